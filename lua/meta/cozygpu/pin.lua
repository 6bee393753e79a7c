---@meta
-- cozygpu.pin — the launcher pod's scheduling gate and its pin to the node
-- of its GPUClaims (lua/cozygpu/pin.lua).
--
-- Source: DESIGN.md §4 "virt-launcher pod create";
-- docs/decisions/0020 item 5 and 0025. Kubernetes: KEP-3521 (scheduling
-- gates), KEP-3838 (mutable scheduling directives of gated pods:
-- kube-apiserver validateNodeAffinityMutation), core/v1 NodeSelector (terms
-- ORed, requirements within a term ANDed, an empty term matches nothing;
-- matchFields takes only metadata.name).
--
-- The pin is `matchFields: [{key: metadata.name, operator: In, values:
-- [NODE]}]` added to every required node selector term that has a
-- requirement (empty terms stay empty), or one term holding only it when the
-- pod has no required node affinity.

---A problem with a field of the pod: its path and what is wrong.
---@class cozygpu.PinProblem
---@field field string e.g. "spec.affinity.nodeAffinity"
---@field message string e.g. "must be an object"

---@class cozygpu.pin
---The gate: "gpu.cozystack.io/claims".
---@field GATE string
---"spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms".
---@field TERMS_FIELD string
local pin = {}

---The pin's requirement for `node`: `{key = "metadata.name", operator =
---"In", values = {node}}` (a new table).
---@param node string
---@return table
function pin.requirement(node) end

---True when `node` is a DNS-1123 subdomain (a Node's name).
---@param node any
---@return boolean
function pin.valid_node(node) end

---The JSONPatch pinning `pod` to `node` (empty when every term carries the
---pin already); nil and a problem when a field on the way has the wrong
---type, the required selector has no terms, or `node` is not a node name.
---Never raises.
---@param pod cozygpu.Object
---@param node string
---@return cozygpu.Patch? patch
---@return cozygpu.PinProblem? problem
function pin.narrow(pod, node) end

---True when the pod's spec.schedulingGates holds the gate.
---@param pod cozygpu.Object
---@return boolean
function pin.gated(pod) end

---The JSONPatch adding the gate (appended after other gates; empty when
---present); nil and a problem when spec.schedulingGates is not a list.
---Never raises.
---@param pod cozygpu.Object
---@return cozygpu.Patch? patch
---@return cozygpu.PinProblem? problem
function pin.gate(pod) end

---The node the claims `names` of namespace `ns` are bound to: every one in
---the view, not being deleted, Bound or Attached, attached to no VMI but
---`vmi`, all on one valid status.node; with `attached_only`, each also
---Attached to `vmi` itself (a Bound claim may be named by two VMIs; the
---leader decides which gets it). Else nil and why (naming the claim).
---Raises when `cluster` is not the cluster view.
---@param cluster cozygpu.Cluster
---@param ns string
---@param names string[]
---@param vmi string?
---@param attached_only boolean?
---@return string? node
---@return string? why
function pin.node_of(cluster, ns, names, vmi, attached_only) end

return pin
