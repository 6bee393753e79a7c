/* sim_scenario.c — a scenario's world as the objects a cluster would hold
 * (sim.h), so that the placement model reads it as the leader reads a
 * cluster (decision 0041):
 *   class  a GPUClass (spec.mode Passthrough, spec.resourceName as given
 *          or simulate.cozygpu.io/<class>, onCordon, tolerations; being
 *          deleted: deletionTimestamp, held by the class protection
 *          finalizer), and an entry of the KubeVirt CR's
 *          permittedHostDevices for a made-up PCI device of the class (10DE:F001, F002, ... in order) of the
 *          class;
 *   node   a Node (Ready condition, spec.unschedulable, taints, labels,
 *          status.allocatable of each class's resource name, a bootID)
 *          and its GPUNode, owned by it, listing one vfio-pci GPU of the
 *          class's device per unit, each in its own IOMMU group, as the
 *          agent writes them (status.layout.pending for layoutPending):
 *          cozygpu.capacity then offers exactly the units given;
 *   claim  a GPUClaim (spec.class, spec.count);
 *   vm     a VirtualMachine: spec.runStrategy, its template naming its
 *          claims (gpu.cozystack.io/claims) with one gpus entry per unit,
 *          or (gpus) labelled gpu.cozystack.io/class-reference with one
 *          gpus entry per unit of each class (template claims, decision
 *          0027); volumeNodes: a PVC bound to a PV whose required node
 *          affinity is kubernetes.io/hostname In those nodes;
 *   namespaces, resourceQuotas  as given.
 * Steps edit those objects as kubectl, virtctl or the node would.
 */
#include "cli/sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binder/binder.h"
#include "format/kobject.h"
#include "placement/read.h"

#define SIM_BOOT "3b1f5c2e-6d0a-4f8e-9a7b-2c4d6e8f0a1b"
#define CLASS_PROTECTION "gpu.cozystack.io/class-protection"
#define SIM_MAX_TAINTS 16
#define SIM_MAX_CLASSES 4000

/* ------------------------------------------------------------ classes */

/* The KubeVirt CR the scenario's classes are permitted in: the first one
 * (a snapshot's), or cozy-kubevirt/kubevirt made here. A new reference. */
static json_t *kubevirt(sim *s)
{
    json_t *all = sim_store_list(s->st, PLACEMENT_KUBEVIRT);
    json_t *kv = json_incref(json_array_get(all, 0));
    json_decref(all);
    if(kv)
        return kv;
    json_t *o = json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:{s:{s:[]}}}}", "apiVersion", "kubevirt.io/v1", "kind", "KubeVirt",
                          "metadata", "name", "kubevirt", "namespace", "cozy-kubevirt", "spec", "configuration",
                          "permittedHostDevices", "pciHostDevices");
    sim_store_create(s->st, PLACEMENT_KUBEVIRT, o);
    return sim_store_get(s->st, PLACEMENT_KUBEVIRT, "cozy-kubevirt", "kubevirt");
}

/* Adds pciHostDevices entry {selector, resourceName} to the KubeVirt CR. */
static void permit(sim *s, const char *selector, const char *rn)
{
    json_t *kv = kubevirt(s);
    json_t *c = json_deep_copy(kv);
    json_decref(kv);
    json_t *cfg = json_object_get(json_object_get(c, "spec"), "configuration");
    if(!json_is_object(cfg)) {
        cfg = json_object();
        json_object_set_new(json_object_get(c, "spec"), "configuration", cfg);
    }
    json_t *phd = json_object_get(cfg, "permittedHostDevices");
    if(!json_is_object(phd))
        json_object_set_new(cfg, "permittedHostDevices", phd = json_object());
    json_t *pci = json_object_get(phd, "pciHostDevices");
    if(!json_is_array(pci))
        json_object_set_new(phd, "pciHostDevices", pci = json_array());
    json_array_append_new(pci, json_pack("{s:s,s:s}", "pciVendorSelector", selector, "resourceName", rn));
    sim_store_replace(s->st, PLACEMENT_KUBEVIRT, c);
}

static const char *class_rn(sim *s, const char *cls)
{
    return json_string_value(json_object_get(json_object_get(s->classes, cls), "resourceName"));
}

static const char *class_device(sim *s, const char *cls)
{
    return json_string_value(json_object_get(json_object_get(s->classes, cls), "device"));
}

void sim_class_known(sim *s, const char *name, const char *rn)
{
    char made[300], dev[16], sel[24];
    if(!*rn) {
        snprintf(made, sizeof made, "simulate.cozygpu.io/%s", name);
        rn = made;
    }
    snprintf(dev, sizeof dev, "f%03x", ++s->next_device);
    snprintf(sel, sizeof sel, "10DE:F%03X", s->next_device);
    json_object_set_new(s->classes, name, json_pack("{s:s,s:s}", "resourceName", rn, "device", dev));
    permit(s, sel, rn);
}

