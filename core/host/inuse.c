/* inuse.c — the agent's reads of /proc (inuse.h): which PCI functions a
 * process holds through VFIO, and the boot id.
 */
#include "host/inuse.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

/* Ceiling on the /proc files read whole here (comm is at most 16 bytes,
 * boot_id 37): one page. */
#define INUSE_MAX_SMALL 4096

static int all_digits(const char *s)
{
    if(!*s)
        return 0;
    for(; *s; s++)
        if(*s < '0' || *s > '9')
            return 0;
    return 1;
}

/* Reads a small file into buf (n bytes; what does not fit is cut off),
 * trimming the trailing newline. -1 on error. */
static int read_small(const char *path, char *buf, size_t n)
{
    char *data;
    size_t got;
    if(cozy_read_file(path, INUSE_MAX_SMALL, &data, &got) != 0)
        return -1;
    if(got > n - 1)
        got = n - 1;
    memcpy(buf, data, got);
    free(data);
    buf[got] = 0;
    while(got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == ' '))
        buf[--got] = 0;
    return 0;
}

cozy_result inuse_scan(const char *proc_root, const char *sysfs_root, const json_t *inventory, json_t **out,
                       cozy_err *err)
{
    *out = NULL;
    DIR *d = opendir(proc_root);
    if(!d)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", proc_root, strerror(errno));
    json_t *groups = json_object(), *cdevs = json_object();
    struct dirent *de;
    char path[PATH_MAX], target[256], comm[64], why[512], blind[512] = "";
    while((de = readdir(d))) {
        if(!all_digits(de->d_name))
            continue;
        snprintf(path, sizeof path, "%s/%s/fd", proc_root, de->d_name);
        DIR *fd = opendir(path);
        if(!fd) {
            /* gone (ENOENT, ESRCH): fine; not readable: cannot tell (below) */
            if((errno == EACCES || errno == EPERM) && !blind[0])
                snprintf(blind, sizeof blind, "%.300s: %.64s", path, strerror(errno));
            continue;
        }
        int have_comm = 0;
        struct dirent *fe;
        while((fe = readdir(fd))) {
            if(fe->d_name[0] == '.')
                continue;
            ssize_t len = readlinkat(dirfd(fd), fe->d_name, target, sizeof target - 1);
            if(len < 0 && (errno == EACCES || errno == EPERM) && !blind[0])
                snprintf(blind, sizeof blind, "%.300s/%.64s: %.64s", path, fe->d_name, strerror(errno));
            if(len <= 0)
                continue;
            target[len] = 0;
            if(strncmp(target, "/dev/vfio/", 10) != 0)
                continue;
            const char *rest = target + 10;
            json_t *into = NULL;
            const char *key = NULL;
            if(strncmp(rest, "devices/", 8) == 0 && rest[8])
                into = cdevs, key = rest + 8;
            else if(all_digits(rest))
                into = groups, key = rest;
            if(!into || json_object_get(into, key))
                continue;
            if(!have_comm) {
                char comm_path[PATH_MAX];
                snprintf(comm_path, sizeof comm_path, "%s/%s/comm", proc_root, de->d_name);
                if(read_small(comm_path, comm, sizeof comm) != 0)
                    comm[0] = 0;
                have_comm = 1;
            }
            if(comm[0])
                snprintf(why, sizeof why, "pid %.20s (%.63s) holds %.255s", de->d_name, comm, target);
            else
                snprintf(why, sizeof why, "pid %.20s holds %.255s", de->d_name, target);
            json_object_set_new(into, key, json_string(why));
        }
        closedir(fd);
    }
    closedir(d);

    json_t *res = json_object();
    size_t i;
    const json_t *fn;
    json_array_foreach(json_object_get(inventory, "functions"), i, fn)
    {
        const char *addr = json_string_value(json_object_get(fn, "address"));
        if(!addr)
            continue;
        const json_t *g = json_object_get(fn, "iommuGroup");
        if(json_is_integer(g)) {
            char k[32];
            snprintf(k, sizeof k, "%lld", (long long)json_integer_value(g));
            const json_t *w = json_object_get(groups, k);
            if(w) {
                json_object_set(res, addr, (json_t *)w);
                continue;
            }
        }
        if(json_object_size(cdevs) == 0)
            continue;
        snprintf(path, sizeof path, "%s/bus/pci/devices/%s/vfio-dev", sysfs_root, addr);
        DIR *vd = opendir(path);
        if(!vd)
            continue;
        while((de = readdir(vd))) {
            const json_t *w = json_object_get(cdevs, de->d_name);
            if(w) {
                json_object_set(res, addr, (json_t *)w);
                break;
            }
        }
        closedir(vd);
    }
    if(blind[0]) {
        /* fail closed: a process we cannot see may hold any function */
        snprintf(why, sizeof why, "cannot tell whether a VM holds it (%.300s); the agent needs CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE", blind);
        json_array_foreach(json_object_get(inventory, "functions"), i, fn)
        {
            const char *addr = json_string_value(json_object_get(fn, "address"));
            if(addr && !json_object_get(res, addr))
                json_object_set_new(res, addr, json_string(why));
        }
    }
    json_decref(groups);
    json_decref(cdevs);
    *out = res;
    return COZY_OK;
}

int inuse_boot_id(const char *proc_root, char *buf, size_t size)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/sys/kernel/random/boot_id", proc_root);
    if(read_small(path, buf, size) != 0) {
        buf[0] = 0;
        return -1;
    }
    return 0;
}
