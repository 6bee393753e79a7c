/* policy.h — the binder's hooks that ask Lua (DESIGN.md §5, §6;
 * docs/decisions/0020 §3, 0024, 0044): the chooser among candidate nodes
 * and the budget check at bind, which reads the units the binder's state
 * holds per namespace and class (binder_state_held_next). Shared by the leader's loop
 * (controller/bind.c) and `cozygpu simulate` (cli/simulate.c), so both
 * decide the same way from the same policies.
 *
 * Usage (per binder state and engine):
 *   placement_policy bp; placement_policy_init(&bp, engine, state);
 *   hooks.choose -> placement_policy_choose, hooks.budget -> placement_policy_budget,
 *   after each pass -> placement_policy_settle; placement_policy_free(&bp).
 * Not thread-safe: the caller's loop owns the engine and the state.
 */
#ifndef COZYGPU_PLACEMENT_POLICY_H
#define COZYGPU_PLACEMENT_POLICY_H

#include <jansson.h>

#include "base/result.h"
#include "binder/binder.h"
#include "engine/engine.h"

/* A candidate node's labels (metadata.labels) for the chooser: a new
 * reference, or NULL for none. */
typedef json_t *(*placement_policy_labels_fn)(void *ud, const char *node);

typedef struct placement_policy {
    engine *e;                   /* borrowed: the bundle's engine (engine_binder_*) */
    binder_state *st;            /* borrowed: its held units, promised as the budget check allows */
    placement_policy_labels_fn labels; /* may be NULL */
    void *labels_ud;
    unsigned long failures[ENGINE_OUTCOME_LAST]; /* chooser failures by outcome (decision 0024) */
} placement_policy;

/* Sets up bp over engine `e` and state `st` (both borrowed). */
void placement_policy_init(placement_policy *bp, engine *e, binder_state *st);

/* Frees what bp holds (not the engine or the state). */
void placement_policy_free(placement_policy *bp);

/* binder_hooks.choose through engine_binder_choose: the set and the
 * candidates as JSON (each candidate with the set's classes' offered,
 * bound and free units on it from the index, and its labels), the
 * policy's answer as a 0-based position or -1 (none this pass). A policy
 * failure answers 0 (the packing order; decision 0024), counted in
 * bp->failures and described in out->message. *out (may be NULL) gets the
 * whole answer. A shape the engine refuses (an internal error) answers -1. */
int placement_policy_choose(placement_policy *bp, const binder_set_view *sv, const binder_candidate *cands, size_t n,
                      engine_binder_choice *out);

/* binder_hooks.budget through engine_binder_budget, over the state's held
 * units: 1 when claim c may go Pending -> Bound; its units then count at
 * once (binder_state_held_promise) for the set's next claims and later
 * sets, until it binds or waits. 0 when refused or when the check failed
 * (fail closed; a promise that cannot be kept is a failure too), with the
 * message in `why` (why_size bytes) and what this pass allowed and is not
 * Bound yet released (the set waits whole). *out (may be NULL) gets the
 * verdict. */
int placement_policy_budget(placement_policy *bp, const binder_claim_status *c, char *why, size_t why_size,
                      engine_binder_verdict *out);

/* After each pass: what the budget check allowed in it and was not bound
 * is released (binder_state_held_settle). */
void placement_policy_settle(placement_policy *bp);

/* ---- the nodes a template VM's VMIs failed on (DESIGN.md §6, last rule;
 * decision 0026 item 8) ----
 * `refused` is a JSON object "ns/vm" -> {node: true} the caller owns (the
 * leader keeps it for the process, simulate until a leaderChange). */

/* At most this many nodes are remembered per VM. */
#define PLACEMENT_POLICY_MAX_REFUSED 64

/* Remembers that a template VMI of VM ns/vm failed on `node`. Returns 1
 * when the node is new for the VM, 0 when known already or the VM's list
 * is full. */
int placement_policy_refuse(json_t *refused, const char *ns, const char *vm, const char *node);

/* The candidates of set sv that its VM's VMIs did not fail on, into
 * kept[0..k) with their positions in cands in at[0..k) (both at least
 * BINDER_MAX_CANDIDATES long); returns k. When every candidate is such a
 * node there is no elsewhere: all of them are kept (tried again).
 * *left_out is how many were left out, n when all were refused (and then
 * kept). A lone claim (sv->vm NULL) keeps all. */
size_t placement_policy_avoid(const json_t *refused, const binder_set_view *sv, const binder_candidate *cands, size_t n,
                        binder_candidate *kept, size_t *at, size_t *left_out);

#endif
