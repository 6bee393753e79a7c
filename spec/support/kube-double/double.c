/* kube-double — a Kubernetes API server double for cozygpu's specs.
 *
 * One process serving the REST API of the kinds cozygpu uses, from memory,
 * with the semantics the product relies on, plus a control API for fault
 * injection. kubectl works against it (see spec/double/double_spec.lua).
 *
 * Usage: kube-double [flags]
 *   --address A            listen address (default 127.0.0.1)
 *   --port N               TCP port, 0 = any (default 0)
 *   --port-file F          write the bound port to F once listening
 *   --tls-cert F --tls-key F   serve HTTPS (PEM) instead of HTTP
 *   --client-ca F          with TLS: accept client certificates signed by F
 *                          as authentication (the token then is optional)
 *   --token T              require `Authorization: Bearer T` (401 otherwise)
 *   --token-file F         same, the token read from F on every request
 *   --history N            watch events retained (default 1000); a watch
 *                          from an older resourceVersion gets 410 Expired
 *   --bookmark-interval S  seconds between BOOKMARK events (default 1; the
 *                          real server uses about 60)
 *   --min-request-timeout S  watch length without timeoutSeconds is S..2S
 *                          seconds (default 1800, as kube-apiserver)
 *   --initial-rv N         the resourceVersion before the first write
 *                          (default 1000)
 *   --expired-watch MODE   `event` (default): a watch from a compacted
 *                          resourceVersion answers 200 and one ERROR event
 *                          with the 410 Status, as the watch cache does;
 *                          `http`: answer HTTP 410 with the Status instead
 *   --log-requests         print one line per request on stderr
 *   --without R[,R...]     do not serve these resources (plurals, e.g.
 *                          workloads,workloadmonitors, at every version;
 *                          or one version: resourceclaims.v1.resource.k8s.io):
 *                          a cluster without that CRD or API version,
 *                          where every path of theirs is 404 and discovery
 *                          does not list them
 *
 * Control API (never authenticated, never subject to faults, not logged):
 *   POST /_double/cut      {"resource":"gpuclasses"?, "mode":"close"|"abrupt"|"expired"}
 *                          ends every open watch (of that resource): close =
 *                          clean end of the chunked stream, abrupt = the
 *                          connection is dropped mid-stream, expired = an
 *                          ERROR event with a 410 Expired Status, then end.
 *                          Answers {"cut": n}.
 *   POST /_double/compact  {"resourceVersion":"N"?} drops watch history up
 *                          to N (default: the current revision), like etcd
 *                          compaction: watches and continue tokens from
 *                          older versions then get 410. Answers
 *                          {"compacted":"N","resourceVersion":"C"}.
 *   POST /_double/fail     {"method":"GET"?, "path":"/apis/..."? (prefix),
 *                          "count":N (default 1, -1 = until cleared),
 *                          "status":500|429|503|..., "retryAfter":seconds?,
 *                          "watch":true|false?} answers the next N matching
 *                          requests with a Status of that code (429 and 503
 *                          carry Retry-After).
 *   POST /_double/latency  {"method"?, "path"?, "ms":L, "count"? (-1 default)}
 *                          delays matching requests by L ms before handling.
 *   POST /_double/clear    removes every fail and latency rule.
 *   GET  /_double/log      [{"method","path","query","userAgent","status",
 *                          "time","contentType","watch"}] of API requests, oldest first.
 *   DELETE /_double/log    empties it.
 *   GET  /_double/state?resource=gpuclasses   {"resourceVersion","compacted",
 *                          "watches","delayed","items":[objects, sorted by namespace/name]}
 *                          (delayed: requests a latency rule holds now)
 *                          (a plural served at several versions: the first
 *                          in the table; or name one as plural.version.group)
 *
 * Semantics followed (sources in k8s.io/apiserver unless said):
 *  - resourceVersion is one global counter (etcd's revision); each object
 *    carries the revision of its last write; lists carry the current one.
 *  - watch: resourceVersion unset or "0" starts with synthetic ADDED events
 *    for the current objects; R > 0 sends every event with rv > R, in order;
 *    R older than the retained history → 410 Expired "too old resource
 *    version: R (F)" (storage/cacher/watch_cache.go). Label/field selectors
 *    on watches turn an object that stops matching into DELETED and one that
 *    starts matching into ADDED (cacher/cache_watcher.go). sendInitialEvents
 *    (with resourceVersionMatch=NotOlderThan) ends the initial events with a
 *    BOOKMARK annotated k8s.io/initial-events-end.
 *  - list: resourceVersion unset/"0"/NotOlderThan → current state;
 *    resourceVersionMatch=Exact and continue tokens read the state at that
 *    revision (rebuilt from history), 410 once compacted.
 *  - writes: 409 AlreadyExists / Conflict, 404 NotFound (also for a missing
 *    namespace), 422 Invalid, no-op updates do not bump the revision,
 *    generation bumps on changes outside metadata and status (custom
 *    resources), the status subresource splits status from the rest,
 *    finalizers delay deletion (deletionTimestamp, MODIFIED, then DELETED
 *    when the last finalizer goes), dryRun=All stores nothing.
 *  - pods (pods.c, pkg/apis/core/validation and pkg/registry/core/pod of
 *    v1.32): scheduling gates must be qualified names without duplicates;
 *    a pod created with gates cannot name a node (422) and gets status
 *    {phase: Pending, conditions: [PodScheduled False, reason
 *    SchedulingGated, message "Scheduling is blocked due to non-empty
 *    scheduling gates"]} from the API server's create strategy, as the
 *    real one sets it; on update gates may only be removed (reordering is
 *    allowed), while the stored pod still has gates its nodeSelector may
 *    gain entries and its required node affinity may be set when absent or
 *    narrowed (each existing nodeSelectorTerm kept and only extended by
 *    matchExpressions/matchFields, the term count unchanged), its
 *    preferred node affinity may change; apart from that, and from
 *    container images, activeDeadlineSeconds (lowered), added tolerations
 *    and terminationGracePeriodSeconds (negative to 1), the spec is
 *    immutable, spec.nodeName included. Refusals are 422 Invalid with one
 *    cause per field error, worded as kube-apiserver v1.32 words them.
 *    Strategic merge patches of pods merge lists by their patchMergeKey
 *    (schedulingGates by name) and honour $patch, $retainKeys,
 *    $setElementOrder and $deleteFromPrimitiveList.
 *  - owner references and garbage collection (gc.c, and "garbage
 *    collection" below; k8s.io/apimachinery objectmeta.go, the generic
 *    registry's store.go, kube-controller-manager's garbagecollector):
 *    on create and update of every kind, metadata.ownerReferences need
 *    apiVersion (with a version), kind, name and uid, no core/v1 Event
 *    owner, at most one controller: true, and metadata.finalizers may not
 *    hold both orphan and foregroundDeletion (422 Invalid, one cause per
 *    error at the real, unindexed field paths; Go pointer addresses inside
 *    a %#v value are a fixed 0xc000000000). Whether an owner exists or
 *    sits in the dependent's namespace is not checked (the real API server
 *    does not either). DELETE takes DeleteOptions from the body, or else
 *    from the query (propagationPolicy, orphanDependents), refuses an
 *    unknown policy or both fields set (422 for DeleteOptions.meta.k8s.io),
 *    and turns them into finalizers: Orphan adds `orphan`, Foreground adds
 *    `foregroundDeletion`, Background (the default for every kind served)
 *    neither; with no policy given an existing one of those finalizers
 *    decides; an object left with finalizers gets a deletionTimestamp and
 *    stays (202 when orphanDependents=false was sent), a second DELETE of
 *    an object being deleted can switch these two finalizers. The
 *    collector then runs synchronously, inside the write's lock and before
 *    the answer (no tick: a client reads the state a real cluster reaches
 *    once its collector ran, each collector write an ordinary event with
 *    its own resourceVersion): `orphan` owners first lose themselves from
 *    their dependents' ownerReferences, then the finalizer; a
 *    `foregroundDeletion` owner loses the finalizer once no dependent with
 *    blockOwnerDeletion: true is left; an object not being deleted whose
 *    owners (looked up by kind, name and uid, in its own namespace when the
 *    owner kind is namespaced) are all absent or waiting on their own
 *    foreground deletion is deleted (Foreground when an owner waits and it
 *    has dependents of its own, else by its own orphan/foregroundDeletion
 *    finalizer, else Background), with its own finalizers honoured; one
 *    with a live owner stays and loses the references to absent and
 *    waiting owners; before an object goes Foreground because an owner
 *    waits, its blocking references turn non-blocking when one of its own
 *    dependents waits too (the collector's cycle guard, so a cycle of
 *    blocking references ends). So a dependent created after its owner is
 *    gone, or naming an owner of another uid, or a namespaced owner in
 *    another namespace, is collected at once; when that owner's uid does exist in
 *    another namespace (also for a cluster-scoped dependent, which is then
 *    kept) a Warning Event OwnerRefInvalidNamespace about the dependent is
 *    written, as graph_builder.go reports it.
 *  - Secrets and ConfigMaps (ValidateSecretUpdate, ValidateConfigMapUpdate
 *    in pkg/apis/core/validation): a Secret's type cannot change, and once
 *    `immutable: true` is stored, updates keep immutable and data (and
 *    binaryData) as they are (422 Invalid; metadata may still change,
 *    and deletion is allowed, as on the real server).
 *  - custom resources (kubevirt.io, cozystack.io) get defaulting and pruning
 *    from a stored CRD's schema and server-side Table output from its
 *    additionalPrinterColumns, when the CRD has been created.
 * Not faithful: no admission, no built-in defaulting (pods, namespaces get
 * only their status; a pod's qosClass is not set), no managedFields/
 * server-side apply (415), strategic merge patch of kinds other than Pod
 * is applied as a JSON merge patch,
 * namespace deletion removes the namespace and its contents at once (its
 * own finalizers and any propagation policy are ignored), no
 * CRD-driven new resource types (the kinds served are fixed), no
 * protobuf, no aggregated discovery, no OpenAPI (404).
 * Pods: no scheduler and no kubelet run, so nothing ever sets spec.nodeName
 * (a pod is only on a node when it was created with one and without
 * gates), status beyond the create-time phase and condition is only what
 * clients write through /status, and removing the last gate leaves the
 * PodScheduled=False/SchedulingGated condition in place (the real
 * scheduler replaces it when it tries the pod); no pods/binding
 * subresource (the real one refuses a pod that still has gates); of pod
 * validation only the rules above are checked (not containers, volumes,
 * resources, security contexts, metadata beyond ownerReferences and
 * finalizers, or status updates); the second
 * part of the "pod updates may not change fields other than ..." message
 * is a JSON diff of the changed spec fields, where the real server prints
 * go-cmp's (deliberately unstable) diff; several new gates in one update
 * are reported in index order (the real server's order is random).
 * Garbage collection: no delay, no informer lag and no absent-owner cache
 * (what a real collector does some seconds later is done before the write
 * is answered); OwnerRefInvalidNamespace Events carry source.component
 * but no reportingComponent/series, and are written once per dependent
 * and owner (the real recorder counts repeats); a cluster-scoped
 * dependent naming a namespaced owner kind, or a reference to a kind the
 * double does not serve, is never collected (the real collector gives up on
 * the first and retries the second forever), while the custom kinds in
 * DBL_TYPES resolve as owners even before their CRD is stored (a real
 * collector cannot map them then); no OwnerReferencesPermissionEnforcement
 * admission (anyone may set blockOwnerDeletion); an update that empties
 * the finalizers of an object being deleted answers the object it sent
 * (the real server answers the deleted object, or a Status Success for
 * kinds that do not return it), its DELETED event carries the last stored
 * state as the real one does; pods are deleted at once
 * (no grace period), so a pod dependent never lingers in Terminating.
 */
#include "double.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>

/* ---- resource types --------------------------------------------------- */

#define VERBS "create delete deletecollection get list patch update watch"

/* Which stores return the deleted object (ReturnDeletedObject in
 * pkg/registry/.../storage): pods, namespaces and every custom resource;
 * the others answer a Status Success with details. */
const dbl_type DBL_TYPES[] = {
    { "", "v1", "namespaces", "namespace", "Namespace", 0, "ns", 1, 0, 1, "status.phase" },
    { "", "v1", "nodes", "node", "Node", 0, "no", 1, 0, 0, "spec.unschedulable" },
    { "", "v1", "pods", "pod", "Pod", 1, "po", 1, 0, 1, "spec.nodeName status.phase spec.schedulerName" },
    { "", "v1", "secrets", "secret", "Secret", 1, "", 0, 0, 0, "type" },
    { "", "v1", "configmaps", "configmap", "ConfigMap", 1, "cm", 0, 0, 0, "" },
    { "", "v1", "resourcequotas", "resourcequota", "ResourceQuota", 1, "quota", 1, 0, 0, "" },
    { "", "v1", "events", "event", "Event", 1, "ev", 0, 0, 0,
      "involvedObject.kind involvedObject.name involvedObject.namespace involvedObject.uid reason type" },
    { "coordination.k8s.io", "v1", "leases", "lease", "Lease", 1, "", 0, 0, 0, "" },
    { "apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition",
      "CustomResourceDefinition", 0, "crd crds", 1, 0, 0, "" },
    { "kubevirt.io", "v1", "virtualmachineinstances", "virtualmachineinstance", "VirtualMachineInstance", 1,
      "vmi vmis", 1, 1, 1, "" },
    { "kubevirt.io", "v1", "virtualmachines", "virtualmachine", "VirtualMachine", 1, "vm vms", 1, 1, 1, "" },
    { "kubevirt.io", "v1", "kubevirts", "kubevirt", "KubeVirt", 1, "kv kvs", 1, 1, 1, "" },
    { "cozystack.io", "v1alpha1", "gpuclasses", "gpuclass", "GPUClass", 0, "gpuc", 1, 1, 1, "" },
    { "cozystack.io", "v1alpha1", "gpuclaims", "gpuclaim", "GPUClaim", 1, "", 1, 1, 1, "" },
    { "cozystack.io", "v1alpha1", "gpunodes", "gpunode", "GPUNode", 0, "", 1, 1, 1, "" },
    /* Cozystack's usage records: Workload has no status subresource (its
     * status is written with the object), WorkloadMonitor has one
     * (cozystack api/v1alpha1 workload_types.go, workloadmonitor_types.go) */
    { "cozystack.io", "v1alpha1", "workloads", "workload", "Workload", 1, "", 0, 1, 1, "" },
    { "cozystack.io", "v1alpha1", "workloadmonitors", "workloadmonitor", "WorkloadMonitor", 1, "", 1, 1, 1, "" },
    /* volumes (T_* above index the entries before this one), for the binder's WaitForFirstConsumer rule (a PV's node
     * affinity); stored and served, no binding controller */
    { "", "v1", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", 1, "pvc", 1, 0, 0, "" },
    { "", "v1", "persistentvolumes", "persistentvolume", "PersistentVolume", 0, "pv", 1, 0, 0, "" },
    /* the kinds of deploy/, so `kubectl apply -k deploy/` can be checked:
     * stored and served, nothing acts on them (no controllers, no RBAC) */
    { "", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", 1, "sa", 0, 0, 0, "" },
    { "", "v1", "services", "service", "Service", 1, "svc", 1, 0, 0, "" },
    { "apps", "v1", "deployments", "deployment", "Deployment", 1, "deploy", 1, 0, 0, "" },
    { "apps", "v1", "daemonsets", "daemonset", "DaemonSet", 1, "ds", 1, 0, 0, "" },
    { "policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", 1, "pdb", 1, 0, 0, "" },
    { "networking.k8s.io", "v1", "networkpolicies", "networkpolicy", "NetworkPolicy", 1, "netpol", 0, 0, 0, "" },
    { "rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", 0, "", 0, 0, 0, "" },
    { "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", 0, "", 0, 0, 0, "" },
    { "rbac.authorization.k8s.io", "v1", "roles", "role", "Role", 1, "", 0, 0, 0, "" },
    { "rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", 1, "", 0, 0, 0, "" },
    { "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "validatingwebhookconfiguration",
      "ValidatingWebhookConfiguration", 0, "", 0, 0, 0, "" },
    { "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "mutatingwebhookconfiguration",
      "MutatingWebhookConfiguration", 0, "", 0, 0, 0, "" },
    { "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "validatingadmissionpolicy",
      "ValidatingAdmissionPolicy", 0, "", 1, 0, 0, "" },
    { "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", "validatingadmissionpolicybinding",
      "ValidatingAdmissionPolicyBinding", 0, "", 0, 0, 0, "" },
    /* cert-manager's CRDs, as if installed (deploy/30-certificates.yaml) */
    { "cert-manager.io", "v1", "issuers", "issuer", "Issuer", 1, "", 1, 1, 1, "" },
    { "cert-manager.io", "v1", "certificates", "certificate", "Certificate", 1, "cert certs", 1, 1, 1, "" },
    /* DRA (k8s.io/api resource/v1 and v1beta1 types.go), for the raw-name
     * policy's claims and device classes: v1 as Kubernetes 1.34+ serves it,
     * v1beta1 as 1.32 did. Each version is a store of its own (no
     * conversion between them: an object exists at the version it was
     * written at); `--without resourceclaims.v1.resource.k8s.io` leaves one
     * version out */
    { "resource.k8s.io", "v1", "resourceclaims", "resourceclaim", "ResourceClaim", 1, "", 1, 0, 0, "" },
    { "resource.k8s.io", "v1", "resourceclaimtemplates", "resourceclaimtemplate", "ResourceClaimTemplate", 1, "", 0, 0, 0, "" },
    { "resource.k8s.io", "v1", "deviceclasses", "deviceclass", "DeviceClass", 0, "", 0, 0, 0, "" },
    { "resource.k8s.io", "v1beta1", "resourceclaims", "resourceclaim", "ResourceClaim", 1, "", 1, 0, 0, "" },
    { "resource.k8s.io", "v1beta1", "resourceclaimtemplates", "resourceclaimtemplate", "ResourceClaimTemplate", 1, "", 0, 0, 0, "" },
    { "resource.k8s.io", "v1beta1", "deviceclasses", "deviceclass", "DeviceClass", 0, "", 0, 0, 0, "" },
};
const size_t DBL_NTYPES = sizeof DBL_TYPES / sizeof DBL_TYPES[0];
#define NTYPES (sizeof DBL_TYPES / sizeof DBL_TYPES[0])
enum { T_NAMESPACES = 0, T_NODES = 1, T_PODS = 2, T_SECRETS = 3, T_CONFIGMAPS = 4, T_EVENTS = 6, T_CRDS = 8 };

/* ---- options ---------------------------------------------------------- */

static struct {
    const char *address, *port_file, *tls_cert, *tls_key, *client_ca, *token, *token_file;
    int port;
    size_t history;
    double bookmark_interval;
    long min_request_timeout;
    unsigned long long initial_rv;
    int expired_http, log_requests;
} opt = { "127.0.0.1", NULL, NULL, NULL, NULL, NULL, NULL, 0, 1000, 1.0, 1800, 1000, 0, 0 };

/* --without: types not served (set once in main, read-only after) */
static int g_unserved[NTYPES];

/* Whether `name` names type i: its plural (every version of it), or
 * plural.version.group (kubectl's fully qualified resource.version.group) */
static int type_named(size_t i, const char *name)
{
    const dbl_type *t = &DBL_TYPES[i];
    size_t n = strlen(t->plural), v = strlen(t->version);
    if (!strcmp(name, t->plural)) return 1;
    return !strncmp(name, t->plural, n) && name[n] == '.' && !strncmp(name + n + 1, t->version, v) &&
           name[n + 1 + v] == '.' && !strcmp(name + n + 2 + v, t->group);
}

/* ---- global state (all under g_lock) ------------------------------------ */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond;            /* CLOCK_MONOTONIC; broadcast on every change */

typedef struct entry {
    char *key;        /* "ns/name" or "name": etcd key order */
    json_t *obj;      /* immutable */
} entry;
/* key -> position in store.v: lookups by key are constant time (the
 * collector looks every owner reference up on every write) */
typedef struct store_ix {
    const char *key;  /* the entry's own key */
    size_t i;
    UT_hash_handle hh;
} store_ix;
typedef struct store {
    entry *v;         /* in insertion order (the collector's walk order) */
    size_t n, cap;
    store_ix *ix;
} store;
static store g_store[NTYPES];

typedef struct event {
    unsigned long long rv;
    int res;
    const char *type;  /* "ADDED", "MODIFIED", "DELETED" */
    char *key;
    json_t *obj;       /* new state (DELETED: last state with the delete's rv) */
    json_t *prev;      /* state before, NULL for ADDED */
} event;
static event *g_hist;                    /* ring of opt.history events */
static size_t g_hist_head, g_hist_n;     /* index of the oldest, count */
static unsigned long long g_rv;          /* current revision */
static unsigned long long g_floor;       /* watch/continue from R needs R >= g_floor */
static unsigned long g_cut_gen[NTYPES];  /* bumped by /_double/cut */
static int g_cut_mode[NTYPES];           /* 0 close, 1 abrupt, 2 expired */
static int g_watches;                    /* open watch streams */
static int g_delayed;                    /* requests held by a latency rule now */
static int g_stopping;

typedef struct rule {
    char method[16];
    char path[512];
    int fail;          /* 1 fail rule, 0 latency rule */
    int status, retry_after, watch; /* watch: -1 any, 0 non-watch, 1 watch only */
    long count;        /* remaining, -1 unlimited */
    long ms;
} rule;
#define MAX_RULES 64
static rule g_rules[MAX_RULES];
static size_t g_nrules;

static json_t *g_log;                    /* array of request records */
#define MAX_LOG 20000

/* ---- small utilities ---------------------------------------------------- */

static void now_rfc3339(char *buf, size_t n)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void random_bytes(unsigned char *b, size_t n)
{
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(b, 1, n, f) != n) {
        for (size_t i = 0; i < n; i++) b[i] = (unsigned char)rand();
    }
    if (f) fclose(f);
}

static void new_uid(char *out /* 37 */)
{
    unsigned char b[16];
    random_bytes(b, sizeof b);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* metadata.<k> as a string, or NULL */
static const char *meta_str(const json_t *obj, const char *k)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), k));
}

