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

#endif
