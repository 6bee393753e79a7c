/* webhook.c — admission webhook HTTPS server (webhook.h).
 *
 * Request life: MHD calls wh_uri_logged() once the request line is read
 * (the request is then "in flight"), wh_access() once the headers are in
 * (route, method, Content-Type, Content-Length checks), again per body chunk
 * (kept up to the ceiling) and once more at the end (parse, check, review,
 * answer), and wh_completed() when the response has been sent or the
 * connection dropped (no longer in flight).
 *
 * Client bounds (decision 0015): libmicrohttpd limits connections in all
 * and per address and the header memory of each. wh_conn_notify() keeps a
 * wh_conn per TCP connection, with the deadline by which its request must
 * be complete; the reaper thread shuts down (shutdown(2), so MHD sees the
 * peer gone and closes it on its own thread) any connection past its
 * deadline. The list is under conns_lock, and MHD calls the CLOSED
 * notification before it closes the socket, so the reaper never touches a
 * closed (or reused) descriptor. Review bodies take bytes from the
 * body_budget before they are kept (wh_body_reserve) and give them back
 * when the body is freed. Certificates: MHD hands every
 * TLS handshake to webhook_tls_retrieve() (server/tls.c), which loads,
 * reloads and copies the pair.
 */
#include "server/webhook.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/metrics.h"
#include "server/tls.h"

/* Connections the probe listener keeps (kubelet, Prometheus). */
#define WH_PROBE_MAX_CONNS 32
#define WH_COMPONENT "webhook"
#define WH_TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"
#define WH_DEFAULT_MAX_BODY (3u * 1024u * 1024u) /* k8s.io/apiserver: maxRequestBodyBytes 3 MiB */
#define WH_DEFAULT_TIMEOUT_MS 8000L
#define WH_DEFAULT_WORKERS 4u
#define WH_DEFAULT_IO_THREADS 2u
#define WH_DEFAULT_CONN_TIMEOUT_S 120u
#define WH_DEFAULT_MAX_CONNS 512u
#define WH_DEFAULT_MAX_CONNS_PER_ADDR 128u
#define WH_DEFAULT_REQUEST_TIMEOUT_MS 10000L /* the webhooks' timeoutSeconds */
#define WH_DEFAULT_BODY_BUDGET (64u * 1024u * 1024u)
#define WH_CONN_MEMORY (32u * 1024u) /* MHD's pool per connection: request line, headers, IO buffers */
#define WH_REAP_EVERY_MS 100L
#define WH_STOP_SEND_MS 2000L /* webhook_stop: time for answers already made to go out */
#define WH_READY_WHY_MAX 1024  /* /readyz: the ready callback's reason buffer */

#define WH_REVIEWS "cozygpu_admission_reviews_total"
#define WH_DURATION "cozygpu_admission_review_duration_seconds"
#define WH_CONNS "cozygpu_webhook_connections"
#define WH_BODY_BYTES "cozygpu_webhook_body_bytes_in_flight"
#define WH_REFUSALS "cozygpu_webhook_refusals_total"
#define WH_QUEUED "cozygpu_webhook_reviews_queued"
#define WH_BUSY "cozygpu_webhook_review_threads_busy"

/* One TCP connection (MHD's socket context). */
typedef struct wh_conn {
    struct wh_conn *prev, *next; /* in webhook_server.conns, under conns_lock */
    int fd;
    atomic_llong deadline_ms; /* CLOCK_MONOTONIC ms by which the request must be complete; 0: none */
    int reaped;               /* shut down by the reaper (under conns_lock) */
} wh_conn;

typedef struct wh_endpoint_labels {
    char *webhook;                  /* webhook="name" */
    char *allowed, *denied, *error; /* webhook="name",decision="..." */
} wh_endpoint_labels;

struct wh_req;