static json_t *meta_of(json_t *obj)
{
    json_t *m = json_object_get(obj, "metadata");
    if (!json_is_object(m)) {
        m = json_object();
        json_object_set_new(obj, "metadata", m);
    }
    return m;
}

static unsigned long long parse_rv(const char *s, int *ok)
{
    char *end;
    *ok = 0;
    if (!s || !*s) return 0;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno) return 0;
    *ok = 1;
    return v;
}

static void set_rv(json_t *obj, unsigned long long rv)
{
    char b[32];
    snprintf(b, sizeof b, "%llu", rv);
    json_object_set_new(meta_of(obj), "resourceVersion", json_string(b));
}

static const char *api_version(const dbl_type *t, char *buf, size_t n)
{
    if (*t->group) snprintf(buf, n, "%s/%s", t->group, t->version);
    else snprintf(buf, n, "%s", t->version);
    return buf;
}

/* "gpuclasses.cozystack.io" or "pods" (schema.GroupResource.String()) */
static const char *qualified(const dbl_type *t, char *buf, size_t n)
{
    if (*t->group) snprintf(buf, n, "%s.%s", t->plural, t->group);
    else snprintf(buf, n, "%s", t->plural);
    return buf;
}

static char *make_key(const char *ns, const char *name)
{
    char *k;
    if (ns && *ns) { if (asprintf(&k, "%s/%s", ns, name) < 0) abort(); }
    else k = strdup(name);
    return k;
}

/* URL-safe base64 without padding (continue tokens, RawURLEncoding) */
static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static char *b64_encode(const char *s, size_t n)
{
    char *out = malloc(n * 4 / 3 + 4), *w = out;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned char)s[i] << 16;
        if (i + 1 < n) v |= (unsigned char)s[i + 1] << 8;
        if (i + 2 < n) v |= (unsigned char)s[i + 2];
        *w++ = B64[(v >> 18) & 63];
        *w++ = B64[(v >> 12) & 63];
        if (i + 1 < n) *w++ = B64[(v >> 6) & 63];
        if (i + 2 < n) *w++ = B64[v & 63];
    }
    *w = '\0';
    return out;
}

static char *b64_decode(const char *s, size_t *outlen)
{
    size_t n = strlen(s);
    char *out = malloc(n + 1);
    size_t o = 0;
    unsigned v = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = strchr(B64, s[i]);
        if (s[i] == '=') break;
        if (!p || !s[i]) { free(out); return NULL; }
        v = (v << 6) | (unsigned)(p - B64);
        bits += 6;
        if (bits >= 8) { bits -= 8; out[o++] = (char)((v >> bits) & 0xff); }
    }
    out[o] = '\0';
    *outlen = o;
    return out;
}

/* ---- Status objects (k8s.io/apimachinery/pkg/api/errors) ----------------- */

static json_t *status_new(int code, const char *reason, const char *message, json_t *details)
{
    json_t *s = json_pack("{s:s,s:s,s:{},s:s,s:s,s:s,s:i}", "kind", "Status", "apiVersion", "v1", "metadata",
                          "status", "Failure", "message", message, "reason", reason, "code", code);
    if (details) json_object_set_new(s, "details", details);
    return s;
}

static json_t *details_of(const dbl_type *t, const char *name)
{
    json_t *d = json_object();
    if (name) json_object_set_new(d, "name", json_string(name));
    if (*t->group) json_object_set_new(d, "group", json_string(t->group));
    json_object_set_new(d, "kind", json_string(t->plural));   /* "Yes we set Kind field to resource." */
    return d;
}

static json_t *err_not_found(const dbl_type *t, const char *name)
{
    char q[160], m[512];
    snprintf(m, sizeof m, "%s \"%s\" not found", qualified(t, q, sizeof q), name);
    return status_new(404, "NotFound", m, details_of(t, name));
}

static json_t *err_already_exists(const dbl_type *t, const char *name)
{
    char q[160], m[512];
    snprintf(m, sizeof m, "%s \"%s\" already exists", qualified(t, q, sizeof q), name);
    return status_new(409, "AlreadyExists", m, details_of(t, name));
}

static json_t *err_conflict(const dbl_type *t, const char *name, const char *why)
{
    char q[160], m[1024];
    snprintf(m, sizeof m, "Operation cannot be fulfilled on %s \"%s\": %s", qualified(t, q, sizeof q), name, why);
    return status_new(409, "Conflict", m, details_of(t, name));
}

/* NewInvalid: `Kind.group "name" is invalid: field: Required value: msg` */
static json_t *err_invalid(const dbl_type *t, const char *name, const char *field, const char *type,
                           const char *reason, const char *detail)
{
    char m[1024], qk[160];
    if (*t->group) snprintf(qk, sizeof qk, "%s.%s", t->kind, t->group);
    else snprintf(qk, sizeof qk, "%s", t->kind);
    snprintf(m, sizeof m, "%s \"%s\" is invalid: %s: %s: %s", qk, name ? name : "", field, type, detail);
    json_t *d = json_object();
    json_object_set_new(d, "name", json_string(name ? name : ""));
    if (*t->group) json_object_set_new(d, "group", json_string(t->group));
    json_object_set_new(d, "kind", json_string(t->kind));
    char cm[512];
    snprintf(cm, sizeof cm, "%s: %s", type, detail);
    json_object_set_new(d, "causes", json_pack("[{s:s,s:s,s:s}]", "reason", reason, "message", cm, "field", field));
    return status_new(422, "Invalid", m, d);
}

/* NewInvalid with a field.ErrorList (given as StatusCauses): the message is
 * `Kind "name" is invalid: E` for one distinct error and `[E1, E2]` for
 * several (ToAggregate drops repeated texts; E is "field: message"). Takes
 * causes (stolen). */
/* ValidateSecretUpdate / ValidateConfigMapUpdate (pkg/apis/core/validation
 * of v1.32): a Secret's type never changes ("field is immutable"); once
 * `immutable: true` is stored, immutable stays true and data (and a
 * ConfigMap's binaryData) stay as they are ("field is immutable when
 * `immutable` is set"). Appends the causes. stringData is not converted
 * into data by the double (not faithful: the real server merges it into
 * data first, so an update through stringData is refused as a change of
 * data). */
static void immutable_causes(json_t *causes, int secret, const json_t *next, const json_t *cur)
{
    static const char *const locked = "Forbidden: field is immutable when `immutable` is set";
    if (secret) {
        const json_t *nt = json_object_get(next, "type"), *ct = json_object_get(cur, "type");
        const char *nv = json_string_value(nt) ?: "", *cv = json_string_value(ct) ?: "";
        if (strcmp(nv, cv) != 0) {
            char m[700];
            snprintf(m, sizeof m, "Invalid value: \"%.600s\": field is immutable", nv);
            json_array_append_new(causes, json_pack("{s:s,s:s,s:s}", "reason", "FieldValueInvalid", "message", m,
                                                    "field", "type"));
        }
    }
    if (!json_is_true(json_object_get(cur, "immutable"))) return;
    if (!json_is_true(json_object_get(next, "immutable")))
        json_array_append_new(causes, json_pack("{s:s,s:s,s:s}", "reason", "FieldValueForbidden", "message", locked,
                                                "field", "immutable"));
    static const char *const fields[] = { "data", "binaryData" };
    for (int i = 0; i < (secret ? 1 : 2); i++) {
        const json_t *a = json_object_get(next, fields[i]), *b = json_object_get(cur, fields[i]);
        int same = (!a || json_object_size(a) == 0) && (!b || json_object_size(b) == 0) ? 1
                 : a && b ? json_equal((json_t *)a, (json_t *)b) : 0;
        if (!same || (secret && json_object_get(next, "stringData")))
            json_array_append_new(causes, json_pack("{s:s,s:s,s:s}", "reason", "FieldValueForbidden", "message",
                                                    locked, "field", fields[i]));
    }
}

static json_t *err_invalid_causes(const dbl_type *t, const char *name, json_t *causes)
{
    char qk[160];
    if (*t->group) snprintf(qk, sizeof qk, "%s.%s", t->kind, t->group);
    else snprintf(qk, sizeof qk, "%s", t->kind);
    json_t *seen = json_object(), *texts = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(causes, i, c) {
        char *e = NULL;
        if (asprintf(&e, "%s: %s", json_string_value(json_object_get(c, "field")),
                     json_string_value(json_object_get(c, "message"))) < 0) continue;
        if (!json_object_get(seen, e)) {
            json_object_set_new(seen, e, json_true());
            json_array_append_new(texts, json_string(e));
        }
        free(e);
    }
    size_t len = strlen(qk) + strlen(name) + 32;
    json_array_foreach(texts, i, c) len += strlen(json_string_value(c)) + 2;
    char *m = malloc(len);
    int o = snprintf(m, len, "%s \"%s\" is invalid: %s", qk, name, json_array_size(texts) > 1 ? "[" : "");
    json_array_foreach(texts, i, c) o += snprintf(m + o, len - (size_t)o, "%s%s", i ? ", " : "", json_string_value(c));
    if (json_array_size(texts) > 1) snprintf(m + o, len - (size_t)o, "]");
    json_t *d = json_object();
    json_object_set_new(d, "name", json_string(name));
    if (*t->group) json_object_set_new(d, "group", json_string(t->group));
    json_object_set_new(d, "kind", json_string(t->kind));
    json_object_set_new(d, "causes", causes);
    json_t *st = status_new(422, "Invalid", m, d);
    free(m);
    json_decref(seen);
    json_decref(texts);
    return st;
}

static json_t *err_bad_request(const char *msg)
{
    return status_new(400, "BadRequest", msg, NULL);
}

static json_t *err_expired(unsigned long long rv, unsigned long long floor)
{
    char m[128];
    snprintf(m, sizeof m, "too old resource version: %llu (%llu)", rv, floor);
    return status_new(410, "Expired", m, NULL);
}

/* ---- store --------------------------------------------------------------- */

static entry *store_find(int res, const char *key)
{
    store *s = &g_store[res];
    store_ix *x;
    HASH_FIND_STR(s->ix, key, x);
    return x ? &s->v[x->i] : NULL;
}

static void store_remove(int res, entry *e)
{
    store *s = &g_store[res];
    size_t i = (size_t)(e - s->v);
    store_ix *x;
    HASH_FIND_STR(s->ix, e->key, x);
    if (x) { HASH_DEL(s->ix, x); free(x); }
    free(e->key);
    json_decref(e->obj);
    memmove(&s->v[i], &s->v[i + 1], (s->n - i - 1) * sizeof *s->v);
    s->n--;
    for (size_t j = i; j < s->n; j++) {   /* the entries after it moved down one */
        HASH_FIND_STR(s->ix, s->v[j].key, x);
        if (x) x->i = j;
    }
}

static void store_append(int res, const char *key, json_t *obj)
{
    store *s = &g_store[res];
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n].key = strdup(key);
    s->v[s->n].obj = obj;
    store_ix *x = calloc(1, sizeof *x);
    x->key = s->v[s->n].key;
    x->i = s->n;
    HASH_ADD_KEYPTR(hh, s->ix, x->key, strlen(x->key), x);
    s->n++;
}

/* Records the write of `obj` (stolen; NULL for deletion with `last` given)
 * as the next revision and an event; updates the store. Returns the new
 * revision. type: "ADDED", "MODIFIED", "DELETED". Caller holds g_lock. */
static long g_gc_objs;   /* stored objects with ownerReferences or a deletionTimestamp */

/* 1 when the collector may have work about obj: it names owners, or it is
 * being deleted (and may be an owner waiting on its dependents). */
static int gc_relevant(const json_t *obj)
{
    const json_t *m = json_object_get(obj, "metadata");
    return json_array_size(json_object_get(m, "ownerReferences")) > 0 || json_object_get(m, "deletionTimestamp");
}

