/* fuzz_inventory — libFuzzer target for the node inventory
 * (core/host/: inventory_scan over libpci's sysfs method and the direct
 * sysfs reads, inventory_print_table).
 *
 * Feeds: a small fake sysfs tree, rebuilt for every input under a
 * temporary directory made in LLVMFuzzerInitialize, following
 * ../shared/fixtures/sysfs/LAYOUT.md as spec/support/sysfs.lua does
 * (devices/pci<DDDD>:<BB>/<BDF>/, bus/pci/devices/<BDF> links, driver and
 * iommu_group links, physfn/virtfn<N>, nvidia/, mdev_supported_types/).
 * The input is read as:
 *   byte 0      flags: 1 a second function; 2 it is an SR-IOV VF of the
 *               first (physfn, virtfn0, sriov_* on the PF); 4 driver links;
 *               8 IOMMU group links; 16 a nvidia/ vGPU directory (on the VF,
 *               else on the first function); 32 an mdev parent (first
 *               function, with class/mdev_bus); 64 a dangling virtfn1
 *               link; 128 the VF's physfn points at itself;
 *   the rest    NUL-separated field values, in the order of FIELDS below
 *               for the first function, then for the second, then the
 *               second function's directory name, the IOMMU group name and
 *               the driver name. A field the input does not reach keeps
 *               its default (a valid value: an L40S-like PF and its VF); a
 *               field given is written as is, also where the flags would
 *               not have made the file; the one-byte field "\x7f" removes
 *               the file. Names have '/' replaced and may not be "", "."
 *               or "..", so the tree stays inside its directory.
 * The PCI ID database is a small pci.ids written at start (no system file).
 * Checks, besides the sanitizers (ASan, UBSan, LeakSanitizer):
 *   - success gives {"functions": [...]} with at most two functions, each
 *     with a string address, in strictly increasing address order, and the
 *     result dumps as JSON (valid UTF-8 everywhere);
 *   - inventory_print_table writes the result without error;
 *   - failure leaves *out NULL and a non-empty message;
 *   - scanning the same tree twice gives equal results (no state kept).
 * Seeds: fuzz/seeds/inventory/ (hand-made trees: PF with VF and vGPU
 * catalog, mdev parent, bare T4) plus the fixtures' creatable_vgpu_types
 * files (read as a field stream, they land in the first fields).
 */
#include "fuzz_tmp.h"
#include "host/inventory.h"

#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(c) do { if(!(c)) { fprintf(stderr, "fuzz_inventory: check failed: %s\n", #c); abort(); } } while(0)

enum { F_SECOND = 1, F_VF = 2, F_DRIVER = 4, F_IOMMU = 8, F_VGPU = 16, F_MDEV = 32, F_DANGLING = 64, F_SELF = 128 };

/* kinds of defaults: when a file is written without an input value */
enum { ALWAYS, IF_PF, IF_VGPU, IF_MDEV };

static const struct field {
    const char *file;
    int when;
    const char *def;
} FIELDS[] = {
    {"vendor", ALWAYS, "0x10de\n"},
    {"device", ALWAYS, "0x26b9\n"},
    {"class", ALWAYS, "0x030200\n"},
    {"subsystem_vendor", ALWAYS, "0x10de\n"},
    {"subsystem_device", ALWAYS, "0x1851\n"},
    {"revision", ALWAYS, "0xa1\n"},
    {"numa_node", ALWAYS, "0\n"},
    {"irq", ALWAYS, "0\n"},
    {"resource", ALWAYS, "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"},
    {"config", ALWAYS, NULL}, /* binary, made by config_bytes */
    {"sriov_totalvfs", IF_PF, "32\n"},
    {"sriov_numvfs", IF_PF, "1\n"},
    {"nvidia/current_vgpu_type", IF_VGPU, "1155\n"},
    {"nvidia/creatable_vgpu_types", IF_VGPU, "ID    : vGPU Name\n1153  : NVIDIA L40S-12Q\n1155  : NVIDIA L40S-24Q\n"},
    {"mdev_supported_types/nvidia-1/name", IF_MDEV, "GRID A2-1Q\n"},
    {"mdev_supported_types/nvidia-1/available_instances", IF_MDEV, "4\n"},
    {"mdev_supported_types/nvidia-1/device_api", IF_MDEV, "vfio-pci\n"},
    {"mdev_supported_types/nvidia-1/description", IF_MDEV, "num_heads=4, frl_config=60\n"},
};
#define NFIELDS (sizeof FIELDS / sizeof FIELDS[0])
#define NVALUES (2 * NFIELDS + 3)

static const char PCI_IDS[] = "10de  NVIDIA Corporation\n"
                              "\t1eb8  TU104GL [Tesla T4]\n"
                              "\t25b6  GA107GL [A2 / A16]\n"
                              "\t26b9  AD102GL [L40S]\n"
                              "\t\t10de 1851  L40S\n";

