/* internal.h — shared between the files of core/controller/ only.
 *
 * Not a public interface (that is controller.h): the state of the one
 * controller of a process, the policy bundle handle, and the entry points
 * each file gives the others. Every name is prefixed by its file (the
 * files of one feature share its prefix):
 *   ctl_cluster_  cluster.c  the cluster view the policies read
 *   ctl_bundle_   bundle.c   policies ConfigMap -> compiled bundle, reloads
 *   ctl_review_   review.c   webhook threads' engines, reviews, readiness
 *   ctl_status_   status.c   leader-only GPUClass status writer
 *   ctl_bind_     bind.c     the leader's binder loop: claim status, pins
 *   ctl_usage_    usage.c, usage_record.c (usage_internal.h)
 *                            the leader's usage records (Workloads) and monitors
 *   ctl_event_    event.c    Events on the controller's own objects
 *   ctl_license_  license.c, license_copy.c, license_status.c,
 *                 license_loop.c (license_internal.h)
 *                            the leader's license token copies (DESIGN.md §8)
 *   ctl_key_      keys.c     sets of object keys (the loops' queues)
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
#include <uthash.h>

#include "base/keyset.h"
#include "base/result.h"
#include "controller/flags.h"
#include "engine/engine.h"
#include "kube/kube.h"
#include "kube/lease.h"
#include "kube/watch.h"
#include "server/webhook.h"

/* A policy bundle: the default policies plus the hoster sources of the
 * policies ConfigMap, handed to every engine from memory
 * (docs/decisions/0007, 0009). Opaque outside bundle.c. Reference
 * counted: the published one holds a reference, and so does every engine
 * built on it. */
typedef struct ctl_bundle ctl_bundle;

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
    kube_informer *gpunodes_inf; /* GPUNodes (the binder's node capacity) */
    kube_informer *vms_inf;      /* VirtualMachines (a stopped VM's claims) */
    kube_informer *pods_inf;     /* virt-launcher pods (the pin) */
    kube_informer *pvcs_inf;     /* PersistentVolumeClaims (a set's volumes, DESIGN.md §6) */
    kube_informer *pvs_inf;      /* PersistentVolumes (their node affinity) */
    kube_informer *workloads_inf; /* usage records (Workloads) this controller manages (optional) */
    kube_informer *monitors_inf;  /* WorkloadMonitors this controller manages (optional) */
    kube_informer *license_src_inf;    /* Secrets of the controller's namespace (license sources; the only
                                          Secrets it reads: docs/decisions/0035) */
    webhook_server *server;
    lease_elector *lease;        /* NULL with --leader-elect=false */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;        /* mu: shutting down */
    ctl_bundle *current; /* mu: the bundle being served */
    int policies_loaded; /* mu: a bundle is being served */
    int status_dirty;    /* mu: the status writer has work */

    pthread_t reloader, writer, binder, usage, licenser;
} ctl;

/* The one controller of this process (controller.c). */
extern ctl *ctl_proc;

/* ---- keys.c ---- */

/* A set of keys (base/keyset.h). A set the watcher thread fills is
 * guarded by ctl.mu (ctl_key_queue). */
typedef keyset ctl_key;

/* keyset_add under ctl.mu, then wakes every waiter on ctl.cv: how the
 * watcher thread hands a change to a leader loop. */
void ctl_key_queue(ctl_key **queue, const char *key);

/* A leader loop's wait: on ctl.cv until `*queue` holds a key, `*wake` is
 * set, ctl.stopping, or wait_ms (> 0, milliseconds) passes; then takes
 * the whole queue (returned, NULL when empty; the caller frees it with
 * keyset_free) and clears *wake, both under ctl.mu. *stop is ctl.stopping
 * (the queue is then freed here and NULL returned). */
ctl_key *ctl_key_wait(ctl_key **queue, int *wake, long wait_ms, int *stop);

/* ctl_key_wait, and take(ud) called under ctl.mu in the same hold that
 * takes the queue (not when stopping): what the watcher thread recorded
 * beside the keys is taken together with them, never a later event's. */
ctl_key *ctl_key_wait_take(ctl_key **queue, int *wake, long wait_ms, int *stop, void (*take)(void *ud), void *ud);

/* ---- writer.c ---- */

