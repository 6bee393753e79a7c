/* usage.c — the leader's usage records (internal.h, ctl_usage_): one
 * Cozystack Workload per held GPUClaim, and the WorkloadMonitor that keeps
 * Cozystack's reconcilers from deleting it.
 *
 * Rules: DESIGN.md §3 "Usage records" (one record per claim while Bound
 * or Attached, kind gpu-device, resources <class>.gpuclass.cozystack.io/
 * devices, owned by its claim, labelled with a monitor the controller
 * owns), §2 (writers on the leader only), docs/decisions/0028 (names,
 * idempotence, what a tenant's edits do, why Cozystack's reconcilers
 * leave the record alone: cozystack internal/controller/
 * workload_controller.go deletes a Workload without the
 * workloads.cozystack.io/monitor label or whose monitor is missing;
 * workloadmonitor_controller.go writes only pod-/pvc-/svc-/bucket-<name>
 * Workloads of the objects its selector matches).
 *
 * One thread. The watcher thread's callbacks queue keys under ctl.mu:
 * "l:ns/claim" (a claim, or a record's owner), "w:ns/record" (a record:
 * mapped here to the claim its name is made from, whatever owner
 * reference it carries), "p:ns/record" (a record gone from the watch),
 * "o:ns" (a monitor). The record named for a claim is that claim's
 * (ctl_usage_record_name is one-to-one; decision 0028 item 5): its owner
 * reference, labels and status are restored whoever someone pointed it at.
 * While this replica leads and every cache has listed, the thread takes
 * the queue and reconciles each key against the caches: the API is
 * written only when the cache differs from what the claim asks for, and
 * a key whose write failed stays queued for the next round (a second
 * later). The caches are the truth read; a create that meets an object
 * the cache has not shown yet (409) reads it and compares.
 */
#include "controller/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gnutls/crypto.h>
#include <uthash.h>

#include "base/log.h"
#include "base/metrics.h"
#include "format/kobject.h"
#include "base/clock.h"

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
#define PROBE_EVERY_MS 60000
#define WARN_EVERY_MS 600000
#define NAME_MAX_LEN 253

/* ------------------------------------------------------------ the queue */

typedef ctl_key ukey; /* keys.c */

static ukey *g_queue; /* mu: "l:ns/name", "w:ns/name", "o:ns" */
static int g_wake;    /* mu: leadership changed */


/* The name of obj's GPUClaim owner reference (ours), or NULL. */
static const char *claim_owner(const json_t *obj, const char **uid)
{
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(json_object_get(obj, "metadata"), "ownerReferences"), i, r)
    {
        const char *kind = json_string_value(json_object_get(r, "kind"));
        const char *av = json_string_value(json_object_get(r, "apiVersion"));
        if(kind && av && strcmp(kind, "GPUClaim") == 0 && strncmp(av, "cozystack.io/", 13) == 0) {
            if(uid)
                *uid = json_string_value(json_object_get(r, "uid"));
            return json_string_value(json_object_get(r, "name"));
        }
    }
    return NULL;
}

/* "<prefix>ns/name" into out (size n); -1 when it does not fit (keys are
 * at most 1 + 63 + 1 + 253 characters for real objects). */
static int join_key(char *out, size_t n, const char *prefix, const char *ns, const char *name)
{
    size_t a = strlen(prefix), b = strlen(ns), c = strlen(name);
    if(a + b + 1 + c + 1 > n)
        return -1;
    memcpy(out, prefix, a);
    memcpy(out + a, ns, b);
    out[a + b] = '/';
    memcpy(out + a + b + 1, name, c + 1);
    return 0;
}

static void queue(const char *key)
{
    ctl_key_queue(&g_queue, key);
}

/* "ns/record" -> claim name, for every cached claim whose record name is
 * cut (a claim name too long for "gpu-<claim>", decision 0028 item 5):
 * kept by the claim watch's callback, so a record's claim is found by name
 * without walking the cluster's claims (kept on every replica, led or not). */
static json_t *g_cut;
static pthread_mutex_t g_cut_mu = PTHREAD_MUTEX_INITIALIZER;