static unsigned long long commit(int res, const char *key, const char *type, json_t *obj)
{
    unsigned long long rv = ++g_rv;
    entry *e = store_find(res, key);
    json_t *prev = e ? json_incref(e->obj) : NULL;
    g_gc_objs += (strcmp(type, "DELETED") && gc_relevant(obj) ? 1 : 0) - (prev && gc_relevant(prev) ? 1 : 0);
    set_rv(obj, rv);
    if (!strcmp(type, "DELETED")) {
        if (e) store_remove(res, e);
    } else if (e) {
        json_decref(e->obj);
        e->obj = json_incref(obj);
    } else {
        store_append(res, key, json_incref(obj));
    }
    /* history ring: drop the oldest when full; that revision becomes the floor */
    if (g_hist_n == opt.history) {
        event *old = &g_hist[g_hist_head];
        g_floor = old->rv;
        free(old->key);
        json_decref(old->obj);
        json_decref(old->prev);
        g_hist_head = (g_hist_head + 1) % opt.history;
        g_hist_n--;
    }
    event *ev = &g_hist[(g_hist_head + g_hist_n) % opt.history];
    ev->rv = rv;
    ev->res = res;
    ev->type = type;
    ev->key = strdup(key);
    ev->obj = obj;
    ev->prev = prev;
    g_hist_n++;
    pthread_cond_broadcast(&g_cond);
    return rv;
}

/* Drops history up to revision c (etcd compaction). Caller holds g_lock. */
static void compact(unsigned long long c)
{
    while (g_hist_n && g_hist[g_hist_head].rv <= c) {
        event *old = &g_hist[g_hist_head];
        free(old->key);
        json_decref(old->obj);
        json_decref(old->prev);
        g_hist_head = (g_hist_head + 1) % opt.history;
        g_hist_n--;
    }
    if (c > g_floor) g_floor = c;
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The objects of `res` at revision `at` (0: now) as a JSON object key → obj
 * (new references), rebuilt by undoing newer events. Caller holds g_lock and
 * checked at >= g_floor. */
static json_t *state_at(int res, unsigned long long at)
{
    json_t *m = json_object();
    store *s = &g_store[res];
    for (size_t i = 0; i < s->n; i++) json_object_set(m, s->v[i].key, s->v[i].obj);
    if (at) {
        for (size_t i = g_hist_n; i-- > 0;) {
            event *e = &g_hist[(g_hist_head + i) % opt.history];
            if (e->rv <= at) break;
            if (e->res != res) continue;
            if (e->prev) json_object_set(m, e->key, e->prev);
            else json_object_del(m, e->key);
        }
    }
    return m;
}

/* ---- the stored CRD of a custom resource type ---------------------------- */

/* The served version entry of the CRD for t (spec.versions[i] whose name is
 * t->version), a new reference, or NULL. Caller holds g_lock. */
static json_t *crd_version(const dbl_type *t)
{
    if (!t->custom) return NULL;
    char key[256];
    snprintf(key, sizeof key, "%s.%s", t->plural, t->group);
    entry *e = store_find(T_CRDS, key);
    if (!e) return NULL;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(json_object_get(e->obj, "spec"), "versions"), i, v) {
        if (!strcmp(json_string_value(json_object_get(v, "name")) ?: "", t->version)) return json_incref(v);
    }
    return NULL;
}

/* ---- requests, responses, the request log --------------------------------- */

typedef struct conn_state {
    char *body;
    size_t len, cap;
    int too_big;
    int started;
} conn_state;

typedef struct rq {
    struct MHD_Connection *c;
    const char *method, *path;
    char query[4096];
    const char *ua;
    int watch;
    conn_state *cs;
} rq;

#define MAX_BODY (3u * 1024 * 1024)   /* the API server's request body limit */

static const char *arg(rq *r, const char *k)
{
    return MHD_lookup_connection_value(r->c, MHD_GET_ARGUMENT_KIND, k);
}

static int arg_true(rq *r, const char *k)
{
    const char *v = arg(r, k);
    return v && (!strcmp(v, "true") || !strcmp(v, "1"));
}

static void log_request(rq *r, int status)
{
    if (!strncmp(r->path, "/_double", 8)) return;
    char t[40];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(t + strlen(t), sizeof t - strlen(t), ".%03ldZ", ts.tv_nsec / 1000000);
    const char *ct = MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "Content-Type");
    json_t *rec = json_pack("{s:s,s:s,s:s,s:s,s:i,s:s,s:s,s:b}", "method", r->method, "path", r->path, "query",
                            r->query, "userAgent", r->ua ? r->ua : "", "status", status, "time", t,
                            "contentType", ct ? ct : "", "watch", r->watch);
    pthread_mutex_lock(&g_lock);
    if (json_array_size(g_log) >= MAX_LOG) json_array_remove(g_log, 0);
    json_array_append_new(g_log, rec);
    pthread_mutex_unlock(&g_lock);
    if (opt.log_requests)
        fprintf(stderr, "kube-double: %s %s%s%s -> %d\n", r->method, r->path, *r->query ? "?" : "", r->query, status);
}

/* Sends body (stolen) as JSON with a trailing newline, as the API server's
 * encoder does. warning: optional Warning header value. */
static enum MHD_Result respond_ex(rq *r, int status, json_t *body, const char *retry_after, const char *warning)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    size_t n = strlen(text);
    text = realloc(text, n + 2);
    text[n] = '\n';
    text[n + 1] = '\0';
    struct MHD_Response *resp = MHD_create_response_from_buffer(n + 1, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-cache, private");
    if (retry_after) MHD_add_response_header(resp, "Retry-After", retry_after);
    if (warning) MHD_add_response_header(resp, "Warning", warning);
    enum MHD_Result rc = MHD_queue_response(r->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    log_request(r, status);
    return rc;
}

static enum MHD_Result respond(rq *r, int status, json_t *body)
{
    return respond_ex(r, status, body, NULL, NULL);
}

/* A Status error answer; its code is the HTTP status. */
static enum MHD_Result respond_status(rq *r, json_t *st)
{
    return respond(r, (int)json_integer_value(json_object_get(st, "code")), st);
}

/* ---- routing ------------------------------------------------------------- */

typedef struct route {
    int res;            /* index in DBL_TYPES, -1 for none */
    char ns[256];       /* "" unless namespaced path */
    char name[256];     /* "" for a collection */
    char sub[32];       /* "status" or "" */
    int discovery;      /* 1: /api/v1 or /apis/g/v */
    char group[128], version[32];
} route;

static int find_type(const char *group, const char *version, const char *plural)
{
    for (size_t i = 0; i < NTYPES; i++)
        if (!g_unserved[i] && !strcmp(DBL_TYPES[i].group, group) && !strcmp(DBL_TYPES[i].version, version) &&
            !strcmp(DBL_TYPES[i].plural, plural))
            return (int)i;
    return -1;
}

/* Parses /api/v1/... or /apis/g/v/... Returns 0 when routed, -1 otherwise. */
static int parse_route(const char *path, route *rt)
{
    memset(rt, 0, sizeof *rt);
    rt->res = -1;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    char *seg[12];
    int n = 0;
    char *save = NULL; /* strtok_r: requests are served on many threads */
    for (char *s = strtok_r(buf, "/", &save); s && n < 12; s = strtok_r(NULL, "/", &save)) seg[n++] = s;
    int i;
    if (n >= 2 && !strcmp(seg[0], "api")) {
        snprintf(rt->version, sizeof rt->version, "%s", seg[1]);
        i = 2;
    } else if (n >= 3 && !strcmp(seg[0], "apis")) {
        snprintf(rt->group, sizeof rt->group, "%s", seg[1]);
        snprintf(rt->version, sizeof rt->version, "%s", seg[2]);
        i = 3;
    } else {
        return -1;
    }
    int rest = n - i;
    if (rest == 0) { rt->discovery = 1; return 0; }
    /* /namespaces/{ns}/{plural}... (but /api/v1/namespaces/{name}[/status] is the namespace) */
    if (!strcmp(seg[i], "namespaces") && rest >= 3 && !(rest == 3 && (!strcmp(seg[i + 2], "status") ||
                                                                       !strcmp(seg[i + 2], "finalize")))) {
        snprintf(rt->ns, sizeof rt->ns, "%s", seg[i + 1]);
        i += 2;
        rest -= 2;
        rt->res = find_type(rt->group, rt->version, seg[i]);
        if (rt->res < 0 || !DBL_TYPES[rt->res].namespaced) return -1;
    } else {
        rt->res = find_type(rt->group, rt->version, seg[i]);
        if (rt->res < 0) return -1;
    }
    if (rest >= 2) snprintf(rt->name, sizeof rt->name, "%s", seg[i + 1]);
    if (rest >= 3) snprintf(rt->sub, sizeof rt->sub, "%s", seg[i + 2]);
    if (rest > 3) return -1;
    if (*rt->sub && strcmp(rt->sub, "status")) return -1;
    if (*rt->sub && !DBL_TYPES[rt->res].has_status) return -1;
    return 0;
}

/* ---- discovery ------------------------------------------------------------ */

static json_t *split_words(const char *s)
{
    json_t *a = json_array();
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL; /* strtok_r: requests are served on many threads */
    for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) json_array_append_new(a, json_string(w));
    return a;
}

static json_t *resource_list(const char *group, const char *version)
{
    json_t *res = json_array();
    char gv[160];
    int any = 0;
    for (size_t i = 0; i < NTYPES; i++) {
        const dbl_type *t = &DBL_TYPES[i];
        if (g_unserved[i] || strcmp(t->group, group) || strcmp(t->version, version)) continue;
        any = 1;
        json_t *r = json_pack("{s:s,s:s,s:b,s:s,s:o}", "name", t->plural, "singularName", t->singular, "namespaced",
                              t->namespaced, "kind", t->kind, "verbs", split_words(VERBS));
        if (*t->short_names) json_object_set_new(r, "shortNames", split_words(t->short_names));
        if (t->custom && !strcmp(t->group, "cozystack.io"))
            json_object_set_new(r, "categories", json_pack("[s]", "cozygpu"));
        json_array_append_new(res, r);
        if (t->has_status) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s/status", t->plural);
            json_array_append_new(res, json_pack("{s:s,s:s,s:b,s:s,s:o}", "name", sub, "singularName", "",
                                                 "namespaced", t->namespaced, "kind", t->kind, "verbs",
                                                 split_words("get patch update")));
        }
    }
    if (!any) { json_decref(res); return NULL; }
    if (*group) snprintf(gv, sizeof gv, "%s/%s", group, version);
    else snprintf(gv, sizeof gv, "%s", version);
    return json_pack("{s:s,s:s,s:s,s:o}", "kind", "APIResourceList", "apiVersion", "v1", "groupVersion", gv,
                     "resources", res);
}

/* The group's served versions in table order, the first preferred; NULL
 * when it serves none */
static json_t *api_group(const char *group)
{
    json_t *versions = json_array(), *preferred = NULL;
    for (size_t i = 0; i < NTYPES; i++) {
        const dbl_type *t = &DBL_TYPES[i];
        if (g_unserved[i] || strcmp(t->group, group)) continue;
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            if (!g_unserved[j] && !strcmp(DBL_TYPES[j].group, group) && !strcmp(DBL_TYPES[j].version, t->version)) seen = 1;
        if (seen) continue;
        char gv[160];
        snprintf(gv, sizeof gv, "%s/%s", t->group, t->version);
        json_t *v = json_pack("{s:s,s:s}", "groupVersion", gv, "version", t->version);
        if (!preferred) preferred = json_incref(v);
        json_array_append_new(versions, v);
    }
    if (!preferred) { json_decref(versions); return NULL; }
    return json_pack("{s:s,s:s,s:s,s:o,s:o}", "kind", "APIGroup", "apiVersion", "v1", "name", group,
                     "versions", versions, "preferredVersion", preferred);
}

/* OpenAPI v3, only as much as kubectl's field-validation check reads
 * (k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go): the root
 * lists each group-version's document; each document has, per resource, a
 * PATCH operation tagged with x-kubernetes-group-version-kind and taking the
 * fieldValidation query parameter. kubectl then leaves validation to the
 * server (fieldValidation=Strict), which the double does for custom
 * resources with a stored CRD. The schemas are those of the stored CRDs
 * only (components.schemas, tagged with x-kubernetes-group-version-kind as
 * the real server does), for `kubectl explain`; built-in kinds have none.
 * The PATCH operations name no strategic-merge request body, so kubectl
 * keeps JSON merge patch for custom resources and its built-in strategic
 * patch metadata for the rest. A document's hash follows its CRDs'
 * resourceVersions: kubectl caches documents by URL. */
static void openapi_hash(const char *gvpath, char *out, size_t n)
{
    unsigned long long h = 1469598103934665603ULL;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < NTYPES; i++) {
        const dbl_type *t = &DBL_TYPES[i];
        char k[200];
        if (!t->custom || !*t->group) continue;
        snprintf(k, sizeof k, "apis/%s/%s", t->group, t->version);
        if (strcmp(k, gvpath)) continue;
        snprintf(k, sizeof k, "%s.%s", t->plural, t->group);
        entry *e = store_find(T_CRDS, k);
        const char *rv = e ? meta_str(e->obj, "resourceVersion") : NULL;
        for (const char *c = rv ? rv : "-"; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        h = (h ^ '/') * 1099511628211ULL;
    }
    pthread_mutex_unlock(&g_lock);
    snprintf(out, n, "KUBEDOUBLE2-%016llx", h);
}

static json_t *openapi_root(void)
{
    json_t *paths = json_object();
    for (size_t i = 0; i < NTYPES; i++) {
        const dbl_type *t = &DBL_TYPES[i];
        char k[200], u[400], hash[64];
        if (*t->group) snprintf(k, sizeof k, "apis/%s/%s", t->group, t->version);
        else snprintf(k, sizeof k, "api/%s", t->version);
        openapi_hash(k, hash, sizeof hash);
        snprintf(u, sizeof u, "/openapi/v3/%s?hash=%s", k, hash);
        json_object_set_new(paths, k, json_pack("{s:s}", "serverRelativeURL", u));
    }
    return json_pack("{s:o}", "paths", paths);
}

static json_t *openapi_gv(const char *gvpath)
{
    json_t *paths = json_object(), *schemas = json_object();
    int any = 0;
    for (size_t i = 0; i < NTYPES; i++) {
        const dbl_type *t = &DBL_TYPES[i];
        char k[200], p[400];
        if (*t->group) snprintf(k, sizeof k, "apis/%s/%s", t->group, t->version);
        else snprintf(k, sizeof k, "api/%s", t->version);
        if (g_unserved[i] || strcmp(k, gvpath)) continue;
        any = 1;
        snprintf(p, sizeof p, "/%s/%s%s/{name}", k, t->namespaced ? "namespaces/{namespace}/" : "", t->plural);
        json_t *params = json_pack("[{s:s,s:s,s:{s:s,s:b}},{s:s,s:s,s:{s:s,s:b}},{s:s,s:s,s:{s:s,s:b}}]",
                                   "name", "dryRun", "in", "query", "schema", "type", "string", "uniqueItems", 1,
                                   "name", "fieldManager", "in", "query", "schema", "type", "string", "uniqueItems", 1,
                                   "name", "fieldValidation", "in", "query", "schema", "type", "string", "uniqueItems", 1);
        json_t *op = json_pack("{s:s,s:o,s:{s:s,s:s,s:s},s:{s:{s:s}}}", "operationId", t->plural, "parameters", params,
                               "x-kubernetes-group-version-kind", "group", t->group, "version", t->version, "kind",
                               t->kind, "responses", "200", "description", "OK");
        json_object_set_new(paths, p, json_pack("{s:o}", "patch", op));
        /* the stored CRD's schema, named as the real server names it
         * (the group's labels reversed: io.cozystack.v1alpha1.GPUClass) */
        pthread_mutex_lock(&g_lock);
        json_t *ver = crd_version(t);
        json_t *schema = json_object_get(json_object_get(ver, "schema"), "openAPIV3Schema");
        if (schema) {
            char name[300] = "", rev[200], *save = NULL;
            snprintf(rev, sizeof rev, "%s", t->group);
            char *labels[32];
            int nl = 0;
            for (char *l = strtok_r(rev, ".", &save); l && nl < 32; l = strtok_r(NULL, ".", &save)) labels[nl++] = l;
            for (int j = nl - 1; j >= 0; j--) {
                strncat(name, labels[j], sizeof name - strlen(name) - 1);
                strncat(name, ".", sizeof name - strlen(name) - 1);
            }
            snprintf(name + strlen(name), sizeof name - strlen(name), "%s.%s", t->version, t->kind);
            json_t *sc = json_deep_copy(schema);
            json_object_set_new(sc, "x-kubernetes-group-version-kind",
                                json_pack("[{s:s,s:s,s:s}]", "group", t->group, "version", t->version, "kind", t->kind));
            json_object_set_new(schemas, name, sc);
        }
        json_decref(ver);
        pthread_mutex_unlock(&g_lock);
    }
    if (!any) { json_decref(paths); json_decref(schemas); return NULL; }
    return json_pack("{s:s,s:{s:s,s:s},s:o,s:{s:o}}", "openapi", "3.0.0", "info", "title", "Kubernetes", "version",
                     "v1.32.0", "paths", paths, "components", "schemas", schemas);
}

