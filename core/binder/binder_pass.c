/* binder_pass.c — the binder's pass: status upkeep, the groups a pass
 * takes, moves and placement, binder_reconcile and binder_reconcile_all
 * (binder.h lists the steps and says what each rule is and where it comes
 * from: DESIGN.md §6, docs/decisions/0020-claim-lifecycle-and-binding.md,
 * 0021, 0023, 0026). Choosing a node is binder_choose.c.
 *
 * binder_reconcile is incremental (binder.h says what it looks at): the
 * inputs mark claims on a dirty list (`binder_i_mark`), room gained on a
 * usable node is listed by class and node (`binder_i_gain`), and waiting
 * claims sit in a bucket per class (`binder_i_wait_update`, after each
 * pass) so that a gain retries only the sets waiting on that class
 * (binder_queue.c), those that wait for room only checked against the
 * nodes that gained (binder_lazy.c, decision 0042). A pass (`run_pass`)
 * takes its groups, widens them (over-committed nodes, gains, sets
 * waiting on a hook) and runs the same steps as the full pass
 * (binder_reconcile_all) on them, in the same order; a group left out is
 * one whose full-pass steps would change nothing (the random run in
 * spec/core/binder_rules_check.c checks that against a twin driven by full
 * passes after every step).
 */
#include "binder/binder_internal.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------- reconcile */

/* Sets a claim's status, emitting an event when phase, node or reason
 * changed. `node` may alias c->node. */
