/* watch.c — informers on one curl multi loop (watch.h): the informers and
 * their caches.
 *
 * Every informer is a state machine driven by the watcher thread only
 * (watch_stream.c: the lists, the watch streams, the backoff and the
 * loop); the caches and the generation counter are the only state shared
 * with other threads, under w->mu. This file holds that shared side: making
 * the watcher and its informers, reading the caches, and changing them
 * (one watch event, or a complete list replacing the cache and delivering
 * the difference, as client-go's reflector does), with the events delivered
 * after the lock is released.
 */
#include "kube/watch.h"
#include "kube/kube_internal.h"
#include "base/buf.h"
#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Metrics (core/base/metrics.h, helper C) are optional at link time: until the
   module is linked these resolve to NULL and nothing is counted. */
void metrics_counter_add(const char *family, const char *labels, double v) __attribute__((weak));
void metrics_declare(const char *family, const char *type, const char *help) __attribute__((weak));
void metrics_gauge_set(const char *family, const char *labels, double v) __attribute__((weak));

static const char RESTARTS[] = "cozygpu_watch_restarts_total";

static const char OBJECTS[] = "cozygpu_watch_cache_objects";

/* ------------------------------------------------------------ helpers */

const char *kube_watch_meta(const json_t *obj, const char *k)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), k));
}

/* cache key: client-go MetaNamespaceKeyFunc */
char *kube_watch_obj_key(const json_t *obj)
{
    const char *ns = kube_watch_meta(obj, "namespace"), *name = kube_watch_meta(obj, "name");
    char *k = NULL;
    if(!name)
        return NULL;
    if(ns && *ns) {
        if(asprintf(&k, "%s/%s", ns, name) < 0)
            k = NULL;
    } else {
        k = strdup(name);
    }
    return k;
}

void kube_watch_set_str(char **dst, const char *v)
{
    char *n = v ? strdup(v) : NULL;
    free(*dst);
    *dst = n;
}

void kube_watch_count_restart(kube_informer *inf, const char *reason)
{
    char labels[256];
    if(!metrics_counter_add)
        return;
    snprintf(labels, sizeof labels, "resource=\"%s\",reason=\"%s\"", inf->res->resource, reason);
    metrics_counter_add(RESTARTS, labels, 1);
}

/* A delivery queued under the lock and run after it. */
typedef struct delivery {
    const char *type;
    json_t *obj; /* owned reference */
} delivery;

typedef struct dqueue {
    delivery *d;
    size_t n, cap;
} dqueue;

static void dq_push(dqueue *q, const char *type, json_t *obj)
{
    delivery *nd = cozy_grow(q->d, &q->cap, q->n + 1, sizeof *nd);
    if(!nd) {
        log_write(LOG_ERROR, "watch", "out of memory queueing an event", NULL);
        return;
    }
    q->d = nd;
    q->d[q->n].type = type;
    q->d[q->n].obj = json_incref(obj);
    q->n++;
}

static void dq_deliver(kube_informer *inf, dqueue *q)
{
    for(size_t i = 0; i < q->n; i++) {
        if(inf->fn)
            inf->fn(inf->ctx, inf, q->d[i].type, q->d[i].obj);
        json_decref(q->d[i].obj);
    }
    free(q->d);
    q->d = NULL;
    q->n = q->cap = 0;
}

/* ------------------------------------------------------------ public API */

kube_watcher *kube_watcher_new(kube_client *c, long resync_seconds)
{
    kube_watcher *w = calloc(1, sizeof *w);
    if(!w)
        return NULL;
    w->c = c;
    w->resync = resync_seconds > 0 ? resync_seconds : 0;
    w->tail = &w->infs;
    pthread_mutex_init(&w->mu, NULL);
    atomic_init(&w->stop, 0);
    if(metrics_declare)
        metrics_declare(RESTARTS, "counter",
                        "Watch streams restarted, by resource and reason (expired, closed, cut, throttled, error, resync).");
    return w;
}

kube_informer *kube_watcher_add(kube_watcher *w, const kube_resource *r, const char *ns,
                                const char *label_selector, const char *field_selector,
                                kube_event_fn fn, void *ctx)
{
    kube_informer *inf;
    if(w->started)
        return NULL;
    inf = calloc(1, sizeof *inf);
    if(!inf)
        return NULL;
    inf->w = w;
    inf->res = r;
    inf->cur = r;
    inf->fn = fn;
    inf->ctx = ctx;
    inf->cache = json_object();
    if((ns && *ns && !(inf->ns = strdup(ns))) ||
       (label_selector && *label_selector && !(inf->label = strdup(label_selector))) ||
       (field_selector && *field_selector && !(inf->field = strdup(field_selector))) || !inf->cache) {
        free(inf->ns);
        free(inf->label);
        free(inf->field);
        json_decref(inf->cache);
        free(inf);
        return NULL;
    }
    *w->tail = inf;
    w->tail = &inf->next;
    return inf;
}

