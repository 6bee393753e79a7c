/* controller.c — `cozygpu controller` (controller.h).
 *
 * Threads:
 *   main        flags, start-up, then waits for SIGTERM/SIGINT and shuts
 *               down in order: not ready, stop accepting, finish the
 *               reviews in flight, stop the writers, release the Lease.
 *   watcher     one curl-multi loop for every watch (watch.h); its event
 *               callbacks only record work and signal the threads below.
 *   webhook     libmicrohttpd's thread pool; each pool thread owns one Lua
 *               engine (thread-local) and rebuilds it between reviews when
 *               the policy bundle changed, and refreshes its cluster view
 *               when the watch caches changed. No Lua state is shared.
 *   reloader    compiles a new policies ConfigMap aside, self-checks it,
 *               and publishes it (or keeps the old one and reports).
 *   elector     leader election (lease.h).
 *   writer      leader-only: GPUClass status conditions.
 */
#include "controller/controller.h"

#include <ctype.h>
#include <ftw.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/duration.h"
#include "base/log.h"
#include "base/metrics.h"
#include "format/config.h"
#include "admission/response.h"
#include "engine/engine.h"
#include "kube/kube.h"
#include "kube/lease.h"
#include "kube/watch.h"
#include "server/webhook.h"

#ifndef COZYGPU_VERSION
#define COZYGPU_VERSION "0.1.0"
#endif

/* ---- flags -------------------------------------------------------------- */

typedef struct flags {
    const char *kubeconfig, *context, *server;
    const char *ns, *identity;
    const char *config_file;
    const char *policies_configmap;
    const char *policies_dir, *library_dir, *state_dir;
    const char *address;
    int port;
    const char *port_file;
    const char *cert_file, *key_file;
    int workers;
    long review_timeout_ms;
    long max_body;
    int leader_elect;
    const char *lease_name;
    long lease_ms, renew_ms, retry_ms;
    long resync_ms;
    long shutdown_grace_ms;
    long status_interval_ms;
    int log_json;
    log_level level;
} flags;

static void usage(FILE *f)
{
    fputs(
        "usage: cozygpu controller [options]\n"
        "\n"
        "Serves the admission webhooks over HTTPS (every replica), watches the cluster,\n"
        "reloads policies from a ConfigMap, and, while it holds the Lease, runs the\n"
        "writers (GPUClass status). Stops gracefully on SIGTERM.\n"
        "\n"
        "API server:\n"
        "  --kubeconfig FILE        kubeconfig (default: $KUBECONFIG, then in-cluster,\n"
        "                           then ~/.kube/config)\n"
        "  --context NAME           kubeconfig context (default: current-context)\n"
        "  --server URL             API server URL, overriding the kubeconfig's\n"
        "  --namespace NS           the controller's namespace: policies ConfigMap, Lease,\n"
        "                           Events (default: $POD_NAMESPACE, else cozy-gpu)\n"
        "  --identity ID            this replica's name in the Lease; must be unique (default:\n"
        "                           $POD_NAME, else HOSTNAME_RANDOM, a new suffix per start)\n"
        "  --resync DURATION        relist every watched resource this often (default 10m;\n"
        "                           0 never)\n"
        "\n"
        "policies and settings:\n"
        "  --config FILE            settings file (DESIGN.md §10; default: built-in defaults)\n"
        "  --policies-configmap NAME  ConfigMap in --namespace whose *.lua keys override the\n"
        "                           default policies; reloaded on change (default\n"
        "                           cozygpu-policies; \"\" to disable)\n"
        "  --policies DIR           default policy bundle (default: the installed policies/)\n"
        "  --library DIR            policy library (default: the installed lua/)\n"
        "  --state-dir DIR          where bundles are compiled (default: $TMPDIR or /tmp)\n"
        "\n"
        "webhook server:\n"
        "  --address ADDR           listen address (default 0.0.0.0)\n"
        "  --port N                 HTTPS port (default 8443; 0 picks a free one)\n"
        "  --port-file FILE         write the bound port to FILE once listening\n"
        "  --tls-cert-file FILE     PEM certificate (chain); re-read when it changes\n"
        "  --tls-key-file FILE      PEM private key; re-read when it changes\n"
        "  --workers N              review threads, one Lua state each (default 4)\n"
        "  --review-timeout DURATION  deadline for one review; keep it below the\n"
        "                           webhooks' timeoutSeconds (default 8s)\n"
        "  --max-body-bytes N       largest AdmissionReview accepted (default 3145728)\n"
        "  --shutdown-grace DURATION  how long SIGTERM waits for reviews in flight\n"
        "                           (default 25s)\n"
        "\n"
        "leader election (coordination.k8s.io/v1 Lease in --namespace):\n"
        "  --leader-elect true|false  run leader election (default true); false: this\n"
        "                           replica never runs the writers\n"
        "  --lease-name NAME        (default cozygpu-controller)\n"
        "  --lease-duration DURATION  how long a holder's record is valid (default 15s)\n"
        "  --renew-deadline DURATION  the leader stops acting when it could not renew\n"
        "                           for this long (default 10s)\n"
        "  --retry-period DURATION  between acquire and renew attempts (default 2s)\n"
        "  --status-interval DURATION  how often the leader re-checks GPUClass status\n"
        "                           besides watch events (default 30s)\n"
        "\n"
        "DURATION is a number with a unit, as in Go and kubectl: 500ms, 15s, 2m, 1h, 1m30s\n"
        "(a bare number is seconds).\n"
        "\n"
        "logging:\n"
        "  --log-format json|text   (default text)\n"
        "  --log-level debug|info|warn|error  (default info)\n"
        "\n"
        "signals: SIGTERM/SIGINT shut down gracefully; SIGUSR1 writes what the watch\n"
        "caches hold to STATE-DIR/cache.json\n"
        "\n"
        "exit status: 0 after a graceful shutdown, 2 on bad flags or a start-up failure\n",
        f);
}

/* ---- shared state ------------------------------------------------------- */

/* A policy bundle: the hoster sources of the ConfigMap, handed to every
 * engine from memory (docs/decisions/0007, 0009). */
typedef struct bundle {
    struct bundle *prev, *next; /* every live bundle (ctl.bundles), for the exit */
    unsigned long gen;
    json_t *data;            /* the ConfigMap's data (owned), or NULL: defaults only */
    engine_source *sources;  /* point into data and modules */
    char (*modules)[256];    /* module names of lib.* keys */
    size_t n_sources;
    char *source_rv; /* the ConfigMap's resourceVersion, or NULL */
    int refs;
} bundle;

