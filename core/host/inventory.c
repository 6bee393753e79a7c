/* inventory.c — the node's NVIDIA PCI functions (inventory.h,
 * docs/gpunode.md): runs the libpci phase (pci.c) and the sysfs phase
 * (sysfs.c, vgpu.c) and assembles their results into the inventory JSON —
 * roles, models, the board a function belongs to, counted IOMMU groups,
 * vfIndex, vGPU type names. The table for people is table.c.
 */
#include "host/inventory.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/internal.h"

static const char *role_of(unsigned cls)
{
    switch(cls) {
    case 0x0300:
    case 0x0302: return "GPU";
    case 0x0403: return "Audio";
    case 0x0c03: return "USB";
    case 0x0c80: return "SerialBus";
    case 0x0680: return "NVSwitch";
    default: return "Other";
    }
}

static int is_gpu(const fn_pci *f)
{
    return strcmp(role_of(f->cls), "GPU") == 0;
}

/* the text in the last [...] of a PCI ID database name, else the name */
static json_t *model_of(const char *name)
{
    const char *open = strrchr(name, '[');
    const char *close = open ? strchr(open, ']') : NULL;
    if(open && close && close > open + 1)
        return json_stringn(open + 1, (size_t)(close - open - 1));
    return json_string(name);
}

static long find_addr(const fn_pci *fns, size_t n, const char *addr)
{
    for(size_t i = 0; i < n; i++)
        if(strcmp(fns[i].addr, addr) == 0)
            return (long)i;
    return -1;
}

static const char *creatable_name(const json_t *creatable, long long type)
{
    size_t i;
    json_t *row;
    json_array_foreach(creatable, i, row) {
        if(json_integer_value(json_object_get(row, "id")) == type)
            return json_string_value(json_object_get(row, "name"));
    }
    return NULL;
}

/* typeName of function i's current type: its own list, else those of the
 * other functions of the same PF (the PF and its VFs), in address order */
static const char *resolve_type_name(const fn_pci *fns, const fn_sys *xs, size_t n, size_t i)
{
    const char *name = creatable_name(xs[i].creatable, xs[i].vgpu_type);
    if(name)
        return name;
    const char *pf = xs[i].physfn[0] ? xs[i].physfn : fns[i].addr;
    for(size_t k = 0; k < n; k++) {
        if(k == i || !xs[k].creatable)
            continue;
        if(strcmp(fns[k].addr, pf) != 0 && strcmp(xs[k].physfn, pf) != 0)
            continue;
        if((name = creatable_name(xs[k].creatable, xs[i].vgpu_type)))
            return name;
    }
    return NULL;
}

static json_t *hex_string(unsigned v, int digits)
{
    char b[16];
    snprintf(b, sizeof b, "%0*x", digits, v);
    return json_string(b);
}

static json_t *build_function(const fn_pci *fns, const fn_sys *xs, size_t n, size_t i)
{
    const fn_pci *f = &fns[i];
    const fn_sys *x = &xs[i];
    const char *role = role_of(f->cls);
    json_t *o = json_object();
    json_object_set_new(o, "address", json_string(f->addr));
    json_object_set_new(o, "vendorID", hex_string(f->vendor, 4));
    json_object_set_new(o, "deviceID", hex_string(f->device, 4));
    if(f->subsys_vendor >= 0) {
        json_object_set_new(o, "subsystemVendorID", hex_string((unsigned)f->subsys_vendor, 4));
        json_object_set_new(o, "subsystemDeviceID", hex_string((unsigned)f->subsys_device, 4));
    }
    if(f->rev >= 0)
        json_object_set_new(o, "revision", hex_string((unsigned)f->rev, 2));
    json_object_set_new(o, "class", hex_string(f->cls, 4));
    json_object_set_new(o, "role", json_string(role));
    json_t *name = f->name ? sysfs_text0(f->name) : NULL;
    if(name) {
        json_object_set_new(o, "name", name);
        json_object_set_new(o, "model", model_of(json_string_value(name)));
    }
    if(f->driver)
        json_object_set_new(o, "driver", sysfs_text0(f->driver));
    if(f->iommu >= 0)
        json_object_set_new(o, "iommuGroup", json_integer(f->iommu));
    if(x->has_numa)
        json_object_set_new(o, "numaNode", json_integer(x->numa));
    if(x->has_total) {
        json_t *s = json_object();
        json_object_set_new(s, "totalVFs", json_integer(x->total_vfs));
        if(x->has_num)
            json_object_set_new(s, "numVFs", json_integer(x->num_vfs));
        json_object_set_new(o, "sriov", s);
    }
    if(x->nvfs) {
        json_t *a = json_array();
        for(size_t k = 0; k < x->nvfs; k++)
            json_array_append_new(a, json_string(x->vfs[k].addr));
        json_object_set_new(o, "virtualFunctions", a);
    }
    if(x->physfn[0]) {
        json_object_set_new(o, "physicalFunction", json_string(x->physfn));
        if(x->vf_index >= 0)
            json_object_set_new(o, "vfIndex", json_integer(x->vf_index));
    }
    if(!strcmp(role, "Audio") || !strcmp(role, "USB") || !strcmp(role, "SerialBus")) {
        for(size_t k = 0; k < n; k++) {
            if(is_gpu(&fns[k]) && fns[k].domain == f->domain && fns[k].bus == f->bus && fns[k].dev == f->dev) {
                json_object_set_new(o, "gpu", json_string(fns[k].addr));
                break;
            }
        }
    }
    if(is_gpu(f)) {
        int counted = 1;
        for(size_t k = 0; k < i && f->iommu >= 0; k++)
            if(is_gpu(&fns[k]) && fns[k].iommu == f->iommu)
                counted = 0;
        json_object_set_new(o, "counted", json_boolean(counted));
    }
    if(x->has_nvidia) {
        json_t *g = json_object();
        if(x->has_type) {
            json_object_set_new(g, "type", json_integer(x->vgpu_type));
            const char *tn = x->vgpu_type ? resolve_type_name(fns, xs, n, i) : NULL;
            if(tn) {
                json_object_set_new(g, "typeName", json_string(tn));
                const char *end = tn + strlen(tn);
                while(end > tn && (end[-1] == ' ' || end[-1] == '\t'))
                    end--;
                const char *w = end;
                while(w > tn && w[-1] != ' ' && w[-1] != '\t')
                    w--;
                json_object_set_new(g, "profile", json_stringn(w, (size_t)(end - w)));
            }
        }
        if(x->creatable)
            json_object_set(g, "creatable", x->creatable);
        json_object_set_new(o, "vgpu", g);
    }
    if(x->mdev)
        json_object_set(o, "mdevTypes", x->mdev);
    return o;
}

