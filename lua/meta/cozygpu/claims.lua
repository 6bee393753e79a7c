---@meta
-- cozygpu.claims — how a VirtualMachineInstance names the GPUClaims it
-- uses (lua/cozygpu/claims.lua).
--
-- Source: DESIGN.md §3 "GPUClaim" (the annotation gpu.cozystack.io/claims:
-- comma-separated claim names in the VMI's namespace), §6 (a VMI is final
-- in Succeeded or Failed; a deletion timestamp alone does not end an
-- attachment); docs/decisions/0019 (syntax:
-- items split at ',', trimmed of ASCII whitespace as Multus trims its
-- network list, each a DNS-1123 subdomain, none empty, none twice);
-- template claims: docs/decisions/0027 (one claim per
-- class of a class-referencing VMI without the annotation, named
-- `<vmi>-<class>`, labelled gpu.cozystack.io/template-claim=true, owned by
-- the VMI).

---@class cozygpu.claims
---The annotation: "gpu.cozystack.io/claims".
---@field ANNOTATION string
---Its field path in refusals: "metadata.annotations[gpu.cozystack.io/claims]".
---@field FIELD string
---The class-reference label: "gpu.cozystack.io/class-reference".
---@field CLASS_REFERENCE string
---The label of a template claim: "gpu.cozystack.io/template-claim" (value "true").
---@field TEMPLATE_LABEL string
---The annotation of a template claim naming its VMI: "gpu.cozystack.io/vmi".
---@field VMI_ANNOTATION string
---The longest GPUClaim name: 253.
---@field MAX_NAME integer
local claims = {}

---Parses an annotation value. Returns the well-formed claim names, in
---order, each once, and the problems (messages naming the item, or its
---position when empty; an empty list when the value is well-formed). Never
---raises.
---@param value any
---@return string[] names
---@return string[] problems
function claims.parse(value) end

---The claims a VMI names: nil without the annotation, else `parse` of it.
---@param vmi cozygpu.Object
---@return string[]? names
---@return string[]? problems
function claims.of(vmi) end

---True when the VMI's status.phase is Succeeded or Failed.
---@param vmi cozygpu.Object
---@return boolean
function claims.final(vmi) end

---True when a VMI, or its virt-launcher pod (KubeVirt copies the VMI's
---labels and annotations), gets template claims: the class-reference label
---is "true" and the claims annotation absent (decision 0027). Never raises.
---@param obj cozygpu.Object
---@return boolean
function claims.templated(obj) end

---The template claim name `<vmi_name>-<class_name>`, or nil and a message
---when it is not a GPUClaim name (over 253 characters, not a DNS-1123
---subdomain) or a part is missing. Never raises.
---@param vmi_name any
---@param class_name any
---@return string? name
---@return string? problem
function claims.template_name(vmi_name, class_name) end

---`{name, class, count}` per item of `classes` ({class, count}), or nil and
---problems `{field = "metadata.name", message, reason = "name"|"unnamed"}`.
---Never raises.
---@param vmi_name any
---@param classes {class: string, count: integer}[]
---@return {name: string, class: string, count: integer}[]? set
---@return {field: string, message: string, reason: string}[]? problems
function claims.template_set(vmi_name, classes) end

---The template claims a VMI gets, one `{name, class, count}` per class of
---its GPU entries in their order; `{}` when it gets none (not `templated`,
---or no GPU entry); nil and problems `{field, message, reason}` (reason
---"entry": an entry without one class, DRA, no deviceName, a fractional
---quantity; "name": a name over 253 characters; "unnamed": no
---metadata.name). Raises when `cluster` is not the view.
---@param vmi cozygpu.Object
---@param cluster cozygpu.Cluster
---@return {name: string, class: string, count: integer}[]? set
---@return {field: string, message: string, reason: string}[]? problems
function claims.template_names(vmi, cluster) end

---The same set read from a virt-launcher pod: its owner VMI's name
---`vmi_name` and the classes of the GPU resource names its container
---"compute" requests; `{}` when the pod is not `templated` or requests no
---GPU; nil and problems when a name maps to no single class, a quantity is
---not whole, another container requests a GPU, or a name is too long.
---Raises when `cluster` is not the view.
---@param pod cozygpu.Object
---@param vmi_name string
---@param cluster cozygpu.Cluster
---@return {name: string, class: string, count: integer}[]? set
---@return {field: string, message: string, reason: string}[]? problems
function claims.template_names_of_pod(pod, vmi_name, cluster) end

---Why `claim` is not VMI `vmi_name`'s (uid `vmi_uid`) template claim
---`want` ({name, class, count}): no template label, no controller owner
---reference to that VMI with that uid, another class or count; nil when
---it is. Never raises.
---@param claim cozygpu.Object
---@param want {name: string, class: string, count: integer}
---@param vmi_name string
---@param vmi_uid string?
---@return string? why
function claims.template_mismatch(claim, want, vmi_name, vmi_uid) end

---The VMIs of namespace `ns` naming each claim, `{[claim] = {vmi, ...}}`
---(read-only; every VMI, final or not; computed once per view and
---namespace). Raises when `cluster` is not the cluster view.
---@param cluster cozygpu.Cluster
---@param ns string
---@return table<string, cozygpu.Object[]>
function claims.named_by(cluster, ns) end

return claims
