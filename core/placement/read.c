/* read.c — cluster objects into the binder's terms (read.h).
 * Rules: DESIGN.md §3, §6; docs/decisions/0019, 0020 §1, 0022, 0026, 0027.
 */
#include "placement/read.h"

#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/luajson.h"
#include "format/kobject.h"

/* metadata.<field> of `obj` as a string, or NULL. */
binder_vmi_phase placement_read_vmi_phase(const json_t *vmi)
{
    const char *p = json_string_value(json_object_get(json_object_get(vmi, "status"), "phase"));
    if(!p || !*p || strcmp(p, "Pending") == 0 || strcmp(p, "Scheduling") == 0)
        return BINDER_VMI_PENDING;
    if(strcmp(p, "Scheduled") == 0)
        return BINDER_VMI_SCHEDULED;
    if(strcmp(p, "Succeeded") == 0)
        return BINDER_VMI_SUCCEEDED;
    if(strcmp(p, "Failed") == 0)
        return BINDER_VMI_FAILED;
    return BINDER_VMI_RUNNING; /* Running, and Unknown (its node cannot be reached: not final) */
}

size_t placement_read_claim_names(const char *v, char *buf, size_t n, const char **names, size_t max)
{
    snprintf(buf, n, "%s", v ? v : "");
    size_t k = 0;
    char *save = NULL;
    for(char *tok = strtok_r(buf, ",", &save); tok && k < max; tok = strtok_r(NULL, ",", &save)) {
        while(*tok == ' ' || *tok == '\t')
            tok++;
        char *end = tok + strlen(tok);
        while(end > tok && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = 0;
        if(*tok)
            names[k++] = tok;
    }
    return k;
}

/* Annotation `key` of the metadata `meta_owner`, or NULL. */
/* A whole number of devices from a quantity ("2", 2); 0 when it is not
 * one (admission refuses such a VMI: decision 0013). */
static long whole_units(const json_t *q)
{
    if(json_is_integer(q))
        return json_integer_value(q) > 0 ? (long)json_integer_value(q) : 0;
    const char *s = json_string_value(q);
    if(!s || !*s)
        return 0;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    return end && *end == 0 && v > 0 && v <= BINDER_MAX_UNITS ? v : 0;
}

/* The devices VMI `vmi` asks for, by resource name, into `used` ({name:
 * units}): one per spec.domain.devices.gpus[] and hostDevices[] entry (by
 * deviceName), and the device-plugin names of spec.domain.resources
 * (limits, or requests when larger: a name with a '/', other than
 * KubeVirt's own devices.kubevirt.io/), as KubeVirt puts all of them into
 * the compute container's limits (pkg/virt-controller/services/
 * renderresources.go). Returns the total. */
static long vmi_units(const json_t *vmi, json_t *used)
{
    long total = 0;
    const json_t *domain = json_object_get(json_object_get(vmi, "spec"), "domain");
    const json_t *dev = json_object_get(domain, "devices");
    static const char *const lists[] = {"gpus", "hostDevices"};
    for(int l = 0; l < 2; l++) {
        size_t i;
        json_t *g;
        json_array_foreach(json_object_get(dev, lists[l]), i, g)
        {
            const char *dn = json_string_value(json_object_get(g, "deviceName"));
            if(dn && *dn) {
                json_object_set_new(used, dn, json_integer(json_integer_value(json_object_get(used, dn)) + 1));
                total++;
            }
        }
    }
    const json_t *res = json_object_get(domain, "resources");
    json_t *asked = json_object(); /* name -> max(limits, requests) */
    static const char *const kinds[] = {"limits", "requests"};
    for(int k = 0; k < 2; k++) {
        const char *rn;
        json_t *q;
        json_object_foreach(json_object_get(res, kinds[k]), rn, q)
        {
            if(!strchr(rn, '/') || strncmp(rn, "devices.kubevirt.io/", 20) == 0)
                continue;
            long u = whole_units(q);
            if(u > json_integer_value(json_object_get(asked, rn)))
                json_object_set_new(asked, rn, json_integer(u));
        }
    }
    const char *rn;
    json_t *u;
    json_object_foreach(asked, rn, u)
    {
        json_int_t v = json_integer_value(u);
        if(v > 0) {
            json_object_set_new(used, rn, json_integer(json_integer_value(json_object_get(used, rn)) + v));
            total += (long)v;
        }
    }
    json_decref(asked);
    return total;
}

int placement_read_vmi_uses_classes(const json_t *vmi)
{
    const json_t *meta = json_object_get(vmi, "metadata");
    if(kobject_annotation(vmi, PLACEMENT_READ_CLAIMS_ANNOTATION))
        return 0; /* it names its claims (blank: none; admission refuses that), as cozygpu.claims reads it */
    const char *ref = json_string_value(json_object_get(json_object_get(meta, "labels"), PLACEMENT_READ_CLASS_REFERENCE));
    return ref && strcmp(ref, "true") == 0;
}

size_t placement_read_vmi_claims(const json_t *vmi, const json_t *tmplset, char *buf, size_t n, const char **names,
                                 size_t max, json_t **tmpl)
{
    if(tmpl)
        *tmpl = NULL;
    const char *ann = kobject_annotation(vmi, PLACEMENT_READ_CLAIMS_ANNOTATION);
    if(ann)
        return placement_read_claim_names(ann, buf, n, names, max);
    if(!placement_read_vmi_uses_classes(vmi) || !json_is_array(tmplset))
        return 0;
    size_t k = 0, used = 0;
    json_t *out = tmpl ? json_array() : NULL;
    size_t i;
    json_t *t;
    json_array_foreach(tmplset, i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        size_t len = name ? strlen(name) : 0;
        if(!name || k >= max || len > BINDER_MAX_NAME || used + len + 1 > n)
            continue;
        char *at = buf + used;
        memcpy(at, name, len + 1);
        used += len + 1;
        names[k++] = at;
        if(out)
            json_array_append(out, t);
    }
    if(tmpl)
        *tmpl = out;
    return k;
}

/* The reason of the claim's Ready condition, or NULL. */
/* Field `field` ("reason", "message") of the claim's Ready condition. */
static const char *ready_field(const json_t *claim, const char *field)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(json_object_get(claim, "status"), "conditions"), i, c)
    {
        const char *t = json_string_value(json_object_get(c, "type"));
        if(t && strcmp(t, "Ready") == 0)
            return json_string_value(json_object_get(c, field));
    }
    return NULL;
}

