/* simulate.c — `cozygpu simulate`: a scenario replayed through the
 * leader's own placement model (placement/placement.h, decision 0041),
 * with no cluster. The scenario's world becomes the objects a cluster
 * would hold (sim_scenario.c, sim_snapshot.c) in an in-memory API server
 * (sim_store.c); the model reads them and writes its decisions there as
 * the leader does through kube-apiserver; what KubeVirt and the scheduler
' * own is sim_kubevirt.c; what a step shows, sim_report.c. The binder's hooks are the leader's (decision
 * 0024): the chooser is policies/binder.lua of the bundle (--policies,
 * --override or the scenario's `override` replace it, as the policies
 * ConfigMap does), the budgets at bind the bundle's.
 *
 * The scenario format is `cozygpu simulate --help`'s (usage() below) and
 * docs/simulate.md's. Each step is settled before its expect lines are
 * checked: rounds of (the leader takes the changed objects, reconciles and
 * writes; KubeVirt's part acts) until a round changes nothing. Step 0
 * ("initial") is a new leader starting on the scenario as loaded. Bad
 * input exits 2 with "FILE: PATH: message" before anything is printed: the
 * whole scenario is first replayed silently, so no step is half-applied.
 */
#include "cli/simulate.h"

#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "binder/binder.h"
#include "cli/sim.h"
#include "format/config.h"
#include "format/kobject.h"
#include "format/manifest.h"
#include "admission/review.h"
#include "placement/read.h"

_Static_assert(ENGINE_BINDER_MAX_CANDIDATES == BINDER_MAX_CANDIDATES, "the chooser is given what the binder finds");

/* Rounds of one step before it counts as not settling (a bug). */
#define SIM_MAX_ROUNDS 400

/* -------------------------------------------------------------- output */

void sim_bad(sim *s, const char *fmt, ...)
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