/* One leader-only writer (the binder, usage records, license copies, the
 * GPUClass Accepted condition): what the writer's loop calls, in this
 * order, on its own thread (DESIGN.md §2: writers run on the leader only;
 * decision 0009). `ud` is passed back to each; NULL members are skipped.
 *   wait_ms: how long to wait for keys this time (ms, >= 0; NULL: 1000);
 *   take: under ctl.mu with the batch (ctl_key_wait_take);
 *   build: this replica leads and every cache has listed, and the writer
 *     holds no state: build it from the caches (the batch is dropped: the
 *     caches hold all of it); non-zero: not built, tried at the next wake;
 *   apply: the keys queued since the last wake (the writer frees none);
 *   work: decide and write what is due, record each result (`had_batch`:
 *     the wake brought keys);
 *   drop: the lead is lost (or the caches are listing again) or the
 *     process stops: forget the state, which `build` makes again.
 * `dropped`: the log line when the state is dropped, NULL for none. */
typedef struct ctl_writer {
    const char *component; /* log component */
    const char *dropped;
    ctl_key **queue;
    int *wake;
    void *ud;
    long (*wait_ms)(void *ud);
    void (*take)(void *ud);
    int (*build)(void *ud);
    void (*apply)(void *ud, ctl_key *batch);
    void (*work)(void *ud, int had_batch);
    void (*drop)(void *ud);
} ctl_writer;

/* Runs writer w until ctl.stopping: waits for keys (ctl_key_wait_take),
 * builds on taking the lead, applies each batch, works, and drops the
 * state when the lead is lost; drops it once more at the end if built. */
void ctl_writer_run(const ctl_writer *w);

/* ctl_key_queue of "K:ns/name" for object `obj` (K = kind; ns empty for a
 * cluster-scoped object); nothing when it has no metadata.name. */
void ctl_key_queue_object(ctl_key **queue, char kind, const json_t *obj);

/* ---- cluster.c ---- */

/* `obj` as the policies index it: with apiVersion and kind. The API server
 * leaves both out of the items of a list (kubernetes/kubernetes#3030), so
 * a cache filled by a relist holds objects without them. Returns a new
 * reference (the object itself, shared and read-only, when it has a kind;
 * else a shallow copy with apiVersion "<group>/<version>", or "<version>"
 * for the core group, and r's kind); the caller decrefs. NULL only when
 * out of memory. */
json_t *ctl_cluster_with_kind(json_t *obj, const kube_resource *r);

/* Everything the cluster watch caches hold now (ctl.cluster_inf: the kinds
 * of docs/decisions/0008), each object through ctl_cluster_with_kind, as
 * one flat JSON array in informer order, the `cluster` argument of
 * engine_set_cluster (engine.h). The caches are read one after the other,
 * so the array may mix moments; decision 0008 says, per read, what a stale
 * cache can do. Returns a new reference (the caller decrefs) whose items
 * may be shared with the caches: read-only. */
json_t *ctl_cluster_snapshot(void);

/* The informer of ctl.cluster_inf that watches resource `r` (&KUBE_...),
 * or NULL when none does. Borrowed. */
kube_informer *ctl_cluster_informer(const kube_resource *r);

/* Annotation values longer than this (bytes) are not cached, but for
 * cozygpu's own keys (ctl_cluster_strip). */
#define CTL_CLUSTER_ANNOTATION_MAX 1024

/* The watch caches' transform (kube_informer_set_transform), for every
 * informer but the Secrets, ConfigMaps and usage records the controller
 * writes back whole: removes in place what no rule or the leader reads and
 * a tenant can make large (decision 0038): metadata.managedFields; every annotation but
 * gpu.cozystack.io/ and workload.cozystack.io/ ones that is not a string,
 * is kubectl's last-applied-configuration or is longer than
 * CTL_CLUSTER_ANNOTATION_MAX; cloud-init payloads of VMI and VM volumes;
 * env, command and args of pod containers. The cluster view the policies
 * read is these objects, so a hoster rule does not see what is stripped. */
void ctl_cluster_strip(const kube_resource *r, json_t *obj);

/* ---- bundle.c ---- */

/* The bundle being served, with a reference taken for the caller (release
 * it with ctl_bundle_unref), or NULL before the first one is published
 * (docs/decisions/0009: not before every cache has listed). Takes mu. */
