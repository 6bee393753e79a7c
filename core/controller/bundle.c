/* bundle.c — the policy bundle: the policies ConfigMap compiled aside,
 * self-checked, then published; the reloader thread that does it on every
 * change, and the Events that report it (internal.h, ctl_bundle_).
 *
 * Rules: DESIGN.md §9 "Hot reload" (compile aside, self-check, swap only
 * if it loads, else report by log, metric and Event);
 * docs/decisions/0007 (ConfigMap keys: NAME.lua is a policy, lib.a.b.lua
 * the module "a.b"; engine_source_for_key maps them); docs/decisions/0009
 * (sources handed to the engine from memory; first bundle after the caches
 * list, a broken one at start leaves the replica unready, deletion keeps
 * the last bundle, one Event per resourceVersion); docs/decisions/0012.
 */
#include "controller/internal.h"

#include "admission/policytest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/metrics.h"

struct ctl_bundle {
    struct ctl_bundle *prev, *next; /* every live bundle (`bundles`), for the exit */
    unsigned long gen;              /* 1, 2, ... in publishing order */
    json_t *data;                   /* the ConfigMap's data (owned), or NULL: defaults only */
    engine_source *sources;         /* point into data and modules */
    char (*modules)[256];           /* module names of lib.* keys */
    size_t n_sources;
    char *source_rv;                /* the ConfigMap's resourceVersion, or NULL */
    cozy_buf ignored;               /* keys neither a policy file nor a policy test, ", "-separated */
    int refs;                       /* ctl_proc->mu */
};

/* State of the reloader, guarded by ctl_proc->mu unless marked. */
static ctl_bundle *bundles;  /* every bundle not yet freed (for the exit) */
static json_t *pending_cm;   /* ConfigMap waiting for the reloader, or json_null() for "deleted" */
static json_t *deleted_cm;   /* the ConfigMap just deleted, for the reloader to report */
static char *policy_error;   /* last reload failure, or NULL */
static char *failed_rv;      /* reloader thread only: resourceVersion of the last bundle that failed */

static void bundle_free(ctl_bundle *b)
{
    json_decref(b->data);
    free(b->sources);
    free(b->modules);
    free(b->source_rv);
    cozy_buf_free(&b->ignored);
    free(b);
}

/* The engine options of bundle `b`: the controller's, with b's sources. */
engine_options ctl_bundle_engine_options(const ctl_bundle *b)
{
    engine_options eo = ctl_proc->eo;
    eo.override_sources = b->sources;
    eo.n_override_sources = b->n_sources;
    return eo;
}

void ctl_bundle_unref(ctl_bundle *b)
{
    if(!b)
        return;
    pthread_mutex_lock(&ctl_proc->mu);
    int last = --b->refs == 0;
    if(last) {
        if(b->prev)
            b->prev->next = b->next;
        else
            bundles = b->next;
        if(b->next)
            b->next->prev = b->prev;
    }
    pthread_mutex_unlock(&ctl_proc->mu);
    if(last)
        bundle_free(b);
}

/* At exit the webhook threads are gone with their references, so every
 * bundle left is freed. */
void ctl_bundle_free_all(void)
{
    json_decref(pending_cm);
    pending_cm = NULL;
    json_decref(deleted_cm);
    deleted_cm = NULL;
    while(bundles) {
        ctl_bundle *b = bundles;
        bundles = b->next;
        bundle_free(b);
    }
    ctl_proc->current = NULL;
    free(policy_error);
    policy_error = NULL;
    free(failed_rv);
    failed_rv = NULL;
}

ctl_bundle *ctl_bundle_current(void)
{
    pthread_mutex_lock(&ctl_proc->mu);
    ctl_bundle *b = ctl_proc->current;
    if(b)
        b->refs++;
    pthread_mutex_unlock(&ctl_proc->mu);
    return b;
}

/* ---- events -------------------------------------------------------------- */

/* An Event on the policies ConfigMap (event.c). */
static void record_event(const json_t *cm, const char *type, const char *reason, const char *message)
{
    ctl_event_record(cm, "v1", "ConfigMap", type, reason, message);
}

/* ---- policy reload ------------------------------------------------------- */

