/* watch.c — informers on one curl multi loop (watch.h).
 *
 * Every informer is a state machine driven by the watcher thread only; the
 * caches and the generation counter are the only state shared with other
 * threads, under w->mu. Watch bodies are read as chunked JSON lines: the
 * write callback appends to a line buffer and decodes each complete line
 * (json_loadb), so a line split across chunks and several lines in one chunk
 * are both handled. Source of the rules: k8s.io/client-go
 * tools/cache/reflector.go (ListAndWatch, watchHandler, isExpiredError,
 * isWatchErrorRetriable), tools/pager/pager.go (expired continue token: full
 * list), and the Kubernetes API concepts page (watch bookmarks, 410 Gone).
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

typedef enum inf_state { INF_IDLE, INF_LISTING, INF_WATCHING, INF_BACKOFF } inf_state;

/* why the watch transfer was aborted from the write callback */
typedef enum abort_why { AB_NONE, AB_GONE, AB_ERROR, AB_THROTTLED } abort_why;

struct kube_informer {
    kube_watcher *w;
    const kube_resource *res;
    char *ns, *label, *field;
    kube_event_fn fn;
    void *ctx;
    kube_transform_fn transform; /* NULL: objects are cached as they come */
    struct kube_informer *next;

    /* loop state (watcher thread only) */
    inf_state state;
    const kube_resource *cur; /* the version listed and watched: res, or an older one
                                 (kube_resource_older) the cluster serves instead */
    int relist;          /* after BACKOFF: list (1) or watch (0) */
    double wake_at;      /* end of BACKOFF */
    int failures;        /* consecutive, for the backoff */
    CURL *h;
    struct curl_slist *hdrs;
    long retry_after;
    char cerr[CURL_ERROR_SIZE];
    cozy_buf buf;        /* list body, or the incomplete watch line (ceiling set per use) */
    int overflow;
    json_t *pending;     /* list pages accumulated: key -> object */
    char *cont;          /* continue token of the next page */
    double watch_start;
    unsigned long watch_events;
    abort_why why;
    char *rv;            /* last resourceVersion seen */
    double resync_at;

    /* shared, under w->mu */
    json_t *cache;       /* key -> object */
    int synced;
    int optional;        /* 404 on LIST: not served, empty (watcher thread only after start) */
    const kube_resource *served; /* the version the cache was listed at; NULL before a list or
                                    when no version is served */
    char rv_copy[64];
};

struct kube_watcher {
    kube_client *c;
    long resync;
    pthread_mutex_t mu;
    unsigned long generation;
    kube_informer *infs, **tail;
    CURLM *multi;
    pthread_t th;
    int started;
    atomic_int stop;
};

/* ------------------------------------------------------------ helpers */

static const char *meta(const json_t *obj, const char *k)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), k));
}

