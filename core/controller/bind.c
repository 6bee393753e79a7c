/* bind.c — the leader's binder loop (internal.h, ctl_bind_): the
 * placement model (placement/placement.h) fed from the watch caches, its
 * writes sent to the API server. Rules: DESIGN.md §3, §4, §6;
 * docs/decisions/0026 (this loop), 0039 (fair flushes), 0040 (applied up
 * to), 0041 (one placement model).
 *
 * One thread. The watcher thread's callbacks only record which objects
 * changed (a set of keys under ctl.mu) and wake it. While this replica
 * leads and every cache has listed, the thread:
 *   1. on taking the lead, builds the model from the caches (claims from
 *      a consistent LIST) and runs one full pass once a policy bundle
 *      serves;
 *   2. after that, applies each batch of changed objects and runs an
 *      incremental pass: one event costs what it touches, never a walk of
 *      the cluster;
 *   3. flushes the writes the passes decided (placement_flush), each
 *      checked against the Lease just before it is sent.
 * Losing the lead drops the model.
 */
#include "controller/internal.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "placement/placement.h"

static ctl_key *g_dirty; /* mu */
static int g_wake;       /* mu: leadership changed or a tick is due */

/* The highest metadata.resourceVersion of each resource whose event was
 * queued (recorded after its key, so a batch never takes the version of
 * an event it does not hold): what "applied up to" is measured against.
 * resourceVersions are opaque to clients (API conventions, "Concurrency
 * Control and Consistency"); kube-apiserver's are etcd revisions, decimal
 * integers, and one that is not is not recorded. */
#define RV_RESOURCES 16
typedef struct rv_seen {
    const kube_resource *r;
    unsigned long long rv;
} rv_seen;
static rv_seen g_rv[RV_RESOURCES]; /* mu */

static void rv_record(const kube_resource *r, const json_t *obj)
{
    const char *v = json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if(!r || !v || !*v)
        return;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if(*end || *v == '-')
        return;
    pthread_mutex_lock(&ctl_proc->mu);
    for(int i = 0; i < RV_RESOURCES; i++) {
        if(!g_rv[i].r)
            g_rv[i].r = r;
        if(g_rv[i].r == r) {
            if(n > g_rv[i].rv)
                g_rv[i].rv = n;
            break;
        }
    }
    pthread_mutex_unlock(&ctl_proc->mu);
}

/* ctl_key_wait_take's take: the versions recorded with the batch's keys. */
static void rv_take(void *ud)
{
    memcpy(ud, g_rv, sizeof g_rv);
}

void ctl_bind_on_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    char kind = (char)(intptr_t)ctx;
    if(inf == ctl_proc->classes_inf)
        ctl_status_on_class_event(NULL, inf, type, obj);
    if(kind == placement_key_kind(PLACEMENT_CLAIM))
        ctl_usage_on_event(ctx, inf, type, obj); /* the claim's usage record */
    ctl_key_queue_object(&g_dirty, kind, obj);
    rv_record(kube_informer_resource(inf), obj);
}

void ctl_bind_on_leader_change(void *ctx, int leading)
{
    ctl_status_on_leader_change(ctx, leading);
    ctl_usage_on_leader_change(ctx, leading);
    pthread_mutex_lock(&ctl_proc->mu);
    g_wake = 1;
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
}

/* ------------------------------------------------- the model's io: caches in, API out */

static kube_informer *informer_of(placement_kind k)
{
    switch(k) {
    case PLACEMENT_CLASS: return ctl_proc->classes_inf;
    case PLACEMENT_NODE: return ctl_cluster_informer(&KUBE_NODES);
    case PLACEMENT_GPUNODE: return ctl_proc->gpunodes_inf;
    case PLACEMENT_CLAIM: return ctl_cluster_informer(&KUBE_GPUCLAIMS);
    case PLACEMENT_VM: return ctl_proc->vms_inf;
    case PLACEMENT_VMI: return ctl_cluster_informer(&KUBE_VMIS);
    case PLACEMENT_POD: return ctl_proc->pods_inf;
    case PLACEMENT_KUBEVIRT: return ctl_cluster_informer(&KUBE_KUBEVIRTS);
    case PLACEMENT_NAMESPACE: return ctl_cluster_informer(&KUBE_NAMESPACES);
    case PLACEMENT_QUOTA: return ctl_cluster_informer(&KUBE_RESOURCEQUOTAS);
    case PLACEMENT_PVC: return ctl_proc->pvcs_inf;
    case PLACEMENT_PV: return ctl_proc->pvs_inf;
    default: return NULL;
    }
}

static const kube_resource *resource_of(placement_kind k)
{
    switch(k) {
    case PLACEMENT_CLASS: return &KUBE_GPUCLASSES;
    case PLACEMENT_CLAIM: return &KUBE_GPUCLAIMS;
    case PLACEMENT_POD: return &KUBE_PODS;
    case PLACEMENT_VMI: return &KUBE_VMIS;
    default: return NULL;
    }
}

