/* agent.h — `cozygpu agent` (DESIGN.md §2, §7): the node agent of the GPU
 * nodes' DaemonSet.
 *
 * Each pass reads the node's NVIDIA functions (inventory.h), finds which of
 * them a process holds open (agent_scan_in_use), plans the declared vGPU
 * layout of GPUNode.spec in Lua (lua/cozygpu/layout.lua), writes each VF's
 * nvidia/current_vgpu_type in rounds, and writes GPUNode.status when it
 * differs from what is stored. Passes run on start, every --interval, and
 * whenever the GPUNode changes (a watch). The GPUNode is created when
 * missing, with an owner reference to the Node (docs/decisions/0011).
 */
#ifndef COZYGPU_AGENT_H
#define COZYGPU_AGENT_H

#include <jansson.h>

#include "base/result.h"

/* Runs the agent with command-line arguments (argv[0] is "agent"). Returns
 * the process exit status: 0 after SIGTERM/SIGINT (or after the pass of
 * --once), 1 when the --once pass failed, 2 on bad flags or when the API
 * server cannot be configured. */
int agent_main(int argc, char **argv);

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
cozy_result agent_scan_in_use(const char *proc_root, const char *sysfs_root, const json_t *inventory,
                              json_t **out, cozy_err *err);

#endif