/* The reviews every bundle must answer without a policy failure before it
 * is served (decision 0009: a bundle that failed on every review used to be
 * served): one request of each kind the webhooks receive (DESIGN.md §4),
 * shaped as the API server sends them. NAME and RESOURCE are replaced by a
 * GPUClass of the cluster (or stand-ins): the rules then run their GPU
 * paths, not only their early returns. Denials are fine; a rule that
 * errors, loops or exhausts memory is not. */
static const char *const GATE_REVIEWS[][2] = {
    {"a Namespace CREATE",
     "{\"uid\":\"00000000-0000-4000-8000-5e1fc4ec0000\",\"kind\":{\"group\":\"\",\"version\":\"v1\",\"kind\":\"Namespace\"},"
     "\"resource\":{\"group\":\"\",\"version\":\"v1\",\"resource\":\"namespaces\"},\"operation\":\"CREATE\","
     "\"name\":\"cozygpu-self-check\",\"userInfo\":{\"username\":\"system:serviceaccount:cozygpu:self-check\"},"
     "\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"cozygpu-self-check\"}}}"},
    {"a GPU VirtualMachineInstance CREATE",
     "{\"uid\":\"00000000-0000-4000-8000-5e1fc4ec0001\",\"kind\":{\"group\":\"kubevirt.io\",\"version\":\"v1\","
     "\"kind\":\"VirtualMachineInstance\"},\"resource\":{\"group\":\"kubevirt.io\",\"version\":\"v1\","
     "\"resource\":\"virtualmachineinstances\"},\"operation\":\"CREATE\",\"name\":\"self-check\","
     "\"namespace\":\"cozygpu-self-check\",\"userInfo\":{\"username\":\"system:serviceaccount:cozygpu:self-check\"},"
     "\"object\":{\"apiVersion\":\"kubevirt.io/v1\",\"kind\":\"VirtualMachineInstance\",\"metadata\":{\"name\":"
     "\"self-check\",\"namespace\":\"cozygpu-self-check\",\"labels\":{\"gpu.cozystack.io/class-reference\":\"true\"}},"
     "\"spec\":{\"domain\":{\"devices\":{\"gpus\":[{\"name\":\"gpu1\",\"deviceName\":\"RESOURCE\"}],\"hostDevices\":"
     "[{\"name\":\"hd1\",\"deviceName\":\"RESOURCE\"}]},\"resources\":{\"limits\":{\"RESOURCE\":\"1\"}}}}}}"},
    {"a virt-launcher Pod CREATE",
     "{\"uid\":\"00000000-0000-4000-8000-5e1fc4ec0002\",\"kind\":{\"group\":\"\",\"version\":\"v1\",\"kind\":\"Pod\"},"
     "\"resource\":{\"group\":\"\",\"version\":\"v1\",\"resource\":\"pods\"},\"operation\":\"CREATE\","
     "\"namespace\":\"cozygpu-self-check\",\"userInfo\":{\"username\":\"system:serviceaccount:kubevirt:kubevirt-controller\"},"
     "\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"generateName\":\"virt-launcher-self-check-\","
     "\"namespace\":\"cozygpu-self-check\",\"labels\":{\"kubevirt.io\":\"virt-launcher\"},\"annotations\":"
     "{\"gpu.cozystack.io/classes\":\"NAME=1\"},\"ownerReferences\":[{\"apiVersion\":\"kubevirt.io/v1\",\"kind\":"
     "\"VirtualMachineInstance\",\"name\":\"self-check\",\"uid\":\"00000000-0000-4000-8000-5e1fc4ec0003\","
     "\"controller\":true}]},\"spec\":{\"containers\":[{\"name\":\"compute\",\"resources\":{\"limits\":{\"RESOURCE\":\"1\"},"
     "\"requests\":{\"RESOURCE\":\"1\"}}}]}}}"},
    {"a GPUClass CREATE",
     "{\"uid\":\"00000000-0000-4000-8000-5e1fc4ec0004\",\"kind\":{\"group\":\"cozystack.io\",\"version\":\"v1alpha1\","
     "\"kind\":\"GPUClass\"},\"resource\":{\"group\":\"cozystack.io\",\"version\":\"v1alpha1\",\"resource\":\"gpuclasses\"},"
     "\"operation\":\"CREATE\",\"name\":\"cozygpu-self-check\",\"userInfo\":{\"username\":\"system:serviceaccount:cozygpu:self-check\"},"
     "\"object\":{\"apiVersion\":\"cozystack.io/v1alpha1\",\"kind\":\"GPUClass\",\"metadata\":{\"name\":\"cozygpu-self-check\"},"
     "\"spec\":{\"displayName\":\"self-check\",\"model\":\"self-check\",\"mode\":\"Passthrough\",\"resourceName\":\"RESOURCE\","
     "\"tolerations\":[{\"key\":\"gpu.cozystack.io/mode\",\"operator\":\"Equal\",\"value\":\"passthrough\",\"effect\":\"NoSchedule\"}]}}}"},
    {"a GPUClaim CREATE",
     "{\"uid\":\"00000000-0000-4000-8000-5e1fc4ec0005\",\"kind\":{\"group\":\"cozystack.io\",\"version\":\"v1alpha1\","
     "\"kind\":\"GPUClaim\"},\"resource\":{\"group\":\"cozystack.io\",\"version\":\"v1alpha1\",\"resource\":\"gpuclaims\"},"
     "\"operation\":\"CREATE\",\"name\":\"self-check\",\"namespace\":\"cozygpu-self-check\",\"userInfo\":{\"username\":"
     "\"system:serviceaccount:cozygpu:self-check\"},\"object\":{\"apiVersion\":\"cozystack.io/v1alpha1\",\"kind\":\"GPUClaim\","
     "\"metadata\":{\"name\":\"self-check\",\"namespace\":\"cozygpu-self-check\"},\"spec\":{\"class\":\"NAME\",\"count\":1}}}"},
};

