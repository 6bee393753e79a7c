/* classstatus.c — GPUClass status.free and maxFreePerNode (DESIGN.md §3,
 * decision 0030), the per-class gauges (decision 0031), and the class
 * protection finalizer (decision 0037). internal.h, pl_.
 */
#include "placement/internal.h"

#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "engine/luajson.h"
#include "format/kobject.h"

/* Writes of GPUClass status are at least this far apart (a burst of
 * binds is one write per class, the last one current). */
#define CLASS_WRITE_GAP_MS 250

/* runtime.binder.class_status(class, units): the {free, maxFreePerNode}
 * the class shows, or NULL (logged at most once a minute) when the call
 * fails. */
static json_t *class_status_of(placement *L, const json_t *cls, const binder_class_view *v)
{
    lua_State *S = engine_lua(L->e);
    engine_push_runtime_fn(L->e, "class_status");
    luajson_push(S, cls);
    json_t *units = json_pack("{s:I, s:I}", "free", (json_int_t)v->units.free, "max_free",
                              (json_int_t)v->units.max_free);
    if(!units) {
        lua_pop(S, 2);
        return NULL;
    }
    luajson_push(S, units);
    json_decref(units);
    cozy_err err;
    json_t *out = NULL;
    if(engine_call(L->e, 2, 1, 0, &err) != ENGINE_ALLOWED || engine_to_json(L->e, -1, &out, &err) != COZY_OK ||
       !json_is_integer(json_object_get(out, "free")) || !json_is_integer(json_object_get(out, "maxFreePerNode"))) {
        long long now = clock_mono_ms();
        if(now - L->class_log_ms >= 60000) {
            L->class_log_ms = now;
            log_write(LOG_ERROR, "binder", "runtime.binder.class_status failed; the class status is not written",
                      "gpuclass", kobject_meta_str(cls, "name"), "error", err.msg, NULL);
        }
        json_decref(out);
        out = NULL;
    }
    lua_settop(S, 0);
    return out;
}

static void class_gauges(const char *name, const binder_class_view *v)
{
    char *esc = metrics_escape(name);
    if(!esc)
        return;
    char lb[700];
    snprintf(lb, sizeof lb, "class=\"%s\"", esc);
    metrics_gauge_set("cozygpu_class_capacity_devices", lb, (double)v->units.offered);
    metrics_gauge_set("cozygpu_class_free_devices", lb, (double)v->units.free);
    for(int ph = 0; ph < BINDER_PHASE_LAST; ph++) {
        snprintf(lb, sizeof lb, "class=\"%s\",phase=\"%s\"", esc, binder_phase_name((binder_phase)ph));
        metrics_gauge_set("cozygpu_class_claimed_devices", lb, (double)v->claim_units[ph]);
    }
    free(esc);
}

/* After a pass: every GPUClass's status.free and status.maxFreePerNode as
 * runtime.binder.class_status makes them of the state, written (a merge
 * patch of the status subresource: the Accepted condition is status.c's)
 * when they differ from what the watch cache shows and were not just
 * written, at most once per CLASS_WRITE_GAP_MS; and the per-class gauges.
 * O(classes x pools of each): no claim or node is walked. */