/* cache key: client-go MetaNamespaceKeyFunc */
static char *obj_key(const json_t *obj)
{
    const char *ns = meta(obj, "namespace"), *name = meta(obj, "name");
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

static void set_str(char **dst, const char *v)
{
    char *n = v ? strdup(v) : NULL;
    free(*dst);
    *dst = n;
}

static void count_restart(kube_informer *inf, const char *reason)
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

/* ------------------------------------------------------------ transfers */

static void buf_reset(kube_informer *inf)
{
    inf->buf.len = 0;
    inf->overflow = 0;
}

static int buf_append(kube_informer *inf, const char *p, size_t n, size_t max)
{
    inf->buf.max = max;
    int rc = cozy_buf_add(&inf->buf, p, n);
    if(rc == EFBIG)
        inf->overflow = 1;
    return rc == 0 ? 0 : -1;
}

static size_t list_write(char *p, size_t size, size_t nmemb, void *userp)
{
    kube_informer *inf = userp;
    size_t n = size * nmemb;
    return buf_append(inf, p, n, KUBE_RESPONSE_MAX_BYTES) == 0 ? n : 0;
}

static size_t head_write(char *p, size_t size, size_t nmemb, void *userp)
{
    kube_informer *inf = userp;
    size_t n = size * nmemb;
    kube_header_retry_after(p, n, &inf->retry_after);
    return n;
}

static void set_rv(kube_informer *inf, const char *rv)
{
    if(!rv)
        return;
    set_str(&inf->rv, rv);
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
static void apply_event(kube_informer *inf, const char *type, json_t *obj)
{
    dqueue q = {0};
    char *key = obj_key(obj);
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
    set_rv(inf, meta(obj, "resourceVersion"));
    dq_deliver(inf, &q);
}

/* One complete watch line. Returns 0 to go on, -1 to abort the stream
   (inf->why says why). */
static int watch_line(kube_informer *inf, const char *line, size_t n)
{
    json_error_t je;
    json_t *ev;
    while(n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' '))
        n--;
    if(n == 0)
        return 0;
    ev = json_loadb(line, n, 0, &je);
    const char *type = json_string_value(json_object_get(ev, "type"));
    json_t *obj = json_object_get(ev, "object");
    if(!ev || !type || !json_is_object(obj)) {
        log_write(LOG_WARN, "watch", "undecodable watch event, relisting", "resource",
                  inf->res->resource, "error", ev ? "no type or object" : je.text, NULL);
        json_decref(ev);
        inf->why = AB_ERROR;
        return -1;
    }
    if(strcmp(type, "ERROR") != 0)
        inf->watch_events++;
    if(strcmp(type, "BOOKMARK") == 0) {
        set_rv(inf, meta(obj, "resourceVersion"));
    } else if(strcmp(type, "ERROR") == 0) {
        json_int_t code = json_integer_value(json_object_get(obj, "code"));
        const char *reason = json_string_value(json_object_get(obj, "reason"));
        const char *msg = json_string_value(json_object_get(obj, "message"));
        char cbuf[24];
        snprintf(cbuf, sizeof cbuf, "%lld", (long long)code);
        if(code == 410 || (reason && (strcmp(reason, "Expired") == 0 || strcmp(reason, "Gone") == 0)))
            inf->why = AB_GONE;
        else if(code == 429 || code >= 500)
            inf->why = AB_THROTTLED;
        else
            inf->why = AB_ERROR;
        log_write(inf->why == AB_GONE ? LOG_INFO : LOG_WARN, "watch", "watch ERROR event",
                  "resource", inf->res->resource, LOG_NUM "code", cbuf, "reason", reason, "message", msg, NULL);
        json_decref(ev);
        return -1;
    } else if(strcmp(type, "ADDED") == 0 || strcmp(type, "MODIFIED") == 0 || strcmp(type, "DELETED") == 0) {
        if(inf->transform)
            inf->transform(inf->res, obj);
        apply_event(inf, type, obj);
    } else {
        log_write(LOG_WARN, "watch", "unknown watch event type ignored", "resource",
                  inf->res->resource, "type", type, NULL);
    }
    json_decref(ev);
    return 0;
}

static size_t watch_write(char *p, size_t size, size_t nmemb, void *userp)
{
    kube_informer *inf = userp;
    size_t n = size * nmemb, start = 0;
    long st = 0;
    if(atomic_load(&inf->w->stop))
        return 0;
    curl_easy_getinfo(inf->h, CURLINFO_RESPONSE_CODE, &st);
    if(st != 200) /* a Status body (410, 429, ...): watch_done reads the code */
        return n;
    for(size_t i = 0; i < n; i++) {
        if(p[i] != '\n')
            continue;
        int rc;
        if(inf->buf.len > 0) {
            if(buf_append(inf, p + start, i - start, KUBE_WATCH_EVENT_MAX_BYTES) != 0)
                goto overflow;
            rc = watch_line(inf, inf->buf.p, inf->buf.len);
            inf->buf.len = 0;
        } else {
            rc = watch_line(inf, p + start, i - start);
        }
        if(rc != 0)
            return 0;
        start = i + 1;
    }
    if(start < n && buf_append(inf, p + start, n - start, KUBE_WATCH_EVENT_MAX_BYTES) != 0)
        goto overflow;
    return n;
overflow:
    log_write(LOG_WARN, "watch", "watch event larger than KUBE_WATCH_EVENT_MAX_BYTES, relisting",
              "resource", inf->res->resource, NULL);
    inf->why = AB_ERROR;
    return 0;
}

static void end_transfer(kube_informer *inf)
{
    if(inf->h) {
        curl_multi_remove_handle(inf->w->multi, inf->h);
        curl_easy_cleanup(inf->h);
        inf->h = NULL;
    }
    curl_slist_free_all(inf->hdrs);
    inf->hdrs = NULL;
}

/* Builds the collection path with query parameters. */
static char *collection_query(kube_informer *inf, const char *extra)
{
    char *base = kube_path(inf->cur, inf->ns, NULL, NULL), *out = NULL;
    char *l = inf->label ? kube_escape(inf->label) : NULL;
    char *f = inf->field ? kube_escape(inf->field) : NULL;
    if(base && (!inf->label || l) && (!inf->field || f) &&
       asprintf(&out, "%s?%s%s%s%s%s", base, extra, l ? "&labelSelector=" : "", l ? l : "",
                f ? "&fieldSelector=" : "", f ? f : "") < 0)
        out = NULL;
    free(base);
    free(l);
    free(f);
    return out;
}

static void backoff(kube_informer *inf, int relist, long retry_after_s);

static int start_transfer(kube_informer *inf, const char *path, int watch)
{
    cozy_err err;
    inf->h = curl_easy_init();
    if(!inf->h)
        return -1;
    if(kube_handle_setup(inf->w->c, inf->h, path, NULL, &inf->hdrs, &err) != COZY_OK) {
        log_write(LOG_ERROR, "watch", "cannot prepare request", "resource", inf->res->resource,
                  "error", err.msg, NULL);
        curl_easy_cleanup(inf->h);
        inf->h = NULL;
        return -1;
    }
    buf_reset(inf);
    inf->retry_after = -1;
    inf->cerr[0] = 0;
    inf->why = AB_NONE;
    curl_easy_setopt(inf->h, CURLOPT_PRIVATE, inf);
    curl_easy_setopt(inf->h, CURLOPT_WRITEFUNCTION, watch ? watch_write : list_write);
    curl_easy_setopt(inf->h, CURLOPT_WRITEDATA, inf);
    curl_easy_setopt(inf->h, CURLOPT_HEADERFUNCTION, head_write);
    curl_easy_setopt(inf->h, CURLOPT_HEADERDATA, inf);
    curl_easy_setopt(inf->h, CURLOPT_ERRORBUFFER, inf->cerr);
    if(curl_multi_add_handle(inf->w->multi, inf->h) != CURLM_OK) {
        end_transfer(inf);
        return -1;
    }
    return 0;
}

/* Lists inf->cur (the next page when inf->cont is set). */
static void list_from(kube_informer *inf)
{
    char extra[64];
    char *cont = inf->cont ? kube_escape(inf->cont) : NULL;
    char *ex2 = NULL, *path;
    snprintf(extra, sizeof extra, "limit=%d", KUBE_WATCH_PAGE_SIZE);
    if(cont && asprintf(&ex2, "%s&continue=%s", extra, cont) < 0)
        ex2 = NULL;
    path = collection_query(inf, ex2 ? ex2 : extra);
    free(cont);
    free(ex2);
    if(!inf->cont) {
        json_decref(inf->pending);
        inf->pending = json_object();
    }
    inf->state = INF_LISTING;
    if(!path || !inf->pending || start_transfer(inf, path, 0) != 0) {
        free(path);
        backoff(inf, 1, -1);
        return;
    }
    curl_easy_setopt(inf->h, CURLOPT_TIMEOUT_MS, kube_client_timeout_ms(inf->w->c) * 3);
    free(path);
}

/* Lists: a new list starts at the newest version (a cluster upgraded since
   the last list may serve it now, and one that stopped serving the version
   watched answers 404), the next page stays at the version of the first. */
static void start_list(kube_informer *inf)
{
    if(!inf->cont)
        inf->cur = inf->res;
    list_from(inf);
}

static void start_watch(kube_informer *inf)
{
    /* client-go: timeoutSeconds = minWatchTimeout * (1 + rand), 5 min */
    long tmo = 300 + (long)(kube_rand01() * 300);
    char *erv = kube_escape(inf->rv ? inf->rv : ""), *extra = NULL, *path = NULL;
    if(erv && asprintf(&extra, "watch=1&allowWatchBookmarks=true&resourceVersion=%s&timeoutSeconds=%ld",
                       erv, tmo) < 0)
        extra = NULL;
    if(extra)
        path = collection_query(inf, extra);
    free(erv);
    free(extra);
    inf->state = INF_WATCHING;
    inf->watch_start = kube_now();
    inf->watch_events = 0;
    if(!path || start_transfer(inf, path, 1) != 0) {
        free(path);
        backoff(inf, 0, -1);
        return;
    }
    /* a hung server is detected by the overall timeout */
    curl_easy_setopt(inf->h, CURLOPT_TIMEOUT_MS, (tmo + 30) * 1000L);
    free(path);
}

static void backoff(kube_informer *inf, int relist, long retry_after_s)
{
    double d = KUBE_WATCH_BACKOFF_BASE_MS;
    char ms[32];
    inf->failures++;
    for(int i = 1; i < inf->failures && d < KUBE_WATCH_BACKOFF_CAP_MS; i++)
        d *= 2;
    if(d > KUBE_WATCH_BACKOFF_CAP_MS)
        d = KUBE_WATCH_BACKOFF_CAP_MS;
    d = d / 2 + kube_rand01() * d / 2;
    if(retry_after_s >= 0)
        d = (double)(retry_after_s > KUBE_RETRY_AFTER_MAX_S ? KUBE_RETRY_AFTER_MAX_S : retry_after_s) * 1000;
    snprintf(ms, sizeof ms, "%.0f", d);
    log_write(LOG_INFO, "watch", relist ? "backing off, then relisting" : "backing off, then resuming the watch",
              "resource", inf->res->resource, LOG_NUM "wait_ms", ms, NULL);
    inf->state = INF_BACKOFF;
    inf->relist = relist;
    inf->wake_at = kube_now() + d / 1000.0;
}

/* The last page has arrived: replace the cache, deliver the difference.
   served: the version listed (NULL: none is served). Objects listed at
   another version than the cache's are new objects even at the same
   resourceVersion (their shape differs), so they come as MODIFIED. */
static void commit_list(kube_informer *inf, const char *list_rv, const kube_resource *served)
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
            const char *orv = meta(old, "resourceVersion"), *nrv = meta(v, "resourceVersion");
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
    set_rv(inf, list_rv);
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

static void list_done(kube_informer *inf, CURLcode cc, long st)
{
    json_t *body = NULL, *items;
    if(cc == CURLE_OK && st == 200)
        body = json_loadb(inf->buf.p, inf->buf.len, 0, NULL);
    items = json_object_get(body, "items");
    if(cc == CURLE_OK && st == 410 && inf->cont) {
        /* continue token expired: list again from the start, unpaginated
           would be what the pager does; a fresh paginated list is as good */
        log_write(LOG_INFO, "watch", "continue token expired, listing again", "resource",
                  inf->res->resource, NULL);
        set_str(&inf->cont, NULL);
        start_list(inf);
        return;
    }
    if(cc == CURLE_OK && st == 404 && !inf->cont && kube_resource_older(inf->cur)) {
        /* this version is not served: the next older one may be */
        log_write(LOG_DEBUG, "watch", "version not served, trying the next older one", "resource",
                  inf->res->resource, "version", inf->cur->version, NULL);
        json_decref(body);
        inf->cur = kube_resource_older(inf->cur);
        list_from(inf);
        return;
    }
    if(cc == CURLE_OK && st == 404 && inf->optional) {
        /* the API is not served here: an empty list, looked for again in a
           minute (commit_list reports objects that vanished as DELETED) */
        if(!inf->synced)
            log_write(LOG_INFO, "watch", "resource not served here; treated as empty", "resource",
                      inf->res->resource, NULL);
        json_decref(body);
        set_str(&inf->cont, NULL);
        json_object_clear(inf->pending);
        commit_list(inf, "", NULL);
        backoff(inf, 1, 60);
        return;
    }
    if(!json_is_array(items)) {
        char sbuf[24];
        snprintf(sbuf, sizeof sbuf, "%ld", st);
        /* a refusal's body is a metav1.Status: its message says why (e.g.
           RBAC's "... cannot list resource ..."); a 200 without items is a
           body this client cannot read */
        const char *why;
        json_t *status = NULL;
        if(cc != CURLE_OK) {
            why = inf->cerr[0] ? inf->cerr : curl_easy_strerror(cc);
        } else if(st == 200) {
            why = body ? "no items" : "invalid JSON";
        } else {
            status = json_loadb(inf->buf.p, inf->buf.len, 0, NULL);
            why = json_string_value(json_object_get(status, "message"));
            if(!why) why = "no Status in the answer";
        }
        log_write(LOG_WARN, "watch", "list failed", "resource", inf->res->resource, LOG_NUM "status",
                  cc == CURLE_OK ? sbuf : NULL, "error", why, NULL);
        json_decref(status);
        json_decref(body);
        set_str(&inf->cont, NULL);
        backoff(inf, 1, st == 429 ? inf->retry_after : -1);
        return;
    }
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        if(inf->transform && json_is_object(it))
            inf->transform(inf->res, it);
        char *k = obj_key(it);
        if(k)
            json_object_set(inf->pending, k, it);
        free(k);
    }
    const char *cont = json_string_value(json_object_get(json_object_get(body, "metadata"), "continue"));
    if(cont && *cont) {
        set_str(&inf->cont, cont);
        json_decref(body);
        start_list(inf);
        return;
    }
    set_str(&inf->cont, NULL);
    const char *rv = json_string_value(json_object_get(json_object_get(body, "metadata"), "resourceVersion"));
    commit_list(inf, rv ? rv : "", inf->cur);
    json_decref(body);
    /* failures are reset by a useful watch, not by a list, so that a
       list / 410 loop still backs off */
    inf->resync_at = inf->w->resync ? kube_now() + (double)inf->w->resync : 0;
    start_watch(inf);
}

