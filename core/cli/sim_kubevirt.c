/* sim_kubevirt.c — what KubeVirt and kube-scheduler do in `cozygpu
 * simulate` (sim.h): the only behaviour simulate models beside the
 * placement model (decision 0041).
 *
 * runStrategy (KubeVirt user guide, "Run Strategies"; virt-controller's
 * VM controller, pkg/virt-controller/watch/vm.go, which starts a VMI
 * whenever none exists under Always, and under RerunOnFailure unless the
 * last one succeeded or a stop was asked):
 *   Always          a new VMI after the VMI ends (Succeeded or Failed) or
 *                   is deleted; `stop` sets Halted;
 *   RerunOnFailure  a new VMI after Failed or a deletion it did not ask
 *                   for, none after Succeeded or `stop`;
 *   Once            runs once: no new VMI after it ends or is deleted;
 *   Manual          only `start` creates a VMI, nothing restarts it;
 *   Halted          no VMI; `start` sets Always.
 * A final VMI that is not replaced stays (KubeVirt keeps it). The VMI has
 * the VM's name, the template's labels, annotations and spec, and a
 * controller ownerReference to the VM. Its launcher pod
 * (virt-launcher-<vmi>, owned by the VMI: garbage collected with it)
 * carries the VMI's labels and claims annotation and, as the launcher
 * webhook makes it (decision 0025), the scheduling gate
 * gpu.cozystack.io/claims, and the tolerations of the classes its GPUs
 * name (the toleration rule, policies/launcher-tolerations.lua).
 * kube-scheduler places an ungated pod on the node its required node
 * affinity pins it to when that node is Ready, not cordoned, and every
 * NoSchedule or NoExecute taint of it is tolerated (the scheduler's
 * NodeUnschedulable and TaintToleration filters); the VMI then runs there
 * (Pending -> Running: Scheduling and Scheduled pass within the round).
 */
#include "cli/sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binder/binder.h"
#include "format/kobject.h"
#include "placement/read.h"

#define GATE "gpu.cozystack.io/claims"

const char *sim_vmi_phase(const json_t *vmi)
{
    return vmi ? binder_vmi_phase_name(placement_read_vmi_phase(vmi)) : "None";
}

static int is_final(const json_t *vmi)
{
    binder_vmi_phase p = placement_read_vmi_phase(vmi);
    return p == BINDER_VMI_SUCCEEDED || p == BINDER_VMI_FAILED;
}

/* The VM controller's memory of VM key ("ns/name"): {stopped, started}. */
static json_t *run_of(json_t *runs, const char *key)
{
    json_t *r = json_object_get(runs, key);
    if(!r) {
        r = json_pack("{s:b,s:b}", "stopped", 0, "started", 0);
        json_object_set_new(runs, key, r);
    }
    return r;
}

static const char *strategy(const json_t *vm)
{
    const json_t *spec = json_object_get(vm, "spec");
    const char *rs = json_string_value(json_object_get(spec, "runStrategy"));
    if(rs)
        return rs;
    const json_t *running = json_object_get(spec, "running");
    return json_is_true(running) ? "Always" : "Halted";
}

static void set_strategy(sim_store *st, const json_t *vm, const char *rs)
{
    json_t *c = json_deep_copy(vm);
    json_t *spec = json_object_get(c, "spec");
    json_object_del(spec, "running");
    json_object_set_new(spec, "runStrategy", json_string(rs));
    sim_store_replace(st, PLACEMENT_VM, c);
}