static void set_status(pass *p, sm_claim *c, binder_phase phase, const char *node, binder_reason reason,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void set_status(pass *p, sm_claim *c, binder_phase phase, const char *node, binder_reason reason,
                       const char *fmt, ...)
{
    char msg[MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int changed = c->phase != phase || !binder_i_same(c->node, node) || c->reason != reason;
    int new_msg = strcmp(c->msg ? c->msg : "", msg) != 0;
    if(changed || new_msg)
        binder_i_mark(p->st, c); /* what changed is looked at again by the next pass */
    /* out of memory for the message: the status changes all the same
     * (the index may hold the claim already), its message left empty */
    char *msg_copy = new_msg && msg[0] ? strdup(msg) : NULL;
    char *old_node = NULL; /* kept until the event is delivered */
    binder_phase old_phase = c->phase;
    int moved = !binder_i_same(c->node, node);
    if(moved) {
        char *copy = binder_i_dup_or_null(node);
        if(node && !copy) {
            free(msg_copy);
            return; /* out of memory: the claim keeps its status; the next pass retries */
        }
        old_node = c->node;
        c->node = copy;
    }
    binder_i_tally(p->st, c, -1);
    c->phase = phase;
    binder_i_tally(p->st, c, +1);
    c->reason = reason;
    if(new_msg) {
        free(c->msg);
        c->msg = msg_copy;
    }
    if(phase != BINDER_ATTACHED) {
        free(c->attached_to);
        c->attached_to = NULL;
    }
    if(changed) {
        p->events++;
        if(p->h && p->h->event) {
            binder_event ev = {c->ns, c->name, old_phase, phase, moved ? old_node : c->node, c->node, reason,
                              c->msg ? c->msg : ""};
            p->h->event(p->h->ud, &ev);
        }
    }
    free(old_node);
}

/* The node the index books the claim on (NULL: none). */
const char *binder_i_booked(const binder_state *st, const sm_claim *c)
{
    binder_claim_view v;
    if(!c->node)
        return NULL; /* booked claims have a node (binder_state_verify) */
    if(binder_claim_get(st->ix, c->ns, c->name, &v))
        return NULL;
    return v.node;
}

/* Releases a booked claim's units; a usable node's room is a gain. */
static void unbind_claim(binder_state *st, const sm_claim *c)
{
    const char *at = binder_i_booked(st, c);
    if(!at)
        return;
    const sm_node *n = binder_i_node_find(st, at);
    if(binder_i_node_usable(n))
        binder_i_gain(st, c->class_name, n->name);
    binder_unbind(st->ix, c->ns, c->name);
}

binder_vmi_phase binder_i_vmi_of(const sm_claim *c)
{
    return c->set ? c->set->phase : BINDER_VMI_NONE;
}

int binder_i_vmi_live(binder_vmi_phase ph)
{
    return ph == BINDER_VMI_SCHEDULED || ph == BINDER_VMI_RUNNING;
}

int binder_i_node_usable(const sm_node *n)
{
    if(!n)
        return 0;
    return n && (n->flags & BINDER_NODE_READY) && (n->flags & BINDER_NODE_SCHEDULABLE) &&
           !(n->flags & BINDER_NODE_LAYOUT_PENDING);
}

/* Step 1: attach, detach, NotReady, node gone while attached. */
static void upkeep(pass *p, sm_claim *c)
{
    binder_state *st = p->st;
    binder_vmi_phase vp = binder_i_vmi_of(c);
    sm_node *n = binder_i_node_find(st, c->node);
    int ready = n && (n->flags & BINDER_NODE_READY);
    const char *vmi = c->set ? c->set->name : NULL;

    switch(c->phase) {
    case BINDER_BOUND:
        if(vp == BINDER_VMI_RUNNING && ready && binder_i_same(c->set->node, c->node)) {
            set_status(p, c, BINDER_ATTACHED, c->node, BINDER_R_ATTACHED, "attached to VMI %s on node %s", vmi,
                       c->node);
            if(!c->attached_to)
                c->attached_to = strdup(vmi);
        }
        break;
    case BINDER_ATTACHED:
        if(!binder_i_vmi_live(vp)) { /* DESIGN §6: leaves Attached only when its VMI is final or removed */
            /* the VMI's name: the one it was attached to (its set may be
             * gone with its VM) */
            const char *was = c->attached_to ? c->attached_to : vmi ? vmi : "?";
            if(n)
                set_status(p, c, BINDER_BOUND, c->node, BINDER_R_PLACED,
                           "VMI %s is no longer running; the claim keeps node %s", was, c->node);
            else
                set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                           "VMI %s is no longer running and node %s is gone; waiting for a node with room", was,
                           c->node);
        } else if(!n)
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_WAITING_FOR_VMI_END,
                       "node %s is gone; waiting for VMI %s to end before placing the claim again", c->node, vmi);
        else if(!ready)
            set_status(p, c, BINDER_LOST, c->node, BINDER_R_WAITING_FOR_VMI_END,
                       "node %s is NotReady; waiting for VMI %s to end (or the node to return)", c->node, vmi);
        break;
    case BINDER_LOST:
        if(c->reason != BINDER_R_WAITING_FOR_VMI_END)
            break;
        if(!binder_i_vmi_live(vp)) {
            unbind_claim(st, c);
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                       "its VMI ended and its node was lost; waiting for a node with room");
        } else if(!n && c->node) {
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_WAITING_FOR_VMI_END,
                       "node %s is gone; waiting for VMI %s to end before placing the claim again", c->node, vmi);
        } else if(n && ready && vp == BINDER_VMI_RUNNING && binder_i_same(c->set->node, c->node)) {
            set_status(p, c, BINDER_ATTACHED, c->node, BINDER_R_ATTACHED, "node %s is back; attached to VMI %s",
                       c->node, vmi);
            if(!c->attached_to)
                c->attached_to = strdup(vmi);
        } else if(!c->node && vp == BINDER_VMI_RUNNING && c->set->node) {
            /* its node was deleted and is registered again while the VMI
             * still runs there: the VMI holds those units, so they are
             * booked again (past what the node offers if others took them:
             * the unattached ones then move, step 2) and it is Attached */
            sm_node *vn = binder_i_node_find(st, c->set->node);
            if(vn && (vn->flags & BINDER_NODE_READY) &&
               binder_bind(st->ix, c->ns, c->name, c->set->node, BINDER_BIND_RESTORE, NULL) == BINDER_OK) {
                set_status(p, c, BINDER_ATTACHED, c->set->node, BINDER_R_ATTACHED,
                           "node %s is back; attached to VMI %s", c->set->node, vmi);
                if(!c->attached_to)
                    c->attached_to = strdup(vmi);
            }
        }
        break;
    default: break;
    }
}

void binder_i_group_of_set(group *g, sm_set *s)
{
    g->set = s;
    g->n = s->n < BINDER_MAX_SET_CLAIMS ? s->n : BINDER_MAX_SET_CLAIMS;
    g->m = s->claims;
}

void binder_i_group_of_claim(group *g, sm_claim *c)
{
    g->set = NULL;
    g->n = 1;
    g->m = &c->self;
}

