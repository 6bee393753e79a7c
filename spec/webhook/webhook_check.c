/* webhook_check.c — a test driver for core/server/webhook.c, used by
 * the specs in spec/webhook/ and as the stand-in controller for the benchmark.
 *
 * Serves two webhooks, POST /validate ("test-validate") and POST /mutate
 * ("test-mutate"), with a toy review callback that decides by the name of
 * the object under review (request.object.metadata.name, else request.name):
 *   deny...       allowed=false, status code 403, "denied by the test callback"
 *   error...      the callback fails (the server must refuse with status 500)
 *   status500...  the callback answers allowed=false with status code 500
 *   slow[-MS]...  sleeps MS milliseconds (default 1500), then allows; run
 *                 inline (on the I/O thread, decision 0052) it moves to a
 *                 review thread first, as the controller's engine does
 *                 once its slice is spent
 *   anything else allowed=true
 * Every answer carries auditAnnotations "webhook-check/deadline-remaining-ms"
 * (milliseconds left before the deadline when the callback started),
 * "webhook-check/phase" and "webhook-check/ran-on" ("io-thread" or
 * "review-thread", decision 0052).
 *
 *   webhook_check --cert F --key F [--address A] [--port N] [--port-file F]
 *                 [--workers N] [--io-threads N] [--max-body BYTES] [--timeout-ms MS]
 *                 [--ready-file F] [--grace-ms MS] [--log-json] [--log-level L]
 *                 [--max-connections N] [--max-connections-per-address N]
 *                 [--request-timeout-ms MS] [--max-body-in-flight BYTES]
 *                 [--idle-timeout-s S] [--inline-max-body BYTES]
 *
 * --workers: review threads and slots; --io-threads: libmicrohttpd threads.
 * --inline-max-body: reviews with bodies up to this size run first on the
 * I/O thread (default 65536, the controller's; 0: never).
 * --port-file: the bound port is written there (atomically) once listening.
 * --ready-file: /readyz is 200 only while this file exists.
 * The client bounds set webhook_options' max_connections,
 * max_connections_per_address, request_timeout_ms, max_body_bytes_in_flight
 * and connection_timeout_s (0 or absent: the server's defaults).
 * SIGTERM/SIGINT: webhook_drain(grace), then webhook_stop, exit 0 (1 when
 * requests were still in flight at the end of the grace period).
 *
 * Build (the lead's Makefile has the rule; by hand):
 *   gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -Icore -o build/tests/webhook_check \
 *     spec/webhook/webhook_check.c core/server/webhook.c core/server/webhook_http.c \
 *     core/server/webhook_review.c core/server/tls.c core/base/metrics.c core/base/log.c core/base/result.c \
 *     $(pkg-config --cflags --libs libmicrohttpd gnutls jansson) -lpthread
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/metrics.h"
#include "server/webhook.h"

static const webhook_endpoint ENDPOINTS[] = {
    { "/validate", "test-validate", 1 },
    { "/mutate", "test-mutate", 2 },
};

static const char *ready_file;

/* Not ready while --ready-file is missing; the reason names the file and
 * carries a second line, which the server must not send. */
static int check_ready(void *ctx, char *why, size_t why_size)
{
    (void)ctx;
    if(!ready_file || access(ready_file, F_OK) == 0)
        return 1;
    snprintf(why, why_size, "no file %s\nsecond line", ready_file);
    return 0;
}

static long ms_until(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (deadline->tv_sec - now.tv_sec) * 1000L + (deadline->tv_nsec - now.tv_nsec) / 1000000L;
}

