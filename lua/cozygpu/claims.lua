--- cozygpu.claims — how a VirtualMachineInstance names the GPUClaims it
--- uses (DESIGN.md §3 "GPUClaim": "A VMI names the ordered claims it uses in
--- the annotation gpu.cozystack.io/claims (comma-separated claim names in
--- its namespace)"; issue 12, contract item 1; docs/decisions/0019).
---
--- The annotation's syntax (decision 0019):
---   * the value is split at every ',';
---   * each item is trimmed of ASCII whitespace (space, tab, CR, LF, VT,
---     FF), as Multus trims the items of its comma-separated
---     k8s.v1.cni.cncf.io/networks annotation (Go strings.TrimSpace, its ASCII part only: a Unicode blank such as U+00A0 stays and makes the name invalid), so
---     "a, b" names a and b;
---   * every item must then be a GPUClaim name: a DNS-1123 subdomain, what
---     the API server requires of a custom resource's metadata.name
---     (k8s.io/apimachinery ValidateObjectMeta, IsDNS1123Subdomain);
---   * no item may be empty ("", "a,,b", "a,") and no name may appear
---     twice: an empty value is a mistake, not "no claims" (remove the
---     annotation instead).
--- Which VMIs are live (KubeVirt's VirtualMachineInstance phases, user
--- guide "VirtualMachineInstance lifecycle"; DESIGN.md §6 "a claim leaves
--- Attached when its VMI is final (Succeeded/Failed) or removed, not on a
--- deletion timestamp alone") is `final`; the rule combines it with the
--- deletion timestamp where it needs to.
local json = require "cozygpu.json"
local object = require "cozygpu.object"
local validation = require "cozygpu.validation"

local M = {}

--- The annotation a VMI names its claims in (DESIGN.md §3).
M.ANNOTATION = "gpu.cozystack.io/claims"

--- The field path of the annotation, for refusal messages, as the API
--- server prints a map key (field.NewPath(...).Key(...)).
M.FIELD = "metadata.annotations[" .. M.ANNOTATION .. "]"

-- per cluster view: namespace -> claim name -> VMIs naming it (the view is
-- immutable and lives as long as its snapshot; weak keys let it go)
local memo_named = setmetatable({}, { __mode = "k" })

-- Problems `parse` lists at most (the rest are counted).
local MAX_PROBLEMS = 15 -- with the "and N more" line: the 16 refusals an answer lists (runtime.admission)

--- Parses an annotation value (syntax: DESIGN.md §3, decision 0019; the
--- module header lists the rules). Returns the claim names, in order, each
--- once, and the problems found: a list of messages, empty when the value
--- is well-formed. Each message names the offending item (or its position,
--- for an empty one). Names that are well-formed are returned even when
--- another item is not, so a caller that only needs the valid names (the
--- holders index) can use them; a rule refuses on any problem. At most
--- 15 problems are listed; past them a 16th entry says how many more
--- there are (a tenant's 100,000 empty items must not become 100,000
--- refusals). Never raises.
--- @param value any the annotation's value (a string, for a real object)
--- @return string[] names
--- @return string[] problems
function M.parse(value)
  local names, problems, seen = {}, {}, {}
  local n_problems = 0
  local function problem(msg)
    n_problems = n_problems + 1
    if n_problems <= MAX_PROBLEMS then problems[#problems + 1] = msg end
  end
  if type(value) ~= "string" then
    return names, { "must be a string of comma-separated GPUClaim names" }
  end
  local i = 0
  for item in (value .. ","):gmatch("([^,]*),") do
    i = i + 1
    -- trimmed without a lazy pattern, so a long run of blanks costs
    -- linear steps
    local first = item:find("%S")
    local name = first and item:sub(first, item:match("^.*()%S")) or ""
    if name == "" then
      if value:match("^%s*$") then
        problem("is empty: name at least one GPUClaim, or remove the annotation")
      else
        problem(("item %d is empty: GPUClaim names are separated by single commas"):format(i))
      end
    else
      local err = validation.dns1123_subdomain(name)
      if err then
        problem(("%q is not a GPUClaim name: %s"):format(name, err))
      elseif seen[name] then
        problem(("%q is named twice"):format(name))
      else
        seen[name] = true
        names[#names + 1] = name
      end
    end
  end
  if n_problems > MAX_PROBLEMS then
    problems[#problems + 1] = ("and %d more problems"):format(n_problems - MAX_PROBLEMS)
  end
  return names, problems
end

--- The claims a VMI names: nil when it has no annotation
--- gpu.cozystack.io/claims (DESIGN.md §3: then it orders without ordered
--- claims); else `parse` of its value (names, problems).
--- @param vmi table a VirtualMachineInstance
--- @return string[]|nil names
--- @return string[]|nil problems
function M.of(vmi)
  local annotations = object.get(vmi, "metadata", "annotations")
  if type(annotations) ~= "table" then return nil end
  local v = annotations[M.ANNOTATION]
  if v == nil then return nil end
  return M.parse(v)
end

--- True when a VMI is final: status.phase Succeeded or Failed (KubeVirt's
--- VirtualMachineInstancePhase; DESIGN.md §6: a claim leaves Attached only
--- then, or when the VMI is removed — a deletion timestamp alone does not
--- make a VMI final).
--- @param vmi table
--- @return boolean
function M.final(vmi)
  local phase = object.get(vmi, "status", "phase")
  return phase == "Succeeded" or phase == "Failed"
end

--- The VMIs of namespace `ns` that name each claim in their annotation
--- (DESIGN.md §3): a read-only table {[claim name] = {vmi, ...}}, VMIs in
--- the view's order; only the well-formed names of an annotation count.
--- Every VMI of the view is listed, final or not: the caller decides
--- which still hold a claim. Computed once per view and namespace. Raises
--- when `cluster` is not the cluster view.
--- @param cluster table the cluster view
--- @param ns string namespace
--- @return table<string, table[]>
function M.named_by(cluster, ns)
  local per_ns = memo_named[cluster]
  if not per_ns then
    per_ns = {}
    memo_named[cluster] = per_ns
  end
  if per_ns[ns] then return per_ns[ns] end
  local t = {}
  for _, v in ipairs(cluster:list("VirtualMachineInstance")) do
    if object.get(v, "metadata", "namespace") == ns then
      local names = M.of(v)
      for _, n in ipairs(names or {}) do
        t[n] = t[n] or {}
        t[n][#t[n] + 1] = v
      end
    end
  end
  per_ns[ns] = json.readonly(t)
  return per_ns[ns]
end

return M
