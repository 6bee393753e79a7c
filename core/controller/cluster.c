/* cluster.c — the cluster view the policies read: the watch caches as one
 * JSON array (internal.h, ctl_cluster_). What is watched, and why a cached
 * read is enough for each decision, is docs/decisions/0008.
 */
#include "controller/internal.h"

#include <stdio.h>

json_t *ctl_cluster_with_kind(json_t *obj, const kube_resource *r)
{
    if(json_object_get(obj, "kind"))
        return json_incref(obj);
    json_t *c = json_copy(obj);
    char av[128];
    if(*r->group)
        snprintf(av, sizeof av, "%s/%s", r->group, r->version);
    else
        snprintf(av, sizeof av, "%s", r->version);
    json_object_set_new(c, "apiVersion", json_string(av));
    json_object_set_new(c, "kind", json_string(r->kind));
    return c;
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