void pl_flush_classes(placement *L)
{
    json_t *classes = pl_list(L, PLACEMENT_CLASS);
    long long now = clock_mono_ms();
    int may_write = now >= L->class_next_ms, wrote = 0, names_changed = 0;
    L->class_pending = 0;
    size_t i;
    json_t *c;
    json_array_foreach(classes, i, c)
    {
        const char *name = kobject_meta_str(c, "name");
        if(!name)
            continue;
        names_changed |= !json_object_get(L->class_names, name);
    }
    names_changed |= json_object_size(L->class_names) != json_array_size(classes);
    if(names_changed) { /* a class went: its series go too */
        pl_class_gauges_clear();
        json_object_clear(L->class_names);
    }
    json_array_foreach(classes, i, c)
    {
        const char *name = kobject_meta_str(c, "name");
        if(!name)
            continue;
        json_object_set_new(L->class_names, name, json_true());
        binder_class_view v;
        binder_state_class_view(L->st, name, &v);
        class_gauges(name, &v);
        json_t *want = class_status_of(L, c, &v);
        if(!want)
            continue;
        const json_t *shown = json_object_get(c, "status");
        if(json_equal(json_object_get(shown, "free"), json_object_get(want, "free")) &&
           json_equal(json_object_get(shown, "maxFreePerNode"), json_object_get(want, "maxFreePerNode"))) {
            json_object_del(L->class_sent, name); /* the API shows it */
            json_decref(want);
            continue;
        }
        json_t *sent = json_object_get(L->class_sent, name);
        if(sent && json_equal(sent, want)) {
            json_decref(want); /* written; the watch has not brought it back yet */
            continue;
        }
        if(!may_write || !pl_leading(L)) {
            L->class_pending = 1;
            json_decref(want);
            continue;
        }
        json_t *patch = json_pack("{s:O}", "status", want);
        long code = 0;
        cozy_err err;
        if(patch && (code = L->io.class_status(L->io.ud, name, patch, &err)) / 100 == 2) {
            json_object_set(L->class_sent, name, want);
            metrics_counter_add("cozygpu_class_status_writes_total", "result=\"ok\"", 1);
            wrote = 1;
        } else {
            metrics_counter_add("cozygpu_class_status_writes_total", "result=\"error\"", 1);
            if(code != 404) { /* a class deleted meanwhile needs nothing */
                L->class_pending = 1;
                log_write(LOG_WARN, "binder", "cannot write GPUClass status", "gpuclass", name, "error",
                          code ? "the API server refused the patch" : err.msg, NULL);
            }
        }
        json_decref(patch);
        json_decref(want);
    }
    json_decref(classes);
    if(wrote)
        L->class_next_ms = now + CLASS_WRITE_GAP_MS;
}

/* The class protection finalizer (decision 0037): added to each queued
 * class not being deleted, removed from a class being deleted once no
 * claim of it is known (L->class_claims; any phase, template claims
 * included). A class that needs nothing, or is gone, leaves the queue; a
 * failed write stays queued for the next flush (at most a second away),
 * its first failure logged (decision 0037). */
void pl_flush_class_protection(placement *L)
{
    keyset *d, *t;
    HASH_ITER(hh, L->class_fin, d, t)
    {
        if(!pl_leading(L))
            return;
        json_t *c = pl_get(L, PLACEMENT_CLASS, NULL, d->key);
        int exists = c != NULL;
        int deleting = c && kobject_meta_str(c, "deletionTimestamp") != NULL;
        int has = c && kobject_has_finalizer(c, PL_CLASS_PROTECTION);
        json_decref(c);
        pl_fin_ctx fc = {L, !deleting, PL_CLASS_PROTECTION};
        if(!exists || (deleting ? !has || json_integer_value(json_object_get(L->class_claims, d->key)) > 0 : has)) {
            keyset_drop(&L->class_fin, d); /* gone, in use, or as it should be: a later event queues it again */
            continue;
        }
        cozy_err err;
        long code = L->io.update(L->io.ud, PLACEMENT_CLASS, NULL, d->key, pl_fin_mutate, &fc, &err);
        if(code == 200 || code == 404) {
            if(deleting)
                log_write(LOG_INFO, "binder", "released a deleted GPUClass no claim names any more", "gpuclass", d->key,
                          NULL);
            json_object_del(L->class_fin_failed, d->key);
            keyset_drop(&L->class_fin, d);
        } else if(!json_object_get(L->class_fin_failed, d->key)) {
            /* tried again at every flush (a webhook down, a conflict); logged once */
            log_write(LOG_WARN, "binder", "cannot write the GPUClass protection finalizer; trying again", "gpuclass",
                      d->key, "error", err.msg, NULL);
            json_object_set_new(L->class_fin_failed, d->key, json_true());
        }
    }
}

void pl_class_gauges_clear(void)
{
    metrics_family_clear("cozygpu_class_capacity_devices");
    metrics_family_clear("cozygpu_class_free_devices");
    metrics_family_clear("cozygpu_class_claimed_devices");
}