static void cut_name_event(const char *type, const char *ns, const char *claim)
{
    char rname[NAME_MAX_LEN + 1], rkey[600];
    if(ctl_usage_record_name(claim, rname, sizeof rname) != 0 || strncmp(rname, "gpu-", 4) == 0 ||
       join_key(rkey, sizeof rkey, "", ns, rname) != 0)
        return;
    pthread_mutex_lock(&g_cut_mu);
    if(!g_cut)
        g_cut = json_object();
    if(type && strcmp(type, "DELETED") == 0)
        json_object_del(g_cut, rkey);
    else
        json_object_set_new(g_cut, rkey, json_string(claim));
    pthread_mutex_unlock(&g_cut_mu);
}

void ctl_usage_on_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    (void)inf, (void)type;
    char kind = (char)(intptr_t)ctx;
    const char *ns = kobject_meta_str(obj, "namespace"), *name = kobject_meta_str(obj, "name");
    if(!ns || !name)
        return;
    char key[600];
    if(kind == 'o')
        snprintf(key, sizeof key, "o:%s", ns);
    else if(kind == 'w') {
        /* the claim the name is made from (mapped by the thread), and the
         * owner it names, if another (its own record is compared too) */
        const char *owner = claim_owner(obj, NULL);
        if(owner) {
            snprintf(key, sizeof key, "l:%s/%s", ns, owner);
            queue(key);
        }
        snprintf(key, sizeof key, "w:%s/%s", ns, name);
        if(type && strcmp(type, "DELETED") == 0) {
            /* gone from the selected watch: deleted, or relabelled by
             * someone (then it still exists, unseen): read it by name */
            char probe[600];
            snprintf(probe, sizeof probe, "p:%s/%s", ns, name);
            queue(probe);
        }
    } else {
        cut_name_event(type, ns, name);
        snprintf(key, sizeof key, "l:%s/%s", ns, name);
    }
    queue(key);
}

void ctl_usage_on_leader_change(void *ctx, int leading)
{
    (void)ctx, (void)leading;
    pthread_mutex_lock(&ctl_proc->mu);
    g_wake = 1;
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
}

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

/* ------------------------------------------------------------ the state */

typedef struct usage {
    int active;          /* built for this lead */
    int avail;           /* the Workload types are served: 1 yes, 0 no, -1 not known */
    long long next_probe; /* ms: when avail is 0, the next probe */
    long long next_warn;  /* ms: the next warning while unavailable */
    ukey *work;          /* keys to reconcile (the queue's, and retries) */
    json_t *wanted;      /* "ns/claim" -> true: claims that want a record */
    json_t *ns_count;    /* ns -> number of claims in `wanted` there */
    json_t *mon_ok;      /* ns -> true: the monitor was written or seen right in this lead */
    json_t *written;     /* "ns/record" -> {obj, behind}: remember() */
} usage;

static int leading(void)
{
    return lease_is_leader(ctl_proc->lease);
}

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
    if(join_key(key, sizeof key, "", ns, name) != 0)
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

/* ------------------------------------------------------------ availability */

/* Whether the cluster serves both types: 1, 0 (404), -1 (no answer, or
 * another status). */
static int probe(void)
{
    const kube_resource *rs[] = {&KUBE_WORKLOADS, &KUBE_WORKLOADMONITORS};
    for(size_t i = 0; i < 2; i++) {
        long code = 0;
        cozy_err err;
        if(kube_list(ctl_proc->client, rs[i], NULL, "limit=1", &code, NULL, &err) != COZY_OK)
            return -1;
        if(code == 404)
            return 0;
        if(code / 100 != 2)
            return -1;
    }
    return 1;
}

static void set_avail(usage *U, int avail)
{
    if(avail == 0 && U->avail != 0)
        U->next_warn = 0; /* warn at once */
    U->avail = avail;
    U->next_probe = clock_mono_ms() + PROBE_EVERY_MS;
    metrics_gauge_set("cozygpu_usage_records_available", NULL, avail == 1 ? 1 : 0);
}

/* The warning while the types are not served: log and an Event on the
 * Lease, at most once per WARN_EVERY_MS. */
