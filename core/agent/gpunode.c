/* gpunode.c — the agent's GPUNode object (gpunode.h): read, created with
 * an owner reference to the Node, owner reference repaired, status written.
 */
#include "agent/gpunode.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

cozy_result gpunode_get(gpunode_ctx *g, json_t **out, cozy_err *err)
{
    *out = NULL;
    if(!g->once) {
        *out = kube_informer_get(g->inf, NULL, g->node);
        return COZY_OK;
    }
    long st = 0;
    json_t *obj = NULL;
    if(kube_get(g->client, &KUBE_GPUNODES, NULL, g->node, &st, &obj, err) != COZY_OK)
        return COZY_ERR_IO;
    if(st == 200) {
        *out = obj;
        return COZY_OK;
    }
    json_decref(obj);
    if(st != 404)
        return cozy_fail(err, COZY_ERR_IO, "GET gpunodes/%s: HTTP %ld", g->node, st);
    return COZY_OK;
}

static json_t *owner_ref(const json_t *node)
{
    const json_t *md = json_object_get(node, "metadata");
    return json_pack("{s:s,s:s,s:O,s:O}", "apiVersion", "v1", "kind", "Node", "name", json_object_get(md, "name"),
                     "uid", json_object_get(md, "uid"));
}

static cozy_result get_node(gpunode_ctx *g, json_t **node, cozy_err *err)
{
    long st = 0;
    *node = NULL;
    if(kube_get(g->client, &KUBE_NODES, NULL, g->node, &st, node, err) != COZY_OK)
        return COZY_ERR_IO;
    if(st != 200) {
        json_decref(*node);
        *node = NULL;
        return cozy_fail(err, COZY_ERR_INPUT, "GET nodes/%s: HTTP %ld%s", g->node, st,
                         st == 404 ? " (the GPUNode is owned by its Node, which must exist)" : "");
    }
    return COZY_OK;
}

cozy_result gpunode_create(gpunode_ctx *g, json_t **out, cozy_err *err)
{
    *out = NULL;
    json_t *node = NULL;
    cozy_result rc = get_node(g, &node, err);
    if(rc != COZY_OK)
        return rc;
    json_t *obj = json_pack("{s:s,s:s,s:{s:s,s:{s:s},s:[o]},s:{}}", "apiVersion", "cozystack.io/v1alpha1", "kind",
                            "GPUNode", "metadata", "name", g->node, "labels", "app.kubernetes.io/managed-by",
                            "cozygpu-agent", "ownerReferences", owner_ref(node), "spec");
    json_decref(node);
    long st = 0;
    json_t *res = NULL;
    rc = kube_create(g->client, &KUBE_GPUNODES, NULL, obj, &st, &res, err);
    json_decref(obj);
    if(rc != COZY_OK)
        return rc;
    if(st == 201 || st == 200) {
        log_write(LOG_INFO, "agent", "created the GPUNode", "name", g->node, NULL);
        *out = res;
        return COZY_OK;
    }
    json_decref(res);
    if(st == 409)
        return COZY_OK;
    return cozy_fail(err, COZY_ERR_INPUT, "POST gpunodes %s: HTTP %ld", g->node, st);
}

cozy_result gpunode_ensure_owner(gpunode_ctx *g, const json_t *gn, json_t **patched, cozy_err *err)
{
    *patched = NULL;
    const char *uid = json_string_value(json_object_get(json_object_get(gn, "metadata"), "uid"));
    /* checked once per GPUNode object, and again every 10 minutes: a Node
       deleted and registered again has a new uid */
    if(uid && g->checked_owner_uid && strcmp(uid, g->checked_owner_uid) == 0 && time(NULL) - g->owner_checked_at < 600)
        return COZY_OK;
    json_t *node = NULL;
    cozy_result rc = get_node(g, &node, err);
    if(rc != COZY_OK)
        return rc;
    const char *node_uid = json_string_value(json_object_get(json_object_get(node, "metadata"), "uid"));
    json_t *refs = json_array();
    int found = 0;
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(json_object_get(gn, "metadata"), "ownerReferences"), i, r)
    {
        const char *kind = json_string_value(json_object_get(r, "kind"));
        if(kind && strcmp(kind, "Node") == 0 && json_is_string(json_object_get(r, "apiVersion")) &&
           strcmp(json_string_value(json_object_get(r, "apiVersion")), "v1") == 0) {
            const char *ru = json_string_value(json_object_get(r, "uid"));
            if(ru && node_uid && strcmp(ru, node_uid) == 0)
                found = 1;
            else
                continue; /* a reference to a Node object that is gone */
        }
        json_array_append(refs, (json_t *)r);
    }
    if(!found) {
        json_array_append_new(refs, owner_ref(node));
        json_t *patch = json_pack("{s:{s:o}}", "metadata", "ownerReferences", refs);
        long st = 0;
        json_t *res = NULL;
        rc = kube_patch(g->client, &KUBE_GPUNODES, NULL, g->node, "application/merge-patch+json", patch, &st, &res,
                        err);
        json_decref(patch);
        if(rc == COZY_OK && st != 200)
            rc = cozy_fail(err, COZY_ERR_INPUT, "PATCH gpunodes/%s (owner reference): HTTP %ld", g->node, st);
        if(rc == COZY_OK) {
            log_write(LOG_INFO, "agent", "added the owner reference to the Node", "name", g->node, NULL);
            *patched = res;
            res = NULL;
        }
        json_decref(res);
    } else
        json_decref(refs);
    json_decref(node);
    if(rc == COZY_OK && uid) {
        free(g->checked_owner_uid);
        g->checked_owner_uid = strdup(uid);
        g->owner_checked_at = time(NULL);
    }
    return rc;
}

cozy_result gpunode_write_status(gpunode_ctx *g, const json_t *gn, json_t *status, int *written, cozy_err *err)
{
    *written = 0;
    json_t *obj = json_deep_copy(gn);
    json_object_set(obj, "status", status);
    long st = 0;
    json_t *res = NULL;
    cozy_result rc = kube_update_status(g->client, &KUBE_GPUNODES, NULL, obj, &st, &res, err);
    json_decref(obj);
    json_decref(res);
    if(rc != COZY_OK)
        return rc;
    if(st == 409) {
        /* the object changed meanwhile: the watch brings it, and the next
           pass writes again */
        log_write(LOG_DEBUG, "agent", "status write conflicted; retrying on the next pass", NULL);
        if(g->once)
            rc = cozy_fail(err, COZY_ERR_IO, "PUT gpunodes/%s/status: conflict", g->node);
    } else if(st != 200 && st != 201)
        rc = cozy_fail(err, COZY_ERR_INPUT, "PUT gpunodes/%s/status: HTTP %ld", g->node, st);
    else {
        log_write(LOG_INFO, "agent", "wrote the GPUNode status", "name", g->node, NULL);
        *written = 1;
    }
    return rc;
}

void gpunode_ctx_free(gpunode_ctx *g)
{
    free(g->checked_owner_uid);
    g->checked_owner_uid = NULL;
}
