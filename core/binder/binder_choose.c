/* binder_choose.c — choosing a node for a group of claims (a set, or a
 * lone claim): its needs per class and their tolerations, the candidates
 * the index has for them (or the set's allowed nodes, DESIGN.md §6: a
 * volume bound to a node), the chooser hook's pick among them
 * (docs/decisions/0024-binder-policy.md), and booking the group on the
 * node chosen. binder_pass.c's steps 2 and 3 call them.
 */
#include "binder/binder_internal.h"

#include <string.h>

int binder_i_needs_of(const binder_state *st, const group *g, int (*pick)(const sm_claim *), needs *out)
{
    memset(out, 0, sizeof *out);
    for(size_t i = 0; i < g->n; i++) {
        const sm_claim *c = g->m[i];
        if(pick && !pick(c))
            continue;
        size_t k;
        for(k = 0; k < out->n; k++)
            if(strcmp(out->need[k].class_name, c->class_name) == 0)
                break;
        if(k == out->n) {
            if(out->n == BINDER_MAX_SET_CLASSES)
                return -1;
            out->need[out->n].class_name = c->class_name;
            out->n++;
            const sm_class *cl = binder_i_class_find(st, c->class_name);
            for(size_t t = 0; cl && t < cl->n_tols && out->n_tols < sizeof out->tols / sizeof *out->tols; t++)
                out->tols[out->n_tols++] = cl->tols[t];
        }
        out->need[k].units += c->count;
    }
    return 0;
}

static void set_view_of(const group *g, binder_claim_status *views, binder_set_view *sv)
{
    for(size_t i = 0; i < g->n; i++)
        binder_i_view_of(g->m[i], &views[i]);
    sv->ns = g->m[0]->ns;
    sv->vm = g->set ? g->set->name : NULL;
    sv->claims = views;
    sv->n = g->n;
}

/* The candidates for the needs of group g (BINDER_MAX_CANDIDATES at most:
 * the index's packing order, or the set's allowed nodes): how many. */
size_t binder_i_candidates_of(pass *p, const group *g, const needs *nd, binder_candidate *cands)
{
    size_t nc = 0;
    binder_query q = {nd->need, nd->n, nd->tols, nd->n_tols, 0};
    if(g->set && g->set->n_allowed) {
        /* a set limited to named nodes (DESIGN.md §6: a volume bound to a
         * node): those of them that are candidates, in the order given */
        for(size_t i = 0; i < g->set->n_allowed && nc < BINDER_MAX_CANDIDATES; i++) {
            int fits = 0;
            if(binder_node_candidate(p->st->ix, g->set->allowed[i], &q, &cands[nc], &fits) == BINDER_OK && fits)
                nc++;
        }
        return nc;
    }
    if(binder_candidates_set(p->st->ix, &q, cands, BINDER_MAX_CANDIDATES, &nc))
        return 0;
    return nc;
}

/* The hook's pick among nc >= 1 candidates: the node name (borrowed from
 * the index), or NULL when the hook took none (p->refused set). */
const char *binder_i_pick_of(pass *p, const group *g, const binder_candidate *cands, size_t nc)
{
    int pick = 0;
    if(p->h && p->h->choose) {
        binder_claim_status views[BINDER_MAX_SET_CLAIMS];
        binder_set_view sv;
        set_view_of(g, views, &sv);
        pick = p->h->choose(p->h->ud, &sv, cands, nc);
    }
    if(pick < 0 || (size_t)pick >= nc) {
        p->refused = 1; /* candidates were there: the hook's answer, not room, keeps the set waiting */
        return NULL;
    }
    return cands[pick].node;
}

/* Candidates for the needs, chosen by the hook. Returns the node name
 * (borrowed from the index) or NULL. */
const char *binder_i_choose(pass *p, const group *g, const needs *nd)
{
    p->refused = 0;
    binder_candidate cands[BINDER_MAX_CANDIDATES];
    size_t nc = binder_i_candidates_of(p, g, nd, cands);
    return nc ? binder_i_pick_of(p, g, cands, nc) : NULL;
}

binder_rc binder_i_bind_group(binder_state *st, const group *g, int (*pick)(const sm_claim *), const char *node,
                              uint32_t flags)
{
    binder_claim_ref refs[BINDER_MAX_SET_CLAIMS];
    size_t n = 0;
    for(size_t i = 0; i < g->n; i++)
        if(!pick || pick(g->m[i]))
            refs[n++] = (binder_claim_ref){g->m[i]->ns, g->m[i]->name};
    return n ? binder_bind_set(st->ix, refs, n, node, flags, NULL) : BINDER_OK;
}
