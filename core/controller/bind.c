/* bind.c — the leader's binder loop (internal.h, ctl_bind_): the binder's
 * state machine (binder/binder.h) driven from the watch caches, its
 * decisions written to the API.
 *
 * Rules: DESIGN.md §3 (GPUClaim), §4 (launcher pod gate and pin), §6 (the
 * binder), docs/decisions/0020 (the status contract), 0021 (where §6 is
 * silent), 0022 (node capacity), 0023 (incremental passes), 0026 (this
 * loop).
 *
 * One thread. The watcher thread's callbacks only record which objects
 * changed (a set of keys under ctl.mu) and wake it. While this replica
 * leads and every cache has listed, the thread:
 *   1. on taking the lead, builds the state from the caches alone: classes,
 *      nodes (capacity through runtime.binder, i.e. cozygpu.capacity),
 *      claims restored from their status, sets from VMs and VMIs; then
 *      binder_state_restore and one full pass;
 *   2. after that, applies each changed object to the state and runs an
 *      incremental pass (binder_reconcile): one event costs what it
 *      touches, never a walk of the cluster;
 *   3. writes each claim whose status the pass changed through the status
 *      subresource, conditional on the resourceVersion the cache holds (a
 *      409 keeps the write queued until the cache moves: the state is this
 *      leader's, so it is written again, never merged);
 *   4. deletes the VMIs the rules ask for (a Pending VMI pinned to a node
 *      its set left);
 *   5. pins the gated launcher pods whose claims are all Bound to one node:
 *      a matchFields requirement metadata.name In [node] on every required
 *      node selector term, then the gate removed (decision 0020 §5).
 * Losing the lead drops the state; every write checks the lease just
 * before it is sent.
 */
#include "controller/internal.h"

#include <lua.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uthash.h>

#include "base/log.h"
#include "base/metrics.h"
#include "binder/binder.h"
#include "controller/bindpolicy.h"
#include "controller/bindread.h"
#include "engine/luajson.h"
#include "format/kobject.h"
#include "base/clock.h"

#define GATE "gpu.cozystack.io/claims"
/* On every claim the leader sees, so that a claim deleted while a VM uses
 * its GPUs keeps its hold until the VMI ends (as kubernetes.io/pvc-protection
 * keeps a PVC a pod uses; decision 0026). */
#define PROTECTION "gpu.cozystack.io/claim-protection"
/* On every GPUClass, so that a class deleted while claims of it exist stays
 * (being deleted) and keeps serving them until the last one is gone, as
 * kubernetes.io/pvc-protection keeps a PVC (DESIGN.md §6, decision 0037). */
#define CLASS_PROTECTION "gpu.cozystack.io/class-protection"
#define CLAIMS_ANNOTATION "gpu.cozystack.io/claims"
#define TEMPLATE_LABEL BINDREAD_TEMPLATE_LABEL

/* ------------------------------------------------------------ dirty keys */

/* What changed, as "K:ns/name" (K one of the kinds below; ns empty for
 * cluster-scoped objects). Filled by the watcher thread under ctl.mu. */
enum {
    K_CLASS = 'c',
    K_NODE = 'n',
    K_GPUNODE = 'g',
    K_CLAIM = 'l',
    K_VM = 'm',
    K_VMI = 'i',
    K_POD = 'p',
    K_KUBEVIRT = 'k',
    K_NAMESPACE = 's', /* the budget check's view only */
    K_QUOTA = 'q',     /* the budget check's view only */
    K_PVC = 'v',       /* a set's volume (DESIGN.md §6, WaitForFirstConsumer) */
    K_PV = 'w',
};

typedef ctl_key dirty; /* keys.c */

static dirty *g_dirty;        /* mu */
static int g_wake;            /* mu: leadership changed or a tick is due */

/* The highest metadata.resourceVersion of each resource whose event was
 * queued (recorded after its key, so a batch never takes the version of
 * an event it does not hold): what "applied up to" is measured against.
 * resourceVersions are opaque to clients (API conventions, "Concurrency
 * Control and Consistency"); kube-apiserver's are etcd revisions, decimal
 * integers, and one that is not is not recorded. */
#define RV_RESOURCES 16
typedef struct rv_seen {
    const kube_resource *r;
    unsigned long long rv;
} rv_seen;
static rv_seen g_rv[RV_RESOURCES]; /* mu */

static void rv_record(const kube_resource *r, const json_t *obj)
{
    const char *v = json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if(!r || !v || !*v)
        return;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    if(*end || *v == '-')
        return;
    pthread_mutex_lock(&ctl_proc->mu);
    for(int i = 0; i < RV_RESOURCES; i++) {
        if(!g_rv[i].r)
            g_rv[i].r = r;
        if(g_rv[i].r == r) {
            if(n > g_rv[i].rv)
                g_rv[i].rv = n;
            break;
        }
    }
    pthread_mutex_unlock(&ctl_proc->mu);
}

/* ctl_key_wait_take's take: the versions recorded with the batch's keys. */
static void rv_take(void *ud)
{
    memcpy(ud, g_rv, sizeof g_rv);
}

void ctl_bind_on_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    (void)type;
    char kind = (char)(intptr_t)ctx;
    if(inf == ctl_proc->classes_inf)
        ctl_status_on_class_event(NULL, inf, type, obj);
    if(kind == K_CLAIM)
        ctl_usage_on_event(ctx, inf, type, obj); /* the claim's usage record */
    ctl_key_queue_object(&g_dirty, kind, obj);
    rv_record(kube_informer_resource(inf), obj);
}

void ctl_bind_on_leader_change(void *ctx, int leading)
{
    ctl_status_on_leader_change(ctx, leading);
    ctl_usage_on_leader_change(ctx, leading);
    pthread_mutex_lock(&ctl_proc->mu);
    g_wake = 1;
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
}

/* ------------------------------------------------------------ the loop */

typedef struct raw_use {
    char *key;  /* "ns/name" of a running VMI no claim covers */
    char *node;
    json_t *used; /* {resource name: units} */
    UT_hash_handle hh;
} raw_use;

typedef struct loop {
    binder_state *st;
    engine *e;          /* runtime.binder: node capacity */
    engine *pe;         /* the served bundle's engine: policies/binder.lua, budgets at bind */
    ctl_bundle *peb;    /* the bundle pe was built on (a reference) */
    bindpolicy bp;      /* the hooks over pe and st, and the usage table */
    int view_dirty;     /* pe's cluster view (namespaces, quotas, classes, raw-name VMIs) is stale */
    int full_pending;   /* the state was built and has had no full pass yet (waiting for a bundle) */
    int policy_waiting; /* the last wake found no bundle to check budgets with (logged once) */
    dirty *writes;      /* claims whose status must be written ("ns/name") */
    dirty *deletes;     /* VMIs to delete ("ns/name") */
    dirty *gated;       /* launcher pods carrying the gate ("ns/name") */
    dirty *waiting_sets; /* sets that named a claim not known yet ("ns/name") */
    raw_use *raw;       /* running raw-name VMIs */
    json_t *uids;       /* "ns/name" -> metadata.uid of each claim in the state */
    dirty *recheck;     /* VMIs ("ns/name") whose claims changed in a pass: raw use looked at again */
    dirty *protect;     /* claims ("ns/name") that lack the protection finalizer */
    dirty *deleting;    /* claims ("ns/name") being deleted: the finalizer goes once nothing uses them */
    json_t *claim_class;  /* "ns/name" -> spec.class of every claim the leader knows (any phase) */
    json_t *class_claims; /* class -> number of claims naming it (claim_class counted; 0: absent) */
    dirty *class_fin;     /* classes whose protection finalizer is looked at in the next flush */
    json_t *class_fin_failed; /* class -> true: its finalizer write failed and was logged (once until it works) */
    json_t *creates;    /* "ns/name" -> template claim to create (decision 0027) */
    json_t *tdeletes;   /* "ns/name" -> 1: template claims of a final VMI, to delete */
    json_t *refused;    /* "ns/vm" -> {node: true}: nodes a template VMI of the VM failed on (DESIGN.md §6) */
    json_t *pvc_sets;   /* "ns/pvc" -> {"ns/set": true}: the sets whose volumes name the PVC */
    long long log_quiet_until; /* ms: policy failure log lines are held back until then */
    unsigned long log_held;    /* lines held back since the last one written */
    json_t *raw_by_node; /* node -> {resource name: units} */
    json_t *class_sent;  /* class -> {free, maxFreePerNode} written, until the cache shows it */
    json_t *class_names; /* class -> true: the classes the per-class gauges were last set for */
    json_t *class_specs; /* class -> {spec, deleting} as last applied (apply_class) */
    long long class_next_ms; /* monotonic ms: no GPUClass status write before then */
    int class_pending;   /* a class status differs and waits for class_next_ms */
    long long flush_until; /* monotonic ms: the current flush writes until then */
    int more;            /* the last flush stopped at its budget with writes left: wake at once */
    int progressed;      /* a write of the current flush succeeded (no retry at once after failures only) */
    long long class_log_ms; /* a failing class_status call was last logged then */
} loop;

static int leading(void)
{
    return lease_is_leader(ctl_proc->lease);
}

/* --- node capacity through Lua (runtime.binder.node) --- */

static json_t *first_kubevirt(void)
{
    for(int i = 0; i < ctl_proc->n_cluster_inf; i++)
        if(kube_informer_resource(ctl_proc->cluster_inf[i]) == &KUBE_KUBEVIRTS) {
            json_t *all = kube_informer_list(ctl_proc->cluster_inf[i]);
            json_t *kv = json_incref(json_array_get(all, 0));
            json_decref(all);
            return kv;
        }
    return NULL;
}

