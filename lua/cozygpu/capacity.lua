--- cozygpu.capacity — what one node offers each GPU class, and whether it
--- can take new claim sets at all (DESIGN.md §3 "GPUNode", §6 "Binder";
--- docs/decisions/0022).
---
--- Pure: every function reads only its arguments and looks at one node, so
--- the leader calls it once per Node or GPUNode event, never over the
--- cluster. Problems are for logs and metrics (they name nodes and PCI
--- functions: never put them in a GPUClass status).
local json = require "cozygpu.json"
local object = require "cozygpu.object"
local quantity = require "cozygpu.quantity"

local M = {}

--- The taint prefix the binder owns (DESIGN.md §3, §6).
M.TAINT_PREFIX = "gpu.cozystack.io/"

local get, list = object.get, object.list

-- Whitespace runs to "_", trimmed: how KubeVirt's mdev plugin and NVIDIA's
-- plugin turn a vGPU type name into a resource name part.
local function norm(s)
  s = s:gsub("^%s+", ""):gsub("%s+$", "")
  return (s:gsub("%s+", "_"))
end

local function last_word(s) return s:match("(%S+)%s*$") or s end

local function healthy(f) return get(f, "health", "status") == "Healthy" end

local function vanished(f) return get(f, "health", "reason") == "Vanished" end

local function str(v) return type(v) == "string" and v or nil end

--- Why `gpunode` cannot be trusted for `node`, or nil when it can:
--- {reason, message}.
local function staleness(node, gpunode)
  local name = str(get(node, "metadata", "name")) or "?"
  if gpunode == nil then
    return { reason = "NoGPUNode", message = ("node %s has no GPUNode"):format(name) }
  end
  local gname = get(gpunode, "metadata", "name")
  if gname ~= name then
    return { reason = "StaleGPUNode", message = ("GPUNode %s is not node %s's"):format(tostring(gname), name) }
  end
  local uid = str(get(node, "metadata", "uid"))
  if uid then
    for _, ref in ipairs(list(gpunode, "metadata", "ownerReferences")) do
      local ruid = get(ref, "uid")
      if get(ref, "kind") == "Node" and ruid ~= nil and ruid ~= uid then
        return { reason = "StaleGPUNode",
          message = ("GPUNode %s is owned by Node uid %s, node %s is uid %s (a deleted Node of the same name)")
            :format(name, tostring(ruid), name, uid) }
      end
    end
  end
  local boot = str(get(node, "status", "nodeInfo", "bootID"))
  if not boot then
    return { reason = "StaleGPUNode",
      message = ("node %s reports no status.nodeInfo.bootID: cannot tell whether GPUNode %s is of this boot"):format(name, name) }
  end
  local gboot = get(gpunode, "status", "bootID")
  if gboot ~= boot then
    return { reason = "StaleGPUNode",
      message = ("GPUNode %s is of boot %s, node %s runs boot %s: its agent has not written since the reboot")
        :format(name, gboot == nil and "(none)" or tostring(gboot), name, boot) }
  end
  return nil
end

