/* review.c — the admission side of every replica (internal.h,
 * ctl_review_): the webhook paths, one Lua engine per review slot kept
 * on the current bundle and cluster view, the review callback, and
 * readiness.
 *
 * Rules: DESIGN.md §4 (every webhook fails closed; each serves one kind),
 * docs/decisions/0001 (status codes of a refusal), docs/decisions/0006
 * (webhook scoping, deploy/50-webhooks.yaml), docs/decisions/0009 (a
 * review runs on exactly one bundle; not ready until the first bundle and
 * every cache are in).
 */
#include "controller/internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "admission/request.h"
#include "admission/response.h"
#include "base/buf.h"
#include "base/jsonload.h"
#include "base/log.h"
#include "base/metrics.h"

/* The paths deploy/50-webhooks.yaml calls, their metric and log names, and
 * the engine phase each runs. */
const webhook_endpoint ctl_review_endpoints[] = {
    {"/validate/vmi", "vmi-validate", ENGINE_VALIDATE},
    {"/mutate/vmi", "vmi-mutate", ENGINE_MUTATE},
    {"/mutate/launcher", "launcher-mutate", ENGINE_MUTATE},
    {"/validate/gpuclass", "gpuclass-validate", ENGINE_VALIDATE},
    {"/validate/gpuclaim", "gpuclaim-validate", ENGINE_VALIDATE},
    {"/validate/pod", "pod-validate", ENGINE_VALIDATE},
};
const size_t ctl_review_n_endpoints = sizeof ctl_review_endpoints / sizeof *ctl_review_endpoints;

typedef struct worker {
    engine *e;
    ctl_bundle *b;
    unsigned long cluster_gen;
    int has_cluster;
    /* what ctl_review_on_parse left for the review that follows it */
    int parsed;         /* it ran */
    engine *decoded_by; /* the engine that read the body, or NULL: */
    int parse_failed;   /* ... because there was none (parse_err says why), else because the
                           review is to move (on the I/O thread, the engine was stale) */
    cozy_err parse_err;
} worker;

/* One worker per review slot of the webhook server (webhook_review_slot:
 * a slot runs one review at a time, on an I/O thread or a review thread,
 * so its worker needs no lock); --workers is at most 256. */
static worker slot_workers[256];
#define W (slot_workers[webhook_review_slot()])

/* CPU time a review may take on the I/O thread that read it before it is
 * moved to a review thread (engine_set_slice, decision 0052): about ten
 * times what the example reviews take, far below what a stuck rule would
 * hold the I/O thread's other connections for (its deadline, 8 s). */
#define CTL_INLINE_SLICE_US 2000L

/* Every engine of a review slot, so that the exit can close them. Guarded by
 * ctl_proc->mu. */
static engine **engines;
static size_t n_engines, cap_engines;

static void register_engine(engine *e)
{
    pthread_mutex_lock(&ctl_proc->mu);
    engine **n = cozy_grow(engines, &cap_engines, n_engines + 1, sizeof *n);
    if(n) {
        engines = n;
        engines[n_engines++] = e;
    }
    pthread_mutex_unlock(&ctl_proc->mu);
}

static void unregister_engine(engine *e)
{
    pthread_mutex_lock(&ctl_proc->mu);
    for(size_t i = 0; i < n_engines; i++)
        if(engines[i] == e) {
            engines[i] = engines[--n_engines];
            break;
        }
    pthread_mutex_unlock(&ctl_proc->mu);
}

void ctl_review_close_engines(void)
{
    for(size_t i = 0; i < n_engines; i++)
        engine_close(engines[i]);
    free(engines);
    engines = NULL;
    n_engines = cap_engines = 0;
}

/* 1 when this slot's engine would have to be made or fed first (a new
 * bundle, or caches that moved since its cluster view was built): work
 * that grows with the cluster, which must not hold an I/O thread's other
 * connections (decision 0052), so an inline review moves instead. */
static int worker_stale(void)
{
    if(!W.e || !W.has_cluster || kube_watcher_generation(ctl_proc->watcher) != W.cluster_gen)
        return 1;
    ctl_bundle *b = ctl_bundle_current();
    int stale = b != W.b;
    ctl_bundle_unref(b);
    return stale;
}

/* Makes sure this slot's engine runs the current bundle and sees the
 * current caches. Returns the engine, or NULL with err set. */
