/* binder_lazy.c — the sets a pass retries because their class gained
 * room, checked lazily (binder_internal.h, binder_i_lazy_*): placed at
 * their turn in step 3 only when a node that gained room is a candidate
 * for them (docs/decisions/0042-room-gained-by-node.md; binder_pass.c
 * runs the pass, binder.h says what each rule is: DESIGN.md §6, decision
 * 0020, 0023).
 */
#include "binder/binder_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int lazy_claim_ok(const sm_claim *x)
{
    return binder_i_unplaced(x) && !x->vol && (x->reason == BINDER_R_NO_NODE_WITH_ROOM || x->reason == BINDER_R_NODE_LOST);
}

/* Adds claim x to entry e's signature and place in line. */
static void lazy_take(lazy *e, const sm_claim *x)
{
    if(x->seq < e->seq)
        e->seq = x->seq;
    if(x->phase == BINDER_LOST)
        e->lost = 1;
    if(e->nsig == SIZE_MAX)
        return; /* more classes than a signature holds: no signature */
    size_t k;
    for(k = 0; k < e->nsig && e->cls[k] != x->held->tally; k++)
        ;
    if(k < e->nsig)
        e->units[k] += x->count;
    else if(e->nsig < LAZY_SIG) {
        /* kept sorted by tally, so that equal needs compare equal */
        size_t at = e->nsig;
        while(at > 0 && (uintptr_t)e->cls[at - 1] > (uintptr_t)x->held->tally) {
            e->cls[at] = e->cls[at - 1];
            e->units[at] = e->units[at - 1];
            at--;
        }
        e->cls[at] = x->held->tally;
        e->units[at] = x->count;
        e->nsig++;
    } else
        e->nsig = SIZE_MAX;
}

/* Lists c's group to be checked at its turn when every claim of it waits
 * for room only (binder_i_unplaced, NoNodeWithRoom or NodeLost, on no hook's
 * answer); returns 0 when it does not (the pass takes it as any other),
 * 1 when listed or the pass has it already. */
int binder_i_lazy_list(binder_state *st, lzlist *lz, sm_claim *c)
{
    sm_set *s = c->set;
    if(s ? s->stamp == st->stamp || s->lstamp == st->stamp : c->stamp == st->stamp || c->lstamp == st->stamp)
        return 1;
    lazy e = {UINT64_MAX, s, s ? NULL : c, 0, 0, {0}, {0}};
    if(s) {
        if(s->n > BINDER_MAX_SET_CLAIMS)
            return 0;
        for(size_t i = 0; i < s->n; i++) {
            if(!lazy_claim_ok(s->claims[i]))
                return 0;
            lazy_take(&e, s->claims[i]);
        }
    } else {
        if(!lazy_claim_ok(c))
            return 0;
        lazy_take(&e, c);
    }
    if(e.nsig == SIZE_MAX)
        e.nsig = 0;
    if(lz->n == lz->cap) {
        size_t cap = lz->cap ? lz->cap * 2 : 64;
        lazy *v = realloc(lz->v, cap * sizeof *v);
        if(!v) {
            lz->oom = 1;
            return 1;
        }
        lz->v = v;
        lz->cap = cap;
    }
    if(s)
        s->lstamp = st->stamp;
    else
        c->lstamp = st->stamp;
    lz->v[lz->n++] = e;
    return 1;
}

static int lazy_cmp(const void *a, const void *b)
{
    const lazy *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void binder_i_lazy_ctx_init(const binder_state *st, lazy_ctx *lc)
{
    memset(lc, 0, sizeof *lc);
    for(size_t i = 0; i < st->n_gained && !lc->wide; i++) {
        const char *node = st->gained[i].node;
        if(!node) {
            lc->wide = 1; /* kept by class only: anywhere */
            break;
        }
        size_t k;
        for(k = 0; k < lc->n && strcmp(lc->nodes[k], node); k++)
            ;
        if(k < lc->n)
            continue;
        if(lc->n == LAZY_MAX_NODES)
            lc->wide = 1;
        else
            lc->nodes[lc->n++] = node;
    }
}

static int lazy_same(const lazy *a, const lazy *b)
{
    if(a->nsig != b->nsig)
        return 0;
    for(size_t k = 0; k < a->nsig; k++)
        if(a->cls[k] != b->cls[k] || a->units[k] != b->units[k])
            return 0;
    return 1;
}

static void lazy_group(const lazy *e, group *g)
{
    if(e->set)
        binder_i_group_of_set(g, e->set);
    else
        binder_i_group_of_claim(g, e->c);
}

/* Whether some node that gained room may be a candidate for e's group
 * now (1 when in doubt). */
static int lazy_may_fit(const binder_state *st, lazy_ctx *lc, const lazy *e)
{
    if(lc->wide)
        return 1;
    for(size_t f = 0; e->nsig && f < lc->n_fail; f++)
        if(lazy_same(&lc->fail[f], e))
            return 0;
    group g;
    lazy_group(e, &g);
    needs nd;
    if(binder_i_needs_of(st, &g, binder_i_unplaced, &nd) || nd.n == 0)
        return 1;
    binder_query q = {nd.need, nd.n, nd.tols, nd.n_tols, 0};
    for(size_t i = 0; i < lc->n; i++) {
        binder_candidate cand;
        int fits = 0;
        binder_rc rc = binder_node_candidate(st->ix, lc->nodes[i], &q, &cand, &fits);
        if((rc == BINDER_OK && fits) || (rc != BINDER_OK && rc != BINDER_ERR_NO_NODE))
            return 1;
    }
    if(e->nsig && lc->n_fail < LAZY_MAX_FAIL)
        lc->fail[lc->n_fail++] = *e;
    return 0;
}

/* Before step 3: drops the listed sets no gained node has room for now
 * (nor will in this step), and sorts the others in line. Room does not
 * change here, so a signature found to fit is not asked again either. */
void binder_i_lazy_prune(const binder_state *st, lazy_ctx *lc, lzlist *lz)
{
    lazy fits[LAZY_MAX_FAIL];
    size_t n_fits = 0, k = 0;
    for(size_t i = 0; i < lz->n; i++) {
        const lazy *e = &lz->v[i];
        if(e->set ? e->set->stamp == st->stamp : e->c->stamp == st->stamp)
            continue; /* taken by the pass after all */
        size_t f;
        for(f = 0; e->nsig && f < n_fits && !lazy_same(&fits[f], e); f++)
            ;
        if(!e->nsig || f == n_fits) {
            if(!lazy_may_fit(st, lc, e))
                continue;
            if(e->nsig && n_fits < LAZY_MAX_FAIL)
                fits[n_fits++] = *e;
        }
        lz->v[k++] = *e;
    }
    lz->n = k;
    if(k)
        qsort(lz->v, k, sizeof *lz->v, lazy_cmp);
}

/* Step 3 for a listed group at its turn (round 0: Lost sets, 1: the rest). */
void binder_i_lazy_try(pass *p, lazy_ctx *lc, const lazy *e, int round)
{
    binder_state *st = p->st;
    if((round == 0) != e->lost || !lazy_may_fit(st, lc, e))
        return;
    group g;
    lazy_group(e, &g);
    if(!binder_i_group_unplaced(&g))
        return;
    binder_i_place_group(p, &g);
    for(size_t m = 0; m < g.n; m++)
        binder_i_wait_update(st, g.m[m]);
}

