/* inventory.h — the node's NVIDIA PCI functions, read from a sysfs tree
 * (DESIGN.md §7; the output is the contract in docs/gpunode.md).
 *
 * Sources: libpci (linux-sysfs method by default, pointed at
 * <root>/bus/pci) for identity, class, revision, IOMMU group, driver, the
 * PCI ID database names, and the subsystem ids from config space when there
 * is no subsystem_vendor file; direct reads of <root>/bus/pci/devices/<BDF>/
 * for numa_node, subsystem_vendor/subsystem_device (linux-sysfs), SR-IOV
 * (sriov_totalvfs, sriov_numvfs, virtfn<N>, physfn), vendor-specific VFIO
 * vGPU (nvidia/current_vgpu_type, nvidia/creatable_vgpu_types) and
 * mediated-device parents (mdev_supported_types/<type>/{name,description,
 * available_instances,device_api,devices/}). File formats:
 * ../shared/fixtures/sysfs/LAYOUT.md.
 *
 * Hostile trees (docs/gpunode.md): a file that is not a regular file is
 * never read (direct reads open non-blocking and fstat; the files libpci
 * opens are checked first) but fails the scan; numbers that are not what
 * the kernel prints are omitted; virtfn/physfn links that name no PCI
 * address are ignored; text that is not UTF-8 gets U+FFFD for each bad byte.
 *
 * The scan holds no state between calls (every call opens and closes its
 * own libpci handle), so the agent may call it every few seconds in one
 * process. libpci's fatal-error callback is redirected (longjmp) into an
 * error result; libpci warnings are counted and otherwise dropped.
 * Not reentrant from a libpci callback; safe from several threads (the
 * redirection is per thread).
 */
#ifndef COZYGPU_INVENTORY_H
#define COZYGPU_INVENTORY_H

#include <jansson.h>
#include <stdio.h>

#include "base/result.h"

typedef struct inventory_options {
    const char *sysfs_root; /* NULL: "/sys". libpci gets sysfs.path = <root>/bus/pci */
    const char *pci_method; /* NULL: "linux-sysfs"; a name pci_lookup_method knows
                               (`lspci -A help` lists them), else COZY_ERR_USAGE naming it */
    const char *pci_ids;    /* NULL: libpci's default pci.ids file; else a pci.ids
                               file path. Never udev's hwdb. */
} inventory_options;

/* Scans the node. `o` may be NULL (all defaults); its strings are borrowed
 * for the call only.
 *
 * On success *out is a new object the caller owns (json_decref):
 *   {"functions": [FUNCTION, ...]}
 * one FUNCTION per PCI function whose vendor is 0x10de, sorted by address,
 * with the fields, field order (insertion order; dump with
 * JSON_PRESERVE_ORDER) and omission rules of docs/gpunode.md. Integers are
 * JSON integers (iommuGroup, numaNode, sriov counts, vfIndex, vGPU type
 * ids, availableInstances); ids are lowercase hex strings without "0x".
 * A node without NVIDIA functions gives {"functions": []}.
 *
 * On failure *out is left NULL, nothing is leaked, err->msg names the path
 * or option, and the result is:
 *   COZY_ERR_USAGE  pci_method is not a method libpci knows;
 *   COZY_ERR_IO     <root>/bus/pci/devices is missing or not a directory;
 *                   pci_ids cannot be read, or libpci cannot parse it;
 *                   a function could not be read while being scanned (its
 *                   directory vanished, a mandatory file such as `vendor` is
 *                   missing, or an optional file exists but read() failed
 *                   or it is not a regular file: a FIFO, a device, a
 *                   directory);
 *                   an entry under bus/pci/devices is not a PCI address;
 *   COZY_ERR_INTERNAL  out of memory.
 * The agent retries a failed scan on its next pass. */
cozy_result inventory_scan(const inventory_options *o, json_t **out, cozy_err *err);

/* Prints `inventory` (the object inventory_scan returns; borrowed) as a
 * table to `f`: a header, then one row per GPU function, physical functions
 * and non-SR-IOV GPUs at the left in address order, each followed by its
 * VFs (by vfIndex) and its board's Audio/USB/SerialBus functions (by
 * address), indented two spaces; functions under no GPU (NVSwitch, a VF
 * whose PF is not listed, ...) come last, at the left. Columns: ADDRESS,
 * ROLE, ID (vendor:device), MODEL, DRIVER, IOMMU, NUMA, SR-IOV ("4/32 VFs"
 * on a PF, "vf 3" on a VF), VGPU (the vGPU profile, "type N" when its name
 * is unknown, "N mdev types" on a mediated-device parent, else "-").
 * Missing values print as "-". An empty inventory prints one line saying
 * no NVIDIA PCI function was found. Write errors show in ferror(f). */
void inventory_print_table(FILE *f, const json_t *inventory);

#endif
