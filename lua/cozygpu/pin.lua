--- cozygpu.pin — the launcher pod's scheduling gate and its pin to the
--- node of its GPUClaims (DESIGN.md §4 "virt-launcher pod create",
--- docs/decisions/0020 item 5 and 0025).
---
--- A virt-launcher pod whose claims are not all Bound (or Attached) to one
--- node waits behind the scheduling gate `gpu.cozystack.io/claims`
--- (Kubernetes KEP-3521, pod scheduling readiness: the scheduler ignores a
--- pod while spec.schedulingGates is non-empty). The pin is a required
--- node affinity to that node: the requirement
---
---     matchFields: [{key: metadata.name, operator: In, values: [NODE]}]
---
--- added to EVERY term of spec.affinity.nodeAffinity.
--- requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms that has
--- a requirement, or one term holding only it when the pod has no required
--- node affinity. Why this shape (Kubernetes NodeAffinity semantics,
--- k8s.io/api core/v1 NodeSelector and NodeSelectorTerm: the terms are
--- ORed, the requirements within a term ANDed, "a null or empty node
--- selector term matches no objects"; matchFields supports only the field
--- metadata.name):
---   * ANDing the requirement into every term narrows the pod's node set
---     to {NODE} ∩ what it allowed before, never widens it; a new term
---     beside the old ones would OR, i.e. widen;
---   * an empty term matches no node, and giving it the requirement would
---     make it match NODE (a widening), so an empty term is left as it is;
---   * it is the only change the API server accepts on a gated pod
---     (KEP-3838, mutable scheduling directives for gated pods; kube-apiserver
---     pkg/apis/core/validation/validation.go validateNodeAffinityMutation:
---     with no required affinity anything may be set; otherwise the number of
---     terms is fixed, an empty term stays empty, and a term may only gain
---     requirements after the ones it has), so the leader writes the same
---     shape when it pins a gated pod and the webhook writes it at creation.
--- Preferred terms, pod affinity and anti-affinity, nodeSelector and
--- spec.nodeName are never touched.
---
--- Everything here treats the pod as untrusted input: a field of the wrong
--- JSON type is a problem `{field, message}` returned to the caller, never
--- an error and never a guess.
local json = require "cozygpu.json"
local jsonpatch = require "cozygpu.jsonpatch"
local object = require "cozygpu.object"
local validation = require "cozygpu.validation"

local M = {}

--- The scheduling gate of a launcher pod whose claims are not bound yet.
M.GATE = "gpu.cozystack.io/claims"

--- The field path of the required node selector terms, as the API server
--- prints it.
M.TERMS_FIELD = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"

local REQUIRED_PTR = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"

local function is_map(v)
  local k = json.kind(v)
  return k == "object" or (k == "table" and v[1] == nil)
end

-- an unmarked Lua table (a spec's own literal) is a list when it has an
-- item 1 or nothing at all (pairs: a read-only view keeps its items
-- behind __pairs)
local function is_list(v)
  local k = json.kind(v)
  if k == "array" then return true end
  if k ~= "table" then return false end
  if v[1] ~= nil then return true end
  for _ in pairs(v) do return false end
  return true
end

local function absent(v) return v == nil or v == json.null end

--- The pin's requirement for `node`: a new table
--- `{key = "metadata.name", operator = "In", values = {node}}` (a
--- NodeSelectorRequirement for matchFields).
--- @param node string
--- @return table
function M.requirement(node)
  return json.object { key = "metadata.name", operator = "In", values = json.array { node } }
end

-- true when `r` is exactly the pin's requirement for `node`
local function is_pin(r, node)
  local values = object.get(r, "values")
  return object.get(r, "key") == "metadata.name" and object.get(r, "operator") == "In"
    and is_list(values) and #values == 1 and values[1] == node
end

--- True when `node` can be pinned to: a DNS-1123 subdomain, what the API
--- server requires of a Node's metadata.name (a claim's status.node is
--- read as untrusted too).
--- @param node any
--- @return boolean
function M.valid_node(node)
  return validation.dns1123_subdomain(node) == nil
end