/* vfIndex of each VF: the N of the PF's virtfn<N> pointing at it */
static cozy_result resolve_vf_indexes(const char *devdir, const fn_pci *fns, fn_sys *xs, size_t n, cozy_err *err)
{
    for(size_t i = 0; i < n; i++) {
        if(!xs[i].physfn[0])
            continue;
        long p = find_addr(fns, n, xs[i].physfn);
        vf_link *own = NULL;
        const vf_link *vfs;
        size_t nvfs;
        if(p >= 0) {
            vfs = xs[p].vfs;
            nvfs = xs[p].nvfs;
        } else { /* the PF is not listed (not NVIDIA?): read its links */
            char dir[INVENTORY_MAX_PATH];
            int missing;
            cozy_result rc;
            if((rc = sysfs_join(dir, sizeof dir, devdir, xs[i].physfn, err)) != COZY_OK ||
               (rc = sysfs_read_virtfns(dir, &own, &nvfs, &missing, err)) != COZY_OK)
                return rc;
            vfs = own;
        }
        for(size_t k = 0; k < nvfs; k++)
            if(strcmp(vfs[k].addr, fns[i].addr) == 0) {
                xs[i].vf_index = (long long)vfs[k].n;
                break;
            }
        free(own);
    }
    return COZY_OK;
}

cozy_result inventory_scan(const inventory_options *o, json_t **out, cozy_err *err)
{
    const char *root = o && o->sysfs_root ? o->sysfs_root : "/sys";
    const char *mname = o && o->pci_method ? o->pci_method : "linux-sysfs";
    const char *ids = o ? o->pci_ids : NULL;
    char pcidir[INVENTORY_MAX_PATH], devdir[INVENTORY_MAX_PATH];
    cozy_result rc;
    int method;
    *out = NULL;

    if((rc = pciscan_method(mname, &method, err)) != COZY_OK)
        return rc;
    int strict = strcmp(mname, "linux-sysfs") == 0;
    if((rc = sysfs_join(pcidir, sizeof pcidir, root, "bus/pci", err)) != COZY_OK ||
       (rc = sysfs_join(devdir, sizeof devdir, pcidir, "devices", err)) != COZY_OK)
        return rc;
    struct stat st;
    if(stat(devdir, &st) != 0)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s (is %s a sysfs root?)", devdir, strerror(errno), root);
    if(!S_ISDIR(st.st_mode))
        return cozy_fail(err, COZY_ERR_IO, "%s: not a directory (is %s a sysfs root?)", devdir, root);
    if((rc = pciscan_check_tree(devdir, ids, strict, err)) != COZY_OK)
        return rc;

    char *buf = malloc(INVENTORY_MAX_ATTR + 1);
    fn_pci *fns = NULL;
    size_t n = 0;
    fn_sys *xs = NULL;
    json_t *functions = NULL;
    if(!buf) {
        rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        goto out;
    }
    if((rc = pciscan_read(pcidir, devdir, method, strict, ids, buf, &fns, &n, err)) != COZY_OK)
        goto out;
    if(n && !(xs = calloc(n, sizeof *xs))) {
        rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        goto out;
    }
    for(size_t i = 0; i < n; i++)
        if((rc = sysfs_read_function(devdir, &fns[i], strict, buf, &xs[i], err)) != COZY_OK)
            goto out;
    if((rc = resolve_vf_indexes(devdir, fns, xs, n, err)) != COZY_OK)
        goto out;
    functions = json_array();
    for(size_t i = 0; i < n; i++)
        json_array_append_new(functions, build_function(fns, xs, n, i));
    *out = json_object();
    if(!*out || !functions) {
        json_decref(*out);
        *out = NULL;
        rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        goto out;
    }
    json_object_set(*out, "functions", functions);
out:
    json_decref(functions);
    for(size_t i = 0; xs && i < n; i++)
        sysfs_function_free(&xs[i]);
    free(xs);
    pciscan_free(fns, n);
    free(buf);
    return rc;
}