static void def_class(sim *s, json_t *c, const char *path)
{
    static const char *const keys[] = {"name", "onCordon", "deleting", "tolerations", "resourceName", NULL};
    if(sim_check_keys(s, c, path, keys))
        return;
    const char *name = sim_str_field(s, c, "name", path, NULL);
    const char *oc = sim_str_field(s, c, "onCordon", path, "Move");
    const char *rn = sim_str_field(s, c, "resourceName", path, "");
    int deleting = sim_bool_field(s, c, "deleting", path, 0);
    if(s->bad[0])
        return;
    if(strlen(name) > BINDER_MAX_NAME - 40)
        return sim_bad(s, "%s.name: longer than %d", path, BINDER_MAX_NAME - 40);
    if(json_object_get(s->classes, name))
        return sim_bad(s, "%s.name: class %s is defined twice (or is in the snapshot)", path, name);
    if(strcmp(oc, "Move") && strcmp(oc, "Stay"))
        return sim_bad(s, "%s.onCordon: must be Move or Stay, not \"%s\"", path, oc);
    json_t *tl = json_object_get(c, "tolerations");
    if(tl && !json_is_array(tl))
        return sim_bad(s, "%s.tolerations: must be a list", path);
    if(json_array_size(tl) > 32)
        return sim_bad(s, "%s.tolerations: more than 32", path);
    json_t *tols = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tl, i, t)
    {
        char p[300];
        snprintf(p, sizeof p, "%s.tolerations[%zu]", path, i);
        static const char *const tk[] = {"key", "operator", "value", "effect", "tolerationSeconds", NULL};
        if(sim_check_keys(s, t, p, tk))
            break;
        const char *key = sim_str_field(s, t, "key", p, "");
        const char *op = sim_str_field(s, t, "operator", p, "Equal");
        const char *val = sim_str_field(s, t, "value", p, "");
        const char *eff = sim_str_field(s, t, "effect", p, "");
        if(s->bad[0])
            break;
        if(strcmp(op, "Exists") && strcmp(op, "Equal")) {
            sim_bad(s, "%s.operator: must be Exists or Equal", p);
            break;
        }
        json_t *o = json_pack("{s:s}", "operator", op);
        if(*key)
            json_object_set_new(o, "key", json_string(key));
        if(*val)
            json_object_set_new(o, "value", json_string(val));
        if(*eff)
            json_object_set_new(o, "effect", json_string(eff));
        json_array_append_new(tols, o);
    }
    if(s->bad[0] || json_object_size(s->classes) >= SIM_MAX_CLASSES) {
        if(!s->bad[0])
            sim_bad(s, "%s: more than %d classes", path, SIM_MAX_CLASSES);
        json_decref(tols);
        return;
    }
    char made[300];
    if(!*rn) {
        snprintf(made, sizeof made, "simulate.cozygpu.io/%s", name);
        rn = made;
    }
    const char *k;
    json_t *v;
    json_object_foreach(s->classes, k, v)
    {
        if(!strcmp(json_string_value(json_object_get(v, "resourceName")), rn)) {
            json_decref(tols);
            return sim_bad(s, "%s.resourceName: class %s has %s already (one resource name, one class)", path, k, rn);
        }
    }
    sim_class_known(s, name, rn);
    json_t *spec = json_pack("{s:s,s:s,s:s,s:o}", "mode", "Passthrough", "resourceName", rn, "onCordon", oc,
                             "tolerations", tols);
    json_t *obj = json_pack("{s:s,s:s,s:{s:s},s:o}", "apiVersion", "cozystack.io/v1alpha1", "kind", "GPUClass",
                            "metadata", "name", name, "spec", spec);
    if(deleting) {
        /* being deleted, held by the leader's finalizer (decision 0037) */
        json_t *md = json_object_get(obj, "metadata");
        json_object_set_new(md, "finalizers", json_pack("[s]", CLASS_PROTECTION));
        json_object_set_new(md, "deletionTimestamp", json_string("2026-01-01T00:00:00Z"));
    }
    sim_store_create(s->st, PLACEMENT_CLASS, obj);
}

/* ------------------------------------------------------------ nodes */

/* The GPUNode status of node `name`: one vfio-pci GPU per unit of each
 * class in s->caps[name], as the agent writes it. */
static json_t *gpunode_status(sim *s, const char *name, int layout_pending)
{
    json_t *fns = json_array();
    const char *cls;
    json_t *u;
    int bus = 0x10;
    json_object_foreach(json_object_get(s->caps, name), cls, u)
    {
        for(json_int_t i = 0; i < json_integer_value(u); i++, bus++) {
            char addr[32];
            snprintf(addr, sizeof addr, "0000:%02x:%02x.0", (bus >> 5) & 0xff, bus & 0x1f);
            json_array_append_new(fns, json_pack("{s:s,s:s,s:s,s:s,s:s,s:b,s:i,s:{s:s}}", "address", addr, "vendorID",
                                                 "10de", "deviceID", class_device(s, cls), "role", "GPU", "driver",
                                                 "vfio-pci", "counted", 1, "iommuGroup", ++s->next_group, "health",
                                                 "status", "Healthy"));
        }
    }
    /* the agent has acted on the (only) generation of its spec */
    return json_pack("{s:s,s:o,s:{s:b},s:i}", "bootID", SIM_BOOT, "functions", fns, "layout", "pending",
                     layout_pending, "observedGeneration", 1);
}

/* Node `name`'s status.allocatable: each class's resource name at its
 * units, and what a kubelet reports beside. */
