-- Site rule (validate, reads the cluster view): no open-ended GPU tenants.
-- DESIGN.md §5 lets a tenant without any GPU key on itself or an ancestor
-- use GPUs up to capacity (budget rule R3). This hoster wants every tenant
-- that runs GPU VMs to have a budget first: a class key
-- <class>.gpuclass.cozystack.io/devices or the total key
-- gpuclass.cozystack.io/devices in a ResourceQuota of the namespace or of
-- one of its ancestor tenants. Whether the order fits the budget is the
-- default rule's business (gpu/vmi-entries, cozygpu.budget); this rule only
-- asks that one exists.
--
-- A raw key (requests.<resource name>) does not count: it blocks orders by
-- class until a class or total key is granted (R4), which the default rule
-- reports. Entries without a class (raw device-plugin names) are the
-- raw-name policy's business, and a namespace outside the tenant tree is
-- not this rule's business.
local object = require "cozygpu.object"
local tenant = require "cozygpu.tenant"
local budget = require "cozygpu.budget"

-- Whether some ResourceQuota of a tenant in `chain` sets `key` in spec.hard.
local function has_key(cluster, chain, key)
  for _, t in ipairs(chain) do
    for _, q in ipairs(cluster:resourcequotas(t)) do
      if object.get(q, "spec", "hard", key) ~= nil then return true end
    end
  end
  return false
end

return rule "site/gpu-needs-budget" {
  description = "GPU VMIs only in tenants with a GPU budget (class or total key) on themselves or an ancestor",
  match = { kind = "VirtualMachineInstance", group = "kubevirt.io", operations = { "CREATE" } },
  validate = function(req, cluster)
    local ns = cluster:namespace(req.namespace)
    if not ns then return nil end
    local chain = tenant.ancestors(ns, object.get(cluster.settings, "tenantRoot"))
    if #chain == 0 then return nil end
    local total = has_key(cluster, chain, budget.TOTAL_KEY)
    local out, seen = {}, {}
    for _, e in ipairs(gpu.entries(object.get(req.object, "spec"), cluster)) do
      local cname = e.class and object.get(e.class, "metadata", "name")
      if cname and not seen[cname] then
        seen[cname] = true
        if not total and not has_key(cluster, chain, budget.class_key(cname)) then
          out[#out + 1] = deny(("GPU class %q: tenant %q has no GPU budget (%s or %s in a ResourceQuota of it or an ancestor); ask your provider for one"):format(
            cname, chain[#chain], budget.class_key(cname), budget.TOTAL_KEY), { field = e.field })
        end
      end
    end
    return out
  end,
}