struct webhook_server {
    struct MHD_Daemon *daemon;
    struct MHD_Daemon *probe_daemon; /* /healthz, /readyz, /metrics on their own thread, or NULL */
    int port;
    int probe_port;
    const webhook_endpoint *endpoints;
    size_t n_endpoints;
    wh_endpoint_labels *labels;
    size_t max_body;
    long timeout_ms;
    webhook_review_fn review;
    void *ctx;
    webhook_ready_fn ready;
    atomic_int in_flight;
    atomic_int quiescing;
    atomic_int started; /* MHD log messages after start are debug noise (bad handshakes) */
    webhook_tls *tls;   /* the certificate pair (server/tls.h) */
    long request_timeout_ms;
    long idle_ms;                 /* connection_timeout_s in ms */
    size_t body_budget;           /* max_body_bytes_in_flight */
    atomic_size_t body_in_flight; /* bytes reserved from body_budget */
    pthread_mutex_t conns_lock;
    wh_conn *conns;               /* open connections */
    long n_conns;
    pthread_t reaper;
    int reaper_started;
    atomic_int stopping;
    /* the review pool: complete review requests wait in a FIFO for one of
       n_pool review threads; their connections are suspended meanwhile */
    pthread_mutex_t q_lock;
    pthread_cond_t q_cond;
    struct wh_req *q_head, *q_tail; /* under q_lock */
    long q_len;                     /* under q_lock */
    int q_stop;                     /* under q_lock: the review threads exit once the queue is empty */
    long busy;                      /* under q_lock: review threads running a review */
    pthread_t *pool;
    unsigned n_pool;                /* review threads started */
};

static long wh_elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (b->tv_sec - a->tv_sec) * 1000000000L + (b->tv_nsec - a->tv_nsec);
}

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

static void wh_conn_notify(void *cls, struct MHD_Connection *con, void **socket_context,
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
        long n = ++s->n_conns;
        pthread_mutex_unlock(&s->conns_lock);
        metrics_gauge_set(WH_CONNS, "", (double)n);
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
    long n = --s->n_conns;
    pthread_mutex_unlock(&s->conns_lock);
    metrics_gauge_set(WH_CONNS, "", (double)n);
    free(c);
    *socket_context = NULL;
}

/* Shuts down every connection past its deadline, every WH_REAP_EVERY_MS,
   until the server stops. */
static void *wh_reaper(void *arg)
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
    metrics_gauge_set(WH_BODY_BYTES, "", (double)(cur + n));
    return 0;
}

static void wh_body_release(webhook_server *s, size_t n)
{
    if(!n)
        return;
    size_t left = atomic_fetch_sub(&s->body_in_flight, n) - n;
    metrics_gauge_set(WH_BODY_BYTES, "", (double)left);
}

/* --- requests ----------------------------------------------------------- */

typedef struct wh_req {
    struct timespec start; /* CLOCK_MONOTONIC, request line read */
    int counted;           /* in s->in_flight */
    int routed;
    const webhook_endpoint *ep;
    size_t ep_index;
    cozy_buf body; /* up to the server's max_body */
    size_t reserved; /* bytes taken from the body budget for body */
    int too_large;
    int over_budget; /* a chunked body went above the budget: drained, not kept, 503 */
    /* the review pool (see "review pool" below) */
    struct MHD_Connection *con; /* suspended while queued or under review */
    struct wh_req *qnext;       /* in webhook_server.q_head, under q_lock */
    atomic_int state;           /* WHR_READING, WHR_QUEUED, WHR_ANSWERED */
    unsigned ans_status;        /* the answer a review worker left for the I/O thread */
    const char *ans_ctype;
    char *ans_text;             /* malloc'd, handed to MHD */
    size_t ans_len;
} wh_req;

enum { WHR_READING = 0, WHR_QUEUED, WHR_ANSWERED };

static void *wh_uri_logged(void *cls, const char *uri, struct MHD_Connection *con)
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

static void wh_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe)
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
    wh_body_release(s, r->reserved);
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
 * workers busy with reviews cannot make the replica look dead (issue 11).
 * GET or HEAD of /healthz, /readyz, /metrics; anything else 404 or 405. A
 * body is never read. */