/* Relists now after a 410, unless the watch that expired was itself
   short and empty and the previous one was too: then back off, so a server
   answering 410 to every watch is not hammered. */
static void relist_after_expiry(kube_informer *inf, int useful)
{
    if(useful || inf->failures == 0) {
        inf->failures = useful ? 0 : 1;
        start_list(inf);
    } else {
        backoff(inf, 1, -1);
    }
}

static void watch_done(kube_informer *inf, CURLcode cc, long st)
{
    int useful = inf->watch_events > 0 || kube_now() - inf->watch_start >= KUBE_WATCH_SHORT_S;
    if(cc == CURLE_WRITE_ERROR && inf->why != AB_NONE) {
        switch(inf->why) {
        case AB_GONE:
            count_restart(inf, "expired");
            log_write(LOG_INFO, "watch", "resourceVersion expired, relisting", "resource",
                      inf->res->resource, "rv", inf->rv, NULL);
            relist_after_expiry(inf, useful);
            return;
        case AB_THROTTLED:
            count_restart(inf, "throttled");
            backoff(inf, 0, -1);
            return;
        default:
            count_restart(inf, "error");
            backoff(inf, 1, -1);
            return;
        }
    }
    if(cc == CURLE_OK && st == 200) {
        /* the server closed the stream (timeoutSeconds, or a cut with a clean end) */
        count_restart(inf, "closed");
        if(useful) {
            inf->failures = 0;
            start_watch(inf);
        } else {
            backoff(inf, 0, -1);
        }
        return;
    }
    if(cc == CURLE_OK) {
        char sbuf[24];
        snprintf(sbuf, sizeof sbuf, "%ld", st);
        if(st == 410) {
            count_restart(inf, "expired");
            log_write(LOG_INFO, "watch", "resourceVersion expired, relisting", "resource",
                      inf->res->resource, "rv", inf->rv, NULL);
            relist_after_expiry(inf, useful);
            return;
        }
        log_write(LOG_WARN, "watch", "watch refused", "resource", inf->res->resource, LOG_NUM "status",
                  sbuf, NULL);
        if(st == 429 || st >= 500) {
            /* 429 is the API server's flow control; 5xx a server error */
            count_restart(inf, st == 429 ? "throttled" : "error");
            backoff(inf, 0, st == 429 || st == 503 ? inf->retry_after : -1);
        } else {
            count_restart(inf, "error");
            backoff(inf, 1, -1);
        }
        return;
    }
    /* transport error: the connection was cut (or never made) */
    count_restart(inf, "cut");
    log_write(useful ? LOG_INFO : LOG_WARN, "watch", "watch stream cut, resuming", "resource",
              inf->res->resource, "rv", inf->rv, "error", inf->cerr[0] ? inf->cerr : curl_easy_strerror(cc), NULL);
    if(useful) {
        inf->failures = 0;
        start_watch(inf);
    } else {
        backoff(inf, 0, -1);
    }
}

