/* flush.c — sending what the passes decided (placement.h
 * placement_flush): claim statuses, class statuses, protection
 * finalizers (decision 0026, 0037), template claims (decision 0027), VMI
 * deletions, pins, within a time budget and fair across namespaces
 * (decision 0039).
 */
#include "placement/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "format/kobject.h"
#include "placement/read.h"

/* io.update's mutate for a protection finalizer (fc->fin): added (not to
 * an object being deleted) or removed; the lease is checked last. */
int pl_fin_mutate(json_t *obj, void *ctx)
{
    pl_fin_ctx *fc = ctx;
    placement *L = fc->L;
    const char *fin = fc->fin;
    json_t *meta = json_object_get(obj, "metadata");
    json_t *fins = json_object_get(meta, "finalizers");
    if(fc->add) {
        if(kobject_meta_str(obj, "deletionTimestamp") || kobject_has_finalizer(obj, fin))
            return 1; /* an object being deleted takes no new finalizer */
        if(!json_is_array(fins)) {
            fins = json_array();
            json_object_set_new(meta, "finalizers", fins);
        }
        json_array_append_new(fins, json_string(fin));
    } else {
        if(!kobject_has_finalizer(obj, fin))
            return 1;
        for(size_t i = json_array_size(fins); i-- > 0;)
            if(strcmp(json_string_value(json_array_get(fins, i)) ? json_string_value(json_array_get(fins, i)) : "",
                      fin) == 0)
                json_array_remove(fins, i);
    }
    return pl_leading(L) ? 0 : -1;
}

/* Whether claim ns/name is in use, so that its deletion waits: Attached,
 * Lost while its VMI may still run on its node (WaitingForVMIEnd), or
 * Bound for a VMI scheduled or running (its pod holds the devices);
 * placement_read_claim_in_use over the leader's state. */
static int claim_in_use(placement *L, const char *ns, const char *name)
{
    return placement_read_claim_in_use(L->st, ns, name);
}

/* Adds the protection finalizer where it is missing and removes it from
 * the claims being deleted that nothing uses any more. */
static void flush_protection(placement *L)
{
    keyset *d, *t;
    size_t n;
    pl_ranked *order = pl_fair_order(L->protect, &n);
    for(size_t i = 0; i < n; i++) {
        if(!pl_leading(L) || pl_flush_spent(L))
            break;
        d = order[i].d;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        pl_fin_ctx fc = {L, 1, PL_PROTECTION};
        cozy_err err;
        long code = L->io.update(L->io.ud, PLACEMENT_CLAIM, ns, name, pl_fin_mutate, &fc, &err);
        if(code == 200 || code == 404) {
            keyset_drop(&L->protect, d);
            L->progressed = 1;
        }
    }
    free(order);
    HASH_ITER(hh, L->deleting, d, t)
    {
        if(!pl_leading(L) || pl_flush_spent(L))
            return;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        if(claim_in_use(L, ns, name))
            continue; /* its VMI still runs: the hold stays until it ends */
        pl_fin_ctx fc = {L, 0, PL_PROTECTION};
        cozy_err err;
        long code = L->io.update(L->io.ud, PLACEMENT_CLAIM, ns, name, pl_fin_mutate, &fc, &err);
        if(code == 200 || code == 404) {
            log_write(LOG_INFO, "binder", "released a deleted claim nothing uses any more", "namespace", ns,
                      "gpuclaim", name, NULL);
            keyset_drop(&L->deleting, d);
        }
    }
}

/* Creates the template claims queued by template_claims and deletes
 * those of final VMIs. A create refused (a budget at admission, a name
 * taken by a claim of someone else) is logged and dropped: the VMI's
 * launcher pod stays gated, and the next change of the VMI tries again. */
static void flush_templates(placement *L)
{
    const char *key;
    json_t *v, *tmp;
    json_object_foreach_safe(L->creates, tmp, key, v)
    {
        if(!pl_leading(L))
            return;
        const char *ns = kobject_meta_str(v, "namespace"), *name = kobject_meta_str(v, "name");
        long code = 0;
        json_t *out = NULL;
        cozy_err err;
        if(!(code = L->io.create_claim(L->io.ud, ns, v, &out, &err))) {
            json_decref(out);
            continue; /* transport: tried again */
        }
        if(code / 100 == 2) {
            pl_explain(L, "template claim %s/%s created for VMI %s", ns, name,
                       kobject_annotation(v, "gpu.cozystack.io/vmi") ? kobject_annotation(v, "gpu.cozystack.io/vmi")
                                                                     : "?");
            log_write(LOG_INFO, "binder", "created a template claim for its VMI", "namespace", ns, "gpuclaim", name,
                      NULL);
        } else if(code != 409) {
            const char *m = json_string_value(json_object_get(out, "message"));
            log_write(LOG_WARN, "binder", "cannot create the template claim; the VMI's launcher pod stays gated",
                      "namespace", ns, "gpuclaim", name, "error", m ? m : "", NULL);
        }
        json_decref(out);
        json_object_del(L->creates, key);
    }
    json_object_foreach_safe(L->tdeletes, tmp, key, v)
    {
        if(!pl_leading(L))
            return;
        char buf[600];
        const char *ns, *name;
        keyset_split(key, buf, sizeof buf, &ns, &name);
        long code = 0;
        cozy_err err;
        /* only this object (its uid as a precondition); 409: the
         * precondition failed (another object of the name) */
        code = L->io.remove(L->io.ud, PLACEMENT_CLAIM, ns, name, json_string_value(v) ? json_string_value(v) : "",
                            &err);
        if(code / 100 == 2)
            pl_explain(L, "template claim %s/%s deleted (its VMI is final)", ns, name);
        if(code / 100 == 2 || code == 404 || code == 409)
            json_object_del(L->tdeletes, key);
    }
}

void placement_flush(placement *L)
{
    keyset *d, *t;
    L->more = 0;
    L->progressed = 0;
    L->flush_until = clock_mono_ms() + PL_FLUSH_BUDGET_MS;
    pl_flush_status(L);
    pl_flush_classes(L);
    flush_protection(L);
    pl_flush_class_protection(L);
    flush_templates(L);
    HASH_ITER(hh, L->deletes, d, t)
    {
        if(!pl_leading(L))
            return;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        long code = 0;
        cozy_err err;
        code = L->io.remove(L->io.ud, PLACEMENT_VMI, ns, name, NULL, &err);
        if(code / 100 == 2 || code == 404)
            keyset_drop(&L->deletes, d);
    }
    size_t n;
    pl_ranked *order = pl_fair_order(L->gated, &n);
    for(size_t i = 0; i < n; i++) {
        if(!pl_leading(L) || pl_flush_spent(L))
            break;
        if(pl_pin_pod(L, order[i].d->key)) {
            keyset_drop(&L->gated, order[i].d);
            L->progressed = 1;
        }
    }
    free(order);
    /* writes that only failed wait for the next wake (at most a second,
     * or an event), not a retry at once against an API server in trouble */
    if(!L->progressed)
        L->more = 0;
}