/* g waits on a hook's answer: retried by every pass (binder_i_wait_update). */
static void group_vol(const group *g)
{
    for(size_t i = 0; i < g->n; i++)
        g->m[i]->vol = 1;
}

enum move_cause { MOVE_NONE = 0, MOVE_GONE, MOVE_LAYOUT, MOVE_CAPACITY, MOVE_CORDON, MOVE_NOT_READY };

static int is_bound(const sm_claim *c)
{
    return c->phase == BINDER_BOUND;
}

/* Step 2 for one group whose members are Bound on `node` (the first
 * Bound member's). */
static void move_group(pass *p, group *g, enum move_cause cause)
{
    binder_state *st = p->st;
    sm_claim *first = NULL;
    for(size_t i = 0; i < g->n; i++)
        if(is_bound(g->m[i])) {
            first = g->m[i];
            break;
        }
    if(!first)
        return;
    char from[BINDER_MAX_NAME + 1];
    snprintf(from, sizeof from, "%s", first->node);
    binder_vmi_phase vp = g->set ? g->set->phase : BINDER_VMI_NONE;
    if(binder_i_vmi_live(vp)) {
        /* scheduled: it runs there or fails (a running one has Attached
         * claims); on a deleted node it can only fail: wait for its end */
        if(cause == MOVE_GONE)
            for(size_t i = 0; i < g->n; i++)
                if(is_bound(g->m[i]))
                    set_status(p, g->m[i], BINDER_LOST, NULL, BINDER_R_WAITING_FOR_VMI_END,
                               "node %s was deleted; waiting for VMI %s to end before placing the claim again", from,
                               g->set->name);
        return;
    }
    static const char *const why[] = {"", "node deleted", "layout change pending", "node lost the capacity",
                                      "node cordoned, onCordon Move", "node NotReady while its VMI waits"};
    needs nd;
    if(binder_i_needs_of(st, g, is_bound, &nd))
        return;
    const char *to = binder_i_choose(p, g, &nd);
    if(p->refused)
        group_vol(g);
    if(to && !strcmp(to, from))
        to = NULL;
    /* DESIGN §6: a set that must move while its VMI exists but is not yet
     * scheduled has that VMI deleted, so the set becomes unattached and
     * moves (its launcher pod was pinned to the old node). Asked only when
     * the set does leave the node: to a new one, or Lost because the node
     * is gone or lost the capacity; a set that keeps its hold (cordon or
     * layout with no room elsewhere) keeps its VMI waiting too. */
    if(vp == BINDER_VMI_PENDING && (to || cause == MOVE_GONE || cause == MOVE_CAPACITY) && p->h && p->h->delete_vmi)
        p->h->delete_vmi(p->h->ud, g->set->ns, g->set->name, why[cause]);
    if(to) {
        char tocopy[BINDER_MAX_NAME + 1];
        snprintf(tocopy, sizeof tocopy, "%s", to);
        /* keep the hold: the target was a candidate with room for the whole
         * set, so the bind cannot fail for room; release, bind, and on any
         * failure book the old node again (RESTORE) before anything else runs */
        for(size_t i = 0; i < g->n; i++)
            if(is_bound(g->m[i]))
                unbind_claim(st, g->m[i]);
        if(binder_i_bind_group(st, g, is_bound, tocopy, 0) == BINDER_OK) {
            for(size_t i = 0; i < g->n; i++)
                if(is_bound(g->m[i]))
                    set_status(p, g->m[i], BINDER_BOUND, tocopy, BINDER_R_PLACED, "moved from node %s (%s) to node %s",
                               from, why[cause], tocopy);
            return;
        }
        if(cause != MOVE_GONE)
            binder_i_bind_group(st, g, is_bound, from, BINDER_BIND_RESTORE);
    }
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(!is_bound(c))
            continue;
        switch(cause) {
        case MOVE_GONE:
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                       "node %s was deleted and no other node has room; waiting for room", from);
            break;
        case MOVE_CAPACITY:
            unbind_claim(st, c);
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                       "node %s lost the capacity of class %s and no other node has room; waiting for room", from,
                       c->class_name);
            break;
        case MOVE_LAYOUT:
            set_status(p, c, BINDER_BOUND, c->node, BINDER_R_LAYOUT_CHANGE_PENDING,
                       "node %s has a layout change pending and no other node has room; the claim keeps its hold",
                       from);
            break;
        case MOVE_NOT_READY:
            set_status(p, c, BINDER_BOUND, c->node, BINDER_R_NODE_LOST,
                       "node %s is NotReady and no other node has room; the claim keeps its hold there", from);
            break;
        default:
            set_status(p, c, BINDER_BOUND, c->node, BINDER_R_NODE_CORDONED,
                       "node %s is cordoned (onCordon: Move) and no other node has room yet; the claim keeps its "
                       "hold there",
                       from);
            break;
        }
    }
}

