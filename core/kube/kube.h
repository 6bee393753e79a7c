/* kube.h — a Kubernetes API client over libcurl.
 *
 * A client is built once from a kubeconfig file (or the in-cluster service
 * account) and then used from any thread: every call takes its own curl easy
 * handle; DNS, TLS sessions and connections are shared through one locked
 * CURLSH, so requests reuse keep-alive connections.
 *
 * Configuration follows k8s.io/client-go tools/clientcmd (loader.go,
 * client_config.go) and rest/config.go InClusterConfig; the retry rules follow
 * rest/request.go (checkWait, Retry-After) and util/retry RetryOnConflict.
 * Every request carries a timeout; watches are in watch.h.
 *
 * Build: pkg-config --cflags --libs libcurl jansson yaml-0.1, -lpthread;
 * sources core/kube/kube.c core/kube/kubeconfig.c (+ core/format/yamlload.c core/base/result.c
 * core/base/log.c).
 */
#ifndef COZYGPU_KUBE_H
#define COZYGPU_KUBE_H

#include "base/result.h"

#include <jansson.h>

/* Ceiling of one response body (a LIST page of a large collection). A larger
   answer fails with COZY_ERR_IO ("response larger than ..."). */
#define KUBE_RESPONSE_MAX_BYTES (64u * 1024u * 1024u)
/* Backoff between retries: base * 2^attempt, capped, with jitter in
   [d/2, d]. Retry-After (seconds) replaces it, capped at KUBE_RETRY_AFTER_MAX_S. */
#define KUBE_RETRY_BASE_MS 100
#define KUBE_RETRY_CAP_MS 5000
#define KUBE_RETRY_AFTER_MAX_S 60
/* kube_update_retry: attempts on 409 Conflict (client-go retry.DefaultRetry
   has Steps 5). */
#define KUBE_CONFLICT_ATTEMPTS 5

typedef struct kube_client kube_client;

typedef struct kube_client_options {
    const char *kubeconfig;      /* path, or a ':'-separated list merged as kubectl
                                    does (first file to define a name wins);
                                    NULL: $KUBECONFIG, then in-cluster when
                                    KUBERNETES_SERVICE_HOST is set, then
                                    ~/.kube/config */
    const char *context;         /* NULL: the config's current-context */
    const char *server;          /* overrides the cluster's server (kubectl --server) */
    const char *user_agent;      /* NULL: "cozygpu/0.1.0" */
    long timeout_ms;             /* per request attempt (not watches); <= 0: 10000 */
    int max_retries;             /* 429 / 5xx / transport errors; < 0: 0 */
    const char *in_cluster_root; /* test hook: directory standing in for
                                    /var/run/secrets/kubernetes.io/serviceaccount */
} kube_client_options;

/* Builds a client. Reads the kubeconfig (or the in-cluster files) now: every
 * file named by it (CA, client certificate and key) is read at once, so a
 * missing file is reported here; a tokenFile (and the in-cluster token) is
 * re-read later whenever its mtime, size or inode changes.
 * Errors: COZY_ERR_IO (a file cannot be read), COZY_ERR_PARSE (YAML),
 * COZY_ERR_CONFIG (a field missing or wrong), each message naming the file
 * and the field, e.g. "/root/.kube/config: users[0].user.client-key: cannot
 * read x.key: No such file or directory". *out is set only on COZY_OK;
 * release it with kube_client_free. */
cozy_result kube_client_new(kube_client **out, const kube_client_options *o, cozy_err *err);

/* Frees a client (NULL is fine). No request may be running on it. */
void kube_client_free(kube_client *c);

/* The server base URL in use ("https://10.0.0.1:443"), owned by the client. */
const char *kube_client_server(const kube_client *c);

/* Where the configuration came from: the kubeconfig path or "in-cluster".
   Owned by the client. */
const char *kube_client_source(const kube_client *c);

/* A resource type: group/version/plural, its kind, and its scope. */
typedef struct kube_resource {
    const char *group;    /* "" for core */
    const char *version;  /* "v1" */
    const char *resource; /* plural: "gpuclasses" */
    const char *kind;     /* "GPUClass" */
    int namespaced;
} kube_resource;

extern const kube_resource KUBE_NAMESPACES, KUBE_NODES, KUBE_PODS, KUBE_SECRETS,
    KUBE_CONFIGMAPS, KUBE_RESOURCEQUOTAS, KUBE_EVENTS, KUBE_LEASES, KUBE_VMIS,
    KUBE_VMS, KUBE_KUBEVIRTS, KUBE_GPUCLASSES, KUBE_GPUCLAIMS, KUBE_GPUNODES,
    KUBE_WORKLOADS, KUBE_WORKLOADMONITORS, KUBE_RESOURCECLAIMS, KUBE_RESOURCECLAIMTEMPLATES, KUBE_DEVICECLASSES,
    KUBE_PVCS, KUBE_PVS;

