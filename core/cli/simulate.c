/* simulate.c — `cozygpu simulate`: a scenario replayed through the binder's
 * state machine (binder/binder.h), no cluster. The binder's hooks are the
 * leader's (decision 0024): the chooser is policies/binder.lua of the
 * bundle (--policies, --override or the scenario's `override` replace it,
 * as the policies ConfigMap does), the budget check at bind is
 * engine_binder_budget over the scenario's namespaces and resourceQuotas.
 *
 * Scenario (one YAML or JSON document; every key below, nothing else):
 *
 *   snapshot:  ../snapshots/cluster.yaml  # optional: a live cluster's objects as the
 *                                      # starting state (below), relative to the
 *                                      # scenario (--snapshot PATH wins)
 *   classes:   - name: l40s            # GPUClass
 *                resourceName: nvidia.com/AD102GL  # optional: raw keys (DESIGN §5 R4, R5)
 *                onCordon: Move        # Move (default) | Stay
 *                deleting: false       # metadata.deletionTimestamp set
 *                tolerations: [{key, operator, value, effect}]
 *   nodes:     - name: gpu-1
 *                capacity: {l40s: 4}   # units per class (DESIGN §3 "capacity")
 *                taints: [{key, value, effect}]
 *                labels: {...}         # handed to binder.lua with the candidate
 *                ready: true           # default true
 *                unschedulable: false  # cordoned
 *                layoutPending: false
 *   claims:    - name: c1              # GPUClaim (ordered)
 *                namespace: tenant-a   # default "default"
 *                class: l40s
 *                count: 1              # 1..4096
 *   vms:       - name: web             # VirtualMachine; its VMI has its name
 *                namespace: tenant-a
 *                claims: [c1]          # gpu.cozystack.io/claims, same namespace
 *                gpus: [{class, count}] # instead of claims: template claims (below)
 *                runStrategy: Always   # Always | RerunOnFailure | Once | Manual | Halted (default)
 *                volumeNodes: [gpu-2]  # optional: the nodes its bound volume's node affinity
 *                                      # allows (DESIGN §6, WaitForFirstConsumer): its sets
 *                                      # are placed, moved and rebound only there
 *   namespaces: - metadata: {name: tenant-a, labels: {tenant.cozystack.io/tenant-root: "", ...}}
 *   resourceQuotas: - metadata: {name: gpu, namespace: tenant-a}
 *                     spec: {hard: {gpuclass.cozystack.io/devices: "2"}}
 *                                      # the tenant-tree budgets (DESIGN §5), checked
 *                                      # once per Pending -> Bound; usage: the units of
 *                                      # the Bound, Attached and Lost claims
 *   override:  ../binder/spread        # optional: a hoster policy directory, relative
 *                                      # to the scenario (--override wins)
 *   steps:     - name: drain gpu-1     # optional
 *                <actions>             # applied in the order listed here
 *                expect: [...]
 *
 * Actions of a step (a NODE, VM or CLASS value may be one name or a list):
 *   addNodes: [node...], addClaims: [claim...], addVMs: [vm...]
 *   cordon, uncordon, notReady, ready, deleteNode: NODE
 *   capacity: {node, class, units} (or a list of them)
 *   layoutPending, layoutApplied: NODE
 *   classDeleting: CLASS
 *   start, stop: VM       (virtctl start/stop)
 *   vmiFinal: {vm, phase: Succeeded|Failed}
 *   deleteClaim: NS/NAME (or NAME in "default")
 *   leaderChange: true    (a new leader: the binder is rebuilt from the
 *                          claims' status alone, decision 0020 §1; the
 *                          nodes template VMIs failed on are forgotten,
 *                          decision 0026 item 8; volumes are read again)
 * Expect lines: {claim: NS/NAME, phase, node, reason}, {claim: NS/NAME,
 * absent: true} (deleted, or not created yet) or {vmi: NS/NAME, phase,
 * node}; each key but claim/vmi is optional; node null or "" means none.
 *
 * Snapshot (issue 12: "what happens if I drain this node now?"): a file
 * or a directory of .yaml/.yml/.json files (read as `kubectl apply -f`
 * reads them: multi-document YAML, kubectl `List`s, format/manifest.h),
 * e.g. `kubectl get nodes,gpunodes,gpuclasses,gpuclaims,vms,vmis,kubevirts,
 * namespaces,resourcequotas,pvc,pv -A -o yaml`. (The controller's SIGUSR1 cache
 * dump holds object identities only, not objects: it cannot serve.)
 * Its objects become the starting state as a new leader builds it from the
 * same objects (controller/bind.c build(), through placement/read.c):
 *   GPUClass      a class: onCordon, metadata.deletionTimestamp (deleting),
 *                 tolerations, resourceName; the object itself is in the
 *                 cluster view the policies read;
 *   Node, GPUNode, KubeVirt (the first)
 *                 a node: what it offers each class, Ready, cordoned,
 *                 layout pending and its gpu.cozystack.io/ taints, from
 *                 runtime.binder.node (cozygpu.capacity, decision 0022),
 *                 less the raw-name use below; its metadata.labels go to
 *                 the chooser; its capacity problems are shown as notes.
 *                 A Node without a GPUNode that no claim is on is left out;
 *   GPUClaim      restored from its status (decision 0020 §1): phase,
 *                 node, attachedTo, the Ready condition's reason (a Bound
 *                 or Attached status without a node starts over Pending);
 *                 one being deleted (metadata.deletionTimestamp) goes
 *                 once nothing uses it (Attached, Lost with a node, Bound
 *                 for a Scheduled or Running VMI), checked after every
 *                 pass, as the leader lets its finalizer go (decision 0026);
 *   VirtualMachine, VirtualMachineInstance
 *                 a VM of this file: runStrategy (spec.runStrategy, one
 *                 not listed above replayed as Manual with a note; or
 *                 spec.running true/false; neither: Halted); with a VMI,
 *                 its phase (none, Pending, Scheduling: Pending; Unknown
 *                 and any phase not KubeVirt's seven, noted: Running),
 *                 status.nodeName and claims (the claims
 *                 annotation, or template claims <vmi>-<class> for a
 *                 class-referencing VMI: created when the snapshot lacks
 *                 them, deleted when the VMI is final); without one, the
 *                 template's claims annotation (a stopped VM holds its
 *                 claims) or its template GPUs (claims made at `start`);
 *                 a VMI without a VM is a VM under Manual. Live VMIs are
 *                 taken first, so they win claims a stopped VM names too.
 *                 A VM naming a claim the snapshot lacks, or one another
 *                 VM holds, is left out with a note (the leader keeps it
 *                 waiting). A VM with Always or RerunOnFailure and no VMI
 *                 gets one (Pending), and one whose VMI is final gets a
 *                 new one after the first pass, as its VM controller would.
 *                 A Scheduled or Running VMI whose own claims do not cover
 *                 its gpus/hostDevices on its node uses those units there
 *                 (raw-name use, subtracted from what the node offers, for
 *                 the whole run: steps do not change it), as the leader
 *                 counts it; VMs naming no claim are not replayed;
 *   Namespace, ResourceQuota
 *                 the budgets at bind (DESIGN.md §5), as `namespaces` and
 *                 `resourceQuotas`;
 *   PersistentVolumeClaim, PersistentVolume
 *                 a VM's volumes (its VMI's spec.volumes, or its
 *                 template's: persistentVolumeClaim, or a dataVolume's PVC
 *                 of that name) whose bound PV (spec.volumeName) has a
 *                 required node affinity kubernetes.io/hostname In or
 *                 metadata.name In limit its sets to those nodes (the
 *                 intersection; none in common: it waits), as the
 *                 leader's volume_nodes reads them (placement_read_volume_nodes,
 *                 decision 0026 item 9; a scenario VM's `volumeNodes`).
 * A template VMI's claims (labelled gpu.cozystack.io/template-claim, owned
 * by the VMI's uid, of its class and count: placement_read_template_claim_is)
 * are its own; a claim of its template name that is not (a tenant's, one
 * left by an earlier VMI) is never taken over — the set waits, noted — and
 * never deleted when the VMI is final (decision 0027). A template VMI
 * Failed with a status.nodeName refuses that node to its VM (below).
 * Claims are then booked where their status says (binder_state_restore)
 * and the budget usage counted from them, so step 0 shows what a new
 * leader's first pass would change (nothing, for a settled cluster). The
 * scenario's classes, nodes, claims and vms add to the snapshot (a name
 * it has already is refused); steps apply to both alike. An object of
 * any other kind is skipped (one note per kind); a known object that is
 * malformed where simulate reads it, has no kind, or is given twice exits
 * 2 with "SNAPSHOT-FILE: KIND NS/NAME: FIELD: message", nothing applied.
 * With --output json each step also lists the nodes: offers, ready,
 * schedulable, layoutPending.
 *
 * Template claims (DESIGN.md §3, issue 12 "Template claims"): a VM with
 * `gpus` gets, for each VMI, one claim per entry named VM-CLASS (template,
 * same namespace), created with the VMI and deleted once the VMI is final
 * or gone, so a pool holds GPUs only for running workers. A claim of that
 * name the VMI did not create (a scenario claim of the name) is not its
 * own: the set waits until it is gone. A VMI of such a VM that goes Failed
 * (`vmiFinal`) on a node remembers the node against the VM (DESIGN.md §6,
 * last rule; at most 64): its later template sets' candidates leave those
 * nodes out before the chooser sees them, unless every candidate is one
 * (then all are tried again) — the leader's on_choose.
 *
 * Each step is settled before its expect lines are checked: a template
 * set that waits for a claim of its name that is not its own is tried
 * again, the binder reconciles, the VMIs it asks to delete are deleted, the VM's runStrategy
 * decides whether a new VMI follows, a Pending VMI whose claims are all
 * Bound to one Ready, schedulable node runs there (its launcher pod is
 * pinned there, decision 0020 §5), and again until nothing changes.
 * Step 0 ("initial") settles the scenario as loaded.
 *
 * runStrategy (KubeVirt user guide, docs/compute/run_strategies.md, and
 * pkg/virt-controller/watch/vm.go, which starts a VMI whenever none exists
 * under Always and RerunOnFailure without a stop request):
 *   Always          a new VMI after the VMI ends (Succeeded or Failed) or
 *                   is deleted; `stop` sets Halted;
 *   RerunOnFailure  a new VMI after Failed or after a deletion by the
 *                   controller, none after Succeeded or `stop`;
 *   Once            runs once: no new VMI after it ends or is deleted;
 *   Manual          only `start` creates a VMI, nothing restarts it;
 *   Halted          no VMI; `start` sets Always.
 * `start` creates a VMI under any strategy when none is live (the guide's
 * virtctl table does not list Once; starting a Once VM is modelled so).
 * At load, VMs under Always, RerunOnFailure and Once get a VMI (Pending).
 *
 * Bad input — a key not listed, a wrong type, an unknown class (for a
 * class-scoped action), node, claim or VM, count 0, a claim named twice
 * by one VM or by two VMs, a volumeNodes that is not a list of 1 to 32
 * known nodes, none twice — exits 2 with "FILE: PATH: message" (PATH like
 * steps[2].cordon) before anything is printed: the whole scenario is first
 * replayed silently, so no step is half-applied.
 */
#include "cli/simulate.h"

#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binder/binder.h"
#include "placement/policy.h"
#include "placement/read.h"
#include "engine/engine.h"
#include "format/config.h"
#include "format/manifest.h"

_Static_assert(ENGINE_BINDER_MAX_CANDIDATES == BINDER_MAX_CANDIDATES, "the chooser is given what the binder finds");

#define SIM_MAX_TAINTS 16
#define SIM_MAX_OFFERS 16
#define SIM_MAX_PASSES 32

typedef enum { RS_HALTED = 0, RS_ALWAYS, RS_RERUN, RS_ONCE, RS_MANUAL } sim_rs;
static const char *const rs_names[] = {"Halted", "Always", "RerunOnFailure", "Once", "Manual"};

typedef struct sim_node {
    char name[BINDER_MAX_NAME + 1];
    uint32_t flags;
    binder_offer offers[SIM_MAX_OFFERS];
    char offer_names[SIM_MAX_OFFERS][BINDER_MAX_NAME + 1];
    size_t n_offers;
    binder_taint taints[SIM_MAX_TAINTS];
    size_t n_taints;
    json_t *labels; /* metadata.labels as given (borrowed from the scenario), NULL: none */
    int gone;
} sim_node;

typedef struct sim_vm {
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1];
    json_t *gpus; /* template GPUs [{class, count}] (borrowed from the scenario), NULL: named claims */
    sim_rs rs;
    binder_vmi_phase phase;
    char node[BINDER_MAX_NAME + 1];
    int restart; /* loaded from a snapshot with a final VMI: its VM controller acts after the first pass */
    json_t *vol_nodes; /* the nodes its bound volume's node affinity allows [name] (borrowed), NULL: no limit */
    int waits;         /* a claim of its template names is not its VMI's own: no set, it waits (decision 0027) */
} sim_vm;

/* The snapshot's objects by kind, checked (snap_read). */
typedef struct snapshot {
    json_t *by_kind;  /* kind -> [record] in the order read */
    json_t *classes;  /* [GPUClass object]: for runtime.binder.node and template claims */
    json_t *gpunodes; /* name -> GPUNode */
    json_t *vms;      /* "ns/name" -> VirtualMachine */
    json_t *vmis;     /* "ns/name" -> VirtualMachineInstance */
    json_t *claims;   /* "ns/name" -> GPUClaim (template claims' ownership, decision 0027) */
    json_t *pvcs;     /* "ns/name" -> PersistentVolumeClaim */
    json_t *pvs;      /* name -> PersistentVolume */
    json_t *raw;      /* node -> {resource name: units} used by VMIs no claim covers */
    json_t *view;     /* Namespaces, ResourceQuotas, GPUClasses and raw-use VMIs for the cluster view */
} snapshot;

/* Whether the snapshot has GPUClass `name`. */
static int snap_has_class(const snapshot *sn, const char *name)
{
    size_t i;
    json_t *c;
    json_array_foreach(sn->classes, i, c) {
        if(!strcmp(json_string_value(json_object_get(json_object_get(c, "metadata"), "name")), name))
            return 1;
    }
    return 0;
}

typedef struct sim {
    const char *file;
    json_t *snap_recs; /* the snapshot's manifest records (borrowed), NULL: none */
    engine *re;        /* runtime.binder: what a snapshot's nodes offer (borrowed; set with snap_recs) */
    snapshot *sn;      /* the snapshot's objects by kind, during the run */
    json_t *keep;      /* values the run's classes, nodes and VMs borrow */
    json_t *deleting;  /* "ns/name" -> true: a snapshot's claims being deleted (metadata.deletionTimestamp) */
    int quiet; /* the silent validation run */
    int json;
    json_t *doc;
    binder_state *st;
    sim_node nodes[1024];
    size_t n_nodes;
    sim_vm vms[4096];
    size_t n_vms;
    json_t *classes; /* name -> class object as given (for leaderChange) */
    json_t *vm_claims; /* "ns/name" -> [claim names]: the claims of the VM's set in the binder */
    json_t *owned;     /* "ns/claim" -> VM name: template claims of that VM's live VMI (decision 0027) */
    json_t *refused;   /* "ns/vm" -> {node: true}: nodes a template VMI of the VM failed on (DESIGN.md §6) */
    engine *e;         /* policies/binder.lua and the budget check at bind (borrowed) */
    const json_t *settings; /* --config or the defaults (borrowed) */
    placement_policy bp;     /* the chooser and budget hooks, and the usage table (placement/policy.h) */
    int policy_failures[ENGINE_OUTCOME_LAST]; /* the chooser's failures by kind (the leader's metric) */
    int choose_calls;
    char bad[1024];
    /* output of the current step */
    json_t *step_out;
    json_t *out;
    int expect_failed, expect_passed;
} sim;

