/* gpunode.h — the agent's GPUNode (cluster-scoped, named after the node;
 * deploy/crds/gpunodes.cozystack.io.yaml, docs/gpunode.md): read it,
 * create it owned by the Node, keep that owner reference, write its status
 * (docs/decisions/0011: the GPUNode lives and dies with its Node).
 *
 * Every call blocks on the API server (kube.h: timeouts and retries of the
 * client). Messages name the verb, resource and HTTP status.
 */
#ifndef COZYGPU_AGENT_GPUNODE_H
#define COZYGPU_AGENT_GPUNODE_H

#include <jansson.h>
#include <time.h>

#include "base/result.h"
#include "kube/kube.h"
#include "kube/watch.h"

typedef struct gpunode_ctx {
    kube_client *client;        /* borrowed */
    kube_informer *inf;         /* borrowed; the GPUNode watch (NULL with once) */
    const char *node;           /* borrowed; the Node's and the GPUNode's name */
    int once;                   /* --once: GET instead of the watch cache; a
                                   status conflict is an error */
    char *checked_owner_uid;    /* owned; GPUNode uid whose owner reference was checked */
    time_t owner_checked_at;
} gpunode_ctx;

/* The GPUNode: from the watch cache (g->inf), or with g->once a GET. *out:
 * a new reference (caller owns it), or NULL when there is none (HTTP 404).
 * Errors: COZY_ERR_IO when the GET fails or answers another status
 * ("GET gpunodes/<node>: HTTP <n>"). */
cozy_result gpunode_get(gpunode_ctx *g, json_t **out, cozy_err *err);

/* Creates the GPUNode (empty spec, label app.kubernetes.io/managed-by:
 * cozygpu-agent) with an owner reference to the Node (GET nodes/<node>
 * first: COZY_ERR_INPUT when the Node does not exist). *out: the created
 * object (caller owns it), or NULL when it already existed (HTTP 409: the
 * watch brings it). Errors: COZY_ERR_IO (transport), COZY_ERR_INPUT (any
 * other HTTP status). */
cozy_result gpunode_create(gpunode_ctx *g, json_t **out, cozy_err *err);

/* Adds the owner reference to the Node (merge patch of
 * metadata.ownerReferences) when GPUNode `gn` (borrowed) lacks it, or
 * names another Node object of this name (the Node was recreated: a new
 * uid); checked once per GPUNode uid and again every 10 minutes.
 * *patched: the object as patched (caller owns it), or NULL when nothing
 * was written. Errors: COZY_ERR_IO, COZY_ERR_INPUT (an HTTP status). */
cozy_result gpunode_ensure_owner(gpunode_ctx *g, const json_t *gn, json_t **patched, cozy_err *err);

/* PUT /status of GPUNode `gn` (borrowed; its resourceVersion guards the
 * write) with `status` (borrowed). *written 1 when stored. A conflict
 * (HTTP 409: the object changed, the watch brings it) is logged and left
 * to the next pass: COZY_OK with *written 0, or with g->once COZY_ERR_IO
 * "PUT gpunodes/<node>/status: conflict". Errors: COZY_ERR_IO (transport),
 * COZY_ERR_INPUT (another HTTP status). */
cozy_result gpunode_write_status(gpunode_ctx *g, const json_t *gn, json_t *status, int *written, cozy_err *err);

/* Frees what *g owns (not the borrowed client or informer). */
void gpunode_ctx_free(gpunode_ctx *g);

#endif