static char base[4096], root[4200], ids[4200];
static FILE *devnull;

typedef struct value {
    const char *p; /* NULL: not given */
    size_t n;
} value;

static void write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(size == 0 || fwrite(data, 1, size, f) == size);
    CHECK(fclose(f) == 0);
}

static void mkdirs(const char *path)
{
    char p[4400];
    snprintf(p, sizeof p, "%s", path);
    for(char *s = p + 1; *s; s++) {
        if(*s == '/') {
            *s = 0;
            CHECK(mkdir(p, 0755) == 0 || errno == EEXIST);
            *s = '/';
        }
    }
    CHECK(mkdir(p, 0755) == 0 || errno == EEXIST);
}

static void link_to(const char *target, const char *path)
{
    CHECK(symlink(target, path) == 0 || errno == EEXIST);
}

static int rm_one(const char *p, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if(type == FTW_DP)
        return rmdir(p);
    return unlink(p);
}

static void rm_tree(const char *p)
{
    struct stat st;
    if(lstat(p, &st) == 0)
        CHECK(nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0);
}

static void cleanup(void)
{
    rm_tree(base);
    if(devnull)
        fclose(devnull);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tmpdir(base, sizeof base, "inventory");
    snprintf(root, sizeof root, "%s/sys", base);
    snprintf(ids, sizeof ids, "%s/pci.ids", base);
    write_file(ids, PCI_IDS, sizeof PCI_IDS - 1);
    devnull = fopen("/dev/null", "w");
    CHECK(devnull != NULL);
    atexit(cleanup);
    return 0;
}

/* a name from the input, made safe as one path component */
static void name_of(const value *v, const char *def, char *out, size_t size)
{
    if(!v->p || v->n == 0 || v->n >= size || v->n > 200) {
        snprintf(out, size, "%s", def);
        return;
    }
    memcpy(out, v->p, v->n);
    out[v->n] = 0;
    for(char *s = out; *s; s++)
        if(*s == '/')
            *s = '_';
    if(strcmp(out, ".") == 0 || strcmp(out, "..") == 0 || strlen(out) != v->n)
        snprintf(out, size, "%s", def);
}

/* the first 64 bytes of config space for vendor 10de, device dev */
static void config_bytes(unsigned char *c, unsigned dev)
{
    memset(c, 0, 64);
    c[0] = 0xde, c[1] = 0x10, c[2] = dev & 0xff, c[3] = dev >> 8;
    c[8] = 0xa1, c[10] = 0x02, c[11] = 0x03;
    c[0x2c] = 0xde, c[0x2d] = 0x10, c[0x2e] = 0x51, c[0x2f] = 0x18;
}

static void write_function(const char *dir, const value *vals, int flags, int is_pf, int vgpu, int mdev, unsigned dev)
{
    char p[4400];
    mkdirs(dir);
    for(size_t i = 0; i < NFIELDS; i++) {
        const struct field *f = &FIELDS[i];
        const value *v = &vals[i];
        int want = f->when == ALWAYS || (f->when == IF_PF && is_pf) || (f->when == IF_VGPU && vgpu) ||
                   (f->when == IF_MDEV && mdev);
        if(v->p && v->n == 1 && v->p[0] == 0x7f)
            continue; /* the file is absent */
        if(!v->p && !want)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, f->file);
        char *slash = strrchr(p, '/');
        *slash = 0;
        mkdirs(p);
        *slash = '/';
        if(v->p) {
            write_file(p, v->p, v->n);
        } else if(f->def) {
            write_file(p, f->def, strlen(f->def));
        } else {
            unsigned char c[64];
            config_bytes(c, dev);
            write_file(p, c, sizeof c);
        }
    }
    (void)flags;
    snprintf(p, sizeof p, "%s/subsystem", dir);
    link_to("../../../bus/pci", p);
    if(mdev) {
        snprintf(p, sizeof p, "%s/mdev_supported_types/nvidia-1/devices", dir);
        mkdirs(p);
    }
}

