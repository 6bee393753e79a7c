/* usage_record.c — a claim's usage record and a namespace's monitor
 * (usage_internal.h, ctl_usage_): the record's name, the Workload and
 * WorkloadMonitor as they should be, and the writes that make the cluster
 * so (create, conditional PUT, delete with a uid precondition), each after
 * checking the Lease and counted in cozygpu_usage_record_writes_total.
 *
 * Rules: DESIGN.md §3 "Usage records" (kind gpu-device, resources
 * <class>.gpuclass.cozystack.io/devices, owned by its claim, labelled with
 * the monitor the controller owns), §2 (writers on the leader only),
 * docs/decisions/0028 (names one-to-one with claims, idempotence, what a
 * tenant's edits do: the owner reference, labels and status of the record
 * named for a claim are that claim's; the monitor's spec is ours).
 */
#include "controller/internal.h"
#include "controller/usage_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/crypto.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "format/kobject.h"

#define MONITOR_LABEL "workloads.cozystack.io/monitor"
#define MANAGED_BY "app.kubernetes.io/managed-by"
#define MANAGER "cozygpu"
#define MONITOR_NAME "cozygpu-gpus"
/* the monitor's selector: a label nothing carries, so Cozystack's monitor
 * reconciler makes no pod/PVC/Service/BucketClaim Workloads from it (an
 * empty selector would select every object of the namespace) */
#define SELECTOR_KEY "gpu.cozystack.io/usage-monitor-selects-nothing"
#define SELECTOR_VALUE "true"
#define RECORD_KIND "gpu-device"
#define RESOURCE_SUFFIX ".gpuclass.cozystack.io/devices"
#define NAME_MAX_LEN CTL_USAGE_NAME_MAX_LEN

typedef ctl_usage_state usage;

/* ------------------------------------------------------------ names */

int ctl_usage_record_name(const char *claim, char *out, size_t n)
{
    size_t len = strlen(claim);
    if(4 + len <= NAME_MAX_LEN) {
        snprintf(out, n, "gpu-%s", claim);
        return 0;
    }
    unsigned char d[32];
    if(gnutls_hash_fast(GNUTLS_DIG_SHA256, claim, len, d) < 0)
        return -1;
    char hex[33];
    for(int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    /* 5 + cut + 1 + 32 = 253 */
    size_t cut = NAME_MAX_LEN - 5 - 1 - 32;
    while(cut > 0 && (claim[cut - 1] == '-' || claim[cut - 1] == '.'))
        cut--;
    snprintf(out, n, "gpuh-%.*s-%s", (int)cut, claim, hex);
    return 0;
}

/* ------------------------------------------------------------ counts, the wanted set */

static void count_write(const char *object, const char *op, const char *result)
{
    char labels[160];
    snprintf(labels, sizeof labels, "object=\"%s\",op=\"%s\",result=\"%s\"", object, op, result);
    metrics_counter_add("cozygpu_usage_record_writes_total", labels, 1);
}

/* `wanted` and `ns_count` follow whether claim ns/name wants a record. */
static void set_wanted(usage *U, const char *ns, const char *name, int want)
{
    char key[600];
    if(ctl_usage_join_key(key, sizeof key, "", ns, name) != 0)
        return;
    int had = json_object_get(U->wanted, key) != NULL;
    if(had == want)
        return;
    json_int_t c = json_integer_value(json_object_get(U->ns_count, ns));
    if(want) {
        json_object_set_new(U->wanted, key, json_true());
        json_object_set_new(U->ns_count, ns, json_integer(c + 1));
    } else {
        json_object_del(U->wanted, key);
        if(c <= 1)
            json_object_del(U->ns_count, ns);
        else
            json_object_set_new(U->ns_count, ns, json_integer(c - 1));
    }
}

/* A 404 that says the type is not served (its CRD is missing): the API
 * server's "the server could not find the requested resource" carries no
 * details.name, while a missing object or namespace is named there. */
static int type_missing(long code, const json_t *out)
{
    if(code != 404)
        return 0;
    return json_string_value(json_object_get(json_object_get(out, "details"), "name")) == NULL;
}

/* ------------------------------------------------------------ objects */

static json_t *desired_monitor(const char *ns)
{
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s}}, s:{s:{s:s}, s:s, s:s}}", "apiVersion",
                     "cozystack.io/v1alpha1", "kind", "WorkloadMonitor", "metadata", "name", MONITOR_NAME,
                     "namespace", ns, "labels", MANAGED_BY, MANAGER, "spec", "selector", SELECTOR_KEY,
                     SELECTOR_VALUE, "kind", RECORD_KIND, "type", RECORD_KIND);
}

