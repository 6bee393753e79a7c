/* sim.h — shared between the files of `cozygpu simulate` only (core/cli/):
 *   simulate.c     the command: options, the two runs, settling a step,
 *                  expect lines, the report
 *   sim_scenario.c a scenario's classes, nodes, claims, VMs and step
 *                  actions, checked, as the objects a cluster would hold
 *   sim_snapshot.c a live cluster's objects (kubectl get -o yaml), checked
 *   sim_store.c    the in-memory API server the placement model reads and
 *                  writes (placement_io), with what the API server itself
 *                  does: resourceVersions, uids, finalizers, garbage
 *                  collection, status subresources
 *   sim_kubevirt.c what KubeVirt and the scheduler own: a VM's runStrategy,
 *                  its VMI, the launcher pod, running where the pod is
 *                  pinned
 * The binder's decisions are the placement model's (placement/placement.h,
 * decision 0041): the same code the leader runs.
 */
#ifndef COZYGPU_CLI_SIM_H
#define COZYGPU_CLI_SIM_H

#include <jansson.h>

#include "base/keyset.h"
#include "engine/engine.h"
#include "placement/placement.h"

/* One run of a scenario (simulate.c). */
typedef struct sim_store sim_store;
typedef struct sim {
    const char *file;        /* the scenario file */
    json_t *doc;             /* the scenario (borrowed) */
    json_t *snap_recs;       /* the snapshot's manifest records (borrowed), NULL: none */
    const json_t *settings;  /* --config or the defaults (borrowed) */
    engine *e;               /* the bundle's engine: binder.lua, budgets at bind (borrowed) */
    engine *re;              /* runtime.binder: what nodes offer (borrowed) */
    engine *ae;              /* the bundle again, for admission of what a step creates (borrowed) */
    int in_step;             /* a step's actions are being applied (admission applies) */
    unsigned long reviews;   /* admission reviews made (their uids) */
    int quiet;               /* the silent validation run */
    int json;                /* --output json */
    sim_store *st;           /* the cluster's objects */
    placement *p;            /* the leader (NULL before the first build) */
    json_t *runs;            /* the VM controller's memory (sim_kubevirt_round) */
    json_t *classes;         /* class name -> {resourceName, selector}: the scenario's and the snapshot's */
    int next_device;         /* the next made-up PCI device ID of a scenario class */
    json_t *caps;            /* scenario node -> {class: units}: its GPUNode is made from it */
    json_t *vm_claims;       /* "ns/claim" -> VM: the scenario VM naming it (one VM per claim) */
    json_t *said;            /* notes said in this run (each once) */
    int next_group;          /* the next IOMMU group of a made-up GPU */
    char bad[1024];          /* the run failed: "FILE: PATH: message" */
    json_t *step_out;        /* the current step's output */
    json_t *out;             /* every step's output */
    int expect_failed, expect_passed;
    int policy_failures[ENGINE_OUTCOME_LAST]; /* the chooser's failures by kind (the leader's metric) */
    unsigned long choose_calls;               /* over every leader of the run */
} sim;