static int toy_review(void *ctx, const webhook_endpoint *ep, const json_t *review, const struct timespec *deadline,
                      int inline_run, webhook_answer *answer, webhook_decision *decision)
{
    *decision = WEBHOOK_ALLOWED;
    (void)ctx;
    long remaining = ms_until(deadline);
    const json_t *req = json_object_get(review, "request");
    const char *name = json_string_value(json_object_get(json_object_get(json_object_get(req, "object"), "metadata"), "name"));
    if(!name)
        name = json_string_value(json_object_get(req, "name"));
    if(!name)
        name = "";
    if(strncmp(name, "error", 5) == 0)
        return -1;
    if(strncmp(name, "slow", 4) == 0 && inline_run) {
        /* as the controller's engine does once its slice is spent: run it
           again on a review thread, where it takes its time */
        log_write(LOG_INFO, "webhook_check", "slow review moved to a review thread", "name", name, NULL);
        return WEBHOOK_MOVE;
    }
    if(strncmp(name, "slow", 4) == 0) {
        long ms = name[4] == '-' ? strtol(name + 5, NULL, 10) : 1500;
        char t[24];
        snprintf(t, sizeof t, "%ld", ms);
        log_write(LOG_INFO, "webhook_check", "slow review sleeping", "name", name, "ms", t, NULL);
        struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
        while(nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    char rem[32];
    snprintf(rem, sizeof rem, "%ld", remaining);
    json_t *resp = json_pack("{s:O,s:b,s:{s:s,s:s,s:s}}", "uid", json_object_get(req, "uid"), "allowed", 1,
                             "auditAnnotations", "webhook-check/deadline-remaining-ms", rem, "webhook-check/phase",
                             ep->phase == 2 ? "mutate" : "validate", "webhook-check/ran-on",
                             inline_run ? "io-thread" : "review-thread");
    if(!resp)
        return -1;
    if(strncmp(name, "deny", 4) == 0) {
        json_object_set_new(resp, "allowed", json_false());
        json_object_set_new(resp, "status", json_pack("{s:i,s:s}", "code", 403, "message", "denied by the test callback"));
        *decision = WEBHOOK_DENIED;
    } else if(strncmp(name, "status500", 9) == 0) {
        json_object_set_new(resp, "allowed", json_false());
        json_object_set_new(resp, "status", json_pack("{s:i,s:s}", "code", 500, "message", "policy error (test)"));
        *decision = WEBHOOK_ERROR; /* as the controller reports a failed policy */
    }
    answer->review = json_pack("{s:O,s:s,s:o}", "apiVersion", json_object_get(review, "apiVersion"), "kind",
                          "AdmissionReview", "response", resp);
    return answer->review ? 0 : -1;
}

static void usage(void)
{
    fprintf(stderr, "usage: webhook_check --cert F --key F [--address A] [--port N] [--port-file F] [--workers N]\n"
                    "       [--io-threads N]\n"
                    "       [--max-body BYTES] [--timeout-ms MS] [--ready-file F] [--grace-ms MS] [--log-json]\n"
                    "       [--log-level debug|info|warn|error] [--max-connections N]\n"
                    "       [--max-connections-per-address N] [--request-timeout-ms MS]\n"
                    "       [--max-body-in-flight BYTES] [--idle-timeout-s S] [--inline-max-body BYTES]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    webhook_options o = { .address = "127.0.0.1", .endpoints = ENDPOINTS, .n_endpoints = 2, .review = toy_review,
                          .ready = check_ready, .inline_max_body = 64 * 1024 };
    const char *port_file = NULL;
    long grace_ms = 10000;
    int json = 0;
    log_level lvl = LOG_INFO;
    for(int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(n) (strcmp(a, n) == 0 && v && (i++, 1))
        if(OPT("--cert"))
            o.cert_file = v;
        else if(OPT("--key"))
            o.key_file = v;
        else if(OPT("--address"))
            o.address = v;
        else if(OPT("--port"))
            o.port = atoi(v);
        else if(OPT("--port-file"))
            port_file = v;
        else if(OPT("--workers"))
            o.workers = (unsigned)atoi(v);
        else if(OPT("--io-threads"))
            o.io_threads = (unsigned)atoi(v);
        else if(OPT("--max-body"))
            o.max_body_bytes = strtoul(v, NULL, 10);
        else if(OPT("--timeout-ms"))
            o.review_timeout_ms = atol(v);
        else if(OPT("--max-connections"))
            o.max_connections = (unsigned)atoi(v);
        else if(OPT("--max-connections-per-address"))
            o.max_connections_per_address = (unsigned)atoi(v);
        else if(OPT("--request-timeout-ms"))
            o.request_timeout_ms = atol(v);
        else if(OPT("--max-body-in-flight"))
            o.max_body_bytes_in_flight = strtoul(v, NULL, 10);
        else if(OPT("--idle-timeout-s"))
            o.connection_timeout_s = (unsigned)atoi(v);
        else if(OPT("--inline-max-body"))
            o.inline_max_body = strtoul(v, NULL, 10);
        else if(OPT("--ready-file"))
            ready_file = v;
        else if(OPT("--grace-ms"))
            grace_ms = atol(v);
        else if(OPT("--log-level")) {
            if(log_level_parse(v, &lvl) != 0)
                usage();
        } else if(strcmp(a, "--log-json") == 0)
            json = 1;
        else
            usage();
#undef OPT
    }
    if(!o.cert_file || !o.key_file)
        usage();
    log_setup(json, lvl);

    /* signals are taken by sigwait in this thread only; MHD's threads inherit the mask */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    webhook_server *s;
    cozy_err err;
    if(webhook_start(&s, &o, &err) != COZY_OK) {
        fprintf(stderr, "webhook_check: %s\n", err.msg);
        return 1;
    }
    if(port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if(!f || fprintf(f, "%d\n", webhook_port(s)) < 0 || fclose(f) != 0 || rename(tmp, port_file) != 0) {
            fprintf(stderr, "webhook_check: cannot write %s: %s\n", port_file, strerror(errno));
            webhook_stop(s);
            return 1;
        }
    }
    int sig = 0;
    sigwait(&set, &sig);
    log_write(LOG_INFO, "webhook_check", "signal received; draining", "signal", sig == SIGTERM ? "TERM" : "INT", NULL);
    int left = webhook_drain(s, grace_ms);
    char n[16];
    snprintf(n, sizeof n, "%d", left);
    log_write(LOG_INFO, "webhook_check", "drained; stopping", "in_flight", n, NULL);
    webhook_stop(s);
    metrics_reset();
    return left ? 1 : 0;
}
