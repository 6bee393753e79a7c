/* simulate.c — `cozygpu simulate`: a scenario replayed through the binder's
 * state machine (binder/binder.h), no cluster. The binder's hooks are the
 * leader's (decision 0024): the chooser is policies/binder.lua of the
 * bundle (--policies, --override or the scenario's `override` replace it,
 * as the policies ConfigMap does), the budget check at bind is
 * engine_binder_budget over the scenario's namespaces and resourceQuotas.
 *
 * Scenario (one YAML or JSON document; every key below, nothing else):
 *
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
 *                          claims' status alone, decision 0020 §1)
 * Expect lines: {claim: NS/NAME, phase, node, reason}, {claim: NS/NAME,
 * absent: true} (deleted, or not created yet) or {vmi: NS/NAME, phase,
 * node}; each key but claim/vmi is optional; node null or "" means none.
 *
 * Template claims (DESIGN.md §3, issue 12 "Template claims"): a VM with
 * `gpus` gets, for each VMI, one claim per entry named VM-CLASS (template,
 * same namespace), created with the VMI and deleted once the VMI is final
 * or gone, so a pool holds GPUs only for running workers. The nodes a
 * template set was refused on are not remembered (DESIGN.md §6's last
 * rule is not built).
 *
 * Each step is settled before its expect lines are checked: the binder
 * reconciles, the VMIs it asks to delete are deleted, the VM's runStrategy
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
 * by one VM or by two VMs — exits 2 with "FILE: PATH: message" (PATH like
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
#include "controller/bindpolicy.h"
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
} sim_vm;

typedef struct sim {
    const char *file;
    int quiet; /* the silent validation run */
    int json;
    json_t *doc;
    binder_state *st;
    sim_node nodes[256];
    size_t n_nodes;
    sim_vm vms[256];
    size_t n_vms;
    json_t *classes; /* name -> class object as given (for leaderChange) */
    json_t *vm_claims; /* "ns/name" -> [claim names] */
    engine *e;         /* policies/binder.lua and the budget check at bind (borrowed) */
    const json_t *settings; /* --config or the defaults (borrowed) */
    bindpolicy bp;     /* the chooser and budget hooks, and the usage table (controller/bindpolicy.h) */
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

/* A failure of the usage table (bindpolicy's last_error) stops the run. */
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
    bindpolicy_on_event(&s->bp, e);
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

/* Template claims (DESIGN.md §3): created by the controller for a VMI of a
 * VM whose template asks for GPUs without naming claims, one claim per
 * class entry, named VM-CLASS; deleted once the VMI is final or gone. */
static void tmpl_create(sim *s, sim_vm *v)
{
    const char *names[BINDER_MAX_SET_CLASSES];
    char buf[BINDER_MAX_SET_CLASSES][2 * BINDER_MAX_NAME + 2]; /* def_vm checked the length */
    size_t n = 0, i;
    json_t *g, *list = json_array();
    json_array_foreach(v->gpus, i, g) {
        const char *cls = json_string_value(json_object_get(g, "class"));
        snprintf(buf[n], sizeof buf[n], "%s-%s", v->name, cls);
        cozy_err err = {{0}};
        if(binder_state_claim_add(s->st, v->ns, buf[n], cls, (uint32_t)json_integer_value(json_object_get(g, "count")),
                                  1, &err)) {
            bad(s, "VM %s/%s: template claim: %s", v->ns, v->name, err.msg);
            break;
        }
        say(s, "  template claim %s/%s created for VMI %s\n", v->ns, buf[n], v->name);
        names[n] = buf[n];
        json_array_append_new(list, json_string(buf[n]));
        n++;
    }
    char key[400];
    vm_key(v, key, sizeof key);
    json_object_set_new(s->vm_claims, key, list);
    cozy_err err = {{0}};
    if(!s->bad[0] && binder_state_set_put(s->st, v->ns, v->name, names, n, v->phase, NULL, &err))
        bad(s, "VM %s/%s: %s", v->ns, v->name, err.msg);
}

static void tmpl_delete(sim *s, sim_vm *v)
{
    char key[400];
    vm_key(v, key, sizeof key);
    json_t *list = json_object_get(s->vm_claims, key);
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c) {
        bindpolicy_on_delete(&s->bp, v->ns, json_string_value(c));
        binder_state_claim_delete(s->st, v->ns, json_string_value(c), NULL);
        say(s, "  template claim %s/%s deleted (its VMI is %s)\n", v->ns, json_string_value(c),
            v->phase == BINDER_VMI_NONE ? "gone" : "final");
    }
    binder_state_set_delete(s->st, v->ns, v->name, NULL);
    json_object_set_new(s->vm_claims, key, json_array());
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
    char key[400];
    vm_key(v, key, sizeof key);
    int has = json_array_size(json_object_get(s->vm_claims, key)) > 0;
    if(ph == BINDER_VMI_PENDING && !has)
        tmpl_create(s, v);
    else if(has)
        push_vmi(s, v);
    if(has && ph != BINDER_VMI_PENDING && ph != BINDER_VMI_SCHEDULED && ph != BINDER_VMI_RUNNING)
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
    int ok = bindpolicy_budget(&s->bp, c, why, why_size, &v);
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

