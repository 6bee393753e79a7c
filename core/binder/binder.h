/* binder.h — the binder's rules (DESIGN.md §6, decision 0020) as a
 * deterministic state machine over the index (binder/index.h).
 *
 * No API, no threads, no Lua: the caller feeds it what the watches say
 * (classes, nodes, claims, VMIs), calls binder_reconcile, and gets back
 * every claim transition as an event record and every VMI the rules want
 * deleted. The leader drives it from its watches; `cozygpu simulate`
 * drives it from a scenario. The same inputs in the same order always give
 * the same transitions (claims are walked in creation order, sets in the
 * creation order of their oldest claim).
 *
 * What it holds:
 *   - classes: name, onCordon (Move | Stay), being deleted, tolerations
 *     (the set's tolerations are the union of its classes');
 *   - nodes: what the index holds (units per class, Ready, schedulable,
 *     layout change pending, GPU taints), kept also as given so that a
 *     leader change can rebuild the index;
 *   - claims: namespace/name, class, count, ordered or template, and the
 *     status decision 0020 defines: phase (Pending, Bound, Attached,
 *     Lost), node, attachedTo, one condition reason and message;
 *   - sets: a VM's or VMI's name (a VMI has its VM's name in KubeVirt), the
 *     claims it names (annotation gpu.cozystack.io/claims), and its VMI's
 *     phase (none, Pending, Scheduled, Running, Succeeded, Failed) and node.
 *     A set with no VMI is a stopped VM: its claims still go to ONE node
 *     (DESIGN.md §6 "all claims one VM names go to one node"). A claim no
 *     set names is a set of its own.
 *
 * Units held: a Bound or Attached claim holds `count` units of its class
 * on its node in the index. A Lost claim holds none, except one waiting
 * for its VMI to end on a NotReady node (reason WaitingForVMIEnd, node
 * kept): its units stay booked there, so that the node's return finds
 * them free for the claim to go back to Attached (DESIGN.md §6), and a
 * leader change restores them from status.node (binder_state_restore).
 *
 * Names are copied. Strings in events and views are borrowed: valid until
 * the next call that changes the state. Errors are binder_rc values with a
 * message naming the object and field in `err` (may be NULL); a call that
 * fails leaves the state as it was.
 */
#ifndef COZYGPU_BINDER_BINDER_H
#define COZYGPU_BINDER_BINDER_H

#include <stddef.h>
#include <stdint.h>

#include "base/result.h"
#include "binder/index.h"

/* Claim phases (DESIGN.md §3, decision 0020). */
typedef enum binder_phase {
    BINDER_PENDING = 0, /* no node yet */
    BINDER_BOUND,       /* units held on a node */
    BINDER_ATTACHED,    /* a running VMI uses it */
    BINDER_LOST,        /* its node is gone or NotReady, or lost the capacity, and no other node has room */
    BINDER_PHASE_LAST
} binder_phase;

/* VMI phases as the binder sees them (KubeVirt VirtualMachineInstance
 * status.phase, reduced); BINDER_VMI_NONE: the VM exists, no VMI. */
typedef enum binder_vmi_phase {
    BINDER_VMI_NONE = 0,
    BINDER_VMI_PENDING,   /* created, not scheduled (launcher pod gated or unscheduled) */
    BINDER_VMI_SCHEDULED, /* its pod has a node, not running yet */
    BINDER_VMI_RUNNING,
    BINDER_VMI_SUCCEEDED, /* final */
    BINDER_VMI_FAILED,    /* final */
    BINDER_VMI_PHASE_LAST
} binder_vmi_phase;

/* Condition reasons (decision 0020 §2; an API: never rename one). */
typedef enum binder_reason {
    BINDER_R_NONE = 0,
    BINDER_R_PLACED,
    BINDER_R_ATTACHED,
    BINDER_R_NO_NODE_WITH_ROOM,
    BINDER_R_OVER_BUDGET,
    BINDER_R_CLASS_NOT_FOUND,
    BINDER_R_CLASS_BEING_DELETED,
    BINDER_R_NODE_CORDONED,
    BINDER_R_NODE_LOST,
    BINDER_R_WAITING_FOR_VMI_END,
    BINDER_R_LAYOUT_CHANGE_PENDING,
    BINDER_R_LAST
} binder_reason;

