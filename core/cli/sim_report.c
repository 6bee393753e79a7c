/* sim_report.c — what `cozygpu simulate` shows after each step (sim.h):
 * the claims' table read from the in-memory API server as a user would
 * read it with kubectl, the nodes' notes, and the scenario's `expect`
 * lines checked against that table (docs/simulate.md, "expect").
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/sim.h"
#include "format/kobject.h"
#include "placement/read.h"

/* -------------------------------------------------------------- reading the store */

/* Claim ns/name as the API shows it: phase, node, attachedTo, the Ready
 * condition's reason ("" for none: the leader writes "Pending") and
 * message. 0, or -1 when there is no such claim. */
typedef struct claim_row {
    const char *phase, *node, *attached, *reason, *message, *cls;
    json_int_t count;
} claim_row;

static void row_of(const json_t *c, claim_row *r)
{
    const json_t *st = json_object_get(c, "status");
    r->phase = json_string_value(json_object_get(st, "phase"));
    if(!r->phase)
        r->phase = "Pending";
    r->node = json_string_value(json_object_get(st, "node"));
    r->attached = json_string_value(json_object_get(st, "attachedTo"));
    r->reason = "";
    r->message = "";
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(st, "conditions"), i, x)
    {
        const char *t = json_string_value(json_object_get(x, "type"));
        if(t && !strcmp(t, "Ready")) {
            const char *rs = json_string_value(json_object_get(x, "reason"));
            r->reason = rs && strcmp(rs, "Pending") ? rs : "";
            r->message = json_string_value(json_object_get(x, "message")) ? json_string_value(json_object_get(x, "message"))
                                                                          : "";
        }
    }
    r->cls = json_string_value(json_object_get(json_object_get(c, "spec"), "class"));
    r->count = json_integer_value(json_object_get(json_object_get(c, "spec"), "count"));
}

/* -------------------------------------------------------------- expects */