static int on_choose(void *ud, const binder_set_view *sv, const binder_candidate *cands, size_t n)
{
    sim *s = ud;
    s->choose_calls++;
    engine_binder_choice ch;
    bindpolicy_choose(&s->bp, sv, cands, n, &ch);
    if(ch.outcome != ENGINE_ALLOWED) {
        s->policy_failures[ch.outcome]++;
        say(s, "  binder policy failed (%s): %s; placed in the packing order instead\n",
            engine_outcome_name(ch.outcome), ch.message);
        if(s->step_out)
            out_event(s, json_pack("{s:s,s:s,s:s,s:s}", "kind", "binderPolicy", "outcome",
                                   engine_outcome_name(ch.outcome), "message", ch.message, "fallback",
                                   "packing order"));
    }
    return ch.index;
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
        size_t n = binder_reconcile(s->st, &h);
        bindpolicy_settle(&s->bp);
        usage_check(s);
        int changed = 0;
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

static void def_vm(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"name", "namespace", "claims", "gpus", "runStrategy", NULL};
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
    cozy_err err = {{0}};
    if(binder_state_set_put(s->st, ns, name, names, n, BINDER_VMI_NONE, NULL, &err))
        return bad(s, "%s.claims: %s", path, err.msg);
    s->n_vms++;
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
 * when given), the scenario's namespaces and resourceQuotas. */
static void set_cluster(sim *s)
{
    if(s->bad[0])
        return;
    json_t *objects = json_array();
    const char *k;
    json_t *c;
    json_object_foreach(s->classes, k, c) {
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
    bindpolicy_on_delete(&s->bp, ns, name);
    if(binder_state_claim_delete(s->st, ns, name, &err))
        return bad(s, "%s: unknown claim \"%s\"", path, ref);
    /* the VM's list loses it too */
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
    }
    cozy_err err = {{0}};
    if(binder_state_restore(s->st, &err))
        bad(s, "%s: %s", path, err.msg);
    binder_state_free(old);
    s->bp.st = s->st;
    if(bindpolicy_feed(&s->bp, &err) != COZY_OK)
        bad(s, "%s: %s", path, err.msg);
    say(s, "  leader change: the binder is rebuilt from the claims' status\n");
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
    cozy_err err = {{0}};
    if(binder_state_verify(s->st, &err))
        bad(s, "internal: the binder broke a rule: %s", err.msg);
}

/* ---------------------------------------------------------------- run */

static void begin_step(sim *s, size_t i, const char *name)
{
    s->step_out = json_pack("{s:I,s:s,s:[],s:[],s:[],s:[]}", "step", (json_int_t)i, "name", name, "events",
                            "claims", "vms", "expect");
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
    static const char *const keys[] = {"classes", "nodes",          "claims",   "vms", "namespaces",
                                       "resourceQuotas", "override", "steps", NULL};
    s->st = binder_state_new();
    s->classes = json_object();
    s->vm_claims = json_object();
    bindpolicy_init(&s->bp, s->e, s->st);
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
        def_list(s, json_object_get(s->doc, "classes"), "classes", def_class);
        set_cluster(s);
        def_list(s, json_object_get(s->doc, "nodes"), "nodes", def_node);
        def_list(s, json_object_get(s->doc, "claims"), "claims", def_claim);
        def_list(s, json_object_get(s->doc, "vms"), "vms", def_vm);
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
    bindpolicy_free(&s->bp);
    return s->bad[0] ? -1 : 0;
}

static void usage(FILE *f)
{
    fputs("usage: cozygpu simulate SCENARIO.yaml [--output table|json] [--config FILE]\n"
          "                        [--policies DIR] [--override DIR] [--library DIR]\n"
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
          "\n"
          "exit status: 0 every expect line held, 1 one failed, 2 bad usage or input\n",
          f);
}

int sim_main(int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, 0, 'o'},   {"config", required_argument, 0, 'c'},
                                         {"policies", required_argument, 0, 'p'}, {"override", required_argument, 0, 'O'},
                                         {"library", required_argument, 0, 'L'},  {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *output = "table", *config_path = NULL;
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
    json_t *settings = NULL;
    if(config_path ? config_load_file(config_path, &settings, &err) != COZY_OK : !(settings = config_defaults())) {
        fprintf(stderr, "cozygpu simulate: %s\n", config_path ? err.msg : "out of memory");
        json_decref(recs);
        return 2;
    }
    const json_t *pb = json_object_get(settings, "policyBudget");
    eo.instructions = json_integer_value(json_object_get(pb, "instructions"));
    eo.memory_bytes = json_integer_value(json_object_get(pb, "memoryBytes"));
    engine *e = NULL;
    if(engine_open(&e, &eo, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu simulate: %s\n", err.msg);
        json_decref(settings);
        json_decref(recs);
        return 2;
    }
    /* first silently, so that bad input is refused before anything is shown */
    sim *s = calloc(1, sizeof *s);
    if(!s) {
        engine_close(e);
        json_decref(settings);
        json_decref(recs);
        return 2;
    }
    s->file = file;
    s->doc = doc;
    s->e = e;
    s->settings = settings;
    s->quiet = 1;
    int rc = run(s);
    json_decref(s->out);
    if(rc) {
        fprintf(stderr, "cozygpu simulate: %s\n", s->bad);
        free(s);
        engine_close(e);
        json_decref(settings);
        json_decref(recs);
        return 2;
    }
    memset(s, 0, sizeof *s);
    s->file = file;
    s->doc = doc;
    s->e = e;
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
    json_decref(settings);
    json_decref(recs);
    if(fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "cozygpu simulate: writing the output failed\n");
        return 2;
    }
    return status;
}