static json_t *allocatable(sim *s, const char *name)
{
    json_t *a = json_pack("{s:s,s:s,s:s}", "cpu", "64", "memory", "512Gi", "pods", "110");
    const char *cls;
    json_t *u;
    json_object_foreach(json_object_get(s->caps, name), cls, u)
    {
        char n[32];
        snprintf(n, sizeof n, "%lld", (long long)json_integer_value(u));
        json_object_set_new(a, class_rn(s, cls), json_string(n));
    }
    return a;
}

static json_t *ready_condition(int ready)
{
    return json_pack("[{s:s,s:s,s:s}]", "type", "Ready", "status", ready ? "True" : "False", "reason",
                     ready ? "KubeletReady" : "NodeStatusUnknown");
}

static void def_node(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"name",          "capacity",      "taints", "labels", "ready",
                                       "unschedulable", "layoutPending", NULL};
    if(sim_check_keys(s, o, path, keys))
        return;
    const char *name = sim_str_field(s, o, "name", path, NULL);
    int ready = sim_bool_field(s, o, "ready", path, 1);
    int cordoned = sim_bool_field(s, o, "unschedulable", path, 0);
    int pending = sim_bool_field(s, o, "layoutPending", path, 0);
    if(s->bad[0])
        return;
    if(strlen(name) > BINDER_MAX_NAME)
        return sim_bad(s, "%s.name: longer than %d", path, BINDER_MAX_NAME);
    json_t *have = sim_store_get(s->st, PLACEMENT_NODE, NULL, name);
    json_decref(have);
    if(have)
        return sim_bad(s, "%s.name: node %s is defined twice", path, name);
    json_t *cap = json_object_get(o, "capacity");
    if(cap && !json_is_object(cap))
        return sim_bad(s, "%s.capacity: must be a mapping of class to units", path);
    const char *k;
    json_t *v;
    json_t *caps = json_object();
    json_object_foreach(cap, k, v)
    {
        if(!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > BINDER_MAX_UNITS) {
            sim_bad(s, "%s.capacity.%s: must be a whole number of units, 0 to %d", path, k, BINDER_MAX_UNITS);
            break;
        }
        if(!json_object_get(s->classes, k)) {
            sim_bad(s, "%s.capacity.%s: unknown class", path, k);
            break;
        }
        json_object_set(caps, k, v);
    }
    json_t *tl = json_object_get(o, "taints");
    if(tl && !json_is_array(tl) && !s->bad[0])
        sim_bad(s, "%s.taints: must be a list", path);
    json_t *taints = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tl, i, t)
    {
        if(s->bad[0])
            break;
        char p[300];
        snprintf(p, sizeof p, "%s.taints[%zu]", path, i);
        static const char *const tk[] = {"key", "value", "effect", NULL};
        if(sim_check_keys(s, t, p, tk))
            break;
        if(i == SIM_MAX_TAINTS) {
            sim_bad(s, "%s: more than %d taints", p, SIM_MAX_TAINTS);
            break;
        }
        const char *key = sim_str_field(s, t, "key", p, NULL);
        const char *val = sim_str_field(s, t, "value", p, "");
        const char *eff = sim_str_field(s, t, "effect", p, NULL);
        if(s->bad[0])
            break;
        if(strcmp(eff, "NoSchedule") && strcmp(eff, "PreferNoSchedule") && strcmp(eff, "NoExecute")) {
            sim_bad(s, "%s.effect: must be NoSchedule, PreferNoSchedule or NoExecute", p);
            break;
        }
        json_t *x = json_pack("{s:s,s:s}", "key", key, "effect", eff);
        if(*val)
            json_object_set_new(x, "value", json_string(val));
        json_array_append_new(taints, x);
    }
    json_t *labels = json_object_get(o, "labels");
    if(labels && !json_is_object(labels) && !s->bad[0])
        sim_bad(s, "%s.labels: must be a mapping", path);
    json_object_foreach(labels, k, v)
    {
        if(!json_is_string(v) && !s->bad[0])
            sim_bad(s, "%s.labels.%s: must be a string", path, k);
    }
    if(s->bad[0]) {
        json_decref(caps);
        json_decref(taints);
        return;
    }
    json_object_set_new(s->caps, name, caps);
    json_t *lb = json_is_object(labels) ? json_deep_copy(labels) : json_object();
    if(!json_object_get(lb, "kubernetes.io/hostname"))
        json_object_set_new(lb, "kubernetes.io/hostname", json_string(name));
    json_t *spec = json_pack("{s:o}", "taints", taints);
    if(cordoned)
        json_object_set_new(spec, "unschedulable", json_true());
    json_t *node = json_pack("{s:s,s:s,s:{s:s,s:o},s:o,s:{s:o,s:o,s:{s:s}}}", "apiVersion", "v1", "kind", "Node",
                             "metadata", "name", name, "labels", lb, "spec", spec, "status", "allocatable",
                             allocatable(s, name), "conditions", ready_condition(ready), "nodeInfo", "bootID",
                             SIM_BOOT);
    sim_store_create(s->st, PLACEMENT_NODE, node);
    json_t *n = sim_store_get(s->st, PLACEMENT_NODE, NULL, name);
    json_t *g = json_pack("{s:s,s:s,s:{s:s,s:[{s:s,s:s,s:s,s:s}]},s:{},s:o}", "apiVersion", "cozystack.io/v1alpha1",
                          "kind", "GPUNode", "metadata", "name", name, "ownerReferences", "apiVersion", "v1", "kind",
                          "Node", "name", name, "uid", kobject_meta_str(n, "uid"), "spec", "status",
                          gpunode_status(s, name, pending));
    json_decref(n);
    sim_store_create(s->st, PLACEMENT_GPUNODE, g);
}