static void bad(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(sim *s, const char *fmt, ...)
{
    if(s->bad[0])
        return;
    char m[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(s->bad, sizeof s->bad, "%s: %s", s->file, m);
}

/* -------------------------------------------------------------- fields */

static int check_keys(sim *s, const json_t *o, const char *path, const char *const *allowed)
{
    if(!json_is_object(o)) {
        bad(s, "%s: must be a mapping", path);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        int found = 0;
        for(const char *const *a = allowed; *a; a++)
            found |= !strcmp(*a, k);
        if(!found) {
            bad(s, "%s.%s: unknown field", path, k);
            return -1;
        }
    }
    return 0;
}

static const char *str_field(sim *s, const json_t *o, const char *key, const char *path, const char *dflt)
{
    const json_t *v = json_object_get(o, key);
    if(!v || json_is_null(v)) {
        if(!dflt)
            bad(s, "%s.%s: required", path, key);
        return dflt;
    }
    if(!json_is_string(v) || !*json_string_value(v)) {
        bad(s, "%s.%s: must be a non-empty string", path, key);
        return NULL;
    }
    return json_string_value(v);
}

static int bool_field(sim *s, const json_t *o, const char *key, const char *path, int dflt)
{
    const json_t *v = json_object_get(o, key);
    if(!v || json_is_null(v))
        return dflt;
    if(!json_is_boolean(v)) {
        bad(s, "%s.%s: must be true or false", path, key);
        return dflt;
    }
    return json_is_true(v);
}

/* "ns/name" or "name" (namespace "default") */
static int split_ref(sim *s, const char *ref, const char *path, char *ns, char *name)
{
    const char *slash = strchr(ref, '/');
    size_t nl = slash ? (size_t)(slash - ref) : 7;
    const char *nsp = slash ? ref : "default";
    const char *np = slash ? slash + 1 : ref;
    if(nl == 0 || nl > BINDER_MAX_NAMESPACE || !*np || strlen(np) > BINDER_MAX_NAME || strchr(np, '/')) {
        bad(s, "%s: \"%s\" is not NAMESPACE/NAME or NAME", path, ref);
        return -1;
    }
    memcpy(ns, nsp, nl);
    ns[nl] = 0;
    strcpy(name, np);
    return 0;
}

/* ---------------------------------------------------------------- output */

static void say(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(sim *s, const char *fmt, ...)
{
    if(s->quiet || s->json)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

static void out_event(sim *s, json_t *ev)
{
    json_array_append_new(json_object_get(s->step_out, "events"), ev);
}

/* A failure of the usage table (placement_policy's last_error) stops the run. */
static void usage_check(sim *s)
{
    if(s->bp.last_error.msg[0]) {
        bad(s, "internal: the usage table: %s", s->bp.last_error.msg);
        s->bp.last_error.msg[0] = 0;
    }
}

static void on_event(void *ud, const binder_event *e)
{
    sim *s = ud;
    placement_policy_on_event(&s->bp, e);
    usage_check(s);
    const char *fn = e->from_node ? e->from_node : "-", *tn = e->to_node ? e->to_node : "-";
    say(s, "  claim %s/%s: %s -> %s, node %s%s%s, %s: %s\n", e->ns, e->name, binder_phase_name(e->from),
        binder_phase_name(e->to), fn, strcmp(fn, tn) ? " -> " : "", strcmp(fn, tn) ? tn : "",
        binder_reason_name(e->reason), e->message);
    char ref[400];
    snprintf(ref, sizeof ref, "%s/%s", e->ns, e->name);
    out_event(s, json_pack("{s:s,s:s,s:s,s:s,s:o,s:o,s:s,s:s}", "kind", "claim", "claim", ref, "from",
                           binder_phase_name(e->from), "to", binder_phase_name(e->to), "fromNode",
                           e->from_node ? json_string(e->from_node) : json_null(), "toNode",
                           e->to_node ? json_string(e->to_node) : json_null(), "reason",
                           binder_reason_name(e->reason), "message", e->message));
}

static void vmi_note(sim *s, const sim_vm *v, binder_vmi_phase from, const char *why)
{
    say(s, "  vmi %s/%s: %s -> %s%s%s (%s)\n", v->ns, v->name, binder_vmi_phase_name(from),
        binder_vmi_phase_name(v->phase), v->node[0] ? " on " : "", v->node, why);
    char ref[400];
    snprintf(ref, sizeof ref, "%s/%s", v->ns, v->name);
    out_event(s, json_pack("{s:s,s:s,s:s,s:s,s:o,s:s}", "kind", "vmi", "vmi", ref, "from",
                           binder_vmi_phase_name(from), "to", binder_vmi_phase_name(v->phase), "node",
                           v->node[0] ? json_string(v->node) : json_null(), "why", why));
}

/* -------------------------------------------------------------- world */

static sim_node *node_get(sim *s, const char *name)
{
    for(size_t i = 0; i < s->n_nodes; i++)
        if(!s->nodes[i].gone && !strcmp(s->nodes[i].name, name))
            return &s->nodes[i];
    return NULL;
}

static sim_vm *vm_get(sim *s, const char *ns, const char *name)
{
    for(size_t i = 0; i < s->n_vms; i++)
        if(!strcmp(s->vms[i].ns, ns) && !strcmp(s->vms[i].name, name))
            return &s->vms[i];
    return NULL;
}

static void push_node(sim *s, sim_node *n, const char *path)
{
    binder_node_spec spec = {n->flags, n->offers, n->n_offers, n->taints, n->n_taints};
    cozy_err err = {{0}};
    if(binder_state_node_set(s->st, n->name, &spec, &err))
        bad(s, "%s: %s", path, err.msg);
}

static void push_vmi(sim *s, sim_vm *v)
{
    cozy_err err = {{0}};
    if(binder_state_set_vmi(s->st, v->ns, v->name, v->phase, v->node[0] ? v->node : NULL, &err))
        bad(s, "VM %s/%s: %s", v->ns, v->name, err.msg);
}

static void vm_key(const sim_vm *v, char *key, size_t n)
{
    snprintf(key, n, "%s/%s", v->ns, v->name);
}

/* Claim ns/name (deleted) leaves the claim lists of the VMs of its
 * namespace. */
static void vm_claims_forget(sim *s, const char *ns, const char *name)
{
    char ck[400];
    snprintf(ck, sizeof ck, "%s/%s", ns, name);
    json_object_del(s->owned, ck);
    const char *k;
    json_t *list;
    json_object_foreach(s->vm_claims, k, list) {
        size_t i;
        json_t *c;
        if(strncmp(k, ns, strlen(ns)) || k[strlen(ns)] != '/')
            continue;
        json_array_foreach(list, i, c) if(!strcmp(json_string_value(c), name))
        {
            json_array_remove(list, i);
            break;
        }
    }
}

/* A snapshot's claims being deleted (metadata.deletionTimestamp) go once
 * nothing uses them (placement_read_claim_in_use), as the leader takes its
 * protection finalizer off after a pass (decision 0026). Returns how many
 * went. */
static int release_deleted(sim *s)
{
    int n = 0;
    const char *k;
    json_t *v, *tmp;
    json_object_foreach_safe(s->deleting, tmp, k, v) {
        char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1];
        const char *slash = strchr(k, '/');
        snprintf(ns, sizeof ns, "%.*s", (int)(slash - k), k);
        snprintf(name, sizeof name, "%s", slash + 1);
        binder_claim_status cs;
        if(binder_state_claim_get(s->st, ns, name, &cs) == BINDER_OK) {
            if(placement_read_claim_in_use(s->st, ns, name))
                continue;
            placement_policy_on_delete(&s->bp, ns, name);
            binder_state_claim_delete(s->st, ns, name, NULL);
            vm_claims_forget(s, ns, name);
            say(s, "  claim %s/%s deleted (it was being deleted and nothing uses it any more)\n", ns, name);
            n++;
        }
        json_object_del(s->deleting, k);
    }
    return n;
}

/* Limits v's set to the nodes its bound volume allows (DESIGN.md §6,
 * WaitForFirstConsumer; binder_state_set_nodes), as the leader's
 * volume_nodes does after each put of the set. Nothing without a limit or
 * without a set. */
static void vm_limit(sim *s, sim_vm *v)
{
    if(!v->vol_nodes)
        return;
    const char *nodes[BINDER_MAX_SET_NODES];
    size_t n = 0, i;
    json_t *x;
    json_array_foreach(v->vol_nodes, i, x) if(n < BINDER_MAX_SET_NODES) nodes[n++] = json_string_value(x);
    binder_vmi_phase ph;
    if(binder_state_set_get(s->st, v->ns, v->name, &ph, NULL) != BINDER_OK)
        return;
    cozy_err err = {{0}};
    if(binder_state_set_nodes(s->st, v->ns, v->name, nodes, n, &err))
        bad(s, "VM %s/%s: volumeNodes: %s", v->ns, v->name, err.msg);
}

/* The name of v's template claim for GPU entry `g` ({class, count}):
 * VM-CLASS (decision 0027; the VMI has the VM's name). */
static void tmpl_name(const sim_vm *v, const json_t *g, char *buf, size_t n)
{
    snprintf(buf, n, "%s-%s", v->name, json_string_value(json_object_get(g, "class")));
}

/* Whether claim ns/name is a template claim of VM `vm`'s live VMI. */
static int owned_by(sim *s, const char *ns, const char *name, const char *vm)
{
    char ck[800];
    snprintf(ck, sizeof ck, "%s/%s", ns, name);
    const char *o = json_string_value(json_object_get(s->owned, ck));
    return o && !strcmp(o, vm);
}

/* Template claims (DESIGN.md §3, decision 0027) of v's live VMI, as the
 * leader's apply_set takes them: each VM-CLASS claim that does not exist
 * is created, owned by the VMI; a claim of such a name the VMI does not
 * own (a tenant's own claim, one left by another VMI) is never taken
 * over: the set waits (no set in the binder; settle tries again after
 * each pass). Otherwise the set is put, or its VMI's phase and node
 * updated, and limited to its volume's nodes. */
static void tmpl_take(sim *s, sim_vm *v)
{
    const char *names[BINDER_MAX_SET_CLASSES];
    char buf[BINDER_MAX_SET_CLASSES][2 * BINDER_MAX_NAME + 2]; /* def_vm checked the length */
    size_t n = 0, i;
    int ours = 1;
    json_t *g;
    json_array_foreach(v->gpus, i, g) {
        tmpl_name(v, g, buf[n], sizeof buf[n]);
        binder_claim_status cs;
        if(binder_state_claim_get(s->st, v->ns, buf[n], &cs) == BINDER_OK)
            ours &= owned_by(s, v->ns, buf[n], v->name);
        else {
            cozy_err err = {{0}};
            if(binder_state_claim_add(s->st, v->ns, buf[n], json_string_value(json_object_get(g, "class")),
                                      (uint32_t)json_integer_value(json_object_get(g, "count")), 1, &err)) {
                bad(s, "VM %s/%s: template claim: %s", v->ns, v->name, err.msg);
                return;
            }
            char ck[800];
            snprintf(ck, sizeof ck, "%s/%.600s", v->ns, buf[n]);
            json_object_set_new(s->owned, ck, json_string(v->name));
            say(s, "  template claim %s/%s created for VMI %s\n", v->ns, buf[n], v->name);
        }
        names[n] = buf[n];
        n++;
    }
    char key[400];
    vm_key(v, key, sizeof key);
    binder_vmi_phase ph;
    int has = binder_state_set_get(s->st, v->ns, v->name, &ph, NULL) == BINDER_OK;
    if(!ours) {
        if(!v->waits)
            say(s, "  VMI %s/%s waits: a claim of its template names is not its own (decision 0027)\n", v->ns,
                v->name);
        v->waits = 1;
        if(has)
            binder_state_set_delete(s->st, v->ns, v->name, NULL);
        json_object_set_new(s->vm_claims, key, json_array());
        return;
    }
    if(v->waits)
        say(s, "  VMI %s/%s: its template claims are its own now; its set is placed\n", v->ns, v->name);
    v->waits = 0;
    if(has) {
        push_vmi(s, v);
        return;
    }
    json_t *list = json_array();
    for(i = 0; i < n; i++)
        json_array_append_new(list, json_string(names[i]));
    json_object_set_new(s->vm_claims, key, list);
    cozy_err err = {{0}};
    if(binder_state_set_put(s->st, v->ns, v->name, names, n, v->phase, v->node[0] ? v->node : NULL, &err))
        bad(s, "VM %s/%s: %s", v->ns, v->name, err.msg);
    vm_limit(s, v);
}

/* v's VMI is final or gone: the template claims it owns are deleted
 * (never a claim of the name that is not its own, decision 0027), and its
 * set goes. */
static void tmpl_delete(sim *s, sim_vm *v)
{
    size_t i;
    json_t *g;
    json_array_foreach(v->gpus, i, g) {
        char name[2 * BINDER_MAX_NAME + 2], ck[800];
        tmpl_name(v, g, name, sizeof name);
        if(!owned_by(s, v->ns, name, v->name))
            continue;
        snprintf(ck, sizeof ck, "%s/%s", v->ns, name);
        json_object_del(s->owned, ck);
        placement_policy_on_delete(&s->bp, v->ns, name);
        if(binder_state_claim_delete(s->st, v->ns, name, NULL) == BINDER_OK)
            say(s, "  template claim %s/%s deleted (its VMI is %s)\n", v->ns, name,
                v->phase == BINDER_VMI_NONE ? "gone" : "final");
    }
    binder_state_set_delete(s->st, v->ns, v->name, NULL);
    char key[400];
    vm_key(v, key, sizeof key);
    json_object_set_new(s->vm_claims, key, json_array());
    v->waits = 0;
}

static void set_vmi(sim *s, sim_vm *v, binder_vmi_phase ph, const char *node, const char *why)
{
    binder_vmi_phase from = v->phase;
    v->phase = ph;
    snprintf(v->node, sizeof v->node, "%s", node ? node : "");
    vmi_note(s, v, from, why);
    if(!v->gpus) {
        push_vmi(s, v);
        return;
    }
    if(ph == BINDER_VMI_PENDING || ph == BINDER_VMI_SCHEDULED || ph == BINDER_VMI_RUNNING)
        tmpl_take(s, v);
    else
        tmpl_delete(s, v);
}

/* What the VM controller does once a VMI is gone or final (see the top). */
static void after_vmi_end(sim *s, sim_vm *v, int deleted_by_controller)
{
    binder_vmi_phase ph = v->phase;
    int again = v->rs == RS_ALWAYS || (v->rs == RS_RERUN && (ph == BINDER_VMI_FAILED || deleted_by_controller));
    if(again)
        set_vmi(s, v, BINDER_VMI_PENDING, NULL,
                v->rs == RS_ALWAYS ? "runStrategy Always starts a new VMI"
                                   : "runStrategy RerunOnFailure starts a new VMI");
}

static void on_delete_vmi(void *ud, const char *ns, const char *name, const char *why)
{
    sim *s = ud;
    sim_vm *v = vm_get(s, ns, name);
    if(!v || v->phase != BINDER_VMI_PENDING)
        return;
    char w[200];
    snprintf(w, sizeof w, "deleted by the controller: its claims must move (%s)", why);
    set_vmi(s, v, BINDER_VMI_NONE, NULL, w);
    after_vmi_end(s, v, 1);
}

/* The budget check at bind (DESIGN.md §5, decision 0020 §3) through
 * engine_binder_budget: the tenant-tree budgets of the scenario's
 * namespaces and resourceQuotas, with usage the units of the Bound,
 * Attached and Lost claims (kept per transition, usage_on_event) plus
 * what this hook allowed in the pass and is not bound yet (taken back when
 * a claim is refused, as its set then waits whole, and after each pass).
 * Asked once per Pending -> Bound,
 * never for a Lost rebind (the binder does not ask). A failure of the
 * check refuses (fail closed). */
static int on_budget(void *ud, const binder_claim_status *c, char *why, size_t why_size)
{
    sim *s = ud;
    engine_binder_verdict v;
    int ok = placement_policy_budget(&s->bp, c, why, why_size, &v);
    usage_check(s);
    if(!ok && v.outcome != ENGINE_ALLOWED)
        say(s, "  budget check failed (%s) for claim %s/%s: it waits (fail closed)\n",
            engine_outcome_name(v.outcome), c->ns, c->name);
    return ok;
}

/* The chooser (DESIGN.md §6, decision 0024) through engine_binder_choose:
 * policies/binder.lua, or the hoster's file of that name, picks among the
 * index's candidates. A policy failure binds in packing order (the first
 * candidate), is counted by kind and shown. */
/* A scenario node's labels for the chooser. */
static json_t *node_labels(void *ud, const char *node)
{
    sim_node *nd = node_get(ud, node);
    return nd && nd->labels ? json_incref(nd->labels) : NULL;
}

/* binder_hooks.choose, as the leader's (controller/bind.c on_choose): a
 * template set's candidates leave out the nodes a VMI of its VM failed on
 * (DESIGN.md §6, last rule; decision 0026 item 8) unless every candidate
 * is one (there is no elsewhere: all are tried again); then the chooser
 * picks among the rest. */
static int on_choose(void *ud, const binder_set_view *sv, const binder_candidate *cands, size_t n)
{
    sim *s = ud;
    s->choose_calls++;
    binder_candidate kept[BINDER_MAX_CANDIDATES];
    size_t at[BINDER_MAX_CANDIDATES], left;
    size_t k = placement_policy_avoid(s->refused, sv, cands, n, kept, at, &left);
    if(left) {
        char rk[400];
        snprintf(rk, sizeof rk, "%s/%s", sv->ns, sv->vm ? sv->vm : "");
        if(left == n)
            say(s, "  VM %s: every candidate is a node its VMIs failed on: all are tried again\n", rk);
        else
            say(s, "  VM %s: %zu node%s its VMIs failed on left out of its candidates\n", rk, left,
                left > 1 ? "s" : "");
        if(s->step_out)
            out_event(s, json_pack("{s:s,s:s,s:i,s:b}", "kind", "refusedNodes", "vm", rk, "leftOut", (int)left,
                                   "triedAgain", left == n));
    }
    engine_binder_choice ch;
    int i = placement_policy_choose(&s->bp, sv, kept, k, &ch);
    if(i >= 0 && (size_t)i < k)
        i = (int)at[i];
    if(ch.outcome != ENGINE_ALLOWED) {
        s->policy_failures[ch.outcome]++;
        say(s, "  binder policy failed (%s): %s; placed in the packing order instead\n",
            engine_outcome_name(ch.outcome), ch.message);
        if(s->step_out)
            out_event(s, json_pack("{s:s,s:s,s:s,s:s}", "kind", "binderPolicy", "outcome",
                                   engine_outcome_name(ch.outcome), "message", ch.message, "fallback",
                                   "packing order"));
    }
    return i;
}

/* A template VMI of v failed on `node` (DESIGN.md §6, last rule; decision
 * 0026 item 8): the node is remembered against the VM (at most 64), so
 * that its later template sets try elsewhere (on_choose). */
static void refuse_node(sim *s, const sim_vm *v, const char *node)
{
    if(placement_policy_refuse(s->refused, v->ns, v->name, node))
        say(s, "  VM %s/%s: its VMI failed on %s; its next template claims go elsewhere\n", v->ns, v->name, node);
}

typedef struct sched_ctx {
    const char *node;
    int all_bound;
} sched_ctx;

/* Settles the world: reconcile, then VMIs scheduled where their claims are. */
static void settle(sim *s)
{
    binder_hooks h = {s, on_choose, on_budget, on_event, on_delete_vmi};
    for(int round = 0; round < SIM_MAX_PASSES && !s->bad[0]; round++) {
        /* a template set waiting for a claim of its name that is not its
         * own: tried again, as the leader does when claims change */
        int retried = 0;
        for(size_t i = 0; i < s->n_vms && !s->bad[0]; i++) {
            sim_vm *v = &s->vms[i];
            if(v->waits && (v->phase == BINDER_VMI_PENDING || v->phase == BINDER_VMI_SCHEDULED ||
                            v->phase == BINDER_VMI_RUNNING)) {
                tmpl_take(s, v);
                retried |= !v->waits;
            }
        }
        size_t n = binder_reconcile(s->st, &h);
        placement_policy_settle(&s->bp);
        usage_check(s);
        int changed = retried | (s->deleting && release_deleted(s) > 0);
        for(size_t i = 0; i < s->n_vms; i++) {
            sim_vm *v = &s->vms[i];
            if(v->phase != BINDER_VMI_PENDING)
                continue;
            char key[400];
            snprintf(key, sizeof key, "%s/%s", v->ns, v->name);
            json_t *cl = json_object_get(s->vm_claims, key);
            const char *where = NULL;
            int ok = json_array_size(cl) > 0;
            size_t k;
            json_t *c;
            json_array_foreach(cl, k, c) {
                binder_claim_status cs;
                if(binder_state_claim_get(s->st, v->ns, json_string_value(c), &cs) || cs.phase != BINDER_BOUND ||
                   !cs.node || (where && strcmp(where, cs.node))) {
                    ok = 0;
                    break;
                }
                where = cs.node;
            }
            sim_node *nd = ok ? node_get(s, where) : NULL;
            if(nd && (nd->flags & BINDER_NODE_READY) && (nd->flags & BINDER_NODE_SCHEDULABLE)) {
                char w[BINDER_MAX_NAME + 1];
                snprintf(w, sizeof w, "%s", where);
                set_vmi(s, v, BINDER_VMI_RUNNING, w, "its claims are Bound there: the launcher pod is pinned and runs");
                changed = 1;
            }
        }
        if(!n && !changed)
            return;
    }
    if(!s->bad[0])
        bad(s, "the scenario did not settle after %d passes (a bug: please report it)", SIM_MAX_PASSES);
}

/* ---------------------------------------------------------- definitions */

static void def_class(sim *s, json_t *c, const char *path)
{
    static const char *const keys[] = {"name", "onCordon", "deleting", "tolerations", "resourceName", NULL};
    if(check_keys(s, c, path, keys))
        return;
    const char *name = str_field(s, c, "name", path, NULL);
    const char *oc = str_field(s, c, "onCordon", path, "Move");
    str_field(s, c, "resourceName", path, ""); /* checked: a string when given */
    int deleting = bool_field(s, c, "deleting", path, 0);
    if(s->bad[0])
        return;
    if(strcmp(oc, "Move") && strcmp(oc, "Stay"))
        return bad(s, "%s.onCordon: must be Move or Stay, not \"%s\"", path, oc);
    json_t *tl = json_object_get(c, "tolerations");
    binder_toleration tols[32];
    size_t nt = 0;
    if(tl && !json_is_array(tl))
        return bad(s, "%s.tolerations: must be a list", path);
    if(json_array_size(tl) > 32)
        return bad(s, "%s.tolerations: more than 32", path);
    size_t i;
    json_t *t;
    json_array_foreach(tl, i, t) {
        char p[300];
        snprintf(p, sizeof p, "%s.tolerations[%zu]", path, i);
        static const char *const tk[] = {"key", "operator", "value", "effect", "tolerationSeconds", NULL};
        if(check_keys(s, t, p, tk))
            return;
        tols[nt].key = str_field(s, t, "key", p, "");
        tols[nt].op = str_field(s, t, "operator", p, "Equal");
        tols[nt].value = str_field(s, t, "value", p, "");
        tols[nt].effect = str_field(s, t, "effect", p, "");
        if(s->bad[0])
            return;
        if(strcmp(tols[nt].op, "Exists") && strcmp(tols[nt].op, "Equal"))
            return bad(s, "%s.operator: must be Exists or Equal", p);
        nt++;
    }
    cozy_err err = {{0}};
    if(binder_state_class_set(s->st, name, !strcmp(oc, "Stay") ? BINDER_CORDON_STAY : BINDER_CORDON_MOVE, deleting,
                              tols, nt, &err))
        return bad(s, "%s: %s", path, err.msg);
    json_object_set(s->classes, name, c);
}

/* A class of the scenario's `classes`: def_class, refused when a class of
 * that name is known already (given twice, or in the snapshot). */
static void def_new_class(sim *s, json_t *c, const char *path)
{
    const char *name = json_string_value(json_object_get(c, "name"));
    if(name && json_object_get(s->classes, name))
        return bad(s, "%s.name: class %s is defined twice (or is in the snapshot)", path, name);
    def_class(s, c, path);
}

static void def_node(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"name", "capacity", "taints", "labels", "ready", "unschedulable",
                                       "layoutPending", NULL};
    if(check_keys(s, o, path, keys))
        return;
    const char *name = str_field(s, o, "name", path, NULL);
    if(s->bad[0])
        return;
    if(strlen(name) > BINDER_MAX_NAME)
        return bad(s, "%s.name: longer than %d", path, BINDER_MAX_NAME);
    if(node_get(s, name))
        return bad(s, "%s.name: node %s is defined twice", path, name);
    if(s->n_nodes == sizeof s->nodes / sizeof *s->nodes)
        return bad(s, "%s: more than %zu nodes", path, sizeof s->nodes / sizeof *s->nodes);
    sim_node *n = &s->nodes[s->n_nodes];
    memset(n, 0, sizeof *n);
    snprintf(n->name, sizeof n->name, "%s", name);
    n->flags = (bool_field(s, o, "ready", path, 1) ? BINDER_NODE_READY : 0) |
               (bool_field(s, o, "unschedulable", path, 0) ? 0 : BINDER_NODE_SCHEDULABLE) |
               (bool_field(s, o, "layoutPending", path, 0) ? BINDER_NODE_LAYOUT_PENDING : 0);
    json_t *cap = json_object_get(o, "capacity");
    if(cap && !json_is_object(cap))
        return bad(s, "%s.capacity: must be a mapping of class to units", path);
    const char *k;
    json_t *v;
    json_object_foreach(cap, k, v) {
        if(!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > BINDER_MAX_UNITS)
            return bad(s, "%s.capacity.%s: must be a whole number of units, 0 to %d", path, k, BINDER_MAX_UNITS);
        if(!json_object_get(s->classes, k))
            return bad(s, "%s.capacity.%s: unknown class", path, k);
        if(n->n_offers == SIM_MAX_OFFERS)
            return bad(s, "%s.capacity: more than %d classes", path, SIM_MAX_OFFERS);
        snprintf(n->offer_names[n->n_offers], sizeof n->offer_names[0], "%s", k);
        n->offers[n->n_offers].class_name = n->offer_names[n->n_offers];
        n->offers[n->n_offers].units = (uint32_t)json_integer_value(v);
        n->n_offers++;
    }
    json_t *tl = json_object_get(o, "taints");
    if(tl && !json_is_array(tl))
        return bad(s, "%s.taints: must be a list", path);
    size_t i;
    json_t *t;
    json_array_foreach(tl, i, t) {
        char p[300];
        snprintf(p, sizeof p, "%s.taints[%zu]", path, i);
        static const char *const tk[] = {"key", "value", "effect", NULL};
        if(check_keys(s, t, p, tk))
            return;
        if(n->n_taints == SIM_MAX_TAINTS)
            return bad(s, "%s: more than %d taints", p, SIM_MAX_TAINTS);
        /* the strings live in the scenario document, which outlives the run */
        n->taints[n->n_taints].key = str_field(s, t, "key", p, NULL);
        n->taints[n->n_taints].value = str_field(s, t, "value", p, "");
        n->taints[n->n_taints].effect = str_field(s, t, "effect", p, NULL);
        if(s->bad[0])
            return;
        const char *e = n->taints[n->n_taints].effect;
        if(strcmp(e, "NoSchedule") && strcmp(e, "PreferNoSchedule") && strcmp(e, "NoExecute"))
            return bad(s, "%s.effect: must be NoSchedule, PreferNoSchedule or NoExecute", p);
        n->n_taints++;
    }
    json_t *labels = json_object_get(o, "labels");
    if(labels && !json_is_object(labels))
        return bad(s, "%s.labels: must be a mapping", path);
    const char *lk;
    json_t *lv;
    json_object_foreach(labels, lk, lv) {
        if(!json_is_string(lv))
            return bad(s, "%s.labels.%s: must be a string", path, lk);
    }
    n->labels = labels;
    if(s->bad[0])
        return;
    s->n_nodes++;
    push_node(s, n, path);
}

static void def_claim(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"name", "namespace", "class", "count", NULL};
    if(check_keys(s, o, path, keys))
        return;
    const char *name = str_field(s, o, "name", path, NULL);
    const char *ns = str_field(s, o, "namespace", path, "default");
    const char *cls = str_field(s, o, "class", path, NULL);
    if(s->bad[0])
        return;
    json_t *cnt = json_object_get(o, "count");
    if(!json_is_integer(cnt) || json_integer_value(cnt) < 1 || json_integer_value(cnt) > BINDER_MAX_UNITS)
        return bad(s, "%s.count: must be a whole number from 1 to %d", path, BINDER_MAX_UNITS);
    if(!json_object_get(s->classes, cls))
        return bad(s, "%s.class: unknown class \"%s\"", path, cls);
    binder_claim_status cs;
    if(!binder_state_claim_get(s->st, ns, name, &cs))
        return bad(s, "%s.name: claim %s/%s is defined twice", path, ns, name);
    cozy_err err = {{0}};
    if(binder_state_claim_add(s->st, ns, name, cls, (uint32_t)json_integer_value(cnt), 0, &err))
        bad(s, "%s: %s", path, err.msg);
}

/* A VM's `volumeNodes` (when given): a list of 1 to BINDER_MAX_SET_NODES
 * known node names, none twice. Returns it (borrowed), or NULL (none, or
 * the run failed). */
static json_t *vm_volume_nodes(sim *s, json_t *o, const char *path)
{
    json_t *vn = json_object_get(o, "volumeNodes");
    if(!vn)
        return NULL;
    if(!json_is_array(vn) || !json_array_size(vn) || json_array_size(vn) > BINDER_MAX_SET_NODES) {
        bad(s, "%s.volumeNodes: must be a list of 1 to %d node names", path, BINDER_MAX_SET_NODES);
        return NULL;
    }
    size_t i;
    json_t *x;
    json_array_foreach(vn, i, x) {
        if(!json_is_string(x) || !*json_string_value(x)) {
            bad(s, "%s.volumeNodes[%zu]: must be a node name", path, i);
            return NULL;
        }
        if(!node_get(s, json_string_value(x))) {
            bad(s, "%s.volumeNodes[%zu]: unknown node \"%s\"", path, i, json_string_value(x));
            return NULL;
        }
        for(size_t k = 0; k < i; k++)
            if(json_equal(x, json_array_get(vn, k))) {
                bad(s, "%s.volumeNodes[%zu]: node \"%s\" is named twice", path, i, json_string_value(x));
                return NULL;
            }
    }
    return vn;
}

static void def_vm(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"name", "namespace", "claims", "gpus", "runStrategy", "volumeNodes", NULL};
    if(check_keys(s, o, path, keys))
        return;
    const char *name = str_field(s, o, "name", path, NULL);
    const char *ns = str_field(s, o, "namespace", path, "default");
    const char *rs = str_field(s, o, "runStrategy", path, "Halted");
    json_t *gpus = json_object_get(o, "gpus");
    if(s->bad[0])
        return;
    if(vm_get(s, ns, name))
        return bad(s, "%s.name: VM %s/%s is defined twice", path, ns, name);
    int r = -1;
    for(int i = 0; i < 5; i++)
        if(!strcmp(rs, rs_names[i]))
            r = i;
    if(r < 0)
        return bad(s, "%s.runStrategy: must be Always, RerunOnFailure, Once, Manual or Halted, not \"%s\"", path, rs);
    if(gpus && json_object_get(o, "claims"))
        return bad(s, "%s: name claims or ask for gpus (template claims), not both", path);
    json_t *vol = vm_volume_nodes(s, o, path);
    if(s->bad[0])
        return;
    if(gpus) {
        if(!json_is_array(gpus) || !json_array_size(gpus) || json_array_size(gpus) > BINDER_MAX_SET_CLASSES)
            return bad(s, "%s.gpus: must be a list of 1 to %d {class, count}", path, BINDER_MAX_SET_CLASSES);
        size_t i;
        json_t *g;
        json_array_foreach(gpus, i, g) {
            char p[300];
            snprintf(p, sizeof p, "%s.gpus[%zu]", path, i);
            static const char *const gk[] = {"class", "count", NULL};
            if(check_keys(s, g, p, gk))
                return;
            const char *cls = str_field(s, g, "class", p, NULL);
            if(s->bad[0])
                return;
            if(!json_object_get(s->classes, cls))
                return bad(s, "%s.class: unknown class \"%s\"", p, cls);
            json_t *cnt = json_object_get(g, "count");
            if(!json_is_integer(cnt) || json_integer_value(cnt) < 1 || json_integer_value(cnt) > BINDER_MAX_UNITS)
                return bad(s, "%s.count: must be a whole number from 1 to %d", p, BINDER_MAX_UNITS);
            for(size_t k = 0; k < i; k++)
                if(!strcmp(json_string_value(json_object_get(json_array_get(gpus, k), "class")), cls))
                    return bad(s, "%s.class: class \"%s\" is asked for twice", p, cls);
            if(strlen(name) + 1 + strlen(cls) > BINDER_MAX_NAME)
                return bad(s, "%s.class: the template claim name %s-%s is too long", p, name, cls);
        }
        if(s->n_vms == sizeof s->vms / sizeof *s->vms)
            return bad(s, "%s: too many VMs", path);
        sim_vm *v = &s->vms[s->n_vms++];
        memset(v, 0, sizeof *v);
        snprintf(v->ns, sizeof v->ns, "%s", ns);
        snprintf(v->name, sizeof v->name, "%s", name);
        v->rs = (sim_rs)r;
        v->gpus = gpus;
        v->vol_nodes = vol;
        char key[400];
        vm_key(v, key, sizeof key);
        json_object_set_new(s->vm_claims, key, json_array());
        if(v->rs == RS_ALWAYS || v->rs == RS_RERUN || v->rs == RS_ONCE)
            set_vmi(s, v, BINDER_VMI_PENDING, NULL, "created: runStrategy starts it");
        return;
    }
    json_t *cl = json_object_get(o, "claims");
    if(!json_is_array(cl) || !json_array_size(cl))
        return bad(s, "%s.claims: must be a non-empty list of claim names (or gpus: for template claims)", path);
    const char *names[BINDER_MAX_SET_CLAIMS];
    size_t n = 0, i;
    json_t *c;
    json_array_foreach(cl, i, c) {
        if(!json_is_string(c) || !*json_string_value(c))
            return bad(s, "%s.claims[%zu]: must be a claim name", path, i);
        if(n == BINDER_MAX_SET_CLAIMS)
            return bad(s, "%s.claims: more than %d", path, BINDER_MAX_SET_CLAIMS);
        binder_claim_status cs;
        if(binder_state_claim_get(s->st, ns, json_string_value(c), &cs))
            return bad(s, "%s.claims[%zu]: no claim \"%s\" in namespace %s", path, i, json_string_value(c), ns);
        for(size_t k = 0; k < n; k++)
            if(!strcmp(names[k], json_string_value(c)))
                return bad(s, "%s.claims[%zu]: claim \"%s\" is named twice", path, i, names[k]);
        names[n++] = json_string_value(c);
    }
    if(s->n_vms == sizeof s->vms / sizeof *s->vms)
        return bad(s, "%s: too many VMs", path);
    sim_vm *v = &s->vms[s->n_vms];
    memset(v, 0, sizeof *v);
    snprintf(v->ns, sizeof v->ns, "%s", ns);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->rs = (sim_rs)r;
    v->vol_nodes = vol;
    cozy_err err = {{0}};
    if(binder_state_set_put(s->st, ns, name, names, n, BINDER_VMI_NONE, NULL, &err))
        return bad(s, "%s.claims: %s", path, err.msg);
    s->n_vms++;
    vm_limit(s, v);
    char key[400];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    json_object_set(s->vm_claims, key, cl);
    if(v->rs == RS_ALWAYS || v->rs == RS_RERUN || v->rs == RS_ONCE)
        set_vmi(s, v, BINDER_VMI_PENDING, NULL, "created: runStrategy starts it");
}

