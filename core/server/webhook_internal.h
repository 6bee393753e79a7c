/* webhook_internal.h — shared between webhook.c, webhook_http.c and
 * webhook_review.c only.
 *
 * Not a public interface: the server's state, the per-connection and
 * per-request records, the metric names, and the calls one part of the
 * server makes into another (webhook.c starts the MHD daemons with the
 * callbacks of webhook_http.c and the review threads of webhook_review.c;
 * webhook_http.c queues complete requests for those threads).
 */
#ifndef COZYGPU_WEBHOOK_INTERNAL_H
#define COZYGPU_WEBHOOK_INTERNAL_H

#include "server/webhook.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "base/buf.h"
#include "server/tls.h"

#define WH_COMPONENT "webhook"

#define WH_REVIEWS "cozygpu_admission_reviews_total"
#define WH_DURATION "cozygpu_admission_review_duration_seconds"
#define WH_CONNS "cozygpu_webhook_connections"
#define WH_BODY_BYTES "cozygpu_webhook_body_bytes_in_flight"
#define WH_REFUSALS "cozygpu_webhook_refusals_total"
#define WH_QUEUED "cozygpu_webhook_reviews_queued"
#define WH_BUSY "cozygpu_webhook_review_threads_busy"
#define WH_MOVED "cozygpu_webhook_reviews_moved_total"

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
    webhook_parse_fn parse; /* NULL: cozy_json_loadb */
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
    atomic_long n_conns;          /* written under conns_lock; cozygpu_webhook_connections reads it */
    pthread_t reaper;
    int reaper_started;
    atomic_int stopping;
    /* the review slots and threads: queued review requests wait in a FIFO
       for one of n_pool review threads and a free slot; their connections
       are suspended meanwhile */
    pthread_mutex_t q_lock;
    pthread_cond_t q_cond;
    struct wh_req *q_head, *q_tail; /* under q_lock */
    atomic_long q_len;              /* written under q_lock; the gauges read these two when scraped */
    int q_stop;                     /* under q_lock: the review threads exit once the queue is empty */
    atomic_long busy;               /* review slots in use */
    int *free_slots;                /* under q_lock: the review slots no review holds, n_free of them */
    unsigned n_free;
    size_t inline_max_body;         /* webhook_options.inline_max_body */
    pthread_t *pool;
    unsigned n_pool;                /* review threads started */
};

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
    /* the review threads (webhook_review.c) */
    struct MHD_Connection *con; /* suspended while queued or under review */
    struct wh_req *qnext;       /* in webhook_server.q_head, under q_lock */
    atomic_int state;           /* WHR_READING, WHR_QUEUED, WHR_ANSWERED */
    unsigned ans_status;        /* the answer a review worker left for the I/O thread */
    const char *ans_ctype;
    char *ans_text;             /* malloc'd, handed to MHD */
    size_t ans_len;
} wh_req;

/* Runs r on the calling I/O thread in a free review slot, when one is free
   and no review waits for one (decision 0052). Returns 1 when r holds its
   answer (send it), 0 when it did not run, -1 when the callback moved it
   (queue it: its body is still there). */
int webhook_review_inline(webhook_server *s, wh_req *r);

enum { WHR_READING = 0, WHR_QUEUED, WHR_ANSWERED };

/* Nanoseconds from a to b (negative when b is earlier). */
static inline long webhook_elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (b->tv_sec - a->tv_sec) * 1000000000L + (b->tv_nsec - a->tv_nsec);
}

/* --- webhook_http.c: MHD callbacks, the reaper, the body budget --------- */

/* MHD's connection notification (cls: the server): on STARTED, tracks the
   TCP connection as a wh_conn with the request deadline from the accept;
   on CLOSED (before MHD closes the socket), forgets and frees it. */
void webhook_conn_notify(void *cls, struct MHD_Connection *con, void **socket_context,
                         enum MHD_ConnectionNotificationCode toe);

/* The reaper thread (arg: the server): shuts down every connection past
   its deadline, every WH_REAP_EVERY_MS, until the server stops. */
void *webhook_reaper(void *arg);

/* Gives n bytes back to the body budget (0: nothing). */
void webhook_body_release(webhook_server *s, size_t n);

/* MHD's URI log callback (cls: the server): the request line is read; sets
   the connection's request deadline and returns a new wh_req, counted in
   in_flight (NULL when out of memory). */
void *webhook_uri_logged(void *cls, const char *uri, struct MHD_Connection *con);

/* MHD's request-completed callback (cls: the server): the response was sent
   or the connection dropped; sets the idle deadline and frees the wh_req
   (no longer in flight, its body bytes back to the budget). */
void webhook_completed(void *cls, struct MHD_Connection *con, void **con_cls,
                       enum MHD_RequestTerminationCode toe);

/* The probe listener's handler (cls: the server): GET or HEAD of /healthz,
   /readyz, /metrics over plain HTTP; anything else 404 or 405. */
enum MHD_Result webhook_probe_access(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                                     const char *version, const char *upload_data, size_t *upload_data_size,
                                     void **con_cls);

/* The TLS listener's handler (cls: the server): routes and checks the
   request, keeps its body within max_body and the budget, reviews the
   complete request on this thread (webhook_review_inline) or queues it for
   a review thread (webhook_pool_push), and sends the answer once it has
   one. */
enum MHD_Result webhook_access(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls);

/* --- webhook_review.c: review slots and threads ------------------------- */

/* Suspends r's connection and queues r for a review thread (I/O thread).
   Returns 0, or -1 when the pool is stopping (nothing done). */
int webhook_pool_push(webhook_server *s, wh_req *r, struct MHD_Connection *con);

/* A review thread (arg: the server): takes queued requests in FIFO order,
   each with a free review slot, reviews each (or answers 503 once the pool
   stops), leaves the answer in
   the request and resumes its connection; returns once the pool stops and
   the queue is empty. */
void *webhook_pool_main(void *arg);

/* Stops the review threads once the queue is empty (what is still queued
   is answered 503) and joins them; each finishes the review it runs, which
   its deadline bounds. */
void webhook_pool_stop(webhook_server *s);

#endif
