/* index_query.c — the binder's index (index.h; DESIGN.md §6):
 * queries and verification.
 *
 * A query checks tolerations and the set's classes once per pool (nodes of
 * one shape share a pool per class), never per node, then walks the
 * buckets of the scarcest class from the fewest free units up, nodes
 * already holding units of the class ("part") before untouched ones
 * ("whole"). binder_verify checks every rule of index.c's top comment
 * against the data, for the specs and the bench.
 */
#include "binder/index.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binder/index_internal.h"

/* The shape offers class id `id`. */
static bool shape_offers(const shape *t, uint32_t id)
{
    for(uint32_t i = 0; i < t->nclasses; i++)
        if(t->classes[i] == id)
            return true;
    return false;
}

/* Kubernetes' Toleration.ToleratesTaint (k8s.io/api/core/v1). */
static bool tolerates(const binder_toleration *tol, const ttaint *taint)
{
    if(tol->effect && *tol->effect && strcmp(tol->effect, binder_effect_names[taint->effect]))
        return false;
    if(tol->key && *tol->key && strcmp(tol->key, taint->key))
        return false;
    const char *op = tol->op ? tol->op : "";
    if(!*op || !strcmp(op, "Equal"))
        return !strcmp(tol->value ? tol->value : "", taint->value);
    return !strcmp(op, "Exists");
}

/* Every taint of `t` is tolerated by one of the tolerations. */
static bool shape_tolerated(const shape *t, const binder_toleration *tol, size_t ntol)
{
    for(uint32_t i = 0; i < t->n; i++) {
        size_t j = 0;
        while(j < ntol && !tolerates(&tol[j], &t->t[i]))
            j++;
        if(j == ntol)
            return false;
    }
    return true;
}

/* --------------------------------------------------------------- classes */

binder_rc binder_class_units_get(const binder_index *ix, const char *class_name, const binder_toleration *tol,
                                 size_t ntol, binder_class_units *out)
{
    memset(out, 0, sizeof *out);
    if(!class_name || !*class_name)
        return BINDER_ERR_INPUT;
    const bclass *c = binder_class_find(ix, class_name);
    if(!c)
        return BINDER_OK;
    out->offered = c->offered;
    out->bound = c->bound;
    for(uint32_t i = 0; i < c->nlist; i++) {
        const pool *p = c->list[i];
        if(!p->top || !shape_tolerated(p->sh, tol, ntol))
            continue;
        out->free += p->free_units;
        if(p->top > out->max_free)
            out->max_free = p->top;
    }
    return BINDER_OK;
}

/* ------------------------------------------------------------ candidates */

typedef struct qneed {
    const bclass *cls;
    uint32_t units;
} qneed;

/* Pool p may hold candidates of the set: the tolerations cover its GPU
 * taints and its shape offers every class of the set. */
static bool pool_usable(const pool *p, const qneed *need, size_t nneed, const binder_toleration *tol, size_t ntol)
{
    for(size_t k = 0; k < nneed; k++)
        if(!shape_offers(p->sh, need[k].cls->id))
            return false;
    return shape_tolerated(p->sh, tol, ntol);
}

/* Nodes of class need[k] with room for its units, in the usable pools. */
static size_t feasible_count(const qneed *need, size_t nneed, size_t k, const binder_toleration *tol, size_t ntol)
{
    size_t sum = 0;
    const bclass *c = need[k].cls;
    for(uint32_t i = 0; i < c->nlist; i++) {
        const pool *p = c->list[i];
        if(need[k].units >= p->nb || !pool_usable(p, need, nneed, tol, ntol))
            continue;
        for(uint32_t f = need[k].units; f < p->nb; f++)
            sum += p->b[f].n;
    }
    return sum;
}

