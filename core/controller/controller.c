/* controller.c — `cozygpu controller` (controller.h): start-up, the
 * watches and the Lease wired to the other files of this folder, signals,
 * the cache dump, and shutdown in order.
 *
 * Files (their shared state and entry points: internal.h):
 *   flags.c     the command line and its checks
 *   cluster.c   the watch caches as the policies' cluster view
 *   bundle.c    policies ConfigMap -> compiled bundle; the reloader thread
 *   review.c    webhook threads' engines, the review callback, readiness
 *   status.c    the leader-only GPUClass status writer
 *   bind.c      the leader's binder loop (claim status, VMI deletes, pins)
 *   usage.c     the leader's usage records (Workloads) and their monitors:
 *               the thread; usage_record.c the objects and their writes
 *   event.c     Events on the controller's own objects
 *   license.c   the leader's license token copies (DESIGN.md §8): the
 *               state; license_copy.c, license_status.c, license_loop.c
 *
 * Threads:
 *   main        flags, start-up, then waits for SIGTERM/SIGINT and shuts
 *               down in order: not ready, stop accepting, finish the
 *               reviews in flight, stop the writers, release the Lease.
 *   watcher     one curl-multi loop for every watch (watch.h); its event
 *               callbacks only record work and signal the threads below.
 *   webhook     libmicrohttpd's thread pool; each pool thread owns one Lua
 *               engine (thread-local) and rebuilds it between reviews when
 *               the policy bundle changed, and refreshes its cluster view
 *               when the watch caches changed. No Lua state is shared.
 *   reloader    compiles a new policies ConfigMap aside, self-checks it,
 *               and publishes it (or keeps the old one and reports).
 *   elector     leader election (lease.h).
 *   writer      leader-only: GPUClass status conditions.
 *   binder      leader-only: the binder's state from the watches, claim
 *               status, launcher pod pins.
 *   usage       leader-only: one Workload per held claim (DESIGN.md §3).
 *   licenser    leader-only: license token Secret copies, the classes'
 *               LicenseReady condition.
 */
#include "controller/controller.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/metrics.h"
#include "controller/internal.h"
#include "format/config.h"
#include "base/clock.h"

#ifndef COZYGPU_VERSION /* the Makefile passes it from the VERSION file */
#define COZYGPU_VERSION "unknown"
#endif

ctl *ctl_proc; /* set by controller_main before any thread starts */

static void write_port_file(const char *path, int port)
{
    char tmp[PATH_MAX];
    if(snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return;
    FILE *fp = fopen(tmp, "w");
    if(!fp)
        return;
    fprintf(fp, "%d\n", port);
    if(fclose(fp) == 0)
        rename(tmp, path);
}

/* SIGUSR1: writes what the watch caches hold, one JSON object per cached
 * object ({resource, namespace, name, resourceVersion, uid}), to
 * <state-dir>/cache.json (replaced atomically), for operators comparing a
 * replica's view with the API server, and for the specs. */
static void dump_caches(void)
{
    kube_informer *all[24];
    int n = 0;
    for(int i = 0; i < ctl_proc->n_cluster_inf; i++)
        all[n++] = ctl_proc->cluster_inf[i];
    if(ctl_proc->policies_inf)
        all[n++] = ctl_proc->policies_inf;
    all[n++] = ctl_proc->gpunodes_inf;
    all[n++] = ctl_proc->vms_inf;
    all[n++] = ctl_proc->pods_inf;
    all[n++] = ctl_proc->pvcs_inf;
    all[n++] = ctl_proc->pvs_inf;
    all[n++] = ctl_proc->workloads_inf;
    all[n++] = ctl_proc->monitors_inf;
    all[n++] = ctl_proc->license_src_inf;
    json_t *out = json_array();
    for(int i = 0; i < n; i++) {
        const kube_resource *r = kube_informer_resource(all[i]);
        json_t *items = kube_informer_list(all[i]);
        size_t j;
        json_t *o;
        json_array_foreach(items, j, o)
        {
            const json_t *md = json_object_get(o, "metadata");
            json_array_append_new(out, json_pack("{s:s, s:s?, s:s?, s:s?, s:s?}", "resource", r->resource,
                                                 "namespace", json_string_value(json_object_get(md, "namespace")),
                                                 "name", json_string_value(json_object_get(md, "name")),
                                                 "resourceVersion",
                                                 json_string_value(json_object_get(md, "resourceVersion")), "uid",
                                                 json_string_value(json_object_get(md, "uid"))));
        }
        json_decref(items);
    }
    char path[PATH_MAX], tmp[PATH_MAX];
    if(snprintf(path, sizeof path, "%s/cache.json", ctl_proc->f.state_dir) >= (int)sizeof path ||
       snprintf(tmp, sizeof tmp, "%s/cache.json.tmp", ctl_proc->f.state_dir) >= (int)sizeof tmp) {
        json_decref(out);
        return;
    }
    if(json_dump_file(out, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) == 0 && rename(tmp, path) == 0)
        log_write(LOG_INFO, "controller", "wrote the watch caches", "path", path, NULL);
    else
        log_write(LOG_WARN, "controller", "cannot write the watch caches", "path", path, NULL);
    json_decref(out);
}

/* The cluster informers' events of the kinds both leader loops follow
 * (classes, claims, VMIs, namespaces): the binder's, then the license
 * copier's. ctx is the kind letter (bind.c, license.c). */
static void on_cluster_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    ctl_bind_on_event(ctx, inf, type, obj);
    ctl_license_on_event(ctx, inf, type, obj);
}

