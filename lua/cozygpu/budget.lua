--- cozygpu.budget — GPU budgets of the tenant tree (DESIGN.md §5).
---
--- Budgets are ResourceQuota `spec.hard` keys on tenant namespaces:
---   * class key  `<class>.gpuclass.cozystack.io/devices`
---   * total key  `gpuclass.cozystack.io/devices` (every class)
---   * raw key    `requests.<gpu resource name>` (device-plugin name)
--- Rules (DESIGN.md §5), each checked on every tenant from the root down to
--- the ordering namespace:
---   R1 a key on a tenant caps the tenant and all its descendants together;
---   R2 a child's key only adds a limit: every level is checked, so it
---      never lifts an ancestor's limit nor grants what an ancestor lacks;
---   R3 no GPU key on the tenant or any ancestor: capacity only (allowed);
---   R4 a raw key for the class's resource name on a tenant blocks orders
---      of that class until the same tenant also has the class or the
---      total key;
---   R5 while a raw key exists it caps the claims of the classes with that
---      resource name together with the raw-name VMIs it covers;
---   R6 usage: every GPUClaim that exists counts (ordered claims in every
---      phase, Lost included, and template claims); raw-name VMIs (without
---      the class-reference label) count while Running: their GPU entries
---      that no claim they name covers.
--- Several ResourceQuotas on one namespace each cap it (Kubernetes checks
--- each quota), so the smallest value of a key wins.
local object = require "cozygpu.object"
local quantity = require "cozygpu.quantity"
local tenant = require "cozygpu.tenant"

local M = {}

-- counts are int64 and a quota may be 2^63-1 ("8Ei", "1e100": no limit):
-- sums and differences saturate instead of wrapping around
local add = quantity.add
local function sub(a, b)
  if b == math.mininteger then return a >= 0 and math.maxinteger or a - b end
  return add(a, -b)
end

M.CLASS_SUFFIX = ".gpuclass.cozystack.io/devices"
M.TOTAL_KEY = "gpuclass.cozystack.io/devices"
M.CLASS_REFERENCE = "gpu.cozystack.io/class-reference"

--- The class key of class `name`.
function M.class_key(name) return name .. M.CLASS_SUFFIX end

--- The raw key of resource name `rn`.
function M.raw_key(rn) return "requests." .. rn end

-- smallest value of `key` over the ResourceQuotas of namespace `ns`:
-- integer, or nil when absent; raises a refusal table for a bad value
local function limit(cluster, ns, key)
  local best, from
  for _, q in ipairs(cluster:resourcequotas(ns)) do
    local hard = object.get(q, "spec", "hard")
    local v = type(hard) == "table" and hard[key] or nil
    if v ~= nil then
      local n, err = quantity.to_integer(v)
      local qname = object.get(q, "metadata", "name")
      if not n or n < 0 then
        error({ budget_error = ("ResourceQuota %s/%s: spec.hard[%s]: %s"):format(ns, tostring(qname), key,
          err or "must not be negative") }, 0)
      end
      if best == nil or n < best then best, from = n, qname end
    end
  end
  return best, from
end

-- namespaces in the subtree of tenant `t` (those labelled tenant.cozystack.io/t)
local function in_subtree(cluster, ns_name, t)
  local ns = cluster:namespace(ns_name)
  return ns ~= nil and object.label(ns, tenant.TENANT_PREFIX .. t) ~= nil
end

-- Usage sums derived from a cluster view, per tenant and key, computed once
-- per view: the view is immutable and lives as long as its snapshot (weak
-- keys let it go), so a review walks the GPUClaims and VMIs of the cluster
-- at most once per (tenant, key) and snapshot instead of on every check.
local memo = setmetatable({}, { __mode = "k" })

local function memoized(cluster, part, t, key, compute)
  local m = memo[cluster]
  if not m then m = {}; memo[cluster] = m end
  local k = part .. "\0" .. t .. "\0" .. key
  local r = m[k]
  if not r then
    local total, users = compute()
    r = { total = total, users = users }
    m[k] = r
  end
  return r.total, r.users
end