/* ------------------------------------------------------------ claims */

static void def_claim(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"name", "namespace", "class", "count", NULL};
    if(sim_check_keys(s, o, path, keys))
        return;
    const char *name = sim_str_field(s, o, "name", path, NULL);
    const char *ns = sim_str_field(s, o, "namespace", path, "default");
    const char *cls = sim_str_field(s, o, "class", path, NULL);
    if(s->bad[0])
        return;
    if(strlen(name) > BINDER_MAX_NAME || strlen(ns) > BINDER_MAX_NAMESPACE)
        return sim_bad(s, "%s: a name longer than %d or a namespace longer than %d", path, BINDER_MAX_NAME,
                       BINDER_MAX_NAMESPACE);
    json_t *cnt = json_object_get(o, "count");
    if(!json_is_integer(cnt) || json_integer_value(cnt) < 1 || json_integer_value(cnt) > BINDER_MAX_UNITS)
        return sim_bad(s, "%s.count: must be a whole number from 1 to %d", path, BINDER_MAX_UNITS);
    if(!json_object_get(s->classes, cls))
        return sim_bad(s, "%s.class: unknown class \"%s\"", path, cls);
    json_t *c = json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:s,s:I}}", "apiVersion", "cozystack.io/v1alpha1", "kind",
                          "GPUClaim", "metadata", "name", name, "namespace", ns, "spec", "class", cls, "count",
                          json_integer_value(cnt));
    json_t *have = sim_store_get(s->st, PLACEMENT_CLAIM, ns, name);
    json_decref(have);
    if(have) {
        json_decref(c);
        return sim_bad(s, "%s.name: claim %s/%s is defined twice", path, ns, name);
    }
    json_t *admitted = sim_admit(s, c, path);
    json_decref(c);
    if(admitted)
        sim_store_create(s->st, PLACEMENT_CLAIM, admitted);
}

/* ------------------------------------------------------------ VMs */


/* A VM's `volumeNodes` (when given): a PVC <vm>-data bound to PV
 * <ns>-<vm>-data whose required node affinity is kubernetes.io/hostname In
 * those nodes (a WaitForFirstConsumer local volume). Returns the VM
 * template's spec.volumes (new), or NULL (none, or the run failed). */
static json_t *vm_volumes(sim *s, json_t *o, const char *path, const char *ns, const char *name)
{
    json_t *vn = json_object_get(o, "volumeNodes");
    if(!vn)
        return NULL;
    if(!json_is_array(vn) || !json_array_size(vn) || json_array_size(vn) > BINDER_MAX_SET_NODES) {
        sim_bad(s, "%s.volumeNodes: must be a list of 1 to %d node names", path, BINDER_MAX_SET_NODES);
        return NULL;
    }
    size_t i;
    json_t *x;
    json_array_foreach(vn, i, x)
    {
        if(!json_is_string(x) || !*json_string_value(x)) {
            sim_bad(s, "%s.volumeNodes[%zu]: must be a node name", path, i);
            return NULL;
        }
        json_t *n = sim_store_get(s->st, PLACEMENT_NODE, NULL, json_string_value(x));
        json_decref(n);
        if(!n) {
            sim_bad(s, "%s.volumeNodes[%zu]: unknown node \"%s\"", path, i, json_string_value(x));
            return NULL;
        }
        for(size_t k = 0; k < i; k++)
            if(json_equal(x, json_array_get(vn, k))) {
                sim_bad(s, "%s.volumeNodes[%zu]: node \"%s\" is named twice", path, i, json_string_value(x));
                return NULL;
            }
    }
    char pvc[300], pv[400];
    snprintf(pvc, sizeof pvc, "%s-data", name);
    snprintf(pv, sizeof pv, "%s-%s-data", ns, name);
    sim_store_create(s->st, PLACEMENT_PV,
                     json_pack("{s:s,s:s,s:{s:s},s:{s:{s:s,s:s},s:{s:{s:[{s:[{s:s,s:s,s:O}]}]}}}}", "apiVersion", "v1",
                               "kind", "PersistentVolume", "metadata", "name", pv, "spec", "claimRef", "namespace", ns,
                               "name", pvc, "nodeAffinity", "required", "nodeSelectorTerms", "matchExpressions", "key",
                               "kubernetes.io/hostname", "operator", "In", "values", vn));
    sim_store_create(s->st, PLACEMENT_PVC,
                     json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:s}}", "apiVersion", "v1", "kind", "PersistentVolumeClaim",
                               "metadata", "name", pvc, "namespace", ns, "spec", "volumeName", pv));
    return json_pack("[{s:s,s:{s:s}}]", "name", "data", "persistentVolumeClaim", "claimName", pvc);
}

/* `units` gpus entries of resource name rn into `gpus`. */
static void gpu_entries(json_t *gpus, const char *rn, json_int_t units)
{
    for(json_int_t i = 0; i < units; i++) {
        char n[32];
        snprintf(n, sizeof n, "gpu%zu", json_array_size(gpus));
        json_array_append_new(gpus, json_pack("{s:s,s:s}", "name", n, "deviceName", rn));
    }
}