/* Static names: "Pending", "Running", "NoNodeWithRoom", ... Never NULL. */
const char *binder_phase_name(binder_phase p);
const char *binder_vmi_phase_name(binder_vmi_phase p);
const char *binder_reason_name(binder_reason r);

/* Parse those names back (exact, case-sensitive). Return 0 on success and
 * -1 for an unknown name (*out unchanged). */
int binder_phase_parse(const char *s, binder_phase *out);
int binder_vmi_phase_parse(const char *s, binder_vmi_phase *out);
int binder_reason_parse(const char *s, binder_reason *out);

/* GPUClass spec.onCordon (DESIGN.md §3, §6). */
typedef enum binder_on_cordon { BINDER_CORDON_MOVE = 0, BINDER_CORDON_STAY } binder_on_cordon;

/* A claim as the state machine holds it (borrowed strings, see above). */
typedef struct binder_claim_status {
    const char *ns;
    const char *name;
    const char *class_name;
    uint32_t count;
    int template_claim;     /* 1: created for a VMI (DESIGN.md §3); 0: ordered */
    binder_phase phase;
    const char *node;       /* status.node, NULL when none */
    const char *attached_to; /* status.attachedTo (a VMI name in ns), NULL when none */
    binder_reason reason;
    const char *message;    /* "" when none */
} binder_claim_status;

/* One claim transition (decision 0020: status.phase, status.node and the
 * Ready condition's reason). `from_node`/`to_node` are NULL for none. An
 * event is also recorded when only the node or the reason changed. */
typedef struct binder_event {
    const char *ns;
    const char *name;
    binder_phase from, to;
    const char *from_node, *to_node;
    binder_reason reason;
    const char *message;
} binder_event;

/* A claim set handed to the chooser and the budget hook: the claims' views
 * (status before the bind) and the set's name (the VM/VMI; NULL for a lone
 * claim). */
typedef struct binder_set_view {
    const char *ns;
    const char *vm; /* NULL: a lone claim */
    const binder_claim_status *claims;
    size_t n;
} binder_set_view;

/* The hooks binder_reconcile calls. Every member may be NULL (defaults
 * below). `ud` is passed back to each.
 *   choose: picks one of the n >= 1 candidates (index packing order, at
 *     most BINDER_MAX_CANDIDATES) for a set; returns its position, or -1
 *     to place the set nowhere this pass (reason NoNodeWithRoom). Default:
 *     0, the index's packing order (most-allocated first). `cozygpu
 *     simulate` plugs policies/binder.lua in here (engine_binder_choose,
 *     decision 0024).
 *   budget: called once per claim that would go Pending -> Bound (never
 *     for a Lost rebind or a move: DESIGN.md §5); returns 1 to allow, 0 to
 *     refuse (the set stays Pending, each Pending claim of it with reason
 *     OverBudget; decision 0020 §3). On a refusal the hook may write why
 *     into `why` (why_size bytes, "" on entry): the waiting claims' message
 *     is then "claim NAME: <why>" (the tenant, key and limit: decision
 *     0024), else a generic one. Default: allow. Called serially, in
 *     the order claims are bound, so the hook may count what it allowed.
 *   event: each claim transition, in order.
 *   delete_vmi: a set leaves its node (moved, or Lost) while its VMI
 *     exists but is not yet scheduled (DESIGN.md §6): the controller
 *     deletes that VMI, whose launcher pod was pinned to the old node; the
 *     set is moved in the same pass, so a new VMI of the VM is pinned to
 *     the new node. Called once per such set and pass. `why` is a static
 *     text. */
