--- cozygpu.tenant — the Cozystack tenant tree and the vGPU entitlement
--- (DESIGN.md §5).
---
--- Cozystack names tenant namespaces `tenant-root`, `tenant-a`, `tenant-a-b`
--- and labels each with `tenant.cozystack.io/<ancestor>` for every ancestor,
--- itself included. A namespace without such labels is outside the tree.
local object = require "cozygpu.object"

local M = {}

M.TENANT_PREFIX = "tenant.cozystack.io/"
M.VGPU_LABEL = "gpu.cozystack.io/vgpu"

--- The tenant namespaces `ns` (a Namespace object) lies under, from the
--- root down, itself last; empty when it is outside the tree.
--- Order: by depth, which is the number of '-' separated parts below
--- the root (tenant-root is depth 0, tenant-a depth 1, tenant-a-b depth 2).
--- @return string[]
function M.ancestors(ns, root)
  root = root or "tenant-root"
  local out = {}
  local labels = object.get(ns, "metadata", "labels")
  if type(labels) ~= "table" then return out end
  -- a namespace is in the tree only under the root (its label is on every
  -- tenant namespace); other tenant.cozystack.io/ labels do not make one
  if labels[M.TENANT_PREFIX .. root] == nil then return out end
  for k in pairs(labels) do
    if type(k) == "string" and k:sub(1, #M.TENANT_PREFIX) == M.TENANT_PREFIX then
      out[#out + 1] = k:sub(#M.TENANT_PREFIX + 1)
    end
  end
  local function depth(name)
    if name == root then return 0 end
    local _, dashes = name:gsub("-", "")
    return dashes
  end
  table.sort(out, function(a, b)
    local da, db = depth(a), depth(b)
    if da ~= db then return da < db end
    return a < b
  end)
  return out
end

--- Whether namespace `name` may use vGPU: its label
--- `gpu.cozystack.io/vgpu=true` holds only where every ancestor namespace
--- carries it too, so no tenant grants itself vGPU (DESIGN.md §5). Returns
--- true, or false and the reason naming the namespace that lacks it.
--- @param cluster table the cluster view
--- @param name string namespace name
--- @return boolean, string?
function M.vgpu_entitled(cluster, name)
  local ns = cluster:namespace(name)
  if not ns then return false, ("namespace %q is not in the cluster state"):format(name) end
  local chain = M.ancestors(ns, object.get(cluster.settings, "tenantRoot"))
  if #chain == 0 then chain = { name } end
  local seen_self = false
  for _, a in ipairs(chain) do
    if a == name then seen_self = true end
    local ans = a == name and ns or cluster:namespace(a)
    if not ans then return false, ("ancestor namespace %q is not in the cluster state"):format(a) end
    if object.label(ans, M.VGPU_LABEL) ~= "true" then
      if a == name then
        return false, ("namespace %q is not entitled to vGPU (label %s=true is missing)"):format(name, M.VGPU_LABEL)
      end
      return false, ("namespace %q is not entitled to vGPU: its ancestor %q lacks the label %s=true"):format(name, a, M.VGPU_LABEL)
    end
  end
  if not seen_self and object.label(ns, M.VGPU_LABEL) ~= "true" then
    return false, ("namespace %q is not entitled to vGPU (label %s=true is missing)"):format(name, M.VGPU_LABEL)
  end
  return true
end

return M