static enum MHD_Result serve_discovery(rq *r)
{
    const char *p = r->path;
    if (!strcmp(p, "/openapi/v3")) return respond(r, 200, openapi_root());
    if (!strncmp(p, "/openapi/v3/", 12)) {
        json_t *doc = openapi_gv(p + 12);
        if (doc) return respond(r, 200, doc);
    }
    if (!strcmp(p, "/version") || !strcmp(p, "/version/"))
        return respond(r, 200, json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "major", "1", "minor", "32",
                                         "gitVersion", "v1.32.0", "gitCommit", "kube-double", "gitTreeState",
                                         "clean", "buildDate", "2024-12-11T00:00:00Z", "goVersion", "go1.23.3",
                                         "compiler", "gc", "platform", "linux/amd64"));
    if (!strcmp(p, "/api") || !strcmp(p, "/api/")) {
        return respond(r, 200, json_pack("{s:s,s:[s],s:[{s:s,s:s}]}", "kind", "APIVersions", "versions", "v1",
                                         "serverAddressByClientCIDRs", "clientCIDR", "0.0.0.0/0", "serverAddress",
                                         "127.0.0.1"));
    }
    if (!strcmp(p, "/apis") || !strcmp(p, "/apis/")) {
        json_t *groups = json_array();
        for (size_t i = 0; i < NTYPES; i++) {
            const dbl_type *t = &DBL_TYPES[i];
            if (!*t->group) continue;
            int seen = 0;
            for (size_t j = 0; j < i; j++) if (!strcmp(DBL_TYPES[j].group, t->group)) seen = 1;
            if (seen) continue;
            json_t *g = api_group(t->group);
            if (!g) continue;
            json_object_del(g, "kind");
            json_object_del(g, "apiVersion");
            json_array_append_new(groups, g);
        }
        return respond(r, 200, json_pack("{s:s,s:s,s:o}", "kind", "APIGroupList", "apiVersion", "v1", "groups", groups));
    }
    if (!strncmp(p, "/apis/", 6) && !strchr(p + 6, '/')) {
        json_t *g = api_group(p + 6);
        if (g) return respond(r, 200, g);
    }
    return MHD_NO;
}

/* ---- Table output for custom resources (apiextensions tableconvertor) ------ */

/* Human duration as k8s.io/apimachinery/pkg/util/duration.HumanDuration. */
static void human_duration(long s, char *b, size_t n)
{
    if (s < 0) s = 0;
    long m = s / 60, h = s / 3600, d = s / 86400, y = d / 365;
    if (s < 120) snprintf(b, n, "%lds", s);
    else if (m < 10) { if (s % 60) snprintf(b, n, "%ldm%lds", m, s % 60); else snprintf(b, n, "%ldm", m); }
    else if (h < 3) snprintf(b, n, "%ldm", m);
    else if (h < 8) { if (m % 60) snprintf(b, n, "%ldh%ldm", h, m % 60); else snprintf(b, n, "%ldh", h); }
    else if (h < 48) snprintf(b, n, "%ldh", h);
    else if (h < 192) { if (h % 24) snprintf(b, n, "%ldd%ldh", d, h % 24); else snprintf(b, n, "%ldd", d); }
    else if (y < 2) snprintf(b, n, "%ldd", d);
    else if (y < 8) { if (d % 365) snprintf(b, n, "%ldy%ldd", y, d % 365); else snprintf(b, n, "%ldy", y); }
    else snprintf(b, n, "%ldy", y);
}

/* Simple JSONPath `.a.b` (what printer columns use here) */
/* A printer column's JSONPath, as the API server evaluates it for a Table
 * (apiextensions' table convertor: the first result only, none is an empty
 * cell): .field steps, [N] indexes and [?(@.field=="value")] filters (also
 * with '...' quotes or !=), the forms CRDs use. A filter keeps the first
 * element that matches. Anything else finds nothing. */
static const json_t *json_path(const json_t *obj, const char *path)
{
    const json_t *cur = obj;
    const char *p = path, *end = path + strlen(path);
    if (*p == '{' && end > p && end[-1] == '}') p++, end--;
    if (p < end && *p == '$') p++;
    while (p < end && cur) {
        if (*p == '.') {
            p++;
            size_t n = strcspn(p, ".[");
            if (p + n > end) n = (size_t)(end - p);
            char key[256];
            if (n == 0 || n >= sizeof key) return NULL;
            memcpy(key, p, n);
            key[n] = 0;
            cur = json_object_get(cur, key);
            p += n;
        } else if (*p == '[' && p[1] == '?') {
            /* [?(@.a.b=="x")] */
            if (strncmp(p, "[?(@", 4) != 0 || !json_is_array(cur)) return NULL;
            const char *f = p + 4, *op = f;
            while (op < end && *op != '=' && *op != '!') op++;
            if (op + 2 >= end || op[1] != '=' || (op[2] != '"' && op[2] != '\'')) return NULL;
            char q = op[2];
            const char *v = op + 3, *ve = memchr(v, q, (size_t)(end - v));
            if (!ve || ve + 2 >= end + 0 || ve[1] != ')' || ve[2] != ']') return NULL;
            char field[256], want[256];
            if ((size_t)(op - f) >= sizeof field || (size_t)(ve - v) >= sizeof want) return NULL;
            snprintf(field, sizeof field, "%.*s", (int)(op - f), f);
            snprintf(want, sizeof want, "%.*s", (int)(ve - v), v);
            int negate = *op == '!';
            const json_t *found = NULL;
            size_t i;
            const json_t *el;
            json_array_foreach(cur, i, el) {
                const json_t *x = field[0] ? json_path(el, field) : el;
                int eq = x && json_is_string(x) && !strcmp(json_string_value(x), want);
                if (eq != negate) { found = el; break; }
            }
            cur = found;
            p = ve + 3;
        } else if (*p == '[') {
            char *e = NULL;
            long idx = strtol(p + 1, &e, 10);
            if (e == p + 1 || *e != ']' || !json_is_array(cur)) return NULL;
            if (idx < 0) idx += (long)json_array_size(cur);
            cur = idx < 0 ? NULL : json_array_get(cur, (size_t)idx);
            p = e + 1;
        } else {
            return NULL;
        }
    }
    return p == end ? cur : NULL;
}

static const char *NAME_DESC =
    "Name must be unique within a namespace. Is required when creating resources, although some resources may "
    "allow a client to request the generation of an appropriate name automatically. Name is primarily intended "
    "for creation idempotence and configuration definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

static json_t *table_columns(const json_t *cols)
{
    json_t *defs = json_array();
    json_array_append_new(defs, json_pack("{s:s,s:s,s:s,s:s,s:i}", "name", "Name", "type", "string", "format",
                                          "name", "description", NAME_DESC, "priority", 0));
    size_t i;
    json_t *c;
    json_array_foreach(cols, i, c) {
        json_array_append_new(defs, json_pack("{s:s,s:s,s:s,s:s,s:I}", "name",
                                              json_string_value(json_object_get(c, "name")) ?: "", "type",
                                              json_string_value(json_object_get(c, "type")) ?: "string", "format",
                                              json_string_value(json_object_get(c, "format")) ?: "", "description",
                                              json_string_value(json_object_get(c, "description")) ?: "",
                                              "priority", json_integer_value(json_object_get(c, "priority"))));
    }
    return defs;
}

static json_t *table_row(const json_t *cols, const json_t *obj)
{
    json_t *cells = json_array();
    json_array_append_new(cells, json_string(meta_str(obj, "name") ?: ""));
    size_t i;
    json_t *c;
    json_array_foreach(cols, i, c) {
        const char *type = json_string_value(json_object_get(c, "type")) ?: "string";
        const json_t *v = json_path(obj, json_string_value(json_object_get(c, "jsonPath")) ?: "");
        if (!v || json_is_null(v)) { json_array_append_new(cells, json_null()); continue; }
        if (!strcmp(type, "date") && json_is_string(v)) {
            struct tm tm = { 0 };
            char b[32];
            if (strptime(json_string_value(v), "%Y-%m-%dT%H:%M:%SZ", &tm)) {
                human_duration((long)(time(NULL) - timegm(&tm)), b, sizeof b);
                json_array_append_new(cells, json_string(b));
            } else {
                json_array_append_new(cells, json_string("<invalid>"));
            }
        } else if (!strcmp(type, "integer") && json_is_number(v)) {
            json_array_append_new(cells, json_integer((json_int_t)json_number_value(v)));
        } else if (!strcmp(type, "string") && !json_is_string(v)) {
            char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            json_array_append_new(cells, json_string(s));
            free(s);
        } else {
            json_array_append_new(cells, json_deep_copy(v));
        }
    }
    json_t *pom = json_pack("{s:s,s:s,s:O}", "kind", "PartialObjectMetadata", "apiVersion", "meta.k8s.io/v1",
                            "metadata", json_object_get(obj, "metadata"));
    return json_pack("{s:o,s:o}", "cells", cells, "object", pom);
}

static int wants_table(rq *r)
{
    const char *a = MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "Accept");
    return a && strstr(a, "as=Table") && strstr(a, "g=meta.k8s.io");
}

/* ---- authentication ------------------------------------------------------- */

static int client_cert_ok(rq *r)
{
    if (!opt.client_ca) return 0;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (!ci || !ci->tls_session) return 0;
    gnutls_session_t s = (gnutls_session_t)ci->tls_session;
    unsigned int n = 0;
    if (!gnutls_certificate_get_peers(s, &n) || n == 0) return 0;
    unsigned int status = 0;
    if (gnutls_certificate_verify_peers2(s, &status) < 0) return 0;
    return status == 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    size_t k;
    while ((k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    b[n] = '\0';
    if (len) *len = n;
    return b;
}

/* 1 when the request is authenticated (or no authentication is configured). */
static int authenticated(rq *r)
{
    if (!opt.token && !opt.token_file && !opt.client_ca) return 1;
    if (client_cert_ok(r)) return 1;
    char *want = NULL;
    if (opt.token_file) {
        want = read_file(opt.token_file, NULL);
        if (want) want[strcspn(want, "\r\n")] = '\0';
    } else if (opt.token) {
        want = strdup(opt.token);
    }
    const char *h = MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "Authorization");
    int ok = want && *want && h && !strncasecmp(h, "Bearer ", 7) && !strcmp(h + 7, want);
    free(want);
    return ok;
}

/* ---- list ------------------------------------------------------------------- */

/* Parsed selectors of a request; 0, or -1 after answering 400. */
static int selectors(rq *r, const dbl_type *t, dbl_selector **ls, dbl_selector **fs)
{
    char err[512];
    *ls = dbl_labels_parse(arg(r, "labelSelector"), err, sizeof err);
    if (!*ls) {
        char m[600];
        snprintf(m, sizeof m, "unable to parse requirement: %s", err);
        respond_status(r, err_bad_request(m));
        return -1;
    }
    *fs = dbl_fields_parse(arg(r, "fieldSelector"), t->fields, err, sizeof err);
    if (!*fs) {
        dbl_selector_free(*ls);
        respond_status(r, err_bad_request(err));
        return -1;
    }
    return 0;
}

static int in_scope(const json_t *obj, const char *ns)
{
    return !*ns || !strcmp(meta_str(obj, "namespace") ?: "", ns);
}

/* List items are sent without kind/apiVersion for built-in types (typed
 * lists), with them for custom resources (unstructured). */
static json_t *list_item(const dbl_type *t, const json_t *obj)
{
    if (t->custom) return json_incref((json_t *)obj);
    json_t *c = json_copy((json_t *)obj);
    json_object_del(c, "kind");
    json_object_del(c, "apiVersion");
    return c;
}

static const char *CONTINUE_EXPIRED =
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list.";

static enum MHD_Result serve_list(rq *r, const route *rt)
{
    const dbl_type *t = &DBL_TYPES[rt->res];
    dbl_selector *ls, *fs;
    if (selectors(r, t, &ls, &fs) < 0) return MHD_YES;
    const char *rvs = arg(r, "resourceVersion"), *match = arg(r, "resourceVersionMatch");
    const char *cont = arg(r, "continue"), *lim = arg(r, "limit");
    long limit = lim ? strtol(lim, NULL, 10) : 0;
    unsigned long long at = 0;
    char *start = NULL;   /* continue: keys strictly after this one */
    json_t *err = NULL;
    int ok;

    pthread_mutex_lock(&g_lock);
    if (cont && *cont) {
        size_t n;
        char *raw = b64_decode(cont, &n);
        json_t *tok = raw ? json_loadb(raw, n, JSON_ALLOW_NUL, NULL) : NULL;
        free(raw);
        const char *st = json_string_value(json_object_get(tok, "start"));
        if (!tok || !st || !json_is_integer(json_object_get(tok, "rv"))) {
            err = err_bad_request("continue key is not valid: invalid continue token");
        } else {
            at = (unsigned long long)json_integer_value(json_object_get(tok, "rv"));
            size_t sl = json_string_length(json_object_get(tok, "start"));
            start = strndup(st, sl && st[sl - 1] == '\0' ? sl - 1 : sl);
            if (at < g_floor) err = status_new(410, "Expired", CONTINUE_EXPIRED, NULL);
        }
        json_decref(tok);
    } else if (rvs && *rvs && strcmp(rvs, "0")) {
        unsigned long long want = parse_rv(rvs, &ok);
        if (!ok) {
            char m[300];
            snprintf(m, sizeof m, "Invalid value: \"%s\": resourceVersion: Invalid value", rvs);
            err = err_bad_request(m);
        } else if (match && !strcmp(match, "Exact")) {
            if (want < g_floor) err = err_expired(want, g_floor);
            else if (want > g_rv) {
                char m[200];
                snprintf(m, sizeof m, "Too large resource version: %llu, current: %llu", want, g_rv);
                err = status_new(504, "Timeout", m, json_pack("{s:[{s:s,s:s}],s:i}", "causes", "reason",
                                 "ResourceVersionTooLarge", "message", "Too large resource version",
                                 "retryAfterSeconds", 1));
            } else at = want;
        } else if (want > g_rv) {
            /* NotOlderThan a future revision: the real server waits up to 3 s */
            struct timespec dl;
            clock_gettime(CLOCK_MONOTONIC, &dl);
            dl.tv_sec += 3;
            while (want > g_rv && pthread_cond_timedwait(&g_cond, &g_lock, &dl) != ETIMEDOUT) {}
            if (want > g_rv) {
                char m[200];
                snprintf(m, sizeof m, "Too large resource version: %llu, current: %llu", want, g_rv);
                err = status_new(504, "Timeout", m, json_pack("{s:[{s:s,s:s}],s:i}", "causes", "reason",
                                 "ResourceVersionTooLarge", "message", "Too large resource version",
                                 "retryAfterSeconds", 1));
            }
        }
    }
    if (err) {
        pthread_mutex_unlock(&g_lock);
        free(start);
        dbl_selector_free(ls);
        dbl_selector_free(fs);
        return respond_status(r, err);
    }
    unsigned long long list_rv = at ? at : g_rv;
    json_t *state = state_at(rt->res, at);
    json_t *crd = wants_table(r) ? crd_version(t) : NULL;
    pthread_mutex_unlock(&g_lock);

    size_t nk = json_object_size(state), k = 0;
    const char **keys = malloc((nk ? nk : 1) * sizeof *keys);
    const char *key;
    json_t *obj;
    json_object_foreach(state, key, obj) keys[k++] = key;
    qsort(keys, nk, sizeof *keys, key_cmp);

    json_t *items = json_array();
    const char *last = NULL;
    size_t remaining = 0;
    int more = 0;
    for (size_t i = 0; i < nk; i++) {
        if (start && strcmp(keys[i], start) <= 0) continue;
        obj = json_object_get(state, keys[i]);
        if (!in_scope(obj, rt->ns) || !dbl_selector_match(ls, obj) || !dbl_selector_match(fs, obj)) continue;
        if (limit > 0 && (long)json_array_size(items) >= limit) {
            more = 1;
            remaining++;
            continue;
        }
        json_array_append_new(items, list_item(t, obj));
        last = keys[i];
    }
    json_t *meta = json_object();
    char rvb[32];
    snprintf(rvb, sizeof rvb, "%llu", list_rv);
    json_object_set_new(meta, "resourceVersion", json_string(rvb));
    if (more && last) {
        size_t ll = strlen(last);
        char *st = malloc(ll + 1);
        memcpy(st, last, ll);
        st[ll] = '\0';
        json_t *tok = json_pack("{s:s,s:I,s:o}", "v", "meta.k8s.io/v1", "rv", (json_int_t)list_rv, "start",
                                json_stringn(st, ll + 1));
        free(st);
        char *tj = json_dumps(tok, JSON_COMPACT);
        char *enc = b64_encode(tj, strlen(tj));
        json_object_set_new(meta, "continue", json_string(enc));
        free(enc);
        free(tj);
        json_decref(tok);
        /* remainingItemCount only when the count is exact: no selectors */
        if (!arg(r, "labelSelector") && !arg(r, "fieldSelector"))
            json_object_set_new(meta, "remainingItemCount", json_integer((json_int_t)remaining));
    }
    json_t *out;
    json_t *cols = crd ? json_object_get(crd, "additionalPrinterColumns") : NULL;
    if (cols) {
        json_t *rows = json_array();
        size_t i;
        json_array_foreach(items, i, obj) json_array_append_new(rows, table_row(cols, obj));
        out = json_pack("{s:s,s:s,s:o,s:o,s:o}", "kind", "Table", "apiVersion", "meta.k8s.io/v1", "metadata", meta,
                        "columnDefinitions", table_columns(cols), "rows", rows);
        json_decref(items);
    } else {
        char av[160], kind[160];
        snprintf(kind, sizeof kind, "%sList", t->kind);
        out = json_pack("{s:s,s:s,s:o,s:o}", "kind", kind, "apiVersion", api_version(t, av, sizeof av), "metadata",
                        meta, "items", items);
    }
    json_decref(crd);
    free(keys);
    free(start);
    json_decref(state);
    dbl_selector_free(ls);
    dbl_selector_free(fs);
    return respond(r, 200, out);
}

static enum MHD_Result serve_get(rq *r, const route *rt)
{
    const dbl_type *t = &DBL_TYPES[rt->res];
    char *key = make_key(rt->ns, rt->name);
    pthread_mutex_lock(&g_lock);
    entry *e = store_find(rt->res, key);
    json_t *obj = e ? json_incref(e->obj) : NULL;
    json_t *crd = obj && wants_table(r) ? crd_version(t) : NULL;
    pthread_mutex_unlock(&g_lock);
    free(key);
    if (!obj) return respond_status(r, err_not_found(t, rt->name));
    json_t *cols = crd ? json_object_get(crd, "additionalPrinterColumns") : NULL;
    if (cols) {
        json_t *meta = json_pack("{s:s}", "resourceVersion", meta_str(obj, "resourceVersion") ?: "");
        json_t *rows = json_pack("[o]", table_row(cols, obj));
        json_decref(obj);
        obj = json_pack("{s:s,s:s,s:o,s:o,s:o}", "kind", "Table", "apiVersion", "meta.k8s.io/v1", "metadata", meta,
                        "columnDefinitions", table_columns(cols), "rows", rows);
    }
    json_decref(crd);
    return respond(r, 200, obj);
}

/* ---- writes ---------------------------------------------------------------- */

static int is_dry_run(rq *r)
{
    const char *d = arg(r, "dryRun");
    return d && !strcmp(d, "All");
}

/* Copy of obj without metadata and status, for "did the spec change". */
static json_t *strip_meta_status(const json_t *obj)
{
    json_t *c = json_copy((json_t *)obj);
    json_object_del(c, "metadata");
    json_object_del(c, "status");
    return c;
}

/* Equal apart from metadata.resourceVersion. */
static int same_object(const json_t *a, const json_t *b)
{
    json_t *ca = json_deep_copy(a), *cb = json_deep_copy(b);
    json_object_del(meta_of(ca), "resourceVersion");
    json_object_del(meta_of(cb), "resourceVersion");
    int eq = json_equal(ca, cb);
    json_decref(ca);
    json_decref(cb);
    return eq;
}

/* Defaulting and pruning from the stored CRD (custom resources only).
 * Fills *warning (malloc'd) for fieldValidation=Warn, or returns a 400
 * Status for Strict when unknown fields were sent. Caller holds g_lock. */
static json_t *apply_schema(rq *r, const dbl_type *t, json_t *obj, char **warning)
{
    json_t *ver = crd_version(t);
    json_t *schema = json_object_get(json_object_get(ver, "schema"), "openAPIV3Schema");
    if (!schema) { json_decref(ver); return NULL; }
    json_t *unknown = json_array();
    dbl_schema_apply(schema, obj, unknown);
    json_decref(ver);
    json_t *err = NULL;
    const char *fv = arg(r, "fieldValidation");
    if (json_array_size(unknown)) {
        char m[2048] = "", w[2048] = "";   /* message; Warning header value (RFC 7234 quoted) */
        size_t i;
        json_t *u;
        json_array_foreach(unknown, i, u) {
            size_t l = strlen(m);
            snprintf(m + l, sizeof m - l, "%sunknown field \"%s\"", i ? ", " : "", json_string_value(u));
            size_t wl = strlen(w);
            snprintf(w + wl, sizeof w - wl, "%s299 - \"unknown field \\\"%s\\\"\"", i ? ", " : "", json_string_value(u));
        }
        if (fv && !strcmp(fv, "Strict")) {
            char full[2400];
            snprintf(full, sizeof full, "%s in version \"%s\" cannot be handled as a %s: strict decoding error: %s",
                     t->kind, t->version, t->kind, m);
            err = err_bad_request(full);
        } else if (!fv || !strcmp(fv, "Warn")) {
            *warning = strdup(w);
        }
    }
    json_decref(unknown);
    return err;
}

static void gc_run(void);

/* Type-specific state set on create (PrepareForCreate of each strategy). */
static void prepare_create(int res, json_t *obj)
{
    const dbl_type *t = &DBL_TYPES[res];
    if (res == T_NAMESPACES) {
        json_object_set_new(obj, "status", json_pack("{s:s}", "phase", "Active"));
        json_t *spec = json_object_get(obj, "spec");
        if (!json_is_object(spec)) json_object_set_new(obj, "spec", spec = json_object());
        if (!json_object_get(spec, "finalizers"))
            json_object_set_new(spec, "finalizers", json_pack("[s]", "kubernetes"));
    } else if (res == T_PODS) {
        char now[32];
        now_rfc3339(now, sizeof now);
        dbl_pod_normalize(obj);
        dbl_pod_prepare_create(obj, now);
    } else if (res == T_CRDS) {
        json_t *spec = json_object_get(obj, "spec");
        char now[32];
        now_rfc3339(now, sizeof now);
        const char *storage = "";
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(spec, "versions"), i, v)
            if (json_is_true(json_object_get(v, "storage"))) storage = json_string_value(json_object_get(v, "name"));
        json_object_set_new(obj, "status", json_pack(
            "{s:O,s:[{s:s,s:s,s:s,s:s,s:s},{s:s,s:s,s:s,s:s,s:s}],s:[s]}",
            "acceptedNames", json_object_get(spec, "names") ?: json_null(),
            "conditions", "type", "NamesAccepted", "status", "True", "lastTransitionTime", now, "reason",
            "NoConflicts", "message", "no conflicts found", "type", "Established", "status", "True",
            "lastTransitionTime", now, "reason", "InitialNamesAccepted", "message", "the initial names have been accepted",
            "storedVersions", storage ?: ""));
    } else if (t->has_status && res != T_NODES) {
        json_object_del(obj, "status");   /* status is set through /status only */
    }
}

