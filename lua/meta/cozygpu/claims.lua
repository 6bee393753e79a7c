---@meta
-- cozygpu.claims — how a VirtualMachineInstance names the GPUClaims it
-- uses (lua/cozygpu/claims.lua).
--
-- Source: DESIGN.md §3 "GPUClaim" (the annotation gpu.cozystack.io/claims:
-- comma-separated claim names in the VMI's namespace), §6 (a VMI is final
-- in Succeeded or Failed; a deletion timestamp alone does not end an
-- attachment); issue 12 contract item 1; docs/decisions/0019 (syntax:
-- items split at ',', trimmed of ASCII whitespace as Multus trims its
-- network list, each a DNS-1123 subdomain, none empty, none twice).

---@class cozygpu.claims
---The annotation: "gpu.cozystack.io/claims".
---@field ANNOTATION string
---Its field path in refusals: "metadata.annotations[gpu.cozystack.io/claims]".
---@field FIELD string
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

---The VMIs of namespace `ns` naming each claim, `{[claim] = {vmi, ...}}`
---(read-only; every VMI, final or not; computed once per view and
---namespace). Raises when `cluster` is not the cluster view.
---@param cluster cozygpu.Cluster
---@param ns string
---@return table<string, cozygpu.Object[]>
function claims.named_by(cluster, ns) end

return claims
