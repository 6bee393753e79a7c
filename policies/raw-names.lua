-- The raw-name policy (DESIGN.md §4 "Raw-name policy", §10
-- `rawResourceNames`): Allowed (default) does nothing; Warn allows with an
-- admission warning; Forbidden refuses
--   * GPU entries on every VMI without a class reference (the label
--     gpu.cozystack.io/class-reference=true, docs/decisions/0003), on every
--     path (gpus, hostDevices, resources);
--   * GPUs a VMI takes through DRA (KubeVirt v1.9 kubevirt.io/api core/v1:
--     spec.resourceClaims, and gpus[]/hostDevices[] entries naming
--     claimName + requestName), on every VMI, class reference or not: a
--     hostDevices entry or a claim request (one no gpus/hostDevices entry
--     names: virt-controller still puts it on the launcher pod) whose
--     device class is a GPU class, and a DRA extended resource of a GPU
--     class in spec.domain.resources;
--   * every pod in a tenant namespace that requests a GPU — through any
--     container (init and ephemeral too), through DRA in the extended-
--     resource forms (`deviceclass.resource.kubernetes.io/<class>`, or a
--     DeviceClass's spec.extendedResourceName), or through a pod resource
--     claim whose ResourceClaim (or template) asks for a GPU device class
--     (`gpuDeviceClasses`) in any request or subrequest — unless it is a
--     virt-launcher pod: created by KubeVirt's virt-controller service
--     account (`virtControllerUser`, default system:serviceaccount:<KubeVirt
--     CR namespace>:kubevirt-controller) AND owned by a
--     VirtualMachineInstance. The exception rests on the request's
--     userInfo, which the API server sets, never on labels or owner
--     references alone, which a tenant can write.
-- A claim whose object is not in the cluster state counts as a GPU (fail
-- closed). A pod outside the tenant tree is not this policy's business. A
-- NIC under an nvidia.com/ name is no GPU resource name (cozygpu.gpu), so it
-- is never refused here.
local object = require "cozygpu.object"
local tenant = require "cozygpu.tenant"

local CLASS_REFERENCE = "gpu.cozystack.io/class-reference"
local DRA_PREFIX = "deviceclass.resource.kubernetes.io/"

local function mode(cluster)
  return object.get(cluster.settings, "rawResourceNames") or "Allowed"
end

local function verdict(m, message, field)
  if m == "Forbidden" then return deny(message, { field = field }) end
  return warn(message)
end

local function owned_by_vmi(pod)
  for _, ref in ipairs(object.list(pod, "metadata", "ownerReferences")) do
    local av = object.get(ref, "apiVersion")
    if object.get(ref, "kind") == "VirtualMachineInstance" and type(av) == "string" and av:match("^kubevirt%.io/") then
      return true
    end
  end
  return false
end

-- ---- DRA (resource.k8s.io) -------------------------------------------------
-- ResourceClaims, ResourceClaimTemplates and DeviceClasses come at the
-- version the controller could read (v1, else v1beta2, else v1beta1:
-- core/kube/watch.h VERSIONS) or a snapshot holds, so every shape is read.

--- The device classes of one DeviceRequest, whatever its version: in
--- resource.k8s.io/v1 and v1beta2 `exactly.deviceClassName`, or one per
--- `firstAvailable[]` subrequest (any of them may be picked, so each
--- counts); in v1beta1 `deviceClassName` on the request itself, or the
--- same `firstAvailable[]` (k8s.io/api resource/v1 types.go DeviceRequest,
--- ExactDeviceRequest, DeviceSubRequest; resource/v1beta1 DeviceRequest).
--- A reference to one subrequest ("<request>/<subrequest>") still gets the
--- whole request: the scheduler picks the subrequest.
local function request_classes(r)
  local out = {}
  local function add(dc) if type(dc) == "string" then out[#out + 1] = dc end end
  add(object.get(r, "exactly", "deviceClassName"))
  add(object.get(r, "deviceClassName"))
  for _, sub in ipairs(object.list(r, "firstAvailable")) do add(object.get(sub, "deviceClassName")) end
  return out
end

--- The requests of the claim a reference names (a pod's
--- spec.resourceClaims[] entry, Kubernetes core/v1 PodResourceClaim, or a
--- VMI's, KubeVirt VirtualMachineInstanceResourceClaim: both carry
--- resourceClaimName or resourceClaimTemplateName): the ResourceClaim's
--- spec.devices.requests, or the ResourceClaimTemplate's
--- spec.spec.devices.requests, in namespace `ns`. nil and why not when the
--- object is not in the cluster state (or the reference names none).
local function claim_requests(cluster, ns, ref)
  local obj, spec
  local tname, cname = object.get(ref, "resourceClaimTemplateName"), object.get(ref, "resourceClaimName")
  if type(tname) == "string" then
    obj = cluster:get("ResourceClaimTemplate", ns, tname)
    spec = obj and object.get(obj, "spec", "spec")
    if not obj then return nil, ("ResourceClaimTemplate %s/%s is not in the cluster state"):format(ns, tname) end
  elseif type(cname) == "string" then
    obj = cluster:get("ResourceClaim", ns, cname)
    spec = obj and object.get(obj, "spec")
    if not obj then return nil, ("ResourceClaim %s/%s is not in the cluster state"):format(ns, cname) end
  else
    return nil, "it names neither resourceClaimName nor resourceClaimTemplateName"
  end
  return object.list(spec, "devices", "requests")
end

--- The GPU device classes among `classes` (a set of settings
--- gpuDeviceClasses), each once, as a list; empty when none is one.
local function gpu_only(gpu_classes, classes)
  local out, seen = {}, {}
  for _, dc in ipairs(classes) do
    if gpu_classes[dc] and not seen[dc] then
      seen[dc] = true
      out[#out + 1] = dc
    end
  end
  return out
end

--- The settings' GPU device classes (`gpuDeviceClasses`) as a set, and the
--- extended resource names that stand for them under DRA, as a map name ->
--- class: `deviceclass.resource.kubernetes.io/<class>` for every GPU class
--- (the implicit name, k8s.io/api resource/v1 ResourceDeviceClassPrefix),
--- and the spec.extendedResourceName of every DeviceClass in the cluster
--- state that is a GPU class (Kubernetes 1.34+ DRAExtendedResource,
--- resource/v1 DeviceClassSpec.ExtendedResourceName). When several classes
--- declare one name the scheduler picks one of them; a name any GPU class
--- declares counts (fail closed).
local function dra_gpu_names(cluster)
  local classes, names = {}, {}
  for _, c in ipairs(object.list(cluster.settings, "gpuDeviceClasses")) do
    classes[c] = true
    names[DRA_PREFIX .. c] = c
  end
  for _, dc in ipairs(cluster:list("DeviceClass")) do
    local name, ern = object.get(dc, "metadata", "name"), object.get(dc, "spec", "extendedResourceName")
    if classes[name] and type(ern) == "string" and names[ern] == nil then names[ern] = name end
  end
  return classes, names
end

-- Verdict records: {name = what is asked for (for the pod message), field
-- =, unknown = true when the claim cannot be looked up (name: why), message
-- = the whole message (VMIs)}.

-- GPU requests of a pod: device-plugin names (cozygpu.gpu.pod_requests),
-- DRA extended resources of GPU device classes, and pod resource claims
-- whose ResourceClaim (or template) asks for a GPU device class. A claim
-- whose object is not in the cluster state cannot be judged, and counts as
-- a GPU request (fail closed), with `unknown` set.
local function pod_gpu_requests(pod, cluster)
  local out, seen = {}, {}
  for _, r in ipairs(gpu.pod_requests(pod, cluster)) do
    out[#out + 1] = r
    seen[r.field] = true
  end
  local gpu_classes, dra_names = dra_gpu_names(cluster)
  for _, r in ipairs(gpu.pod_resources(pod, function(k) return dra_names[k] ~= nil end)) do
    if not seen[r.field] then
      if r.name ~= DRA_PREFIX .. dra_names[r.name] then
        r.name = ("%s (DRA extended resource of device class %s)"):format(r.name, dra_names[r.name])
      end
      out[#out + 1] = r
    end
  end
  local ns = object.get(pod, "metadata", "namespace")
  for i, ref in ipairs(object.list(pod, "spec", "resourceClaims")) do
    local field = ("spec.resourceClaims[%d]"):format(i - 1)
    local requests, what = claim_requests(cluster, ns, ref)
    if not requests then
      out[#out + 1] = { name = what, field = field, unknown = true }
    else
      for _, r in ipairs(requests) do
        local g = gpu_only(gpu_classes, request_classes(r))
        if #g > 0 then out[#out + 1] = { name = "DRA device class " .. table.concat(g, ", "), field = field } end
      end
    end
  end
  return out
end

-- How to order a GPU instead (the end of every VMI message).
local BY_CLASS = ("order GPUs by class (label %s=true and a GPUClass resource name)"):format(CLASS_REFERENCE)

-- GPUs a VMI takes through DRA (KubeVirt v1.9 kubevirt.io/api core/v1
-- VirtualMachineInstanceSpec.ResourceClaims, GPU and HostDevice with the
-- inline ClaimRequest {claimName, requestName}; virt-controller copies
-- every spec.resourceClaims entry to the launcher pod, services/template.go):
--   * a hostDevices entry whose claim request asks for a GPU device class;
--   * a request of a spec.resourceClaims claim that no gpus or hostDevices
--     entry names and that asks for a GPU device class (the pod gets the
--     device all the same);
--   * a DRA extended resource of a GPU class in spec.domain.resources.
-- gpus entries with claimName are GPU entries of cozygpu.gpu.entries and
-- judged there. A claim not in the cluster state, or a claimName /
-- requestName the VMI or its claim does not have, counts (fail closed).
local function vmi_dra_requests(vmi, cluster)
  local out = {}
  local spec = object.get(vmi, "spec")
  local ns = object.get(vmi, "metadata", "namespace")
  local gpu_classes, dra_names = dra_gpu_names(cluster)
  local claims, referenced = {}, {}
  for _, ref in ipairs(object.list(spec, "resourceClaims")) do
    local name = object.get(ref, "name")
    if type(name) == "string" then claims[name] = ref end
  end
  -- the claims and requests the devices name ("<request>" of "<request>/<subrequest>")
  local function mark(entry)
    local cn, rn = object.get(entry, "claimName"), object.get(entry, "requestName")
    if type(cn) ~= "string" then return nil end
    referenced[cn] = referenced[cn] or {}
    if type(rn) == "string" then referenced[cn][rn:match("^[^/]*")] = true else referenced[cn]["*"] = true end
    return cn, rn
  end
  for _, g in ipairs(object.list(spec, "domain", "devices", "gpus")) do mark(g) end
  for i, h in ipairs(object.list(spec, "domain", "devices", "hostDevices")) do
    local cn, rn = mark(h)
    if cn then
      local field = ("spec.domain.devices.hostDevices[%d].claimName"):format(i - 1)
      local c = claims[cn]
      local requests, why
      if not c then
        why = "spec.resourceClaims does not list it"
      else
        requests, why = claim_requests(cluster, ns, c)
      end
      if not requests then
        out[#out + 1] = { field = field, message = ("cannot tell whether DRA claim %q of host device %q asks for a GPU: %s"):format(
          cn, object.show(object.get(h, "name")), why) }
      else
        local req = type(rn) == "string" and rn:match("^[^/]*") or nil
        local classes, found = {}, false
        for _, r in ipairs(requests) do
          if req == nil or object.get(r, "name") == req then
            found = true
            for _, dc in ipairs(request_classes(r)) do classes[#classes + 1] = dc end
          end
        end
        if not found then
          out[#out + 1] = { field = field, message = ("cannot tell whether DRA claim %q of host device %q asks for a GPU: it has no request %q"):format(
            cn, object.show(object.get(h, "name")), tostring(req)) }
        else
          local g = gpu_only(gpu_classes, classes)
          if #g > 0 then
            out[#out + 1] = { field = field, message = ("host device %q takes a GPU through DRA claim %q (device class %s): %s"):format(
              object.show(object.get(h, "name")), cn, table.concat(g, ", "), BY_CLASS) }
          end
        end
      end
    end
  end
  for i, ref in ipairs(object.list(spec, "resourceClaims")) do
    local field, rawname = ("spec.resourceClaims[%d]"):format(i - 1), object.get(ref, "name")
    local name = object.show(rawname)
    local requests, why = claim_requests(cluster, ns, ref)
    local refs = type(rawname) == "string" and referenced[rawname] or nil
    if not requests then
      -- a claim a device names is reported there (hostDevices) or is a GPU entry (gpus)
      if not refs then
        out[#out + 1] = { field = field, message = ("cannot tell whether DRA claim %q asks for a GPU: %s"):format(name, why) }
      end
    elseif not (refs and refs["*"]) then
      for _, r in ipairs(requests) do
        local rname = object.get(r, "name")
        if not (refs and refs[rname]) then
          local g = gpu_only(gpu_classes, request_classes(r))
          if #g > 0 then
            out[#out + 1] = { field = field, message = ("DRA claim %q asks for a GPU (request %q, device class %s) that no device of the VM names: %s"):format(
              name, object.show(rname), table.concat(g, ", "), BY_CLASS) }
          end
        end
      end
    end
  end
  -- DRA extended resources (a device-plugin GPU name is a GPU entry already)
  local names, seen = gpu.resource_names(cluster), {}
  for _, which in ipairs { "limits", "requests" } do
    local res = object.get(spec, "domain", "resources", which)
    if type(res) == "table" then
      local keys = {}
      for k in pairs(res) do
        if type(k) == "string" and dra_names[k] and not names[k] and not seen[k] then keys[#keys + 1] = k end
      end
      table.sort(keys)
      for _, k in ipairs(keys) do
        seen[k] = true
        out[#out + 1] = { field = ("spec.domain.resources.%s[%s]"):format(which, k), message = ("GPU %q ordered as a DRA extended resource (device class %s): %s"):format(
          k, dra_names[k], BY_CLASS) }
      end
    end
  end
  return out
end

return rule "gpu/raw-names" {
  description = "rawResourceNames: warn about or refuse GPUs ordered by device-plugin name instead of by class",
  match = function(req)
    local k = req.kind or {}
    return req.operation == "CREATE" and ((k.kind == "VirtualMachineInstance" and k.group == "kubevirt.io")
      or (k.kind == "Pod" and k.group == ""))
  end,
  validate = function(req, cluster)
    local m = mode(cluster)
    if m ~= "Warn" and m ~= "Forbidden" then return nil end
    local obj = req.object
    local out = {}
    if req.kind.kind == "VirtualMachineInstance" then
      -- a class-referencing VMI's GPU entries are vmi-gpus.lua's (which
      -- refuses a DRA gpus entry); GPUs through DRA are raw on every VMI
      if object.label(obj, CLASS_REFERENCE) ~= "true" then
        -- entries() lists every gpus entry first, in order
        local gpus, n = object.list(obj, "spec", "domain", "devices", "gpus"), 0
        for _, e in ipairs(gpu.entries(object.get(obj, "spec"), cluster)) do
          if e.source == "gpus" then n = n + 1 end
          if e.dra then
            local g = gpus[n]
            out[#out + 1] = verdict(m, ("GPU %q ordered through DRA claim %q (request %q): %s"):format(
              object.show(e.entry_name), object.show(object.get(g, "claimName")), object.show(object.get(g, "requestName")), BY_CLASS),
              e.path .. ".claimName")
          else
            out[#out + 1] = verdict(m, ("GPU %q ordered by device-plugin name: %s"):format(object.show(e.name or e.entry_name), BY_CLASS),
              e.field or e.path)
          end
        end
      end
      for _, r in ipairs(vmi_dra_requests(obj, cluster)) do out[#out + 1] = verdict(m, r.message, r.field) end
      return out
    end
    -- a pod
    local ns = cluster:namespace(req.namespace)
    if not ns or #tenant.ancestors(ns, object.get(cluster.settings, "tenantRoot")) == 0 then return nil end
    local requests = pod_gpu_requests(obj, cluster)
    if #requests == 0 then return nil end
    local user = object.get(req, "userInfo", "username")
    local vc = cluster:virt_controller()
    if vc and user == vc and owned_by_vmi(obj) then return nil end
    for _, r in ipairs(requests) do
      if r.unknown then
        out[#out + 1] = verdict(m, ("cannot tell whether the pod's DRA claim asks for a GPU: %s"):format(r.name), r.field)
      else
        out[#out + 1] = verdict(m, ("pod requests GPU %q directly: GPUs are ordered by class through a VirtualMachine (only KubeVirt's virt-launcher pods may request them)"):format(r.name), r.field)
      end
    end
    return out
  end,
}
