-- The raw-name policy (DESIGN.md §4 "Raw-name policy", §10
-- `rawResourceNames`): Allowed (default) does nothing; Warn allows with an
-- admission warning; Forbidden refuses
--   * GPU entries on every VMI without a class reference (the label
--     gpu.cozystack.io/class-reference=true, docs/decisions/0003), on every
--     path (gpus, hostDevices, resources);
--   * every pod in a tenant namespace that requests a GPU — through any
--     container (init and ephemeral too), through DRA in the extended-
--     resource form `deviceclass.resource.kubernetes.io/<class>`, or
--     through a pod resource claim whose ResourceClaim (or template) asks
--     for a GPU device class (`gpuDeviceClasses`); a claim whose object is
--     not in the cluster state counts as one (fail closed) — unless it is a virt-launcher
--     pod: created by KubeVirt's virt-controller service account
--     (`virtControllerUser`, default system:serviceaccount:<KubeVirt CR
--     namespace>:kubevirt-controller) AND owned by a VirtualMachineInstance.
--     The exception rests on the request's userInfo, which the API server
--     sets, never on labels or owner references alone, which a tenant can
--     write.
-- A pod outside the tenant tree is not this policy's business. A NIC under
-- an nvidia.com/ name is no GPU resource name (cozygpu.gpu), so it is never
-- refused here.
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

-- The device classes a DRA claim asks for: ResourceClaim
-- spec.devices.requests[].deviceClassName (resource.k8s.io/v1beta1), or
-- the same under a ResourceClaimTemplate's spec.spec. nil when the object
-- is not in the cluster state.
local function claim_device_classes(cluster, ns, ref)
  local obj, spec
  local tname, cname = object.get(ref, "resourceClaimTemplateName"), object.get(ref, "resourceClaimName")
  if type(tname) == "string" then
    obj = cluster:get("ResourceClaimTemplate", ns, tname)
    spec = obj and object.get(obj, "spec", "spec")
  elseif type(cname) == "string" then
    obj = cluster:get("ResourceClaim", ns, cname)
    spec = obj and object.get(obj, "spec")
  end
  if not obj then return nil, tname and ("ResourceClaimTemplate " .. ns .. "/" .. tname) or ("ResourceClaim " .. ns .. "/" .. tostring(cname)) end
  local out = {}
  for _, r in ipairs(object.list(spec, "devices", "requests")) do
    local dc = object.get(r, "deviceClassName")
    if type(dc) == "string" then out[#out + 1] = dc end
  end
  return out
end

-- GPU requests of a pod: device-plugin names (cozygpu.gpu.pod_requests),
-- DRA device classes in the extended-resource form, and pod resource
-- claims whose ResourceClaim (or template) asks for a GPU device class.
-- A claim whose object is not in the cluster state cannot be judged, and
-- counts as a GPU request (fail closed), with `unknown` set.
local function pod_gpu_requests(pod, cluster)
  local out = {}
  for _, r in ipairs(gpu.pod_requests(pod, cluster)) do out[#out + 1] = r end
  local classes, gpu_classes = {}, {}
  for _, c in ipairs(object.list(cluster.settings, "gpuDeviceClasses")) do
    classes[DRA_PREFIX .. c] = true
    gpu_classes[c] = true
  end
  local ns = object.get(pod, "metadata", "namespace")
  for i, ref in ipairs(object.list(pod, "spec", "resourceClaims")) do
    local field = ("spec.resourceClaims[%d]"):format(i - 1)
    local dcs, what = claim_device_classes(cluster, ns, ref)
    if not dcs then
      out[#out + 1] = { name = what, field = field, unknown = true }
    else
      for _, dc in ipairs(dcs) do
        if gpu_classes[dc] then out[#out + 1] = { name = "DRA device class " .. dc, field = field } end
      end
    end
  end
  for _, r in ipairs(gpu.pod_resources(pod, function(k) return classes[k] ~= nil end)) do out[#out + 1] = r end
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
      if object.label(obj, CLASS_REFERENCE) == "true" then return nil end
      for _, e in ipairs(gpu.entries(object.get(obj, "spec"), cluster)) do
        out[#out + 1] = verdict(m, ("GPU %q ordered by device-plugin name: order GPUs by class (label %s=true and a GPUClass resource name)"):format(
          tostring(e.name or "DRA claim"), CLASS_REFERENCE), e.field or e.path)
      end
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
        out[#out + 1] = verdict(m, ("cannot tell whether the pod's DRA claim asks for a GPU: %s is not in the cluster state"):format(r.name), r.field)
      else
        out[#out + 1] = verdict(m, ("pod requests GPU %q directly: GPUs are ordered by class through a VirtualMachine (only KubeVirt's virt-launcher pods may request them)"):format(r.name), r.field)
      end
    end
    return out
  end,
}