static enum MHD_Result serve_create(rq *r, const route *rt, json_t *body)
{
    const dbl_type *t = &DBL_TYPES[rt->res];
    char av[160];
    api_version(t, av, sizeof av);
    const char *kind = json_string_value(json_object_get(body, "kind"));
    const char *bav = json_string_value(json_object_get(body, "apiVersion"));
    if (!kind || !*kind) {
        char *s = json_dumps(body, JSON_COMPACT), m[1200];
        snprintf(m, sizeof m, "Object 'Kind' is missing in '%.1000s'", s);
        free(s);
        json_decref(body);
        return respond_status(r, err_bad_request(m));
    }
    if (!bav || strcmp(bav, av) || strcmp(kind, t->kind)) {
        char m[600];
        snprintf(m, sizeof m, "the API version in the data (%s) does not match the expected API version (%s)",
                 bav ? bav : "", av);
        if (bav && !strcmp(bav, av))
            snprintf(m, sizeof m, "the kind in the data (%s) does not match the expected kind (%s)", kind, t->kind);
        json_decref(body);
        return respond_status(r, err_bad_request(m));
    }
    json_t *meta = meta_of(body);
    const char *bns = json_string_value(json_object_get(meta, "namespace"));
    if (t->namespaced) {
        if (bns && *bns && strcmp(bns, rt->ns)) {
            json_decref(body);
            return respond_status(r, err_bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
        json_object_set_new(meta, "namespace", json_string(rt->ns));
    } else {
        json_object_del(meta, "namespace");
    }
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *gen = json_string_value(json_object_get(meta, "generateName"));
    char genbuf[300];
    if ((!name || !*name) && gen && *gen) {
        static const char alpha[] = "bcdfghjklmnpqrstvwxz2456789";   /* utilrand.String */
        unsigned char rb[5];
        random_bytes(rb, 5);
        snprintf(genbuf, sizeof genbuf, "%.58s", gen);
        size_t l = strlen(genbuf);
        for (int i = 0; i < 5; i++) genbuf[l + (size_t)i] = alpha[rb[i] % (sizeof alpha - 1)];
        genbuf[l + 5] = '\0';
        json_object_set_new(meta, "name", json_string(genbuf));
        name = json_string_value(json_object_get(meta, "name"));
    }
    if (!name || !*name) {
        json_decref(body);
        return respond_status(r, err_invalid(t, "", "metadata.name", "Required value", "FieldValueRequired",
                                             "name or generateName is required"));
    }
    char uid[37], now[32];
    new_uid(uid);
    now_rfc3339(now, sizeof now);
    json_object_set_new(meta, "uid", json_string(uid));
    json_object_set_new(meta, "creationTimestamp", json_string(now));
    json_object_del(meta, "resourceVersion");
    json_object_del(meta, "deletionTimestamp");
    json_object_del(meta, "deletionGracePeriodSeconds");
    json_object_del(meta, "managedFields");
    if (t->custom || rt->res == T_CRDS) json_object_set_new(meta, "generation", json_integer(1));
    else json_object_del(meta, "generation");
    prepare_create(rt->res, body);

    char *key = make_key(rt->ns, name), *warning = NULL;
    json_t *err = NULL, *out = NULL;
    pthread_mutex_lock(&g_lock);
    if (t->namespaced) {
        entry *nse = store_find(T_NAMESPACES, rt->ns);
        if (!nse) err = err_not_found(&DBL_TYPES[T_NAMESPACES], rt->ns);
        else if (meta_str(nse->obj, "deletionTimestamp")) {
            char m[400];
            snprintf(m, sizeof m, "%s \"%s\" is forbidden: unable to create new content in namespace %s because it is being terminated",
                     t->plural, name, rt->ns);
            err = status_new(403, "Forbidden", m, details_of(t, name));
        }
    }
    if (!err && t->custom) err = apply_schema(r, t, body, &warning);
    if (!err) {
        /* ValidateObjectMeta comes first in every strategy's Validate */
        json_t *causes = dbl_meta_validate(body);
        if (rt->res == T_PODS) {
            json_t *pc = dbl_pod_validate_create(body);
            json_array_extend(causes, pc);
            json_decref(pc);
        }
        if (json_array_size(causes)) err = err_invalid_causes(t, name, causes);
        else json_decref(causes);
    }
    if (!err && store_find(rt->res, key)) err = err_already_exists(t, name);
    if (!err) {
        if (is_dry_run(r)) out = json_incref(body);
        else {
            commit(rt->res, key, "ADDED", json_incref(body));
            out = json_incref(body);
            gc_run();
        }
    }
    pthread_mutex_unlock(&g_lock);
    free(key);
    json_decref(body);
    if (err) { free(warning); return respond_status(r, err); }
    enum MHD_Result rc = respond_ex(r, 201, out, NULL, warning);
    free(warning);
    return rc;
}

/* The core of PUT and PATCH: `obj` (stolen) is the desired object. Answers. */
static enum MHD_Result do_update(rq *r, const route *rt, json_t *obj, json_t *current_seen, int *retry)
{
    const dbl_type *t = &DBL_TYPES[rt->res];
    int status_only = *rt->sub != 0;
    char *key = make_key(rt->ns, rt->name), *warning = NULL;
    json_t *err = NULL, *out = NULL;
    const char *bname = meta_str(obj, "name");
    if (bname && *bname && strcmp(bname, rt->name)) {
        char m[700];
        snprintf(m, sizeof m, "the name of the object (%s) does not match the name on the URL (%s)", bname, rt->name);
        free(key);
        json_decref(obj);
        return respond_status(r, err_bad_request(m));
    }
    pthread_mutex_lock(&g_lock);
    entry *e = store_find(rt->res, key);
    if (!e) {
        err = err_not_found(t, rt->name);
    } else if (current_seen && e->obj != current_seen) {
        /* a write slipped in between the patch's read and now: retry like
         * the API server's patch loop does (the caller re-applies) */
        err = json_string("retry");
    } else {
        const char *want_rv = meta_str(obj, "resourceVersion");
        const char *cur_rv = meta_str(e->obj, "resourceVersion");
        if (want_rv && *want_rv && strcmp(want_rv, cur_rv))
            err = err_conflict(t, rt->name, "the object has been modified; please apply your changes to the latest version and try again");
    }
    if (!err) {
        json_t *cur = e->obj, *next;
        if (status_only) {
            next = json_deep_copy(cur);
            json_t *st = json_object_get(obj, "status");
            if (st) json_object_set(next, "status", st);
            else json_object_del(next, "status");
        } else {
            next = json_incref(obj);
            json_t *m = meta_of(next), *cm = json_object_get(cur, "metadata");
            static const char *keep[] = { "uid", "creationTimestamp", "generation", "deletionTimestamp",
                                          "deletionGracePeriodSeconds", "namespace", "name" };
            for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
                json_t *v = json_object_get(cm, keep[i]);
                if (v) json_object_set(m, keep[i], v);
                else json_object_del(m, keep[i]);
            }
            json_object_del(m, "managedFields");
            if (t->has_status && rt->res != T_NAMESPACES) {
                json_t *st = json_object_get(cur, "status");
                if (st) json_object_set(next, "status", st);
                else json_object_del(next, "status");
            }
            if (json_object_get(next, "kind") == NULL) json_object_set(next, "kind", json_object_get(cur, "kind"));
            if (json_object_get(next, "apiVersion") == NULL)
                json_object_set(next, "apiVersion", json_object_get(cur, "apiVersion"));
            if (t->custom) err = apply_schema(r, t, next, &warning);
            if (rt->res == T_PODS) dbl_pod_normalize(next);
            if (!err) {
                /* ValidateObjectMetaUpdate (ownerReferences, finalizers), then the pod's rules */
                json_t *causes = dbl_meta_validate(next);
                if (rt->res == T_PODS) {
                    json_t *pc = dbl_pod_validate_update(next, cur);
                    json_array_extend(causes, pc);
                    json_decref(pc);
                }
                if (rt->res == T_SECRETS || rt->res == T_CONFIGMAPS)
                    immutable_causes(causes, rt->res == T_SECRETS, next, cur);
                if (json_array_size(causes)) err = err_invalid_causes(t, rt->name, causes);
                else json_decref(causes);
            }
            if (!err && (t->custom || rt->res == T_CRDS)) {
                json_t *a = strip_meta_status(cur), *b = strip_meta_status(next);
                if (!json_equal(a, b))
                    json_object_set_new(m, "generation",
                                        json_integer(json_integer_value(json_object_get(cm, "generation")) + 1));
                json_decref(a);
                json_decref(b);
            }
        }
        if (err) {
            json_decref(next);
        } else if (same_object(next, cur)) {
            out = json_incref(cur);      /* no-op: no new revision, no event */
            json_decref(next);
        } else if (is_dry_run(r)) {
            out = next;
        } else {
            json_t *fin = json_object_get(meta_of(next), "finalizers");
            int gone = meta_str(next, "deletionTimestamp") && json_array_size(fin) == 0;
            /* store.go: an update emptying the finalizers of an object being
             * deleted is not written (errEmptiedFinalizers) but deletes the
             * key, so watchers get DELETED with the last stored state */
            if (gone) commit(rt->res, key, "DELETED", json_deep_copy(cur));
            else commit(rt->res, key, "MODIFIED", json_incref(next));
            out = next;
            gc_run();
        }
    }
    pthread_mutex_unlock(&g_lock);
    free(key);
    json_decref(obj);
    if (err) {
        free(warning);
        if (json_is_string(err)) { json_decref(err); *retry = 1; return MHD_YES; }
        return respond_status(r, err);
    }
    enum MHD_Result rc = respond_ex(r, 200, out, NULL, warning);
    free(warning);
    return rc;
}

static enum MHD_Result serve_patch(rq *r, const route *rt, const char *body, size_t len)
{
    const dbl_type *t = &DBL_TYPES[rt->res];
    const char *ct = MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, "Content-Type");
    int kindp = 0;   /* 1 merge, 2 strategic, 3 json patch */
    if (ct && !strncmp(ct, "application/merge-patch+json", 28)) kindp = 1;
    else if (ct && !strncmp(ct, "application/strategic-merge-patch+json", 38)) kindp = 2;
    else if (ct && !strncmp(ct, "application/json-patch+json", 27)) kindp = 3;
    if (!kindp || (kindp == 2 && t->custom)) {
        char m[400];
        snprintf(m, sizeof m, "the body of the request was in an unknown format - accepted media types include: "
                 "application/json-patch+json, application/merge-patch+json%s",
                 t->custom ? ", application/apply-patch+yaml" : ", application/apply-patch+yaml, application/strategic-merge-patch+json");
        return respond(r, 415, status_new(415, "UnsupportedMediaType", m, NULL));
    }
    json_error_t je;
    json_t *patch = json_loadb(body, len, 0, &je);
    if (!patch) {
        char m[400];
        snprintf(m, sizeof m, "error decoding patch: %s", je.text);
        return respond_status(r, err_bad_request(m));
    }
    for (int attempt = 0; attempt < 5; attempt++) {
        char *key = make_key(rt->ns, rt->name);
        pthread_mutex_lock(&g_lock);
        entry *e = store_find(rt->res, key);
        json_t *cur = e ? json_incref(e->obj) : NULL;
        pthread_mutex_unlock(&g_lock);
        free(key);
        if (!cur) { json_decref(patch); return respond_status(r, err_not_found(t, rt->name)); }
        json_t *next;
        char err[600];
        if (kindp == 3) next = dbl_json_patch(cur, patch, err, sizeof err);
        else if (kindp == 2 && rt->res == T_PODS) next = dbl_strategic_patch_pod(cur, patch);
        else next = dbl_merge_patch(cur, patch, kindp == 2);
        if (!next) {
            json_decref(cur);
            json_decref(patch);
            return respond(r, 422, status_new(422, "Invalid", err, NULL));
        }
        /* the patch result carries the current rv unless the patch set one
         * (a precondition): do_update compares it */
        int retry = 0;
        enum MHD_Result rc = do_update(r, rt, next, cur, &retry);
        json_decref(cur);
        if (!retry) { json_decref(patch); return rc; }
    }
    json_decref(patch);
    return respond(r, 500, status_new(500, "InternalError", "patch retries exhausted", NULL));
}

