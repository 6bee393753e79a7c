/* review.c — inputs to AdmissionRequests, answers to AdmissionReviews
 * (review.h). */
#include "admission/review.h"
#include "admission/request.h"
#include "admission/response.h"

#include "base/b64.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Resource (plural) names of the kinds cozygpu reviews; other kinds get
 * the lower-case kind plus "s", as most Kubernetes resources do. */
static const struct {
    const char *kind, *resource;
} plural_names[] = {
    {"Pod", "pods"},
    {"Namespace", "namespaces"},
    {"VirtualMachineInstance", "virtualmachineinstances"},
    {"VirtualMachine", "virtualmachines"},
    {"GPUClass", "gpuclasses"},
    {"GPUClaim", "gpuclaims"},
    {"GPUNode", "gpunodes"},
    {"ResourceQuota", "resourcequotas"},
    {"KubeVirt", "kubevirts"},
    {"Node", "nodes"},
    {NULL, NULL},
};

static const char *const cluster_scoped[] = {"Namespace", "Node", "GPUClass", "GPUNode", NULL};

static void split_api_version(const char *av, char *group, size_t gn, char *version, size_t vn)
{
    const char *slash = strchr(av, '/');
    if(slash) {
        snprintf(group, gn, "%.*s", (int)(slash - av), av);
        snprintf(version, vn, "%s", slash + 1);
    } else {
        group[0] = 0;
        snprintf(version, vn, "%s", av);
    }
}

static void resource_of(const char *kind, char *out, size_t n)
{
    for(int i = 0; plural_names[i].kind; i++)
        if(strcmp(plural_names[i].kind, kind) == 0) {
            snprintf(out, n, "%s", plural_names[i].resource);
            return;
        }
    size_t i = 0;
    for(; kind[i] && i + 2 < n; i++)
        out[i] = (char)tolower((unsigned char)kind[i]);
    out[i++] = 's';
    out[i] = 0;
}

static int is_cluster_scoped(const char *kind)
{
    for(int i = 0; cluster_scoped[i]; i++)
        if(strcmp(cluster_scoped[i], kind) == 0)
            return 1;
    return 0;
}

/* The VMI KubeVirt's VM controller creates from a VM's template
 * (pkg/virt-controller/watch/vm.go: name and namespace of the VM, the
 * template's metadata and spec, an owner reference to the VM). */
static json_t *vmi_from_vm(const json_t *vm)
{
    json_t *tmpl = json_object_get(json_object_get(vm, "spec"), "template");
    if(!json_is_object(tmpl))
        return NULL;
    json_t *meta = json_deep_copy(json_object_get(tmpl, "metadata"));
    if(!json_is_object(meta)) {
        json_decref(meta);
        meta = json_object();
    }
    json_t *vmmeta = json_object_get(vm, "metadata");
    json_t *v;
    if((v = json_object_get(vmmeta, "name")))
        json_object_set(meta, "name", v);
    if((v = json_object_get(vmmeta, "namespace")))
        json_object_set(meta, "namespace", v);
    json_object_set_new(meta, "ownerReferences",
                        json_pack("[{s:O?, s:s, s:O?, s:O?, s:b, s:b}]", "apiVersion",
                                  json_object_get(vm, "apiVersion"), "kind", "VirtualMachine", "name",
                                  json_object_get(vmmeta, "name"), "uid", json_object_get(vmmeta, "uid"),
                                  "controller", 1, "blockOwnerDeletion", 1));
    json_t *spec = json_deep_copy(json_object_get(tmpl, "spec"));
    return json_pack("{s:O?, s:s, s:o, s:o}", "apiVersion", json_object_get(vm, "apiVersion"), "kind",
                     "VirtualMachineInstance", "metadata", meta, "spec", spec ? spec : json_object());
}

int review_is_response_only(const json_t *doc)
{
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    return kind && strcmp(kind, "AdmissionReview") == 0 && !json_object_get(doc, "request") &&
           json_is_object(json_object_get(doc, "response"));
}

