/* index.c — the binder's index (index.h; DESIGN.md §6, issue 12).
 *
 * Layout of the data:
 *   - nodes, claims, classes and node shapes in uthash tables (Debian's
 *     uthash-dev, header-only), keyed by name ("ns\0name" for claims);
 *   - a node holds one `slot` per class it offers or holds: units offered,
 *     units bound, and its place in the buckets;
 *   - a node's shape is its GPU taints and the classes it offers, interned;
 *   - a class holds one `pool` per shape offering it (indexed by the
 *     shape's id, and listed in the order made); a pool is an array of
 *     buckets indexed by free units, each two doubly linked lists (utlist)
 *     of slots: nodes already holding units of the class ("part") and
 *     untouched ones ("whole");
 *   - a slot is in exactly the bucket of its free units, in the pool of
 *     its node's shape, when its node is Ready, schedulable and not
 *     layout-pending and it has free units; otherwise in no bucket.
 * Every change (offer, flags, bind, unbind) moves a slot in O(1). Pools are
 * made, with buckets up to the units offered, before anything changes, so
 * moving a slot never allocates and never fails.
 */
#include "binder/index.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* uthash: report a failed allocation instead of exit(): the element is not
 * added and its hh.tbl is NULL, which the callers check. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>
#include <utlist.h>

enum { EFFECT_NO_SCHEDULE = 1, EFFECT_PREFER_NO_SCHEDULE, EFFECT_NO_EXECUTE };

static const char *const effect_names[] = {NULL, "NoSchedule", "PreferNoSchedule", "NoExecute"};

/* the most claims one bind_set takes (a VM names a handful) */
#define BIND_SET_MAX 64

typedef struct ttaint {
    char *key;
    char *value;
    int effect;
} ttaint;

/* A node's shape, interned: its GPU taints (sorted) and the classes it
 * offers (sorted ids). Nodes of one shape share a pool per class, so a
 * query checks tolerations and the set's classes once per pool, never per
 * node. id 0: no taint, no class. */
typedef struct shape {
    char *canon; /* "key\x1fvalue\x1feffect\x1e..." sorted, then "\x1d", then "id," per class */
    uint32_t id;
    uint32_t n;
    ttaint *t;
    uint32_t nclasses;
    uint32_t *classes;
    UT_hash_handle hh;
} shape;

struct slot;

typedef struct bucket {
    struct slot *part;  /* nodes holding units of the class */
    struct slot *whole; /* untouched nodes of the class */
    uint32_t n;
} bucket;

typedef struct pool {
    const shape *sh;
    bucket *b; /* b[free], free 1..nb-1 */
    uint32_t nb;
    uint64_t free_units; /* the free units of the slots listed here, added up */
    uint32_t top;        /* the highest bucket holding a slot, 0 when none */
} pool;

typedef struct bclass {
    char *name;
    uint32_t id;
    pool **pools; /* by shape id; NULL where none */
    uint32_t npools;
    pool **list; /* the pools, in the order they were made */
    uint32_t nlist;
    uint64_t offered, bound; /* over every node's slot of the class */
    UT_hash_handle hh;
} bclass;

struct bnode;

typedef struct slot {
    struct bnode *node;
    bclass *cls;
    uint32_t offered;
    uint32_t bound;
    pool *pool; /* where listed; NULL: in no bucket */
    uint32_t free_at;
    bool whole;
    struct slot *prev, *next;
} slot;

typedef struct bclaim {
    char *key; /* "ns\0name\0" */
    size_t keylen;  /* ns + 1 + name */
    bclass *cls;
    uint32_t count;
    struct bnode *node;
    struct bclaim *prev, *next; /* the node's claims */
    UT_hash_handle hh;
} bclaim;

typedef struct bnode {
    char *name;
    uint32_t flags;
    shape *sh;
    slot *slots;
    uint32_t nslots;
    bclaim *claims;
    UT_hash_handle hh;
} bnode;

struct binder_index {
    bnode *nodes;
    bclaim *claims;
    bclass *classes;
    shape *shapes;
    shape **shape_by_id;
    uint32_t nshapes;
    uint32_t nclasses;
    size_t listed;
    size_t bound;
    size_t overcommit;
};