static int label_is(const json_t *obj, const char *key, const char *want)
{
    const char *v = json_string_value(json_object_get(json_object_get(json_object_get(obj, "metadata"), "labels"), key));
    return v && strcmp(v, want) == 0;
}

static int monitor_matches(const json_t *have, const json_t *want)
{
    return label_is(have, MANAGED_BY, MANAGER) && json_equal(json_object_get(have, "spec"), json_object_get(want, "spec"));
}

/* `have` (a deep copy the caller owns) made right: our label set, the spec
 * replaced (a tenant's selector or kind would let Cozystack's monitor
 * reconciler bill the tenant's pods under our monitor). */
static void fix_monitor(json_t *have, const json_t *want)
{
    json_t *md = json_object_get(have, "metadata");
    json_t *labels = json_object_get(md, "labels");
    if(!json_is_object(labels)) {
        labels = json_object();
        json_object_set_new(md, "labels", labels);
    }
    json_object_set_new(labels, MANAGED_BY, json_string(MANAGER));
    json_object_set(have, "spec", json_object_get(want, "spec"));
}

/* The record claim `claim` asks for (the caller checked its phase). */
static json_t *desired_record(const json_t *claim, const char *rname)
{
    const json_t *spec = json_object_get(claim, "spec");
    const char *cls = json_string_value(json_object_get(spec, "class"));
    json_int_t count = json_integer_value(json_object_get(spec, "count"));
    const char *phase = json_string_value(json_object_get(json_object_get(claim, "status"), "phase"));
    char key[400], qty[32];
    snprintf(key, sizeof key, "%s" RESOURCE_SUFFIX, cls);
    snprintf(qty, sizeof qty, "%lld", (long long)count);
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s, s:s}, s:[{s:s, s:s, s:s, s:s, s:b}]}, s:{s:s, s:s, s:{s:s}, s:b}}",
                     "apiVersion", "cozystack.io/v1alpha1", "kind", "Workload", "metadata", "name", rname,
                     "namespace", kobject_meta_str(claim, "namespace"), "labels", MONITOR_LABEL, MONITOR_NAME, MANAGED_BY,
                     MANAGER, "ownerReferences", "apiVersion", "cozystack.io/v1alpha1", "kind", "GPUClaim", "name",
                     kobject_meta_str(claim, "name"), "uid", kobject_meta_str(claim, "uid"), "controller", 1, "status", "kind",
                     RECORD_KIND, "type", cls, "resources", key, qty, "operational",
                     phase && strcmp(phase, "Attached") == 0);
}

/* A quantity as the API may hand it back: the string we wrote, or an
 * integer (the CRD's int-or-string). */
static int quantity_equal(const json_t *have, const json_t *want)
{
    if(json_is_string(have))
        return strcmp(json_string_value(have), json_string_value(want)) == 0;
    if(json_is_integer(have)) {
        char b[32];
        snprintf(b, sizeof b, "%lld", (long long)json_integer_value(have));
        return strcmp(b, json_string_value(want)) == 0;
    }
    return 0;
}

