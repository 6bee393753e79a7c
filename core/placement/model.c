/* model.c — the placement model's state from objects (placement.h):
 * building it as a new leader does, one batch of changed keys, passes.
 * Rules: DESIGN.md §3, §6; docs/decisions/0020 §1 (restore from status),
 * 0022 (node capacity), 0023 (incremental passes), 0026 (the loop), 0037
 * (class protection).
 */
#include "placement/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "format/kobject.h"
#include "placement/read.h"

const char *const placement_api_version[PLACEMENT_KINDS] = {
    [PLACEMENT_CLASS] = "cozystack.io/v1alpha1", [PLACEMENT_NODE] = "v1",
    [PLACEMENT_GPUNODE] = "cozystack.io/v1alpha1", [PLACEMENT_CLAIM] = "cozystack.io/v1alpha1",
    [PLACEMENT_VM] = "kubevirt.io/v1", [PLACEMENT_VMI] = "kubevirt.io/v1", [PLACEMENT_POD] = "v1",
    [PLACEMENT_KUBEVIRT] = "kubevirt.io/v1", [PLACEMENT_NAMESPACE] = "v1", [PLACEMENT_QUOTA] = "v1",
    [PLACEMENT_PVC] = "v1", [PLACEMENT_PV] = "v1",
};
const char *const placement_kind_name[PLACEMENT_KINDS] = {
    [PLACEMENT_CLASS] = "GPUClass", [PLACEMENT_NODE] = "Node", [PLACEMENT_GPUNODE] = "GPUNode",
    [PLACEMENT_CLAIM] = "GPUClaim", [PLACEMENT_VM] = "VirtualMachine", [PLACEMENT_VMI] = "VirtualMachineInstance",
    [PLACEMENT_POD] = "Pod", [PLACEMENT_KUBEVIRT] = "KubeVirt", [PLACEMENT_NAMESPACE] = "Namespace",
    [PLACEMENT_QUOTA] = "ResourceQuota", [PLACEMENT_PVC] = "PersistentVolumeClaim",
    [PLACEMENT_PV] = "PersistentVolume",
};
static const char key_letters[PLACEMENT_KINDS] = {
    [PLACEMENT_CLASS] = PL_K_CLASS, [PLACEMENT_NODE] = PL_K_NODE, [PLACEMENT_GPUNODE] = PL_K_GPUNODE,
    [PLACEMENT_CLAIM] = PL_K_CLAIM, [PLACEMENT_VM] = PL_K_VM, [PLACEMENT_VMI] = PL_K_VMI, [PLACEMENT_POD] = PL_K_POD,
    [PLACEMENT_KUBEVIRT] = PL_K_KUBEVIRT, [PLACEMENT_NAMESPACE] = PL_K_NAMESPACE, [PLACEMENT_QUOTA] = PL_K_QUOTA,
    [PLACEMENT_PVC] = PL_K_PVC, [PLACEMENT_PV] = PL_K_PV,
};

char placement_key_kind(placement_kind k)
{
    return k < PLACEMENT_KINDS ? key_letters[k] : '?';
}

char *placement_key_of(placement_kind k, const json_t *obj, char *buf, size_t n)
{
    const char *ns = kobject_meta_str(obj, "namespace"), *name = kobject_meta_str(obj, "name");
    if(!name)
        return NULL;
    int w = snprintf(buf, n, "%c:%s/%s", placement_key_kind(k), ns ? ns : "", name);
    return w >= 0 && (size_t)w < n ? buf : NULL;
}

json_t *pl_get(placement *L, placement_kind k, const char *ns, const char *name)
{
    return name ? L->io.get(L->io.ud, k, ns, name) : NULL;
}

json_t *pl_list(placement *L, placement_kind k)
{
    json_t *a = L->io.list(L->io.ud, k);
    return a ? a : json_array();
}

int pl_leading(placement *L)
{
    return L->io.leading(L->io.ud);
}

