-- Mutation of virt-launcher pods (DESIGN.md §4 "virt-launcher pod
-- create"): add the union of the tolerations of the GPU classes the pod
-- requests, never duplicating one already there.
local object = require "cozygpu.object"
local tolerations = require "cozygpu.tolerations"

-- A virt-launcher pod: label kubevirt.io=virt-launcher and a controller
-- owner reference to a VirtualMachineInstance (KubeVirt's template
-- service, pkg/virt-controller/services/template.go).
local function is_virt_launcher(pod)
  if object.label(pod, "kubevirt.io") ~= "virt-launcher" then return false end
  local owner = object.controller_of(pod)
  return owner ~= nil and object.get(owner, "kind") == "VirtualMachineInstance"
end

return rule "gpu/launcher-tolerations" {
  description = "virt-launcher pods get the tolerations of their GPU classes",
  match = { kind = "Pod", group = "", operations = { "CREATE" } },
  mutate = function(req, cluster)
    local pod = req.object
    if not is_virt_launcher(pod) then return nil end
    local wanted, seen = {}, {}
    for _, r in ipairs(gpu.pod_requests(pod, cluster)) do
      local class = gpu.class_for(cluster, r.name)
      local cname = class and object.get(class, "metadata", "name")
      if class and not seen[cname] then
        seen[cname] = true
        for _, t in ipairs(object.list(class, "spec", "tolerations")) do wanted[#wanted + 1] = t end
      end
    end
    if #wanted == 0 then return nil end
    local present = object.get(pod, "spec", "tolerations")
    local add = tolerations.missing(present, wanted)
    if #add == 0 then return nil end
    local p = patch.new()
    if present == nil or #present == 0 then
      p:add("/spec/tolerations", json.array(add))
    else
      for _, t in ipairs(add) do p:add("/spec/tolerations/-", t) end
    end
    return p
  end,
}
