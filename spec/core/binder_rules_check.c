/* binder_rules_check — checks of the binder's state machine
 * (core/binder/binder_*.c) against each rule of DESIGN.md §6 and decision
 * 0020, run under ASan/UBSan by spec/core/run-binder-rules-check.sh.
 *
 * Every expected value is read off the rule text quoted above its case,
 * not off the code's output; binder_state_verify runs after every pass.
 *
 * Usage: binder_rules_check [STEPS [SEED]]   (the random runs, without and with hooks, each
 *   against its full-pass twin: default 20000 steps, seed 12)
 *   Prints "N passed, N failed", exit 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "binder/binder.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define F_OK (BINDER_NODE_READY | BINDER_NODE_SCHEDULABLE)

/* --------------------------------------------------------------- world */

typedef struct rec {
    char events[64][160];
    int n_events;
    char deleted[8][128];
    int n_deleted;
    int budget_left; /* -1: no budget hook limit */
    int budget_calls;
    int choose_last;
} rec;

static void on_event(void *ud, const binder_event *e)
{
    rec *r = ud;
    if(r->n_events < 64)
        snprintf(r->events[r->n_events++], sizeof r->events[0], "%s/%s %s->%s %s->%s %s", e->ns, e->name,
                 binder_phase_name(e->from), binder_phase_name(e->to), e->from_node ? e->from_node : "-",
                 e->to_node ? e->to_node : "-", binder_reason_name(e->reason));
}

static void on_delete(void *ud, const char *ns, const char *vmi, const char *why)
{
    rec *r = ud;
    (void)why;
    if(r->n_deleted < 8)
        snprintf(r->deleted[r->n_deleted++], sizeof r->deleted[0], "%s/%s", ns, vmi);
}

static int on_budget(void *ud, const binder_claim_status *c, char *why, size_t why_size)
{
    rec *r = ud;
    (void)c, (void)why, (void)why_size;
    r->budget_calls++;
    if(r->budget_left < 0)
        return 1;
    if(r->budget_left == 0)
        return 0;
    r->budget_left--;
    return 1;
}

static int on_choose(void *ud, const binder_set_view *s, const binder_candidate *c, size_t n)
{
    rec *r = ud;
    (void)s;
    (void)c;
    return r->choose_last ? (int)n - 1 : 0;
}

static rec R;
static binder_hooks H = {&R, on_choose, on_budget, on_event, on_delete};

static binder_state *fresh(const char *name)
{
    check_section = name;
    memset(&R, 0, sizeof R);
    R.budget_left = -1;
    binder_state *st = binder_state_new();
    binder_state_class_set(st, "a", BINDER_CORDON_MOVE, 0, NULL, 0, NULL);
    binder_state_class_set(st, "b", BINDER_CORDON_MOVE, 0, NULL, 0, NULL);
    binder_state_class_set(st, "s", BINDER_CORDON_STAY, 0, NULL, 0, NULL);
    return st;
}

static void node(binder_state *st, const char *name, uint32_t flags, const char *cls, uint32_t units,
                 const char *cls2, uint32_t units2)
{
    binder_offer o[2] = {{cls, units}, {cls2, units2}};
    binder_node_spec s = {flags, o, cls2 ? 2 : 1, NULL, 0};
    cozy_err err = {{0}};
    if(binder_state_node_set(st, name, &s, &err))
        ok(0, "node_set", err.msg);
}

static void claim(binder_state *st, const char *name, const char *cls, uint32_t count)
{
    cozy_err err = {{0}};
    if(binder_state_claim_add(st, "t", name, cls, count, 0, &err))
        ok(0, "claim_add", err.msg);
}

static void vm(binder_state *st, const char *name, const char *c1, const char *c2, binder_vmi_phase ph,
               const char *on)
{
    const char *cl[2] = {c1, c2};
    cozy_err err = {{0}};
    if(binder_state_set_put(st, "t", name, cl, c2 ? 2 : 1, ph, on, &err))
        ok(0, "set_put", err.msg);
}

static void vmi(binder_state *st, const char *name, binder_vmi_phase ph, const char *on)
{
    cozy_err err = {{0}};
    if(binder_state_set_vmi(st, "t", name, ph, on, &err))
        ok(0, "set_vmi", err.msg);
}

static size_t pass(binder_state *st)
{
    size_t n = binder_reconcile(st, &H);
    cozy_err err = {{0}};
    binder_rc rc = binder_state_verify(st, &err);
    ok(rc == BINDER_OK, "state verifies after the pass", rc ? err.msg : NULL);
    return n;
}

/* Expect claim t/name in phase, on node (NULL: none), with reason. */
static void want(binder_state *st, const char *name, binder_phase ph, const char *on, binder_reason r)
{
    binder_claim_status c;
    char what[200], d[400];
    snprintf(what, sizeof what, "claim %s", name);
    if(binder_state_claim_get(st, "t", name, &c)) {
        ok(0, what, "not known");
        return;
    }
    int good = c.phase == ph && ((!on && !c.node) || (on && c.node && !strcmp(on, c.node))) && c.reason == r;
    snprintf(d, sizeof d, "got %s on %s (%s: %s), want %s on %s (%s)", binder_phase_name(c.phase),
             c.node ? c.node : "-", binder_reason_name(c.reason), c.message, binder_phase_name(ph), on ? on : "-",
             binder_reason_name(r));
    ok(good, what, good ? NULL : d);
}

static void units(binder_state *st, const char *nodename, const char *cls, uint32_t bound)
{
    binder_slot_view sl = {0, 0};
    char what[200], d[120];
    snprintf(what, sizeof what, "node %s class %s bound units", nodename, cls);
    binder_node_slot(binder_state_index(st), nodename, cls, &sl);
    snprintf(d, sizeof d, "got %u, want %u", sl.bound, bound);
    ok(sl.bound == bound, what, sl.bound == bound ? NULL : d);
}

static void has_event(const char *text)
{
    for(int i = 0; i < R.n_events; i++)
        if(!strcmp(R.events[i], text))
            return ok(1, text, NULL);
    char d[400] = "events:";
    for(int i = 0; i < R.n_events; i++)
        snprintf(d + strlen(d), sizeof d - strlen(d), " [%s]", R.events[i]);
    ok(0, text, d);
}

/* ---------------------------------------------------------------- cases */

/* §6 "Places claim sets: all claims one VM names go to one node ... enough
 * free units of every class in the set." */