/* The object with finalizers `fin` (stolen; dropped from metadata when
 * empty), committed as MODIFIED, or DELETED when it is being deleted and no
 * finalizer is left (the registry's update path). Caller holds g_lock. */
static void write_finalizers(int res, const char *key, json_t *next /* stolen */, json_t *fin)
{
    json_t *m = meta_of(next);
    if (json_array_size(fin)) json_object_set_new(m, "finalizers", fin);
    else { json_decref(fin); json_object_del(m, "finalizers"); }
    int gone = json_object_get(m, "deletionTimestamp") && !json_object_get(m, "finalizers");
    if (gone) {
        /* errEmptiedFinalizers: deleted as last stored (see do_update) */
        entry *e = store_find(res, key);
        commit(res, key, "DELETED", json_deep_copy(e->obj));
        json_decref(next);
    } else {
        commit(res, key, "MODIFIED", next);
    }
}

static int same_strings(const json_t *a, const json_t *b)
{
    if (json_array_size(a) != json_array_size(b)) return 0;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        int found = 0;
        size_t j;
        json_t *w;
        json_array_foreach(b, j, w) if (json_equal(v, w)) found = 1;
        if (!found) return 0;
    }
    return 1;
}

/* Deletes the object at key (caller holds g_lock) as the generic registry's
 * Delete does: preconditions, then the finalizers the deletion options ask
 * for (dbl_gc_finalizers; namespaces excepted, they go at once with their
 * content); an object left with finalizers gets a deletionTimestamp and
 * stays, one already being deleted only has its orphan/foregroundDeletion
 * finalizers switched (and goes when none is left). dry: store nothing.
 * Returns the answer body and sets *code. */
static json_t *delete_locked(int dry, int res, const char *key, const char *name, const json_t *opts, int *code)
{
    const dbl_type *t = &DBL_TYPES[res];
    entry *e = store_find(res, key);
    *code = 200;
    if (!e) { *code = 404; return err_not_found(t, name); }
    const json_t *pre = json_object_get(opts, "preconditions");
    const char *puid = json_string_value(json_object_get(pre, "uid"));
    const char *prv = json_string_value(json_object_get(pre, "resourceVersion"));
    if (puid && strcmp(puid, meta_str(e->obj, "uid") ?: "")) {
        char m[300];
        snprintf(m, sizeof m, "Precondition failed: UID in precondition: %s, UID in object meta: %s", puid,
                 meta_str(e->obj, "uid") ?: "");
        *code = 409;
        return err_conflict(t, name, m);
    }
    if (prv && strcmp(prv, meta_str(e->obj, "resourceVersion") ?: "")) {
        char m[300];
        snprintf(m, sizeof m, "Precondition failed: ResourceVersion in precondition: %s, ResourceVersion in object meta: %s",
                 prv, meta_str(e->obj, "resourceVersion") ?: "");
        *code = 409;
        return err_conflict(t, name, m);
    }
    json_t *fin = json_object_get(json_object_get(e->obj, "metadata"), "finalizers");
    json_t *nfin = res == T_NAMESPACES ? json_array() : dbl_gc_finalizers(fin, opts);
    if (res != T_NAMESPACES && (json_array_size(nfin) > 0 || meta_str(e->obj, "deletionTimestamp"))) {
        if (meta_str(e->obj, "deletionTimestamp") && same_strings(fin, nfin)) {
            json_decref(nfin);
            return json_incref(e->obj);
        }
        json_t *next = json_deep_copy(e->obj);
        if (!meta_str(next, "deletionTimestamp")) {
            char now[32];
            now_rfc3339(now, sizeof now);
            json_object_set_new(meta_of(next), "deletionTimestamp", json_string(now));
            json_object_set_new(meta_of(next), "deletionGracePeriodSeconds", json_integer(0));
        }
        if (json_array_size(nfin) > 0) {
            json_object_set(meta_of(next), "finalizers", nfin);
            if (!dry) commit(res, key, "MODIFIED", json_incref(next));
            json_decref(nfin);
            return next;
        }
        /* being deleted and the options took its last finalizer: it goes */
        json_decref(next);
    }
    json_decref(nfin);
    json_t *last = json_deep_copy(e->obj);
    if (res == T_NAMESPACES && !dry) {
        /* the namespace controller's job, done at once: delete its content */
        for (size_t ti = 0; ti < NTYPES; ti++) {
            if (!DBL_TYPES[ti].namespaced) continue;
            for (size_t i = g_store[ti].n; i-- > 0;) {
                entry *c = &g_store[ti].v[i];
                if (strcmp(meta_str(c->obj, "namespace") ?: "", name)) continue;
                char *ck = strdup(c->key);
                commit((int)ti, ck, "DELETED", json_deep_copy(c->obj));
                free(ck);
            }
        }
    }
    if (!dry) commit(res, key, "DELETED", json_incref(last));
    if (t->return_deleted) return last;
    json_t *d = details_of(t, name);
    json_object_set_new(d, "uid", json_string(meta_str(last, "uid") ?: ""));
    json_decref(last);
    return json_pack("{s:s,s:s,s:{},s:s,s:o}", "kind", "Status", "apiVersion", "v1", "metadata", "status", "Success",
                     "details", d);
}

/* ---- garbage collection (kube-controller-manager's collector, in-process) ----
 *
 * pkg/controller/garbagecollector (v1.32): garbagecollector.go
 * (attemptToDeleteItem, isDangling, classifyReferences,
 * processDeletingDependentsItem, attemptToOrphanWorker) and
 * graph_builder.go. The double runs it synchronously: after every write
 * that changed the store, gc_run() repeats single collector steps until
 * none applies, before the request's lock is released and before it is
 * answered. Every step is an ordinary write (MODIFIED or DELETED event with
 * its own resourceVersion), so watchers see the same sequence as from a real
 * cluster once its collector ran; only the delay is gone. */

/* The served type of an ownerReference's apiVersion and kind (the
 * collector's RESTMapper), or -1 when the double does not serve it. */
static int ref_type(const json_t *ref)
{
    const char *av = json_string_value(json_object_get(ref, "apiVersion")) ?: "";
    const char *kind = json_string_value(json_object_get(ref, "kind")) ?: "";
    char b[200];
    for (size_t i = 0; i < NTYPES; i++)
        if (!strcmp(DBL_TYPES[i].kind, kind) && !strcmp(api_version(&DBL_TYPES[i], b, sizeof b), av)) return (int)i;
    return -1;
}

static int has_finalizer(const json_t *obj, const char *f)
{
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(json_object_get(obj, "metadata"), "finalizers"), i, v)
        if (!strcmp(json_string_value(v) ?: "", f)) return 1;
    return 0;
}

/* The dependents of the object with uid `uid`: objects naming it in an
 * ownerReference (the collector's graph links by uid). blocking: only
 * those whose reference has blockOwnerDeletion: true. Returns 1 if any. */
static int has_dependents(const char *uid, int blocking)
{
    for (size_t ti = 0; ti < NTYPES; ti++)
        for (size_t i = 0; i < g_store[ti].n; i++) {
            size_t j;
            json_t *ref;
            json_array_foreach(json_object_get(json_object_get(g_store[ti].v[i].obj, "metadata"), "ownerReferences"), j, ref)
                if (!strcmp(json_string_value(json_object_get(ref, "uid")) ?: "", uid) &&
                    (!blocking || json_is_true(json_object_get(ref, "blockOwnerDeletion")))) return 1;
        }
    return 0;
}

/* 1 when a dependent of `uid` is itself waiting on its foreground deletion
 * (node.isDeletingDependents of one of the graph's dependents). */
static int dependent_deleting_dependents(const char *uid)
{
    for (size_t ti = 0; ti < NTYPES; ti++)
        for (size_t i = 0; i < g_store[ti].n; i++) {
            const json_t *o = g_store[ti].v[i].obj;
            if (!meta_str(o, "deletionTimestamp") || !has_finalizer(o, DBL_FINALIZER_FOREGROUND)) continue;
            size_t j;
            json_t *ref;
            json_array_foreach(json_object_get(json_object_get(o, "metadata"), "ownerReferences"), j, ref)
                if (!strcmp(json_string_value(json_object_get(ref, "uid")) ?: "", uid)) return 1;
        }
    return 0;
}

/* A copy of obj without the ownerReferences whose uid is a key of `uids`
 * (the collector's delete-owner-reference patch); the field goes when empty. */
static json_t *without_refs(const json_t *obj, const json_t *uids)
{
    json_t *next = json_deep_copy(obj), *m = meta_of(next), *keep = json_array();
    size_t i;
    json_t *ref;
    json_array_foreach(json_object_get(m, "ownerReferences"), i, ref)
        if (!json_object_get(uids, json_string_value(json_object_get(ref, "uid")) ?: "")) json_array_append(keep, ref);
    if (json_array_size(keep)) json_object_set_new(m, "ownerReferences", keep);
    else { json_decref(keep); json_object_del(m, "ownerReferences"); }
    return next;
}

static json_t *g_gc_reported;   /* "dependent uid/owner uid" already reported */

/* The graph builder's reportInvalidNamespaceOwnerRef: when the owner named
 * by `ref` (a namespaced kind, type ot) exists under that uid in another
 * namespace than the dependent `dep` (of type res), a Warning Event
 * OwnerRefInvalidNamespace about the dependent, from
 * garbage-collector-controller, in the dependent's namespace ("default"
 * for a cluster-scoped one), once per dependent and owner. Returns 1 when
 * it wrote one. Caller holds g_lock. */
