/* webhook.h — the admission webhook HTTPS server (libmicrohttpd + GnuTLS).
 *
 * What the API server expects of a webhook (Kubernetes docs,
 * "Dynamic Admission Control", and k8s.io/apiserver
 * pkg/admission/plugin/webhook/request/admissionreview.go): HTTPS, a POST of
 * an `admission.k8s.io/v1` AdmissionReview with `Content-Type:
 * application/json`, answered with HTTP 200 and an AdmissionReview of the same
 * apiVersion whose `response.uid` equals `request.uid`. The API server sends
 * at most 3 MiB (its request body limit) and waits `timeoutSeconds` (1-30,
 * default 10).
 *
 * This server:
 *  - speaks TLS 1.2 and 1.3 only ("NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2");
 *  - hands each new handshake the current certificate and key: the files are
 *    stat()ed (following symlinks, so a Kubernetes Secret volume's `..data`
 *    swap is seen) at most once a second, on a handshake; when the device,
 *    inode, size or mtime of either changed the pair is loaded aside and, if
 *    it loads and the key matches the certificate, replaces the old pair;
 *    otherwise the old pair keeps serving and a warning is logged (once per
 *    change of the files);
 *  - serves one POST path per webhook (405 for other methods, with `Allow`),
 *    refuses a body above max_body_bytes (413), another Content-Type (415),
 *    a body that is not JSON or not an `admission.k8s.io/v1` AdmissionReview
 *    with a `request.uid` (400, with a message saying what is wrong);
 *  - GET /healthz (200 "ok"), /readyz (200 "ok" while `ready` says so and the
 *    server is not quiescing; else 503 with a text/plain body that says
 *    why: "shutting down" while quiescing, "not ready: <the reason `ready`
 *    gave>", or "not ready" when it gave none), /metrics (metrics_render());
 *    anything else is 404;
 *  - bounds what clients hold (decision 0015): open connections in all and
 *    per client address (libmicrohttpd's limits), the time from accept to a
 *    complete request (a deadline no trickle of bytes extends: a reaper
 *    thread shuts down connections past it), and the bytes of review bodies
 *    held at once (503 with Retry-After above it, the body not kept);
 *    libmicrohttpd keeps at most 32 KiB per connection for the request line
 *    and headers (MHD_OPTION_CONNECTION_MEMORY_LIMIT; it refuses a larger
 *    request);
 *  - exports gauges cozygpu_webhook_connections (open connections) and
 *    cozygpu_webhook_body_bytes_in_flight, and counts
 *    cozygpu_webhook_refusals_total{reason="request_timeout"|"body_budget"};
 *  - counts cozygpu_admission_reviews_total{webhook,decision} (allowed,
 *    denied, or error: the callback failed or said the review failed) and
 *    observes cozygpu_admission_review_duration_seconds{webhook} (from the
 *    request line received to the response queued) per review.
 *
 * Threads: `io_threads` libmicrohttpd threads (epoll) move bytes: TLS,
 * headers, bodies, answers, for many connections each. Reviews run in one
 * of `workers` review slots (the controller keeps a Lua state per slot:
 * webhook_review_slot). A complete review request whose body is at most
 * `inline_max_body` bytes is first run on the I/O thread that read it,
 * when a slot is free and no review waits for one, with `inline_run` set:
 * the callback may then give up early (WEBHOOK_MOVE; the controller does
 * after a slice of CPU time) and the request goes on as any other. Any
 * other is queued (first in, first out) with its connection suspended;
 * one of `workers` review threads takes it with a free slot, runs the
 * callback and hands the answer back. A review stuck until its deadline
 * therefore holds one review thread and its slot, and an I/O thread for
 * at most the slice (docs/decisions/0017, 0052). A review whose deadline
 * passed while it waited is refused (500, counted as an error) without
 * the callback. Gauges: cozygpu_webhook_reviews_queued,
 * cozygpu_webhook_review_threads_busy (slots in use). The callbacks must
 * be thread-safe.
 */
#ifndef COZYGPU_WEBHOOK_H
#define COZYGPU_WEBHOOK_H

#include <jansson.h>
#include <stddef.h>
#include <time.h>

#include "base/result.h"

typedef struct webhook_server webhook_server;

typedef struct webhook_endpoint {
    const char *path; /* "/validate/vmi"; exact match, no query */
    const char *name; /* metric and log label: "vmi-validate" */
    int phase;        /* for the callback: engine_phase (ENGINE_VALIDATE, ENGINE_MUTATE) */
} webhook_endpoint;

