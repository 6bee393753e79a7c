/* sets.c — a VM's or VMI's claims as one set (internal.h, pl_): which
 * claims a VMI or a stopped VM holds (decision 0019, 0021 §6), the
 * template claims a class-referencing VMI gets (decision 0027), a set's
 * volume nodes (DESIGN.md §6, WaitForFirstConsumer) and the units a
 * running VMI uses that no claim covers (raw-name use, decision 0022).
 */
#include "placement/internal.h"

#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/luajson.h"
#include "format/kobject.h"
#include "placement/read.h"

json_t *pl_template_set(placement *L, const json_t *vmi)
{
    if(!placement_read_vmi_uses_classes(vmi))
        return NULL;
    const char *ns = kobject_meta_str(vmi, "namespace"), *name = kobject_meta_str(vmi, "name");
    const char *uid = kobject_meta_str(vmi, "uid");
    json_int_t gen = json_integer_value(json_object_get(json_object_get(vmi, "metadata"), "generation"));
    char key[600];
    if(!name || snprintf(key, sizeof key, "%s/%s", ns ? ns : "", name) >= (int)sizeof key)
        return NULL;
    const json_t *had = json_object_get(L->tmpl_sets, key);
    const char *had_uid = json_string_value(json_object_get(had, "uid"));
    if(had && ((!uid && !had_uid) || (uid && had_uid && strcmp(uid, had_uid) == 0)) &&
       json_integer_value(json_object_get(had, "generation")) == gen) {
        json_t *kept = json_object_get(had, "set");
        return json_is_array(kept) ? json_incref(kept) : NULL;
    }
    json_t *classes = pl_list(L, PLACEMENT_CLASS), *kv = pl_first_kubevirt(L);
    lua_State *S = engine_lua(L->e);
    engine_push_runtime_fn(L->e, "template_claims");
    luajson_push(S, vmi);
    luajson_push(S, classes);
    if(kv)
        luajson_push(S, kv);
    else
        lua_pushnil(S);
    if(L->settings)
        luajson_push(S, L->settings);
    else
        lua_pushnil(S);
    json_decref(classes);
    json_decref(kv);
    cozy_err err;
    json_t *out = NULL, *set = NULL;
    if(engine_call(L->e, 4, 1, 0, &err) != ENGINE_ALLOWED || engine_to_json(L->e, -1, &out, &err) != COZY_OK) {
        log_write(LOG_ERROR, "binder", "runtime.binder.template_claims failed; the VMI gets no template claims now",
                  "namespace", ns, "vmi", name, "error", err.msg, NULL);
        json_decref(out);
        lua_settop(S, 0);
        return NULL; /* not remembered: asked again at its next event */
    }
    lua_settop(S, 0);
    const json_t *pr = json_array_get(json_object_get(out, "problems"), 0);
    if(pr)
        /* admission refuses such a VMI (cozygpu.claims.template_names);
         * one admitted before a class or the KubeVirt CR changed gets no
         * template claims now (decision 0043) */
        log_write(LOG_WARN, "binder", "a VMI's template claims cannot be formed; it gets none", "namespace", ns,
                  "vmi", name, "field", json_string_value(json_object_get(pr, "field")), "error",
                  json_string_value(json_object_get(pr, "message")), NULL);
    set = json_incref(json_object_get(out, "claims"));
    if(json_array_size(set) == 0) {
        json_decref(set);
        set = NULL;
    }
    json_t *entry = json_pack("{s:s?, s:I, s:O?}", "uid", uid, "generation", gen, "set", set);
    if(entry)
        json_object_set_new(L->tmpl_sets, key, entry);
    json_decref(out);
    return set;
}

/* The claims VMI `vmi` holds (placement_read_vmi_claims with its
 * template set, computed only for a VMI with template claims). */
size_t pl_vmi_claims(placement *L, const json_t *vmi, char *buf, size_t n, const char **names, size_t max, json_t **tmpl)
{
    json_t *set = pl_template_set(L, vmi);
    size_t k = placement_read_vmi_claims(vmi, set, buf, n, names, max, tmpl);
    json_decref(set);
    return k;
}