static const char *const rc_names[BINDER_RC_LAST] = {
    [BINDER_OK] = "ok",
    [BINDER_ERR_INPUT] = "invalid argument",
    [BINDER_ERR_MEMORY] = "out of memory",
    [BINDER_ERR_NO_NODE] = "no such node",
    [BINDER_ERR_NO_CLAIM] = "no such claim",
    [BINDER_ERR_CHANGED] = "claim known with another class or count",
    [BINDER_ERR_BOUND] = "claim already bound",
    [BINDER_ERR_NOT_BOUND] = "claim not bound",
    [BINDER_ERR_NO_ROOM] = "no room on node",
};

const char *binder_strerror(binder_rc rc)
{
    if((int)rc < 0 || rc >= BINDER_RC_LAST)
        return "unknown binder error";
    return rc_names[rc];
}

/* cozy_say's message, and `rc` (the binder's own result codes) */
#define fail(err, rc, ...) (cozy_say((err), __VA_ARGS__), (rc))

static bool name_ok(const char *s, size_t max)
{
    if(!s || !*s)
        return false;
    size_t n = strnlen(s, max + 1);
    return n <= max;
}

/* ---------------------------------------------------------------- shapes */

static int ttaint_cmp(const void *a, const void *b)
{
    const ttaint *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if(c)
        return c;
    if((c = strcmp(x->value, y->value)))
        return c;
    return x->effect - y->effect;
}

static void shape_free(shape *t)
{
    if(!t)
        return;
    for(uint32_t i = 0; i < t->n; i++) {
        free(t->t[i].key);
        free(t->t[i].value);
    }
    free(t->t);
    free(t->classes);
    free(t->canon);
    free(t);
}

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The interned shape of taints `tmp` (n entries, borrowed strings; sorted
 * here, duplicates dropped) and class ids `cls` (nc, distinct; sorted
 * here), made when new. NULL when out of memory. */
static shape *shape_intern(binder_index *ix, ttaint *tmp, uint32_t n, uint32_t *cls, uint32_t nc)
{
    if(n)
        qsort(tmp, n, sizeof *tmp, ttaint_cmp);
    if(nc)
        qsort(cls, nc, sizeof *cls, u32_cmp);
    uint32_t k = 0;
    for(uint32_t i = 0; i < n; i++)
        if(k == 0 || ttaint_cmp(&tmp[k - 1], &tmp[i]))
            tmp[k++] = tmp[i];
    n = k;
    size_t len = 2 + (size_t)nc * 11;
    for(uint32_t i = 0; i < n; i++)
        len += strlen(tmp[i].key) + strlen(tmp[i].value) + 3 + 16;
    char *canon = malloc(len);
    if(!canon)
        return NULL;
    size_t at = 0;
    canon[0] = 0;
    for(uint32_t i = 0; i < n; i++)
        at += (size_t)snprintf(canon + at, len - at, "%s\x1f%s\x1f%s\x1e", tmp[i].key, tmp[i].value,
                               effect_names[tmp[i].effect]);
    at += (size_t)snprintf(canon + at, len - at, "\x1d");
    for(uint32_t i = 0; i < nc; i++)
        at += (size_t)snprintf(canon + at, len - at, "%u,", cls[i]);
    shape *t = NULL;
    HASH_FIND(hh, ix->shapes, canon, at, t);
    if(t) {
        free(canon);
        return t;
    }
    shape **by_id = realloc(ix->shape_by_id, (ix->nshapes + 1) * sizeof *by_id);
    if(!by_id) {
        free(canon);
        return NULL;
    }
    ix->shape_by_id = by_id;
    t = calloc(1, sizeof *t);
    if(!t) {
        free(canon);
        return NULL;
    }
    t->canon = canon;
    t->id = ix->nshapes;
    if(nc) {
        if(!(t->classes = malloc(nc * sizeof *t->classes))) {
            shape_free(t);
            return NULL;
        }
        memcpy(t->classes, cls, nc * sizeof *cls);
        t->nclasses = nc;
    }
    if(n) {
        t->t = calloc(n, sizeof *t->t);
        if(!t->t) {
            shape_free(t);
            return NULL;
        }
        for(uint32_t i = 0; i < n; i++, t->n++) {
            t->t[i].key = strdup(tmp[i].key);
            t->t[i].value = strdup(tmp[i].value);
            t->t[i].effect = tmp[i].effect;
            if(!t->t[i].key || !t->t[i].value) {
                t->n++;
                shape_free(t);
                return NULL;
            }
        }
    }
    HASH_ADD_KEYPTR(hh, ix->shapes, t->canon, at, t);
    if(!t->hh.tbl) {
        shape_free(t);
        return NULL;
    }
    ix->shape_by_id[ix->nshapes++] = t;
    return t;
}

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
    if(tol->effect && *tol->effect && strcmp(tol->effect, effect_names[taint->effect]))
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