typedef struct ctl {
    flags f;
    json_t *settings;
    engine_options eo;
    kube_client *client;
    kube_watcher *watcher;
    kube_informer *cluster_inf[12];
    int n_cluster_inf;
    kube_informer *policies_inf;
    kube_informer *classes_inf;
    webhook_server *server;
    lease_elector *lease;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;
    bundle *current;           /* guarded by mu */
    int policies_loaded;       /* a bundle is being served */
    char *policy_error;        /* last reload failure (for /readyz), or NULL */
    json_t *pending_cm;        /* ConfigMap waiting for the reloader, or json_null() for "deleted" */
    char *failed_rv;           /* reloader only: resourceVersion of the last bundle that failed */
    json_t *deleted_cm;        /* the ConfigMap just deleted, for the reloader to report */
    unsigned long reload_seq;
    int status_dirty;

    pthread_t reloader, writer;

    /* engines of the webhook threads, closed at exit */
    engine **engines;
    size_t n_engines;
    bundle *bundles; /* guarded by mu: every bundle not yet freed */
} ctl;

static ctl *C; /* the one controller of this process (signal-free access) */

static void bundle_free(bundle *b)
{
    json_decref(b->data);
    free(b->sources);
    free(b->modules);
    free(b->source_rv);
    free(b);
}

/* The engine options of bundle `b`: the controller's, with b's sources. */
static engine_options bundle_engine_options(const bundle *b)
{
    engine_options eo = C->eo;
    eo.override_sources = b->sources;
    eo.n_override_sources = b->n_sources;
    return eo;
}

static void bundle_unref(bundle *b)
{
    if(!b)
        return;
    pthread_mutex_lock(&C->mu);
    int last = --b->refs == 0;
    if(last) {
        if(b->prev)
            b->prev->next = b->next;
        else
            C->bundles = b->next;
        if(b->next)
            b->next->prev = b->prev;
    }
    pthread_mutex_unlock(&C->mu);
    if(last)
        bundle_free(b);
}

/* At exit: the webhook threads are gone with their references, so every
 * bundle left is freed. */
static void bundles_free_all(void)
{
    while(C->bundles) {
        bundle *b = C->bundles;
        C->bundles = b->next;
        bundle_free(b);
    }
    C->current = NULL;
}

static bundle *bundle_current(void)
{
    pthread_mutex_lock(&C->mu);
    bundle *b = C->current;
    if(b)
        b->refs++;
    pthread_mutex_unlock(&C->mu);
    return b;
}

/* ---- cluster snapshot ---------------------------------------------------- */

/* Objects from a list may lack apiVersion and kind (the API server omits
 * them in the items of built-in lists); the policies index by kind. */
static json_t *with_kind(json_t *obj, const kube_resource *r)
{
    if(json_object_get(obj, "kind"))
        return json_incref(obj);
    json_t *c = json_copy(obj);
    char av[128];
    if(*r->group)
        snprintf(av, sizeof av, "%s/%s", r->group, r->version);
    else
        snprintf(av, sizeof av, "%s", r->version);
    json_object_set_new(c, "apiVersion", json_string(av));
    json_object_set_new(c, "kind", json_string(r->kind));
    return c;
}

static json_t *cluster_snapshot(void)
{
    json_t *all = json_array();
    for(int i = 0; i < C->n_cluster_inf; i++) {
        const kube_resource *r = kube_informer_resource(C->cluster_inf[i]);
        json_t *items = kube_informer_list(C->cluster_inf[i]);
        size_t j;
        json_t *o;
        json_array_foreach(items, j, o) json_array_append_new(all, with_kind(o, r));
        json_decref(items);
    }
    return all;
}

/* ---- per-thread engines -------------------------------------------------- */

typedef struct worker {
    engine *e;
    bundle *b;
    unsigned long cluster_gen;
    int has_cluster;
} worker;

static __thread worker W;

static void register_engine(engine *e)
{
    pthread_mutex_lock(&C->mu);
    engine **n = realloc(C->engines, (C->n_engines + 1) * sizeof *n);
    if(n) {
        C->engines = n;
        C->engines[C->n_engines++] = e;
    }
    pthread_mutex_unlock(&C->mu);
}

static void unregister_engine(engine *e)
{
    pthread_mutex_lock(&C->mu);
    for(size_t i = 0; i < C->n_engines; i++)
        if(C->engines[i] == e) {
            C->engines[i] = C->engines[--C->n_engines];
            break;
        }
    pthread_mutex_unlock(&C->mu);
}

/* Makes sure this thread's engine runs the current bundle and sees the
 * current caches. Returns the engine, or NULL with err set. */