static void on_leader_change(void *ctx, int leading)
{
    ctl_bind_on_leader_change(ctx, leading);
    ctl_license_on_leader_change(ctx, leading);
}

int controller_main(int argc, char **argv)
{
    static ctl state;
    ctl_proc = &state;
    int rp = ctl_flags_parse(argc, argv, &ctl_proc->f);
    if(rp != 0)
        return rp > 0 ? 0 : 2;
    ctl_flags *f = &ctl_proc->f;
    log_setup(f->log_json, f->level);
    int status = 2;
    cozy_err err;
    pthread_mutex_init(&ctl_proc->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ctl_proc->cv, &ca);
    pthread_condattr_destroy(&ca);

    /* signals: blocked in every thread; the main thread waits for them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    metrics_declare("cozygpu_admission_reviews_total", "counter", "Admission reviews answered, by webhook and decision.");
    metrics_declare("cozygpu_admission_review_duration_seconds", "histogram", "Time to answer one admission review.");
    metrics_declare("cozygpu_policy_errors_total", "counter", "Reviews refused because a policy failed (error, budget, memory, deadline).");
    metrics_declare("cozygpu_policy_rule_errors_total", "counter",
                    "Policy failures by rule and kind (error, budget, memory, deadline); the first failing rule of a review.");
    metrics_declare("cozygpu_policy_rule_decisions_total", "counter",
                    "What each rule that ran said, per review: allowed (refused nothing), denied, patched, or the "
                    "kind of its failure (error, budget, memory, deadline).");
    static const double rule_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                          0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5, 8};
    metrics_declare_histogram("cozygpu_policy_rule_duration_seconds",
                              "Wall time of one rule's calls (match function and hooks) in one review.", rule_buckets,
                              sizeof rule_buckets / sizeof *rule_buckets);
    metrics_declare("cozygpu_policy_reloads_total", "counter", "Policy bundle reloads from the ConfigMap, by result.");
    metrics_declare("cozygpu_policy_bundle_generation", "gauge", "Generation of the policy bundle being served.");
    metrics_declare("cozygpu_policy_reload_failing", "gauge",
                    "1 from a failed policy reload until one succeeds: the ConfigMap's current version is not "
                    "served (the previous bundle, or none, is).");
    metrics_declare("cozygpu_watch_restarts_total", "counter", "Watch restarts, by resource and reason.");
    metrics_declare("cozygpu_watch_cache_objects", "gauge", "Objects each watch cache holds, by resource.");
    metrics_declare("cozygpu_leader", "gauge", "1 while this replica holds the leader Lease.");
    metrics_declare("cozygpu_writer_wakes_total", "counter",
                    "Wakes of each leader-only writer loop (binder, license, status, usage), by whether this replica "
                    "led then; counted before the wake's work, so a wake that writes nothing shows too.");
    metrics_declare("cozygpu_binder_passes_total", "counter",
                    "Binder passes on the leader, by kind (full: on taking the lead; incremental: per batch of changes).");
    metrics_declare("cozygpu_binder_applied_resource_version", "gauge",
                    "On the leader, by resource: the resourceVersion of the last watch event the binder has taken "
                    "into its state, reconciled and written for (decision 0040).");
    metrics_declare("cozygpu_binder_transitions_total", "counter", "Claim status transitions the binder decided.");
    metrics_declare("cozygpu_binder_status_writes_total", "counter",
                    "GPUClaim status writes by result (ok, conflict: the cache was behind, error).");
    metrics_declare("cozygpu_binder_policy_failures_total", "counter",
                    "Binder policy (binder.lua) failures by kind; the set was placed in packing order (decision 0024).");
    metrics_declare("cozygpu_binder_pod_pins_total", "counter",
                    "Gated virt-launcher pods pinned to their claims' node and ungated.");
    metrics_declare("cozygpu_binder_placements_total", "counter", "Pending claims the leader bound to a node, by class.");
    metrics_declare("cozygpu_binder_moves_total", "counter", "Bound claims the leader moved to another node, by class.");
    metrics_declare("cozygpu_binder_rebinds_total", "counter",
                    "Lost claims the leader bound again (another node, or the same one back), by class.");
    metrics_declare("cozygpu_binder_refusals_total", "counter",
                    "Claims left waiting (Pending or Lost) with a new reason, by class and reason.");
    static const double bind_buckets[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600};
    metrics_declare_histogram("cozygpu_binder_bind_latency_seconds",
                              "Time from a claim's creationTimestamp (whole seconds) to its first Bound, by class.",
                              bind_buckets, sizeof bind_buckets / sizeof *bind_buckets);
    metrics_declare("cozygpu_class_capacity_devices", "gauge",
                    "Units of the class all nodes offer (leader only), by class.");
    metrics_declare("cozygpu_class_free_devices", "gauge",
                    "Units of the class free on nodes a new order could go to now (leader only), by class.");
    metrics_declare("cozygpu_class_claimed_devices", "gauge",
                    "Units of the class the claims ask for, by class and claim phase (leader only).");
    metrics_declare("cozygpu_class_status_writes_total", "counter",
                    "GPUClass status.free and maxFreePerNode writes, by result.");
    metrics_declare("cozygpu_usage_records_available", "gauge",
                    "1 while the leader can write usage records (the cluster serves Cozystack's Workload and "
                    "WorkloadMonitor types); 0 when it does not, or before the leader has looked.");
    metrics_declare("cozygpu_usage_record_writes_total", "counter",
                    "Usage record (Workload) and monitor (WorkloadMonitor) writes by object, op (create, update, "
                    "delete) and result (ok, conflict, error, unavailable: the type is not served).");
    metrics_gauge_set("cozygpu_usage_records_available", NULL, 0);
    metrics_declare("cozygpu_license_copy_writes_total", "counter",
                    "License token Secret copies written by the leader, by op (create, update, delete) and result "
                    "(ok, retry, error).");
    metrics_counter_add("cozygpu_policy_reloads_total", "result=\"success\"", 0);
    metrics_counter_add("cozygpu_policy_reloads_total", "result=\"failure\"", 0);
    metrics_counter_add("cozygpu_policy_errors_total", NULL, 0);
    metrics_gauge_set("cozygpu_leader", NULL, 0);
    metrics_gauge_set("cozygpu_policy_reload_failing", NULL, 0);

    /* settings */
    if(f->config_file) {
        if(config_load_file(f->config_file, &ctl_proc->settings, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu controller: --config: %s\n", err.msg);
            goto out;
        }
    } else
        ctl_proc->settings = config_defaults();
    json_t *budget = json_object_get(ctl_proc->settings, "policyBudget");
    ctl_proc->eo = (engine_options){
        .library_dir = f->library_dir,
        .bundle_dir = f->policies_dir,
        .instructions = json_integer_value(json_object_get(budget, "instructions")),
        .memory_bytes = json_integer_value(json_object_get(budget, "memoryBytes")),
    };
    {
        /* the default bundle must load before anything else starts */
        engine *probe = NULL;
        if(engine_open(&probe, &ctl_proc->eo, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu controller: default policies: %s\n", err.msg);
            goto out;
        }
        engine_close(probe);
    }

    /* API client */
    char ua[512];
    snprintf(ua, sizeof ua, "cozygpu/" COZYGPU_VERSION " (%s)", f->identity);
    kube_client_options ko = {.kubeconfig = f->kubeconfig, .context = f->context, .server = f->server,
                              .user_agent = ua, .timeout_ms = 10000, .max_retries = 4};
    if(kube_client_new(&ctl_proc->client, &ko, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu controller: %s\n", err.msg);
        goto out;
    }

    /* watches */
    ctl_proc->watcher = kube_watcher_new(ctl_proc->client, f->resync_ms / 1000);
    /* what the policies read (docs/decisions/0008); VMIs for the raw-name
     * usage that raw budget keys count (DESIGN.md §5) */
    static const kube_resource *const cluster_kinds[] = {&KUBE_NAMESPACES, &KUBE_NODES,      &KUBE_RESOURCEQUOTAS,
                                                          &KUBE_KUBEVIRTS,  &KUBE_GPUCLASSES, &KUBE_GPUCLAIMS,
                                                          &KUBE_VMIS, &KUBE_RESOURCECLAIMS, &KUBE_RESOURCECLAIMTEMPLATES,
                                                          &KUBE_DEVICECLASSES};
    for(size_t i = 0; i < sizeof cluster_kinds / sizeof *cluster_kinds; i++) {
        /* the binder's kinds wake it (bind.c: the kind letter as ctx) */
        const kube_resource *r = cluster_kinds[i];
        int kind = r == &KUBE_GPUCLASSES ? 'c' : r == &KUBE_NODES ? 'n' : r == &KUBE_GPUCLAIMS ? 'l'
                 : r == &KUBE_VMIS ? 'i' : r == &KUBE_KUBEVIRTS ? 'k' : r == &KUBE_NAMESPACES ? 's'
                 : r == &KUBE_RESOURCEQUOTAS ? 'q' : 0;
        kube_event_fn fn = kind == 'c' || kind == 'l' || kind == 'i' || kind == 's' ? on_cluster_event
                         : kind ? ctl_bind_on_event : NULL;
        ctl_proc->cluster_inf[ctl_proc->n_cluster_inf++] =
            kube_watcher_add(ctl_proc->watcher, r, NULL, NULL, NULL, fn, (void *)(intptr_t)kind);
        if(cluster_kinds[i] == &KUBE_GPUCLASSES)
            ctl_proc->classes_inf = ctl_proc->cluster_inf[ctl_proc->n_cluster_inf - 1];
        /* DRA objects, for the raw-name policy's resource claims and DRA
         * extended resources (DeviceClass spec.extendedResourceName): read
         * at the newest version served (resource.k8s.io/v1, else v1beta2,
         * else v1beta1: watch.h VERSIONS); a cluster without DRA serves
         * none */
        if(cluster_kinds[i] == &KUBE_RESOURCECLAIMS || cluster_kinds[i] == &KUBE_RESOURCECLAIMTEMPLATES ||
           cluster_kinds[i] == &KUBE_DEVICECLASSES)
            kube_informer_set_optional(ctl_proc->cluster_inf[ctl_proc->n_cluster_inf - 1]);
    }
    ctl_proc->gpunodes_inf =
        kube_watcher_add(ctl_proc->watcher, &KUBE_GPUNODES, NULL, NULL, NULL, ctl_bind_on_event, (void *)(intptr_t)'g');
    ctl_proc->vms_inf =
        kube_watcher_add(ctl_proc->watcher, &KUBE_VMS, NULL, NULL, NULL, ctl_bind_on_event, (void *)(intptr_t)'m');
    ctl_proc->pods_inf = kube_watcher_add(ctl_proc->watcher, &KUBE_PODS, NULL, "kubevirt.io=virt-launcher", NULL,
                                          ctl_bind_on_event, (void *)(intptr_t)'p');
    ctl_proc->pvcs_inf =
        kube_watcher_add(ctl_proc->watcher, &KUBE_PVCS, NULL, NULL, NULL, ctl_bind_on_event, (void *)(intptr_t)'v');
    ctl_proc->pvs_inf =
        kube_watcher_add(ctl_proc->watcher, &KUBE_PVS, NULL, NULL, NULL, ctl_bind_on_event, (void *)(intptr_t)'w');
    /* what no rule reads and a tenant can make large stays out of the
     * caches (ctl_cluster_strip); not on the Secrets, ConfigMaps and usage
     * records below, which are written back whole */
    for(int i = 0; i < ctl_proc->n_cluster_inf; i++)
        kube_informer_set_transform(ctl_proc->cluster_inf[i], ctl_cluster_strip);
    kube_informer_set_transform(ctl_proc->gpunodes_inf, ctl_cluster_strip);
    kube_informer_set_transform(ctl_proc->vms_inf, ctl_cluster_strip);
    kube_informer_set_transform(ctl_proc->pods_inf, ctl_cluster_strip);
    kube_informer_set_transform(ctl_proc->pvcs_inf, ctl_cluster_strip);
    kube_informer_set_transform(ctl_proc->pvs_inf, ctl_cluster_strip);
    /* usage records (DESIGN.md §3): only the objects this controller
     * manages; a cluster without Cozystack's CRDs does not serve them */
    ctl_proc->workloads_inf = kube_watcher_add(ctl_proc->watcher, &KUBE_WORKLOADS, NULL,
                                               "app.kubernetes.io/managed-by=cozygpu", NULL, ctl_usage_on_event,
                                               (void *)(intptr_t)'w');
    ctl_proc->monitors_inf = kube_watcher_add(ctl_proc->watcher, &KUBE_WORKLOADMONITORS, NULL,
                                              "app.kubernetes.io/managed-by=cozygpu", NULL, ctl_usage_on_event,
                                              (void *)(intptr_t)'o');
    kube_informer_set_optional(ctl_proc->workloads_inf);
    kube_informer_set_optional(ctl_proc->monitors_inf);
    /* the Secrets of the controller's own namespace, where the hoster
     * keeps the license token sources: the only Secrets it reads; the
     * copies in tenant namespaces are written by name, never read
     * (docs/decisions/0029, 0035) */
    ctl_proc->license_src_inf =
        kube_watcher_add(ctl_proc->watcher, &KUBE_SECRETS, f->ns, NULL, NULL, ctl_license_on_event, (void *)(intptr_t)'y');
    if(f->policies_configmap && *f->policies_configmap) {
        char sel[300];
        snprintf(sel, sizeof sel, "metadata.name=%s", f->policies_configmap);
        ctl_proc->policies_inf =
            kube_watcher_add(ctl_proc->watcher, &KUBE_CONFIGMAPS, f->ns, NULL, sel, ctl_bundle_on_policies_event, NULL);
    }
    /* from here on every exit goes through shutdown, which stops what has
     * started (the watch thread uses the client freed at out) */
    if(kube_watcher_start(ctl_proc->watcher, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu controller: %s\n", err.msg);
        goto shutdown;
    }
    if(pthread_create(&ctl_proc->reloader, NULL, ctl_bundle_reloader_main, NULL) != 0) {
        ctl_proc->reloader = 0;
        fprintf(stderr, "cozygpu controller: cannot start the reload thread\n");
        goto shutdown;
    }

    /* webhook server */
    webhook_options wo = {
        .address = f->address,
        .port = f->port,
        .cert_file = f->cert_file,
        .key_file = f->key_file,
        .endpoints = ctl_review_endpoints,
        .n_endpoints = ctl_review_n_endpoints,
        .workers = (unsigned)f->workers,
        .io_threads = (unsigned)f->io_threads,
        .max_body_bytes = (size_t)f->max_body,
        .review_timeout_ms = f->review_timeout_ms,
        .max_connections = (unsigned)f->max_connections,
        .max_connections_per_address = (unsigned)f->max_connections_per_address,
        .request_timeout_ms = f->request_timeout_ms,
        .max_body_bytes_in_flight = (size_t)f->max_body_in_flight,
        .probe_port = f->probe_port < 0 ? 0 : f->probe_port == 0 ? WEBHOOK_PROBE_ANY_PORT : f->probe_port,
        .inline_max_body = CTL_INLINE_MAX_BODY,
        .review = ctl_review_on_review,
        .parse = ctl_review_on_parse,
        .ctx = ctl_proc,
        .ready = ctl_review_on_ready,
    };
    if(webhook_start(&ctl_proc->server, &wo, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu controller: %s\n", err.msg);
        goto shutdown;
    }
    char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", webhook_port(ctl_proc->server));
    if(f->port_file)
        write_port_file(f->port_file, webhook_port(ctl_proc->server));
    if(f->probe_port_file && webhook_probe_port(ctl_proc->server))
        write_port_file(f->probe_port_file, webhook_probe_port(ctl_proc->server));
    char workers[16], io[16];
    snprintf(workers, sizeof workers, "%d", f->workers);
    snprintf(io, sizeof io, "%d", f->io_threads);
    log_write(LOG_INFO, "controller", "serving admission webhooks", LOG_NUM "port", portbuf, "identity", f->identity,
              "server", kube_client_server(ctl_proc->client), LOG_NUM "workers", workers, LOG_NUM "io_threads", io,
              NULL);

    if(f->leader_elect) {
        lease_options lo = {.namespace_ = f->ns, .name = f->lease_name, .identity = f->identity,
                            .lease_duration_ms = f->lease_ms, .renew_deadline_ms = f->renew_ms,
                            .retry_period_ms = f->retry_ms, .on_change = on_leader_change};
        if(lease_start(&ctl_proc->lease, ctl_proc->client, &lo, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu controller: %s\n", err.msg);
            goto shutdown;
        }
    }
    if(pthread_create(&ctl_proc->writer, NULL, ctl_status_writer_main, NULL) != 0) {
        ctl_proc->writer = 0;
        fprintf(stderr, "cozygpu controller: cannot start the status writer\n");
        goto shutdown;
    }

    if(pthread_create(&ctl_proc->binder, NULL, ctl_bind_main, NULL) != 0) {
        ctl_proc->binder = 0;
        fprintf(stderr, "cozygpu controller: cannot start the binder\n");
        goto shutdown;
    }

    if(pthread_create(&ctl_proc->usage, NULL, ctl_usage_main, NULL) != 0) {
        ctl_proc->usage = 0;
        fprintf(stderr, "cozygpu controller: cannot start the usage-record thread\n");
        goto shutdown;
    }

    if(pthread_create(&ctl_proc->licenser, NULL, ctl_license_main, NULL) != 0) {
        ctl_proc->licenser = 0;
        fprintf(stderr, "cozygpu controller: cannot start the license copier\n");
        goto shutdown;
    }

    /* run until SIGTERM / SIGINT; SIGUSR1 dumps the caches */
    int sig = 0;
    while(sigwait(&sigs, &sig) == 0 && sig == SIGUSR1)
        dump_caches();
    log_write(LOG_INFO, "controller", "shutting down", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
    status = 0;

shutdown:
    pthread_mutex_lock(&ctl_proc->mu);
    ctl_proc->stopping = 1; /* /readyz answers 503 from now on */
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
    /* The Lease goes at once (a hardening fix), before the reviews in flight are
     * drained: another replica leads now, while this one still answers.
     * The writer first (it sees `stopping` and ends; its policy calls are
     * budgeted), so nothing writes once the Lease is released. */
    if(ctl_proc->writer)
        pthread_join(ctl_proc->writer, NULL);
    if(ctl_proc->binder)
        pthread_join(ctl_proc->binder, NULL);
    if(ctl_proc->usage)
        pthread_join(ctl_proc->usage, NULL);
    if(ctl_proc->licenser)
        pthread_join(ctl_proc->licenser, NULL);
    lease_stop(ctl_proc->lease, 1);
    ctl_proc->lease = NULL;
    if(ctl_proc->server) {
        webhook_quiesce(ctl_proc->server);
        long long t0 = clock_mono_ms();
        while(webhook_in_flight(ctl_proc->server) > 0 && clock_mono_ms() - t0 < f->shutdown_grace_ms)
            usleep(10000);
        if(webhook_in_flight(ctl_proc->server) > 0) {
            /* a review still running holds its worker, and stopping the
             * server would wait for it: exit now, as the grace promises
             * (the API server's failurePolicy answers for it) */
            char n[16];
            snprintf(n, sizeof n, "%d", webhook_in_flight(ctl_proc->server));
            log_write(LOG_WARN, "controller", "shutdown grace passed with reviews in flight; exiting without them",
                      LOG_NUM "in_flight", n, NULL);
            fflush(NULL);
            _exit(1);
        }
        webhook_stop(ctl_proc->server);
    }
    if(ctl_proc->reloader)
        pthread_join(ctl_proc->reloader, NULL);
    if(ctl_proc->watcher) {
        kube_watcher_stop(ctl_proc->watcher);
        kube_watcher_free(ctl_proc->watcher);
    }
    log_write(LOG_INFO, "controller", "stopped", NULL);
out:
    ctl_review_close_engines();
    ctl_bundle_free_all();
    kube_client_free(ctl_proc->client);
    json_decref(ctl_proc->settings);
    return status;
}
