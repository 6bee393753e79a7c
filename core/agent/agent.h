/* agent.h — `cozygpu agent` (DESIGN.md §2, §7): the node agent of the GPU
 * nodes' DaemonSet.
 *
 * Each pass reads the node's NVIDIA functions (inventory.h), finds which of
 * them a process holds open (host/inuse.h), plans the declared vGPU
 * layout of GPUNode.spec in Lua (lua/runtime/layout.lua), writes each VF's
 * nvidia/current_vgpu_type in rounds, and writes GPUNode.status when it
 * differs from what is stored. Passes run on start, every --interval, and
 * whenever the GPUNode changes (a watch). The GPUNode is created when
 * missing, with an owner reference to the Node (docs/decisions/0011).
 */
#ifndef COZYGPU_AGENT_H
#define COZYGPU_AGENT_H

/* Runs the agent with command-line arguments (argv[0] is "agent"). Returns
 * the process exit status: 0 after SIGTERM/SIGINT (or after the pass of
 * --once), 1 when the --once pass failed, 2 on bad flags or when the API
 * server cannot be configured. */
int agent_main(int argc, char **argv);

#endif