/* The needs of query q by class (a class named twice adds up) into
 * need[0..*nneed); *unknown when a class is not known to the index (no
 * node offers it). BINDER_ERR_INPUT for an empty or long class name,
 * units 0 or past BINDER_MAX_UNITS, more than BINDER_MAX_SET_CLASSES. */
static binder_rc query_needs(const binder_index *ix, const binder_query *q, qneed *need, size_t *nneed,
                             bool *unknown)
{
    *nneed = 0;
    *unknown = false;
    for(size_t i = 0; i < q->n_needs; i++) {
        const binder_need *w = &q->needs[i];
        if(!binder_name_ok(w->class_name, BINDER_MAX_NAME) || w->units == 0 || w->units > BINDER_MAX_UNITS)
            return BINDER_ERR_INPUT;
        const bclass *c = binder_class_find(ix, w->class_name);
        if(!c) {
            *unknown = true;
            continue;
        }
        size_t k = 0;
        while(k < *nneed && need[k].cls != c)
            k++;
        if(k == *nneed) {
            if(*nneed == BINDER_MAX_SET_CLASSES)
                return BINDER_ERR_INPUT;
            need[(*nneed)++] = (qneed){c, 0};
        }
        if(need[k].units + w->units > BINDER_MAX_UNITS)
            return BINDER_ERR_INPUT;
        need[k].units += w->units;
    }
    return BINDER_OK;
}

binder_rc binder_node_candidate(const binder_index *ix, const char *name, const binder_query *q,
                                binder_candidate *out, int *fits)
{
    *fits = 0;
    if(!q->n_needs || !q->needs || (q->n_tolerations && !q->tolerations))
        return BINDER_ERR_INPUT;
    const bnode *n = binder_node_find(ix, name);
    if(!n)
        return BINDER_ERR_NO_NODE;
    const uint32_t usable = BINDER_NODE_READY | BINDER_NODE_SCHEDULABLE;
    if((n->flags & usable) != usable || (n->flags & BINDER_NODE_LAYOUT_PENDING) ||
       !shape_tolerated(n->sh, q->tolerations, q->n_tolerations))
        return BINDER_OK;
    qneed need[BINDER_MAX_SET_CLASSES];
    size_t nneed = 0;
    bool unknown = false;
    binder_rc rc = query_needs(ix, q, need, &nneed, &unknown);
    if(rc)
        return rc;
    if(unknown)
        return BINDER_OK; /* a class no node offers */
    binder_candidate cand = {n->name, 0, 0, 0};
    for(size_t k = 0; k < nneed; k++) {
        const slot *o = binder_slot_find(n, need[k].cls);
        if(!o || binder_slot_free(o) < need[k].units)
            return BINDER_OK;
        cand.free += binder_slot_free(o);
        cand.bound += o->bound;
        cand.offered += o->offered;
    }
    *out = cand;
    *fits = 1;
    return BINDER_OK;
}

