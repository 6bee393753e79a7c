/* placement.h — the placement model: the leader's binder from watch-shaped
 * objects to decided writes, one body of code for the leader
 * (controller/bind.c: informers in, the API server out) and for
 * `cozygpu simulate` (cli/: a scenario's objects in, an in-memory store
 * out). docs/decisions/0041 says why there is one.
 *
 * What it decides (DESIGN.md §3, §4, §6; decisions 0019–0027, 0030, 0037):
 * each GPUClaim's status (phase, node, attachedTo, the Ready condition),
 * the protection finalizers of claims and classes, the template claims a
 * class-referencing VMI gets and loses, the Pending VMIs deleted because
 * their claims moved, the pin and ungating of gated virt-launcher pods,
 * and each GPUClass's status.free / maxFreePerNode.
 *
 * How it is driven (one thread; nothing here is locked):
 *   p = placement_new(&io, runtime, settings);
 *   placement_build(p)           -- the state from io's objects, as a new
 *                                   leader builds it (claims restored from
 *                                   their status, decision 0020 §1)
 *   placement_set_policy(p, pe)  -- the policy bundle's engine (chooser,
 *                                   budgets at bind); again when it changes
 *   loop: placement_apply(p, batch)   -- the keys of changed objects
 *         placement_reconcile(p, full)
 *         placement_flush(p)          -- the writes, through io
 *   placement_free(p).
 * Keys name an object as "K:ns/name" (K a placement_key_kind; ns empty for
 * a cluster-scoped object): placement_key_of builds one.
 *
 * Reads (io.get, io.list) are of a cache that follows the writes (the
 * leader's watch caches; simulate's store, at once); every write is
 * conditional the way the API server's are (a status on the
 * resourceVersion read, a template claim's delete on its uid), so a stale
 * read costs a retry, never a wrong write.
 */
#ifndef COZYGPU_PLACEMENT_H
#define COZYGPU_PLACEMENT_H

#include <jansson.h>

#include "base/keyset.h"
#include "base/result.h"
#include "binder/binder.h"
#include "engine/engine.h"

/* The kinds of object the model reads. */
typedef enum placement_kind {
    PLACEMENT_CLASS,     /* cozystack.io/v1alpha1 GPUClass (cluster) */
    PLACEMENT_NODE,      /* v1 Node */
    PLACEMENT_GPUNODE,   /* cozystack.io/v1alpha1 GPUNode (cluster) */
    PLACEMENT_CLAIM,     /* cozystack.io/v1alpha1 GPUClaim */
    PLACEMENT_VM,        /* kubevirt.io/v1 VirtualMachine */
    PLACEMENT_VMI,       /* kubevirt.io/v1 VirtualMachineInstance */
    PLACEMENT_POD,       /* v1 Pod (virt-launcher) */
    PLACEMENT_KUBEVIRT,  /* kubevirt.io/v1 KubeVirt (the first one is read) */
    PLACEMENT_NAMESPACE, /* v1 Namespace (budgets, DESIGN.md §5) */
    PLACEMENT_QUOTA,     /* v1 ResourceQuota (budgets) */
    PLACEMENT_PVC,       /* v1 PersistentVolumeClaim (a set's volumes, DESIGN.md §6) */
    PLACEMENT_PV,        /* v1 PersistentVolume */
    PLACEMENT_KINDS
} placement_kind;

/* apiVersion and kind of each placement_kind, as the API server serves
 * them (for objects a list left them out of: kubernetes/kubernetes#3030). */
extern const char *const placement_api_version[PLACEMENT_KINDS];
extern const char *const placement_kind_name[PLACEMENT_KINDS];

/* The letter of a kind in a key ("c:/gpu-l40s", "l:tenant-a/c1"). */
char placement_key_kind(placement_kind k);

/* The key of object `obj` of kind k into buf (n bytes): "K:ns/name".
 * Returns buf, or NULL when obj has no metadata.name or it does not fit. */
char *placement_key_of(placement_kind k, const json_t *obj, char *buf, size_t n);