/* A group's place in line: its oldest claim's creation. */
static uint64_t group_seq(const group *g)
{
    uint64_t s = UINT64_MAX;
    for(size_t i = 0; i < g->n; i++)
        if(g->m[i]->seq < s)
            s = g->m[i]->seq;
    return s;
}

static int group_cmp(const void *a, const void *b)
{
    uint64_t sx = group_seq(a), sy = group_seq(b);
    return sx < sy ? -1 : sx > sy;
}

/* The groups a pass looks at: a growing array, each set or lone claim
 * once (stamps of the pass). */
typedef struct glist {
    group *g;
    size_t n, cap;
    int oom;
} glist;

/* Adds c's group (its set's, or c alone) unless the pass has it. */
static void gl_add(binder_state *st, glist *gl, sm_claim *c)
{
    if(c->set ? c->set->stamp == st->stamp : c->stamp == st->stamp)
        return;
    if(gl->n == gl->cap) {
        size_t cap = gl->cap ? gl->cap * 2 : 64;
        group *g = realloc(gl->g, cap * sizeof *g);
        if(!g) {
            gl->oom = 1;
            return;
        }
        gl->g = g;
        gl->cap = cap;
    }
    if(c->set) {
        c->set->stamp = st->stamp;
        binder_i_group_of_set(&gl->g[gl->n++], c->set);
    } else {
        c->stamp = st->stamp;
        binder_i_group_of_claim(&gl->g[gl->n++], c);
    }
}

static int claim_seq_cmp(const void *a, const void *b)
{
    const sm_claim *x = *(sm_claim *const *)a, *y = *(sm_claim *const *)b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void binder_i_cap_collect(void *ud, const binder_claim_view *v)
{
    cap_walk *w = ud;
    if(w->n < sizeof w->list / sizeof *w->list) {
        sm_claim *c = v->tag ? v->tag : binder_i_claim_find(w->st, v->ns, v->name);
        if(c)
            w->list[w->n++] = c;
    }
}

/* Whether c is among g's members (a set past BINDER_MAX_SET_CLAIMS is cut
 * in its group). */
static int in_group(const group *g, const sm_claim *c)
{
    for(size_t m = 0; m < g->n; m++)
        if(g->m[m] == c)
            return 1;
    return 0;
}

int binder_i_movable(const sm_claim *c)
{
    return c->phase == BINDER_BOUND && !binder_i_vmi_live(binder_i_vmi_of(c));
}

/* Capacity drops: per node, per class bound above offered, mark the most
 * recently bound movable claims' groups until the class fits. */
static void mark_capacity(binder_state *st, group *gs, sm_node *const *nodes, size_t nn, enum move_cause *causes)
{
    for(size_t ni = 0; ni < nn; ni++) {
        const sm_node *n = nodes[ni];
        cap_walk w = {st, n->name, {0}, 0};
        binder_node_claims(st->ix, n->name, binder_i_cap_collect, &w);
        for(size_t i = 0; i < w.n; i++) {
            sm_claim *c = w.list[i];
            binder_slot_view sl;
            if(binder_node_slot(st->ix, n->name, c->class_name, &sl) || sl.bound <= sl.offered)
                continue;
            /* the class is over: count what the groups already marked free */
            uint32_t leaving = 0;
            for(size_t k = 0; k < w.n; k++) {
                sm_claim *o = w.list[k];
                if(strcmp(o->class_name, c->class_name))
                    continue;
                if(causes[o->gi] == MOVE_CAPACITY && in_group(&gs[o->gi], o))
                    leaving += o->count;
            }
            if(sl.bound - leaving <= sl.offered || !binder_i_movable(c))
                continue;
            if(in_group(&gs[c->gi], c) && causes[c->gi] != MOVE_GONE)
                causes[c->gi] = MOVE_CAPACITY; /* stronger than a pending layout: no hold past the offer */
        }
    }
}

int binder_i_unplaced(const sm_claim *c)
{
    return c->phase == BINDER_PENDING || (c->phase == BINDER_LOST && !c->node && c->reason != BINDER_R_WAITING_FOR_VMI_END);
}

static int is_pending(const sm_claim *c)
{
    return c->phase == BINDER_PENDING;
}

/* Leaves every unplaced member of g waiting with `reason`. */
static void wait_group(pass *p, group *g, binder_reason reason, const char *msg)
{
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(!binder_i_unplaced(c))
            continue;
        binder_reason r = reason;
        if(c->phase == BINDER_LOST && (r == BINDER_R_NO_NODE_WITH_ROOM || r == BINDER_R_OVER_BUDGET))
            r = BINDER_R_NODE_LOST; /* a Lost claim never fails a budget check; it waits for room */
        set_status(p, c, c->phase, NULL, r, "%s", msg);
    }
}