int placement_read_claim(const json_t *obj, int restore, binder_claim_status *out)
{
    const char *ns = kobject_meta_str(obj, "namespace"), *name = kobject_meta_str(obj, "name");
    const json_t *spec = json_object_get(obj, "spec"), *status = json_object_get(obj, "status");
    const char *cls = json_string_value(json_object_get(spec, "class"));
    json_int_t count = json_integer_value(json_object_get(spec, "count"));
    if(!ns || !name || !cls || count < 1 || count > BINDER_MAX_UNITS)
        return -1;
    const json_t *labels = json_object_get(json_object_get(obj, "metadata"), "labels");
    int tmpl = json_object_get(labels, PLACEMENT_READ_TEMPLATE_LABEL) != NULL;
    *out = (binder_claim_status){.ns = ns, .name = name, .class_name = cls, .count = (uint32_t)count,
                                 .template_claim = tmpl, .phase = BINDER_PENDING, .message = ""};
    if(restore) {
        const char *ph = json_string_value(json_object_get(status, "phase"));
        if(ph)
            binder_phase_parse(ph, &out->phase);
        out->node = json_string_value(json_object_get(status, "node"));
        out->attached_to = json_string_value(json_object_get(status, "attachedTo"));
        const char *rs = ready_field(obj, "reason"), *msg = ready_field(obj, "message");
        if(rs)
            binder_reason_parse(rs, &out->reason);
        if(msg)
            out->message = msg; /* a new leader keeps what the API says (no rewrite of an unchanged claim) */
        if((out->phase == BINDER_BOUND || out->phase == BINDER_ATTACHED) && !out->node)
            out->phase = BINDER_PENDING; /* a status no binder writes: start over */
    }
    return 0;
}

int placement_read_claim_in_use(const binder_state *st, const char *ns, const char *name)
{
    binder_claim_status c;
    if(binder_state_claim_get(st, ns, name, &c) != BINDER_OK)
        return 0;
    if(c.phase == BINDER_ATTACHED || (c.phase == BINDER_LOST && c.node))
        return 1;
    const char *set = binder_state_claim_set(st, ns, name);
    binder_vmi_phase ph;
    /* as kubernetes.io/pvc-protection counts every pod not terminated: a
     * Pending VMI's launcher pod may already be pinned and scheduled */
    return c.phase == BINDER_BOUND && set && binder_state_set_get(st, ns, set, &ph, NULL) == BINDER_OK &&
           (ph == BINDER_VMI_PENDING || ph == BINDER_VMI_SCHEDULED || ph == BINDER_VMI_RUNNING);
}

