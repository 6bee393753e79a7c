---@meta
-- cozygpu.gpu — the GPU entries of a VirtualMachineInstance, the GPU
-- resource names, and the classes behind them (lua/cozygpu/gpu.lua). Also
-- the global `gpu` of every policy.
--
-- Source: DESIGN.md §3 (GPUClass, one resource name per offer), §4 ("A GPU
-- entry is"), docs/decisions/0003 (an entry's class is the GPUClass with
-- its resource name); KubeVirt's VMI API (kubevirt.io/api core/v1:
-- spec.domain.devices.gpus and hostDevices, deviceName, claimName for DRA)
-- and the KubeVirt CR's spec.configuration.permittedHostDevices
-- (pciHostDevices with pciVendorSelector, mediatedDevices).
--
-- GPU resource names are: every GPUClass spec.resourceName; the settings
-- list gpuResourceNames; the pciHostDevices of the KubeVirt CR whose
-- pciVendorSelector starts with 10DE (NVIDIA); every mediatedDevices entry.
-- A NIC under an nvidia.com/ name (ConnectX, BlueField: vendor 15B3) is
-- none of these. Functions taking `cluster` raise when it is not the
-- cluster view; none raises otherwise unless said.

---One GPU entry of a VMI spec.
---@class cozygpu.GPUEntry
---@field source "gpus"|"hostDevices"|"resources"
---@field path string field path of the entry, e.g. "spec.domain.devices.gpus[0]"
---@field field string field path of its resource name, e.g. "spec.domain.devices.gpus[0].deviceName" or "spec.domain.resources.limits[nvidia.com/AD102GL_L40S]"
---@field name string? the resource name; nil for a DRA entry (or a gpus entry without a string deviceName)
---@field entry_name string? the entry's `name` (gpus, hostDevices)
---@field count integer devices: 1 per list entry; the quantity for resources (0 when it is not whole)
---@field count_error string? why the quantity is not a whole number
---@field dra boolean? true for a gpus entry with claimName
---@field class cozygpu.GPUClass? the class whose resourceName is `name`
---@field class_problem ("none"|"ambiguous")? why `class` is nil (only when `name` is set)

---An extended resource a pod's containers request.
---@class cozygpu.PodResource
---@field name string the resource name
---@field count integer the quantity, 0 when it is not a whole number
---@field field string e.g. "spec.containers[0].resources.limits[nvidia.com/AD102GL_L40S]"

---A filter for gpu.count: entries whose class has this mode and/or name.
---@class cozygpu.GPUFilter
---@field mode ("Passthrough"|"VGPU")?
---@field class string? a GPUClass name

---@class cozygpu.gpu
local gpu = {}

---Fields of a VMI spec that carry GPU entries but have the wrong JSON type:
---domain.devices.gpus and hostDevices must be lists of objects,
---domain.resources.limits and requests maps (KubeVirt's
---VirtualMachineInstanceSpec). `entries` reads a wrong type as "no
---entries", so check this first; the default rule gpu/vmi-entries refuses
---them with 422. Empty when every field present has its type.
---@param spec table|nil the VMI's spec
---@param prefix string? field path of `spec` (default "spec")
---@return {field: string, message: string}[]
function gpu.shape_problems(spec, prefix) end

---The GPU entries of a VMI spec, in order: every spec.domain.devices.gpus
---entry; every hostDevices entry whose deviceName is a GPU resource name;
---every GPU resource name in spec.domain.resources (limits win over
---requests for the same name; sorted by name). `prefix` is the field path
---of `spec` in messages (default "spec"). Note: takes the spec, not the
---VMI (gpu.count takes the VMI).
---@param spec table|nil the VMI's spec (object.get(vmi, "spec"))
---@param cluster cozygpu.Cluster
---@param prefix string?
---@return cozygpu.GPUEntry[]
function gpu.entries(spec, cluster, prefix) end

---The number of GPUs in a VMI (an object with `spec`): the sum of the
---entries' counts. With `filter`, only entries with a class that matches
---every given field count; entries without a class count only when
---`filter` is nil (so `count(vmi, cluster, {})` counts the classed ones).
---@param vmi cozygpu.Object
---@param cluster cozygpu.Cluster
---@param filter cozygpu.GPUFilter?
---@return integer
function gpu.count(vmi, cluster, filter) end

---The GPUClass whose spec.resourceName is `name`, or nil and "none" (no
---class has it) or "ambiguous" (several do).
---@param cluster cozygpu.Cluster
---@param name string
---@return cozygpu.GPUClass|nil
---@return ("none"|"ambiguous")? problem
function gpu.class_for(cluster, name) end

---The resource names KubeVirt permits as host devices, as a set
---{[name] = "pci"|"mdev"} (a new table each call). nil when the cluster
---view has no KubeVirt CR: nothing can be checked. A CR without
---permittedHostDevices permits nothing (an empty set).
---@param cluster cozygpu.Cluster
---@return table<string, "pci"|"mdev">|nil
function gpu.permitted(cluster) end

---The GPU resource names, as a set {[name] = source}, source "class",
---"settings", "kubevirt-mdev" or "kubevirt-pci"; a name with several
---sources reads the first in that order (a class's name reads "class").
---A new table each call.
---@param cluster cozygpu.Cluster
---@return table<string, "class"|"settings"|"kubevirt-pci"|"kubevirt-mdev">
function gpu.resource_names(cluster) end

---The effective maxCount of a class (DESIGN.md §3): spec.maxCount when it
---is an integer; else 1 for a VGPU class; else nil (Passthrough: "the
---GPUs of one node", no fixed cap).
---@param class cozygpu.GPUClass
---@return integer?
function gpu.max_count(class) end

---The extended resources a pod requests whose name `accept(name)` takes,
---across initContainers, containers and ephemeralContainers (limits win
---over requests per container; names sorted per container). Raises when
---`accept` is not callable and the pod requests anything.
---@param pod cozygpu.Object
---@param accept fun(name: string): boolean
---@return cozygpu.PodResource[]
function gpu.pod_resources(pod, accept) end

---`gpu.pod_resources` for the GPU resource names.
---@param pod cozygpu.Object
---@param cluster cozygpu.Cluster
---@return cozygpu.PodResource[]
function gpu.pod_requests(pod, cluster) end

return gpu