static json_t *node_inf_get(const char *name)
{
    for(int i = 0; i < ctl_proc->n_cluster_inf; i++)
        if(kube_informer_resource(ctl_proc->cluster_inf[i]) == &KUBE_NODES)
            return kube_informer_get(ctl_proc->cluster_inf[i], NULL, name);
    return NULL;
}

/* Node `name` (cached) into the state: its capacity per class and flags
 * from runtime.binder.node, or deleted when the cache has no such Node. A
 * node the Lua side cannot read offers nothing (logged). */
static void apply_node(loop *L, const char *name, const json_t *classes, const json_t *kubevirt)
{
    cozy_err err;
    json_t *node = node_inf_get(name);
    if(!node) {
        binder_state_node_delete(L->st, name, NULL);
        return;
    }
    json_t *gpunode = kube_informer_get(ctl_proc->gpunodes_inf, NULL, name);
    bindread_node_view v;
    if(bindread_node(L->e, node, gpunode, kubevirt, classes, json_object_get(L->raw_by_node, name), &v, &err) !=
       COZY_OK)
        log_write(LOG_WARN, "binder", "cannot read the node's capacity; it offers nothing", "node", name, "error",
                  err.msg, NULL);
    if(binder_state_node_set(L->st, name, &v.spec, &err) != BINDER_OK)
        log_write(LOG_WARN, "binder", "cannot take the node", "node", name, "error", err.msg, NULL);
    bindread_node_view_free(&v);
    json_decref(gpunode);
    json_decref(node);
}

static void apply_all_nodes(loop *L, const json_t *classes)
{
    json_t *kv = first_kubevirt();
    json_t *nodes = kube_informer_list(ctl_cluster_informer(&KUBE_NODES));
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n)
    {
        const char *name = kobject_meta_str(n, "name");
        if(name)
            apply_node(L, name, classes, kv);
    }
    json_decref(nodes);
    json_decref(kv);
}

/* --- classes --- */

/* Class `name` (cached) into the state, or deleted when the cache has no
 * such class. Returns 1 when what nodes offer may have changed (the class
 * came, went, or its spec or deletionTimestamp changed), 0 when only its
 * status or other metadata did: the leader's own status writes come back
 * through the watch, and each must not cost a walk of every node and claim. */
static int apply_class(loop *L, const char *name)
{
    json_t *c = kube_informer_get(ctl_proc->classes_inf, NULL, name);
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

/* --- claims --- */

/* Whether `obj` carries finalizer `fin`. */
static int has_finalizer(const json_t *obj, const char *fin)
{
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(json_object_get(obj, "metadata"), "finalizers"), i, f)
    {
        if(json_is_string(f) && strcmp(json_string_value(f), fin) == 0)
            return 1;
    }
    return 0;
}

static int has_protection(const json_t *obj)
{
    return has_finalizer(obj, PROTECTION);
}

/* Counts claim `key` ("ns/name") under the class `obj` names (obj: the
 * cached or listed claim; NULL when it is gone): L->claim_class and
 * L->class_claims follow it, one claim at a time (no walk of the claims).
 * A class whose count falls to 0 is queued for its protection finalizer
 * (decision 0037). A claim without a string spec.class counts nowhere. */
static void count_claim(loop *L, const char *key, const json_t *obj)
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
static void watch_protection(loop *L, const json_t *obj, const char *key)
{
    if(kobject_meta_str(obj, "deletionTimestamp")) {
        if(has_protection(obj))
            keyset_add(&L->deleting, key);
    } else if(!has_protection(obj))
        keyset_add(&L->protect, key);
}

/* A cached claim into the state: restored from its status when
 * `restore` (a new leader), else added Pending. */