/* A Kubernetes object of the scenario (namespaces, resourceQuotas): a
 * mapping with metadata.name (and metadata.namespace when namespaced),
 * copied into `objects` with its kind set. */
static void def_object(sim *s, json_t *o, const char *path, const char *kind, int namespaced, json_t *objects)
{
    json_t *md = json_object_get(o, "metadata");
    if(!json_is_object(o) || !json_is_object(md))
        return bad(s, "%s: must be a %s object (metadata.name%s)", path, kind,
                   namespaced ? ", metadata.namespace, spec.hard" : ", metadata.labels");
    const json_t *name = json_object_get(md, "name"), *ns = json_object_get(md, "namespace");
    if(!json_is_string(name) || !*json_string_value(name))
        return bad(s, "%s.metadata.name: must be a non-empty string", path);
    if(namespaced && (!json_is_string(ns) || !*json_string_value(ns)))
        return bad(s, "%s.metadata.namespace: must be a non-empty string", path);
    json_t *labels = json_object_get(md, "labels");
    if(labels && !json_is_object(labels))
        return bad(s, "%s.metadata.labels: must be a mapping", path);
    if(namespaced && !json_is_object(json_object_get(json_object_get(o, "spec"), "hard")))
        return bad(s, "%s.spec.hard: must be a mapping", path);
    json_t *copy = json_deep_copy(o);
    json_object_set_new(copy, "apiVersion", json_string("v1"));
    json_object_set_new(copy, "kind", json_string(kind));
    json_array_append_new(objects, copy);
}