typedef struct binder_hooks {
    void *ud;
    int (*choose)(void *ud, const binder_set_view *set, const binder_candidate *cands, size_t n);
    int (*budget)(void *ud, const binder_claim_status *claim, char *why, size_t why_size);
    void (*event)(void *ud, const binder_event *ev);
    void (*delete_vmi)(void *ud, const char *ns, const char *vmi, const char *why);
} binder_hooks;

/* Candidates asked of the index per set (decision 0020 §4). */
#define BINDER_MAX_CANDIDATES 32
/* Claims one set may name (binder_bind_set's ceiling). */
#define BINDER_MAX_SET_CLAIMS 64

typedef struct binder_state binder_state;

/* A new, empty state with its own index (caller owns it;
 * binder_state_free). NULL when out of memory. */
binder_state *binder_state_new(void);

/* Frees the state and its index. NULL is a no-op. */
void binder_state_free(binder_state *st);

/* The index the state drives (borrowed; for checks and stats: change it
 * only through the state). */
const binder_index *binder_state_index(const binder_state *st);

/* ------------------------------------------------------------- classes */

/* Creates class `name` or replaces what is known of it: onCordon, being
 * deleted (metadata.deletionTimestamp set) and tolerations (copied; the
 * strings of each binder_toleration). Errors: BINDER_ERR_INPUT (empty or
 * long name, more than 32 tolerations), BINDER_ERR_MEMORY. */
binder_rc binder_state_class_set(binder_state *st, const char *name, binder_on_cordon on_cordon, int deleting,
                                 const binder_toleration *tols, size_t n_tols, cozy_err *err);

/* Forgets class `name` (claims of it wait with ClassNotFound when
 * Pending). Errors: BINDER_ERR_INPUT when unknown. */
binder_rc binder_state_class_delete(binder_state *st, const char *name, cozy_err *err);

/* --------------------------------------------------------------- nodes */

/* Creates node `name` or replaces what is known of it (binder_node_upsert
 * plus a copy kept for binder_state_restore). Claims bound there stay
 * bound; binder_reconcile applies the rules (a capacity drop moves
 * unattached claims away). Errors: those of binder_node_upsert. */
binder_rc binder_state_node_set(binder_state *st, const char *name, const binder_node_spec *spec, cozy_err *err);

/* Sets only the flags (BINDER_NODE_*) of a known node: cordon, NotReady,
 * layout pending. Errors: BINDER_ERR_NO_NODE. */
binder_rc binder_state_node_flags(binder_state *st, const char *name, uint32_t flags, cozy_err *err);

/* The node is deleted: its claims' units are released at once (the index
 * forgets the node); binder_reconcile then moves their sets or marks them
 * Lost. Errors: BINDER_ERR_NO_NODE. */
binder_rc binder_state_node_delete(binder_state *st, const char *name, cozy_err *err);

/* -------------------------------------------------------------- claims */

/* A new claim (a GPUClaim created): Pending, no node. The class need not
 * exist (the claim then waits with ClassNotFound). Errors:
 * BINDER_ERR_INPUT (empty/long names, count 0 or above BINDER_MAX_UNITS),
 * BINDER_ERR_BOUND (known already: the spec is immutable, a change is a
 * new claim), BINDER_ERR_MEMORY. */
binder_rc binder_state_claim_add(binder_state *st, const char *ns, const char *name, const char *class_name,
                                 uint32_t count, int template_claim, cozy_err *err);

/* A claim restored from its status (a new leader's list, decision 0020
 * §1): like binder_state_claim_add, then phase/node/attachedTo/reason as
 * given (node NULL for none). Bound and Attached claims, and a Lost one
 * with a node, are booked in the index by binder_state_restore, not here.
 * Errors: those of binder_state_claim_add; BINDER_ERR_INPUT for a Bound or
 * Attached claim without a node. */
binder_rc binder_state_claim_put(binder_state *st, const binder_claim_status *status, cozy_err *err);