static engine *worker_engine(cozy_err *err)
{
    if(!kube_watcher_synced(C->watcher)) {
        /* /readyz says 503 meanwhile; a review that arrives anyway is
         * refused rather than judged against empty caches */
        cozy_fail(err, COZY_ERR_INTERNAL, "the watch caches have not listed the cluster yet");
        return NULL;
    }
    bundle *b = bundle_current();
    if(!b) {
        cozy_fail(err, COZY_ERR_INTERNAL, "no policy bundle loaded");
        return NULL;
    }
    if(!W.e || W.b != b) {
        engine_options eo = bundle_engine_options(b);
        engine *e = NULL;
        if(engine_open(&e, &eo, err) != COZY_OK) {
            bundle_unref(b);
            return NULL;
        }
        if(W.e) {
            unregister_engine(W.e);
            engine_close(W.e);
        }
        bundle_unref(W.b);
        W.e = e;
        W.b = b; /* keeps our reference */
        W.has_cluster = 0;
        register_engine(e);
    } else
        bundle_unref(b);
    unsigned long gen = kube_watcher_generation(C->watcher);
    if(!W.has_cluster || gen != W.cluster_gen) {
        json_t *snap = cluster_snapshot();
        cozy_result rc = engine_set_cluster(W.e, snap, C->settings, err);
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

static int on_review(void *ctx, const webhook_endpoint *ep, const json_t *review, const struct timespec *deadline,
                     json_t **response)
{
    (void)ctx;
    cozy_err err;
    const json_t *request = json_object_get(review, "request");
    engine *e = worker_engine(&err);
    if(!e) {
        /* fail closed, and say why (not ready yet, no bundle) */
        log_write(LOG_WARN, "webhook", "refusing: no engine for the review", "webhook", ep->name, "error", err.msg,
                  NULL);
        char msg[1200];
        snprintf(msg, sizeof msg, "cozygpu webhook %s: not serving: %s", ep->name, err.msg);
        *response = admission_envelope(NULL, admission_refusal(request, 500, msg));
        return *response ? 0 : -1;
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
    } else if(op && (strcmp(op, "CREATE") == 0 || strcmp(op, "UPDATE") == 0) &&
              !json_is_object(json_object_get(request, "object"))) {
        /* the API server always sends the object of a CREATE or UPDATE */
        char msg[300];
        snprintf(msg, sizeof msg, "cozygpu webhook %s: request.object must be an object for %s", ep->name, op);
        resp = admission_refusal(request, 400, msg);
    } else {
        engine_set_deadline(e, deadline);
        engine_verdict v;
        cozy_result rc = engine_review(e, request, (engine_phase)ep->phase, &v, &err);
        engine_set_deadline(e, NULL);
        if(rc != COZY_OK) {
            log_write(LOG_ERROR, "webhook", "policy engine failed", "webhook", ep->name, "error", err.msg, NULL);
            return -1;
        }
        resp = v.response;
        outcome = v.outcome;
    }
    if(engine_outcome_is_failure(outcome))
        metrics_counter_add("cozygpu_policy_errors_total", NULL, 1);
    *response = admission_envelope(NULL, resp);
    return *response ? 0 : -1;
}

static int on_ready(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&C->mu);
    int ok = C->policies_loaded && !C->stopping;
    pthread_mutex_unlock(&C->mu);
    return ok && kube_watcher_synced(C->watcher);
}

/* ---- events -------------------------------------------------------------- */

/* Records a core/v1 Event on the ConfigMap (client-go record.EventRecorder
 * shape: name "<object>.<hex nanoseconds>", involvedObject, source). Errors
 * are logged, never fatal. */
static void record_event(const json_t *cm, const char *type, const char *reason, const char *message)
{
    const json_t *md = json_object_get(cm, "metadata");
    const char *name = json_string_value(json_object_get(md, "name"));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char ev_name[300], stamp[40];
    snprintf(ev_name, sizeof ev_name, "%s.%llx", name ? name : "cozygpu", (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char msg[1024];
    snprintf(msg, sizeof msg, "%.1000s", message); /* keep Event messages near 1 KiB */
    json_t *ev = json_pack(
        "{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:s, s:s, s:s, s:s?, s:s?}, s:s, s:s, s:s, s:{s:s}, s:s, s:s, s:s, s:s, s:i}",
        "apiVersion", "v1", "kind", "Event", "metadata", "name", ev_name, "namespace", C->f.ns, "involvedObject",
        "apiVersion", "v1", "kind", "ConfigMap", "namespace", C->f.ns, "name", name ? name : "",
        "uid", json_string_value(json_object_get(md, "uid")), "resourceVersion",
        json_string_value(json_object_get(md, "resourceVersion")), "type", type, "reason", reason, "message", msg,
        "source", "component", "cozygpu-controller", "reportingComponent", "cozygpu-controller",
        "reportingInstance", C->f.identity, "firstTimestamp", stamp, "lastTimestamp", stamp, "count", 1);
    if(!ev)
        return;
    char *path = kube_path(&KUBE_EVENTS, C->f.ns, NULL, NULL);
    long status = 0;
    json_t *res = NULL;
    cozy_err err;
    if(!path || kube_request(C->client, "POST", path, NULL, ev, &status, &res, &err) != COZY_OK)
        log_write(LOG_WARN, "events", "cannot record an event", "reason", reason, "error", err.msg, NULL);
    else if(status != 201 && status != 200) {
        char code[16];
        snprintf(code, sizeof code, "%ld", status);
        log_write(LOG_WARN, "events", "event refused", "reason", reason, "status", code, NULL);
    }
    free(path);
    json_decref(res);
    json_decref(ev);
}

/* ---- policy reload ------------------------------------------------------- */

static cozy_result self_check(engine *e, cozy_err *err)
{
    json_t *snap = cluster_snapshot();
    cozy_result rc = engine_set_cluster(e, snap, C->settings, err);
    json_decref(snap);
    if(rc != COZY_OK)
        return rc;
    json_t *req = json_pack("{s:s, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:s}, s:s, s:s, s:{s:s}, s:{s:s, s:s, s:{s:s}}}",
                            "uid", "00000000-0000-4000-8000-5e1fc4ec0000", "kind", "group", "", "version", "v1",
                            "kind", "Namespace", "resource", "group", "", "version", "v1", "resource",
                            "namespaces", "operation", "CREATE", "name", "cozygpu-self-check", "userInfo",
                            "username", "system:serviceaccount:cozygpu:self-check", "object", "apiVersion", "v1",
                            "kind", "Namespace", "metadata", "name", "cozygpu-self-check");
    engine_verdict v;
    rc = engine_review(e, req, ENGINE_BOTH, &v, err);
    json_decref(req);
    if(rc == COZY_OK && engine_outcome_is_failure(v.outcome))
        rc = cozy_fail(err, COZY_ERR_POLICY, "self-check review failed: %s", v.message ? v.message : "");
    json_decref(v.response);
    return rc;
}

/* Compiles `cm` (a ConfigMap, or NULL for "no ConfigMap": defaults only)
 * into a new bundle: its keys become engine sources (engine_source_for_key,
 * docs/decisions/0007) handed to the engine from memory, so messages name
 * the keys the hoster edits. On success returns it (refs 1); else NULL with
 * err. */
static bundle *compile_bundle(const json_t *cm, cozy_err *err)
{
    bundle *b = calloc(1, sizeof *b);
    if(!b) {
        cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    b->refs = 1;
    pthread_mutex_lock(&C->mu);
    b->next = C->bundles;
    if(b->next)
        b->next->prev = b;
    C->bundles = b;
    pthread_mutex_unlock(&C->mu);
    const char *cm_name = C->f.policies_configmap;
    if(cm) {
        b->source_rv = strdup(json_string_value(json_object_get(json_object_get(cm, "metadata"), "resourceVersion"))
                                  ?: "");
        json_t *data = json_object_get(cm, "data");
        b->data = json_is_object(data) ? json_deep_copy(data) : json_object();
        size_t n = json_object_size(b->data);
        b->sources = calloc(n ? n : 1, sizeof *b->sources);
        b->modules = calloc(n ? n : 1, sizeof *b->modules);
        if(!b->data || !b->sources || !b->modules) {
            cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
            goto fail;
        }
        const char *k;
        json_t *v;
        json_object_foreach(b->data, k, v)
        {
            const char *text = json_string_value(v);
            cozy_err kerr;
            cozy_result krc = engine_source_for_key(k, text ? text : "", text ? json_string_length(v) : 0,
                                                    &b->sources[b->n_sources], b->modules[b->n_sources],
                                                    sizeof b->modules[0], &kerr);
            if(krc == COZY_ERR_INPUT) {
                log_write(LOG_WARN, "reload", "ignoring a key that is not a policy file name (NAME.lua of letters, digits, - _ .)", "configmap", cm_name,
                          "key", k, NULL);
                continue;
            }
            if(krc != COZY_OK) {
                cozy_fail(err, krc, "ConfigMap %s/%s: %s", C->f.ns, cm_name, kerr.msg);
                goto fail;
            }
            b->n_sources++;
        }
        if(json_object_size(json_object_get(cm, "binaryData")) > 0)
            log_write(LOG_WARN, "reload", "ignoring binaryData: policies are text", "configmap", cm_name, NULL);
    }
    engine_options eo = bundle_engine_options(b);
    engine *e = NULL;
    cozy_result rc = engine_open(&e, &eo, err);
    if(rc == COZY_OK) {
        rc = self_check(e, err);
        engine_close(e);
    }
    if(rc != COZY_OK) {
        if(cm) {
            char tmp[sizeof err->msg];
            snprintf(tmp, sizeof tmp, "%s", err->msg);
            cozy_fail(err, rc, "ConfigMap %s/%s: %s", C->f.ns, cm_name, tmp);
        }
        goto fail;
    }
    return b;
fail:
    b->refs = 1;
    bundle_unref(b);
    return NULL;
}

static void publish(bundle *b)
{
    pthread_mutex_lock(&C->mu);
    bundle *old = C->current;
    b->gen = old ? old->gen + 1 : 1;
    C->current = b;
    C->policies_loaded = 1;
    free(C->policy_error);
    C->policy_error = NULL;
    C->status_dirty = 1;
    pthread_cond_broadcast(&C->cv);
    pthread_mutex_unlock(&C->mu);
    bundle_unref(old);
    metrics_gauge_set("cozygpu_policy_bundle_generation", NULL, (double)b->gen);
}

static void *reloader_main(void *arg)
{
    (void)arg;
    /* The first bundle: only once every cache has listed is it known
     * whether the ConfigMap exists. If it does, its ADDED event has queued
     * it (and if it does not load, the replica stays unready: never the
     * defaults in place of a hoster's broken rules, docs/decisions/0009);
     * if it does not, the defaults are the bundle. */
    pthread_mutex_lock(&C->mu);
    while(!C->stopping && !kube_watcher_synced(C->watcher)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 50 * 1000000;
        if(ts.tv_nsec >= 1000000000)
            ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&C->cv, &C->mu, &ts);
    }
    pthread_mutex_unlock(&C->mu);
    json_t *existing = C->policies_inf ? kube_informer_get(C->policies_inf, C->f.ns, C->f.policies_configmap) : NULL;
    pthread_mutex_lock(&C->mu);
    if(!existing && !C->current && !C->pending_cm)
        C->pending_cm = json_null();
    pthread_mutex_unlock(&C->mu);
    json_decref(existing);
    for(;;) {
        pthread_mutex_lock(&C->mu);
        while(!C->stopping && !C->pending_cm && !C->deleted_cm)
            pthread_cond_wait(&C->cv, &C->mu);
        if(C->stopping) {
            pthread_mutex_unlock(&C->mu);
            break;
        }
        json_t *gone = C->deleted_cm;
        C->deleted_cm = NULL;
        json_t *cm = C->pending_cm;
        C->pending_cm = NULL;
        pthread_mutex_unlock(&C->mu);
        if(gone) {
            log_write(LOG_WARN, "reload",
                      "the policies ConfigMap was deleted; the last bundle keeps serving (apply an empty "
                      "ConfigMap to serve the default policies)",
                      "configmap", C->f.policies_configmap, NULL);
            record_event(gone, "Warning", "PolicyConfigMapDeleted",
                         "the policies ConfigMap was deleted; the last loaded bundle keeps serving; apply an empty "
                         "ConfigMap to serve the default policies");
            json_decref(gone);
        }
        if(!cm)
            continue;

        const json_t *src = json_is_null(cm) ? NULL : cm;
        const char *rv = src ? json_string_value(json_object_get(json_object_get(src, "metadata"), "resourceVersion"))
                             : NULL;
        bundle *cur = bundle_current();
        int same = cur && ((!src && !cur->source_rv) ||
                           (src && cur->source_rv && rv && strcmp(cur->source_rv, rv) == 0));
        bundle_unref(cur);
        /* a resync replays the same failed version: report it once */
        if(!same && src && rv && C->failed_rv && strcmp(C->failed_rv, rv) == 0)
            same = 1;
        if(same) {
            json_decref(cm);
            continue;
        }
        cozy_err err;
        bundle *b = compile_bundle(src, &err);
        if(b) {
            publish(b);
            metrics_counter_add("cozygpu_policy_reloads_total", "result=\"success\"", 1);
            log_write(LOG_INFO, "reload", src ? "policies reloaded from the ConfigMap" : "serving the default policies",
                      "configmap", C->f.policies_configmap, "resourceVersion", rv, NULL);
            if(src)
                record_event(src, "Normal", "PolicyReloaded", "policy bundle compiled, self-checked and serving");
        } else {
            metrics_counter_add("cozygpu_policy_reloads_total", "result=\"failure\"", 1);
            free(C->failed_rv);
            C->failed_rv = rv ? strdup(rv) : NULL;
            pthread_mutex_lock(&C->mu);
            int serving = C->policies_loaded;
            free(C->policy_error);
            C->policy_error = strdup(err.msg);
            pthread_mutex_unlock(&C->mu);
            log_write(LOG_ERROR, "reload",
                      serving ? "policy reload failed; the previous bundle keeps serving"
                              : "policy bundle failed to load; not ready",
                      "configmap", C->f.policies_configmap, "resourceVersion", rv, "error", err.msg, NULL);
            if(src) {
                char msg[1100];
                snprintf(msg, sizeof msg, "%s%s", serving ? "previous bundle keeps serving: " : "not serving: ",
                         err.msg);
                record_event(src, "Warning", "PolicyReloadFailed", msg);
            }
        }
        json_decref(cm);
    }
    return NULL;
}

static void queue_reload(json_t *cm_or_null)
{
    pthread_mutex_lock(&C->mu);
    json_decref(C->pending_cm);
    C->pending_cm = cm_or_null;
    pthread_cond_broadcast(&C->cv);
    pthread_mutex_unlock(&C->mu);
}

static void on_policies_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    (void)ctx;
    (void)inf;
    if(strcmp(type, "DELETED") != 0) {
        queue_reload(json_deep_copy(obj));
        return;
    }
    /* Deleting the ConfigMap does not drop the hoster's rules (that would
     * fail open): the last bundle keeps serving; an empty ConfigMap is how
     * to go back to the defaults (docs/decisions/0009). Only a replica
     * that never loaded a bundle (the ConfigMap was broken) takes the
     * defaults, as at a start without a ConfigMap. */
    pthread_mutex_lock(&C->mu);
    int have = C->current != NULL;
    if(have) {
        json_decref(C->deleted_cm);
        C->deleted_cm = json_deep_copy(obj);
        pthread_cond_broadcast(&C->cv);
    }
    pthread_mutex_unlock(&C->mu);
    if(!have)
        queue_reload(json_null());
}

static void on_class_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    (void)ctx, (void)inf, (void)type, (void)obj;
    pthread_mutex_lock(&C->mu);
    C->status_dirty = 1;
    pthread_cond_broadcast(&C->cv);
    pthread_mutex_unlock(&C->mu);
}

/* ---- leader-only writer: GPUClass status --------------------------------- */

/* Each GPUClass gets one condition, type "Accepted" (API conventions:
 * status.conditions with observedGeneration), True when the class passes
 * the gpuclass validation rules of the current bundle, False with their
 * message otherwise. A class admitted before a policy change can become
 * invalid; the condition is how the hoster sees it. Written through the
 * status subresource, only when it changes, only while leading. */
typedef struct class_cond {
    const char *status, *reason, *message;
    json_int_t generation;
    const char *now;
} class_cond;

static int set_condition(json_t *obj, void *ctx)
{
    class_cond *c = ctx;
    json_t *status = json_object_get(obj, "status");
    if(!json_is_object(status)) {
        status = json_object();
        json_object_set_new(obj, "status", status);
    }
    json_t *conds = json_object_get(status, "conditions");
    if(!json_is_array(conds)) {
        conds = json_array();
        json_object_set_new(status, "conditions", conds);
    }
    json_t *mine = NULL;
    size_t i;
    json_t *x;
    json_array_foreach(conds, i, x) if(json_is_string(json_object_get(x, "type")) &&
                                       strcmp(json_string_value(json_object_get(x, "type")), "Accepted") == 0) mine = x;
    if(mine) {
        const char *st = json_string_value(json_object_get(mine, "status"));
        const char *rs = json_string_value(json_object_get(mine, "reason"));
        const char *ms = json_string_value(json_object_get(mine, "message"));
        json_int_t og = json_integer_value(json_object_get(mine, "observedGeneration"));
        if(st && rs && ms && strcmp(st, c->status) == 0 && strcmp(rs, c->reason) == 0 &&
           strcmp(ms, c->message) == 0 && og == c->generation)
            return 1; /* unchanged: no write */
        if(!st || strcmp(st, c->status) != 0)
            json_object_set_new(mine, "lastTransitionTime", json_string(c->now));
    } else {
        mine = json_pack("{s:s, s:s}", "type", "Accepted", "lastTransitionTime", c->now);
        json_array_append_new(conds, mine);
    }
    json_object_set_new(mine, "status", json_string(c->status));
    json_object_set_new(mine, "reason", json_string(c->reason));
    json_object_set_new(mine, "message", json_string(c->message));
    json_object_set_new(mine, "observedGeneration", json_integer(c->generation));
    return lease_is_leader(C->lease) ? 0 : -1; /* last check before the write */
}

static void reconcile_classes(engine *e)
{
    json_t *classes = kube_informer_list(C->classes_inf);
    size_t i;
    json_t *cls;
    json_array_foreach(classes, i, cls)
    {
        if(!lease_is_leader(C->lease))
            break;
        json_t *obj = with_kind(cls, &KUBE_GPUCLASSES);
        const char *name = json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
        json_t *req = json_pack("{s:s, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:s}, s:s, s:s, s:{s:s}, s:O}", "uid",
                                "00000000-0000-4000-8000-c1a550000000", "kind", "group", "cozystack.io", "version",
                                "v1alpha1", "kind", "GPUClass", "resource", "group", "cozystack.io", "version",
                                "v1alpha1", "resource", "gpuclasses", "operation", "CREATE", "name", name ? name : "",
                                "userInfo", "username", "system:serviceaccount:cozygpu:status", "object", obj);
        engine_verdict v = {0};
        cozy_err err;
        if(req && name && engine_review(e, req, ENGINE_VALIDATE, &v, &err) == COZY_OK) {
            int ok = v.outcome == ENGINE_ALLOWED;
            const char *m = v.message;
            char now[40];
            time_t t = time(NULL);
            struct tm tm;
            gmtime_r(&t, &tm);
            strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm);
            class_cond c = {ok ? "True" : "False", ok ? "Valid" : "Invalid",
                            ok ? "the class passes the gpuclass rules" : (m ? m : "refused by the gpuclass rules"),
                            json_integer_value(json_object_get(json_object_get(obj, "metadata"), "generation")), now};
            json_t *out = NULL;
            if(kube_update_retry(C->client, &KUBE_GPUCLASSES, NULL, name, 1, set_condition, &c, &out, &err) !=
               COZY_OK)
                log_write(LOG_WARN, "status", "cannot write GPUClass status", "gpuclass", name, "error", err.msg,
                          NULL);
            json_decref(out);
        }
        json_decref(v.response);
        json_decref(req);
        json_decref(obj);
    }
    json_decref(classes);
}

