---@meta
-- cozygpu.capacity — what one node offers each GPU class, and whether it
-- can take new claim sets (lua/cozygpu/capacity.lua).
--
-- Source: DESIGN.md §3 (GPUNode: "a class's capacity on a node is what the
-- functions carrying its resource name add up to, capped at the kubelet's
-- status.allocatable for that name"), §6 (candidates),
-- docs/decisions/0022, docs/gpunode.md (the GPUNode's fields), and
-- docs/decisions/0022, which says which functions carry a name: the
-- rules of KubeVirt's PCI and mediated-device plugins and of NVIDIA's
-- kubevirt-gpu-device-plugin. Pure: only the arguments are read, one node
-- per call.

---A problem found while computing the offers: for logs and metrics only
---(it names the node and PCI functions; never put it in a GPUClass status).
---@class cozygpu.CapacityProblem
---@field class string? the class it is about; nil for the whole node
---@field reason "NoGPUNode"|"StaleGPUNode"|"NoKubeVirt"|"UnknownVGPUType"|"InvalidClass"|"SharedResourceName"|"NotPermitted"|"Excluded"|"MixedResourceName"|"InvalidAllocatable"|"AllocatableBelowInventory"|"InventoryBelowAllocatable"|"RawUseExceedsCapacity"
---@field message string e.g. "the GPUNode shows 4 of nvidia.com/TU104GL_TESLA_T4, status.allocatable 3"

---A Node taint the binder matches against a set's tolerations.
---@class cozygpu.CapacityTaint
---@field key string starts with "gpu.cozystack.io/"
---@field value string?
---@field effect "NoSchedule"|"NoExecute"

---Whether a node can take new claim sets (the binder index's flags).
---@class cozygpu.NodeState
---@field ready boolean condition Ready is "True"
---@field schedulable boolean spec.unschedulable is not true
---@field layout_pending boolean status.layout.pending, observedGeneration absent or below metadata.generation, or no current GPUNode
---@field taints cozygpu.CapacityTaint[] the gpu.cozystack.io/ taints with effect NoSchedule or NoExecute
---@field candidate boolean ready and schedulable and not layout_pending
---@field reasons {reason: "NotReady"|"Unschedulable"|"LayoutPending"|"NoGPUNode"|"StaleGPUNode", message: string}[]

---@class cozygpu.capacity
---@field TAINT_PREFIX string "gpu.cozystack.io/"
local capacity = {}

---What `node` offers each class: `{[class name] = units}` with every class
---of `classes` (0 when nothing), and the problems, in a stable order.
---
---Nothing when the GPUNode is missing or stale (another name; an owner
---reference of kind Node with another uid; its status.bootID is not the
---Node's status.nodeInfo.bootID, or the Node has none) or there is no
---KubeVirt CR. Otherwise, per class: the units carrying its
---spec.resourceName (passthrough: a Healthy, `counted` GPU PF on vfio-pci
---matching a pciHostDevices selector, its IOMMU group usable; vGPU: a
---created mdev of a type matching a mediatedDevices selector, or a VF on
---nvidia with a non-zero vgpu.type under the name KubeVirt's or NVIDIA's
---plugin gives it) of the class's mode and profile; 0 when the name also
---carries units the class cannot promise (MixedResourceName), is shared
---by two classes, or is not permitted; capped at status.allocatable[name]
---(absent: 0); minus raw_used[name], not below 0. A pending layout does
---not change the offers (see `state`).
---
---Raises when `node` is not a table, `classes` not a list of objects with
---metadata.name, or `raw_used` neither nil nor a map of non-negative
---integers.
---@param node table the core/v1 Node
---@param gpunode table? its GPUNode
---@param kubevirt table? the KubeVirt CR
---@param classes cozygpu.GPUClass[]
---@param raw_used table<string, integer>? units used on the node by running pods that request the name and no claim covers (raw-name VMs)
---@return table<string, integer> offers
---@return cozygpu.CapacityProblem[] problems
function capacity.of(node, gpunode, kubevirt, classes, raw_used) end

---Whether `node` can take new claim sets: Ready, schedulable, no pending
---layout (a missing or stale GPUNode counts as pending), and the
---gpu.cozystack.io/ taints for the caller to match against the set's
---tolerations. Raises when `node` is not a table.
---@param node table the core/v1 Node
---@param gpunode table? its GPUNode
---@return cozygpu.NodeState
function capacity.state(node, gpunode) end

return capacity
