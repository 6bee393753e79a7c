/* watch.h — list-then-watch informers sharing one event loop thread.
 *
 * A watcher owns one thread and one curl multi handle; each informer added to
 * it keeps a cache of one resource type (optionally one namespace, label and
 * field selector) in step with the API server, the way client-go's reflector
 * does (k8s.io/client-go tools/cache/reflector.go ListAndWatch,
 * watchHandler; k8s.io/apimachinery pkg/util/net and the API concepts page
 * "Efficient detection of changes"):
 *
 *   LISTING   GET the collection (consistent read: no resourceVersion) in
 *             pages of KUBE_WATCH_PAGE_SIZE (limit/continue); an expired
 *             continue token (410) restarts the list without pagination.
 *             When the last page arrives the cache is replaced and the
 *             difference is delivered (see kube_event_fn).
 *   WATCHING  GET ?watch=1&resourceVersion=<last rv>&allowWatchBookmarks=true
 *             &timeoutSeconds=<300..600, jittered>. Events are chunked JSON
 *             lines, parsed one complete line at a time. BOOKMARK only moves
 *             the rv. When the stream ends or is cut, the watch resumes from
 *             the last rv seen (so no event is delivered twice and none is
 *             lost). 410 Gone, as an HTTP status or as an ERROR event with
 *             code 410 (reason Expired or Gone), relists.
 *   BACKOFF   after an error: exponential (KUBE_WATCH_BACKOFF_*) with jitter
 *             in [d/2, d]; a Retry-After on 429 sets the wait. Then either the
 *             watch resumes (429, 5xx, transport errors) or a relist follows
 *             (other statuses, undecodable events, ERROR events).
 *
 * VERSIONS  a resource with older versions (kube_resource_older: the DRA
 *           kinds) is read at the newest version the cluster serves: a LIST
 *           answered 404 is tried again at the next older version at once;
 *           every new list (not the next page) starts at the newest again,
 *           so an upgraded cluster is followed, and a version the cluster
 *           stops serving (404 on the watch, then a relist) is left. The
 *           objects are cached as received, in the shape of the version
 *           read (kube_informer_served says which).
 *
 * Every resync_seconds (0: never) a watching informer relists, delivering
 * only the difference. Each restart of a watch counts in
 * cozygpu_watch_restarts_total{resource,reason} with reason one of
 * expired, closed (the server ended the stream), cut (transport error),
 * throttled, error, resync. cozygpu_watch_cache_objects{resource} is the
 * number of objects each cache holds.
 *
 * Caches map "namespace/name" (or "name" for cluster-scoped objects) to the
 * object as received; objects are never modified once cached, so readers
 * share them (new references) and must treat them as read-only. All caches of
 * a watcher share one mutex; callbacks run on the watcher thread without it.
 */
#ifndef COZYGPU_WATCH_H
#define COZYGPU_WATCH_H

#include "kube/kube.h"

#include <jansson.h>

/* objects per list page: each page's body is held and parsed whole before
   the transform (kube_informer_set_transform) shrinks its objects, so the
   page bounds a relist's peak memory: 100 objects of a tenant's 250 KiB
   annotations is 25 MiB of body (client-go's 500 would be 125 MiB) */
#define KUBE_WATCH_PAGE_SIZE 100
/* ceiling of one watch event line (the API server's object limit is 1.5 MiB
   in etcd; a line above this aborts the stream and relists) */
#define KUBE_WATCH_EVENT_MAX_BYTES (16u * 1024u * 1024u)
#define KUBE_WATCH_BACKOFF_BASE_MS 500
#define KUBE_WATCH_BACKOFF_CAP_MS 30000
/* a watch that ends sooner than this without an event counts as a failure
   (client-go: "very short watch") */
#define KUBE_WATCH_SHORT_S 1.0

typedef struct kube_watcher kube_watcher;
typedef struct kube_informer kube_informer;

/* type: "ADDED", "MODIFIED", "DELETED". obj is borrowed (valid during the
 * call; json_incref it to keep it). Watch events are delivered as received,
 * except that an ADDED for a cached key is delivered as MODIFIED and a
 * MODIFIED for an unknown key as ADDED (as client-go's DeltaFIFO /
 * processDeltas does). After a relist: DELETED (with the last cached object)
 * for each key that vanished, ADDED for each new key, MODIFIED for each key
 * whose metadata.resourceVersion differs; unchanged objects give no event.
 * The cache already holds the change when fn runs. Called on the watcher
 * thread, without the cache lock held; fn may read the caches, and must not
 * call kube_watcher_stop. */