json_t *pl_first_kubevirt(placement *L)
{
    json_t *all = pl_list(L, PLACEMENT_KUBEVIRT);
    json_t *kv = json_incref(json_array_get(all, 0));
    json_decref(all);
    return kv;
}

json_t *pl_with_kind(json_t *obj, placement_kind k)
{
    return kobject_with_kind(obj, placement_api_version[k], placement_kind_name[k]);
}

/* Node `name` (cached) into the state: its capacity per class and flags
 * from runtime.binder.node, or deleted when the cache has no such Node. A
 * node the Lua side cannot read offers nothing (logged). */
void pl_apply_node(placement *L, const char *name, const json_t *classes, const json_t *kubevirt)
{
    cozy_err err;
    json_t *node = pl_get(L, PLACEMENT_NODE, NULL, name);
    if(!node) {
        binder_state_node_delete(L->st, name, NULL);
        return;
    }
    json_t *gpunode = pl_get(L, PLACEMENT_GPUNODE, NULL, name);
    placement_read_node_view v;
    if(placement_read_node(L->e, node, gpunode, kubevirt, classes, json_object_get(L->raw_by_node, name), &v, &err) !=
       COZY_OK)
        log_write(LOG_WARN, "binder", "cannot read the node's capacity; it offers nothing", "node", name, "error",
                  err.msg, NULL);
    if(binder_state_node_set(L->st, name, &v.spec, &err) != BINDER_OK)
        log_write(LOG_WARN, "binder", "cannot take the node", "node", name, "error", err.msg, NULL);
    placement_read_node_view_free(&v);
    json_decref(gpunode);
    json_decref(node);
}

static void apply_all_nodes(placement *L, const json_t *classes)
{
    json_t *kv = pl_first_kubevirt(L);
    json_t *nodes = pl_list(L, PLACEMENT_NODE);
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n)
    {
        const char *name = kobject_meta_str(n, "name");
        if(name)
            pl_apply_node(L, name, classes, kv);
    }
    json_decref(nodes);
    json_decref(kv);
}

/* Class `name` (cached) into the state, or deleted when the cache has no
 * such class. Returns 1 when what nodes offer may have changed (the class
 * came, went, or its spec or deletionTimestamp changed), 0 when only its
 * status or other metadata did: the leader's own status writes come back
 * through the watch, and each must not cost a walk of every node and claim. */
static int apply_class(placement *L, const char *name)
{
    json_t *c = pl_get(L, PLACEMENT_CLASS, NULL, name);
    cozy_err err;
    if(!c) {
        binder_state_class_delete(L->st, name, NULL);
        int had = json_object_get(L->class_specs, name) != NULL;
        json_object_del(L->class_specs, name);
        return had;
    }
    json_t *seen = json_pack("{s:O?, s:b}", "spec", json_object_get(c, "spec"), "deleting",
                             kobject_meta_str(c, "deletionTimestamp") != NULL);
    int changed = !seen || !json_equal(seen, json_object_get(L->class_specs, name));
    if(seen)
        json_object_set_new(L->class_specs, name, seen);
    keyset_add(&L->class_fin, name); /* its protection finalizer looked at (decision 0037) */
    const json_t *spec = json_object_get(c, "spec");
    const char *oc = json_string_value(json_object_get(spec, "onCordon"));
    binder_toleration tols[32];
    size_t n = 0, i;
    json_t *t;
    if(json_array_size(json_object_get(spec, "tolerations")) > 32) /* the CRD allows 16 */
        log_write(LOG_WARN, "binder", "a class with more than 32 tolerations: the binder reads the first 32",
                  "gpuclass", name, NULL);
    json_array_foreach(json_object_get(spec, "tolerations"), i, t)
    {
        if(n < 32)
            tols[n++] = (binder_toleration){json_string_value(json_object_get(t, "key")),
                                            json_string_value(json_object_get(t, "operator")),
                                            json_string_value(json_object_get(t, "value")),
                                            json_string_value(json_object_get(t, "effect"))};
    }
    int deleting = kobject_meta_str(c, "deletionTimestamp") != NULL;
    if(binder_state_class_set(L->st, name, oc && strcmp(oc, "Stay") == 0 ? BINDER_CORDON_STAY : BINDER_CORDON_MOVE,
                              deleting, tols, n, &err) != BINDER_OK)
        log_write(LOG_WARN, "binder", "cannot take the class", "gpuclass", name, "error", err.msg, NULL);
    json_decref(c);
    return changed;
}

