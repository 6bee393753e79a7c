/* webhook.c — admission webhook HTTPS server (webhook.h): its lifecycle.
 *
 * Starts the TLS listener (libmicrohttpd, TLS 1.2/1.3 only), the review
 * threads (webhook_review.c), the connection reaper (webhook_http.c) and
 * the optional plain-HTTP probe listener; quiesces, drains and stops them.
 * The request side (the request life, the client bounds of decision 0015)
 * is in webhook_http.c, the review slots and threads (decisions 0017,
 * 0052) in webhook_review.c, the types they share in webhook_internal.h.
 *
 * Certificates: MHD hands every TLS handshake to webhook_tls_retrieve()
 * (server/tls.c), which loads, reloads and copies the pair.
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
#include <unistd.h>

#include "base/log.h"
#include "base/metrics.h"
#include "server/tls.h"
#include "server/webhook_internal.h"

/* Connections the probe listener keeps (kubelet, Prometheus). */
#define WH_PROBE_MAX_CONNS 32
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
#define WH_STOP_SEND_MS 2000L /* webhook_stop: time for answers already made to go out */

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
    metrics_declare(WH_BUSY, "gauge", "Review slots in use (a review running), against --workers.");
    metrics_declare(WH_MOVED, "counter",
                    "Reviews begun on the I/O thread that read them and run again on a review thread (their "
                    "policies ran past the slice of CPU time they get there), by webhook.");
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

/* The gauges that change on every review, read when /metrics is scraped
 * (metrics_gauge_read): no metrics lock per review, never stale. */
static double wh_read_conns(void *ctx) { return (double)atomic_load(&((webhook_server *)ctx)->n_conns); }
static double wh_read_body(void *ctx) { return (double)atomic_load(&((webhook_server *)ctx)->body_in_flight); }
static double wh_read_queued(void *ctx) { return (double)atomic_load(&((webhook_server *)ctx)->q_len); }
static double wh_read_busy(void *ctx) { return (double)atomic_load(&((webhook_server *)ctx)->busy); }

static const struct {
    const char *family;
    double (*read)(void *);
} wh_gauges[] = {
    {WH_CONNS, wh_read_conns}, {WH_BODY_BYTES, wh_read_body}, {WH_QUEUED, wh_read_queued}, {WH_BUSY, wh_read_busy},
};

static void wh_free(webhook_server *s)
{
    if(!s)
        return;
    for(size_t i = 0; i < sizeof wh_gauges / sizeof *wh_gauges; i++)
        metrics_gauge_unread(wh_gauges[i].family, "", s);
    for(size_t i = 0; s->labels && i < s->n_endpoints; i++) {
        free(s->labels[i].webhook);
        free(s->labels[i].allowed);
        free(s->labels[i].denied);
        free(s->labels[i].error);
    }
    free(s->labels);
    free(s->pool);
    free(s->free_slots);
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
    s->parse = o->parse;
    s->ctx = o->ctx;
    s->ready = o->ready;
    s->request_timeout_ms = o->request_timeout_ms > 0 ? o->request_timeout_ms : WH_DEFAULT_REQUEST_TIMEOUT_MS;
    s->idle_ms = 1000L * (o->connection_timeout_s ? o->connection_timeout_s : WH_DEFAULT_CONN_TIMEOUT_S);
    s->body_budget = o->max_body_bytes_in_flight ? o->max_body_bytes_in_flight : WH_DEFAULT_BODY_BUDGET;
    atomic_init(&s->body_in_flight, 0);
    atomic_init(&s->n_conns, 0);
    atomic_init(&s->q_len, 0);
    atomic_init(&s->busy, 0);
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
    for(size_t i = 0; i < sizeof wh_gauges / sizeof *wh_gauges; i++)
        metrics_gauge_read(wh_gauges[i].family, "", wh_gauges[i].read, s);

    if(webhook_tls_register(s->tls) != 0) {
        wh_free(s);
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: more than %d servers in one process",
                         WEBHOOK_TLS_MAX_SERVERS);
    }

    unsigned workers = o->workers ? o->workers : WH_DEFAULT_WORKERS;
    unsigned io_threads = o->io_threads ? o->io_threads : WH_DEFAULT_IO_THREADS;
    if(!(s->pool = calloc(workers, sizeof *s->pool)) || !(s->free_slots = calloc(workers, sizeof *s->free_slots))) {
        wh_free(s);
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory");
    }
    for(unsigned i = 0; i < workers; i++) /* slot 0 taken first */
        s->free_slots[s->n_free++] = (int)(workers - 1 - i);
    s->inline_max_body = o->inline_max_body;
    for(; s->n_pool < workers; s->n_pool++)
        if(pthread_create(&s->pool[s->n_pool], NULL, webhook_pool_main, s) != 0) {
            webhook_pool_stop(s);
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
        flags, (uint16_t)o->port, NULL, NULL, webhook_access, s, MHD_OPTION_EXTERNAL_LOGGER, wh_mhd_log, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, io_threads, MHD_OPTION_HTTPS_PRIORITIES, WH_TLS_PRIORITIES,
        MHD_OPTION_HTTPS_CERT_CALLBACK2, webhook_tls_retrieve, MHD_OPTION_URI_LOG_CALLBACK, webhook_uri_logged, s,
        MHD_OPTION_NOTIFY_COMPLETED, webhook_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, conn_timeout,
        MHD_OPTION_CONNECTION_LIMIT, max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_addr,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)WH_CONN_MEMORY, MHD_OPTION_NOTIFY_CONNECTION, webhook_conn_notify, s,
        MHD_OPTION_END);
    if(!s->daemon) {
        int e = errno;
        webhook_pool_stop(s);
        wh_free(s);
        return cozy_fail(err, COZY_ERR_IO, "webhook: cannot listen on %s port %d%s%s", addr, o->port, e ? ": " : "",
                         e ? strerror(e) : "");
    }
    if(pthread_create(&s->reaper, NULL, webhook_reaper, s) != 0) {
        MHD_stop_daemon(s->daemon);
        webhook_pool_stop(s);
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
        s->probe_daemon = MHD_start_daemon(pflags, (uint16_t)pp, NULL, NULL, webhook_probe_access, s,
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
            webhook_pool_stop(s);
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
        if(n == 0 || webhook_elapsed_ns(&start, &now) >= grace_ms * 1000000L)
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
    webhook_pool_stop(s);
    struct timespec start, now, step = { 0, 5 * 1000000L };
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        if(webhook_in_flight(s) == 0)
            break;
        nanosleep(&step, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while(webhook_elapsed_ns(&start, &now) < WH_STOP_SEND_MS * 1000000L);
    MHD_stop_daemon(s->daemon);
    wh_free(s);
}