static engine *worker_engine(cozy_err *err)
{
    int slot = webhook_review_slot();
    if(slot < 0 || (size_t)slot >= sizeof slot_workers / sizeof *slot_workers) {
        cozy_fail(err, COZY_ERR_INTERNAL, "no review slot on this thread");
        return NULL;
    }
    if(!kube_watcher_synced(ctl_proc->watcher)) {
        /* /readyz says 503 meanwhile; a review that arrives anyway is
         * refused rather than judged against empty caches */
        cozy_fail(err, COZY_ERR_INTERNAL, "the watch caches have not listed the cluster yet");
        return NULL;
    }
    ctl_bundle *b = ctl_bundle_current();
    if(!b) {
        cozy_fail(err, COZY_ERR_INTERNAL, "no policy bundle loaded");
        return NULL;
    }
    if(!W.e || W.b != b) {
        engine_options eo = ctl_bundle_engine_options(b);
        engine *e = NULL;
        if(engine_open(&e, &eo, err) != COZY_OK) {
            ctl_bundle_unref(b);
            return NULL;
        }
        if(W.e) {
            unregister_engine(W.e);
            engine_close(W.e);
        }
        ctl_bundle_unref(W.b);
        W.e = e;
        W.b = b; /* keeps our reference */
        W.has_cluster = 0;
        register_engine(e);
    } else
        ctl_bundle_unref(b);
    unsigned long gen = kube_watcher_generation(ctl_proc->watcher);
    if(!W.has_cluster || gen != W.cluster_gen) {
        json_t *snap = ctl_cluster_snapshot();
        cozy_result rc = engine_set_cluster(W.e, snap, ctl_proc->settings, err);
        json_decref(snap);
        if(rc != COZY_OK)
            return NULL;
        W.cluster_gen = gen;
        W.has_cluster = 1;
    }
    return W.e;
}

/* The kind (and its API group) each webhook path serves
 * (deploy/50-webhooks.yaml rules). */
static const char *endpoint_kind(const webhook_endpoint *ep, const char **group)
{
    if(strcmp(ep->path, "/validate/vmi") == 0 || strcmp(ep->path, "/mutate/vmi") == 0)
        return *group = "kubevirt.io", "VirtualMachineInstance";
    if(strcmp(ep->path, "/mutate/launcher") == 0 || strcmp(ep->path, "/validate/pod") == 0)
        return *group = "", "Pod";
    if(strcmp(ep->path, "/validate/gpuclass") == 0)
        return *group = "cozystack.io", "GPUClass";
    if(strcmp(ep->path, "/validate/gpuclaim") == 0)
        return *group = "cozystack.io", "GPUClaim";
    return *group = NULL, NULL;
}

/* A policy failure, per rule (found in hardening: policy errors were neither logged
 * per review nor counted per rule): cozygpu_policy_rule_errors_total{rule,
 * kind}, and a log line naming the rule, at most one per second per
 * process (a rule failing on every review must not flood the log; the
 * counter has every one, and the line says how many were not logged). */
static void policy_error(const webhook_endpoint *ep, const engine_verdict *v)
{
    char labels[256];
    snprintf(labels, sizeof labels, "rule=\"%s\",kind=\"%s\"", v->rule, engine_outcome_name(v->outcome));
    metrics_counter_add("cozygpu_policy_rule_errors_total", labels, 1);
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static time_t last;
    static unsigned long suppressed;
    time_t now = time(NULL);
    pthread_mutex_lock(&mu);
    int say = now != last;
    unsigned long quiet = suppressed;
    if(say) {
        last = now;
        suppressed = 0;
    } else
        suppressed++;
    pthread_mutex_unlock(&mu);
    if(!say)
        return;
    char n[32];
    snprintf(n, sizeof n, "%lu", quiet);
    log_write(LOG_WARN, "webhook", "a policy failed; the review was refused", "webhook", ep->name, "rule", v->rule,
              "kind", engine_outcome_name(v->outcome), "message", v->message ? v->message : "",
              LOG_NUM "not_logged_since", n, NULL);
}

/* What each rule said and how long it took (per-rule metrics):
 * cozygpu_policy_rule_decisions_total{rule,decision} and
 * cozygpu_policy_rule_duration_seconds{rule}. Rule names are letters,
 * digits and - . _ / (cozygpu.policy refuses others), safe in a label. */
static void rule_metrics(const engine *e)
{
    size_t n = 0;
    const engine_rule_result *rr = engine_last_rules(e, &n);
    for(size_t i = 0; i < n; i++) {
        char labels[256];
        snprintf(labels, sizeof labels, "rule=\"%s\",decision=\"%s\"", rr[i].rule, rr[i].result);
        metrics_counter_add("cozygpu_policy_rule_decisions_total", labels, 1);
        snprintf(labels, sizeof labels, "rule=\"%s\"", rr[i].rule);
        metrics_histogram_observe("cozygpu_policy_rule_duration_seconds", labels, rr[i].seconds);
    }
}

