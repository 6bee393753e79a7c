/* kobject.h — reading a Kubernetes object as the API server serves it
 * (JSON, jansson), and its status conditions, written once for every
 * layer that reads or writes one.
 */
#ifndef COZYGPU_FORMAT_KOBJECT_H
#define COZYGPU_FORMAT_KOBJECT_H

#include <jansson.h>

/* metadata.<field> of `obj` when it is a string ("name", "namespace",
 * "uid", "resourceVersion", "deletionTimestamp", ...), else NULL.
 * Borrowed from obj. NULL obj: NULL. */
const char *kobject_meta_str(const json_t *obj, const char *field);

/* metadata.annotations.<key> of `obj` when a string, else NULL (borrowed). */
const char *kobject_annotation(const json_t *obj, const char *key);

/* `obj` with apiVersion and kind: the object itself (a new reference,
 * shared and read-only) when it has a kind, else a shallow copy with
 * these set (list items come without them: kubernetes/kubernetes#3030).
 * The caller decrefs. NULL only when out of memory. */
json_t *kobject_with_kind(json_t *obj, const char *api_version, const char *kind);

/* Whether metadata.finalizers of `obj` holds the string `fin`. */
int kobject_has_finalizer(const json_t *obj, const char *fin);

/* One status condition (Kubernetes API conventions, "Typical status
 * properties"; metav1.Condition): type, status ("True", "False",
 * "Unknown"), a CamelCase reason, a message for a person, and the
 * metadata.generation it was computed from. Strings borrowed. */
typedef struct kobject_condition {
    const char *type, *status, *reason, *message;
    json_int_t generation;
} kobject_condition;

/* The condition of type `type` in `conditions` (an array, or NULL), or
 * NULL when none (borrowed). */
const json_t *kobject_condition_get(const json_t *conditions, const char *type);

/* Whether `conditions` (an array, or NULL) holds condition c->type with
 * the same status, reason, message and observedGeneration. */
int kobject_condition_shown(const json_t *conditions, const kobject_condition *c);

/* The lastTransitionTime condition c->type takes: the one `conditions`
 * holds when its status is the same (it moves only when the status does),
 * else `now` (RFC 3339). Borrowed from conditions or now. */
const char *kobject_condition_since(const json_t *conditions, const kobject_condition *c, const char *now);

/* Sets condition c in obj's status.conditions, making status and the list
 * when absent and leaving every other condition and status field as they
 * are (a read-modify-write of one condition through the status
 * subresource). Returns 1 when obj showed it already (nothing changed), 0
 * when changed, -1 out of memory (obj may be half changed: do not write
 * it). */
int kobject_condition_set(json_t *obj, const kobject_condition *c, const char *now);

/* Removes condition `type` from obj's status.conditions: 1 when there was
 * none (nothing changed), 0 when removed. */
int kobject_condition_remove(json_t *obj, const char *type);

#endif
