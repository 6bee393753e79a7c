/* cluster.c — the cluster view the policies read: the watch caches as one
 * JSON array (internal.h, ctl_cluster_). What is watched, and why a cached
 * read is enough for each decision, is docs/decisions/0008.
 */
#include "controller/internal.h"

#include <stdio.h>
#include <string.h>

#include "format/kobject.h"

json_t *ctl_cluster_with_kind(json_t *obj, const kube_resource *r)
{
    char av[128];
    if(*r->group)
        snprintf(av, sizeof av, "%s/%s", r->group, r->version);
    else
        snprintf(av, sizeof av, "%s", r->version);
    return kobject_with_kind(obj, av, r->kind);
}

json_t *ctl_cluster_snapshot(void)
{
    json_t *all = json_array();
    for(int i = 0; i < ctl_proc->n_cluster_inf; i++) {
        /* kind and apiVersion of the version listed (a DRA kind may be
           read at an older one) */
        const kube_resource *r = NULL;
        json_t *items = kube_informer_list_served(ctl_proc->cluster_inf[i], &r);
        if(!r)
            r = kube_informer_resource(ctl_proc->cluster_inf[i]);
        size_t j;
        json_t *o;
        json_array_foreach(items, j, o) json_array_append_new(all, ctl_cluster_with_kind(o, r));
        json_decref(items);
    }
    return all;
}

kube_informer *ctl_cluster_informer(const kube_resource *r)
{
    for(int i = 0; i < ctl_proc->n_cluster_inf; i++)
        if(kube_informer_resource(ctl_proc->cluster_inf[i]) == r)
            return ctl_proc->cluster_inf[i];
    return NULL;
}

/* Annotations kept whatever their size: the ones cozygpu's rules and the
 * leader read (the claims list, the billing annotation, decisions 0019,
 * 0028). */
static int strip_keep_annotation(const char *key)
{
    return strncmp(key, "gpu.cozystack.io/", 17) == 0 || strncmp(key, "workload.cozystack.io/", 22) == 0;
}

/* The cloud-init payloads of a list of KubeVirt volumes (spec.volumes of a
 * VMI, spec.template.spec.volumes of a VM): kubevirt.io/api/core/v1
 * CloudInitNoCloudSource and CloudInitConfigDriveSource. */
static void strip_cloud_init(json_t *volumes)
{
    static const char *const sources[] = {"cloudInitNoCloud", "cloudInitConfigDrive"};
    static const char *const fields[] = {"userData", "userDataBase64", "networkData", "networkDataBase64"};
    size_t i;
    json_t *v;
    json_array_foreach(volumes, i, v)
    {
        for(size_t s = 0; s < sizeof sources / sizeof *sources; s++) {
            json_t *src = json_object_get(v, sources[s]);
            for(size_t f = 0; json_is_object(src) && f < sizeof fields / sizeof *fields; f++)
                json_object_del(src, fields[f]);
        }
    }
}

/* What a container carries that no rule or the leader reads (core/v1
 * Container env, command, args). */
static void strip_containers(json_t *containers)
{
    size_t i;
    json_t *c;
    json_array_foreach(containers, i, c)
    {
        json_object_del(c, "env");
        json_object_del(c, "command");
        json_object_del(c, "args");
    }
}

void ctl_cluster_strip(const kube_resource *r, json_t *obj)
{
    json_t *md = json_object_get(obj, "metadata");
    if(json_is_object(md)) {
        json_object_del(md, "managedFields");
        json_t *an = json_object_get(md, "annotations");
        if(json_is_object(an)) {
            const char *k;
            json_t *v;
            void *tmp;
            json_object_foreach_safe(an, tmp, k, v)
            {
                if(strip_keep_annotation(k))
                    continue;
                if(strcmp(k, "kubectl.kubernetes.io/last-applied-configuration") == 0 ||
                   !json_is_string(v) || json_string_length(v) > CTL_CLUSTER_ANNOTATION_MAX)
                    json_object_del(an, k);
            }
        }
    }
    json_t *spec = json_object_get(obj, "spec");
    if(r == &KUBE_VMIS)
        strip_cloud_init(json_object_get(spec, "volumes"));
    else if(r == &KUBE_VMS)
        strip_cloud_init(json_object_get(json_object_get(json_object_get(spec, "template"), "spec"), "volumes"));
    else if(r == &KUBE_PODS) {
        strip_containers(json_object_get(spec, "containers"));
        strip_containers(json_object_get(spec, "initContainers"));
    }
}
