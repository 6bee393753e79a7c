/* inventory.c — the node's NVIDIA PCI functions (inventory.h,
 * docs/gpunode.md).
 *
 * Two phases. The libpci phase opens a pci_access, scans the bus and copies
 * what libpci knows of each 0x10de function into plain structs; libpci's
 * fatal-error callback longjmps back to that phase (never past it), which
 * then closes the handle, so a vanished function is an error result and not
 * an exit. The sysfs phase reads the SR-IOV, vGPU and mdev files directly
 * and builds the JSON; it calls no libpci function.
 */
#include "host/inventory.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pci/pci.h>

#define INVENTORY_VENDOR_NVIDIA 0x10de
/* Ceiling on one sysfs attribute we read (creatable_vgpu_types is the
 * largest, about 1 KiB for a full catalog). */
#define INVENTORY_MAX_ATTR (64u * 1024u)
/* Ceiling on a path built under the sysfs root. */
#define INVENTORY_MAX_PATH 4096
/* Ceiling on a PCI ID database name. */
#define INVENTORY_MAX_NAME 512

/* ---- what libpci tells about one function ---------------------------- */

typedef struct fn_pci {
    unsigned domain, bus, dev, func;
    char addr[32];              /* "dddd:bb:dd.f" */
    unsigned vendor, device;
    unsigned cls;               /* base class and subclass, 0x0302 */
    int rev;                    /* -1: unknown */
    int subsys_vendor, subsys_device; /* -1: unknown */
    long long iommu;            /* -1: no group */
    char *driver;               /* owned; NULL: unbound */
    char *name;                 /* owned; NULL: not in the database */
} fn_pci;

/* one virtfn<N> link */
typedef struct vf_link {
    unsigned long n;
    char addr[64];
} vf_link;

/* what the sysfs phase reads of one function */
typedef struct fn_sys {
    int has_total, has_num;
    long long total_vfs, num_vfs;
    vf_link *vfs;               /* owned, sorted by n */
    size_t nvfs;
    int has_numa;
    long long numa;             /* numa_node, when has_numa */
    char physfn[64];            /* "" when not a VF (or physfn names no PCI address) */
    long long vf_index;         /* -1: unknown */
    int has_nvidia;             /* nvidia/ directory present */
    int has_type;
    long long vgpu_type;
    json_t *creatable;          /* owned; NULL when the file is absent */
    json_t *mdev;               /* owned; NULL when not an mdev parent */
} fn_sys;

typedef struct scan_state {
    jmp_buf jb;                 /* libpci's error callback returns here */
    char msg[1024];             /* libpci's fatal message */
    unsigned long warnings;     /* libpci warnings so far */
    int strict;                 /* linux-sysfs: libpci reads files under devdir */
    const char *devdir;         /* <root>/bus/pci/devices */
    char *buf;                  /* INVENTORY_MAX_ATTR + 1 bytes, for read_attr */
    fn_pci *fns;
    size_t n, cap;
} scan_state;

/* libpci's callbacks take no context pointer, hence one per thread. */
static _Thread_local scan_state *tl_scan;

/* direct reads (below), used by the libpci phase too */
static cozy_result join(char *buf, size_t size, const char *dir, const char *name, cozy_err *err);
static cozy_result read_attr(const char *dir, const char *name, char *buf, int *found, cozy_err *err);
static cozy_result check_regular(const char *dir, const char *name, cozy_err *err);
static int parse_hex_id(const char *s, unsigned *v);