/* A new VMI of `vm` (Pending). */
static void create_vmi(sim_store *st, const json_t *vm, const char *why, sim_say_fn say, void *ud)
{
    const char *ns = kobject_meta_str(vm, "namespace"), *name = kobject_meta_str(vm, "name");
    const json_t *tmpl = json_object_get(json_object_get(vm, "spec"), "template");
    const json_t *tmd = json_object_get(tmpl, "metadata");
    json_t *md = json_pack("{s:s,s:s,s:[{s:s,s:s,s:s,s:s?,s:b,s:b}]}", "name", name, "namespace", ns,
                           "ownerReferences", "apiVersion", "kubevirt.io/v1", "kind", "VirtualMachine", "name", name,
                           "uid", kobject_meta_str(vm, "uid"), "controller", 1, "blockOwnerDeletion", 1);
    if(json_object_get(tmd, "labels"))
        json_object_set_new(md, "labels", json_deep_copy(json_object_get(tmd, "labels")));
    if(json_object_get(tmd, "annotations"))
        json_object_set_new(md, "annotations", json_deep_copy(json_object_get(tmd, "annotations")));
    json_t *spec = json_deep_copy(json_object_get(tmpl, "spec"));
    json_t *vmi = json_pack("{s:s,s:s,s:o,s:o,s:{s:s}}", "apiVersion", "kubevirt.io/v1", "kind",
                            "VirtualMachineInstance", "metadata", md, "spec", spec ? spec : json_object(), "status",
                            "phase", "Pending");
    if(sim_store_create(st, PLACEMENT_VMI, vmi) == 201 && say)
        say(ud, ns, name, "None", "Pending", NULL, why);
}

/* The tolerations of the classes VMI `vmi`'s gpus and hostDevices name
 * (by spec.resourceName), as the launcher webhook's toleration rule gives
 * its pod. A new array. */
static json_t *class_tolerations(sim_store *st, const json_t *vmi)
{
    json_t *out = json_array();
    json_t *classes = sim_store_list(st, PLACEMENT_CLASS);
    const json_t *dev = json_object_get(json_object_get(json_object_get(vmi, "spec"), "domain"), "devices");
    static const char *const lists[] = {"gpus", "hostDevices"};
    for(int l = 0; l < 2; l++) {
        size_t i;
        json_t *d;
        json_array_foreach(json_object_get(dev, lists[l]), i, d)
        {
            const char *dn = json_string_value(json_object_get(d, "deviceName"));
            size_t k;
            json_t *c;
            json_array_foreach(classes, k, c)
            {
                const char *rn = json_string_value(json_object_get(json_object_get(c, "spec"), "resourceName"));
                if(!dn || !rn || strcmp(dn, rn))
                    continue;
                size_t t;
                json_t *tol;
                json_array_foreach(json_object_get(json_object_get(c, "spec"), "tolerations"), t, tol)
                {
                    int have = 0;
                    size_t h;
                    json_t *x;
                    json_array_foreach(out, h, x) have |= json_equal(x, tol);
                    if(!have)
                        json_array_append(out, tol);
                }
            }
        }
    }
    json_decref(classes);
    return out;
}

/* Whether toleration `t` tolerates taint `x` (k8s.io/api core/v1
 * Toleration.ToleratesTaint: an empty effect matches every effect; an
 * empty key with Exists matches every key). */
static int tolerates(const json_t *t, const json_t *x)
{
    const char *tk = json_string_value(json_object_get(t, "key")), *op = json_string_value(json_object_get(t, "operator"));
    const char *tv = json_string_value(json_object_get(t, "value")), *te = json_string_value(json_object_get(t, "effect"));
    const char *xk = json_string_value(json_object_get(x, "key")), *xv = json_string_value(json_object_get(x, "value"));
    const char *xe = json_string_value(json_object_get(x, "effect"));
    if(te && *te && (!xe || strcmp(te, xe)))
        return 0;
    if(tk && *tk && (!xk || strcmp(tk, xk)))
        return 0;
    if(op && !strcmp(op, "Exists"))
        return 1;
    return (!tk || !*tk) ? 0 : !strcmp(tv ? tv : "", xv ? xv : "");
}

/* The launcher pod of live VMI `vmi`, when it has none: gated, or (a VMI
 * found running, as a snapshot shows it) already on the VMI's node. */