static void take_claim(loop *L, const json_t *obj, int restore)
{
    const char *ns = kobject_meta_str(obj, "namespace"), *name = kobject_meta_str(obj, "name");
    cozy_err err;
    binder_claim_status s;
    if(bindread_claim(obj, restore, &s)) {
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

/* --- sets (a VM or VMI naming claims) --- */

/* bindread_vmi_phase. */
static binder_vmi_phase vmi_phase(const json_t *vmi)
{
    return bindread_vmi_phase(vmi);
}

/* bindread_claim_names. */
static size_t claim_names(const char *v, char *buf, size_t n, const char **names, size_t max)
{
    return bindread_claim_names(v, buf, n, names, max);
}

/* Annotation `key` of the metadata `meta_owner`, or NULL. */
static const char *annotation(const json_t *meta_owner, const char *key)
{
    return json_string_value(json_object_get(json_object_get(meta_owner, "annotations"), key));
}

/* The claims VMI `vmi` holds (bindread_vmi_claims over the cached
 * GPUClasses, listed only for a VMI with template claims). */
static size_t vmi_claims(const json_t *vmi, char *buf, size_t n, const char **names, size_t max, json_t **tmpl)
{
    json_t *classes = bindread_vmi_uses_classes(vmi) ? kube_informer_list(ctl_proc->classes_inf) : NULL;
    size_t k = bindread_vmi_claims(vmi, classes, buf, n, names, max, tmpl);
    json_decref(classes);
    return k;
}

/* The VMI's units on its node that no claim covers (bindread_raw_units
 * over the state and the cached GPUClasses). NULL when none. */
static json_t *raw_units(loop *L, const json_t *vmi)
{
    if(!bindread_vmi_on_node(vmi))
        return NULL;
    json_t *classes = bindread_vmi_uses_classes(vmi) ? kube_informer_list(ctl_proc->classes_inf) : NULL;
    json_t *used = bindread_raw_units(L->st, vmi, classes);
    json_decref(classes);
    return used;
}

static void raw_node_add(loop *L, const char *node, const json_t *used, int sign)
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
static void raw_update(loop *L, const char *key, const json_t *vmi, const char **changed_a, const char **changed_b,
                       char *buf_a, char *buf_b, size_t n)
{
    *changed_a = *changed_b = NULL;
    raw_use *r;
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

/* What a template VMI's claims need (issue 12 item 2, decision 0027):
 * while the VMI is not final, each of `tmpl` ([{name, class, count}]) that
 * the cache does not hold is queued for creation — labelled a template
 * claim, owned by the VMI (controller ownerReference: garbage collection
 * removes it with the VMI), protected by the finalizer; once the VMI is
 * final (Succeeded, Failed), each that exists is queued for deletion (it
 * then goes once nothing uses it). */
static void template_claims(loop *L, const json_t *vmi, const json_t *tmpl, binder_vmi_phase phase)
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
        json_t *have = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, name);
        if(final) {
            json_object_del(L->creates, key);
            /* only this VMI's own claim goes, and only that object (its
             * uid as a precondition): a tenant's claim of the name, or a
             * later VMI's, is never deleted */
            const char *cuid = have ? kobject_meta_str(have, "uid") : NULL;
            if(have && cuid && !kobject_meta_str(have, "deletionTimestamp") && bindread_template_claim_is(have, t, uid))
                json_object_set_new(L->tdeletes, key, json_string(cuid));
        } else if(!have && !kobject_meta_str(vmi, "deletionTimestamp")) {
            json_object_set_new(
                L->creates, key,
                json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s}, s:{s:s}, s:[{s:s, s:s, s:s, s:s, s:b, s:b}], s:[s]},"
                          " s:{s:s, s:O}}",
                          "apiVersion", "cozystack.io/v1alpha1", "kind", "GPUClaim", "metadata", "name", name,
                          "namespace", ns, "labels", TEMPLATE_LABEL, "true", "annotations", "gpu.cozystack.io/vmi",
                          vname, "ownerReferences", "apiVersion", "kubevirt.io/v1", "kind", "VirtualMachineInstance",
                          "name", vname, "uid", uid, "controller", 1, "blockOwnerDeletion", 1, "finalizers",
                          PROTECTION, "spec", "class", json_string_value(json_object_get(t, "class")), "count",
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
static int template_claims_ours(const json_t *vmi, const json_t *tmpl)
{
    const char *ns = kobject_meta_str(vmi, "namespace"), *uid = kobject_meta_str(vmi, "uid");
    size_t i;
    json_t *t;
    json_array_foreach(tmpl, i, t)
    {
        json_t *c = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, json_string_value(json_object_get(t, "name")));
        int ok = !c || bindread_template_claim_is(c, t, uid);
        json_decref(c);
        if(!ok)
            return 0;
    }
    return 1;
}

/* bindread_volume_nodes' lookup for the leader: PVC `pvc` of the set
 * being read is remembered against it (so that a PVC or PV change looks
 * at the set again), and its bound PV comes from the informers. */
typedef struct pv_lookup {
    loop *L;
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
    json_t *claim = kube_informer_get(ctl_proc->pvcs_inf, q->ns, pvc);
    const char *pvname = json_string_value(json_object_get(json_object_get(claim, "spec"), "volumeName"));
    json_t *pv = pvname ? kube_informer_get(ctl_proc->pvs_inf, NULL, pvname) : NULL;
    json_decref(claim);
    return pv;
}

/* DESIGN.md §6: "a set placed after a WaitForFirstConsumer volume bound is
 * limited to the nodes the volume's node affinity allows". The nodes the
 * volumes of `spec` (the VMI's, or the stopped VM's template's) allow,
 * read by bindread_volume_nodes over the PVC and PV informers, limit set
 * ns/name (no such volume: no limit; volumes that disagree: no node, the
 * set waits). The PVCs are remembered against the set so that a PVC or PV
 * change looks at it again. */
static void volume_nodes(loop *L, const char *ns, const char *name, const json_t *spec)
{
    char setkey[600];
    snprintf(setkey, sizeof setkey, "%s/%s", ns, name);
    pv_lookup q = {L, ns, setkey};
    const char *nodes[BINDER_MAX_SET_NODES];
    json_t *keep = NULL;
    size_t n = bindread_volume_nodes(spec, bound_pv, &q, nodes, BINDER_MAX_SET_NODES, &keep);
    cozy_err err;
    if(binder_state_set_nodes(L->st, ns, name, nodes, n, &err) != BINDER_OK)
        log_write(LOG_WARN, "binder", "cannot limit the VM's claims to its volume's nodes", "namespace", ns, "vm", name,
                  "error", err.msg, NULL);
    json_decref(keep);
}

/* Set ns/name from the caches: the VMI's annotation, phase and node when a
 * VMI exists, else the VM's template annotation (a stopped VM still holds
 * its claims on one node, DESIGN.md §6). No claims named: no set. A set
 * naming a claim not known yet waits in waiting_sets. */
static void apply_set(loop *L, const char *ns, const char *name)
{
    json_t *vmi = kube_informer_get(ctl_cluster_informer(&KUBE_VMIS), ns, name);
    json_t *vm = kube_informer_get(ctl_proc->vms_inf, ns, name);
    const char *ann = NULL;
    binder_vmi_phase phase = BINDER_VMI_NONE;
    const char *node = NULL;
    if(vmi) {
        ann = annotation(json_object_get(vmi, "metadata"), CLAIMS_ANNOTATION);
        phase = vmi_phase(vmi);
        if(phase != BINDER_VMI_PENDING)
            node = json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName"));
        if(phase == BINDER_VMI_SCHEDULED || phase == BINDER_VMI_RUNNING) {
            if(!node)
                phase = BINDER_VMI_PENDING;
        }
    } else if(vm) {
        ann = annotation(json_object_get(json_object_get(json_object_get(vm, "spec"), "template"), "metadata"),
                         CLAIMS_ANNOTATION);
    }
    char buf[8192];
    const char *names[BINDER_MAX_SET_CLAIMS];
    json_t *tmpl = NULL;
    size_t n = vmi ? vmi_claims(vmi, buf, sizeof buf, names, BINDER_MAX_SET_CLAIMS, &tmpl)
                   : claim_names(ann, buf, sizeof buf, names, BINDER_MAX_SET_CLAIMS);
    int not_ours = 0;
    if(tmpl) {
        template_claims(L, vmi, tmpl, phase);
        not_ours = !template_claims_ours(vmi, tmpl);
        const char *fnode = json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName"));
        if(phase == BINDER_VMI_FAILED && fnode) {
            /* remembered against the VM (its VMIs share its name), so that
             * its next VMI's template set tries elsewhere */
            if(bindpolicy_refuse(L->refused, ns, name, fnode))
                log_write(LOG_INFO, "binder", "a template VMI failed on a node; its VM's next claims go elsewhere",
                          "namespace", ns, "vm", name, "node", fnode, NULL);
        }
    }
    json_decref(tmpl);
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    dirty *w;
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
             * it gives them up too (issue 20 item 10; before, the live
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

/* --- building the state on taking the lead --- */

static void loop_drop(loop *L)
{
    bindpolicy_free(&L->bp);
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
    raw_use *r, *rt;
    HASH_ITER(hh, L->raw, r, rt)
    {
        HASH_DEL(L->raw, r);
        free(r->key);
        free(r->node);
        json_decref(r->used);
        free(r);
    }
    json_object_clear(L->raw_by_node);
    json_object_clear(L->class_sent);
    json_object_clear(L->class_names);
    json_object_clear(L->class_specs);
    L->class_pending = 0;
    /* only the leader's view of capacity is exported (a follower's would
     * be stale and double any sum across replicas) */
    metrics_family_clear("cozygpu_class_capacity_devices");
    metrics_family_clear("cozygpu_class_free_devices");
    metrics_family_clear("cozygpu_class_claimed_devices");
    metrics_family_clear("cozygpu_binder_applied_resource_version");
}

/* The leader's "applied up to": for each resource, the resourceVersion of
 * the last event whose batch has been taken into the state, reconciled
 * and its writes sent (none left for the next wake by the flush's budget).
 * A spec that wrote an object waits until its resource's version here is
 * at least the one its write returned, instead of a fixed sleep
 * (docs/decisions/0040). */
static void publish_applied(const rv_seen *taken)
{
    for(int i = 0; i < RV_RESOURCES && taken[i].r; i++) {
        char lb[128];
        snprintf(lb, sizeof lb, "resource=\"%s\"", taken[i].r->resource);
        metrics_gauge_set("cozygpu_binder_applied_resource_version", lb, (double)taken[i].rv);
    }
}

static int build(loop *L)
{
    cozy_err err;
    L->st = binder_state_new();
    if(!L->st)
        return -1;
    json_t *classes = kube_informer_list(ctl_proc->classes_inf);
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
    if(kube_list(ctl_proc->client, &KUBE_GPUCLAIMS, NULL, NULL, &code, &list, &err) != COZY_OK || code != 200) {
        log_write(LOG_WARN, "binder", "cannot list GPUClaims to take the lead; trying again", "error",
                  code ? json_string_value(json_object_get(list, "message")) : err.msg, NULL);
        json_decref(list);
        json_decref(classes);
        loop_drop(L);
        return -1;
    }
    json_array_foreach(json_object_get(list, "items"), i, o)
    {
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
    json_decref(list);
    /* sets next (which VMI holds which claims), then raw-name use (a VMI
     * its claims do not cover), then what each node offers */
    json_t *vms = kube_informer_list(ctl_proc->vms_inf);
    json_array_foreach(vms, i, o)
    {
        if(kobject_meta_str(o, "namespace") && kobject_meta_str(o, "name"))
            apply_set(L, kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
    }
    json_decref(vms);
    json_t *vmis = kube_informer_list(ctl_cluster_informer(&KUBE_VMIS));
    json_array_foreach(vmis, i, o)
    {
        if(kobject_meta_str(o, "namespace") && kobject_meta_str(o, "name"))
            apply_set(L, kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
    }
    json_array_foreach(vmis, i, o)
    {
        const char *ns = kobject_meta_str(o, "namespace"), *name = kobject_meta_str(o, "name");
        if(!ns || !name)
            continue;
        char key[600], a[256], b[256];
        const char *ca, *cb;
        snprintf(key, sizeof key, "%s/%s", ns, name);
        raw_update(L, key, o, &ca, &cb, a, b, sizeof a);
    }
    json_decref(vmis);
    apply_all_nodes(L, classes);
    json_decref(classes);
    json_t *pods = kube_informer_list(ctl_proc->pods_inf);
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
        loop_drop(L);
        return -1;
    }
    log_write(LOG_INFO, "binder", "rebuilt the binder's state from the caches", NULL);
    return 0;
}

/* --- hooks --- */

/* The binder's counters of one transition (issue 13 "Metrics"):
 * placements (a Pending claim Bound: its first node), moves (a Bound claim
 * to another node), rebinds (a Lost claim Bound or Attached again),
 * refusals (a claim left waiting, Pending or Lost, with a new reason), by
 * class, and for a placement the time from the claim's creation
 * (metadata.creationTimestamp, whole seconds) to Bound. */
static void count_transition(loop *L, const binder_event *ev)
{
    binder_claim_status c;
    if(binder_state_claim_get(L->st, ev->ns, ev->name, &c) != BINDER_OK)
        return;
    char *cls = metrics_escape(c.class_name);
    if(!cls)
        return;
    char lb[600];
    if(ev->from == BINDER_PENDING && ev->to == BINDER_BOUND) {
        snprintf(lb, sizeof lb, "class=\"%s\"", cls);
        metrics_counter_add("cozygpu_binder_placements_total", lb, 1);
        json_t *obj = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ev->ns, ev->name);
        double age = clock_seconds_since(kobject_meta_str(obj, "creationTimestamp"));
        if(age >= 0)
            metrics_histogram_observe("cozygpu_binder_bind_latency_seconds", lb, age);
        json_decref(obj);
    } else if(ev->from == BINDER_BOUND && ev->to == BINDER_BOUND && ev->from_node && ev->to_node &&
              strcmp(ev->from_node, ev->to_node) != 0) {
        snprintf(lb, sizeof lb, "class=\"%s\"", cls);
        metrics_counter_add("cozygpu_binder_moves_total", lb, 1);
    } else if(ev->from == BINDER_LOST && (ev->to == BINDER_BOUND || ev->to == BINDER_ATTACHED) &&
              !(ev->from_node && ev->to_node && strcmp(ev->from_node, ev->to_node) == 0)) {
        snprintf(lb, sizeof lb, "class=\"%s\"", cls);
        metrics_counter_add("cozygpu_binder_rebinds_total", lb, 1);
    } else if((ev->to == BINDER_PENDING || ev->to == BINDER_LOST) && ev->reason != BINDER_R_NONE) {
        snprintf(lb, sizeof lb, "class=\"%s\",reason=\"%s\"", cls, binder_reason_name(ev->reason));
        metrics_counter_add("cozygpu_binder_refusals_total", lb, 1);
    }
    free(cls);
}

static void on_event(void *ud, const binder_event *ev)
{
    loop *L = ud;
    bindpolicy_on_event(&L->bp, ev);
    count_transition(L, ev);
    const char *set = binder_state_claim_set(L->st, ev->ns, ev->name);
    if(set) {
        char vk[600];
        snprintf(vk, sizeof vk, "%s/%s", ev->ns, set);
        keyset_add(&L->recheck, vk); /* does it still cover its VMI's devices? */
    }
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ev->ns, ev->name);
    keyset_add(&L->writes, key);
    metrics_counter_add("cozygpu_binder_transitions_total", NULL, 1);
}

static void on_delete_vmi(void *ud, const char *ns, const char *vmi, const char *why)
{
    loop *L = ud;
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ns, vmi);
    keyset_add(&L->deletes, key);
    log_write(LOG_INFO, "binder", "deleting a pending VMI whose claims left its node", "namespace", ns, "vmi", vmi,
              "why", why, NULL);
}

/* A deadline one second from now for one policy call of the binder (the
 * instruction budget bounds its CPU; this bounds a call stuck otherwise). */
static void policy_deadline(loop *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += 1;
    engine_set_deadline(L->pe, &ts);
}

static json_t *node_labels(void *ud, const char *node)
{
    (void)ud;
    json_t *n = node_inf_get(node);
    json_t *labels = json_incref(json_object_get(json_object_get(n, "metadata"), "labels"));
    json_decref(n);
    return labels;
}

/* binder_hooks.choose: policies/binder.lua (decision 0024); a failure
 * places in packing order, is counted and logged. */
static int on_choose(void *ud, const binder_set_view *sv, const binder_candidate *cands, size_t n)
{
    loop *L = ud;
    /* a template set does not go back to a node one of its VM's VMIs
     * failed on (DESIGN.md §6, last rule; in memory: a restart forgets) */
    binder_candidate kept[BINDER_MAX_CANDIDATES];
    size_t at[BINDER_MAX_CANDIDATES], left;
    size_t k = bindpolicy_avoid(L->refused, sv, cands, n, kept, at, &left);
    policy_deadline(L);
    engine_binder_choice ch;
    int i = bindpolicy_choose(&L->bp, sv, kept, k, &ch);
    if(i >= 0 && (size_t)i < k)
        i = (int)at[i];
    if(ch.outcome != ENGINE_ALLOWED) {
        char lbl[64];
        snprintf(lbl, sizeof lbl, "kind=\"%s\"", engine_outcome_name(ch.outcome));
        metrics_counter_add("cozygpu_binder_policy_failures_total", lbl, 1);
        /* at most one line per 10 s (the metric counts every failure) */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
        if(ms >= L->log_quiet_until) {
            char held[32];
            snprintf(held, sizeof held, "%lu", L->log_held);
            log_write(LOG_WARN, "binder", "the binder policy failed; placing in packing order", "namespace", sv->ns,
                      "vm", sv->vm ? sv->vm : "", "gpuclaim", sv->n ? sv->claims[0].name : "", "kind",
                      engine_outcome_name(ch.outcome), "error", ch.message, LOG_NUM "failures_not_logged", held, NULL);
            L->log_quiet_until = ms + 10000;
            L->log_held = 0;
        } else
            L->log_held++;
    }
    return i;
}

/* binder_hooks.budget: the tenant-tree budgets at bind (DESIGN.md §5,
 * decision 0020 §3), fail closed. */
static int on_budget(void *ud, const binder_claim_status *c, char *why, size_t why_size)
{
    loop *L = ud;
    policy_deadline(L);
    engine_binder_verdict v;
    int ok = bindpolicy_budget(&L->bp, c, why, why_size, &v);
    if(!ok && v.outcome != ENGINE_ALLOWED)
        log_write(LOG_WARN, "binder", "the budget check at bind failed; the claim waits", "namespace", c->ns,
                  "gpuclaim", c->name, "kind", engine_outcome_name(v.outcome), "error", v.message, NULL);
    if(L->bp.last_error.msg[0]) {
        log_write(LOG_ERROR, "binder", "the budget usage table failed; it is counted again", "error",
                  L->bp.last_error.msg, NULL);
        L->bp.last_error.msg[0] = 0;
    }
    return ok;
}

/* The served bundle's engine for the hooks, (re)built when the bundle
 * changed (the usage table is fed again from the state), and its cluster
 * view (Namespaces, ResourceQuotas, GPUClasses, Running raw-name VMIs:
 * what the budget rules read) set again when one of those changed.
 * Returns 0 when the hooks can run. */
static int policy_ready(loop *L)
{
    cozy_err err;
    ctl_bundle *b = ctl_bundle_current();
    if(!b)
        return -1;
    if(!L->pe || b != L->peb) {
        engine *e = NULL;
        engine_options eo = ctl_bundle_engine_options(b);
        if(engine_open(&e, &eo, &err) != COZY_OK) {
            log_write(LOG_ERROR, "binder", "cannot open the policy engine for the binder", "error", err.msg, NULL);
            ctl_bundle_unref(b);
            return -1;
        }
        engine_close(L->pe);
        ctl_bundle_unref(L->peb);
        L->pe = e;
        L->peb = b;
        L->view_dirty = 1;
        bindpolicy_free(&L->bp);
        bindpolicy_init(&L->bp, L->pe, L->st);
        L->bp.labels = node_labels;
        if(bindpolicy_feed(&L->bp, &err) != COZY_OK) {
            log_write(LOG_ERROR, "binder", "cannot count the claims' usage for the budget check", "error", err.msg,
                      NULL);
            return -1;
        }
    } else
        ctl_bundle_unref(b);
    if(L->view_dirty) {
        json_t *view = json_array();
        static const kube_resource *const kinds[] = {&KUBE_NAMESPACES, &KUBE_RESOURCEQUOTAS, &KUBE_GPUCLASSES};
        for(size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
            json_t *items = kube_informer_list(ctl_cluster_informer(kinds[k]));
            size_t i;
            json_t *o;
            json_array_foreach(items, i, o) json_array_append_new(view, ctl_cluster_with_kind(o, kinds[k]));
            json_decref(items);
        }
        raw_use *r, *rt;
        HASH_ITER(hh, L->raw, r, rt)
        {
            char buf[600];
            const char *ns, *name;
            keyset_split(r->key, buf, sizeof buf, &ns, &name);
            json_t *v = kube_informer_get(ctl_cluster_informer(&KUBE_VMIS), ns, name);
            if(v)
                json_array_append_new(view, ctl_cluster_with_kind(v, &KUBE_VMIS));
            json_decref(v);
        }
        if(engine_set_cluster(L->pe, view, ctl_proc->settings, &err) != COZY_OK)
            log_write(LOG_ERROR, "binder", "cannot give the binder policy its cluster view", "error", err.msg, NULL);
        else
            L->view_dirty = 0;
        json_decref(view);
    }
    return 0;
}

/* --- status writes --- */

static json_t *status_of(const binder_claim_status *s, json_int_t generation, const json_t *old_status, const char *now)
{
    json_t *st = json_object();
    json_object_set_new(st, "phase", json_string(binder_phase_name(s->phase)));
    if(s->node)
        json_object_set_new(st, "node", json_string(s->node));
    if(s->attached_to)
        json_object_set_new(st, "attachedTo", json_string(s->attached_to));
    json_object_set_new(st, "observedGeneration", json_integer(generation));
    int ready = s->phase == BINDER_BOUND || s->phase == BINDER_ATTACHED;
    const char *reason = s->reason == BINDER_R_NONE ? "Pending" : binder_reason_name(s->reason);
    const char *when = now;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(old_status, "conditions"), i, c)
    {
        const char *t = json_string_value(json_object_get(c, "type"));
        const char *cs = json_string_value(json_object_get(c, "status"));
        const char *lt = json_string_value(json_object_get(c, "lastTransitionTime"));
        if(t && strcmp(t, "Ready") == 0 && cs && strcmp(cs, ready ? "True" : "False") == 0 && lt)
            when = lt; /* lastTransitionTime moves only when status does (API conventions) */
    }
    json_object_set_new(st, "conditions",
                        json_pack("[{s:s, s:s, s:s, s:s, s:I, s:s}]", "type", "Ready", "status",
                                  ready ? "True" : "False", "reason", reason, "message", s->message ? s->message : "",
                                  "observedGeneration", (json_int_t)generation, "lastTransitionTime", when));
    return st;
}

/* Writes claim `key`'s status when the cache holds another one. Returns 1
 * when done (written, already so, or the claim is gone), 0 to retry. */
static int write_claim(loop *L, const char *key)
{
    char buf[600];
    const char *ns, *name;
    keyset_split(key, buf, sizeof buf, &ns, &name);
    binder_claim_status s;
    if(binder_state_claim_get(L->st, ns, name, &s) != BINDER_OK)
        return 1;
    json_t *obj = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, name);
    if(!obj)
        return 1;
    const char *uid = kobject_meta_str(obj, "uid"), *held = json_string_value(json_object_get(L->uids, key));
    if(uid && held && strcmp(uid, held) != 0) {
        /* the cache already holds a claim re-created under this name, whose
         * event the state has not taken yet: the state's status is the old
         * claim's, never the new one's (decision 0026, identity by uid) */
        json_decref(obj);
        return 0;
    }
    char now[40];
    clock_rfc3339_now(now, sizeof now);
    const json_t *old = json_object_get(obj, "status");
    json_t *st = status_of(&s, json_integer_value(json_object_get(json_object_get(obj, "metadata"), "generation")),
                           old, now);
    int done = 1;
    if(!json_equal(st, old)) {
        if(!leading()) {
            done = 0;
        } else {
            json_t *body = json_copy(obj);
            json_object_set(body, "status", st);
            long code = 0;
            json_t *out = NULL;
            cozy_err err;
            if(kube_update_status(ctl_proc->client, &KUBE_GPUCLAIMS, ns, body, &code, &out, &err) != COZY_OK) {
                log_write(LOG_WARN, "binder", "cannot write the claim's status", "namespace", ns, "gpuclaim", name,
                          "error", err.msg, NULL);
                metrics_counter_add("cozygpu_binder_status_writes_total", "result=\"error\"", 1);
                done = 0;
            } else if(code == 409) {
                metrics_counter_add("cozygpu_binder_status_writes_total", "result=\"conflict\"", 1);
                done = 0; /* the cache is behind: written again when it moves */
            } else if(code == 404) {
                done = 1;
            } else if(code / 100 != 2) {
                const char *m = json_string_value(json_object_get(out, "message"));
                log_write(LOG_WARN, "binder", "the API server refused the claim's status", "namespace", ns, "gpuclaim",
                          name, "error", m ? m : "", NULL);
                metrics_counter_add("cozygpu_binder_status_writes_total", "result=\"error\"", 1);
                done = 0;
            } else
                metrics_counter_add("cozygpu_binder_status_writes_total", "result=\"ok\"", 1);
            json_decref(out);
            json_decref(body);
        }
    }
    json_decref(st);
    json_decref(obj);
    return done;
}