/* `text` with every NAME and RESOURCE replaced (caller frees), or NULL. */
static char *gate_text(const char *text, const char *name, const char *resource)
{
    cozy_buf b = {.max = 1 << 20};
    for(const char *p = text; *p;) {
        if(strncmp(p, "RESOURCE", 8) == 0) {
            if(cozy_buf_add(&b, resource, strlen(resource)))
                goto fail;
            p += 8;
        } else if(strncmp(p, "NAME", 4) == 0) {
            if(cozy_buf_add(&b, name, strlen(name)))
                goto fail;
            p += 4;
        } else if(cozy_buf_add(&b, p++, 1))
            goto fail;
    }
    return b.p;
fail:
    cozy_buf_free(&b);
    return NULL;
}

/* 1 when `s` may stand inside a JSON string literal as it is (a class name
 * or resource name from the cluster: DNS labels and qualified names) */
static int json_plain(const char *s)
{
    for(; s && *s; s++)
        if(*s == '"' || *s == '\\' || (unsigned char)*s < 0x20)
            return 0;
    return s != NULL;
}

/* Runs GATE_REVIEWS through `e` on the current caches. COZY_ERR_POLICY with
 * the review and the policy's message when a policy fails on one. */
static cozy_result self_check(engine *e, cozy_err *err)
{
    json_t *snap = ctl_cluster_snapshot();
    cozy_result rc = engine_set_cluster(e, snap, ctl_proc->settings, err);
    /* a GPUClass of the cluster makes the GPU paths of the rules run */
    const char *name = "cozygpu-self-check", *resource = "nvidia.com/GA102GL_A10";
    size_t i;
    json_t *o;
    json_array_foreach(snap, i, o) {
        const char *k = json_string_value(json_object_get(o, "kind"));
        const char *n = json_string_value(json_object_get(json_object_get(o, "metadata"), "name"));
        const char *r = json_string_value(json_object_get(json_object_get(o, "spec"), "resourceName"));
        if(k && strcmp(k, "GPUClass") == 0 && json_plain(n) && json_plain(r)) {
            name = n, resource = r;
            break;
        }
    }
    for(size_t g = 0; rc == COZY_OK && g < sizeof GATE_REVIEWS / sizeof *GATE_REVIEWS; g++) {
        char *text = gate_text(GATE_REVIEWS[g][1], name, resource);
        json_t *req = text ? json_loads(text, 0, NULL) : NULL;
        free(text);
        if(!req) {
            rc = cozy_fail(err, COZY_ERR_INTERNAL, "self-check: cannot build %s", GATE_REVIEWS[g][0]);
            break;
        }
        /* under the deadline a webhook review has: a rule that would run
         * past it fails here, not in front of the API server */
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += ctl_proc->f.review_timeout_ms / 1000;
        deadline.tv_nsec += (ctl_proc->f.review_timeout_ms % 1000) * 1000000L;
        if(deadline.tv_nsec >= 1000000000L)
            deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
        engine_set_deadline(e, &deadline);
        engine_verdict v;
        rc = engine_review(e, req, ENGINE_BOTH, &v, err);
        engine_set_deadline(e, NULL);
        json_decref(req);
        if(rc == COZY_OK && engine_outcome_is_failure(v.outcome))
            rc = cozy_fail(err, COZY_ERR_POLICY, "self-check review (%s) failed: %s", GATE_REVIEWS[g][0],
                           v.message ? v.message : "");
        json_decref(v.response);
    }
    json_decref(snap);
    return rc;
}