int kube_watcher_synced(kube_watcher *w)
{
    int ok = 1;
    pthread_mutex_lock(&w->mu);
    for(kube_informer *i = w->infs; i; i = i->next)
        ok = ok && i->synced;
    pthread_mutex_unlock(&w->mu);
    return ok;
}

size_t kube_watcher_unsynced(kube_watcher *w, char *buf, size_t n)
{
    size_t count = 0, len = 0, left_out = 0;
    if(n > 0)
        buf[0] = '\0';
    pthread_mutex_lock(&w->mu);
    for(kube_informer *i = w->infs; i; i = i->next) {
        if(i->synced)
            continue;
        count++;
        const char *name = i->res->resource;
        int seen = 0; /* one name once, however many informers watch it */
        for(kube_informer *j = w->infs; j != i; j = j->next)
            if(!j->synced && strcmp(j->res->resource, name) == 0)
                seen = 1;
        if(seen)
            continue;
        /* whole names only, with room kept for ", +N more" */
        if(n == 0 || len + 2 + strlen(name) + 16 >= n) {
            left_out++;
            continue;
        }
        len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", name);
    }
    pthread_mutex_unlock(&w->mu);
    if(left_out && n > len + 1)
        snprintf(buf + len, n - len, "%s+%zu more", len ? ", " : "", left_out);
    return count;
}

unsigned long kube_watcher_generation(kube_watcher *w)
{
    unsigned long g;
    pthread_mutex_lock(&w->mu);
    g = w->generation;
    pthread_mutex_unlock(&w->mu);
    return g;
}

static void append_cache(json_t *arr, kube_informer *inf)
{
    const char *k;
    json_t *v;
    json_object_foreach(inf->cache, k, v) json_array_append(arr, v);
}

json_t *kube_watcher_snapshot(kube_watcher *w)
{
    json_t *arr = json_array();
    if(!arr)
        return NULL;
    pthread_mutex_lock(&w->mu);
    for(kube_informer *i = w->infs; i; i = i->next)
        append_cache(arr, i);
    pthread_mutex_unlock(&w->mu);
    return arr;
}

json_t *kube_informer_list(kube_informer *inf)
{
    json_t *arr = json_array();
    if(!arr)
        return NULL;
    pthread_mutex_lock(&inf->w->mu);
    append_cache(arr, inf);
    pthread_mutex_unlock(&inf->w->mu);
    return arr;
}

json_t *kube_informer_get(kube_informer *inf, const char *ns, const char *name)
{
    char *k = NULL;
    json_t *v;
    if(ns && *ns) {
        if(asprintf(&k, "%s/%s", ns, name) < 0)
            return NULL;
    } else if(!(k = strdup(name))) {
        return NULL;
    }
    pthread_mutex_lock(&inf->w->mu);
    v = json_incref(json_object_get(inf->cache, k));
    pthread_mutex_unlock(&inf->w->mu);
    free(k);
    return v;
}

const kube_resource *kube_informer_resource(kube_informer *inf) { return inf->res; }

const kube_resource *kube_informer_served(kube_informer *inf)
{
    const kube_resource *r;
    pthread_mutex_lock(&inf->w->mu);
    r = inf->served;
    pthread_mutex_unlock(&inf->w->mu);
    return r;
}

json_t *kube_informer_list_served(kube_informer *inf, const kube_resource **served)
{
    json_t *arr = json_array();
    if(!arr)
        return NULL;
    pthread_mutex_lock(&inf->w->mu);
    append_cache(arr, inf);
    if(served)
        *served = inf->served;
    pthread_mutex_unlock(&inf->w->mu);
    return arr;
}

void kube_informer_rv(kube_informer *inf, char *buf, size_t n)
{
    pthread_mutex_lock(&inf->w->mu);
    snprintf(buf, n, "%s", inf->rv_copy);
    pthread_mutex_unlock(&inf->w->mu);
}

void kube_watch_set_rv(kube_informer *inf, const char *rv)
{
    if(!rv)
        return;
    kube_watch_set_str(&inf->rv, rv);
    pthread_mutex_lock(&inf->w->mu);
    snprintf(inf->rv_copy, sizeof inf->rv_copy, "%s", rv);
    pthread_mutex_unlock(&inf->w->mu);
}

