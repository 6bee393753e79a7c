/* pci.c — the libpci phase of the inventory (internal.h): identity,
 * class, revision, subsystem ids, IOMMU group, driver and PCI ID database
 * name of every 0x10de function.
 *
 * Every scan opens and closes its own pci_access. libpci's fatal-error
 * callback longjmps back to pciscan_read (never past it), which then closes
 * the handle, so a function that vanishes is an error result and not an
 * exit; warnings are counted and otherwise dropped.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pci/pci.h>

#include "base/buf.h"
#include "host/internal.h"

/* Ceiling on a PCI ID database name. */
#define INVENTORY_MAX_NAME 512

typedef struct scan_state {
    jmp_buf jb;                 /* libpci's error callback returns here */
    char msg[1024];             /* libpci's fatal message */
    unsigned long warnings;     /* libpci warnings so far */
    int strict;                 /* linux-sysfs: libpci reads files under devdir */
    const char *devdir;         /* <root>/bus/pci/devices */
    char *buf;                  /* INVENTORY_MAX_ATTR + 1 bytes, for sysfs_read_attr */
    fn_pci *fns;
    size_t n, cap;
} scan_state;

/* libpci's callbacks take no context pointer, hence one per thread. */
static _Thread_local scan_state *tl_scan;

static void on_pci_error(char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void on_pci_error(char *fmt, ...)
{
    scan_state *s = tl_scan;
    if(!s)
        abort(); /* a libpci call outside pciscan_read(): a bug here */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->msg, sizeof s->msg, fmt, ap);
    va_end(ap);
    size_t len = strlen(s->msg);
    while(len && (s->msg[len - 1] == '\n' || s->msg[len - 1] == ' '))
        s->msg[--len] = 0;
    longjmp(s->jb, 1);
}