/* What a review came to, as the callback reports it: the metric's
 * `decision` label, decided by the callback's own code (the engine's
 * outcome), never inferred from a status code or a message. */
typedef enum webhook_decision {
    WEBHOOK_ALLOWED = 0,
    WEBHOOK_DENIED,  /* refused by a rule, or a request the callback refuses */
    WEBHOOK_ERROR,   /* refused because a policy or the callback failed (fail closed) */
} webhook_decision;

/* What a review callback answers: one of
 *   review: a new AdmissionReview (the server takes the reference) with
 *     the request's apiVersion and kind and response.uid = request.uid;
 *     the server checks it and writes it out;
 *   text: the AdmissionReview already written as compact JSON (malloc'd,
 *     the server frees it; len its length), with `allowed` what its
 *     response.allowed says; the callback vouches for its shape
 *     (response.uid = request.uid, allowed a boolean): the controller's
 *     comes from engine_review_text, which checks both (decision 0051).
 * The server hands it over zeroed. */
typedef struct webhook_answer {
    json_t *review;
    char *text;
    size_t len;
    int allowed;
} webhook_answer;

/* What a review callback returns, when it was called with `inline_run`,
 * to have the review run again on a review thread (its answer, if any,
 * is dropped; the parse hook runs again there too). */
#define WEBHOOK_MOVE 1

/* Called for each valid review, in a review slot (webhook_review_slot).
 * review: the AdmissionReview as received (borrowed; apiVersion
 *   admission.k8s.io/v1, kind AdmissionReview, request an object with a
 *   non-empty string uid), as the parse hook made it, if any.
 * deadline: CLOCK_MONOTONIC time by which the answer should be ready
 *   (review_timeout_ms after the request line arrived).
 * inline_run: 1 on the I/O thread that read the request (other
 *   connections wait meanwhile): the callback may stop early and return
 *   WEBHOOK_MOVE; 0 on a review thread.
 * answer: set to the answer (webhook_answer).
 * decision: set to what the review came to (the server starts it at
 *   WEBHOOK_ERROR). A response that does not allow is never counted as
 *   allowed, whatever the callback says.
 * Returns 0, WEBHOOK_MOVE (inline_run only), or -1 on an internal
 * error. On -1 (or WEBHOOK_MOVE on a review thread), or a missing or malformed
 * response (no response object, wrong uid, no boolean allowed), the server
 * answers a fail-closed refusal: allowed=false, status.code 500, message
 * "cozygpu webhook <name>: internal error", counted as an error. */
typedef int (*webhook_review_fn)(void *ctx, const webhook_endpoint *ep, const json_t *review,
                                 const struct timespec *deadline, int inline_run, webhook_answer *answer,
                                 webhook_decision *decision);

/* The review slot, 0 to workers - 1, the calling thread holds while the
 * parse hook and the review callback run on it; -1 elsewhere. One slot
 * runs one review at a time, so state per slot (a Lua engine) needs no
 * lock. */
int webhook_review_slot(void);

/* 1 while the parse hook and the review callback run inline, on the I/O
 * thread that read the request (the callback also gets it as
 * `inline_run`): the parse hook can then leave work that grows with the
 * cluster to the review thread the callback moves the review to. */
int webhook_running_inline(void);

/* Reads a review's body (`len` bytes at `body`, borrowed) into the
 * document the server checks and hands to review; called in the review
 * slot that then calls review with that document, right after it, when
 * the document is an AdmissionReview the server accepts (else nothing
 * follows). Must answer as cozy_json_loadb(body, len,
 * JSON_REJECT_DUPLICATES, error) does (base/jsonload.h): a new reference,
 * or NULL with *error filled, the same error for the same text; it may
 * leave out of the document what its review callback reads elsewhere
 * (the controller's keeps request.object and request.oldObject in its
 * engine, decision 0049). */
typedef json_t *(*webhook_parse_fn)(void *ctx, const webhook_endpoint *ep, const char *body, size_t len,
                                    json_error_t *error);

/* /readyz asks it on the probe or an I/O thread (so it must be quick and
 * thread-safe). Returns nonzero when the replica is ready. Otherwise
 * returns 0 and may write why into `why` (a buffer of `why_size` bytes,
 * at least 256, handed over holding ""): one short line without a newline,
 * NUL-terminated, cut to fit, e.g. "watch caches not synced (gpuclaims,
 * nodes)"; the server answers 503 "not ready: <why>". */
typedef int (*webhook_ready_fn)(void *ctx, char *why, size_t why_size);

