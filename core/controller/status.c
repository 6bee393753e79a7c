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

/* The class condition writer (writer.c): its engine and the bundle it
 * was opened on. It keeps no state to build: every wake reviews every
 * cached class. */
typedef struct status_writer {
    engine *e;
    ctl_bundle *eb;
} status_writer;

static ctl_key *g_none; /* the writer wakes on ctl.status_dirty, with no keys */

static long sw_wait_ms(void *ud)
{
    (void)ud;
    return ctl_proc->f.status_interval_ms;
}

static void sw_work(void *ud, int had_batch)
{
    (void)had_batch;
    status_writer *w = ud;
    ctl_bundle *b = ctl_bundle_current();
    if(!b)
        return;
    cozy_err err;
    if(!w->e || w->eb != b) {
        engine_close(w->e);
        w->e = NULL;
        engine_options eo = ctl_bundle_engine_options(b);
        if(engine_open(&w->e, &eo, &err) != COZY_OK) {
            log_write(LOG_ERROR, "status", "cannot open the policy engine", "error", err.msg, NULL);
            ctl_bundle_unref(b);
            return;
        }
        ctl_bundle_unref(w->eb);
        w->eb = b;
    } else
        ctl_bundle_unref(b);
    json_t *snap = ctl_cluster_snapshot();
    if(engine_set_cluster(w->e, snap, ctl_proc->settings, &err) == COZY_OK)
        reconcile_classes(w->e);
    json_decref(snap);
}

void *ctl_status_writer_main(void *arg)
{
    (void)arg;
    status_writer sw = {0};
    const ctl_writer w = {.component = "status",
                          .queue = &g_none,
                          .wake = &ctl_proc->status_dirty,
                          .ud = &sw,
                          .wait_ms = sw_wait_ms,
                          .work = sw_work};
    ctl_writer_run(&w);
    engine_close(sw.e);
    ctl_bundle_unref(sw.eb);
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