static int record_matches(const json_t *have, const json_t *want)
{
    if(!label_is(have, MONITOR_LABEL, MONITOR_NAME) || !label_is(have, MANAGED_BY, MANAGER))
        return 0;
    const json_t *refs = json_object_get(json_object_get(have, "metadata"), "ownerReferences");
    const json_t *wref = json_array_get(json_object_get(json_object_get(want, "metadata"), "ownerReferences"), 0);
    if(json_array_size(refs) != 1 || !json_equal(json_array_get(refs, 0), wref))
        return 0;
    const json_t *hs = json_object_get(have, "status"), *ws = json_object_get(want, "status");
    if(!json_equal(json_object_get(hs, "kind"), json_object_get(ws, "kind")) ||
       !json_equal(json_object_get(hs, "type"), json_object_get(ws, "type")) ||
       !json_equal(json_object_get(hs, "operational"), json_object_get(ws, "operational")))
        return 0;
    const json_t *hr = json_object_get(hs, "resources"), *wr = json_object_get(ws, "resources");
    if(json_object_size(hr) != json_object_size(wr))
        return 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)wr, k, v) if(!quantity_equal(json_object_get(hr, k), v)) return 0;
    return 1;
}

/* `have` (a deep copy the caller owns) made right: our labels set (the
 * tenant's others kept), our owner reference alone, status replaced. */
static void fix_record(json_t *have, const json_t *want)
{
    json_t *md = json_object_get(have, "metadata");
    json_t *labels = json_object_get(md, "labels");
    if(!json_is_object(labels)) {
        labels = json_object();
        json_object_set_new(md, "labels", labels);
    }
    json_object_set_new(labels, MONITOR_LABEL, json_string(MONITOR_NAME));
    json_object_set_new(labels, MANAGED_BY, json_string(MANAGER));
    json_object_set(md, "ownerReferences", json_object_get(json_object_get(want, "metadata"), "ownerReferences"));
    json_object_set(have, "status", json_object_get(want, "status"));
}

/* ------------------------------------------------------------ writes */


/* DELETE r ns/name if its uid is still `uid` (a precondition: an object
 * re-created under the name in between is left alone). */
int ctl_usage_delete_uid(const kube_resource *r, const char *object, const char *ns, const char *name, const char *uid)
{
    if(!ctl_usage_leading())
        return CTL_USAGE_W_RETRY;
    long code = 0;
    cozy_err err;
    json_t *out = NULL;
    char *path = kube_path(r, ns, name, NULL);
    json_t *opts = json_pack("{s:s, s:s, s:{s:s}}", "apiVersion", "v1", "kind", "DeleteOptions", "preconditions",
                             "uid", uid ? uid : "");
    int rc = CTL_USAGE_W_RETRY;
    if(path && opts && kube_request(ctl_proc->client, "DELETE", path, NULL, opts, &code, &out, &err) == COZY_OK) {
        if(code / 100 == 2 || code == 404 || code == 409) {
            /* 404: gone already; 409: another object holds the name now */
            count_write(object, "delete", code / 100 == 2 ? "ok" : "conflict");
            rc = CTL_USAGE_W_OK;
        } else
            count_write(object, "delete", "error");
    } else
        count_write(object, "delete", "error");
    json_decref(out);
    json_decref(opts);
    free(path);
    return rc;
}

/* A refused write, logged; a write refused again a second later is not
 * logged again for 10 s (the lines held back are counted in the next). */
static void write_failed(const char *what, const kube_resource *r, const char *ns, const char *name, long code,
                         const char *message)
{
    static long long quiet_until;
    static unsigned long held;
    long long now = clock_mono_ms();
    if(now < quiet_until) {
        held++;
        return;
    }
    quiet_until = now + 10000;
    char c[16], h[24];
    snprintf(c, sizeof c, "%ld", code);
    snprintf(h, sizeof h, "%lu", held);
    held = 0;
    log_write(LOG_WARN, "usage", what, "resource", r->resource, "namespace", ns, "name", name ? name : "",
              LOG_NUM "status", c, "error", message ? message : "", LOG_NUM "held_back", h, NULL);
}

/* PUT `obj` (conditional on its resourceVersion); on success *result (if
 * result) is the object as written (a new reference). */