/* --- launcher pods: pin and ungate --- */

/* --- GPUClass status and the per-class gauges (DESIGN.md §3, issue 13,
 * decision 0030) --- */

/* Writes of GPUClass status are at least this far apart (a burst of
 * binds is one write per class, the last one current). */
#define CLASS_WRITE_GAP_MS 250

/* runtime.binder.class_status(class, units): the {free, maxFreePerNode}
 * the class shows, or NULL (logged at most once a minute) when the call
 * fails. */
static json_t *class_status_of(loop *L, const json_t *cls, const binder_class_view *v)
{
    lua_State *S = engine_lua(L->e);
    engine_push_runtime_fn(L->e, "class_status");
    luajson_push(S, cls);
    json_t *units = json_pack("{s:I, s:I}", "free", (json_int_t)v->units.free, "max_free",
                              (json_int_t)v->units.max_free);
    if(!units) {
        lua_pop(S, 2);
        return NULL;
    }
    luajson_push(S, units);
    json_decref(units);
    cozy_err err;
    json_t *out = NULL;
    if(engine_call(L->e, 2, 1, 0, &err) != ENGINE_ALLOWED || engine_to_json(L->e, -1, &out, &err) != COZY_OK ||
       !json_is_integer(json_object_get(out, "free")) || !json_is_integer(json_object_get(out, "maxFreePerNode"))) {
        long long now = clock_mono_ms();
        if(now - L->class_log_ms >= 60000) {
            L->class_log_ms = now;
            log_write(LOG_ERROR, "binder", "runtime.binder.class_status failed; the class status is not written",
                      "gpuclass", kobject_meta_str(cls, "name"), "error", err.msg, NULL);
        }
        json_decref(out);
        out = NULL;
    }
    lua_settop(S, 0);
    return out;
}

