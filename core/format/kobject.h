/* kobject.h — reading a Kubernetes object as the API server serves it
 * (JSON, jansson), written once for every layer that reads one.
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

#endif
