/* pin.c — gated virt-launcher pods (internal.h, pl_): pinned to the node
 * their claims are Bound on and ungated (decision 0020 §5, 0025), and a
 * Pending VMI whose pod was pinned where its claims are not deleted
 * (DESIGN.md §6).
 */
#include "placement/internal.h"

#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/metrics.h"
#include "engine/luajson.h"
#include "format/kobject.h"
#include "placement/read.h"

static int has_gate(const json_t *pod)
{
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(json_object_get(pod, "spec"), "schedulingGates"), i, g)
    {
        const char *n = json_string_value(json_object_get(g, "name"));
        if(n && strcmp(n, PL_GATE) == 0)
            return 1;
    }
    return 0;
}

/* The VMI a launcher pod runs: its controller ownerReference of kind
 * VirtualMachineInstance (KubeVirt's template service). */
static const char *owner_vmi(const json_t *pod)
{
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(json_object_get(pod, "metadata"), "ownerReferences"), i, r)
    {
        const char *k = json_string_value(json_object_get(r, "kind"));
        if(k && strcmp(k, "VirtualMachineInstance") == 0 && json_is_true(json_object_get(r, "controller")))
            return json_string_value(json_object_get(r, "name"));
    }
    return NULL;
}

/* Whether `r` is the pin's requirement metadata.name In [one node]; the
 * node, or NULL. */
static const char *pin_of(const json_t *r)
{
    const char *k = json_string_value(json_object_get(r, "key"));
    const char *op = json_string_value(json_object_get(r, "operator"));
    const json_t *v = json_object_get(r, "values");
    if(k && op && strcmp(k, "metadata.name") == 0 && strcmp(op, "In") == 0 && json_array_size(v) == 1)
        return json_string_value(json_array_get(v, 0));
    return NULL;
}

/* A NodeSelectorTerm with no requirement (it matches no node: k8s.io/api
 * core/v1 NodeSelectorTerm). */
static int empty_term(const json_t *term)
{
    return json_array_size(json_object_get(term, "matchExpressions")) == 0 &&
           json_array_size(json_object_get(term, "matchFields")) == 0;
}

/* Narrows a gated pod to `node` and removes the gate (decision 0020 §5,
 * 0025): the narrowed affinity is runtime.binder.pin's, i.e.
 * cozygpu.pin.narrow's, the shape the webhook writes at creation (KEP-3838
 * and kube-apiserver validateNodeAffinityMutation: on a gated pod a
 * required node affinity may be set when there is none, else each term
 * may only gain requirements and an empty term stays empty).
 * io.update's mutate: 1 when the gate is gone already, -1 for a shape the
 * API server would not have stored (left as it is), when Lua cannot
 * answer, or when this replica no longer leads. */
typedef struct pin_ctx {
    placement *L;
    const char *node;
    int bad_shape; /* set when the pod's affinity is a shape the API server would not have stored */
} pin_ctx;

/* runtime.binder.pin(pod, node): the new spec.affinity (a new reference),
 * or NULL with *bad set for a shape that cannot be narrowed. */
static json_t *pinned_affinity(placement *L, const json_t *pod, const char *node, int *bad)
{
    lua_State *S = engine_lua(L->e);
    engine_push_runtime_fn(L->e, "pin");
    luajson_push(S, pod);
    lua_pushstring(S, node);
    cozy_err err;
    json_t *out = NULL;
    if(engine_call(L->e, 2, 1, 0, &err) != ENGINE_ALLOWED || engine_to_json(L->e, -1, &out, &err) != COZY_OK) {
        log_write(LOG_ERROR, "binder", "runtime.binder.pin failed; the pod stays gated", "pod",
                  kobject_meta_str(pod, "name"), "error", err.msg, NULL);
        json_decref(out);
        lua_settop(S, 0);
        return NULL;
    }
    lua_settop(S, 0);
    json_t *aff = json_incref(json_object_get(out, "affinity"));
    if(!aff) {
        const json_t *pr = json_object_get(out, "problem");
        log_write(LOG_WARN, "binder", "a gated launcher pod's affinity cannot be narrowed; it stays gated",
                  "namespace", kobject_meta_str(pod, "namespace"), "pod", kobject_meta_str(pod, "name"), "field", json_string_value(json_object_get(pr, "field")), "error",
                  json_string_value(json_object_get(pr, "message")), NULL);
        *bad = 1;
    }
    json_decref(out);
    return aff;
}