/* The claim is gone (deleted): its units are released at once, no event.
 * Errors: BINDER_ERR_NO_CLAIM. */
binder_rc binder_state_claim_delete(binder_state *st, const char *ns, const char *name, cozy_err *err);

/* The status of claim ns/name (borrowed strings). Errors: BINDER_ERR_NO_CLAIM. */
binder_rc binder_state_claim_get(const binder_state *st, const char *ns, const char *name, binder_claim_status *out);

/* One class as the state holds it: the index's units (offered and bound
 * over all nodes; free and max_free over the nodes a new set of the class,
 * with the class's tolerations, could be placed on: binder_class_units_get,
 * both 0 while the class is not known or is being deleted, since no new
 * order of it is placed: DESIGN.md §6), and the claims naming it and their
 * units by phase (index binder_phase). */
typedef struct binder_class_view {
    binder_class_units units;
    uint64_t claim_units[BINDER_PHASE_LAST];
    uint64_t claims[BINDER_PHASE_LAST];
} binder_class_view;

/* The view of class `name` (GPUClass status.free and status.maxFreePerNode,
 * DESIGN.md §3; the per-class metrics of decision 0030). All zero for a name no
 * node, claim or class carries. O(pools of the class): the counts are kept
 * as claims and nodes change, never counted per call. */
void binder_state_class_view(const binder_state *st, const char *name, binder_class_view *out);

/* Units a claim in phase p holds against its tenant's budgets at bind
 * (DESIGN.md §5, decision 0020 §3): Bound, Attached and Lost (a Lost
 * claim keeps counting while it waits for a node). 1 or 0. */
int binder_phase_holds(binder_phase p);

/* The units namespace `ns` holds of class `class_name`: its claims in a
 * phase that holds (binder_phase_holds) plus its promised Pending ones.
 * Kept as claims come, change phase and go: O(1), never a walk of claims.
 * 0 for a pair no claim holds or a name too long. */
uint64_t binder_state_held(const binder_state *st, const char *ns, const char *class_name);

/* Walks the (namespace, class) pairs holding units (> 0), in the order
 * they began holding: *pos NULL starts; each call sets *ns, *class_name
 * (borrowed: valid until the state changes) and *units and returns 1, or
 * 0 at the end. The state must not change during a walk. The budget
 * check at bind reads it (decision 0044): O(pairs holding units). */
int binder_state_held_next(const binder_state *st, const void **pos, const char **ns, const char **class_name,
                           uint64_t *units);

/* The budget check allowed Pending claim ns/name (DESIGN.md §5, decision
 * 0020 §3): its units count as held at once, so the set's next claims and
 * later sets of the pass see them, until its phase next changes (bound:
 * it then holds them as a claim; waiting: they are released), it is
 * deleted, or binder_state_held_settle. Promising twice is once. Errors:
 * BINDER_ERR_NO_CLAIM, BINDER_ERR_INPUT (not Pending), BINDER_ERR_MEMORY. */
binder_rc binder_state_held_promise(binder_state *st, const char *ns, const char *name, cozy_err *err);

/* Releases every promise still open (a pass ended, or a set refused by
 * its budget waits whole). */
void binder_state_held_settle(binder_state *st);

/* Calls fn for every claim in creation order. fn must not change the state. */
void binder_state_claims(const binder_state *st, void (*fn)(void *ud, const binder_claim_status *c), void *ud);

/* ---------------------------------------------------------------- sets */

/* Creates or replaces the set of VM (or bare VMI) ns/name: the claims it
 * names (the annotation's list, in order), its VMI's phase and node (node
 * NULL unless Scheduled, Running, or final after running). Errors:
 * BINDER_ERR_INPUT (empty/long name, no claims or more than
 * BINDER_MAX_SET_CLAIMS, a claim named twice, a node given with phase
 * none or Pending), BINDER_ERR_NO_CLAIM (a claim not known: the message
 * names it), BINDER_ERR_BOUND (a claim another set names), BINDER_ERR_MEMORY.
 * On error the set is as before. */
