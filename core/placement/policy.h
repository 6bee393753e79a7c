/* policy.h — the binder's hooks that ask Lua (DESIGN.md §5, §6;
 * docs/decisions/0020 §3, 0024): the chooser among candidate nodes and the
 * budget check at bind, with the usage table the budget check reads kept
 * equal to what the binder holds. Shared by the leader's loop
 * (controller/bind.c) and `cozygpu simulate` (cli/simulate.c), so both
 * decide the same way from the same policies.
 *
 * Usage (per binder state and engine):
 *   placement_policy bp; placement_policy_init(&bp, engine, state);
 *   placement_policy_feed(&bp, &err);           -- after the state is built or
 *                                            restored, or the engine changed
 *   hooks.choose -> placement_policy_choose, hooks.budget -> placement_policy_budget,
 *   every event -> placement_policy_on_event, before a claim is deleted from the
 *   state -> placement_policy_on_delete, after each pass -> placement_policy_settle;
 *   placement_policy_free(&bp).
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
    const binder_state *st;      /* borrowed */
    json_t *allowed;             /* "ns/name" -> {class, count}: allowed by the budget check in this pass, not Bound yet */
    placement_policy_labels_fn labels; /* may be NULL */
    void *labels_ud;
    unsigned long failures[ENGINE_OUTCOME_LAST]; /* chooser failures by outcome (decision 0024) */
    cozy_err last_error;         /* the last usage-table failure ("" when none) */
} placement_policy;

/* Sets up bp over engine `e` and state `st` (both borrowed). */
void placement_policy_init(placement_policy *bp, engine *e, const binder_state *st);

/* Frees what bp holds (not the engine or the state). */
void placement_policy_free(placement_policy *bp);

/* Units a claim in phase p counts against its tenant's budgets at bind
 * (DESIGN.md §5, decision 0020 §3): Bound, Attached and Lost. */
int placement_policy_holds(binder_phase p);

/* Empties the engine's usage table and adds every claim of the state that
 * holds units (placement_policy_holds): on taking the lead, after a leader
 * change in a scenario, or with a new engine (a reloaded bundle). Errors:
 * those of engine_binder_usage_reset / _add (COZY_ERR_INTERNAL). */
cozy_result placement_policy_feed(placement_policy *bp, cozy_err *err);

/* binder_hooks.choose through engine_binder_choose: the set and the
 * candidates as JSON (each candidate with the set's classes' offered,
 * bound and free units on it from the index, and its labels), the
 * policy's answer as a 0-based position or -1 (none this pass). A policy
 * failure answers 0 (the packing order; decision 0024), counted in
 * bp->failures and described in out->message. *out (may be NULL) gets the
 * whole answer. A shape the engine refuses (an internal error) answers -1. */
int placement_policy_choose(placement_policy *bp, const binder_set_view *sv, const binder_candidate *cands, size_t n,
                      engine_binder_choice *out);

/* binder_hooks.budget through engine_binder_budget: 1 when claim c may go
 * Pending -> Bound; its units then count at once for the rest of the pass
 * (the set's next claims and later sets). 0 when refused or when the
 * check failed (fail closed), with the message in `why` (why_size bytes)
 * and what this pass allowed and is not Bound yet taken back (the set
 * waits whole). *out (may be NULL) gets the verdict. */
int placement_policy_budget(placement_policy *bp, const binder_claim_status *c, char *why, size_t why_size,
                      engine_binder_verdict *out);

/* Keeps the usage table equal to what the state holds, per claim
 * transition (binder_hooks.event calls it first). */
void placement_policy_on_event(placement_policy *bp, const binder_event *e);

/* Call before claim ns/name is deleted from the state: what it held leaves
 * the usage table. */
void placement_policy_on_delete(placement_policy *bp, const char *ns, const char *name);

/* After each pass: what the budget check allowed in it but was not bound
 * (its set waited for another reason) leaves the usage table again. */
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