ctl_bundle *ctl_bundle_current(void);

/* Drops a reference; the last one unlinks the bundle and frees it. NULL
 * is allowed. Takes mu. */
void ctl_bundle_unref(ctl_bundle *b);

/* The engine options of bundle `b`: ctl.eo with b's sources
 * (override_sources point into b, and engine_open copies them: hold a
 * reference on b until engine_open returns). */
engine_options ctl_bundle_engine_options(const ctl_bundle *b);

/* The reloader thread (pthread start routine; `arg` unused; returns NULL
 * once ctl.stopping is set). Waits for every cache to list, then takes the
 * defaults when there is no ConfigMap; after that compiles each ConfigMap
 * version queued by ctl_bundle_on_policies_event into engine sources held
 * in memory (engine_source_for_key: NAME.lua and lib.a.b.lua keys, other
 * keys and binaryData logged and skipped), self-checks it in a throw-away
 * engine (a synthetic Namespace CREATE must not come to a policy failure,
 * engine_outcome_is_failure), and publishes it (ctl.current,
 * ctl.policies_loaded, ctl.status_dirty, metric
 * cozygpu_policy_bundle_generation; cozygpu_policy_reload_failing 0) or
 * keeps the old one (cozygpu_policy_reload_failing 1). Each result is
 * logged, counted in cozygpu_policy_reloads_total{result} and recorded as
 * an Event on the ConfigMap (PolicyReloaded, PolicyReloadFailed once per
 * resourceVersion, PolicyConfigMapDeleted). A published bundle's log line
 * (fields added, changed, removed) and PolicyReloaded Event name the data
 * keys added, changed and removed since the bundle it replaced (the first
 * replaces the defaults, which have none). Rules: DESIGN.md §9 "Hot
 * reload", docs/decisions/0007 and 0009. */
void *ctl_bundle_reloader_main(void *arg);

/* kube_event_fn of the policies ConfigMap informer (kube/watch.h; ctx and
 * inf unused): an ADDED or MODIFIED ConfigMap (type) is deep-copied and
 * queued for the reloader, replacing one not yet taken; a DELETED one is
 * handed to the reloader to report while the last bundle keeps serving,
 * or, when no bundle was ever published, queues the defaults
 * (docs/decisions/0009). Runs on the watcher thread: takes mu, never
 * blocks on the API server. */
void ctl_bundle_on_policies_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj);

/* Copies the error of the last failed reload into buf (size n, cut,
 * NUL-terminated) and returns 1 while no reload succeeded since it; else
 * returns 0 and leaves buf alone. Takes mu. */
int ctl_bundle_last_error(char *buf, size_t n);

/* At exit, once every thread that held a bundle is joined or stopped:
 * frees every bundle left (ctl.current becomes NULL), and the reloader's
 * queued ConfigMaps and last error. */
void ctl_bundle_free_all(void);

/* ---- review.c ---- */

/* The webhook paths and their phases (deploy/50-webhooks.yaml). */
extern const webhook_endpoint ctl_review_endpoints[];
extern const size_t ctl_review_n_endpoints;

/* Reviews whose body is at most this many bytes run first on the I/O
 * thread that read them (webhook_options.inline_max_body, decision 0052):
 * VMs and pods are a few KiB; reading 64 KiB into Lua takes about as
 * long as the 2 ms slice, and a larger body would hold the I/O thread
 * longer. */
#define CTL_INLINE_MAX_BODY (64u * 1024u)

