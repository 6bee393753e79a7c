-- Validation of the GPU entries of a VirtualMachineInstance at creation
-- (DESIGN.md §4 "VMI create"): class known and not being deleted, resource
-- name permitted by KubeVirt, maxCount, one vGPU class per VM, vGPU
-- entitlement, and the tenant budgets for the classes it asks for (§5).
-- A VMI that names GPUClaims in gpu.cozystack.io/claims (DESIGN.md §3,
-- docs/decisions/0019) takes its GPUs from them:
-- the claims must exist in its namespace, not be being deleted, not be
-- held by another live VMI, and its GPU entries must match them class by
-- class; the claims already count against the budgets (§5 R6), so the
-- VMI's set is not counted again, and a class being deleted still serves
-- them (§6). A class-referencing VMI without the annotation gets template
-- claims named `<VMI name>-<class>` (docs/decisions/0027): a name the API
-- server would refuse for a GPUClaim (over 253 characters) refuses the VMI.
local object = require "cozygpu.object"
local tenant = require "cozygpu.tenant"
local budget = require "cozygpu.budget"
local quantity = require "cozygpu.quantity"
local claims = require "cozygpu.claims"

-- A VMI that orders GPUs by class carries this label (set by the chart);
-- then every GPU entry must map to a GPUClass (docs/decisions/0003).
local CLASS_REFERENCE = "gpu.cozystack.io/class-reference"

local function plural(n, one, many) return n == 1 and one or many end

local function quoted_list(names)
  local q = {}
  for i, n in ipairs(names) do q[i] = ("%q"):format(n) end
  return table.concat(q, ", ")
end

