/* table.c — inventory_print_table (inventory.h): the inventory as a table
 * for people (`cozygpu inventory`, the default output; docs/gpunode.md).
 * Reads only the inventory JSON, never the tree.
 */
#include "host/inventory.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

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
    table_row *grown = cozy_grow(t->rows, &t->cap, t->n + 1, sizeof *grown);
    if(!grown)
        return;
    t->rows = grown;
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