static int put(const kube_resource *r, const char *object, const char *ns, const json_t *obj, json_t **result)
{
    if(!ctl_usage_leading())
        return CTL_USAGE_W_RETRY;
    long code = 0;
    json_t *out = NULL;
    cozy_err err;
    int rc = CTL_USAGE_W_RETRY;
    if(kube_update(ctl_proc->client, r, ns, obj, &code, &out, &err) == COZY_OK) {
        if(code / 100 == 2) {
            count_write(object, "update", "ok");
            rc = CTL_USAGE_W_OK;
            if(result) {
                *result = out;
                out = NULL;
            }
        } else if(type_missing(code, out)) {
            count_write(object, "update", "unavailable");
            rc = CTL_USAGE_W_MISSING;
        } else {
            count_write(object, "update", code == 409 ? "conflict" : "error");
            if(code != 409) {
                const char *m = json_string_value(json_object_get(out, "message"));
                write_failed("cannot update", r, ns, kobject_meta_str(obj, "name"), code, m);
            }
        }
    } else
        count_write(object, "update", "error");
    json_decref(out);
    return rc;
}

/* POST `want`; on success *result (if result) is the object as created;
 * on 409 *existing is set to the object read back (new references), or
 * CTL_USAGE_W_RETRY when it cannot be read. */
static int create(const kube_resource *r, const char *object, const char *ns, const json_t *want, json_t **existing,
                  json_t **result)
{
    *existing = NULL;
    if(!ctl_usage_leading())
        return CTL_USAGE_W_RETRY;
    long code = 0;
    json_t *out = NULL;
    cozy_err err;
    int rc = CTL_USAGE_W_RETRY;
    if(kube_create(ctl_proc->client, r, ns, want, &code, &out, &err) != COZY_OK) {
        count_write(object, "create", "error");
        return CTL_USAGE_W_RETRY;
    }
    if(code / 100 == 2) {
        count_write(object, "create", "ok");
        rc = CTL_USAGE_W_OK;
        if(result) {
            *result = out;
            out = NULL;
        }
    } else if(type_missing(code, out)) {
        count_write(object, "create", "unavailable");
        rc = CTL_USAGE_W_MISSING;
    } else if(code == 409) {
        count_write(object, "create", "conflict");
        json_t *got = NULL;
        long gc = 0;
        if(kube_get(ctl_proc->client, r, ns, kobject_meta_str(want, "name"), &gc, &got, &err) == COZY_OK && gc == 200) {
            *existing = got;
            got = NULL;
            rc = CTL_USAGE_W_OK;
        }
        json_decref(got);
    } else {
        count_write(object, "create", "error");
        const char *m = json_string_value(json_object_get(out, "message"));
        write_failed("cannot create", r, ns, kobject_meta_str(want, "name"), code, m);
    }
    json_decref(out);
    return rc;
}

/* The monitor of namespace `ns` as it should be. `force`: compare with
 * the cache even when this lead wrote it already. */
int ctl_usage_ensure_monitor(usage *U, const char *ns, int force)
{
    if(!force && json_object_get(U->mon_ok, ns))
        return CTL_USAGE_W_OK;
    json_t *want = desired_monitor(ns);
    json_t *have = kube_informer_get(ctl_proc->monitors_inf, ns, MONITOR_NAME);
    int rc = CTL_USAGE_W_OK;
    if(!have || !monitor_matches(have, want)) {
        json_t *existing = NULL;
        if(have) {
            existing = json_deep_copy(have);
        } else {
            rc = create(&KUBE_WORKLOADMONITORS, "monitor", ns, want, &existing, NULL);
            if(rc == CTL_USAGE_W_OK && !existing)
                log_write(LOG_INFO, "usage", "created the usage monitor", "namespace", ns, "workloadmonitor",
                          MONITOR_NAME, NULL);
        }
        if(rc == CTL_USAGE_W_OK && existing && !monitor_matches(existing, want)) {
            fix_monitor(existing, want);
            rc = put(&KUBE_WORKLOADMONITORS, "monitor", ns, existing, NULL);
            if(rc == CTL_USAGE_W_OK)
                log_write(LOG_INFO, "usage", "restored the usage monitor's labels and spec", "namespace", ns,
                          "workloadmonitor", MONITOR_NAME, NULL);
        }
        json_decref(existing);
    }
    json_decref(have);
    json_decref(want);
    if(rc == CTL_USAGE_W_OK)
        json_object_set_new(U->mon_ok, ns, json_true());
    return rc;
}