--- The refusals for the claims a VMI names (DESIGN.md §3 "GPUClaim",
--- docs/decisions/0019): each named claim exists in
--- the VMI's namespace, is not being deleted, has a valid spec, and is
--- not held by another live VMI (status.attachedTo names another VMI that
--- is not final, DESIGN.md §6; or another VMI of the namespace that is
--- neither final nor being deleted names it); then, per class, the VMI
--- has one GPU entry per GPU of the claims' counts, and no entry of a
--- class none of its claims is of. Lookups stay in `ns` (a claim of the
--- same name elsewhere is another tenant's and is never read). Returns
--- the 403 refusals and, apart, the 409 ones (a claim in use: retry once
--- the other VMI is final), so the caller puts the latter last.
--- @param cluster table the cluster view
--- @param ns string the VMI's namespace
--- @param self_name string|nil the VMI's name
--- @param names string[] the named claims (parsed, well-formed)
--- @param by_class table class name -> {count, first = entry}
--- @param class_order string[] the entries' classes, in order
--- @return table[] refusals (403), table[] conflicts (409)
local function check_claims(cluster, ns, self_name, names, by_class, class_order)
  local out, conflicts = {}, {}
  local F = claims.FIELD
  local complete = true
  local claimed, claimed_order = {}, {} -- class -> {count, names}
  local holders -- the namespace's VMIs by the claims they name, read once a claim exists
  for _, name in ipairs(names) do
    local c = cluster:get("GPUClaim", ns, name)
    if c == nil then
      complete = false
      out[#out + 1] = deny(("GPUClaim %q does not exist in namespace %q"):format(name, ns), { field = F })
    else
      if object.deleting(c) then
        out[#out + 1] = deny(("GPUClaim %q is being deleted"):format(name), { field = F })
      end
      local cls, count = object.get(c, "spec", "class"), object.get(c, "spec", "count")
      if type(cls) ~= "string" or cls == "" or math.type(count) ~= "integer" or count < 1 then
        complete = false
        out[#out + 1] = deny(("GPUClaim %q has no valid spec.class and spec.count"):format(name), { field = F })
      else
        if not claimed[cls] then
          claimed[cls] = { count = 0, names = {} }
          claimed_order[#claimed_order + 1] = cls
        end
        claimed[cls].count = quantity.add(claimed[cls].count, count)
        claimed[cls].names[#claimed[cls].names + 1] = name
      end
      -- held by another live VMI: attached to it (the binder's record;
      -- a deletion timestamp alone does not end an attachment, §6), or
      -- named by one that is neither final nor being deleted
      local other
      local att = object.get(c, "status", "attachedTo")
      if type(att) == "string" and att ~= "" and att ~= self_name then
        local v = cluster:get("VirtualMachineInstance", ns, att)
        if v ~= nil and not claims.final(v) then
          other = ("GPUClaim %q is attached to VirtualMachineInstance %q, which is not final; it can be used once that VMI has stopped"):format(name, att)
        end
      end
      if not other then
        holders = holders or claims.named_by(cluster, ns)
        for _, v in ipairs(holders[name] or {}) do
          local vname = object.get(v, "metadata", "name")
          if vname ~= self_name and not claims.final(v) and not object.deleting(v) then
            other = ("GPUClaim %q is named by VirtualMachineInstance %q, which is not final; it can be used once that VMI has stopped"):format(name, vname)
            break
          end
        end
      end
      if other then conflicts[#conflicts + 1] = deny(other, { field = F, code = 409 }) end
    end
  end
  -- entries against claims, class by class (only when every claim was
  -- read: a missing one would make every count look wrong)
  if complete then
    for _, cls in ipairs(claimed_order) do
      local want, e = claimed[cls], by_class[cls]
      if e == nil then
        local what = #class_order == 0 and "it has no GPU entry of any class"
          or ("its GPU entries are of class %s"):format(quoted_list(class_order))
        for _, n in ipairs(want.names) do
          out[#out + 1] = deny(("GPUClaim %q is of class %q, but the VMI has no GPU entry of that class (%s)"):format(n, cls, what), { field = F })
        end
      elseif e.count ~= want.count then
        out[#out + 1] = deny(("class %q: %s %s %s %d %s, the VMI has %d GPU %s of that class; it needs one entry per claimed GPU"):format(
          cls, plural(#want.names, "GPUClaim", "GPUClaims"), quoted_list(want.names), plural(#want.names, "holds", "hold"),
          want.count, plural(want.count, "GPU", "GPUs"), e.count, plural(e.count, "entry", "entries")), { field = e.first.field })
      end
    end
    for _, cls in ipairs(class_order) do
      if not claimed[cls] then
        local e = by_class[cls]
        out[#out + 1] = deny(("%d GPU %s of class %q, but none of the named GPUClaims (%s) is of that class"):format(
          e.count, plural(e.count, "entry", "entries"), cls, quoted_list(names)), { field = e.first.field })
      end
    end
  end
  return out, conflicts
end

return rule "gpu/vmi-entries" {
  description = "GPU entries of a new VMI: known class, permitted by KubeVirt, maxCount, one vGPU class, entitlement, budgets; the GPUClaims it names",
  match = { kind = "VirtualMachineInstance", group = "kubevirt.io", operations = { "CREATE" } },
  validate = function(req, cluster)
    local vmi = req.object
    -- wrong types read as "no entries": refuse them first (found in hardening)
    local bad = {}
    for _, p in ipairs(gpu.shape_problems(object.get(vmi, "spec"))) do
      bad[#bad + 1] = deny(p.message, { field = p.field, code = 422 })
    end
    if #bad > 0 then return bad end
    local entries = gpu.entries(object.get(vmi, "spec"), cluster)
    -- the claims it names (nil: no annotation); a malformed annotation is
    -- an invalid object (422) and comes first, so its code is the answer's
    local names, problems = claims.of(vmi)
    if #entries == 0 and names == nil then return nil end
    local out = {}
    for _, p in ipairs(problems or {}) do
      out[#out + 1] = deny(p, { field = claims.FIELD, code = 422 })
    end
    local by_claims = names ~= nil
    -- a VMI that gets template claims (DESIGN.md §3, decision 0027) must
    -- give each a name the API server accepts as a GPUClaim's:
    -- `<VMI name>-<class>`, a DNS-1123 subdomain of at most 253
    -- characters. Otherwise the leader could never create them and its
    -- pod would wait behind the gate for ever: an invalid object (422),
    -- refused before any state-dependent refusal. A VMI without a name is
    -- not judged here: the API server names every object (generateName)
    -- before the validating webhooks see it.
    if not by_claims and claims.templated(vmi) and #entries > 0 then
      local _, tproblems = claims.template_names(vmi, cluster)
      for _, p in ipairs(tproblems or {}) do
        if p.reason == "name" then out[#out + 1] = deny(p.message, { field = p.field, code = 422 }) end
      end
    end
    local by_class = {}
    local class_order = {}
    local by_class_ref = object.label(vmi, CLASS_REFERENCE) == "true"
    local permitted = gpu.permitted(cluster)
    if permitted == nil and #entries > 0 then
      out[#out + 1] = warn("no KubeVirt CR in the cluster state: permittedHostDevices was not checked")
    end
    local kv = cluster:kubevirt()
    local kvref = kv and object.ref(kv) or ""
    for _, e in ipairs(entries) do
      if e.count_error then
        out[#out + 1] = deny(("GPUs are whole devices: %s"):format(e.count_error), { field = e.field })
      end
      if e.dra then
        if by_class_ref then
          out[#out + 1] = deny("a DRA GPU entry (claimName) cannot be ordered through a GPU class", { field = e.path })
        elseif by_claims then
          out[#out + 1] = deny(("a DRA GPU entry (claimName) cannot take its GPU from the GPUClaims named in %s"):format(claims.ANNOTATION), { field = e.path })
        end
      elseif e.name == nil then
        out[#out + 1] = deny("a GPU entry needs a deviceName", { field = e.path })
      else
        if permitted and e.source ~= "resources" and not permitted[e.name] then
          out[#out + 1] = deny(("resource name %q is not permitted by KubeVirt (not in spec.configuration.permittedHostDevices of KubeVirt %s)"):format(e.name, kvref), { field = e.field })
        end
        if e.class then
          local name = object.get(e.class, "metadata", "name")
          -- a class being deleted still serves its existing claims (§6):
          -- only an order that would make new ones is refused (§4)
          if object.deleting(e.class) and not by_claims then
            out[#out + 1] = deny(("GPUClass %q is being deleted"):format(name), { field = e.field })
          end
          if not by_class[name] then
            by_class[name] = { class = e.class, count = 0, first = e }
            class_order[#class_order + 1] = name
          end
          by_class[name].count = quantity.add(by_class[name].count, e.count)
        elseif e.class_problem == "ambiguous" then
          out[#out + 1] = deny(("several GPUClasses have resource name %q"):format(e.name), { field = e.field })
        elseif by_class_ref then
          out[#out + 1] = deny(("unknown GPU class: no GPUClass has resource name %q"):format(e.name), { field = e.field })
        elseif by_claims then
          out[#out + 1] = deny(("no GPUClass has resource name %q; a VMI that names GPUClaims (%s) takes every GPU from them"):format(e.name, claims.ANNOTATION), { field = e.field })
        end
      end
    end
    local vgpu_classes = {}
    for _, name in ipairs(class_order) do
      local c = by_class[name]
      local max = gpu.max_count(c.class)
      if max and c.count > max then
        out[#out + 1] = deny(("%d GPUs of class %q, more than its maxCount %d"):format(c.count, name, max), { field = c.first.field })
      end
      if object.get(c.class, "spec", "mode") == "VGPU" then vgpu_classes[#vgpu_classes + 1] = name end
    end
    if #vgpu_classes > 1 then
      out[#out + 1] = deny(("vGPU devices of more than one class in one VM (%s); a VM takes vGPUs of one class only"):format(table.concat(vgpu_classes, ", ")), { field = "spec.domain.devices" })
    end
    if #vgpu_classes > 0 then
      local ok, why = tenant.vgpu_entitled(cluster, req.namespace)
      if not ok then
        out[#out + 1] = deny(("vGPU class %q: %s"):format(vgpu_classes[1], why), { field = by_class[vgpu_classes[1]].first.field })
      end
    end
    -- the claims it names (only when the annotation is well-formed: a
    -- partial list would make every count look wrong); refusals for a
    -- claim another VMI holds (409) go last, so a refusal a retry cannot
    -- cure decides the code
    local conflicts = {}
    if by_claims and #problems == 0 then
      local ns = req.namespace or object.get(vmi, "metadata", "namespace")
      local more
      more, conflicts = check_claims(cluster, ns, object.get(vmi, "metadata", "name") or req.name, names, by_class, class_order)
      for _, d in ipairs(more) do out[#out + 1] = d end
    end
    -- the set the VM asks for, against every budget above its namespace
    -- (checked only when nothing else refused: a budget message about an
    -- order that is wrong anyway would mislead). A VMI that names claims
    -- is not checked: its GPUs are its claims', which count already (§5
    -- R6), and its entries must match them.
    local denied = #conflicts > 0
    for _, v in ipairs(out) do if v.verdict == "deny" then denied = true end end
    if not denied and not by_claims then
      local set = {}
      for _, name in ipairs(class_order) do set[#set + 1] = { class = by_class[name].class, count = by_class[name].count } end
      -- a VMI without the class reference orders by raw name: its entries
      -- without a class still count under raw keys (R5), and R4 does not
      -- block it (decision 0010)
      if not by_class_ref then
        for _, en in ipairs(entries) do
          if not en.class and en.name and not en.dra then set[#set + 1] = { rn = en.name, count = en.count } end
        end
      end
      if #set > 0 then
        local ok, shorts = budget.check_set(cluster, req.namespace, set, { raw = not by_class_ref })
        if not ok then
          for _, sh in ipairs(shorts) do
            out[#out + 1] = deny(sh.message, { field = entries[1].field or entries[1].path })
          end
        end
      end
    end
    for _, d in ipairs(conflicts) do out[#out + 1] = d end
    return out
  end,
}
