/* index_internal.h — shared between index.c, index_nodes.c and
 * index_query.c only.
 *
 * Not a public interface: the index's data (its layout is in index.c's top
 * comment), the small helpers every part reads it with, and the calls one
 * part makes into another (index_nodes.c interns shapes and makes classes
 * and pools with index.c; index_query.c finds nodes with index_nodes.c).
 */
#ifndef COZYGPU_BINDER_INDEX_INTERNAL_H
#define COZYGPU_BINDER_INDEX_INTERNAL_H

#include "binder/index.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* uthash: report a failed allocation instead of exit(): the element is not
 * added and its hh.tbl is NULL, which the callers check. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>
#include <utlist.h>

enum { EFFECT_NO_SCHEDULE = 1, EFFECT_PREFER_NO_SCHEDULE, EFFECT_NO_EXECUTE };

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
    bclass *cls;
    struct bnode *node;
    struct bclaim *prev, *next; /* the node's claims */
    void *tag; /* the caller's (binder_claim_tag) */
    uint32_t count;
    uint32_t keylen;  /* ns + 1 + name */
    UT_hash_handle hh;
    char key[]; /* "ns\0name\0", in the same allocation */
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

/* Names of a taint's effects, by EFFECT_* (index.c); [0] is NULL. */
extern const char *const binder_effect_names[];

/* cozy_say's message, and `rc` (the binder's own result codes) */
#define fail(err, rc, ...) (cozy_say((err), __VA_ARGS__), (rc))

/* s is a non-empty name of at most max bytes. */
static inline bool binder_name_ok(const char *s, size_t max)
{
    if(!s || !*s)
        return false;
    size_t n = strnlen(s, max + 1);
    return n <= max;
}

/* The free units of slot s (0 when overcommitted). */
static inline uint32_t binder_slot_free(const slot *s)
{
    return s->offered > s->bound ? s->offered - s->bound : 0;
}

/* Node n's slots may be listed: Ready, schedulable, not layout-pending. */
static inline bool binder_node_eligible(const bnode *n)
{
    return (n->flags & BINDER_NODE_READY) && (n->flags & BINDER_NODE_SCHEDULABLE) &&
           !(n->flags & BINDER_NODE_LAYOUT_PENDING);
}

/* Node n's slot of class c, or NULL. */
static inline slot *binder_slot_find(const bnode *n, const bclass *c)
{
    for(uint32_t i = 0; i < n->nslots; i++)
        if(n->slots[i].cls == c)
            return &n->slots[i];
    return NULL;
}

/* --- index.c: shapes, classes, pools ----------------------------------- */

/* The interned shape of taints `tmp` (n entries, borrowed strings; sorted
 * here, duplicates dropped) and class ids `cls` (nc, distinct; sorted
 * here), made when new. NULL when out of memory. */
shape *binder_shape_intern(binder_index *ix, ttaint *tmp, uint32_t n, uint32_t *cls, uint32_t nc);

/* The class `name`, or NULL when the index does not know it. */
bclass *binder_class_find(const binder_index *ix, const char *name);

/* The class `name`, made when new; NULL when out of memory. */
bclass *binder_class_get(binder_index *ix, const char *name);

/* Makes sure class c has a pool for shape t with buckets up to `units`
 * free. Returns false when out of memory (nothing listed has moved). */
bool binder_pool_ensure(bclass *c, const shape *t, uint32_t units);

/* --- index_nodes.c ------------------------------------------------------ */

/* The node `name` (NULL allowed), or NULL when the index does not know it. */
bnode *binder_node_find(const binder_index *ix, const char *name);

#endif
