/* index_nodes.c — the binder's index (index.h; DESIGN.md §6):
 * slots, nodes, claims and binding.
 *
 * Every change (offer, flags, bind, unbind) moves a slot in O(1) between
 * the buckets of its class's pool for its node's shape (the layout is in
 * index.c's top comment): a slot is in exactly the bucket of its free
 * units when its node is Ready, schedulable and not layout-pending and it
 * has free units, otherwise in no bucket. A node upsert makes everything
 * that allocates (slots, shape, pools) before anything changes, so a
 * failure leaves the index as it was and moving a slot never fails.
 */
#include "binder/index.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binder/index_internal.h"

/* the most claims one bind_set takes (a VM names a handful) */
#define BIND_SET_MAX 64

/* ----------------------------------------------------------------- slots */

static void slot_unlist(binder_index *ix, slot *s)
{
    if(!s->pool)
        return;
    pool *p = s->pool;
    bucket *b = &p->b[s->free_at];
    if(s->whole)
        DL_DELETE(b->whole, s);
    else
        DL_DELETE(b->part, s);
    b->n--;
    p->free_units -= s->free_at;
    while(p->top && !p->b[p->top].n)
        p->top--;
    s->pool = NULL;
    s->prev = s->next = NULL;
    ix->listed--;
}

/* Puts slot s where its node and units say (index.c's top comment). The
 * pool exists with enough buckets (binder_pool_ensure ran when the offer was set). */
static void slot_place(binder_index *ix, slot *s)
{
    uint32_t fr = binder_slot_free(s);
    pool *p = NULL;
    if(fr && binder_node_eligible(s->node))
        p = s->cls->pools[s->node->sh->id];
    bool whole = s->bound == 0;
    if(s->pool == p && (!p || (s->free_at == fr && s->whole == whole)))
        return;
    slot_unlist(ix, s);
    if(!p)
        return;
    bucket *b = &p->b[fr];
    if(whole)
        DL_APPEND(b->whole, s);
    else
        DL_APPEND(b->part, s);
    b->n++;
    p->free_units += fr;
    if(fr > p->top)
        p->top = fr;
    s->pool = p;
    s->free_at = fr;
    s->whole = whole;
    ix->listed++;
}

/* Sets a slot's units, keeping the overcommit count. */
static void slot_set(binder_index *ix, slot *s, uint32_t offered, uint32_t bound)
{
    ix->overcommit -= s->bound > s->offered;
    s->cls->offered -= s->offered;
    s->cls->bound -= s->bound;
    s->offered = offered;
    s->bound = bound;
    s->cls->offered += offered;
    s->cls->bound += bound;
    ix->overcommit += s->bound > s->offered;
}

/* Replaces node n's slot array by `fresh` (nfresh slots, their units set,
 * list links cleared), moving every slot out of the buckets and back. */
static void node_slots_replace(binder_index *ix, bnode *n, slot *fresh, uint32_t nfresh)
{
    for(uint32_t i = 0; i < n->nslots; i++) {
        slot_unlist(ix, &n->slots[i]);
        ix->overcommit -= n->slots[i].bound > n->slots[i].offered;
        n->slots[i].cls->offered -= n->slots[i].offered;
        n->slots[i].cls->bound -= n->slots[i].bound;
    }
    free(n->slots);
    n->slots = fresh;
    n->nslots = nfresh;
    for(uint32_t i = 0; i < nfresh; i++) {
        n->slots[i].node = n;
        n->slots[i].cls->offered += n->slots[i].offered;
        n->slots[i].cls->bound += n->slots[i].bound;
        ix->overcommit += n->slots[i].bound > n->slots[i].offered;
        slot_place(ix, &n->slots[i]);
    }
}

/* ----------------------------------------------------------------- nodes */

bnode *binder_node_find(const binder_index *ix, const char *name)
{
    bnode *n = NULL;
    if(name)
        HASH_FIND_STR(ix->nodes, name, n);
    return n;
}

static int effect_of(const char *s)
{
    for(int e = EFFECT_NO_SCHEDULE; e <= EFFECT_NO_EXECUTE; e++)
        if(s && !strcmp(s, binder_effect_names[e]))
            return e;
    return 0;
}

