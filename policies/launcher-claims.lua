-- The scheduling gate and the pin of virt-launcher pods (DESIGN.md §4
-- "virt-launcher pod create", docs/decisions/0020 item 5
-- and 0025). A virt-launcher pod whose VMI names GPUClaims
-- (gpu.cozystack.io/claims; KubeVirt copies every VMI annotation to the
-- pod, template.go filterVMIAnnotationsForPod) gets, when the claims are
-- all Attached to that VMI on one node (a new launcher pod of a running
-- VMI), a required node affinity to that node and no gate; otherwise the
-- gate gpu.cozystack.io/claims, which the leader removes after binding the
-- set and pinning the pod the same way. A claim only Bound gates too: two
-- VMIs may name it (admitted at once on two replicas, before either
-- replica's cache shows the other), and the leader ungates the pod of the
-- one VMI its set gives the claim to: the gate is the serialization point
-- (decision 0036).
-- A virt-launcher pod of a VMI with template claims (DESIGN.md §3,
-- docs/decisions/0027: the class-reference label, which KubeVirt
-- copies from the VMI, template.go podLabels, and no claims annotation) is
-- judged against the claims `<vmi>-<class>` the leader creates for the
-- classes its compute container requests: Bound or Attached to one node
-- pins, since each must also be that VMI's own template claim (label,
-- controller owner with the VMI's uid, class and count), which no other
-- VMI can name; one not created yet — the usual case at pod creation —
-- gates.
-- Whatever this rule cannot judge (a claim the view does not hold yet, a
-- malformed list or affinity) gates: the pod waits for the leader rather
-- than run on a guess. A malformed list is also refused, at /validate/pod.
local object = require "cozygpu.object"
local claims = require "cozygpu.claims"
local pin = require "cozygpu.pin"

-- The VMI a virt-launcher pod runs: label kubevirt.io=virt-launcher and a
-- controller owner reference to a VirtualMachineInstance (KubeVirt's
-- template service, pkg/virt-controller/services/template.go); its name
-- and uid (nil when the reference has none), or nil for any other pod.
local function launcher_vmi(pod)
  if object.label(pod, "kubevirt.io") ~= "virt-launcher" then return nil end
  local owner = object.controller_of(pod)
  if owner == nil or object.get(owner, "kind") ~= "VirtualMachineInstance" then return nil end
  local name, uid = object.get(owner, "name"), object.get(owner, "uid")
  if type(name) ~= "string" then return nil end
  return name, type(uid) == "string" and uid or nil
end

-- The node of a template VMI's claims (decision 0027), or nil: `set`, the
-- claims the pod's compute container asks for
-- (claims.template_names_of_pod; nil when it could not be formed), each
-- in the view and this VMI's template claim (claims.template_mismatch),
-- before pin.node_of judges their phases and nodes. A claim not created
-- yet gives nil: the caller gates.
local function template_node(cluster, ns, set, vmi, uid)
  if set == nil or #set == 0 or type(ns) ~= "string" or ns == "" then return nil end
  local names = {}
  for _, want in ipairs(set) do
    local c = cluster:get("GPUClaim", ns, want.name)
    if c == nil or claims.template_mismatch(c, want, vmi, uid) ~= nil then return nil end
    names[#names + 1] = want.name
  end
  return (pin.node_of(cluster, ns, names, vmi))
end

return rule "gpu/launcher-claims" {
  description = "virt-launcher pods of VMIs naming GPUClaims or getting template claims: pinned to the claims' node when attached to the VMI (template claims: bound), else gated until the leader gives the VMI its claims",
  match = { kind = "Pod", group = "", operations = { "CREATE" } },
  -- /validate/pod: the list must parse (KubeVirt copies it verbatim from
  -- the VMI, where it was checked at creation: a malformed one was edited
  -- in later, decision 0019, or the pod is not KubeVirt's). A gated pod
  -- with a list nobody can read would wait forever without a word.
  validate = function(req)
    local pod = req.object
    if launcher_vmi(pod) == nil then return nil end
    local names, problems = claims.of(pod)
    if names == nil or #problems == 0 then return nil end
    local out = {}
    for _, p in ipairs(problems) do out[#out + 1] = deny(p, { field = claims.FIELD, code = 422 }) end
    return out
  end,
  mutate = function(req, cluster)
    local pod = req.object
    local vmi, uid = launcher_vmi(pod)
    if vmi == nil then return nil end
    local ns = req.namespace or object.get(pod, "metadata", "namespace")
    local names, problems = claims.of(pod)
    local node
    if names == nil then
      -- no claims annotation: a template VMI's pod, or none of ours
      if not claims.templated(pod) then return nil end
      local set = claims.template_names_of_pod(pod, vmi, cluster)
      -- no GPU requested: no template claims to wait for
      if set ~= nil and #set == 0 then return nil end
      if pin.gated(pod) then return nil end
      node = template_node(cluster, ns, set, vmi, uid)
      problems = {}
    else
      -- already gated (by an earlier call of this webhook on reinvocation,
      -- or by its creator): from here the pod is the leader's
      if pin.gated(pod) then return nil end
      if #problems == 0 then node = pin.node_of(cluster, ns, names, vmi, true) end
    end
    if #problems == 0 then
      -- a pod that names a node skips the scheduler: pinned only when that
      -- is the claims' node; otherwise it is gated, which the API server
      -- refuses for a pod with spec.nodeName (ValidatePodCreate)
      local named = object.get(pod, "spec", "nodeName")
      if node and (named == nil or named == "" or named == node) then
        local p = pin.narrow(pod, node)
        if p then
          if #p == 0 then return nil end
          return p
        end
        -- an affinity the pin cannot narrow safely: gated (the API server
        -- refuses such a pod anyway; decision 0025)
      end
    end
    local p, problem = pin.gate(pod)
    if not p then
      -- fail closed: without a gate the pod would be scheduled unheld
      error(("%s: %s; cannot add the scheduling gate %s"):format(problem.field, problem.message, pin.GATE), 0)
    end
    if #p == 0 then return nil end
    return p
  end,
}