void sim_say(sim *s, const char *fmt, ...)
{
    if(s->quiet || s->json)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

void sim_event(sim *s, json_t *ev)
{
    if(s->step_out)
        json_array_append_new(json_object_get(s->step_out, "events"), ev);
    else
        json_decref(ev);
}

void sim_vmi_event(void *ud, const char *ns, const char *vmi, const char *from, const char *to, const char *node,
                   const char *why)
{
    sim *s = ud;
    sim_say(s, "  vmi %s/%s: %s -> %s%s%s (%s)\n", ns, vmi, from, to, node ? " on " : "", node ? node : "", why);
    char ref[600];
    snprintf(ref, sizeof ref, "%s/%s", ns, vmi);
    sim_event(s, json_pack("{s:s,s:s,s:s,s:s,s:o,s:s}", "kind", "vmi", "vmi", ref, "from", from, "to", to, "node",
                           node ? json_string(node) : json_null(), "why", why));
}

void sim_note(sim *s, const char *fmt, ...)
{
    char m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if(json_object_get(s->said, m))
        return; /* said once a run */
    json_object_set_new(s->said, m, json_true());
    sim_say(s, "  note: %s\n", m);
    sim_event(s, json_pack("{s:s,s:s}", "kind", "note", "message", m));
}

/* The placement model's notes: a step's events. */
static void on_note(void *ud, const placement_note *n)
{
    sim *s = ud;
    char ref[600];
    switch(n->kind) {
    case PLACEMENT_NOTE_TRANSITION: {
        const binder_event *e = n->event;
        const char *fn = e->from_node ? e->from_node : "-", *tn = e->to_node ? e->to_node : "-";
        sim_say(s, "  claim %s/%s: %s -> %s, node %s%s%s, %s: %s\n", e->ns, e->name, binder_phase_name(e->from),
                binder_phase_name(e->to), fn, strcmp(fn, tn) ? " -> " : "", strcmp(fn, tn) ? tn : "",
                binder_reason_name(e->reason), e->message);
        snprintf(ref, sizeof ref, "%s/%s", e->ns, e->name);
        sim_event(s, json_pack("{s:s,s:s,s:s,s:s,s:o,s:o,s:s,s:s}", "kind", "claim", "claim", ref, "from",
                               binder_phase_name(e->from), "to", binder_phase_name(e->to), "fromNode",
                               e->from_node ? json_string(e->from_node) : json_null(), "toNode",
                               e->to_node ? json_string(e->to_node) : json_null(), "reason",
                               binder_reason_name(e->reason), "message", e->message));
        break;
    }
    case PLACEMENT_NOTE_AVOIDED:
        snprintf(ref, sizeof ref, "%s/%s", n->ns, n->name);
        if(n->left == n->candidates)
            sim_say(s, "  VM %s: every candidate is a node its VMIs failed on: all are tried again\n", ref);
        else
            sim_say(s, "  VM %s: %zu node%s its VMIs failed on left out of its candidates\n", ref, n->left,
                    n->left > 1 ? "s" : "");
        sim_event(s, json_pack("{s:s,s:s,s:i,s:b}", "kind", "refusedNodes", "vm", ref, "leftOut", (int)n->left,
                               "triedAgain", n->left == n->candidates));
        break;
    case PLACEMENT_NOTE_POLICY_FAILED:
        if((unsigned)n->outcome < ENGINE_OUTCOME_LAST)
            s->policy_failures[n->outcome]++;
        sim_say(s, "  binder policy failed (%s): %s; placed in the packing order instead\n",
                engine_outcome_name(n->outcome), n->message);
        sim_event(s, json_pack("{s:s,s:s,s:s,s:s}", "kind", "binderPolicy", "outcome", engine_outcome_name(n->outcome),
                               "message", n->message, "fallback", "packing order"));
        break;
    case PLACEMENT_NOTE_BUDGET_FAILED:
        sim_say(s, "  budget check failed (%s) for claim %s/%s: it waits (fail closed)\n",
                engine_outcome_name(n->outcome), n->ns, n->name);
        break;
    case PLACEMENT_NOTE_EXPLAIN:
        sim_note(s, "%s", n->message);
        break;
    }
}

/* -------------------------------------------------------------- fields */

int sim_check_keys(sim *s, const json_t *o, const char *path, const char *const *allowed)
{
    if(!json_is_object(o)) {
        sim_bad(s, "%s: must be a mapping", path);
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v)
    {
        int found = 0;
        for(const char *const *a = allowed; *a; a++)
            found |= !strcmp(*a, k);
        if(!found) {
            char list[600] = "";
            size_t used = 0;
            for(const char *const *a = allowed; *a && used < sizeof list; a++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", a == allowed ? "" : ", ", *a);
            sim_bad(s, "%s.%s: unknown field (valid: %s)", path, k, list);
            return -1;
        }
    }
    return 0;
}

const char *sim_str_field(sim *s, const json_t *o, const char *key, const char *path, const char *dflt)
{
    const json_t *v = json_object_get(o, key);
    if(!v || json_is_null(v)) {
        if(!dflt)
            sim_bad(s, "%s.%s: required", path, key);
        return dflt;
    }
    if(!json_is_string(v) || !*json_string_value(v)) {
        sim_bad(s, "%s.%s: must be a non-empty string", path, key);
        return dflt ? dflt : "";
    }
    return json_string_value(v);
}

int sim_bool_field(sim *s, const json_t *o, const char *key, const char *path, int dflt)
{
    const json_t *v = json_object_get(o, key);
    if(!v || json_is_null(v))
        return dflt;
    if(!json_is_boolean(v)) {
        sim_bad(s, "%s.%s: must be true or false", path, key);
        return dflt;
    }
    return json_is_true(v);
}

int sim_split_ref(sim *s, const char *ref, const char *path, char *ns, char *name)
{
    const char *slash = strchr(ref, '/');
    size_t nl = slash ? (size_t)(slash - ref) : 7;
    const char *nsp = slash ? ref : "default";
    const char *np = slash ? slash + 1 : ref;
    if(nl == 0 || nl > BINDER_MAX_NAMESPACE || !*np || strlen(np) > BINDER_MAX_NAME || strchr(np, '/')) {
        sim_bad(s, "%s: \"%s\" is not NAMESPACE/NAME or NAME", path, ref);
        return -1;
    }
    memcpy(ns, nsp, nl);
    ns[nl] = 0;
    strcpy(name, np);
    return 0;
}

void sim_list(sim *s, json_t *list, const char *path, void (*fn)(sim *, json_t *, const char *))
{
    if(!list || s->bad[0])
        return;
    if(!json_is_array(list))
        return sim_bad(s, "%s: must be a list", path);
    size_t i;
    json_t *o;
    json_array_foreach(list, i, o)
    {
        char p[300];
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        fn(s, o, p);
        if(s->bad[0])
            return;
    }
}

void sim_each_name(sim *s, json_t *v, const char *path, void (*fn)(sim *, const char *, const char *))
{
    if(json_is_string(v)) {
        fn(s, json_string_value(v), path);
        return;
    }
    if(!json_is_array(v) || !json_array_size(v))
        return sim_bad(s, "%s: must be a name or a list of names", path);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x)
    {
        char p[300];
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        if(!json_is_string(x))
            return sim_bad(s, "%s: must be a name", p);
        fn(s, json_string_value(x), p);
        if(s->bad[0])
            return;
    }
}

/* -------------------------------------------------------------- the leader */

/* A new leader: the model built from the store's objects (decision 0020
 * §1: claims restored from their status), with the bundle's engine. */
static void leader_start(sim *s)
{
    if(s->p)
        s->choose_calls += placement_choose_calls(s->p);
    placement_free(s->p);
    s->p = NULL;
    placement_io io = sim_store_io(s->st, on_note, s);
    s->p = placement_new(&io, s->re, s->settings);
    if(!s->p || placement_build(s->p) != 0)
        return sim_bad(s, "internal: the leader cannot build its state from the objects");
    placement_set_policy(s->p, s->e, 1);
    keyset *seen = sim_store_changes(s->st); /* the build read all of it */
    keyset_free(&seen);
}

json_t *sim_admit(sim *s, json_t *obj, const char *path)
{
    if(!s->in_step)
        return json_incref(obj);
    json_t *view = json_array();
    for(int k = 0; k < PLACEMENT_KINDS; k++) {
        json_t *all = sim_store_list(s->st, (placement_kind)k);
        json_array_extend(view, all);
        json_decref(all);
    }
    cozy_err err = {{0}};
    json_t *groups = json_pack("[s,s]", "system:masters", "system:authenticated");
    review_options ro = {.username = "kubernetes-admin", .groups = groups, .phases = ENGINE_BOTH};
    json_t *out = NULL;
    engine_outcome outcome;
    json_t *admitted = NULL;
    if(engine_set_cluster(s->ae, view, s->settings, &err) != COZY_OK ||
       review_document(s->ae, obj, path, ++s->reviews, &ro, &out, &outcome, &err) != COZY_OK) {
        sim_bad(s, "%s: the admission review failed: %s", path, err.msg);
    } else {
        const json_t *resp = json_object_get(out, "response");
        if(json_is_true(json_object_get(resp, "allowed"))) {
            json_t *ops = review_decode_patch(resp);
            if(!ops)
                admitted = json_incref(obj);
            else if(engine_apply_patch(s->ae, obj, ops, &admitted, &err) != COZY_OK)
                sim_bad(s, "%s: the admission patch does not apply: %s", path, err.msg);
            json_decref(ops);
        } else {
            const char *m = json_string_value(json_object_get(json_object_get(resp, "status"), "message"));
            char ref[600];
            snprintf(ref, sizeof ref, "%s %s/%s", json_string_value(json_object_get(obj, "kind")),
                     kobject_meta_str(obj, "namespace") ? kobject_meta_str(obj, "namespace") : "",
                     kobject_meta_str(obj, "name"));
            sim_say(s, "  %s refused at admission: %s\n", ref, m ? m : "");
            sim_event(s, json_pack("{s:s,s:s,s:s}", "kind", "refused", "object", ref, "message", m ? m : ""));
        }
    }
    json_decref(out);
    json_decref(groups);
    json_decref(view);
    return admitted;
}

void sim_leader_catch_up(sim *s)
{
    if(!s->p)
        return;
    for(int round = 0; round < SIM_MAX_ROUNDS && !s->bad[0]; round++) {
        keyset *ch = sim_store_changes(s->st);
        if(!ch && !placement_more(s->p))
            return;
        if(ch)
            placement_apply(s->p, ch);
        keyset_free(&ch);
        placement_reconcile(s->p, PLACEMENT_PASS_CHANGES);
        placement_flush(s->p);
    }
    if(!s->bad[0])
        sim_bad(s, "the leader did not catch up after %d rounds (a bug: please report it)", SIM_MAX_ROUNDS);
}

/* Settles the world: rounds of the leader (the changed objects, a pass,
 * its writes) then KubeVirt's part, until a round changes nothing. */
static void settle(sim *s, int full)
{
    for(int round = 0; round < SIM_MAX_ROUNDS && !s->bad[0]; round++) {
        keyset *ch = sim_store_changes(s->st);
        int changed = ch != NULL;
        if(ch)
            placement_apply(s->p, ch);
        keyset_free(&ch);
        placement_reconcile(s->p, full ? PLACEMENT_PASS_FULL
                                  : changed ? PLACEMENT_PASS_CHANGES
                                            : PLACEMENT_PASS_RETRY);
        full = 0;
        placement_flush(s->p);
        int kv = sim_kubevirt_round(s->st, s->runs, sim_vmi_event, s);
        if(!changed && !kv && !placement_more(s->p)) {
            keyset *left = sim_store_changes(s->st);
            if(!left)
                return;
            /* the flush wrote: the next round takes it */
            placement_apply(s->p, left);
            keyset_free(&left);
        }
    }
    if(!s->bad[0])
        sim_bad(s, "the scenario did not settle after %d rounds (a bug: please report it)", SIM_MAX_ROUNDS);
}

/* ---------------------------------------------------------------- run */

static void begin_step(sim *s, size_t i, const char *name)
{
    s->step_out = json_pack("{s:I,s:s,s:[],s:[],s:[],s:[],s:[]}", "step", (json_int_t)i, "name", name, "events",
                            "claims", "vms", "nodes", "expect");
    json_array_append_new(s->out, s->step_out);
    sim_say(s, "== step %zu: %s\n", i, name);
}

static void run_step(sim *s, json_t *step, size_t idx)
{
    char path[100], p[160];
    snprintf(path, sizeof path, "steps[%zu]", idx);
    static const char *const keys[] = {"name",          "addNodes",      "addClaims",     "addVMs",     "cordon",
                                       "uncordon",      "notReady",      "ready",         "deleteNode", "capacity",
                                       "layoutPending", "layoutApplied", "classDeleting", "start",      "stop",
                                       "vmiFinal",      "deleteClaim",   "leaderChange",  "expect",     NULL};
    if(sim_check_keys(s, step, path, keys))
        return;
    char dflt[64];
    snprintf(dflt, sizeof dflt, "step %zu", idx + 1);
    const char *name = sim_str_field(s, step, "name", path, dflt);
    if(s->bad[0])
        return;
    begin_step(s, idx + 1, name);
    s->in_step = 1;
    sim_scenario_step(s, step, path);
    s->in_step = 0;
    json_t *lc = json_object_get(step, "leaderChange");
    int full = 0;
    if(lc && !s->bad[0]) {
        snprintf(p, sizeof p, "%s.leaderChange", path);
        if(!json_is_boolean(lc))
            sim_bad(s, "%s: must be true or false", p);
        else if(json_is_true(lc)) {
            sim_say(s, "  leader change: a new leader builds its state from the objects (claims from their status; "
                       "the nodes template VMIs failed on are forgotten)\n");
            leader_start(s);
            full = 1;
        }
    }
    if(s->bad[0])
        return;
    settle(s, full);
    sim_step_table(s);
    snprintf(p, sizeof p, "%s.expect", path);
    sim_list(s, json_object_get(step, "expect"), p, sim_check_expect);
}

static int run(sim *s)
{
    static const char *const keys[] = {"classes",        "nodes",    "claims",   "vms",   "namespaces",
                                       "resourceQuotas", "override", "snapshot", "steps", NULL};
    s->st = sim_store_new();
    s->runs = json_object();
    s->classes = json_object();
    s->caps = json_object();
    s->vm_claims = json_object();
    s->said = json_object();
    s->out = json_array();
    if(!s->st)
        sim_bad(s, "out of memory");
    else if(!sim_check_keys(s, s->doc, "scenario", keys)) {
        begin_step(s, 0, "initial");
        if(s->snap_recs)
            sim_snapshot_load(s);
        if(!s->bad[0])
            sim_scenario_load(s);
        if(!s->bad[0]) {
            sim_node_notes(s);
            /* a leader takes over the cluster as loaded; KubeVirt acts
             * after its first pass (a snapshot's final VMI is seen by the
             * leader before its VM starts the next one) */
            leader_start(s);
        }
        if(!s->bad[0]) {
            settle(s, 1);
            sim_step_table(s);
        }
        json_t *steps = json_object_get(s->doc, "steps");
        if(steps && !json_is_array(steps))
            sim_bad(s, "steps: must be a list");
        size_t i;
        json_t *st;
        json_array_foreach(steps, i, st)
        {
            if(s->bad[0])
                break;
            run_step(s, st, i);
        }
    }
    if(s->p)
        s->choose_calls += placement_choose_calls(s->p);
    placement_free(s->p);
    s->p = NULL;
    sim_store_free(s->st);
    s->st = NULL;
    json_decref(s->runs);
    json_decref(s->classes);
    json_decref(s->caps);
    json_decref(s->vm_claims);
    json_decref(s->said);
    s->runs = s->classes = s->caps = s->vm_claims = s->said = NULL;
    return s->bad[0] ? -1 : 0;
}

static void usage(FILE *f)
{
    fputs(
        "usage: cozygpu simulate SCENARIO.yaml [--output table|json] [--config FILE]\n"
        "                        [--policies DIR] [--override DIR] [--library DIR]\n"
        "                        [--snapshot PATH]\n"
        "\n"
        "Replays a scenario through the leader's own placement code (claim phases and\n"
        "nodes, template claims, pins, VMI deletions: DESIGN.md §6), with no cluster:\n"
        "the scenario becomes the objects a cluster holds, the leader reads and writes\n"
        "them as it does through the API server, and KubeVirt's part (runStrategy,\n"
        "launcher pods, running where the pod is pinned) is modelled beside it.\n"
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
        "                       directory of YAML/JSON (kubectl get nodes,gpunodes,\n"
        "                       gpuclasses,gpuclaims,vms,vmis,kubevirts,namespaces,\n"
        "                       resourcequotas,pvc,pv -A -o yaml); overrides the\n"
        "                       scenario's `snapshot`\n"
        "\n"
        "The scenario (one YAML or JSON document; these keys only):\n"
        "  snapshot: PATH        optional, relative to the scenario (--snapshot wins)\n"
        "  override: DIR         optional hoster policy directory, relative to the scenario\n"
        "  classes:  - {name, resourceName?, onCordon?: Move|Stay, deleting?: bool,\n"
        "              tolerations?: [{key, operator, value, effect}]}\n"
        "  nodes:    - {name, capacity?: {CLASS: units}, taints?: [{key, value, effect}],\n"
        "              labels?: {..}, ready?: true, unschedulable?: false,\n"
        "              layoutPending?: false}\n"
        "  claims:   - {name, namespace?: default, class, count: 1..4096}\n"
        "  vms:      - {name, namespace?: default, claims: [NAME..] | gpus: [{class, count}],\n"
        "              runStrategy?: Always|RerunOnFailure|Once|Manual|Halted (default),\n"
        "              volumeNodes?: [NODE..]}\n"
        "  namespaces: [Namespace objects], resourceQuotas: [ResourceQuota objects]\n"
        "  steps:    - {name?, ACTIONS.., expect?: [..]}\n"
        "Actions, applied in this order, each taken by the leader before the next (a\n"
        "NODE, VM, CLASS or CLAIM value may be one name or a list):\n"
        "  addNodes, addClaims, addVMs: [as above]\n"
        "  cordon, uncordon, notReady, ready, deleteNode, layoutPending, layoutApplied: NODE\n"
        "  capacity: {node, class, units} (or a list)    classDeleting: CLASS\n"
        "  start, stop: NS/VM (virtctl)                    vmiFinal: {vm, phase: Succeeded|Failed}\n"
        "  deleteClaim: NS/NAME                            leaderChange: true\n"
        "Expect lines: {claim: NS/NAME, phase?, node?, reason?}, {claim, absent: true},\n"
        "  {vmi: NS/NAME, phase?, node?} (node null: none). A VMI's phase: None, Pending,\n"
        "  Scheduled, Running, Succeeded or Failed. docs/simulate.md says more.\n"
        "\n"
        "exit status: 0 every expect line held, 1 one failed, 2 bad usage or input\n",
        f);
}

int sim_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, 0, 'o'},   {"config", required_argument, 0, 'c'},
        {"policies", required_argument, 0, 'p'}, {"override", required_argument, 0, 'O'},
        {"library", required_argument, 0, 'L'},  {"snapshot", required_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    const char *output = "table", *config_path = NULL, *snapshot_path = NULL;
    engine_options eo = {0};
    int c;
    optind = 1;
    opterr = 0; /* said below, with the command's name */
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch(c) {
        case 'o': output = optarg; break;
        case 'c': config_path = optarg; break;
        case 'p': eo.bundle_dir = optarg; break;
        case 'O': eo.override_dir = optarg; break;
        case 'L': eo.library_dir = optarg; break;
        case 'S': snapshot_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "cozygpu simulate: %s: %s\n", argv[optind - 1],
                    c == ':' || (optopt && strchr("ocpOLS", optopt)) ? "needs a value" : "unknown option");
            usage(stderr);
            return 2;
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
    /* the leader's logs (pins, template claims) are not the report: only
     * errors reach stderr */
    log_setup(0, LOG_ERROR);
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
    engine *e = NULL, *re = NULL, *ae = NULL;
    engine_options reo = eo; /* runtime.binder: the library alone, as the leader opens it */
    reo.bundle_dir = NULL;
    reo.override_dir = NULL;
    if(engine_open(&e, &eo, &err) != COZY_OK || engine_open(&ae, &eo, &err) != COZY_OK ||
       engine_open_runtime(&re, &reo, "binder", &err) != COZY_OK) {
        fprintf(stderr, "cozygpu simulate: %s\n", err.msg);
        engine_close(e);
        engine_close(ae);
        json_decref(snap_recs);
        json_decref(settings);
        json_decref(recs);
        return 2;
    }
    sim *s = calloc(1, sizeof *s);
    int status = 2;
    if(!s) {
        fprintf(stderr, "cozygpu simulate: out of memory\n");
        goto out;
    }
    /* first silently, so that bad input is refused before anything is shown */
    *s = (sim){.file = file, .doc = doc, .e = e, .re = re, .ae = ae, .snap_recs = snap_recs, .settings = settings,
               .quiet = 1};
    int rc = run(s);
    json_decref(s->out);
    if(rc) {
        fprintf(stderr, "cozygpu simulate: %s\n", s->bad);
        goto out;
    }
    *s = (sim){.file = file, .doc = doc, .e = e, .re = re, .ae = ae, .snap_recs = snap_recs, .settings = settings,
               .json = !strcmp(output, "json")};
    rc = run(s);
    if(rc) {
        fprintf(stderr, "cozygpu simulate: %s\n", s->bad);
    } else if(s->json) {
        json_t *fails = json_object();
        for(int o = ENGINE_POLICY_ERROR; o < ENGINE_OUTCOME_LAST; o++)
            json_object_set_new(fails, engine_outcome_name((engine_outcome)o), json_integer(s->policy_failures[o]));
        json_t *all = json_pack("{s:s,s:O,s:i,s:i,s:{s:I,s:o}}", "scenario", file, "steps", s->out, "expectPassed",
                                s->expect_passed, "expectFailed", s->expect_failed, "binderPolicy", "calls",
                                (json_int_t)s->choose_calls, "failures", fails);
        json_dumpf(all, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(all);
    } else {
        int fails = 0;
        for(int o = ENGINE_POLICY_ERROR; o < ENGINE_OUTCOME_LAST; o++)
            fails += s->policy_failures[o];
        if(fails)
            printf("the binder policy failed %d of %lu times; those sets were placed in the packing order\n", fails,
                   s->choose_calls);
        printf("%d expect lines held, %d failed\n", s->expect_passed, s->expect_failed);
    }
    status = rc ? 2 : s->expect_failed ? 1 : 0;
    json_decref(s->out);
out:
    free(s);
    engine_close(e);
    engine_close(ae);
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