/* The cluster view the budget check at bind and the chooser read
 * (engine_set_cluster): a GPUClass per class (name, spec.resourceName
 * when given; a snapshot's GPUClass as it is), the scenario's namespaces
 * and resourceQuotas, and a snapshot's Namespaces, ResourceQuotas and the
 * VMIs whose GPUs no claim covers (what the leader's view holds). */
static void set_cluster(sim *s)
{
    if(s->bad[0])
        return;
    json_t *objects = json_array();
    const char *k;
    json_t *c;
    json_object_foreach(s->classes, k, c) {
        if(s->sn && snap_has_class(s->sn, k))
            continue; /* the snapshot's GPUClass object itself is in the view */
        json_t *spec = json_object();
        const json_t *rn = json_object_get(c, "resourceName");
        if(json_is_string(rn))
            json_object_set_new(spec, "resourceName", json_string(json_string_value(rn)));
        json_array_append_new(objects, json_pack("{s:s,s:s,s:{s:s},s:o}", "apiVersion", "cozystack.io/v1alpha1", "kind",
                                                 "GPUClass", "metadata", "name", k, "spec", spec));
    }
    static const char *const lists[] = {"namespaces", "resourceQuotas"};
    for(int l = 0; l < 2 && !s->bad[0]; l++) {
        json_t *list = json_object_get(s->doc, lists[l]);
        if(list && !json_is_array(list)) {
            bad(s, "%s: must be a list", lists[l]);
            break;
        }
        size_t i;
        json_t *o;
        json_array_foreach(list, i, o) {
            char p[100];
            snprintf(p, sizeof p, "%s[%zu]", lists[l], i);
            def_object(s, o, p, l ? "ResourceQuota" : "Namespace", l, objects);
            if(s->bad[0])
                break;
        }
    }
    if(s->sn)
        json_array_extend(objects, s->sn->view);
    cozy_err err = {{0}};
    if(!s->bad[0] && engine_set_cluster(s->e, objects, s->settings, &err) != COZY_OK)
        bad(s, "the cluster view: %s", err.msg);
    json_decref(objects);
}

static void def_list(sim *s, json_t *list, const char *path, void (*fn)(sim *, json_t *, const char *))
{
    if(!list)
        return;
    if(!json_is_array(list))
        return bad(s, "%s: must be a list", path);
    size_t i;
    json_t *o;
    json_array_foreach(list, i, o) {
        char p[200];
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        fn(s, o, p);
        if(s->bad[0])
            return;
    }
}

/* ------------------------------------------------------------- snapshot */

/* The kinds a snapshot is read for (anything else is skipped with a
 * note), and whether they are namespaced. */
static const struct {
    const char *kind;
    int namespaced;
} snap_kinds[] = {{"GPUClass", 0},      {"Node", 0},           {"GPUNode", 0},
                  {"KubeVirt", 1},      {"GPUClaim", 1},       {"VirtualMachine", 1},
                  {"VirtualMachineInstance", 1}, {"Namespace", 0}, {"ResourceQuota", 1},
                  {"PersistentVolumeClaim", 1}, {"PersistentVolume", 0}};
_Static_assert(sizeof snap_kinds / sizeof *snap_kinds == 11, "snap_apply's note counts each kind");

/* A field of `o` down the NULL-terminated list of keys (NULL when absent). */
static const json_t *get(const json_t *o, ...)
{
    va_list ap;
    va_start(ap, o);
    for(const char *k = va_arg(ap, const char *); k && o; k = va_arg(ap, const char *))
        o = json_object_get(o, k);
    va_end(ap);
    return o;
}

/* A snapshot record's object: "KIND NS/NAME" or "KIND NAME". */
static void snap_id(const json_t *rec, char *buf, size_t n)
{
    const json_t *o = json_object_get(rec, "object");
    const char *kind = json_string_value(json_object_get(o, "kind"));
    const char *ns = json_string_value(get(o, "metadata", "namespace", NULL));
    const char *name = json_string_value(get(o, "metadata", "name", NULL));
    snprintf(buf, n, "%s %s%s%s", kind ? kind : "object", ns ? ns : "", ns ? "/" : "",
             name ? name : "(no metadata.name)");
}

/* Fails the run on snapshot record `rec`: "FILE: KIND NS/NAME: FIELD:
 * message" (FILE the snapshot file the object came from). Returns -1. */