/* webhook_review_fn (server/webhook.h; ctx unused): answers one
 * AdmissionReview (admission.k8s.io/v1) on the engine of the calling
 * thread's review slot (webhook_review_slot), rebuilt first if the bundle
 * or the watch caches changed. With `inline_run` (the I/O thread) the
 * policies get 2 ms of CPU time (engine_set_slice); a review that needs
 * more returns WEBHOOK_MOVE and runs again on a review thread
 * (decision 0052).
 * *response is set to a new AdmissionReview whose response is:
 *  - allowed=false, code 500 "cozygpu webhook NAME: not serving: WHY" when
 *    the caches have not listed yet or no bundle is loaded (fail closed,
 *    DESIGN.md §4; docs/decisions/0001 for the codes);
 *  - allowed=false, code 400 when request.kind is not the kind the path
 *    serves (deploy/50-webhooks.yaml, docs/decisions/0006), or a CREATE or
 *    UPDATE has no request.object (the API server always sends it);
 *  - else the policies' verdict under `deadline`, as text written straight
 *    from the Lua response (engine_review_text, decision 0051; the
 *    refusals above are answered as JSON documents)
 *    (CLOCK_MONOTONIC); one whose outcome is a failure (error, budget,
 *    memory, deadline: engine_outcome_is_failure) counts in
 *    cozygpu_policy_errors_total.
 * *decision is the metric's label from the outcome: a policy failure or no
 * engine is WEBHOOK_ERROR, a refusal (a rule's, or the 400s above)
 * WEBHOOK_DENIED, else WEBHOOK_ALLOWED.
 * Returns 0, or -1 when the engine itself failed or out of memory (the
 * server then answers its own fail-closed 500). */
int ctl_review_on_review(void *ctx, const webhook_endpoint *ep, const json_t *review,
                         const struct timespec *deadline, int inline_run, webhook_answer *answer,
                         webhook_decision *decision);

/* webhook_parse_fn (server/webhook.h; ctx and ep unused): reads the body
 * with the engine of this thread's review slot (engine_decode_review: the request's Lua
 * value kept in the engine, request.object and request.oldObject emptied
 * in the document) and remembers the engine for the review that follows,
 * so that a bundle reload in between cannot hand that review to an
 * engine without its object (decision 0049). Without an engine (caches
 * not listed, no bundle) it reads the whole body with cozy_json_loadb and
 * the review refuses, saying why. */
json_t *ctl_review_on_parse(void *ctx, const webhook_endpoint *ep, const char *body, size_t len, json_error_t *error);

/* webhook_options.ready (server/webhook.h): 1 when /readyz should answer
 * 200: a bundle is served, not shutting down, every watch cache listed.
 * Else 0, with every reason that holds in `why` (size why_size), joined by
 * "; ": "shutting down", "watch caches not synced (<resources>)" (from
 * kube_watcher_unsynced), "no policy bundle loaded" or, when the last load
 * failed, "policy bundle did not load: <its error>". Takes mu. */
int ctl_review_on_ready(void *ctx, char *why, size_t why_size);

/* At exit, after webhook_stop: closes the engines the webhook threads
 * left behind (their threads are gone, their thread-locals unreachable)
 * and frees the list. Does not drop the engines' bundle references:
 * ctl_bundle_free_all frees every bundle regardless. */
void ctl_review_close_engines(void);

/* ---- status.c ---- */

/* The status writer thread (pthread start routine; `arg` unused; returns
 * NULL once ctl.stopping is set). Wakes on ctl.status_dirty or every
 * --status-interval; while this replica leads (lease_is_leader) and the
 * caches have listed, reviews every cached GPUClass as a synthetic CREATE
 * against the current bundle's gpuclass rules (its own engine) and writes
 * the condition type "Accepted" — True/Valid, or False/Invalid with the
 * rules' message — with observedGeneration through the status subresource
 * (kube_update_retry), only when it changed, re-checking leadership just
 * before each write. lastTransitionTime moves only when status changes.
 * Rules: docs/decisions/0009; Kubernetes API conventions, "Typical status
 * properties". A write that fails is logged and tried again on the next
 * pass. */
void *ctl_status_writer_main(void *arg);

/* kube_event_fn of the GPUClass informer (all arguments unused): marks the
 * status dirty and wakes the writer. Runs on the watcher thread; takes mu. */
void ctl_status_on_class_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj);

/* lease_options.on_change (kube/lease.h; ctx unused): on becoming leader
 * (leading 1), marks the status dirty so the new leader writes at once
 * instead of after --status-interval; losing the lead needs nothing, the
 * writer checks lease_is_leader before every write. Takes mu. */
void ctl_status_on_leader_change(void *ctx, int leading);

/* ---- bind.c ---- */