static int pin_mutate(json_t *pod, void *ctx)
{
    pin_ctx *pc = ctx;
    placement *L = pc->L;
    if(!has_gate(pod))
        return 1;
    json_t *spec = json_object_get(pod, "spec");
    json_t *aff = pinned_affinity(L, pod, pc->node, &pc->bad_shape);
    if(!aff)
        return -1;
    json_object_set_new(spec, "affinity", aff);
    json_t *gates = json_object_get(spec, "schedulingGates");
    for(size_t i = json_array_size(gates); i-- > 0;) {
        const char *n = json_string_value(json_object_get(json_array_get(gates, i), "name"));
        if(n && strcmp(n, PL_GATE) == 0)
            json_array_remove(gates, i);
    }
    if(json_array_size(gates) == 0)
        json_object_del(spec, "schedulingGates");
    return pl_leading(L) ? 0 : -1; /* the last check before the write */
}

static const json_t *required_terms(const json_t *pod)
{
    return json_object_get(
        json_object_get(json_object_get(json_object_get(json_object_get(pod, "spec"), "affinity"), "nodeAffinity"),
                        "requiredDuringSchedulingIgnoredDuringExecution"),
        "nodeSelectorTerms");
}

/* The node an ungated pod's pin names: the pin is appended last to every
 * term that has a requirement (cozygpu.pin, pin_mutate), so it is the
 * last matchFields requirement of each such term, naming the same node;
 * NULL when the pod carries no such pin (a requirement of the pod's own is
 * not ours). */
const char *placement_pinned_node(const json_t *pod)
{
    const json_t *terms = required_terms(pod);
    const char *node = NULL;
    size_t i;
    json_t *term;
    json_array_foreach(terms, i, term)
    {
        if(empty_term(term))
            continue;
        const json_t *mf = json_object_get(term, "matchFields");
        const char *n = pin_of(json_array_get(mf, json_array_size(mf) - 1));
        if(!n || (node && strcmp(node, n) != 0))
            return NULL;
        node = n;
    }
    return node;
}

/* The node all claims of the set named by the pod's VMI are Bound (or
 * Attached) on, or NULL when they are not all on one node. */
static const char *set_node(placement *L, const char *ns, const char *vmi_name, char *buf, size_t n)
{
    json_t *vmi = pl_get(L, PLACEMENT_VMI, ns, vmi_name);
    if(!vmi)
        return NULL;
    char nb[8192];
    const char *names[BINDER_MAX_SET_CLAIMS];
    size_t k = pl_vmi_claims(L, vmi, nb, sizeof nb, names, BINDER_MAX_SET_CLAIMS, NULL);
    const char *node = NULL;
    for(size_t i = 0; i < k; i++) {
        /* the state's decision, and the API showing it (a write not sent
         * yet must not lead to a pin the claim's status does not back) */
        binder_claim_status s;
        json_t *c = pl_get(L, PLACEMENT_CLAIM, ns, names[i]);
        const char *api = json_string_value(json_object_get(json_object_get(c, "status"), "node"));
        const char *owner = binder_state_claim_set(L->st, ns, names[i]);
        int ok = binder_state_claim_get(L->st, ns, names[i], &s) == BINDER_OK &&
                 (s.phase == BINDER_BOUND || s.phase == BINDER_ATTACHED) && s.node && api &&
                 strcmp(api, s.node) == 0 && (!node || strcmp(node, s.node) == 0) &&
                 /* the claims are this VMI's: its own set holds them and
                  * no other VMI is attached (decision 0019: another VMI's
                  * launcher pod stays gated) */
                 owner && strcmp(owner, vmi_name) == 0 && (!s.attached_to || strcmp(s.attached_to, vmi_name) == 0);
        json_decref(c);
        if(!ok) {
            node = NULL;
            k = 0;
            break;
        }
        node = s.node;
    }
    if(node)
        snprintf(buf, n, "%s", node);
    json_decref(vmi);
    return k && node ? buf : NULL;
}