static int snap_bad(sim *s, const json_t *rec, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int snap_bad(sim *s, const json_t *rec, const char *field, const char *fmt, ...)
{
    if(s->bad[0])
        return -1;
    char m[600], id[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snap_id(rec, id, sizeof id);
    snprintf(s->bad, sizeof s->bad, "%s: %s: %s%s%s", json_string_value(json_object_get(rec, "file")), id,
             field ? field : "", field ? ": " : "", m);
    return -1;
}

/* A note of the snapshot's reading: a line of step 0 (table) or an event
 * {kind: note, message} (json). */
static void snap_note(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void snap_note(sim *s, const char *fmt, ...)
{
    char m[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    say(s, "  note: %s\n", m);
    if(s->step_out)
        out_event(s, json_pack("{s:s,s:s}", "kind", "note", "message", m));
}

/* Type checks of one field of a snapshot object: absent is fine unless
 * `required`; otherwise the value must be of the kind named. Each returns
 * 0, or -1 with the run failed (snap_bad). */
static int want_str(sim *s, const json_t *rec, const json_t *v, const char *field, int required)
{
    if(!v || json_is_null(v))
        return required ? snap_bad(s, rec, field, "required") : 0;
    if(!json_is_string(v) || (required && !*json_string_value(v)))
        return snap_bad(s, rec, field, "must be a%s string", required ? " non-empty" : "");
    return 0;
}

/* `v` (when given) is of JSON type `type`: JSON_OBJECT, JSON_ARRAY or
 * JSON_TRUE (a boolean). */
static int want_type(sim *s, const json_t *rec, const json_t *v, const char *field, int type)
{
    if(!v || json_is_null(v))
        return 0;
    static const char *const what[] = {[JSON_OBJECT] = "a mapping", [JSON_ARRAY] = "a list",
                                       [JSON_TRUE] = "true or false"};
    int t = json_typeof(v) == JSON_FALSE ? JSON_TRUE : (int)json_typeof(v);
    if(t != type)
        return snap_bad(s, rec, field, "must be %s", what[type]);
    return 0;
}

/* Every element of list `v` (when given) is a mapping; its string fields
 * `strs` (NULL-terminated) are strings when given. */
static int want_maps(sim *s, const json_t *rec, const json_t *v, const char *field, const char *const *strs)
{
    if(want_type(s, rec, v, field, JSON_ARRAY))
        return -1;
    size_t i;
    json_t *x;
    json_array_foreach((json_t *)v, i, x) {
        char f[300];
        snprintf(f, sizeof f, "%s[%zu]", field, i);
        if(!json_is_object(x))
            return snap_bad(s, rec, f, "must be a mapping");
        for(const char *const *k = strs; k && *k; k++) {
            char fk[400];
            snprintf(fk, sizeof fk, "%s.%s", f, *k);
            if(want_str(s, rec, json_object_get(x, *k), fk, 0))
                return -1;
        }
    }
    return 0;
}

/* metadata.labels or .annotations (when given) map names to strings. */
static int want_string_map(sim *s, const json_t *rec, const json_t *v, const char *field)
{
    if(want_type(s, rec, v, field, JSON_OBJECT))
        return -1;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if(!json_is_string(x)) {
            char f[400];
            snprintf(f, sizeof f, "%s.%s", field, k);
            return snap_bad(s, rec, f, "must be a string");
        }
    }
    return 0;
}

/* The volumes of a VM's template or a VMI (`vols`, at `field`), as
 * placement_read_volume_nodes reads them: a list of mappings whose
 * persistentVolumeClaim.claimName and dataVolume.name are strings. */
static int want_volumes(sim *s, const json_t *rec, const json_t *vols, const char *field)
{
    if(want_maps(s, rec, vols, field, NULL))
        return -1;
    size_t i;
    json_t *v;
    json_array_foreach((json_t *)vols, i, v) {
        static const char *const src[][2] = {{"persistentVolumeClaim", "claimName"}, {"dataVolume", "name"}};
        for(int k = 0; k < 2; k++) {
            char f[400];
            snprintf(f, sizeof f, "%s[%zu].%s", field, i, src[k][0]);
            const json_t *x = json_object_get(v, src[k][0]);
            if(want_type(s, rec, x, f, JSON_OBJECT))
                return -1;
            snprintf(f, sizeof f, "%s[%zu].%s.%s", field, i, src[k][0], src[k][1]);
            if(want_str(s, rec, json_object_get(x, src[k][1]), f, 0))
                return -1;
        }
    }
    return 0;
}

/* A PersistentVolume's spec.nodeAffinity, as placement_read_pv_nodes reads it:
 * required.nodeSelectorTerms a list of mappings, their matchExpressions
 * and matchFields lists of {key, operator} strings with `values` a list of
 * strings. */
static int want_pv_affinity(sim *s, const json_t *rec, const json_t *o)
{
    const json_t *na = get(o, "spec", "nodeAffinity", NULL);
    const json_t *terms = get(na, "required", "nodeSelectorTerms", NULL);
    static const char *const kv[] = {"key", "operator", NULL};
    if(want_type(s, rec, na, "spec.nodeAffinity", JSON_OBJECT) ||
       want_type(s, rec, json_object_get(na, "required"), "spec.nodeAffinity.required", JSON_OBJECT) ||
       want_maps(s, rec, terms, "spec.nodeAffinity.required.nodeSelectorTerms", NULL))
        return -1;
    size_t i;
    json_t *t;
    json_array_foreach((json_t *)terms, i, t) {
        static const char *const kinds[] = {"matchExpressions", "matchFields"};
        for(int k = 0; k < 2; k++) {
            char f[300];
            snprintf(f, sizeof f, "spec.nodeAffinity.required.nodeSelectorTerms[%zu].%s", i, kinds[k]);
            const json_t *reqs = json_object_get(t, kinds[k]);
            if(want_maps(s, rec, reqs, f, kv))
                return -1;
            size_t j;
            json_t *r;
            json_array_foreach((json_t *)reqs, j, r) {
                char fv[400];
                snprintf(fv, sizeof fv, "%s[%zu].values", f, j);
                const json_t *vals = json_object_get(r, "values");
                if(want_type(s, rec, vals, fv, JSON_ARRAY))
                    return -1;
                size_t m;
                json_t *val;
                json_array_foreach((json_t *)vals, m, val) {
                    if(!json_is_string(val)) {
                        char fm[450];
                        snprintf(fm, sizeof fm, "%s[%zu]", fv, m);
                        return snap_bad(s, rec, fm, "must be a string");
                    }
                }
            }
        }
    }
    return 0;
}

/* Checks the fields simulate reads of snapshot record `rec` of kind
 * `kind` (the leader reads the same ones: placement/read.c,
 * runtime.binder.node). Returns 0 or -1 (the run failed naming the file,
 * the object and the field). */
static int snap_check(sim *s, const json_t *rec, const char *kind, int namespaced)
{
    const json_t *o = json_object_get(rec, "object");
    const json_t *md = json_object_get(o, "metadata");
    if(!json_is_object(md))
        return snap_bad(s, rec, "metadata", "required (a mapping)");
    if(want_str(s, rec, json_object_get(md, "name"), "metadata.name", 1) ||
       (namespaced && want_str(s, rec, json_object_get(md, "namespace"), "metadata.namespace", 1)) ||
       want_string_map(s, rec, json_object_get(md, "labels"), "metadata.labels") ||
       want_string_map(s, rec, json_object_get(md, "annotations"), "metadata.annotations") ||
       want_str(s, rec, json_object_get(md, "deletionTimestamp"), "metadata.deletionTimestamp", 0) ||
       want_type(s, rec, json_object_get(o, "spec"), "spec", JSON_OBJECT) ||
       want_type(s, rec, json_object_get(o, "status"), "status", JSON_OBJECT))
        return -1;
    const char *name = json_string_value(json_object_get(md, "name"));
    if(strlen(name) > BINDER_MAX_NAME)
        return snap_bad(s, rec, "metadata.name", "longer than %d", BINDER_MAX_NAME);
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    if(namespaced && strlen(ns) > BINDER_MAX_NAMESPACE)
        return snap_bad(s, rec, "metadata.namespace", "longer than %d", BINDER_MAX_NAMESPACE);
    static const char *const tol[] = {"key", "operator", "value", "effect", NULL};
    static const char *const taint[] = {"key", "value", "effect", NULL};
    static const char *const cond[] = {"type", "status", "reason", NULL};
    static const char *const dev[] = {"deviceName", NULL};
    if(!strcmp(kind, "GPUClass")) {
        const json_t *oc = get(o, "spec", "onCordon", NULL);
        if(want_str(s, rec, oc, "spec.onCordon", 0) || want_str(s, rec, get(o, "spec", "resourceName", NULL),
                                                                 "spec.resourceName", 0) ||
           want_maps(s, rec, get(o, "spec", "tolerations", NULL), "spec.tolerations", tol))
            return -1;
        if(oc && strcmp(json_string_value(oc), "Move") && strcmp(json_string_value(oc), "Stay"))
            return snap_bad(s, rec, "spec.onCordon", "must be Move or Stay, not \"%s\"", json_string_value(oc));
        size_t i;
        json_t *t;
        json_array_foreach(get(o, "spec", "tolerations", NULL), i, t) {
            const char *op = json_string_value(json_object_get(t, "operator"));
            if(op && strcmp(op, "Exists") && strcmp(op, "Equal")) {
                char f[100];
                snprintf(f, sizeof f, "spec.tolerations[%zu].operator", i);
                return snap_bad(s, rec, f, "must be Exists or Equal, not \"%s\"", op);
            }
        }
        if(json_array_size(get(o, "spec", "tolerations", NULL)) > 32)
            return snap_bad(s, rec, "spec.tolerations", "more than 32");
    } else if(!strcmp(kind, "Node")) {
        if(want_type(s, rec, get(o, "spec", "unschedulable", NULL), "spec.unschedulable", JSON_TRUE) ||
           want_maps(s, rec, get(o, "spec", "taints", NULL), "spec.taints", taint) ||
           want_maps(s, rec, get(o, "status", "conditions", NULL), "status.conditions", cond) ||
           want_type(s, rec, get(o, "status", "allocatable", NULL), "status.allocatable", JSON_OBJECT) ||
           want_str(s, rec, get(o, "status", "nodeInfo", "bootID", NULL), "status.nodeInfo.bootID", 0))
            return -1;
    } else if(!strcmp(kind, "GPUNode")) {
        if(want_maps(s, rec, get(o, "status", "functions", NULL), "status.functions", NULL) ||
           want_str(s, rec, get(o, "status", "bootID", NULL), "status.bootID", 0))
            return -1;
    } else if(!strcmp(kind, "KubeVirt")) {
        if(want_type(s, rec, get(o, "spec", "configuration", "permittedHostDevices", NULL),
                     "spec.configuration.permittedHostDevices", JSON_OBJECT))
            return -1;
    } else if(!strcmp(kind, "GPUClaim")) {
        const json_t *cnt = get(o, "spec", "count", NULL), *ph = get(o, "status", "phase", NULL);
        if(want_str(s, rec, get(o, "spec", "class", NULL), "spec.class", 1))
            return -1;
        if(!json_is_integer(cnt) || json_integer_value(cnt) < 1 || json_integer_value(cnt) > BINDER_MAX_UNITS)
            return snap_bad(s, rec, "spec.count", "must be a whole number from 1 to %d", BINDER_MAX_UNITS);
        if(want_str(s, rec, ph, "status.phase", 0) ||
           want_str(s, rec, get(o, "status", "node", NULL), "status.node", 0) ||
           want_str(s, rec, get(o, "status", "attachedTo", NULL), "status.attachedTo", 0) ||
           want_maps(s, rec, get(o, "status", "conditions", NULL), "status.conditions", cond))
            return -1;
        binder_phase p;
        if(ph && binder_phase_parse(json_string_value(ph), &p))
            return snap_bad(s, rec, "status.phase", "must be Pending, Bound, Attached or Lost, not \"%s\"",
                            json_string_value(ph));
        size_t i;
        json_t *c;
        json_array_foreach(get(o, "status", "conditions", NULL), i, c) {
            const char *t = json_string_value(json_object_get(c, "type"));
            const char *r = json_string_value(json_object_get(c, "reason"));
            binder_reason br;
            /* "Pending": the leader's word for no reason yet (bind.c status_of) */
            if(t && !strcmp(t, "Ready") && r && *r && strcmp(r, "Pending") && binder_reason_parse(r, &br)) {
                char f[100];
                snprintf(f, sizeof f, "status.conditions[%zu].reason", i);
                return snap_bad(s, rec, f, "\"%s\" is not a reason of decision 0020", r);
            }
        }
    } else if(!strcmp(kind, "VirtualMachine")) {
        const json_t *rs = get(o, "spec", "runStrategy", NULL);
        if(want_str(s, rec, rs, "spec.runStrategy", 0) ||
           want_type(s, rec, get(o, "spec", "running", NULL), "spec.running", JSON_TRUE) ||
           want_string_map(s, rec, get(o, "spec", "template", "metadata", "annotations", NULL),
                           "spec.template.metadata.annotations") ||
           want_string_map(s, rec, get(o, "spec", "template", "metadata", "labels", NULL),
                           "spec.template.metadata.labels") ||
           want_maps(s, rec, get(o, "spec", "template", "spec", "domain", "devices", "gpus", NULL),
                     "spec.template.spec.domain.devices.gpus", dev) ||
           want_maps(s, rec, get(o, "spec", "template", "spec", "domain", "devices", "hostDevices", NULL),
                     "spec.template.spec.domain.devices.hostDevices", dev) ||
           want_volumes(s, rec, get(o, "spec", "template", "spec", "volumes", NULL), "spec.template.spec.volumes"))
            return -1;
        int r = -1;
        for(int i = 0; rs && i < 5; i++)
            if(!strcmp(json_string_value(rs), rs_names[i]))
                r = i;
        if(rs && r < 0) {
            char id[400];
            snap_id(rec, id, sizeof id);
            snap_note(s, "snapshot: %s: runStrategy %s is not modelled; replayed as Manual (nothing restarts it)", id,
                      json_string_value(rs));
        }
    } else if(!strcmp(kind, "VirtualMachineInstance")) {
        const json_t *ph = get(o, "status", "phase", NULL);
        if(want_str(s, rec, ph, "status.phase", 0) ||
           want_str(s, rec, get(o, "status", "nodeName", NULL), "status.nodeName", 0) ||
           want_maps(s, rec, get(o, "spec", "domain", "devices", "gpus", NULL), "spec.domain.devices.gpus", dev) ||
           want_maps(s, rec, get(o, "spec", "domain", "devices", "hostDevices", NULL),
                     "spec.domain.devices.hostDevices", dev) ||
           want_volumes(s, rec, get(o, "spec", "volumes", NULL), "spec.volumes"))
            return -1;
        static const char *const phases[] = {"",        "Pending",   "Scheduling", "Scheduled",
                                             "Running", "Succeeded", "Failed",     "Unknown"};
        int ok = !ph;
        for(size_t i = 0; ph && i < sizeof phases / sizeof *phases; i++)
            ok |= !strcmp(json_string_value(ph), phases[i]);
        if(!ok) {
            char id[400];
            snap_id(rec, id, sizeof id);
            snap_note(s, "snapshot: %s: status.phase %s is read as Running, as the leader reads it", id,
                      json_string_value(ph));
        }
    } else if(!strcmp(kind, "ResourceQuota")) {
        if(!json_is_object(get(o, "spec", "hard", NULL)))
            return snap_bad(s, rec, "spec.hard", "must be a mapping");
    } else if(!strcmp(kind, "PersistentVolumeClaim")) {
        if(want_str(s, rec, get(o, "spec", "volumeName", NULL), "spec.volumeName", 0))
            return -1;
    } else if(!strcmp(kind, "PersistentVolume")) {
        if(want_pv_affinity(s, rec, o))
            return -1;
    }
    return 0;
}


/* Frees what the snapshot's sorting holds (not the records). */
static void snapshot_free(snapshot *sn)
{
    json_decref(sn->by_kind);
    json_decref(sn->classes);
    json_decref(sn->gpunodes);
    json_decref(sn->vms);
    json_decref(sn->vmis);
    json_decref(sn->claims);
    json_decref(sn->pvcs);
    json_decref(sn->pvs);
    json_decref(sn->raw);
    json_decref(sn->view);
    memset(sn, 0, sizeof *sn);
}

/* The snapshot's records of `kind` (borrowed; NULL when none). */
static json_t *snap_list(const snapshot *sn, const char *kind)
{
    return json_object_get(sn->by_kind, kind);
}

/* A copy of object `o` with its kind and apiVersion set (objects of a
 * kubectl List carry them; a cache dump may not). */
static json_t *with_kind(const json_t *o, const char *kind, const char *api)
{
    json_t *c = json_deep_copy(o);
    json_object_set_new(c, "kind", json_string(kind));
    if(!json_is_string(json_object_get(c, "apiVersion")))
        json_object_set_new(c, "apiVersion", json_string(api));
    return c;
}

/* Sorts and checks every record of the snapshot (s->snap_recs) before
 * anything is applied: an unknown kind is counted and skipped (one note
 * per kind), a known object that is malformed or given twice fails the
 * run. */
static void snap_read(sim *s, snapshot *sn)
{
    sn->by_kind = json_object();
    sn->classes = json_array();
    sn->gpunodes = json_object();
    sn->vms = json_object();
    sn->vmis = json_object();
    sn->claims = json_object();
    sn->pvcs = json_object();
    sn->pvs = json_object();
    sn->raw = json_object();
    sn->view = json_array();
    json_t *skipped = json_object(), *seen = json_object();
    size_t i;
    json_t *rec;
    json_array_foreach(s->snap_recs, i, rec) {
        const json_t *o = json_object_get(rec, "object");
        const json_t *kv = json_object_get(o, "kind");
        if(!json_is_string(kv) || !*json_string_value(kv)) {
            snap_bad(s, rec, "kind", "required");
            break;
        }
        const char *kind = json_string_value(kv);
        size_t k;
        for(k = 0; k < sizeof snap_kinds / sizeof *snap_kinds; k++)
            if(!strcmp(kind, snap_kinds[k].kind))
                break;
        if(k == sizeof snap_kinds / sizeof *snap_kinds) {
            json_object_set_new(skipped, kind, json_integer(json_integer_value(json_object_get(skipped, kind)) + 1));
            continue;
        }
        if(snap_check(s, rec, kind, snap_kinds[k].namespaced))
            break;
        char id[400];
        snap_id(rec, id, sizeof id);
        if(json_object_get(seen, id)) {
            snap_bad(s, rec, NULL, "given twice (also in %s)", json_string_value(json_object_get(seen, id)));
            break;
        }
        json_object_set_new(seen, id, json_string(json_string_value(json_object_get(rec, "file"))));
        json_t *list = json_object_get(sn->by_kind, kind);
        if(!list)
            json_object_set_new(sn->by_kind, kind, list = json_array());
        json_array_append(list, rec);
        const char *name = json_string_value(get(o, "metadata", "name", NULL));
        const char *ns = json_string_value(get(o, "metadata", "namespace", NULL));
        char key[400];
        snprintf(key, sizeof key, "%s/%s", ns ? ns : "", name);
        if(!strcmp(kind, "GPUClass")) {
            json_array_append_new(sn->classes, with_kind(o, kind, "cozystack.io/v1alpha1"));
            json_array_append_new(sn->view, with_kind(o, kind, "cozystack.io/v1alpha1"));
        } else if(!strcmp(kind, "GPUNode"))
            json_object_set_new(sn->gpunodes, name, with_kind(o, kind, "cozystack.io/v1alpha1"));
        else if(!strcmp(kind, "VirtualMachine"))
            json_object_set(sn->vms, key, (json_t *)o);
        else if(!strcmp(kind, "VirtualMachineInstance"))
            json_object_set(sn->vmis, key, (json_t *)o);
        else if(!strcmp(kind, "GPUClaim"))
            json_object_set(sn->claims, key, (json_t *)o);
        else if(!strcmp(kind, "PersistentVolumeClaim"))
            json_object_set(sn->pvcs, key, (json_t *)o);
        else if(!strcmp(kind, "PersistentVolume"))
            json_object_set(sn->pvs, name, (json_t *)o);
        else if(!strcmp(kind, "Namespace") || !strcmp(kind, "ResourceQuota"))
            json_array_append_new(sn->view, with_kind(o, kind, "v1"));
    }
    const char *k;
    json_t *n;
    json_object_foreach(skipped, k, n) {
        snap_note(s, "snapshot: skipped %lld %s object%s (not a kind simulate reads)", (long long)json_integer_value(n),
                  k, json_integer_value(n) > 1 ? "s" : "");
    }
    if(json_array_size(snap_list(sn, "KubeVirt")) > 1)
        snap_note(s, "snapshot: %zu KubeVirt objects; the first is used, as the leader does",
                  json_array_size(snap_list(sn, "KubeVirt")));
    json_decref(skipped);
    json_decref(seen);
}

/* The snapshot's GPUClasses into the binder and s->classes (as a
 * scenario's `classes` entry: name, onCordon, deleting, tolerations,
 * resourceName), read as the leader's apply_class reads them. A scenario
 * class of the same name is then refused (run). */
static void snap_classes(sim *s, snapshot *sn)
{
    size_t i;
    json_t *rec;
    json_array_foreach(snap_list(sn, "GPUClass"), i, rec) {
        const json_t *o = json_object_get(rec, "object");
        json_t *c = json_object();
        json_object_set(c, "name", (json_t *)get(o, "metadata", "name", NULL));
        const json_t *oc = get(o, "spec", "onCordon", NULL), *rn = get(o, "spec", "resourceName", NULL);
        if(json_is_string(oc))
            json_object_set(c, "onCordon", (json_t *)oc);
        if(json_is_string(rn) && *json_string_value(rn))
            json_object_set(c, "resourceName", (json_t *)rn);
        json_object_set_new(c, "deleting", json_boolean(get(o, "metadata", "deletionTimestamp", NULL) != NULL));
        json_t *tols = json_array();
        size_t j;
        json_t *t;
        json_array_foreach(get(o, "spec", "tolerations", NULL), j, t) {
            json_t *x = json_object();
            static const char *const tk[] = {"key", "operator", "value", "effect"};
            for(int f = 0; f < 4; f++) {
                const json_t *v = json_object_get(t, tk[f]);
                if(json_is_string(v) && *json_string_value(v))
                    json_object_set(x, tk[f], (json_t *)v);
            }
            json_array_append_new(tols, x);
        }
        json_object_set_new(c, "tolerations", tols);
        char path[420], id[400];
        snap_id(rec, id, sizeof id);
        snprintf(path, sizeof path, "snapshot %s", id);
        def_class(s, c, path);
        json_array_append_new(s->keep, c);
        if(s->bad[0])
            return;
    }
}

/* The snapshot's GPUClaims restored from their status, as a new leader
 * restores them (placement_read_claim with restore: phase, node, attachedTo,
 * the Ready condition's reason; decision 0020 §1). */
static void snap_claims(sim *s, snapshot *sn)
{
    size_t i;
    json_t *rec;
    json_array_foreach(snap_list(sn, "GPUClaim"), i, rec) {
        binder_claim_status cs;
        const json_t *o = json_object_get(rec, "object");
        if(placement_read_claim(o, 1, &cs)) {
            snap_bad(s, rec, "spec", "no usable spec.class and spec.count");
            return;
        }
        if(cs.phase == BINDER_PENDING && json_string_value(get(o, "status", "phase", NULL)) &&
           strcmp(json_string_value(get(o, "status", "phase", NULL)), "Pending"))
            snap_note(s,
                      "snapshot: GPUClaim %s/%s is %s without status.node: it starts over Pending, as the leader does",
                      cs.ns, cs.name, json_string_value(get(o, "status", "phase", NULL)));
        cozy_err err = {{0}};
        if(binder_state_claim_put(s->st, &cs, &err)) {
            snap_bad(s, rec, NULL, "%s", err.msg);
            return;
        }
        if(get(o, "metadata", "deletionTimestamp", NULL)) {
            char key[400];
            snprintf(key, sizeof key, "%s/%s", cs.ns, cs.name);
            json_object_set_new(s->deleting, key, json_true());
            snap_note(s, "snapshot: GPUClaim %s is being deleted: it goes once nothing uses it", key);
        }
    }
}

/* A snapshot VM's runStrategy: spec.runStrategy (one not modelled here:
 * Manual), or spec.running true (Always) / false (Halted); neither:
 * Halted. */
static sim_rs snap_rs(const json_t *vm)
{
    const char *rs = json_string_value(get(vm, "spec", "runStrategy", NULL));
    for(int i = 0; rs && i < 5; i++)
        if(!strcmp(rs, rs_names[i]))
            return (sim_rs)i;
    if(rs)
        return RS_MANUAL; /* one this file does not model (snap_check noted it) */
    return json_is_true(get(vm, "spec", "running", NULL)) ? RS_ALWAYS : RS_HALTED;
}

/* A new sim VM ns/name (NULL, the run failed, when there are too many). */
static sim_vm *snap_new_vm(sim *s, const json_t *rec, const char *ns, const char *name, sim_rs rs)
{
    if(s->n_vms == sizeof s->vms / sizeof *s->vms) {
        snap_bad(s, rec, NULL, "more than %zu VMs", sizeof s->vms / sizeof *s->vms);
        return NULL;
    }
    sim_vm *v = &s->vms[s->n_vms++];
    memset(v, 0, sizeof *v);
    snprintf(v->ns, sizeof v->ns, "%s", ns);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->rs = rs;
    return v;
}

/* Template GPUs [{class, count}] of template claims [{name, class, count}]
 * (kept for the run: sim_vm.gpus borrows it). */
static json_t *snap_gpus(sim *s, const json_t *tmpl)
{
    json_t *g = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tmpl, i, t) json_array_append_new(
        g, json_pack("{s:O,s:O}", "class", json_object_get(t, "class"), "count", json_object_get(t, "count")));
    json_array_append_new(s->keep, g);
    return g;
}

/* placement_read_volume_nodes' lookup over the snapshot: PVC ns/pvc's bound
 * PV (spec.volumeName), as the leader reads its informers. */
typedef struct snap_pv_lookup {
    const snapshot *sn;
    const char *ns;
} snap_pv_lookup;

static json_t *snap_bound_pv(void *ud, const char *pvc)
{
    const snap_pv_lookup *q = ud;
    char key[600];
    snprintf(key, sizeof key, "%s/%s", q->ns, pvc);
    const char *pv = json_string_value(get(json_object_get(q->sn->pvcs, key), "spec", "volumeName", NULL));
    return pv ? json_incref(json_object_get(q->sn->pvs, pv)) : NULL;
}

/* The nodes the volumes of snapshot VM ns/name allow (`spec`: its VMI's,
 * or its template's), read as the leader reads them
 * (placement_read_volume_nodes over the snapshot's PersistentVolumeClaims and
 * PersistentVolumes): a list kept for the run, or NULL when nothing
 * limits it. Noted when it does. */
static json_t *snap_volume_nodes(sim *s, const snapshot *sn, const char *ns, const char *name, const json_t *spec)
{
    snap_pv_lookup q = {sn, ns};
    const char *nodes[BINDER_MAX_SET_NODES];
    json_t *keep = NULL;
    size_t n = placement_read_volume_nodes(spec, snap_bound_pv, &q, nodes, BINDER_MAX_SET_NODES, &keep);
    json_t *list = NULL;
    if(n) {
        list = json_array();
        char m[600] = "";
        for(size_t i = 0; i < n; i++) {
            json_array_append_new(list, json_string(nodes[i]));
            size_t l = strlen(m);
            snprintf(m + l, sizeof m - l, "%s%s", i ? ", " : "", nodes[i]);
        }
        json_array_append_new(s->keep, list);
        snap_note(s, "snapshot: VM %s/%s: its bound volumes allow only %s (DESIGN.md §6)", ns, name, m);
    }
    json_decref(keep);
    return list;
}

/* One VM (vm and/or vmi given, same ns/name) of the snapshot into the
 * run, as the leader's apply_set takes it: the VMI's claims (annotation,
 * or its template claims: placement_read_vmi_claims), phase and node when a VMI
 * exists, else the VM template's annotation (a stopped VM holds its claims)
 * or its template GPUs (claims made when it starts). `live` selects the
 * pass: VMIs that are not final first, so a running VMI takes claims a
 * stopped VM's template names too (as the leader gives them). A VM whose
 * claims cannot be taken is left out with a note. */
static void snap_vm(sim *s, snapshot *sn, const json_t *rec, const json_t *vm, const json_t *vmi)
{
    const json_t *o = vmi ? vmi : vm;
    const char *ns = json_string_value(get(o, "metadata", "namespace", NULL));
    const char *name = json_string_value(get(o, "metadata", "name", NULL));
    char buf[8192];
    const char *names[BINDER_MAX_SET_CLAIMS];
    json_t *tmpl = NULL;
    size_t n;
    binder_vmi_phase phase = BINDER_VMI_NONE;
    const char *node = NULL;
    const json_t *vspec = vmi ? get(vmi, "spec", NULL) : get(vm, "spec", "template", "spec", NULL);
    if(vmi) {
        n = placement_read_vmi_claims(vmi, sn->classes, buf, sizeof buf, names, BINDER_MAX_SET_CLAIMS, &tmpl);
        phase = placement_read_vmi_phase(vmi);
        if(phase != BINDER_VMI_PENDING)
            node = json_string_value(get(vmi, "status", "nodeName", NULL));
        if((phase == BINDER_VMI_SCHEDULED || phase == BINDER_VMI_RUNNING) && !node)
            phase = BINDER_VMI_PENDING;
    } else {
        const json_t *tm = get(vm, "spec", "template", "metadata", NULL);
        n = placement_read_claim_names(json_string_value(get(tm, "annotations", PLACEMENT_READ_CLAIMS_ANNOTATION, NULL)), buf,
                                 sizeof buf, names, BINDER_MAX_SET_CLAIMS);
        if(n == 0) {
            /* a stopped VM asking for GPUs by class: its template claims
             * are made when a VMI starts */
            json_t *pseudo = json_pack("{s:{s:s,s:O},s:O}", "metadata", "name", name, "labels",
                                       json_object_get(tm, "labels") ? json_object_get(tm, "labels") : json_null(),
                                       "spec", get(vm, "spec", "template", "spec", NULL)
                                                   ? get(vm, "spec", "template", "spec", NULL)
                                                   : json_null());
            char tb[8192];
            const char *tn[BINDER_MAX_SET_CLAIMS];
            if(pseudo && placement_read_vmi_claims(pseudo, sn->classes, tb, sizeof tb, tn, BINDER_MAX_SET_CLAIMS, &tmpl) &&
               tmpl) {
                sim_vm *v = snap_new_vm(s, rec, ns, name, snap_rs(vm));
                if(v) {
                    v->gpus = snap_gpus(s, tmpl);
                    v->vol_nodes = snap_volume_nodes(s, sn, ns, name, vspec);
                    char key[400];
                    vm_key(v, key, sizeof key);
                    json_object_set_new(s->vm_claims, key, json_array());
                    if(v->rs == RS_ALWAYS || v->rs == RS_RERUN)
                        set_vmi(s, v, BINDER_VMI_PENDING, NULL, "the VM controller starts it (runStrategy)");
                }
            }
            json_decref(pseudo);
            json_decref(tmpl);
            return;
        }
    }
    if(n == 0) {
        json_decref(tmpl);
        return; /* names no claim: a raw-name VM (its devices count against its node) or no GPU at all */
    }
    int final = phase == BINDER_VMI_SUCCEEDED || phase == BINDER_VMI_FAILED;
    int waits = 0; /* a template claim of the VMI's names is not its own */
    json_t *own = json_array(); /* the template claims that are the VMI's own */
    cozy_err err = {{0}};
    if(tmpl) {
        /* template claims, as the leader's apply_set takes them (decision
         * 0027): one of the snapshot that is this VMI's own (label, owner
         * uid, class, count: placement_read_template_claim_is) is its claim, and
         * deleted once the VMI is final; one that is not is never taken
         * over (the set waits) nor deleted; one the snapshot lacks is made
         * for a live VMI */
        const char *uid = json_string_value(get(vmi, "metadata", "uid", NULL));
        if(phase == BINDER_VMI_FAILED && node && *node) {
            sim_vm tmp = {0};
            snprintf(tmp.ns, sizeof tmp.ns, "%s", ns);
            snprintf(tmp.name, sizeof tmp.name, "%s", name);
            refuse_node(s, &tmp, node);
        }
        size_t i;
        json_t *t;
        json_array_foreach(tmpl, i, t) {
            const char *cn = json_string_value(json_object_get(t, "name"));
            char ck[600];
            snprintf(ck, sizeof ck, "%s/%s", ns, cn);
            binder_claim_status cs;
            int have = binder_state_claim_get(s->st, ns, cn, &cs) == BINDER_OK;
            int ours = have && placement_read_template_claim_is(json_object_get(sn->claims, ck), t, uid);
            if(have && !ours) {
                snap_note(s,
                          "snapshot: GPUClaim %s is not VMI %s/%s's own template claim (no template label, another "
                          "owner uid, class or count; decision 0027): %s",
                          ck, ns, name,
                          final ? "kept, though the VMI is final" : "never taken over, the VMI's set waits");
                waits |= !final;
            } else if(final && have) {
                placement_policy_on_delete(&s->bp, ns, cn);
                binder_state_claim_delete(s->st, ns, cn, NULL);
                snap_note(s, "snapshot: template claim %s/%s deleted (its VMI is final)", ns, cn);
            } else if(!final && !have) {
                if(binder_state_claim_add(s->st, ns, cn, json_string_value(json_object_get(t, "class")),
                                          (uint32_t)json_integer_value(json_object_get(t, "count")), 1, &err)) {
                    snap_bad(s, rec, NULL, "template claim %s: %s", cn, err.msg);
                    break;
                }
                snap_note(s, "snapshot: template claim %s/%s created for VMI %s (the snapshot does not hold it yet)",
                          ns, cn, name);
                json_array_append_new(own, json_string(cn));
            } else if(!final)
                json_array_append_new(own, json_string(cn));
        }
    }
    if(s->bad[0]) {
        json_decref(own);
        json_decref(tmpl);
        return;
    }
    if(!(tmpl && (final || waits))) {
        binder_rc rc = binder_state_set_put(s->st, ns, name, names, n, phase, node, &err);
        if(rc == BINDER_ERR_NO_CLAIM || rc == BINDER_ERR_BOUND) {
            snap_note(s, "snapshot: %s %s/%s left out: %s (the leader keeps its claims waiting)",
                      vmi ? "VMI" : "VM", ns, name, err.msg);
            json_decref(own);
            json_decref(tmpl);
            return;
        }
        if(rc != BINDER_OK) {
            snap_bad(s, rec, NULL, "%s", err.msg);
            json_decref(own);
            json_decref(tmpl);
            return;
        }
    }
    /* its own template claims (created above, or the snapshot's) */
    size_t i;
    json_t *x;
    json_array_foreach(own, i, x) {
        char ck[600];
        snprintf(ck, sizeof ck, "%s/%s", ns, json_string_value(x));
        json_object_set_new(s->owned, ck, json_string(name));
    }
    json_decref(own);
    sim_vm *v = snap_new_vm(s, rec, ns, name, vm ? snap_rs(vm) : RS_MANUAL);
    if(!v) {
        json_decref(tmpl);
        return;
    }
    v->phase = phase;
    v->waits = waits;
    snprintf(v->node, sizeof v->node, "%s", node ? node : "");
    v->vol_nodes = snap_volume_nodes(s, sn, ns, name, vspec);
    char key[400];
    vm_key(v, key, sizeof key);
    json_t *list = json_array();
    for(size_t k = 0; k < n && !(tmpl && (final || waits)); k++)
        json_array_append_new(list, json_string(names[k]));
    json_object_set_new(s->vm_claims, key, list);
    vm_limit(s, v);
    if(tmpl)
        v->gpus = snap_gpus(s, tmpl);
    json_decref(tmpl);
    if(final && (v->rs == RS_ALWAYS || v->rs == RS_RERUN))
        v->restart = 1; /* its VM controller acts once the binder has seen the final VMI (run) */
    else if(!vmi && (v->rs == RS_ALWAYS || v->rs == RS_RERUN))
        set_vmi(s, v, BINDER_VMI_PENDING, NULL, "the VM controller starts it (runStrategy)");
}

/* The VMs and VMIs of the snapshot (snap_vm): VMIs that are not final
 * first, then the rest, then VMs with no VMI; a VMI without a VM is a VM
 * under Manual (nothing restarts it). */
static void snap_sets(sim *s, snapshot *sn)
{
    for(int pass = 0; pass < 3 && !s->bad[0]; pass++) {
        json_t *all = pass < 2 ? sn->vmis : sn->vms;
        const char *key;
        json_t *o;
        json_object_foreach(all, key, o) {
            json_t *vm = json_object_get(sn->vms, key), *vmi = json_object_get(sn->vmis, key);
            if(pass == 2 && vmi)
                continue;
            binder_vmi_phase ph = vmi ? placement_read_vmi_phase(vmi) : BINDER_VMI_NONE;
            int final = ph == BINDER_VMI_SUCCEEDED || ph == BINDER_VMI_FAILED;
            if(pass < 2 && final != pass)
                continue;
            /* the record, for messages */
            json_t *rec = NULL;
            size_t i;
            json_t *r;
            json_array_foreach(snap_list(sn, vmi ? "VirtualMachineInstance" : "VirtualMachine"), i, r)
                if(json_object_get(r, "object") == (vmi ? vmi : vm)) rec = r;
            snap_vm(s, sn, rec, vm, vmi);
            if(s->bad[0])
                return;
        }
    }
}

/* Raw-name use, as the leader counts it (placement_read_raw_units): the units
 * each Scheduled or Running VMI uses on its node that its own claims do
 * not cover; those VMIs join the cluster view. */
static void snap_raw(sim *s, snapshot *sn)
{
    const char *key;
    json_t *vmi;
    json_object_foreach(sn->vmis, key, vmi) {
        json_t *used = placement_read_raw_units(s->st, vmi, sn->classes);
        if(!used)
            continue;
        const char *node = json_string_value(get(vmi, "status", "nodeName", NULL));
        json_t *per = json_object_get(sn->raw, node);
        if(!per)
            json_object_set_new(sn->raw, node, per = json_object());
        const char *rn;
        json_t *u;
        json_object_foreach(used, rn, u) json_object_set_new(
            per, rn, json_integer(json_integer_value(json_object_get(per, rn)) + json_integer_value(u)));
        snap_note(s, "snapshot: VMI %s uses GPUs on %s that no claim of it covers: they are taken from what %s offers",
                  key, node, node);
        json_array_append_new(sn->view, with_kind(vmi, "VirtualMachineInstance", "kubevirt.io/v1"));
        json_decref(used);
    }
}

/* Whether some claim of the state names node `name` in its status. */
typedef struct on_node {
    const char *name;
    int found;
} on_node;

/* binder_state_claims callback for on_node. */
static void claim_on(void *ud, const binder_claim_status *c)
{
    on_node *o = ud;
    o->found |= c->node && !strcmp(c->node, o->name);
}

/* The snapshot's Nodes into the run: what each offers per class and its
 * flags and gpu.cozystack.io/ taints through runtime.binder.node (its
 * GPUNode, the first KubeVirt, the snapshot's GPUClasses, the raw-name
 * use on it) exactly as the leader computes them (placement_read_node); its
 * capacity problems are shown as notes. A Node without a GPUNode that no
 * claim is on is left out (it can offer nothing). */
static void snap_nodes(sim *s, snapshot *sn)
{
    const json_t *kv = json_object_get(json_array_get(snap_list(sn, "KubeVirt"), 0), "object");
    size_t i, left_out = 0;
    json_t *rec;
    json_array_foreach(snap_list(sn, "Node"), i, rec) {
        const json_t *o = json_object_get(rec, "object");
        const char *name = json_string_value(get(o, "metadata", "name", NULL));
        const json_t *gn = json_object_get(sn->gpunodes, name);
        on_node on = {name, 0};
        binder_state_claims(s->st, claim_on, &on);
        if(!gn && !on.found) {
            left_out++;
            continue;
        }
        if(s->n_nodes == sizeof s->nodes / sizeof *s->nodes) {
            snap_bad(s, rec, NULL, "more than %zu GPU nodes", sizeof s->nodes / sizeof *s->nodes);
            return;
        }
        placement_read_node_view nv;
        cozy_err err = {{0}};
        if(placement_read_node(s->re, o, gn, kv, sn->classes, json_object_get(sn->raw, name), &nv, &err) != COZY_OK) {
            snap_bad(s, rec, NULL, "runtime.binder.node cannot read it: %s", err.msg);
            placement_read_node_view_free(&nv);
            return;
        }
        sim_node *n = &s->nodes[s->n_nodes];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", name);
        n->flags = nv.spec.flags;
        if(nv.spec.n_offers > SIM_MAX_OFFERS || nv.spec.n_taints > SIM_MAX_TAINTS) {
            snap_bad(s, rec, NULL, "more than %d classes or %d gpu.cozystack.io/ taints", SIM_MAX_OFFERS,
                     SIM_MAX_TAINTS);
            placement_read_node_view_free(&nv);
            return;
        }
        for(size_t k = 0; k < nv.spec.n_offers; k++) {
            snprintf(n->offer_names[k], sizeof n->offer_names[k], "%s", nv.offers[k].class_name);
            n->offers[k] = (binder_offer){n->offer_names[k], nv.offers[k].units};
        }
        n->n_offers = nv.spec.n_offers;
        memcpy(n->taints, nv.taints, nv.spec.n_taints * sizeof *nv.taints);
        n->n_taints = nv.spec.n_taints;
        n->labels = (json_t *)get(o, "metadata", "labels", NULL);
        size_t j;
        json_t *p;
        json_array_foreach(json_object_get(nv.view, "problems"), j, p) {
            const char *m = json_string_value(p);
            size_t nl = strlen(name);
            if(m && !strncmp(m, "node ", 5) && !strncmp(m + 5, name, nl) && (m[5 + nl] == ' ' || m[5 + nl] == ':'))
                snap_note(s, "snapshot: %s", m); /* it names the node already */
            else
                snap_note(s, "snapshot: node %s: %s", name, m ? m : "?");
        }
        json_array_append(s->keep, nv.view); /* the taints' strings */
        placement_read_node_view_free(&nv);
        s->n_nodes++;
        char path[300];
        snprintf(path, sizeof path, "snapshot Node %s", name);
        push_node(s, n, path);
        if(s->bad[0])
            return;
    }
    if(left_out)
        snap_note(s, "snapshot: %zu Node%s without a GPUNode left out (they offer no GPU)", left_out,
                  left_out > 1 ? "s" : "");
}

/* The snapshot as the scenario's starting state, after snap_read and
 * snap_classes (and the scenario's classes and the cluster view): claims
 * restored, sets, raw-name use, nodes, then the binder's index rebuilt
 * from the claims' status (binder_state_restore) and the budget usage
 * counted from it — what a new leader does with the same objects (the
 * leader's build()). */
static void snap_apply(sim *s, snapshot *sn)
{
    snap_claims(s, sn);
    if(!s->bad[0])
        snap_sets(s, sn);
    if(!s->bad[0])
        snap_raw(s, sn);
    if(!s->bad[0])
        snap_nodes(s, sn);
    cozy_err err = {{0}};
    if(!s->bad[0] && binder_state_restore(s->st, &err))
        bad(s, "snapshot: %s", err.msg);
    if(!s->bad[0] && placement_policy_feed(&s->bp, &err) != COZY_OK)
        bad(s, "snapshot: %s", err.msg);
    if(!s->bad[0]) {
        size_t n[11];
        for(size_t k = 0; k < 11; k++)
            n[k] = json_array_size(snap_list(sn, snap_kinds[k].kind));
        snap_note(s,
                  "snapshot: %zu GPUClasses, %zu Nodes (%zu GPU nodes), %zu GPUNodes, %zu GPUClaims, %zu VMs, "
                  "%zu VMIs, %zu Namespaces, %zu ResourceQuotas, %zu PersistentVolumeClaims, %zu PersistentVolumes",
                  n[0], n[1], s->n_nodes, n[2], n[4], n[5], n[6], n[7], n[8], n[9], n[10]);
    }
}

/* ---------------------------------------------------------------- steps */

/* Calls fn for each name of a NAME-or-list value. */
static void each_name(sim *s, json_t *v, const char *path, void (*fn)(sim *, const char *, const char *))
{
    if(json_is_string(v)) {
        fn(s, json_string_value(v), path);
        return;
    }
    if(!json_is_array(v) || !json_array_size(v))
        return bad(s, "%s: must be a name or a list of names", path);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        char p[300];
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        if(!json_is_string(x))
            return bad(s, "%s: must be a name", p);
        fn(s, json_string_value(x), p);
        if(s->bad[0])
            return;
    }
}

static const char *act; /* the action being applied (node flag actions share one function) */

static void node_flag(sim *s, const char *name, const char *path)
{
    sim_node *n = node_get(s, name);
    if(!n)
        return bad(s, "%s: unknown node \"%s\"", path, name);
    if(!strcmp(act, "deleteNode")) {
        cozy_err err = {{0}};
        if(binder_state_node_delete(s->st, name, &err))
            return bad(s, "%s: %s", path, err.msg);
        n->gone = 1;
        say(s, "  node %s deleted\n", name);
        return;
    }
    uint32_t f = n->flags;
    if(!strcmp(act, "cordon"))
        f &= ~BINDER_NODE_SCHEDULABLE;
    else if(!strcmp(act, "uncordon"))
        f |= BINDER_NODE_SCHEDULABLE;
    else if(!strcmp(act, "notReady"))
        f &= ~BINDER_NODE_READY;
    else if(!strcmp(act, "ready"))
        f |= BINDER_NODE_READY;
    else if(!strcmp(act, "layoutPending"))
        f |= BINDER_NODE_LAYOUT_PENDING;
    else if(!strcmp(act, "layoutApplied"))
        f &= ~BINDER_NODE_LAYOUT_PENDING;
    n->flags = f;
    cozy_err err = {{0}};
    if(binder_state_node_flags(s->st, name, f, &err))
        bad(s, "%s: %s", path, err.msg);
    say(s, "  node %s: %s\n", name, act);
}

static void class_deleting(sim *s, const char *name, const char *path)
{
    json_t *c = json_object_get(s->classes, name);
    if(!c)
        return bad(s, "%s: unknown class \"%s\"", path, name);
    json_t *copy = json_deep_copy(c);
    json_object_set_new(copy, "deleting", json_true());
    def_class(s, copy, path);
    json_decref(copy);
    say(s, "  class %s: being deleted\n", name);
}

static sim_vm *vm_ref(sim *s, const char *ref, const char *path)
{
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1];
    if(split_ref(s, ref, path, ns, name))
        return NULL;
    sim_vm *v = vm_get(s, ns, name);
    if(!v)
        bad(s, "%s: unknown VM \"%s\"", path, ref);
    return v;
}