static void t_set_one_node(void)
{
    binder_state *st = fresh("set on one node");
    node(st, "n1", F_OK, "a", 2, NULL, 0);
    node(st, "n2", F_OK, "a", 2, "b", 1);
    claim(st, "c1", "a", 2);
    claim(st, "c2", "b", 1);
    vm(st, "vm", "c1", "c2", BINDER_VMI_NONE, NULL);
    pass(st);
    want(st, "c1", BINDER_BOUND, "n2", BINDER_R_PLACED);
    want(st, "c2", BINDER_BOUND, "n2", BINDER_R_PLACED);
    units(st, "n1", "a", 0);
    has_event("t/c1 Pending->Bound -->n2 Placed");
    binder_state_free(st);

    /* all or nothing: no node has room for both, nothing is booked */
    st = fresh("set all or nothing");
    node(st, "n1", F_OK, "a", 2, NULL, 0);
    node(st, "n2", F_OK, "b", 1, NULL, 0);
    claim(st, "c1", "a", 2);
    claim(st, "c2", "b", 1);
    vm(st, "vm", "c1", "c2", BINDER_VMI_NONE, NULL);
    pass(st);
    want(st, "c1", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    want(st, "c2", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    units(st, "n1", "a", 0);
    units(st, "n2", "b", 0);
    binder_state_free(st);
}

/* A state that never gained room (no node yet, as a leader's first pass
 * on an empty cluster): a pass leaves its claims waiting, and nothing in
 * it touches the empty list of gains (UBSan stopped the controller on a
 * memmove from it). */
static void t_no_gain_yet(void)
{
    binder_state *st = fresh("a pass before any node");
    claim(st, "c1", "a", 1);
    pass(st);
    want(st, "c1", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    pass(st);
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    pass(st);
    want(st, "c1", BINDER_BOUND, "n1", BINDER_R_PLACED);
    binder_state_free(st);
}

/* Decision 0042: room returning retries the sets waiting for room only
 * against the nodes that gained it, answering sets that ask the same once.
 * A set of six classes (more than a signature holds) waiting for room is
 * placed when a node with all six comes; a second set of the same needs
 * stays waiting once that node is full; a set whose classes the node does
 * not all offer stays waiting. */
static void t_lazy_many_classes(void)
{
    binder_state *st = fresh("waiting sets of many classes, retried where room was gained");
    static const char *const cls[6] = {"k1", "k2", "k3", "k4", "k5", "k6"};
    binder_offer o[6];
    for(int i = 0; i < 6; i++) {
        binder_state_class_set(st, cls[i], BINDER_CORDON_MOVE, 0, NULL, 0, NULL);
        o[i] = (binder_offer){cls[i], 1};
    }
    node(st, "small", F_OK, "k1", 1, NULL, 0);
    const char *first[7], *second[7];
    static const char *const names1[7] = {"x1", "x2", "x3", "x4", "x5", "x6", "x7"};
    static const char *const names2[7] = {"y1", "y2", "y3", "y4", "y5", "y6", "y7"};
    for(int i = 0; i < 7; i++) {
        /* seven claims over six classes: the last one's class again */
        claim(st, names1[i], cls[i < 6 ? i : 5], 1);
        claim(st, names2[i], cls[i < 6 ? i : 5], 1);
        first[i] = names1[i];
        second[i] = names2[i];
    }
    cozy_err err = {{0}};
    if(binder_state_set_put(st, "t", "vm1", first, 7, BINDER_VMI_NONE, NULL, &err) ||
       binder_state_set_put(st, "t", "vm2", second, 7, BINDER_VMI_NONE, NULL, &err))
        ok(0, "set_put", err.msg);
    claim(st, "lone", "k1", 1);
    pass(st);
    want(st, "x1", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    want(st, "lone", BINDER_BOUND, "small", BINDER_R_PLACED);
    /* a node offering five of the six: nobody fits there */
    binder_node_spec five = {F_OK, o, 5, NULL, 0};
    binder_state_node_set(st, "five", &five, NULL);
    pass(st);
    want(st, "x1", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    want(st, "y1", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    /* one offering all six, one unit each but two of k6: the older set */
    binder_offer all[6];
    memcpy(all, o, sizeof all);
    all[5].units = 2;
    binder_node_spec six = {F_OK, all, 6, NULL, 0};
    binder_state_node_set(st, "six", &six, NULL);
    pass(st);
    want(st, "x1", BINDER_BOUND, "six", BINDER_R_PLACED);
    want(st, "x7", BINDER_BOUND, "six", BINDER_R_PLACED);
    want(st, "y1", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    units(st, "six", "k6", 2);
    /* the same as a full pass gives */
    ok(binder_reconcile_all(st, &H) == 0, "a full pass then changes nothing", NULL);
    binder_state_free(st);
}

/* §6 "Lost claims are rebound before new orders when capacity returns" */
static void t_lost_first(void)
{
    binder_state *st = fresh("Lost rebound before new orders");
    claim(st, "new", "a", 1); /* created first: only the Lost rule puts the other ahead */
    binder_claim_status l = {"t", "lost", "a", 1, 0, BINDER_LOST, NULL, NULL, BINDER_R_NODE_LOST, "lost"};
    binder_state_claim_put(st, &l, NULL);
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    pass(st);
    want(st, "lost", BINDER_BOUND, "n1", BINDER_R_PLACED);
    want(st, "new", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    binder_state_free(st);

    /* "... but a large Lost set never blocks a smaller order that fits elsewhere" */
    st = fresh("large Lost set does not block a small order");
    binder_claim_status big = {"t", "big", "a", 4, 0, BINDER_LOST, NULL, NULL, BINDER_R_NODE_LOST, "lost"};
    binder_state_claim_put(st, &big, NULL);
    claim(st, "small", "a", 1);
    node(st, "n1", F_OK, "a", 2, NULL, 0);
    pass(st);
    want(st, "big", BINDER_LOST, NULL, BINDER_R_NODE_LOST);
    want(st, "small", BINDER_BOUND, "n1", BINDER_R_PLACED);
    /* decision 0020 §3: a Lost rebind never goes through the budget check */
    ok(R.budget_calls == 1, "budget asked once (the new order only)", NULL);
    binder_state_free(st);
}

/* §6 "a claim keeps its node while the node exists, matches the class, has
 * capacity and no pending layout change" */
static void t_keeps_node(void)
{
    binder_state *st = fresh("keeps its node");
    node(st, "n1", F_OK, "a", 4, NULL, 0);
    claim(st, "c", "a", 1);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_PLACED);
    node(st, "n0", F_OK, "a", 1, NULL, 0); /* a tighter fit appears: no reason to move */
    ok(pass(st) == 0, "no transition", NULL);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_PLACED);
    /* NotReady is not in the list: an unattached claim keeps its node */
    binder_state_node_flags(st, "n1", BINDER_NODE_SCHEDULABLE, NULL);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_PLACED);
    /* ... until a VMI waits for it there (decision 0021 §2): then it moves */
    vm(st, "vm", "c", NULL, BINDER_VMI_PENDING, NULL);
    pass(st);
    want(st, "c", BINDER_BOUND, "n0", BINDER_R_PLACED);
    ok(R.n_deleted == 1, "the pending VMI pinned to the NotReady node is deleted", NULL);
    binder_state_free(st);

    /* node deleted: the claim moves, or goes Lost when nowhere has room */
    st = fresh("node deleted");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    claim(st, "d", "a", 1);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_PLACED);
    node(st, "n2", F_OK, "a", 1, NULL, 0);
    pass(st);
    want(st, "d", BINDER_BOUND, "n2", BINDER_R_PLACED);
    binder_state_node_delete(st, "n1", NULL);
    pass(st);
    want(st, "c", BINDER_LOST, NULL, BINDER_R_NODE_LOST);
    node(st, "n3", F_OK, "a", 1, NULL, 0);
    pass(st);
    want(st, "c", BINDER_BOUND, "n3", BINDER_R_PLACED);
    binder_state_free(st);

    /* layout change pending: it moves; with no room it keeps its hold */
    st = fresh("layout change pending");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    pass(st);
    binder_state_node_flags(st, "n1", F_OK | BINDER_NODE_LAYOUT_PENDING, NULL);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_LAYOUT_CHANGE_PENDING);
    units(st, "n1", "a", 1);
    node(st, "n2", F_OK, "a", 1, NULL, 0);
    pass(st);
    want(st, "c", BINDER_BOUND, "n2", BINDER_R_PLACED);
    units(st, "n1", "a", 0);
    binder_state_free(st);

    /* capacity lost: the most recently bound leaves; nowhere to go: Lost */
    st = fresh("capacity lost");
    node(st, "n1", F_OK, "a", 2, NULL, 0);
    claim(st, "first", "a", 1);
    pass(st);
    claim(st, "second", "a", 1);
    pass(st);
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    pass(st);
    want(st, "first", BINDER_BOUND, "n1", BINDER_R_PLACED);
    want(st, "second", BINDER_LOST, NULL, BINDER_R_NODE_LOST);
    units(st, "n1", "a", 1);
    node(st, "n2", F_OK, "a", 1, NULL, 0);
    pass(st);
    want(st, "second", BINDER_BOUND, "n2", BINDER_R_PLACED);
    binder_state_free(st);
}

/* §6 "cordon with onCordon: Move: an unattached claim on a cordoned node
 * moves to another node with room and keeps its hold; Stay: it waits, and
 * the pin gives way once the node has lost the capacity" */
static void t_cordon(void)
{
    binder_state *st = fresh("cordon Move");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    pass(st);
    binder_state_node_flags(st, "n1", BINDER_NODE_READY, NULL);
    pass(st);
    /* no room elsewhere: it keeps its hold on n1 */
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_NODE_CORDONED);
    units(st, "n1", "a", 1);
    node(st, "n2", F_OK, "a", 1, NULL, 0);
    pass(st);
    want(st, "c", BINDER_BOUND, "n2", BINDER_R_PLACED);
    units(st, "n1", "a", 0);
    units(st, "n2", "a", 1);
    has_event("t/c Bound->Bound n1->n2 Placed");
    binder_state_free(st);

    st = fresh("cordon Stay");
    node(st, "n1", F_OK, "s", 1, NULL, 0);
    node(st, "n2", F_OK, "s", 1, NULL, 0);
    claim(st, "c", "s", 1);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_PLACED);
    binder_state_node_flags(st, "n1", BINDER_NODE_READY, NULL);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_NODE_CORDONED);
    node(st, "n1", BINDER_NODE_READY, "s", 0, NULL, 0); /* the node lost the capacity: the pin gives way */
    pass(st);
    want(st, "c", BINDER_BOUND, "n2", BINDER_R_PLACED);
    binder_state_free(st);

    /* an attached claim on a cordoned Move node stays attached */
    st = fresh("cordon leaves Attached alone");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    node(st, "n2", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    vm(st, "vm", "c", NULL, BINDER_VMI_PENDING, NULL);
    pass(st);
    vmi(st, "vm", BINDER_VMI_RUNNING, "n1");
    pass(st);
    want(st, "c", BINDER_ATTACHED, "n1", BINDER_R_ATTACHED);
    binder_state_node_flags(st, "n1", BINDER_NODE_READY, NULL);
    pass(st);
    want(st, "c", BINDER_ATTACHED, "n1", BINDER_R_ATTACHED);
    /* the VMI ends: it leaves Attached and then moves off the cordoned node */
    vmi(st, "vm", BINDER_VMI_SUCCEEDED, "n1");
    pass(st);
    want(st, "c", BINDER_BOUND, "n2", BINDER_R_PLACED);
    binder_state_free(st);
}

/* §6 "node NotReady: attached claims go Lost and are rebound once their
 * VMIs are final or removed; if the node returns while the VMI runs, the
 * claim goes back to Attached there" */
static void t_not_ready(void)
{
    binder_state *st = fresh("NotReady and back");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    node(st, "n2", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    vm(st, "vm", "c", NULL, BINDER_VMI_PENDING, NULL);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_PLACED);
    vmi(st, "vm", BINDER_VMI_RUNNING, "n1");
    pass(st);
    want(st, "c", BINDER_ATTACHED, "n1", BINDER_R_ATTACHED);
    binder_state_node_flags(st, "n1", BINDER_NODE_SCHEDULABLE, NULL);
    pass(st);
    want(st, "c", BINDER_LOST, "n1", BINDER_R_WAITING_FOR_VMI_END);
    /* it waits for its VMI: not placed elsewhere meanwhile */
    units(st, "n2", "a", 0);
    binder_state_node_flags(st, "n1", F_OK, NULL);
    pass(st);
    want(st, "c", BINDER_ATTACHED, "n1", BINDER_R_ATTACHED);
    binder_state_free(st);

    st = fresh("NotReady and the VMI fails");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    node(st, "n2", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    vm(st, "vm", "c", NULL, BINDER_VMI_PENDING, NULL);
    pass(st);
    vmi(st, "vm", BINDER_VMI_RUNNING, "n1");
    pass(st);
    binder_state_node_flags(st, "n1", BINDER_NODE_SCHEDULABLE, NULL);
    pass(st);
    vmi(st, "vm", BINDER_VMI_FAILED, "n1");
    pass(st);
    want(st, "c", BINDER_BOUND, "n2", BINDER_R_PLACED);
    units(st, "n1", "a", 0);
    has_event("t/c Attached->Lost n1->n1 WaitingForVMIEnd");
    has_event("t/c Lost->Lost n1->- NodeLost");
    has_event("t/c Lost->Bound -->n2 Placed");
    binder_state_free(st);
}

/* §6 "a claim leaves Attached when its VMI is final or removed, not on a
 * deletion timestamp alone" */
static void t_leave_attached(void)
{
    binder_state *st = fresh("leaves Attached when the VMI is removed");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    vm(st, "vm", "c", NULL, BINDER_VMI_RUNNING, "n1");
    pass(st);
    pass(st);
    want(st, "c", BINDER_ATTACHED, "n1", BINDER_R_ATTACHED);
    vmi(st, "vm", BINDER_VMI_RUNNING, "n1"); /* a deletion timestamp changes nothing the binder reads */
    ok(pass(st) == 0, "no transition while the VMI runs", NULL);
    binder_state_set_delete(st, "t", "vm", NULL);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_PLACED);
    binder_state_free(st);
}

/* §6 "a set that must move while its VMI exists but is not yet scheduled
 * ... has that VMI deleted by the controller, so the set becomes
 * unattached and moves" */
static void t_delete_pending_vmi(void)
{
    binder_state *st = fresh("pending VMI deleted so the set can move");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    node(st, "n2", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    vm(st, "vm", "c", NULL, BINDER_VMI_PENDING, NULL);
    pass(st);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_PLACED);
    binder_state_node_flags(st, "n1", BINDER_NODE_READY, NULL);
    pass(st);
    ok(R.n_deleted == 1 && !strcmp(R.deleted[0], "t/vm"), "delete_vmi asked for t/vm", NULL);
    want(st, "c", BINDER_BOUND, "n2", BINDER_R_PLACED);
    binder_state_free(st);

    /* no room elsewhere: the set keeps its hold and its VMI is kept */
    st = fresh("pending VMI kept when the set cannot leave");
    node(st, "n1", F_OK, "a", 1, NULL, 0);
    claim(st, "c", "a", 1);
    vm(st, "vm", "c", NULL, BINDER_VMI_PENDING, NULL);
    pass(st);
    binder_state_node_flags(st, "n1", BINDER_NODE_READY, NULL);
    pass(st);
    ok(R.n_deleted == 0, "delete_vmi not asked", NULL);
    want(st, "c", BINDER_BOUND, "n1", BINDER_R_NODE_CORDONED);
    /* the node lost the capacity: the set goes Lost and the VMI is deleted */
    node(st, "n1", BINDER_NODE_READY, "a", 0, NULL, 0);
    pass(st);
    ok(R.n_deleted == 1, "delete_vmi asked once the set leaves", NULL);
    want(st, "c", BINDER_LOST, NULL, BINDER_R_NODE_LOST);
    binder_state_free(st);
}

/* §6 "a class being deleted keeps serving its Bound, Attached and Lost
 * ordered claims and leaves a Pending one waiting with a reason" */
static void t_class_deleting(void)
{
    binder_state *st = fresh("class being deleted");
    node(st, "n1", F_OK, "a", 2, NULL, 0);
    claim(st, "bound", "a", 1);
    pass(st);
    binder_claim_status l = {"t", "lost", "a", 1, 0, BINDER_LOST, NULL, NULL, BINDER_R_NODE_LOST, "lost"};
    binder_state_claim_put(st, &l, NULL);
    binder_state_class_set(st, "a", BINDER_CORDON_MOVE, 1, NULL, 0, NULL);
    claim(st, "pending", "a", 1);
    pass(st);
    want(st, "bound", BINDER_BOUND, "n1", BINDER_R_PLACED);
    want(st, "lost", BINDER_BOUND, "n1", BINDER_R_PLACED);
    want(st, "pending", BINDER_PENDING, NULL, BINDER_R_CLASS_BEING_DELETED);
    claim(st, "nocls", "zz", 1);
    pass(st);
    want(st, "nocls", BINDER_PENDING, NULL, BINDER_R_CLASS_NOT_FOUND);
    binder_state_free(st);
}

/* §6 "never two claims on more units than a node has, across leader
 * changes"; decision 0020 §1: a new leader rebuilds from the claims' status */
static void t_no_overcommit_and_restore(void)
{
    binder_state *st = fresh("never more than offered");
    node(st, "n1", F_OK, "a", 2, NULL, 0);
    claim(st, "c1", "a", 1);
    claim(st, "c2", "a", 1);
    claim(st, "c3", "a", 1);
    pass(st);
    want(st, "c1", BINDER_BOUND, "n1", BINDER_R_PLACED);
    want(st, "c2", BINDER_BOUND, "n1", BINDER_R_PLACED);
    want(st, "c3", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    units(st, "n1", "a", 2);
    cozy_err err = {{0}};
    ok(binder_state_restore(st, &err) == BINDER_OK, "restore", err.msg);
    units(st, "n1", "a", 2);
    ok(pass(st) == 0, "a restored state is settled", NULL);
    want(st, "c3", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    binder_state_free(st);
}

/* decision 0020 §3: the budget hook refuses Pending -> Bound (OverBudget) */
/* ------------------------------------------------- held units (§5 at bind) */

/* The units binder_state_held_next walks for ns/cls, -1 when the pair is
 * listed twice or with 0 units (the walk lists each holding pair once). */
static long long walked(const binder_state *st, const char *ns, const char *cls)
{
    const void *pos = NULL;
    const char *n, *c;
    uint64_t u;
    long long got = 0;
    int seen_pair = 0;
    while(binder_state_held_next(st, &pos, &n, &c, &u)) {
        if(u == 0)
            return -1;
        if(!strcmp(n, ns) && !strcmp(c, cls)) {
            if(seen_pair++)
                return -1;
            got = (long long)u;
        }
    }
    return got;
}

static void held_is(const binder_state *st, const char *ns, const char *cls, uint64_t want_units, const char *when)
{
    char what[200], d[160];
    snprintf(what, sizeof what, "%s: %s holds %llu of class %s", when, ns, (unsigned long long)want_units, cls);
    uint64_t got = binder_state_held(st, ns, cls);
    long long w = walked(st, ns, cls);
    snprintf(d, sizeof d, "binder_state_held %llu, the walk %lld", (unsigned long long)got, w);
    ok(got == want_units && w == (long long)want_units, what, d);
}

/* A budget hook as placement's: a limit of `budget_left` units per
 * namespace and class over what the state holds, promising what it allows
 * and releasing the pass's promises when it refuses (the set waits whole). */
static binder_state *HELD_ST;
static int held_budget(void *ud, const binder_claim_status *c, char *why, size_t why_size)
{
    rec *r = ud;
    r->budget_calls++;
    if(binder_state_held(HELD_ST, c->ns, c->class_name) + c->count > (uint64_t)r->budget_left) {
        snprintf(why, why_size, "over %d", r->budget_left);
        binder_state_held_settle(HELD_ST);
        return 0;
    }
    return binder_state_held_promise(HELD_ST, c->ns, c->name, NULL) == BINDER_OK;
}

/* DESIGN.md §5 at bind, decision 0044: the state keeps the units each
 * namespace holds of each class (Bound, Attached, Lost; Pending only while
 * promised), so the budget check reads them instead of a copy kept by
 * deltas. */
static void t_held(void)
{
    binder_state *st = fresh("held units per namespace and class");
    node(st, "n1", F_OK, "a", 8, "b", 8);
    cozy_err err = {{0}};
    binder_state_claim_add(st, "t2", "c", "a", 1, 0, NULL);
    claim(st, "p", "a", 2);
    held_is(st, "t", "a", 0, "Pending");
    ok(binder_state_held_promise(st, "t", "p", &err) == BINDER_OK, "a Pending claim is promised", err.msg);
    ok(binder_state_held_promise(st, "t", "p", &err) == BINDER_OK, "promised twice", err.msg);
    held_is(st, "t", "a", 2, "promised (twice: once)");
    held_is(st, "t", "b", 0, "promised");
    binder_state_held_settle(st);
    held_is(st, "t", "a", 0, "settled");
    binder_state_held_promise(st, "t", "p", NULL);
    pass(st); /* Pending -> Bound: the promise becomes the claim's own */
    want(st, "p", BINDER_BOUND, "n1", BINDER_R_PLACED);
    held_is(st, "t", "a", 2, "promised, then Bound");
    binder_state_held_settle(st);
    held_is(st, "t", "a", 2, "Bound, after a settle");
    held_is(st, "t2", "a", 1, "Bound in another namespace");
    ok(binder_state_held_promise(st, "t", "p", &err) == BINDER_ERR_INPUT, "a Bound claim is not promised", NULL);
    ok(binder_state_held_promise(st, "t", "nope", NULL) == BINDER_ERR_NO_CLAIM, "an unknown claim is not promised",
       NULL);
    binder_claim_status l = {"t", "lost", "b", 3, 0, BINDER_LOST, NULL, NULL, BINDER_R_NODE_LOST, "lost"};
    binder_state_claim_put(st, &l, NULL);
    held_is(st, "t", "b", 3, "Lost (it keeps counting)");
    /* a promised claim deleted: its units go, and a settle after it is safe */
    claim(st, "gone", "a", 4);
    binder_state_held_promise(st, "t", "gone", NULL);
    held_is(st, "t", "a", 6, "Bound 2 and promised 4");
    binder_state_claim_delete(st, "t", "gone", NULL);
    held_is(st, "t", "a", 2, "the promised claim deleted");
    binder_state_held_settle(st);
    held_is(st, "t", "a", 2, "settled after the deletion");
    binder_state_claim_delete(st, "t", "p", NULL);
    binder_state_claim_delete(st, "t2", "c", NULL);
    held_is(st, "t", "a", 0, "its Bound claim deleted");
    held_is(st, "t2", "a", 0, "its Bound claim deleted");
    binder_state_free(st);

    /* the set's next claim sees the first one's promise; a refusal
     * releases the set's promises (the set waits whole) */
    st = fresh("held units: the budget hook promises");
    HELD_ST = st;
    node(st, "n1", F_OK, "a", 8, NULL, 0);
    binder_hooks hk = {&R, on_choose, held_budget, on_event, on_delete};
    R.budget_left = 3;
    claim(st, "x1", "a", 2);
    claim(st, "x2", "a", 2);
    vm(st, "vx", "x1", "x2", BINDER_VMI_NONE, NULL);
    binder_reconcile(st, &hk);
    want(st, "x1", BINDER_PENDING, NULL, BINDER_R_OVER_BUDGET);
    want(st, "x2", BINDER_PENDING, NULL, BINDER_R_OVER_BUDGET);
    held_is(st, "t", "a", 0, "a set over its budget (2 + 2 > 3)");
    binder_state_free(st);
    st = fresh("held units: a set within its budget");
    HELD_ST = st;
    node(st, "n1", F_OK, "a", 8, NULL, 0);
    R.budget_left = 3;
    claim(st, "y1", "a", 1);
    claim(st, "y2", "a", 2);
    vm(st, "vy", "y1", "y2", BINDER_VMI_NONE, NULL);
    binder_reconcile(st, &hk);
    binder_state_held_settle(st);
    want(st, "y1", BINDER_BOUND, "n1", BINDER_R_PLACED);
    want(st, "y2", BINDER_BOUND, "n1", BINDER_R_PLACED);
    held_is(st, "t", "a", 3, "a set within its budget (1 + 2), bound");
    claim(st, "y3", "a", 1);
    binder_reconcile(st, &hk);
    want(st, "y3", BINDER_PENDING, NULL, BINDER_R_OVER_BUDGET);
    held_is(st, "t", "a", 3, "a claim over the budget waits, unheld");
    HELD_ST = NULL;
    binder_state_free(st);
}

static void t_budget(void)
{
    binder_state *st = fresh("budget at bind");
    R.budget_left = 1;
    node(st, "n1", F_OK, "a", 4, NULL, 0);
    claim(st, "c1", "a", 1);
    claim(st, "c2", "a", 1);
    pass(st);
    want(st, "c1", BINDER_BOUND, "n1", BINDER_R_PLACED);
    want(st, "c2", BINDER_PENDING, NULL, BINDER_R_OVER_BUDGET);
    units(st, "n1", "a", 1);
    binder_state_free(st);
}

/* decision 0020 §4 / index.h: the default chooser takes the index's packing
 * order (most-allocated first); a chooser hook decides otherwise */
static void t_chooser(void)
{
    binder_state *st = fresh("chooser");
    node(st, "n1", F_OK, "a", 4, NULL, 0);
    node(st, "n2", F_OK, "a", 4, NULL, 0);
    claim(st, "c1", "a", 1);
    pass(st);
    want(st, "c1", BINDER_BOUND, "n1", BINDER_R_PLACED);
    claim(st, "c2", "a", 1);
    pass(st);
    want(st, "c2", BINDER_BOUND, "n1", BINDER_R_PLACED);
    R.choose_last = 1;
    claim(st, "c3", "a", 1);
    pass(st);
    want(st, "c3", BINDER_BOUND, "n2", BINDER_R_PLACED);
    binder_state_free(st);
}

/* §6 "a node is a candidate when ... tolerates-match (the set's tolerations
 * cover the node's gpu.cozystack.io/ taints; other taints are the
 * scheduler's business)": the set's tolerations are its classes' union */
static void t_taints(void)
{
    binder_state *st = fresh("set tolerations are the union of its classes'");
    binder_toleration tol = {"gpu.cozystack.io/reserved", "Exists", NULL, NULL};
    binder_state_class_set(st, "r", BINDER_CORDON_MOVE, 0, &tol, 1, NULL);
    binder_offer o[2] = {{"a", 2}, {"r", 2}};
    binder_taint t = {"gpu.cozystack.io/reserved", "x", "NoSchedule"};
    binder_node_spec s = {F_OK, o, 2, &t, 1};
    binder_state_node_set(st, "tainted", &s, NULL);
    claim(st, "plain", "a", 1);
    pass(st);
    want(st, "plain", BINDER_PENDING, NULL, BINDER_R_NO_NODE_WITH_ROOM);
    claim(st, "ra", "a", 1);
    claim(st, "rr", "r", 1);
    vm(st, "vm", "ra", "rr", BINDER_VMI_NONE, NULL);
    pass(st);
    want(st, "ra", BINDER_BOUND, "tainted", BINDER_R_PLACED);
    want(st, "rr", BINDER_BOUND, "tainted", BINDER_R_PLACED);
    binder_taint other = {"example.com/maintenance", "", "NoSchedule"};
    binder_node_spec s2 = {F_OK, o, 1, &other, 1};
    binder_state_node_set(st, "other-taint", &s2, NULL);
    pass(st);
    want(st, "plain", BINDER_BOUND, "other-taint", BINDER_R_PLACED);
    binder_state_free(st);
}

/* bad input: a set naming an unknown claim or one twice changes nothing */
static void t_bad_input(void)
{
    binder_state *st = fresh("bad input");
    claim(st, "c", "a", 1);
    const char *twice[2] = {"c", "c"}, *unknown[1] = {"x"};
    cozy_err err = {{0}};
    ok(binder_state_set_put(st, "t", "vm", twice, 2, BINDER_VMI_NONE, NULL, &err) == BINDER_ERR_INPUT,
       "a claim named twice is refused", err.msg);
    ok(binder_state_set_put(st, "t", "vm", unknown, 1, BINDER_VMI_NONE, NULL, &err) == BINDER_ERR_NO_CLAIM,
       "an unknown claim is refused", err.msg);
    ok(strstr(err.msg, "\"x\"") != NULL, "the message names the claim", err.msg);
    ok(binder_state_set_get(st, "t", "vm", NULL, NULL) == BINDER_ERR_NO_CLAIM, "no set was made", NULL);
    ok(binder_state_claim_add(st, "t", "z", "a", 0, 0, &err) == BINDER_ERR_INPUT, "count 0 is refused", err.msg);
    binder_state_free(st);
}

/* ------------------------------------------------------------ random run */

/* A seeded random run over a small world (4 nodes, 2 classes, up to 12
 * claims, 4 VMs): claim creates and deletes, cordons, NotReady and back,
 * layout pending, capacity changes, node deletes and returns, VMI starts,
 * runs, ends and removals, leader changes. After each step the world
 * settles (reconcile until no transition; a VMI the binder asks to delete
 * is deleted; a Pending VMI whose claims are all Bound on one Ready,
 * schedulable node runs there) and must hold the rules that never bend:
 * binder_state_verify (index consistent, no node over what it offers unless
 * what holds it cannot move, booked iff Bound/Attached/Lost-with-node, no
 * claim Attached to a VMI that is not live, every waiting claim with a
 * reason), and a leader change on a settled state changes nothing.
 * The state under test reconciles incrementally (binder_reconcile); a twin
 * replays the same draws with full passes (binder_reconcile_all), and after
 * every step both must hold the same status for every claim (phase, node,
 * attachedTo, reason, message) and the same VMI for every VM: the proof
 * that the incremental pass changes no answer. The run is made twice, the
 * second time with a budget hook and a chooser that refuses some sets
 * (answering from their arguments, as binder.h assumes). */
static unsigned long long rng_state;
static unsigned rnd(unsigned n)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)((rng_state >> 33) % n);
}

static binder_state *RS;
/* What each state emitted in a step (events and VMI deletions, in order):
 * [0] the state under test, [1] its twin; cut at the buffer's end. */
static char LOG[2][8192];
static int LOGK;

static void log_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_add(const char *fmt, ...)
{
    size_t at = strlen(LOG[LOGK]);
    va_list ap;
    va_start(ap, fmt);
    if(at < sizeof LOG[0] - 1)
        vsnprintf(LOG[LOGK] + at, sizeof LOG[0] - at, fmt, ap);
    va_end(ap);
}

static void rand_delete(void *ud, const char *ns, const char *vmi, const char *why)
{
    (void)ud;
    log_add("delete %s/%s (%s); ", ns, vmi, why);
    binder_state_set_vmi(RS, ns, vmi, BINDER_VMI_NONE, NULL, NULL);
}

static void rand_event(void *ud, const binder_event *e)
{
    (void)ud;
    log_add("%s %s->%s %s->%s %s; ", e->name, binder_phase_name(e->from), binder_phase_name(e->to),
            e->from_node ? e->from_node : "-", e->to_node ? e->to_node : "-", binder_reason_name(e->reason));
}

typedef struct snap {
    char rows[16][300];
    int n;
} snap;

static void snap_row(void *ud, const binder_claim_status *c)
{
    snap *s = ud;
    if(s->n < 16)
        snprintf(s->rows[s->n++], sizeof s->rows[0], "%s %s %s %s", c->name, binder_phase_name(c->phase),
                 c->node ? c->node : "-", binder_reason_name(c->reason));
}

/* Hooks of the random run, answering from their arguments alone (as
 * binder.h assumes): claim c3 is always over budget; a set of VM v1 takes
 * the last candidate and refuses a lone one; others take the first. */
static int rand_budget(void *ud, const binder_claim_status *c, char *why, size_t why_size)
{
    (void)ud, (void)why, (void)why_size;
    return strcmp(c->name, "c3") != 0;
}

static int rand_choose(void *ud, const binder_set_view *s, const binder_candidate *c, size_t n)
{
    (void)ud;
    (void)c;
    if(s->vm && !strcmp(s->vm, "v1"))
        return n == 1 ? -1 : (int)n - 1;
    return 0;
}

static const char *const NODES[4] = {"n0", "n1", "n2", "n3"};
static const char *const CLAIMS[12] = {"c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10", "c11"};
static const char *const VMS[4] = {"v0", "v1", "v2", "v3"};

static void rand_node(binder_state *st, const char *name)
{
    binder_offer o[2] = {{"a", rnd(4)}, {"b", rnd(3)}};
    uint32_t f = BINDER_NODE_READY | BINDER_NODE_SCHEDULABLE;
    binder_node_spec s = {f, o, 2, NULL, 0};
    binder_state_node_set(st, name, &s, NULL);
}

static unsigned long seen[BINDER_PHASE_LAST], transitions;
static void count_phase(void *ud, const binder_claim_status *c)
{
    (void)ud;
    seen[c->phase]++;
}

/* units and claims of one class by phase, from a walk of every claim */
typedef struct phase_sum {
    const char *cls;
    uint64_t units[BINDER_PHASE_LAST], claims[BINDER_PHASE_LAST];
} phase_sum;

static void sum_phase(void *ud, const binder_claim_status *c)
{
    phase_sum *p = ud;
    if(strcmp(c->class_name, p->cls) == 0) {
        p->units[c->phase] += c->count;
        p->claims[c->phase]++;
    }
}

/* binder_state_class_view's counts by phase against a walk of every claim;
 * 0 when they agree, else 1 with the first difference in d */
static int class_view_differs(const binder_state *st, const char *cls, char *d, size_t n)
{
    phase_sum want = {.cls = cls};
    binder_state_claims(st, sum_phase, &want);
    binder_class_view v;
    binder_state_class_view(st, cls, &v);
    for(int ph = 0; ph < BINDER_PHASE_LAST; ph++)
        if(v.claim_units[ph] != want.units[ph] || v.claims[ph] != want.claims[ph]) {
            snprintf(d, n, "class %s, %s: %llu units in %llu claims, the claims add up to %llu in %llu", cls,
                     binder_phase_name((binder_phase)ph), (unsigned long long)v.claim_units[ph],
                     (unsigned long long)v.claims[ph], (unsigned long long)want.units[ph],
                     (unsigned long long)want.claims[ph]);
            return 1;
        }
    return 0;
}

/* the held units of class cls in namespace t against a walk of every
 * claim in a holding phase (no promise is open between passes) */
static void sum_held(void *ud, const binder_claim_status *c)
{
    phase_sum *p = ud;
    if(strcmp(c->class_name, p->cls) == 0 && binder_phase_holds(c->phase))
        p->units[0] += c->count;
}

static int held_differs(const binder_state *st, const char *cls, char *d, size_t n)
{
    phase_sum want = {.cls = cls};
    binder_state_claims(st, sum_held, &want);
    uint64_t got = binder_state_held(st, "t", cls);
    long long w = walked(st, "t", cls);
    if(got == want.units[0] && w == (long long)got)
        return 0;
    snprintf(d, n, "class %s: held %llu, walked %lld, the claims hold %llu", cls, (unsigned long long)got, w,
             (unsigned long long)want.units[0]);
    return 1;
}

/* The pass the random run drives: binder_reconcile (incremental) for the
 * state under test, binder_reconcile_all (every claim) for its twin. */
static size_t (*RECONCILE)(binder_state *, const binder_hooks *) = binder_reconcile;

static int settle_random(binder_state *st, binder_hooks *h)
{
    for(int round = 0; round < 16; round++) {
        size_t n = RECONCILE(st, h);
        if(RECONCILE == binder_reconcile)
            transitions += n;
        int ran = 0;
        for(int v = 0; v < 4; v++) {
            binder_vmi_phase ph;
            if(binder_state_set_get(st, "t", VMS[v], &ph, NULL) || ph != BINDER_VMI_PENDING)
                continue;
            /* runs where all its claims are Bound, if that node takes pods */
            const char *where = NULL;
            int good = 1;
            for(int c = 0; c < 12; c++) {
                binder_claim_status cs;
                if(binder_state_claim_get(st, "t", CLAIMS[c], &cs) || c % 4 != v)
                    continue;
                if(cs.phase != BINDER_BOUND || (where && strcmp(where, cs.node)))
                    good = 0;
                else
                    where = cs.node;
            }
            uint32_t fl;
            if(good && where && !binder_node_flags(binder_state_index(st), where, &fl) &&
               (fl & BINDER_NODE_READY) && (fl & BINDER_NODE_SCHEDULABLE)) {
                char w[16];
                snprintf(w, sizeof w, "%s", where);
                binder_state_set_vmi(st, "t", VMS[v], BINDER_VMI_RUNNING, w, NULL);
                ran = 1;
            }
        }
        if(!n && !ran)
            return 0;
    }
    return -1;
}

/* The claims of VM v are c(v), c(v+4), c(v+8) that exist; re-put the set. */
static void rand_set(binder_state *st, int v, binder_vmi_phase ph, const char *node)
{
    const char *names[3];
    size_t n = 0;
    for(int c = v; c < 12; c += 4) {
        binder_claim_status cs;
        if(!binder_state_claim_get(st, "t", CLAIMS[c], &cs))
            names[n++] = CLAIMS[c];
    }
    if(n)
        binder_state_set_put(st, "t", VMS[v], names, n, ph, node, NULL);
    else
        binder_state_set_delete(st, "t", VMS[v], NULL);
}

/* Every claim's status (phase, node, attachedTo, reason, message) and
 * every VM's VMI alike in a and b; else 0 with the first difference in d. */
typedef struct rows {
    char r[16][600];
    int n;
} rows;

static void full_row(void *ud, const binder_claim_status *c)
{
    rows *s = ud;
    if(s->n < 16)
        snprintf(s->r[s->n++], sizeof s->r[0], "%s %s %s att=%s %s \"%s\"", c->name, binder_phase_name(c->phase),
                 c->node ? c->node : "-", c->attached_to ? c->attached_to : "-", binder_reason_name(c->reason),
                 c->message);
}

static int same_states(const binder_state *a, const binder_state *b, char *d, size_t dn)
{
    static rows ra, rb;
    ra.n = rb.n = 0;
    binder_state_claims(a, full_row, &ra);
    binder_state_claims(b, full_row, &rb);
    if(ra.n != rb.n) {
        snprintf(d, dn, "%d claims against %d", ra.n, rb.n);
        return 0;
    }
    for(int i = 0; i < ra.n; i++)
        if(strcmp(ra.r[i], rb.r[i])) {
            snprintf(d, dn, "incremental: %.600s; full pass: %.600s", ra.r[i], rb.r[i]);
            return 0;
        }
    for(int v = 0; v < 4; v++) {
        binder_vmi_phase pa = BINDER_VMI_NONE, pb = BINDER_VMI_NONE;
        const char *na = NULL, *nb = NULL;
        int ea = binder_state_set_get(a, "t", VMS[v], &pa, &na), eb = binder_state_set_get(b, "t", VMS[v], &pb, &nb);
        if(ea != eb || pa != pb || (na && nb ? strcmp(na, nb) != 0 : na != nb)) {
            snprintf(d, dn, "VM %s: VMI %s on %s against %s on %s", VMS[v], binder_vmi_phase_name(pa), na ? na : "-",
                     binder_vmi_phase_name(pb), nb ? nb : "-");
            return 0;
        }
    }
    return 1;
}

static int rand_step(binder_state *st, binder_hooks *h_, unsigned long step, int twin);

static void t_random(unsigned long steps, unsigned long long seed, int hooks)
{
    char name[120];
    snprintf(name, sizeof name, "random run, seed %llu, %lu steps%s", seed, steps,
             hooks ? ", budget and chooser hooks" : "");
    check_section = name;
    rng_state = seed;
    binder_state *st = binder_state_new(), *twin = binder_state_new();
    binder_hooks h = {NULL, hooks ? rand_choose : NULL, hooks ? rand_budget : NULL, rand_event, rand_delete};
    transitions = 0;
    memset(seen, 0, sizeof seen);
    for(int k = 0; k < 2; k++) {
        binder_state *s = k ? twin : st;
        binder_state_class_set(s, "a", BINDER_CORDON_MOVE, 0, NULL, 0, NULL);
        binder_state_class_set(s, "b", BINDER_CORDON_STAY, 0, NULL, 0, NULL);
        unsigned long long saved = rng_state;
        for(int i = 0; i < 4; i++)
            rand_node(s, NODES[i]);
        if(!k)
            rng_state = saved;
    }
    int bad = 0;
    for(unsigned long step = 0; step < steps && !bad; step++) {
        /* the step on the state under test (incremental passes), then the
         * same draws on its twin (full passes): both must end alike */
        unsigned long long saved = rng_state, after = 0;
        LOG[0][0] = LOG[1][0] = 0;
        for(int k = 0; k < 2 && !bad; k++) {
            LOGK = k;
            if(k) {
                after = rng_state;
                rng_state = saved;
            }
            bad = rand_step(k ? twin : st, &h, step, k);
        }
        if(bad)
            break;
        if(rng_state != after) {
            ok(0, "the twin replays the same draws", NULL);
            bad = 1;
            break;
        }
        RECONCILE = binder_reconcile;
        char d[1400];
        if(strcmp(LOG[0], LOG[1])) {
            char m[1500];
            snprintf(m, sizeof m, "step %lu: incremental: %.600s / full: %.600s", step, LOG[0], LOG[1]);
            ok(0, "incremental reconcile emits what a full pass emits, in order", m);
            bad = 1;
        } else if(!same_states(st, twin, d, sizeof d)) {
            char m[1500];
            snprintf(m, sizeof m, "step %lu: %s", step, d);
            ok(0, "incremental reconcile = a full pass after every step", m);
            bad = 1;
        }
    }
    if(!bad)
        ok(1, "random run", NULL);
    printf("random run%s: seed %llu, %lu steps, %lu transitions; claim-steps Pending %lu, Bound %lu, Attached %lu, "
           "Lost %lu%s\n",
           hooks ? " with hooks" : "", seed, steps, transitions, seen[BINDER_PENDING], seen[BINDER_BOUND], seen[BINDER_ATTACHED], seen[BINDER_LOST],
           bad ? " (failed: rerun with these to replay)" : "");
    binder_state_free(st);
    binder_state_free(twin);
}

/* One step of the random run on st (twin: 1 for the full-pass twin, whose
 * counts are not kept), settled and verified; 1 when a check failed. */
static int rand_step(binder_state *st, binder_hooks *h_, unsigned long step, int twin)
{
    binder_hooks h = *h_;
    int bad = 0;
    RS = st;
    RECONCILE = twin ? binder_reconcile_all : binder_reconcile;
    {
        unsigned op = rnd(12);
        const char *nd = NODES[rnd(4)];
        int ci = (int)rnd(12), v = (int)rnd(4);
        uint32_t fl = 0;
        binder_vmi_phase ph = BINDER_VMI_NONE;
        const char *on = NULL;
        switch(op) {
        case 0: /* a claim created (and named by its VM) or deleted */
        case 1: {
            binder_claim_status cs;
            if(binder_state_claim_get(st, "t", CLAIMS[ci], &cs)) {
                binder_state_claim_add(st, "t", CLAIMS[ci], rnd(2) ? "a" : "b", 1 + rnd(2), 0, NULL);
                binder_state_set_get(st, "t", VMS[ci % 4], &ph, &on);
                char keep[16] = "";
                if(on)
                    snprintf(keep, sizeof keep, "%s", on);
                rand_set(st, ci % 4, ph, keep[0] ? keep : NULL);
            } else
                binder_state_claim_delete(st, "t", CLAIMS[ci], NULL);
            break;
        }
        case 2: /* cordon / uncordon */
            if(!binder_node_flags(binder_state_index(st), nd, &fl))
                binder_state_node_flags(st, nd, fl ^ BINDER_NODE_SCHEDULABLE, NULL);
            break;
        case 3: /* NotReady / Ready */
            if(!binder_node_flags(binder_state_index(st), nd, &fl))
                binder_state_node_flags(st, nd, fl ^ BINDER_NODE_READY, NULL);
            break;
        case 4: /* layout pending / applied */
            if(!binder_node_flags(binder_state_index(st), nd, &fl))
                binder_state_node_flags(st, nd, fl ^ BINDER_NODE_LAYOUT_PENDING, NULL);
            break;
        case 5: /* capacity change (also a node coming back) */
            rand_node(st, nd);
            break;
        case 6: /* node deleted */
            binder_state_node_delete(st, nd, NULL);
            break;
        case 7: /* VM start */
            if(!binder_state_set_get(st, "t", VMS[v], &ph, NULL) &&
               (ph == BINDER_VMI_NONE || ph == BINDER_VMI_SUCCEEDED || ph == BINDER_VMI_FAILED))
                binder_state_set_vmi(st, "t", VMS[v], BINDER_VMI_PENDING, NULL, NULL);
            break;
        case 8: /* VMI ends */
            if(!binder_state_set_get(st, "t", VMS[v], &ph, &on) && (ph == BINDER_VMI_RUNNING || ph == BINDER_VMI_SCHEDULED)) {
                char keep[16];
                snprintf(keep, sizeof keep, "%s", on);
                binder_state_set_vmi(st, "t", VMS[v], rnd(2) ? BINDER_VMI_FAILED : BINDER_VMI_SUCCEEDED, keep, NULL);
            }
            break;
        case 9: /* VMI removed / VM stopped */
            if(!binder_state_set_get(st, "t", VMS[v], &ph, NULL))
                binder_state_set_vmi(st, "t", VMS[v], BINDER_VMI_NONE, NULL, NULL);
            break;
        case 10: { /* leader change on a settled state: nothing changes */
            snap before = {{{0}}, 0}, after = {{{0}}, 0};
            binder_state_claims(st, snap_row, &before);
            cozy_err err = {{0}};
            if(binder_state_restore(st, &err)) {
                ok(0, "restore", err.msg);
                bad = 1;
                break;
            }
            size_t n = RECONCILE(st, &h);
            binder_state_claims(st, snap_row, &after);
            int same = before.n == after.n && n == 0;
            for(int i = 0; same && i < before.n; i++)
                same = !strcmp(before.rows[i], after.rows[i]);
            if(!same) {
                char d[200];
                snprintf(d, sizeof d, "step %lu: %zu transitions after a leader change", step, n);
                ok(0, "a leader change on a settled state changes nothing", d);
                bad = 1;
            }
            break;
        }
        default: /* a VM's claim list changes (a claim added to or kept in its set) */
            if(!binder_state_set_get(st, "t", VMS[v], &ph, &on)) {
                char keep[16] = "";
                if(on)
                    snprintf(keep, sizeof keep, "%s", on);
                rand_set(st, v, ph, keep[0] ? keep : NULL);
            } else
                rand_set(st, v, BINDER_VMI_NONE, NULL);
            break;
        }
        if(bad)
            return 1;
        if(settle_random(st, &h)) {
            char d[80];
            snprintf(d, sizeof d, "step %lu (op %u) did not settle", step, op);
            ok(0, "the world settles", d);
            return 1;
        }
        if(!twin)
            binder_state_claims(st, count_phase, NULL);
        for(int k = 0; k < 2 && !bad; k++) {
            char d[400];
            if(class_view_differs(st, k ? "b" : "a", d, sizeof d)) {
                char dd[480];
                snprintf(dd, sizeof dd, "step %lu (op %u): %s", step, op, d);
                ok(0, "the class view counts every claim by phase", dd);
                bad = 1;
            }
            if(!bad && held_differs(st, k ? "b" : "a", d, sizeof d)) {
                char dd[480];
                snprintf(dd, sizeof dd, "step %lu (op %u): %s", step, op, d);
                ok(0, "the held units are those of the claims in a holding phase", dd);
                bad = 1;
            }
        }
        cozy_err err = {{0}};
        if(binder_state_verify(st, &err)) {
            char d[1200];
            snprintf(d, sizeof d, "step %lu (op %u)%s: %s", step, op, twin ? " (full-pass twin)" : "", err.msg);
            ok(0, "state verifies", d);
            bad = 1;
        }
    }
    return bad;
}

int main(int argc, char **argv)
{
    unsigned long steps = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000;
    unsigned long long seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 12;
    t_set_one_node();
    t_lost_first();
    t_keeps_node();
    t_cordon();
    t_not_ready();
    t_leave_attached();
    t_delete_pending_vmi();
    t_class_deleting();
    t_held();
    t_no_overcommit_and_restore();
    t_budget();
    t_chooser();
    t_bad_input();
    t_taints();
    t_lazy_many_classes();
    t_no_gain_yet();
    t_random(steps, seed, 0);
    t_random(steps, seed, 1);
    return check_finish();
}