typedef struct webhook_options {
    const char *address;                  /* IPv4 or IPv6 literal; NULL: "0.0.0.0" */
    int port;                             /* 0: any free port (see webhook_port) */
    const char *cert_file, *key_file;     /* PEM: certificate (chain) and private key */
    const webhook_endpoint *endpoints;    /* borrowed; must outlive the server */
    size_t n_endpoints;
    unsigned workers;                     /* review threads and review slots; 0: 4 */
    unsigned io_threads;                  /* libmicrohttpd threads (TLS and HTTP); 0: 2 */
    size_t max_body_bytes;                /* 0: 3 MiB (the API server's limit) */
    long review_timeout_ms;               /* per-review deadline; <= 0: 8000 (webhook timeoutSeconds 10) */
    unsigned connection_timeout_s;        /* idle keep-alive connection closed after; 0: 120 */
    /* What one client can hold (docs/decisions/0015, which has the
     * arithmetic of the defaults against the Deployment's 512Mi limit): */
    unsigned max_connections;             /* open connections in all, libmicrohttpd's
                                             MHD_OPTION_CONNECTION_LIMIT (split evenly
                                             among the workers); 0: 512 */
    unsigned max_connections_per_address; /* open connections from one client IP address,
                                             MHD_OPTION_PER_IP_CONNECTION_LIMIT; a new one
                                             above it is closed at once; 0: 128 */
    long request_timeout_ms;              /* a complete request (TLS handshake, headers and
                                             body) within this many ms of the accept, or of
                                             the request line on a kept-alive connection
                                             (which must come within connection_timeout_s
                                             of the previous response), else the connection
                                             is shut down; <= 0: 10000 (the webhooks'
                                             timeoutSeconds: the API server has given up
                                             by then) */
    size_t max_body_bytes_in_flight;      /* bytes of review bodies held at once across all
                                             connections (declared Content-Length, or what
                                             a chunked body has brought); a request that
                                             would go above it is answered 503 with
                                             Retry-After: 1, without keeping its body;
                                             0: 64 MiB */
    size_t inline_max_body;               /* a review whose body is at most this many bytes
                                             runs first on the I/O thread that read it
                                             (inline_run); 0: never, every review goes
                                             to a review thread */
    webhook_review_fn review;
    webhook_parse_fn parse;               /* NULL: cozy_json_loadb, duplicate keys refused */
    void *ctx;                            /* for review, parse and ready */
    webhook_ready_fn ready;               /* /readyz; NULL: always ready */
    /* Probes on their own listener and thread (plain HTTP, same address):
     * GET /healthz, /readyz, /metrics answer there even while every review
     * worker is busy. > 0: that port; 0: none; WEBHOOK_PROBE_ANY_PORT: a
     * free port (see webhook_probe_port). The TLS port keeps serving them
     * too. */
    int probe_port;
} webhook_options;

/* Loads the certificate pair, binds and starts the worker threads.
 * o is read during the call only, except endpoints (borrowed) and ctx.
 * Errors: COZY_ERR_IO when a certificate file cannot be read or does not
 * load (err names the file and GnuTLS's message) or when the address
 * cannot be bound; COZY_ERR_USAGE for an invalid address or no endpoints. */
cozy_result webhook_start(webhook_server **out, const webhook_options *o, cozy_err *err);

/* The bound TCP port (the chosen one when options.port was 0). */
int webhook_port(const webhook_server *s);

/* options.probe_port for a free port */
#define WEBHOOK_PROBE_ANY_PORT (-1)

/* The probe listener's bound port, or 0 when there is none. */
int webhook_probe_port(const webhook_server *s);

/* Stops accepting connections: the listening socket is closed, so a new
 * connection is refused, while connections already open are still served
 * (their responses then carry `Connection: close`). /readyz answers 503 from
 * now on. Idempotent. */
void webhook_quiesce(webhook_server *s);

/* Requests received (request line read) whose response has not yet been
 * completely sent, on every path. */
int webhook_in_flight(const webhook_server *s);

/* Graceful drain for SIGTERM: quiesce, then wait until webhook_in_flight is 0
 * or `grace_ms` passed. Returns the requests still in flight (0: clean). */
int webhook_drain(webhook_server *s, long grace_ms);

/* Stops the threads, closes every connection and frees the server. Call
 * after webhook_drain for a graceful stop. Reviews still queued are
 * answered 503, the ones running finish (their deadline bounds them), and
 * the answers get up to 2 s to be sent before the connections close. NULL
 * is ignored. */
void webhook_stop(webhook_server *s);

/* Declares the server's metric families (webhook_start does it too). */
void webhook_declare_metrics(void);

#endif