static int ensure_pod(sim_store *st, const json_t *vmi)
{
    const char *ns = kobject_meta_str(vmi, "namespace"), *name = kobject_meta_str(vmi, "name");
    char pod[400];
    snprintf(pod, sizeof pod, "virt-launcher-%s", name);
    json_t *have = sim_store_get(st, PLACEMENT_POD, ns, pod);
    int ok = have != NULL;
    json_decref(have);
    if(ok)
        return 0;
    json_t *labels = json_deep_copy(json_object_get(json_object_get(vmi, "metadata"), "labels"));
    if(!json_is_object(labels))
        labels = json_object();
    json_object_set_new(labels, "kubevirt.io", json_string("virt-launcher"));
    json_object_set_new(labels, "vm.kubevirt.io/name", json_string(name));
    json_t *md = json_pack("{s:s,s:s,s:o,s:[{s:s,s:s,s:s,s:s?,s:b,s:b}]}", "name", pod, "namespace", ns, "labels",
                           labels, "ownerReferences", "apiVersion", "kubevirt.io/v1", "kind",
                           "VirtualMachineInstance", "name", name, "uid", kobject_meta_str(vmi, "uid"), "controller", 1,
                           "blockOwnerDeletion", 1);
    const char *ann = kobject_annotation(vmi, PLACEMENT_READ_CLAIMS_ANNOTATION);
    if(ann)
        json_object_set_new(md, "annotations", json_pack("{s:s}", PLACEMENT_READ_CLAIMS_ANNOTATION, ann));
    json_t *spec = json_pack("{s:[{s:s,s:s}],s:o}", "containers", "name", "compute", "image", "virt-launcher",
                             "tolerations", class_tolerations(st, vmi));
    const char *node = json_string_value(json_object_get(json_object_get(vmi, "status"), "nodeName"));
    binder_vmi_phase ph = placement_read_vmi_phase(vmi);
    json_t *status;
    if(node && ph != BINDER_VMI_PENDING) {
        json_object_set_new(spec, "nodeName", json_string(node));
        status = json_pack("{s:s}", "phase", "Running");
    } else {
        json_object_set_new(spec, "schedulingGates", json_pack("[{s:s}]", "name", GATE));
        status = json_pack("{s:s}", "phase", "Pending");
    }
    json_t *p = json_pack("{s:s,s:s,s:o,s:o,s:o}", "apiVersion", "v1", "kind", "Pod", "metadata", md, "spec", spec,
                          "status", status);
    return sim_store_create(st, PLACEMENT_POD, p) == 201;
}

static int gated(const json_t *pod)
{
    return json_array_size(json_object_get(json_object_get(pod, "spec"), "schedulingGates")) > 0;
}

/* Whether Node `name` takes `pod`: Ready, not cordoned, and its
 * NoSchedule and NoExecute taints tolerated by the pod. */
static int node_takes(sim_store *st, const char *name, const json_t *pod)
{
    json_t *n = sim_store_get(st, PLACEMENT_NODE, NULL, name);
    if(!n)
        return 0;
    int ready = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(json_object_get(n, "status"), "conditions"), i, c)
    {
        const char *t = json_string_value(json_object_get(c, "type"));
        const char *s = json_string_value(json_object_get(c, "status"));
        if(t && s && !strcmp(t, "Ready"))
            ready = !strcmp(s, "True");
    }
    int ok = ready && !json_is_true(json_object_get(json_object_get(n, "spec"), "unschedulable"));
    json_t *x;
    json_array_foreach(json_object_get(json_object_get(n, "spec"), "taints"), i, x)
    {
        const char *e = json_string_value(json_object_get(x, "effect"));
        if(!e || !strcmp(e, "PreferNoSchedule"))
            continue;
        int tolerated = 0;
        size_t k;
        json_t *t;
        json_array_foreach(json_object_get(json_object_get(pod, "spec"), "tolerations"), k, t) tolerated |= tolerates(t, x);
        ok &= tolerated;
    }
    json_decref(n);
    return ok;
}

/* kube-scheduler and virt-handler for one pod: placed where it is pinned,
 * and its Pending VMI running there. */