static void build(const uint8_t *data, size_t size)
{
    int flags = size ? data[0] : 0;
    value vals[NVALUES];
    memset(vals, 0, sizeof vals);
    size_t k = 0;
    if(size > 1) {
        const char *p = (const char *)data + 1, *end = (const char *)data + size;
        while(k < NVALUES) {
            const char *z = memchr(p, 0, (size_t)(end - p));
            vals[k].p = p;
            vals[k].n = z ? (size_t)(z - p) : (size_t)(end - p);
            k++;
            if(!z)
                break;
            p = z + 1;
        }
    }
    int second = flags & F_SECOND, vf = second && (flags & F_VF);
    char name0[256] = "0000:41:00.0", name1[256], group[256], driver[256];
    name_of(&vals[2 * NFIELDS], vf ? "0000:41:00.4" : "0000:c1:00.0", name1, sizeof name1);
    name_of(&vals[2 * NFIELDS + 1], "45", group, sizeof group);
    name_of(&vals[2 * NFIELDS + 2], "nvidia", driver, sizeof driver);
    if(second && strcmp(name1, name0) == 0)
        snprintf(name1, sizeof name1, "0000:c1:00.0");

    char p[4400], q[4400], fn0[4400], fn1[4400];
    const char *parent = "devices/pci0000:41";
    snprintf(p, sizeof p, "%s/bus/pci/devices", root);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/bus/pci/drivers", root);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/kernel/iommu_groups", root);
    mkdirs(p);

    snprintf(fn0, sizeof fn0, "%s/%s/%s", root, parent, name0);
    write_function(fn0, vals, flags, vf, (flags & F_VGPU) && !vf, flags & F_MDEV, 0x26b9);
    snprintf(p, sizeof p, "%s/bus/pci/devices/%s", root, name0);
    snprintf(q, sizeof q, "../../../%s/%s", parent, name0);
    link_to(q, p);
    if(second) {
        snprintf(fn1, sizeof fn1, "%s/%s/%s", root, parent, name1);
        write_function(fn1, vals + NFIELDS, flags, 0, (flags & F_VGPU) && vf, 0, vf ? 0x26b9 : 0x1eb8);
        snprintf(p, sizeof p, "%s/bus/pci/devices/%s", root, name1);
        snprintf(q, sizeof q, "../../../%s/%s", parent, name1);
        link_to(q, p);
        if(vf) {
            snprintf(p, sizeof p, "%s/physfn", fn1);
            snprintf(q, sizeof q, "../%s", (flags & F_SELF) ? name1 : name0);
            link_to(q, p);
            snprintf(p, sizeof p, "%s/virtfn0", fn0);
            snprintf(q, sizeof q, "../%s", name1);
            link_to(q, p);
        }
    }
    if(flags & F_DANGLING) {
        snprintf(p, sizeof p, "%s/virtfn1", fn0);
        link_to("../0000:41:00.5", p);
    }
    if(flags & F_DRIVER) {
        snprintf(p, sizeof p, "%s/bus/pci/drivers/%s", root, driver);
        mkdirs(p);
        snprintf(p, sizeof p, "%s/driver", fn0);
        snprintf(q, sizeof q, "../../../bus/pci/drivers/%s", driver);
        link_to(q, p);
        if(second) {
            snprintf(p, sizeof p, "%s/driver", fn1);
            link_to(q, p);
        }
    }
    if(flags & F_IOMMU) {
        snprintf(p, sizeof p, "%s/kernel/iommu_groups/%s/devices", root, group);
        mkdirs(p);
        snprintf(p, sizeof p, "%s/iommu_group", fn0);
        snprintf(q, sizeof q, "../../../kernel/iommu_groups/%s", group);
        link_to(q, p);
        if(second) {
            snprintf(p, sizeof p, "%s/iommu_group", fn1);
            link_to("../../../kernel/iommu_groups/46", p);
        }
    }
    if(flags & F_MDEV) {
        snprintf(p, sizeof p, "%s/class/mdev_bus", root);
        mkdirs(p);
        snprintf(p, sizeof p, "%s/class/mdev_bus/%s", root, name0);
        snprintf(q, sizeof q, "../../%s/%s", parent, name0);
        link_to(q, p);
    }
}

static json_t *scan(cozy_err *err, cozy_result *rc)
{
    inventory_options o = {.sysfs_root = root, .pci_ids = ids};
    json_t *out = NULL;
    *rc = inventory_scan(&o, &out, err);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rm_tree(root);
    build(data, size);
    cozy_err err = {{0}};
    cozy_result rc;
    json_t *inv = scan(&err, &rc);
    if(rc != COZY_OK) {
        CHECK(inv == NULL);
        CHECK(err.msg[0] != 0);
    } else {
        CHECK(json_is_object(inv));
        json_t *fns = json_object_get(inv, "functions");
        CHECK(json_is_array(fns));
        CHECK(json_array_size(fns) <= 2);
        const char *prev = NULL;
        size_t i;
        json_t *fn;
        json_array_foreach(fns, i, fn) {
            const char *a = json_string_value(json_object_get(fn, "address"));
            CHECK(a != NULL);
            CHECK(!prev || strcmp(prev, a) < 0);
            prev = a;
        }
        char *s = json_dumps(inv, JSON_COMPACT | JSON_PRESERVE_ORDER);
        CHECK(s != NULL);
        free(s);
        clearerr(devnull);
        inventory_print_table(devnull, inv);
        CHECK(!ferror(devnull));
    }
    cozy_err err2 = {{0}};
    cozy_result rc2;
    json_t *again = scan(&err2, &rc2);
    CHECK(rc2 == rc);
    CHECK((inv == NULL) == (again == NULL));
    if(inv)
        CHECK(json_equal(inv, again));
    else
        CHECK(strcmp(err.msg, err2.msg) == 0);
    json_decref(again);
    json_decref(inv);
    return 0;
}