/* Counts claim `key` ("ns/name") under the class `obj` names (obj: the
 * cached or listed claim; NULL when it is gone): L->claim_class and
 * L->class_claims follow it, one claim at a time (no walk of the claims).
 * A class whose count falls to 0 is queued for its protection finalizer
 * (decision 0037). A claim without a string spec.class counts nowhere. */
static void count_claim(placement *L, const char *key, const json_t *obj)
{
    const char *had = json_string_value(json_object_get(L->claim_class, key));
    const char *now = obj ? json_string_value(json_object_get(json_object_get(obj, "spec"), "class")) : NULL;
    if(had && now && strcmp(had, now) == 0)
        return;
    if(had) {
        json_int_t n = json_integer_value(json_object_get(L->class_claims, had)) - 1;
        if(n > 0)
            json_object_set_new(L->class_claims, had, json_integer(n));
        else {
            json_object_del(L->class_claims, had);
            keyset_add(&L->class_fin, had);
        }
        json_object_del(L->claim_class, key); /* `had` is freed here */
    }
    if(now && *now) {
        json_object_set_new(L->class_claims, now,
                            json_integer(json_integer_value(json_object_get(L->class_claims, now)) + 1));
        json_object_set_new(L->claim_class, key, json_string(now));
    }
}

/* Queues what the protection finalizer of claim `obj` needs: added while
 * it is not being deleted, looked at (removed once unused) while it is. */
static void watch_protection(placement *L, const json_t *obj, const char *key)
{
    if(kobject_meta_str(obj, "deletionTimestamp")) {
        if(kobject_has_finalizer(obj, PL_PROTECTION))
            keyset_add(&L->deleting, key);
    } else if(!kobject_has_finalizer(obj, PL_PROTECTION))
        keyset_add(&L->protect, key);
}

/* A cached claim into the state: restored from its status when
 * `restore` (a new leader), else added Pending. */
static void take_claim(placement *L, const json_t *obj, int restore)
{
    const char *ns = kobject_meta_str(obj, "namespace"), *name = kobject_meta_str(obj, "name");
    cozy_err err;
    binder_claim_status s;
    if(placement_read_claim(obj, restore, &s)) {
        log_write(LOG_WARN, "binder", "a GPUClaim without a usable spec.class and spec.count is ignored", "namespace",
                  ns ? ns : "", "gpuclaim", name ? name : "", NULL);
        return;
    }
    if(binder_state_claim_put(L->st, &s, &err) != BINDER_OK) {
        log_write(LOG_WARN, "binder", "cannot take the claim", "namespace", ns, "gpuclaim", name, "error", err.msg,
                  NULL);
        return;
    }
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    const char *uid = kobject_meta_str(obj, "uid");
    json_object_set_new(L->uids, key, json_string(uid ? uid : ""));
    watch_protection(L, obj, key);
}

/* Empties the state and every queue (what a new build starts from). */
static void model_clear(placement *L)
{
    placement_policy_free(&L->bp);
    memset(&L->bp, 0, sizeof L->bp);
    binder_state_free(L->st);
    L->st = NULL;
    keyset_free(&L->writes);
    keyset_free(&L->deletes);
    keyset_free(&L->waiting_sets);
    keyset_free(&L->gated);
    keyset_free(&L->recheck);
    keyset_free(&L->protect);
    keyset_free(&L->deleting);
    keyset_free(&L->class_fin);
    json_object_clear(L->claim_class);
    json_object_clear(L->class_claims);
    json_object_clear(L->class_fin_failed);
    json_object_clear(L->creates);
    json_object_clear(L->tdeletes);
    json_object_clear(L->pvc_sets);
    json_object_clear(L->uids);
    pl_raw_clear(L);
    json_object_clear(L->raw_by_node);
    json_object_clear(L->class_sent);
    json_object_clear(L->class_names);
    json_object_clear(L->class_specs);
    json_object_clear(L->tmpl_sets);
    json_object_clear(L->refused);
    L->class_pending = 0;
    L->more = 0;
}