binder_rc binder_node_upsert(binder_index *ix, const char *name, const binder_node_spec *spec, size_t *overcommitted,
                             cozy_err *err)
{
    if(overcommitted)
        *overcommitted = 0;
    if(!binder_name_ok(name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "node name: empty or longer than %d", BINDER_MAX_NAME);
    if(!spec)
        return fail(err, BINDER_ERR_INPUT, "node %s: no spec", name);
    if((spec->n_offers && !spec->offers) || (spec->n_taints && !spec->taints))
        return fail(err, BINDER_ERR_INPUT, "node %s: offers or taints missing", name);
    if(spec->flags & ~(BINDER_NODE_READY | BINDER_NODE_SCHEDULABLE | BINDER_NODE_LAYOUT_PENDING))
        return fail(err, BINDER_ERR_INPUT, "node %s: unknown flags 0x%x", name, spec->flags);
    for(size_t i = 0; i < spec->n_offers; i++) {
        const binder_offer *o = &spec->offers[i];
        if(!binder_name_ok(o->class_name, BINDER_MAX_NAME))
            return fail(err, BINDER_ERR_INPUT, "node %s: offers[%zu].class: empty or longer than %d", name, i,
                        BINDER_MAX_NAME);
        uint64_t sum = 0;
        for(size_t j = 0; j < spec->n_offers; j++)
            if(!strcmp(spec->offers[j].class_name ? spec->offers[j].class_name : "", o->class_name))
                sum += spec->offers[j].units;
        if(sum > BINDER_MAX_UNITS)
            return fail(err, BINDER_ERR_INPUT, "node %s: offers[%zu].units: class %s offers %llu units, above %d",
                        name, i, o->class_name, (unsigned long long)sum, BINDER_MAX_UNITS);
    }
    /* the GPU taints that filter, validated */
    ttaint *tmp = NULL;
    uint32_t nt = 0;
    binder_rc rc = BINDER_OK;
    slot *fresh = NULL;
    uint32_t *cls = NULL;
    if(spec->n_taints && !(tmp = calloc(spec->n_taints, sizeof *tmp)))
        return fail(err, BINDER_ERR_MEMORY, "node %s: out of memory", name);
    for(size_t i = 0; i < spec->n_taints; i++) {
        const binder_taint *t = &spec->taints[i];
        if(!t->key || strncmp(t->key, BINDER_TAINT_PREFIX, sizeof BINDER_TAINT_PREFIX - 1))
            continue;
        int e = effect_of(t->effect);
        if(!e) {
            rc = fail(err, BINDER_ERR_INPUT, "node %s: taints[%zu].effect: %s is not NoSchedule, PreferNoSchedule "
                      "or NoExecute", name, i, t->effect ? t->effect : "(none)");
            goto out;
        }
        if(!binder_name_ok(t->key, BINDER_MAX_TAINT_KEY) || strnlen(t->value ? t->value : "", BINDER_MAX_TAINT_VALUE + 1) >
                                                         BINDER_MAX_TAINT_VALUE) {
            rc = fail(err, BINDER_ERR_INPUT, "node %s: taints[%zu]: key or value too long", name, i);
            goto out;
        }
        if(e == EFFECT_PREFER_NO_SCHEDULE)
            continue;
        tmp[nt++] = (ttaint){(char *)t->key, (char *)(t->value ? t->value : ""), e};
    }
    /* everything that allocates, before anything changes: the new slots
     * (kept classes still held, then the offers), the shape, the pools */
    bnode *n = binder_node_find(ix, name);
    uint32_t nold = n ? n->nslots : 0, nf = 0, nc = 0;
    fresh = calloc(nold + spec->n_offers + 1, sizeof *fresh);
    cls = calloc(nold + spec->n_offers + 1, sizeof *cls);
    shape *sh = NULL;
    if(!fresh || !cls)
        goto oom;
    for(uint32_t i = 0; i < nold; i++)
        if(n->slots[i].bound)
            fresh[nf++] = (slot){.cls = n->slots[i].cls, .bound = n->slots[i].bound};
    for(size_t i = 0; i < spec->n_offers; i++) {
        if(!spec->offers[i].units)
            continue;
        bclass *c = binder_class_get(ix, spec->offers[i].class_name);
        if(!c)
            goto oom;
        uint32_t k = 0;
        while(k < nf && fresh[k].cls != c)
            k++;
        if(k == nf)
            fresh[nf++] = (slot){.cls = c};
        fresh[k].offered += spec->offers[i].units;
    }
    for(uint32_t k = 0; k < nf; k++)
        if(fresh[k].offered)
            cls[nc++] = fresh[k].cls->id;
    if(!(sh = binder_shape_intern(ix, tmp, nt, cls, nc)))
        goto oom;
    for(uint32_t k = 0; k < nf; k++)
        if(fresh[k].offered && !binder_pool_ensure(fresh[k].cls, sh, fresh[k].offered))
            goto oom;
    if(!n) {
        if(!(n = calloc(1, sizeof *n)) || !(n->name = strdup(name))) {
            free(n);
            goto oom;
        }
        n->sh = ix->shape_by_id[0];
        HASH_ADD_KEYPTR(hh, ix->nodes, n->name, strlen(n->name), n);
        if(!n->hh.tbl) {
            free(n->name);
            free(n);
            goto oom;
        }
    }
    /* commit: nothing fails from here */
    n->flags = spec->flags;
    n->sh = sh;
    node_slots_replace(ix, n, fresh, nf);
    if(overcommitted)
        for(uint32_t i = 0; i < nf; i++)
            *overcommitted += fresh[i].bound > fresh[i].offered;
    goto out;
oom:
    free(fresh);
    rc = fail(err, BINDER_ERR_MEMORY, "node %s: out of memory", name);
out:
    free(cls);
    free(tmp);
    return rc;
}

binder_rc binder_node_set_flags(binder_index *ix, const char *name, uint32_t flags)
{
    bnode *n = binder_node_find(ix, name);
    if(!n)
        return BINDER_ERR_NO_NODE;
    if(flags & ~(BINDER_NODE_READY | BINDER_NODE_SCHEDULABLE | BINDER_NODE_LAYOUT_PENDING))
        return BINDER_ERR_INPUT;
    n->flags = flags;
    for(uint32_t i = 0; i < n->nslots; i++)
        slot_place(ix, &n->slots[i]);
    return BINDER_OK;
}

static void claim_view(const bclaim *c, binder_claim_view *v)
{
    v->ns = c->key;
    v->name = c->key + strlen(c->key) + 1;
    v->class_name = c->cls->name;
    v->count = c->count;
    v->node = c->node ? c->node->name : NULL;
    v->tag = c->tag;
}

/* Takes claim c off its node; the slot is moved by the caller. */
static slot *claim_detach(binder_index *ix, bclaim *c)
{
    bnode *n = c->node;
    slot *s = binder_slot_find(n, c->cls);
    slot_set(ix, s, s->offered, s->bound - c->count);
    DL_DELETE(n->claims, c);
    c->prev = c->next = NULL;
    c->node = NULL;
    ix->bound--;
    return s;
}

binder_rc binder_node_delete(binder_index *ix, const char *name, binder_claim_fn fn, void *ud)
{
    bnode *n = binder_node_find(ix, name);
    if(!n)
        return BINDER_ERR_NO_NODE;
    for(uint32_t i = 0; i < n->nslots; i++)
        slot_unlist(ix, &n->slots[i]);
    while(n->claims) {
        bclaim *c = n->claims;
        claim_detach(ix, c);
        if(fn) {
            binder_claim_view v;
            claim_view(c, &v);
            fn(ud, &v);
        }
    }
    for(uint32_t i = 0; i < n->nslots; i++) {
        ix->overcommit -= n->slots[i].bound > n->slots[i].offered;
        n->slots[i].cls->offered -= n->slots[i].offered;
        n->slots[i].cls->bound -= n->slots[i].bound;
    }
    HASH_DEL(ix->nodes, n);
    free(n->slots);
    free(n->name);
    free(n);
    return BINDER_OK;
}

binder_rc binder_node_flags(const binder_index *ix, const char *name, uint32_t *flags)
{
    const bnode *n = binder_node_find(ix, name);
    if(!n)
        return BINDER_ERR_NO_NODE;
    *flags = n->flags;
    return BINDER_OK;
}

binder_rc binder_node_slot(const binder_index *ix, const char *name, const char *class_name, binder_slot_view *out)
{
    const bnode *n = binder_node_find(ix, name);
    if(!n)
        return BINDER_ERR_NO_NODE;
    const bclass *c = class_name ? binder_class_find(ix, class_name) : NULL;
    const slot *s = c ? binder_slot_find(n, c) : NULL;
    out->offered = s ? s->offered : 0;
    out->bound = s ? s->bound : 0;
    return BINDER_OK;
}

binder_rc binder_node_claims(const binder_index *ix, const char *name, binder_claim_fn fn, void *ud)
{
    const bnode *n = binder_node_find(ix, name);
    if(!n)
        return BINDER_ERR_NO_NODE;
    const bclaim *c;
    DL_FOREACH(n->claims, c)
    {
        binder_claim_view v;
        claim_view(c, &v);
        fn(ud, &v);
    }
    return BINDER_OK;
}

/* ---------------------------------------------------------------- claims */

/* The hash key of ns/name ("ns\0name") into buf; its length, or 0 when a
 * part is empty or too long. */
static size_t claim_key(char buf[BINDER_MAX_NAMESPACE + BINDER_MAX_NAME + 2], const char *ns, const char *name)
{
    if(!binder_name_ok(ns, BINDER_MAX_NAMESPACE) || !binder_name_ok(name, BINDER_MAX_NAME))
        return 0;
    size_t a = strlen(ns), b = strlen(name);
    memcpy(buf, ns, a + 1);
    memcpy(buf + a + 1, name, b + 1);
    return a + 1 + b;
}

static bclaim *claim_find(const binder_index *ix, const char *ns, const char *name)
{
    char key[BINDER_MAX_NAMESPACE + BINDER_MAX_NAME + 2];
    size_t len = claim_key(key, ns, name);
    bclaim *c = NULL;
    if(len)
        HASH_FIND(hh, ix->claims, key, len, c);
    return c;
}

binder_rc binder_claim_upsert(binder_index *ix, const char *ns, const char *name, const char *class_name,
                              uint32_t count, cozy_err *err)
{
    char key[BINDER_MAX_NAMESPACE + BINDER_MAX_NAME + 2];
    size_t len = claim_key(key, ns, name);
    if(!len)
        return fail(err, BINDER_ERR_INPUT, "claim %s/%s: namespace or name empty or too long", ns ? ns : "",
                    name ? name : "");
    if(!binder_name_ok(class_name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "claim %s/%s: spec.class empty or too long", ns, name);
    if(count == 0 || count > BINDER_MAX_UNITS)
        return fail(err, BINDER_ERR_INPUT, "claim %s/%s: spec.count %u is not in 1..%d", ns, name, count,
                    BINDER_MAX_UNITS);
    bclaim *c = NULL;
    HASH_FIND(hh, ix->claims, key, len, c);
    if(c) {
        if(strcmp(c->cls->name, class_name) || c->count != count)
            return fail(err, BINDER_ERR_CHANGED, "claim %s/%s: known as %u of class %s, now %u of class %s", ns,
                        name, c->count, c->cls->name, count, class_name);
        return BINDER_OK;
    }
    bclass *k = binder_class_get(ix, class_name);
    if(!k || !(c = calloc(1, sizeof *c + len + 1)))
        return fail(err, BINDER_ERR_MEMORY, "claim %s/%s: out of memory", ns, name);
    memcpy(c->key, key, len + 1);
    c->keylen = (uint32_t)len;
    c->cls = k;
    c->count = count;
    HASH_ADD_KEYPTR(hh, ix->claims, c->key, c->keylen, c);
    if(!c->hh.tbl) {
        free(c);
        return fail(err, BINDER_ERR_MEMORY, "claim %s/%s: out of memory", ns, name);
    }
    return BINDER_OK;
}

binder_rc binder_claim_tag(binder_index *ix, const char *ns, const char *name, void *tag)
{
    bclaim *c = claim_find(ix, ns, name);
    if(!c)
        return BINDER_ERR_NO_CLAIM;
    c->tag = tag;
    return BINDER_OK;
}

binder_rc binder_claim_delete(binder_index *ix, const char *ns, const char *name)
{
    bclaim *c = claim_find(ix, ns, name);
    if(!c)
        return BINDER_ERR_NO_CLAIM;
    if(c->node)
        slot_place(ix, claim_detach(ix, c));
    HASH_DEL(ix->claims, c);
    free(c);
    return BINDER_OK;
}

binder_rc binder_claim_get(const binder_index *ix, const char *ns, const char *name, binder_claim_view *out)
{
    const bclaim *c = claim_find(ix, ns, name);
    if(!c)
        return BINDER_ERR_NO_CLAIM;
    claim_view(c, out);
    return BINDER_OK;
}

binder_rc binder_bind_set(binder_index *ix, const binder_claim_ref *claims, size_t n, const char *name,
                          uint32_t flags, cozy_err *err)
{
    if(n == 0 || n > BIND_SET_MAX || !claims)
        return fail(err, BINDER_ERR_INPUT, "bind: a set of %zu claims (1..%d)", n, BIND_SET_MAX);
    bnode *nd = binder_node_find(ix, name);
    if(!nd)
        return fail(err, BINDER_ERR_NO_NODE, "bind: node %s is not known", name ? name : "(null)");
    bclaim *c[BIND_SET_MAX];
    struct {
        bclass *cls;
        uint64_t units;
    } need[BINDER_MAX_SET_CLASSES];
    size_t nneed = 0;
    for(size_t i = 0; i < n; i++) {
        if(!(c[i] = claim_find(ix, claims[i].ns, claims[i].name)))
            return fail(err, BINDER_ERR_NO_CLAIM, "bind: claim %s/%s is not known", claims[i].ns ? claims[i].ns : "",
                        claims[i].name ? claims[i].name : "");
        if(c[i]->node)
            return fail(err, BINDER_ERR_BOUND, "bind: claim %s/%s is bound to node %s", claims[i].ns,
                        claims[i].name, c[i]->node->name);
        for(size_t j = 0; j < i; j++)
            if(c[j] == c[i])
                return fail(err, BINDER_ERR_BOUND, "bind: claim %s/%s is named twice in the set", claims[i].ns,
                            claims[i].name);
        size_t k = 0;
        while(k < nneed && need[k].cls != c[i]->cls)
            k++;
        if(k == nneed) {
            if(nneed == BINDER_MAX_SET_CLASSES)
                return fail(err, BINDER_ERR_INPUT, "bind: more than %d classes in one set", BINDER_MAX_SET_CLASSES);
            need[k].cls = c[i]->cls;
            need[k].units = 0;
            nneed++;
        }
        need[k].units += c[i]->count;
    }
    bool missing = false;
    for(size_t k = 0; k < nneed; k++) {
        const slot *s = binder_slot_find(nd, need[k].cls);
        uint32_t fr = s ? binder_slot_free(s) : 0;
        if(s && s->bound + need[k].units > UINT32_MAX / 2)
            return fail(err, BINDER_ERR_INPUT, "bind: node %s: class %s: bound units out of range", nd->name,
                        need[k].cls->name);
        missing |= !s;
        if(!(flags & BINDER_BIND_RESTORE) && fr < need[k].units)
            return fail(err, BINDER_ERR_NO_ROOM, "bind: node %s has %u free units of class %s, the set needs %llu",
                        nd->name, fr, need[k].cls->name, (unsigned long long)need[k].units);
    }
    if(missing) { /* RESTORE onto a class the node does not offer: a slot of 0 units */
        slot *fresh = calloc(nd->nslots + nneed, sizeof *fresh);
        if(!fresh)
            return fail(err, BINDER_ERR_MEMORY, "bind: node %s: out of memory", nd->name);
        uint32_t nf = 0;
        for(uint32_t i = 0; i < nd->nslots; i++)
            fresh[nf++] = (slot){.cls = nd->slots[i].cls, .offered = nd->slots[i].offered,
                                 .bound = nd->slots[i].bound};
        for(size_t k = 0; k < nneed; k++)
            if(!binder_slot_find(nd, need[k].cls))
                fresh[nf++] = (slot){.cls = need[k].cls};
        node_slots_replace(ix, nd, fresh, nf);
    }
    for(size_t i = 0; i < n; i++) {
        slot *s = binder_slot_find(nd, c[i]->cls);
        slot_set(ix, s, s->offered, s->bound + c[i]->count);
        c[i]->node = nd;
        DL_PREPEND(nd->claims, c[i]);
        ix->bound++;
    }
    for(size_t k = 0; k < nneed; k++)
        slot_place(ix, binder_slot_find(nd, need[k].cls));
    return BINDER_OK;
}

binder_rc binder_bind(binder_index *ix, const char *ns, const char *claim, const char *node, uint32_t flags,
                      cozy_err *err)
{
    binder_claim_ref r = {ns, claim};
    return binder_bind_set(ix, &r, 1, node, flags, err);
}

binder_rc binder_unbind(binder_index *ix, const char *ns, const char *name)
{
    bclaim *c = claim_find(ix, ns, name);
    if(!c)
        return BINDER_ERR_NO_CLAIM;
    if(!c->node)
        return BINDER_ERR_NOT_BOUND;
    slot_place(ix, claim_detach(ix, c));
    return BINDER_OK;
}
