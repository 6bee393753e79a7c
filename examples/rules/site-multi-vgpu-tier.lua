-- Site rule (validate): a VM that takes more than one vGPU runs only in a
-- namespace with a billing tier. This is DESIGN.md §9's illustration
-- written against the real API: the namespace comes from the cluster view
-- (cluster:namespace), its label through the billing helper.
--
-- Passthrough GPUs and GPU entries without a class do not count
-- (gpu.count with a mode filter counts only entries whose class matches).
local billing = require "site.billing"

return rule "site/multi-vgpu-needs-tier" {
  description = "VMs with more than one vGPU need a billing tier on their namespace",
  match = { kind = "VirtualMachineInstance", group = "kubevirt.io", operations = { "CREATE" } },
  validate = function(req, cluster)
    local vgpus = gpu.count(req.object, cluster, { mode = "VGPU" })
    if vgpus <= 1 or billing.tier(cluster, req.namespace) then return nil end
    return deny(("%d vGPUs in one VM need a billing tier: namespace %q has no label %s"):format(
      vgpus, tostring(req.namespace), billing.TIER_LABEL), { field = "metadata.namespace" })
  end,
}
