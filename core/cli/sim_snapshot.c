/* sim_snapshot.c — a live cluster's objects as `cozygpu simulate`'s
 * starting state (sim.h): a file or a directory of .yaml/.yml/.json files
 * read as `kubectl apply -f` reads them (format/manifest.h), e.g.
 * `kubectl get nodes,gpunodes,gpuclasses,gpuclaims,vms,vmis,kubevirts,
 * namespaces,resourcequotas,pvc,pv -A -o yaml`. Every object of a kind the
 * leader reads is checked where the leader reads it (a malformed one, one
 * without a kind, or one given twice fails the run naming the file, the
 * object and the field), then stored as it is: the placement model builds
 * its state from them as a new leader would (decision 0041). Objects of
 * other kinds are skipped, one note per kind.
 */
#include "cli/sim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binder/binder.h"
#include "format/kobject.h"
#include "placement/read.h"

static const char *const rs_names[] = {"Halted", "Always", "RerunOnFailure", "Once", "Manual"};

/* The kinds a snapshot is read for (anything else is skipped with a
 * note), and whether they are namespaced. */
static const struct {
    const char *kind;
    int namespaced;
} snap_kinds[] = {{"GPUClass", 0},      {"Node", 0},           {"GPUNode", 0},
                  {"KubeVirt", 1},      {"GPUClaim", 1},       {"VirtualMachine", 1},
                  {"VirtualMachineInstance", 1}, {"Namespace", 0}, {"ResourceQuota", 1},
                  {"PersistentVolumeClaim", 1}, {"PersistentVolume", 0}};
_Static_assert(sizeof snap_kinds / sizeof *snap_kinds == 11, "snap_apply's note counts each kind");

/* A field of `o` down the NULL-terminated list of keys (NULL when absent). */
static const json_t *get(const json_t *o, ...)
{
    va_list ap;
    va_start(ap, o);
    for(const char *k = va_arg(ap, const char *); k && o; k = va_arg(ap, const char *))
        o = json_object_get(o, k);
    va_end(ap);
    return o;
}

/* A snapshot record's object: "KIND NS/NAME" or "KIND NAME". */
static void snap_id(const json_t *rec, char *buf, size_t n)
{
    const json_t *o = json_object_get(rec, "object");
    const char *kind = json_string_value(json_object_get(o, "kind"));
    const char *ns = json_string_value(get(o, "metadata", "namespace", NULL));
    const char *name = json_string_value(get(o, "metadata", "name", NULL));
    snprintf(buf, n, "%s %s%s%s", kind ? kind : "object", ns ? ns : "", ns ? "/" : "",
             name ? name : "(no metadata.name)");
}

/* Fails the run on snapshot record `rec`: "FILE: KIND NS/NAME: FIELD:
 * message" (FILE the snapshot file the object came from). Returns -1. */