/* The operations each path is registered for (deploy/50-webhooks.yaml
 * rules[].operations): another one means a forged request or a changed
 * configuration, refused rather than judged by rules that match no such
 * operation. */
static int endpoint_serves(const webhook_endpoint *ep, const char *op)
{
    static const char *const create[] = {"CREATE"}, *const create_update[] = {"CREATE", "UPDATE"};
    if(strcmp(ep->path, "/validate/gpuclass") == 0 || strcmp(ep->path, "/validate/gpuclaim") == 0)
        return admission_operation_in(op, create_update, 2);
    return admission_operation_in(op, create, 1);
}

static const char *endpoint_operations(const webhook_endpoint *ep)
{
    return strcmp(ep->path, "/validate/gpuclass") == 0 || strcmp(ep->path, "/validate/gpuclaim") == 0 ? "CREATE and UPDATE"
                                                                                                      : "CREATE";
}

json_t *ctl_review_on_parse(void *ctx, const webhook_endpoint *ep, const char *body, size_t len, json_error_t *error)
{
    (void)ctx;
    (void)ep;
    int slot = webhook_review_slot();
    if(slot < 0 || (size_t)slot >= sizeof slot_workers / sizeof *slot_workers) /* the review says so */
        return cozy_json_loadb(body, len, JSON_REJECT_DUPLICATES, error);
    W.parsed = 1;
    W.parse_failed = 0;
    W.decoded_by = NULL;
    /* on the I/O thread, an engine to rebuild first sends the review to a
       review thread: read plainly here, and ctl_review_on_review moves it */
    if(webhook_running_inline() && worker_stale())
        return cozy_json_loadb(body, len, JSON_REJECT_DUPLICATES, error);
    engine *e = worker_engine(&W.parse_err);
    if(!e) { /* ctl_review_on_review refuses, saying why */
        W.parse_failed = 1;
        return cozy_json_loadb(body, len, JSON_REJECT_DUPLICATES, error);
    }
    W.decoded_by = e;
    return engine_decode_review(e, body, len, error);
}

static int review_with(engine *e, const cozy_err *engine_err, const webhook_endpoint *ep, const json_t *review,
                       const struct timespec *deadline, int inline_run, webhook_answer *answer,
                       webhook_decision *decision);

int ctl_review_on_review(void *ctx, const webhook_endpoint *ep, const json_t *review, const struct timespec *deadline,
                         int inline_run, webhook_answer *answer, webhook_decision *decision)
{
    (void)ctx;
    cozy_err err = {{0}};
    /* the engine that read the body, if one did: it holds the request's
       object (ctl_review_on_parse), and a bundle reload in between must
       not hand this review to another */
    engine *e = NULL;
    int slot = webhook_review_slot();
    if(slot < 0 || (size_t)slot >= sizeof slot_workers / sizeof *slot_workers)
        cozy_fail(&err, COZY_ERR_INTERNAL, "no review slot on this thread");
    else if(W.parsed) { /* the parse hook's engine, or why it had none (once: not tried again) */
        e = W.decoded_by;
        int failed = W.parse_failed;
        W.parsed = 0;
        W.decoded_by = NULL;
        if(!e && failed)
            err = W.parse_err;
        else if(!e && inline_run)
            return WEBHOOK_MOVE; /* its engine was stale: a review thread makes it ready */
        else if(!e)
            e = worker_engine(&err);
    } else
        e = worker_engine(&err);
    int rc = review_with(e, &err, ep, review, deadline, inline_run, answer, decision);
    if(e)
        engine_forget_decoded(e); /* a refusal before the rules left it */
    return rc;
}