void sim_check_expect(sim *s, json_t *e, const char *path)
{
    static const char *const keys[] = {"claim", "vmi", "phase", "node", "reason", "absent", NULL};
    if(sim_check_keys(s, e, path, keys))
        return;
    const char *cref = json_string_value(json_object_get(e, "claim"));
    const char *vref = json_string_value(json_object_get(e, "vmi"));
    if(!!cref == !!vref)
        return sim_bad(s, "%s: name exactly one of claim or vmi", path);
    json_t *jn = json_object_get(e, "node");
    if(jn && !json_is_null(jn) && !json_is_string(jn))
        return sim_bad(s, "%s.node: must be a node name, or null for none", path);
    const char *want_node = jn && json_is_string(jn) && *json_string_value(jn) ? json_string_value(jn) : NULL;
    const char *want_phase = json_object_get(e, "phase") ? sim_str_field(s, e, "phase", path, NULL) : NULL;
    const char *want_reason = json_object_get(e, "reason") ? sim_str_field(s, e, "reason", path, NULL) : NULL;
    if(s->bad[0])
        return;
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1], got[700], what[600];
    const char *got_phase, *got_node, *got_reason = NULL;
    json_t *obj = NULL;
    if(cref) {
        binder_phase p;
        binder_reason r;
        if(want_phase && binder_phase_parse(want_phase, &p))
            return sim_bad(s, "%s.phase: must be Pending, Bound, Attached or Lost", path);
        if(want_reason && binder_reason_parse(want_reason, &r))
            return sim_bad(s, "%s.reason: \"%s\" is not a reason of decision 0020", path, want_reason);
        if(sim_split_ref(s, cref, path, ns, name))
            return;
        int absent = sim_bool_field(s, e, "absent", path, 0);
        if(absent && (want_phase || want_reason || json_object_get(e, "node")))
            return sim_bad(s, "%s.absent: goes alone with claim", path);
        obj = sim_store_get(s->st, PLACEMENT_CLAIM, ns, name);
        snprintf(what, sizeof what, "claim %s/%s", ns, name);
        if(absent) {
            int gone = obj == NULL;
            claim_row r = {0};
            if(obj)
                row_of(obj, &r);
            if(gone)
                s->expect_passed++;
            else
                s->expect_failed++;
            snprintf(got, sizeof got, "%s", gone ? "absent" : r.phase);
            sim_say(s, "  expect %s absent: %s%s\n", what, gone ? "ok" : "FAILED, got ", gone ? "" : got);
            json_array_append_new(json_object_get(s->step_out, "expect"),
                                  json_pack("{s:s,s:O,s:b,s:s}", "what", what, "want", e, "ok", gone, "got", got));
            json_decref(obj);
            return;
        }
        if(!obj)
            return sim_bad(s, "%s.claim: unknown claim \"%s\"", path, cref);
        claim_row cr;
        row_of(obj, &cr);
        got_phase = cr.phase;
        got_node = cr.node;
        got_reason = cr.reason;
    } else {
        binder_vmi_phase p;
        if(want_reason)
            return sim_bad(s, "%s.reason: a VMI has no reason here", path);
        if(want_phase && binder_vmi_phase_parse(want_phase, &p))
            return sim_bad(s, "%s.phase: must be None, Pending, Scheduled, Running, Succeeded or Failed", path);
        if(sim_split_ref(s, vref, path, ns, name))
            return;
        json_t *vm = sim_store_get(s->st, PLACEMENT_VM, ns, name);
        obj = sim_store_get(s->st, PLACEMENT_VMI, ns, name);
        json_decref(vm);
        if(!vm && !obj)
            return sim_bad(s, "%s: unknown VM \"%s\"", path, vref);
        got_phase = sim_vmi_phase(obj);
        got_node = obj ? json_string_value(json_object_get(json_object_get(obj, "status"), "nodeName")) : NULL;
        snprintf(what, sizeof what, "vmi %s/%s", ns, name);
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
    sim_say(s, "  expect %s%s%s%s%s%s%s: %s%s\n", what, want_phase ? " phase=" : "", want_phase ? want_phase : "",
            json_object_get(e, "node") ? " node=" : "",
            json_object_get(e, "node") ? (want_node ? want_node : "none") : "", want_reason ? " reason=" : "",
            want_reason ? want_reason : "", good ? "ok" : "FAILED, got ", good ? "" : got);
    json_array_append_new(json_object_get(s->step_out, "expect"),
                          json_pack("{s:s,s:O,s:b,s:s}", "what", what, "want", e, "ok", good, "got", got));
    json_decref(obj);
}

/* ---------------------------------------------------------------- table */