static bclass *class_find(const binder_index *ix, const char *name)
{
    bclass *c = NULL;
    HASH_FIND_STR(ix->classes, name, c);
    return c;
}

/* The class `name`, made when new; NULL when out of memory. */
static bclass *class_get(binder_index *ix, const char *name)
{
    bclass *c = class_find(ix, name);
    if(c)
        return c;
    c = calloc(1, sizeof *c);
    if(!c || !(c->name = strdup(name))) {
        free(c);
        return NULL;
    }
    c->id = ix->nclasses;
    HASH_ADD_KEYPTR(hh, ix->classes, c->name, strlen(c->name), c);
    if(!c->hh.tbl) {
        free(c->name);
        free(c);
        return NULL;
    }
    ix->nclasses++;
    return c;
}

/* Makes sure class c has a pool for shape t with buckets up to `units`
 * free. Returns false when out of memory (nothing listed has moved). */
static bool pool_ensure(bclass *c, const shape *t, uint32_t units)
{
    if(t->id >= c->npools) {
        pool **p = realloc(c->pools, (t->id + 1) * sizeof *p);
        if(!p)
            return false;
        for(uint32_t i = c->npools; i <= t->id; i++)
            p[i] = NULL;
        c->pools = p;
        c->npools = t->id + 1;
    }
    pool *p = c->pools[t->id];
    if(!p) {
        pool **list = realloc(c->list, (c->nlist + 1) * sizeof *list);
        if(!list)
            return false;
        c->list = list;
        if(!(p = calloc(1, sizeof *p)))
            return false;
        p->sh = t;
        c->pools[t->id] = p;
        c->list[c->nlist++] = p;
    }
    if(units + 1 > p->nb) {
        /* the lists' heads move with the array: their first element's prev
         * points to the last element, never to the head, so copying heads is safe */
        bucket *b = realloc(p->b, (units + 1) * sizeof *b);
        if(!b)
            return false;
        memset(b + p->nb, 0, (units + 1 - p->nb) * sizeof *b);
        p->b = b;
        p->nb = units + 1;
    }
    return true;
}

/* ----------------------------------------------------------------- slots */

static uint32_t slot_free(const slot *s)
{
    return s->offered > s->bound ? s->offered - s->bound : 0;
}

static bool node_eligible(const bnode *n)
{
    return (n->flags & BINDER_NODE_READY) && (n->flags & BINDER_NODE_SCHEDULABLE) &&
           !(n->flags & BINDER_NODE_LAYOUT_PENDING);
}

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
 * pool exists with enough buckets (pool_ensure ran when the offer was set). */
