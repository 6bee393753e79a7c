/* internal.h — shared between the files of core/placement/ only (the
 * public interface is placement.h). Every name here is prefixed pl_ and
 * belongs to one file:
 *   model.c        the state from objects: build, classes, nodes, claims,
 *                  one batch of changed keys, passes
 *   sets.c         a VM's or VMI's claims as a set: raw-name use, volumes,
 *                  template claims queued
 *   hooks.c        the binder's hooks (events, chooser, budgets, VMI
 *                  deletions) and the policy engine's cluster view
 *   claimstatus.c  GPUClaim status writes, in the API's booking order, and
 *                  the fair order of every queue (decision 0039)
 *   classstatus.c  GPUClass status, per-class gauges, class protection
 *   pin.c          gated launcher pods: pin and ungate, a stale pin's VMI
 *   flush.c        the flush: claim protection, template claims, VMI
 *                  deletions, then the rest in order
 * Rules: DESIGN.md §3, §4, §6; docs/decisions/0019–0027, 0030, 0037, 0039.
 */
#ifndef COZYGPU_PLACEMENT_INTERNAL_H
#define COZYGPU_PLACEMENT_INTERNAL_H

#include <jansson.h>
#include <uthash.h>

#include "base/keyset.h"
#include "binder/binder.h"
#include "placement/placement.h"
#include "placement/policy.h"

/* The launcher pod's scheduling gate and the VMI's claims annotation
 * (decision 0019, 0020 §5). */
#define PL_GATE "gpu.cozystack.io/claims"
#define PL_CLAIMS_ANNOTATION "gpu.cozystack.io/claims"
/* On every claim the leader sees, so that a claim deleted while a VM uses
 * its GPUs keeps its hold until the VMI ends (as kubernetes.io/pvc-protection
 * keeps a PVC a pod uses; decision 0026). */
#define PL_PROTECTION "gpu.cozystack.io/claim-protection"
/* On every GPUClass, so that a class deleted while claims of it exist stays
 * (being deleted) and keeps serving them until the last one is gone, as
 * kubernetes.io/pvc-protection keeps a PVC (DESIGN.md §6, decision 0037). */
#define PL_CLASS_PROTECTION "gpu.cozystack.io/class-protection"

/* Key letters (placement_key_kind). */
enum {
    PL_K_CLASS = 'c',
    PL_K_NODE = 'n',
    PL_K_GPUNODE = 'g',
    PL_K_CLAIM = 'l',
    PL_K_VM = 'm',
    PL_K_VMI = 'i',
    PL_K_POD = 'p',
    PL_K_KUBEVIRT = 'k',
    PL_K_NAMESPACE = 's', /* the budget check's view only */
    PL_K_QUOTA = 'q',     /* the budget check's view only */
    PL_K_PVC = 'v',       /* a set's volume (DESIGN.md §6, WaitForFirstConsumer) */
    PL_K_PV = 'w',
};

/* A running VMI whose claims do not cover its devices (raw-name use). */
typedef struct pl_raw_use {
    char *key;    /* "ns/name" of the VMI */
    char *node;
    json_t *used; /* {resource name: units} */
    UT_hash_handle hh;
} pl_raw_use;

struct placement {
    placement_io io;
    const json_t *settings; /* borrowed */
    binder_state *st;
    engine *e;           /* runtime.binder: node capacity, class status (borrowed) */
    engine *pe;          /* the bundle's engine: policies/binder.lua, budgets at bind (borrowed) */
    placement_policy bp; /* the hooks over pe and st */
    binder_hooks hooks;
    int view_dirty;      /* pe's cluster view (namespaces, quotas, classes, raw-name VMIs) is stale */
    keyset *writes;      /* claims whose status must be written ("ns/name") */
    keyset *deletes;     /* VMIs to delete ("ns/name") */
    keyset *gated;       /* launcher pods carrying the gate ("ns/name") */
    keyset *waiting_sets; /* sets that named a claim not known yet ("ns/name") */
    pl_raw_use *raw;     /* running raw-name VMIs */
    json_t *uids;        /* "ns/name" -> metadata.uid of each claim in the state */
    keyset *recheck;     /* VMIs ("ns/name") whose claims changed in a pass: raw use looked at again */
    keyset *protect;     /* claims ("ns/name") that lack the protection finalizer */
    keyset *deleting;    /* claims ("ns/name") being deleted: the finalizer goes once nothing uses them */
    json_t *claim_class;  /* "ns/name" -> spec.class of every claim known (any phase) */
    json_t *class_claims; /* class -> number of claims naming it (claim_class counted; 0: absent) */
    keyset *class_fin;    /* classes whose protection finalizer is looked at in the next flush */
    json_t *class_fin_failed; /* class -> true: its finalizer write failed and was logged (once until it works) */
    json_t *creates;     /* "ns/name" -> template claim to create (decision 0027) */
    json_t *tdeletes;    /* "ns/name" -> uid: template claims of a final VMI, to delete */
    json_t *refused;     /* "ns/vm" -> {node: true}: nodes a template VMI of the VM failed on (DESIGN.md §6) */
    json_t *pvc_sets;    /* "ns/pvc" -> {"ns/set": true}: the sets whose volumes name the PVC */
    long long log_quiet_until; /* ms: policy failure log lines are held back until then */
    unsigned long log_held;    /* lines held back since the last one written */
    json_t *raw_by_node; /* node -> {resource name: units} */
    json_t *class_sent;  /* class -> {free, maxFreePerNode} written, until the cache shows it */
    json_t *class_names; /* class -> true: the classes the per-class gauges were last set for */
    json_t *class_specs; /* class -> {spec, deleting} as last applied (apply_class) */
    json_t *tmpl_sets;   /* "ns/name" of a VMI -> {uid, generation, set}: its template claims (pl_template_set) */
    long long class_next_ms; /* monotonic ms: no GPUClass status write before then */
    int class_pending;   /* a class status differs and waits for class_next_ms */
    long long flush_until; /* monotonic ms: the current flush writes until then */
    int more;            /* the last flush stopped at its budget with writes left: wake at once */
    int progressed;      /* a write of the current flush succeeded (no retry at once after failures only) */
    long long class_log_ms; /* a failing class_status call was last logged then */
    unsigned long choose_calls; /* the chooser was asked this often */
};

