/* inuse.h — which of the node's PCI functions a process holds open, and
 * the boot id: the two things the agent reads from /proc (DESIGN.md §7:
 * "never rewrites a VF a running VM holds"; docs/gpunode.md, "The layout,
 * step by step").
 *
 * Sources: proc(5) — /proc/<pid>/fd/<n> (links to the open files; reading
 * them takes CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE over other users'
 * processes), /proc/<pid>/comm, /proc/sys/kernel/random/boot_id; the Linux
 * VFIO docs (Documentation/driver-api/vfio.rst): a process holds a function
 * through its IOMMU group's /dev/vfio/<group> (legacy VFIO, as QEMU uses it)
 * or through the function's cdev /dev/vfio/devices/vfio<N>, which sysfs
 * names as <sysfs>/bus/pci/devices/<address>/vfio-dev/vfio<N>.
 */
#ifndef COZYGPU_INUSE_H
#define COZYGPU_INUSE_H

#include <jansson.h>
#include <stddef.h>

#include "base/result.h"

/* Which PCI functions a process holds open through VFIO: every
 * <proc_root>/<pid>/fd/<n> link whose target is /dev/vfio/<group> (the
 * IOMMU group of the function, legacy VFIO as QEMU uses it) or
 * /dev/vfio/devices/vfio<N> (the function's VFIO cdev, found as
 * <sysfs_root>/bus/pci/devices/<address>/vfio-dev/vfio<N>).
 * `inventory` is the object of inventory_scan (borrowed). Returns a new
 * object { address: "pid 812 (qemu-kvm) holds /dev/vfio/46" } (caller owns
 * it). A process that ends during the scan is skipped. When a process's
 * fd directory or one of its links cannot be read (EACCES/EPERM: the agent
 * lacks CAP_DAC_READ_SEARCH or CAP_SYS_PTRACE over it), the scan fails
 * closed: every function of `inventory` is reported held ("cannot tell
 * whether a VM holds it (<path>: Permission denied) ..."), so no vGPU type
 * is changed (DESIGN.md §7). Errors: COZY_ERR_IO when proc_root cannot be
 * listed. */
cozy_result inuse_scan(const char *proc_root, const char *sysfs_root, const json_t *inventory, json_t **out,
                       cozy_err *err);

/* The boot id of the running kernel, <proc_root>/sys/kernel/random/boot_id
 * (proc(5): a UUID, new at every boot), into buf (`size` bytes; at most
 * size - 1 characters kept, trailing newline removed). Returns 0, or -1
 * with buf "" when the file cannot be read (the caller then treats the
 * boot as unknown). */
int inuse_boot_id(const char *proc_root, char *buf, size_t size);

#endif
