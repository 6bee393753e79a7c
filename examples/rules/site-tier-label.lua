-- Site rule (mutate): every new VMI with a GPU carries its namespace's
-- billing tier as the label billing.example.com/tier, so usage dashboards
-- (kube-state-metrics' VMI labels, the billing exporter) can group GPU VMs
-- by tier without joining namespaces. The namespace's value wins: a tier
-- label the tenant wrote on the VM is replaced.
--
-- The patch is built with the `patch` global (cozygpu.jsonpatch): segment
-- lists are escaped for us ("billing.example.com/tier" becomes
-- ".../billing.example.com~1tier"), and `add` of the whole labels map is
-- used when the VMI has none, since JSON Patch cannot add below a member
-- that does not exist.
local object = require "cozygpu.object"
local billing = require "site.billing"

return rule "site/gpu-vmi-tier-label" {
  description = "GPU VMIs carry their namespace's billing tier as a label",
  match = { kind = "VirtualMachineInstance", group = "kubevirt.io", operations = { "CREATE" } },
  mutate = function(req, cluster)
    local vmi = req.object
    if gpu.count(vmi, cluster) == 0 then return nil end
    local tier = billing.tier(cluster, req.namespace)
    if not tier then return nil end
    if object.get(vmi, "metadata", "labels") == nil then
      return patch.new():add("/metadata/labels", json.object { [billing.TIER_LABEL] = tier })
    end
    local path = { "metadata", "labels", billing.TIER_LABEL }
    local have = object.label(vmi, billing.TIER_LABEL)
    if have == tier then return nil end
    if have == nil then return patch.new():add(path, tier) end
    -- `test` makes the patch refuse to apply if the label changed meanwhile
    return patch.new():test(path, have):replace(path, tier)
  end,
}