/* The mutate callback of io.update: changes `obj` (a fresh copy of the
 * object, owned by the caller) in place. Returns 0 to write it, 1 when
 * nothing needs writing, -1 to give up (nothing written). */
typedef int (*placement_mutate_fn)(json_t *obj, void *ctx);

/* What the model tells an observer (io.note), beside its logs and
 * metrics: `simulate` shows these as a step's events. */
typedef enum placement_note_kind {
    PLACEMENT_NOTE_TRANSITION,    /* .event: a claim's status changed in a pass */
    PLACEMENT_NOTE_AVOIDED,       /* .ns/.name (the VM), .left of .candidates: nodes its VMIs failed on left out
                                     (all tried again when left == candidates; DESIGN.md §6, last rule) */
    PLACEMENT_NOTE_POLICY_FAILED, /* .outcome, .message: binder.lua failed; placed in packing order (decision 0024) */
    PLACEMENT_NOTE_BUDGET_FAILED, /* .ns/.name (the claim), .outcome, .message: the budget check failed; it waits */
    PLACEMENT_NOTE_EXPLAIN,       /* .message: a sentence on why a set waits or what the leader did (a template
                                     claim created or deleted, a claim of a template name not the VMI's own, a
                                     set limited to its volume's nodes, GPUs a VMI uses that no claim covers);
                                     said again each time it holds */
} placement_note_kind;

typedef struct placement_note {
    placement_note_kind kind;
    const binder_event *event;
    const char *ns, *name;
    size_t left, candidates;
    engine_outcome outcome;
    const char *message;
} placement_note;

/* What the model reads and writes through. Every write returns the HTTP
 * status the API server gave (200/201 done, 404 gone, 409 conflict, ...)
 * or 0 when it was not sent (err says why). *out, when asked for, is the
 * response body (a new reference, may be NULL). */
typedef struct placement_io {
    void *ud;
    /* The cached object ns/name (ns NULL or "" for cluster-scoped) of kind
     * k, a new reference, or NULL. */
    json_t *(*get)(void *ud, placement_kind k, const char *ns, const char *name);
    /* Every cached object of kind k, a new reference to an array. */
    json_t *(*list)(void *ud, placement_kind k);
    /* Every GPUClaim as the API holds it now (a consistent LIST, not the
     * cache: a new leader must not book a unit twice, decision 0026): the
     * List object ({"items": [...]}, a new reference) into *out, or a
     * Status on a refusal. 200 when done. */
    long (*list_claims)(void *ud, json_t **out, cozy_err *err);
    /* Whether this process may write (the leader's Lease; always 1 in
     * simulate). Checked before every write. */
    int (*leading)(void *ud);
    /* PUT GPUClaim ns/name's status subresource with `obj` (status set,
     * metadata.resourceVersion as read: 409 when it moved). */
    long (*claim_status)(void *ud, const char *ns, const json_t *obj, json_t **out, cozy_err *err);
    /* JSON merge patch of GPUClass `name`'s status subresource. */
    long (*class_status)(void *ud, const char *name, const json_t *patch, cozy_err *err);
    /* Read-modify-write of object ns/name of kind k (a Pod's pin, a
     * finalizer), retried on a conflict: 200 when written or mutate said
     * nothing was needed, 404 when the object is gone, 0 (or another
     * status) when not written (mutate gave up, conflicts, transport). */
    long (*update)(void *ud, placement_kind k, const char *ns, const char *name, placement_mutate_fn mutate, void *ctx,
                   cozy_err *err);
    /* POST a GPUClaim (a template claim). */
    long (*create_claim)(void *ud, const char *ns, const json_t *obj, json_t **out, cozy_err *err);
    /* DELETE object ns/name of kind k (a claim, a VMI); `uid` non-NULL:
     * only that object (preconditions.uid: 409 when another one has the
     * name). */
    long (*remove)(void *ud, placement_kind k, const char *ns, const char *name, const char *uid, cozy_err *err);
    /* Optional (NULL: none): told what placement_note_kind lists, as it
     * happens (the note and its strings live for the call only). */
    void (*note)(void *ud, const placement_note *n);
} placement_io;

