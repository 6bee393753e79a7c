-- The billing annotation of virt-launcher pods (DESIGN.md §3 "Usage
-- records": a virt-launcher pod must not report GPUs a second time;
-- docs/decisions/0028).
--
-- Cozystack bills a VM's pods: its VM app has a WorkloadMonitor selecting
-- them, and the monitor's reconciler writes one Workload per pod with the
-- sum of the containers' requests — the GPU device-plugin resource name
-- included — where the pod annotation workload.cozystack.io/resources (a
-- JSON object, name -> quantity string) replaces the named keys
-- (cozystack internal/controller/workloadmonitor_controller.go,
-- reconcilePodForMonitor). The GPUs a VMI takes through GPUClaims are
-- billed by the claims' own records (one per Bound or Attached claim), so
-- this rule sets, in the launcher pod's annotation, each GPU resource name
-- the claims cover to "0".
--
-- Whose pods: only those the virt-controller creates (the request's user,
-- which the API server sets and no tenant can forge: cluster:
-- virt_controller(), as policies/raw-names.lua trusts it).
--
-- Which names: a pod whose VMI names ordered claims (gpu.cozystack.io/
-- claims, which KubeVirt copies to the pod) or takes template claims
-- (decision 0027) gets all its GPUs from those claims — the VMI's GPU
-- entries had to match the named claims class by class (DESIGN.md §3),
-- and template claims are made for every class its compute container
-- asks for — so every GPU resource name the pod requests that is a
-- GPUClass's resourceName is covered. A raw-name GPU (no class) has no
-- claim and no record: the pod's Workload keeps billing it.
--
-- A GPU no claim covers (a raw-name GPU, or any GPU of a pod whose VMI
-- names no claims) is billed by the pod alone, so the annotation may not
-- override it: a key naming such a GPU resource is removed, whatever its
-- value, and Cozystack bills the containers' requests (decision 0036,
-- item 4: a VM that set the key to "0" on its VMI ran its GPU unbilled).
--
-- The annotation may be there already (KubeVirt copies the VMI's
-- annotations to the pod, template.go filterVMIAnnotationsForPod): its
-- other keys are kept. One Cozystack cannot read (not a JSON object of
-- strings: Go's json.Unmarshal into map[string]string then fails and the
-- whole annotation is ignored) is replaced by ours. So is one with a
-- key twice, which Go reads (the last wins) and json.decode refuses: its
-- other keys are lost, a case no copy of a VMI annotation should produce.
local object = require "cozygpu.object"
local claims = require "cozygpu.claims"

local RESOURCES = "workload.cozystack.io/resources"

-- A virt-launcher pod: label kubevirt.io=virt-launcher and a controller
-- owner reference to a VirtualMachineInstance (KubeVirt's template
-- service, pkg/virt-controller/services/template.go).
local function is_virt_launcher(pod)
  if object.label(pod, "kubevirt.io") ~= "virt-launcher" then return false end
  local owner = object.controller_of(pod)
  return owner ~= nil and object.get(owner, "kind") == "VirtualMachineInstance"
end

-- The annotation's value as Cozystack reads it: a table of name -> string,
-- or nil when Cozystack would ignore it whole.
local function parse(value)
  if type(value) ~= "string" then return nil end
  local v = json.decode(value)
  if v == nil or json.kind(v) ~= "object" then return nil end
  local out = {}
  for k, q in pairs(v) do
    if type(k) ~= "string" or type(q) ~= "string" then return nil end
    out[k] = q
  end
  return out
end

return rule "gpu/launcher-billing" {
  description = "virt-launcher pods of VMIs with GPUClaims report the claims' GPUs as 0 in workload.cozystack.io/resources (the claims' usage records bill them); other GPUs stay billed by the pod",
  match = { kind = "Pod", group = "", operations = { "CREATE" } },
  mutate = function(req, cluster)
    local pod = req.object
    if not is_virt_launcher(pod) then return nil end
    -- zeroed only in a pod KubeVirt made: labels and owner references are
    -- the creator's to write, so a tenant's own pod dressed as a launcher
    -- keeps its GPUs billed (the pod's Workload); unknown virt-controller
    -- (no setting, no KubeVirt CR): nothing is zeroed, never under-billed
    local vc = cluster:virt_controller()
    local by_kubevirt = vc ~= nil and object.get(req, "userInfo", "username") == vc
    local with_claims = by_kubevirt and (claims.of(pod) ~= nil or claims.templated(pod))
    local covered, uncovered = {}, {}
    for _, r in ipairs(gpu.pod_requests(pod, cluster)) do
      if with_claims and gpu.class_for(cluster, r.name) ~= nil then
        covered[#covered + 1] = r.name
      else
        uncovered[#uncovered + 1] = r.name
      end
    end
    if #covered == 0 and #uncovered == 0 then return nil end
    local annotations = object.get(pod, "metadata", "annotations")
    local present = type(annotations) == "table" and annotations[RESOURCES] or nil
    if present == nil and #covered == 0 then return nil end
    local map = parse(present)
    -- nothing to zero and an annotation Cozystack ignores whole: it bills
    -- the requests already
    if map == nil and #covered == 0 then return nil end
    local changed = map == nil
    map = map or {}
    for _, name in ipairs(covered) do
      if map[name] ~= "0" then
        map[name] = "0"
        changed = true
      end
    end
    for _, name in ipairs(uncovered) do
      if map[name] ~= nil then
        map[name] = nil
        changed = true
      end
    end
    if not changed then return nil end
    local value = assert(json.encode(json.object(map)))
    if type(annotations) ~= "table" then
      return patch.new():add("/metadata/annotations", json.object { [RESOURCES] = value })
    end
    return patch.new():add({ "metadata", "annotations", RESOURCES }, value)
  end,
}
