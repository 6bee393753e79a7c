/* webhook.c — admission webhook HTTPS server (webhook.h).
 *
 * Request life: MHD calls wh_uri_logged() once the request line is read
 * (the request is then "in flight"), wh_access() once the headers are in
 * (route, method, Content-Type, Content-Length checks), again per body chunk
 * (kept up to the ceiling) and once more at the end (parse, check, review,
 * answer), and wh_completed() when the response has been sent or the
 * connection dropped (no longer in flight). Certificates: MHD hands every
 * TLS handshake to webhook_tls_retrieve() (server/tls.c), which loads,
 * reloads and copies the pair.
 */
#include "server/webhook.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
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

#define WH_COMPONENT "webhook"
#define WH_TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"
#define WH_DEFAULT_MAX_BODY (3u * 1024u * 1024u) /* k8s.io/apiserver: maxRequestBodyBytes 3 MiB */
#define WH_DEFAULT_TIMEOUT_MS 8000L
#define WH_DEFAULT_WORKERS 4u
#define WH_DEFAULT_CONN_TIMEOUT_S 120u

#define WH_REVIEWS "cozygpu_admission_reviews_total"
#define WH_DURATION "cozygpu_admission_review_duration_seconds"

typedef struct wh_endpoint_labels {
    char *webhook;                  /* webhook="name" */
    char *allowed, *denied, *error; /* webhook="name",decision="..." */
} wh_endpoint_labels;

struct webhook_server {
    struct MHD_Daemon *daemon;
    int port;
    const webhook_endpoint *endpoints;
    size_t n_endpoints;
    wh_endpoint_labels *labels;
    size_t max_body;
    long timeout_ms;
    webhook_review_fn review;
    void *ctx;
    int (*ready)(void *ctx);
    atomic_int in_flight;
    atomic_int quiescing;
    atomic_int started; /* MHD log messages after start are debug noise (bad handshakes) */
    webhook_tls *tls;   /* the certificate pair (server/tls.h) */
};

static long wh_elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (b->tv_sec - a->tv_sec) * 1000000000L + (b->tv_nsec - a->tv_nsec);
}

/* --- requests ----------------------------------------------------------- */

typedef struct wh_req {
    struct timespec start; /* CLOCK_MONOTONIC, request line read */
    int counted;           /* in s->in_flight */
    int routed;
    const webhook_endpoint *ep;
    size_t ep_index;
    cozy_buf body; /* up to the server's max_body */
    int too_large;
} wh_req;