--- The JSONPatch that pins `pod` to `node` (the shape in the module
--- header): for each term of the required node affinity that has a
--- requirement and lacks the pin, an `add` of the pin to its matchFields
--- (the list created when absent or empty); when the pod has no required
--- node affinity, one `add` of the missing object (affinity,
--- nodeAffinity or requiredDuringSchedulingIgnoredDuringExecution) with
--- one term holding the pin. The patch is empty when every term already
--- carries the pin (a webhook reinvocation, decision 0025). Returns nil
--- and a problem `{field, message}` when the pod cannot be narrowed
--- safely: a field on the way of the wrong JSON type, a term or a
--- requirement list that is not an object or a list, a required node
--- selector with no terms (the API server refuses that pod: "must have at
--- least one node selector term"), or an invalid `node`. Never raises.
--- @param pod table a Pod
--- @param node string the node's name
--- @return table|nil patch (patch.new())
--- @return {field:string, message:string}|nil problem
function M.narrow(pod, node)
  if type(node) ~= "string" then
    return nil, { field = "node", message = ("must be a string, not %s"):format(json.kind(node)) }
  end
  if not M.valid_node(node) then
    return nil, { field = "node", message = ("%q is not a node name: %s"):format(node, validation.dns1123_subdomain(node)) }
  end
  local p = jsonpatch.new()
  local spec = object.get(pod, "spec")
  if not is_map(spec) then return nil, { field = "spec", message = "must be an object" } end
  local function one_term()
    return json.object { nodeSelectorTerms = json.array { json.object { matchFields = json.array { M.requirement(node) } } } }
  end
  local affinity = spec.affinity
  if absent(affinity) then
    return p:add("/spec/affinity", json.object { nodeAffinity = json.object { requiredDuringSchedulingIgnoredDuringExecution = one_term() } })
  end
  if not is_map(affinity) then return nil, { field = "spec.affinity", message = "must be an object" } end
  local na = affinity.nodeAffinity
  if absent(na) then
    return p:add("/spec/affinity/nodeAffinity", json.object { requiredDuringSchedulingIgnoredDuringExecution = one_term() })
  end
  if not is_map(na) then return nil, { field = "spec.affinity.nodeAffinity", message = "must be an object" } end
  local required = na.requiredDuringSchedulingIgnoredDuringExecution
  if absent(required) then
    return p:add(REQUIRED_PTR, one_term())
  end
  if not is_map(required) then
    return nil, { field = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", message = "must be an object" }
  end
  local terms = required.nodeSelectorTerms
  if absent(terms) or (is_list(terms) and #terms == 0) then
    return nil, { field = M.TERMS_FIELD, message = "must have at least one node selector term (the API server refuses a required node selector without terms)" }
  end
  if not is_list(terms) then return nil, { field = M.TERMS_FIELD, message = "must be a list" } end
  for i, term in ipairs(terms) do
    local tfield = ("%s[%d]"):format(M.TERMS_FIELD, i - 1)
    if not is_map(term) then return nil, { field = tfield, message = "must be an object" } end
    local exprs, fields = term.matchExpressions, term.matchFields
    if not absent(exprs) and not is_list(exprs) then
      return nil, { field = tfield .. ".matchExpressions", message = "must be a list" }
    end
    if not absent(fields) and not is_list(fields) then
      return nil, { field = tfield .. ".matchFields", message = "must be a list" }
    end
    local n_exprs = absent(exprs) and 0 or #exprs
    local n_fields = absent(fields) and 0 or #fields
    if n_exprs + n_fields > 0 then -- an empty term matches nothing: left so
      local pinned = false
      for j = 1, n_fields do
        if is_pin(fields[j], node) then pinned = true break end
      end
      if not pinned then
        local base = ("%s/nodeSelectorTerms/%d/matchFields"):format(REQUIRED_PTR, i - 1)
        if n_fields == 0 then
          p:add(base, json.array { M.requirement(node) })
        else
          p:add(base .. "/-", M.requirement(node))
        end
      end
    end
  end
  return p
end

--- True when `pod` carries the gate `gpu.cozystack.io/claims` in
--- spec.schedulingGates (entries of the wrong type are not it).
--- @param pod table a Pod
--- @return boolean
function M.gated(pod)
  local gates = object.get(pod, "spec", "schedulingGates")
  if not is_list(gates) then return false end
  for _, g in ipairs(gates) do
    if object.get(g, "name") == M.GATE then return true end
  end
  return false
end

--- The JSONPatch that adds the gate to `pod`: the list
--- spec.schedulingGates with the gate when the pod has none, else the gate
--- appended after the others; empty when the pod carries it already (a
--- gate name may appear once: the API server refuses duplicates). Returns
--- nil and a problem `{field, message}` when spec or spec.schedulingGates
--- has the wrong JSON type. Never raises.
--- @param pod table a Pod
--- @return table|nil patch (patch.new())
--- @return {field:string, message:string}|nil problem
function M.gate(pod)
  local p = jsonpatch.new()
  local spec = object.get(pod, "spec")
  if not is_map(spec) then return nil, { field = "spec", message = "must be an object" } end
  local gates = spec.schedulingGates
  if absent(gates) or (is_list(gates) and #gates == 0) then
    return p:add("/spec/schedulingGates", json.array { json.object { name = M.GATE } })
  end
  if not is_list(gates) then return nil, { field = "spec.schedulingGates", message = "must be a list" } end
  if M.gated(pod) then return p end
  return p:add("/spec/schedulingGates/-", json.object { name = M.GATE })
end

--- The node a set of claims is bound to, or nil and why not (DESIGN.md §3
--- phases, §4, decision 0025). `names` are claim names in namespace `ns`
--- (as `cozygpu.claims.parse` returns them); `vmi` the name of the VMI the
--- pod runs. The node is returned only when every claim is in the view,
--- none is being deleted, each is `Bound` or `Attached` (status.phase),
--- none is attached to another VMI (status.attachedTo empty or `vmi`),
--- and all have the same status.node, a valid node name. Anything else —
--- a claim the (possibly lagging) view does not hold, `Pending`, `Lost`,
--- two nodes — is nil with a message naming the claim: the caller gates,
--- and the leader, whose view is the binder's own, pins later. With
--- `attached_only`, each claim must also be `Attached` to `vmi` itself: a
--- claim only `Bound` may be named by two VMIs at once, and which of them
--- gets it is the leader's to decide (decision 0036: the gate is the
--- serialization point; decision 0025). Raises when `cluster` is not the
--- cluster view.
--- @param cluster table the cluster view
--- @param ns string namespace
--- @param names string[] claim names (at least one)
--- @param vmi string|nil the VMI's name
--- @param attached_only boolean|nil require status.attachedTo == vmi
--- @return string|nil node
--- @return string|nil why
function M.node_of(cluster, ns, names, vmi, attached_only)
  if type(ns) ~= "string" or ns == "" then return nil, "the pod has no namespace" end
  if #names == 0 then return nil, "no claims" end
  local node, first
  for _, name in ipairs(names) do
    local c = cluster:get("GPUClaim", ns, name)
    if c == nil then return nil, ("GPUClaim %q is not in the cluster view"):format(name) end
    if object.deleting(c) then return nil, ("GPUClaim %q is being deleted"):format(name) end
    local phase = object.get(c, "status", "phase")
    if phase ~= "Bound" and phase ~= "Attached" then
      return nil, ("GPUClaim %q is %s"):format(name, type(phase) == "string" and phase or "without a phase")
    end
    local att = object.get(c, "status", "attachedTo")
    if att ~= nil and att ~= "" and att ~= vmi then
      return nil, ("GPUClaim %q is attached to another VMI"):format(name)
    end
    if attached_only and (phase ~= "Attached" or att ~= vmi or vmi == nil) then
      return nil, ("GPUClaim %q is not attached to this VMI yet: the leader decides which VMI gets it"):format(name)
    end
    local n = object.get(c, "status", "node")
    if not M.valid_node(n) then return nil, ("GPUClaim %q has no valid status.node"):format(name) end
    if node == nil then
      node, first = n, name
    elseif n ~= node then
      return nil, ("GPUClaims %q and %q are on two nodes"):format(first, name)
    end
  end
  return node
end

return M