/* Fails the run: s->bad = "FILE: message" (the first failure wins). */
void sim_bad(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A line of the table output (nothing in the quiet run or with json). */
void sim_say(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A note (printf format): a table line "  note: ..." and an event
 * {kind: note, message}; each distinct note once a run. */
void sim_note(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An event of the current step (stolen). */
void sim_event(sim *s, json_t *ev);
/* Scenario fields: `o` is a mapping of only `allowed` keys (NULL-ended);
 * a non-empty string (dflt when absent; NULL dflt: required); a boolean;
 * "ns/name" or "name" (namespace "default") into ns, name. Each fails the
 * run naming PATH.KEY. */
int sim_check_keys(sim *s, const json_t *o, const char *path, const char *const *allowed);
const char *sim_str_field(sim *s, const json_t *o, const char *key, const char *path, const char *dflt);
int sim_bool_field(sim *s, const json_t *o, const char *key, const char *path, int dflt);
int sim_split_ref(sim *s, const char *ref, const char *path, char *ns, char *name);
/* fn on each element of list (when given; a list), PATH[i]. */
void sim_list(sim *s, json_t *list, const char *path, void (*fn)(sim *, json_t *, const char *));
/* fn on a name or each of a list of names, PATH or PATH[i]. */
void sim_each_name(sim *s, json_t *v, const char *path, void (*fn)(sim *, const char *, const char *));
/* What cozygpu's webhooks say of creating `obj` (a GPUClaim or a
 * VirtualMachine a step adds; kubectl as the cluster admin would): the
 * bundle's admission rules (engine_review) over the store's objects as the
 * cluster view. Returns the object as admitted (a new reference, any
 * mutation applied), or NULL when refused: then a note and an event
 * {kind: refused, object, message} say why, as kubectl would print it.
 * Objects the scenario starts with were admitted before: not reviewed. */
json_t *sim_admit(sim *s, json_t *obj, const char *path);
/* The leader takes what changed (rounds of the placement model alone,
 * no KubeVirt round) until its writes change nothing more: between two
 * actions of a step. Nothing before the first leader. */
void sim_leader_catch_up(sim *s);
/* A VMI's phase change, as the step's event and a table line. */
void sim_vmi_event(void *s, const char *ns, const char *vmi, const char *from, const char *to, const char *node,
                   const char *why);

/* -------------------------------------------------------------- report */

/* The step's claims table (kubectl's columns: phase, node, attachedTo,
 * the Ready condition's reason) and VMs, read from s->st, printed and
 * kept in the step's JSON output. */
void sim_step_table(sim *s);
/* What the leader's node reading says of each node (capacity it cannot
 * read, a GPU no class takes), printed once per step when it holds. */
void sim_node_notes(sim *s);
/* One `expect` line of a step (PATH its path), checked against the
 * store; a mismatch is a failed expectation (exit 1), a bad line bad
 * input (exit 2). */
void sim_check_expect(sim *s, json_t *e, const char *path);

/* ------------------------------------------------------------ scenario */

/* The scenario's classes, nodes, claims, VMs, namespaces and
 * resourceQuotas as objects in s->st (after a snapshot's). */
void sim_scenario_load(sim *s);
/* Class `name` of resource name rn ("": simulate.cozygpu.io/<name>)
 * known to the run: a made-up PCI device permitted (10DE:F001 for the first class, F002 the next, ...) under rn in
 * the KubeVirt CR, for the GPUs of scenario nodes. */
void sim_class_known(sim *s, const char *name, const char *rn);
/* The actions of step `step` (PATH steps[i]) applied to s->st, checked;
 * not its expect lines. */
void sim_scenario_step(sim *s, json_t *step, const char *path);

/* ------------------------------------------------------------ snapshot */

/* The snapshot's records (s->snap_recs), checked, as objects in s->st;
 * its GPUClasses into s->classes. */
void sim_snapshot_load(sim *s);

/* ------------------------------------------------------------ the store */

/* A new, empty store; NULL when out of memory. */
sim_store *sim_store_new(void);
void sim_store_free(sim_store *st);

/* Object ns/name of kind k (ns NULL or "" for cluster-scoped), a new
 * reference to the stored object (read it, never change it), or NULL. */
json_t *sim_store_get(sim_store *st, placement_kind k, const char *ns, const char *name);

/* Every object of kind k in the order created, a new array. */
json_t *sim_store_list(sim_store *st, placement_kind k);

/* Creates `obj` (stolen) of kind k: resourceVersion is the store's, and
 * metadata.uid and generation too unless it has them (a snapshot's).
 * Returns 201, or 409 when one of that name exists. */
long sim_store_create(sim_store *st, placement_kind k, json_t *obj);

/* Replaces object ns/name of kind k with `obj` (stolen) as a PUT of the
 * whole object would (no resourceVersion check: the scenario's own
 * edits), keeping uid and creationTimestamp; an object being deleted
 * whose finalizers are now empty goes. Returns 200, or 404. */
long sim_store_replace(sim_store *st, placement_kind k, json_t *obj);

/* Deletes object ns/name of kind k as the API server does: with
 * finalizers it only gets metadata.deletionTimestamp; without, it goes,
 * and its dependents (objects whose ownerReferences name its uid) are
 * deleted the same way (background garbage collection). `uid` non-NULL:
 * a precondition (409 when another object has the name). Returns 200, 404
 * or 409. */
long sim_store_delete(sim_store *st, placement_kind k, const char *ns, const char *name, const char *uid);

/* The keys (placement_key_of) of the objects changed since the last call,
 * in the order changed, as watches would deliver them; the caller frees
 * the set (keyset_free). NULL when none. */
keyset *sim_store_changes(sim_store *st);

/* The placement model's io over the store: reads are of the store (a
 * cache always up to date), writes apply at once; leading is always 1.
 * `note` and `ud` are the observer (may be NULL). */
placement_io sim_store_io(sim_store *st, void (*note)(void *ud, const placement_note *n), void *ud);

/* ------------------------------------------------------------ KubeVirt */

/* What the VM controller, virt-controller and the scheduler do, as one
 * round over the store (after the leader's writes of a round):
 *   - a VM under Always with no VMI, or with a final one (deleted first),
 *     gets a new VMI; under RerunOnFailure the same after Failed or when
 *     none exists (not after Succeeded, nor after a stop); under Once the
 *     first time only; Manual and Halted never;
 *   - a live VMI without a launcher pod gets one, carrying the scheduling
 *     gate gpu.cozystack.io/claims (what the launcher webhook gives a pod
 *     whose claims are not attached to its VMI, decision 0025);
 *   - a pod without the gate, pinned to a node (the leader's pin) that is
 *     Ready and not cordoned, is scheduled there, and its Pending VMI runs
 *     there (kube-scheduler filters unschedulable nodes; the toleration
 *     rule gave the pod the class's tolerations, so taints are not read).
 * `runs` ("ns/name" -> {strategy, stopped, started}) is the VM
 * controller's memory, kept by the caller. Returns how many objects it
 * changed (0: quiet). Events (VMI phase changes) go to `say`. */
typedef void (*sim_say_fn)(void *ud, const char *ns, const char *vmi, const char *from, const char *to,
                           const char *node, const char *why);
int sim_kubevirt_round(sim_store *st, json_t *runs, sim_say_fn say, void *ud);

/* virtctl start: Halted becomes Always; a VM with no live VMI gets one
 * (a final VMI is deleted first); a stop request is lifted. Returns 0, or
 * -1 when there is no such VM. */
int sim_kubevirt_start(sim_store *st, json_t *runs, const char *ns, const char *name, sim_say_fn say, void *ud);

/* virtctl stop: Always becomes Halted, RerunOnFailure remembers the stop;
 * the VMI is deleted. Returns 0, or -1 when there is no such VM. */
int sim_kubevirt_stop(sim_store *st, json_t *runs, const char *ns, const char *name, sim_say_fn say, void *ud);

/* The VMI of VM ns/name ends (phase "Succeeded" or "Failed"), on the node
 * it ran on; its launcher pod ends alike. Returns 0, or -1 when it has no
 * live VMI. */
int sim_kubevirt_final(sim_store *st, const char *ns, const char *name, const char *phase, sim_say_fn say, void *ud);

/* The binder's name of a VMI's phase ("None" when vmi is NULL). */
const char *sim_vmi_phase(const json_t *vmi);

#endif