static int snap_bad(sim *s, const json_t *rec, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int snap_bad(sim *s, const json_t *rec, const char *field, const char *fmt, ...)
{
    if(s->bad[0])
        return -1;
    char m[600], id[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snap_id(rec, id, sizeof id);
    snprintf(s->bad, sizeof s->bad, "%s: %s: %s%s%s", json_string_value(json_object_get(rec, "file")), id,
             field ? field : "", field ? ": " : "", m);
    return -1;
}

/* A note of the snapshot's reading: a line of step 0 (table) or an event
 * {kind: note, message} (json). */
static void snap_note(sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void snap_note(sim *s, const char *fmt, ...)
{
    char m[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    sim_say(s, "  note: %s\n", m);
    sim_event(s, json_pack("{s:s,s:s}", "kind", "note", "message", m));
}

/* Type checks of one field of a snapshot object: absent is fine unless
 * `required`; otherwise the value must be of the kind named. Each returns
 * 0, or -1 with the run failed (snap_bad). */
static int want_str(sim *s, const json_t *rec, const json_t *v, const char *field, int required)
{
    if(!v || json_is_null(v))
        return required ? snap_bad(s, rec, field, "required") : 0;
    if(!json_is_string(v) || (required && !*json_string_value(v)))
        return snap_bad(s, rec, field, "must be a%s string", required ? " non-empty" : "");
    return 0;
}

/* `v` (when given) is of JSON type `type`: JSON_OBJECT, JSON_ARRAY or
 * JSON_TRUE (a boolean). */
static int want_type(sim *s, const json_t *rec, const json_t *v, const char *field, int type)
{
    if(!v || json_is_null(v))
        return 0;
    static const char *const what[] = {[JSON_OBJECT] = "a mapping", [JSON_ARRAY] = "a list",
                                       [JSON_TRUE] = "true or false"};
    int t = json_typeof(v) == JSON_FALSE ? JSON_TRUE : (int)json_typeof(v);
    if(t != type)
        return snap_bad(s, rec, field, "must be %s", what[type]);
    return 0;
}

/* Every element of list `v` (when given) is a mapping; its string fields
 * `strs` (NULL-terminated) are strings when given. */
static int want_maps(sim *s, const json_t *rec, const json_t *v, const char *field, const char *const *strs)
{
    if(want_type(s, rec, v, field, JSON_ARRAY))
        return -1;
    size_t i;
    json_t *x;
    json_array_foreach((json_t *)v, i, x) {
        char f[300];
        snprintf(f, sizeof f, "%s[%zu]", field, i);
        if(!json_is_object(x))
            return snap_bad(s, rec, f, "must be a mapping");
        for(const char *const *k = strs; k && *k; k++) {
            char fk[400];
            snprintf(fk, sizeof fk, "%s.%s", f, *k);
            if(want_str(s, rec, json_object_get(x, *k), fk, 0))
                return -1;
        }
    }
    return 0;
}

/* metadata.labels or .annotations (when given) map names to strings. */
static int want_string_map(sim *s, const json_t *rec, const json_t *v, const char *field)
{
    if(want_type(s, rec, v, field, JSON_OBJECT))
        return -1;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        if(!json_is_string(x)) {
            char f[400];
            snprintf(f, sizeof f, "%s.%s", field, k);
            return snap_bad(s, rec, f, "must be a string");
        }
    }
    return 0;
}

/* The volumes of a VM's template or a VMI (`vols`, at `field`), as
 * placement_read_volume_nodes reads them: a list of mappings whose
 * persistentVolumeClaim.claimName and dataVolume.name are strings. */
static int want_volumes(sim *s, const json_t *rec, const json_t *vols, const char *field)
{
    if(want_maps(s, rec, vols, field, NULL))
        return -1;
    size_t i;
    json_t *v;
    json_array_foreach((json_t *)vols, i, v) {
        static const char *const src[][2] = {{"persistentVolumeClaim", "claimName"}, {"dataVolume", "name"}};
        for(int k = 0; k < 2; k++) {
            char f[400];
            snprintf(f, sizeof f, "%s[%zu].%s", field, i, src[k][0]);
            const json_t *x = json_object_get(v, src[k][0]);
            if(want_type(s, rec, x, f, JSON_OBJECT))
                return -1;
            snprintf(f, sizeof f, "%s[%zu].%s.%s", field, i, src[k][0], src[k][1]);
            if(want_str(s, rec, json_object_get(x, src[k][1]), f, 0))
                return -1;
        }
    }
    return 0;
}

/* A PersistentVolume's spec.nodeAffinity, as placement_read_pv_nodes reads it:
 * required.nodeSelectorTerms a list of mappings, their matchExpressions
 * and matchFields lists of {key, operator} strings with `values` a list of
 * strings. */
static int want_pv_affinity(sim *s, const json_t *rec, const json_t *o)
{
    const json_t *na = get(o, "spec", "nodeAffinity", NULL);
    const json_t *terms = get(na, "required", "nodeSelectorTerms", NULL);
    static const char *const kv[] = {"key", "operator", NULL};
    if(want_type(s, rec, na, "spec.nodeAffinity", JSON_OBJECT) ||
       want_type(s, rec, json_object_get(na, "required"), "spec.nodeAffinity.required", JSON_OBJECT) ||
       want_maps(s, rec, terms, "spec.nodeAffinity.required.nodeSelectorTerms", NULL))
        return -1;
    size_t i;
    json_t *t;
    json_array_foreach((json_t *)terms, i, t) {
        static const char *const kinds[] = {"matchExpressions", "matchFields"};
        for(int k = 0; k < 2; k++) {
            char f[300];
            snprintf(f, sizeof f, "spec.nodeAffinity.required.nodeSelectorTerms[%zu].%s", i, kinds[k]);
            const json_t *reqs = json_object_get(t, kinds[k]);
            if(want_maps(s, rec, reqs, f, kv))
                return -1;
            size_t j;
            json_t *r;
            json_array_foreach((json_t *)reqs, j, r) {
                char fv[400];
                snprintf(fv, sizeof fv, "%s[%zu].values", f, j);
                const json_t *vals = json_object_get(r, "values");
                if(want_type(s, rec, vals, fv, JSON_ARRAY))
                    return -1;
                size_t m;
                json_t *val;
                json_array_foreach((json_t *)vals, m, val) {
                    if(!json_is_string(val)) {
                        char fm[450];
                        snprintf(fm, sizeof fm, "%s[%zu]", fv, m);
                        return snap_bad(s, rec, fm, "must be a string");
                    }
                }
            }
        }
    }
    return 0;
}

/* Checks the fields simulate reads of snapshot record `rec` of kind
 * `kind` (the leader reads the same ones: placement/read.c,
 * runtime.binder.node). Returns 0 or -1 (the run failed naming the file,
 * the object and the field). */
static int snap_check(sim *s, const json_t *rec, const char *kind, int namespaced)
{
    const json_t *o = json_object_get(rec, "object");
    const json_t *md = json_object_get(o, "metadata");
    if(!json_is_object(md))
        return snap_bad(s, rec, "metadata", "required (a mapping)");
    if(want_str(s, rec, json_object_get(md, "name"), "metadata.name", 1) ||
       (namespaced && want_str(s, rec, json_object_get(md, "namespace"), "metadata.namespace", 1)) ||
       want_string_map(s, rec, json_object_get(md, "labels"), "metadata.labels") ||
       want_string_map(s, rec, json_object_get(md, "annotations"), "metadata.annotations") ||
       want_str(s, rec, json_object_get(md, "deletionTimestamp"), "metadata.deletionTimestamp", 0) ||
       want_type(s, rec, json_object_get(o, "spec"), "spec", JSON_OBJECT) ||
       want_type(s, rec, json_object_get(o, "status"), "status", JSON_OBJECT))
        return -1;
    const char *name = json_string_value(json_object_get(md, "name"));
    if(strlen(name) > BINDER_MAX_NAME)
        return snap_bad(s, rec, "metadata.name", "longer than %d", BINDER_MAX_NAME);
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    if(namespaced && strlen(ns) > BINDER_MAX_NAMESPACE)
        return snap_bad(s, rec, "metadata.namespace", "longer than %d", BINDER_MAX_NAMESPACE);
    static const char *const tol[] = {"key", "operator", "value", "effect", NULL};
    static const char *const taint[] = {"key", "value", "effect", NULL};
    static const char *const cond[] = {"type", "status", "reason", NULL};
    static const char *const dev[] = {"deviceName", NULL};
    if(!strcmp(kind, "GPUClass")) {
        const json_t *oc = get(o, "spec", "onCordon", NULL);
        if(want_str(s, rec, oc, "spec.onCordon", 0) || want_str(s, rec, get(o, "spec", "resourceName", NULL),
                                                                 "spec.resourceName", 0) ||
           want_maps(s, rec, get(o, "spec", "tolerations", NULL), "spec.tolerations", tol))
            return -1;
        if(oc && strcmp(json_string_value(oc), "Move") && strcmp(json_string_value(oc), "Stay"))
            return snap_bad(s, rec, "spec.onCordon", "must be Move or Stay, not \"%s\"", json_string_value(oc));
        size_t i;
        json_t *t;
        json_array_foreach(get(o, "spec", "tolerations", NULL), i, t) {
            const char *op = json_string_value(json_object_get(t, "operator"));
            if(op && strcmp(op, "Exists") && strcmp(op, "Equal")) {
                char f[100];
                snprintf(f, sizeof f, "spec.tolerations[%zu].operator", i);
                return snap_bad(s, rec, f, "must be Exists or Equal, not \"%s\"", op);
            }
        }
        if(json_array_size(get(o, "spec", "tolerations", NULL)) > 32)
            return snap_bad(s, rec, "spec.tolerations", "more than 32");
    } else if(!strcmp(kind, "Node")) {
        if(want_type(s, rec, get(o, "spec", "unschedulable", NULL), "spec.unschedulable", JSON_TRUE) ||
           want_maps(s, rec, get(o, "spec", "taints", NULL), "spec.taints", taint) ||
           want_maps(s, rec, get(o, "status", "conditions", NULL), "status.conditions", cond) ||
           want_type(s, rec, get(o, "status", "allocatable", NULL), "status.allocatable", JSON_OBJECT) ||
           want_str(s, rec, get(o, "status", "nodeInfo", "bootID", NULL), "status.nodeInfo.bootID", 0))
            return -1;
    } else if(!strcmp(kind, "GPUNode")) {
        if(want_maps(s, rec, get(o, "status", "functions", NULL), "status.functions", NULL) ||
           want_str(s, rec, get(o, "status", "bootID", NULL), "status.bootID", 0))
            return -1;
    } else if(!strcmp(kind, "KubeVirt")) {
        if(want_type(s, rec, get(o, "spec", "configuration", "permittedHostDevices", NULL),
                     "spec.configuration.permittedHostDevices", JSON_OBJECT))
            return -1;
    } else if(!strcmp(kind, "GPUClaim")) {
        const json_t *cnt = get(o, "spec", "count", NULL), *ph = get(o, "status", "phase", NULL);
        if(want_str(s, rec, get(o, "spec", "class", NULL), "spec.class", 1))
            return -1;
        if(!json_is_integer(cnt) || json_integer_value(cnt) < 1 || json_integer_value(cnt) > BINDER_MAX_UNITS)
            return snap_bad(s, rec, "spec.count", "must be a whole number from 1 to %d", BINDER_MAX_UNITS);
        if(want_str(s, rec, ph, "status.phase", 0) ||
           want_str(s, rec, get(o, "status", "node", NULL), "status.node", 0) ||
           want_str(s, rec, get(o, "status", "attachedTo", NULL), "status.attachedTo", 0) ||
           want_maps(s, rec, get(o, "status", "conditions", NULL), "status.conditions", cond))
            return -1;
        binder_phase p;
        if(ph && binder_phase_parse(json_string_value(ph), &p))
            return snap_bad(s, rec, "status.phase", "must be Pending, Bound, Attached or Lost, not \"%s\"",
                            json_string_value(ph));
        size_t i;
        json_t *c;
        json_array_foreach(get(o, "status", "conditions", NULL), i, c) {
            const char *t = json_string_value(json_object_get(c, "type"));
            const char *r = json_string_value(json_object_get(c, "reason"));
            binder_reason br;
            /* "Pending": the leader's word for no reason yet (bind.c status_of) */
            if(t && !strcmp(t, "Ready") && r && *r && strcmp(r, "Pending") && binder_reason_parse(r, &br)) {
                char f[100];
                snprintf(f, sizeof f, "status.conditions[%zu].reason", i);
                return snap_bad(s, rec, f, "\"%s\" is not a reason of decision 0020", r);
            }
        }
    } else if(!strcmp(kind, "VirtualMachine")) {
        const json_t *rs = get(o, "spec", "runStrategy", NULL);
        if(want_str(s, rec, rs, "spec.runStrategy", 0) ||
           want_type(s, rec, get(o, "spec", "running", NULL), "spec.running", JSON_TRUE) ||
           want_string_map(s, rec, get(o, "spec", "template", "metadata", "annotations", NULL),
                           "spec.template.metadata.annotations") ||
           want_string_map(s, rec, get(o, "spec", "template", "metadata", "labels", NULL),
                           "spec.template.metadata.labels") ||
           want_maps(s, rec, get(o, "spec", "template", "spec", "domain", "devices", "gpus", NULL),
                     "spec.template.spec.domain.devices.gpus", dev) ||
           want_maps(s, rec, get(o, "spec", "template", "spec", "domain", "devices", "hostDevices", NULL),
                     "spec.template.spec.domain.devices.hostDevices", dev) ||
           want_volumes(s, rec, get(o, "spec", "template", "spec", "volumes", NULL), "spec.template.spec.volumes"))
            return -1;
        int r = -1;
        for(int i = 0; rs && i < 5; i++)
            if(!strcmp(json_string_value(rs), rs_names[i]))
                r = i;
        if(rs && r < 0) {
            char id[400];
            snap_id(rec, id, sizeof id);
            snap_note(s, "snapshot: %s: runStrategy %s is not modelled; replayed as Manual (nothing restarts it)", id,
                      json_string_value(rs));
        }
    } else if(!strcmp(kind, "VirtualMachineInstance")) {
        const json_t *ph = get(o, "status", "phase", NULL);
        if(want_str(s, rec, ph, "status.phase", 0) ||
           want_str(s, rec, get(o, "status", "nodeName", NULL), "status.nodeName", 0) ||
           want_maps(s, rec, get(o, "spec", "domain", "devices", "gpus", NULL), "spec.domain.devices.gpus", dev) ||
           want_maps(s, rec, get(o, "spec", "domain", "devices", "hostDevices", NULL),
                     "spec.domain.devices.hostDevices", dev) ||
           want_volumes(s, rec, get(o, "spec", "volumes", NULL), "spec.volumes"))
            return -1;
        static const char *const phases[] = {"",        "Pending",   "Scheduling", "Scheduled",
                                             "Running", "Succeeded", "Failed",     "Unknown"};
        int ok = !ph;
        for(size_t i = 0; ph && i < sizeof phases / sizeof *phases; i++)
            ok |= !strcmp(json_string_value(ph), phases[i]);
        if(!ok) {
            char id[400];
            snap_id(rec, id, sizeof id);
            snap_note(s, "snapshot: %s: status.phase %s is read as Running, as the leader reads it", id,
                      json_string_value(ph));
        }
    } else if(!strcmp(kind, "ResourceQuota")) {
        if(!json_is_object(get(o, "spec", "hard", NULL)))
            return snap_bad(s, rec, "spec.hard", "must be a mapping");
    } else if(!strcmp(kind, "PersistentVolumeClaim")) {
        if(want_str(s, rec, get(o, "spec", "volumeName", NULL), "spec.volumeName", 0))
            return -1;
    } else if(!strcmp(kind, "PersistentVolume")) {
        if(want_pv_affinity(s, rec, o))
            return -1;
    }
    return 0;
}

static placement_kind kind_of(const char *kind)
{
    for(int k = 0; k < PLACEMENT_KINDS; k++)
        if(!strcmp(placement_kind_name[k], kind))
            return (placement_kind)k;
    return PLACEMENT_KINDS;
}

void sim_snapshot_load(sim *s)
{
    json_t *skipped = json_object(), *seen = json_object();
    size_t i, kubevirts = 0;
    json_t *rec;
    json_array_foreach(s->snap_recs, i, rec)
    {
        const json_t *o = json_object_get(rec, "object");
        const json_t *kv = json_object_get(o, "kind");
        if(!json_is_string(kv) || !*json_string_value(kv)) {
            snap_bad(s, rec, "kind", "required");
            break;
        }
        const char *kind = json_string_value(kv);
        size_t k;
        for(k = 0; k < sizeof snap_kinds / sizeof *snap_kinds; k++)
            if(!strcmp(kind, snap_kinds[k].kind))
                break;
        if(k == sizeof snap_kinds / sizeof *snap_kinds) {
            json_object_set_new(skipped, kind, json_integer(json_integer_value(json_object_get(skipped, kind)) + 1));
            continue;
        }
        if(snap_check(s, rec, kind, snap_kinds[k].namespaced))
            break;
        char id[400];
        snap_id(rec, id, sizeof id);
        if(json_object_get(seen, id)) {
            snap_bad(s, rec, NULL, "given twice (also in %s)", json_string_value(json_object_get(seen, id)));
            break;
        }
        json_object_set_new(seen, id, json_string(json_string_value(json_object_get(rec, "file"))));
        placement_kind pk = kind_of(kind);
        if(pk == PLACEMENT_KUBEVIRT && kubevirts++)
            continue; /* the first is used, as the leader does */
        if(kobject_meta_str(o, "deletionTimestamp"))
            snap_note(s, "snapshot: %s is being deleted: it goes once nothing uses it (its finalizers)", id);
        sim_store_create(s->st, pk, json_deep_copy(o));
    }
    /* the snapshot's classes, for scenario nodes that offer them (after
     * every object: the made-up devices go into the snapshot's KubeVirt) */
    json_t *classes = s->bad[0] ? json_array() : sim_store_list(s->st, PLACEMENT_CLASS);
    json_t *c;
    json_array_foreach(classes, i, c)
    {
        const char *rn = json_string_value(get(c, "spec", "resourceName", NULL));
        sim_class_known(s, kobject_meta_str(c, "name"), rn ? rn : "");
    }
    json_decref(classes);
    const char *k;
    json_t *n;
    json_object_foreach(skipped, k, n)
    {
        snap_note(s, "snapshot: skipped %lld %s object%s (not a kind simulate reads)", (long long)json_integer_value(n),
                  k, json_integer_value(n) > 1 ? "s" : "");
    }
    if(kubevirts > 1)
        snap_note(s, "snapshot: %zu KubeVirt objects; the first is used, as the leader does", kubevirts);
    json_decref(skipped);
    json_decref(seen);
}