binder_rc binder_state_set_put(binder_state *st, const char *ns, const char *name, const char *const *claims,
                               size_t n_claims, binder_vmi_phase phase, const char *node, cozy_err *err);

/* Only the VMI of set ns/name changed (phase, node as above).
 * Errors: BINDER_ERR_NO_CLAIM (no such set), BINDER_ERR_INPUT. */
binder_rc binder_state_set_vmi(binder_state *st, const char *ns, const char *name, binder_vmi_phase phase,
                               const char *node, cozy_err *err);

/* The VM (and its VMI) is gone: its claims become lone sets.
 * Errors: BINDER_ERR_NO_CLAIM (no such set). */
binder_rc binder_state_set_delete(binder_state *st, const char *ns, const char *name, cozy_err *err);

/* Nodes one set may be limited to (binder_state_set_nodes). */
#define BINDER_MAX_SET_NODES 32

/* Limits set ns/name to the nodes `nodes[0..n)` (copied; n 0 lifts the
 * limit): its claims are placed, moved and rebound only there (DESIGN.md
 * §6: "a set placed after a WaitForFirstConsumer volume bound is limited
 * to the nodes the volume's node affinity allows"). Claims already bound
 * elsewhere keep their node. Candidates are the listed nodes that pass
 * binder_node_candidate, in the order given. Marks the set when the list
 * changes. Errors: BINDER_ERR_NO_CLAIM (no such set), BINDER_ERR_INPUT
 * (more than BINDER_MAX_SET_NODES, an empty or long name), BINDER_ERR_MEMORY
 * (the set is as before). */
binder_rc binder_state_set_nodes(binder_state *st, const char *ns, const char *name, const char *const *nodes,
                                 size_t n, cozy_err *err);

/* The name of the set (VM or VMI, same namespace) that names claim
 * ns/name, or NULL when none does or the claim is unknown (borrowed). */
const char *binder_state_claim_set(const binder_state *st, const char *ns, const char *name);

/* The VMI phase and node of set ns/name. Errors: BINDER_ERR_NO_CLAIM. */
binder_rc binder_state_set_get(const binder_state *st, const char *ns, const char *name, binder_vmi_phase *phase,
                               const char **node);

/* ----------------------------------------------------------- reconcile */

/* One pass of DESIGN.md §6, incremental: it gives the same statuses,
 * events (in the same order) and delete_vmi calls as binder_reconcile_all
 * would on the same state, but looks only at the sets an input since the
 * last pass can have changed:
 *   - the sets of the claims marked by the calls above: a node set, its
 *     flags set or deleted marks the claims booked there; a claim created
 *     or put marks itself, deleted marks the rest of its set; a set put,
 *     deleted or its VMI changed marks its claims; a claim whose status
 *     changed in a pass is looked at again by the next;
 *   - the sets on an over-committed node one of those touches;
 *   - the waiting sets (a claim whose reason is neither Placed,
 *     Attached nor WaitingForVMIEnd: Pending, Lost, held on a cordoned,
 *     NotReady or layout-pending node) of each class that gained room on a usable
 *     node (Ready, schedulable, no layout pending) since it was last
 *     retried: a node set or its flags set usable, a claim released there
 *     (deleted, moved away, Lost); room freed by a move in this pass is
 *     retried by the next;
 *   - every set waiting on a hook's answer (OverBudget, or a chooser that
 *     took none of its candidates), as a full pass asks them again.
 * A class set or deleted, binder_state_restore, or an allocation failure
 * makes the next pass a full one. Hooks are assumed to answer from their
 * arguments (and, for budget, from what they allowed): a chooser that
 * changes its mind with no input changing is asked again only when the
 * set is looked at. Cost: O(claims looked at x log) plus the index's
 * candidate queries for those sets; an event touching one node or one set
 * costs no walk of every claim. Returns what binder_reconcile_all returns. */
size_t binder_reconcile(binder_state *st, const binder_hooks *hooks);

