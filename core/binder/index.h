/* index.h — the binder's index: nodes, claims, and the free units of every
 * GPU class on every node, kept so that the nodes able to take a claim set
 * are found without scanning the cluster (DESIGN.md §6;
 * decisions 0022 and 0041).
 *
 * The leader feeds it from its watches (one call per event: a node
 * changed, a claim created, bound, unbound, deleted) and asks it for
 * candidates when a set waits. It holds no Kubernetes objects, only what
 * placement needs:
 *
 *   - a node: its name; per class the units it offers (the caller computes
 *     them as decision 0022 says: GPUNode functions carrying the
 *     class's resource name, an IOMMU group counted once, capped at the
 *     Node's status.allocatable, minus raw-name use); the flags Ready,
 *     schedulable (not cordoned) and layout change pending; its
 *     `gpu.cozystack.io/` taints with effect NoSchedule or NoExecute;
 *   - a claim: namespace/name, class, count (GPUs, on one node), and the
 *     node it is bound to or none. A bound claim holds `count` units of its
 *     class on its node (DESIGN.md §3: only Bound and Attached claims hold
 *     GPUs; the caller unbinds a Lost claim);
 *   - per class, buckets of nodes by free units (offered minus bound).
 *
 * Candidates (DESIGN.md §6): a node is a candidate for a set when it is
 * Ready, schedulable, has no pending layout change, the set's tolerations
 * cover its `gpu.cozystack.io/` taints, and it has enough free units of
 * every class of the set. Nodes failing the first three are out of the
 * buckets altogether (a flag change moves them out or back in, O(classes
 * on the node)). Nodes of one shape (the same GPU taints and the same
 * classes offered) share a pool per class, and a query checks the
 * tolerations and the set's classes once per pool, never per node: a
 * two-class set never walks the nodes that offer only one of its classes.
 * So a one-class query costs O(pools x distinct free values + the nodes it
 * returns), whatever the number of nodes; the pools of a class are as many
 * as the shapes offering it (node models x GPU taint sets: tens, not
 * thousands, on a real cluster).
 *
 * Packing order (DESIGN.md §6: "the default heuristic packs, most-allocated
 * first, so that whole nodes stay free for large sets"): nodes that already
 * hold units of the class come before untouched ones; within each group,
 * fewest free units first (best fit); among equals, the node that has
 * waited longest at that level first. The list is bounded (`max`), so a
 * caller can hand it to Lua (policies/binder.lua, later) to filter and
 * score without ever calling Lua once per node of the cluster.
 *
 * The invariant the index keeps: a bind never makes a node hold more units
 * of a class than it offers (BINDER_ERR_NO_ROOM). A capacity drop below
 * what is bound is recorded, not repaired: the claims stay bound, the node
 * reports the overcommit, and the caller decides which claims go Lost.
 *
 * Names are copied; every pointer the index returns (node names in
 * candidates and views) is borrowed and valid until the object it belongs
 * to is deleted or the index freed. Not thread-safe: the leader's binder
 * is one serialized loop (DESIGN.md §5: the leader's serialized bind is the
 * hard guarantee). Errors are numbered (binder_rc); functions taking a
 * `cozy_err *` also write a message naming the object and field there (it
 * may be NULL).
 */
#ifndef COZYGPU_BINDER_INDEX_H
#define COZYGPU_BINDER_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "base/result.h"

/* What a binder call can answer. BINDER_OK is zero. */
typedef enum binder_rc {
    BINDER_OK = 0,
    BINDER_ERR_INPUT,     /* malformed argument: empty or too long name, count 0, bad effect, ... */
    BINDER_ERR_MEMORY,    /* an allocation failed; the index is as before the call */
    BINDER_ERR_NO_NODE,   /* no node of that name */
    BINDER_ERR_NO_CLAIM,  /* no claim of that namespace/name */
    BINDER_ERR_CHANGED,   /* the claim exists with another class or count (a claim's spec is immutable) */
    BINDER_ERR_BOUND,     /* the claim is already bound (or named twice in one set) */
    BINDER_ERR_NOT_BOUND, /* the claim is not bound */
    BINDER_ERR_NO_ROOM,   /* the node has fewer free units of the class than the claims need */
    BINDER_RC_LAST
} binder_rc;