static void class_gauges(const char *name, const binder_class_view *v)
{
    char *esc = metrics_escape(name);
    if(!esc)
        return;
    char lb[700];
    snprintf(lb, sizeof lb, "class=\"%s\"", esc);
    metrics_gauge_set("cozygpu_class_capacity_devices", lb, (double)v->units.offered);
    metrics_gauge_set("cozygpu_class_free_devices", lb, (double)v->units.free);
    for(int ph = 0; ph < BINDER_PHASE_LAST; ph++) {
        snprintf(lb, sizeof lb, "class=\"%s\",phase=\"%s\"", esc, binder_phase_name((binder_phase)ph));
        metrics_gauge_set("cozygpu_class_claimed_devices", lb, (double)v->claim_units[ph]);
    }
    free(esc);
}

/* After a pass: every GPUClass's status.free and status.maxFreePerNode as
 * runtime.binder.class_status makes them of the state, written (a merge
 * patch of the status subresource: the Accepted condition is status.c's)
 * when they differ from what the watch cache shows and were not just
 * written, at most once per CLASS_WRITE_GAP_MS; and the per-class gauges.
 * O(classes x pools of each): no claim or node is walked. */
static void flush_classes(loop *L)
{
    json_t *classes = kube_informer_list(ctl_proc->classes_inf);
    long long now = clock_mono_ms();
    int may_write = now >= L->class_next_ms, wrote = 0, names_changed = 0;
    L->class_pending = 0;
    size_t i;
    json_t *c;
    json_array_foreach(classes, i, c)
    {
        const char *name = kobject_meta_str(c, "name");
        if(!name)
            continue;
        names_changed |= !json_object_get(L->class_names, name);
    }
    names_changed |= json_object_size(L->class_names) != json_array_size(classes);
    if(names_changed) { /* a class went: its series go too */
        metrics_family_clear("cozygpu_class_capacity_devices");
        metrics_family_clear("cozygpu_class_free_devices");
        metrics_family_clear("cozygpu_class_claimed_devices");
        json_object_clear(L->class_names);
    }
    json_array_foreach(classes, i, c)
    {
        const char *name = kobject_meta_str(c, "name");
        if(!name)
            continue;
        json_object_set_new(L->class_names, name, json_true());
        binder_class_view v;
        binder_state_class_view(L->st, name, &v);
        class_gauges(name, &v);
        json_t *want = class_status_of(L, c, &v);
        if(!want)
            continue;
        const json_t *shown = json_object_get(c, "status");
        if(json_equal(json_object_get(shown, "free"), json_object_get(want, "free")) &&
           json_equal(json_object_get(shown, "maxFreePerNode"), json_object_get(want, "maxFreePerNode"))) {
            json_object_del(L->class_sent, name); /* the API shows it */
            json_decref(want);
            continue;
        }
        json_t *sent = json_object_get(L->class_sent, name);
        if(sent && json_equal(sent, want)) {
            json_decref(want); /* written; the watch has not brought it back yet */
            continue;
        }
        if(!may_write || !leading()) {
            L->class_pending = 1;
            json_decref(want);
            continue;
        }
        json_t *patch = json_pack("{s:O}", "status", want);
        long code = 0;
        cozy_err err;
        if(patch && kube_patch_status(ctl_proc->client, &KUBE_GPUCLASSES, NULL, name, patch, &code, NULL, &err) ==
                        COZY_OK &&
           code / 100 == 2) {
            json_object_set(L->class_sent, name, want);
            metrics_counter_add("cozygpu_class_status_writes_total", "result=\"ok\"", 1);
            wrote = 1;
        } else {
            metrics_counter_add("cozygpu_class_status_writes_total", "result=\"error\"", 1);
            if(code != 404) { /* a class deleted meanwhile needs nothing */
                L->class_pending = 1;
                log_write(LOG_WARN, "binder", "cannot write GPUClass status", "gpuclass", name, "error",
                          code ? "the API server refused the patch" : err.msg, NULL);
            }
        }
        json_decref(patch);
        json_decref(want);
    }
    json_decref(classes);
    if(wrote)
        L->class_next_ms = now + CLASS_WRITE_GAP_MS;
}

static int has_gate(const json_t *pod)
{
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(json_object_get(pod, "spec"), "schedulingGates"), i, g)
    {
        const char *n = json_string_value(json_object_get(g, "name"));
        if(n && strcmp(n, GATE) == 0)
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
 * the same shape as cozygpu.pin.narrow, decision 0025; KEP-3838 and
 * kube-apiserver validateNodeAffinityMutation: on a gated pod a required
 * node affinity may be set when there is none, else each term may only
 * gain requirements and an empty term stays empty). The requirement
 * metadata.name In [node] goes into every term that has a requirement, or
 * into one new term when the pod has no required node affinity.
 * kube_update_retry's mutate: 1 when the gate is gone already, -1 for a
 * shape the API server would not have stored (left as it is) or when this
 * replica no longer leads. */
typedef struct pin_ctx {
    const char *node;
    int bad_shape; /* set when the pod's affinity is a shape the API server would not have stored */
} pin_ctx;