static void def_vm(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"name", "namespace", "claims", "gpus", "runStrategy", "volumeNodes", NULL};
    if(sim_check_keys(s, o, path, keys))
        return;
    const char *name = sim_str_field(s, o, "name", path, NULL);
    const char *ns = sim_str_field(s, o, "namespace", path, "default");
    const char *rs = sim_str_field(s, o, "runStrategy", path, "Halted");
    json_t *gpus = json_object_get(o, "gpus");
    if(s->bad[0])
        return;
    if(strlen(name) > BINDER_MAX_NAME - 20 || strlen(ns) > BINDER_MAX_NAMESPACE)
        return sim_bad(s, "%s: a name longer than %d or a namespace longer than %d", path, BINDER_MAX_NAME - 20,
                       BINDER_MAX_NAMESPACE);
    json_t *have = sim_store_get(s->st, PLACEMENT_VM, ns, name);
    json_decref(have);
    if(have)
        return sim_bad(s, "%s.name: VM %s/%s is defined twice", path, ns, name);
    static const char *const rss[] = {"Always", "RerunOnFailure", "Once", "Manual", "Halted"};
    int ok = 0;
    for(size_t i = 0; i < sizeof rss / sizeof *rss; i++)
        ok |= !strcmp(rs, rss[i]);
    if(!ok)
        return sim_bad(s, "%s.runStrategy: must be Always, RerunOnFailure, Once, Manual or Halted, not \"%s\"", path,
                       rs);
    if(gpus && json_object_get(o, "claims"))
        return sim_bad(s, "%s: name claims or ask for gpus (template claims), not both", path);
    json_t *devices = json_array(), *tmd = json_object();
    if(gpus) {
        if(!json_is_array(gpus) || !json_array_size(gpus) || json_array_size(gpus) > BINDER_MAX_SET_CLASSES)
            sim_bad(s, "%s.gpus: must be a list of 1 to %d {class, count}", path, BINDER_MAX_SET_CLASSES);
        size_t i;
        json_t *g;
        json_array_foreach(gpus, i, g)
        {
            if(s->bad[0])
                break;
            char p[300];
            snprintf(p, sizeof p, "%s.gpus[%zu]", path, i);
            static const char *const gk[] = {"class", "count", NULL};
            if(sim_check_keys(s, g, p, gk))
                break;
            const char *cls = sim_str_field(s, g, "class", p, NULL);
            if(s->bad[0])
                break;
            if(!json_object_get(s->classes, cls)) {
                sim_bad(s, "%s.class: unknown class \"%s\"", p, cls);
                break;
            }
            json_t *cnt = json_object_get(g, "count");
            if(!json_is_integer(cnt) || json_integer_value(cnt) < 1 || json_integer_value(cnt) > BINDER_MAX_UNITS) {
                sim_bad(s, "%s.count: must be a whole number from 1 to %d", p, BINDER_MAX_UNITS);
                break;
            }
            for(size_t k = 0; k < i; k++)
                if(!strcmp(json_string_value(json_object_get(json_array_get(gpus, k), "class")), cls))
                    sim_bad(s, "%s.class: class \"%s\" is asked for twice", p, cls);
            if(strlen(name) + 1 + strlen(cls) > BINDER_MAX_NAME)
                sim_bad(s, "%s.class: the template claim name %s-%s is too long", p, name, cls);
            gpu_entries(devices, class_rn(s, cls), json_integer_value(cnt));
        }
        json_object_set_new(tmd, "labels", json_pack("{s:s}", PLACEMENT_READ_CLASS_REFERENCE, "true"));
    } else {
        json_t *cl = json_object_get(o, "claims");
        if(!json_is_array(cl) || !json_array_size(cl))
            sim_bad(s, "%s.claims: must be a non-empty list of claim names (or gpus: for template claims)", path);
        else if(json_array_size(cl) > BINDER_MAX_SET_CLAIMS)
            sim_bad(s, "%s.claims: more than %d", path, BINDER_MAX_SET_CLAIMS);
        char ann[16384] = "";
        size_t used = 0, i;
        json_t *c;
        json_t *named = s->vm_claims;
        json_array_foreach(cl, i, c)
        {
            if(s->bad[0])
                break;
            if(!json_is_string(c) || !*json_string_value(c)) {
                sim_bad(s, "%s.claims[%zu]: must be a claim name", path, i);
                break;
            }
            const char *cn = json_string_value(c);
            json_t *claim = sim_store_get(s->st, PLACEMENT_CLAIM, ns, cn);
            if(!claim) {
                sim_bad(s, "%s.claims[%zu]: no claim \"%s\" in namespace %s", path, i, cn, ns);
                break;
            }
            for(size_t k = 0; k < i; k++)
                if(!strcmp(json_string_value(json_array_get(cl, k)), cn))
                    sim_bad(s, "%s.claims[%zu]: claim \"%s\" is named twice", path, i, cn);
            char nk[600];
            snprintf(nk, sizeof nk, "%s/%s", ns, cn);
            const char *other = json_string_value(json_object_get(named, nk));
            if(other && !s->bad[0])
                sim_bad(s, "%s.claims[%zu]: claim \"%s\" is named by VM %s too (a claim is one VM's)", path, i, cn,
                        other);
            json_object_set_new(named, nk, json_string(name));
            const char *cls = json_string_value(json_object_get(json_object_get(claim, "spec"), "class"));
            gpu_entries(devices, cls && class_rn(s, cls) ? class_rn(s, cls) : "unknown/class",
                        json_integer_value(json_object_get(json_object_get(claim, "spec"), "count")));
            json_decref(claim);
            used += (size_t)snprintf(ann + used, used < sizeof ann ? sizeof ann - used : 0, "%s%s", i ? "," : "", cn);
        }
        json_object_set_new(tmd, "annotations", json_pack("{s:s}", PLACEMENT_READ_CLAIMS_ANNOTATION, ann));
    }
    json_t *vols = s->bad[0] ? NULL : vm_volumes(s, o, path, ns, name);
    if(s->bad[0]) {
        json_decref(devices);
        json_decref(tmd);
        json_decref(vols);
        return;
    }
    json_t *tspec = json_pack("{s:{s:{s:o},s:{s:{s:s}}}}", "domain", "devices", "gpus", devices, "resources",
                              "requests", "memory", "1Gi");
    if(vols)
        json_object_set_new(tspec, "volumes", vols);
    json_t *vm = json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:s,s:{s:o,s:o}}}", "apiVersion", "kubevirt.io/v1", "kind",
                           "VirtualMachine", "metadata", "name", name, "namespace", ns, "spec", "runStrategy", rs,
                           "template", "metadata", tmd, "spec", tspec);
    json_t *admitted = sim_admit(s, vm, path);
    json_decref(vm);
    if(admitted)
        sim_store_create(s->st, PLACEMENT_VM, admitted);
    else if(vols) { /* refused: its volume goes too (kubectl apply of the three would leave them; keep it simple) */
        char pvc[300], pv[400];
        snprintf(pvc, sizeof pvc, "%s-data", name);
        snprintf(pv, sizeof pv, "%s-%s-data", ns, name);
        sim_store_delete(s->st, PLACEMENT_PVC, ns, pvc, NULL);
        sim_store_delete(s->st, PLACEMENT_PV, NULL, pv, NULL);
    }
}