/* io.note when the caller gave one. */
void pl_note(placement *L, const placement_note *n);
/* An EXPLAIN note (printf format), built only when the caller listens. */
void pl_explain(placement *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- model.c ---- */

/* io.get / io.list of the model (new references). */
json_t *pl_get(placement *L, placement_kind k, const char *ns, const char *name);
json_t *pl_list(placement *L, placement_kind k);
/* Whether writes may go (io.leading). */
int pl_leading(placement *L);
/* The first KubeVirt object, or NULL (new reference). */
json_t *pl_first_kubevirt(placement *L);
/* Node `name` into the state (capacity through runtime.binder.node), or
 * out of it when io has no such Node. */
void pl_apply_node(placement *L, const char *name, const json_t *classes, const json_t *kubevirt);
/* `obj` with apiVersion and kind of kind k (a shallow copy when it has
 * none: lists leave them out); a new reference. */
json_t *pl_with_kind(json_t *obj, placement_kind k);

/* ---- sets.c ---- */

/* Set ns/name from the VMI or VM of that name (decision 0019, 0021 §6,
 * 0027): taken, changed or dropped; queued in waiting_sets when it names
 * a claim not known yet or held by another set. */
void pl_apply_set(placement *L, const char *ns, const char *name);
/* The template claims of VMI `vmi` ([{name, class, count}], a new
 * reference), or NULL when it gets none: runtime.binder.template_claims
 * (cozygpu.claims.template_names, decision 0027) over the cached GPUClasses
 * and KubeVirt CR, asked once per VMI uid and generation (L->tmpl_sets,
 * cleared when a class or the KubeVirt CR changes). */
json_t *pl_template_set(placement *L, const json_t *vmi);
/* The claims VMI `vmi` holds (placement_read_vmi_claims with its
 * template set, computed only for a VMI with template claims). */
size_t pl_vmi_claims(placement *L, const json_t *vmi, char *buf, size_t n, const char **names, size_t max,
                     json_t **tmpl);
/* Updates the raw-name use of VMI `key` (vmi NULL: gone); the nodes whose
 * use changed into *changed_a / *changed_b (NULL when none). */
void pl_raw_update(placement *L, const char *key, const json_t *vmi, const char **changed_a, const char **changed_b,
                   char *buf_a, char *buf_b, size_t n);
/* Forgets every raw-name use. */
void pl_raw_clear(placement *L);

/* ---- hooks.c ---- */

/* The binder's hooks over L (choose, budget, event, delete_vmi). */
binder_hooks pl_hooks(placement *L);
/* Sets the policy engine's cluster view again when L->view_dirty. */
void pl_policy_view(placement *L);

/* ---- claimstatus.c ---- */

/* A queue's keys ("ns/name") in fair order: each namespace's first key,
 * then each one's second, ... (ties by key). */
typedef struct pl_ranked {
    keyset *d;
    unsigned rank; /* its place among its namespace's keys */
} pl_ranked;
/* An array of *n entries (the caller frees it), NULL when the set is
 * empty or out of memory. O(n log n). */
pl_ranked *pl_fair_order(keyset *set, size_t *n);
/* Whether the current flush has used its budget; sets L->more when so. */
int pl_flush_spent(placement *L);
/* Sends the queued claim status writes (L->writes). */
void pl_flush_status(placement *L);

/* ---- classstatus.c ---- */

/* GPUClass status writes and the per-class gauges. */
void pl_flush_classes(placement *L);
/* The class protection finalizers queued in L->class_fin. */
void pl_flush_class_protection(placement *L);
/* Clears the per-class gauges (only a leader exports them). */
void pl_class_gauges_clear(void);

/* Writes per flush stop after this long (ms); the caller wakes again at
 * once for the rest (placement_more), after taking the events that came
 * meanwhile (decision 0039). */
#define PL_FLUSH_BUDGET_MS 200

/* ---- pin.c ---- */

/* Tries to pin gated pod `key` ("ns/name"). 1 when it needs nothing more,
 * 0 while it waits. */
int pl_pin_pod(placement *L, const char *key);

/* ---- flush.c ---- */

/* The mutate of a protection finalizer write (fin added when `add`, else
 * removed). */
typedef struct pl_fin_ctx {
    placement *L;
    int add;
    const char *fin;
} pl_fin_ctx;
int pl_fin_mutate(json_t *obj, void *ctx);

#endif