static json_t *io_get(void *ud, placement_kind k, const char *ns, const char *name)
{
    (void)ud;
    kube_informer *inf = informer_of(k);
    return inf ? kube_informer_get(inf, ns && *ns ? ns : NULL, name) : NULL;
}

static json_t *io_list(void *ud, placement_kind k)
{
    (void)ud;
    kube_informer *inf = informer_of(k);
    return inf ? kube_informer_list(inf) : json_array();
}

static long io_list_claims(void *ud, json_t **out, cozy_err *err)
{
    (void)ud;
    long code = 0;
    if(kube_list(ctl_proc->client, &KUBE_GPUCLAIMS, NULL, NULL, &code, out, err) != COZY_OK)
        return 0;
    if(code != 200 && !err->msg[0]) {
        const char *m = json_string_value(json_object_get(*out, "message"));
        snprintf(err->msg, sizeof err->msg, "HTTP %ld: %s", code, m ? m : "");
    }
    return code;
}

static int io_leading(void *ud)
{
    (void)ud;
    return lease_is_leader(ctl_proc->lease);
}

static long io_claim_status(void *ud, const char *ns, const json_t *obj, json_t **out, cozy_err *err)
{
    (void)ud;
    long code = 0;
    if(kube_update_status(ctl_proc->client, &KUBE_GPUCLAIMS, ns, obj, &code, out, err) != COZY_OK)
        return 0;
    return code;
}

static long io_class_status(void *ud, const char *name, const json_t *patch, cozy_err *err)
{
    (void)ud;
    long code = 0;
    if(kube_patch_status(ctl_proc->client, &KUBE_GPUCLASSES, NULL, name, patch, &code, NULL, err) != COZY_OK)
        return code ? code : 0;
    return code;
}

static long io_update(void *ud, placement_kind k, const char *ns, const char *name, placement_mutate_fn mutate,
                      void *ctx, cozy_err *err)
{
    (void)ud;
    const kube_resource *r = resource_of(k);
    if(!r) {
        snprintf(err->msg, sizeof err->msg, "no update of kind %d", (int)k);
        return 0;
    }
    if(kube_update_retry(ctl_proc->client, r, ns && *ns ? ns : NULL, name, 0, mutate, ctx, NULL, err) == COZY_OK)
        return 200;
    /* kube_update_retry says a 404 in its message (the object is gone) */
    return strstr(err->msg, "NotFound") || strstr(err->msg, "404") ? 404 : 0;
}

static long io_create_claim(void *ud, const char *ns, const json_t *obj, json_t **out, cozy_err *err)
{
    (void)ud;
    long code = 0;
    if(kube_create(ctl_proc->client, &KUBE_GPUCLAIMS, ns, obj, &code, out, err) != COZY_OK)
        return 0;
    return code;
}

static long io_remove(void *ud, placement_kind k, const char *ns, const char *name, const char *uid, cozy_err *err)
{
    (void)ud;
    const kube_resource *r = resource_of(k);
    if(!r) {
        snprintf(err->msg, sizeof err->msg, "no delete of kind %d", (int)k);
        return 0;
    }
    long code = 0;
    if(!uid) {
        if(kube_delete(ctl_proc->client, r, ns, name, &code, NULL, err) != COZY_OK)
            return 0;
        return code;
    }
    char *path = kube_path(r, ns, name, NULL);
    json_t *opts = json_pack("{s:s, s:s, s:{s:s}}", "apiVersion", "v1", "kind", "DeleteOptions", "preconditions",
                             "uid", uid);
    cozy_result rc = path && opts ? kube_request(ctl_proc->client, "DELETE", path, NULL, opts, &code, NULL, err)
                                  : COZY_ERR_INTERNAL;
    json_decref(opts);
    free(path);
    return rc == COZY_OK ? code : 0;
}

/* The leader's "applied up to": for each resource, the resourceVersion of
 * the last event whose batch has been taken into the state, reconciled
 * and its writes sent (none left for the next wake by the flush's budget).
 * A spec that wrote an object waits until its resource's version here is
 * at least the one its write returned, instead of a fixed sleep
 * (docs/decisions/0040). */
static void publish_applied(const rv_seen *taken)
{
    for(int i = 0; i < RV_RESOURCES && taken[i].r; i++) {
        char lb[128];
        snprintf(lb, sizeof lb, "resource=\"%s\"", taken[i].r->resource);
        metrics_gauge_set("cozygpu_binder_applied_resource_version", lb, (double)taken[i].rv);
    }
}

/* The binder as a leader-only writer (writer.c): its state, the served
 * bundle's engine, and the resourceVersions taken with each batch. */
typedef struct bind_writer {
    placement_io io;
    engine *runtime;         /* runtime.binder: cozygpu.capacity */
    placement *p;
    engine *pe;              /* the served bundle's engine: policies/binder.lua, budgets at bind */
    ctl_bundle *peb;         /* the bundle pe was built on (a reference) */
    int full_pending;        /* built, no full pass yet (waiting for a bundle) */
    int policy_waiting;      /* the last wake found no bundle (logged once) */
    rv_seen taken[RV_RESOURCES];
} bind_writer;

