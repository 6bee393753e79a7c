--- cozygpu.claims — how a VirtualMachineInstance names the GPUClaims it
--- uses (DESIGN.md §3 "GPUClaim": "A VMI names the ordered claims it uses in
--- the annotation gpu.cozystack.io/claims (comma-separated claim names in
--- its namespace)"; docs/decisions/0019).
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
--- Template claims (DESIGN.md §3 "GPUClaim",
--- docs/decisions/0027): a VMI with the class-reference label
--- gpu.cozystack.io/class-reference=true, GPU entries that map to classes
--- and no gpu.cozystack.io/claims annotation gets, from the leader, one
--- claim per class of its entries, named `<vmi name>-<class name>` in its
--- namespace, spec {class, count = its GPUs of that class}, label
--- gpu.cozystack.io/template-claim=true, annotation gpu.cozystack.io/vmi
--- = the VMI's name and a controller ownerReference to the VMI.
--- `template_names` and `template_names_of_pod` compute that set; the
--- leader's C side (core/controller/bind.c) must name claims the same way.
--- Which VMIs are live (KubeVirt's VirtualMachineInstance phases, user
--- guide "VirtualMachineInstance lifecycle"; DESIGN.md §6 "a claim leaves
--- Attached when its VMI is final (Succeeded/Failed) or removed, not on a
--- deletion timestamp alone") is `final`; the rule combines it with the
--- deletion timestamp where it needs to.
local json = require "cozygpu.json"
local object = require "cozygpu.object"
local validation = require "cozygpu.validation"
local gpu = require "cozygpu.gpu"
local quantity = require "cozygpu.quantity"

local M = {}

--- The annotation a VMI names its claims in (DESIGN.md §3).
M.ANNOTATION = "gpu.cozystack.io/claims"

--- The field path of the annotation, for refusal messages, as the API
--- server prints a map key (field.NewPath(...).Key(...)).
M.FIELD = "metadata.annotations[" .. M.ANNOTATION .. "]"

--- The label a VMI orders GPUs by class with (decision 0003); KubeVirt
--- copies every VMI label onto its virt-launcher pod
--- (pkg/virt-controller/services/template.go, podLabels).
M.CLASS_REFERENCE = "gpu.cozystack.io/class-reference"

--- The label every template claim carries, value "true" (decision 0027).
M.TEMPLATE_LABEL = "gpu.cozystack.io/template-claim"

--- The annotation of a template claim naming its VMI (decision 0027).
M.VMI_ANNOTATION = "gpu.cozystack.io/vmi"

--- The longest object name the API server accepts for a GPUClaim (a
--- DNS-1123 subdomain, k8s.io/apimachinery IsDNS1123Subdomain).
M.MAX_NAME = 253

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

--- True when `obj` — a VMI, or its virt-launcher pod, which carries the
--- VMI's labels and annotations (KubeVirt template.go podLabels and
--- filterVMIAnnotationsForPod) — takes its GPUs from template claims
--- (DESIGN.md §3, decision 0027): the label gpu.cozystack.io/class-reference
--- is "true" and the annotation gpu.cozystack.io/claims is absent. Whether
--- it has GPU entries is not looked at (no entries: no claims). Never
--- raises.
--- @param obj table a VirtualMachineInstance or a Pod
--- @return boolean
function M.templated(obj)
  if object.label(obj, M.CLASS_REFERENCE) ~= "true" then return false end
  local annotations = object.get(obj, "metadata", "annotations")
  return type(annotations) ~= "table" or annotations[M.ANNOTATION] == nil
end

--- The name of the template claim of VMI `vmi_name` for class
--- `class_name` (decision 0027): `<vmi_name>-<class_name>`, or nil and a
--- message when that is not a GPUClaim name (a DNS-1123 subdomain of at
--- most 253 characters: the API server would refuse the claim). Two valid
--- names joined by "-" are always a subdomain, so for real objects only
--- the length can fail. Never raises.
--- @param vmi_name any
--- @param class_name any
--- @return string|nil name
--- @return string|nil problem
function M.template_name(vmi_name, class_name)
  if type(vmi_name) ~= "string" or vmi_name == "" then return nil, "the VMI has no name" end
  if type(class_name) ~= "string" or class_name == "" then return nil, "the class has no name" end
  local name = vmi_name .. "-" .. class_name
  if #name > M.MAX_NAME then
    return nil, ("the template GPUClaim of class %q would be named <VMI name>-%s, %d characters, more than %d: name the VMI with at most %d characters"):format(
      class_name, class_name, #name, M.MAX_NAME, math.max(0, M.MAX_NAME - 1 - #class_name))
  end
  local err = validation.dns1123_subdomain(name)
  if err then return nil, ("the template GPUClaim name %q is not a GPUClaim name: %s"):format(name, err) end
  return name
end

--- The template claims of VMI `vmi_name` for `classes`, a list of
--- {class = class name, count = GPUs} in the order the entries name them
--- (each class once): a list of {name, class, count}, one per class, in
--- that order; or nil and the problems, a list of {field, message,
--- reason} (field "metadata.name": the VMI's name is what the claim names
--- are made of): reason "name", one per name that cannot be a GPUClaim
--- name; reason "unnamed", once, when `vmi_name` is absent or empty (a
--- VMI created with generateName before the API server named it).
--- Never raises.
--- @param vmi_name any
--- @param classes {class: string, count: integer}[]
--- @return {name: string, class: string, count: integer}[]|nil set
--- @return {field: string, message: string, reason: string}[]|nil problems
function M.template_set(vmi_name, classes)
  local set, problems = {}, {}
  if type(vmi_name) ~= "string" or vmi_name == "" then
    return nil, { { field = "metadata.name", message = "the VMI has no name: its template GPUClaims cannot be named", reason = "unnamed" } }
  end
  for _, c in ipairs(classes) do
    local name, why = M.template_name(vmi_name, c.class)
    if name then
      set[#set + 1] = { name = name, class = c.class, count = c.count }
    else
      problems[#problems + 1] = { field = "metadata.name", message = why, reason = "name" }
    end
  end
  if #problems > 0 then return nil, problems end
  return set
end

-- adds `n` GPUs of class `name` to `order`/`by` (first appearance first)
local function tally(order, by, name, n)
  if not by[name] then
    by[name] = { class = name, count = 0 }
    order[#order + 1] = by[name]
  end
  by[name].count = quantity.add(by[name].count, n)
end

--- The template claims a VMI gets (DESIGN.md §3,
--- docs/decisions/0027): for a VMI that `templated` accepts, one
--- {name, class, count} per GPUClass its GPU entries (cozygpu.gpu
--- entries) map to, in the order the entries first name each class;
--- `name` is `<metadata.name>-<class>`, `count` the VMI's GPUs of that
--- class (a `resources` entry counts by its quantity). An empty list when
--- the VMI gets no template claims (no class-reference label, the claims
--- annotation present, or no GPU entry). Nil and the problems, a list of
--- {field, message, reason}, when its set cannot be formed:
---   * reason "entry": an entry without a class (no class or several have
---     its resource name), a DRA entry, an entry without a deviceName, a
---     quantity that is not a whole number (`gpu/vmi-entries` refuses all
---     of these on a class-referencing VMI already);
---   * reason "name": a `<vmi>-<class>` name longer than 253 characters or
---     not a DNS-1123 subdomain (field "metadata.name"), which the API
---     server would refuse as a GPUClaim name;
---   * reason "unnamed": the VMI has no metadata.name (yet).
--- Raises when `cluster` is not the cluster view.
--- @param vmi table a VirtualMachineInstance
--- @param cluster table the cluster view
--- @return {name: string, class: string, count: integer}[]|nil set
--- @return {field: string, message: string, reason: string}[]|nil problems
function M.template_names(vmi, cluster)
  if not M.templated(vmi) then return {} end
  local entries = gpu.entries(object.get(vmi, "spec"), cluster)
  if #entries == 0 then return {} end
  local order, by, problems = {}, {}, {}
  for _, e in ipairs(entries) do
    if e.dra then
      problems[#problems + 1] = { field = e.path, message = "a DRA GPU entry (claimName) cannot get a template claim", reason = "entry" }
    elseif e.name == nil then
      problems[#problems + 1] = { field = e.path, message = "a GPU entry needs a deviceName", reason = "entry" }
    elseif e.class == nil then
      problems[#problems + 1] = { field = e.field, message = ("no single GPUClass has resource name %q (%s)"):format(e.name, e.class_problem or "none"), reason = "entry" }
    elseif e.count_error then
      problems[#problems + 1] = { field = e.field, message = ("GPUs are whole devices: %s"):format(e.count_error), reason = "entry" }
    else
      tally(order, by, object.get(e.class, "metadata", "name"), e.count)
    end
  end
  local set, named = M.template_set(object.get(vmi, "metadata", "name"), order)
  for _, p in ipairs(named or {}) do problems[#problems + 1] = p end
  if #problems > 0 then return nil, problems end
  return set
end

--- The template claims of a virt-launcher pod's VMI, from the pod alone
--- (decision 0027): KubeVirt renders every device-plugin GPU of the VMI
--- (gpus and hostDevices deviceNames, and domain.resources) into the
--- limits and requests of the container "compute"
--- (pkg/virt-controller/services/renderresources.go, requestResource), and
--- copies the VMI's labels and annotations onto the pod. `vmi_name` is the
--- pod's controller owner's name. Returns what `template_names` returns for
--- the VMI: an empty list when the pod is not `templated` or requests no
--- GPU resource name; else one {name, class, count} per class of the
--- compute container's GPU resource names (count: its quantity, limits
--- before requests). Nil and problems {field, message, reason} when the
--- set cannot be told for sure: a GPU resource name no single class
--- carries, a quantity that is not whole, a GPU requested by another
--- container than "compute" (reason "entry"), or a name problem as in
--- `template_set` (reason "name"). Raises when `cluster` is not the view.
--- @param pod table a Pod
--- @param vmi_name string
--- @param cluster table the cluster view
--- @return {name: string, class: string, count: integer}[]|nil set
--- @return {field: string, message: string, reason: string}[]|nil problems
function M.template_names_of_pod(pod, vmi_name, cluster)
  if not M.templated(pod) then return {} end
  local requests = gpu.pod_requests(pod, cluster)
  if #requests == 0 then return {} end
  local compute
  for i, c in ipairs(object.list(pod, "spec", "containers")) do
    if object.get(c, "name") == "compute" then compute = ("spec.containers[%d]."):format(i - 1) break end
  end
  local order, by, problems = {}, {}, {}
  for _, r in ipairs(requests) do
    if compute == nil or r.field:sub(1, #compute) ~= compute then
      problems[#problems + 1] = { field = r.field, message = "a GPU requested by another container than \"compute\"", reason = "entry" }
    else
      local class, why = gpu.class_for(cluster, r.name)
      if class == nil then
        problems[#problems + 1] = { field = r.field, message = ("no single GPUClass has resource name %q (%s)"):format(r.name, why), reason = "entry" }
      elseif r.count < 1 then
        problems[#problems + 1] = { field = r.field, message = "not a whole number of GPUs", reason = "entry" }
      else
        tally(order, by, object.get(class, "metadata", "name"), r.count)
      end
    end
  end
  local set, named = M.template_set(vmi_name, order)
  for _, p in ipairs(named or {}) do problems[#problems + 1] = p end
  if #problems > 0 then return nil, problems end
  return set
end

--- Why `claim` is not the template claim `want` ({name, class, count}, an
--- item of `template_names`) of the VMI `vmi_name` whose uid is `vmi_uid`
--- (decision 0027), or nil when it is: label gpu.cozystack.io/template-claim
--- "true" (a tenant's ordered claim of the same name is not it), a
--- controller ownerReference to that VirtualMachineInstance with that uid
--- (a claim left by a previous VMI of the same name has another uid), and
--- spec.class and spec.count equal to `want`'s. Never raises.
--- @param claim table a GPUClaim
--- @param want {name: string, class: string, count: integer}
--- @param vmi_name string
--- @param vmi_uid string|nil
--- @return string|nil why
function M.template_mismatch(claim, want, vmi_name, vmi_uid)
  local name = want.name
  if object.label(claim, M.TEMPLATE_LABEL) ~= "true" then
    return ("GPUClaim %q is not a template claim (no label %s=true)"):format(name, M.TEMPLATE_LABEL)
  end
  local owner = object.controller_of(claim)
  if owner == nil or object.get(owner, "kind") ~= "VirtualMachineInstance" or object.get(owner, "name") ~= vmi_name then
    return ("GPUClaim %q is not owned by VirtualMachineInstance %q"):format(name, vmi_name)
  end
  local uid = object.get(owner, "uid")
  if type(vmi_uid) ~= "string" or vmi_uid == "" or uid ~= vmi_uid then
    return ("GPUClaim %q belongs to another VirtualMachineInstance %q (uid %s)"):format(name, vmi_name, tostring(uid))
  end
  if object.get(claim, "spec", "class") ~= want.class or object.get(claim, "spec", "count") ~= want.count then
    return ("GPUClaim %q is not %d of class %q"):format(name, want.count, want.class)
  end
  return nil
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