/* Whether the claims VMI `vmi` names cover its GPU entries on `node`:
 * the VMI's own set (the binder took the annotation for this VMI, not for
 * another VM naming the same claims) exists, and every claim of it is
 * Bound or Attached on `node`, or Lost waiting for this VMI to end there
 * (WaitingForVMIEnd on a NotReady node: decision 0021 §1 keeps its units
 * booked on `node`), attached to nobody else, with at least as many units
 * as the VMI has entries. Otherwise its devices are in use on the node
 * with no claim booked for them (an annotation naming nothing, changed
 * after start, or claims held elsewhere: decision 0022). Counting the
 * units of a Lost-but-booked claim as raw use too would count them twice
 * and shrink the node's offer under its other holds (decision 0021). */
static int claims_cover(const binder_state *st, const json_t *vmi, const json_t *tmplset, const char *node,
                        long entries)
{
    const char *ns = kobject_meta_str(vmi, "namespace"), *name = kobject_meta_str(vmi, "name");
    char nb[8192];
    const char *names[BINDER_MAX_SET_CLAIMS];
    size_t k = placement_read_vmi_claims(vmi, tmplset, nb, sizeof nb, names, BINDER_MAX_SET_CLAIMS, NULL);
    if(!ns || !name || k == 0 || binder_state_set_get(st, ns, name, NULL, NULL) != BINDER_OK)
        return 0;
    long units = 0;
    for(size_t i = 0; i < k; i++) {
        binder_claim_status c;
        const char *owner = binder_state_claim_set(st, ns, names[i]);
        if(binder_state_claim_get(st, ns, names[i], &c) != BINDER_OK || !owner || strcmp(owner, name) != 0 ||
           (c.phase != BINDER_BOUND && c.phase != BINDER_ATTACHED &&
            !(c.phase == BINDER_LOST && c.reason == BINDER_R_WAITING_FOR_VMI_END)) ||
           !c.node || strcmp(c.node, node) != 0 ||
           (c.attached_to && strcmp(c.attached_to, name) != 0))
            return 0;
        units += c.count;
    }
    return units >= entries;
}

int placement_read_vmi_on_node(const json_t *vmi)
{
    binder_vmi_phase ph = placement_read_vmi_phase(vmi);
    const char *node = json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName"));
    return (ph == BINDER_VMI_RUNNING || ph == BINDER_VMI_SCHEDULED) && node;
}

json_t *placement_read_raw_units(const binder_state *st, const json_t *vmi, const json_t *tmplset)
{
    if(!placement_read_vmi_on_node(vmi))
        return NULL;
    const char *node = json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName"));
    json_t *used = json_object();
    long entries = vmi_units(vmi, used);
    if(json_object_size(used) == 0 || claims_cover(st, vmi, tmplset, node, entries)) {
        json_decref(used);
        return NULL;
    }
    return used;
}

cozy_result placement_read_node(engine *e, const json_t *node, const json_t *gpunode, const json_t *kubevirt,
                          const json_t *classes, const json_t *raw_used, placement_read_node_view *out, cozy_err *err)
{
    memset(out, 0, sizeof *out);
    out->spec.offers = out->offers;
    out->spec.taints = out->taints;
    lua_State *S = engine_lua(e);
    engine_push_runtime_fn(e, "node");
    const json_t *args[] = {node, gpunode, kubevirt, classes, raw_used};
    for(size_t i = 0; i < sizeof args / sizeof *args; i++) {
        if(args[i])
            luajson_push(S, args[i]);
        else
            lua_pushnil(S);
    }
    if(engine_call(e, 5, 1, 0, err) != ENGINE_ALLOWED)
        return COZY_ERR_POLICY;
    cozy_result rc = engine_to_json(e, -1, &out->view, err);
    lua_pop(S, 1);
    if(rc != COZY_OK)
        return rc;
    binder_node_spec *spec = &out->spec;
    const char *cls;
    json_t *u;
    json_object_foreach(json_object_get(out->view, "offers"), cls, u)
    {
        if(spec->n_offers < PLACEMENT_READ_MAX_OFFERS && json_integer_value(u) > 0)
            out->offers[spec->n_offers++] = (binder_offer){cls, (uint32_t)json_integer_value(u)};
    }
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(out->view, "taints"), i, t)
    {
        if(spec->n_taints < PLACEMENT_READ_MAX_TAINTS)
            out->taints[spec->n_taints++] = (binder_taint){json_string_value(json_object_get(t, "key")),
                                                           json_string_value(json_object_get(t, "value")),
                                                           json_string_value(json_object_get(t, "effect"))};
    }
    if(json_is_true(json_object_get(out->view, "ready")))
        spec->flags |= BINDER_NODE_READY;
    if(json_is_true(json_object_get(out->view, "schedulable")))
        spec->flags |= BINDER_NODE_SCHEDULABLE;
    if(json_is_true(json_object_get(out->view, "layout_pending")))
        spec->flags |= BINDER_NODE_LAYOUT_PENDING;
    return COZY_OK;
}