/* Step 3 for one group with unplaced members. */
void binder_i_place_group(pass *p, group *g)
{
    binder_state *st = p->st;
    char msg[MSG_MAX];
    const char *anchor = NULL;
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(c->phase == BINDER_LOST && c->reason == BINDER_R_WAITING_FOR_VMI_END) {
            /* its VMI still holds the set: the others wait with it */
            snprintf(msg, sizeof msg, "claim %s of the same VM waits for VMI %s to end; this one waits with it",
                     c->name, g->set ? g->set->name : "");
            wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, msg);
            return;
        }
        if((c->phase == BINDER_BOUND || c->phase == BINDER_ATTACHED) && !anchor)
            anchor = c->node;
    }
    /* classes: a missing class blocks the set; a class being deleted blocks
     * a Pending claim only (DESIGN §6: it keeps serving Lost ones) */
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(!binder_i_unplaced(c))
            continue;
        const sm_class *cl = binder_i_class_find(st, c->class_name);
        if(!cl || (cl->deleting && c->phase == BINDER_PENDING)) {
            binder_reason r = cl ? BINDER_R_CLASS_BEING_DELETED : BINDER_R_CLASS_NOT_FOUND;
            snprintf(msg, sizeof msg, cl ? "class %s is being deleted; claim %s waits" : "class %s not found (claim %s)",
                     c->class_name, c->name);
            for(size_t k = 0; k < g->n; k++)
                if(binder_i_unplaced(g->m[k]))
                    set_status(p, g->m[k], g->m[k]->phase, NULL, r, "%s", msg);
            return;
        }
    }
    needs nd;
    if(binder_i_needs_of(st, g, binder_i_unplaced, &nd)) {
        wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, "the set names more classes than one node can be asked for");
        return;
    }
    char target[BINDER_MAX_NAME + 1];
    if(anchor) {
        /* the set's other claims hold node `anchor`: all of a set on one node */
        const sm_node *n = binder_i_node_find(st, anchor);
        int room = binder_i_node_usable(n);
        for(size_t k = 0; room && k < nd.n; k++) {
            binder_slot_view sl;
            room = !binder_node_slot(st->ix, anchor, nd.need[k].class_name, &sl) && sl.offered >= sl.bound &&
                   sl.offered - sl.bound >= nd.need[k].units;
        }
        if(!room) {
            snprintf(msg, sizeof msg, "the other claims of VM %s hold node %s, which has no room for this one",
                     g->set ? g->set->name : "", anchor);
            wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, msg);
            return;
        }
        snprintf(target, sizeof target, "%s", anchor);
    }
    binder_candidate cands[BINDER_MAX_CANDIDATES];
    size_t nc = 0;
    if(!anchor) {
        p->refused = 0;
        nc = binder_i_candidates_of(p, g, &nd, cands);
        if(nc == 0) {
            snprintf(msg, sizeof msg, "no node has room for %s%s (class %s)", g->set ? "the claims of VM " : "claim ",
                     g->set ? g->set->name : g->m[0]->name, nd.need[0].class_name);
            wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, msg);
            return;
        }
    }
    /* budgets: once per Pending -> Bound, serially (decision 0020 §3);
     * after the index found room and before the chooser runs, so that a
     * set over its budget costs no policy call (decision 0026) */
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(!is_pending(c) || !p->h || !p->h->budget)
            continue;
        binder_claim_status v;
        binder_i_view_of(c, &v);
        char why[MSG_MAX - 64] = "";
        if(!p->h->budget(p->h->ud, &v, why, sizeof why)) {
            if(why[0])
                snprintf(msg, sizeof msg, "claim %s: %s", c->name, why);
            else
                snprintf(msg, sizeof msg, "claim %s would exceed a budget of namespace %s", c->name, c->ns);
            wait_group(p, g, BINDER_R_OVER_BUDGET, msg);
            return;
        }
    }
    if(!anchor) {
        const char *to = binder_i_pick_of(p, g, cands, nc);
        if(p->refused)
            group_vol(g);
        if(!to) {
            snprintf(msg, sizeof msg, "no node has room for %s%s (class %s)", g->set ? "the claims of VM " : "claim ",
                     g->set ? g->set->name : g->m[0]->name, nd.need[0].class_name);
            wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, msg);
            return;
        }
        snprintf(target, sizeof target, "%s", to);
    }
    if(binder_i_bind_group(st, g, binder_i_unplaced, target, 0) != BINDER_OK) {
        wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, "no node has room");
        return;
    }
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(binder_i_unplaced(c))
            set_status(p, c, BINDER_BOUND, target, BINDER_R_PLACED, "%s on node %s",
                       c->phase == BINDER_LOST ? "placed again" : "placed", target);
    }
}

