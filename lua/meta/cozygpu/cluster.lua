---@meta _
-- The cluster view: the read-only second argument of every hook
-- (lua/cozygpu/cluster.lua builds it; a policy never builds one, so the
-- module itself is not part of the policy API).
--
-- Where it comes from: in `cozygpu review` and `cozygpu policy test`, the
-- snapshot files (--cluster, `cluster:`); in the controller, the watch
-- caches of Namespaces, Nodes, ResourceQuotas, the KubeVirt CR, GPUClasses,
-- GPUClaims, VirtualMachineInstances, ResourceClaims,
-- ResourceClaimTemplates and DeviceClasses (docs/decisions/0008 says what a
-- stale cache can do per read; the DRA kinds at the newest version the
-- cluster serves: resource.k8s.io/v1, else v1beta2, else v1beta1). Kinds a snapshot carries beyond those are kept and
-- reachable through `list` and `get`.
--
-- Call every method with a colon (`cluster:nodes()`). With a dot, some
-- raise and others (list, get, classes_for_resource, gpuclaims) take the
-- first argument as `self` and silently answer for shifted arguments:
-- `cluster.list("Node")` is an empty list. Lookups that find nothing return
-- nil; lists are never nil. Called with a colon nothing here raises, and
-- everything returned is a read-only view.
--
-- Source: DESIGN.md §9 ("a read-only view of cluster state").

---The settings (DESIGN.md §10; `--config`, the ConfigMap cozygpu-config),
---with every default filled in.
---@class cozygpu.Settings
---@field rawResourceNames "Allowed"|"Warn"|"Forbidden"
---@field gpuResourceNames string[] extra GPU resource names (DESIGN.md §4)
---@field gpuDeviceClasses string[] DRA device classes that are GPUs
---@field virtControllerUser string "" means derived from the KubeVirt CR's namespace
---@field tenantRoot string root of the tenant tree, default "tenant-root"
---@field policyBudget {instructions: integer, memoryBytes: integer}

---@class cozygpu.Cluster
---@field settings cozygpu.Settings
local Cluster = {}

---Every object of `kind` (e.g. "Node", "VirtualMachineInstance"), in
---snapshot order.
---@param kind string
---@return cozygpu.Object[]
function Cluster:list(kind) end

---One object by kind, namespace (nil for a cluster-scoped kind) and name.
---@param kind string
---@param ns string?
---@param name string
---@return cozygpu.Object?
function Cluster:get(kind, ns, name) end

---The GPUClass `name`.
---@param name string
---@return cozygpu.GPUClass?
function Cluster:gpuclass(name) end

---Every GPUClass.
---@return cozygpu.GPUClass[]
function Cluster:gpuclasses() end

---The GPUClasses whose spec.resourceName is `name`: at most one in a
---cluster whose GPUClass admission runs (DESIGN.md §3, one resource name
---per offer); a snapshot may hold more (gpu.class_for says "ambiguous").
---@param name string
---@return cozygpu.GPUClass[]
function Cluster:classes_for_resource(name) end

---The Namespace `name`.
---@param name string
---@return cozygpu.Object?
function Cluster:namespace(name) end

---The ResourceQuotas of namespace `ns`.
---@param ns string
---@return cozygpu.Object[]
function Cluster:resourcequotas(ns) end

---The KubeVirt CR (the first one; a cluster runs one), or nil when the
---snapshot has none.
---@return cozygpu.Object?
function Cluster:kubevirt() end

---The user KubeVirt's virt-controller acts as when it creates
---virt-launcher pods: the setting virtControllerUser, or
---"system:serviceaccount:<KubeVirt CR namespace>:kubevirt-controller";
---nil when neither is known (then nobody is the virt-controller).
---@return string?
function Cluster:virt_controller() end

---The Node `name`.
---@param name string
---@return cozygpu.Object?
function Cluster:node(name) end

---Every Node.
---@return cozygpu.Object[]
function Cluster:nodes() end

---The GPUClaims of namespace `ns`, or of every namespace when nil.
---@param ns string?
---@return cozygpu.Object[]
function Cluster:gpuclaims(ns) end

-- ---- GPUClass (cozystack.io/v1alpha1; deploy/crds, DESIGN.md §3) -------------

---@class cozygpu.GPUClassLicense
---@field secretRef {name: string, namespace: string?}
---@field featureType (1|2|4)?

---@class cozygpu.GPUClassSpec
---@field displayName string?
---@field model string? e.g. "L40S"
---@field mode "Passthrough"|"VGPU"
---@field profile string? vGPU profile, e.g. "L40S-24C"; empty for Passthrough
---@field resourceName string the device-plugin resource name behind the offer
---@field maxCount integer? GPUs of the class one VM may take (gpu.max_count)
---@field tolerations cozygpu.Toleration[]?
---@field onCordon ("Move"|"Stay")?
---@field license cozygpu.GPUClassLicense?

---@class cozygpu.GPUClass
---@field apiVersion "cozystack.io/v1alpha1"
---@field kind "GPUClass"
---@field metadata table
---@field spec cozygpu.GPUClassSpec
---@field status table?