/* 1 when ConfigMap key `k` holds a policy test document (NAME.test.yaml,
 * docs/decisions/0018). */
static int is_test_key(const char *k)
{
    size_t n = strlen(k), sfx = strlen(".test.yaml");
    return n > sfx && strcmp(k + n - sfx, ".test.yaml") == 0;
}

/* Runs the bundle's own policy tests (the ConfigMap's NAME.test.yaml keys,
 * in key order) on `eo` with the controller's settings, each review under
 * the webhook review deadline. COZY_ERR_POLICY naming the key and the
 * first failures when any case fails or a document is unreadable. */
static cozy_result run_bundle_tests(const json_t *data, const engine_options *eo, int *n_cases, cozy_err *err)
{
    const char *k;
    json_t *v;
    *n_cases = 0;
    json_object_foreach((json_t *)data, k, v) {
        if(!is_test_key(k) || !json_is_string(v))
            continue;
        char *text = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&text, &len);
        if(!out)
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        pthread_mutex_lock(&ctl_proc->mu);
        json_t *settings = json_incref(ctl_proc->settings);
        pthread_mutex_unlock(&ctl_proc->mu);
        policytest_counts c = policytest_run_memory(k, json_string_value(v), json_string_length(v), settings,
                                                    ctl_proc->f.review_timeout_ms, eo, out);
        json_decref(settings);
        fclose(out);
        *n_cases += c.passed + c.failed;
        if(c.failed || c.errors) {
            /* the failures (FAIL/ERROR lines and their reasons), not the passes */
            char msg[1500];
            size_t o = 0;
            msg[0] = 0;
            int keep = 0;
            char *save = NULL;
            for(char *line = text ? strtok_r(text, "\n", &save) : NULL; line && o + 1 < sizeof msg;
                line = strtok_r(NULL, "\n", &save)) {
                if(!strncmp(line, "PASS ", 5)) {
                    keep = 0;
                    continue;
                }
                if(!strncmp(line, "FAIL ", 5) || !strncmp(line, "ERROR ", 6))
                    keep = 1;
                if(keep) {
                    while(*line == ' ')
                        line++;
                    o += (size_t)snprintf(msg + o, sizeof msg - o, "%s%s", o ? "; " : "", line);
                }
            }
            free(text);
            return cozy_fail(err, COZY_ERR_POLICY, "policy tests in %s: %d passed, %d failed%s: %s", k, c.passed,
                             c.failed, c.errors ? ", unreadable" : "", msg);
        }
        free(text);
    }
    return COZY_OK;
}

/* Compiles `cm` (a ConfigMap, or NULL for "no ConfigMap": defaults only)
 * into a new bundle: its keys become engine sources (engine_source_for_key,
 * docs/decisions/0007) handed to the engine from memory, so messages name
 * the keys the hoster edits. On success returns it (refs 1); else NULL with
 * err. */