static int gc_report_namespace(int res, const json_t *dep, int ot, const json_t *ref)
{
    const char *ruid = json_string_value(json_object_get(ref, "uid")) ?: "";
    const char *ns = meta_str(dep, "namespace") ?: "";
    const char *duid = meta_str(dep, "uid") ?: "";
    int elsewhere = 0;
    /* uids are unique: an owner found in the dependent's own namespace with
     * that uid is nowhere else (the walk below is for dangling references) */
    char *own = make_key(ns, json_string_value(json_object_get(ref, "name")) ?: "");
    entry *here = store_find(ot, own);
    free(own);
    if (here && !strcmp(meta_str(here->obj, "uid") ?: "", ruid)) return 0;
    for (size_t i = 0; i < g_store[ot].n && !elsewhere; i++) {
        const json_t *o = g_store[ot].v[i].obj;
        if (!strcmp(meta_str(o, "uid") ?: "", ruid) && strcmp(meta_str(o, "namespace") ?: "", ns)) elsewhere = 1;
    }
    if (!elsewhere) return 0;
    char rk[200];
    snprintf(rk, sizeof rk, "%.90s/%.90s", duid, ruid);
    if (!g_gc_reported) g_gc_reported = json_object();
    if (json_object_get(g_gc_reported, rk)) return 0;
    json_object_set_new(g_gc_reported, rk, json_true());
    const dbl_type *dt = &DBL_TYPES[res];
    char av[160], now[32], name[400], msg[1200];
    now_rfc3339(now, sizeof now);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(name, sizeof name, "%s.%llx", meta_str(dep, "name") ?: "",
             (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    /* objectReference.String(): [apiVersion/kind, namespace: ns, name: n, uid: u], ns being the dependent's */
    snprintf(msg, sizeof msg, "ownerRef [%s/%s, namespace: %s, name: %s, uid: %s] does not exist in namespace \"%s\"",
             json_string_value(json_object_get(ref, "apiVersion")) ?: "", json_string_value(json_object_get(ref, "kind")) ?: "",
             ns, json_string_value(json_object_get(ref, "name")) ?: "", ruid, ns);
    const char *evns = *ns ? ns : "default";
    json_t *inv = json_pack("{s:s,s:s,s:s,s:s}", "kind", dt->kind, "apiVersion", api_version(dt, av, sizeof av),
                            "name", meta_str(dep, "name") ?: "", "uid", duid);
    if (*ns) json_object_set_new(inv, "namespace", json_string(ns));
    char uid[37];
    new_uid(uid);
    json_t *ev = json_pack("{s:s,s:s,s:{s:s,s:s,s:s,s:s},s:o,s:s,s:s,s:{s:s},s:s,s:s,s:i,s:s}",
                           "apiVersion", "v1", "kind", "Event",
                           "metadata", "name", name, "namespace", evns, "uid", uid, "creationTimestamp", now,
                           "involvedObject", inv, "reason", "OwnerRefInvalidNamespace", "message", msg,
                           "source", "component", "garbage-collector-controller",
                           "firstTimestamp", now, "lastTimestamp", now, "count", 1, "type", "Warning");
    char *key = make_key(evns, name);
    commit(T_EVENTS, key, "ADDED", ev);
    free(key);
    return 1;
}

/* One collector step on the stored object (res, e); returns 1 when it wrote. */
static int gc_step(int res, entry *e)
{
    const json_t *obj = e->obj, *m = json_object_get(obj, "metadata");
    const char *uid = meta_str(obj, "uid") ?: "";
    char *key = strdup(e->key);
    int wrote = 0;
    if (json_object_get(m, "deletionTimestamp")) {
        if (has_finalizer(obj, DBL_FINALIZER_ORPHAN)) {
            /* attemptToOrphanWorker: drop the reference from every dependent,
             * then the owner's orphan finalizer */
            json_t *uids = json_pack("{s:b}", uid, 1);
            for (size_t ti = 0; ti < NTYPES; ti++)
                for (size_t i = 0; i < g_store[ti].n; i++) {
                    entry *d = &g_store[ti].v[i];
                    int names = 0;
                    size_t j;
                    json_t *ref;
                    json_array_foreach(json_object_get(json_object_get(d->obj, "metadata"), "ownerReferences"), j, ref)
                        if (!strcmp(json_string_value(json_object_get(ref, "uid")) ?: "", uid)) names = 1;
                    if (names) commit((int)ti, d->key, "MODIFIED", without_refs(d->obj, uids));
                }
            json_decref(uids);
            e = store_find(res, key);
            json_t *next = json_deep_copy(e->obj), *fin = json_array();
            size_t i;
            json_t *f;
            json_array_foreach(json_object_get(meta_of(next), "finalizers"), i, f)
                if (strcmp(json_string_value(f) ?: "", DBL_FINALIZER_ORPHAN)) json_array_append(fin, f);
            write_finalizers(res, key, next, fin);
            wrote = 1;
        } else if (has_finalizer(obj, DBL_FINALIZER_FOREGROUND) && !has_dependents(uid, 1)) {
            /* processDeletingDependentsItem: no blocking dependent is left */
            json_t *next = json_deep_copy(obj), *fin = json_array();
            size_t i;
            json_t *f;
            json_array_foreach(json_object_get(meta_of(next), "finalizers"), i, f)
                if (strcmp(json_string_value(f) ?: "", DBL_FINALIZER_FOREGROUND)) json_array_append(fin, f);
            write_finalizers(res, key, next, fin);
            wrote = 1;
        }
        /* otherwise: being deleted is a one-way trip; nothing to collect */
        free(key);
        return wrote;
    }
    const json_t *refs = json_object_get(m, "ownerReferences");
    if (!json_array_size(refs)) { free(key); return 0; }
    const char *ns = meta_str(obj, "namespace");
    int solid = 0, dangling = 0, waiting = 0;
    json_t *drop = json_object();   /* uids of dangling and waiting owners */
    size_t i;
    json_t *ref;
    json_array_foreach(refs, i, ref) {
        int ot = ref_type(ref);
        if (ot < 0) { json_decref(drop); free(key); return 0; }   /* restMappingError: retried forever */
        if (DBL_TYPES[ot].namespaced && gc_report_namespace(res, obj, ot, ref)) {
            json_decref(drop);                                     /* the store moved: start over */
            free(key);
            return 1;
        }
        if (DBL_TYPES[ot].namespaced && !DBL_TYPES[res].namespaced) {
            json_decref(drop);                                     /* namespacedOwnerOfClusterScopedObjectErr */
            free(key);
            return 0;
        }
        char *ok = make_key(DBL_TYPES[ot].namespaced ? ns : NULL, json_string_value(json_object_get(ref, "name")) ?: "");
        entry *owner = store_find(ot, ok);
        free(ok);
        const char *ruid = json_string_value(json_object_get(ref, "uid")) ?: "";
        if (!owner || strcmp(meta_str(owner->obj, "uid") ?: "", ruid)) {
            dangling++;
            json_object_set_new(drop, ruid, json_true());
        } else if (meta_str(owner->obj, "deletionTimestamp") && has_finalizer(owner->obj, DBL_FINALIZER_FOREGROUND)) {
            waiting++;
            json_object_set_new(drop, ruid, json_true());
        } else {
            solid++;
        }
    }
    if (solid) {
        if (dangling || waiting) {
            commit(res, key, "MODIFIED", without_refs(obj, drop));
            wrote = 1;
        }
    } else {
        const char *policy;
        if (waiting && has_dependents(uid, 0) && dependent_deleting_dependents(uid)) {
            /* the collector's cycle guard: an owner and a dependent both wait
             * on foreground deletion, so this object's blocking references
             * become non-blocking (unblockOwnerReferences) before it goes */
            json_t *next = json_deep_copy(obj);
            size_t k;
            json_t *r2;
            json_array_foreach(json_object_get(meta_of(next), "ownerReferences"), k, r2)
                if (json_is_true(json_object_get(r2, "blockOwnerDeletion")))
                    json_object_set_new(r2, "blockOwnerDeletion", json_false());
            if (!json_equal(next, obj)) {
                commit(res, key, "MODIFIED", next);
                json_decref(drop);
                free(key);
                return 1;
            }
            json_decref(next);
        }
        if (waiting && has_dependents(uid, 0)) policy = "Foreground";
        else if (has_finalizer(obj, DBL_FINALIZER_ORPHAN)) policy = "Orphan";
        else if (has_finalizer(obj, DBL_FINALIZER_FOREGROUND)) policy = "Foreground";
        else policy = "Background";
        json_t *opts = json_pack("{s:s,s:{s:s}}", "propagationPolicy", policy, "preconditions", "uid", uid);
        int code;
        json_decref(delete_locked(0, res, key, meta_str(obj, "name") ?: "", opts, &code));
        json_decref(opts);
        wrote = code == 200;
    }
    json_decref(drop);
    free(key);
    return wrote;
}

/* Runs collector steps until none applies (caller holds g_lock). */
static void gc_run(void)
{
    for (long guard = 0; g_gc_objs > 0 && guard < 1000000; guard++) {
        int wrote = 0;
        for (size_t ti = 0; ti < NTYPES && !wrote; ti++)
            for (size_t i = 0; i < g_store[ti].n && !wrote; i++)
                if (gc_relevant(g_store[ti].v[i].obj)) wrote = gc_step((int)ti, &g_store[ti].v[i]);
        if (!wrote) break;
    }
}

static const dbl_type DELETE_OPTIONS = { "meta.k8s.io", "v1", "deleteoptions", "deleteoptions", "DeleteOptions", 0, "", 0, 0, 0, "" };

/* The request's DeleteOptions: the body when there is one, else the query
 * (handlers/delete.go decodes one or the other). Returns a new object, or
 * NULL after answering 400/422 (*rc set). */
static json_t *delete_options(rq *r, const char *body, size_t len, enum MHD_Result *rc)
{
    json_t *opts;
    if (len) {
        json_error_t je;
        opts = json_loadb(body, len, 0, &je);
        if (!json_is_object(opts)) {
            json_decref(opts);
            char m[300];
            snprintf(m, sizeof m, "the object provided is unrecognized: %s", je.text);
            *rc = respond_status(r, err_bad_request(m));
            return NULL;
        }
    } else {
        opts = json_object();
        const char *pp = arg(r, "propagationPolicy"), *od = arg(r, "orphanDependents");
        if (pp) json_object_set_new(opts, "propagationPolicy", json_string(pp));
        if (od) json_object_set_new(opts, "orphanDependents", json_boolean(!strcmp(od, "true") || !strcmp(od, "1")));
    }
    json_t *causes = dbl_delete_options_validate(opts);
    if (json_array_size(causes)) {
        json_decref(opts);
        *rc = respond_status(r, err_invalid_causes(&DELETE_OPTIONS, "", causes));
        return NULL;
    }
    json_decref(causes);
    return opts;
}

static enum MHD_Result serve_delete(rq *r, const route *rt, const char *body, size_t len)
{
    enum MHD_Result rc;
    json_t *opts = delete_options(r, body, len, &rc);
    if (!opts) return rc;
    char *key = make_key(rt->ns, rt->name);
    int code;
    pthread_mutex_lock(&g_lock);
    json_t *out = delete_locked(is_dry_run(r), rt->res, key, rt->name, opts, &code);
    if (code == 200 && !is_dry_run(r)) gc_run();
    pthread_mutex_unlock(&g_lock);
    free(key);
    /* 202 when the object stays and orphanDependents=false was asked */
    if (code == 200 && meta_str(out, "deletionTimestamp") && json_is_false(json_object_get(opts, "orphanDependents")))
        code = 202;
    json_decref(opts);
    return respond(r, code, out);
}

static enum MHD_Result serve_delete_collection(rq *r, const route *rt, const char *body, size_t len)
{
    const dbl_type *t = &DBL_TYPES[rt->res];
    dbl_selector *ls, *fs;
    if (selectors(r, t, &ls, &fs) < 0) return MHD_YES;
    enum MHD_Result rc;
    json_t *opts = delete_options(r, body, len, &rc);
    if (!opts) { dbl_selector_free(ls); dbl_selector_free(fs); return rc; }
    json_t *items = json_array();
    pthread_mutex_lock(&g_lock);
    json_t *state = state_at(rt->res, 0);
    const char *key;
    json_t *obj;
    json_object_foreach(state, key, obj) {
        if (!in_scope(obj, rt->ns) || !dbl_selector_match(ls, obj) || !dbl_selector_match(fs, obj)) continue;
        int code;
        json_t *res = delete_locked(is_dry_run(r), rt->res, key, meta_str(obj, "name"), opts, &code);
        if (code == 200 && json_is_object(res) && json_object_get(res, "metadata") &&
            !json_object_get(res, "status")) json_array_append_new(items, list_item(t, res));
        else if (code == 200 && t->return_deleted) json_array_append_new(items, list_item(t, res));
        json_decref(res);
    }
    if (!is_dry_run(r)) gc_run();
    char rvb[32];
    snprintf(rvb, sizeof rvb, "%llu", g_rv);
    pthread_mutex_unlock(&g_lock);
    json_decref(state);
    json_decref(opts);
    dbl_selector_free(ls);
    dbl_selector_free(fs);
    char av[160], kind[160];
    snprintf(kind, sizeof kind, "%sList", t->kind);
    return respond(r, 200, json_pack("{s:s,s:s,s:{s:s},s:o}", "kind", kind, "apiVersion", api_version(t, av, sizeof av),
                                     "metadata", "resourceVersion", rvb, "items", items));
}

/* ---- watch --------------------------------------------------------------------- */

typedef struct watch {
    int res;
    char ns[256];
    dbl_selector *ls, *fs;
    unsigned long long cursor;       /* every event <= cursor has been considered */
    int bookmarks;
    double deadline, next_bookmark;
    unsigned long cut_gen;
    json_t *cols;                    /* Table columns, or NULL */
    int table_header_sent;
    char *buf;
    size_t len, off, cap;
    int done;                        /* 1 end cleanly once drained, 2 drop the connection */
} watch;

static void wbuf_add(watch *w, const char *type, json_t *obj /* stolen */)
{
    json_t *ev;
    if (w->cols && strcmp(type, "BOOKMARK") && strcmp(type, "ERROR")) {
        json_t *rows = json_pack("[o]", table_row(w->cols, obj));
        json_t *tbl = json_pack("{s:s,s:s,s:{s:s},s:o}", "kind", "Table", "apiVersion", "meta.k8s.io/v1", "metadata",
                                "resourceVersion", meta_str(obj, "resourceVersion") ?: "", "rows", rows);
        json_object_set_new(tbl, "columnDefinitions", w->table_header_sent ? json_array() : table_columns(w->cols));
        w->table_header_sent = 1;
        json_decref(obj);
        obj = tbl;
    }
    ev = json_pack("{s:s,s:o}", "type", type, "object", obj);
    char *s = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    size_t n = strlen(s);
    if (w->len + n + 1 > w->cap) {
        w->cap = (w->len + n + 1) * 2;
        w->buf = realloc(w->buf, w->cap);
    }
    memcpy(w->buf + w->len, s, n);
    w->buf[w->len + n] = '\n';
    w->len += n + 1;
    free(s);
}

static void wbuf_bookmark(watch *w, unsigned long long rv, int initial_end)
{
    const dbl_type *t = &DBL_TYPES[w->res];
    char av[160], rvb[32];
    snprintf(rvb, sizeof rvb, "%llu", rv);
    json_t *o = json_pack("{s:s,s:s,s:{s:s}}", "kind", t->kind, "apiVersion", api_version(t, av, sizeof av),
                          "metadata", "resourceVersion", rvb);
    if (initial_end)
        json_object_set_new(json_object_get(o, "metadata"), "annotations",
                            json_pack("{s:s}", "k8s.io/initial-events-end", "true"));
    wbuf_add(w, "BOOKMARK", o);
}

/* Gathers events after w->cursor into the buffer. Caller holds g_lock.
 * Returns the number of events buffered, -1 if the cursor fell out of the
 * retained history (an ERROR 410 was buffered). */
static int gather(watch *w)
{
    if (w->cursor < g_floor) {
        wbuf_add(w, "ERROR", err_expired(w->cursor, g_floor));
        w->done = 1;
        return -1;
    }
    int n = 0;
    for (size_t i = 0; i < g_hist_n; i++) {
        event *e = &g_hist[(g_hist_head + i) % opt.history];
        if (e->rv <= w->cursor) continue;
        w->cursor = e->rv;
        if (e->res != w->res || !in_scope(e->obj, w->ns)) continue;
        int deleted = !strcmp(e->type, "DELETED");
        int cur = !deleted && dbl_selector_match(w->ls, e->obj) && dbl_selector_match(w->fs, e->obj);
        int old = e->prev && dbl_selector_match(w->ls, e->prev) && dbl_selector_match(w->fs, e->prev);
        if (!cur && !old) continue;
        if (cur && !old) wbuf_add(w, "ADDED", json_incref(e->obj));
        else if (cur && old) wbuf_add(w, "MODIFIED", json_incref(e->obj));
        else {
            json_t *o = deleted ? json_incref(e->obj) : json_deep_copy(e->prev);
            if (!deleted) set_rv(o, e->rv);
            wbuf_add(w, "DELETED", o);
        }
        n++;
    }
    if (w->cursor < g_rv) w->cursor = g_rv;   /* no events of ours up to g_rv */
    return n;
}

static ssize_t watch_read(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    watch *w = cls;
    for (;;) {
        if (w->off < w->len) {
            size_t n = w->len - w->off;
            if (n > max) n = max;
            memcpy(out, w->buf + w->off, n);
            w->off += n;
            if (w->off == w->len) w->off = w->len = 0;
            return (ssize_t)n;
        }
        if (w->done == 1) return MHD_CONTENT_READER_END_OF_STREAM;
        if (w->done == 2) return MHD_CONTENT_READER_END_WITH_ERROR;
        pthread_mutex_lock(&g_lock);
        while (!w->len && !w->done) {
            if (g_stopping) { w->done = 1; break; }
            if (g_cut_gen[w->res] != w->cut_gen) {
                int mode = g_cut_mode[w->res];
                if (mode == 2) {
                    wbuf_add(w, "ERROR", err_expired(w->cursor, w->cursor + 1));
                    w->done = 1;
                } else {
                    w->done = mode == 1 ? 2 : 1;
                }
                break;
            }
            if (gather(w) != 0) break;
            double now = mono_now();
            if (now >= w->deadline) {
                if (w->bookmarks) wbuf_bookmark(w, w->cursor, 0);
                w->done = 1;
                break;
            }
            if (w->bookmarks && now >= w->next_bookmark) {
                wbuf_bookmark(w, w->cursor, 0);
                w->next_bookmark = now + opt.bookmark_interval;
                break;
            }
            double until = w->deadline;
            if (w->bookmarks && w->next_bookmark < until) until = w->next_bookmark;
            if (until > now + 1.0) until = now + 1.0;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double d = until - now;
            ts.tv_sec += (time_t)d;
            ts.tv_nsec += (long)((d - (double)(time_t)d) * 1e9);
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&g_cond, &g_lock, &ts);
        }
        pthread_mutex_unlock(&g_lock);
    }
}

static void watch_free(void *cls)
{
    watch *w = cls;
    pthread_mutex_lock(&g_lock);
    g_watches--;
    pthread_mutex_unlock(&g_lock);
    dbl_selector_free(w->ls);
    dbl_selector_free(w->fs);
    json_decref(w->cols);
    free(w->buf);
    free(w);
}

static enum MHD_Result serve_watch(rq *r, const route *rt)
{
    const dbl_type *t = &DBL_TYPES[rt->res];
    watch *w = calloc(1, sizeof *w);
    w->res = rt->res;
    snprintf(w->ns, sizeof w->ns, "%s", rt->ns);
    if (selectors(r, t, &w->ls, &w->fs) < 0) { free(w); return MHD_YES; }
    const char *rvs = arg(r, "resourceVersion"), *ts = arg(r, "timeoutSeconds");
    const char *match = arg(r, "resourceVersionMatch");
    int initial_events = arg_true(r, "sendInitialEvents");
    w->bookmarks = arg_true(r, "allowWatchBookmarks");
    if (arg(r, "sendInitialEvents") && (!match || strcmp(match, "NotOlderThan"))) {
        watch_free_unlocked:
        dbl_selector_free(w->ls);
        dbl_selector_free(w->fs);
        free(w);
        return respond(r, 422, status_new(422, "Invalid",
                       "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                       json_pack("{s:s,s:s,s:s}", "group", "meta.k8s.io", "kind", "ListOptions", "name", "")));
    }
    double timeout = ts ? strtod(ts, NULL) : (double)opt.min_request_timeout * (1.0 + (double)rand() / RAND_MAX);
    if (timeout <= 0) timeout = (double)opt.min_request_timeout;
    double now = mono_now();
    w->deadline = now + timeout;
    w->next_bookmark = now + opt.bookmark_interval;
    int ok = 0;
    unsigned long long from = parse_rv(rvs, &ok);
    if (rvs && *rvs && !ok) { goto watch_free_unlocked; }

    pthread_mutex_lock(&g_lock);
    json_t *crd = wants_table(r) ? crd_version(t) : NULL;
    if (crd && json_object_get(crd, "additionalPrinterColumns"))
        w->cols = json_incref(json_object_get(crd, "additionalPrinterColumns"));
    json_decref(crd);
    w->cut_gen = g_cut_gen[rt->res];
    if (!ok || from == 0 || initial_events) {
        /* Get State and Start at Most Recent: synthetic ADDED for what exists */
        json_t *state = state_at(rt->res, 0);
        size_t nk = json_object_size(state), k = 0;
        const char **keys = malloc((nk ? nk : 1) * sizeof *keys);
        const char *key;
        json_t *obj;
        json_object_foreach(state, key, obj) keys[k++] = key;
        qsort(keys, nk, sizeof *keys, key_cmp);
        for (size_t i = 0; i < nk; i++) {
            obj = json_object_get(state, keys[i]);
            if (in_scope(obj, w->ns) && dbl_selector_match(w->ls, obj) && dbl_selector_match(w->fs, obj))
                wbuf_add(w, "ADDED", json_incref(obj));
        }
        free(keys);
        json_decref(state);
        w->cursor = g_rv;
        if (initial_events) wbuf_bookmark(w, g_rv, 1);
    } else if (from < g_floor) {
        json_t *st = err_expired(from, g_floor);
        pthread_mutex_unlock(&g_lock);
        if (opt.expired_http) {
            dbl_selector_free(w->ls);
            dbl_selector_free(w->fs);
            json_decref(w->cols);
            free(w);
            return respond_status(r, st);
        }
        wbuf_add(w, "ERROR", st);
        w->done = 1;
        pthread_mutex_lock(&g_lock);
        w->cursor = g_rv;
    } else {
        w->cursor = from;
    }
    g_watches++;
    pthread_mutex_unlock(&g_lock);

    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, watch_read, w, watch_free);
    MHD_add_response_header(resp, "Content-Type", w->cols ? "application/json;as=Table;v=v1;g=meta.k8s.io" : "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-cache, private");
    enum MHD_Result rc = MHD_queue_response(r->c, 200, resp);
    MHD_destroy_response(resp);
    log_request(r, 200);
    return rc;
}

/* ---- control API ------------------------------------------------------------- */

static enum MHD_Result serve_control(rq *r, const char *body, size_t len)
{
    const char *p = r->path + 8;  /* after "/_double" */
    json_t *in = len ? json_loadb(body, len, 0, NULL) : json_object();
    if (!in) in = json_object();
    json_t *out = NULL;
    int code = 200;
    int post = !strcmp(r->method, "POST");
    pthread_mutex_lock(&g_lock);
    if (post && !strcmp(p, "/cut")) {
        const char *res = json_string_value(json_object_get(in, "resource"));
        const char *mode = json_string_value(json_object_get(in, "mode"));
        int m = !mode || !strcmp(mode, "close") ? 0 : !strcmp(mode, "abrupt") ? 1 : !strcmp(mode, "expired") ? 2 : -1;
        if (m < 0) { code = 400; out = json_pack("{s:s}", "error", "mode: close, abrupt or expired"); }
        else {
            int n = 0;
            for (size_t i = 0; i < NTYPES; i++) {
                if (res && !type_named(i, res)) continue;
                g_cut_gen[i]++;
                g_cut_mode[i] = m;
                n++;
            }
            pthread_cond_broadcast(&g_cond);
            out = json_pack("{s:i,s:i}", "cut", g_watches, "resources", n);
        }
    } else if (post && !strcmp(p, "/compact")) {
        int ok;
        unsigned long long c = parse_rv(json_string_value(json_object_get(in, "resourceVersion")), &ok);
        if (!ok || c > g_rv) c = g_rv;
        compact(c);
        char a[32], b[32];
        snprintf(a, sizeof a, "%llu", g_floor);
        snprintf(b, sizeof b, "%llu", g_rv);
        out = json_pack("{s:s,s:s}", "compacted", a, "resourceVersion", b);
    } else if (post && (!strcmp(p, "/fail") || !strcmp(p, "/latency"))) {
        if (g_nrules == MAX_RULES) { code = 400; out = json_pack("{s:s}", "error", "too many rules"); }
        else {
            rule *ru = &g_rules[g_nrules++];
            memset(ru, 0, sizeof *ru);
            snprintf(ru->method, sizeof ru->method, "%s", json_string_value(json_object_get(in, "method")) ?: "");
            snprintf(ru->path, sizeof ru->path, "%s", json_string_value(json_object_get(in, "path")) ?: "");
            ru->fail = p[1] == 'f';
            json_t *cnt = json_object_get(in, "count");
            ru->count = cnt ? (long)json_integer_value(cnt) : (ru->fail ? 1 : -1);
            ru->status = (int)json_integer_value(json_object_get(in, "status"));
            if (ru->fail && !ru->status) ru->status = 500;
            ru->retry_after = (int)json_integer_value(json_object_get(in, "retryAfter"));
            json_t *wt = json_object_get(in, "watch");
            ru->watch = wt ? json_is_true(wt) : -1;
            ru->ms = (long)json_integer_value(json_object_get(in, "ms"));
            out = json_pack("{s:i}", "rules", (int)g_nrules);
        }
    } else if (post && !strcmp(p, "/clear")) {
        g_nrules = 0;
        out = json_pack("{s:i}", "rules", 0);
    } else if (!strcmp(r->method, "GET") && !strcmp(p, "/log")) {
        out = json_deep_copy(g_log);
    } else if ((!strcmp(r->method, "DELETE") && !strcmp(p, "/log")) || (post && !strcmp(p, "/log/reset"))) {
        json_array_clear(g_log);
        out = json_object();
    } else if (!strcmp(r->method, "GET") && !strcmp(p, "/state")) {
        const char *res = arg(r, "resource");
        char a[32], b[32];
        snprintf(a, sizeof a, "%llu", g_rv);
        snprintf(b, sizeof b, "%llu", g_floor);
        out = json_pack("{s:s,s:s,s:i,s:i}", "resourceVersion", a, "compacted", b, "watches", g_watches, "delayed",
                        g_delayed);
        if (res) {
            int idx = -1;
            for (size_t i = NTYPES; i-- > 0;) if (type_named(i, res)) idx = (int)i; /* the first named */
            if (idx < 0) { code = 404; json_decref(out); out = json_pack("{s:s}", "error", "unknown resource"); }
            else {
                json_t *state = state_at(idx, 0), *items = json_array();
                size_t nk = json_object_size(state), k = 0;
                const char **keys = malloc((nk ? nk : 1) * sizeof *keys);
                const char *key;
                json_t *obj;
                json_object_foreach(state, key, obj) keys[k++] = key;
                qsort(keys, nk, sizeof *keys, key_cmp);
                for (size_t i = 0; i < nk; i++) json_array_append(items, json_object_get(state, keys[i]));
                free(keys);
                json_decref(state);
                json_object_set_new(out, "items", items);
            }
        }
    } else {
        code = 404;
        out = json_pack("{s:s}", "error", "unknown control call");
    }
    pthread_mutex_unlock(&g_lock);
    json_decref(in);
    return respond(r, code, out);
}

/* Applies latency and fail rules to a request. Returns 1 when the request
 * was answered by a fail rule. */
static int apply_faults(rq *r, enum MHD_Result *rc)
{
    long delay = 0;
    int fail = 0, status = 0, retry_after = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nrules; i++) {
        rule *ru = &g_rules[i];
        if (ru->count == 0) continue;
        if (*ru->method && strcmp(ru->method, r->method)) continue;
        if (*ru->path && strncmp(ru->path, r->path, strlen(ru->path))) continue;
        if (ru->watch >= 0 && ru->watch != r->watch) continue;
        if (ru->fail) {
            if (fail) continue;
            fail = 1;
            status = ru->status;
            retry_after = ru->retry_after;
        } else {
            delay += ru->ms;
        }
        if (ru->count > 0) ru->count--;
    }
    if (delay > 0) g_delayed++;
    pthread_mutex_unlock(&g_lock);
    if (delay > 0) {
        struct timespec ts = { delay / 1000, (delay % 1000) * 1000000L };
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_lock);
        g_delayed--;
        pthread_mutex_unlock(&g_lock);
    }
    if (!fail) return 0;
    char ra[16];
    snprintf(ra, sizeof ra, "%d", retry_after > 0 ? retry_after : 1);
    json_t *st;
    if (status == 429) {
        st = status_new(429, "TooManyRequests", "Too many requests, please try again later.",
                        json_pack("{s:i}", "retryAfterSeconds", retry_after > 0 ? retry_after : 1));
    } else if (status == 503) {
        st = status_new(503, "ServiceUnavailable", "the server is currently unable to handle the request",
                        json_pack("{s:i}", "retryAfterSeconds", retry_after > 0 ? retry_after : 1));
    } else if (status == 500) {
        st = status_new(500, "InternalError", "Internal error occurred: injected by kube-double",
                        json_pack("{s:[{s:s}]}", "causes", "message", "injected by kube-double"));
    } else if (status == 504) {
        st = status_new(504, "Timeout", "Timeout: request did not complete within requested timeout - context deadline exceeded", NULL);
    } else {
        st = status_new(status, "InternalError", "injected by kube-double", NULL);
    }
    *rc = respond_ex(r, status, st, status == 429 || status == 503 || retry_after > 0 ? ra : NULL, NULL);
    return 1;
}