void sim_step_table(sim *s)
{
    sim_say(s, "    %-28s %-12s %5s  %-8s %-14s %-20s %s\n", "CLAIM", "CLASS", "COUNT", "PHASE", "NODE", "REASON",
            "MESSAGE");
    json_t *claims = sim_store_list(s->st, PLACEMENT_CLAIM);
    size_t i;
    json_t *c;
    json_array_foreach(claims, i, c)
    {
        claim_row r;
        row_of(c, &r);
        char ref[600];
        snprintf(ref, sizeof ref, "%s/%s", kobject_meta_str(c, "namespace"), kobject_meta_str(c, "name"));
        sim_say(s, "    %-28s %-12s %5lld  %-8s %-14s %-20s %s\n", ref, r.cls ? r.cls : "?", (long long)r.count,
                r.phase, r.node ? r.node : "-", r.reason, r.message);
        json_array_append_new(json_object_get(s->step_out, "claims"),
                              json_pack("{s:s,s:s,s:I,s:s,s:o,s:o,s:s,s:s}", "claim", ref, "class", r.cls ? r.cls : "",
                                        "count", r.count, "phase", r.phase, "node", r.node ? json_string(r.node) : json_null(),
                                        "attachedTo", r.attached ? json_string(r.attached) : json_null(), "reason",
                                        r.reason, "message", r.message));
    }
    json_decref(claims);
    json_t *vms = sim_store_list(s->st, PLACEMENT_VM);
    json_t *v;
    json_array_foreach(vms, i, v)
    {
        const char *ns = kobject_meta_str(v, "namespace"), *name = kobject_meta_str(v, "name");
        json_t *vmi = sim_store_get(s->st, PLACEMENT_VMI, ns, name);
        const char *rs = json_string_value(json_object_get(json_object_get(v, "spec"), "runStrategy"));
        const char *node = vmi ? json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName")) : NULL;
        char ref[600];
        snprintf(ref, sizeof ref, "%s/%s", ns, name);
        json_array_append_new(json_object_get(s->step_out, "vms"),
                              json_pack("{s:s,s:s,s:s,s:o}", "vm", ref, "runStrategy", rs ? rs : "Halted", "vmi",
                                        sim_vmi_phase(vmi), "node", node ? json_string(node) : json_null()));
        json_decref(vmi);
    }
    json_decref(vms);
    const binder_state *bs = placement_state(s->p);
    const binder_index *ix = bs ? binder_state_index(bs) : NULL;
    json_t *nodes = sim_store_list(s->st, PLACEMENT_NODE);
    json_t *n;
    json_array_foreach(nodes, i, n)
    {
        const char *name = kobject_meta_str(n, "name");
        uint32_t flags = 0;
        if(!ix || binder_node_flags(ix, name, &flags) != BINDER_OK)
            continue; /* offers nothing the binder keeps */
        json_t *offers = json_object();
        const char *cls;
        json_t *x;
        json_object_foreach(s->classes, cls, x)
        {
            binder_slot_view sv;
            if(binder_node_slot(ix, name, cls, &sv) == BINDER_OK && sv.offered)
                json_object_set_new(offers, cls, json_integer(sv.offered));
        }
        json_array_append_new(json_object_get(s->step_out, "nodes"),
                              json_pack("{s:s,s:o,s:b,s:b,s:b}", "node", name, "offers", offers, "ready",
                                        !!(flags & BINDER_NODE_READY), "schedulable",
                                        !!(flags & BINDER_NODE_SCHEDULABLE), "layoutPending",
                                        !!(flags & BINDER_NODE_LAYOUT_PENDING)));
    }
    json_decref(nodes);
    cozy_err err = {{0}};
    if(bs && binder_state_verify(bs, &err))
        sim_bad(s, "internal: the binder broke a rule: %s", err.msg);
}

/* Step 0's notes: each node's capacity problems, as runtime.binder.node
 * reads them (what the leader logs). */
void sim_node_notes(sim *s)
{
    json_t *classes = sim_store_list(s->st, PLACEMENT_CLASS);
    json_t *kvs = sim_store_list(s->st, PLACEMENT_KUBEVIRT);
    json_t *nodes = sim_store_list(s->st, PLACEMENT_NODE);
    size_t i, bare = 0;
    json_t *n;
    json_array_foreach(nodes, i, n)
    {
        const char *name = kobject_meta_str(n, "name");
        const char *from = json_object_get(s->caps, name) ? "" : "snapshot: ";
        json_t *g = sim_store_get(s->st, PLACEMENT_GPUNODE, NULL, name);
        if(!g) {
            bare++; /* no GPU node (a control plane): it offers nothing */
            continue;
        }
        placement_read_node_view v;
        cozy_err err = {{0}};
        if(placement_read_node(s->re, n, g, json_array_get(kvs, 0), classes, NULL, &v, &err) != COZY_OK)
            sim_note(s, "%snode %s: %s", from, name, err.msg);
        else {
            size_t k;
            json_t *p;
            json_array_foreach(json_object_get(v.view, "problems"), k, p)
            {
                sim_note(s, "%snode %s: %s", from, name, json_string_value(p) ? json_string_value(p) : "?");
            }
        }
        placement_read_node_view_free(&v);
        json_decref(g);
    }
    if(bare)
        sim_note(s, "snapshot: %zu Node%s without a GPUNode offer%s nothing", bare, bare > 1 ? "s" : "",
                 bare > 1 ? "" : "s");
    json_decref(nodes);
    json_decref(kvs);
    json_decref(classes);
}