/* The VMI's units on its node that no claim covers (placement_read_raw_units
 * over the state and its template set). NULL when none. */
static json_t *raw_units(placement *L, const json_t *vmi)
{
    if(!placement_read_vmi_on_node(vmi))
        return NULL;
    json_t *set = pl_template_set(L, vmi);
    json_t *used = placement_read_raw_units(L->st, vmi, set);
    json_decref(set);
    return used;
}

static void raw_node_add(placement *L, const char *node, const json_t *used, int sign)
{
    json_t *per = json_object_get(L->raw_by_node, node);
    if(!per) {
        per = json_object();
        json_object_set_new(L->raw_by_node, node, per);
    }
    const char *rn;
    json_t *u;
    json_object_foreach((json_t *)used, rn, u)
    {
        json_int_t v = json_integer_value(json_object_get(per, rn)) + sign * json_integer_value(u);
        if(v > 0)
            json_object_set_new(per, rn, json_integer(v));
        else
            json_object_del(per, rn);
    }
    if(json_object_size(per) == 0)
        json_object_del(L->raw_by_node, node);
}

/* Updates the raw-name use of VMI `key` (ns/name). Returns the nodes whose
 * use changed into changed[0..1] (NULL when none). */
void pl_raw_update(placement *L, const char *key, const json_t *vmi, const char **changed_a, const char **changed_b,
                       char *buf_a, char *buf_b, size_t n)
{
    *changed_a = *changed_b = NULL;
    pl_raw_use *r;
    HASH_FIND_STR(L->raw, key, r);
    json_t *used = vmi ? raw_units(L, vmi) : NULL;
    const char *node = vmi ? json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName")) : NULL;
    if(used && !node) {
        json_decref(used);
        used = NULL;
    }
    if(r && used && strcmp(r->node, node) == 0 && json_equal(r->used, used)) {
        json_decref(used);
        return;
    }
    if(!r && !used)
        return;
    L->view_dirty = 1;
    if(r) {
        raw_node_add(L, r->node, r->used, -1);
        snprintf(buf_a, n, "%s", r->node);
        *changed_a = buf_a;
        HASH_DEL(L->raw, r);
        free(r->key);
        free(r->node);
        json_decref(r->used);
        free(r);
    }
    if(used) {
        char m[300] = "";
        size_t w = 0;
        const char *rn;
        json_t *u;
        json_object_foreach(used, rn, u)
        {
            if(w < sizeof m)
                w += (size_t)snprintf(m + w, sizeof m - w, "%s%lld %s", w ? ", " : "",
                                      (long long)json_integer_value(u), rn);
        }
        pl_explain(L, "VMI %s uses GPUs on %s that no claim of it covers: they are taken from what %s offers (%s)", key,
                   node, node, m);
    }
    if(used) {
        r = calloc(1, sizeof *r);
        if(!r || !(r->key = strdup(key)) || !(r->node = strdup(node))) {
            if(r)
                free(r->key);
            free(r);
            json_decref(used);
            return;
        }
        r->used = used;
        HASH_ADD_KEYPTR(hh, L->raw, r->key, strlen(r->key), r);
        raw_node_add(L, node, used, +1);
        snprintf(buf_b, n, "%s", node);
        *changed_b = buf_b;
    }
}

/* What a template VMI's claims need (decision 0027):
 * while the VMI is not final, each of `tmpl` ([{name, class, count}]) that
 * the cache does not hold is queued for creation — labelled a template
 * claim, owned by the VMI (controller ownerReference: garbage collection
 * removes it with the VMI), protected by the finalizer; once the VMI is
 * final (Succeeded, Failed), each that exists is queued for deletion (it
 * then goes once nothing uses it). */