/* ---- the request handler --------------------------------------------------------- */

static enum MHD_Result collect_query(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    (void)kind;
    rq *r = cls;
    size_t l = strlen(r->query);
    snprintf(r->query + l, sizeof r->query - l, "%s%s%s%s", l ? "&" : "", k, v ? "=" : "", v ? v : "");
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls;
    (void)version;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = calloc(1, sizeof *cs);
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size) {
        if (cs->len + *upload_size > MAX_BODY) cs->too_big = 1;
        else {
            if (cs->len + *upload_size + 1 > cs->cap) {
                cs->cap = (cs->len + *upload_size + 1) * 2;
                cs->body = realloc(cs->body, cs->cap);
            }
            memcpy(cs->body + cs->len, upload, *upload_size);
            cs->len += *upload_size;
            cs->body[cs->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    rq r = { .c = c, .method = method, .path = url, .cs = cs };
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_query, &r);
    r.ua = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "User-Agent");
    r.watch = !strcmp(method, "GET") && arg_true(&r, "watch");
    const char *body = cs->body ? cs->body : "";
    size_t blen = cs->len;

    if (!strncmp(url, "/_double/", 9)) return serve_control(&r, body, blen);
    if (!authenticated(&r))
        return respond(&r, 401, status_new(401, "Unauthorized", "Unauthorized", NULL));
    enum MHD_Result rc;
    if (apply_faults(&r, &rc)) return rc;
    if (cs->too_big) {
        return respond(&r, 413, status_new(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728", NULL));
    }
    if (!strcmp(method, "GET") && (rc = serve_discovery(&r)) == MHD_YES) return rc;
    if (!strcmp(url, "/healthz") || !strcmp(url, "/readyz") || !strcmp(url, "/livez")) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(2, (void *)"ok", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Content-Type", "text/plain; charset=utf-8");
        rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        log_request(&r, 200);
        return rc;
    }
    route rt;
    if (parse_route(url, &rt) < 0) {
        return respond(&r, 404, status_new(404, "NotFound", "the server could not find the requested resource",
                                           json_pack("{s:[{s:s}]}", "causes", "reason", "UnexpectedServerResponse")));
    }
    if (rt.discovery) {
        json_t *rl = !strcmp(method, "GET") ? resource_list(rt.group, rt.version) : NULL;
        if (rl) return respond(&r, 200, rl);
        return respond(&r, 404, status_new(404, "NotFound", "the server could not find the requested resource", NULL));
    }
    const dbl_type *t = &DBL_TYPES[rt.res];
    int collection = !*rt.name;
    if (!strcmp(method, "GET")) {
        if (r.watch && collection) return serve_watch(&r, &rt);
        return collection ? serve_list(&r, &rt) : serve_get(&r, &rt);
    }
    const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if ((!strcmp(method, "POST") || !strcmp(method, "PUT")) && ctype && strncmp(ctype, "application/json", 16)) {
        /* the real server also takes YAML and protobuf; the double only JSON */
        return respond(&r, 415, status_new(415, "UnsupportedMediaType",
                       "the body of the request was in an unknown format - accepted media types include: application/json", NULL));
    }
    if (!strcmp(method, "POST") && collection) {
        json_error_t je;
        json_t *obj = json_loadb(body, blen, 0, &je);
        if (!json_is_object(obj)) {
            json_decref(obj);
            char m[300];
            snprintf(m, sizeof m, "the object provided is unrecognized: %s", blen ? je.text : "empty body");
            return respond_status(&r, err_bad_request(m));
        }
        return serve_create(&r, &rt, obj);
    }
    if (!strcmp(method, "PUT") && !collection) {
        json_t *obj = json_loadb(body, blen, 0, NULL);
        if (!json_is_object(obj)) {
            json_decref(obj);
            return respond_status(&r, err_bad_request("the object provided is unrecognized"));
        }
        const char *kind = json_string_value(json_object_get(obj, "kind"));
        if (kind && strcmp(kind, t->kind)) {
            json_decref(obj);
            char m[300];
            snprintf(m, sizeof m, "the kind in the data (%s) does not match the expected kind (%s)", kind, t->kind);
            return respond_status(&r, err_bad_request(m));
        }
        int retry = 0;
        return do_update(&r, &rt, obj, NULL, &retry);
    }
    if (!strcmp(method, "PATCH") && !collection) return serve_patch(&r, &rt, body, blen);
    if (!strcmp(method, "DELETE")) {
        if (collection) return serve_delete_collection(&r, &rt, body, blen);
        if (*rt.sub) goto not_allowed;
        return serve_delete(&r, &rt, body, blen);
    }
not_allowed:
    {
        char m[200];
        snprintf(m, sizeof m, "the server does not allow this method on the requested resource");
        return respond(&r, 405, status_new(405, "MethodNotAllowed", m, NULL));
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    conn_state *cs = *con_cls;
    if (cs) {
        free(cs->body);
        free(cs);
        *con_cls = NULL;
    }
}

/* ---- main ---------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: kube-double [--address A] [--port N] [--port-file F] [--tls-cert F --tls-key F]\n"
                    "       [--client-ca F] [--token T | --token-file F] [--history N] [--bookmark-interval S]\n"
                    "       [--min-request-timeout S] [--initial-rv N] [--expired-watch event|http] [--log-requests]\n"
                    "       [--without RESOURCE,...]\n"
                    "(see the comment at the top of spec/support/kube-double/double.c)\n");
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && (i++, 1))
        if (OPT("--address")) opt.address = v;
        else if (OPT("--port")) opt.port = atoi(v);
        else if (OPT("--port-file")) opt.port_file = v;
        else if (OPT("--tls-cert")) opt.tls_cert = v;
        else if (OPT("--tls-key")) opt.tls_key = v;
        else if (OPT("--client-ca")) opt.client_ca = v;
        else if (OPT("--token")) opt.token = v;
        else if (OPT("--token-file")) opt.token_file = v;
        else if (OPT("--history")) opt.history = (size_t)strtoul(v, NULL, 10);
        else if (OPT("--bookmark-interval")) opt.bookmark_interval = strtod(v, NULL);
        else if (OPT("--min-request-timeout")) opt.min_request_timeout = strtol(v, NULL, 10);
        else if (OPT("--initial-rv")) opt.initial_rv = strtoull(v, NULL, 10);
        else if (OPT("--expired-watch")) opt.expired_http = !strcmp(v, "http");
        else if (!strcmp(a, "--log-requests")) opt.log_requests = 1;
        else if (OPT("--without")) {
            char buf[1024];
            snprintf(buf, sizeof buf, "%s", v);
            char *save = NULL;
            for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
                int any = 0;
                for (size_t k = 0; k < NTYPES; k++)
                    if (type_named(k, w)) { g_unserved[k] = 1; any = 1; }
                if (!any) { fprintf(stderr, "kube-double: --without: unknown resource %s\n", w); return 2; }
            }
        }
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        else { fprintf(stderr, "kube-double: unknown or incomplete flag %s\n", a); usage(); return 2; }
#undef OPT
    }
    if (opt.history < 1) opt.history = 1;
    if (opt.bookmark_interval <= 0) opt.bookmark_interval = 1;
    if ((opt.tls_cert != NULL) != (opt.tls_key != NULL)) { fprintf(stderr, "kube-double: --tls-cert needs --tls-key\n"); return 2; }
    if (opt.client_ca && !opt.tls_cert) { fprintf(stderr, "kube-double: --client-ca needs --tls-cert\n"); return 2; }
    srand((unsigned)time(NULL) ^ (unsigned)getpid());

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cond, &ca);
    pthread_condattr_destroy(&ca);
    g_hist = calloc(opt.history, sizeof *g_hist);
    g_rv = opt.initial_rv;
    g_floor = 0;
    g_log = json_array();

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);   /* inherited by MHD's threads */

    struct sockaddr_in sa = { 0 };
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)opt.port);
    if (inet_pton(AF_INET, opt.address, &sa.sin_addr) != 1) { fprintf(stderr, "kube-double: bad --address\n"); return 2; }

    char *cert = NULL, *key = NULL, *ca_pem = NULL;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (opt.tls_cert) {
        cert = read_file(opt.tls_cert, NULL);
        key = read_file(opt.tls_key, NULL);
        if (!cert || !key) { fprintf(stderr, "kube-double: cannot read %s or %s\n", opt.tls_cert, opt.tls_key); return 1; }
        if (opt.client_ca && !(ca_pem = read_file(opt.client_ca, NULL))) {
            fprintf(stderr, "kube-double: cannot read %s\n", opt.client_ca);
            return 1;
        }
        flags |= MHD_USE_TLS;
    }
    struct MHD_Daemon *d;
    if (opt.tls_cert && ca_pem)
        d = MHD_start_daemon(flags, 0, NULL, NULL, handle, NULL, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_NOTIFY_COMPLETED,
                             completed, NULL, MHD_OPTION_HTTPS_MEM_CERT, cert, MHD_OPTION_HTTPS_MEM_KEY, key,
                             MHD_OPTION_HTTPS_MEM_TRUST, ca_pem, MHD_OPTION_END);
    else if (opt.tls_cert)
        d = MHD_start_daemon(flags, 0, NULL, NULL, handle, NULL, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_NOTIFY_COMPLETED,
                             completed, NULL, MHD_OPTION_HTTPS_MEM_CERT, cert, MHD_OPTION_HTTPS_MEM_KEY, key,
                             MHD_OPTION_END);
    else
        d = MHD_start_daemon(flags, 0, NULL, NULL, handle, NULL, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_NOTIFY_COMPLETED,
                             completed, NULL, MHD_OPTION_END);
    if (!d) { fprintf(stderr, "kube-double: cannot listen on %s:%d\n", opt.address, opt.port); return 1; }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : opt.port;
    if (opt.port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", opt.port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, opt.port_file) != 0) {
            fprintf(stderr, "kube-double: cannot write %s\n", opt.port_file);
            return 1;
        }
    }
    fprintf(stderr, "kube-double: listening on %s://%s:%d\n", opt.tls_cert ? "https" : "http", opt.address, port);

    int sig = 0;
    sigdelset(&set, SIGPIPE);
    sigwait(&set, &sig);
    pthread_mutex_lock(&g_lock);
    g_stopping = 1;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
    MHD_stop_daemon(d);

    for (size_t i = 0; i < NTYPES; i++) {
        store_ix *x, *tmp;
        HASH_ITER(hh, g_store[i].ix, x, tmp) { HASH_DEL(g_store[i].ix, x); free(x); }
        for (size_t j = 0; j < g_store[i].n; j++) { free(g_store[i].v[j].key); json_decref(g_store[i].v[j].obj); }
        free(g_store[i].v);
    }
    compact(g_rv);
    free(g_hist);
    json_decref(g_log);
    free(cert);
    free(key);
    free(ca_pem);
    return 0;
}