/* The objects a cache holds, as cozygpu_watch_cache_objects{resource}
   (under w->mu). */
static void count_objects(const kube_informer *inf, const json_t *cache)
{
    if(!metrics_gauge_set)
        return;
    char lb[160];
    snprintf(lb, sizeof lb, "resource=\"%s\"", inf->res->resource);
    metrics_gauge_set(OBJECTS, lb, (double)json_object_size(cache));
}

/* Applies one watch event to the cache and delivers it. */
void kube_watch_apply_event(kube_informer *inf, const char *type, json_t *obj)
{
    dqueue q = {0};
    char *key = kube_watch_obj_key(obj);
    if(!key) {
        log_write(LOG_WARN, "watch", "event object without metadata.name ignored", "resource",
                  inf->res->resource, "type", type, NULL);
        return;
    }
    pthread_mutex_lock(&inf->w->mu);
    int had = json_object_get(inf->cache, key) != NULL;
    if(strcmp(type, "DELETED") == 0) {
        if(had)
            json_object_del(inf->cache, key);
        dq_push(&q, "DELETED", obj);
    } else {
        json_object_set(inf->cache, key, obj);
        dq_push(&q, had ? "MODIFIED" : "ADDED", obj);
    }
    inf->w->generation++;
    count_objects(inf, inf->cache);
    pthread_mutex_unlock(&inf->w->mu);
    free(key);
    kube_watch_set_rv(inf, kube_watch_meta(obj, "resourceVersion"));
    dq_deliver(inf, &q);
}

/* The last page has arrived: replace the cache, deliver the difference.
   served: the version listed (NULL: none is served). Objects listed at
   another version than the cache's are new objects even at the same
   resourceVersion (their shape differs), so they come as MODIFIED. */
void kube_watch_commit_list(kube_informer *inf, const char *list_rv, const kube_resource *served)
{
    dqueue q = {0};
    const char *k;
    json_t *v;
    pthread_mutex_lock(&inf->w->mu);
    int changed = !inf->synced;
    const kube_resource *before = inf->served;
    int switched = before != served;
    json_object_foreach(inf->cache, k, v) {
        if(!json_object_get(inf->pending, k))
            dq_push(&q, "DELETED", v);
    }
    for(void *it = json_object_iter(inf->pending); it; it = json_object_iter_next(inf->pending, it)) {
        k = json_object_iter_key(it);
        v = json_object_iter_value(it);
        json_t *old = json_object_get(inf->cache, k);
        if(!old) {
            dq_push(&q, "ADDED", v);
        } else {
            const char *orv = kube_watch_meta(old, "resourceVersion"), *nrv = kube_watch_meta(v, "resourceVersion");
            if(switched || !orv || !nrv || strcmp(orv, nrv) != 0)
                dq_push(&q, "MODIFIED", v);
            else
                json_object_iter_set(inf->pending, it, old); /* unchanged: keep the cached value */
        }
    }
    json_decref(inf->cache);
    inf->cache = inf->pending;
    inf->pending = NULL;
    inf->synced = 1;
    count_objects(inf, inf->cache);
    inf->served = served;
    if(changed || q.n)
        inf->w->generation++;
    pthread_mutex_unlock(&inf->w->mu);
    kube_watch_set_rv(inf, list_rv);
    if(served && served != before && (before || served != inf->res))
        log_write(LOG_INFO, "watch",
                  served != inf->res ? "reading an older version: the newer ones are not served"
                                     : "reading the newest version: it is served now",
                  "resource", inf->res->resource, "version", served->version, NULL);
    {
        char nbuf[24];
        snprintf(nbuf, sizeof nbuf, "%zu", json_object_size(inf->cache));
        log_write(LOG_DEBUG, "watch", "listed", "resource", inf->res->resource, "rv", list_rv,
                  LOG_NUM "objects", nbuf, NULL);
    }
    dq_deliver(inf, &q);
}

void kube_watcher_free(kube_watcher *w)
{
    if(!w)
        return;
    kube_watcher_stop(w);
    for(kube_informer *i = w->infs, *n; i; i = n) {
        n = i->next;
        free(i->ns);
        free(i->label);
        free(i->field);
        cozy_buf_free(&i->buf);
        free(i->cont);
        free(i->rv);
        json_decref(i->pending);
        json_decref(i->cache);
        free(i);
    }
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void kube_informer_set_transform(kube_informer *inf, kube_transform_fn fn)
{
    if(inf)
        inf->transform = fn;
}

void kube_informer_set_optional(kube_informer *inf)
{
    if(inf)
        inf->optional = 1;
}