/* A second at most: retries of writes left by a 409 or an error; sooner
 * when a GPUClass status waits for its write gap; at once when the last
 * flush stopped at its budget. */
static long bw_wait_ms(void *ud)
{
    bind_writer *w = ud;
    if(w->p && placement_more(w->p))
        return 0;
    long left = w->p ? placement_class_wait_ms(w->p) : -1;
    return left < 0 ? 1000 : left < 10 ? 10 : left > 1000 ? 1000 : left;
}

static void bw_take(void *ud)
{
    rv_take(((bind_writer *)ud)->taken);
}

static int bw_build(void *ud)
{
    bind_writer *w = ud;
    w->p = placement_new(&w->io, w->runtime, ctl_proc->settings);
    if(!w->p || placement_build(w->p) != 0) {
        placement_free(w->p);
        w->p = NULL;
        return -1;
    }
    log_write(LOG_INFO, "binder", "rebuilt the binder's state from the caches", NULL);
    ctl_bundle_unref(w->peb); /* a new model: the engine is set on it again */
    w->peb = NULL;
    w->full_pending = 1;
    return 0;
}

static void bw_apply(void *ud, ctl_key *batch)
{
    placement_apply(((bind_writer *)ud)->p, batch);
}

/* The served bundle's engine, opened again when the bundle changed; 1
 * when one serves and the model has it. */
static int bw_policy(bind_writer *w)
{
    ctl_bundle *b = ctl_bundle_current();
    if(!b)
        return 0;
    if(b == w->peb) {
        ctl_bundle_unref(b);
        return 1;
    }
    engine *e = NULL;
    engine_options beo = ctl_bundle_engine_options(b);
    cozy_err err;
    if(engine_open(&e, &beo, &err) != COZY_OK) {
        log_write(LOG_ERROR, "binder", "cannot open the policy engine for the binder", "error", err.msg, NULL);
        ctl_bundle_unref(b);
        return 0;
    }
    placement_set_policy(w->p, e, 1);
    engine_close(w->pe);
    ctl_bundle_unref(w->peb);
    w->pe = e;
    w->peb = b;
    return 1;
}

static void bw_work(void *ud, int had_batch)
{
    bind_writer *w = ud;
    if(!bw_policy(w)) {
        /* no bind without the budget check: the state stays and follows
         * the caches until a bundle serves, then gets its full pass
         * (decision 0026; dropping it here rebuilt it from the caches on
         * every wake with a broken ConfigMap at start-up) */
        if(!w->policy_waiting)
            log_write(LOG_WARN, "binder", "no policy bundle serves: nothing is bound until one does", NULL);
        w->policy_waiting = 1;
        return;
    }
    w->policy_waiting = 0;
    placement_reconcile(w->p, w->full_pending ? PLACEMENT_PASS_FULL
                              : had_batch     ? PLACEMENT_PASS_CHANGES
                                              : PLACEMENT_PASS_RETRY);
    w->full_pending = 0;
    placement_flush(w->p);
    if(!placement_more(w->p) && lease_is_leader(ctl_proc->lease))
        publish_applied(w->taken);
}

static void bw_drop(void *ud)
{
    bind_writer *w = ud;
    placement_free(w->p);
    w->p = NULL;
    metrics_family_clear("cozygpu_binder_applied_resource_version");
}

void *ctl_bind_main(void *arg)
{
    (void)arg;
    engine_options eo = ctl_proc->eo;
    eo.bundle_dir = NULL;
    cozy_err err;
    bind_writer bw = {.io = {.get = io_get,
                             .list = io_list,
                             .list_claims = io_list_claims,
                             .leading = io_leading,
                             .claim_status = io_claim_status,
                             .class_status = io_class_status,
                             .update = io_update,
                             .create_claim = io_create_claim,
                             .remove = io_remove}};
    if(engine_open_runtime(&bw.runtime, &eo, "binder", &err) != COZY_OK) {
        log_write(LOG_ERROR, "binder", "cannot open runtime.binder; the binder does not run", "error", err.msg, NULL);
        return NULL;
    }
    const ctl_writer w = {.component = "binder",
                          .dropped = "not leading: the binder's state is dropped",
                          .queue = &g_dirty,
                          .wake = &g_wake,
                          .ud = &bw,
                          .wait_ms = bw_wait_ms,
                          .take = bw_take,
                          .build = bw_build,
                          .apply = bw_apply,
                          .work = bw_work,
                          .drop = bw_drop};
    ctl_writer_run(&w);
    engine_close(bw.pe);
    ctl_bundle_unref(bw.peb);
    engine_close(bw.runtime);
    pthread_mutex_lock(&ctl_proc->mu);
    keyset_free(&g_dirty);
    pthread_mutex_unlock(&ctl_proc->mu);
    return NULL;
}