static void warn_unavailable(usage *U)
{
    long long now = clock_mono_ms();
    if(now < U->next_warn)
        return;
    U->next_warn = now + WARN_EVERY_MS;
    static const char msg[] =
        "usage records are not written: the cluster does not serve cozystack.io/v1alpha1 workloads and "
        "workloadmonitors (Cozystack's CRDs); GPU claims are bound as usual; checked again every minute";
    log_write(LOG_WARN, "usage", msg, NULL);
    if(!ctl_proc->lease)
        return; /* --leader-elect=false: no Lease to report on */
    long code = 0;
    json_t *lease = NULL;
    cozy_err err;
    if(kube_get(ctl_proc->client, &KUBE_LEASES, ctl_proc->f.ns, ctl_proc->f.lease_name, &code, &lease, &err) ==
           COZY_OK &&
       code == 200)
        ctl_event_record(lease, "coordination.k8s.io/v1", "Lease", "Warning", "UsageRecordsUnavailable", msg);
    json_decref(lease);
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

enum { W_OK = 0, W_RETRY = -1, W_MISSING = -2 };

/* DELETE r ns/name if its uid is still `uid` (a precondition: an object
 * re-created under the name in between is left alone). */
static int delete_uid(const kube_resource *r, const char *object, const char *ns, const char *name, const char *uid)
{
    if(!leading())
        return W_RETRY;
    long code = 0;
    cozy_err err;
    json_t *out = NULL;
    char *path = kube_path(r, ns, name, NULL);
    json_t *opts = json_pack("{s:s, s:s, s:{s:s}}", "apiVersion", "v1", "kind", "DeleteOptions", "preconditions",
                             "uid", uid ? uid : "");
    int rc = W_RETRY;
    if(path && opts && kube_request(ctl_proc->client, "DELETE", path, NULL, opts, &code, &out, &err) == COZY_OK) {
        if(code / 100 == 2 || code == 404 || code == 409) {
            /* 404: gone already; 409: another object holds the name now */
            count_write(object, "delete", code / 100 == 2 ? "ok" : "conflict");
            rc = W_OK;
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
    if(!leading())
        return W_RETRY;
    long code = 0;
    json_t *out = NULL;
    cozy_err err;
    int rc = W_RETRY;
    if(kube_update(ctl_proc->client, r, ns, obj, &code, &out, &err) == COZY_OK) {
        if(code / 100 == 2) {
            count_write(object, "update", "ok");
            rc = W_OK;
            if(result) {
                *result = out;
                out = NULL;
            }
        } else if(type_missing(code, out)) {
            count_write(object, "update", "unavailable");
            rc = W_MISSING;
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
 * W_RETRY when it cannot be read. */
static int create(const kube_resource *r, const char *object, const char *ns, const json_t *want, json_t **existing,
                  json_t **result)
{
    *existing = NULL;
    if(!leading())
        return W_RETRY;
    long code = 0;
    json_t *out = NULL;
    cozy_err err;
    int rc = W_RETRY;
    if(kube_create(ctl_proc->client, r, ns, want, &code, &out, &err) != COZY_OK) {
        count_write(object, "create", "error");
        return W_RETRY;
    }
    if(code / 100 == 2) {
        count_write(object, "create", "ok");
        rc = W_OK;
        if(result) {
            *result = out;
            out = NULL;
        }
    } else if(type_missing(code, out)) {
        count_write(object, "create", "unavailable");
        rc = W_MISSING;
    } else if(code == 409) {
        count_write(object, "create", "conflict");
        json_t *got = NULL;
        long gc = 0;
        if(kube_get(ctl_proc->client, r, ns, kobject_meta_str(want, "name"), &gc, &got, &err) == COZY_OK && gc == 200) {
            *existing = got;
            got = NULL;
            rc = W_OK;
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
static int ensure_monitor(usage *U, const char *ns, int force)
{
    if(!force && json_object_get(U->mon_ok, ns))
        return W_OK;
    json_t *want = desired_monitor(ns);
    json_t *have = kube_informer_get(ctl_proc->monitors_inf, ns, MONITOR_NAME);
    int rc = W_OK;
    if(!have || !monitor_matches(have, want)) {
        json_t *existing = NULL;
        if(have) {
            existing = json_deep_copy(have);
        } else {
            rc = create(&KUBE_WORKLOADMONITORS, "monitor", ns, want, &existing, NULL);
            if(rc == W_OK && !existing)
                log_write(LOG_INFO, "usage", "created the usage monitor", "namespace", ns, "workloadmonitor",
                          MONITOR_NAME, NULL);
        }
        if(rc == W_OK && existing && !monitor_matches(existing, want)) {
            fix_monitor(existing, want);
            rc = put(&KUBE_WORKLOADMONITORS, "monitor", ns, existing, NULL);
            if(rc == W_OK)
                log_write(LOG_INFO, "usage", "restored the usage monitor's labels and spec", "namespace", ns,
                          "workloadmonitor", MONITOR_NAME, NULL);
        }
        json_decref(existing);
    }
    json_decref(have);
    json_decref(want);
    if(rc == W_OK)
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
    if(join_key(rkey, sizeof rkey, "", ns, rname) != 0)
        return W_OK;
    const char *claim = claim_owner(want, &want_uid);
    if(!claim)
        return W_OK;
    json_t *existing = have ? json_deep_copy(have) : NULL;
    /* the versions the cache may show until our write's event arrives */
    json_t *behind = json_array();
    const char *hrv = have ? kobject_meta_str(have, "resourceVersion") : NULL;
    json_array_append_new(behind, json_string(hrv ? hrv : ""));
    int rc = W_OK;
    for(int round = 0; round < 2 && rc == W_OK; round++) {
        if(!existing) {
            json_t *made = NULL;
            rc = create(&KUBE_WORKLOADS, "record", ns, want, &existing, &made);
            if(rc == W_OK && !existing) {
                log_write(LOG_INFO, "usage", "created a usage record", "namespace", ns, "workload", rname, NULL);
                remember(U, rkey, made, json_incref(behind));
                break;
            }
            if(rc != W_OK)
                break;
            const char *erv = kobject_meta_str(existing, "resourceVersion");
            if(erv)
                json_array_append_new(behind, json_string(erv));
        }
        have_uid = NULL;
        const char *owner = claim_owner(existing, &have_uid);
        if(owner && strcmp(owner, claim) == 0 && have_uid && want_uid && strcmp(have_uid, want_uid) != 0) {
            /* the record of an earlier claim of the same name */
            rc = delete_uid(&KUBE_WORKLOADS, "record", ns, rname, kobject_meta_str(existing, "uid"));
            json_decref(existing);
            existing = NULL;
            if(rc == W_OK)
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
            if(rc == W_OK)
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
static int reconcile_claim(usage *U, const char *ns, const char *name, int probe_api)
{
    char rname[NAME_MAX_LEN + 1], rkey[600];
    if(ctl_usage_record_name(name, rname, sizeof rname) != 0 || join_key(rkey, sizeof rkey, "", ns, rname) != 0)
        return W_OK; /* no such object can exist */
    json_t *claim = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, name);
    const json_t *spec = json_object_get(claim, "spec");
    const char *phase = json_string_value(json_object_get(json_object_get(claim, "status"), "phase"));
    int want = claim && phase && (strcmp(phase, "Bound") == 0 || strcmp(phase, "Attached") == 0) &&
               json_is_string(json_object_get(spec, "class")) &&
               json_integer_value(json_object_get(spec, "count")) > 0 && kobject_meta_str(claim, "uid");
    set_wanted(U, ns, name, want);
    json_t *have = known_record(U, rkey, kube_informer_get(ctl_proc->workloads_inf, ns, rname));
    int rc = W_OK;
    if(want) {
        rc = ensure_monitor(U, ns, 0);
        if(rc == W_OK) {
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
                rc = W_RETRY;
            else if(code != 200) {
                json_decref(api);
                api = NULL;
            }
        }
        const json_t *gone = have ? have : api;
        /* the object under this claim's record name is this claim's record
         * whatever claim it names as owner (the owner's record has its own
         * name); one that carries none of our marks is not ours */
        if(gone && (claim_owner(gone, NULL) || label_is(gone, MANAGED_BY, MANAGER) ||
                    label_is(gone, MONITOR_LABEL, MONITOR_NAME))) {
            rc = delete_uid(&KUBE_WORKLOADS, "record", ns, rname, kobject_meta_str(gone, "uid"));
            json_object_del(U->written, rkey);
            if(rc == W_OK)
                log_write(LOG_INFO, "usage", "removed the usage record of a claim that holds no GPUs",
                          "namespace", ns, "workload", rname, NULL);
        }
        json_decref(api);
    }
    json_decref(have);
    json_decref(claim);
    return rc;
}

/* ------------------------------------------------------------ the loop */

/* Every cached claim and record into the work set (taking the lead, or
 * the types becoming served). */
static void queue_all(usage *U)
{
    char key[600];
    json_t *all = kube_informer_list(ctl_cluster_informer(&KUBE_GPUCLAIMS));
    size_t i;
    json_t *o;
    json_array_foreach(all, i, o)
    {
        snprintf(key, sizeof key, "l:%s/%s", kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
        keyset_add(&U->work, key);
    }
    json_decref(all);
    all = kube_informer_list(ctl_proc->workloads_inf);
    json_array_foreach(all, i, o)
    {
        /* mapped by name in the round (the owner is a claim listed above) */
        snprintf(key, sizeof key, "w:%s/%s", kobject_meta_str(o, "namespace"), kobject_meta_str(o, "name"));
        keyset_add(&U->work, key);
    }
    json_decref(all);
    all = kube_informer_list(ctl_proc->monitors_inf);
    json_array_foreach(all, i, o)
    {
        snprintf(key, sizeof key, "o:%s", kobject_meta_str(o, "namespace"));
        keyset_add(&U->work, key);
    }
    json_decref(all);
}

static void drop(usage *U)
{
    keyset_free(&U->work);
    json_object_clear(U->wanted);
    json_object_clear(U->ns_count);
    json_object_clear(U->mon_ok);
    json_object_clear(U->written);
    U->active = 0;
    U->avail = -1;
    U->next_probe = 0;
}

/* The claim whose record name (ctl_usage_record_name, one-to-one) is
 * `rname` in `ns`, into out (size n): "gpu-<claim>"; for a cut name
 * ("gpuh-..."), the cached claim of the namespace it is made from (g_cut,
 * O(1)), else the owner `obj` (the record, or NULL) names when its record
 * name is `rname`. Returns 0, or -1 when no claim, existing or not, can be
 * named. */
static int record_claim(const char *ns, const char *rname, const json_t *obj, char *out, size_t n)
{
    char rkey[600], mine[NAME_MAX_LEN + 1];
    const char *claim = NULL;
    int rc = -1;
    if(strncmp(rname, "gpu-", 4) == 0)
        claim = rname + 4;
    else if(join_key(rkey, sizeof rkey, "", ns, rname) == 0) {
        pthread_mutex_lock(&g_cut_mu);
        const char *c = json_string_value(json_object_get(g_cut, rkey));
        if(c && strlen(c) + 1 <= n) {
            memcpy(out, c, strlen(c) + 1);
            rc = 0;
        }
        pthread_mutex_unlock(&g_cut_mu);
        if(rc == 0)
            return 0;
    }
    if(!claim && obj) {
        const char *owner = claim_owner(obj, NULL);
        if(owner && ctl_usage_record_name(owner, mine, sizeof mine) == 0 && strcmp(mine, rname) == 0)
            claim = owner;
    }
    if(!claim || strlen(claim) + 1 > n)
        return -1;
    memcpy(out, claim, strlen(claim) + 1);
    return 0;
}

/* One round over the work set: claims first (they create monitors as
 * needed), then monitors. Returns W_MISSING when a write found the types
 * unserved. */
static int round_work(usage *U)
{
    ukey *k, *t;
    /* probes name records that left the watch: their claims get an API read */
    json_t *probes = json_object();
    HASH_ITER(hh, U->work, k, t)
    {
        if(k->key[0] != 'p')
            continue;
        char buf[600];
        const char *ns, *rname;
        keyset_split(k->key + 2, buf, sizeof buf, &ns, &rname);
        char rkey[600];
        join_key(rkey, sizeof rkey, "", ns, rname);
        json_object_del(U->written, rkey); /* gone from the watch: what we wrote is no guide */
        char claim[NAME_MAX_LEN + 1], ck[600];
        if(record_claim(ns, rname, NULL, claim, sizeof claim) != 0 ||
           join_key(ck, sizeof ck, "l:", ns, claim) != 0) {
            keyset_drop(&U->work, k);
            continue;
        }
        json_object_set_new(probes, ck + 2, json_true());
        keyset_add(&U->work, ck);
        keyset_drop(&U->work, k);
    }
    HASH_ITER(hh, U->work, k, t)
    {
        if(!leading())
            break;
        char buf[600];
        const char *ns, *name;
        if(k->key[0] == 'w') {
            /* a record: the claim its name is made from, whatever owner
             * reference it carries */
            keyset_split(k->key + 2, buf, sizeof buf, &ns, &name);
            char claim[NAME_MAX_LEN + 1], ck[600];
            json_t *rec = kube_informer_get(ctl_proc->workloads_inf, ns, name);
            int mapped = record_claim(ns, name, rec, claim, sizeof claim) == 0 &&
                         join_key(ck, sizeof ck, "", ns, claim) == 0;
            if(!mapped) {
                int rc = W_OK;
                /* a cut name of no claim (ours: the cache holds only our
                 * label), kept alive by an owner reference to another
                 * claim: nobody's record */
                if(rec && strncmp(name, "gpuh-", 5) == 0) {
                    rc = delete_uid(&KUBE_WORKLOADS, "record", ns, name, kobject_meta_str(rec, "uid"));
                    if(rc == W_OK)
                        log_write(LOG_INFO, "usage", "removed a usage record named for no claim", "namespace", ns,
                                  "workload", name, NULL);
                }
                json_decref(rec);
                if(rc == W_OK)
                    keyset_drop(&U->work, k);
                continue;
            }
            json_decref(rec);
            keyset_split(ck, buf, sizeof buf, &ns, &name);
        } else if(k->key[0] == 'l')
            keyset_split(k->key + 2, buf, sizeof buf, &ns, &name);
        else
            continue;
        char pk[600];
        join_key(pk, sizeof pk, "", ns, name);
        int rc = reconcile_claim(U, ns, name, json_object_get(probes, pk) != NULL);
        if(rc == W_MISSING) {
            json_decref(probes);
            return W_MISSING;
        }
        if(rc == W_OK)
            keyset_drop(&U->work, k);
    }
    json_decref(probes);
    HASH_ITER(hh, U->work, k, t)
    {
        if(!leading())
            break;
        if(k->key[0] != 'o')
            continue;
        const char *ns = k->key + 2;
        int rc = W_OK;
        json_object_del(U->mon_ok, ns);
        if(json_integer_value(json_object_get(U->ns_count, ns)) > 0)
            rc = ensure_monitor(U, ns, 1);
        if(rc == W_MISSING)
            return W_MISSING;
        if(rc == W_OK)
            keyset_drop(&U->work, k);
    }
    return W_OK;
}

void *ctl_usage_main(void *arg)
{
    (void)arg;
    usage U = {.avail = -1};
    U.wanted = json_object();
    U.ns_count = json_object();
    U.mon_ok = json_object();
    U.written = json_object();
    for(;;) {
        int stop; /* a second at most: retries of failed writes, probes */
        ukey *batch = ctl_key_wait(&g_queue, &g_wake, 1000, &stop);
        if(stop)
            break;
        if(!leading() || !kube_watcher_synced(ctl_proc->watcher)) {
            keyset_free(&batch);
            if(U.active)
                drop(&U);
            continue;
        }
        int full = 0;
        if(!U.active) {
            U.active = 1;
            keyset_free(&batch); /* the caches hold all of it */
            full = 1;
        }
        if(U.avail != 1) {
            if(clock_mono_ms() >= U.next_probe) {
                int was = U.avail;
                int p = probe();
                if(p >= 0)
                    set_avail(&U, p);
                else {
                    /* no answer, or one that is not 404 (a 403: RBAC): asked again in 10 s */
                    U.next_probe = clock_mono_ms() + 10000;
                    if(clock_mono_ms() >= U.next_warn) {
                        U.next_warn = clock_mono_ms() + WARN_EVERY_MS;
                        log_write(LOG_WARN, "usage",
                                  "cannot tell whether the cluster serves Cozystack's Workload types; no usage "
                                  "records are written until it answers",
                                  NULL);
                    }
                }
                if(p == 1 && was != 1) {
                    if(was == 0)
                        log_write(LOG_INFO, "usage", "the Workload types are served now: writing usage records",
                                  NULL);
                    full = 1;
                }
            }
            if(U.avail == 0)
                warn_unavailable(&U);
            if(U.avail != 1) {
                keyset_free(&batch); /* compared in full once served */
                continue;
            }
        }
        if(full)
            queue_all(&U);
        ukey *k, *t;
        HASH_ITER(hh, batch, k, t) keyset_add(&U.work, k->key);
        keyset_free(&batch);
        if(round_work(&U) == W_MISSING && probe() == 0) {
            /* confirmed: compared in full once served again */
            set_avail(&U, 0);
            warn_unavailable(&U);
            keyset_free(&U.work);
        }
    }
    drop(&U);
    json_decref(U.wanted);
    json_decref(U.ns_count);
    json_decref(U.mon_ok);
    json_decref(U.written);
    pthread_mutex_lock(&ctl_proc->mu);
    keyset_free(&g_queue);
    pthread_mutex_unlock(&ctl_proc->mu);
    return NULL;
}