cozy_result review_build_request(const json_t *doc, const char *where, unsigned long seq, const review_options *opt,
                                 json_t **request, const char **api_version, int *judged_vmi, cozy_err *err)
{
    *judged_vmi = 0;
    *api_version = "admission.k8s.io/v1";
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    const char *av = json_string_value(json_object_get(doc, "apiVersion"));
    json_t *req = NULL;
    if(kind && strcmp(kind, "AdmissionReview") == 0) {
        if(!av || (strcmp(av, "admission.k8s.io/v1") && strcmp(av, "admission.k8s.io/v1beta1")))
            return cozy_fail(err, COZY_ERR_INPUT, "%s: AdmissionReview apiVersion must be admission.k8s.io/v1 (got %s)",
                             where, av ? av : "none");
        *api_version = strcmp(av, "admission.k8s.io/v1") == 0 ? "admission.k8s.io/v1" : "admission.k8s.io/v1beta1";
        json_t *r = json_object_get(doc, "request");
        if(!json_is_object(r))
            return cozy_fail(err, COZY_ERR_INPUT, "%s: AdmissionReview has no request", where);
        req = json_deep_copy(r);
    } else if(!kind && json_is_object(json_object_get(doc, "kind")) && json_object_get(doc, "operation")) {
        req = json_deep_copy(doc); /* a bare AdmissionRequest */
    }
    if(req) {
        /* the same check the webhook makes (admission/request.h) */
        cozy_result rc = admission_check_request(req, where, err);
        if(rc != COZY_OK) {
            json_decref(req);
            return rc;
        }
    } else {
        /* a plain object: wrap it as a CREATE. Manifests copied from docs
         * sometimes omit apiVersion; for the kinds cozygpu reviews it is
         * assumed, with a note. */
        if(kind && !av) {
            if(strcmp(kind, "VirtualMachineInstance") == 0 || strcmp(kind, "VirtualMachine") == 0)
                av = "kubevirt.io/v1";
            else if(strcmp(kind, "Pod") == 0)
                av = "v1";
            else if(strcmp(kind, "GPUClass") == 0 || strcmp(kind, "GPUClaim") == 0)
                av = "cozystack.io/v1alpha1";
            if(av && opt && opt->notes) {
                char note[512];
                snprintf(note, sizeof note, "%s: %s has no apiVersion; assumed %s", where, kind, av);
                json_array_append_new(opt->notes, json_string(note));
            }
        }
        if(!kind || !av)
            return cozy_fail(err, COZY_ERR_INPUT, "%s: not an AdmissionReview and not a Kubernetes object (needs apiVersion and kind)",
                             where);
        json_t *meta = json_object_get(doc, "metadata");
        const char *name = json_string_value(json_object_get(meta, "name"));
        if(!name && !json_string_value(json_object_get(meta, "generateName")) && opt && opt->notes) {
            char note[512];
            snprintf(note, sizeof note, "%s: %s has neither metadata.name nor generateName", where, kind);
            json_array_append_new(opt->notes, json_string(note));
        }
        char group[256], version[64], resource[128], uid[64];
        split_api_version(av, group, sizeof group, version, sizeof version);
        resource_of(kind, resource, sizeof resource);
        snprintf(uid, sizeof uid, "00000000-0000-4000-8000-%012lx", seq);
        const char *ns = json_string_value(json_object_get(meta, "namespace"));
        if(!ns && !is_cluster_scoped(kind))
            ns = "default";
        json_t *groups = opt && opt->groups ? json_incref((json_t *)opt->groups) : json_pack("[s]", "system:authenticated");
        json_t *object = json_deep_copy(doc);
        if(!json_object_get(object, "apiVersion"))
            json_object_set_new(object, "apiVersion", json_string(av));
        req = json_pack("{s:s, s:{s:s, s:s, s:s}, s:{s:s, s:s, s:s}, s:s, s:{s:s, s:o}, s:o, s:b, s:{s:s, s:s}}",
                        "uid", uid, "kind", "group", group, "version", version, "kind", kind, "resource", "group",
                        group, "version", version, "resource", resource, "operation", "CREATE", "userInfo",
                        "username", opt && opt->username ? opt->username : "kubernetes-admin", "groups",
                        groups, "object", object,
                        "dryRun", 0, "options", "apiVersion", "meta.k8s.io/v1", "kind", "CreateOptions");
        if(name)
            json_object_set_new(req, "name", json_string(name));
        if(ns)
            json_object_set_new(req, "namespace", json_string(ns));
    }
    /* VirtualMachine: judge the VMI its template would create */
    json_t *k = json_object_get(req, "kind");
    const char *op = json_string_value(json_object_get(req, "operation"));
    if(strcmp(json_string_value(json_object_get(k, "kind")), "VirtualMachine") == 0 &&
       strcmp(json_string_value(json_object_get(k, "group")) ? json_string_value(json_object_get(k, "group")) : "",
              "kubevirt.io") == 0 &&
       (strcmp(op, "CREATE") == 0 || strcmp(op, "UPDATE") == 0)) {
        json_t *vmi = vmi_from_vm(json_object_get(req, "object"));
        if(vmi) {
            char version_buf[64];
            const char *v0 = json_string_value(json_object_get(k, "version"));
            snprintf(version_buf, sizeof version_buf, "%s", v0 ? v0 : "v1");
            const char *version = version_buf; /* k is replaced below */
            json_object_set_new(req, "kind", json_pack("{s:s, s:s, s:s}", "group", "kubevirt.io", "version",
                                                       version ? version : "v1", "kind", "VirtualMachineInstance"));
            json_object_set_new(req, "resource",
                                json_pack("{s:s, s:s, s:s}", "group", "kubevirt.io", "version",
                                          version ? version : "v1", "resource", "virtualmachineinstances"));
            json_object_set_new(req, "operation", json_string("CREATE"));
            json_object_set_new(req, "object", vmi);
            json_object_del(req, "oldObject");
            json_object_del(req, "requestKind");
            json_object_del(req, "requestResource");
            *judged_vmi = 1;
        }
    }
    *request = req;
    return COZY_OK;
}