placement *placement_new(const placement_io *io, engine *runtime, const json_t *settings)
{
    placement *L = calloc(1, sizeof *L);
    if(!L)
        return NULL;
    L->io = *io;
    L->e = runtime;
    L->settings = settings;
    json_t **objs[] = {&L->raw_by_node, &L->uids,       &L->creates,     &L->refused,     &L->pvc_sets,
                       &L->tdeletes,    &L->class_sent, &L->class_names, &L->class_specs, &L->claim_class,
                       &L->class_claims, &L->class_fin_failed, &L->tmpl_sets};
    for(size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        if(!(*objs[i] = json_object())) {
            placement_free(L);
            return NULL;
        }
    L->hooks = pl_hooks(L);
    return L;
}

void placement_free(placement *L)
{
    if(!L)
        return;
    model_clear(L);
    /* only the leader's view of capacity is exported (a follower's would
     * be stale and double any sum across replicas) */
    pl_class_gauges_clear();
    json_t *objs[] = {L->raw_by_node, L->uids,       L->creates,     L->refused,     L->pvc_sets,
                      L->tdeletes,    L->class_sent, L->class_names, L->class_specs, L->claim_class,
                      L->class_claims, L->class_fin_failed, L->tmpl_sets};
    for(size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        json_decref(objs[i]);
    free(L);
}

const binder_state *placement_state(const placement *L)
{
    return L->st;
}

unsigned long placement_choose_calls(const placement *L)
{
    return L->choose_calls;
}

int placement_more(const placement *L)
{
    return L->more;
}

long placement_class_wait_ms(const placement *L)
{
    if(!L->class_pending)
        return -1;
    long long left = L->class_next_ms - clock_mono_ms();
    return left < 0 ? 0 : (long)left;
}

/* qsort: claims by metadata.creationTimestamp (RFC 3339 with whole
 * seconds, which sorts as text), then namespace, then name. */
static int by_creation(const void *a, const void *b)
{
    const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    static const char *const fields[] = {"creationTimestamp", "namespace", "name"};
    for(size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        const char *p = kobject_meta_str(x, fields[i]), *q = kobject_meta_str(y, fields[i]);
        int c = strcmp(p ? p : "", q ? q : "");
        if(c)
            return c;
    }
    return 0;
}

int placement_build(placement *L)
{
    cozy_err err;
    model_clear(L);
    L->st = binder_state_new();
    if(!L->st)
        return -1;
    json_t *classes = pl_list(L, PLACEMENT_CLASS);
    size_t i;
    json_t *o;
    json_array_foreach(classes, i, o)
    {
        if(kobject_meta_str(o, "name"))
            apply_class(L, kobject_meta_str(o, "name"));
    }
    /* Claims from a fresh, consistent LIST, not the cache: the last
     * leader's last writes may not have reached this replica's watch yet,
     * and a status missed here would book its units twice (decision 0026). */
    long code = 0;
    json_t *list = NULL;
    if((code = L->io.list_claims(L->io.ud, &list, &err)) != 200) {
        log_write(LOG_WARN, "binder", "cannot list GPUClaims to take the lead; trying again", "error",
                  code ? json_string_value(json_object_get(list, "message")) : err.msg, NULL);
        json_decref(list);
        json_decref(classes);
        model_clear(L);
        return -1;
    }
    /* in the order they were ordered: the API lists by key (namespace,
     * then name), the binder places waiting claims in the order it took
     * them, and a new leader must not let a later order pass an earlier
     * one (metadata.creationTimestamp, whole seconds; ties by key) */
    json_t *items = json_object_get(list, "items");
    size_t n_items = json_array_size(items);
    json_t **sorted = n_items ? calloc(n_items, sizeof *sorted) : NULL;
    json_array_foreach(items, i, o) if(sorted) sorted[i] = o;
    if(sorted)
        qsort(sorted, n_items, sizeof *sorted, by_creation);
    for(i = 0; i < n_items; i++) {
        o = sorted ? sorted[i] : json_array_get(items, i);
        take_claim(L, o, 1);
        if(kobject_meta_str(o, "namespace") && kobject_meta_str(o, "name")) {
            char key[600];
            snprintf(key, sizeof key, "%s/%s", kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
            count_claim(L, key, o);
        }
        /* every claim is compared with what the API holds once (a status
         * no binder wrote, or the last leader's write that failed, is put
         * right even when this pass changes nothing for it) */
        if(kobject_meta_str(o, "namespace") && kobject_meta_str(o, "name")) {
            char key[600];
            snprintf(key, sizeof key, "%s/%s", kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
            keyset_add(&L->writes, key);
        }
    }
    free(sorted);
    json_decref(list);
    /* sets next (which VMI holds which claims), then raw-name use (a VMI
     * its claims do not cover), then what each node offers */
    json_t *vms = pl_list(L, PLACEMENT_VM);
    json_array_foreach(vms, i, o)
    {
        if(kobject_meta_str(o, "namespace") && kobject_meta_str(o, "name"))
            pl_apply_set(L, kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
    }
    json_decref(vms);
    json_t *vmis = pl_list(L, PLACEMENT_VMI);
    json_array_foreach(vmis, i, o)
    {
        if(kobject_meta_str(o, "namespace") && kobject_meta_str(o, "name"))
            pl_apply_set(L, kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
    }
    json_array_foreach(vmis, i, o)
    {
        const char *ns = kobject_meta_str(o, "namespace"), *name = kobject_meta_str(o, "name");
        if(!ns || !name)
            continue;
        char key[600], a[256], b[256];
        const char *ca, *cb;
        snprintf(key, sizeof key, "%s/%s", ns, name);
        pl_raw_update(L, key, o, &ca, &cb, a, b, sizeof a);
    }
    json_decref(vmis);
    apply_all_nodes(L, classes);
    json_decref(classes);
    json_t *pods = pl_list(L, PLACEMENT_POD);
    json_array_foreach(pods, i, o)
    {
        if(kobject_meta_str(o, "namespace") && kobject_meta_str(o, "name")) {
            char key[600];
            snprintf(key, sizeof key, "%s/%s", kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
            keyset_add(&L->gated, key); /* checked (and dropped when not gated) after the pass */
        }
    }
    json_decref(pods);
    if(binder_state_restore(L->st, &err) != BINDER_OK) {
        log_write(LOG_ERROR, "binder", "cannot rebuild the binder's index", "error", err.msg, NULL);
        model_clear(L);
        return -1;
    }
    return 0;
}

typedef struct class_walk {
    placement *L;
    const json_t *classes; /* name -> true */
} class_walk;

static void queue_class_claim(void *ud, const binder_claim_status *c)
{
    class_walk *cw = ud;
    if(json_object_get(cw->classes, c->class_name)) {
        char key[600];
        snprintf(key, sizeof key, "%s/%s", c->ns, c->name);
        keyset_add(&cw->L->writes, key);
    }
}

/* Looks again at the raw-name use of the VMIs in L->recheck (their
 * objects changed, or their claims did in a pass) and adds the nodes
 * whose use changed to *nodes. Empties L->recheck. */
static void recheck_raw(placement *L, keyset **nodes)
{
    keyset *d, *t;
    HASH_ITER(hh, L->recheck, d, t)
    {
        char buf[600], a[256], b[256];
        const char *ns, *name, *ca, *cb;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        json_t *vmi = pl_get(L, PLACEMENT_VMI, ns, name);
        pl_raw_update(L, d->key, vmi, &ca, &cb, a, b, sizeof a);
        if(ca)
            keyset_add(nodes, ca);
        if(cb)
            keyset_add(nodes, cb);
        json_decref(vmi);
    }
    keyset_free(&L->recheck);
}

void placement_apply(placement *L, keyset *batch)
{
    int classes_changed = 0, kubevirt_changed = 0, sets_changed = 0;
    keyset *d, *t;
    /* classes first (a node's offers depend on them), then claims, sets,
     * the raw-name use that depends on sets, and last what nodes offer */
    json_t *changed = json_object(); /* classes changed in this batch */
    HASH_ITER(hh, batch, d, t)
    {
        if(d->key[0] == PL_K_CLASS) {
            if(apply_class(L, d->key + 3)) {
                json_object_set_new(changed, d->key + 3, json_true());
                classes_changed = 1;
            }
            L->view_dirty = 1;
        } else if(d->key[0] == PL_K_KUBEVIRT)
            kubevirt_changed = 1;
        else if(d->key[0] == PL_K_NAMESPACE || d->key[0] == PL_K_QUOTA)
            L->view_dirty = 1;
    }
    if(json_object_size(changed) > 0) {
        /* a class change can change its claims' messages alone (onCordon
         * Move -> Stay), which the state records without an event: their
         * statuses are compared with the API after the pass (class changes
         * are rare; this walks every claim once) */
        class_walk cw = {L, changed};
        binder_state_claims(L->st, queue_class_claim, &cw);
    }
    json_decref(changed);
    if(classes_changed || kubevirt_changed)
        json_object_clear(L->tmpl_sets); /* template sets read the classes' specs and the KubeVirt CR */
    HASH_ITER(hh, batch, d, t)
    {
        if(d->key[0] != PL_K_CLAIM)
            continue;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key + 2, buf, sizeof buf, &ns, &name);
        json_t *obj = pl_get(L, PLACEMENT_CLAIM, ns, name);
        count_claim(L, d->key + 2, obj);
        binder_claim_status s;
        int known = binder_state_claim_get(L->st, ns, name, &s) == BINDER_OK;
        const char *uid = obj ? kobject_meta_str(obj, "uid") : NULL;
        const char *had = json_string_value(json_object_get(L->uids, d->key + 2));
        if(known && (!obj || (uid && had && strcmp(uid, had) != 0))) {
            /* gone, or deleted and created again under the same name
             * (another uid: a new claim, with its own class and count) */
            binder_state_claim_delete(L->st, ns, name, NULL);
            json_object_del(L->uids, d->key + 2);
            known = 0;
            sets_changed = 1;
        }
        if(obj && !known) {
            take_claim(L, obj, 0);
            sets_changed = 1;
        } else if(obj) {
            keyset_add(&L->writes, d->key + 2); /* written again if the API holds another status */
            watch_protection(L, obj, d->key + 2);
        }
        json_decref(obj);
    }
    /* a PVC bound, or a PV's affinity: the sets whose volumes name it */
    keyset *vsets = NULL;
    HASH_ITER(hh, batch, d, t)
    {
        char pk[600] = "";
        if(d->key[0] == PL_K_PVC)
            snprintf(pk, sizeof pk, "%s", d->key + 2);
        else if(d->key[0] == PL_K_PV) {
            json_t *pv = pl_get(L, PLACEMENT_PV, NULL, d->key + 3);
            const json_t *ref = json_object_get(json_object_get(pv, "spec"), "claimRef");
            const char *rns = json_string_value(json_object_get(ref, "namespace"));
            const char *rn = json_string_value(json_object_get(ref, "name"));
            if(rns && rn)
                snprintf(pk, sizeof pk, "%s/%s", rns, rn);
            json_decref(pv);
        }
        const char *sk;
        json_t *v;
        if(*pk)
            json_object_foreach(json_object_get(L->pvc_sets, pk), sk, v) keyset_add(&vsets, sk);
    }
    HASH_ITER(hh, vsets, d, t)
    {
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        pl_apply_set(L, ns, name);
    }
    keyset_free(&vsets);
    HASH_ITER(hh, batch, d, t)
    {
        if(d->key[0] == PL_K_VM || d->key[0] == PL_K_VMI) {
            char buf[600];
            const char *ns, *name;
            keyset_split(d->key + 2, buf, sizeof buf, &ns, &name);
            pl_apply_set(L, ns, name);
            sets_changed = 1;
            if(d->key[0] == PL_K_VMI) {
                json_t *gone = pl_get(L, PLACEMENT_VMI, ns, name);
                if(!gone)
                    json_object_del(L->tmpl_sets, d->key + 2); /* its template set is not asked again */
                json_decref(gone);
            }
        } else if(d->key[0] == PL_K_POD)
            keyset_add(&L->gated, d->key + 2);
    }
    if(sets_changed && L->waiting_sets) {
        /* a claim arrived or a set let go of one: the sets that named a
         * claim not known yet, or held by a set, try again */
        keyset *w = L->waiting_sets, *wt;
        L->waiting_sets = NULL;
        HASH_ITER(hh, w, d, wt)
        {
            char buf[600];
            const char *ns, *name;
            keyset_split(d->key, buf, sizeof buf, &ns, &name);
            pl_apply_set(L, ns, name);
        }
        keyset_free(&w);
    }
    keyset *nodes = NULL;
    HASH_ITER(hh, batch, d, t)
    {
        if(d->key[0] == PL_K_VMI)
            keyset_add(&L->recheck, d->key + 2);
        else if(d->key[0] == PL_K_NODE || d->key[0] == PL_K_GPUNODE)
            keyset_add(&nodes, d->key + 3);
    }
    recheck_raw(L, &nodes);
    json_t *classes = pl_list(L, PLACEMENT_CLASS);
    /* the batch's nodes first (apply_node takes a deleted one out of the
     * state), then, when what every node offers may have changed, each
     * node the cache holds */
    json_t *kv = pl_first_kubevirt(L);
    HASH_ITER(hh, nodes, d, t) pl_apply_node(L, d->key, classes, kv);
    json_decref(kv);
    if(classes_changed || kubevirt_changed)
        apply_all_nodes(L, classes);
    keyset_free(&nodes);
    json_decref(classes);
}

void placement_reconcile(placement *L, placement_pass pass)
{
    if(!L->st || !L->bp.e)
        return;
    pl_policy_view(L);
    if(pass == PLACEMENT_PASS_FULL) {
        binder_reconcile_all(L->st, &L->hooks);
        placement_policy_settle(&L->bp);
        metrics_counter_add("cozygpu_binder_passes_total", "kind=\"full\"", 1);
    } else if(pass == PLACEMENT_PASS_CHANGES) {
        binder_reconcile(L->st, &L->hooks);
        placement_policy_settle(&L->bp);
        metrics_counter_add("cozygpu_binder_passes_total", "kind=\"incremental\"", 1);
    }
    /* a pass whose transitions need another (room freed by a move is
     * retried by the next pass, decision 0023), or whose claims no
     * longer cover (or now cover) a VMI's devices */
    for(int i = 0; i < 4; i++) {
        keyset *nodes = NULL, *d, *t;
        recheck_raw(L, &nodes);
        if(nodes) {
            json_t *classes = pl_list(L, PLACEMENT_CLASS);
            json_t *kv = pl_first_kubevirt(L);
            HASH_ITER(hh, nodes, d, t) pl_apply_node(L, d->key, classes, kv);
            json_decref(kv);
            json_decref(classes);
            keyset_free(&nodes);
        }
        size_t n = binder_reconcile(L->st, &L->hooks);
        placement_policy_settle(&L->bp);
        if(n == 0 && !L->recheck)
            break;
    }
    /* what the last pass left to look at (L->recheck) waits for the next
     * wake: never dropped */
}

