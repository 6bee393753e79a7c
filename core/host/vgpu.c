/* vgpu.c — the vGPU and mediated-device types of a function (internal.h):
 * nvidia/creatable_vgpu_types (NVIDIA vGPU software, "Virtual GPU Software
 * User Guide", creating vGPUs on Linux with KVM) and mdev_supported_types/
 * (Linux sysfs ABI Documentation/ABI/testing/sysfs-bus-vfio-mdev and
 * Documentation/driver-api/vfio-mediated-device.rst). File formats:
 * ../shared/fixtures/sysfs/LAYOUT.md; output: docs/gpunode.md.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "host/internal.h"

/* `creatable_vgpu_types`: a header line (`ID    : vGPU Name`), then one
 * `<id> : <name>` row per type. Lines that are not such a row (the header,
 * blank lines) are skipped, so a file without the header reads the same. */
json_t *vgpu_parse_creatable(const char *text)
{
    json_t *arr = json_array();
    const char *p = text;
    while(arr && *p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        const char *q = p, *end = p + len;
        p = eol ? eol + 1 : p + len;
        while(q < end && (*q == ' ' || *q == '\t'))
            q++;
        const char *digits = q;
        long long id = 0;
        while(q < end && *q >= '0' && *q <= '9' && q - digits < 18)
            id = id * 10 + (*q++ - '0');
        if(q == digits || (q < end && *q >= '0' && *q <= '9'))
            continue;
        while(q < end && (*q == ' ' || *q == '\t'))
            q++;
        if(q == end || *q != ':')
            continue;
        q++;
        while(q < end && (*q == ' ' || *q == '\t'))
            q++;
        while(end > q && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
            end--;
        if(end == q)
            continue;
        json_t *row = json_object();
        json_object_set_new(row, "id", json_integer(id));
        json_object_set_new(row, "name", sysfs_text(q, (size_t)(end - q)));
        json_array_append_new(arr, row);
    }
    return arr;
}

typedef struct mdev_entry {
    char *type;
    json_t *obj;
} mdev_entry;

/* the numeric suffix of an mdev type name ("nvidia-742" -> 742); types
 * without one sort after, by name */
static int type_suffix(const char *t, unsigned long long *v)
{
    size_t len = strlen(t), i = len;
    while(i > 0 && t[i - 1] >= '0' && t[i - 1] <= '9')
        i--;
    if(i == len || len - i > 18)
        return 0;
    *v = strtoull(t + i, NULL, 10);
    return 1;
}

static int cmp_mdev(const void *a, const void *b)
{
    const mdev_entry *x = a, *y = b;
    unsigned long long vx, vy;
    int hx = type_suffix(x->type, &vx), hy = type_suffix(y->type, &vy);
    if(hx != hy)
        return hx ? -1 : 1;
    if(hx && vx != vy)
        return vx < vy ? -1 : 1;
    return strcmp(x->type, y->type);
}

static int not_hidden(const char *name, void *ctx)
{
    (void)ctx;
    return name[0] != '.';
}

/* The entry names of directory `path` (without those starting with '.'),
 * sorted bytewise, as they are (to build paths; sysfs_text them for the
 * output); *found 0 when it does not exist. */
static cozy_result list_dir(const char *path, char ***out, size_t *nout, int *found, cozy_err *err)
{
    *out = NULL;
    *nout = 0;
    *found = 0;
    int e = cozy_list_dir(path, not_hidden, NULL, out, nout);
    if(e == ENOENT || e == ENOTDIR)
        return COZY_OK;
    if(e == ENOMEM)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    if(e)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(e));
    *found = 1;
    return COZY_OK;
}

/* An optional text file of an mdev type into o[key] (omitted when absent). */
static cozy_result mdev_text(json_t *o, const char *tdir, const char *file, const char *key, char *buf,
                             cozy_err *err)
{
    int found;
    cozy_result rc = sysfs_read_attr(tdir, file, buf, &found, err);
    if(rc == COZY_OK && found)
        json_object_set_new(o, key, sysfs_text0(buf));
    return rc;
}

/* mdev_supported_types/<type>/ of function directory `dir`: *out is NULL
 * when the function is not a mediated-device parent. */
cozy_result vgpu_read_mdev(const char *dir, char *buf, json_t **out, cozy_err *err)
{
    char base[INVENTORY_MAX_PATH], tdir[INVENTORY_MAX_PATH], path[INVENTORY_MAX_PATH];
    cozy_result rc;
    char **types = NULL;
    size_t nt = 0;
    int found;
    *out = NULL;
    if((rc = sysfs_join(base, sizeof base, dir, "mdev_supported_types", err)) != COZY_OK)
        return rc;
    if((rc = list_dir(base, &types, &nt, &found, err)) != COZY_OK || !found)
        return rc;
    mdev_entry *ents = calloc(nt ? nt : 1, sizeof *ents);
    if(!ents) {
        cozy_free_names(types, nt);
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    }
    size_t n = 0;
    for(size_t i = 0; i < nt && rc == COZY_OK; i++) {
        const char *type = types[i];
        struct stat st;
        if((rc = sysfs_join(tdir, sizeof tdir, base, type, err)) != COZY_OK)
            break;
        if(stat(tdir, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        json_t *o = json_object();
        json_object_set_new(o, "type", sysfs_text0(type));
        if((rc = mdev_text(o, tdir, "name", "name", buf, err)) != COZY_OK) {
            json_decref(o);
            break;
        }
        if((rc = sysfs_read_attr(tdir, "available_instances", buf, &found, err)) != COZY_OK) {
            json_decref(o);
            break;
        }
        long long v;
        if(found && sysfs_parse_dec(buf, 0, &v))
            json_object_set_new(o, "availableInstances", json_integer(v));
        if((rc = mdev_text(o, tdir, "device_api", "deviceAPI", buf, err)) != COZY_OK ||
           (rc = mdev_text(o, tdir, "description", "description", buf, err)) != COZY_OK) {
            json_decref(o);
            break;
        }
        char **devs = NULL;
        size_t nd = 0;
        if((rc = sysfs_join(path, sizeof path, tdir, "devices", err)) != COZY_OK ||
           (rc = list_dir(path, &devs, &nd, &found, err)) != COZY_OK) {
            json_decref(o);
            break;
        }
        if(nd) {
            json_t *a = json_array();
            for(size_t k = 0; k < nd; k++)
                json_array_append_new(a, sysfs_text0(devs[k]));
            json_object_set_new(o, "devices", a);
        }
        cozy_free_names(devs, nd);
        ents[n].type = (char *)type;
        ents[n].obj = o;
        n++;
    }
    if(rc == COZY_OK) {
        if(n > 1)
            qsort(ents, n, sizeof *ents, cmp_mdev);
        *out = json_array();
        for(size_t i = 0; i < n; i++)
            json_array_append(*out, ents[i].obj);
    }
    for(size_t i = 0; i < n; i++)
        json_decref(ents[i].obj);
    free(ents);
    cozy_free_names(types, nt);
    return rc;
}