static enum MHD_Result wh_probe_access(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                                       const char *version, const char *upload_data, size_t *upload_data_size,
                                       void **con_cls)
{
    (void)version, (void)upload_data, (void)upload_data_size, (void)con_cls;
    return wh_builtin(cls, con, url, method);
}

/* NULL when `doc` is an admission.k8s.io/v1 AdmissionReview with a request
   and a request.uid; else what is wrong with it. */
static const char *wh_review_problem(const json_t *doc, char *buf, size_t len)
{
    if(!json_is_object(doc))
        return "the body is not a JSON object";
    const char *av = json_string_value(json_object_get(doc, "apiVersion"));
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    if(!kind || strcmp(kind, "AdmissionReview") != 0) {
        snprintf(buf, len, "kind is %s%s%s, want \"AdmissionReview\"", kind ? "\"" : "", kind ? kind : "missing",
                 kind ? "\"" : "");
        return buf;
    }
    if(!av || strcmp(av, "admission.k8s.io/v1") != 0) {
        snprintf(buf, len, "apiVersion is %s%s%s, want \"admission.k8s.io/v1\" (admissionReviewVersions: [v1])",
                 av ? "\"" : "", av ? av : "missing", av ? "\"" : "");
        return buf;
    }
    const json_t *req = json_object_get(doc, "request");
    if(!json_is_object(req))
        return "request is missing or not an object";
    const char *uid = json_string_value(json_object_get(req, "uid"));
    if(!uid || !*uid)
        return "request.uid is missing or empty";
    return NULL;
}

/* NULL when the callback's answer is usable; else why not. */
static const char *wh_response_problem(const json_t *out, const char *uid)
{
    if(!json_is_object(out))
        return "no AdmissionReview";
    const json_t *resp = json_object_get(out, "response");
    if(!json_is_object(resp))
        return "response missing";
    const char *ruid = json_string_value(json_object_get(resp, "uid"));
    if(!ruid || strcmp(ruid, uid) != 0)
        return "response.uid differs from request.uid";
    if(!json_is_boolean(json_object_get(resp, "allowed")))
        return "response.allowed missing";
    return NULL;
}

