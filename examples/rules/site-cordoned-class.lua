-- Site rule (validate, reads the cluster view): warn, do not refuse, when
-- no node could take a new VM of a GPU class right now: every node whose
-- status.allocatable advertises the class's resource name is cordoned
-- (spec.unschedulable), or no node advertises it at all. The VM is
-- admitted and waits (its virt-launcher pod stays Pending) until a node is
-- uncordoned or added; the warning tells the tenant why before they
-- wonder.
--
-- A warning rather than a refusal because Nodes come from the controller's
-- watch cache (docs/decisions/0008): a cordon lifted a moment ago must not
-- refuse a VM. A snapshot without any Node (a `cozygpu review` run that
-- passes none) says nothing about capacity, so the rule stays silent then.
local object = require "cozygpu.object"
local quantity = require "cozygpu.quantity"

-- Devices of resource name `rn` that `node` advertises (0 when absent or
-- not a whole quantity).
local function allocatable(node, rn)
  local q = object.get(node, "status", "allocatable", rn)
  if q == nil then return 0 end
  return quantity.to_integer(q) or 0
end

return rule "site/cordoned-class-warning" {
  description = "warn when every node offering a VM's GPU class is cordoned, or none offers it",
  match = { kind = "VirtualMachineInstance", group = "kubevirt.io", operations = { "CREATE" } },
  validate = function(req, cluster)
    local nodes = cluster:nodes()
    if #nodes == 0 then return nil end
    local out, seen = {}, {}
    for _, e in ipairs(gpu.entries(object.get(req.object, "spec"), cluster)) do
      local cname = e.class and object.get(e.class, "metadata", "name")
      if cname and not seen[cname] then
        seen[cname] = true
        local offering, cordoned = 0, 0
        for _, node in ipairs(nodes) do
          if allocatable(node, e.name) > 0 then
            offering = offering + 1
            if object.get(node, "spec", "unschedulable") == true then cordoned = cordoned + 1 end
          end
        end
        if offering == 0 then
          out[#out + 1] = warn(("GPU class %q: no node offers %s; the VM waits until one does"):format(cname, e.name))
        elseif cordoned == offering then
          out[#out + 1] = warn(("GPU class %q: all %d node(s) offering it are cordoned; the VM waits until one is uncordoned"):format(cname, offering))
        end
      end
    end
    return out
  end,
}
