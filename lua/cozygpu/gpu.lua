--- cozygpu.gpu — finding the GPU entries of a VirtualMachineInstance and
--- the classes behind them (DESIGN.md §3, §4).
---
--- A GPU entry is (DESIGN.md §4):
---   * any `spec.domain.devices.gpus` entry;
---   * any `spec.domain.devices.hostDevices` entry whose deviceName is a GPU
---     resource name;
---   * any GPU resource name in `spec.domain.resources.{requests,limits}`.
--- GPU resource names are: every GPUClass `spec.resourceName`; the hoster
--- list `gpuResourceNames` (settings); the `10DE` (NVIDIA vendor)
--- `pciHostDevices` and every `mediatedDevices` entry of the KubeVirt CR's
--- `spec.configuration.permittedHostDevices`. A NIC passed through under an
--- `nvidia.com/` name (ConnectX, BlueField: PCI vendor 15B3) is none of
--- these, so it is not a GPU entry.
local json = require "cozygpu.json"
local object = require "cozygpu.object"
local quantity = require "cozygpu.quantity"

local M = {}

-- Sets derived from a cluster view, computed once per view: the view is
-- immutable and lives as long as its snapshot (weak keys let it go).
local memo_permitted = setmetatable({}, { __mode = "k" })
local memo_names = setmetatable({}, { __mode = "k" })
local NONE = {}

local function permitted_host_devices(cluster)
  local kv = cluster:kubevirt()
  if not kv then return nil end
  return object.get(kv, "spec", "configuration", "permittedHostDevices") or json.object()
end

--- The names KubeVirt permits (`pciHostDevices` and `mediatedDevices`
--- resourceNames of the KubeVirt CR), as a set {name = "pci"|"mdev"}; nil
--- when the snapshot has no KubeVirt CR (nothing can be checked). A CR
--- without `permittedHostDevices` permits no host device.
--- @return table<string,string>|nil
local function permitted_set(cluster)
  local m = memo_permitted[cluster]
  if m ~= nil then
    if m == NONE then return nil end
    return m
  end
  local phd = permitted_host_devices(cluster)
  if phd == nil then
    memo_permitted[cluster] = NONE
    return nil
  end
  local set = {}
  for _, d in ipairs(object.list(phd, "pciHostDevices")) do
    local rn = object.get(d, "resourceName")
    if type(rn) == "string" then set[rn] = "pci" end
  end
  for _, d in ipairs(object.list(phd, "mediatedDevices")) do
    local rn = object.get(d, "resourceName")
    if type(rn) == "string" then set[rn] = "mdev" end
  end
  memo_permitted[cluster] = set
  return set
end

function M.permitted(cluster)
  local set = permitted_set(cluster)
  if set == nil then return nil end
  local copy = {}
  for k, v in pairs(set) do copy[k] = v end
  return copy
end

--- The GPU resource names, as a set {name = source}, source one of
--- "class", "settings", "kubevirt-pci" (a 10DE pciHostDevices entry),
--- "kubevirt-mdev".
--- @return table<string,string>
local function names_set(cluster)
  local m = memo_names[cluster]
  if m then return m end
  local set = {}
  local phd = permitted_host_devices(cluster)
  if phd then
    for _, d in ipairs(object.list(phd, "pciHostDevices")) do
      local sel, rn = object.get(d, "pciVendorSelector"), object.get(d, "resourceName")
      if type(sel) == "string" and type(rn) == "string" and sel:upper():match("^10DE:") then
        set[rn] = "kubevirt-pci"
      end
    end
    for _, d in ipairs(object.list(phd, "mediatedDevices")) do
      local rn = object.get(d, "resourceName")
      if type(rn) == "string" then set[rn] = "kubevirt-mdev" end
    end
  end
  local settings = cluster.settings
  for _, rn in ipairs(object.list(settings, "gpuResourceNames")) do set[rn] = "settings" end
  for _, c in ipairs(cluster:gpuclasses()) do
    local rn = object.get(c, "spec", "resourceName")
    if type(rn) == "string" then set[rn] = "class" end
  end
  memo_names[cluster] = set
  return set
end

function M.resource_names(cluster)
  local copy = {}
  for k, v in pairs(names_set(cluster)) do copy[k] = v end
  return copy
end

--- The GPUClass for resource name `name`: the class, or nil and a reason
--- ("none" when no class has it, "ambiguous" when several do).
function M.class_for(cluster, name)
  local classes = cluster:classes_for_resource(name)
  if #classes == 1 then return classes[1] end
  if #classes == 0 then return nil, "none" end
  return nil, "ambiguous"
end

