/* webhook_http.c — the webhook server's HTTP side: connections, request
 * callbacks, the body budget, the built-in and probe endpoints.
 *
 * Request life: MHD calls webhook_uri_logged() once the request line is read
 * (the request is then "in flight"), webhook_access() once the headers are in
 * (route, method, Content-Type, Content-Length checks), again per body chunk
 * (kept up to the ceiling) and once more at the end (the complete request
 * is reviewed on this thread when it can be, else it goes to the review
 * threads, webhook_review.c, which parse, check and review it; its answer
 * is queued when a review thread resumes the connection), and
 * webhook_completed() when the response has been sent or the connection
 * dropped (no longer in flight).
 *
 * Client bounds (decision 0015): libmicrohttpd limits connections in all
 * and per address and the header memory of each. webhook_conn_notify() keeps a
 * wh_conn per TCP connection, with the deadline by which its request must
 * be complete; the reaper thread shuts down (shutdown(2), so MHD sees the
 * peer gone and closes it on its own thread) any connection past its
 * deadline. The list is under conns_lock, and MHD calls the CLOSED
 * notification before it closes the socket, so the reaper never touches a
 * closed (or reused) descriptor. Review bodies take bytes from the
 * body_budget before they are kept (wh_body_reserve) and give them back
 * when the body is freed.
 */
#include "server/webhook.h"

#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/metrics.h"
#include "server/webhook_internal.h"

#define WH_REAP_EVERY_MS 100L
#define WH_READY_WHY_MAX 1024  /* /readyz: the ready callback's reason buffer */

static long long wh_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* --- connections and their deadlines -------------------------------------- */

static wh_conn *wh_conn_of(struct MHD_Connection *con)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Sets the connection's deadline to `ms` (0: none). */
static void wh_conn_deadline(struct MHD_Connection *con, long long ms)
{
    wh_conn *c = wh_conn_of(con);
    if(c)
        atomic_store(&c->deadline_ms, ms);
}