/* A static name for `rc` ("no room on node", ...). Never NULL. */
const char *binder_strerror(binder_rc rc);

/* Ceilings of what the index takes (BINDER_ERR_INPUT past them). */
#define BINDER_MAX_NAME 253      /* node, claim and class names (Kubernetes object names) */
#define BINDER_MAX_NAMESPACE 63  /* a namespace is a DNS label */
#define BINDER_MAX_UNITS 4096    /* units of one class on one node; count of one claim */
#define BINDER_MAX_TAINT_KEY 316 /* prefix 253 + '/' + name 62, as Kubernetes allows */
#define BINDER_MAX_TAINT_VALUE 63
#define BINDER_MAX_SET_CLASSES 16 /* distinct classes in one set query or one bound set */

/* The taint prefix the binder owns (DESIGN.md §3, §6); other taints are the
 * scheduler's business and are ignored by binder_node_upsert. */
#define BINDER_TAINT_PREFIX "gpu.cozystack.io/"

/* Node flags (binder_node_spec.flags, binder_node_set_flags). */
#define BINDER_NODE_READY 0x1u          /* Node condition Ready is True */
#define BINDER_NODE_SCHEDULABLE 0x2u    /* not cordoned (spec.unschedulable false) */
#define BINDER_NODE_LAYOUT_PENDING 0x4u /* GPUNode: a layout change is pending */

typedef struct binder_index binder_index;

/* One class a node offers: `units` GPUs (or vGPUs) of class `class_name`. */
typedef struct binder_offer {
    const char *class_name;
    uint32_t units;
} binder_offer;

/* A Node taint: key, value (NULL is ""), effect "NoSchedule",
 * "PreferNoSchedule" or "NoExecute" (Kubernetes core/v1 Taint). */
typedef struct binder_taint {
    const char *key;
    const char *value;
    const char *effect;
} binder_taint;

/* A pod toleration (Kubernetes core/v1 Toleration): `key` NULL or "" with
 * operator "Exists" tolerates every key; `op` "Exists" or "Equal" (NULL or
 * "" is "Equal", Kubernetes' default); `value` NULL is ""; `effect` NULL or
 * "" matches every effect. tolerationSeconds plays no part in placement. */
typedef struct binder_toleration {
    const char *key;
    const char *op;
    const char *value;
    const char *effect;
} binder_toleration;

/* What a node is now: flags (BINDER_NODE_*), the classes it offers (a class
 * named twice adds up) and its taints (all of them may be passed: only
 * BINDER_TAINT_PREFIX keys with effect NoSchedule or NoExecute are kept,
 * the two effects the scheduler filters on; PreferNoSchedule only steers
 * scoring, so it never takes a node out of the candidates). */
typedef struct binder_node_spec {
    uint32_t flags;
    const binder_offer *offers;
    size_t n_offers;
    const binder_taint *taints;
    size_t n_taints;
} binder_node_spec;

/* A claim as the index holds it. Strings are borrowed (see above);
 * `node` is NULL while unbound. */
typedef struct binder_claim_view {
    const char *ns;
    const char *name;
    const char *class_name;
    uint32_t count;
    const char *node;
    void *tag; /* the caller's (binder_claim_tag), NULL when none */
} binder_claim_view;

/* Called once per claim by the functions that walk claims. */
typedef void (*binder_claim_fn)(void *ud, const binder_claim_view *claim);

/* One class of a node: units offered and units held by bound claims.
 * `bound > offered` is an overcommit left by a capacity drop. */
typedef struct binder_slot_view {
    uint32_t offered;
    uint32_t bound;
} binder_slot_view;

/* One class of a set and the units it needs on the node (the counts of the
 * set's claims of that class added up; a class named twice adds up). */
