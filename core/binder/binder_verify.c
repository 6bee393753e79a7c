/* binder_verify.c — a new leader's rebuild of the index from the store
 * (binder_state_restore: claims' status.node, DESIGN.md §6, decision
 * 0020) and the check of the store against the index and the binder's
 * rules (binder_state_verify; binder.h says what each rule is and where it
 * comes from).
 */
#include "binder/binder_internal.h"

#include <string.h>

/* ------------------------------------------------------------ restore */

static binder_node_spec spec_of(const sm_node *n)
{
    binder_node_spec s = {n->flags, n->offers, n->n_offers, n->taints, n->n_taints};
    return s;
}

binder_rc binder_state_restore(binder_state *st, cozy_err *err)
{
    binder_index *ix = binder_new();
    if(!ix)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    binder_rc rc = BINDER_OK;
    for(const sm_node *n = st->nodes; n && !rc; n = n->hh.next) {
        binder_node_spec s = spec_of(n);
        rc = binder_node_upsert(ix, n->name, &s, NULL, err);
    }
    for(sm_claim *c = st->claims; c && !rc; c = c->hh.next) {
        rc = binder_claim_upsert(ix, c->ns, c->name, c->class_name, c->count, err);
        if(!rc)
            binder_claim_tag(ix, c->ns, c->name, c);
        int book = c->node && (c->phase == BINDER_BOUND || c->phase == BINDER_ATTACHED || c->phase == BINDER_LOST);
        if(!rc && book && binder_i_node_find(st, c->node))
            rc = binder_bind(ix, c->ns, c->name, c->node, BINDER_BIND_RESTORE, err);
    }
    if(rc) {
        binder_free(ix);
        return rc;
    }
    binder_free(st->ix);
    st->ix = ix;
    st->full = 1; /* a new leader's first pass looks at every claim */
    return BINDER_OK;
}

/* ------------------------------------------------------------- verify */

binder_rc binder_state_verify(const binder_state *st, cozy_err *err)
{
    binder_rc rc = binder_verify(st->ix, err);
    if(rc)
        return rc;
    for(const sm_claim *c = st->claims; c; c = c->hh.next) {
        /* the index itself (binder_i_booked trusts this very rule) */
        binder_claim_view v;
        const char *b = binder_claim_get(st->ix, c->ns, c->name, &v) == BINDER_OK ? v.node : NULL;
        int should = c->node && binder_i_node_find(st, c->node) &&
                     (c->phase == BINDER_BOUND || c->phase == BINDER_ATTACHED || c->phase == BINDER_LOST);
        if(should != (b != NULL) || (b && !binder_i_same(b, c->node)))
            return fail(err, BINDER_ERR_INPUT, "claim %s/%s: %s on node %s but booked on %s", c->ns, c->name,
                        binder_phase_name(c->phase), c->node ? c->node : "(none)", b ? b : "(none)");
        if(c->phase == BINDER_ATTACHED && !binder_i_vmi_live(binder_i_vmi_of(c)))
            return fail(err, BINDER_ERR_INPUT, "claim %s/%s: Attached to a VMI that is %s", c->ns, c->name,
                        c->set ? binder_vmi_phase_name(c->set->phase) : "gone");
        if((c->phase == BINDER_PENDING || c->phase == BINDER_LOST) && c->reason == BINDER_R_NONE)
            return fail(err, BINDER_ERR_INPUT, "claim %s/%s: %s without a reason", c->ns, c->name,
                        binder_phase_name(c->phase));
    }
    for(const sm_node *n = st->nodes; n; n = n->hh.next) {
        cap_walk w = {st, n->name, {0}, 0};
        binder_node_claims(st->ix, n->name, binder_i_cap_collect, &w);
        for(size_t i = 0; i < w.n; i++) {
            binder_slot_view sl;
            if(binder_node_slot(st->ix, n->name, w.list[i]->class_name, &sl) || sl.bound <= sl.offered)
                continue;
            /* over: allowed only while what holds it cannot move yet */
            for(size_t k = 0; k < w.n; k++)
                if(!strcmp(w.list[k]->class_name, w.list[i]->class_name) && binder_i_movable(w.list[k]) &&
                   binder_i_vmi_of(w.list[k]) != BINDER_VMI_PENDING)
                    return fail(err, BINDER_ERR_INPUT,
                                "node %s: class %s holds %u units of %u offered, and claim %s/%s could move",
                                n->name, w.list[i]->class_name, sl.bound, sl.offered, w.list[k]->ns,
                                w.list[k]->name);
        }
    }
    return BINDER_OK;
}
