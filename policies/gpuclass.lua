-- Validation of GPUClass create and update (DESIGN.md §3, §4 "GPUClass
-- create/update"): the tolerations rule, mode/resourceName/profile
-- consistent, one resource name per offer, maxCount frozen while claims use
-- the class. Refusals are 422 Invalid, as for any invalid object.
local object = require "cozygpu.object"
local tolerations = require "cozygpu.tolerations"
local validation = require "cozygpu.validation"

local INVALID = 422
local FEATURE_TYPES = { [1] = true, [2] = true, [4] = true }

local function invalid(out, field, message)
  out[#out + 1] = deny(message, { field = field, code = INVALID })
end

return rule "gpu/gpuclass" {
  description = "GPUClass: tolerations pod validation accepts, consistent mode/resourceName/profile, frozen maxCount",
  match = { kind = "GPUClass", group = "cozystack.io", operations = { "CREATE", "UPDATE" } },
  validate = function(req, cluster)
    local class = req.object
    local spec = object.get(class, "spec")
    local out = {}
    local name = object.get(class, "metadata", "name")
    local err = validation.dns1123_label(name)
    if err then invalid(out, "metadata.name", err .. " (the name is part of quota keys <class>.gpuclass.cozystack.io/devices)") end
    if type(spec) ~= "table" then
      invalid(out, "spec", "Required value")
      return out
    end
    local mode = object.get(spec, "mode")
    if mode ~= "Passthrough" and mode ~= "VGPU" then
      invalid(out, "spec.mode", ("Unsupported value: %q: supported values: \"Passthrough\", \"VGPU\""):format(object.show(mode)))
    end
    local rn = object.get(spec, "resourceName")
    if rn == nil then
      invalid(out, "spec.resourceName", "Required value")
    else
      err = validation.extended_resource_name(rn)
      if err then invalid(out, "spec.resourceName", err) end
    end
    local profile = object.get(spec, "profile")
    if profile ~= nil and type(profile) ~= "string" then
      invalid(out, "spec.profile", "must be a string")
    elseif mode == "VGPU" and (profile == nil or profile == "") then
      invalid(out, "spec.profile", "Required value: a VGPU class names its vGPU profile (e.g. L40S-24C)")
    elseif mode == "Passthrough" and profile ~= nil and profile ~= "" then
      invalid(out, "spec.profile", "must be empty for a Passthrough class")
    end
    local max = object.get(spec, "maxCount")
    if max ~= nil and (math.type(max) ~= "integer" or max < 1) then
      invalid(out, "spec.maxCount", "must be an integer of at least 1")
    end
    local on_cordon = object.get(spec, "onCordon")
    if on_cordon ~= nil and on_cordon ~= "Move" and on_cordon ~= "Stay" then
      invalid(out, "spec.onCordon", ("Unsupported value: %q: supported values: \"Move\", \"Stay\""):format(object.show(on_cordon)))
    end
    local license = object.get(spec, "license")
    if license ~= nil then
      if mode ~= "VGPU" then invalid(out, "spec.license", "only a VGPU class can carry a license") end
      if type(object.get(license, "secretRef", "name")) ~= "string" then
        invalid(out, "spec.license.secretRef.name", "Required value")
      end
      local ft = object.get(license, "featureType")
      if ft ~= nil and not FEATURE_TYPES[ft] then
        invalid(out, "spec.license.featureType", "must be 1 (NVIDIA vGPU), 2 (RTX vWS) or 4 (vCS)")
      end
    end
    for _, e in ipairs(tolerations.validate(object.get(spec, "tolerations"), "spec.tolerations")) do
      invalid(out, e.field, e.message .. " (every virt-launcher pod of the class would be refused)")
    end
    -- the CRD's maxItems, also where no API server checks the schema
    -- (a snapshot, the double): the binder reads no more than that
    local tl = object.get(spec, "tolerations")
    if type(tl) == "table" and #tl > 16 then
      invalid(out, "spec.tolerations", ("Too many: %d: must have at most 16 items"):format(#tl))
    end
    -- one resource name per offer (DESIGN.md §3)
    if type(rn) == "string" then
      for _, other in ipairs(cluster:classes_for_resource(rn)) do
        local oname = object.get(other, "metadata", "name")
        if oname ~= name then
          invalid(out, "spec.resourceName", ("resource name %q already belongs to GPUClass %q (one resource name per offer)"):format(rn, oname))
        end
      end
    end
    -- maxCount is frozen while claims use the class
    if req.operation == "UPDATE" and req.oldObject then
      local old = object.get(req.oldObject, "spec", "maxCount")
      if old ~= max then
        local users = 0
        for _, claim in ipairs(cluster:gpuclaims()) do
          if object.get(claim, "spec", "class") == name then users = users + 1 end
        end
        if users > 0 then
          invalid(out, "spec.maxCount", ("cannot change while %d GPUClaim(s) use the class"):format(users))
        end
      end
    end
    return out
  end,
}