/* The binder thread (pthread start routine; `arg` unused; returns NULL
 * once ctl.stopping is set). While this replica leads and every cache has
 * listed: builds the binder's state (binder/binder.h) from the caches on
 * taking the lead (claims restored from their status, decision 0020 §1),
 * then applies each changed object and runs an incremental pass; writes
 * every claim whose status changed through the status subresource,
 * conditional on the cached resourceVersion; deletes the Pending VMIs the
 * rules ask for; pins gated virt-launcher pods whose claims are all Bound
 * to one node and removes their gate (DESIGN.md §4, §6; decisions 0020,
 * 0026). Drops its state when the lead is lost. Node capacity comes from
 * runtime.binder (cozygpu.capacity, decision 0022); when that module
 * cannot be opened the thread logs it and ends (the webhooks keep
 * serving). */
void *ctl_bind_main(void *arg);

/* kube_event_fn of the binder's informers: `ctx` is the kind letter cast
 * to a pointer (see bind.c); records ns/name as changed and wakes the
 * binder. The GPUClass informer's events also go to
 * ctl_status_on_class_event, the GPUClaim informer's to
 * ctl_usage_on_event. Runs on the watcher thread; takes mu. */
void ctl_bind_on_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj);

/* lease_options.on_change: ctl_status_on_leader_change,
 * ctl_usage_on_leader_change, and wakes the binder so that it builds (leading) or drops (not leading) its state at
 * once. Takes mu. */
void ctl_bind_on_leader_change(void *ctx, int leading);

/* ---- event.c ---- */

/* Records a core/v1 Event about `obj` (borrowed; its metadata name,
 * namespace, uid and resourceVersion become the involvedObject, with
 * `api_version` and `kind`; the Event is in the object's namespace, or in
 * "default" for a cluster-scoped object, as kube-apiserver requires): type "Normal" or
 * "Warning", a CamelCase reason, a message cut near 1 KiB (invalid UTF-8
 * becomes U+FFFD). Shape: client-go tools/record's EventRecorder (name
 * "<object>.<hex nanoseconds>", source.component cozygpu-controller,
 * reportingInstance the --identity). Blocks on one POST; errors are
 * logged, never returned. */
void ctl_event_record(const json_t *obj, const char *api_version, const char *kind, const char *type,
                      const char *reason, const char *message);

/* ---- usage.c (ctl_usage_record_name: usage_record.c) ---- */

/* The usage-record thread (pthread start routine; `arg` unused; returns
 * NULL once ctl.stopping is set). While this replica leads and every cache
 * has listed, keeps one Cozystack Workload per GPUClaim whose
 * status.phase is Bound or Attached (DESIGN.md §3 "Usage records";
 * docs/decisions/0028): named ctl_usage_record_name(claim), in the claim's
 * namespace, status {kind: gpu-device, type: <class>, resources:
 * {"<class>.gpuclass.cozystack.io/devices": "<count>"}, operational:
 * phase == Attached}, a controller ownerReference to the claim, labels
 * workloads.cozystack.io/monitor=cozygpu-gpus and
 * app.kubernetes.io/managed-by=cozygpu; and the WorkloadMonitor
 * cozygpu-gpus in each namespace that has a record. Incremental: a claim,
 * record or monitor event touches that claim's record or that namespace's
 * monitor only; on taking the lead (and when the Workload types become
 * served) every cached claim and record is compared once. Writes only
 * what differs (create; 409 AlreadyExists: read and update; a record of
 * an earlier claim of the same name: deleted with a uid precondition and
 * created again; a record pointed at another claim: its owner reference,
 * labels and status put back, since the record name decides whose it is;
 * a record under the name of a claim that holds nothing or of no claim:
 * deleted whoever it names as owner);
 * a failed write is tried again a second later. When the cluster does not
 * serve the Workload types (404) it writes nothing, probes once a minute,
 * and reports it (log and Warning Event UsageRecordsUnavailable on the
 * Lease, once per 10 minutes; gauge cozygpu_usage_records_available 0). */
void *ctl_usage_main(void *arg);

/* kube_event_fn of the GPUClaim, Workload and WorkloadMonitor informers:
 * `ctx` is the kind letter ('l' claim, 'w' record, 'o' monitor) cast to a
 * pointer. Queues the claim (a record's: the claim its name is made
 * from, mapped by the thread, and also its GPUClaim owner if any) or the
 * namespace (a monitor) and wakes the thread. Runs on the watcher thread; takes mu; never blocks on the API. */