typedef struct binder_need {
    const char *class_name;
    uint32_t units;
} binder_need;

/* A set query: the needs of the set (all must fit on ONE node), the set's
 * tolerations (the union of its classes' spec.tolerations), and a ceiling
 * on the nodes examined (0: none). The ceiling only matters for a set of
 * several classes, where a node with room for the first class may lack
 * the others: it bounds the work per query at the price of missing a fit
 * further down the packing order. */
typedef struct binder_query {
    const binder_need *needs;
    size_t n_needs;
    const binder_toleration *tolerations;
    size_t n_tolerations;
    size_t max_examined;
} binder_query;

/* One candidate node. `free`, `bound` and `offered` add up the set's
 * classes on that node, as they are before the set is placed. */
typedef struct binder_candidate {
    const char *node;
    uint32_t free;
    uint32_t bound;
    uint32_t offered;
} binder_candidate;

/* Counts, for metrics and checks. */
typedef struct binder_stats {
    size_t nodes;      /* nodes known */
    size_t listed;     /* node classes in the buckets (candidate for something) */
    size_t claims;     /* claims known */
    size_t bound;      /* of which bound */
    size_t overcommit; /* node classes holding more than they offer */
    size_t classes;    /* classes known (named by a node or a claim) */
    size_t shapes;     /* distinct node shapes seen (GPU taints + classes offered) */
} binder_stats;

/* ---------------------------------------------------------------- index */

/* A new, empty index (caller owns it; binder_free). NULL when out of memory. */
binder_index *binder_new(void);

/* Frees the index and everything in it. NULL is a no-op. */
void binder_free(binder_index *ix);

/* Counts (see binder_stats). O(1). */
void binder_stats_get(const binder_index *ix, binder_stats *out);

/* Walks every node, claim and bucket and checks the index against its own
 * rules: bound units = the counts of the claims bound there, a node class
 * is listed iff the node is Ready, schedulable, not pending and has free
 * units, in the bucket of its free units and packing group, in the pool of
 * its taints. O(everything): for checks and fault runs, not the event path.
 * Returns BINDER_OK, or BINDER_ERR_INPUT with the first broken rule in err. */
binder_rc binder_verify(const binder_index *ix, cozy_err *err);

/* ---------------------------------------------------------------- nodes */

/* Creates node `name` or replaces what is known of it (an event of the
 * Node or GPUNode watch: capacity change, cordon, NotReady, taints, layout
 * pending). Claims bound there stay bound, also when a class's units drop
 * below what is bound (or the class disappears: its offer becomes 0): then
 * `*overcommitted` (may be NULL) is the number of the node's classes that
 * hold more than they offer, and the caller picks the claims that go Lost
 * (binder_node_claims, binder_unbind). Rule source: decision 0022,
 * DESIGN.md §6 ("a claim keeps its node while the node exists, matches the
 * class, has capacity ..."). O(classes on the node + taints).
 * Errors: BINDER_ERR_INPUT (empty or long name, class name, a unit count
 * above BINDER_MAX_UNITS or adding up past it, a taint with a bad effect or
 * key), BINDER_ERR_MEMORY; on error the node is as before. */
binder_rc binder_node_upsert(binder_index *ix, const char *name, const binder_node_spec *spec, size_t *overcommitted,
                             cozy_err *err);

/* Sets a known node's flags only (BINDER_NODE_*): the cheap path for
 * cordon/uncordon, NotReady/Ready, layout pending. O(classes on the node).
 * A NotReady node keeps its claims bound (DESIGN.md §6: the caller marks
 * attached claims Lost and unbinds them once their VMIs are final; if the
 * node returns first they are Attached there again).
 * Errors: BINDER_ERR_NO_NODE. */
binder_rc binder_node_set_flags(binder_index *ix, const char *name, uint32_t flags);