typedef struct placement placement;

/* A new, empty model reading and writing through *io (copied), asking
 * `runtime` (runtime.binder of the default bundle: cozygpu.capacity and
 * class_status, borrowed, open while the model lives) what nodes offer,
 * with `settings` (the controller's settings, DESIGN.md §10; borrowed,
 * may be NULL) in the policy view. NULL when out of memory. */
placement *placement_new(const placement_io *io, engine *runtime, const json_t *settings);

/* Frees the model and everything it holds (NULL: no-op). The engines are
 * the caller's. Only the leader's view of capacity is exported: the
 * per-class gauges are cleared. */
void placement_free(placement *p);

/* Builds the state from io's objects as a new leader does: classes,
 * claims from io.list_claims restored from their status, sets from VMs
 * and VMIs, raw-name use, what each node offers, gated pods; then the
 * binder's index restored. Every claim is queued to be compared with the
 * API once. Returns 0, or -1 (logged) when the claims cannot be listed or
 * the index cannot be rebuilt (the model is then empty: build again). */
int placement_build(placement *p);

/* The policy bundle's engine (borrowed, open until replaced or the model
 * is freed): the chooser (policies/binder.lua, decision 0024) and the
 * budget check at bind (DESIGN.md §5), which reads the units the binder's
 * state holds (decision 0044: nothing to feed a new engine). `changed`
 * non-zero when it is not the engine given last. Nothing is bound before
 * an engine is set. */
void placement_set_policy(placement *p, engine *pe, int changed);

/* Takes the objects named by `batch` (keys, above; borrowed) as io shows
 * them now into the state: classes first, then claims, volumes, sets,
 * raw-name use, and last what nodes offer. */
void placement_apply(placement *p, keyset *batch);

/* Which pass placement_reconcile starts with. */
typedef enum placement_pass {
    PLACEMENT_PASS_FULL,    /* binder_reconcile_all: after placement_build */
    PLACEMENT_PASS_CHANGES, /* binder_reconcile: after placement_apply */
    PLACEMENT_PASS_RETRY,   /* neither: only what earlier passes left */
} placement_pass;

/* Reconciles: the pass `pass` names, then incremental passes while
 * raw-name use or moves leave work (at most 4; the rest waits for the
 * next call), each followed by a settle of the held units' promises
 * (binder_state_held_settle). Sets the policy
 * engine's cluster view first when it is stale. Does nothing before a
 * policy engine was set (placement_set_policy): no bind without the
 * budget check. */
void placement_reconcile(placement *p, placement_pass pass);

/* Sends the writes the passes left, within a budget of time (decision
 * 0039), fair across namespaces: claim statuses (in an order in which the
 * API never shows a node over its offer), GPUClass statuses, protection
 * finalizers, template claims, VMI deletions, pins. */
void placement_flush(placement *p);

/* Whether the last flush stopped at its budget with writes left (wake
 * again at once), and the milliseconds until a GPUClass status write is
 * due (-1: none waits). */
int placement_more(const placement *p);
long placement_class_wait_ms(const placement *p);

/* The node the leader's pin on a launcher pod names (decision 0020 §5,
 * 0025): the last matchFields requirement metadata.name In [node] of every
 * required node selector term that has requirements, all naming the same
 * node; NULL when the pod carries no such pin. Borrowed from `pod`. The
 * one reading of the pin: the leader's stale-pin check and simulate's
 * scheduler both use it. */
const char *placement_pinned_node(const json_t *pod);

/* The binder's state (read-only; NULL before a build): what a report
 * shows (binder.h's binder_state_claims, binder_state_index). Valid until
 * the next call that changes the model. */
const binder_state *placement_state(const placement *p);

/* How many times the chooser (binder.lua) was asked since the model was
 * made. */
unsigned long placement_choose_calls(const placement *p);

#endif