-- GPUs held by the GPUClaims of the subtree of `t` whose class satisfies
-- `want` (R6: every claim that exists counts, in every phase): total, and
-- the users {what, name, count} in snapshot order
local function claims_usage(cluster, t, want)
  local total, users = 0, {}
  for _, c in ipairs(cluster:gpuclaims()) do
    local ns = object.get(c, "metadata", "namespace")
    local cls = object.get(c, "spec", "class")
    if type(cls) == "string" and want(cls) and in_subtree(cluster, ns, t) then
      local n = object.get(c, "spec", "count")
      n = math.type(n) == "integer" and n or 1
      total = add(total, n)
      users[#users + 1] = { what = "GPUClaim", name = ns .. "/" .. tostring(object.get(c, "metadata", "name")), count = n }
    end
  end
  return total, users
end

-- GPUs of the running raw-name VMIs (without the class-reference label) of
-- the subtree of `t` (R6): with `rn`, their entries of that resource name
-- (a raw key); without, their entries whose class satisfies `want` (class
-- and total keys: a VM does not leave a class's budget by naming the
-- class's resource directly, decision 0003). Total and users, one per VMI.
local function vmi_usage(cluster, t, want, rn)
  local total, users = 0, {}
  local gpu = require "cozygpu.gpu"
  local claims_of = require("cozygpu.claims").of
  for _, v in ipairs(cluster:list("VirtualMachineInstance")) do
    local ns = object.get(v, "metadata", "namespace")
    if object.get(v, "status", "phase") == "Running" and object.label(v, M.CLASS_REFERENCE) ~= "true"
      and in_subtree(cluster, ns, t) then
      -- a VMI naming claims (gpu.cozystack.io/claims) runs its class GPUs
      -- on them, and the claims count already: only its entries no class
      -- carries are its own (decision 0036: they were counted twice)
      local named = claims_of(v)
      local by_claims = type(named) == "table" and #named > 0
      local n = 0
      for _, e in ipairs(gpu.entries(object.get(v, "spec") or {}, cluster)) do
        if by_claims and e.class then
          -- the claims' units
        elseif rn then
          if e.name == rn then n = add(n, e.count or 0) end
        elseif e.class and want(object.get(e.class, "metadata", "name")) then
          n = add(n, e.count or 0)
        end
      end
      if n > 0 then
        total = add(total, n)
        users[#users + 1] = { what = "VirtualMachineInstance", name = ns .. "/" .. tostring(object.get(v, "metadata", "name")), count = n }
      end
    end
  end
  return total, users
end

-- usage in the subtree of `t` under the key `key` (what `want` and `rn`
-- select: "class:<name>", "all" or "rn:<resource name>"): the claims whose
-- class satisfies `want(class name)`, plus the running raw-name VMIs'
-- entries (vmi_usage). `claims`, when given, replaces the claims of the
-- view: claims(t, want) -> total, users (the binder's own count, decision
-- 0024). Returns total, list of users {what, name, count} (claims first,
-- then VMIs; the list is shared: read it only).
local function usage(cluster, t, key, want, rn, claims)
  local ctotal, cusers
  if claims then
    ctotal, cusers = claims(t, want)
  else
    ctotal, cusers = memoized(cluster, "claims", t, key, function() return claims_usage(cluster, t, want) end)
  end
  local vtotal, vusers = memoized(cluster, "vmis", t, key, function() return vmi_usage(cluster, t, want, rn) end)
  if #vusers == 0 then return add(ctotal, vtotal), cusers end
  local users = {}
  for i, u in ipairs(cusers) do users[i] = u end
  for _, u in ipairs(vusers) do users[#users + 1] = u end
  return add(ctotal, vtotal), users
end

-- resource name -> {class name = true}, once per view
local memo_rn = setmetatable({}, { __mode = "k" })
local function classes_by_resource(cluster)
  local m = memo_rn[cluster]
  if m then return m end
  m = {}
  for _, c in ipairs(cluster:gpuclasses()) do
    local rn = object.get(c, "spec", "resourceName")
    if type(rn) == "string" then
      m[rn] = m[rn] or {}
      m[rn][object.get(c, "metadata", "name")] = true
    end
  end
  memo_rn[cluster] = m
  return m
end

local function describe_users(users, elsewhere)
  local parts = {}
  for i, u in ipairs(users) do
    if i > 5 then parts[#parts + 1] = ("and %d more"):format(#users - 5) break end
    parts[#parts + 1] = ("%s %s (%d)"):format(u.what, u.name, u.count)
  end
  local text = table.concat(parts, ", ")
  if elsewhere > 0 then text = ("%s, and %d elsewhere in the tenant tree"):format(text, elsewhere) end
  return text
end

-- "none in use", "2 in use" (users not known), or "2 in use by GPUClaim
-- tenant-a/held (2)": never "0 in use by nothing". The message goes to a
-- user of namespace `viewer`, who may read its own namespace and those
-- below it (Cozystack binds a tenant's roles in every descendant): users
-- elsewhere (an ancestor's or a sibling's objects, under a budget they
-- share) are counted, not named (decision 0036, item 4 and invariant 4).
local function in_use(cluster, viewer, used, users)
  if used == 0 then return "none in use" end
  if #users == 0 then return ("%d in use"):format(used) end
  local shown, elsewhere = {}, 0
  for _, u in ipairs(users) do
    local uns = u.name:match("^([^/]+)/")
    if uns == viewer or (uns and in_subtree(cluster, uns, viewer)) then
      shown[#shown + 1] = u
    else
      elsewhere = add(elsewhere, u.count)
    end
  end
  if #shown == 0 then return ("%d in use elsewhere in the tenant tree"):format(used) end
  return ("%d in use by %s"):format(used, describe_users(shown, elsewhere))
end

--- Checks an order — a set of `{class = GPUClass object, count = n}` (or
--- `{rn = resource name, count = n}` for a raw name no class carries),
--- e.g. what one VM asks for — in namespace `ns_name` against every budget
--- above it. `opts.raw` marks a raw-name order (a VMI without the
--- class-reference label): R4 does not block it, since it is no order of a
--- class, and raw keys cap it (R5). `opts.claims`, a function(tenant,
--- want) returning the GPUs held by claims of the tenant's subtree whose
--- class name satisfies want(name) (and a list of users, may be empty),
--- replaces the walk of every GPUClaim in the view: the binder counts its
--- own Bound, Attached and Lost claims so (decision 0024). Class keys are checked per class, the total key with the
--- whole set, a raw key with every class of the set behind that resource
--- name.
--- Returns true when it fits (or the namespace is outside the tenant tree,
--- or no key applies: R3); else false and a list of shortfalls, each
--- {tenant, key, rule ("R1".."R5"), limit, used, short, message}, in order
--- from the root down. A ResourceQuota value that is not a whole,
--- non-negative quantity is a shortfall too (rule "quantity"), so a bad
--- budget refuses (fail closed) and says where.
--- @param cluster table the cluster view
--- @param ns_name string
--- @param set table[] {class = table, count = integer}
--- @return boolean, table[]?
function M.check_set(cluster, ns_name, set, opts)
  opts = opts or {}
  local ns = cluster:namespace(ns_name)
  if not ns or #set == 0 then return true end
  local chain = tenant.ancestors(ns, object.get(cluster.settings, "tenantRoot"))
  if #chain == 0 then return true end
  -- the order per class and per resource name
  local by_class, class_order, by_rn, rn_order, total = {}, {}, {}, {}, 0
  for _, o in ipairs(set) do
    local rn = o.rn
    if o.class then
      local cname = object.get(o.class, "metadata", "name")
      if not by_class[cname] then by_class[cname] = 0; class_order[#class_order + 1] = cname end
      by_class[cname] = add(by_class[cname], o.count)
      rn = object.get(o.class, "spec", "resourceName")
      total = add(total, o.count)
    end
    if type(rn) == "string" then
      if not by_rn[rn] then by_rn[rn] = { count = 0, classes = {} }; rn_order[#rn_order + 1] = rn end
      by_rn[rn].count = add(by_rn[rn].count, o.count)
      if o.class then by_rn[rn].classes[#by_rn[rn].classes + 1] = object.get(o.class, "metadata", "name") end
    end
  end
  local classes_of_rn = classes_by_resource(cluster)
  local out = {}
  for _, t in ipairs(chain) do
    local ok, err = pcall(function()
      local function over(key, lim, used, users, rule, count)
        local room = sub(lim, used)
        if count > room then
          local short = sub(count, room)
          out[#out + 1] = {
            tenant = t, key = key, rule = rule, limit = lim, used = used, short = short,
            message = ("tenant %q: %s is %d, %s; %d more is short by %d"):format(
              t, key, lim, in_use(cluster, ns_name, used, users), count, short),
          }
        end
      end
      local tlimit = limit(cluster, t, M.TOTAL_KEY)
      local climits = {}
      for _, cname in ipairs(class_order) do
        local ck = M.class_key(cname)
        climits[cname] = limit(cluster, t, ck)
        if climits[cname] then
          local used, users = usage(cluster, t, "class:" .. cname, function(c) return c == cname end, nil, opts.claims)
          over(ck, climits[cname], used, users, "R1", by_class[cname])
        end
      end
      if tlimit and total > 0 then
        local used, users = usage(cluster, t, "all", function() return true end, nil, opts.claims)
        over(M.TOTAL_KEY, tlimit, used, users, "R1", total)
      end
      for _, rn in ipairs(rn_order) do
        local rlimit = limit(cluster, t, M.raw_key(rn))
        if rlimit then
          local blocked = {}
          for _, cname in ipairs(by_rn[rn].classes) do
            if not opts.raw and not climits[cname] and not tlimit and not blocked[cname] then
              blocked[cname] = true
              out[#out + 1] = {
                tenant = t, key = M.raw_key(rn), rule = "R4", limit = rlimit, used = 0, short = by_class[cname],
                message = ("tenant %q: has the raw budget %s but neither %s nor %s: orders of class %q wait until the class or total key is granted there"):format(
                  t, M.raw_key(rn), M.class_key(cname), M.TOTAL_KEY, cname),
              }
            end
          end
          if next(blocked) == nil then
            local same = classes_of_rn[rn] or {}
            local used, users = usage(cluster, t, "rn:" .. rn, function(c) return same[c] == true end, rn, opts.claims)
            over(M.raw_key(rn), rlimit, used, users, "R5", by_rn[rn].count)
          end
        end
      end
    end)
    if not ok then
      if type(err) == "table" and err.budget_error then
        out[#out + 1] = { tenant = t, rule = "quantity", short = total, message = err.budget_error }
      else
        error(err, 0)
      end
    end
  end
  if #out == 0 then return true end
  return false, out
end

--- Checks an order of `count` GPUs of GPUClass `class` (an object):
--- check_set with one element.
--- @return boolean, table[]?
function M.check(cluster, ns_name, class, count)
  return M.check_set(cluster, ns_name, { { class = class, count = count } })
end

return M