void ctl_usage_on_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj);

/* lease_options.on_change (through ctl_bind_on_leader_change): wakes the
 * thread so that it compares everything (leading) or drops its state.
 * Takes mu. */
void ctl_usage_on_leader_change(void *ctx, int leading);

/* The usage record name of GPUClaim `claim` (a DNS subdomain of at most
 * 253 characters) into out (size n >= 254): "gpu-<claim>" when that fits;
 * else "gpuh-", the claim name cut to 215 characters (trailing '-' and '.'
 * dropped), "-" and 32 hex digits of the SHA-256 of the whole name. The
 * two forms never meet (the fourth character is '-' in one, 'h' in the
 * other) and a tenant cannot make two names share a hash, so every claim
 * of a namespace has its own record name, the same on every replica and
 * after a restart (decision 0028). Returns 0, or -1 when the hash cannot
 * be computed (out unchanged). */
int ctl_usage_record_name(const char *claim, char *out, size_t n);
/* ---- license_loop.c (the defines: every license*.c) ---- */

/* The copy of class C's token in a tenant namespace is the Secret
 * CTL_LICENSE_PREFIX C (docs/decisions/0004), labelled
 * app.kubernetes.io/managed-by=cozygpu and CTL_LICENSE_CLASS_LABEL=C (cut
 * to 63 characters), holding only CTL_LICENSE_TOKEN_KEY
 * (docs/decisions/0029). The controller writes copies by name and never
 * reads them (docs/decisions/0035). */
#define CTL_LICENSE_PREFIX "gpu-license-"
#define CTL_LICENSE_CLASS_LABEL "gpu.cozystack.io/license-class"
/* the file name NVIDIA's GPU Operator gives the token (its licensing
 * ConfigMap), and the key the guest finds it under */
#define CTL_LICENSE_TOKEN_KEY "client_configuration_token.tok"
/* owners one copy lists at most (the namespace's users of the class) */
#define CTL_LICENSE_MAX_OWNERS 32
/* a token larger than this is refused (NotAToken) */
#define CTL_LICENSE_TOKEN_MAX_BYTES (64u * 1024u)

/* The license copier thread (pthread start routine; `arg` unused; returns
 * NULL once ctl.stopping is set). While this replica leads and every cache
 * has listed: keeps, for every licensed vGPU GPUClass (spec.mode VGPU,
 * spec.license.secretRef), the Secret CTL_LICENSE_PREFIX<class> in every
 * namespace that runtime.license (cozygpu.tenant.vgpu_entitled) says is
 * entitled and that has a GPUClaim or a VMI (not final) of the class:
 * type Opaque, immutable, only the token under CTL_LICENSE_TOKEN_KEY, the
 * users as ownerReferences (at most CTL_LICENSE_MAX_OWNERS); deletes it
 * when the class, its license, the entitlement (once no VMI of the class
 * runs there: DESIGN.md §8) or the last user goes; writes the class's
 * LicenseReady condition (True TokenFound; False SecretNamespaceNotAllowed
 * for a source outside the controller's namespace, SecretNotFound,
 * KeyNotFound, NotAToken, naming the class and its secretRef, never a
 * tenant namespace) with a log line and a Warning Event on each new
 * failure. Reads only the Secrets of the controller's namespace; knows its
 * copies from its own writes' answers (they are never read): incremental
 * per event, every copy asserted (PUT or delete by name) on taking the
 * lead and every f.resync_ms, rate-limited. Rules: DESIGN.md §3, §5, §8;
 * docs/decisions/0004, 0029, 0035. When runtime.license cannot be opened
 * the thread logs it and ends. */
void *ctl_license_main(void *arg);

/* kube_event_fn of the informers the copier follows: `ctx` is the kind
 * letter cast to a pointer ('c' GPUClass, 's' Namespace, 'l' GPUClaim,
 * 'i' VMI, 'y' Secret of the controller's namespace);
 * records ns/name as changed and wakes the copier. Runs on the watcher
 * thread; takes mu. */
void ctl_license_on_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj);

/* lease_options.on_change part of the copier: wakes it so that it builds
 * (leading) or drops (not leading) its state at once. Takes mu. */
void ctl_license_on_leader_change(void *ctx, int leading);

#endif