static void on_pci_warning(char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void on_pci_warning(char *fmt, ...)
{
    (void)fmt; /* e.g. "Cannot open .../config" on trees without config space */
    if(tl_scan)
        tl_scan->warnings++;
}

static void on_pci_debug(char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void on_pci_debug(char *fmt, ...)
{
    (void)fmt;
}

static void fn_pci_free(fn_pci *f)
{
    free(f->driver);
    free(f->name);
}

static int cmp_fn_pci(const void *a, const void *b)
{
    const fn_pci *x = a, *y = b;
    if(x->domain != y->domain)
        return x->domain < y->domain ? -1 : 1;
    if(x->bus != y->bus)
        return x->bus < y->bus ? -1 : 1;
    if(x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    if(x->func != y->func)
        return x->func < y->func ? -1 : 1;
    return 0;
}

/* Lists the method names libpci knows into buf, for the error message. */
static void known_methods(char *buf, size_t size)
{
    size_t o = 0;
    buf[0] = 0;
    for(int i = 0;; i++) {
        char *name = pci_get_method_name(i);
        if(!name)
            break;
        if(!*name)
            continue;
        int w = snprintf(buf + o, size - o, "%s%s", o ? ", " : "", name);
        if(w < 0 || (size_t)w >= size - o)
            break;
        o += (size_t)w;
    }
}

/* The sysfs scan of libpci gives up (and leaks its directory handle) on an
 * entry that is not a PCI address; refuse such a tree before it starts. */
static cozy_result check_entries(const char *devdir, cozy_err *err)
{
    DIR *d = opendir(devdir);
    if(!d)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", devdir, strerror(errno));
    struct dirent *e;
    cozy_result rc = COZY_OK;
    while((e = readdir(d))) {
        unsigned dom, bus, dev;
        int func;
        char tail;
        if(e->d_name[0] == '.')
            continue;
        if(sscanf(e->d_name, "%x:%x:%x.%d%c", &dom, &bus, &dev, &func, &tail) != 4 || dom > 0x7fffffff) {
            rc = cozy_fail(err, COZY_ERR_IO, "%s/%s: not a PCI address", devdir, e->d_name);
            break;
        }
    }
    closedir(d);
    return rc;
}

/* the files libpci's linux-sysfs method opens (blocking) for what we ask
 * of it: the identity of every function, then the rest of an NVIDIA one
 * (`config` when `revision` or the subsystem files are absent) */
static const char *const ident_files[] = {"vendor", "device", "class", NULL};
static const char *const nvidia_files[] = {"revision", "config", NULL};

/* linux-sysfs only: refuses a function whose files libpci would open
 * (`files`) when one is a FIFO, a device or a directory, before libpci
 * blocks on it. */
static cozy_result check_pci_files(const scan_state *s, const struct pci_dev *d, const char *const *files,
                                   cozy_err *err)
{
    char dir[INVENTORY_MAX_PATH], addr[32];
    cozy_result rc;
    snprintf(addr, sizeof addr, "%04x:%02x:%02x.%u", (unsigned)d->domain, d->bus, d->dev, d->func);
    if((rc = sysfs_join(dir, sizeof dir, s->devdir, addr, err)) != COZY_OK)
        return rc;
    for(; *files; files++)
        if((rc = sysfs_check_regular(dir, *files, err)) != COZY_OK)
            return rc;
    return COZY_OK;
}

/* linux-sysfs only: the subsystem ids from `subsystem_vendor` and
 * `subsystem_device` ("0x%04x"). *have 0 when `subsystem_vendor` is absent
 * (libpci then reads both from config space); else *sv and *sd are the two
 * ids, or -1 when either file is absent or not such an id (libpci would
 * report the missing half as 0). */
static cozy_result read_subsys(const scan_state *s, const char *addr, int *have, int *sv, int *sd, cozy_err *err)
{
    char dir[INVENTORY_MAX_PATH];
    cozy_result rc;
    int found;
    unsigned v, d;
    *have = 0;
    *sv = *sd = -1;
    if((rc = sysfs_join(dir, sizeof dir, s->devdir, addr, err)) != COZY_OK ||
       (rc = sysfs_read_attr(dir, "subsystem_vendor", s->buf, &found, err)) != COZY_OK || !found)
        return rc;
    *have = 1;
    if(!sysfs_parse_hex_id(s->buf, &v))
        return COZY_OK;
    if((rc = sysfs_read_attr(dir, "subsystem_device", s->buf, &found, err)) != COZY_OK)
        return rc;
    if(found && sysfs_parse_hex_id(s->buf, &d)) {
        *sv = (int)v;
        *sd = (int)d;
    }
    return COZY_OK;
}

/* Copies one NVIDIA function out of libpci. Every libpci call (each may
 * longjmp) happens before anything is allocated. */
static cozy_result copy_function(struct pci_access *a, struct pci_dev *d, scan_state *s, cozy_err *err)
{
    fn_pci f;
    cozy_result rc;
    memset(&f, 0, sizeof f);
    f.domain = (unsigned)d->domain;
    f.bus = d->bus;
    f.dev = d->dev;
    f.func = d->func;
    snprintf(f.addr, sizeof f.addr, "%04x:%02x:%02x.%u", f.domain, f.bus, f.dev, f.func);
    f.vendor = d->vendor_id;
    f.device = d->device_id;
    f.cls = d->device_class;
    if(s->strict && (rc = check_pci_files(s, d, nvidia_files, err)) != COZY_OK)
        return rc;

    /* without a `revision` file libpci reads config space, and warns when
     * that is unreadable too (fake trees): then the revision is unknown */
    unsigned long w = s->warnings;
    pci_fill_info(d, PCI_FILL_CLASS_EXT);
    f.rev = s->warnings == w ? d->rev_id : -1;
    /* both subsystem ids or neither: from their two files when
     * `subsystem_vendor` exists, else libpci's values from config space */
    int have = 0;
    if(s->strict && (rc = read_subsys(s, f.addr, &have, &f.subsys_vendor, &f.subsys_device, err)) != COZY_OK)
        return rc;
    if(!have) {
        w = s->warnings;
        int known = pci_fill_info(d, PCI_FILL_SUBSYS);
        if((known & PCI_FILL_SUBSYS) && s->warnings == w) {
            f.subsys_vendor = d->subsys_vendor_id;
            f.subsys_device = d->subsys_id;
        } else
            f.subsys_vendor = f.subsys_device = -1;
    }
    /* numa_node is read with the SR-IOV files (read_sys): libpci takes
     * garbage for node 0 */
    pci_fill_info(d, PCI_FILL_IOMMU_GROUP | PCI_FILL_DRIVER);
    f.iommu = -1;
    const char *group = pci_get_string_property(d, PCI_FILL_IOMMU_GROUP);
    if(group && *group) {
        char *end;
        long long g = strtoll(group, &end, 10);
        if(!*end && g >= 0)
            f.iommu = g;
    }
    const char *driver = pci_get_string_property(d, PCI_FILL_DRIVER);
    char namebuf[INVENTORY_MAX_NAME];
    const char *name = pci_lookup_name(a, namebuf, sizeof namebuf, PCI_LOOKUP_DEVICE | PCI_LOOKUP_NO_NUMBERS,
                                       (int)f.vendor, (int)f.device);

    /* no libpci call below */
    if(driver && *driver && !(f.driver = strdup(driver)))
        goto nomem;
    if(name && *name && !(f.name = strdup(name)))
        goto nomem;
    fn_pci *grown = cozy_grow(s->fns, &s->cap, s->n + 1, sizeof *grown);
    if(!grown)
        goto nomem;
    s->fns = grown;
    s->fns[s->n++] = f;
    return COZY_OK;
nomem:
    fn_pci_free(&f);
    return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
}

/* The libpci phase: fills s->fns (unsorted). */
static cozy_result read_pci(scan_state *s, const char *pcidir, int method, const char *ids, cozy_err *err)
{
    volatile cozy_result rc = COZY_OK; /* set between setjmp and longjmp */
    struct pci_access *a = pci_alloc();
    if(!a)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    a->error = on_pci_error;
    a->warning = on_pci_warning;
    a->debug = on_pci_debug;
    a->method = (unsigned)method;
    /* names from the pci.ids file only: no ~/.pciids-cache, and no udev
     * hwdb (libpci 3.9 leaks a udev context per lookup when the hwdb
     * cannot be opened, as in most containers) */
    a->id_lookup_mode = PCI_LOOKUP_NO_HWDB;
    if(ids)
        pci_set_name_list_path(a, (char *)ids, 0);
    pci_set_param(a, "sysfs.path", (char *)pcidir);

    tl_scan = s;
    if(setjmp(s->jb)) {
        rc = cozy_fail(err, COZY_ERR_IO, "libpci: %s", s->msg);
        goto out;
    }
    pci_init(a);
    pci_scan_bus(a);
    for(struct pci_dev *d = a->devices; d; d = d->next) {
        if(s->strict && (rc = check_pci_files(s, d, ident_files, err)) != COZY_OK)
            break;
        pci_fill_info(d, PCI_FILL_IDENT | PCI_FILL_CLASS);
        if(d->vendor_id != INVENTORY_VENDOR_NVIDIA)
            continue;
        if((rc = copy_function(a, d, s, err)) != COZY_OK)
            break;
    }
out:
    /* pci_cleanup closes what the scan opened; should it call the error
     * callback itself, give up on the handle rather than exit */
    if(setjmp(s->jb) == 0)
        pci_cleanup(a);
    tl_scan = NULL;
    return rc;
}


cozy_result pciscan_method(const char *name, int *method, cozy_err *err)
{
    *method = pci_lookup_method((char *)name);
    if(*method < 0) {
        char known[512];
        known_methods(known, sizeof known);
        return cozy_fail(err, COZY_ERR_USAGE, "unknown PCI access method \"%s\" (libpci knows: %s)", name, known);
    }
    return COZY_OK;
}

cozy_result pciscan_check_tree(const char *devdir, const char *ids, int strict, cozy_err *err)
{
    if(ids) {
        int fd = open(ids, O_RDONLY | O_CLOEXEC);
        if(fd < 0)
            return cozy_fail(err, COZY_ERR_IO, "PCI ID database %s: %s", ids, strerror(errno));
        close(fd);
    }
    if(strict)
        return check_entries(devdir, err);
    return COZY_OK;
}

cozy_result pciscan_read(const char *pcidir, const char *devdir, int method, int strict, const char *ids, char *buf,
                         fn_pci **fns, size_t *n, cozy_err *err)
{
    *fns = NULL;
    *n = 0;
    scan_state *s = calloc(1, sizeof *s);
    if(!s)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    s->strict = strict;
    s->devdir = devdir;
    s->buf = buf;
    cozy_result rc = read_pci(s, pcidir, method, ids, err);
    if(rc != COZY_OK) {
        pciscan_free(s->fns, s->n);
        free(s);
        return rc;
    }
    if(s->n > 1)
        qsort(s->fns, s->n, sizeof *s->fns, cmp_fn_pci);
    *fns = s->fns;
    *n = s->n;
    free(s);
    return COZY_OK;
}

void pciscan_free(fn_pci *fns, size_t n)
{
    for(size_t i = 0; fns && i < n; i++)
        fn_pci_free(&fns[i]);
    free(fns);
}
