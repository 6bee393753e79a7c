/* index.c — the binder's index (index.h; DESIGN.md §6).
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
 *
 * This file holds the rules above that are about shapes, classes and pools:
 * interning shapes, making classes and their pools (with their buckets),
 * and the index's lifetime and counters. Slots, nodes, claims and binding
 * are in index_nodes.c, the queries and the check of every rule above in
 * index_query.c, the types they share in index_internal.h.
 */
#include "binder/index.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binder/index_internal.h"

/* Names of a taint's effects, by EFFECT_* (index_internal.h). */
const char *const binder_effect_names[] = {NULL, "NoSchedule", "PreferNoSchedule", "NoExecute"};

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
shape *binder_shape_intern(binder_index *ix, ttaint *tmp, uint32_t n, uint32_t *cls, uint32_t nc)
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
                               binder_effect_names[tmp[i].effect]);
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

/* --------------------------------------------------------------- classes */

bclass *binder_class_find(const binder_index *ix, const char *name)
{
    bclass *c = NULL;
    HASH_FIND_STR(ix->classes, name, c);
    return c;
}

/* The class `name`, made when new; NULL when out of memory. */
bclass *binder_class_get(binder_index *ix, const char *name)
{
    bclass *c = binder_class_find(ix, name);
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
bool binder_pool_ensure(bclass *c, const shape *t, uint32_t units)
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

/* ----------------------------------------------------------------- index */

binder_index *binder_new(void)
{
    binder_index *ix = calloc(1, sizeof *ix);
    if(!ix)
        return NULL;
    if(!binder_shape_intern(ix, NULL, 0, NULL, 0)) { /* id 0: no taint, no class */
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
