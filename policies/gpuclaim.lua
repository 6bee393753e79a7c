-- GPUClaim create/update (DESIGN.md §4 "GPUClaim create/update", §5): the
-- class exists and is not being deleted, the count is within its maxCount,
-- the namespace is entitled to vGPU for a vGPU class, the tenant budgets
-- have room; the spec never changes (a change is a new claim; the CRD's
-- CEL rule says the same at the API server).
local object = require "cozygpu.object"
local tenant = require "cozygpu.tenant"
local budget = require "cozygpu.budget"

return rule "gpu/gpuclaim" {
  description = "GPUClaim: known class, maxCount, vGPU entitlement, tenant budgets; spec immutable",
  match = { kind = "GPUClaim", group = "cozystack.io", operations = { "CREATE", "UPDATE" } },
  validate = function(req, cluster)
    local claim = req.object
    local spec = object.get(claim, "spec")
    if req.operation == "UPDATE" then
      if not patch.equal(spec, object.get(req.oldObject, "spec")) then
        return deny("spec is immutable; create a new GPUClaim instead", { field = "spec", code = 422 })
      end
      return nil -- status and metadata changes: nothing to judge again
    end
    local cname, count = object.get(spec, "class"), object.get(spec, "count")
    if type(cname) ~= "string" or cname == "" then
      return deny("Required value: the GPUClass to claim", { field = "spec.class", code = 422 })
    end
    if math.type(count) ~= "integer" or count < 1 then
      return deny("must be a whole number of GPUs, at least 1", { field = "spec.count", code = 422 })
    end
    local class = cluster:gpuclass(cname)
    if not class then
      return deny(("unknown GPU class %q"):format(cname), { field = "spec.class" })
    end
    local out = {}
    if object.deleting(class) then
      out[#out + 1] = deny(("GPUClass %q is being deleted"):format(cname), { field = "spec.class" })
    end
    local max = gpu.max_count(class)
    if max and count > max then
      out[#out + 1] = deny(("%d GPUs of class %q, more than its maxCount %d"):format(count, cname, max), { field = "spec.count" })
    end
    if object.get(class, "spec", "mode") == "VGPU" then
      local ok, why = tenant.vgpu_entitled(cluster, req.namespace)
      if not ok then out[#out + 1] = deny(("vGPU class %q: %s"):format(cname, why), { field = "spec.class" }) end
    end
    if #out == 0 then
      local ok, shorts = budget.check(cluster, req.namespace, class, count)
      if not ok then
        for _, s in ipairs(shorts) do out[#out + 1] = deny(s.message, { field = "spec.count" }) end
      end
    end
    return out
  end,
}