static void vm_start(sim *s, const char *ref, const char *path)
{
    sim_vm *v = vm_ref(s, ref, path);
    if(!v)
        return;
    if(v->rs == RS_HALTED)
        v->rs = RS_ALWAYS; /* virtctl start: Halted -> Always (user guide, run strategies) */
    if(v->phase == BINDER_VMI_NONE || v->phase == BINDER_VMI_SUCCEEDED || v->phase == BINDER_VMI_FAILED)
        set_vmi(s, v, BINDER_VMI_PENDING, NULL, "virtctl start");
}

static void vm_stop(sim *s, const char *ref, const char *path)
{
    sim_vm *v = vm_ref(s, ref, path);
    if(!v)
        return;
    if(v->rs == RS_ALWAYS)
        v->rs = RS_HALTED; /* virtctl stop: Always -> Halted */
    if(v->phase != BINDER_VMI_NONE)
        set_vmi(s, v, BINDER_VMI_NONE, NULL, "virtctl stop: the VMI is deleted, no new one follows");
}

static void vmi_final(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"vm", "phase", NULL};
    if(check_keys(s, o, path, keys))
        return;
    const char *ref = str_field(s, o, "vm", path, NULL);
    const char *ph = str_field(s, o, "phase", path, NULL);
    if(s->bad[0])
        return;
    binder_vmi_phase p;
    if(binder_vmi_phase_parse(ph, &p) || (p != BINDER_VMI_SUCCEEDED && p != BINDER_VMI_FAILED))
        return bad(s, "%s.phase: must be Succeeded or Failed", path);
    sim_vm *v = vm_ref(s, ref, path);
    if(!v)
        return;
    if(v->phase == BINDER_VMI_NONE || v->phase == BINDER_VMI_SUCCEEDED || v->phase == BINDER_VMI_FAILED)
        return bad(s, "%s.vm: VM %s has no live VMI", path, ref);
    char node[BINDER_MAX_NAME + 1];
    snprintf(node, sizeof node, "%s", v->node);
    set_vmi(s, v, p, node[0] ? node : NULL, "the VMI ended");
    if(p == BINDER_VMI_FAILED && v->gpus && node[0])
        refuse_node(s, v, node);
    settle(s); /* the binder sees the final VMI before its VM acts */
    after_vmi_end(s, v, 0);
}

