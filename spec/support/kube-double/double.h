/* double.h — internals shared by the kube-double sources (not a public API).
 *
 * The double is a test program: one process, one global store behind one
 * mutex (g_lock) and one condition variable (g_cond) that wakes watchers.
 * Stored objects are immutable jansson values: every write stores a new
 * value and events keep references, so threads may serialise them without
 * the lock (jansson 2.14 reference counts are atomic).
 */
#ifndef KUBE_DOUBLE_H
#define KUBE_DOUBLE_H

#include <jansson.h>
#include <stddef.h>

/* ---- resource types (double.c) ---------------------------------------- */

typedef struct dbl_type {
    const char *group;        /* "" for core */
    const char *version;
    const char *plural;
    const char *singular;
    const char *kind;
    int namespaced;
    const char *short_names;  /* space separated, "" for none */
    int has_status;           /* status subresource */
    int custom;               /* served from a CRD in a real cluster: list items
                                 keep kind/apiVersion, generation is kept,
                                 DELETE returns the object */
    int return_deleted;       /* DELETE answers the deleted object (else Status Success) */
    const char *fields;       /* extra field-selector fields, space separated */
} dbl_type;

extern const dbl_type DBL_TYPES[];
extern const size_t DBL_NTYPES;

/* ---- selectors (select.c) --------------------------------------------- */

typedef struct dbl_selector dbl_selector;

/* Parses a label selector (k8s.io/apimachinery/pkg/labels/selector.go
 * grammar: `k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`,
 * `k>n`, `k<n`, comma separated). NULL or "" selects everything. Returns
 * NULL and a message in err (size errlen) on a syntax error. */
dbl_selector *dbl_labels_parse(const char *text, char *err, size_t errlen);

/* Parses a field selector (`f=v`, `f==v`, `f!=v`, comma separated); fields
 * allowed: metadata.name, metadata.namespace and the space separated
 * `extra`. Unknown field: NULL and `field label not supported: F` in err. */
dbl_selector *dbl_fields_parse(const char *text, const char *extra, char *err, size_t errlen);

/* 1 when obj matches (labels from metadata.labels, or field paths). */
int dbl_selector_match(const dbl_selector *s, const json_t *obj);
void dbl_selector_free(dbl_selector *s);

/* ---- patches (patch.c) -------------------------------------------------- */

/* RFC 7386 JSON merge patch: returns a new value (patch applied to a copy of
 * target). strategic != 0 drops the `$`-directives of a strategic merge
 * patch first and otherwise merges like RFC 7386 (lists are replaced). */
json_t *dbl_merge_patch(const json_t *target, const json_t *patch, int strategic);

/* Strategic merge patch of a core/v1 Pod (k8s.io/apimachinery/pkg/util/
 * strategicpatch with the Pod's patchStrategy/patchMergeKey tags): lists
 * such as spec.schedulingGates, spec.containers or status.conditions merge
 * by their key, the `$patch`, `$retainKeys`, `$setElementOrder/` and
 * `$deleteFromPrimitiveList/` directives apply. Returns a new value. */
json_t *dbl_strategic_patch_pod(const json_t *target, const json_t *patch);

/* RFC 6902 JSON patch on a copy of doc. Returns the new document, or NULL
 * with a message in err (evanphx/json-patch wording where it matters). */
json_t *dbl_json_patch(const json_t *doc, const json_t *ops, char *err, size_t errlen);

/* ---- CRD schema (schema.c) --------------------------------------------- */

/* Applies `default`s and prunes fields not declared in the structural
 * schema `schema` (openAPIV3Schema) to obj in place, as the apiextensions
 * apiserver does for custom resources. metadata, apiVersion and kind are
 * never pruned. Unknown field paths (".spec.foo") are appended to
 * `unknown` (a JSON array) when it is not NULL. */
void dbl_schema_apply(const json_t *schema, json_t *obj, json_t *unknown);

/* ---- Pod rules (pods.c) -------------------------------------------------- */

/* ValidatePodCreate, the part the double checks: scheduling gate names
 * (qualified names, no duplicates) and no spec.nodeName while gates remain.
 * Returns a new JSON array of StatusCauses ({reason, message, field});
 * empty when the pod is valid. */
json_t *dbl_pod_validate_create(const json_t *pod);

/* PrepareForCreate of the pod strategy: status becomes {phase: Pending},
 * plus the PodScheduled=False condition with reason SchedulingGated (and
 * lastTransitionTime `now`, RFC 3339) when the pod has scheduling gates. */
void dbl_pod_prepare_create(json_t *pod, const char *now);

/* ValidatePodUpdate, the part the double checks, of newp (the object to
 * store) against oldp (the stored one): containers neither added nor
 * removed, activeDeadlineSeconds, tolerations only added, scheduling gates
 * only removed, for a pod whose old version has gates the node selector
 * only extended and the required node affinity only narrowed (KEP-3838),
 * and no other spec change. Returns a new JSON array of StatusCauses in
 * the real server's order; empty when the update is valid. */
json_t *dbl_pod_validate_update(const json_t *newp, const json_t *oldp);

/* Drops spec.schedulingGates, spec.nodeSelector and spec.tolerations when
 * they are null or empty: the real server decodes into typed fields tagged
 * omitempty, so an emptied list (the last gate removed) is not stored. */
void dbl_pod_normalize(json_t *pod);

/* ---- owner references and deletion options (gc.c) ------------------------ */

#define DBL_FINALIZER_ORPHAN "orphan"                 /* metav1.FinalizerOrphanDependents */
#define DBL_FINALIZER_FOREGROUND "foregroundDeletion" /* metav1.FinalizerDeleteDependents */

/* The part of ValidateObjectMetaAccessor(Update) the double checks, for
 * every kind on create and update: each of metadata.ownerReferences needs
 * apiVersion (with a version), kind, name and uid, no core/v1 Event owner,
 * at most one with controller: true; metadata.finalizers may not hold both
 * orphan and foregroundDeletion. Field paths are the real ones (not
 * indexed: `metadata.ownerReferences.uid`). Returns a new JSON array of
 * StatusCauses ({reason, message, field}) in the real order, empty when
 * valid. Whether an owner exists, or sits in the dependent's namespace, is
 * not checked here: the API server never checks it (the collector does). */
json_t *dbl_meta_validate(const json_t *obj);

/* ValidateDeleteOptions: propagationPolicy one of Foreground, Background,
 * Orphan, and not together with orphanDependents. Returns a new JSON array
 * of StatusCauses, empty when valid (the caller answers 422 Invalid for
 * kind DeleteOptions, group meta.k8s.io, name ""). */
json_t *dbl_delete_options_validate(const json_t *opts);

/* deletionFinalizersForGarbageCollection: the finalizers an object keeps
 * when a DELETE with options `opts` (DeleteOptions as JSON, may be NULL)
 * reaches it: `orphan` and `foregroundDeletion` are removed, then `orphan`
 * added when orphanDependents is true, or propagationPolicy is Orphan, or
 * neither is given and the object already had `orphan` first;
 * `foregroundDeletion` likewise for Foreground. The default policy is
 * Background for every kind the double serves. Returns a new array. */
json_t *dbl_gc_finalizers(const json_t *finalizers, const json_t *opts);

#endif