int binder_i_group_has(const group *g, binder_phase ph)
{
    for(size_t i = 0; i < g->n; i++)
        if(g->m[i]->phase == ph && binder_i_unplaced(g->m[i]))
            return 1;
    return 0;
}

int binder_i_group_unplaced(const group *g)
{
    for(size_t i = 0; i < g->n; i++)
        if(binder_i_unplaced(g->m[i]))
            return 1;
    return 0;
}

/* A node deleted and given again between two passes: claims whose status
 * names it are booked there again (Attached, and Lost waiting for a VMI,
 * even past what it offers: their VMI holds the units; a Bound one only
 * where it fits, else it goes Lost and is placed again). */
static void rebook(pass *p, sm_claim *c)
{
    binder_state *st = p->st;
    if(!c->node || binder_i_booked(st, c) || !binder_i_node_find(st, c->node))
        return;
    if(c->phase == BINDER_ATTACHED || (c->phase == BINDER_LOST && c->reason == BINDER_R_WAITING_FOR_VMI_END))
        binder_bind(st->ix, c->ns, c->name, c->node, BINDER_BIND_RESTORE, NULL);
    else if(c->phase == BINDER_BOUND && binder_bind(st->ix, c->ns, c->name, c->node, 0, NULL) != BINDER_OK)
        set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                   "node %s came back without room for the claim; waiting for a node with room", c->node);
}

/* Whether a class of node n holds more than it offers; when so, its
 * booked claims are in w. */
static int node_over(binder_state *st, const sm_node *n, cap_walk *w)
{
    w->st = st;
    w->node = n->name;
    w->n = 0;
    binder_node_claims(st->ix, n->name, binder_i_cap_collect, w);
    for(size_t i = 0; i < w->n; i++) {
        binder_slot_view sl;
        if(!binder_node_slot(st->ix, n->name, w->list[i]->class_name, &sl) && sl.bound > sl.offered)
            return 1;
    }
    return 0;
}

/* One pass over the groups in gl (all of them, or the incremental
 * selection): the steps binder.h lists, in the same order for the groups
 * it has as a full pass. */