--- Fields of a VMI spec that carry GPU entries but have the wrong JSON
--- type (KubeVirt's VirtualMachineInstanceSpec: domain.devices.gpus and
--- hostDevices are lists of objects, domain.resources.limits and requests
--- are maps). The API server's schema check for the CRD runs after the
--- mutating webhooks, and entries() reads a wrong type as "no entries", so
--- a rule refuses these first (found in hardening: a VMI whose `gpus` was an object
--- was allowed past maxCount). Returns a list of {field, message}, empty
--- when every field present has its type.
--- @param spec table the VMI `spec`
--- @param prefix string|nil field path of `spec` (default "spec")
--- @return {field: string, message: string}[]
function M.shape_problems(spec, prefix)
  prefix = prefix or "spec"
  local out = {}
  local function kind(v) return v == nil and "absent" or json.kind(v) end
  if spec ~= nil and kind(spec) ~= "object" then
    return { { field = prefix, message = "must be an object" } }
  end
  for _, f in ipairs { "gpus", "hostDevices" } do
    local v = object.get(spec, "domain", "devices", f)
    local path = ("%s.domain.devices.%s"):format(prefix, f)
    if v ~= nil and kind(v) ~= "array" then
      out[#out + 1] = { field = path, message = "must be a list" }
    elseif v ~= nil then
      for i, item in ipairs(v) do
        if kind(item) ~= "object" then out[#out + 1] = { field = ("%s[%d]"):format(path, i - 1), message = "must be an object" } end
      end
    end
  end
  for _, f in ipairs { "limits", "requests" } do
    local v = object.get(spec, "domain", "resources", f)
    if v ~= nil and kind(v) ~= "object" then
      out[#out + 1] = { field = ("%s.domain.resources.%s"):format(prefix, f), message = "must be a map of quantities" }
    end
  end
  return out
end

--- The GPU entries of a VMI spec, in order: gpus, hostDevices, resources.
--- Each entry: {source = "gpus"|"hostDevices"|"resources", path = field
--- path of the entry, field = field path of its resource name, name =
--- resource name (nil for a DRA entry), entry_name = the entry's `name`,
--- count = devices (1 per list entry; the quantity for resources),
--- count_error = message when the quantity is not a whole number,
--- dra = true for a `claimName` entry, class = the GPUClass or nil,
--- class_problem = "none"|"ambiguous" when class is nil}.
--- @param spec table the VMI `spec`
--- @param cluster table the cluster view
--- @param prefix string|nil field path of `spec` (default "spec")
--- @return table[]
function M.entries(spec, cluster, prefix)
  prefix = prefix or "spec"
  local names = names_set(cluster)
  local out = {}
  local function add(e)
    if e.name then
      e.class, e.class_problem = M.class_for(cluster, e.name)
    end
    out[#out + 1] = e
  end
  for i, g in ipairs(object.list(spec, "domain", "devices", "gpus")) do
    local path = ("%s.domain.devices.gpus[%d]"):format(prefix, i - 1)
    local dn = object.get(g, "deviceName")
    add {
      source = "gpus", path = path, field = path .. ".deviceName", name = type(dn) == "string" and dn or nil,
      entry_name = object.get(g, "name"), count = 1, dra = object.get(g, "claimName") ~= nil,
    }
  end
  for i, h in ipairs(object.list(spec, "domain", "devices", "hostDevices")) do
    local dn = object.get(h, "deviceName")
    if type(dn) == "string" and names[dn] then
      local path = ("%s.domain.devices.hostDevices[%d]"):format(prefix, i - 1)
      add {
        source = "hostDevices", path = path, field = path .. ".deviceName", name = dn,
        entry_name = object.get(h, "name"), count = 1,
      }
    end
  end
  -- extended resources: limits win over requests (they must be equal)
  local seen = {}
  for _, which in ipairs { "limits", "requests" } do
    local res = object.get(spec, "domain", "resources", which)
    if type(res) == "table" then
      local keys = {}
      for k in pairs(res) do if names[k] then keys[#keys + 1] = k end end
      table.sort(keys)
      for _, k in ipairs(keys) do
        if not seen[k] then
          seen[k] = true
          local n, err = quantity.to_integer(res[k])
          local path = ("%s.domain.resources.%s[%s]"):format(prefix, which, k)
          add { source = "resources", path = path, field = path, name = k, count = n or 0, count_error = err }
        end
      end
    end
  end
  return out
end

--- Number of GPUs in a VMI (an object with `spec`), optionally only those
--- whose class matches `filter` ({mode = "VGPU"|"Passthrough", class =
--- name}). Entries without a class count only when no filter is given.
function M.count(vmi, cluster, filter)
  local n = 0
  for _, e in ipairs(M.entries(object.get(vmi, "spec") or {}, cluster)) do
    local ok = true
    if filter then
      if not e.class then ok = false
      else
        if filter.mode and object.get(e.class, "spec", "mode") ~= filter.mode then ok = false end
        if filter.class and object.get(e.class, "metadata", "name") ~= filter.class then ok = false end
      end
    end
    if ok then n = quantity.add(n, e.count or 0) end
  end
  return n
end

--- The effective maxCount of a class (DESIGN.md §3): spec.maxCount when
--- set; else 1 for VGPU; else nil (Passthrough: "the GPUs of one node").
function M.max_count(class)
  local m = object.get(class, "spec", "maxCount")
  if math.type(m) == "integer" then return m end
  if object.get(class, "spec", "mode") == "VGPU" then return 1 end
  return nil
end

--- Extended resources a pod requests whose name satisfies `accept(name)`,
--- across initContainers, containers and ephemeralContainers: a list of
--- {name=, count=, field=} (limits win over requests per container; count
--- 0 when the quantity is not a whole number).
--- @param pod table
--- @param accept fun(name: string): boolean
--- @return table[]
function M.pod_resources(pod, accept)
  local out = {}
  for _, group in ipairs { "initContainers", "containers", "ephemeralContainers" } do
    for i, c in ipairs(object.list(pod, "spec", group)) do
      local seen = {}
      for _, which in ipairs { "limits", "requests" } do
        local res = object.get(c, "resources", which)
        if type(res) == "table" then
          local keys = {}
          for k in pairs(res) do if type(k) == "string" and accept(k) and not seen[k] then keys[#keys + 1] = k end end
          table.sort(keys)
          for _, k in ipairs(keys) do
            seen[k] = true
            out[#out + 1] = {
              name = k, count = quantity.to_integer(res[k]) or 0,
              field = ("spec.%s[%d].resources.%s[%s]"):format(group, i - 1, which, k),
            }
          end
        end
      end
    end
  end
  return out
end

--- GPU resource names requested by a pod (pod_resources of the GPU
--- resource names).
function M.pod_requests(pod, cluster)
  local names = names_set(cluster)
  return M.pod_resources(pod, function(k) return names[k] ~= nil end)
end

return M