/* A Kubernetes object of the scenario (namespaces, resourceQuotas): a
 * mapping with metadata.name (and metadata.namespace when namespaced),
 * stored with its kind. */
static void def_object(sim *s, json_t *o, const char *path, placement_kind k)
{
    int namespaced = k == PLACEMENT_QUOTA;
    const char *kind = placement_kind_name[k];
    json_t *md = json_object_get(o, "metadata");
    if(!json_is_object(o) || !json_is_object(md))
        return sim_bad(s, "%s: must be a %s object (metadata.name%s)", path, kind,
                       namespaced ? ", metadata.namespace, spec.hard" : ", metadata.labels");
    const json_t *name = json_object_get(md, "name"), *ns = json_object_get(md, "namespace");
    if(!json_is_string(name) || !*json_string_value(name))
        return sim_bad(s, "%s.metadata.name: must be a non-empty string", path);
    if(namespaced && (!json_is_string(ns) || !*json_string_value(ns)))
        return sim_bad(s, "%s.metadata.namespace: must be a non-empty string", path);
    json_t *labels = json_object_get(md, "labels");
    if(labels && !json_is_object(labels))
        return sim_bad(s, "%s.metadata.labels: must be a mapping", path);
    if(namespaced && !json_is_object(json_object_get(json_object_get(o, "spec"), "hard")))
        return sim_bad(s, "%s.spec.hard: must be a mapping", path);
    json_t *copy = json_deep_copy(o);
    json_object_set_new(copy, "apiVersion", json_string("v1"));
    json_object_set_new(copy, "kind", json_string(kind));
    if(sim_store_create(s->st, k, copy) == 409)
        sim_bad(s, "%s.metadata.name: %s %s%s%s is defined twice (or is in the snapshot)", path, kind,
                namespaced ? json_string_value(ns) : "", namespaced ? "/" : "", json_string_value(name));
}

static void def_namespace(sim *s, json_t *o, const char *path)
{
    def_object(s, o, path, PLACEMENT_NAMESPACE);
}

static void def_quota(sim *s, json_t *o, const char *path)
{
    def_object(s, o, path, PLACEMENT_QUOTA);
}

void sim_scenario_load(sim *s)
{
    sim_list(s, json_object_get(s->doc, "classes"), "classes", def_class);
    sim_list(s, json_object_get(s->doc, "namespaces"), "namespaces", def_namespace);
    sim_list(s, json_object_get(s->doc, "resourceQuotas"), "resourceQuotas", def_quota);
    sim_list(s, json_object_get(s->doc, "nodes"), "nodes", def_node);
    sim_list(s, json_object_get(s->doc, "claims"), "claims", def_claim);
    sim_list(s, json_object_get(s->doc, "vms"), "vms", def_vm);
}

/* ------------------------------------------------------------ steps */

static const char *act; /* the node action being applied (they share node_action) */

/* A copy of node `name` (NULL: unknown, the run failed). */
static json_t *node_copy(sim *s, const char *name, const char *path)
{
    json_t *n = sim_store_get(s->st, PLACEMENT_NODE, NULL, name);
    if(!n) {
        sim_bad(s, "%s: unknown node \"%s\"", path, name);
        return NULL;
    }
    json_t *c = json_deep_copy(n);
    json_decref(n);
    return c;
}