static size_t run_pass(binder_state *st, const binder_hooks *hooks, glist *gl, int full)
{
    pass p = {st, hooks, 0, 0};
    /* 0-1. rebook, then status upkeep, claim by claim in creation order */
    size_t nc = 0;
    for(size_t gi = 0; gi < gl->n; gi++)
        nc += gl->g[gi].n;
    sm_claim **cl = malloc((nc + 1) * sizeof *cl);
    if(!cl) {
        st->full = 1;
        return 0;
    }
    nc = 0;
    for(size_t gi = 0; gi < gl->n; gi++)
        for(size_t m = 0; m < gl->g[gi].n; m++)
            cl[nc++] = gl->g[gi].m[m];
    qsort(cl, nc, sizeof *cl, claim_seq_cmp);
    for(size_t i = 0; i < nc; i++)
        rebook(&p, cl[i]);
    for(size_t i = 0; i < nc; i++)
        upkeep(&p, cl[i]);
    free(cl);

    /* the incremental pass widens its selection before the moves: every
     * set on an over-committed node it touches (their classes gain room as
     * the most recent leave), and the waiting sets of each class that
     * gained room since it was last retried, and those waiting on a hook;
     * until nothing is added. A full pass has them all. */
    sm_node **nodes = NULL;
    size_t nn = 0, ncap = 0;
    cap_walk w;
    lzlist lz = {0};
    if(full) {
        ncap = HASH_COUNT(st->nodes) + 1;
        nodes = malloc(ncap * sizeof *nodes);
        if(!nodes) {
            st->full = 1;
            return p.events;
        }
        for(sm_node *n = st->nodes; n; n = n->hh.next)
            nodes[nn++] = n;
    } else {
        size_t scanned = 0, applied = 0;
        int vol_done = 0;
        for(;;) {
            for(; scanned < gl->n; scanned++) {
                group *g = &gl->g[scanned];
                for(size_t m = 0; m < g->n; m++) {
                    sm_node *n = binder_i_node_find(st, binder_i_booked(st, g->m[m]));
                    if(!n || n->stamp == st->stamp)
                        continue;
                    n->stamp = st->stamp;
                    if(nn == ncap) {
                        size_t cap = ncap ? ncap * 2 : 32;
                        sm_node **q = realloc(nodes, cap * sizeof *q);
                        if(!q) {
                            free(nodes);
                            free(lz.v);
                            st->full = 1;
                            return p.events;
                        }
                        nodes = q;
                        ncap = cap;
                    }
                    nodes[nn++] = n;
                    if(node_over(st, n, &w))
                        for(size_t k = 0; k < w.n; k++) {
                            binder_i_gain(st, w.list[k]->class_name, n->name);
                            gl_add(st, gl, w.list[k]);
                        }
                }
            }
            size_t before = gl->n;
            for(; applied < st->n_gained; applied++) {
                const char *cls = st->gained[applied].cls;
                size_t k;
                for(k = 0; k < applied && strcmp(st->gained[k].cls, cls); k++)
                    ;
                if(k < applied)
                    continue; /* its bucket is walked already */
                wbucket *b = NULL;
                HASH_FIND_STR(st->waits, cls, b);
                for(sm_claim *c = b ? b->head : NULL; c; c = c->wnext) {
                    if(!binder_i_lazy_list(st, &lz, c))
                        gl_add(st, gl, c);
                }
            }
            if(!vol_done) {
                vol_done = 1;
                wbucket *b = NULL;
                HASH_FIND_STR(st->waits, "", b);
                for(sm_claim *c = b ? b->head : NULL; c; c = c->wnext)
                    gl_add(st, gl, c);
            }
            if(gl->oom || lz.oom) {
                free(nodes);
                free(lz.v);
                st->full = 1;
                return p.events;
            }
            if(gl->n == before && scanned == gl->n)
                break;
        }
    }
    /* the gains retried now are consumed; later ones (a move below
     * freeing room) wait for the next pass */
    size_t consumed = st->n_gained;
    st->gained_floor = consumed;

    group *gs = gl->g;
    size_t ng = gl->n;
    if(ng)
        qsort(gs, ng, sizeof *gs, group_cmp);
    for(size_t i = 0; i < ng; i++)
        for(size_t m = 0; m < gs[i].n; m++) {
            gs[i].m[m]->gi = i;
            gs[i].m[m]->vol = 0;
        }
    enum move_cause *causes = calloc(ng + 1, sizeof *causes);
    if(!causes) {
        free(nodes);
        free(lz.v);
        st->full = 1;
        st->gained_floor = 0;
        return p.events;
    }
    /* 2. sets that must move */
    for(size_t gi = 0; gi < ng; gi++) {
        group *g = &gs[gi];
        for(size_t i = 0; i < g->n; i++) {
            sm_claim *c = g->m[i];
            if(!is_bound(c))
                continue;
            sm_node *n = binder_i_node_find(st, c->node);
            if(!n)
                causes[gi] = MOVE_GONE;
            else if(n->flags & BINDER_NODE_LAYOUT_PENDING)
                causes[gi] = MOVE_LAYOUT;
            break;
        }
    }
    mark_capacity(st, gs, nodes, nn, causes);
    free(nodes);
    for(size_t gi = 0; gi < ng; gi++) {
        group *g = &gs[gi];
        if(causes[gi] != MOVE_NONE)
            continue;
        for(size_t i = 0; i < g->n; i++) {
            sm_claim *c = g->m[i];
            if(!is_bound(c))
                continue;
            sm_node *n = binder_i_node_find(st, c->node);
            const sm_class *cl = binder_i_class_find(st, c->class_name);
            if(n && !(n->flags & BINDER_NODE_READY) && binder_i_vmi_of(c) == BINDER_VMI_PENDING) {
                /* its VMI waits for a node that cannot run it (decision 0021) */
                causes[gi] = MOVE_NOT_READY;
            } else if(n && !(n->flags & BINDER_NODE_SCHEDULABLE)) {
                if(cl && cl->on_cordon == BINDER_CORDON_STAY)
                    set_status(&p, c, BINDER_BOUND, c->node, BINDER_R_NODE_CORDONED,
                               "node %s is cordoned; class %s has onCordon: Stay, the claim waits there", c->node,
                               c->class_name);
                else
                    causes[gi] = MOVE_CORDON;
            } else if(n && (c->reason == BINDER_R_NODE_CORDONED || c->reason == BINDER_R_LAYOUT_CHANGE_PENDING ||
                            c->reason == BINDER_R_NODE_LOST))
                set_status(&p, c, BINDER_BOUND, c->node, BINDER_R_PLACED, "placed on node %s", c->node);
        }
    }
    for(size_t gi = 0; gi < ng; gi++)
        if(causes[gi] != MOVE_NONE)
            move_group(&p, &gs[gi], causes[gi]);

    /* 3. placement: Lost sets first, then new orders; the listed sets
     * each at its turn in the same order */
    lazy_ctx lc;
    binder_i_lazy_ctx_init(st, &lc);
    binder_i_lazy_prune(st, &lc, &lz);
    for(int round = 0; round < 2; round++)
        for(size_t gi = 0, li = 0; gi <= ng; gi++) {
            uint64_t at = gi < ng ? group_seq(&gs[gi]) : UINT64_MAX;
            for(; li < lz.n && lz.v[li].seq < at; li++)
                binder_i_lazy_try(&p, &lc, &lz.v[li], round);
            if(gi == ng)
                break;
            group *g = &gs[gi];
            if(!binder_i_group_unplaced(g))
                continue;
            int lost = binder_i_group_has(g, BINDER_LOST);
            if((round == 0) != !!lost)
                continue;
            binder_i_place_group(&p, g);
        }
    free(causes);
    for(size_t gi = 0; gi < ng; gi++)
        for(size_t m = 0; m < gs[gi].n; m++)
            binder_i_wait_update(st, gs[gi].m[m]);
    free(lz.v);
    for(size_t i = 0; i < consumed; i++) {
        free(st->gained[i].cls);
        free(st->gained[i].node);
    }
    if(st->n_gained > consumed) /* st->gained is NULL until the first gain */
        memmove(st->gained, st->gained + consumed, (st->n_gained - consumed) * sizeof *st->gained);
    st->n_gained -= consumed;
    st->gained_floor = 0;
    return p.events;
}


