-- Validation of the GPU entries of a VirtualMachineInstance at creation
-- (DESIGN.md §4 "VMI create"): class known and not being deleted, resource
-- name permitted by KubeVirt, maxCount, one vGPU class per VM, vGPU
-- entitlement, and the tenant budgets for the classes it asks for (§5).
local object = require "cozygpu.object"
local tenant = require "cozygpu.tenant"
local budget = require "cozygpu.budget"
local quantity = require "cozygpu.quantity"

-- A VMI that orders GPUs by class carries this label (set by the chart);
-- then every GPU entry must map to a GPUClass (docs/decisions/0003).
local CLASS_REFERENCE = "gpu.cozystack.io/class-reference"

return rule "gpu/vmi-entries" {
  description = "GPU entries of a new VMI: known class, permitted by KubeVirt, maxCount, one vGPU class, entitlement, budgets",
  match = { kind = "VirtualMachineInstance", group = "kubevirt.io", operations = { "CREATE" } },
  validate = function(req, cluster)
    local vmi = req.object
    -- wrong types read as "no entries": refuse them first (issue 11)
    local bad = {}
    for _, p in ipairs(gpu.shape_problems(object.get(vmi, "spec"))) do
      bad[#bad + 1] = deny(p.message, { field = p.field, code = 422 })
    end
    if #bad > 0 then return bad end
    local entries = gpu.entries(object.get(vmi, "spec"), cluster)
    if #entries == 0 then return nil end
    local out = {}
    local by_class = {}
    local class_order = {}
    local by_class_ref = object.label(vmi, CLASS_REFERENCE) == "true"
    local permitted = gpu.permitted(cluster)
    if permitted == nil then
      out[#out + 1] = warn("no KubeVirt CR in the cluster state: permittedHostDevices was not checked")
    end
    local kv = cluster:kubevirt()
    local kvref = kv and object.ref(kv) or ""
    for _, e in ipairs(entries) do
      if e.count_error then
        out[#out + 1] = deny(("GPUs are whole devices: %s"):format(e.count_error), { field = e.field })
      end
      if e.dra then
        if by_class_ref then
          out[#out + 1] = deny("a DRA GPU entry (claimName) cannot be ordered through a GPU class", { field = e.path })
        end
      elseif e.name == nil then
        out[#out + 1] = deny("a GPU entry needs a deviceName", { field = e.path })
      else
        if permitted and e.source ~= "resources" and not permitted[e.name] then
          out[#out + 1] = deny(("resource name %q is not permitted by KubeVirt (not in spec.configuration.permittedHostDevices of KubeVirt %s)"):format(e.name, kvref), { field = e.field })
        end
        if e.class then
          local name = object.get(e.class, "metadata", "name")
          if object.deleting(e.class) then
            out[#out + 1] = deny(("GPUClass %q is being deleted"):format(name), { field = e.field })
          end
          if not by_class[name] then
            by_class[name] = { class = e.class, count = 0, first = e }
            class_order[#class_order + 1] = name
          end
          by_class[name].count = quantity.add(by_class[name].count, e.count)
        elseif e.class_problem == "ambiguous" then
          out[#out + 1] = deny(("several GPUClasses have resource name %q"):format(e.name), { field = e.field })
        elseif by_class_ref then
          out[#out + 1] = deny(("unknown GPU class: no GPUClass has resource name %q"):format(e.name), { field = e.field })
        end
      end
    end
    local vgpu_classes = {}
    for _, name in ipairs(class_order) do
      local c = by_class[name]
      local max = gpu.max_count(c.class)
      if max and c.count > max then
        out[#out + 1] = deny(("%d GPUs of class %q, more than its maxCount %d"):format(c.count, name, max), { field = c.first.field })
      end
      if object.get(c.class, "spec", "mode") == "VGPU" then vgpu_classes[#vgpu_classes + 1] = name end
    end
    if #vgpu_classes > 1 then
      out[#out + 1] = deny(("vGPU devices of more than one class in one VM (%s); a VM takes vGPUs of one class only"):format(table.concat(vgpu_classes, ", ")), { field = "spec.domain.devices" })
    end
    if #vgpu_classes > 0 then
      local ok, why = tenant.vgpu_entitled(cluster, req.namespace)
      if not ok then
        out[#out + 1] = deny(("vGPU class %q: %s"):format(vgpu_classes[1], why), { field = by_class[vgpu_classes[1]].first.field })
      end
    end
    -- the set the VM asks for, against every budget above its namespace
    -- (checked only when nothing else refused: a budget message about an
    -- order that is wrong anyway would mislead)
    local denied = false
    for _, v in ipairs(out) do if v.verdict == "deny" then denied = true end end
    if not denied then
      local set = {}
      for _, name in ipairs(class_order) do set[#set + 1] = { class = by_class[name].class, count = by_class[name].count } end
      -- a VMI without the class reference orders by raw name: its entries
      -- without a class still count under raw keys (R5), and R4 does not
      -- block it (decision 0010)
      if not by_class_ref then
        for _, en in ipairs(entries) do
          if not en.class and en.name and not en.dra then set[#set + 1] = { rn = en.name, count = en.count } end
        end
      end
      if #set > 0 then
        local ok, shorts = budget.check_set(cluster, req.namespace, set, { raw = not by_class_ref })
        if not ok then
          for _, sh in ipairs(shorts) do
            out[#out + 1] = deny(sh.message, { field = entries[1].field or entries[1].path })
          end
        end
      end
    end
    return out
  end,
}