/* What this lead wrote to record `rkey` and the cache may not show yet:
 * `written` maps it to {obj: the object as the API answered, behind:
 * [resourceVersions the cache may still show, "" for none]}. */
static void remember(usage *U, const char *rkey, json_t *obj, json_t *behind)
{
    if(!obj) {
        json_decref(behind);
        return;
    }
    json_object_set_new(U->written, rkey, json_pack("{s:o, s:o}", "obj", obj, "behind", behind));
}

/* The record as this lead knows it: the cached one, or what it wrote when
 * the cache still shows the state before that write (the watch event is
 * on its way). A cache that moved elsewhere wins, and the entry goes.
 * Returns a new reference or NULL; takes `cached`. */
static json_t *known_record(usage *U, const char *rkey, json_t *cached)
{
    json_t *w = json_object_get(U->written, rkey);
    if(!w)
        return cached;
    const char *rv = cached ? kobject_meta_str(cached, "resourceVersion") : "";
    const char *wrv = kobject_meta_str(json_object_get(w, "obj"), "resourceVersion");
    if(cached && rv && wrv && strcmp(rv, wrv) == 0) {
        json_object_del(U->written, rkey); /* caught up */
        return cached;
    }
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(w, "behind"), i, b) if(rv && json_is_string(b) &&
                                                              strcmp(json_string_value(b), rv) == 0)
    {
        json_decref(cached);
        return json_incref(json_object_get(w, "obj"));
    }
    json_object_del(U->written, rkey);
    return cached;
}

/* Makes `have` (the record of the claim's record name as known, or NULL)
 * what `want` says; `have` is owned by the caller. The object under the
 * claim's record name is the claim's whatever owner reference it carries
 * (names are one-to-one, decision 0028 item 5): an owner reference to
 * another claim, live or not, is replaced in place; one to an earlier
 * claim of the same name (another uid) has the record deleted and made
 * again. */
static int write_record(usage *U, const char *ns, const json_t *want, const json_t *have)
{
    const char *rname = kobject_meta_str(want, "name");
    const char *want_uid = NULL, *have_uid = NULL;
    char rkey[600];
    if(ctl_usage_join_key(rkey, sizeof rkey, "", ns, rname) != 0)
        return CTL_USAGE_W_OK;
    const char *claim = ctl_usage_claim_owner(want, &want_uid);
    if(!claim)
        return CTL_USAGE_W_OK;
    json_t *existing = have ? json_deep_copy(have) : NULL;
    /* the versions the cache may show until our write's event arrives */
    json_t *behind = json_array();
    const char *hrv = have ? kobject_meta_str(have, "resourceVersion") : NULL;
    json_array_append_new(behind, json_string(hrv ? hrv : ""));
    int rc = CTL_USAGE_W_OK;
    for(int round = 0; round < 2 && rc == CTL_USAGE_W_OK; round++) {
        if(!existing) {
            json_t *made = NULL;
            rc = create(&KUBE_WORKLOADS, "record", ns, want, &existing, &made);
            if(rc == CTL_USAGE_W_OK && !existing) {
                log_write(LOG_INFO, "usage", "created a usage record", "namespace", ns, "workload", rname, NULL);
                remember(U, rkey, made, json_incref(behind));
                break;
            }
            if(rc != CTL_USAGE_W_OK)
                break;
            const char *erv = kobject_meta_str(existing, "resourceVersion");
            if(erv)
                json_array_append_new(behind, json_string(erv));
        }
        have_uid = NULL;
        const char *owner = ctl_usage_claim_owner(existing, &have_uid);
        if(owner && strcmp(owner, claim) == 0 && have_uid && want_uid && strcmp(have_uid, want_uid) != 0) {
            /* the record of an earlier claim of the same name */
            rc = ctl_usage_delete_uid(&KUBE_WORKLOADS, "record", ns, rname, kobject_meta_str(existing, "uid"));
            json_decref(existing);
            existing = NULL;
            if(rc == CTL_USAGE_W_OK)
                log_write(LOG_INFO, "usage", "replaced the usage record of an earlier claim of the same name",
                          "namespace", ns, "workload", rname, NULL);
            continue; /* created in the next round */
        }
        if(owner && strcmp(owner, claim) != 0)
            /* pointed at another claim (which has its own record under
             * its own name): this name is this claim's, taken back */
            log_write(LOG_WARN, "usage", "a usage record named another claim as its owner: restored to its own claim",
                      "namespace", ns, "workload", rname, "owner", owner, "claim", claim, NULL);
        if(!record_matches(existing, want)) {
            fix_record(existing, want);
            json_t *made = NULL;
            rc = put(&KUBE_WORKLOADS, "record", ns, existing, &made);
            if(rc == CTL_USAGE_W_OK)
                remember(U, rkey, made, json_incref(behind));
        }
        break;
    }
    json_decref(behind);
    json_decref(existing);
    return rc;
}