/* ------------------------------------------------------------ the loop */

static void *loop(void *arg)
{
    kube_watcher *w = arg;
    for(kube_informer *i = w->infs; i; i = i->next)
        start_list(i);
    while(!atomic_load(&w->stop)) {
        double now = kube_now(), next = now + 1.0;
        int running;
        for(kube_informer *i = w->infs; i; i = i->next) {
            if(i->state == INF_BACKOFF && now >= i->wake_at) {
                if(i->relist)
                    start_list(i);
                else
                    start_watch(i);
            } else if(i->state == INF_WATCHING && i->resync_at > 0 && now >= i->resync_at) {
                log_write(LOG_DEBUG, "watch", "periodic resync: relisting", "resource",
                          i->res->resource, NULL);
                end_transfer(i);
                count_restart(i, "resync");
                start_list(i);
            }
            if(i->state == INF_BACKOFF && i->wake_at < next)
                next = i->wake_at;
            if(i->state == INF_WATCHING && i->resync_at > 0 && i->resync_at < next)
                next = i->resync_at;
        }
        curl_multi_perform(w->multi, &running);
        CURLMsg *m;
        int left;
        while((m = curl_multi_info_read(w->multi, &left))) {
            kube_informer *inf = NULL;
            long st = 0;
            CURLcode cc;
            if(m->msg != CURLMSG_DONE)
                continue;
            cc = m->data.result;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&inf);
            curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &st);
            end_transfer(inf);
            if(atomic_load(&w->stop))
                break;
            if(inf->state == INF_LISTING)
                list_done(inf, cc, st);
            else
                watch_done(inf, cc, st);
        }
        now = kube_now();
        int tmo = next > now ? (int)((next - now) * 1000) + 1 : 0;
        if(tmo > 1000)
            tmo = 1000;
        curl_multi_poll(w->multi, NULL, 0, tmo, NULL);
    }
    for(kube_informer *i = w->infs; i; i = i->next)
        end_transfer(i);
    return NULL;
}

cozy_result kube_watcher_start(kube_watcher *w, cozy_err *err)
{
    if(w->started)
        return cozy_fail(err, COZY_ERR_INTERNAL, "watcher already started");
    w->multi = curl_multi_init();
    if(!w->multi)
        return cozy_fail(err, COZY_ERR_INTERNAL, "cannot create a curl multi handle");
    atomic_store(&w->stop, 0);
    if(pthread_create(&w->th, NULL, loop, w) != 0) {
        curl_multi_cleanup(w->multi);
        w->multi = NULL;
        return cozy_fail(err, COZY_ERR_INTERNAL, "cannot start the watcher thread");
    }
    w->started = 1;
    return COZY_OK;
}

void kube_watcher_stop(kube_watcher *w)
{
    if(!w || !w->started)
        return;
    atomic_store(&w->stop, 1);
    curl_multi_wakeup(w->multi);
    pthread_join(w->th, NULL);
    curl_multi_cleanup(w->multi);
    w->multi = NULL;
    w->started = 0;
    atomic_store(&w->stop, 0);
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