static void capacity(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"node", "class", "units", NULL};
    if(check_keys(s, o, path, keys))
        return;
    const char *node = str_field(s, o, "node", path, NULL);
    const char *cls = str_field(s, o, "class", path, NULL);
    if(s->bad[0])
        return;
    json_t *u = json_object_get(o, "units");
    if(!json_is_integer(u) || json_integer_value(u) < 0 || json_integer_value(u) > BINDER_MAX_UNITS)
        return bad(s, "%s.units: must be a whole number, 0 to %d", path, BINDER_MAX_UNITS);
    sim_node *n = node_get(s, node);
    if(!n)
        return bad(s, "%s.node: unknown node \"%s\"", path, node);
    if(!json_object_get(s->classes, cls))
        return bad(s, "%s.class: unknown class \"%s\"", path, cls);
    size_t i;
    for(i = 0; i < n->n_offers; i++)
        if(!strcmp(n->offer_names[i], cls))
            break;
    if(i == n->n_offers) {
        if(i == SIM_MAX_OFFERS)
            return bad(s, "%s: more than %d classes on node %s", path, SIM_MAX_OFFERS, node);
        snprintf(n->offer_names[i], sizeof n->offer_names[0], "%s", cls);
        n->offers[i].class_name = n->offer_names[i];
        n->n_offers++;
    }
    n->offers[i].units = (uint32_t)json_integer_value(u);
    say(s, "  node %s: %s capacity %u\n", node, cls, n->offers[i].units);
    push_node(s, n, path);
}

static void delete_claim(sim *s, const char *ref, const char *path)
{
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1];
    if(split_ref(s, ref, path, ns, name))
        return;
    cozy_err err = {{0}};
    placement_policy_on_delete(&s->bp, ns, name);
    if(binder_state_claim_delete(s->st, ns, name, &err))
        return bad(s, "%s: unknown claim \"%s\"", path, ref);
    vm_claims_forget(s, ns, name);
    say(s, "  claim %s/%s deleted\n", ns, name);
}


typedef struct cl_copy {
    binder_state *to;
    sim *s;
} cl_copy;

static void copy_claim(void *ud, const binder_claim_status *c)
{
    cl_copy *cc = ud;
    cozy_err err = {{0}};
    if(binder_state_claim_put(cc->to, c, &err))
        bad(cc->s, "leaderChange: %s", err.msg);
}

/* A new leader: a fresh binder from the classes, nodes and VMs the watches
 * give and the claims' status alone (decision 0020 §1); it counts the
 * claims' usage again from their status (engine_binder_usage_reset). */
static void leader_change(sim *s, const char *path)
{
    binder_state *old = s->st;
    s->st = binder_state_new();
    if(!s->st) {
        s->st = old;
        return bad(s, "%s: out of memory", path);
    }
    const char *k;
    json_t *c, *classes = json_copy(s->classes); /* def_class writes s->classes */
    json_object_foreach(classes, k, c) def_class(s, c, path);
    json_decref(classes);
    for(size_t i = 0; i < s->n_nodes; i++)
        if(!s->nodes[i].gone)
            push_node(s, &s->nodes[i], path);
    cl_copy cc = {s->st, s};
    binder_state_claims(old, copy_claim, &cc);
    for(size_t i = 0; i < s->n_vms; i++) {
        sim_vm *v = &s->vms[i];
        char key[400];
        snprintf(key, sizeof key, "%s/%s", v->ns, v->name);
        json_t *cl = json_object_get(s->vm_claims, key);
        const char *names[BINDER_MAX_SET_CLAIMS];
        size_t n = 0, j;
        json_t *x;
        json_array_foreach(cl, j, x) if(n < BINDER_MAX_SET_CLAIMS) names[n++] = json_string_value(x);
        cozy_err err = {{0}};
        if(n && binder_state_set_put(s->st, v->ns, v->name, names, n, v->phase, v->node[0] ? v->node : NULL, &err))
            bad(s, "%s: %s", path, err.msg);
        vm_limit(s, v); /* the new leader reads the volumes again */
    }
    /* the nodes template VMIs failed on live in the old leader's memory
     * (decision 0026 item 8): forgotten */
    json_object_clear(s->refused);
    cozy_err err = {{0}};
    if(binder_state_restore(s->st, &err))
        bad(s, "%s: %s", path, err.msg);
    binder_state_free(old);
    s->bp.st = s->st;
    if(placement_policy_feed(&s->bp, &err) != COZY_OK)
        bad(s, "%s: %s", path, err.msg);
    say(s, "  leader change: the binder is rebuilt from the claims' status (the nodes template VMIs failed on are "
           "forgotten)\n");
}

/* ------------------------------------------------------------- expects */

static void check_expect(sim *s, json_t *e, const char *path)
{
    static const char *const keys[] = {"claim", "vmi", "phase", "node", "reason", "absent", NULL};
    if(check_keys(s, e, path, keys))
        return;
    const char *cref = json_string_value(json_object_get(e, "claim"));
    const char *vref = json_string_value(json_object_get(e, "vmi"));
    if(!!cref == !!vref)
        return bad(s, "%s: name exactly one of claim or vmi", path);
    json_t *jn = json_object_get(e, "node");
    if(jn && !json_is_null(jn) && !json_is_string(jn))
        return bad(s, "%s.node: must be a node name, or null for none", path);
    const char *want_node = jn && json_is_string(jn) && *json_string_value(jn) ? json_string_value(jn) : NULL;
    const char *want_phase = json_object_get(e, "phase") ? str_field(s, e, "phase", path, NULL) : NULL;
    const char *want_reason = json_object_get(e, "reason") ? str_field(s, e, "reason", path, NULL) : NULL;
    if(s->bad[0])
        return;
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1], got[600], what[600];
    const char *got_phase, *got_node, *got_reason = NULL;
    if(cref) {
        binder_phase p;
        binder_reason r;
        if(want_phase && binder_phase_parse(want_phase, &p))
            return bad(s, "%s.phase: must be Pending, Bound, Attached or Lost", path);
        if(want_reason && binder_reason_parse(want_reason, &r))
            return bad(s, "%s.reason: \"%s\" is not a reason of decision 0020", path, want_reason);
        if(split_ref(s, cref, path, ns, name))
            return;
        binder_claim_status cs;
        int absent = bool_field(s, e, "absent", path, 0);
        if(absent && (want_phase || want_reason || json_object_get(e, "node")))
            return bad(s, "%s.absent: goes alone with claim", path);
        if(absent) {
            int gone = binder_state_claim_get(s->st, ns, name, &cs) != BINDER_OK;
            if(gone)
                s->expect_passed++;
            else
                s->expect_failed++;
            snprintf(what, sizeof what, "claim %s/%s", ns, name);
            snprintf(got, sizeof got, "%s", gone ? "absent" : binder_phase_name(cs.phase));
            say(s, "  expect %s absent: %s%s\n", what, gone ? "ok" : "FAILED, got ", gone ? "" : got);
            json_array_append_new(json_object_get(s->step_out, "expect"),
                                  json_pack("{s:s,s:O,s:b,s:s}", "what", what, "want", e, "ok", gone, "got", got));
            return;
        }
        if(binder_state_claim_get(s->st, ns, name, &cs))
            return bad(s, "%s.claim: unknown claim \"%s\"", path, cref);
        got_phase = binder_phase_name(cs.phase);
        got_node = cs.node;
        got_reason = binder_reason_name(cs.reason);
        snprintf(what, sizeof what, "claim %s/%s", ns, name);
    } else {
        binder_vmi_phase p;
        if(want_reason)
            return bad(s, "%s.reason: a VMI has no reason here", path);
        if(want_phase && binder_vmi_phase_parse(want_phase, &p))
            return bad(s, "%s.phase: must be None, Pending, Scheduled, Running, Succeeded or Failed", path);
        sim_vm *v = vm_ref(s, vref, path);
        if(!v)
            return;
        got_phase = binder_vmi_phase_name(v->phase);
        got_node = v->node[0] ? v->node : NULL;
        snprintf(what, sizeof what, "vmi %s/%s", v->ns, v->name);
    }
    int good = (!want_phase || !strcmp(want_phase, got_phase)) &&
               (!json_object_get(e, "node") || (!want_node && !got_node) ||
                (want_node && got_node && !strcmp(want_node, got_node))) &&
               (!want_reason || !strcmp(want_reason, got_reason));
    snprintf(got, sizeof got, "%s node=%s%s%s", got_phase, got_node ? got_node : "none", got_reason ? " reason=" : "",
             got_reason ? got_reason : "");
    if(good)
        s->expect_passed++;
    else
        s->expect_failed++;
    say(s, "  expect %s%s%s%s%s%s%s: %s%s%s\n", what, want_phase ? " phase=" : "", want_phase ? want_phase : "",
        json_object_get(e, "node") ? " node=" : "", json_object_get(e, "node") ? (want_node ? want_node : "none") : "",
        want_reason ? " reason=" : "", want_reason ? want_reason : "", good ? "ok" : "FAILED, got ", good ? "" : got,
        "");
    json_array_append_new(json_object_get(s->step_out, "expect"),
                          json_pack("{s:s,s:O,s:b,s:s}", "what", what, "want", e, "ok", good, "got", got));
}

/* ---------------------------------------------------------------- table */

typedef struct tab {
    sim *s;
    json_t *arr;
} tab;

static void claim_row(void *ud, const binder_claim_status *c)
{
    tab *t = ud;
    char ref[400];
    snprintf(ref, sizeof ref, "%s/%s", c->ns, c->name);
    say(t->s, "    %-28s %-12s %5u  %-8s %-14s %-20s %s\n", ref, c->class_name, c->count, binder_phase_name(c->phase),
        c->node ? c->node : "-", binder_reason_name(c->reason), c->message);
    json_array_append_new(t->arr, json_pack("{s:s,s:s,s:i,s:s,s:o,s:o,s:s,s:s}", "claim", ref, "class", c->class_name,
                                            "count", (int)c->count, "phase", binder_phase_name(c->phase), "node",
                                            c->node ? json_string(c->node) : json_null(), "attachedTo",
                                            c->attached_to ? json_string(c->attached_to) : json_null(), "reason",
                                            binder_reason_name(c->reason), "message", c->message));
}

