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
 *
 * This file holds the thread, its queue and the watcher's callbacks,
 * whether the Workload types are served, and the rounds; the record's
 * name, the objects as they should be and their writes are in
 * usage_record.c (usage_internal.h).
 */
#include "controller/internal.h"
#include "controller/usage_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "format/kobject.h"

#define PROBE_EVERY_MS 60000
#define WARN_EVERY_MS 600000
#define NAME_MAX_LEN CTL_USAGE_NAME_MAX_LEN

/* ------------------------------------------------------------ the queue */

typedef ctl_key ukey; /* keys.c */

static ukey *g_queue; /* mu: "l:ns/name", "w:ns/name", "o:ns" */
static int g_wake;    /* mu: leadership changed */


/* The name of obj's GPUClaim owner reference (ours), or NULL. */
const char *ctl_usage_claim_owner(const json_t *obj, const char **uid)
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
int ctl_usage_join_key(char *out, size_t n, const char *prefix, const char *ns, const char *name)
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
       ctl_usage_join_key(rkey, sizeof rkey, "", ns, rname) != 0)
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
        const char *owner = ctl_usage_claim_owner(obj, NULL);
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

/* ------------------------------------------------------------ the state */

typedef ctl_usage_state usage;

int ctl_usage_leading(void)
{
    return lease_is_leader(ctl_proc->lease);
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
    else if(ctl_usage_join_key(rkey, sizeof rkey, "", ns, rname) == 0) {
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
        const char *owner = ctl_usage_claim_owner(obj, NULL);
        if(owner && ctl_usage_record_name(owner, mine, sizeof mine) == 0 && strcmp(mine, rname) == 0)
            claim = owner;
    }
    if(!claim || strlen(claim) + 1 > n)
        return -1;
    memcpy(out, claim, strlen(claim) + 1);
    return 0;
}

/* One round over the work set: claims first (they create monitors as
 * needed), then monitors. Returns CTL_USAGE_W_MISSING when a write found the types
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
        ctl_usage_join_key(rkey, sizeof rkey, "", ns, rname);
        json_object_del(U->written, rkey); /* gone from the watch: what we wrote is no guide */
        char claim[NAME_MAX_LEN + 1], ck[600];
        if(record_claim(ns, rname, NULL, claim, sizeof claim) != 0 ||
           ctl_usage_join_key(ck, sizeof ck, "l:", ns, claim) != 0) {
            keyset_drop(&U->work, k);
            continue;
        }
        json_object_set_new(probes, ck + 2, json_true());
        keyset_add(&U->work, ck);
        keyset_drop(&U->work, k);
    }
    HASH_ITER(hh, U->work, k, t)
    {
        if(!ctl_usage_leading())
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
                         ctl_usage_join_key(ck, sizeof ck, "", ns, claim) == 0;
            if(!mapped) {
                int rc = CTL_USAGE_W_OK;
                /* a cut name of no claim (ours: the cache holds only our
                 * label), kept alive by an owner reference to another
                 * claim: nobody's record */
                if(rec && strncmp(name, "gpuh-", 5) == 0) {
                    rc = ctl_usage_delete_uid(&KUBE_WORKLOADS, "record", ns, name, kobject_meta_str(rec, "uid"));
                    if(rc == CTL_USAGE_W_OK)
                        log_write(LOG_INFO, "usage", "removed a usage record named for no claim", "namespace", ns,
                                  "workload", name, NULL);
                }
                json_decref(rec);
                if(rc == CTL_USAGE_W_OK)
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
        ctl_usage_join_key(pk, sizeof pk, "", ns, name);
        int rc = ctl_usage_reconcile_claim(U, ns, name, json_object_get(probes, pk) != NULL);
        if(rc == CTL_USAGE_W_MISSING) {
            json_decref(probes);
            return CTL_USAGE_W_MISSING;
        }
        if(rc == CTL_USAGE_W_OK)
            keyset_drop(&U->work, k);
    }
    json_decref(probes);
    HASH_ITER(hh, U->work, k, t)
    {
        if(!ctl_usage_leading())
            break;
        if(k->key[0] != 'o')
            continue;
        const char *ns = k->key + 2;
        int rc = CTL_USAGE_W_OK;
        json_object_del(U->mon_ok, ns);
        if(json_integer_value(json_object_get(U->ns_count, ns)) > 0)
            rc = ctl_usage_ensure_monitor(U, ns, 1);
        if(rc == CTL_USAGE_W_MISSING)
            return CTL_USAGE_W_MISSING;
        if(rc == CTL_USAGE_W_OK)
            keyset_drop(&U->work, k);
    }
    return CTL_USAGE_W_OK;
}

/* ------------------------------------------------- the writer (writer.c) */

static int uw_build(void *ud)
{
    usage *U = ud;
    U->active = 1;
    U->full = 1; /* the caches hold all of it */
    return 0;
}

static void uw_apply(void *ud, ctl_key *batch)
{
    usage *U = ud;
    ukey *k, *t;
    HASH_ITER(hh, batch, k, t) keyset_add(&U->work, k->key);
}

/* Whether the Workload types are served (probed at most every minute
 * while not); a change to served compares everything. */
static int available(usage *U)
{
    if(U->avail == 1)
        return 1;
    if(clock_mono_ms() >= U->next_probe) {
        int was = U->avail;
        int p = probe();
        if(p >= 0)
            set_avail(U, p);
        else {
            /* no answer, or one that is not 404 (a 403: RBAC): asked again in 10 s */
            U->next_probe = clock_mono_ms() + 10000;
            if(clock_mono_ms() >= U->next_warn) {
                U->next_warn = clock_mono_ms() + WARN_EVERY_MS;
                log_write(LOG_WARN, "usage",
                          "cannot tell whether the cluster serves Cozystack's Workload types; no usage records are "
                          "written until it answers",
                          NULL);
            }
        }
        if(p == 1 && was != 1) {
            if(was == 0)
                log_write(LOG_INFO, "usage", "the Workload types are served now: writing usage records", NULL);
            U->full = 1;
        }
    }
    if(U->avail == 0)
        warn_unavailable(U);
    if(U->avail != 1) {
        keyset_free(&U->work); /* compared in full once served */
        return 0;
    }
    return 1;
}

static void uw_work(void *ud, int had_batch)
{
    (void)had_batch;
    usage *U = ud;
    if(!available(U))
        return;
    if(U->full) {
        queue_all(U);
        U->full = 0;
    }
    if(round_work(U) == CTL_USAGE_W_MISSING && probe() == 0) {
        /* confirmed: compared in full once served again */
        set_avail(U, 0);
        warn_unavailable(U);
        keyset_free(&U->work);
    }
}

static void uw_drop(void *ud)
{
    drop(ud);
}

void *ctl_usage_main(void *arg)
{
    (void)arg;
    usage U = {.avail = -1};
    U.wanted = json_object();
    U.ns_count = json_object();
    U.mon_ok = json_object();
    U.written = json_object();
    /* a second at most between wakes: retries of failed writes, probes */
    const ctl_writer w = {.component = "usage",
                          .queue = &g_queue,
                          .wake = &g_wake,
                          .ud = &U,
                          .build = uw_build,
                          .apply = uw_apply,
                          .work = uw_work,
                          .drop = uw_drop};
    ctl_writer_run(&w);
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