/* Writes the GPUNode of scenario node `name` again from s->caps (layout
 * pending as `pending`, -1: as it is). */
static void gpunode_write(sim *s, const char *name, int pending)
{
    json_t *g = sim_store_get(s->st, PLACEMENT_GPUNODE, NULL, name);
    if(!g)
        return;
    json_t *c = json_deep_copy(g);
    json_decref(g);
    if(pending < 0)
        pending = json_is_true(json_object_get(json_object_get(json_object_get(c, "status"), "layout"), "pending"));
    if(json_object_get(s->caps, name))
        json_object_set_new(c, "status", gpunode_status(s, name, pending));
    else {
        json_t *st = json_object_get(c, "status");
        if(!json_is_object(st))
            json_object_set_new(c, "status", st = json_object());
        json_t *layout = json_object_get(st, "layout");
        if(!json_is_object(layout))
            json_object_set_new(st, "layout", layout = json_object());
        json_object_set_new(layout, "pending", json_boolean(pending));
    }
    sim_store_replace(s->st, PLACEMENT_GPUNODE, c);
}

static void node_action(sim *s, const char *name, const char *path)
{
    if(!strcmp(act, "deleteNode")) {
        if(sim_store_delete(s->st, PLACEMENT_NODE, NULL, name, NULL) == 404)
            return sim_bad(s, "%s: unknown node \"%s\"", path, name);
        json_object_del(s->caps, name);
        sim_say(s, "  node %s deleted\n", name);
        return;
    }
    if(!strcmp(act, "layoutPending") || !strcmp(act, "layoutApplied")) {
        json_t *n = sim_store_get(s->st, PLACEMENT_NODE, NULL, name);
        json_decref(n);
        if(!n)
            return sim_bad(s, "%s: unknown node \"%s\"", path, name);
        gpunode_write(s, name, !strcmp(act, "layoutPending"));
        sim_say(s, "  node %s: %s\n", name, act);
        return;
    }
    json_t *c = node_copy(s, name, path);
    if(!c)
        return;
    json_t *spec = json_object_get(c, "spec");
    if(!json_is_object(spec))
        json_object_set_new(c, "spec", spec = json_object());
    if(!strcmp(act, "cordon"))
        json_object_set_new(spec, "unschedulable", json_true());
    else if(!strcmp(act, "uncordon"))
        json_object_del(spec, "unschedulable");
    else {
        json_t *st = json_object_get(c, "status");
        if(!json_is_object(st))
            json_object_set_new(c, "status", st = json_object());
        int ready = !strcmp(act, "ready");
        json_t *conds = json_object_get(st, "conditions");
        int found = 0;
        size_t i;
        json_t *x;
        json_array_foreach(conds, i, x)
        {
            const char *t = json_string_value(json_object_get(x, "type"));
            if(t && !strcmp(t, "Ready")) {
                json_object_set_new(x, "status", json_string(ready ? "True" : "Unknown"));
                json_object_set_new(x, "reason", json_string(ready ? "KubeletReady" : "NodeStatusUnknown"));
                found = 1;
            }
        }
        if(!found) {
            if(!json_is_array(conds))
                json_object_set_new(st, "conditions", conds = json_array());
            json_array_extend(conds, ready_condition(ready));
        }
    }
    sim_store_replace(s->st, PLACEMENT_NODE, c);
    sim_say(s, "  node %s: %s\n", name, act);
}

static void capacity(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"node", "class", "units", NULL};
    if(sim_check_keys(s, o, path, keys))
        return;
    const char *node = sim_str_field(s, o, "node", path, NULL);
    const char *cls = sim_str_field(s, o, "class", path, NULL);
    if(s->bad[0])
        return;
    json_t *u = json_object_get(o, "units");
    if(!json_is_integer(u) || json_integer_value(u) < 0 || json_integer_value(u) > BINDER_MAX_UNITS)
        return sim_bad(s, "%s.units: must be a whole number, 0 to %d", path, BINDER_MAX_UNITS);
    json_t *c = node_copy(s, node, path);
    if(!c)
        return;
    if(!json_object_get(s->classes, cls)) {
        json_decref(c);
        return sim_bad(s, "%s.class: unknown class \"%s\"", path, cls);
    }
    if(!json_object_get(s->caps, node)) {
        json_decref(c);
        return sim_bad(s, "%s.node: node %s is a snapshot's: its capacity is what its GPUNode shows", path, node);
    }
    json_object_set(json_object_get(s->caps, node), cls, u);
    json_object_set_new(json_object_get(c, "status"), "allocatable", allocatable(s, node));
    sim_store_replace(s->st, PLACEMENT_NODE, c);
    gpunode_write(s, node, -1);
    sim_say(s, "  node %s: %s capacity %lld\n", node, cls, (long long)json_integer_value(u));
}

static void class_deleting(sim *s, const char *name, const char *path)
{
    if(!json_object_get(s->classes, name))
        return sim_bad(s, "%s: unknown class \"%s\"", path, name);
    if(sim_store_delete(s->st, PLACEMENT_CLASS, NULL, name, NULL) == 404)
        return sim_bad(s, "%s: class \"%s\" is gone already", path, name);
    sim_say(s, "  class %s: kubectl delete (it goes once no claim names it, decision 0037)\n", name);
}