/* Removes node `name` (deleted, or lost for good). Every claim bound there
 * is unbound first and, when `fn` is not NULL, reported to it (the view's
 * `node` is NULL by then; the claim stays known). O(classes + claims on
 * the node). Errors: BINDER_ERR_NO_NODE. */
binder_rc binder_node_delete(binder_index *ix, const char *name, binder_claim_fn fn, void *ud);

/* The node's flags, or BINDER_ERR_NO_NODE. */
binder_rc binder_node_flags(const binder_index *ix, const char *name, uint32_t *flags);

/* Units offered and bound of class `class_name` on node `name` (both 0 when
 * the node does not offer the class and holds none of it).
 * Errors: BINDER_ERR_NO_NODE. */
binder_rc binder_node_slot(const binder_index *ix, const char *name, const char *class_name, binder_slot_view *out);

/* Calls fn for each claim bound on node `name`, most recently bound first.
 * fn must not change the index. Errors: BINDER_ERR_NO_NODE. */
binder_rc binder_node_claims(const binder_index *ix, const char *name, binder_claim_fn fn, void *ud);

/* --------------------------------------------------------------- claims */

/* Records claim ns/name (a GPUClaim: spec.class, spec.count), unbound.
 * Recording it again with the same class and count is a no-op.
 * Errors: BINDER_ERR_INPUT (empty or long namespace/name/class, count 0 or
 * above BINDER_MAX_UNITS), BINDER_ERR_CHANGED (known with another class or
 * count: DESIGN.md §3, the spec is immutable), BINDER_ERR_MEMORY. */
binder_rc binder_claim_upsert(binder_index *ix, const char *ns, const char *name, const char *class_name,
                              uint32_t count, cozy_err *err);

/* Attaches the caller's `tag` to claim ns/name (borrowed; given back in
 * every binder_claim_view of it), so that a walk of a node's claims needs
 * no lookup to find the caller's own record. Errors: BINDER_ERR_NO_CLAIM. */
binder_rc binder_claim_tag(binder_index *ix, const char *ns, const char *name, void *tag);

/* Forgets a claim, unbinding it first. Errors: BINDER_ERR_NO_CLAIM. */
binder_rc binder_claim_delete(binder_index *ix, const char *ns, const char *name);

/* What the index holds of a claim (borrowed strings). Errors: BINDER_ERR_NO_CLAIM. */
binder_rc binder_claim_get(const binder_index *ix, const char *ns, const char *name, binder_claim_view *out);

/* A claim named in a set (binder_bind_set). */
typedef struct binder_claim_ref {
    const char *ns;
    const char *name;
} binder_claim_ref;

/* binder_bind_set flags */
#define BINDER_BIND_RESTORE 0x1u /* rebuilding from the API's claim status: record the binding even past
                                    what the node offers (it is reported as overcommit), never refuse it */

/* Binds the `n` claims of a set to node `name`, all or none (DESIGN.md §6: no
 * claim left Bound on a node whose set failed to place). Each must be known
 * and unbound. Without BINDER_BIND_RESTORE, the node must have, per class,
 * at least the set's units of that class free: never more units than it
 * offers (DESIGN.md §6). Candidacy (Ready, schedulable, layout, taints) is
 * NOT checked here: binder_candidates_set answers that, and a claim kept on
 * a cordoned node, or restored on a NotReady one, is bound all the same.
 * O(n + classes on the node). Errors: BINDER_ERR_INPUT (n 0 or more than
 * 64 claims, or more than BINDER_MAX_SET_CLASSES classes), BINDER_ERR_NO_NODE,
 * BINDER_ERR_NO_CLAIM, BINDER_ERR_BOUND (bound already, or named twice),
 * BINDER_ERR_NO_ROOM, BINDER_ERR_MEMORY (only when the node gains a class
 * it does not offer, under RESTORE); err names the claim or class. */
binder_rc binder_bind_set(binder_index *ix, const binder_claim_ref *claims, size_t n, const char *name,
                          uint32_t flags, cozy_err *err);