static void *writer_main(void *arg)
{
    (void)arg;
    engine *e = NULL;
    bundle *eb = NULL;
    for(;;) {
        pthread_mutex_lock(&C->mu);
        if(!C->stopping && !C->status_dirty) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += C->f.status_interval_ms / 1000;
            ts.tv_nsec += (C->f.status_interval_ms % 1000) * 1000000;
            if(ts.tv_nsec >= 1000000000)
                ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&C->cv, &C->mu, &ts);
        }
        int stop = C->stopping;
        C->status_dirty = 0;
        pthread_mutex_unlock(&C->mu);
        if(stop)
            break;
        if(!lease_is_leader(C->lease) || !kube_watcher_synced(C->watcher))
            continue;
        bundle *b = bundle_current();
        if(!b)
            continue;
        cozy_err err;
        if(!e || eb != b) {
            engine_close(e);
            e = NULL;
            engine_options eo = bundle_engine_options(b);
            if(engine_open(&e, &eo, &err) != COZY_OK) {
                log_write(LOG_ERROR, "status", "cannot open the policy engine", "error", err.msg, NULL);
                bundle_unref(b);
                continue;
            }
            bundle_unref(eb);
            eb = b;
        } else
            bundle_unref(b);
        json_t *snap = cluster_snapshot();
        if(engine_set_cluster(e, snap, C->settings, &err) == COZY_OK)
            reconcile_classes(e);
        json_decref(snap);
    }
    engine_close(e);
    bundle_unref(eb);
    return NULL;
}