cozy_result review_document(engine *e, const json_t *doc, const char *where, unsigned long seq,
                            const review_options *opt, json_t **out, engine_outcome *outcome, cozy_err *err)
{
    json_t *req = NULL;
    const char *api_version;
    int judged = 0;
    cozy_result rc = review_build_request(doc, where, seq, opt, &req, &api_version, &judged, err);
    if(rc != COZY_OK)
        return rc;
    engine_verdict v;
    cozy_err eerr = {{0}};
    if(engine_review(e, req, opt ? opt->phases : ENGINE_BOTH, &v, &eerr) != COZY_OK) {
        /* fail closed: the library itself failed */
        char msg[sizeof eerr.msg + 32];
        snprintf(msg, sizeof msg, "cozygpu internal error: %s", eerr.msg);
        v.response = admission_refusal(req, 500, msg);
        v.outcome = ENGINE_POLICY_ERROR;
    }
    json_t *resp = v.response;
    if(outcome)
        *outcome = v.outcome;
    if(judged) {
        json_t *meta = json_object_get(json_object_get(req, "object"), "metadata");
        char note[512];
        snprintf(note, sizeof note, "VirtualMachineInstance from spec.template of VirtualMachine %s/%s",
                 json_string_value(json_object_get(meta, "namespace")) ? json_string_value(json_object_get(meta, "namespace")) : "",
                 json_string_value(json_object_get(meta, "name")) ? json_string_value(json_object_get(meta, "name")) : "");
        json_t *aa = json_object_get(resp, "auditAnnotations");
        if(!json_is_object(aa)) {
            aa = json_object();
            json_object_set_new(resp, "auditAnnotations", aa);
        }
        json_object_set_new(aa, "gpu.cozystack.io/judged-as", json_string(note));
    }
    *out = admission_envelope(api_version, resp);
    json_decref(req);
    return COZY_OK;
}

json_t *review_decode_patch(const json_t *response)
{
    const char *s = json_string_value(json_object_get(response, "patch"));
    if(!s)
        return NULL;
    /* the API server reads `patch` ([]byte in Go) with base64.StdEncoding */
    unsigned char *buf = NULL;
    size_t n = 0;
    if(cozy_base64_decode(s, strlen(s), &buf, &n) != 0)
        return NULL;
    json_t *ops = json_loadb((const char *)buf, n, 0, NULL);
    free(buf);
    return ops;
}