typedef void (*kube_event_fn)(void *ctx, kube_informer *inf, const char *type, const json_t *obj);

/* A watcher over client c (borrowed; must outlive the watcher). resync_seconds
   0 disables periodic relists. NULL on out of memory. */
kube_watcher *kube_watcher_new(kube_client *c, long resync_seconds);

/* Adds an informer (before kube_watcher_start only; NULL after it or on out
 * of memory). r is borrowed and must outlive the watcher (use the KUBE_*
 * constants); ns NULL or "" for all namespaces; selectors NULL for none (they
 * are sent as labelSelector / fieldSelector). fn may be NULL. */
kube_informer *kube_watcher_add(kube_watcher *w, const kube_resource *r, const char *ns,
                                const char *label_selector, const char *field_selector,
                                kube_event_fn fn, void *ctx);

/* Starts the thread; every informer begins listing. COZY_ERR_INTERNAL if the
   thread or the multi handle cannot be created, or when already started. */
cozy_result kube_watcher_start(kube_watcher *w, cozy_err *err);

/* Stops the thread (any transfer is abandoned) and joins it. Safe to call
   when not started or twice. Must not be called from a callback. */
void kube_watcher_stop(kube_watcher *w);

/* Stops (if needed) and frees the watcher, its informers and caches. */
void kube_watcher_free(kube_watcher *w);

/* Nonzero once every informer has completed one list. */
int kube_watcher_synced(kube_watcher *w);

/* The informers that have not completed their first list yet: their
 * resource names (kube_resource.resource, e.g. "gpuclaims"), in the order
 * they were added, each once, joined by ", " into buf (size n, always
 * NUL-terminated when n > 0); names that do not fit whole are counted in
 * a last ", +N more". Returns how many
 * informers have not listed (0: synced; buf is then ""). For /readyz's
 * reason. */
size_t kube_watcher_unsynced(kube_watcher *w, char *buf, size_t n);

/* A counter incremented on every cache change of any informer (and once when
   an informer completes its first list). */
unsigned long kube_watcher_generation(kube_watcher *w);

/* A new array holding every cached object of every informer (shared objects:
   read-only). NULL on out of memory. */
json_t *kube_watcher_snapshot(kube_watcher *w);

/* A new array of the informer's cached objects (same rule). */
json_t *kube_informer_list(kube_informer *inf);

/* A new reference to the cached object ns/name (ns NULL for cluster-scoped),
   or NULL. */
json_t *kube_informer_get(kube_informer *inf, const char *ns, const char *name);

/* The informer's resource type, as given to kube_watcher_add (the newest
   version, whatever version is read). */
const kube_resource *kube_informer_resource(kube_informer *inf);

/* The version of the resource the cached objects were listed at: the
   resource itself or one of its kube_resource_older versions; NULL before
   the first list, or when the cluster serves no version (optional). */
const kube_resource *kube_informer_served(kube_informer *inf);

/* kube_informer_list, and the kube_informer_served version of that list
   (into *served when not NULL), read together under the cache lock. */
json_t *kube_informer_list_served(kube_informer *inf, const kube_resource **served);

/* Called on the watcher thread on every object listed or watched, before
 * it is cached or delivered to the event function: it may remove fields in
 * place (it owns no reference; it must not fail or keep `obj`). The shape of
 * client-go's SharedIndexInformer.SetTransform (k8s.io/client-go/tools/cache
 * TransformFunc), used there to drop managedFields and keep caches small. */
typedef void (*kube_transform_fn)(const kube_resource *r, json_t *obj);

/* Sets the informer's transform (NULL: none). Call before
 * kube_watcher_start. */
void kube_informer_set_transform(kube_informer *inf, kube_transform_fn fn);

/* Marks the resource as one the cluster may not serve (an optional API
 * group, e.g. resource.k8s.io without DRA). A LIST answered 404 (at every
 * version, see VERSIONS) then counts as an empty list, so the watcher still
 * syncs; the list is tried again every minute. Call before
 * kube_watcher_start. */
void kube_informer_set_optional(kube_informer *inf);

/* The last resourceVersion the informer has seen (list, event or bookmark),
   copied into buf (size n, truncated); "" before the first list. */
void kube_informer_rv(kube_informer *inf, char *buf, size_t n);

#endif
