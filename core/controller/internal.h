/* internal.h — shared between the files of core/controller/ only.
 *
 * Not a public interface (that is controller.h): the state of the one
 * controller of a process, the policy bundle record, and the entry points
 * each file gives the others. Every name is prefixed by its file:
 *   ctl_cluster_  cluster.c  the cluster view the policies read
 *   ctl_bundle_   bundle.c   policies ConfigMap -> compiled bundle, reloads
 *   ctl_review_   review.c   webhook threads' engines, reviews, readiness
 *   ctl_status_   status.c   leader-only GPUClass status writer
 *   ctl_proc      controller.c  the state, wired up by controller_main
 *
 * Locking: one mutex (ctl.mu) and one condition variable (ctl.cv, on
 * CLOCK_MONOTONIC) guard the fields marked "mu" below; every thread that
 * waits does so on cv, and every change a waiter cares about broadcasts.
 */
#ifndef COZYGPU_CONTROLLER_INTERNAL_H
#define COZYGPU_CONTROLLER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>

#include "base/result.h"
#include "controller/flags.h"
#include "engine/engine.h"
#include "kube/kube.h"
#include "kube/lease.h"
#include "kube/watch.h"
#include "server/webhook.h"

/* A policy bundle: the default policies plus the hoster sources of the
 * policies ConfigMap, handed to every engine from memory
 * (docs/decisions/0007, 0009). Reference counted: the published one holds
 * a reference, and so does every engine built on it. */
typedef struct ctl_bundle {
    struct ctl_bundle *prev, *next; /* every live bundle, for the exit (bundle.c) */
    unsigned long gen;              /* 1, 2, ... in publishing order */
    json_t *data;                   /* the ConfigMap's data (owned), or NULL: defaults only */
    engine_source *sources;         /* point into data and modules */
    char (*modules)[256];           /* module names of lib.* keys */
    size_t n_sources;
    char *source_rv;                /* the ConfigMap's resourceVersion, or NULL */
    int refs;                       /* mu */
} ctl_bundle;

/* The controller of this process. Set up by controller_main before any
 * thread starts; the fields not marked "mu" are read-only after that. */
typedef struct ctl {
    ctl_flags f;
    json_t *settings;   /* --config, or the defaults (DESIGN.md §10) */
    engine_options eo;  /* library, default bundle, budget; override_dir per bundle */
    kube_client *client;
    kube_watcher *watcher;
    kube_informer *cluster_inf[12]; /* what the policies read (decision 0008) */
    int n_cluster_inf;
    kube_informer *policies_inf; /* the policies ConfigMap, or NULL */
    kube_informer *classes_inf;  /* GPUClasses (also in cluster_inf) */
    webhook_server *server;
    lease_elector *lease;        /* NULL with --leader-elect=false */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;        /* mu: shutting down */
    ctl_bundle *current; /* mu: the bundle being published */
    int policies_loaded; /* mu: a bundle is being served */
    int status_dirty;    /* mu: the status writer has work */

    pthread_t reloader, writer;
} ctl;

/* The one controller of this process (controller.c). */
extern ctl *ctl_proc;

/* ---- cluster.c ---- */

/* `obj` as the policies index it: with apiVersion and kind, which the API
 * server omits in the items of built-in lists (apimachinery's
 * UnstructuredList). Returns a new reference (the object itself when it has
 * a kind, else a shallow copy with r's group/version and kind set); the
 * caller decrefs. */
json_t *ctl_cluster_with_kind(json_t *obj, const kube_resource *r);

/* Everything the cluster watch caches hold now (ctl.cluster_inf), each
 * object through ctl_cluster_with_kind, as one JSON array for
 * engine_set_cluster. Returns a new reference; the caller decrefs. */
json_t *ctl_cluster_snapshot(void);

/* ---- bundle.c ---- */

/* The bundle being served with a reference taken (release it with
 * ctl_bundle_unref), or NULL before the first one is published. */
ctl_bundle *ctl_bundle_current(void);

/* Drops a reference; the last one unlinks the bundle and frees it. NULL
 * is allowed. Takes mu. */
void ctl_bundle_unref(ctl_bundle *b);

/* The engine options of bundle `b`: ctl.eo with b's sources
 * (override_sources point into b: keep a reference while the engine
 * opens). */
engine_options ctl_bundle_engine_options(const ctl_bundle *b);

/* The reloader thread (pthread start routine; `arg` unused, returns NULL
 * once ctl.stopping is set). Waits for the caches to list, then compiles,
 * self-checks and publishes each ConfigMap version queued by
 * ctl_bundle_on_policies_event (DESIGN.md §9 "Hot reload", decision 0009),
 * reporting each result by log, metric and Event. */
void *ctl_bundle_reloader_main(void *arg);

/* kube_event_fn of the policies ConfigMap informer (watch.h): queues an
 * ADDED/MODIFIED ConfigMap for the reloader; a DELETED one keeps the
 * last bundle serving (decision 0009). Runs on the watcher thread and
 * only records work. */
void ctl_bundle_on_policies_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj);

/* At exit, once no thread holds a bundle: frees every bundle left, and
 * the reloader's pending state. */
void ctl_bundle_free_all(void);

/* ---- review.c ---- */

/* The webhook paths and their phases (deploy/50-webhooks.yaml). */
extern const webhook_endpoint ctl_review_endpoints[];
extern const size_t ctl_review_n_endpoints;

/* webhook_review_fn (server/webhook.h): answers one AdmissionReview. */
int ctl_review_on_review(void *ctx, const webhook_endpoint *ep, const json_t *review,
                         const struct timespec *deadline, json_t **response);

/* webhook_options.ready (server/webhook.h): 1 when /readyz should answer
 * 200: a bundle is served, not shutting down, every watch cache listed. */
int ctl_review_on_ready(void *ctx);

/* At exit, after webhook_stop: closes the engines the webhook threads
 * left behind (their threads are gone, their thread-locals unreachable). */
void ctl_review_close_engines(void);

/* ---- status.c ---- */

/* The status writer thread (pthread start routine; `arg` unused, returns
 * NULL once ctl.stopping is set): while leading, sets each GPUClass's
 * Accepted condition (decision 0009). */
void *ctl_status_writer_main(void *arg);

/* kube_event_fn of the GPUClass informer: marks the status dirty. */
void ctl_status_on_class_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj);

/* lease_options.on_change (kube/lease.h): on becoming leader, marks the
 * status dirty so the new leader writes at once. */
void ctl_status_on_leader_change(void *ctx, int leading);

#endif