void placement_read_node_view_free(placement_read_node_view *v)
{
    json_decref(v->view);
    v->view = NULL;
}

int placement_read_template_claim_is(const json_t *c, const json_t *t, const char *uid)
{
    const json_t *labels = json_object_get(json_object_get(c, "metadata"), "labels");
    const char *tl = json_string_value(json_object_get(labels, PLACEMENT_READ_TEMPLATE_LABEL));
    const json_t *spec = json_object_get(c, "spec");
    const char *cls = json_string_value(json_object_get(spec, "class"));
    const char *want = json_string_value(json_object_get(t, "class"));
    if(!tl || strcmp(tl, "true") != 0 || !cls || !want || strcmp(cls, want) != 0 ||
       json_integer_value(json_object_get(spec, "count")) != json_integer_value(json_object_get(t, "count")))
        return 0;
    size_t j;
    json_t *r;
    json_array_foreach(json_object_get(json_object_get(c, "metadata"), "ownerReferences"), j, r)
    {
        const char *ruid = json_string_value(json_object_get(r, "uid"));
        if(json_is_true(json_object_get(r, "controller")) && ruid && uid && strcmp(ruid, uid) == 0)
            return 1;
    }
    return 0;
}

int placement_read_pv_nodes(const json_t *pv, json_t *out)
{
    const json_t *terms = json_object_get(
        json_object_get(json_object_get(json_object_get(pv, "spec"), "nodeAffinity"), "required"), "nodeSelectorTerms");
    int limited = 0;
    size_t i;
    json_t *term;
    json_array_foreach(terms, i, term)
    {
        static const char *const kinds[] = {"matchExpressions", "matchFields"};
        static const char *const keys[] = {"kubernetes.io/hostname", "metadata.name"};
        for(int k = 0; k < 2; k++) {
            size_t j;
            json_t *r;
            json_array_foreach(json_object_get(term, kinds[k]), j, r)
            {
                const char *key = json_string_value(json_object_get(r, "key"));
                const char *op = json_string_value(json_object_get(r, "operator"));
                if(!key || !op || strcmp(key, keys[k]) != 0 || strcmp(op, "In") != 0)
                    continue;
                size_t v;
                json_t *val;
                json_array_foreach(json_object_get(r, "values"), v, val)
                {
                    if(json_is_string(val))
                        json_object_set_new(out, json_string_value(val), json_true());
                }
                limited = 1;
            }
        }
    }
    return limited;
}

size_t placement_read_volume_nodes(const json_t *spec, placement_read_bound_pv_fn pv_of, void *ud, const char **nodes, size_t max,
                             json_t **keep)
{
    json_t *allowed = NULL;
    size_t i;
    json_t *vol;
    *keep = NULL;
    json_array_foreach(json_object_get(spec, "volumes"), i, vol)
    {
        const char *pvc = json_string_value(json_object_get(json_object_get(vol, "persistentVolumeClaim"), "claimName"));
        if(!pvc)
            pvc = json_string_value(json_object_get(json_object_get(vol, "dataVolume"), "name"));
        if(!pvc)
            continue;
        json_t *pv = pv_of(ud, pvc);
        json_t *these = json_object();
        if(pv && these && placement_read_pv_nodes(pv, these)) {
            if(!allowed)
                allowed = json_incref(these);
            else {
                const char *k;
                json_t *v, *tmp;
                json_object_foreach_safe(allowed, tmp, k, v)
                {
                    if(!json_object_get(these, k))
                        json_object_del(allowed, k);
                }
            }
        }
        json_decref(these);
        json_decref(pv);
    }
    size_t n = 0;
    if(allowed) {
        const char *k;
        json_t *v;
        json_object_foreach(allowed, k, v)
        {
            if(n < max)
                nodes[n++] = k;
        }
        if(n == 0 && max > 0)
            nodes[n++] = PLACEMENT_READ_NO_NODE; /* no Node has this name */
    }
    *keep = allowed;
    return n;
}
