/* internal.h — PRIVATE to the inventory files of core/host/ (pci.c,
 * sysfs.c, vgpu.c, inventory.c). Not a public header: nothing outside
 * core/host/ includes it, and nothing here is a stable interface. The
 * public API is inventory.h.
 *
 * The scan has two phases (inventory.c drives them):
 *   pci.c    the libpci phase: a pci_access opened and closed per scan,
 *            what libpci knows of each 0x10de function copied into fn_pci;
 *            libpci's fatal-error callback longjmps back into that phase
 *            only (never past it).
 *   sysfs.c  the sysfs phase: direct, never-blocking reads of the function
 *            directories (numbers, links, SR-IOV, nvidia/) into fn_sys; no
 *            libpci call. vgpu.c reads the vGPU and mediated-device type
 *            lists it needs.
 * File formats: ../shared/fixtures/sysfs/LAYOUT.md; the Linux sysfs ABI
 * (Documentation/ABI/testing/sysfs-bus-pci, sysfs-bus-vfio-mdev); the
 * output rules: docs/gpunode.md.
 */
#ifndef COZYGPU_HOST_INTERNAL_H
#define COZYGPU_HOST_INTERNAL_H

#include <jansson.h>
#include <stddef.h>

#include "base/result.h"

#define INVENTORY_VENDOR_NVIDIA 0x10de
/* Ceiling on one sysfs attribute we read (creatable_vgpu_types is the
 * largest, about 1 KiB for a full catalog). */
#define INVENTORY_MAX_ATTR (64u * 1024u)
/* Ceiling on a path built under the sysfs root. */
#define INVENTORY_MAX_PATH 4096

/* ---- what libpci tells about one function (pci.c) --------------------- */

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

/* ---- what the sysfs phase reads of one function (sysfs.c) ------------- */

/* one virtfn<N> link */
typedef struct vf_link {
    unsigned long n;
    char addr[64];
} vf_link;

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

/* ---- pci.c: the libpci phase ------------------------------------------ */

/* The libpci access method named `name` ("linux-sysfs", ...) into *method.
 * COZY_ERR_USAGE naming it and the methods libpci knows when there is no
 * such method (inventory.h). */
cozy_result pciscan_method(const char *name, int *method, cozy_err *err);

/* Checks, before libpci runs, what it would otherwise fail on badly:
 * `ids` (may be NULL: libpci's default) must open for reading, else
 * COZY_ERR_IO "PCI ID database <ids>: <strerror>"; with `strict`
 * (linux-sysfs) every entry of `devdir` (<root>/bus/pci/devices) must be a
 * PCI address, else COZY_ERR_IO naming it (libpci's sysfs scan gives up on
 * one and leaks its directory handle). */
cozy_result pciscan_check_tree(const char *devdir, const char *ids, int strict, cozy_err *err);

/* The libpci phase: scans <pcidir> (<root>/bus/pci) with `method` and the
 * pci.ids file `ids` (NULL: libpci's default; never udev's hwdb) and
 * returns in *fns (malloc'd, caller frees with pciscan_free) the *n
 * functions whose vendor is 0x10de, sorted by address. `strict`
 * (linux-sysfs): the files libpci opens under `devdir` are checked to be
 * regular files first, and the subsystem ids come from their sysfs files.
 * `buf` is scratch of INVENTORY_MAX_ATTR + 1 bytes. Errors: COZY_ERR_IO
 * ("libpci: <its fatal message>", or a file that is not a regular file),
 * COZY_ERR_INTERNAL when out of memory; *fns is NULL then. */
cozy_result pciscan_read(const char *pcidir, const char *devdir, int method, int strict, const char *ids, char *buf,
                         fn_pci **fns, size_t *n, cozy_err *err);

/* Frees the n functions of pciscan_read and the array. NULL is allowed. */
void pciscan_free(fn_pci *fns, size_t n);

/* ---- sysfs.c: direct reads --------------------------------------------- */

/* <dir>/<name> into buf (`size` bytes). COZY_ERR_IO "<dir>/<name>: path
 * too long" when it does not fit. */
cozy_result sysfs_join(char *buf, size_t size, const char *dir, const char *name, cozy_err *err);

/* Reads attribute <dir>/<name> into buf (INVENTORY_MAX_ATTR + 1 bytes),
 * NUL-terminated, trailing whitespace removed; *found 0 when it does not
 * exist. Never blocks: a file that is not a regular file (FIFO, device,
 * directory) is COZY_ERR_IO "<path>: not a regular file" and is never
 * read; so is a read() failure or a file of INVENTORY_MAX_ATTR bytes or
 * more. A NUL byte in the contents reads as 0xff (sysfs_text makes it
 * U+FFFD). */