-- The permittedHostDevices entries: pci = {{selector (lowercase), name,
-- external}}, mdev = {{selector (normalized), name}}, permitted = {[name] = true}.
local function entries(kubevirt)
  local phd = get(kubevirt, "spec", "configuration", "permittedHostDevices")
  local pci, mdev, permitted = {}, {}, {}
  for _, d in ipairs(list(phd, "pciHostDevices")) do
    local sel, rn = str(get(d, "pciVendorSelector")), str(get(d, "resourceName"))
    if sel and rn then
      pci[#pci + 1] = { selector = sel:lower(), name = rn, external = get(d, "externalResourceProvider") == true }
      permitted[rn] = true
    end
  end
  for _, d in ipairs(list(phd, "mediatedDevices")) do
    local sel, rn = str(get(d, "mdevNameSelector")), str(get(d, "resourceName"))
    if sel and rn then
      mdev[#mdev + 1] = { selector = norm(sel), name = rn }
      permitted[rn] = true
    end
  end
  return pci, mdev, permitted
end

-- Units and exclusions of one GPUNode under the KubeVirt CR's entries.
-- A unit: {name, kind = "passthrough"|"vgpu", profile = type name or nil,
-- what = "0000:41:00.0" or "0000:08:01.7/<uuid>"}. An exclusion: {name,
-- what, why}. Problems not tied to a name go to `notes`.
local function carriers(gpunode, pci, mdev)
  local units, excluded, notes = {}, {}, {}
  local fns = list(gpunode, "status", "functions")
  local groups = {}
  for _, f in ipairs(fns) do
    local g = get(f, "iommuGroup")
    if g ~= nil then
      groups[g] = groups[g] or {}
      table.insert(groups[g], f)
    end
  end
  local function unit(name, kind, profile, what) units[#units + 1] = { name = name, kind = kind, profile = profile, what = what } end
  local function exclude(name, what, why) excluded[#excluded + 1] = { name = name, what = what, why = why } end

  -- why the IOMMU group of counted GPU `f` cannot be assigned, or nil
  local function group_unusable(f)
    for _, o in ipairs(groups[get(f, "iommuGroup")]) do
      if o ~= f and not vanished(o) then
        local addr, drv = tostring(get(o, "address")), get(o, "driver")
        if get(o, "role") == "GPU" then
          if drv ~= "vfio-pci" then
            return ("GPU %s of its IOMMU group is on %s, not vfio-pci"):format(addr, tostring(drv or "no driver"))
          elseif not healthy(o) then
            return ("GPU %s of its IOMMU group is not Healthy"):format(addr)
          end
        elseif drv ~= nil and drv ~= "vfio-pci" and drv ~= "pci-stub" then
          return ("%s function %s of its IOMMU group is on %s (VFIO needs the whole group on vfio-pci or unbound)")
            :format(tostring(get(o, "role") or "?"), addr, tostring(drv))
        end
      end
    end
    return nil
  end

  for _, f in ipairs(fns) do
    local addr = tostring(get(f, "address"))
    local role, drv = get(f, "role"), get(f, "driver")
    local ids = ("%s:%s"):format(tostring(get(f, "vendorID")), tostring(get(f, "deviceID"))):lower()
    local is_vf = get(f, "physicalFunction") ~= nil

    if role == "GPU" and not is_vf and get(f, "counted") ~= false and (drv == "vfio-pci" or drv == nil) then
      -- passthrough: one unit per IOMMU group, on its counted GPU (a GPU
      -- on another driver, `nvidia` on a vGPU host, carries no such name)
      for _, e in ipairs(pci) do
        if e.selector == ids then
          if drv == nil then
            exclude(e.name, addr, "no driver is bound (passthrough needs vfio-pci)")
          elseif not healthy(f) then
            exclude(e.name, addr, ("not Healthy (%s)"):format(tostring(get(f, "health", "reason") or "no health reported")))
          elseif get(f, "iommuGroup") == nil then
            exclude(e.name, addr, "no IOMMU group")
          else
            local why = group_unusable(f)
            if why then exclude(e.name, addr, why) else unit(e.name, "passthrough", nil, addr) end
          end
        end
      end
    end

    local vtype = get(f, "vgpu", "type")
    if role == "GPU" and is_vf and drv == "nvidia" and math.type(vtype) == "integer" and vtype > 0 then
      -- a VF carrying a vGPU (vendor-specific VFIO)
      local tname = str(get(f, "vgpu", "typeName"))
      local names = {}
      for _, e in ipairs(pci) do
        if not e.external and e.selector == ids then names[#names + 1] = e.name end
      end
      if tname then
        for _, e in ipairs(mdev) do
          if e.selector == norm(tname) then names[#names + 1] = e.name end
        end
        for _, e in ipairs(pci) do
          if e.external and e.name:match("/(.*)$") == norm(tname) then names[#names + 1] = e.name end
        end
      else
        notes[#notes + 1] = { reason = "UnknownVGPUType",
          message = ("VF %s carries vGPU type %d, which no list of its card names (status.layout.knownTypes has no name for it)")
            :format(addr, vtype) }
      end
      for _, rn in ipairs(names) do
        if not healthy(f) then
          exclude(rn, addr, ("not Healthy (%s)"):format(tostring(get(f, "health", "reason") or "no health reported")))
        elseif get(f, "iommuGroup") == nil then
          exclude(rn, addr, "no IOMMU group")
        else
          unit(rn, "vgpu", tname, addr)
        end
      end
    end

    for _, t in ipairs(list(f, "mdevTypes")) do
      local tname, devs = str(get(t, "name")), list(t, "devices")
      if tname and #devs > 0 then
        for _, e in ipairs(mdev) do
          if e.selector == norm(tname) then
            for _, uuid in ipairs(devs) do
              local what = addr .. "/" .. tostring(uuid)
              if role == "GPU" and not healthy(f) then
                exclude(e.name, what, ("parent %s not Healthy (%s)"):format(addr, tostring(get(f, "health", "reason") or "no health reported")))
              else
                unit(e.name, "vgpu", tname, what)
              end
            end
          end
        end
      end
    end
  end
  return units, excluded, notes
end

-- True when type name `tname` is the class profile `profile` (the full
-- name, or its last word: "L40S-24Q" is "NVIDIA L40S-24Q").
local function same_profile(profile, tname)
  if not tname then return false end
  return norm(profile) == norm(tname) or profile == last_word(tname)
end

local function check_args(node, classes, raw_used)
  if type(node) ~= "table" then error("capacity: node must be a Node object", 3) end
  local n = 0
  if type(classes) == "table" and json.kind(classes) ~= "object" then
    for _ in pairs(classes) do n = n + 1 end
  end
  if type(classes) ~= "table" or json.kind(classes) == "object" or n ~= #classes then
    error("capacity: classes must be a list of GPUClass objects", 3)
  end
  for i, c in ipairs(classes) do
    if type(str(get(c, "metadata", "name"))) ~= "string" then
      error(("capacity: classes[%d] has no metadata.name"):format(i), 3)
    end
  end
  if raw_used ~= nil then
    if type(raw_used) ~= "table" then error("capacity: raw_used must be a table {[resource name] = units} or nil", 3) end
    for k, v in pairs(raw_used) do
      if type(k) ~= "string" or math.type(v) ~= "integer" or v < 0 then
        error(("capacity: raw_used[%s] must be a non-negative integer"):format(tostring(k)), 3)
      end
    end
  end
end

--- What `node` offers each class: `{[class name] = units}` (every class of
--- `classes`, 0 when nothing) and the problems `{class?, reason, message}`
--- in a stable order. See docs/decisions/0022 for every rule.
--- @param node table the core/v1 Node
--- @param gpunode table|nil its GPUNode (nil: none)
--- @param kubevirt table|nil the KubeVirt CR (nil: none)
--- @param classes table[] GPUClass objects
--- @param raw_used table<string,integer>|nil units used on the node by running pods not covered by claims, per resource name
--- @return table<string,integer> offers
--- @return table[] problems
function M.of(node, gpunode, kubevirt, classes, raw_used)
  check_args(node, classes, raw_used)
  raw_used = raw_used or {}
  local offers, problems = {}, {}
  for _, c in ipairs(classes) do offers[get(c, "metadata", "name")] = 0 end
  local function problem(class, reason, message)
    problems[#problems + 1] = { class = class, reason = reason, message = message }
  end

  local stale = staleness(node, gpunode)
  if stale then
    problem(nil, stale.reason, stale.message .. ": it offers nothing")
    return offers, problems
  end
  if kubevirt == nil then
    problem(nil, "NoKubeVirt", "no KubeVirt CR: no host device is permitted, the node offers nothing")
    return offers, problems
  end

  local pci, mdev, permitted = entries(kubevirt)
  local units, excluded, notes = carriers(gpunode, pci, mdev)
  for _, n in ipairs(notes) do problem(nil, n.reason, n.message) end

  local per_name = {}
  for _, c in ipairs(classes) do
    local rn = str(get(c, "spec", "resourceName"))
    if rn then per_name[rn] = (per_name[rn] or 0) + 1 end
  end
  local alloc = get(node, "status", "allocatable")

  for _, c in ipairs(classes) do
    local cname = get(c, "metadata", "name")
    local rn, mode, profile = str(get(c, "spec", "resourceName")), get(c, "spec", "mode"), str(get(c, "spec", "profile"))
    if not rn then
      problem(cname, "InvalidClass", "spec.resourceName is not set")
    elseif mode ~= "Passthrough" and not (mode == "VGPU" and profile and profile ~= "") then
      problem(cname, "InvalidClass", mode == "VGPU" and "a VGPU class without spec.profile"
        or ("spec.mode %s is neither Passthrough nor VGPU"):format(tostring(mode)))
    elseif per_name[rn] > 1 then
      problem(cname, "SharedResourceName", ("%d classes have resource name %s"):format(per_name[rn], rn))
    elseif not permitted[rn] then
      problem(cname, "NotPermitted", ("KubeVirt's permittedHostDevices does not list %s"):format(rn))
    else
      local mine, foreign = 0, {}
      for _, u in ipairs(units) do
        if u.name == rn then
          if mode == "Passthrough" then
            if u.kind == "passthrough" then mine = mine + 1
            else foreign[#foreign + 1] = ("%s (vGPU %s)"):format(u.what, u.profile or "of unknown type") end
          elseif u.kind == "vgpu" and same_profile(profile, u.profile) then
            mine = mine + 1
          else
            foreign[#foreign + 1] = u.kind == "passthrough" and (u.what .. " (a passthrough GPU)")
              or ("%s (vGPU %s)"):format(u.what, u.profile or "of unknown type")
          end
        end
      end
      for _, x in ipairs(excluded) do
        if x.name == rn then problem(cname, "Excluded", ("%s does not count for %s: %s"):format(x.what, rn, x.why)) end
      end
      if #foreign > 0 then
        problem(cname, "MixedResourceName", ("%s also carries %s on this node, which class %s cannot promise: it offers nothing here")
          :format(rn, table.concat(foreign, ", "), cname))
      else
        local araw = get(alloc, rn)
        local a, aerr = 0, nil
        if araw ~= nil then a, aerr = quantity.to_integer(araw) end
        if aerr or (a and a < 0) then
          problem(cname, "InvalidAllocatable", ("status.allocatable[%s] is %s: %s"):format(rn, tostring(araw),
            aerr or "negative"))
        else
          if a < mine then
            problem(cname, "AllocatableBelowInventory", ("the GPUNode shows %d of %s, status.allocatable %d"):format(mine, rn, a))
          elseif a > mine then
            problem(cname, "InventoryBelowAllocatable", ("status.allocatable shows %d of %s, the GPUNode %d"):format(a, rn, mine))
          end
          local cap = math.min(mine, a)
          local used = raw_used[rn] or 0
          if used > cap then
            problem(cname, "RawUseExceedsCapacity", ("pods without claims use %d of %s, the node offers %d"):format(used, rn, cap))
          end
          offers[cname] = math.max(0, cap - used)
        end
      end
    end
  end
  return offers, problems
end

--- Whether `node` can take new claim sets, as the binder's index keeps it:
--- {ready, schedulable, layout_pending, taints = {{key, value, effect}},
--- candidate, reasons = {{reason, message}}}. `taints` are the Node's
--- `gpu.cozystack.io/` taints with effect NoSchedule or NoExecute (the
--- caller matches them against a set's tolerations); `candidate` is ready
--- and schedulable and not layout_pending.
--- @param node table the core/v1 Node
--- @param gpunode table|nil its GPUNode
--- @return table
function M.state(node, gpunode)
  if type(node) ~= "table" then error("capacity: node must be a Node object", 2) end
  local reasons = {}
  local function why(reason, message) reasons[#reasons + 1] = { reason = reason, message = message } end
  local name = tostring(get(node, "metadata", "name") or "?")

  local ready_status
  for _, c in ipairs(list(node, "status", "conditions")) do
    if get(c, "type") == "Ready" then ready_status = get(c, "status") end
  end
  local ready = ready_status == "True"
  if not ready then why("NotReady", ("node %s: condition Ready is %s"):format(name, tostring(ready_status or "absent"))) end

  local schedulable = get(node, "spec", "unschedulable") ~= true
  if not schedulable then why("Unschedulable", ("node %s is cordoned (spec.unschedulable)"):format(name)) end

  local pending = false
  local stale = staleness(node, gpunode)
  if stale then
    pending = true
    why(stale.reason, stale.message)
  else
    local gen, seen = get(gpunode, "metadata", "generation"), get(gpunode, "status", "observedGeneration")
    if get(gpunode, "status", "layout", "pending") == true then
      pending = true
      why("LayoutPending", ("GPUNode %s: a layout change waits (status.layout.pending)"):format(name))
    elseif math.type(gen) == "integer" and (math.type(seen) ~= "integer" or seen < gen) then
      pending = true
      why("LayoutPending", ("GPUNode %s: the agent has not acted on generation %d (observedGeneration %s)")
        :format(name, gen, tostring(seen or "absent")))
    end
  end

  local taints = {}
  for _, t in ipairs(list(node, "spec", "taints")) do
    local key, effect = str(get(t, "key")), get(t, "effect")
    if key and key:sub(1, #M.TAINT_PREFIX) == M.TAINT_PREFIX and (effect == "NoSchedule" or effect == "NoExecute") then
      taints[#taints + 1] = { key = key, value = str(get(t, "value")), effect = effect }
    end
  end

  return {
    ready = ready, schedulable = schedulable, layout_pending = pending, taints = taints,
    candidate = ready and schedulable and not pending, reasons = reasons,
  }
end

return M