static int schedule(sim_store *st, const json_t *pod, sim_say_fn say, void *ud)
{
    if(gated(pod) || json_object_get(json_object_get(pod, "spec"), "nodeName"))
        return 0;
    const char *node = placement_pinned_node(pod);
    if(!node || !node_takes(st, node, pod))
        return 0;
    const char *ns = kobject_meta_str(pod, "namespace");
    const char *vname = json_string_value(json_object_get(json_object_get(pod, "metadata"), "labels") ?
                                              json_object_get(json_object_get(json_object_get(pod, "metadata"),
                                                                              "labels"),
                                                              "vm.kubevirt.io/name")
                                                                                                        : NULL);
    json_t *vmi = vname ? sim_store_get(st, PLACEMENT_VMI, ns, vname) : NULL;
    if(!vmi || placement_read_vmi_phase(vmi) != BINDER_VMI_PENDING || kobject_meta_str(vmi, "deletionTimestamp")) {
        json_decref(vmi);
        return 0;
    }
    char nb[300];
    snprintf(nb, sizeof nb, "%s", node);
    json_t *p = json_deep_copy(pod);
    json_object_set_new(json_object_get(p, "spec"), "nodeName", json_string(nb));
    json_object_set_new(p, "status", json_pack("{s:s}", "phase", "Running"));
    sim_store_replace(st, PLACEMENT_POD, p);
    json_t *v = json_deep_copy(vmi);
    json_decref(vmi);
    json_object_set_new(v, "status", json_pack("{s:s,s:s}", "phase", "Running", "nodeName", nb));
    sim_store_replace(st, PLACEMENT_VMI, v);
    if(say)
        say(ud, ns, vname, "Pending", "Running", nb, "its launcher pod is pinned there and scheduled");
    return 1;
}

int sim_kubevirt_round(sim_store *st, json_t *runs, sim_say_fn say, void *ud)
{
    int n = 0;
    json_t *vms = sim_store_list(st, PLACEMENT_VM);
    size_t i;
    json_t *vm;
    json_array_foreach(vms, i, vm)
    {
        const char *ns = kobject_meta_str(vm, "namespace"), *name = kobject_meta_str(vm, "name");
        if(!ns || !name || kobject_meta_str(vm, "deletionTimestamp"))
            continue;
        char key[600];
        snprintf(key, sizeof key, "%s/%s", ns, name);
        json_t *run = run_of(runs, key);
        const char *rs = strategy(vm);
        json_t *vmi = sim_store_get(st, PLACEMENT_VMI, ns, name);
        int stopped = json_is_true(json_object_get(run, "stopped"));
        int started = json_is_true(json_object_get(run, "started"));
        const char *why = NULL;
        if(vmi && is_final(vmi)) {
            int failed = placement_read_vmi_phase(vmi) == BINDER_VMI_FAILED;
            if(!strcmp(rs, "Always"))
                why = "runStrategy Always starts a new VMI";
            else if(!strcmp(rs, "RerunOnFailure") && failed && !stopped)
                why = "runStrategy RerunOnFailure starts a new VMI";
            if(why) {
                sim_store_delete(st, PLACEMENT_VMI, ns, name, NULL);
                n++;
            }
        } else if(!vmi) {
            if(!strcmp(rs, "Always"))
                why = started ? "runStrategy Always starts a new VMI" : "created: runStrategy starts it";
            else if(!strcmp(rs, "RerunOnFailure") && !stopped)
                why = started ? "runStrategy RerunOnFailure starts a new VMI" : "created: runStrategy starts it";
            else if(!strcmp(rs, "Once") && !started)
                why = "created: runStrategy starts it";
        }
        json_decref(vmi);
        if(why) {
            create_vmi(st, vm, why, say, ud);
            json_object_set_new(run, "started", json_true());
            n++;
        }
    }
    json_decref(vms);
    json_t *vmis = sim_store_list(st, PLACEMENT_VMI);
    json_t *v;
    json_array_foreach(vmis, i, v)
    {
        if(!is_final(v) && !kobject_meta_str(v, "deletionTimestamp"))
            n += ensure_pod(st, v);
    }
    json_decref(vmis);
    json_t *pods = sim_store_list(st, PLACEMENT_POD);
    json_t *p;
    json_array_foreach(pods, i, p) n += schedule(st, p, say, ud);
    json_decref(pods);
    return n;
}