/* Claim ns/name against its record. `probe_api`: the record left the
 * selected watch, so a missing cache entry may still exist in the API. */
int ctl_usage_reconcile_claim(usage *U, const char *ns, const char *name, int probe_api)
{
    char rname[NAME_MAX_LEN + 1], rkey[600];
    if(ctl_usage_record_name(name, rname, sizeof rname) != 0 || ctl_usage_join_key(rkey, sizeof rkey, "", ns, rname) != 0)
        return CTL_USAGE_W_OK; /* no such object can exist */
    json_t *claim = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, name);
    const json_t *spec = json_object_get(claim, "spec");
    const char *phase = json_string_value(json_object_get(json_object_get(claim, "status"), "phase"));
    int want = claim && phase && (strcmp(phase, "Bound") == 0 || strcmp(phase, "Attached") == 0) &&
               json_is_string(json_object_get(spec, "class")) &&
               json_integer_value(json_object_get(spec, "count")) > 0 && kobject_meta_str(claim, "uid");
    set_wanted(U, ns, name, want);
    json_t *have = known_record(U, rkey, kube_informer_get(ctl_proc->workloads_inf, ns, rname));
    int rc = CTL_USAGE_W_OK;
    if(want) {
        rc = ctl_usage_ensure_monitor(U, ns, 0);
        if(rc == CTL_USAGE_W_OK) {
            json_t *d = desired_record(claim, rname);
            if(!have || !record_matches(have, d))
                rc = write_record(U, ns, d, have);
            json_decref(d);
        }
    } else {
        json_t *api = NULL;
        if(!have && probe_api) {
            long code = 0;
            cozy_err err;
            if(kube_get(ctl_proc->client, &KUBE_WORKLOADS, ns, rname, &code, &api, &err) != COZY_OK ||
               (code != 200 && code != 404))
                rc = CTL_USAGE_W_RETRY;
            else if(code != 200) {
                json_decref(api);
                api = NULL;
            }
        }
        const json_t *gone = have ? have : api;
        /* the object under this claim's record name is this claim's record
         * whatever claim it names as owner (the owner's record has its own
         * name); one that carries none of our marks is not ours */
        if(gone && (ctl_usage_claim_owner(gone, NULL) || label_is(gone, MANAGED_BY, MANAGER) ||
                    label_is(gone, MONITOR_LABEL, MONITOR_NAME))) {
            rc = ctl_usage_delete_uid(&KUBE_WORKLOADS, "record", ns, rname, kobject_meta_str(gone, "uid"));
            json_object_del(U->written, rkey);
            if(rc == CTL_USAGE_W_OK)
                log_write(LOG_INFO, "usage", "removed the usage record of a claim that holds no GPUs",
                          "namespace", ns, "workload", rname, NULL);
        }
        json_decref(api);
    }
    json_decref(have);
    json_decref(claim);
    return rc;
}