static ctl_bundle *compile_bundle(const json_t *cm, cozy_err *err)
{
    ctl_bundle *b = calloc(1, sizeof *b);
    if(!b) {
        cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        return NULL;
    }
    b->refs = 1;
    pthread_mutex_lock(&ctl_proc->mu);
    b->next = bundles;
    if(b->next)
        b->next->prev = b;
    bundles = b;
    pthread_mutex_unlock(&ctl_proc->mu);
    const char *cm_name = ctl_proc->f.policies_configmap;
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
            if(is_test_key(k))
                continue; /* the bundle's own tests: run by the gate below */
            cozy_err kerr;
            cozy_result krc = engine_source_for_key(k, text ? text : "", text ? json_string_length(v) : 0,
                                                    &b->sources[b->n_sources], b->modules[b->n_sources],
                                                    sizeof b->modules[0], &kerr);
            if(krc == COZY_ERR_INPUT) {
                log_write(LOG_WARN, "reload", "ignoring a key that is neither a policy file (NAME.lua of letters, digits, - _ .) nor a policy test (NAME.test.yaml)", "configmap", cm_name,
                          "key", k, NULL);
                /* said in a Warning Event too once the bundle serves
                 * (decision 0031: a typo used to be reported as added) */
                cozy_buf_printf(&b->ignored, "%s%s", b->ignored.len ? ", " : "", k);
                continue;
            }
            if(krc != COZY_OK) {
                cozy_fail(err, krc, "ConfigMap %s/%s: %s", ctl_proc->f.ns, cm_name, kerr.msg);
                goto fail;
            }
            b->n_sources++;
        }
        if(json_object_size(json_object_get(cm, "binaryData")) > 0)
            log_write(LOG_WARN, "reload", "ignoring binaryData: policies are text", "configmap", cm_name, NULL);
    }
    engine_options eo = ctl_bundle_engine_options(b);
    engine *e = NULL;
    cozy_result rc = engine_open(&e, &eo, err);
    if(rc == COZY_OK) {
        rc = self_check(e, err);
        engine_close(e);
    }
    int n_cases = 0;
    if(rc == COZY_OK && b->data)
        rc = run_bundle_tests(b->data, &eo, &n_cases, err);
    if(rc == COZY_OK && n_cases > 0) {
        char n[16];
        snprintf(n, sizeof n, "%d", n_cases);
        log_write(LOG_INFO, "reload", "the bundle passed its own policy tests", "configmap", cm_name, LOG_NUM "cases",
                  n, NULL);
    }
    if(rc != COZY_OK) {
        if(cm) {
            char tmp[sizeof err->msg];
            snprintf(tmp, sizeof tmp, "%s", err->msg);
            cozy_fail(err, rc, "ConfigMap %s/%s: %s", ctl_proc->f.ns, cm_name, tmp);
        }
        goto fail;
    }
    return b;
fail:
    b->refs = 1;
    ctl_bundle_unref(b);
    return NULL;
}

int ctl_bundle_last_error(char *buf, size_t n)
{
    pthread_mutex_lock(&ctl_proc->mu);
    int failed = policy_error != NULL;
    if(failed && n > 0)
        snprintf(buf, n, "%s", policy_error);
    pthread_mutex_unlock(&ctl_proc->mu);
    return failed;
}

/* One key of a data_diff: its name and list (0 added, 1 changed, 2 removed). */
typedef struct diff_key {
    const char *key;
    int list;
} diff_key;

static int diff_key_cmp(const void *a, const void *b)
{
    return strcmp(((const diff_key *)a)->key, ((const diff_key *)b)->key);
}

/* What changed between two ConfigMap data objects (NULL: no ConfigMap,
 * the defaults): the keys only in `to` (added), in both with different
 * values (changed), only in `from` (removed), each list in byte order,
 * joined by ", " into out[0..2] (new strings the caller frees; "" when
 * none). Returns 0, or -1 out of memory (out[] then all NULL). */