/* Leaves a plain-text answer in r for the I/O thread (review threads). */
static void wh_answer_text(wh_req *r, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void wh_answer_text(wh_req *r, unsigned status, const char *fmt, ...)
{
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    r->ans_status = status;
    r->ans_ctype = "text/plain; charset=utf-8";
    r->ans_text = n < 0 ? NULL : msg; /* NULL: the I/O thread closes the connection */
    r->ans_len = n < 0 ? 0 : (size_t)n;
}

/* Parses, checks and reviews r's body, and leaves the answer in r. Runs on
 * a review thread; touches neither the connection nor MHD. */
static void wh_review(webhook_server *s, wh_req *r)
{
    const webhook_endpoint *ep = r->ep;
    const wh_endpoint_labels *lab = &s->labels[r->ep_index];
    json_error_t jerr;
    /* duplicate keys are refused, as `cozygpu review` refuses them: one
     * decoding for both (issue 11) */
    json_t *doc = json_loadb(r->body.p ? r->body.p : "", r->body.len, JSON_REJECT_DUPLICATES, &jerr);
    cozy_buf_free(&r->body); /* parsed: its bytes go back to the budget */
    r->body = (cozy_buf){ 0 };
    wh_body_release(s, r->reserved);
    r->reserved = 0;
    if(!doc) {
        wh_answer_text(r, MHD_HTTP_BAD_REQUEST, "cozygpu webhook %s: the body is not JSON: %s (line %d, column %d)\n",
                       ep->name, jerr.text, jerr.line, jerr.column);
        return;
    }
    char why[256];
    const char *problem = wh_review_problem(doc, why, sizeof why);
    if(problem) {
        json_decref(doc);
        wh_answer_text(r, MHD_HTTP_BAD_REQUEST,
                       "cozygpu webhook %s: the body is not an admission.k8s.io/v1 AdmissionReview: %s\n", ep->name,
                       problem);
        return;
    }
    const char *uid = json_string_value(json_object_get(json_object_get(doc, "request"), "uid"));
    struct timespec deadline = r->start;
    deadline.tv_sec += s->timeout_ms / 1000;
    deadline.tv_nsec += (s->timeout_ms % 1000) * 1000000L;
    if(deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    json_t *out = NULL;
    webhook_decision said = WEBHOOK_ERROR;
    const char *bad;
    if(wh_elapsed_ns(&deadline, &now) >= 0) {
        /* waited for a review thread past its deadline: the API server has
           given up or is about to; refuse without running it */
        bad = "its deadline passed while it waited for a review thread (every one was busy)";
    } else {
        int rc = s->review(s->ctx, ep, doc, &deadline, &out, &said);
        bad = rc != 0 ? "the review callback failed" : wh_response_problem(out, uid);
    }
    const char *decision;
    if(bad) {
        log_write(LOG_ERROR, WH_COMPONENT, "review failed; refusing (fail closed)", "webhook", ep->name, "uid", uid,
                  "error", bad, NULL);
        json_decref(out);
        char msg[300];
        snprintf(msg, sizeof msg, "cozygpu webhook %s: internal error", ep->name);
        out = json_pack("{s:O?,s:s,s:{s:s,s:b,s:{s:i,s:s}}}", "apiVersion", json_object_get(doc, "apiVersion"), "kind",
                        "AdmissionReview", "response", "uid", uid, "allowed", 0, "status", "code", 500, "message", msg);
        decision = lab->error;
    } else {
        int allowed = json_is_true(json_object_get(json_object_get(out, "response"), "allowed"));
        decision = said == WEBHOOK_ERROR               ? lab->error
                   : said == WEBHOOK_ALLOWED && allowed ? lab->allowed
                                                        : lab->denied;
    }
    json_decref(doc);
    char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    if(!text) { /* out of memory: the API server's failurePolicy Fail refuses for us */
        wh_answer_text(r, MHD_HTTP_INTERNAL_SERVER_ERROR, "cozygpu webhook %s: internal error\n", ep->name);
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    double took = wh_elapsed_ns(&r->start, &now) / 1e9;
    metrics_counter_add(WH_REVIEWS, decision, 1);
    metrics_histogram_observe(WH_DURATION, lab->webhook, took);
    if(wh_elapsed_ns(&deadline, &now) > 0)
        log_write(LOG_WARN, WH_COMPONENT, "review answered after its deadline", "webhook", ep->name, NULL);
    r->ans_status = MHD_HTTP_OK;
    r->ans_ctype = "application/json";
    r->ans_text = text;
    r->ans_len = strlen(text);
}

/* --- review pool ----------------------------------------------------------
 * libmicrohttpd's threads only move bytes: a complete review request is
 * queued (FIFO) and its connection suspended (MHD_suspend_connection); one
 * of n_pool review threads takes it, runs wh_review, leaves the answer in
 * the request and resumes the connection (MHD_resume_connection, which
 * wakes the I/O thread through its inter-thread channel); MHD then calls
 * wh_access again and the answer is queued there. So a review stuck until
 * its deadline holds one review thread and nothing else: other reviews go
 * to the free threads, whatever connection or I/O thread they came on
 * (issue 11; decision 0017). */

/* Under q_lock, so that the last value set is the current one. */
static void wh_pool_gauges(webhook_server *s)
{
    metrics_gauge_set(WH_QUEUED, "", (double)s->q_len);
    metrics_gauge_set(WH_BUSY, "", (double)s->busy);
}

/* Suspends r's connection and queues r for a review thread (I/O thread).
   Returns 0, or -1 when the pool is stopping (nothing done). */
static int wh_pool_push(webhook_server *s, wh_req *r, struct MHD_Connection *con)
{
    pthread_mutex_lock(&s->q_lock);
    if(s->q_stop) {
        pthread_mutex_unlock(&s->q_lock);
        return -1;
    }
    r->con = con;
    atomic_store(&r->state, WHR_QUEUED);
    MHD_suspend_connection(con); /* before a review thread can see r and resume it */
    r->qnext = NULL;
    if(s->q_tail)
        s->q_tail->qnext = r;
    else
        s->q_head = r;
    s->q_tail = r;
    s->q_len++;
    wh_pool_gauges(s);
    pthread_cond_signal(&s->q_cond);
    pthread_mutex_unlock(&s->q_lock);
    return 0;
}

static void *wh_pool_main(void *arg)
{
    webhook_server *s = arg;
    for(;;) {
        pthread_mutex_lock(&s->q_lock);
        while(!s->q_head && !s->q_stop)
            pthread_cond_wait(&s->q_cond, &s->q_lock);
        wh_req *r = s->q_head;
        if(!r) { /* stopping and nothing left */
            pthread_mutex_unlock(&s->q_lock);
            return NULL;
        }
        s->q_head = r->qnext;
        if(!s->q_head)
            s->q_tail = NULL;
        s->q_len--;
        s->busy++;
        wh_pool_gauges(s);
        int stopping = s->q_stop;
        pthread_mutex_unlock(&s->q_lock);
        if(stopping)
            wh_answer_text(r, MHD_HTTP_SERVICE_UNAVAILABLE, "cozygpu webhook %s: shutting down\n", r->ep->name);
        else
            wh_review(s, r);
        pthread_mutex_lock(&s->q_lock);
        s->busy--;
        wh_pool_gauges(s);
        pthread_mutex_unlock(&s->q_lock);
        struct MHD_Connection *con = r->con;
        atomic_store(&r->state, WHR_ANSWERED); /* r belongs to the I/O thread again */
        MHD_resume_connection(con);
    }
}

/* Stops the review threads once the queue is empty (what is still queued
   is answered 503) and joins them; each finishes the review it runs, which
   its deadline bounds. */
static void wh_pool_stop(webhook_server *s)
{
    pthread_mutex_lock(&s->q_lock);
    s->q_stop = 1;
    pthread_cond_broadcast(&s->q_cond);
    pthread_mutex_unlock(&s->q_lock);
    for(unsigned i = 0; i < s->n_pool; i++)
        pthread_join(s->pool[i], NULL);
    s->n_pool = 0;
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

static enum MHD_Result wh_access(void *cls, struct MHD_Connection *con, const char *url, const char *method,
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
    if(atomic_load(&r->state) == WHR_ANSWERED) { /* resumed by a review thread */
        char *text = r->ans_text;
        r->ans_text = NULL;
        if(!text)
            return MHD_NO;
        return wh_send(s, con, r->ans_status, r->ans_ctype, text, r->ans_len, MHD_RESPMEM_MUST_FREE, NULL);
    }
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
                wh_body_release(s, r->reserved);
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
    if(wh_pool_push(s, r, con) != 0)
        return wh_text(s, con, MHD_HTTP_SERVICE_UNAVAILABLE, "1", "cozygpu webhook %s: shutting down\n", r->ep->name);
    return MHD_YES;
}

static void wh_mhd_log(void *cls, const char *fmt, va_list ap)
{
    webhook_server *s = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while(n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    /* after start, MHD mostly reports clients that went away or failed the
       TLS handshake (an old TLS version, a scanner): not worth a warning */
    log_write(atomic_load(&s->started) ? LOG_DEBUG : LOG_WARN, WH_COMPONENT, "libmicrohttpd", "detail", msg, NULL);
}

/* --- lifecycle ---------------------------------------------------------- */

void webhook_declare_metrics(void)
{
    metrics_declare(WH_REVIEWS, "counter",
                    "Admission reviews answered, by webhook and decision (allowed, denied, error: the review failed "
                    "and was refused, or a policy failed).");
    metrics_declare(WH_DURATION, "histogram",
                    "Time from a review's request line to its response being queued, by webhook.");
    metrics_declare(WH_CONNS, "gauge", "Open connections to the webhook server.");
    metrics_declare(WH_BODY_BYTES, "gauge",
                    "Bytes of review bodies held at once (declared Content-Length or received), against "
                    "--max-body-bytes-in-flight.");
    metrics_declare(WH_QUEUED, "gauge",
                    "Complete review requests waiting for a review thread (their connections suspended).");
    metrics_declare(WH_BUSY, "gauge", "Review threads running a review, against --workers.");
    metrics_declare(WH_REFUSALS, "counter",
                    "Requests refused for a client bound, by reason (request_timeout: the connection had no "
                    "complete request in time and was closed; body_budget: 503, bodies in flight at their budget).");
}

static char *wh_label(const char *name, const char *decision)
{
    char *esc = metrics_escape(name), *out = NULL;
    if(!esc)
        return NULL;
    if(decision) {
        if(asprintf(&out, "webhook=\"%s\",decision=\"%s\"", esc, decision) < 0)
            out = NULL;
    } else if(asprintf(&out, "webhook=\"%s\"", esc) < 0) {
        out = NULL;
    }
    free(esc);
    return out;
}

static void wh_free(webhook_server *s)
{
    if(!s)
        return;
    for(size_t i = 0; s->labels && i < s->n_endpoints; i++) {
        free(s->labels[i].webhook);
        free(s->labels[i].allowed);
        free(s->labels[i].denied);
        free(s->labels[i].error);
    }
    free(s->labels);
    free(s->pool);
    pthread_mutex_destroy(&s->conns_lock);
    pthread_mutex_destroy(&s->q_lock);
    pthread_cond_destroy(&s->q_cond);
    webhook_tls_unregister(s->tls); /* no handshake reaches it any more */
    webhook_tls_free(s->tls);
    free(s);
}

cozy_result webhook_start(webhook_server **out, const webhook_options *o, cozy_err *err)
{
    *out = NULL;
    if(!o->endpoints || o->n_endpoints == 0 || !o->review)
        return cozy_fail(err, COZY_ERR_USAGE, "webhook: no endpoints or no review callback");
    if(!o->cert_file || !o->key_file)
        return cozy_fail(err, COZY_ERR_USAGE, "webhook: a certificate and a key file are required");
    if(o->port < 0 || o->port > 65535)
        return cozy_fail(err, COZY_ERR_USAGE, "webhook: port %d out of range", o->port);
    const char *addr = o->address ? o->address : "0.0.0.0";
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_TLS | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if(inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)o->port);
    } else if(inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)o->port);
        flags |= MHD_USE_IPv6;
    } else {
        return cozy_fail(err, COZY_ERR_USAGE, "webhook: address %s is not an IPv4 or IPv6 literal", addr);
    }

    webhook_server *s = calloc(1, sizeof *s);
    if(!s)
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory");
    s->endpoints = o->endpoints;
    s->n_endpoints = o->n_endpoints;
    s->max_body = o->max_body_bytes ? o->max_body_bytes : WH_DEFAULT_MAX_BODY;
    s->timeout_ms = o->review_timeout_ms > 0 ? o->review_timeout_ms : WH_DEFAULT_TIMEOUT_MS;
    s->review = o->review;
    s->ctx = o->ctx;
    s->ready = o->ready;
    s->request_timeout_ms = o->request_timeout_ms > 0 ? o->request_timeout_ms : WH_DEFAULT_REQUEST_TIMEOUT_MS;
    s->idle_ms = 1000L * (o->connection_timeout_s ? o->connection_timeout_s : WH_DEFAULT_CONN_TIMEOUT_S);
    s->body_budget = o->max_body_bytes_in_flight ? o->max_body_bytes_in_flight : WH_DEFAULT_BODY_BUDGET;
    atomic_init(&s->body_in_flight, 0);
    pthread_mutex_init(&s->conns_lock, NULL);
    pthread_mutex_init(&s->q_lock, NULL);
    pthread_cond_init(&s->q_cond, NULL);
    s->labels = calloc(o->n_endpoints, sizeof *s->labels);
    if(!s->labels) {
        wh_free(s);
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory");
    }
    for(size_t i = 0; i < o->n_endpoints; i++) {
        wh_endpoint_labels *l = &s->labels[i];
        const char *name = o->endpoints[i].name ? o->endpoints[i].name : o->endpoints[i].path;
        l->webhook = wh_label(name, NULL);
        l->allowed = wh_label(name, "allowed");
        l->denied = wh_label(name, "denied");
        l->error = wh_label(name, "error");
        if(!l->webhook || !l->allowed || !l->denied || !l->error || !o->endpoints[i].path) {
            wh_free(s);
            return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory or endpoint without a path");
        }
    }
    char why[512];
    int trc = webhook_tls_open(&s->tls, o->cert_file, o->key_file, why, sizeof why);
    if(trc != 0) {
        wh_free(s);
        if(trc == -2)
            return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory");
        return cozy_fail(err, COZY_ERR_IO, "webhook: TLS: %s", why);
    }
    webhook_declare_metrics();

    if(webhook_tls_register(s->tls) != 0) {
        wh_free(s);
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: more than %d servers in one process",
                         WEBHOOK_TLS_MAX_SERVERS);
    }

    unsigned workers = o->workers ? o->workers : WH_DEFAULT_WORKERS;
    unsigned io_threads = o->io_threads ? o->io_threads : WH_DEFAULT_IO_THREADS;
    if(!(s->pool = calloc(workers, sizeof *s->pool))) {
        wh_free(s);
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory");
    }
    for(; s->n_pool < workers; s->n_pool++)
        if(pthread_create(&s->pool[s->n_pool], NULL, wh_pool_main, s) != 0) {
            wh_pool_stop(s);
            wh_free(s);
            return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: cannot start review thread %u of %u", s->n_pool + 1,
                             workers);
        }
    unsigned conn_timeout = o->connection_timeout_s ? o->connection_timeout_s : WH_DEFAULT_CONN_TIMEOUT_S;
    unsigned max_conns = o->max_connections ? o->max_connections : WH_DEFAULT_MAX_CONNS;
    unsigned per_addr = o->max_connections_per_address ? o->max_connections_per_address : WH_DEFAULT_MAX_CONNS_PER_ADDR;
    if(max_conns < io_threads) /* MHD gives each I/O thread max_conns / io_threads */
        max_conns = io_threads;
    errno = 0;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, wh_access, s, MHD_OPTION_EXTERNAL_LOGGER, wh_mhd_log, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, io_threads, MHD_OPTION_HTTPS_PRIORITIES, WH_TLS_PRIORITIES,
        MHD_OPTION_HTTPS_CERT_CALLBACK2, webhook_tls_retrieve, MHD_OPTION_URI_LOG_CALLBACK, wh_uri_logged, s,
        MHD_OPTION_NOTIFY_COMPLETED, wh_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, conn_timeout,
        MHD_OPTION_CONNECTION_LIMIT, max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_addr,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)WH_CONN_MEMORY, MHD_OPTION_NOTIFY_CONNECTION, wh_conn_notify, s,
        MHD_OPTION_END);
    if(!s->daemon) {
        int e = errno;
        wh_pool_stop(s);
        wh_free(s);
        return cozy_fail(err, COZY_ERR_IO, "webhook: cannot listen on %s port %d%s%s", addr, o->port, e ? ": " : "",
                         e ? strerror(e) : "");
    }
    if(pthread_create(&s->reaper, NULL, wh_reaper, s) != 0) {
        MHD_stop_daemon(s->daemon);
        wh_pool_stop(s);
        wh_free(s);
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: cannot start the connection reaper thread");
    }
    s->reaper_started = 1;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : o->port;
    if(o->probe_port != 0) {
        int pp = o->probe_port > 0 ? o->probe_port : 0;
        struct sockaddr_storage ps = ss;
        if(ps.ss_family == AF_INET)
            ((struct sockaddr_in *)&ps)->sin_port = htons((uint16_t)pp);
        else
            ((struct sockaddr_in6 *)&ps)->sin6_port = htons((uint16_t)pp);
        unsigned pflags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | (ps.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
        s->probe_daemon = MHD_start_daemon(pflags, (uint16_t)pp, NULL, NULL, wh_probe_access, s,
                                           MHD_OPTION_EXTERNAL_LOGGER, wh_mhd_log, s, MHD_OPTION_SOCK_ADDR,
                                           (struct sockaddr *)&ps, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                                           MHD_OPTION_CONNECTION_LIMIT, (unsigned)WH_PROBE_MAX_CONNS,
                                           MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)WH_PROBE_MAX_CONNS / 2,
                                           MHD_OPTION_END);
        if(!s->probe_daemon) {
            int e = errno;
            atomic_store(&s->stopping, 1);
            pthread_join(s->reaper, NULL);
            MHD_stop_daemon(s->daemon);
            wh_pool_stop(s);
            wh_free(s);
            return cozy_fail(err, COZY_ERR_IO, "webhook: cannot listen for probes on %s port %d%s%s", addr, pp,
                             e ? ": " : "", e ? strerror(e) : "");
        }
        const union MHD_DaemonInfo *pinfo = MHD_get_daemon_info(s->probe_daemon, MHD_DAEMON_INFO_BIND_PORT);
        s->probe_port = pinfo ? pinfo->port : pp;
    }
    webhook_tls_set_port(s->tls, s->port);
    atomic_store(&s->started, 1);
    char port[16], serial[80];
    snprintf(port, sizeof port, "%d", s->port);
    webhook_tls_serial(s->tls, serial, sizeof serial);
    log_write(LOG_INFO, WH_COMPONENT, "serving admission reviews", "address", addr, LOG_NUM "port", port, "serial",
              serial, NULL);
    *out = s;
    return COZY_OK;
}