cozy_result sysfs_read_attr(const char *dir, const char *name, char *buf, int *found, cozy_err *err);

/* For a file libpci opens itself (blocking): COZY_ERR_IO "<path>: not a
 * regular file" when <dir>/<name> exists and is not a regular file. An
 * absent file is COZY_OK (left to libpci). */
cozy_result sysfs_check_regular(const char *dir, const char *name, cozy_err *err);

/* A 16-bit id as the kernel prints one ("0x%04x": "0x" then one to four
 * hex digits) into *v: 1, else 0. */
int sysfs_parse_hex_id(const char *s, unsigned *v);

/* A whole decimal number as the kernel prints one ("%u", or "%d" when
 * `sign`) into *v: 1, else 0 (no '+', no overflow, blanks around allowed). */
int sysfs_parse_dec(const char *s, int sign, long long *v);

/* A JSON string of the n bytes of text at s, read from the tree; every
 * byte that is not part of well-formed UTF-8, and NUL, becomes U+FFFD
 * (docs/gpunode.md: jansson refuses other text). New reference; NULL only
 * when out of memory. sysfs_text0: the same for a C string. */
json_t *sysfs_text(const char *s, size_t n);
json_t *sysfs_text0(const char *s);

/* The virtfn<N> links of function directory `dir` (sysfs ABI:
 * /sys/bus/pci/devices/<dev>/virtfnN), sorted by N, into *out (malloc'd,
 * caller frees; NULL when none) and *nout. *missing 1 when `dir` does not
 * exist. Only links the kernel could have made count: N as "%u" writes it,
 * the target's basename a PCI address in the kernel's form, the target an
 * existing directory (a dangling link is a VF going away); a link to `dir`
 * itself or a second link to a listed VF is dropped (docs/gpunode.md,
 * hostile trees). Errors: COZY_ERR_IO naming the path, COZY_ERR_INTERNAL. */
cozy_result sysfs_read_virtfns(const char *dir, vf_link **out, size_t *nout, int *missing, cozy_err *err);

/* The sysfs phase for function `f` under `devdir` into *x (zeroed by the
 * caller; release with sysfs_function_free, also after an error):
 * numa_node, sriov_totalvfs, sriov_numvfs, virtfn<N>, physfn,
 * nvidia/current_vgpu_type, nvidia/creatable_vgpu_types,
 * mdev_supported_types/. Numbers that are not what the kernel prints are
 * omitted. `strict`: the function came from this tree, so a directory gone
 * missing is COZY_ERR_IO "<dir>: the function vanished during the scan".
 * `buf`: scratch of INVENTORY_MAX_ATTR + 1 bytes. x->vf_index is left -1
 * (inventory.c resolves it from the PF's links). */
cozy_result sysfs_read_function(const char *devdir, const fn_pci *f, int strict, char *buf, fn_sys *x,
                                cozy_err *err);

/* Frees what sysfs_read_function put into *x (not x itself). */
void sysfs_function_free(fn_sys *x);

/* ---- vgpu.c: vGPU and mediated-device types ---------------------------- */

/* Parses the text of nvidia/creatable_vgpu_types (NVIDIA vGPU docs, "Creating
 * an NVIDIA vGPU on a Linux with KVM hypervisor": a header `ID    : vGPU
 * Name`, then one `<id> : <name>` row per type) into a new array of
 * {"id": int, "name": string}; lines that are not such a row are skipped.
 * NULL only when out of memory. */
json_t *vgpu_parse_creatable(const char *text);

/* mdev_supported_types/<type>/ of function directory `dir` (sysfs ABI
 * sysfs-bus-vfio-mdev; Linux Documentation/driver-api/vfio-mediated-device
 * .rst) into *out: a new array of {"type", "name"?, "availableInstances"?,
 * "deviceAPI"?, "description"?, "devices"?} ordered by the type's numeric
 * suffix (docs/gpunode.md), or NULL when the function is not a mediated-
 * device parent. `buf`: scratch of INVENTORY_MAX_ATTR + 1 bytes. Errors:
 * COZY_ERR_IO naming the path, COZY_ERR_INTERNAL. */
cozy_result vgpu_read_mdev(const char *dir, char *buf, json_t **out, cozy_err *err);

#endif