binder_rc binder_candidates_set(const binder_index *ix, const binder_query *q, binder_candidate *out, size_t max,
                                size_t *n_out)
{
    *n_out = 0;
    if(!q->n_needs || !q->needs || (q->n_tolerations && !q->tolerations))
        return BINDER_ERR_INPUT;
    qneed need[BINDER_MAX_SET_CLASSES];
    size_t nneed = 0;
    bool unknown = false;
    binder_rc rc = query_needs(ix, q, need, &nneed, &unknown);
    if(rc)
        return rc;
    if(unknown || !max)
        return BINDER_OK;
    /* the scarcest class drives the walk */
    size_t drive = 0, best = SIZE_MAX;
    for(size_t k = 0; k < nneed; k++) {
        size_t f = feasible_count(need, nneed, k, q->tolerations, q->n_tolerations);
        if(f < best)
            best = f, drive = k;
    }
    if(best == 0)
        return BINDER_OK;
    const bclass *dc = need[drive].cls;
    uint32_t du = need[drive].units, top = 0;
    /* the driving class's usable pools */
    const pool *local[32], **pools = local;
    size_t np = 0;
    if(dc->nlist > 32 && !(pools = malloc(dc->nlist * sizeof *pools)))
        return BINDER_ERR_MEMORY;
    for(uint32_t i = 0; i < dc->nlist; i++) {
        const pool *p = dc->list[i];
        if(du < p->nb && pool_usable(p, need, nneed, q->tolerations, q->n_tolerations)) {
            pools[np++] = p;
            if(p->nb > top)
                top = p->nb;
        }
    }
    size_t examined = 0, n = 0;
    for(int group = 0; group < 2; group++) {
        for(uint32_t f = du; f < top; f++) {
            for(size_t i = 0; i < np; i++) {
                if(f >= pools[i]->nb)
                    continue;
                const slot *s;
                DL_FOREACH(group ? pools[i]->b[f].whole : pools[i]->b[f].part, s)
                {
                    if(q->max_examined && examined == q->max_examined)
                        goto done;
                    examined++;
                    binder_candidate cand = {s->node->name, binder_slot_free(s), s->bound, s->offered};
                    bool fits = true;
                    for(size_t k = 0; k < nneed && fits; k++) {
                        if(k == drive)
                            continue;
                        const slot *o = binder_slot_find(s->node, need[k].cls);
                        fits = o && binder_slot_free(o) >= need[k].units;
                        if(fits) {
                            cand.free += binder_slot_free(o);
                            cand.bound += o->bound;
                            cand.offered += o->offered;
                        }
                    }
                    if(!fits)
                        continue;
                    out[n++] = cand;
                    if(n == max)
                        goto done;
                }
            }
        }
    }
done:
    if(pools != local)
        free(pools);
    *n_out = n;
    return BINDER_OK;
}

binder_rc binder_candidates(const binder_index *ix, const char *class_name, uint32_t units,
                            const binder_toleration *tolerations, size_t n_tolerations, binder_candidate *out,
                            size_t max, size_t *n_out)
{
    binder_need need = {class_name, units};
    binder_query q = {&need, 1, tolerations, n_tolerations, 0};
    return binder_candidates_set(ix, &q, out, max, n_out);
}

/* ---------------------------------------------------------------- verify */