/* binder_bind_set of one claim. */
binder_rc binder_bind(binder_index *ix, const char *ns, const char *claim, const char *node, uint32_t flags,
                      cozy_err *err);

/* Releases a bound claim's units (Lost, moved, deleted). O(1).
 * Errors: BINDER_ERR_NO_CLAIM, BINDER_ERR_NOT_BOUND. */
binder_rc binder_unbind(binder_index *ix, const char *ns, const char *name);

/* -------------------------------------------------------------- classes */

/* What the index holds of one class, all nodes together. */
typedef struct binder_class_units {
    uint64_t offered;  /* units every known node offers (whatever its flags) */
    uint64_t bound;    /* units held by the claims bound to those nodes */
    uint64_t free;     /* free units on the candidate nodes (below) */
    uint32_t max_free; /* the most free units one candidate node has */
} binder_class_units;

/* The units of class `class_name` (GPUClass status and metrics: DESIGN.md
 * §3 "status.free, status.maxFreePerNode", decision 0030). `free` and
 * `max_free` count only the nodes a new set of the class could be placed
 * on now: Ready, schedulable, no layout change pending, and every
 * NoSchedule/NoExecute `gpu.cozystack.io/` taint covered by the
 * tolerations `tol` (the class's own, which every launcher pod of the
 * class gets): the nodes binder_candidates would consider. So `max_free`
 * is the largest set one node can take and `free` what orders together
 * could get. A class no node offers or claim names is all zero. O(pools
 * of the class): the sums are kept as units move, never counted per call.
 * Errors: BINDER_ERR_INPUT (empty class name; *out zeroed). */
binder_rc binder_class_units_get(const binder_index *ix, const char *class_name, const binder_toleration *tol,
                                 size_t ntol, binder_class_units *out);

/* ----------------------------------------------------------- candidates */

/* The candidate nodes for a set (DESIGN.md §6, decision 0022): at
 * most `max` of them into out[0..max-1], in packing order (see the top of
 * this file) of the set's scarcest class (the one with the fewest nodes
 * having room), each checked for the other classes; `*n_out` is how many.
 * Never a node that is NotReady, cordoned, layout-pending, has a
 * NoSchedule/NoExecute GPU taint the tolerations do not cover, or lacks
 * room for any class of the set. A class no node offers gives 0
 * candidates. Cost: O(pools x free levels + nodes examined); for a set of
 * one class every node examined is returned; for several, a node examined
 * offers every class of the set but may lack units of another class than
 * the driving one (then it is skipped; max_examined bounds that); no scan
 * of every node.
 * This bounded list is what a caller hands to Lua to filter and score.
 * Errors: BINDER_ERR_INPUT (no needs, units 0 or above BINDER_MAX_UNITS,
 * empty class name, more than BINDER_MAX_SET_CLASSES classes),
 * BINDER_ERR_MEMORY (only with more than 32 shapes offering the class). */
/* Whether node `name` is a candidate for the set of query q, by the same
 * tests as binder_candidates_set (Ready, schedulable, no layout pending,
 * GPU taints tolerated, room for every class of the set): *fits 1 and
 * *out the node's candidate entry when it is, *fits 0 otherwise. For a set
 * limited to a few named nodes (a volume bound to a node: DESIGN.md §6),
 * O(classes of the set). q->max_examined is not used. Errors:
 * BINDER_ERR_NO_NODE, BINDER_ERR_INPUT (as binder_candidates_set). */
binder_rc binder_node_candidate(const binder_index *ix, const char *name, const binder_query *q,
                                binder_candidate *out, int *fits);

binder_rc binder_candidates_set(const binder_index *ix, const binder_query *q, binder_candidate *out, size_t max,
                                size_t *n_out);

/* binder_candidates_set for one class: `units` of class `class_name`. */
binder_rc binder_candidates(const binder_index *ix, const char *class_name, uint32_t units,
                            const binder_toleration *tolerations, size_t n_tolerations, binder_candidate *out,
                            size_t max, size_t *n_out);

#endif