static int pin_mutate(json_t *pod, void *ctx)
{
    pin_ctx *pc = ctx;
    const char *node = pc->node;
    if(!has_gate(pod))
        return 1;
    json_t *spec = json_object_get(pod, "spec");
    json_t *aff = json_object_get(spec, "affinity");
    if(!json_is_object(aff)) {
        aff = json_object();
        json_object_set_new(spec, "affinity", aff);
    }
    json_t *na = json_object_get(aff, "nodeAffinity");
    if(!json_is_object(na)) {
        na = json_object();
        json_object_set_new(aff, "nodeAffinity", na);
    }
    json_t *req = json_object_get(na, "requiredDuringSchedulingIgnoredDuringExecution");
    json_t *requirement =
        json_pack("{s:s, s:s, s:[s]}", "key", "metadata.name", "operator", "In", "values", node);
    if(!json_is_object(req)) {
        json_object_set_new(na, "requiredDuringSchedulingIgnoredDuringExecution",
                            json_pack("{s:[{s:[o]}]}", "nodeSelectorTerms", "matchFields", requirement));
    } else {
        json_t *terms = json_object_get(req, "nodeSelectorTerms");
        if(!json_is_array(terms) || json_array_size(terms) == 0) {
            json_decref(requirement);
            pc->bad_shape = 1;
            return -1;
        }
        size_t i;
        json_t *term;
        json_array_foreach(terms, i, term)
        {
            if(!json_is_object(term)) {
                json_decref(requirement);
                pc->bad_shape = 1;
                return -1;
            }
            if(empty_term(term))
                continue; /* matches no node, and must stay so */
            json_t *mf = json_object_get(term, "matchFields");
            if(!json_is_array(mf)) {
                mf = json_array();
                json_object_set_new(term, "matchFields", mf);
            }
            const char *last = pin_of(json_array_get(mf, json_array_size(mf) - 1));
            if(last && strcmp(last, node) == 0)
                continue; /* pinned already (a retry, or the webhook's pin): no second copy */
            json_array_append(mf, requirement);
        }
        json_decref(requirement);
    }
    json_t *gates = json_object_get(spec, "schedulingGates");
    for(size_t i = json_array_size(gates); i-- > 0;) {
        const char *n = json_string_value(json_object_get(json_array_get(gates, i), "name"));
        if(n && strcmp(n, GATE) == 0)
            json_array_remove(gates, i);
    }
    if(json_array_size(gates) == 0)
        json_object_del(spec, "schedulingGates");
    return leading() ? 0 : -1; /* the last check before the write */
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
static const char *pinned_node(const json_t *pod)
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
static const char *set_node(loop *L, const char *ns, const char *vmi_name, char *buf, size_t n)
{
    json_t *vmi = kube_informer_get(ctl_cluster_informer(&KUBE_VMIS), ns, vmi_name);
    if(!vmi)
        return NULL;
    char nb[8192];
    const char *names[BINDER_MAX_SET_CLAIMS];
    size_t k = vmi_claims(vmi, nb, sizeof nb, names, BINDER_MAX_SET_CLAIMS, NULL);
    const char *node = NULL;
    for(size_t i = 0; i < k; i++) {
        /* the state's decision, and the API showing it (a write not sent
         * yet must not lead to a pin the claim's status does not back) */
        binder_claim_status s;
        json_t *c = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, names[i]);
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
static int pin_pod(loop *L, const char *key)
{
    char buf[600];
    const char *ns, *name;
    keyset_split(key, buf, sizeof buf, &ns, &name);
    json_t *pod = kube_informer_get(ctl_proc->pods_inf, ns, name);
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
        const char *ref = json_string_value(json_object_get(json_object_get(pmeta, "labels"), BINDREAD_CLASS_REFERENCE));
        const char *pin = annotation(pmeta, CLAIMS_ANNOTATION) || (ref && strcmp(ref, "true") == 0)
                              ? pinned_node(pod)
                              : NULL;
        const char *now = vmi ? set_node(L, ns, vmi, nodebuf, sizeof nodebuf) : NULL;
        json_t *v = vmi ? kube_informer_get(ctl_cluster_informer(&KUBE_VMIS), ns, vmi) : NULL;
        if(pin && now && strcmp(pin, now) != 0 && v && vmi_phase(v) == BINDER_VMI_PENDING &&
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
    if(node && leading()) {
        cozy_err err;
        json_t *out = NULL;
        pin_ctx pc = {node, 0};
        if(kube_update_retry(ctl_proc->client, &KUBE_PODS, ns, name, 0, pin_mutate, &pc, &out, &err) == COZY_OK) {
            log_write(LOG_INFO, "binder", "pinned the launcher pod to its claims' node and removed its gate",
                      "namespace", ns, "pod", name, "node", node, NULL);
            metrics_counter_add("cozygpu_binder_pod_pins_total", NULL, 1);
            done = 1;
        } else if(pc.bad_shape) {
            /* the API server refuses such a pod; a double or a hand-made
             * object can hold one: said once, not tried again */
            log_write(LOG_WARN, "binder",
                      "cannot pin the launcher pod: its required node affinity has no term or a term that is not "
                      "an object; it stays gated",
                      "namespace", ns, "pod", name, NULL);
            done = 1;
        } else
            log_write(LOG_WARN, "binder", "cannot pin the launcher pod", "namespace", ns, "pod", name, "error",
                      err.msg, NULL);
        json_decref(out);
    }
    json_decref(pod);
    return done;
}

/* --- one batch --- */

typedef struct class_walk {
    loop *L;
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
static void recheck_raw(loop *L, dirty **nodes)
{
    dirty *d, *t;
    HASH_ITER(hh, L->recheck, d, t)
    {
        char buf[600], a[256], b[256];
        const char *ns, *name, *ca, *cb;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        json_t *vmi = kube_informer_get(ctl_cluster_informer(&KUBE_VMIS), ns, name);
        raw_update(L, d->key, vmi, &ca, &cb, a, b, sizeof a);
        if(ca)
            keyset_add(nodes, ca);
        if(cb)
            keyset_add(nodes, cb);
        json_decref(vmi);
    }
    keyset_free(&L->recheck);
}

static void apply_dirty(loop *L, dirty *batch)
{
    int classes_changed = 0, kubevirt_changed = 0, sets_changed = 0;
    dirty *d, *t;
    /* classes first (a node's offers depend on them), then claims, sets,
     * the raw-name use that depends on sets, and last what nodes offer */
    json_t *changed = json_object(); /* classes changed in this batch */
    HASH_ITER(hh, batch, d, t)
    {
        if(d->key[0] == K_CLASS) {
            if(apply_class(L, d->key + 3)) {
                json_object_set_new(changed, d->key + 3, json_true());
                classes_changed = 1;
            }
            L->view_dirty = 1;
        } else if(d->key[0] == K_KUBEVIRT)
            kubevirt_changed = 1;
        else if(d->key[0] == K_NAMESPACE || d->key[0] == K_QUOTA)
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
    HASH_ITER(hh, batch, d, t)
    {
        if(d->key[0] != K_CLAIM)
            continue;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key + 2, buf, sizeof buf, &ns, &name);
        json_t *obj = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, name);
        count_claim(L, d->key + 2, obj);
        binder_claim_status s;
        int known = binder_state_claim_get(L->st, ns, name, &s) == BINDER_OK;
        const char *uid = obj ? kobject_meta_str(obj, "uid") : NULL;
        const char *had = json_string_value(json_object_get(L->uids, d->key + 2));
        if(known && (!obj || (uid && had && strcmp(uid, had) != 0))) {
            /* gone, or deleted and created again under the same name
             * (another uid: a new claim, with its own class and count) */
            bindpolicy_on_delete(&L->bp, ns, name);
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
    dirty *vsets = NULL;
    HASH_ITER(hh, batch, d, t)
    {
        char pk[600] = "";
        if(d->key[0] == K_PVC)
            snprintf(pk, sizeof pk, "%s", d->key + 2);
        else if(d->key[0] == K_PV) {
            json_t *pv = kube_informer_get(ctl_proc->pvs_inf, NULL, d->key + 3);
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
        apply_set(L, ns, name);
    }
    keyset_free(&vsets);
    HASH_ITER(hh, batch, d, t)
    {
        if(d->key[0] == K_VM || d->key[0] == K_VMI) {
            char buf[600];
            const char *ns, *name;
            keyset_split(d->key + 2, buf, sizeof buf, &ns, &name);
            apply_set(L, ns, name);
            sets_changed = 1;
        } else if(d->key[0] == K_POD)
            keyset_add(&L->gated, d->key + 2);
    }
    if(sets_changed && L->waiting_sets) {
        /* a claim arrived or a set let go of one: the sets that named a
         * claim not known yet, or held by a set, try again */
        dirty *w = L->waiting_sets, *wt;
        L->waiting_sets = NULL;
        HASH_ITER(hh, w, d, wt)
        {
            char buf[600];
            const char *ns, *name;
            keyset_split(d->key, buf, sizeof buf, &ns, &name);
            apply_set(L, ns, name);
        }
        keyset_free(&w);
    }
    dirty *nodes = NULL;
    HASH_ITER(hh, batch, d, t)
    {
        if(d->key[0] == K_VMI)
            keyset_add(&L->recheck, d->key + 2);
        else if(d->key[0] == K_NODE || d->key[0] == K_GPUNODE)
            keyset_add(&nodes, d->key + 3);
    }
    recheck_raw(L, &nodes);
    json_t *classes = kube_informer_list(ctl_proc->classes_inf);
    /* the batch's nodes first (apply_node takes a deleted one out of the
     * state), then, when what every node offers may have changed, each
     * node the cache holds */
    json_t *kv = first_kubevirt();
    HASH_ITER(hh, nodes, d, t) apply_node(L, d->key, classes, kv);
    json_decref(kv);
    if(classes_changed || kubevirt_changed)
        apply_all_nodes(L, classes);
    keyset_free(&nodes);
    json_decref(classes);
}


/* --- fairness: one tenant's burst does not hold back another's writes
 * (issue 20, "Fairness") --- */

/* Writes per flush stop after this long (ms); the loop wakes again at once
 * for the rest, after taking the events that came meanwhile. */
#define FLUSH_BUDGET_MS 200

/* Whether the current flush has used its budget; sets L->more when so. */
static int flush_spent(loop *L)
{
    if(clock_mono_ms() < L->flush_until)
        return 0;
    L->more = 1;
    return 1;
}

/* The length of the namespace part of key "ns/name". */
static size_t key_ns_len(const char *key)
{
    const char *slash = strchr(key, '/');
    return slash ? (size_t)(slash - key) : strlen(key);
}

/* A set's keys ("ns/name") in fair order: each namespace's first key,
 * then each one's second, ... (ties by key), so writes in this order go
 * round robin across tenants. An array of n entries (free it), NULL when
 * the set is empty or out of memory. O(n log n). */
typedef struct ranked {
    dirty *d;
    unsigned rank; /* its place among its namespace's keys */
} ranked;

static int cmp_ranked(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if(x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return strcmp(x->d->key, y->d->key);
}

static ranked *fair_order(dirty *set, size_t *n)
{
    *n = HASH_COUNT(set);
    ranked *r = *n ? calloc(*n, sizeof *r) : NULL;
    json_t *seen = json_object();
    if(!r || !seen) {
        free(r);
        json_decref(seen);
        *n = 0;
        return NULL;
    }
    size_t i = 0;
    dirty *d, *t;
    HASH_ITER(hh, set, d, t)
    {
        char ns[300];
        size_t l = key_ns_len(d->key);
        snprintf(ns, sizeof ns, "%.*s", (int)(l < sizeof ns ? l : sizeof ns - 1), d->key);
        json_int_t k = json_integer_value(json_object_get(seen, ns));
        json_object_set_new(seen, ns, json_integer(k + 1));
        r[i++] = (ranked){d, (unsigned)k};
    }
    json_decref(seen);
    qsort(r, *n, sizeof *r, cmp_ranked);
    return r;
}

/* One status write to send: what it does to the API's bookings. */
typedef struct pending_write {
    dirty *d;
    const char *class_name;
    uint32_t count;
    char rel[256];  /* the node the API shows it on and the state moved it from ("" none) */
    char book[256]; /* the node the state holds it on and the API does not show ("" none) */
} pending_write;


/* Units per "node/class" that the API shows booked beyond the state:
 * + a release not written yet, - a booking not written yet. */
typedef struct api_delta {
    char *key;
    long units;
    UT_hash_handle hh;
} api_delta;

static void delta_add(api_delta **m, const char *node, const char *cls, long units)
{
    char key[600];
    snprintf(key, sizeof key, "%s/%s", node, cls);
    api_delta *x;
    HASH_FIND_STR(*m, key, x);
    if(!x) {
        x = calloc(1, sizeof *x);
        if(!x || !(x->key = strdup(key))) {
            free(x);
            return;
        }
        HASH_ADD_KEYPTR(hh, *m, x->key, strlen(x->key), x);
    }
    x->units += units;
}

static long delta_get(api_delta *m, const char *node, const char *cls)
{
    char key[600];
    snprintf(key, sizeof key, "%s/%s", node, cls);
    api_delta *x;
    HASH_FIND_STR(m, key, x);
    return x ? x->units : 0;
}

/* Sends the status writes in an order in which the API never shows a node
 * holding more units of a class than it offers (issue 12 item 7), even
 * when some writes fail: what the API shows booked on a node is what the
 * state holds plus the releases not written yet minus the bookings not
 * written yet; a write that books is sent only when that, plus its units,
 * fits the node's offer. Releases always fit, so a failed release holds
 * back exactly the bookings that need its units, and a swap between two
 * nodes goes through (the state bound the first move before releasing
 * anything). Rounds repeat while one makes progress. */
static void flush_status(loop *L)
{
    size_t n, k = 0;
    ranked *order = fair_order(L->writes, &n); /* round robin across namespaces */
    pending_write *w = n ? calloc(n, sizeof *w) : NULL;
    if(!w) {
        free(order);
        return;
    }
    api_delta *delta = NULL;
    for(size_t j = 0; j < n; j++) {
        dirty *d = order[j].d;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        binder_claim_status s;
        json_t *obj = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, name);
        if(binder_state_claim_get(L->st, ns, name, &s) != BINDER_OK || !obj) {
            json_decref(obj);
            keyset_drop(&L->writes, d); /* gone: nothing to write */
            continue;
        }
        const char *api = json_string_value(json_object_get(json_object_get(obj, "status"), "node"));
        pending_write *p = &w[k++];
        p->d = d;
        p->class_name = s.class_name;
        p->count = s.count;
        if(api && (!s.node || strcmp(api, s.node) != 0)) {
            snprintf(p->rel, sizeof p->rel, "%s", api);
            delta_add(&delta, p->rel, s.class_name, (long)s.count);
        }
        if(s.node && (!api || strcmp(api, s.node) != 0)) {
            snprintf(p->book, sizeof p->book, "%s", s.node);
            delta_add(&delta, p->book, s.class_name, -(long)s.count);
        }
        json_decref(obj);
    }
    const binder_index *ix = binder_state_index(L->st);
    for(int progress = 1; progress && leading() && !flush_spent(L);) {
        progress = 0;
        for(size_t i = 0; i < k; i++) {
            pending_write *p = &w[i];
            if(!p->d)
                continue;
            if(flush_spent(L))
                break;
            if(*p->book) {
                binder_slot_view v;
                if(binder_node_slot(ix, p->book, p->class_name, &v) != BINDER_OK)
                    continue;
                long shown = (long)v.bound + delta_get(delta, p->book, p->class_name);
                if(shown + (long)p->count > (long)v.offered)
                    continue; /* its units are still shown taken: after the release */
            }
            if(!leading())
                break;
            if(!write_claim(L, p->d->key))
                continue;
            L->progressed = 1;
            if(*p->rel)
                delta_add(&delta, p->rel, p->class_name, -(long)p->count);
            if(*p->book)
                delta_add(&delta, p->book, p->class_name, (long)p->count);
            keyset_drop(&L->writes, p->d);
            p->d = NULL;
            progress = 1;
        }
    }
    api_delta *x, *xt;
    HASH_ITER(hh, delta, x, xt)
    {
        HASH_DEL(delta, x);
        free(x->key);
        free(x);
    }
    free(w);
    free(order);
}

typedef struct fin_ctx {
    int add;         /* 1: add the finalizer (object not being deleted); 0: remove it */
    const char *fin; /* which: PROTECTION or CLASS_PROTECTION */
} fin_ctx;

/* kube_update_retry's mutate for a protection finalizer (fc->fin). */
static int fin_mutate(json_t *obj, void *ctx)
{
    fin_ctx *fc = ctx;
    const char *fin = fc->fin;
    json_t *meta = json_object_get(obj, "metadata");
    json_t *fins = json_object_get(meta, "finalizers");
    if(fc->add) {
        if(kobject_meta_str(obj, "deletionTimestamp") || has_finalizer(obj, fin))
            return 1; /* an object being deleted takes no new finalizer */
        if(!json_is_array(fins)) {
            fins = json_array();
            json_object_set_new(meta, "finalizers", fins);
        }
        json_array_append_new(fins, json_string(fin));
    } else {
        if(!has_finalizer(obj, fin))
            return 1;
        for(size_t i = json_array_size(fins); i-- > 0;)
            if(strcmp(json_string_value(json_array_get(fins, i)) ? json_string_value(json_array_get(fins, i)) : "",
                      fin) == 0)
                json_array_remove(fins, i);
    }
    return leading() ? 0 : -1;
}

/* The class protection finalizer (decision 0037): added to each queued
 * class not being deleted, removed from a class being deleted once no
 * claim of it is known (L->class_claims; any phase, template claims
 * included). A class that needs nothing, or is gone, leaves the queue; a
 * failed write stays queued for the next flush (at most a second away),
 * its first failure logged (decision 0037). */
static void flush_class_protection(loop *L)
{
    dirty *d, *t;
    HASH_ITER(hh, L->class_fin, d, t)
    {
        if(!leading())
            return;
        json_t *c = kube_informer_get(ctl_proc->classes_inf, NULL, d->key);
        int exists = c != NULL;
        int deleting = c && kobject_meta_str(c, "deletionTimestamp") != NULL;
        int has = c && has_finalizer(c, CLASS_PROTECTION);
        json_decref(c);
        fin_ctx fc = {!deleting, CLASS_PROTECTION};
        if(!exists || (deleting ? !has || json_integer_value(json_object_get(L->class_claims, d->key)) > 0 : has)) {
            keyset_drop(&L->class_fin, d); /* gone, in use, or as it should be: a later event queues it again */
            continue;
        }
        cozy_err err;
        if(kube_update_retry(ctl_proc->client, &KUBE_GPUCLASSES, NULL, d->key, 0, fin_mutate, &fc, NULL, &err) ==
               COZY_OK ||
           strstr(err.msg, "NotFound") || strstr(err.msg, "404")) {
            if(deleting)
                log_write(LOG_INFO, "binder", "released a deleted GPUClass no claim names any more", "gpuclass", d->key,
                          NULL);
            json_object_del(L->class_fin_failed, d->key);
            keyset_drop(&L->class_fin, d);
        } else if(!json_object_get(L->class_fin_failed, d->key)) {
            /* tried again at every flush (a webhook down, a conflict); logged once */
            log_write(LOG_WARN, "binder", "cannot write the GPUClass protection finalizer; trying again", "gpuclass",
                      d->key, "error", err.msg, NULL);
            json_object_set_new(L->class_fin_failed, d->key, json_true());
        }
    }
}

/* Whether claim ns/name is in use, so that its deletion waits: Attached,
 * Lost while its VMI may still run on its node (WaitingForVMIEnd), or
 * Bound for a VMI scheduled or running (its pod holds the devices);
 * bindread_claim_in_use over the leader's state. */
static int claim_in_use(loop *L, const char *ns, const char *name)
{
    return bindread_claim_in_use(L->st, ns, name);
}

/* Adds the protection finalizer where it is missing and removes it from
 * the claims being deleted that nothing uses any more. */
static void flush_protection(loop *L)
{
    dirty *d, *t;
    size_t n;
    ranked *order = fair_order(L->protect, &n);
    for(size_t i = 0; i < n; i++) {
        if(!leading() || flush_spent(L))
            break;
        d = order[i].d;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        fin_ctx fc = {1, PROTECTION};
        cozy_err err;
        if(kube_update_retry(ctl_proc->client, &KUBE_GPUCLAIMS, ns, name, 0, fin_mutate, &fc, NULL, &err) ==
               COZY_OK ||
           strstr(err.msg, "NotFound") || strstr(err.msg, "404")) {
            keyset_drop(&L->protect, d);
            L->progressed = 1;
        }
    }
    free(order);
    HASH_ITER(hh, L->deleting, d, t)
    {
        if(!leading() || flush_spent(L))
            return;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        if(claim_in_use(L, ns, name))
            continue; /* its VMI still runs: the hold stays until it ends */
        fin_ctx fc = {0, PROTECTION};
        cozy_err err;
        if(kube_update_retry(ctl_proc->client, &KUBE_GPUCLAIMS, ns, name, 0, fin_mutate, &fc, NULL, &err) ==
               COZY_OK ||
           strstr(err.msg, "NotFound") || strstr(err.msg, "404")) {
            log_write(LOG_INFO, "binder", "released a deleted claim nothing uses any more", "namespace", ns,
                      "gpuclaim", name, NULL);
            keyset_drop(&L->deleting, d);
        }
    }
}

/* Sends the writes the last passes left: statuses (flush_status), VMI
 * deletions, pins. */
/* Creates the template claims queued by template_claims and deletes
 * those of final VMIs. A create refused (a budget at admission, a name
 * taken by a claim of someone else) is logged and dropped: the VMI's
 * launcher pod stays gated, and the next change of the VMI tries again. */
static void flush_templates(loop *L)
{
    const char *key;
    json_t *v, *tmp;
    json_object_foreach_safe(L->creates, tmp, key, v)
    {
        if(!leading())
            return;
        const char *ns = kobject_meta_str(v, "namespace"), *name = kobject_meta_str(v, "name");
        long code = 0;
        json_t *out = NULL;
        cozy_err err;
        if(kube_create(ctl_proc->client, &KUBE_GPUCLAIMS, ns, v, &code, &out, &err) != COZY_OK) {
            json_decref(out);
            continue; /* transport: tried again */
        }
        if(code / 100 == 2)
            log_write(LOG_INFO, "binder", "created a template claim for its VMI", "namespace", ns, "gpuclaim", name,
                      NULL);
        else if(code != 409) {
            const char *m = json_string_value(json_object_get(out, "message"));
            log_write(LOG_WARN, "binder", "cannot create the template claim; the VMI's launcher pod stays gated",
                      "namespace", ns, "gpuclaim", name, "error", m ? m : "", NULL);
        }
        json_decref(out);
        json_object_del(L->creates, key);
    }
    json_object_foreach_safe(L->tdeletes, tmp, key, v)
    {
        if(!leading())
            return;
        char buf[600];
        const char *ns, *name;
        keyset_split(key, buf, sizeof buf, &ns, &name);
        long code = 0;
        cozy_err err;
        char *path = kube_path(&KUBE_GPUCLAIMS, ns, name, NULL);
        json_t *opts = json_pack("{s:s, s:s, s:{s:s}}", "apiVersion", "v1", "kind", "DeleteOptions", "preconditions",
                                 "uid", json_string_value(v) ? json_string_value(v) : "");
        /* 409: the uid precondition failed (another object of the name) */
        if(path && kube_request(ctl_proc->client, "DELETE", path, NULL, opts, &code, NULL, &err) == COZY_OK &&
           (code / 100 == 2 || code == 404 || code == 409))
            json_object_del(L->tdeletes, key);
        json_decref(opts);
        free(path);
    }
}

static void flush(loop *L)
{
    dirty *d, *t;
    L->more = 0;
    L->progressed = 0;
    L->flush_until = clock_mono_ms() + FLUSH_BUDGET_MS;
    flush_status(L);
    flush_classes(L);
    flush_protection(L);
    flush_class_protection(L);
    flush_templates(L);
    HASH_ITER(hh, L->deletes, d, t)
    {
        if(!leading())
            return;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        long code = 0;
        cozy_err err;
        if(kube_delete(ctl_proc->client, &KUBE_VMIS, ns, name, &code, NULL, &err) == COZY_OK &&
           (code / 100 == 2 || code == 404))
            keyset_drop(&L->deletes, d);
    }
    size_t n;
    ranked *order = fair_order(L->gated, &n);
    for(size_t i = 0; i < n; i++) {
        if(!leading() || flush_spent(L))
            break;
        if(pin_pod(L, order[i].d->key)) {
            keyset_drop(&L->gated, order[i].d);
            L->progressed = 1;
        }
    }
    free(order);
    /* writes that only failed wait for the next wake (at most a second,
     * or an event), not a retry at once against an API server in trouble */
    if(!L->progressed)
        L->more = 0;
}

void *ctl_bind_main(void *arg)
{
    (void)arg;
    loop L = {0};
    L.raw_by_node = json_object();
    L.uids = json_object();
    L.creates = json_object();
    L.refused = json_object();
    L.pvc_sets = json_object();
    L.tdeletes = json_object();
    L.class_sent = json_object();
    L.class_names = json_object();
    L.class_specs = json_object();
    L.claim_class = json_object();
    L.class_claims = json_object();
    L.class_fin_failed = json_object();
    engine_options eo = ctl_proc->eo;
    eo.bundle_dir = NULL;
    cozy_err err;
    if(engine_open_runtime(&L.e, &eo, "binder", &err) != COZY_OK) {
        log_write(LOG_ERROR, "binder", "cannot open runtime.binder; the binder does not run", "error", err.msg, NULL);
        json_decref(L.raw_by_node);
        return NULL;
    }
    binder_hooks hooks = {.ud = &L, .choose = on_choose, .budget = on_budget, .event = on_event,
                          .delete_vmi = on_delete_vmi};
    for(;;) {
        /* a second at most: retries of writes left by a 409 or an error;
         * sooner when a GPUClass status waits for its write gap */
        long wait = L.more ? 0 : 1000; /* writes left by the last flush's budget: at once */
        if(L.class_pending && !L.more) {
            long long left = L.class_next_ms - clock_mono_ms();
            wait = left < 10 ? 10 : left > 1000 ? 1000 : (long)left;
        }
        int stop;
        rv_seen taken[RV_RESOURCES];
        dirty *batch = ctl_key_wait_take(&g_dirty, &g_wake, wait, &stop, rv_take, taken);
        if(stop)
            break;
        if(!leading() || !kube_watcher_synced(ctl_proc->watcher)) {
            if(L.st)
                log_write(LOG_INFO, "binder", "not leading: the binder's state is dropped", NULL);
            loop_drop(&L);
            keyset_free(&batch);
            continue;
        }
        int had_batch = batch != NULL;
        if(!L.st) {
            keyset_free(&batch); /* the caches hold all of it */
            if(build(&L) != 0)
                continue;
            ctl_bundle_unref(L.peb); /* a new state: the usage table is fed again */
            L.peb = NULL;
            engine_close(L.pe);
            L.pe = NULL;
            L.full_pending = 1;
        } else if(batch) {
            apply_dirty(&L, batch);
            keyset_free(&batch);
        }
        if(policy_ready(&L) != 0) {
            /* no bind without the budget check: the state stays and follows
             * the caches until a bundle serves, then gets its full pass
             * (dropping it here rebuilt it from the caches on every wake,
             * about 20 times a second with a broken ConfigMap at start-up:
             * issue 20, defect 12) */
            if(!L.policy_waiting)
                log_write(LOG_WARN, "binder", "no policy bundle serves: nothing is bound until one does", NULL);
            L.policy_waiting = 1;
            continue;
        }
        L.policy_waiting = 0;
        if(L.full_pending) {
            binder_reconcile_all(L.st, &hooks);
            bindpolicy_settle(&L.bp);
            L.full_pending = 0;
            metrics_counter_add("cozygpu_binder_passes_total", "kind=\"full\"", 1);
        } else if(had_batch) {
            binder_reconcile(L.st, &hooks);
            bindpolicy_settle(&L.bp);
            metrics_counter_add("cozygpu_binder_passes_total", "kind=\"incremental\"", 1);
        }
        /* a pass whose transitions need another (room freed by a move is
         * retried by the next pass, decision 0023), or whose claims no
         * longer cover (or now cover) a VMI's devices */
        for(int i = 0; i < 4; i++) {
            dirty *nodes = NULL, *d, *t;
            recheck_raw(&L, &nodes);
            if(nodes) {
                json_t *classes = kube_informer_list(ctl_proc->classes_inf);
                json_t *kv = first_kubevirt();
                HASH_ITER(hh, nodes, d, t) apply_node(&L, d->key, classes, kv);
                json_decref(kv);
                json_decref(classes);
                keyset_free(&nodes);
            }
            size_t n = binder_reconcile(L.st, &hooks);
            bindpolicy_settle(&L.bp);
            if(n == 0 && !L.recheck)
                break;
        }
        /* what the last pass left to look at (L.recheck) waits for the next
         * wake, at most a second away: never dropped */
        flush(&L);
        if(!L.more && leading())
            publish_applied(taken);
    }
    loop_drop(&L);
    engine_close(L.pe);
    ctl_bundle_unref(L.peb);
    json_decref(L.raw_by_node);
    json_decref(L.uids);
    json_decref(L.creates);
    json_decref(L.refused);
    json_decref(L.pvc_sets);
    json_decref(L.tdeletes);
    json_decref(L.class_sent);
    json_decref(L.class_names);
    json_decref(L.class_specs);
    json_decref(L.claim_class);
    json_decref(L.class_claims);
    json_decref(L.class_fin_failed);
    engine_close(L.e);
    pthread_mutex_lock(&ctl_proc->mu);
    keyset_free(&g_dirty);
    pthread_mutex_unlock(&ctl_proc->mu);
    return NULL;
}