/* One pass of DESIGN.md §6 over every claim (the reference the
 * incremental binder_reconcile must equal; spec/core/binder_rules_check.c
 * runs both side by side), in this order:
 *  1. status upkeep, claim by claim (creation order):
 *     - a claim whose set's VMI runs on the claim's node goes Attached
 *       (attachedTo the VMI); an Attached claim whose VMI is final or
 *       removed leaves Attached (Bound on its node, or Lost/moved by the
 *       rules below) — never on anything else;
 *     - its node NotReady or deleted while Attached: Lost, reason
 *       WaitingForVMIEnd (node kept while the node exists); back to
 *       Attached if the node is Ready again while the VMI runs there;
 *       released (unbound, node cleared, reason NodeLost) once the VMI is
 *       final or removed, and rebound below;
 *  2. sets that must move (unattached, VMI neither Scheduled nor Running):
 *     node deleted, layout change pending, the class's units on the node
 *     below what is bound (the most recently bound go first; Attached
 *     claims never move), or cordoned with onCordon Move for any class of
 *     the set (Stay: it keeps the node, reason NodeCordoned), or NotReady
 *     while the set's VMI is Pending (a stopped VM's set keeps a NotReady
 *     node). A set Scheduled on a deleted node goes Lost (WaitingForVMIEnd).
 *     It moves to a candidate, binding there before releasing the old
 *     node; with no candidate it keeps its hold (cordon, layout, NotReady:
 *     reason NodeCordoned / LayoutChangePending / NodeLost) or, its node
 *     being gone or without the capacity, goes Lost (NodeLost). When the set leaves its
 *     node (moved or Lost) while its VMI exists and is Pending, delete_vmi
 *     is asked for that VMI in the same pass (its launcher pod was pinned
 *     to the old node); a set that keeps its hold keeps its VMI;
 *  3. placement: Lost sets first, then Pending sets (each group in the
 *     creation order of its oldest claim); each is tried on its own
 *     candidates, so a Lost set that fits nowhere
 *     never blocks a smaller one that fits (decision 0020 §4). A Pending
 *     claim of a missing class waits (ClassNotFound), of a class being
 *     deleted waits (ClassBeingDeleted; Lost claims of it still rebind,
 *     Bound and Attached ones keep their node); the budget hook may refuse
 *     (OverBudget); no candidate: NoNodeWithRoom (Lost: NodeLost).
 * A set binds all or nothing (binder_bind_set), never past what a node
 * offers. Where DESIGN.md §6 is silent, decision 0021 says what is done.
 * `hooks` may be NULL. Returns the number of events (claim
 * transitions) emitted; 0 means the state is settled for these inputs.
 * O(claims + nodes) and a candidate query per waiting set: for
 * `cozygpu simulate`, checks and a new leader's first pass. */
size_t binder_reconcile_all(binder_state *st, const binder_hooks *hooks);

/* A leader change (decision 0020 §1): forgets the index and rebuilds it
 * from the nodes as last given and the claims' status alone (phase, node):
 * Bound, Attached, and Lost claims with a node are booked with
 * BINDER_BIND_RESTORE (never refused; an overcommit is reported by
 * binder_verify's counts, not hidden). Sets, classes and VMIs are kept
 * (the watches give them again). Errors: BINDER_ERR_MEMORY (the state is
 * then unusable: free it). */
binder_rc binder_state_restore(binder_state *st, cozy_err *err);

/* Checks the state against the rules that must always hold: the index is
 * consistent (binder_verify), no node holds more units of a class than it
 * offers unless the capacity dropped under Attached claims, every Bound or
 * Attached claim is booked on its node in the index and nothing else is,
 * no claim is Attached to a VMI that is final or gone, every Pending or
 * Lost claim has a reason. Returns BINDER_OK or BINDER_ERR_INPUT with the
 * first broken rule in err. O(everything). */
binder_rc binder_state_verify(const binder_state *st, cozy_err *err);

#endif
