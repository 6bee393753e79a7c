--- The billing and budget invariants (docs/decisions/0036), checked
--- over the objects an API server holds, as a billing system and a tenant
--- would read them. One checker for every place that needs it: the cluster
--- specs (over kube-apiserver), the binder fault run (over the double).
---
---   local I = require "invariants"
---   local bad = I.check(I.gather(c))   -- c: anything with :state(resource)
---   assert(#bad == 0, I.report(bad))
---
--- The invariants, "after the leader has caught up":
---  1. billing: per namespace and GPU resource name, the units billed (the
---     `gpu-device` usage records' counts, plus what Cozystack bills for the
---     launcher pods of running VMIs) equal the units held (Bound and
---     Attached claims) plus the units running VMIs use that no Attached or
---     Lost claim of theirs covers;
---  2. budgets: per tenant budget key (class, total or raw key of a
---     ResourceQuota, DESIGN.md §5), the units held or waiting for their
---     node (Bound, Attached, Lost claims) plus the uncovered units of
---     running VMIs, over the tenant's subtree, are within the limit;
---  3. one unit, one user: no claim is named by two live VMIs that run or
---     are scheduled, and no node has Bound claims beyond the units its
---     allocatable for the resource name leaves after its Attached claims
---     (DESIGN.md §3 GPUNode: capacity is capped at allocatable; §6:
---     Attached claims stay with their VM when capacity drops);
---  4. nothing of another tenant shows: no claim condition or Event in a
---     tenant namespace names `<namespace>/<name>` of a namespace its users
---     cannot read (anything but itself and the namespaces below it).
local json = require "cozygpu.json"

local I = {}

local CLAIMS_ANN = "gpu.cozystack.io/claims"
local RESOURCES_ANN = "workload.cozystack.io/resources"
local KEY_SUFFIX = ".gpuclass.cozystack.io/devices"
local TOTAL_KEY = "gpuclass.cozystack.io/devices"

-- a whole-number quantity ("2", "0", "2k" is not a GPU count) or nil
local function units(q)
  if type(q) == "number" then return math.floor(q) end
  if type(q) ~= "string" then return nil end
  return tonumber(q:match("^%s*(%d+)%s*$"))
end

local function items(list) return (list and list.items) or list or {} end

--- Reads what the invariants need from `c` (kube_cluster's Cluster or the
--- double: anything with :state(resource) returning a List). Returns a
--- table of lists: claims, records (Workloads), monitors, pods, vmis,
--- classes, quotas, namespaces, nodes, events.
function I.gather(c)
  local function get(res)
    local ok, v = pcall(function() return c:state(res) end)
    return ok and items(v) or {}
  end
  return {
    claims = get "gpuclaims", records = get "workloads", pods = get "pods",
    vmis = get "virtualmachineinstances", classes = get "gpuclasses", quotas = get "resourcequotas",
    namespaces = get "namespaces", nodes = get "nodes", events = get "events",
  }
end

local function key(ns, name) return ns .. "/" .. name end

local function claim_phase(cl) return cl.status and cl.status.phase end

-- the VMI's GPU units by resource name (each gpus[]/hostDevices[] entry is
-- one device: KubeVirt requests one of its deviceName per entry)
local function vmi_units(vmi)
  local out = {}
  local devs = vmi.spec and vmi.spec.domain and vmi.spec.domain.devices or {}
  for _, list in ipairs { devs.gpus or {}, devs.hostDevices or {} } do
    for _, d in ipairs(list) do
      if type(d.deviceName) == "string" then out[d.deviceName] = (out[d.deviceName] or 0) + 1 end
    end
  end
  return out
end

local function owner_of(obj, kind)
  for _, o in ipairs(obj.metadata.ownerReferences or {}) do
    if o.kind == kind then return o end
  end
end

local function final(vmi)
  local ph = vmi.status and vmi.status.phase
  return ph == "Succeeded" or ph == "Failed"
end