static int review_with(engine *e, const cozy_err *engine_err, const webhook_endpoint *ep, const json_t *review,
                       const struct timespec *deadline, int inline_run, webhook_answer *answer,
                       webhook_decision *decision)
{
    cozy_err err;
    char where[96];
    snprintf(where, sizeof where, "cozygpu webhook %s", ep->name);
    const json_t *request = json_object_get(review, "request");
    if(!e) {
        /* fail closed, and say why (not ready yet, no bundle) */
        log_write(LOG_WARN, "webhook", "refusing: no engine for the review", "webhook", ep->name, "error",
                  engine_err->msg, NULL);
        char msg[1200];
        snprintf(msg, sizeof msg, "cozygpu webhook %s: not serving: %s", ep->name, engine_err->msg);
        answer->review = admission_envelope(NULL, admission_refusal(request, 500, msg));
        *decision = WEBHOOK_ERROR;
        return answer->review ? 0 : -1;
    }
    json_t *resp = NULL;
    engine_outcome outcome = ENGINE_REFUSED; /* the controller's own refusals below */
    /* A webhook serves one kind (deploy/50-webhooks.yaml): another kind
     * means the webhook configuration is wrong; refuse rather than let
     * rules that do not match it allow it. */
    const char *want_group = NULL;
    const char *want = endpoint_kind(ep, &want_group);
    const json_t *kind = json_object_get(request, "kind");
    const char *got = json_string_value(json_object_get(kind, "kind"));
    const char *got_group = json_string_value(json_object_get(kind, "group"));
    const char *op = json_string_value(json_object_get(request, "operation"));
    if(want && (!got || strcmp(want, got) != 0 || !got_group || strcmp(want_group, got_group) != 0)) {
        char msg[600];
        snprintf(msg, sizeof msg,
                 "cozygpu webhook %s serves %s objects (group \"%s\"), not %s (group \"%s\"): check the rules of "
                 "the webhook configuration",
                 ep->name, want, want_group, got ? got : "(no kind)", got_group ? got_group : "");
        resp = admission_refusal(request, 400, msg);
    } else if(admission_check_request(request, where, &err) != COZY_OK) {
        /* the same shape `cozygpu review` requires (admission/request.h) */
        resp = admission_refusal(request, 400, err.msg);
    } else if(!endpoint_serves(ep, op)) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "cozygpu webhook %s serves %s requests, not %s: check the rules of the webhook configuration",
                 ep->name, endpoint_operations(ep), op);
        resp = admission_refusal(request, 400, msg);
    } else {
        engine_set_deadline(e, deadline);
        if(inline_run) /* on the I/O thread: a slice of CPU time, then a review thread (decision 0052) */
            engine_set_slice(e, CTL_INLINE_SLICE_US);
        engine_verdict v;
        /* the answer written straight from the Lua response (decision 0051) */
        cozy_result rc = engine_review_text(e, request, (engine_phase)ep->phase, &v, &answer->text,
                                            &answer->len, &err);
        engine_set_deadline(e, NULL);
        int sliced = inline_run && engine_sliced(e);
        if(inline_run)
            engine_set_slice(e, 0);
        if(sliced) { /* what it answered means nothing: run it again on a review thread */
            free(answer->text);
            answer->text = NULL;
            answer->len = 0;
            return WEBHOOK_MOVE;
        }
        if(rc != COZY_OK) {
            log_write(LOG_ERROR, "webhook", "policy engine failed", "webhook", ep->name, "error", err.msg, NULL);
            return -1;
        }
        answer->allowed = v.allowed;
        outcome = v.outcome;
        rule_metrics(e);
        if(engine_outcome_is_failure(outcome))
            policy_error(ep, &v);
    }
    if(engine_outcome_is_failure(outcome))
        metrics_counter_add("cozygpu_policy_errors_total", NULL, 1);
    *decision = engine_outcome_is_failure(outcome) ? WEBHOOK_ERROR
                : outcome == ENGINE_ALLOWED        ? WEBHOOK_ALLOWED
                                                   : WEBHOOK_DENIED;
    if(answer->text)
        return 0;
    answer->review = admission_envelope(NULL, resp);
    return answer->review ? 0 : -1;
}

/* Appends "; " (unless out is empty) and the formatted reason to out
 * (size n), cutting it to fit. */
static void add_reason(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_reason(char *out, size_t n, const char *fmt, ...)
{
    size_t len = strnlen(out, n);
    if(len + 1 >= n)
        return;
    if(len > 0) {
        snprintf(out + len, n - len, "; ");
        len = strnlen(out, n);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + len, n - len, fmt, ap);
    va_end(ap);
}

int ctl_review_on_ready(void *ctx, char *why, size_t why_size)
{
    (void)ctx;
    pthread_mutex_lock(&ctl_proc->mu);
    int loaded = ctl_proc->policies_loaded, stopping = ctl_proc->stopping;
    pthread_mutex_unlock(&ctl_proc->mu);
    char caches[1024];
    size_t unsynced = kube_watcher_unsynced(ctl_proc->watcher, caches, sizeof caches);
    if(loaded && !stopping && unsynced == 0)
        return 1;
    why[0] = '\0';
    if(stopping)
        add_reason(why, why_size, "shutting down");
    if(unsynced > 0)
        add_reason(why, why_size, "watch caches not synced (%s)", caches);
    if(!loaded) {
        char err[400];
        if(ctl_bundle_last_error(err, sizeof err))
            add_reason(why, why_size, "policy bundle did not load: %s", err);
        else
            add_reason(why, why_size, "no policy bundle loaded");
    }
    return 0;
}