static void *wh_uri_logged(void *cls, const char *uri, struct MHD_Connection *con)
{
    (void)uri;
    (void)con;
    webhook_server *s = cls;
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
    (void)con;
    (void)toe;
    webhook_server *s = cls;
    wh_req *r = *con_cls;
    if(!r)
        return;
    if(r->counted)
        atomic_fetch_sub(&s->in_flight, 1);
    cozy_buf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

static enum MHD_Result wh_send(webhook_server *s, struct MHD_Connection *con, unsigned status, const char *ctype,
                               char *body, size_t len, enum MHD_ResponseMemoryMode mode, const char *allow)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, mode);
    if(!resp) {
        if(mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if(allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
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
        if(s->ready && !s->ready(s->ctx))
            return wh_text(s, con, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "not ready\n");
        return wh_send(s, con, MHD_HTTP_OK, "text/plain; charset=utf-8", "ok", 2, MHD_RESPMEM_PERSISTENT, NULL);
    }
    char *text = metrics_render();
    if(!text)
        return wh_text(s, con, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory\n");
    return wh_send(s, con, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text),
                   MHD_RESPMEM_MUST_FREE, NULL);
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

static enum MHD_Result wh_review(webhook_server *s, struct MHD_Connection *con, wh_req *r)
{
    const webhook_endpoint *ep = r->ep;
    const wh_endpoint_labels *lab = &s->labels[r->ep_index];
    json_error_t jerr;
    /* duplicate keys are refused, as `cozygpu review` refuses them: one
     * decoding for both (issue 11) */
    json_t *doc = json_loadb(r->body.p ? r->body.p : "", r->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if(!doc)
        return wh_text(s, con, MHD_HTTP_BAD_REQUEST, NULL,
                       "cozygpu webhook %s: the body is not JSON: %s (line %d, column %d)\n", ep->name, jerr.text,
                       jerr.line, jerr.column);
    char why[256];
    const char *problem = wh_review_problem(doc, why, sizeof why);
    if(problem) {
        json_decref(doc);
        return wh_text(s, con, MHD_HTTP_BAD_REQUEST, NULL,
                       "cozygpu webhook %s: the body is not an admission.k8s.io/v1 AdmissionReview: %s\n", ep->name,
                       problem);
    }
    const char *uid = json_string_value(json_object_get(json_object_get(doc, "request"), "uid"));
    struct timespec deadline = r->start;
    deadline.tv_sec += s->timeout_ms / 1000;
    deadline.tv_nsec += (s->timeout_ms % 1000) * 1000000L;
    if(deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    json_t *out = NULL;
    webhook_decision said = WEBHOOK_ERROR;
    int rc = s->review(s->ctx, ep, doc, &deadline, &out, &said);
    const char *bad = rc != 0 ? "the review callback failed" : wh_response_problem(out, uid);
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
    if(!text) /* out of memory: the API server's failurePolicy Fail refuses for us */
        return wh_text(s, con, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "cozygpu webhook %s: internal error\n", ep->name);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double took = wh_elapsed_ns(&r->start, &now) / 1e9;
    metrics_counter_add(WH_REVIEWS, decision, 1);
    metrics_histogram_observe(WH_DURATION, lab->webhook, took);
    if(wh_elapsed_ns(&deadline, &now) > 0)
        log_write(LOG_WARN, WH_COMPONENT, "review answered after its deadline", "webhook", ep->name, NULL);
    return wh_send(s, con, MHD_HTTP_OK, "application/json", text, strlen(text), MHD_RESPMEM_MUST_FREE, NULL);
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
            char *p = n > 0 ? cozy_grow(NULL, &r->body.cap, n + 1, 1) : NULL;
            if(p) /* room for the whole body at once (else it grows as it comes) */
                r->body.p = p;
        }
        return MHD_YES;
    }
    if(*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        int rc = r->too_large ? EFBIG : cozy_buf_add(&r->body, upload_data, n);
        if(rc == EFBIG) {
            r->too_large = 1; /* chunked body: drain it, answer 413 at the end */
            return MHD_YES;
        }
        return rc == 0 ? MHD_YES : MHD_NO;
    }
    if(r->too_large)
        return wh_text(s, con, MHD_HTTP_CONTENT_TOO_LARGE, NULL,
                       "cozygpu webhook %s: body is above the limit of %zu bytes\n", r->ep->name, s->max_body);
    return wh_review(s, con, r);
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
    unsigned flags = MHD_USE_TLS | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
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
    unsigned conn_timeout = o->connection_timeout_s ? o->connection_timeout_s : WH_DEFAULT_CONN_TIMEOUT_S;
    errno = 0;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, wh_access, s, MHD_OPTION_EXTERNAL_LOGGER, wh_mhd_log, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, workers, MHD_OPTION_HTTPS_PRIORITIES, WH_TLS_PRIORITIES,
        MHD_OPTION_HTTPS_CERT_CALLBACK2, webhook_tls_retrieve, MHD_OPTION_URI_LOG_CALLBACK, wh_uri_logged, s,
        MHD_OPTION_NOTIFY_COMPLETED, wh_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, conn_timeout,
        MHD_OPTION_END);
    if(!s->daemon) {
        int e = errno;
        wh_free(s);
        return cozy_fail(err, COZY_ERR_IO, "webhook: cannot listen on %s port %d%s%s", addr, o->port, e ? ": " : "",
                         e ? strerror(e) : "");
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : o->port;
    webhook_tls_set_port(s->tls, s->port);
    atomic_store(&s->started, 1);
    char port[16], serial[80];
    snprintf(port, sizeof port, "%d", s->port);
    webhook_tls_serial(s->tls, serial, sizeof serial);
    log_write(LOG_INFO, WH_COMPONENT, "serving admission reviews", "address", addr, "port", port, "serial", serial,
              NULL);
    *out = s;
    return COZY_OK;
}

int webhook_port(const webhook_server *s)
{
    return s->port;
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
    MHD_stop_daemon(s->daemon);
    wh_free(s);
}
