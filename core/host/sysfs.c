/* sysfs.c — the sysfs phase of the inventory (internal.h): direct reads
 * of <root>/bus/pci/devices/<BDF>/ — attributes, the virtfn<N>/physfn
 * links, SR-IOV counts, numa_node and nvidia/ (the Linux sysfs ABI,
 * Documentation/ABI/testing/sysfs-bus-pci; file formats:
 * ../shared/fixtures/sysfs/LAYOUT.md). No libpci call here.
 *
 * Hostile trees (docs/gpunode.md): nothing that is not a regular file is
 * ever read (it fails the scan instead), numbers that are not what the
 * kernel prints are omitted, links that name no PCI address are ignored.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/utf8.h"
#include "host/internal.h"

cozy_result sysfs_join(char *buf, size_t size, const char *dir, const char *name, cozy_err *err)
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
 * contents reads as 0xff, an invalid byte (sysfs_text makes it U+FFFD; no
 * number contains it), so nothing after it is cut off.
 * Not cozy_read_file (base/file.h): that one opens blocking (fopen) and
 * would hang on a FIFO in the tree; this read must never block. */
cozy_result sysfs_read_attr(const char *dir, const char *name, char *buf, int *found, cozy_err *err)
{
    char path[INVENTORY_MAX_PATH];
    cozy_result rc;
    struct stat st;
    *found = 0;
    buf[0] = 0;
    if((rc = sysfs_join(path, sizeof path, dir, name, err)) != COZY_OK)
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
cozy_result sysfs_check_regular(const char *dir, const char *name, cozy_err *err)
{
    char path[INVENTORY_MAX_PATH];
    cozy_result rc;
    struct stat st;
    if((rc = sysfs_join(path, sizeof path, dir, name, err)) != COZY_OK)
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
int sysfs_parse_dec(const char *s, int sign, long long *v)
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
int sysfs_parse_hex_id(const char *s, unsigned *v)
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

json_t *sysfs_text(const char *s, size_t n)
{
    /* keep_nul 0: NUL is a bad byte too, as docs/gpunode.md has it */
    size_t len;
    char *b = cozy_utf8_sanitize(s, n, 0, &len);
    if(!b)
        return NULL;
    json_t *j = json_stringn(b, len);
    free(b);
    return j;
}

json_t *sysfs_text0(const char *s)
{
    return sysfs_text(s, strlen(s));
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
    if((rc = sysfs_join(path, sizeof path, dir, name, err)) != COZY_OK)
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
cozy_result sysfs_read_virtfns(const char *dir, vf_link **out, size_t *nout, int *missing, cozy_err *err)
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
        if((rc = sysfs_join(path, sizeof path, dir, e->d_name, err)) != COZY_OK)
            break;
        if(stat(path, &st) != 0) {
            if(absent_errno(errno) || errno == ELOOP)
                continue; /* dangling */
            rc = cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
            break;
        }
        if(!S_ISDIR(st.st_mode))
            continue;
        vf_link *grown = cozy_grow(v, &cap, n + 1, sizeof *grown);
        if(!grown) {
            rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
            break;
        }
        v = grown;
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

/* A number attribute <dir>/<name> ("%u", or "%d" when `sign`) into *v with
 * *has 1; *has untouched when the file is absent or holds anything else
 * (or a negative number). */
static cozy_result read_count(const char *dir, const char *name, int sign, char *buf, int *has, long long *v,
                              cozy_err *err)
{
    int found;
    long long n;
    cozy_result rc = sysfs_read_attr(dir, name, buf, &found, err);
    if(rc == COZY_OK && found && sysfs_parse_dec(buf, sign, &n) && n >= 0) {
        *has = 1;
        *v = n;
    }
    return rc;
}

/* The sysfs phase for one function. `strict`: the functions came from this
 * tree (linux-sysfs), so a missing directory means the function vanished. */
cozy_result sysfs_read_function(const char *devdir, const fn_pci *f, int strict, char *buf, fn_sys *x,
                                cozy_err *err)
{
    char dir[INVENTORY_MAX_PATH], sub[INVENTORY_MAX_PATH];
    cozy_result rc;
    int found, missing;
    x->vf_index = -1;
    if((rc = sysfs_join(dir, sizeof dir, devdir, f->addr, err)) != COZY_OK)
        return rc;

    if((rc = sysfs_read_virtfns(dir, &x->vfs, &x->nvfs, &missing, err)) != COZY_OK)
        return rc;
    if(missing) {
        if(strict)
            return cozy_fail(err, COZY_ERR_IO, "%s: the function vanished during the scan", dir);
        return COZY_OK;
    }
    /* numbers the kernel prints with "%u" ("%d" for numa_node): anything
     * else is garbage and omitted, as a negative node is */
    if((rc = read_count(dir, "numa_node", 1, buf, &x->has_numa, &x->numa, err)) != COZY_OK ||
       (rc = read_count(dir, "sriov_totalvfs", 0, buf, &x->has_total, &x->total_vfs, err)) != COZY_OK ||
       (rc = read_count(dir, "sriov_numvfs", 0, buf, &x->has_num, &x->num_vfs, err)) != COZY_OK)
        return rc;
    if((rc = read_link_base(dir, "physfn", sub, sizeof sub, &found, err)) != COZY_OK)
        return rc;
    if(found && is_pci_address(sub)) /* else no PF named: not a VF */
        memcpy(x->physfn, sub, strlen(sub) + 1);

    if((rc = sysfs_join(sub, sizeof sub, dir, "nvidia", err)) != COZY_OK)
        return rc;
    struct stat st;
    if(stat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
        x->has_nvidia = 1;
        if((rc = read_count(sub, "current_vgpu_type", 0, buf, &x->has_type, &x->vgpu_type, err)) != COZY_OK)
            return rc;
        if((rc = sysfs_read_attr(sub, "creatable_vgpu_types", buf, &found, err)) != COZY_OK)
            return rc;
        if(found && !(x->creatable = vgpu_parse_creatable(buf)))
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    }
    if((rc = vgpu_read_mdev(dir, buf, &x->mdev, err)) != COZY_OK)
        return rc;

    /* still there? (libpci read `vendor` before we started) */
    if(strict && (rc = sysfs_join(sub, sizeof sub, dir, "vendor", err)) == COZY_OK && access(sub, F_OK) != 0)
        return cozy_fail(err, COZY_ERR_IO, "%s: the function vanished during the scan", dir);
    return rc;
}

void sysfs_function_free(fn_sys *x)
{
    free(x->vfs);
    json_decref(x->creatable);
    json_decref(x->mdev);
}