static void step_table(sim *s)
{
    say(s, "    %-28s %-12s %5s  %-8s %-14s %-20s %s\n", "CLAIM", "CLASS", "COUNT", "PHASE", "NODE", "REASON", "MESSAGE");
    tab t = {s, json_object_get(s->step_out, "claims")};
    binder_state_claims(s->st, claim_row, &t);
    for(size_t i = 0; i < s->n_vms; i++) {
        sim_vm *v = &s->vms[i];
        char ref[400];
        snprintf(ref, sizeof ref, "%s/%s", v->ns, v->name);
        json_array_append_new(json_object_get(s->step_out, "vms"),
                              json_pack("{s:s,s:s,s:s,s:o}", "vm", ref, "runStrategy", rs_names[v->rs], "vmi",
                                        binder_vmi_phase_name(v->phase), "node",
                                        v->node[0] ? json_string(v->node) : json_null()));
    }
    json_t *nodes = json_object_get(s->step_out, "nodes");
    for(size_t i = 0; i < s->n_nodes; i++) {
        sim_node *n = &s->nodes[i];
        if(n->gone)
            continue;
        json_t *offers = json_object();
        for(size_t k = 0; k < n->n_offers; k++)
            json_object_set_new(offers, n->offer_names[k], json_integer(n->offers[k].units));
        json_array_append_new(nodes, json_pack("{s:s,s:o,s:b,s:b,s:b}", "node", n->name, "offers", offers, "ready",
                                               !!(n->flags & BINDER_NODE_READY), "schedulable",
                                               !!(n->flags & BINDER_NODE_SCHEDULABLE), "layoutPending",
                                               !!(n->flags & BINDER_NODE_LAYOUT_PENDING)));
    }
    cozy_err err = {{0}};
    if(binder_state_verify(s->st, &err))
        bad(s, "internal: the binder broke a rule: %s", err.msg);
}

/* ---------------------------------------------------------------- run */

static void begin_step(sim *s, size_t i, const char *name)
{
    s->step_out = json_pack("{s:I,s:s,s:[],s:[],s:[],s:[],s:[]}", "step", (json_int_t)i, "name", name, "events",
                            "claims", "vms", "nodes", "expect");
    json_array_append_new(s->out, s->step_out);
    say(s, "== step %zu: %s\n", i, name);
}

static void run_step(sim *s, json_t *step, size_t idx)
{
    char path[100], p[160];
    snprintf(path, sizeof path, "steps[%zu]", idx);
    static const char *const keys[] = {"name",         "addNodes",      "addClaims",     "addVMs",   "cordon",
                                       "uncordon",     "notReady",      "ready",         "deleteNode", "capacity",
                                       "layoutPending", "layoutApplied", "classDeleting", "start",    "stop",
                                       "vmiFinal",     "deleteClaim",   "leaderChange",  "expect",   NULL};
    if(check_keys(s, step, path, keys))
        return;
    char dflt[64];
    snprintf(dflt, sizeof dflt, "step %zu", idx + 1);
    const char *name = str_field(s, step, "name", path, dflt);
    if(s->bad[0])
        return;
    begin_step(s, idx + 1, name);
    static const char *const flags[] = {"cordon", "uncordon", "notReady", "ready", "deleteNode", "layoutPending",
                                        "layoutApplied"};
#define SUB(k) (snprintf(p, sizeof p, "%s.%s", path, k), p)
    def_list(s, json_object_get(step, "addNodes"), SUB("addNodes"), def_node);
    def_list(s, json_object_get(step, "addClaims"), SUB("addClaims"), def_claim);
    def_list(s, json_object_get(step, "addVMs"), SUB("addVMs"), def_vm);
    for(size_t i = 0; i < sizeof flags / sizeof *flags && !s->bad[0]; i++) {
        json_t *v = json_object_get(step, flags[i]);
        if(v) {
            act = flags[i];
            each_name(s, v, SUB(flags[i]), node_flag);
        }
    }
    json_t *cap = json_object_get(step, "capacity");
    if(cap && !s->bad[0]) {
        if(json_is_array(cap))
            def_list(s, cap, SUB("capacity"), capacity);
        else
            capacity(s, cap, SUB("capacity"));
    }
    if(json_object_get(step, "classDeleting") && !s->bad[0])
        each_name(s, json_object_get(step, "classDeleting"), SUB("classDeleting"), class_deleting);
    if(json_object_get(step, "start") && !s->bad[0])
        each_name(s, json_object_get(step, "start"), SUB("start"), vm_start);
    if(json_object_get(step, "stop") && !s->bad[0])
        each_name(s, json_object_get(step, "stop"), SUB("stop"), vm_stop);
    json_t *fin = json_object_get(step, "vmiFinal");
    if(fin && !s->bad[0]) {
        if(json_is_array(fin))
            def_list(s, fin, SUB("vmiFinal"), vmi_final);
        else
            vmi_final(s, fin, SUB("vmiFinal"));
    }
    if(json_object_get(step, "deleteClaim") && !s->bad[0])
        each_name(s, json_object_get(step, "deleteClaim"), SUB("deleteClaim"), delete_claim);
    json_t *lc = json_object_get(step, "leaderChange");
    if(lc && !s->bad[0]) {
        if(!json_is_boolean(lc))
            bad(s, "%s: must be true or false", SUB("leaderChange"));
        else if(json_is_true(lc))
            leader_change(s, SUB("leaderChange"));
    }
    if(s->bad[0])
        return;
    settle(s);
    step_table(s);
    def_list(s, json_object_get(step, "expect"), SUB("expect"), check_expect);
#undef SUB
}

static int run(sim *s)
{
    static const char *const keys[] = {"classes",        "nodes",    "claims",   "vms",   "namespaces",
                                       "resourceQuotas", "override", "snapshot", "steps", NULL};
    snapshot sn = {0};
    s->st = binder_state_new();
    s->classes = json_object();
    s->keep = json_array();
    s->deleting = json_object();
    s->vm_claims = json_object();
    s->owned = json_object();
    s->refused = json_object();
    placement_policy_init(&s->bp, s->e, s->st);
    s->bp.labels = node_labels;
    s->bp.labels_ud = s;
    s->out = json_array();
    if(!s->st)
        bad(s, "out of memory");
    else if(!check_keys(s, s->doc, "scenario", keys)) {
        begin_step(s, 0, "initial");
        cozy_err err = {{0}};
        if(engine_binder_usage_reset(s->e, &err) != COZY_OK)
            bad(s, "%s", err.msg);
        if(s->snap_recs) {
            s->sn = &sn;
            snap_read(s, &sn);
            if(!s->bad[0])
                snap_classes(s, &sn);
        }
        def_list(s, json_object_get(s->doc, "classes"), "classes", def_new_class);
        if(s->sn && !s->bad[0])
            snap_apply(s, &sn);
        set_cluster(s);
        def_list(s, json_object_get(s->doc, "nodes"), "nodes", def_node);
        def_list(s, json_object_get(s->doc, "claims"), "claims", def_claim);
        def_list(s, json_object_get(s->doc, "vms"), "vms", def_vm);
        int restart = 0;
        for(size_t i = 0; i < s->n_vms; i++)
            restart |= s->vms[i].restart;
        if(restart && !s->bad[0]) {
            /* a snapshot's VMI that is final under Always or
             * RerunOnFailure: the binder sees it first, then its VM
             * controller starts a new one */
            settle(s);
            for(size_t i = 0; i < s->n_vms && !s->bad[0]; i++)
                if(s->vms[i].restart) {
                    s->vms[i].restart = 0;
                    after_vmi_end(s, &s->vms[i], 0);
                }
        }
        if(!s->bad[0]) {
            settle(s);
            step_table(s);
        }
        json_t *steps = json_object_get(s->doc, "steps");
        if(steps && !json_is_array(steps))
            bad(s, "steps: must be a list");
        size_t i;
        json_t *st;
        json_array_foreach(steps, i, st) {
            if(s->bad[0])
                break;
            run_step(s, st, i);
        }
    }
    binder_state_free(s->st);
    json_decref(s->classes);
    json_decref(s->vm_claims);
    json_decref(s->owned);
    json_decref(s->refused);
    s->owned = s->refused = NULL;
    placement_policy_free(&s->bp);
    snapshot_free(&sn);
    s->sn = NULL;
    json_decref(s->keep);
    s->keep = NULL;
    json_decref(s->deleting);
    s->deleting = NULL;
    return s->bad[0] ? -1 : 0;
}

static void usage(FILE *f)
{
    fputs("usage: cozygpu simulate SCENARIO.yaml [--output table|json] [--config FILE]\n"
          "                        [--policies DIR] [--override DIR] [--library DIR]\n"
          "                        [--snapshot PATH]\n"
          "\n"
          "Replays a scenario (classes, nodes, claims, VMs, then steps: cordon, uncordon,\n"
          "notReady, ready, deleteNode, capacity, layoutPending, layoutApplied,\n"
          "classDeleting, start, stop, vmiFinal, deleteClaim, leaderChange, each with\n"
          "expect lines) through the binder's rules (DESIGN.md §6), with no cluster.\n"
          "The format is described in core/cli/simulate.c; examples/scenarios/ has some.\n"
          "\n"
          "options:\n"
          "  --output table|json  table (default): each step's transitions and the\n"
          "                       claims; json: one document with every step\n"
          "  --config FILE        settings (tenantRoot, policyBudget; default: built-in)\n"
          "  --policies DIR       the default bundle (default: the installed policies/)\n"
          "  --override DIR       hoster policies: same file name replaces, new name adds;\n"
          "                       its binder.lua chooses among candidates (overrides the\n"
          "                       scenario's `override`)\n"
          "  --library DIR        the policy library (default: the installed lua/)\n"
          "  --snapshot PATH      a live cluster's objects as the starting state: a file or\n"
          "                       directory of YAML/JSON (kubectl get ... -o yaml: nodes,\n"
          "                       gpunodes, gpuclasses, gpuclaims, vms, vmis, kubevirts,\n"
          "                       namespaces, resourcequotas, pvc, pv); overrides the\n"
          "                       scenario's `snapshot`\n"
          "\n"
          "exit status: 0 every expect line held, 1 one failed, 2 bad usage or input\n",
          f);
}

int sim_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, 0, 'o'},  {"config", required_argument, 0, 'c'},
        {"policies", required_argument, 0, 'p'}, {"override", required_argument, 0, 'O'},
        {"library", required_argument, 0, 'L'}, {"snapshot", required_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    const char *output = "table", *config_path = NULL, *snapshot_path = NULL;
    engine_options eo = {0};
    int c;
    optind = 1;
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch(c) {
        case 'o': output = optarg; break;
        case 'c': config_path = optarg; break;
        case 'p': eo.bundle_dir = optarg; break;
        case 'O': eo.override_dir = optarg; break;
        case 'L': eo.library_dir = optarg; break;
        case 'S': snapshot_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if(strcmp(output, "table") && strcmp(output, "json")) {
        fprintf(stderr, "cozygpu simulate: --output must be table or json, not \"%s\"\n", output);
        return 2;
    }
    if(argc - optind != 1) {
        fprintf(stderr, "cozygpu simulate: give exactly one scenario file\n");
        usage(stderr);
        return 2;
    }
    const char *file = argv[optind];
    json_t *recs = json_array();
    cozy_err err = {{0}};
    if(manifest_load_file(file, recs, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu simulate: %s\n", err.msg);
        json_decref(recs);
        return 2;
    }
    if(json_array_size(recs) != 1) {
        fprintf(stderr, "cozygpu simulate: %s: must hold exactly one document (the scenario), not %zu\n", file,
                json_array_size(recs));
        json_decref(recs);
        return 2;
    }
    json_t *doc = json_object_get(json_array_get(recs, 0), "object");
    /* the scenario's `override`: a directory relative to the scenario file */
    char override[4096];
    const json_t *ov = json_object_get(doc, "override");
    if(ov && !eo.override_dir) {
        if(!json_is_string(ov) || !*json_string_value(ov)) {
            fprintf(stderr, "cozygpu simulate: %s: override: must be a directory (relative to the scenario)\n", file);
            json_decref(recs);
            return 2;
        }
        const char *slash = strrchr(file, '/');
        const char *o = json_string_value(ov);
        if(o[0] == '/' || !slash)
            snprintf(override, sizeof override, "%s", o);
        else
            snprintf(override, sizeof override, "%.*s/%s", (int)(slash - file), file, o);
        eo.override_dir = override;
    }
    /* the scenario's `snapshot`: a file or directory relative to the
     * scenario file (--snapshot wins) */
    char snap_buf[4096];
    const json_t *sp = json_object_get(doc, "snapshot");
    if(sp && !snapshot_path) {
        if(!json_is_string(sp) || !*json_string_value(sp)) {
            fprintf(stderr, "cozygpu simulate: %s: snapshot: must be a file or directory (relative to the scenario)\n",
                    file);
            json_decref(recs);
            return 2;
        }
        const char *slash = strrchr(file, '/');
        const char *o = json_string_value(sp);
        if(o[0] == '/' || !slash)
            snprintf(snap_buf, sizeof snap_buf, "%s", o);
        else
            snprintf(snap_buf, sizeof snap_buf, "%.*s/%s", (int)(slash - file), file, o);
        snapshot_path = snap_buf;
    }
    json_t *snap_recs = NULL;
    if(snapshot_path) {
        snap_recs = json_array();
        if(manifest_load_path(snapshot_path, snap_recs, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu simulate: snapshot: %s\n", err.msg);
            json_decref(snap_recs);
            json_decref(recs);
            return 2;
        }
    }
    json_t *settings = NULL;
    if(config_path ? config_load_file(config_path, &settings, &err) != COZY_OK : !(settings = config_defaults())) {
        fprintf(stderr, "cozygpu simulate: %s\n", config_path ? err.msg : "out of memory");
        json_decref(snap_recs);
        json_decref(recs);
        return 2;
    }
    const json_t *pb = json_object_get(settings, "policyBudget");
    eo.instructions = json_integer_value(json_object_get(pb, "instructions"));
    eo.memory_bytes = json_integer_value(json_object_get(pb, "memoryBytes"));
    engine *e = NULL, *re = NULL;
    engine_options reo = eo; /* runtime.binder: the library alone, as the leader opens it */
    reo.bundle_dir = NULL;
    reo.override_dir = NULL;
    if(engine_open(&e, &eo, &err) != COZY_OK ||
       (snap_recs && engine_open_runtime(&re, &reo, "binder", &err) != COZY_OK)) {
        fprintf(stderr, "cozygpu simulate: %s\n", err.msg);
        engine_close(e);
        json_decref(snap_recs);
        json_decref(settings);
        json_decref(recs);
        return 2;
    }
    /* first silently, so that bad input is refused before anything is shown */
    sim *s = calloc(1, sizeof *s);
    if(!s) {
        engine_close(e);
        engine_close(re);
        json_decref(snap_recs);
        json_decref(settings);
        json_decref(recs);
        return 2;
    }
    s->file = file;
    s->doc = doc;
    s->e = e;
    s->re = re;
    s->snap_recs = snap_recs;
    s->settings = settings;
    s->quiet = 1;
    int rc = run(s);
    json_decref(s->out);
    if(rc) {
        fprintf(stderr, "cozygpu simulate: %s\n", s->bad);
        free(s);
        engine_close(e);
        engine_close(re);
        json_decref(snap_recs);
        json_decref(settings);
        json_decref(recs);
        return 2;
    }
    memset(s, 0, sizeof *s);
    s->file = file;
    s->doc = doc;
    s->e = e;
    s->re = re;
    s->snap_recs = snap_recs;
    s->settings = settings;
    s->json = !strcmp(output, "json");
    rc = run(s);
    if(s->json && !rc) {
        json_t *fails = json_object();
        for(int o = ENGINE_POLICY_ERROR; o < ENGINE_OUTCOME_LAST; o++)
            json_object_set_new(fails, engine_outcome_name((engine_outcome)o), json_integer(s->policy_failures[o]));
        json_t *all = json_pack("{s:s,s:O,s:i,s:i,s:{s:i,s:o}}", "scenario", file, "steps", s->out, "expectPassed",
                                s->expect_passed, "expectFailed", s->expect_failed, "binderPolicy", "calls",
                                s->choose_calls, "failures", fails);
        json_dumpf(all, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(all);
    } else if(!rc) {
        int fails = 0;
        for(int o = ENGINE_POLICY_ERROR; o < ENGINE_OUTCOME_LAST; o++)
            fails += s->policy_failures[o];
        if(fails)
            printf("the binder policy failed %d of %d times; those sets were placed in the packing order\n", fails,
                   s->choose_calls);
        printf("%d expect lines held, %d failed\n", s->expect_passed, s->expect_failed);
    }
    int status = rc ? 2 : s->expect_failed ? 1 : 0;
    if(rc)
        fprintf(stderr, "cozygpu simulate: %s\n", s->bad);
    json_decref(s->out);
    free(s);
    engine_close(e);
    engine_close(re);
    json_decref(snap_recs);
    json_decref(settings);
    json_decref(recs);
    if(fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "cozygpu simulate: writing the output failed\n");
        return 2;
    }
    return status;
}