static void on_pci_error(char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void on_pci_error(char *fmt, ...)
{
    scan_state *s = tl_scan;
    if(!s)
        abort(); /* a libpci call outside read_pci(): a bug here */
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

static void fn_sys_free(fn_sys *x)
{
    free(x->vfs);
    json_decref(x->creatable);
    json_decref(x->mdev);
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
    if((rc = join(dir, sizeof dir, s->devdir, addr, err)) != COZY_OK)
        return rc;
    for(; *files; files++)
        if((rc = check_regular(dir, *files, err)) != COZY_OK)
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
    if((rc = join(dir, sizeof dir, s->devdir, addr, err)) != COZY_OK ||
       (rc = read_attr(dir, "subsystem_vendor", s->buf, &found, err)) != COZY_OK || !found)
        return rc;
    *have = 1;
    if(!parse_hex_id(s->buf, &v))
        return COZY_OK;
    if((rc = read_attr(dir, "subsystem_device", s->buf, &found, err)) != COZY_OK)
        return rc;
    if(found && parse_hex_id(s->buf, &d)) {
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
    if(s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        fn_pci *p = realloc(s->fns, cap * sizeof *p);
        if(!p)
            goto nomem;
        s->fns = p;
        s->cap = cap;
    }
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

/* ---- direct sysfs reads ---------------------------------------------- */

static cozy_result join(char *buf, size_t size, const char *dir, const char *name, cozy_err *err)
{
    int n = snprintf(buf, size, "%s/%s", dir, name);
    if(n < 0 || (size_t)n >= size)
        return cozy_fail(err, COZY_ERR_IO, "%s/%s: path too long", dir, name);
    return COZY_OK;
}

static int absent_errno(int e)
{
    return e == ENOENT || e == ENOTDIR;
}

/* Reads <dir>/<name> into buf (size INVENTORY_MAX_ATTR + 1), NUL-terminated
 * with trailing whitespace removed. *found is 0 when the file does not
 * exist. Any other failure is COZY_ERR_IO naming the file, and so is a file
 * that is not a regular file: sysfs attributes are regular files, and a
 * FIFO or a device in a tree must not block the scan (the open is
 * non-blocking and nothing is read from such a file). A NUL byte in the
 * contents reads as 0xff, an invalid byte (json_text makes it U+FFFD; no
 * number contains it), so nothing after it is cut off. */
static cozy_result read_attr(const char *dir, const char *name, char *buf, int *found, cozy_err *err)
{
    char path[INVENTORY_MAX_PATH];
    cozy_result rc;
    struct stat st;
    *found = 0;
    buf[0] = 0;
    if((rc = join(path, sizeof path, dir, name, err)) != COZY_OK)
        return rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if(fd < 0) {
        if(absent_errno(errno))
            return COZY_OK;
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if(fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(e));
    }
    if(!S_ISREG(st.st_mode)) {
        close(fd);
        return cozy_fail(err, COZY_ERR_IO, "%s: not a regular file", path);
    }
    size_t len = 0;
    for(;;) {
        ssize_t r = read(fd, buf + len, INVENTORY_MAX_ATTR - len);
        if(r < 0) {
            if(errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(e));
        }
        if(r == 0)
            break;
        len += (size_t)r;
        if(len == INVENTORY_MAX_ATTR) {
            close(fd);
            return cozy_fail(err, COZY_ERR_IO, "%s: longer than %u bytes", path, INVENTORY_MAX_ATTR);
        }
    }
    close(fd);
    for(size_t i = 0; i < len; i++)
        if(buf[i] == 0)
            buf[i] = (char)0xff;
    while(len && (buf[len - 1] == '\n' || buf[len - 1] == ' ' || buf[len - 1] == '\t' || buf[len - 1] == '\r'))
        len--;
    buf[len] = 0;
    *found = 1;
    return COZY_OK;
}

/* A file libpci opens itself (blocking) must not be a FIFO or a device:
 * COZY_ERR_IO naming it when <dir>/<name> exists and is not a regular
 * file. An absent file is left to libpci (an error for a mandatory one). */
static cozy_result check_regular(const char *dir, const char *name, cozy_err *err)
{
    char path[INVENTORY_MAX_PATH];
    cozy_result rc;
    struct stat st;
    if((rc = join(path, sizeof path, dir, name, err)) != COZY_OK)
        return rc;
    if(stat(path, &st) != 0) {
        if(absent_errno(errno))
            return COZY_OK;
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if(!S_ISREG(st.st_mode))
        return cozy_fail(err, COZY_ERR_IO, "%s: not a regular file", path);
    return COZY_OK;
}

/* Parses a whole decimal number as the kernel prints one ("%u", or "%d"
 * when `sign` allows a leading '-'): digits only, blanks around allowed, no
 * '+', no overflow. 0 when `s` is anything else. */
static int parse_dec(const char *s, int sign, long long *v)
{
    while(*s == ' ' || *s == '\t')
        s++;
    int neg = sign && *s == '-';
    if(neg)
        s++;
    if(*s < '0' || *s > '9')
        return 0;
    long long x = 0;
    for(; *s >= '0' && *s <= '9'; s++) {
        if(x > (LLONG_MAX - (*s - '0')) / 10)
            return 0;
        x = x * 10 + (*s - '0');
    }
    while(*s == ' ' || *s == '\t' || *s == '\n')
        s++;
    if(*s)
        return 0;
    *v = neg ? -x : x;
    return 1;
}

/* Parses a 16-bit id as the kernel prints one ("0x%04x"): "0x" then one to
 * four hex digits. 0 when `s` is anything else. */
static int parse_hex_id(const char *s, unsigned *v)
{
    while(*s == ' ' || *s == '\t')
        s++;
    if(s[0] != '0' || (s[1] != 'x' && s[1] != 'X'))
        return 0;
    s += 2;
    unsigned x = 0;
    int n = 0;
    for(;; s++, n++) {
        int d;
        if(*s >= '0' && *s <= '9')
            d = *s - '0';
        else if(*s >= 'a' && *s <= 'f')
            d = *s - 'a' + 10;
        else if(*s >= 'A' && *s <= 'F')
            d = *s - 'A' + 10;
        else
            break;
        if(n == 4)
            return 0;
        x = x << 4 | (unsigned)d;
    }
    if(n == 0 || *s)
        return 0;
    *v = x;
    return 1;
}

/* Whether `s` is a PCI address in the kernel's form ("%04x:%02x:%02x.%d",
 * lowercase): the only basenames virtfn<N> and physfn links may have. */
static int is_pci_address(const char *s)
{
    _Static_assert(sizeof((vf_link *)0)->addr >= 32 && sizeof((fn_sys *)0)->physfn >= 32, "room for an address");
    unsigned dom, bus, dev, fn;
    char tail, canon[32];
    if(strlen(s) >= sizeof canon || sscanf(s, "%x:%x:%x.%u%c", &dom, &bus, &dev, &fn, &tail) != 4)
        return 0;
    if(dom > 0x7fffffff || bus > 0xff || dev > 0x1f || fn > 7)
        return 0;
    snprintf(canon, sizeof canon, "%04x:%02x:%02x.%u", dom, bus, dev, fn);
    return strcmp(canon, s) == 0;
}

/* The length of the well-formed UTF-8 sequence at s (n bytes left), or 0
 * when none starts there (a stray or truncated byte, an overlong form, a
 * surrogate, a code point past U+10FFFF, or NUL). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0], cp, min;
    size_t len;
    if(c == 0)
        return 0;
    if(c < 0x80)
        return 1;
    if(c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
        min = 0x80;
    } else if(c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
        min = 0x800;
    } else if(c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else
        return 0;
    if(n < len)
        return 0;
    for(size_t i = 1; i < len; i++) {
        if((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if(cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* A JSON string of n bytes of text read from the tree. jansson refuses
 * text that is not UTF-8 (and the field would silently vanish), so every
 * byte that does not belong to a well-formed UTF-8 sequence becomes U+FFFD
 * (docs/gpunode.md). NULL only when out of memory. */
static json_t *json_text(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t bad = 0;
    for(size_t i = 0; i < n;) {
        size_t l = utf8_seq(u + i, n - i);
        if(l)
            i += l;
        else {
            bad++;
            i++;
        }
    }
    if(!bad)
        return json_stringn(s, n);
    char *b = malloc(n + 2 * bad + 1);
    if(!b)
        return NULL;
    size_t o = 0;
    for(size_t i = 0; i < n;) {
        size_t l = utf8_seq(u + i, n - i);
        if(l) {
            memcpy(b + o, s + i, l);
            o += l;
            i += l;
        } else {
            memcpy(b + o, "\xef\xbf\xbd", 3); /* U+FFFD */
            o += 3;
            i++;
        }
    }
    json_t *j = json_stringn(b, o);
    free(b);
    return j;
}

static json_t *json_text0(const char *s)
{
    return json_text(s, strlen(s));
}

/* The basename of the target of link <dir>/<name> into out; *found 0 when
 * there is no such link. */
static cozy_result read_link_base(const char *dir, const char *name, char *out, size_t size, int *found,
                                  cozy_err *err)
{
    char path[INVENTORY_MAX_PATH], target[INVENTORY_MAX_PATH];
    cozy_result rc;
    *found = 0;
    out[0] = 0;
    if((rc = join(path, sizeof path, dir, name, err)) != COZY_OK)
        return rc;
    ssize_t n = readlink(path, target, sizeof target - 1);
    if(n < 0) {
        if(absent_errno(errno) || errno == EINVAL) /* EINVAL: not a link */
            return COZY_OK;
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
    }
    target[n] = 0;
    while(n > 1 && target[n - 1] == '/')
        target[--n] = 0;
    const char *base = strrchr(target, '/');
    base = base ? base + 1 : target;
    if(strlen(base) >= size)
        return cozy_fail(err, COZY_ERR_IO, "%s: link target too long", path);
    strcpy(out, base);
    *found = 1;
    return COZY_OK;
}

static int cmp_vf_link(const void *a, const void *b)
{
    const vf_link *x = a, *y = b;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* The virtfn<N> links of function directory `dir`, sorted by N. *missing
 * is set when the directory itself does not exist. Only links the kernel
 * could have made count: N as "%u" writes it (no leading zero, so no two
 * links share an N), the target's basename a PCI address, the target an
 * existing directory (a dangling link is a VF going away). */
static cozy_result read_virtfns(const char *dir, vf_link **out, size_t *nout, int *missing, cozy_err *err)
{
    *out = NULL;
    *nout = 0;
    *missing = 0;
    DIR *d = opendir(dir);
    if(!d) {
        if(absent_errno(errno)) {
            *missing = 1;
            return COZY_OK;
        }
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", dir, strerror(errno));
    }
    vf_link *v = NULL;
    size_t n = 0, cap = 0;
    cozy_result rc = COZY_OK;
    struct dirent *e;
    while((e = readdir(d))) {
        const char *num = e->d_name + 6;
        if(strncmp(e->d_name, "virtfn", 6) != 0 || num[0] < '0' || num[0] > '9' || (num[0] == '0' && num[1]))
            continue;
        char *end;
        errno = 0;
        unsigned long idx = strtoul(num, &end, 10);
        if(*end || errno || idx > UINT_MAX)
            continue;
        int found;
        char addr[INVENTORY_MAX_PATH], path[INVENTORY_MAX_PATH];
        if((rc = read_link_base(dir, e->d_name, addr, sizeof addr, &found, err)) != COZY_OK)
            break;
        if(!found || !is_pci_address(addr))
            continue; /* the VF went away between readdir and readlink, or not a VF link */
        struct stat st;
        if((rc = join(path, sizeof path, dir, e->d_name, err)) != COZY_OK)
            break;
        if(stat(path, &st) != 0) {
            if(absent_errno(errno) || errno == ELOOP)
                continue; /* dangling */
            rc = cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
            break;
        }
        if(!S_ISDIR(st.st_mode))
            continue;
        if(n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            vf_link *p = realloc(v, ncap * sizeof *p);
            if(!p) {
                rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
                break;
            }
            v = p;
            cap = ncap;
        }
        v[n].n = idx;
        memcpy(v[n].addr, addr, strlen(addr) + 1); /* a PCI address: fits */
        n++;
    }
    closedir(d);
    if(rc != COZY_OK) {
        free(v);
        return rc;
    }
    if(n > 1)
        qsort(v, n, sizeof *v, cmp_vf_link);
    /* links the kernel never makes: to the PF itself, or a second link to a
       VF already listed (the lower index, met first, stays) */
    const char *self = strrchr(dir, '/');
    self = self ? self + 1 : dir;
    size_t kept = 0;
    for(size_t i = 0; i < n; i++) {
        int dup = strcmp(v[i].addr, self) == 0;
        for(size_t j = 0; j < kept && !dup; j++)
            dup = strcmp(v[j].addr, v[i].addr) == 0;
        if(!dup)
            v[kept++] = v[i];
    }
    n = kept;
    *out = v;
    *nout = n;
    return COZY_OK;
}

/* `creatable_vgpu_types`: a header line (`ID    : vGPU Name`), then one
 * `<id> : <name>` row per type. Lines that are not such a row (the header,
 * blank lines) are skipped, so a file without the header reads the same. */
static json_t *parse_creatable(const char *text)
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
        json_object_set_new(row, "name", json_text(q, (size_t)(end - q)));
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

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for(size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* The entry names of directory `path` (without those starting with '.'),
 * sorted bytewise, as they are (to build paths; json_text them for the
 * output); *found 0 when it does not exist. */
static cozy_result list_dir(const char *path, char ***out, size_t *nout, int *found, cozy_err *err)
{
    *out = NULL;
    *nout = 0;
    *found = 0;
    DIR *d = opendir(path);
    if(!d) {
        if(absent_errno(errno))
            return COZY_OK;
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    cozy_result rc = COZY_OK;
    struct dirent *e;
    while((e = readdir(d))) {
        if(e->d_name[0] == '.')
            continue;
        if(n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **p = realloc(names, ncap * sizeof *p);
            if(!p) {
                rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
                break;
            }
            names = p;
            cap = ncap;
        }
        if(!(names[n] = strdup(e->d_name))) {
            rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if(rc != COZY_OK) {
        free_names(names, n);
        return rc;
    }
    if(n > 1)
        qsort(names, n, sizeof *names, cmp_str);
    *out = names;
    *nout = n;
    *found = 1;
    return COZY_OK;
}

/* An optional text file of an mdev type into o[key] (omitted when absent). */
static cozy_result mdev_text(json_t *o, const char *tdir, const char *file, const char *key, char *buf,
                             cozy_err *err)
{
    int found;
    cozy_result rc = read_attr(tdir, file, buf, &found, err);
    if(rc == COZY_OK && found)
        json_object_set_new(o, key, json_text0(buf));
    return rc;
}

/* mdev_supported_types/<type>/ of function directory `dir`: *out is NULL
 * when the function is not a mediated-device parent. */
static cozy_result read_mdev(const char *dir, char *buf, json_t **out, cozy_err *err)
{
    char base[INVENTORY_MAX_PATH], tdir[INVENTORY_MAX_PATH], path[INVENTORY_MAX_PATH];
    cozy_result rc;
    char **types = NULL;
    size_t nt = 0;
    int found;
    *out = NULL;
    if((rc = join(base, sizeof base, dir, "mdev_supported_types", err)) != COZY_OK)
        return rc;
    if((rc = list_dir(base, &types, &nt, &found, err)) != COZY_OK || !found)
        return rc;
    mdev_entry *ents = calloc(nt ? nt : 1, sizeof *ents);
    if(!ents) {
        free_names(types, nt);
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    }
    size_t n = 0;
    for(size_t i = 0; i < nt && rc == COZY_OK; i++) {
        const char *type = types[i];
        struct stat st;
        if((rc = join(tdir, sizeof tdir, base, type, err)) != COZY_OK)
            break;
        if(stat(tdir, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        json_t *o = json_object();
        json_object_set_new(o, "type", json_text0(type));
        if((rc = mdev_text(o, tdir, "name", "name", buf, err)) != COZY_OK) {
            json_decref(o);
            break;
        }
        if((rc = read_attr(tdir, "available_instances", buf, &found, err)) != COZY_OK) {
            json_decref(o);
            break;
        }
        long long v;
        if(found && parse_dec(buf, 0, &v))
            json_object_set_new(o, "availableInstances", json_integer(v));
        if((rc = mdev_text(o, tdir, "device_api", "deviceAPI", buf, err)) != COZY_OK ||
           (rc = mdev_text(o, tdir, "description", "description", buf, err)) != COZY_OK) {
            json_decref(o);
            break;
        }
        char **devs = NULL;
        size_t nd = 0;
        if((rc = join(path, sizeof path, tdir, "devices", err)) != COZY_OK ||
           (rc = list_dir(path, &devs, &nd, &found, err)) != COZY_OK) {
            json_decref(o);
            break;
        }
        if(nd) {
            json_t *a = json_array();
            for(size_t k = 0; k < nd; k++)
                json_array_append_new(a, json_text0(devs[k]));
            json_object_set_new(o, "devices", a);
        }
        free_names(devs, nd);
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
    free_names(types, nt);
    return rc;
}

/* The sysfs phase for one function. `strict`: the functions came from this
 * tree (linux-sysfs), so a missing directory means the function vanished. */
static cozy_result read_sys(const char *devdir, const fn_pci *f, int strict, char *buf, fn_sys *x, cozy_err *err)
{
    char dir[INVENTORY_MAX_PATH], sub[INVENTORY_MAX_PATH];
    cozy_result rc;
    int found, missing;
    long long v;
    x->vf_index = -1;
    if((rc = join(dir, sizeof dir, devdir, f->addr, err)) != COZY_OK)
        return rc;

    if((rc = read_virtfns(dir, &x->vfs, &x->nvfs, &missing, err)) != COZY_OK)
        return rc;
    if(missing) {
        if(strict)
            return cozy_fail(err, COZY_ERR_IO, "%s: the function vanished during the scan", dir);
        return COZY_OK;
    }
    /* numbers the kernel prints with "%u" ("%d" for numa_node): anything
     * else is garbage and omitted, as a negative node is */
    if((rc = read_attr(dir, "numa_node", buf, &found, err)) != COZY_OK)
        return rc;
    if(found && parse_dec(buf, 1, &v) && v >= 0) {
        x->has_numa = 1;
        x->numa = v;
    }
    if((rc = read_attr(dir, "sriov_totalvfs", buf, &found, err)) != COZY_OK)
        return rc;
    if(found && parse_dec(buf, 0, &v)) {
        x->has_total = 1;
        x->total_vfs = v;
    }
    if((rc = read_attr(dir, "sriov_numvfs", buf, &found, err)) != COZY_OK)
        return rc;
    if(found && parse_dec(buf, 0, &v)) {
        x->has_num = 1;
        x->num_vfs = v;
    }
    if((rc = read_link_base(dir, "physfn", sub, sizeof sub, &found, err)) != COZY_OK)
        return rc;
    if(found && is_pci_address(sub)) /* else no PF named: not a VF */
        memcpy(x->physfn, sub, strlen(sub) + 1);

    if((rc = join(sub, sizeof sub, dir, "nvidia", err)) != COZY_OK)
        return rc;
    struct stat st;
    if(stat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
        x->has_nvidia = 1;
        if((rc = read_attr(sub, "current_vgpu_type", buf, &found, err)) != COZY_OK)
            return rc;
        if(found && parse_dec(buf, 0, &v)) {
            x->has_type = 1;
            x->vgpu_type = v;
        }
        if((rc = read_attr(sub, "creatable_vgpu_types", buf, &found, err)) != COZY_OK)
            return rc;
        if(found && !(x->creatable = parse_creatable(buf)))
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    }
    if((rc = read_mdev(dir, buf, &x->mdev, err)) != COZY_OK)
        return rc;

    /* still there? (libpci read `vendor` before we started) */
    if(strict && (rc = join(sub, sizeof sub, dir, "vendor", err)) == COZY_OK && access(sub, F_OK) != 0)
        return cozy_fail(err, COZY_ERR_IO, "%s: the function vanished during the scan", dir);
    return rc;
}

/* ---- assembling the JSON --------------------------------------------- */

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
    json_t *name = f->name ? json_text0(f->name) : NULL;
    if(name) {
        json_object_set_new(o, "name", name);
        json_object_set_new(o, "model", model_of(json_string_value(name)));
    }
    if(f->driver)
        json_object_set_new(o, "driver", json_text0(f->driver));
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
            if((rc = join(dir, sizeof dir, devdir, xs[i].physfn, err)) != COZY_OK ||
               (rc = read_virtfns(dir, &own, &nvfs, &missing, err)) != COZY_OK)
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
    *out = NULL;

    int method = pci_lookup_method((char *)mname);
    if(method < 0) {
        char known[512];
        known_methods(known, sizeof known);
        return cozy_fail(err, COZY_ERR_USAGE, "unknown PCI access method \"%s\" (libpci knows: %s)", mname, known);
    }
    int strict = strcmp(mname, "linux-sysfs") == 0;
    if((rc = join(pcidir, sizeof pcidir, root, "bus/pci", err)) != COZY_OK ||
       (rc = join(devdir, sizeof devdir, pcidir, "devices", err)) != COZY_OK)
        return rc;
    struct stat st;
    if(stat(devdir, &st) != 0)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s (is %s a sysfs root?)", devdir, strerror(errno), root);
    if(!S_ISDIR(st.st_mode))
        return cozy_fail(err, COZY_ERR_IO, "%s: not a directory (is %s a sysfs root?)", devdir, root);
    if(ids) {
        int fd = open(ids, O_RDONLY | O_CLOEXEC);
        if(fd < 0)
            return cozy_fail(err, COZY_ERR_IO, "PCI ID database %s: %s", ids, strerror(errno));
        close(fd);
    }
    if(strict && (rc = check_entries(devdir, err)) != COZY_OK)
        return rc;

    scan_state *s = calloc(1, sizeof *s);
    char *buf = malloc(INVENTORY_MAX_ATTR + 1);
    fn_sys *xs = NULL;
    json_t *functions = NULL;
    if(!s || !buf) {
        rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        goto out;
    }
    s->strict = strict;
    s->devdir = devdir;
    s->buf = buf;
    if((rc = read_pci(s, pcidir, method, ids, err)) != COZY_OK)
        goto out;
    if(s->n > 1)
        qsort(s->fns, s->n, sizeof *s->fns, cmp_fn_pci);
    if(s->n && !(xs = calloc(s->n, sizeof *xs))) {
        rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        goto out;
    }
    for(size_t i = 0; i < s->n; i++)
        if((rc = read_sys(devdir, &s->fns[i], strict, buf, &xs[i], err)) != COZY_OK)
            goto out;
    if((rc = resolve_vf_indexes(devdir, s->fns, xs, s->n, err)) != COZY_OK)
        goto out;
    functions = json_array();
    for(size_t i = 0; i < s->n; i++)
        json_array_append_new(functions, build_function(s->fns, xs, s->n, i));
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
    if(s) {
        for(size_t i = 0; i < s->n; i++) {
            fn_pci_free(&s->fns[i]);
            if(xs)
                fn_sys_free(&xs[i]);
        }
        free(s->fns);
    }
    free(xs);
    free(s);
    free(buf);
    return rc;
}

/* ---- the table ------------------------------------------------------- */

#define TABLE_COLS 9

typedef struct table_row {
    char *cell[TABLE_COLS];
} table_row;

typedef struct table {
    table_row *rows;
    size_t n, cap;
} table;

static const char *str_or_dash(const char *s)
{
    return s && *s ? s : "-";
}

static char *dupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dupf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if(vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

static void table_add(table *t, const json_t *fn, int indent)
{
    if(t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        table_row *p = realloc(t->rows, cap * sizeof *p);
        if(!p)
            return;
        t->rows = p;
        t->cap = cap;
    }
    table_row *r = &t->rows[t->n++];
    const char *role = json_string_value(json_object_get(fn, "role"));
    const json_t *sriov = json_object_get(fn, "sriov");
    const json_t *vgpu = json_object_get(fn, "vgpu");
    const json_t *mdev = json_object_get(fn, "mdevTypes");
    const json_t *iommu = json_object_get(fn, "iommuGroup");
    const json_t *numa = json_object_get(fn, "numaNode");

    r->cell[0] = dupf("%s%s", indent ? "  " : "", str_or_dash(json_string_value(json_object_get(fn, "address"))));
    r->cell[1] = dupf("%s", str_or_dash(role));
    r->cell[2] = dupf("%s:%s", str_or_dash(json_string_value(json_object_get(fn, "vendorID"))),
                      str_or_dash(json_string_value(json_object_get(fn, "deviceID"))));
    r->cell[3] = dupf("%s", str_or_dash(json_string_value(json_object_get(fn, "model"))));
    r->cell[4] = dupf("%s", str_or_dash(json_string_value(json_object_get(fn, "driver"))));
    r->cell[5] = iommu ? dupf("%lld", (long long)json_integer_value(iommu)) : dupf("-");
    r->cell[6] = numa ? dupf("%lld", (long long)json_integer_value(numa)) : dupf("-");
    if(sriov) {
        const json_t *num = json_object_get(sriov, "numVFs");
        r->cell[7] = num ? dupf("%lld/%lld VFs", (long long)json_integer_value(num),
                                (long long)json_integer_value(json_object_get(sriov, "totalVFs")))
                         : dupf("-/%lld VFs", (long long)json_integer_value(json_object_get(sriov, "totalVFs")));
    } else if(json_object_get(fn, "physicalFunction")) {
        const json_t *idx = json_object_get(fn, "vfIndex");
        r->cell[7] = idx ? dupf("vf %lld", (long long)json_integer_value(idx)) : dupf("vf");
    } else
        r->cell[7] = dupf("-");
    const json_t *type = json_object_get(vgpu, "type");
    if(type && json_integer_value(type) != 0) {
        const char *profile = json_string_value(json_object_get(vgpu, "profile"));
        r->cell[8] = profile ? dupf("%s", profile) : dupf("type %lld", (long long)json_integer_value(type));
    } else if(mdev) {
        size_t nt = json_array_size(mdev), nd = 0, i;
        const json_t *m;
        json_array_foreach(mdev, i, m) nd += json_array_size(json_object_get(m, "devices"));
        r->cell[8] = nd ? dupf("%zu mdev type%s, %zu mdev%s", nt, nt == 1 ? "" : "s", nd, nd == 1 ? "" : "s")
                        : dupf("%zu mdev type%s", nt, nt == 1 ? "" : "s");
    } else
        r->cell[8] = dupf("-");
}

static int vf_order(const json_t *fn)
{
    const json_t *i = json_object_get(fn, "vfIndex");
    return i ? (int)json_integer_value(i) : -1;
}

void inventory_print_table(FILE *f, const json_t *inventory)
{
    const json_t *fns = json_object_get(inventory, "functions");
    size_t n = json_array_size(fns);
    if(n == 0) {
        fputs("No NVIDIA PCI function was found.\n", f);
        return;
    }
    static const char *const head[TABLE_COLS] = {"ADDRESS", "ROLE", "ID", "MODEL", "DRIVER", "IOMMU",
                                                 "NUMA", "SR-IOV", "VGPU"};
    char *done = calloc(n, 1);
    table t = {0};
    if(!done)
        return;
    for(size_t i = 0; i < n; i++) {
        const json_t *fn = json_array_get(fns, i);
        const char *role = json_string_value(json_object_get(fn, "role"));
        if(done[i] || !role || strcmp(role, "GPU") != 0 || json_object_get(fn, "physicalFunction"))
            continue;
        const char *addr = json_string_value(json_object_get(fn, "address"));
        table_add(&t, fn, 0);
        done[i] = 1;
        /* its VFs, by vfIndex (those without one last, by address) */
        for(int pass = 0; pass < 2; pass++) {
            for(;;) {
                long best = -1;
                for(size_t k = 0; k < n; k++) {
                    const json_t *v = json_array_get(fns, k);
                    const char *pf = json_string_value(json_object_get(v, "physicalFunction"));
                    if(done[k] || !pf || strcmp(pf, addr) != 0 || (vf_order(v) >= 0) != (pass == 0))
                        continue;
                    if(best < 0 || (pass == 0 && vf_order(v) < vf_order(json_array_get(fns, (size_t)best))))
                        best = (long)k;
                }
                if(best < 0)
                    break;
                table_add(&t, json_array_get(fns, (size_t)best), 1);
                done[best] = 1;
            }
        }
        /* the board's other functions */
        for(size_t k = 0; k < n; k++) {
            const json_t *c = json_array_get(fns, k);
            const char *gpu = json_string_value(json_object_get(c, "gpu"));
            if(!done[k] && gpu && strcmp(gpu, addr) == 0) {
                table_add(&t, c, 1);
                done[k] = 1;
            }
        }
    }
    for(size_t i = 0; i < n; i++)
        if(!done[i])
            table_add(&t, json_array_get(fns, i), 0);

    size_t width[TABLE_COLS];
    for(int c = 0; c < TABLE_COLS; c++) {
        width[c] = strlen(head[c]);
        for(size_t r = 0; r < t.n; r++)
            if(t.rows[r].cell[c] && strlen(t.rows[r].cell[c]) > width[c])
                width[c] = strlen(t.rows[r].cell[c]);
    }
    for(int c = 0; c < TABLE_COLS; c++) {
        if(c == TABLE_COLS - 1)
            fprintf(f, "%s\n", head[c]);
        else
            fprintf(f, "%-*s  ", (int)width[c], head[c]);
    }
    for(size_t r = 0; r < t.n; r++) {
        for(int c = 0; c < TABLE_COLS; c++) {
            const char *cell = t.rows[r].cell[c] ? t.rows[r].cell[c] : "?";
            if(c == TABLE_COLS - 1)
                fprintf(f, "%s\n", cell);
            else
                fprintf(f, "%-*s  ", (int)width[c], cell);
        }
        for(int c = 0; c < TABLE_COLS; c++)
            free(t.rows[r].cell[c]);
    }
    free(t.rows);
    free(done);
}
