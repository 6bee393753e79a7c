-- Mutation of a new VirtualMachineInstance (DESIGN.md §4 "VMI create",
-- §8): record the GPU classes it uses in the annotation
-- gpu.cozystack.io/classes ("class=count,..." sorted by class), and give
-- it a Secret volume with the license token of each licensed vGPU class
-- (docs/decisions/0004).
local object = require "cozygpu.object"
local quantity = require "cozygpu.quantity"

local ANNOTATION = "gpu.cozystack.io/classes"

--- Name of the Secret the controller copies a class's token to, in the
--- tenant namespace (docs/decisions/0004).
local function license_secret(class_name) return "gpu-license-" .. class_name end

return rule "gpu/vmi-record" {
  description = "record the GPU classes of a new VMI, add license volumes",
  match = { kind = "VirtualMachineInstance", group = "kubevirt.io", operations = { "CREATE" } },
  mutate = function(req, cluster)
    local vmi = req.object
    local counts, names = {}, {}
    local classes = {}
    for _, e in ipairs(gpu.entries(object.get(vmi, "spec"), cluster)) do
      if e.class then
        local n = object.get(e.class, "metadata", "name")
        if not counts[n] then counts[n] = 0 names[#names + 1] = n classes[n] = e.class end
        counts[n] = quantity.add(counts[n], e.count)
      end
    end
    if #names == 0 then return nil end
    table.sort(names)
    local parts = {}
    for i, n in ipairs(names) do parts[i] = ("%s=%d"):format(n, counts[n]) end
    local value = table.concat(parts, ",")
    local p = patch.new()
    if object.get(vmi, "metadata", "annotations") == nil then
      p:add("/metadata/annotations", json.object { [ANNOTATION] = value })
    else
      p:add({ "metadata", "annotations", ANNOTATION }, value)
    end
    -- license volumes
    local volumes = object.get(vmi, "spec", "volumes")
    local disks = object.get(vmi, "spec", "domain", "devices", "disks")
    local have = {}
    for _, v in ipairs(volumes or {}) do have[object.get(v, "name") or ""] = true end
    local new_volumes, new_disks = {}, {}
    for _, n in ipairs(names) do
      local c = classes[n]
      if object.get(c, "spec", "mode") == "VGPU" and object.get(c, "spec", "license", "secretRef", "name") then
        local vname = ("gpu-license-%s"):format(n):sub(1, 63)
        if not have[vname] then
          new_volumes[#new_volumes + 1] = { name = vname, secret = { secretName = license_secret(n) } }
          new_disks[#new_disks + 1] = { name = vname, disk = { bus = "virtio" } }
        end
      end
    end
    if #new_volumes > 0 then
      if volumes == nil then p:add("/spec/volumes", json.array(new_volumes))
      else for _, v in ipairs(new_volumes) do p:add("/spec/volumes/-", v) end end
      if disks == nil then p:add("/spec/domain/devices/disks", json.array(new_disks))
      else for _, d in ipairs(new_disks) do p:add("/spec/domain/devices/disks/-", d) end end
    end
    return p
  end,
}
