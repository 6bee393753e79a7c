---@meta
-- cozygpu.tenant — the Cozystack tenant tree and the vGPU entitlement
-- (lua/cozygpu/tenant.lua).
--
-- Source: Cozystack tenant namespaces (`tenant-root`, `tenant-a`,
-- `tenant-a-b`, each labelled tenant.cozystack.io/<ancestor> for every
-- ancestor, itself included); DESIGN.md §5 (vGPU entitlement);
-- docs/decisions/0010 (a namespace is a tenant only under the root).

---@class cozygpu.tenant
---The label prefix of the tenant tree: "tenant.cozystack.io/".
---@field TENANT_PREFIX string
---The entitlement label: "gpu.cozystack.io/vgpu" (value "true").
---@field VGPU_LABEL string
local tenant = {}

---The tenant namespaces `ns` lies under, from the root down (by depth:
---the root first, then by the number of '-' separated parts, ties by
---name), the namespace itself last when it carries its own label. Empty
---when `ns` is nil, has no labels, or lacks the root's label
---(tenant.cozystack.io/<root>): then it is outside the tree. `root`
---defaults to "tenant-root"; pass `cluster.settings.tenantRoot`. Never
---raises.
---@param ns cozygpu.Object? a Namespace object (not a name)
---@param root string?
---@return string[]
function tenant.ancestors(ns, root) end

---Whether namespace `name` may use vGPU: the label gpu.cozystack.io/vgpu=
---"true" on it and on every ancestor tenant (outside the tree: on itself),
---so no tenant grants itself vGPU. Returns true, or false and a reason
---naming the namespace that lacks it, or that a namespace is not in the
---cluster state (fail closed). Raises when `cluster` is not the cluster
---view.
---@param cluster cozygpu.Cluster
---@param name string namespace name
---@return boolean ok
---@return string? reason
function tenant.vgpu_entitled(cluster, name) end

return tenant