void webhook_conn_notify(void *cls, struct MHD_Connection *con, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe)
{
    webhook_server *s = cls;
    if(toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
        wh_conn *c = calloc(1, sizeof *c);
        if(!c || !ci) { /* untracked: MHD's idle timeout still closes it */
            free(c);
            log_write(LOG_WARN, WH_COMPONENT, "cannot track a new connection (out of memory)", NULL);
            return;
        }
        c->fd = ci->connect_fd;
        atomic_init(&c->deadline_ms, wh_now_ms() + s->request_timeout_ms);
        pthread_mutex_lock(&s->conns_lock);
        c->next = s->conns;
        if(s->conns)
            s->conns->prev = c;
        s->conns = c;
        atomic_fetch_add(&s->n_conns, 1);
        pthread_mutex_unlock(&s->conns_lock);
        *socket_context = c;
        return;
    }
    wh_conn *c = *socket_context;
    if(!c)
        return;
    pthread_mutex_lock(&s->conns_lock); /* before MHD closes the descriptor */
    if(c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if(c->next)
        c->next->prev = c->prev;
    atomic_fetch_sub(&s->n_conns, 1);
    pthread_mutex_unlock(&s->conns_lock);
    free(c);
    *socket_context = NULL;
}

/* Shuts down every connection past its deadline, every WH_REAP_EVERY_MS,
   until the server stops. */
void *webhook_reaper(void *arg)
{
    webhook_server *s = arg;
    struct timespec step = { 0, WH_REAP_EVERY_MS * 1000000L };
    while(!atomic_load(&s->stopping)) {
        nanosleep(&step, NULL);
        long long now = wh_now_ms();
        int reaped = 0;
        pthread_mutex_lock(&s->conns_lock);
        for(wh_conn *c = s->conns; c; c = c->next) {
            long long d = atomic_load(&c->deadline_ms);
            if(d && now >= d && !c->reaped) {
                c->reaped = 1;
                shutdown(c->fd, SHUT_RDWR);
                reaped++;
            }
        }
        pthread_mutex_unlock(&s->conns_lock);
        if(reaped) {
            metrics_counter_add(WH_REFUSALS, "reason=\"request_timeout\"", reaped);
            char n[16];
            snprintf(n, sizeof n, "%d", reaped);
            log_write(LOG_DEBUG, WH_COMPONENT, "closed connections without a complete request in time", LOG_NUM "count",
                      n, NULL);
        }
    }
    return NULL;
}

/* --- the body budget ------------------------------------------------------ */

/* Takes n bytes from the budget; 0, or -1 when that would go above it. */
static int wh_body_reserve(webhook_server *s, size_t n)
{
    size_t cur = atomic_load(&s->body_in_flight);
    do {
        if(n > s->body_budget || cur > s->body_budget - n)
            return -1;
    } while(!atomic_compare_exchange_weak(&s->body_in_flight, &cur, cur + n));
    return 0;
}

void webhook_body_release(webhook_server *s, size_t n)
{
    if(!n)
        return;
    atomic_fetch_sub(&s->body_in_flight, n);
}

/* --- requests ----------------------------------------------------------- */

void *webhook_uri_logged(void *cls, const char *uri, struct MHD_Connection *con)
{
    (void)uri;
    webhook_server *s = cls;
    /* the rest of the request within request_timeout of its request line
       (on a new connection, the deadline from the accept is earlier) */
    wh_conn *c = wh_conn_of(con);
    if(c) {
        long long d = atomic_load(&c->deadline_ms), mine = wh_now_ms() + s->request_timeout_ms;
        if(!d || mine < d)
            atomic_store(&c->deadline_ms, mine);
    }
    wh_req *r = calloc(1, sizeof *r);
    if(!r)
        return NULL;
    clock_gettime(CLOCK_MONOTONIC, &r->start);
    r->counted = 1;
    atomic_fetch_add(&s->in_flight, 1);
    return r;
}

void webhook_completed(void *cls, struct MHD_Connection *con, void **con_cls,
                       enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    webhook_server *s = cls;
    /* a kept-alive connection: the next request line within the idle timeout */
    wh_conn_deadline(con, s->idle_ms ? wh_now_ms() + s->idle_ms : 0);
    wh_req *r = *con_cls;
    if(!r)
        return;
    if(r->counted)
        atomic_fetch_sub(&s->in_flight, 1);
    cozy_buf_free(&r->body);
    webhook_body_release(s, r->reserved);
    free(r->ans_text);
    free(r);
    *con_cls = NULL;
}

static enum MHD_Result wh_send(webhook_server *s, struct MHD_Connection *con, unsigned status, const char *ctype,
                               char *body, size_t len, enum MHD_ResponseMemoryMode mode, const char *allow)
{
    /* allow: the Allow header (405), or for a 503 the Retry-After seconds */
    wh_conn_deadline(con, 0); /* the request is complete, or no more of it is read */
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, mode);
    if(!resp) {
        if(mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if(allow)
        MHD_add_response_header(resp, status == MHD_HTTP_SERVICE_UNAVAILABLE ? MHD_HTTP_HEADER_RETRY_AFTER
                                                                              : MHD_HTTP_HEADER_ALLOW,
                                allow);
    if(atomic_load(&s->quiescing))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(con, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result wh_text(webhook_server *s, struct MHD_Connection *con, unsigned status, const char *allow,
                               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result wh_text(webhook_server *s, struct MHD_Connection *con, unsigned status, const char *allow,
                               const char *fmt, ...)
{
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    if(n < 0)
        return MHD_NO;
    return wh_send(s, con, status, "text/plain; charset=utf-8", msg, (size_t)n, MHD_RESPMEM_MUST_FREE, allow);
}

/* Sends the answer a review left in r (no answer: the connection closes). */
static enum MHD_Result wh_send_answer(webhook_server *s, struct MHD_Connection *con, wh_req *r)
{
    char *text = r->ans_text;
    r->ans_text = NULL;
    if(!text)
        return MHD_NO;
    return wh_send(s, con, r->ans_status, r->ans_ctype, text, r->ans_len, MHD_RESPMEM_MUST_FREE, NULL);
}

static int wh_content_type_json(const char *ct)
{
    if(!ct)
        return 0;
    while(*ct == ' ' || *ct == '\t')
        ct++;
    size_t n = strcspn(ct, ";");
    while(n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
        n--;
    return n == strlen("application/json") && strncasecmp(ct, "application/json", n) == 0;
}

static enum MHD_Result wh_builtin(webhook_server *s, struct MHD_Connection *con, const char *url, const char *method)
{
    int get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if(strcmp(url, "/healthz") != 0 && strcmp(url, "/readyz") != 0 && strcmp(url, "/metrics") != 0)
        return wh_text(s, con, MHD_HTTP_NOT_FOUND, NULL, "404 page not found: %s\n", url);
    if(!get)
        return wh_text(s, con, MHD_HTTP_METHOD_NOT_ALLOWED, "GET, HEAD", "%s: method %s not allowed\n", url, method);
    if(strcmp(url, "/healthz") == 0)
        return wh_send(s, con, MHD_HTTP_OK, "text/plain; charset=utf-8", "ok", 2, MHD_RESPMEM_PERSISTENT, NULL);
    if(strcmp(url, "/readyz") == 0) {
        if(atomic_load(&s->quiescing))
            return wh_text(s, con, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "shutting down\n");
        char why[WH_READY_WHY_MAX] = "";
        if(s->ready && !s->ready(s->ctx, why, sizeof why)) {
            why[sizeof why - 1] = '\0';
            why[strcspn(why, "\r\n")] = '\0'; /* one line */
            return wh_text(s, con, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "not ready%s%s\n", why[0] ? ": " : "", why);
        }
        return wh_send(s, con, MHD_HTTP_OK, "text/plain; charset=utf-8", "ok", 2, MHD_RESPMEM_PERSISTENT, NULL);
    }
    char *text = metrics_render();
    if(!text)
        return wh_text(s, con, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory\n");
    return wh_send(s, con, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text),
                   MHD_RESPMEM_MUST_FREE, NULL);
}

/* The probe listener's handler: plain HTTP, on its own thread, so that
 * workers busy with reviews cannot make the replica look dead (a hardening fix).
 * GET or HEAD of /healthz, /readyz, /metrics; anything else 404 or 405. A
 * body is never read. */
enum MHD_Result webhook_probe_access(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                                     const char *version, const char *upload_data, size_t *upload_data_size,
                                     void **con_cls)
{
    (void)version, (void)upload_data, (void)upload_data_size, (void)con_cls;
    return wh_builtin(cls, con, url, method);
}


/* 503 with Retry-After: 1 for a body the budget has no room for (declared:
   its Content-Length, 0 for a chunked one). 503, not 413: the body is within
   max_body and would be accepted once others are done; client-go's REST
   client, which the API server calls webhooks with, retries a 503 that
   carries Retry-After while the call's timeout allows. */
static enum MHD_Result wh_busy(webhook_server *s, struct MHD_Connection *con, wh_req *r, unsigned long long declared)
{
    metrics_counter_add(WH_REFUSALS, "reason=\"body_budget\"", 1);
    char n[24];
    snprintf(n, sizeof n, "%llu", declared);
    /* debug, as the reaper's: under a flood a line per refusal would be a
       flood of its own; cozygpu_webhook_refusals_total is the signal */
    log_write(LOG_DEBUG, WH_COMPONENT, "review body refused: bodies in flight at their budget", "webhook", r->ep->name,
              LOG_NUM "content_length", n, NULL);
    return wh_text(s, con, MHD_HTTP_SERVICE_UNAVAILABLE, "1",
                   "cozygpu webhook %s: too many review bodies in flight (budget %zu bytes); retry\n", r->ep->name,
                   s->body_budget);
}

enum MHD_Result webhook_access(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls)
{
    (void)version;
    webhook_server *s = cls;
    wh_req *r = *con_cls;
    if(!r) { /* the URI callback could not allocate */
        if(!(r = calloc(1, sizeof *r)))
            return MHD_NO;
        clock_gettime(CLOCK_MONOTONIC, &r->start);
        *con_cls = r;
    }
    if(atomic_load(&r->state) == WHR_ANSWERED) /* resumed by a review thread */
        return wh_send_answer(s, con, r);
    if(!r->routed) {
        r->routed = 1;
        r->body.max = s->max_body; /* whatever the route: no body is kept past it */
        for(size_t i = 0; i < s->n_endpoints && !r->ep; i++)
            if(strcmp(url, s->endpoints[i].path) == 0) {
                r->ep = &s->endpoints[i];
                r->ep_index = i;
            }
        if(!r->ep)
            return wh_builtin(s, con, url, method);
        if(strcmp(method, MHD_HTTP_METHOD_POST) != 0)
            return wh_text(s, con, MHD_HTTP_METHOD_NOT_ALLOWED, "POST", "cozygpu webhook %s: method %s not allowed\n",
                           r->ep->name, method);
        const char *ct = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        if(!wh_content_type_json(ct))
            return wh_text(s, con, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, NULL,
                           "cozygpu webhook %s: Content-Type is %s, want application/json\n", r->ep->name,
                           ct ? ct : "missing");
        const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if(cl) {
            unsigned long long n = strtoull(cl, NULL, 10);
            if(n > s->max_body)
                return wh_text(s, con, MHD_HTTP_CONTENT_TOO_LARGE, NULL,
                               "cozygpu webhook %s: body of %llu bytes is above the limit of %zu\n", r->ep->name, n,
                               s->max_body);
            if(n > 0 && wh_body_reserve(s, (size_t)n) != 0)
                return wh_busy(s, con, r, n);
            r->reserved = (size_t)n;
            char *p = n > 0 ? cozy_grow(NULL, &r->body.cap, n + 1, 1) : NULL;
            if(p) /* room for the whole body at once (else it grows as it comes) */
                r->body.p = p;
        }
        return MHD_YES;
    }
    if(*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if(r->too_large || r->over_budget)
            return MHD_YES; /* drained, not kept */
        if(r->body.len + n > r->reserved) { /* chunked, or more than declared */
            size_t more = r->body.len + n - r->reserved;
            if(r->body.len + n <= s->max_body && wh_body_reserve(s, more) != 0) {
                r->over_budget = 1;
                cozy_buf_free(&r->body);
                r->body = (cozy_buf){ 0 };
                webhook_body_release(s, r->reserved);
                r->reserved = 0;
                return MHD_YES;
            }
            if(r->body.len + n <= s->max_body)
                r->reserved += more;
        }
        int rc = cozy_buf_add(&r->body, upload_data, n);
        if(rc == EFBIG) {
            r->too_large = 1; /* chunked body: drain it, answer 413 at the end */
            return MHD_YES;
        }
        return rc == 0 ? MHD_YES : MHD_NO;
    }
    wh_conn_deadline(con, 0); /* the request is complete: the review has its own deadline */
    if(r->too_large)
        return wh_text(s, con, MHD_HTTP_CONTENT_TOO_LARGE, NULL,
                       "cozygpu webhook %s: body is above the limit of %zu bytes\n", r->ep->name, s->max_body);
    if(r->over_budget)
        return wh_busy(s, con, r, 0);
    /* first on this thread, when the body is small and a slot is free
       (decision 0052); a review the callback moves goes on below */
    if(s->inline_max_body && r->body.len <= s->inline_max_body && webhook_review_inline(s, r) == 1)
        return wh_send_answer(s, con, r);
    if(webhook_pool_push(s, r, con) != 0)
        return wh_text(s, con, MHD_HTTP_SERVICE_UNAVAILABLE, "1", "cozygpu webhook %s: shutting down\n", r->ep->name);
    return MHD_YES;
}