static void on_leader_change(void *ctx, int leading)
{
    (void)ctx;
    if(leading) {
        pthread_mutex_lock(&C->mu);
        C->status_dirty = 1;
        pthread_cond_broadcast(&C->cv);
        pthread_mutex_unlock(&C->mu);
    }
}

/* ---- start-up and shutdown ----------------------------------------------- */

static const webhook_endpoint ENDPOINTS[] = {
    {"/validate/vmi", "vmi-validate", ENGINE_VALIDATE},
    {"/mutate/vmi", "vmi-mutate", ENGINE_MUTATE},
    {"/mutate/launcher", "launcher-mutate", ENGINE_MUTATE},
    {"/validate/gpuclass", "gpuclass-validate", ENGINE_VALIDATE},
    {"/validate/gpuclaim", "gpuclaim-validate", ENGINE_VALIDATE},
    {"/validate/pod", "pod-validate", ENGINE_VALIDATE},
};

static int parse_flags(int argc, char **argv, flags *f)
{
    enum {
        O_KUBECONFIG = 1000, O_CONTEXT, O_SERVER, O_NS, O_ID, O_CONFIG, O_PCM, O_POLICIES, O_LIBRARY, O_STATE,
        O_ADDRESS, O_PORT, O_PORTFILE, O_CERT, O_KEY, O_WORKERS, O_RTIMEOUT, O_MAXBODY, O_LEADER, O_LEASE,
        O_LEASEDUR, O_RENEW, O_RETRY, O_RESYNC, O_GRACE, O_STATUSINT, O_LOGFMT, O_LOGLVL, O_HELP
    };
    static const struct option opts[] = {
        {"kubeconfig", required_argument, 0, O_KUBECONFIG}, {"context", required_argument, 0, O_CONTEXT},
        {"server", required_argument, 0, O_SERVER},         {"namespace", required_argument, 0, O_NS},
        {"identity", required_argument, 0, O_ID},           {"config", required_argument, 0, O_CONFIG},
        {"policies-configmap", required_argument, 0, O_PCM}, {"policies", required_argument, 0, O_POLICIES},
        {"library", required_argument, 0, O_LIBRARY},       {"state-dir", required_argument, 0, O_STATE},
        {"address", required_argument, 0, O_ADDRESS},       {"port", required_argument, 0, O_PORT},
        {"port-file", required_argument, 0, O_PORTFILE},    {"tls-cert-file", required_argument, 0, O_CERT},
        {"tls-key-file", required_argument, 0, O_KEY},      {"workers", required_argument, 0, O_WORKERS},
        {"review-timeout", required_argument, 0, O_RTIMEOUT}, {"max-body-bytes", required_argument, 0, O_MAXBODY},
        {"leader-elect", required_argument, 0, O_LEADER},   {"lease-name", required_argument, 0, O_LEASE},
        {"lease-duration", required_argument, 0, O_LEASEDUR}, {"renew-deadline", required_argument, 0, O_RENEW},
        {"retry-period", required_argument, 0, O_RETRY},    {"resync", required_argument, 0, O_RESYNC},
        {"shutdown-grace", required_argument, 0, O_GRACE},  {"status-interval", required_argument, 0, O_STATUSINT},
        {"log-format", required_argument, 0, O_LOGFMT},     {"log-level", required_argument, 0, O_LOGLVL},
        {"help", no_argument, 0, O_HELP},                   {0, 0, 0, 0},
    };
    static char host[300];
    const char *env_ns = getenv("POD_NAMESPACE"), *env_id = getenv("POD_NAME");
    {
        /* as kube-controller-manager does: host name plus a random part, so
         * two processes on one host never share an identity (and so a
         * Lease) by accident */
        char h[256];
        if(gethostname(h, sizeof h - 1) != 0)
            snprintf(h, sizeof h, "cozygpu");
        h[sizeof h - 1] = 0;
        unsigned char rnd[6] = {0};
        FILE *ur = fopen("/dev/urandom", "rb");
        if(ur) {
            if(fread(rnd, 1, sizeof rnd, ur) != sizeof rnd)
                memset(rnd, 0, sizeof rnd);
            fclose(ur);
        }
        snprintf(host, sizeof host, "%s_%02x%02x%02x%02x%02x%02x", h, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
    }
    const char *tmp = getenv("TMPDIR");
    *f = (flags){
        .ns = env_ns && *env_ns ? env_ns : "cozy-gpu",
        .identity = env_id && *env_id ? env_id : host,
        .policies_configmap = "cozygpu-policies",
        .state_dir = tmp && *tmp ? tmp : "/tmp",
        .address = "0.0.0.0",
        .port = 8443,
        .workers = 4,
        .review_timeout_ms = 8000,
        .max_body = 3 * 1024 * 1024,
        .leader_elect = 1,
        .lease_name = "cozygpu-controller",
        .lease_ms = 15000,
        .renew_ms = 10000,
        .retry_ms = 2000,
        .resync_ms = 600000,
        .shutdown_grace_ms = 25000,
        .status_interval_ms = 30000,
        .level = LOG_INFO,
    };
    int c;
    optind = 1;
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        long *dur = NULL;
        char *end;
        switch(c) {
        case O_KUBECONFIG: f->kubeconfig = optarg; break;
        case O_CONTEXT: f->context = optarg; break;
        case O_SERVER: f->server = optarg; break;
        case O_NS: f->ns = optarg; break;
        case O_ID: f->identity = optarg; break;
        case O_CONFIG: f->config_file = optarg; break;
        case O_PCM: f->policies_configmap = optarg; break;
        case O_POLICIES: f->policies_dir = optarg; break;
        case O_LIBRARY: f->library_dir = optarg; break;
        case O_STATE: f->state_dir = optarg; break;
        case O_ADDRESS: f->address = optarg; break;
        case O_PORT:
            f->port = (int)strtol(optarg, &end, 10);
            if(!*optarg || *end || f->port < 0 || f->port > 65535) {
                fprintf(stderr, "cozygpu controller: --port: not a port number: %s\n", optarg);
                return -1;
            }
            break;
        case O_PORTFILE: f->port_file = optarg; break;
        case O_CERT: f->cert_file = optarg; break;
        case O_KEY: f->key_file = optarg; break;
        case O_WORKERS:
            f->workers = (int)strtol(optarg, &end, 10);
            if(!*optarg || *end || f->workers < 1 || f->workers > 256) {
                fprintf(stderr, "cozygpu controller: --workers: need 1..256, got %s\n", optarg);
                return -1;
            }
            break;
        case O_MAXBODY:
            f->max_body = strtol(optarg, &end, 10);
            if(!*optarg || *end || f->max_body < 1024) {
                fprintf(stderr, "cozygpu controller: --max-body-bytes: need an integer >= 1024, got %s\n", optarg);
                return -1;
            }
            break;
        case O_LEADER:
            if(strcmp(optarg, "true") == 0)
                f->leader_elect = 1;
            else if(strcmp(optarg, "false") == 0)
                f->leader_elect = 0;
            else {
                fprintf(stderr, "cozygpu controller: --leader-elect: true or false, got %s\n", optarg);
                return -1;
            }
            break;
        case O_LEASE: f->lease_name = optarg; break;
        case O_RTIMEOUT: dur = &f->review_timeout_ms; break;
        case O_LEASEDUR: dur = &f->lease_ms; break;
        case O_RENEW: dur = &f->renew_ms; break;
        case O_RETRY: dur = &f->retry_ms; break;
        case O_RESYNC: dur = &f->resync_ms; break;
        case O_GRACE: dur = &f->shutdown_grace_ms; break;
        case O_STATUSINT: dur = &f->status_interval_ms; break;
        case O_LOGFMT:
            if(strcmp(optarg, "json") == 0)
                f->log_json = 1;
            else if(strcmp(optarg, "text") == 0)
                f->log_json = 0;
            else {
                fprintf(stderr, "cozygpu controller: --log-format: json or text, got %s\n", optarg);
                return -1;
            }
            break;
        case O_LOGLVL:
            if(log_level_parse(optarg, &f->level) != 0) {
                fprintf(stderr, "cozygpu controller: --log-level: debug, info, warn or error, got %s\n", optarg);
                return -1;
            }
            break;
        case O_HELP: usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
        if(dur && cozy_parse_duration(optarg, dur) != 0) {
            fprintf(stderr, "cozygpu controller: --%s: not a duration (like 500ms, 15s, 2m): %s\n",
                    opts[c - O_KUBECONFIG].name, optarg);
            return -1;
        }
    }
    if(optind < argc) {
        fprintf(stderr, "cozygpu controller: unexpected argument \"%s\"\n", argv[optind]);
        return -1;
    }
    const struct {
        const char *flag;
        const char **value;
    } names[] = {{"--namespace", &f->ns}, {"--identity", &f->identity}, {"--lease-name", &f->lease_name}};
    for(size_t i = 0; i < sizeof names / sizeof *names; i++)
        if(!*names[i].value || !**names[i].value) {
            fprintf(stderr, "cozygpu controller: %s: must not be empty\n", names[i].flag);
            return -1;
        }
    if(f->policies_configmap && *f->policies_configmap) {
        /* a ConfigMap name is a DNS subdomain (RFC 1123): lowercase
         * letters, digits, '-' and '.', at most 253 */
        const char *n = f->policies_configmap;
        int ok = strlen(n) <= 253 && isalnum((unsigned char)n[0]) && isalnum((unsigned char)n[strlen(n) - 1]);
        for(const char *q = n; ok && *q; q++)
            ok = (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '-' || *q == '.';
        if(!ok) {
            fprintf(stderr, "cozygpu controller: --policies-configmap: \"%s\" is not a ConfigMap name "
                            "(lowercase letters, digits, '-' and '.')\n", n);
            return -1;
        }
    }
    if(f->leader_elect && !(f->retry_ms > 0 && f->retry_ms < f->renew_ms && f->renew_ms < f->lease_ms)) {
        fprintf(stderr, "cozygpu controller: --retry-period (%ld ms) < --renew-deadline (%ld ms) < "
                        "--lease-duration (%ld ms) is required\n", f->retry_ms, f->renew_ms, f->lease_ms);
        return -1;
    }
    if(!f->cert_file || !f->key_file) {
        fprintf(stderr, "cozygpu controller: --tls-cert-file and --tls-key-file are required (the API server "
                        "calls webhooks over HTTPS only)\n");
        return -1;
    }
    {
        struct stat st;
        errno = 0;
        if(stat(f->state_dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(f->state_dir, W_OK | X_OK) != 0) {
            fprintf(stderr, "cozygpu controller: --state-dir %s: not a writable directory%s%s\n", f->state_dir,
                    errno ? ": " : "", errno ? strerror(errno) : "");
            return -1;
        }
    }
    if(f->review_timeout_ms < 100 || f->review_timeout_ms > 29000) {
        fprintf(stderr, "cozygpu controller: --review-timeout: need 100ms..29s (webhooks time out at 30s at most)\n");
        return -1;
    }
    return 0;
}

static void write_port_file(const char *path, int port)
{
    char tmp[PATH_MAX];
    if(snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return;
    FILE *fp = fopen(tmp, "w");
    if(!fp)
        return;
    fprintf(fp, "%d\n", port);
    if(fclose(fp) == 0)
        rename(tmp, path);
}

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* SIGUSR1: writes what the watch caches hold, one JSON object per cached
 * object ({resource, namespace, name, resourceVersion, uid}), to
 * <state-dir>/cache.json (replaced atomically), for operators comparing a
 * replica's view with the API server, and for the specs. */
static void dump_caches(void)
{
    kube_informer *all[13];
    int n = 0;
    for(int i = 0; i < C->n_cluster_inf; i++)
        all[n++] = C->cluster_inf[i];
    if(C->policies_inf)
        all[n++] = C->policies_inf;
    json_t *out = json_array();
    for(int i = 0; i < n; i++) {
        const kube_resource *r = kube_informer_resource(all[i]);
        json_t *items = kube_informer_list(all[i]);
        size_t j;
        json_t *o;
        json_array_foreach(items, j, o)
        {
            const json_t *md = json_object_get(o, "metadata");
            json_array_append_new(out, json_pack("{s:s, s:s?, s:s?, s:s?, s:s?}", "resource", r->resource,
                                                 "namespace", json_string_value(json_object_get(md, "namespace")),
                                                 "name", json_string_value(json_object_get(md, "name")),
                                                 "resourceVersion",
                                                 json_string_value(json_object_get(md, "resourceVersion")), "uid",
                                                 json_string_value(json_object_get(md, "uid"))));
        }
        json_decref(items);
    }
    char path[PATH_MAX], tmp[PATH_MAX];
    if(snprintf(path, sizeof path, "%s/cache.json", C->f.state_dir) >= (int)sizeof path ||
       snprintf(tmp, sizeof tmp, "%s/cache.json.tmp", C->f.state_dir) >= (int)sizeof tmp) {
        json_decref(out);
        return;
    }
    if(json_dump_file(out, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) == 0 && rename(tmp, path) == 0)
        log_write(LOG_INFO, "controller", "wrote the watch caches", "path", path, NULL);
    else
        log_write(LOG_WARN, "controller", "cannot write the watch caches", "path", path, NULL);
    json_decref(out);
}

int controller_main(int argc, char **argv)
{
    static ctl state;
    C = &state;
    int rp = parse_flags(argc, argv, &C->f);
    if(rp != 0)
        return rp > 0 ? 0 : 2;
    flags *f = &C->f;
    log_setup(f->log_json, f->level);
    int status = 2;
    cozy_err err;
    pthread_mutex_init(&C->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&C->cv, &ca);
    pthread_condattr_destroy(&ca);

    /* signals: blocked in every thread; the main thread waits for them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    metrics_declare("cozygpu_admission_reviews_total", "counter", "Admission reviews answered, by webhook and decision.");
    metrics_declare("cozygpu_admission_review_duration_seconds", "histogram", "Time to answer one admission review.");
    metrics_declare("cozygpu_policy_errors_total", "counter", "Reviews refused because a policy failed (error, budget, memory, deadline).");
    metrics_declare("cozygpu_policy_reloads_total", "counter", "Policy bundle reloads from the ConfigMap, by result.");
    metrics_declare("cozygpu_policy_bundle_generation", "gauge", "Generation of the policy bundle being served.");
    metrics_declare("cozygpu_watch_restarts_total", "counter", "Watch restarts, by resource and reason.");
    metrics_declare("cozygpu_leader", "gauge", "1 while this replica holds the leader Lease.");
    metrics_counter_add("cozygpu_policy_reloads_total", "result=\"success\"", 0);
    metrics_counter_add("cozygpu_policy_reloads_total", "result=\"failure\"", 0);
    metrics_counter_add("cozygpu_policy_errors_total", NULL, 0);
    metrics_gauge_set("cozygpu_leader", NULL, 0);

    /* settings */
    if(f->config_file) {
        if(config_load_file(f->config_file, &C->settings, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu controller: --config: %s\n", err.msg);
            goto out;
        }
    } else
        C->settings = config_defaults();
    json_t *budget = json_object_get(C->settings, "policyBudget");
    C->eo = (engine_options){
        .library_dir = f->library_dir,
        .bundle_dir = f->policies_dir,
        .instructions = json_integer_value(json_object_get(budget, "instructions")),
        .memory_bytes = json_integer_value(json_object_get(budget, "memoryBytes")),
    };
    {
        /* the default bundle must load before anything else starts */
        engine *probe = NULL;
        if(engine_open(&probe, &C->eo, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu controller: default policies: %s\n", err.msg);
            goto out;
        }
        engine_close(probe);
    }

    /* API client */
    char ua[512];
    snprintf(ua, sizeof ua, "cozygpu/" COZYGPU_VERSION " (%s)", f->identity);
    kube_client_options ko = {.kubeconfig = f->kubeconfig, .context = f->context, .server = f->server,
                              .user_agent = ua, .timeout_ms = 10000, .max_retries = 4};
    if(kube_client_new(&C->client, &ko, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu controller: %s\n", err.msg);
        goto out;
    }

    /* watches */
    C->watcher = kube_watcher_new(C->client, f->resync_ms / 1000);
    /* what the policies read (docs/decisions/0008); VMIs for the raw-name
     * usage that raw budget keys count (DESIGN.md §5) */
    static const kube_resource *const cluster_kinds[] = {&KUBE_NAMESPACES, &KUBE_NODES,      &KUBE_RESOURCEQUOTAS,
                                                          &KUBE_KUBEVIRTS,  &KUBE_GPUCLASSES, &KUBE_GPUCLAIMS,
                                                          &KUBE_VMIS, &KUBE_RESOURCECLAIMS, &KUBE_RESOURCECLAIMTEMPLATES};
    for(size_t i = 0; i < sizeof cluster_kinds / sizeof *cluster_kinds; i++) {
        kube_event_fn fn = cluster_kinds[i] == &KUBE_GPUCLASSES ? on_class_event : NULL;
        C->cluster_inf[C->n_cluster_inf++] = kube_watcher_add(C->watcher, cluster_kinds[i], NULL, NULL, NULL, fn, NULL);
        if(cluster_kinds[i] == &KUBE_GPUCLASSES)
            C->classes_inf = C->cluster_inf[C->n_cluster_inf - 1];
        /* DRA objects, for the raw-name policy's pod resource claims; a
         * cluster without DRA does not serve them */
        if(cluster_kinds[i] == &KUBE_RESOURCECLAIMS || cluster_kinds[i] == &KUBE_RESOURCECLAIMTEMPLATES)
            kube_informer_set_optional(C->cluster_inf[C->n_cluster_inf - 1]);
    }
    if(f->policies_configmap && *f->policies_configmap) {
        char sel[300];
        snprintf(sel, sizeof sel, "metadata.name=%s", f->policies_configmap);
        C->policies_inf = kube_watcher_add(C->watcher, &KUBE_CONFIGMAPS, f->ns, NULL, sel, on_policies_event, NULL);
    }
    if(kube_watcher_start(C->watcher, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu controller: %s\n", err.msg);
        goto out;
    }
    if(pthread_create(&C->reloader, NULL, reloader_main, NULL) != 0) {
        fprintf(stderr, "cozygpu controller: cannot start the reload thread\n");
        goto out;
    }

    /* webhook server */
    webhook_options wo = {
        .address = f->address,
        .port = f->port,
        .cert_file = f->cert_file,
        .key_file = f->key_file,
        .endpoints = ENDPOINTS,
        .n_endpoints = sizeof ENDPOINTS / sizeof *ENDPOINTS,
        .workers = (unsigned)f->workers,
        .max_body_bytes = (size_t)f->max_body,
        .review_timeout_ms = f->review_timeout_ms,
        .review = on_review,
        .ctx = C,
        .ready = on_ready,
    };
    if(webhook_start(&C->server, &wo, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu controller: %s\n", err.msg);
        goto shutdown;
    }
    char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", webhook_port(C->server));
    if(f->port_file)
        write_port_file(f->port_file, webhook_port(C->server));
    log_write(LOG_INFO, "controller", "serving admission webhooks", "port", portbuf, "identity", f->identity,
              "server", kube_client_server(C->client), NULL);

    if(f->leader_elect) {
        lease_options lo = {.namespace_ = f->ns, .name = f->lease_name, .identity = f->identity,
                            .lease_duration_ms = f->lease_ms, .renew_deadline_ms = f->renew_ms,
                            .retry_period_ms = f->retry_ms, .on_change = on_leader_change};
        if(lease_start(&C->lease, C->client, &lo, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu controller: %s\n", err.msg);
            goto shutdown;
        }
    }
    if(pthread_create(&C->writer, NULL, writer_main, NULL) != 0) {
        fprintf(stderr, "cozygpu controller: cannot start the status writer\n");
        goto shutdown;
    }

    /* run until SIGTERM / SIGINT; SIGUSR1 dumps the caches */
    int sig = 0;
    while(sigwait(&sigs, &sig) == 0 && sig == SIGUSR1)
        dump_caches();
    log_write(LOG_INFO, "controller", "shutting down", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
    status = 0;

shutdown:
    pthread_mutex_lock(&C->mu);
    C->stopping = 1; /* /readyz answers 503 from now on */
    pthread_cond_broadcast(&C->cv);
    pthread_mutex_unlock(&C->mu);
    if(C->server) {
        webhook_quiesce(C->server);
        long long t0 = mono_ms();
        while(webhook_in_flight(C->server) > 0 && mono_ms() - t0 < f->shutdown_grace_ms)
            usleep(10000);
        if(webhook_in_flight(C->server) > 0)
            log_write(LOG_WARN, "controller", "shutdown grace passed with reviews in flight", NULL);
        webhook_stop(C->server);
    }
    if(C->writer)
        pthread_join(C->writer, NULL);
    lease_stop(C->lease, 1); /* after the writer: nothing writes once released */
    if(C->reloader)
        pthread_join(C->reloader, NULL);
    if(C->watcher) {
        kube_watcher_stop(C->watcher);
        kube_watcher_free(C->watcher);
    }
    log_write(LOG_INFO, "controller", "stopped", NULL);
out:
    for(size_t i = 0; i < C->n_engines; i++)
        engine_close(C->engines[i]);
    free(C->engines);
    json_decref(C->pending_cm);
    json_decref(C->deleted_cm);
    bundles_free_all();
    free(C->policy_error);
    free(C->failed_rv);
    kube_client_free(C->client);
    json_decref(C->settings);
    return status;
}