/* The next older version of r that a cluster may serve instead of it, or
 * NULL. Only the DRA kinds have one: KUBE_RESOURCECLAIMS,
 * KUBE_RESOURCECLAIMTEMPLATES and KUBE_DEVICECLASSES are resource.k8s.io/v1
 * (Kubernetes 1.34), then v1beta2 (1.33), then v1beta1 (1.32)
 * (k8s.io/api resource/<version>/types.go). The watch reads the newest one
 * served (watch.h, kube_watcher_add). */
const kube_resource *kube_resource_older(const kube_resource *r);

/* Path of a collection or an object: "/api/v1/namespaces/ns/pods/name/status"
 * or "/apis/group/version/...". ns NULL (or "") for cluster-scoped types or
 * all namespaces; name NULL for the collection; sub ("status") or NULL.
 * ns, name and sub are percent-escaped. Returns a malloc'd string the caller
 * frees, NULL on out of memory. */
char *kube_path(const kube_resource *r, const char *ns, const char *name, const char *sub);

/* Percent-escapes s for a URL query value (RFC 3986 unreserved kept).
 * Returns a malloc'd string, NULL on out of memory. */
char *kube_escape(const char *s);

/* One request. method "GET", "POST", "PUT", "PATCH", "DELETE"; path starts
 * with "/" and may carry a query; content_type for PATCH is
 * "application/merge-patch+json", "application/json-patch+json" or
 * "application/strategic-merge-patch+json" (NULL: application/json); body is
 * borrowed, may be NULL.
 *
 * Retries, up to max_retries times, with backoff (KUBE_RETRY_*): 429 and 5xx
 * answers (a Retry-After in seconds sets the wait), connection failures
 * (nothing was sent), and for GET any transport error. 409 and every other
 * status are returned to the caller at once.
 *
 * Returns COZY_OK once an HTTP answer was received (any status): *status is
 * it, *out (if out != NULL) the parsed JSON body, owned by the caller (a
 * Status object on errors), or NULL when the body was empty or not JSON.
 * COZY_ERR_IO on transport failure after the retries, with err naming the
 * method, the URL and curl's message. */
cozy_result kube_request(kube_client *c, const char *method, const char *path,
                         const char *content_type, const json_t *body,
                         long *status, json_t **out, cozy_err *err);

/* Conveniences over kube_request on r's paths (same status/out shape).
 * kube_list: the collection with an optional query ("labelSelector=a%3Db"),
 * without pagination. kube_update PUTs obj (its metadata.resourceVersion
 * makes it conditional), kube_update_status PUTs the status subresource. */
cozy_result kube_get(kube_client *c, const kube_resource *r, const char *ns, const char *name,
                     long *status, json_t **out, cozy_err *err);
cozy_result kube_list(kube_client *c, const kube_resource *r, const char *ns, const char *query,
                      long *status, json_t **out, cozy_err *err);
cozy_result kube_create(kube_client *c, const kube_resource *r, const char *ns, const json_t *obj,
                        long *status, json_t **out, cozy_err *err);
cozy_result kube_update(kube_client *c, const kube_resource *r, const char *ns, const json_t *obj,
                        long *status, json_t **out, cozy_err *err);
cozy_result kube_update_status(kube_client *c, const kube_resource *r, const char *ns,
                               const json_t *obj, long *status, json_t **out, cozy_err *err);
cozy_result kube_patch(kube_client *c, const kube_resource *r, const char *ns, const char *name,
                       const char *content_type, const json_t *patch,
                       long *status, json_t **out, cozy_err *err);
/* kube_patch_status: a JSON merge patch (RFC 7386) of the status
 * subresource, unconditional: for fields one writer owns alone (the
 * leader's GPUClass status.free), so no read is needed first and a field
 * another writer owns (a condition) is left as it is. */
cozy_result kube_patch_status(kube_client *c, const kube_resource *r, const char *ns, const char *name,
                              const json_t *patch, long *status, json_t **out, cozy_err *err);
cozy_result kube_delete(kube_client *c, const kube_resource *r, const char *ns, const char *name,
                        long *status, json_t **out, cozy_err *err);

/* Read-modify-write with conflict retry (client-go util/retry
 * RetryOnConflict with DefaultRetry): GET the object, call mutate(obj, ctx)
 * on it (0: write it, 1: nothing to do, -1: abort), PUT it (the status
 * subresource when status_only), and on 409 start again, at most
 * KUBE_CONFLICT_ATTEMPTS times in all.
 * Returns COZY_OK with *out (if out) the object as written, or as read when
 * mutate said 1. Errors: COZY_ERR_INPUT when the GET or PUT answered a status
 * other than 2xx/409 (message names it and the Status message; NotFound
 * included), or mutate aborted; COZY_ERR_IO on transport failure or when
 * every attempt conflicted. */
cozy_result kube_update_retry(kube_client *c, const kube_resource *r, const char *ns,
                              const char *name, int status_only,
                              int (*mutate)(json_t *obj, void *ctx), void *ctx,
                              json_t **out, cozy_err *err);

#endif