int webhook_port(const webhook_server *s)
{
    return s->port;
}

int webhook_probe_port(const webhook_server *s)
{
    return s->probe_daemon ? s->probe_port : 0;
}

void webhook_quiesce(webhook_server *s)
{
    if(atomic_exchange(&s->quiescing, 1))
        return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if(fd != MHD_INVALID_SOCKET)
        close(fd); /* refuse new connections now rather than leave them in the backlog */
    log_write(LOG_INFO, WH_COMPONENT, "stopped accepting connections", NULL);
}

int webhook_in_flight(const webhook_server *s)
{
    return atomic_load(&((webhook_server *)s)->in_flight);
}

int webhook_drain(webhook_server *s, long grace_ms)
{
    webhook_quiesce(s);
    struct timespec start, now, step = { 0, 10 * 1000000L };
    clock_gettime(CLOCK_MONOTONIC, &start);
    for(;;) {
        int n = webhook_in_flight(s);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if(n == 0 || wh_elapsed_ns(&start, &now) >= grace_ms * 1000000L)
            return n;
        nanosleep(&step, NULL);
    }
}

void webhook_stop(webhook_server *s)
{
    if(!s)
        return;
    atomic_store(&s->stopping, 1);
    if(s->reaper_started)
        pthread_join(s->reaper, NULL);
    if(s->probe_daemon)
        MHD_stop_daemon(s->probe_daemon);
    /* no connection may be suspended when MHD stops: the review threads
       answer (or refuse) and resume every queued review first; then the
       I/O threads get a moment to send those answers (MHD_stop_daemon
       closes connections without sending what is queued) */
    wh_pool_stop(s);
    struct timespec start, now, step = { 0, 5 * 1000000L };
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        if(webhook_in_flight(s) == 0)
            break;
        nanosleep(&step, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while(wh_elapsed_ns(&start, &now) < WH_STOP_SEND_MS * 1000000L);
    MHD_stop_daemon(s->daemon);
    wh_free(s);
}