static void template_claims(placement *L, const json_t *vmi, const json_t *tmpl, binder_vmi_phase phase)
{
    const char *ns = kobject_meta_str(vmi, "namespace"), *vname = kobject_meta_str(vmi, "name"), *uid = kobject_meta_str(vmi, "uid");
    if(!ns || !vname || !uid)
        return;
    int final = phase == BINDER_VMI_SUCCEEDED || phase == BINDER_VMI_FAILED;
    size_t i;
    json_t *t;
    json_array_foreach(tmpl, i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        char key[600];
        snprintf(key, sizeof key, "%s/%s", ns, name);
        json_t *have = pl_get(L, PLACEMENT_CLAIM, ns, name);
        if(final) {
            json_object_del(L->creates, key);
            /* only this VMI's own claim goes, and only that object (its
             * uid as a precondition): a tenant's claim of the name, or a
             * later VMI's, is never deleted */
            const char *cuid = have ? kobject_meta_str(have, "uid") : NULL;
            if(have && cuid && !kobject_meta_str(have, "deletionTimestamp") && placement_read_template_claim_is(have, t, uid))
                json_object_set_new(L->tdeletes, key, json_string(cuid));
        } else if(!have && !kobject_meta_str(vmi, "deletionTimestamp")) {
            json_object_set_new(
                L->creates, key,
                json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s}, s:{s:s}, s:[{s:s, s:s, s:s, s:s, s:b, s:b}], s:[s]},"
                          " s:{s:s, s:O}}",
                          "apiVersion", "cozystack.io/v1alpha1", "kind", "GPUClaim", "metadata", "name", name,
                          "namespace", ns, "labels", PLACEMENT_READ_TEMPLATE_LABEL, "true", "annotations", "gpu.cozystack.io/vmi",
                          vname, "ownerReferences", "apiVersion", "kubevirt.io/v1", "kind", "VirtualMachineInstance",
                          "name", vname, "uid", uid, "controller", 1, "blockOwnerDeletion", 1, "finalizers",
                          PL_PROTECTION, "spec", "class", json_string_value(json_object_get(t, "class")), "count",
                          json_object_get(t, "count")));
        }
        json_decref(have);
    }
}

/* Whether every template claim of `tmpl` the cache holds is this VMI's:
 * labelled a template claim, its controller ownerReference naming the
 * VMI's uid, of the class and count the VMI's entries ask (decision 0027;
 * the launcher webhook checks the same before it pins). A claim not
 * created yet counts as ours (it will be). */
static int template_claims_ours(placement *L, const json_t *vmi, const json_t *tmpl, int final)
{
    const char *ns = kobject_meta_str(vmi, "namespace"), *uid = kobject_meta_str(vmi, "uid");
    size_t i;
    json_t *t;
    int all = 1;
    json_array_foreach(tmpl, i, t)
    {
        const char *cn = json_string_value(json_object_get(t, "name"));
        json_t *c = pl_get(L, PLACEMENT_CLAIM, ns, cn);
        int ok = !c || placement_read_template_claim_is(c, t, uid);
        json_decref(c);
        if(!ok)
            pl_explain(L,
                       "GPUClaim %s/%s is not VMI %s/%s's own template claim (no template label, another owner uid, "
                       "class or count; decision 0027): %s",
                       ns, cn, ns, kobject_meta_str(vmi, "name"),
                       final ? "kept, though the VMI is final" : "never taken over, the VMI's set waits");
        all &= ok;
    }
    return all;
}

/* placement_read_volume_nodes' lookup for the leader: PVC `pvc` of the set
 * being read is remembered against it (so that a PVC or PV change looks
 * at the set again), and its bound PV comes from the informers. */
typedef struct pv_lookup {
    placement *L;
    const char *ns;
    const char *setkey;
} pv_lookup;

static json_t *bound_pv(void *ud, const char *pvc)
{
    pv_lookup *q = ud;
    char pk[600];
    snprintf(pk, sizeof pk, "%s/%s", q->ns, pvc);
    json_t *users = json_object_get(q->L->pvc_sets, pk);
    if(!users) {
        users = json_object();
        json_object_set_new(q->L->pvc_sets, pk, users);
    }
    json_object_set_new(users, q->setkey, json_true());
    json_t *claim = pl_get(q->L, PLACEMENT_PVC, q->ns, pvc);
    const char *pvname = json_string_value(json_object_get(json_object_get(claim, "spec"), "volumeName"));
    json_t *pv = pvname ? pl_get(q->L, PLACEMENT_PV, NULL, pvname) : NULL;
    json_decref(claim);
    return pv;
}