static void slot_place(binder_index *ix, slot *s)
{
    uint32_t fr = slot_free(s);
    pool *p = NULL;
    if(fr && node_eligible(s->node))
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

static slot *node_slot(const bnode *n, const bclass *c)
{
    for(uint32_t i = 0; i < n->nslots; i++)
        if(n->slots[i].cls == c)
            return &n->slots[i];
    return NULL;
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

/* ----------------------------------------------------------------- index */

binder_index *binder_new(void)
{
    binder_index *ix = calloc(1, sizeof *ix);
    if(!ix)
        return NULL;
    if(!shape_intern(ix, NULL, 0, NULL, 0)) { /* id 0: no taint, no class */
        free(ix);
        return NULL;
    }
    return ix;
}

void binder_free(binder_index *ix)
{
    if(!ix)
        return;
    bnode *n, *ntmp;
    HASH_ITER(hh, ix->nodes, n, ntmp)
    {
        HASH_DEL(ix->nodes, n);
        free(n->slots);
        free(n->name);
        free(n);
    }
    bclaim *c, *ctmp;
    HASH_ITER(hh, ix->claims, c, ctmp)
    {
        HASH_DEL(ix->claims, c);
        free(c->key);
        free(c);
    }
    bclass *k, *ktmp;
    HASH_ITER(hh, ix->classes, k, ktmp)
    {
        HASH_DEL(ix->classes, k);
        for(uint32_t i = 0; i < k->npools; i++) {
            if(k->pools[i])
                free(k->pools[i]->b);
            free(k->pools[i]);
        }
        free(k->pools);
        free(k->list);
        free(k->name);
        free(k);
    }
    shape *t, *ttmp;
    HASH_ITER(hh, ix->shapes, t, ttmp)
    {
        HASH_DEL(ix->shapes, t);
        shape_free(t);
    }
    free(ix->shape_by_id);
    free(ix);
}

void binder_stats_get(const binder_index *ix, binder_stats *out)
{
    memset(out, 0, sizeof *out);
    out->nodes = HASH_COUNT(ix->nodes);
    out->listed = ix->listed;
    out->claims = HASH_COUNT(ix->claims);
    out->bound = ix->bound;
    out->overcommit = ix->overcommit;
    out->classes = ix->nclasses;
    out->shapes = ix->nshapes;
}

/* ----------------------------------------------------------------- nodes */

static bnode *node_find(const binder_index *ix, const char *name)
{
    bnode *n = NULL;
    if(name)
        HASH_FIND_STR(ix->nodes, name, n);
    return n;
}

static int effect_of(const char *s)
{
    for(int e = EFFECT_NO_SCHEDULE; e <= EFFECT_NO_EXECUTE; e++)
        if(s && !strcmp(s, effect_names[e]))
            return e;
    return 0;
}

binder_rc binder_node_upsert(binder_index *ix, const char *name, const binder_node_spec *spec, size_t *overcommitted,
                             cozy_err *err)
{
    if(overcommitted)
        *overcommitted = 0;
    if(!name_ok(name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "node name: empty or longer than %d", BINDER_MAX_NAME);
    if(!spec)
        return fail(err, BINDER_ERR_INPUT, "node %s: no spec", name);
    if((spec->n_offers && !spec->offers) || (spec->n_taints && !spec->taints))
        return fail(err, BINDER_ERR_INPUT, "node %s: offers or taints missing", name);
    if(spec->flags & ~(BINDER_NODE_READY | BINDER_NODE_SCHEDULABLE | BINDER_NODE_LAYOUT_PENDING))
        return fail(err, BINDER_ERR_INPUT, "node %s: unknown flags 0x%x", name, spec->flags);
    for(size_t i = 0; i < spec->n_offers; i++) {
        const binder_offer *o = &spec->offers[i];
        if(!name_ok(o->class_name, BINDER_MAX_NAME))
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
        if(!name_ok(t->key, BINDER_MAX_TAINT_KEY) || strnlen(t->value ? t->value : "", BINDER_MAX_TAINT_VALUE + 1) >
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
    bnode *n = node_find(ix, name);
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
        bclass *c = class_get(ix, spec->offers[i].class_name);
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
    if(!(sh = shape_intern(ix, tmp, nt, cls, nc)))
        goto oom;
    for(uint32_t k = 0; k < nf; k++)
        if(fresh[k].offered && !pool_ensure(fresh[k].cls, sh, fresh[k].offered))
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
    bnode *n = node_find(ix, name);
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
}

/* Takes claim c off its node; the slot is moved by the caller. */
static slot *claim_detach(binder_index *ix, bclaim *c)
{
    bnode *n = c->node;
    slot *s = node_slot(n, c->cls);
    slot_set(ix, s, s->offered, s->bound - c->count);
    DL_DELETE(n->claims, c);
    c->prev = c->next = NULL;
    c->node = NULL;
    ix->bound--;
    return s;
}

binder_rc binder_node_delete(binder_index *ix, const char *name, binder_claim_fn fn, void *ud)
{
    bnode *n = node_find(ix, name);
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
    const bnode *n = node_find(ix, name);
    if(!n)
        return BINDER_ERR_NO_NODE;
    *flags = n->flags;
    return BINDER_OK;
}

binder_rc binder_node_slot(const binder_index *ix, const char *name, const char *class_name, binder_slot_view *out)
{
    const bnode *n = node_find(ix, name);
    if(!n)
        return BINDER_ERR_NO_NODE;
    const bclass *c = class_name ? class_find(ix, class_name) : NULL;
    const slot *s = c ? node_slot(n, c) : NULL;
    out->offered = s ? s->offered : 0;
    out->bound = s ? s->bound : 0;
    return BINDER_OK;
}

binder_rc binder_node_claims(const binder_index *ix, const char *name, binder_claim_fn fn, void *ud)
{
    const bnode *n = node_find(ix, name);
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
    if(!name_ok(ns, BINDER_MAX_NAMESPACE) || !name_ok(name, BINDER_MAX_NAME))
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
    if(!name_ok(class_name, BINDER_MAX_NAME))
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
    bclass *k = class_get(ix, class_name);
    if(!k || !(c = calloc(1, sizeof *c)) || !(c->key = malloc(len + 1))) {
        free(c);
        return fail(err, BINDER_ERR_MEMORY, "claim %s/%s: out of memory", ns, name);
    }
    memcpy(c->key, key, len + 1);
    c->keylen = len;
    c->cls = k;
    c->count = count;
    HASH_ADD_KEYPTR(hh, ix->claims, c->key, c->keylen, c);
    if(!c->hh.tbl) {
        free(c->key);
        free(c);
        return fail(err, BINDER_ERR_MEMORY, "claim %s/%s: out of memory", ns, name);
    }
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
    free(c->key);
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
    bnode *nd = node_find(ix, name);
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
        const slot *s = node_slot(nd, need[k].cls);
        uint32_t fr = s ? slot_free(s) : 0;
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
            if(!node_slot(nd, need[k].cls))
                fresh[nf++] = (slot){.cls = need[k].cls};
        node_slots_replace(ix, nd, fresh, nf);
    }
    for(size_t i = 0; i < n; i++) {
        slot *s = node_slot(nd, c[i]->cls);
        slot_set(ix, s, s->offered, s->bound + c[i]->count);
        c[i]->node = nd;
        DL_PREPEND(nd->claims, c[i]);
        ix->bound++;
    }
    for(size_t k = 0; k < nneed; k++)
        slot_place(ix, node_slot(nd, need[k].cls));
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

/* --------------------------------------------------------------- classes */

binder_rc binder_class_units_get(const binder_index *ix, const char *class_name, const binder_toleration *tol,
                                 size_t ntol, binder_class_units *out)
{
    memset(out, 0, sizeof *out);
    if(!class_name || !*class_name)
        return BINDER_ERR_INPUT;
    const bclass *c = class_find(ix, class_name);
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
        if(!name_ok(w->class_name, BINDER_MAX_NAME) || w->units == 0 || w->units > BINDER_MAX_UNITS)
            return BINDER_ERR_INPUT;
        const bclass *c = class_find(ix, w->class_name);
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
    const bnode *n = node_find(ix, name);
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
        const slot *o = node_slot(n, need[k].cls);
        if(!o || slot_free(o) < need[k].units)
            return BINDER_OK;
        cand.free += slot_free(o);
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
                    binder_candidate cand = {s->node->name, slot_free(s), s->bound, s->offered};
                    bool fits = true;
                    for(size_t k = 0; k < nneed && fits; k++) {
                        if(k == drive)
                            continue;
                        const slot *o = node_slot(s->node, need[k].cls);
                        fits = o && slot_free(o) >= need[k].units;
                        if(fits) {
                            cand.free += slot_free(o);
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
            bool want = slot_free(s) && node_eligible(n);
            if(want != (s->pool != NULL))
                return fail(err, BINDER_ERR_INPUT, "node %s: class %s is %slisted", n->name, s->cls->name,
                            s->pool ? "" : "not ");
            if(s->pool) {
                listed++;
                if(s->pool != s->cls->pools[n->sh->id] || s->free_at != slot_free(s) || s->whole != (s->bound == 0))
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
            if(!node_slot(n, c->cls))
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
            const slot *s = node_slot(n, k);
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
