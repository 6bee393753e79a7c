/* status.c — the leader-only writer: the GPUClass `Accepted` condition
 * (internal.h, ctl_status_).
 *
 * Rules: docs/decisions/0009 (the first leader-only writer), DESIGN.md §2
 * (writers run on the leader only, via a Lease), Kubernetes API
 * conventions (community/contributors/devel/sig-architecture/
 * api-conventions.md "Typical status properties": conditions with type,
 * status, reason, message, lastTransitionTime, observedGeneration),
 * written through the status subresource.
 */
#include "base/clock.h"
#include "controller/internal.h"

#include <string.h>
#include <time.h>

#include "base/log.h"
#include "format/kobject.h"

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
    kobject_condition k = {"Accepted", c->status, c->reason, c->message, c->generation};
    int r = kobject_condition_set(obj, &k, c->now);
    if(r)
        return r > 0 ? 1 : -1; /* unchanged: no write; out of memory: none either */
    return lease_is_leader(ctl_proc->lease) ? 0 : -1; /* last check before the write */
}

static void reconcile_classes(engine *e)
{
    json_t *classes = kube_informer_list(ctl_proc->classes_inf);
    size_t i;
    json_t *cls;
    json_array_foreach(classes, i, cls)
    {
        if(!lease_is_leader(ctl_proc->lease))
            break;
        json_t *obj = ctl_cluster_with_kind(cls, &KUBE_GPUCLASSES);
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
            clock_rfc3339_now(now, sizeof now);
            class_cond c = {ok ? "True" : "False", ok ? "Valid" : "Invalid",
                            ok ? "the class passes the gpuclass rules" : (m ? m : "refused by the gpuclass rules"),
                            json_integer_value(json_object_get(json_object_get(obj, "metadata"), "generation")), now};
            json_t *out = NULL;
            if(kube_update_retry(ctl_proc->client, &KUBE_GPUCLASSES, NULL, name, 1, set_condition, &c, &out, &err) !=
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

void *ctl_status_writer_main(void *arg)
{
    (void)arg;
    engine *e = NULL;
    ctl_bundle *eb = NULL;
    for(;;) {
        pthread_mutex_lock(&ctl_proc->mu);
        if(!ctl_proc->stopping && !ctl_proc->status_dirty) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += ctl_proc->f.status_interval_ms / 1000;
            ts.tv_nsec += (ctl_proc->f.status_interval_ms % 1000) * 1000000;
            if(ts.tv_nsec >= 1000000000)
                ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&ctl_proc->cv, &ctl_proc->mu, &ts);
        }
        int stop = ctl_proc->stopping;
        ctl_proc->status_dirty = 0;
        pthread_mutex_unlock(&ctl_proc->mu);
        if(stop)
            break;
        if(!lease_is_leader(ctl_proc->lease) || !kube_watcher_synced(ctl_proc->watcher))
            continue;
        ctl_bundle *b = ctl_bundle_current();
        if(!b)
            continue;
        cozy_err err;
        if(!e || eb != b) {
            engine_close(e);
            e = NULL;
            engine_options eo = ctl_bundle_engine_options(b);
            if(engine_open(&e, &eo, &err) != COZY_OK) {
                log_write(LOG_ERROR, "status", "cannot open the policy engine", "error", err.msg, NULL);
                ctl_bundle_unref(b);
                continue;
            }
            ctl_bundle_unref(eb);
            eb = b;
        } else
            ctl_bundle_unref(b);
        json_t *snap = ctl_cluster_snapshot();
        if(engine_set_cluster(e, snap, ctl_proc->settings, &err) == COZY_OK)
            reconcile_classes(e);
        json_decref(snap);
    }
    engine_close(e);
    ctl_bundle_unref(eb);
    return NULL;
}

void ctl_status_on_leader_change(void *ctx, int leading)
{
    (void)ctx;
    if(leading) {
        pthread_mutex_lock(&ctl_proc->mu);
        ctl_proc->status_dirty = 1;
        pthread_cond_broadcast(&ctl_proc->cv);
        pthread_mutex_unlock(&ctl_proc->mu);
    }
}

void ctl_status_on_class_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    (void)ctx, (void)inf, (void)type, (void)obj;
    pthread_mutex_lock(&ctl_proc->mu);
    ctl_proc->status_dirty = 1;
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
}
