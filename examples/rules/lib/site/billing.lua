-- site.billing — where this (example) hoster keeps a tenant's billing tier.
-- A module of the hoster's bundle: `require "site.billing"` finds it in the
-- override directory's lib/ (in the policies ConfigMap: the key
-- lib.site.billing.lua). The billing system writes the label on each tenant
-- namespace; tenants cannot edit their own namespace's labels.
local object = require "cozygpu.object"

local M = {}

--- The namespace label that names the billing tier ("standard", "premium").
M.TIER_LABEL = "billing.example.com/tier"

--- The billing tier of namespace `name`, or nil when the namespace is not in
--- the cluster state or carries no tier (an empty value counts as none).
--- @param cluster table the cluster view
--- @param name string|nil namespace name (req.namespace)
--- @return string|nil
function M.tier(cluster, name)
  if type(name) ~= "string" then return nil end
  local v = object.label(cluster:namespace(name), M.TIER_LABEL)
  if type(v) == "string" and v ~= "" then return v end
  return nil
end

return M
