/* watch_stream.c — informers on one curl multi loop (watch.h): the lists,
 * the watch streams and the loop that drives them.
 *
 * Every informer is a state machine driven by the watcher thread only
 * (list, watch, back off, relist); what it reads goes into the caches
 * through watch.c. Watch bodies are read as chunked JSON lines: the
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
        kube_watch_set_rv(inf, kube_watch_meta(obj, "resourceVersion"));
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
        kube_watch_apply_event(inf, type, obj);
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
        kube_watch_set_str(&inf->cont, NULL);
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
        kube_watch_set_str(&inf->cont, NULL);
        json_object_clear(inf->pending);
        kube_watch_commit_list(inf, "", NULL);
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
        kube_watch_set_str(&inf->cont, NULL);
        backoff(inf, 1, st == 429 ? inf->retry_after : -1);
        return;
    }
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        if(inf->transform && json_is_object(it))
            inf->transform(inf->res, it);
        char *k = kube_watch_obj_key(it);
        if(k)
            json_object_set(inf->pending, k, it);
        free(k);
    }
    const char *cont = json_string_value(json_object_get(json_object_get(body, "metadata"), "continue"));
    if(cont && *cont) {
        kube_watch_set_str(&inf->cont, cont);
        json_decref(body);
        start_list(inf);
        return;
    }
    kube_watch_set_str(&inf->cont, NULL);
    const char *rv = json_string_value(json_object_get(json_object_get(body, "metadata"), "resourceVersion"));
    kube_watch_commit_list(inf, rv ? rv : "", inf->cur);
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
            kube_watch_count_restart(inf, "expired");
            log_write(LOG_INFO, "watch", "resourceVersion expired, relisting", "resource",
                      inf->res->resource, "rv", inf->rv, NULL);
            relist_after_expiry(inf, useful);
            return;
        case AB_THROTTLED:
            kube_watch_count_restart(inf, "throttled");
            backoff(inf, 0, -1);
            return;
        default:
            kube_watch_count_restart(inf, "error");
            backoff(inf, 1, -1);
            return;
        }
    }
    if(cc == CURLE_OK && st == 200) {
        /* the server closed the stream (timeoutSeconds, or a cut with a clean end) */
        kube_watch_count_restart(inf, "closed");
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
            kube_watch_count_restart(inf, "expired");
            log_write(LOG_INFO, "watch", "resourceVersion expired, relisting", "resource",
                      inf->res->resource, "rv", inf->rv, NULL);
            relist_after_expiry(inf, useful);
            return;
        }
        log_write(LOG_WARN, "watch", "watch refused", "resource", inf->res->resource, LOG_NUM "status",
                  sbuf, NULL);
        if(st == 429 || st >= 500) {
            /* 429 is the API server's flow control; 5xx a server error */
            kube_watch_count_restart(inf, st == 429 ? "throttled" : "error");
            backoff(inf, 0, st == 429 || st == 503 ? inf->retry_after : -1);
        } else {
            kube_watch_count_restart(inf, "error");
            backoff(inf, 1, -1);
        }
        return;
    }
    /* transport error: the connection was cut (or never made) */
    kube_watch_count_restart(inf, "cut");
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
                kube_watch_count_restart(i, "resync");
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