/* DESIGN.md §6: "a set placed after a WaitForFirstConsumer volume bound is
 * limited to the nodes the volume's node affinity allows". The nodes the
 * volumes of `spec` (the VMI's, or the stopped VM's template's) allow,
 * read by placement_read_volume_nodes over the PVC and PV informers, limit set
 * ns/name (no such volume: no limit; volumes that disagree: no node, the
 * set waits). The PVCs are remembered against the set so that a PVC or PV
 * change looks at it again. */
static void volume_nodes(placement *L, const char *ns, const char *name, const json_t *spec)
{
    char setkey[600];
    snprintf(setkey, sizeof setkey, "%s/%s", ns, name);
    pv_lookup q = {L, ns, setkey};
    const char *nodes[BINDER_MAX_SET_NODES];
    json_t *keep = NULL;
    size_t n = placement_read_volume_nodes(spec, bound_pv, &q, nodes, BINDER_MAX_SET_NODES, &keep);
    cozy_err err;
    if(n) {
        char m[600] = "";
        size_t used = 0;
        for(size_t i = 0; i < n && used < sizeof m; i++)
            used += (size_t)snprintf(m + used, sizeof m - used, "%s%s", i ? ", " : "", nodes[i]);
        pl_explain(L, "VM %s/%s: its bound volumes allow only %s (DESIGN.md §6)", ns, name, m);
    }
    if(binder_state_set_nodes(L->st, ns, name, nodes, n, &err) != BINDER_OK)
        log_write(LOG_WARN, "binder", "cannot limit the VM's claims to its volume's nodes", "namespace", ns, "vm", name,
                  "error", err.msg, NULL);
    json_decref(keep);
}

/* Set ns/name from the caches: the VMI's annotation, phase and node when a
 * VMI exists, else the VM's template annotation (a stopped VM still holds
 * its claims on one node, DESIGN.md §6). No claims named: no set. A set
 * naming a claim not known yet waits in waiting_sets. */
