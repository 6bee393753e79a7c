/* license_status.c — the LicenseReady condition of a licensed GPUClass
 * (license_internal.h, ctl_license_): written through the status
 * subresource when it changed (read-modify-write of that condition only,
 * as status.c does for Accepted); a bad source reported once per reason
 * with a log line and a Warning Event on the class.
 *
 * Rules: DESIGN.md §8; docs/decisions/0029 (the condition's reasons, the
 * Event), 0035 (a message names the class and its secretRef, never a
 * tenant namespace). The condition of a class that stops being licensed is
 * removed only once none of its pairs waits for a write: until then a
 * next leader still sees that the class may have copies.
 */
#include "controller/internal.h"
#include "controller/license_internal.h"

#include <stdio.h>
#include <string.h>
#include <uthash.h>

#include "base/clock.h"
#include "base/log.h"
#include "format/kobject.h"

#define COND CTL_LICENSE_COND

typedef ctl_license_state state;
typedef ctl_license_class lclass;

/* --- the class condition --- */

typedef struct cond_want {
    const char *reason, *message, *now;
    json_int_t generation;
} cond_want;

/* The condition wanted: True with TokenFound, else False (decision 0029). */
static kobject_condition cond_of(const char *reason, const char *message, json_int_t generation)
{
    return (kobject_condition){COND, strcmp(reason, "TokenFound") == 0 ? "True" : "False", reason, message,
                               generation};
}

/* kube_update_retry mutate: sets (or with reason "" removes) the
 * LicenseReady condition, leaving every other condition and status field
 * as read. */
static int set_cond(json_t *obj, void *ctx)
{
    cond_want *w = ctx;
    kobject_condition k = cond_of(w->reason, w->message, w->generation);
    int r = *w->reason ? kobject_condition_set(obj, &k, w->now) : kobject_condition_remove(obj, COND);
    if(r)
        return r > 0 ? 1 : -1; /* unchanged: no write; out of memory: none either */
    return ctl_license_leading() ? 0 : -1; /* last check before the write */
}

/* Records a Warning Event on GPUClass `obj` (event.c: a cluster-scoped
 * object's Events go to "default", decision 0029 item 7). */
static void class_event(const json_t *obj, const char *reason, const char *message)
{
    ctl_event_record(obj, "cozystack.io/v1alpha1", "GPUClass", "Warning", reason, message);
}

/* Whether the cached class already shows the wanted condition (none, for
 * a class no longer licensed). */
static int cond_shown(const json_t *obj, const lclass *c)
{
    const json_t *conds = json_object_get(json_object_get(obj, "status"), "conditions");
    if(!*c->reason)
        return !kobject_condition_get(conds, COND);
    kobject_condition k = cond_of(c->reason, c->message, c->generation);
    return kobject_condition_shown(conds, &k);
}

/* Whether a pair of class `cls` still waits to be compared or asserted. */
static int class_pending(state *S, const char *cls)
{
    const char *ns;
    json_t *v;
    char key[600];
    json_object_foreach(json_object_get(S->class_ns, cls), ns, v)
    {
        if(snprintf(key, sizeof key, "%s/%s", ns, cls) < (int)sizeof key &&
           (keyset_find(S->due, key) || keyset_find(S->asserting, key)))
            return 1;
    }
    return 0;
}

/* Writes the condition of class `name`; 1 when done. A condition to remove
 * (the class is not licensed any more) waits until none of the class's
 * pairs waits: a leader taken over meanwhile still deletes the copies of a
 * class that shows the condition (build). */
int ctl_license_write_cond(state *S, const char *name)
{
    lclass *c;
    HASH_FIND_STR(S->classes, name, c);
    json_t *obj = kube_informer_get(ctl_proc->classes_inf, NULL, name);
    if(!c || !obj) {
        json_decref(obj);
        return 1;
    }
    int failed = *c->reason && strcmp(c->reason, "TokenFound") != 0;
    if(failed && strcmp(c->reported, c->reason) != 0 && ctl_license_leading()) {
        log_write(LOG_WARN, "license", "the license Secret of a class cannot be copied", "gpuclass", c->name,
                  "reason", c->reason, "error", c->message, NULL);
        class_event(obj, c->reason, c->message);
        snprintf(c->reported, sizeof c->reported, "%s", c->reason);
    } else if(!failed && *c->reported) {
        log_write(LOG_INFO, "license", "the license Secret of a class is readable again", "gpuclass", c->name, NULL);
        c->reported[0] = 0;
    }
    if(cond_shown(obj, c)) {
        json_decref(obj);
        return 1;
    }
    json_decref(obj);
    if(!*c->reason && class_pending(S, name))
        return 0;
    char now[40];
    clock_rfc3339_now(now, sizeof now);
    cond_want w = {c->reason, c->message, now, c->generation};
    json_t *out = NULL;
    cozy_err err;
    int ok = 1;
    if(!ctl_license_leading())
        return 0;
    if(kube_update_retry(ctl_proc->client, &KUBE_GPUCLASSES, NULL, name, 1, set_cond, &w, &out, &err) != COZY_OK) {
        log_write(LOG_WARN, "license", "cannot write GPUClass status", "gpuclass", name, "error", err.msg, NULL);
        ok = strstr(err.msg, "404") != NULL || strstr(err.msg, "NotFound") != NULL;
    }
    json_decref(out);
    return ok;
}