static int data_diff(const json_t *from, const json_t *to, char *out[3])
{
    out[0] = out[1] = out[2] = NULL;
    size_t n = json_object_size(from) + json_object_size(to), m = 0;
    diff_key *keys = calloc(n ? n : 1, sizeof *keys);
    cozy_buf lists[3] = {{0}, {0}, {0}};
    int rc = -1;
    if(!keys)
        goto done;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)to, k, v)
    {
        json_t *was = json_object_get(from, k);
        if(!was || !json_equal(was, v))
            keys[m++] = (diff_key){k, was ? 1 : 0};
    }
    json_object_foreach((json_t *)from, k, v)
    {
        if(!json_object_get(to, k))
            keys[m++] = (diff_key){k, 2};
    }
    qsort(keys, m, sizeof *keys, diff_key_cmp);
    for(size_t i = 0; i < m; i++)
        if(cozy_buf_printf(&lists[keys[i].list], "%s%s", lists[keys[i].list].len ? ", " : "", keys[i].key) != 0)
            goto done;
    for(int i = 0; i < 3; i++) {
        out[i] = strndup(lists[i].p ? lists[i].p : "", lists[i].len);
        if(!out[i])
            goto done;
    }
    rc = 0;
done:
    if(rc != 0)
        for(int i = 0; i < 3; i++) {
            free(out[i]);
            out[i] = NULL;
        }
    for(int i = 0; i < 3; i++)
        cozy_buf_free(&lists[i]);
    free(keys);
    return rc;
}

static void publish(ctl_bundle *b)
{
    pthread_mutex_lock(&ctl_proc->mu);
    ctl_bundle *old = ctl_proc->current;
    b->gen = old ? old->gen + 1 : 1;
    ctl_proc->current = b;
    ctl_proc->policies_loaded = 1;
    free(policy_error);
    policy_error = NULL;
    ctl_proc->status_dirty = 1;
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
    ctl_bundle_unref(old);
    metrics_gauge_set("cozygpu_policy_bundle_generation", NULL, (double)b->gen);
    metrics_gauge_set("cozygpu_policy_reload_failing", NULL, 0);
}