binder_rc binder_verify(const binder_index *ix, cozy_err *err)
{
    size_t listed = 0, bound = 0, over = 0;
    const bnode *n, *ntmp;
    HASH_ITER(hh, ix->nodes, n, ntmp)
    {
        for(uint32_t i = 0; i < n->nslots; i++) {
            const slot *s = &n->slots[i];
            if(s->node != n)
                return fail(err, BINDER_ERR_INPUT, "node %s: slot %u points to another node", n->name, i);
            for(uint32_t j = 0; j < i; j++)
                if(n->slots[j].cls == s->cls)
                    return fail(err, BINDER_ERR_INPUT, "node %s: class %s has two slots", n->name, s->cls->name);
            uint64_t sum = 0;
            const bclaim *c;
            DL_FOREACH(n->claims, c)
            if(c->cls == s->cls) sum += c->count;
            if(sum != s->bound)
                return fail(err, BINDER_ERR_INPUT, "node %s: class %s: %u units bound, its claims add up to %llu",
                            n->name, s->cls->name, s->bound, (unsigned long long)sum);
            over += s->bound > s->offered;
            bool want = binder_slot_free(s) && binder_node_eligible(n);
            if(want != (s->pool != NULL))
                return fail(err, BINDER_ERR_INPUT, "node %s: class %s is %slisted", n->name, s->cls->name,
                            s->pool ? "" : "not ");
            if(s->pool) {
                listed++;
                if(s->pool != s->cls->pools[n->sh->id] || s->free_at != binder_slot_free(s) || s->whole != (s->bound == 0))
                    return fail(err, BINDER_ERR_INPUT, "node %s: class %s is in the wrong bucket", n->name,
                                s->cls->name);
            }
        }
        uint32_t offering = 0;
        for(uint32_t i = 0; i < n->nslots; i++)
            if(n->slots[i].offered) {
                offering++;
                if(!shape_offers(n->sh, n->slots[i].cls->id))
                    return fail(err, BINDER_ERR_INPUT, "node %s: its shape lacks class %s", n->name,
                                n->slots[i].cls->name);
            }
        if(offering != n->sh->nclasses)
            return fail(err, BINDER_ERR_INPUT, "node %s: offers %u classes, its shape %u", n->name, offering,
                        n->sh->nclasses);
        const bclaim *c;
        DL_FOREACH(n->claims, c)
        {
            if(c->node != n)
                return fail(err, BINDER_ERR_INPUT, "node %s lists claim %s/%s bound elsewhere", n->name, c->key,
                            c->key + strlen(c->key) + 1);
            if(!binder_slot_find(n, c->cls))
                return fail(err, BINDER_ERR_INPUT, "node %s: claim %s has no slot", n->name, c->key);
        }
    }
    const bclaim *c, *ctmp;
    HASH_ITER(hh, ix->claims, c, ctmp)
    bound += c->node != NULL;
    /* every list element is where its fields say */
    size_t inlists = 0;
    const bclass *k, *ktmp;
    HASH_ITER(hh, ix->classes, k, ktmp)
    {
        for(uint32_t i = 0; i < k->npools; i++) {
            const pool *p = k->pools[i];
            if(!p)
                continue;
            uint64_t sum = 0;
            uint32_t top = 0;
            for(uint32_t f = 0; f < p->nb; f++) {
                uint32_t cnt = 0;
                for(int g = 0; g < 2; g++) {
                    const slot *s;
                    DL_FOREACH(g ? p->b[f].whole : p->b[f].part, s)
                    {
                        cnt++;
                        if(s->pool != p || s->free_at != f || s->whole != (g == 1) || s->cls != k)
                            return fail(err, BINDER_ERR_INPUT, "class %s: bucket %u holds node %s wrongly", k->name,
                                        f, s->node->name);
                    }
                }
                if(cnt != p->b[f].n)
                    return fail(err, BINDER_ERR_INPUT, "class %s: bucket %u counts %u, holds %u", k->name, f,
                                p->b[f].n, cnt);
                inlists += cnt;
                sum += (uint64_t)f * cnt;
                if(cnt)
                    top = f;
            }
            if(sum != p->free_units || top != p->top)
                return fail(err, BINDER_ERR_INPUT, "class %s: pool %u: free units %llu and top %u recorded, %llu and %u held",
                            k->name, i, (unsigned long long)p->free_units, p->top, (unsigned long long)sum, top);
        }
        uint64_t offered = 0, held = 0;
        HASH_ITER(hh, ix->nodes, n, ntmp)
        {
            const slot *s = binder_slot_find(n, k);
            offered += s ? s->offered : 0;
            held += s ? s->bound : 0;
        }
        if(offered != k->offered || held != k->bound)
            return fail(err, BINDER_ERR_INPUT, "class %s: %llu offered and %llu bound recorded, nodes add up to %llu and %llu",
                        k->name, (unsigned long long)k->offered, (unsigned long long)k->bound,
                        (unsigned long long)offered, (unsigned long long)held);
    }
    if(listed != ix->listed || inlists != listed)
        return fail(err, BINDER_ERR_INPUT, "listed: counted %zu, in lists %zu, recorded %zu", listed, inlists,
                    ix->listed);
    if(bound != ix->bound)
        return fail(err, BINDER_ERR_INPUT, "bound claims: counted %zu, recorded %zu", bound, ix->bound);
    if(over != ix->overcommit)
        return fail(err, BINDER_ERR_INPUT, "overcommit: counted %zu, recorded %zu", over, ix->overcommit);
    return BINDER_OK;
}