/* Takes the dirty list (claims marked since the last pass). */
static void take_dirty(binder_state *st, glist *gl, int add)
{
    sm_claim *c, *tmp;
    DL_FOREACH_SAFE2(st->dirty, c, tmp, dnext) {
        DL_DELETE2(st->dirty, c, dprev, dnext);
        c->dirty = 0;
        if(add)
            gl_add(st, gl, c);
    }
}

size_t binder_reconcile_all(binder_state *st, const binder_hooks *hooks)
{
    glist gl = {0};
    st->stamp++;
    st->full = 0;
    take_dirty(st, &gl, 0);
    for(sm_claim *c = st->claims; c; c = c->hh.next)
        gl_add(st, &gl, c);
    if(gl.oom) {
        free(gl.g);
        st->full = 1;
        return 0;
    }
    size_t n = run_pass(st, hooks, &gl, 1);
    free(gl.g);
    return n;
}

size_t binder_reconcile(binder_state *st, const binder_hooks *hooks)
{
    if(st->full)
        return binder_reconcile_all(st, hooks);
    glist gl = {0};
    st->stamp++;
    take_dirty(st, &gl, 1);
    if(gl.oom) {
        free(gl.g);
        return binder_reconcile_all(st, hooks);
    }
    size_t n = run_pass(st, hooks, &gl, 0);
    free(gl.g);
    return n;
}