void *ctl_bundle_reloader_main(void *arg)
{
    (void)arg;
    /* The first bundle: only once every cache has listed is it known
     * whether the ConfigMap exists. If it does, its ADDED event has queued
     * it (and if it does not load, the replica stays unready: never the
     * defaults in place of a hoster's broken rules, docs/decisions/0009);
     * if it does not, the defaults are the bundle. */
    pthread_mutex_lock(&ctl_proc->mu);
    while(!ctl_proc->stopping && !kube_watcher_synced(ctl_proc->watcher)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 50 * 1000000;
        if(ts.tv_nsec >= 1000000000)
            ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&ctl_proc->cv, &ctl_proc->mu, &ts);
    }
    pthread_mutex_unlock(&ctl_proc->mu);
    json_t *existing = ctl_proc->policies_inf
                           ? kube_informer_get(ctl_proc->policies_inf, ctl_proc->f.ns, ctl_proc->f.policies_configmap)
                           : NULL;
    pthread_mutex_lock(&ctl_proc->mu);
    if(!existing && !ctl_proc->current && !pending_cm)
        pending_cm = json_null();
    pthread_mutex_unlock(&ctl_proc->mu);
    json_decref(existing);
    for(;;) {
        pthread_mutex_lock(&ctl_proc->mu);
        while(!ctl_proc->stopping && !pending_cm && !deleted_cm)
            pthread_cond_wait(&ctl_proc->cv, &ctl_proc->mu);
        if(ctl_proc->stopping) {
            pthread_mutex_unlock(&ctl_proc->mu);
            break;
        }
        json_t *gone = deleted_cm;
        deleted_cm = NULL;
        json_t *cm = pending_cm;
        pending_cm = NULL;
        pthread_mutex_unlock(&ctl_proc->mu);
        if(gone) {
            log_write(LOG_WARN, "reload",
                      "the policies ConfigMap was deleted; the last bundle keeps serving (apply an empty "
                      "ConfigMap to serve the default policies)",
                      "configmap", ctl_proc->f.policies_configmap, NULL);
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
        /* cur: the bundle a new one replaces (only this thread publishes),
           held until its keys are compared */
        ctl_bundle *cur = ctl_bundle_current();
        int same = cur && ((!src && !cur->source_rv) ||
                           (src && cur->source_rv && rv && strcmp(cur->source_rv, rv) == 0));
        /* a resync replays the same failed version: report it once */
        if(!same && src && rv && failed_rv && strcmp(failed_rv, rv) == 0)
            same = 1;
        if(same) {
            ctl_bundle_unref(cur);
            json_decref(cm);
            continue;
        }
        cozy_err err;
        ctl_bundle *b = compile_bundle(src, &err);
        if(b) {
            /* the ConfigMap keys added, changed and removed since the
               bundle replaced (none before the first: every key is added) */
            char *diff[3];
            int have_diff = data_diff(cur ? cur->data : NULL, b->data, diff) == 0;
            publish(b);
            metrics_counter_add("cozygpu_policy_reloads_total", "result=\"success\"", 1);
            log_write(LOG_INFO, "reload", src ? "policies reloaded from the ConfigMap" : "serving the default policies",
                      "configmap", ctl_proc->f.policies_configmap, "resourceVersion", rv, "added",
                      have_diff ? diff[0] : NULL, "changed", have_diff ? diff[1] : NULL, "removed",
                      have_diff ? diff[2] : NULL, NULL);
            if(src) {
                cozy_buf msg = {0};
                cozy_buf_printf(&msg, "policy bundle compiled, self-checked and serving");
                static const char *const what[3] = {"added", "changed", "removed"};
                int any = 0;
                for(int i = 0; have_diff && i < 3; i++)
                    if(diff[i][0]) {
                        cozy_buf_printf(&msg, "; %s: %s", what[i], diff[i]);
                        any = 1;
                    }
                if(have_diff && !any)
                    cozy_buf_printf(&msg, "; no data key changed");
                if(b->ignored.len)
                    cozy_buf_printf(&msg, "; ignored (neither NAME.lua nor NAME.test.yaml): %s", b->ignored.p);
                record_event(src, "Normal", "PolicyReloaded",
                             msg.p ? msg.p : "policy bundle compiled, self-checked and serving");
                cozy_buf_free(&msg);
                if(b->ignored.len) {
                    cozy_buf w = {0};
                    cozy_buf_printf(&w,
                                    "ConfigMap key(s) %s ignored: a policy file is NAME.lua (letters, digits, - _ .), "
                                    "a policy test NAME.test.yaml; nothing of them is serving",
                                    b->ignored.p);
                    record_event(src, "Warning", "PolicyKeyIgnored", w.p ? w.p : "a ConfigMap key was ignored");
                    cozy_buf_free(&w);
                }
            }
            for(int i = 0; have_diff && i < 3; i++)
                free(diff[i]);
        } else {
            metrics_counter_add("cozygpu_policy_reloads_total", "result=\"failure\"", 1);
            metrics_gauge_set("cozygpu_policy_reload_failing", NULL, 1);
            free(failed_rv);
            failed_rv = rv ? strdup(rv) : NULL;
            pthread_mutex_lock(&ctl_proc->mu);
            int serving = ctl_proc->policies_loaded;
            free(policy_error);
            policy_error = strdup(err.msg);
            pthread_mutex_unlock(&ctl_proc->mu);
            log_write(LOG_ERROR, "reload",
                      serving ? "policy reload failed; the previous bundle keeps serving"
                              : "policy bundle failed to load; not ready",
                      "configmap", ctl_proc->f.policies_configmap, "resourceVersion", rv, "error", err.msg, NULL);
            if(src) {
                char msg[1100];
                snprintf(msg, sizeof msg, "%s%s", serving ? "previous bundle keeps serving: " : "not serving: ",
                         err.msg);
                record_event(src, "Warning", "PolicyReloadFailed", msg);
            }
        }
        ctl_bundle_unref(cur);
        json_decref(cm);
    }
    return NULL;
}

static void queue_reload(json_t *cm_or_null)
{
    pthread_mutex_lock(&ctl_proc->mu);
    json_decref(pending_cm);
    pending_cm = cm_or_null;
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
}

void ctl_bundle_on_policies_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
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
    pthread_mutex_lock(&ctl_proc->mu);
    int have = ctl_proc->current != NULL;
    if(have) {
        json_decref(deleted_cm);
        deleted_cm = json_deep_copy(obj);
        pthread_cond_broadcast(&ctl_proc->cv);
    }
    pthread_mutex_unlock(&ctl_proc->mu);
    if(!have)
        queue_reload(json_null());
}
