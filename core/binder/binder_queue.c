/* binder_queue.c — what the next pass looks at: the dirty list of
 * claims (binder_i_mark), the room gained on a usable node, by class and
 * node (binder_i_gain), and the waiting claims in a bucket per class
 * (binder_i_wait_update, after each pass), so that a gain retries only the
 * sets waiting on that class (docs/decisions/0023-incremental-reconcile.md;
 * binder_pass.c says how a pass uses them, binder.h what each rule is and
 * where it comes from: DESIGN.md §6, decision 0020).
 */
#include "binder/binder_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------- dirty and waiting */

void binder_i_mark(binder_state *st, sm_claim *c)
{
    if(c && !c->dirty) {
        c->dirty = 1;
        DL_APPEND2(st->dirty, c, dprev, dnext);
    }
}

void binder_i_mark_set(binder_state *st, sm_set *s)
{
    for(size_t i = 0; s && i < s->n; i++)
        binder_i_mark(st, s->claims[i]);
}

/* Past this many gains since the pass began, a gain is kept by class
 * only (node NULL: anywhere), so that many nodes given at once (a
 * leader's start, a zone back) cost a short list, not one entry each; a
 * pass then retries those classes' waiting sets as decision 0023 did. */
#define MAX_GAIN_NODES 64

void binder_i_gain(binder_state *st, const char *cls, const char *node)
{
    if(st->n_gained - st->gained_floor >= MAX_GAIN_NODES)
        node = NULL;
    for(size_t i = st->gained_floor; i < st->n_gained; i++)
        if(!strcmp(st->gained[i].cls, cls) &&
           (node ? st->gained[i].node && !strcmp(st->gained[i].node, node) : !st->gained[i].node))
            return;
    if(st->n_gained == st->cap_gained) {
        size_t cap = st->cap_gained ? st->cap_gained * 2 : 16;
        gain *g = realloc(st->gained, cap * sizeof *g);
        if(!g) {
            st->full = 1;
            return;
        }
        st->gained = g;
        st->cap_gained = cap;
    }
    gain g = {strdup(cls), node ? strdup(node) : NULL};
    if(!g.cls || (node && !g.node)) {
        free(g.cls);
        free(g.node);
        st->full = 1;
        return;
    }
    st->gained[st->n_gained++] = g;
}

void binder_i_gain_node(binder_state *st, const sm_node *n)
{
    if(!binder_i_node_usable(n))
        return;
    for(size_t i = 0; i < n->n_offers; i++)
        binder_i_gain(st, n->offers[i].class_name, n->name);
}

void binder_i_wait_remove(binder_state *st, sm_claim *c)
{
    (void)st;
    if(c->wb) {
        DL_DELETE2(c->wb->head, c, wprev, wnext);
        c->wb = NULL;
    }
}

/* Puts c in the waiting bucket it belongs in after a pass, or none. */
void binder_i_wait_update(binder_state *st, sm_claim *c)
{
    /* a claim waiting for its VMI to end waits on the VMI (its set is
     * marked when that changes), not on room */
    int waiting = c->vol || (c->reason != BINDER_R_PLACED && c->reason != BINDER_R_ATTACHED &&
                             c->reason != BINDER_R_WAITING_FOR_VMI_END);
    const char *cls = c->vol || c->reason == BINDER_R_OVER_BUDGET ? "" : c->class_name;
    if(c->wb && (!waiting || strcmp(c->wb->cls, cls)))
        binder_i_wait_remove(st, c);
    if(!waiting || c->wb)
        return;
    wbucket *b = NULL;
    HASH_FIND_STR(st->waits, cls, b);
    if(!b) {
        b = calloc(1, sizeof *b);
        if(!b || !(b->cls = strdup(cls))) {
            free(b);
            st->full = 1; /* out of memory: the next pass looks at everything */
            return;
        }
        HASH_ADD_KEYPTR(hh, st->waits, b->cls, strlen(b->cls), b);
        if(!b->hh.tbl) {
            free(b->cls);
            free(b);
            st->full = 1;
            return;
        }
    }
    DL_APPEND2(b->head, c, wprev, wnext);
    c->wb = b;
}

/* The claims booked on node `name`, for marking (index walk: O(claims there)). */
typedef struct mark_walk {
    binder_state *st;
} mark_walk;

static void mark_booked(void *ud, const binder_claim_view *v)
{
    mark_walk *w = ud;
    binder_i_mark(w->st, v->tag ? v->tag : binder_i_claim_find(w->st, v->ns, v->name));
}

void binder_i_mark_node(binder_state *st, const char *name)
{
    mark_walk w = {st};
    binder_node_claims(st->ix, name, mark_booked, &w);
}

/* A node arrives or turns Ready: the sets whose VMI is scheduled or runs
 * there are looked at, so that claims released when the node was deleted
 * go back to Attached on it (upkeep). Their claims are not booked on the
 * node, so binder_i_mark_node does not reach them. O(sets on the node):
 * st->on_node lists them by node. */
void binder_i_mark_sets_on(binder_state *st, const char *name)
{
    onode *o;
    HASH_FIND_STR(st->on_node, name, o);
    sm_set *s;
    if(o)
        DL_FOREACH2(o->head, s, onext)
        {
            if(s->phase == BINDER_VMI_SCHEDULED || s->phase == BINDER_VMI_RUNNING)
                binder_i_mark_set(st, s);
        }
}