--- The claims a VMI uses: those its annotation names and the template claims
--- it owns (decision 0027), as a list of claim objects that exist.
local function vmi_claims(vmi, claims_by_key)
  local out, seen = {}, {}
  local ns = vmi.metadata.namespace
  local ann = (vmi.metadata.annotations or {})[CLAIMS_ANN]
  if type(ann) == "string" then
    for name in ann:gmatch("[^,%s]+") do
      local cl = claims_by_key[key(ns, name)]
      if cl and not seen[cl] then seen[cl] = true out[#out + 1] = cl end
    end
  end
  for _, cl in pairs(claims_by_key) do
    local o = cl.metadata.namespace == ns and owner_of(cl, "VirtualMachineInstance")
    if o and o.uid == vmi.metadata.uid and not seen[cl] then seen[cl] = true out[#out + 1] = cl end
  end
  return out
end

--- What Cozystack bills for a pod, per resource name (decision 0028: the
--- sum of the containers' requests, then the `workload.cozystack.io/resources`
--- annotation replaces the keys it names; one that does not decode into a
--- map of strings is ignored whole).
function I.pod_billed(pod)
  local out = {}
  for _, ctr in ipairs(pod.spec and pod.spec.containers or {}) do
    local req = ctr.resources and (ctr.resources.requests or ctr.resources.limits) or {}
    for name, q in pairs(req) do
      local n = units(q)
      if n then out[name] = (out[name] or 0) + n end
    end
  end
  local ann = (pod.metadata.annotations or {})[RESOURCES_ANN]
  if type(ann) == "string" then
    local ok, m = pcall(json.decode, ann)
    local whole = ok and type(m) == "table"
    if whole then
      for _, v in pairs(m) do if type(v) ~= "string" then whole = false end end
    end
    if whole then
      for name, v in pairs(m) do out[name] = units(v) or 0 end
    end
  end
  return out
end

--- Checks the four invariants over `s` (I.gather's shape), but those
--- `skip` names ({[n] = true}, optional). Returns a list of violations
--- {invariant = 1..4, message, objects = {"kind ns/name"...}} (empty when
--- all hold).
function I.check(s, skip)
  local bad = {}
  local function violation(n, msg, objs)
    if not (skip and skip[n]) then bad[#bad + 1] = { invariant = n, message = msg, objects = objs or {} } end
  end

  local class_res, res_classes = {}, {}
  for _, cl in ipairs(s.classes) do
    local r = cl.spec and cl.spec.resourceName
    if r then
      class_res[cl.metadata.name] = r
      res_classes[r] = res_classes[r] or {}
      table.insert(res_classes[r], cl.metadata.name)
    end
  end
  local claims_by_key = {}
  for _, cl in ipairs(s.claims) do claims_by_key[key(cl.metadata.namespace, cl.metadata.name)] = cl end
  local vmis_by_uid = {}
  for _, v in ipairs(s.vmis) do vmis_by_uid[v.metadata.uid] = v end

  -- per namespace and resource name
  local held, billed, used = {}, {}, {} -- used: held + Lost + uncovered running (budgets)
  local why = {}
  local function add(t, ns, r, n, what)
    if n == 0 then return end
    t[ns] = t[ns] or {}
    t[ns][r] = (t[ns][r] or 0) + n
    if what then
      why[ns .. " " .. r] = why[ns .. " " .. r] or {}
      table.insert(why[ns .. " " .. r], what)
    end
  end

  for _, cl in ipairs(s.claims) do
    local ph, r = claim_phase(cl), class_res[cl.spec and cl.spec.class]
    local n = units(cl.spec and cl.spec.count) or 0
    if r and (ph == "Bound" or ph == "Attached") then
      add(held, cl.metadata.namespace, r, n, ("GPUClaim %s %s (%d)"):format(key(cl.metadata.namespace, cl.metadata.name), ph, n))
    end
    if r and (ph == "Bound" or ph == "Attached" or ph == "Lost") then add(used, cl.metadata.namespace, r, n) end
  end

  -- running VMIs: units no Attached or Lost claim of theirs covers
  local claim_users = {}
  for _, v in ipairs(s.vmis) do
    local ph = v.status and v.status.phase
    local live = not final(v) and not (v.metadata.deletionTimestamp and ph ~= "Running")
    local mine = vmi_claims(v, claims_by_key)
    if live and (ph == "Running" or ph == "Scheduled") then
      for _, cl in ipairs(mine) do
        local k = key(cl.metadata.namespace, cl.metadata.name)
        claim_users[k] = claim_users[k] or {}
        table.insert(claim_users[k], key(v.metadata.namespace, v.metadata.name))
      end
    end
    if ph == "Running" then
      local covered = {}
      for _, cl in ipairs(mine) do
        local cph, r = claim_phase(cl), class_res[cl.spec and cl.spec.class]
        if r and (cph == "Attached" or cph == "Lost") then covered[r] = (covered[r] or 0) + (units(cl.spec.count) or 0) end
      end
      for r, n in pairs(vmi_units(v)) do
        if res_classes[r] then
          local left = n - (covered[r] or 0)
          if left > 0 then
            local what = ("VirtualMachineInstance %s Running, %d of its %s not covered by a claim"):format(
              key(v.metadata.namespace, v.metadata.name), left, r)
            add(held, v.metadata.namespace, r, left, what)
            add(used, v.metadata.namespace, r, left)
          end
        end
      end
    end
  end

  -- billed: records, and launcher pods of running VMIs
  for _, w in ipairs(s.records) do
    local st = w.status or {}
    if st.kind == "gpu-device" then
      for k, q in pairs(st.resources or {}) do
        local class = type(k) == "string" and k:match("^(.-)" .. KEY_SUFFIX:gsub("%.", "%%.") .. "$")
        local r = class and class_res[class]
        if r then
          add(billed, w.metadata.namespace, r, units(q) or 0,
            ("Workload %s (%s)"):format(key(w.metadata.namespace, w.metadata.name), tostring(q)))
        end
      end
    end
  end
  for _, p in ipairs(s.pods) do
    local o = owner_of(p, "VirtualMachineInstance")
    local v = o and vmis_by_uid[o.uid]
    if v and v.status and v.status.phase == "Running" and not (p.status and (p.status.phase == "Succeeded" or p.status.phase == "Failed")) then
      for r, n in pairs(I.pod_billed(p)) do
        if res_classes[r] then add(billed, p.metadata.namespace, r, n, ("Pod %s (%d)"):format(key(p.metadata.namespace, p.metadata.name), n)) end
      end
    end
  end

  -- 1. billing follows what runs
  local seen = {}
  for _, t in ipairs { held, billed } do
    for ns, per in pairs(t) do
      for r in pairs(per) do
        local k = ns .. " " .. r
        if not seen[k] then
          seen[k] = true
          local h, b = (held[ns] or {})[r] or 0, (billed[ns] or {})[r] or 0
          if h ~= b then
            violation(1, ("namespace %s, %s: %d units held or running, %d billed"):format(ns, r, h, b), why[k])
          end
        end
      end
    end
  end

  -- 2. budgets hold, over each tenant's subtree
  local subtree = {}
  for _, n in ipairs(s.namespaces) do
    for l in pairs(n.metadata.labels or {}) do
      local t = l:match("^tenant%.cozystack%.io/(.+)$")
      if t then subtree[t] = subtree[t] or {} table.insert(subtree[t], n.metadata.name) end
    end
  end
  for _, q in ipairs(s.quotas) do
    local tenant = q.metadata.namespace
    for k, lim in pairs(q.spec and q.spec.hard or {}) do
      local limit = units(lim)
      local rs -- resource names the key caps
      if k == TOTAL_KEY then
        rs = res_classes
      elseif k:sub(-#KEY_SUFFIX) == KEY_SUFFIX then
        local r = class_res[k:sub(1, -#KEY_SUFFIX - 1)]
        rs = r and { [r] = true } or {}
      elseif k:match("^requests%.") and res_classes[k:sub(10)] then
        rs = { [k:sub(10)] = true }
      end
      if rs and limit then
        local sum = 0
        for _, ns in ipairs(subtree[tenant] or { tenant }) do
          for r in pairs(rs) do sum = sum + ((used[ns] or {})[r] or 0) end
        end
        if sum > limit then
          violation(2, ("tenant %s: %s is %d, %d held or running"):format(tenant, k, limit, sum),
            { "ResourceQuota " .. key(tenant, q.metadata.name) })
        end
      end
    end
  end

  -- 3. one unit, one user
  for k, users in pairs(claim_users) do
    if #users > 1 then
      table.sort(users)
      violation(3, ("GPUClaim %s serves %d live VMIs: %s"):format(k, #users, table.concat(users, ", ")), users)
    end
  end
  -- a node's capacity may drop under running VMs (a GPU falls off the
  -- bus): Attached claims stay with their VM (DESIGN.md §6), so only the
  -- Bound holds beyond what the Attached ones leave are promised twice
  local bound_on, attached_on = {}, {}
  for _, cl in ipairs(s.claims) do
    local ph, node, r = claim_phase(cl), cl.status and cl.status.node, class_res[cl.spec and cl.spec.class]
    local t = ph == "Bound" and bound_on or ph == "Attached" and attached_on or nil
    if node and r and t then
      t[node] = t[node] or {}
      t[node][r] = (t[node][r] or 0) + (units(cl.spec.count) or 0)
    end
  end
  for _, n in ipairs(s.nodes) do
    local alloc = n.status and n.status.allocatable or {}
    for r, bound in pairs(bound_on[n.metadata.name] or {}) do
      local cap = units(alloc[r]) or 0
      local attached = (attached_on[n.metadata.name] or {})[r] or 0
      if bound > math.max(0, cap - attached) then
        violation(3, ("node %s: %d units of %s promised (%d Bound, %d Attached), %d allocatable"):format(
          n.metadata.name, bound + attached, r, bound, attached, cap), { "Node " .. n.metadata.name })
      end
    end
  end

  -- 4. nothing of another tenant shows
  -- a tenant's users read their namespace and those below it (Cozystack
  -- binds a tenant's roles in every descendant; a tenant namespace carries
  -- tenant.cozystack.io/<t> for itself and each ancestor t); the
  -- controller's own namespace is not a tenant's
  local namespaces, labels_of = {}, {}
  for _, n in ipairs(s.namespaces) do
    namespaces[n.metadata.name] = true
    labels_of[n.metadata.name] = n.metadata.labels or {}
  end
  local function tenant_ns(ns)
    for l in pairs(labels_of[ns] or {}) do
      if l:match("^tenant%.cozystack%.io/") then return true end
    end
  end
  local function leaks(ns, text)
    if not tenant_ns(ns) then return nil end
    for other in pairs(namespaces) do
      local readable = other == ns or (labels_of[other] or {})["tenant.cozystack.io/" .. ns] ~= nil
      -- "<other>/" starting a word: "tenant-a-b/x" does not name "a-b"
      if not readable and text:find("%f[%w%.%-]" .. other:gsub("%p", "%%%0") .. "/") then return other end
    end
  end
  for _, cl in ipairs(s.claims) do
    for _, cond in ipairs(cl.status and cl.status.conditions or {}) do
      local other = leaks(cl.metadata.namespace, cond.message or "")
      if other then
        violation(4, ("GPUClaim %s condition %s names an object of namespace %s: %s"):format(
          key(cl.metadata.namespace, cl.metadata.name), cond.type, other, cond.message))
      end
    end
  end
  for _, e in ipairs(s.events) do
    local other = leaks(e.metadata.namespace, e.message or "")
    if other then
      violation(4, ("Event %s names an object of namespace %s: %s"):format(
        key(e.metadata.namespace, e.metadata.name), other, e.message))
    end
  end
  table.sort(bad, function(a, b)
    if a.invariant ~= b.invariant then return a.invariant < b.invariant end
    return a.message < b.message
  end)
  return bad
end

--- Waits until the invariants hold over what `c` holds (I.gather's
--- source) once the leader has caught up. o = {timeout (seconds, default
--- 20), skip (as I.check), what (the failure's first words)}. Raises with
--- the violations and the objects involved when they still fail at the
--- deadline.
function I.hold(c, o)
  o = o or {}
  local bad
  local ok = require("proc").wait_until(function()
    bad = I.check(I.gather(c), o.skip)
    return #bad == 0
  end, o.timeout or 20, 0.5)
  if not ok then error((o.what or "invariants broken") .. ":\n" .. I.report(bad or {}), 2) end
end

--- The violations as text for a failing assertion: one per line with the
--- objects involved.
function I.report(bad)
  local out = {}
  for _, v in ipairs(bad) do
    out[#out + 1] = ("invariant %d: %s"):format(v.invariant, v.message)
    for _, o in ipairs(v.objects) do out[#out + 1] = "    " .. o end
  end
  return table.concat(out, "\n")
end

return I