void pl_apply_set(placement *L, const char *ns, const char *name)
{
    json_t *vmi = pl_get(L, PLACEMENT_VMI, ns, name);
    json_t *vm = pl_get(L, PLACEMENT_VM, ns, name);
    const char *ann = NULL;
    binder_vmi_phase phase = BINDER_VMI_NONE;
    const char *node = NULL;
    if(vmi) {
        ann = kobject_annotation(vmi, PL_CLAIMS_ANNOTATION);
        phase = placement_read_vmi_phase(vmi);
        if(phase != BINDER_VMI_PENDING)
            node = json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName"));
        if(phase == BINDER_VMI_SCHEDULED || phase == BINDER_VMI_RUNNING) {
            if(!node)
                phase = BINDER_VMI_PENDING;
        }
    } else if(vm) {
        ann = kobject_annotation(json_object_get(json_object_get(vm, "spec"), "template"), PL_CLAIMS_ANNOTATION);
    }
    char buf[8192];
    const char *names[BINDER_MAX_SET_CLAIMS];
    json_t *tmpl = NULL;
    size_t n = vmi ? pl_vmi_claims(L, vmi, buf, sizeof buf, names, BINDER_MAX_SET_CLAIMS, &tmpl)
                   : placement_read_claim_names(ann, buf, sizeof buf, names, BINDER_MAX_SET_CLAIMS);
    int not_ours = 0;
    if(tmpl) {
        template_claims(L, vmi, tmpl, phase);
        not_ours = !template_claims_ours(L, vmi, tmpl,
                                         phase == BINDER_VMI_SUCCEEDED || phase == BINDER_VMI_FAILED);
        const char *fnode = json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName"));
        if(phase == BINDER_VMI_FAILED && fnode) {
            /* remembered against the VM (its VMIs share its name), so that
             * its next VMI's template set tries elsewhere */
            if(placement_policy_refuse(L->refused, ns, name, fnode))
                log_write(LOG_INFO, "binder", "a template VMI failed on a node; its VM's next claims go elsewhere",
                          "namespace", ns, "vm", name, "node", fnode, NULL);
        }
    }
    json_decref(tmpl);
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    keyset *w;
    HASH_FIND_STR(L->waiting_sets, key, w);
    if(w) {
        HASH_DEL(L->waiting_sets, w);
        free(w->key);
        free(w);
    }
    cozy_err err;
    if(!vmi && !vm)
        json_object_del(L->refused, key); /* the VM is gone: what it failed on is forgotten */
    if(n == 0) {
        binder_state_set_delete(L->st, ns, name, NULL);
    } else if(not_ours) {
        /* a claim of a template name that this VMI does not own (a claim
         * left by an earlier VMI of the name, or a tenant's own claim of
         * that name): never taken over (decision 0027); the set waits,
         * and is tried again when claims change */
        binder_state_set_delete(L->st, ns, name, NULL);
        keyset_add(&L->waiting_sets, key);
    } else {
        binder_rc rc = binder_state_set_put(L->st, ns, name, names, n, phase, node, &err);
        if(rc == BINDER_ERR_BOUND && phase != BINDER_VMI_NONE && phase != BINDER_VMI_SUCCEEDED &&
           phase != BINDER_VMI_FAILED) {
            /* A live VMI names claims a stopped VM's template names too
             * (admission checks only live VMIs, decision 0019): the claims
             * go with the VMI that runs, the stopped VM's set waits until
             * they are free again. A live owner keeps them. A stopped VM
             * whose last VMI ended (Succeeded or Failed) and is still
             * there, as KubeVirt keeps it, is as stopped as one with no
             * VMI: its set carries the final phase (decision 0021 §6), so
             * it gives them up too (decision 0026; before, the live
             * VMI's claims went Lost, and a new leader kept its launcher
             * pod gated). One lookup per claim the VMI names. */
            int moved = 0;
            for(size_t i = 0; i < n; i++) {
                const char *owner = binder_state_claim_set(L->st, ns, names[i]);
                binder_vmi_phase oph;
                if(owner && strcmp(owner, name) != 0 &&
                   binder_state_set_get(L->st, ns, owner, &oph, NULL) == BINDER_OK &&
                   (oph == BINDER_VMI_NONE || oph == BINDER_VMI_SUCCEEDED || oph == BINDER_VMI_FAILED)) {
                    char ok[600];
                    snprintf(ok, sizeof ok, "%s/%s", ns, owner);
                    binder_state_set_delete(L->st, ns, owner, NULL);
                    keyset_add(&L->waiting_sets, ok);
                    moved = 1;
                }
            }
            if(moved)
                rc = binder_state_set_put(L->st, ns, name, names, n, phase, node, &err);
        }
        if(rc == BINDER_ERR_NO_CLAIM || rc == BINDER_ERR_BOUND)
            keyset_add(&L->waiting_sets, key); /* a claim not seen yet, or still another set's */
        else if(rc != BINDER_OK)
            log_write(LOG_WARN, "binder", "cannot take the VM's claims", "namespace", ns, "vm", name, "error", err.msg,
                      NULL);
        else
            volume_nodes(L, ns, name, vmi ? json_object_get(vmi, "spec")
                                          : json_object_get(json_object_get(json_object_get(vm, "spec"), "template"),
                                                            "spec"));
    }
    json_decref(vmi);
    json_decref(vm);
}

void pl_raw_clear(placement *L)
{
    pl_raw_use *r, *rt;
    HASH_ITER(hh, L->raw, r, rt)
    {
        HASH_DEL(L->raw, r);
        free(r->key);
        free(r->node);
        json_decref(r->used);
        free(r);
    }
}