/* Tries to pin gated pod `key`. Returns 1 when the pod needs nothing more
 * (pinned, not gated, gone), 0 while it waits. */
int pl_pin_pod(placement *L, const char *key)
{
    char buf[600];
    const char *ns, *name;
    keyset_split(key, buf, sizeof buf, &ns, &name);
    json_t *pod = pl_get(L, PLACEMENT_POD, ns, name);
    if(!pod)
        return 1;
    const char *vmi = owner_vmi(pod);
    char nodebuf[256];
    if(!has_gate(pod)) {
        /* Pinned at creation by a replica whose cache still showed the
         * claims' old node (decision 0025): while its VMI is not
         * scheduled, that VMI goes, as for a set that moved (DESIGN.md
         * §6), and the VM's runStrategy starts one pinned right. */
        /* pods the webhook pins: those naming claims, and template VMIs'
         * (KubeVirt copies the VMI's labels onto the pod) */
        const json_t *pmeta = json_object_get(pod, "metadata");
        const char *ref = json_string_value(json_object_get(json_object_get(pmeta, "labels"), PLACEMENT_READ_CLASS_REFERENCE));
        const char *pin = kobject_annotation(pod, PL_CLAIMS_ANNOTATION) || (ref && strcmp(ref, "true") == 0)
                              ? placement_pinned_node(pod)
                              : NULL;
        const char *now = vmi ? set_node(L, ns, vmi, nodebuf, sizeof nodebuf) : NULL;
        json_t *v = vmi ? pl_get(L, PLACEMENT_VMI, ns, vmi) : NULL;
        if(pin && now && strcmp(pin, now) != 0 && v && placement_read_vmi_phase(v) == BINDER_VMI_PENDING &&
           !json_object_get(json_object_get(pod, "spec"), "nodeName")) {
            char key2[1024];
            if(snprintf(key2, sizeof key2, "%s/%s", ns, vmi) < (int)sizeof key2)
                keyset_add(&L->deletes, key2);
            log_write(LOG_INFO, "binder", "deleting a pending VMI whose launcher pod is pinned where its claims are not",
                      "namespace", ns, "vmi", vmi, "pinned", pin, "node", now, NULL);
        }
        json_decref(v);
        json_decref(pod);
        return 1;
    }
    const char *node = vmi ? set_node(L, ns, vmi, nodebuf, sizeof nodebuf) : NULL;
    int done = 0;
    if(node && pl_leading(L)) {
        cozy_err err = {0};
        pin_ctx pc = {L, node, 0};
        long code = L->io.update(L->io.ud, PLACEMENT_POD, ns, name, pin_mutate, &pc, &err);
        if(code == 200) {
            log_write(LOG_INFO, "binder", "pinned the launcher pod to its claims' node and removed its gate",
                      "namespace", ns, "pod", name, "node", node, NULL);
            metrics_counter_add("cozygpu_binder_pod_pins_total", NULL, 1);
            done = 1;
        } else if(pc.bad_shape) {
            /* the API server refuses such a pod; a double or a hand-made
             * object can hold one: said once (pinned_affinity logged
             * cozygpu.pin.narrow's problem), not tried again */
            done = 1;
        } else if(code == 404) {
            done = 1; /* gone meanwhile */
        } else
            log_write(LOG_WARN, "binder", "cannot pin the launcher pod", "namespace", ns, "pod", name, "error",
                      err.msg, NULL);
    }
    json_decref(pod);
    return done;
}