static void vm_start(sim *s, const char *ref, const char *path)
{
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1];
    if(sim_split_ref(s, ref, path, ns, name))
        return;
    if(sim_kubevirt_start(s->st, s->runs, ns, name, sim_vmi_event, s))
        sim_bad(s, "%s: unknown VM \"%s\"", path, ref);
}

static void vm_stop(sim *s, const char *ref, const char *path)
{
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1];
    if(sim_split_ref(s, ref, path, ns, name))
        return;
    if(sim_kubevirt_stop(s->st, s->runs, ns, name, sim_vmi_event, s))
        sim_bad(s, "%s: unknown VM \"%s\"", path, ref);
}

static void vmi_final(sim *s, json_t *o, const char *path)
{
    static const char *const keys[] = {"vm", "phase", NULL};
    if(sim_check_keys(s, o, path, keys))
        return;
    const char *ref = sim_str_field(s, o, "vm", path, NULL);
    const char *ph = sim_str_field(s, o, "phase", path, NULL);
    if(s->bad[0])
        return;
    if(strcmp(ph, "Succeeded") && strcmp(ph, "Failed"))
        return sim_bad(s, "%s.phase: must be Succeeded or Failed", path);
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1];
    if(sim_split_ref(s, ref, path, ns, name))
        return;
    json_t *vm = sim_store_get(s->st, PLACEMENT_VM, ns, name);
    json_t *vmi = sim_store_get(s->st, PLACEMENT_VMI, ns, name);
    int known = vm || vmi;
    json_decref(vm);
    json_decref(vmi);
    if(!known)
        return sim_bad(s, "%s.vm: unknown VM \"%s\"", path, ref);
    if(sim_kubevirt_final(s->st, ns, name, ph, sim_vmi_event, s))
        sim_bad(s, "%s.vm: VM %s has no live VMI", path, ref);
}

static void delete_claim(sim *s, const char *ref, const char *path)
{
    char ns[BINDER_MAX_NAMESPACE + 1], name[BINDER_MAX_NAME + 1];
    if(sim_split_ref(s, ref, path, ns, name))
        return;
    if(sim_store_delete(s->st, PLACEMENT_CLAIM, ns, name, NULL) == 404)
        return sim_bad(s, "%s: unknown claim \"%s\"", path, ref);
    sim_say(s, "  claim %s/%s: kubectl delete (it goes once nothing uses it, decision 0026)\n", ns, name);
}

void sim_scenario_step(sim *s, json_t *step, const char *path)
{
    char p[200];
    /* the actions in this order, each taken by the leader before the next
     * (sim_leader_catch_up): what happens at once in a cluster is what
     * one action does, and a step lists its actions in no order of its own */
#define SUB(k) (snprintf(p, sizeof p, "%s.%s", path, k), p)
#define THEN() (s->bad[0] ? (void)0 : sim_leader_catch_up(s))
    json_t *v;
    if((v = json_object_get(step, "addNodes"))) {
        sim_list(s, v, SUB("addNodes"), def_node);
        THEN();
    }
    if((v = json_object_get(step, "addClaims"))) {
        sim_list(s, v, SUB("addClaims"), def_claim);
        THEN();
    }
    if((v = json_object_get(step, "addVMs"))) {
        sim_list(s, v, SUB("addVMs"), def_vm);
        THEN();
    }
    static const char *const flags[] = {"cordon",     "uncordon",      "notReady",     "ready",
                                        "deleteNode", "layoutPending", "layoutApplied"};
    for(size_t i = 0; i < sizeof flags / sizeof *flags && !s->bad[0]; i++) {
        if((v = json_object_get(step, flags[i]))) {
            act = flags[i];
            sim_each_name(s, v, SUB(flags[i]), node_action);
            THEN();
        }
    }
    json_t *cap = json_object_get(step, "capacity");
    if(cap && !s->bad[0]) {
        if(json_is_array(cap))
            sim_list(s, cap, SUB("capacity"), capacity);
        else
            capacity(s, cap, SUB("capacity"));
        THEN();
    }
    if(json_object_get(step, "classDeleting") && !s->bad[0]) {
        sim_each_name(s, json_object_get(step, "classDeleting"), SUB("classDeleting"), class_deleting);
        THEN();
    }
    if(json_object_get(step, "start") && !s->bad[0]) {
        sim_each_name(s, json_object_get(step, "start"), SUB("start"), vm_start);
        THEN();
    }
    if(json_object_get(step, "stop") && !s->bad[0]) {
        sim_each_name(s, json_object_get(step, "stop"), SUB("stop"), vm_stop);
        THEN();
    }
    json_t *fin = json_object_get(step, "vmiFinal");
    if(fin && !s->bad[0]) {
        if(json_is_array(fin))
            sim_list(s, fin, SUB("vmiFinal"), vmi_final);
        else
            vmi_final(s, fin, SUB("vmiFinal"));
        THEN();
    }
    if(json_object_get(step, "deleteClaim") && !s->bad[0]) {
        sim_each_name(s, json_object_get(step, "deleteClaim"), SUB("deleteClaim"), delete_claim);
        THEN();
    }
#undef THEN
#undef SUB
}