static json_t *vm_of(sim_store *st, const char *ns, const char *name)
{
    return sim_store_get(st, PLACEMENT_VM, ns, name);
}

/* VM ns/name (a new reference, NULL when none) and its VM controller
 * memory, whose "stopped" becomes `stopped` (virtctl start or stop). */
static json_t *vm_asked(sim_store *st, json_t *runs, const char *ns, const char *name, int stopped, json_t **run)
{
    json_t *vm = vm_of(st, ns, name);
    if(!vm)
        return NULL;
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    *run = run_of(runs, key);
    json_object_set_new(*run, "stopped", json_boolean(stopped));
    return vm;
}

int sim_kubevirt_start(sim_store *st, json_t *runs, const char *ns, const char *name, sim_say_fn say, void *ud)
{
    json_t *run;
    json_t *vm = vm_asked(st, runs, ns, name, 0, &run);
    if(!vm)
        return -1;
    if(!strcmp(strategy(vm), "Halted"))
        set_strategy(st, vm, "Always"); /* virtctl start: Halted -> Always */
    json_decref(vm);
    json_t *vmi = sim_store_get(st, PLACEMENT_VMI, ns, name);
    int live = vmi && !is_final(vmi);
    if(vmi && !live)
        sim_store_delete(st, PLACEMENT_VMI, ns, name, NULL);
    json_decref(vmi);
    if(!live) {
        vm = vm_of(st, ns, name);
        create_vmi(st, vm, "virtctl start", say, ud);
        json_decref(vm);
        json_object_set_new(run, "started", json_true());
    }
    return 0;
}

int sim_kubevirt_stop(sim_store *st, json_t *runs, const char *ns, const char *name, sim_say_fn say, void *ud)
{
    json_t *run;
    json_t *vm = vm_asked(st, runs, ns, name, 1, &run);
    if(!vm)
        return -1;
    if(!strcmp(strategy(vm), "Always"))
        set_strategy(st, vm, "Halted"); /* virtctl stop: Always -> Halted */
    json_decref(vm);
    json_t *vmi = sim_store_get(st, PLACEMENT_VMI, ns, name);
    if(vmi) {
        const char *from = sim_vmi_phase(vmi);
        char fb[32];
        snprintf(fb, sizeof fb, "%s", from);
        sim_store_delete(st, PLACEMENT_VMI, ns, name, NULL);
        if(say)
            say(ud, ns, name, fb, "None", NULL, "virtctl stop: the VMI is deleted, no new one follows");
    }
    json_decref(vmi);
    return 0;
}

int sim_kubevirt_final(sim_store *st, const char *ns, const char *name, const char *phase, sim_say_fn say, void *ud)
{
    json_t *vmi = sim_store_get(st, PLACEMENT_VMI, ns, name);
    if(!vmi || is_final(vmi)) {
        json_decref(vmi);
        return -1;
    }
    char from[32];
    snprintf(from, sizeof from, "%s", sim_vmi_phase(vmi));
    json_t *v = json_deep_copy(vmi);
    json_decref(vmi);
    json_t *status = json_object_get(v, "status");
    if(!json_is_object(status))
        json_object_set_new(v, "status", status = json_object());
    json_object_set_new(status, "phase", json_string(phase));
    const char *node = json_string_value(json_object_get(status, "nodeName"));
    char nb[300] = "";
    if(node)
        snprintf(nb, sizeof nb, "%s", node);
    sim_store_replace(st, PLACEMENT_VMI, v);
    char pod[400];
    snprintf(pod, sizeof pod, "virt-launcher-%s", name);
    json_t *p = sim_store_get(st, PLACEMENT_POD, ns, pod);
    if(p) {
        json_t *c = json_deep_copy(p);
        json_object_set_new(c, "status", json_pack("{s:s}", "phase", phase));
        sim_store_replace(st, PLACEMENT_POD, c);
    }
    json_decref(p);
    if(say)
        say(ud, ns, name, from, phase, *nb ? nb : NULL, "the VMI ended");
    return 0;
}
