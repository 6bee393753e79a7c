--- runtime.admission — runs the policy bundle over one AdmissionRequest.
---
--- Trusted runtime code, out of a policy's reach (a policy's `require`
--- finds only cozygpu.* in lua/ and the bundle's lib/), loaded and called by
--- the C engine (core/engine/engine.c, engine_call) with the `host` table; every policy function runs through host.invoke, which
--- applies the instruction budget and memory cap and never raises. A policy
--- that errors, loops or runs out of memory is a refusal naming it (fail
--- closed, DESIGN.md §9).
local json = require "cozygpu.json"
local jsonpatch = require "cozygpu.jsonpatch"
local policy = require "cozygpu.policy"
local cluster_view = require "cozygpu.cluster"
local budget = require "cozygpu.budget"
local tenant = require "cozygpu.tenant"
local object = require "cozygpu.object"

local M = {}

--- The file name of the binder policy in a bundle (docs/decisions/0024):
--- it returns binder { choose = ... } instead of rules, and is replaced
--- from the policies ConfigMap like every policy file.
M.BINDER_FILE = "binder.lua"

--- Loads every policy file listed in host.policy_files, in order. Returns
--- the bundle {rules = {...}, count = n, binder = {choose, description,
--- file} or nil}. Raises "FILE: message" when a file fails to
--- load, declares a bad or duplicate rule, or binder.lua returns anything
--- but one binder declaration.
function M.load(host)
  local base = host.base
  base.rule, base.deny, base.warn, base.binder = policy.rule, policy.deny, policy.warn, policy.binder
  base.json = require "cozygpu.json"
  base.gpu = require "cozygpu.gpu"
  base.patch = require "cozygpu.jsonpatch"
  local bundle = { host = host, rules = {}, byname = {}, count = 0 }
  for _, f in ipairs(host.policy_files) do
    local chunk, err = host.load(f.path, f.memory)
    if not chunk then error(err, 0) end
    local st, result = host.invoke(f.name, chunk)
    if st ~= "ok" then error(("%s: %s"):format(f.path, result), 0) end
    -- its globals as loaded are put back before every review: no answer
    -- depends on which reviews came before (decision 0014)
    host.freeze(chunk)
    -- what the file returned is the policy's: read raw (no metamethod of
    -- its runs here), rules taken only as rule() made them
    local list
    local b = policy.declared_binder(result)
    if f.name == M.BINDER_FILE then
      if not b then
        error(("%s: the binder policy must return binder { choose = function(set, candidates, cluster) ... end } (got %s)"):format(f.path, type(result)), 0)
      end
      b.file = f.path
      bundle.binder = b
      goto continue
    elseif b then
      error(("%s: binder { ... } belongs in %s (the bundle's one binder policy)"):format(f.path, M.BINDER_FILE), 0)
    end
    if policy.declared(result) then list = { result }
    elseif type(result) == "table" and (getmetatable(result) == nil or getmetatable(result) == getmetatable(json.array())) then
      list = result
    end
    local n = list and rawlen(list) or 0
    if n == 0 then
      error(("%s: a policy file must return a rule or a list of rules (got %s)"):format(f.path, type(result)), 0)
    end
    for i = 1, n do
      local r = policy.declared(rawget(list, i))
      if not r then
        error(("%s: item %d is not a rule (declare it with rule \"name\" {...})"):format(f.path, i), 0)
      end
      if bundle.byname[r.name] then
        error(("rule %q is declared twice: in %s and in %s"):format(r.name, bundle.byname[r.name].file, f.path), 0)
      end
      r.file = f.path
      bundle.byname[r.name] = r
      bundle.rules[#bundle.rules + 1] = r
    end
    ::continue::
  end
  bundle.count = #bundle.rules
  M.set_cluster(bundle, {}, {})
  return bundle
end

--- Replaces the cluster view of the bundle (objects: array of Kubernetes
--- objects; settings: config.h shape).
function M.set_cluster(bundle, objects, settings)
  bundle.cluster = cluster_view.new(objects, settings)
end

local function one_of(want, have)
  if want == nil then return true end
  if type(want) == "string" then return want == have end
  for _, w in ipairs(want) do if w == have then return true end end
  return false
end

-- whether a table match (kind, group, operations) takes request `req`
local function match_table(m, req)
  local kind = req.kind or {}
  return one_of(m.kind, kind.kind) and one_of(m.group, kind.group) and one_of(m.operations, req.operation)
end

-- returns true/false, or nil and a failure {kind, message}; and the
-- seconds a match function took (0 for a table)
local function matches(host, r, req, cluster)
  local m = r.match
  if m == nil then return true, nil, 0 end
  if type(m) == "function" then
    local t0 = host.now()
    local st, a = host.invoke(r.name, m, req, cluster)
    local took = host.now() - t0
    if st ~= "ok" then return nil, { kind = st, message = a }, took end
    return a and true or false, nil, took
  end
  return match_table(m, req), nil, 0
end

-- What a hook returned is the policy's: it is read with raw access only
-- (rawget, rawlen, the raw `next`), so no metamethod of the policy's runs
-- here, outside the budget of host.invoke.

local VERDICT_KEYS = { verdict = true, message = true, field = true, code = true }

-- the metatables a returned table may carry: the JSON markers, and for a
-- mutate hook the patch builder's; any other means fields could come from
-- metamethods the engine does not run, so the value is unreadable
local ARRAY_MT, OBJECT_MT = getmetatable(json.array()), getmetatable(json.object())
local PATCH_MT = getmetatable(jsonpatch.new())
local function readable(t, patch_too)
  local mt = getmetatable(t)
  return mt == nil or mt == ARRAY_MT or mt == OBJECT_MT or (patch_too and mt == PATCH_MT)
end

-- a key for a message: strings as they are, others by their type
local function key_name(k)
  return type(k) == "string" and k or ("[" .. (math.type(k) or type(k)) .. "]")
end

-- "a table with keys code, message", "a string", ...: what a hook returned,
-- for a refusal's message
local function shape(v)
  if type(v) ~= "table" then return "a " .. type(v) end
  if not readable(v, true) then return "a table with a metatable" end
  local keys, n = {}, 0
  for k in next, v do
    n = n + 1
    keys[#keys + 1] = key_name(k)
    if n > 50 then break end
  end
  if n == 0 then return "an empty table" end
  table.sort(keys)
  if #keys > 6 then keys = { keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], "..." } end
  return "a table with keys " .. table.concat(keys, ", ")
end

-- true when t's keys are exactly 1..#t (an empty table is a sequence)
local function is_sequence(t)
  local n, count = rawlen(t), 0
  for k in next, t do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
    count = count + 1
  end
  return count == n
end

-- nil when v is a verdict the engine can read (as deny() and warn() make
-- them: a deny carries a 4xx code), else what is wrong with it
local function verdict_problem(v)
  if type(v) ~= "table" or not readable(v) then return shape(v) end
  local kind = rawget(v, "verdict")
  if kind ~= "deny" and kind ~= "warn" then return shape(v) end
  for k in next, v do
    if not VERDICT_KEYS[k] then return ("a %s verdict with an unknown key %q"):format(kind, key_name(k)) end
  end
  if type(rawget(v, "message")) ~= "string" then return ("a %s verdict without a message"):format(kind) end
  local field = rawget(v, "field")
  if field ~= nil and type(field) ~= "string" then return ("a %s verdict whose field is not a string"):format(kind) end
  if kind == "deny" then
    local code = rawget(v, "code")
    if math.type(code) ~= "integer" or code < 400 or code > 499 then
      return "a deny verdict without a 4xx code"
    end
  elseif rawget(v, "code") ~= nil then
    return "a warn verdict with a code"
  end
  return nil
end

-- The verdicts of a validate hook's result (not nil): a list, or nil and
-- what is wrong
local function verdicts_of(result)
  if type(result) ~= "table" or not readable(result) then return nil, shape(result) end
  if rawget(result, "verdict") ~= nil then
    local bad = verdict_problem(result)
    if bad then return nil, bad end
    return { result }
  end
  if not is_sequence(result) then return nil, shape(result) end
  for i = 1, rawlen(result) do
    local bad = verdict_problem(rawget(result, i))
    if bad then return nil, ("a list whose item %d is %s"):format(i, bad) end
  end
  return result
end

-- What one answer lists at most, and how long one listed message may be:
-- a rule's verdicts are built under its memory cap, but the answer is
-- built here, outside it, and goes back to the API server (and on to the
-- tenant's client) whole. Without a bound, a tenant-controlled input that
-- makes a rule refuse once per item (100,000 empty items in an annotation)
-- turned into a 30 MB answer and hundreds of MB per review (found in
-- a review). The first refusals are the ones a person reads; the count of
-- the others is said.
local MAX_LISTED, MAX_MESSAGE = 16, 2048

-- `s` cut to at most `n` bytes on a UTF-8 character boundary, with "…"
-- when cut.
local function clip(s, n)
  s = tostring(s)
  if #s <= n then return s end
  local cut = n
  -- step back over continuation bytes (10xxxxxx) to a character start
  while cut > 0 and (s:byte(cut + 1) or 0) & 0xC0 == 0x80 do cut = cut - 1 end
  return s:sub(1, cut) .. "…"
end

local function describe(st, message)
  if st == "error" then return "failed: " .. clip(message, MAX_MESSAGE) end
  return clip(message, MAX_MESSAGE)
end

--- Answers one AdmissionRequest. `request` is the request as a Lua table
--- (converted from JSON), `phases` = {validate = bool, mutate = bool}.
--- Returns the AdmissionResponse table (`patch` is the list of operations;
--- the C side encodes it to base64), the outcome ("allowed", "refused",
--- or the first failure's kind: "error", "budget", "memory", "deadline")
--- the name of the rule that decided it (nil when allowed), and what each
--- rule that ran said: a list of {rule = name, result = word, seconds = n}
--- in the order the rules first ran, where word is "allowed" (it ran and
--- refused nothing; warnings included), "denied", "patched", or its
--- failure's kind, and seconds the wall time of its calls (match function
--- and hooks, both phases) from host.now. A failure wins over a denial: the
--- review is refused with 500 (fail closed, DESIGN.md §9); engine.h's
--- engine_outcome mirrors these words, engine_last_rules the list.
function M.review(bundle, request, phases)
  local host, cluster = bundle.host, bundle.cluster
  host.restore() -- a hook that assigned `_ENV` itself does not carry it over
  local req = host.readonly(request)
  local denials, warnings, failures = {}, {}, {}
  local n_denials, n_warnings = 0, 0 -- all of them; the lists keep MAX_LISTED
  local ran, by_rule = {}, {} -- what each rule said (engine_last_rules)
  local RANK = { allowed = 0, patched = 1, denied = 2 } -- a failure outranks them all
  local function said(r, word, seconds)
    local e = by_rule[r.name]
    if not e then
      e = { rule = r.name, result = word, seconds = 0 }
      by_rule[r.name] = e
      ran[#ran + 1] = e
    elseif (RANK[word] or 3) > (RANK[e.result] or 3) then
      e.result = word
    end
    e.seconds = e.seconds + seconds
  end

  -- once the review's deadline has passed, the rules not yet run are
  -- skipped: only the rule that was running is named
  local late = false
  local first_failure -- {kind, rule}
  local function failed(r, kind, message, seconds)
    said(r, kind, seconds or 0)
    failures[#failures + 1] = ("policy %q %s"):format(r.name, describe(kind, message))
    first_failure = first_failure or { kind = kind, rule = r.name }
    if kind == "deadline" then late = true end
  end

  if phases.validate then
    for _, r in ipairs(bundle.rules) do
      if late then break end
      if r.validate then
        local yes, f, took = matches(host, r, req, cluster)
        if f then failed(r, f.kind, f.message, took)
        elseif yes then
          local t0 = host.now()
          local st, result = host.invoke(r.name, r.validate, req, cluster)
          took = took + (host.now() - t0)
          if st ~= "ok" then
            failed(r, st, result, took)
          elseif result ~= nil then
            local list, bad = verdicts_of(result)
            if not list then
              -- fail closed: a verdict the engine cannot read is a refusal
              failed(r, "error", ("validate returned %s; expected nil, a verdict (deny(), warn()) or a list of them"):format(bad), took)
            else
              local denied = false
              for i = 1, rawlen(list) do
                local v = rawget(list, i)
                if rawget(v, "verdict") == "deny" then
                  denied = true
                  n_denials = n_denials + 1
                  if #denials < MAX_LISTED then
                    denials[#denials + 1] = { rule = r.name, message = clip(rawget(v, "message"), MAX_MESSAGE),
                      field = rawget(v, "field") and clip(rawget(v, "field"), MAX_MESSAGE), code = rawget(v, "code") }
                  end
                else
                  n_warnings = n_warnings + 1
                  if #warnings < MAX_LISTED then warnings[#warnings + 1] = clip(rawget(v, "message"), MAX_MESSAGE) end
                end
              end
              said(r, denied and "denied" or "allowed", took)
            end
          else
            said(r, "allowed", took)
          end
        end
      end
    end
  end

  local ops = json.array()
  if phases.mutate and #denials == 0 and #failures == 0 and request.object ~= nil then
    -- no copy: rules see it read-only, and jsonpatch.apply returns a new document
    local current = request.object
    for _, r in ipairs(bundle.rules) do
      -- a table match reads only kind and operation, which no patch
      -- changes: a rule it leaves out costs no view of the patched request
      if r.mutate and #failures == 0 and (type(r.match) ~= "table" or match_table(r.match, req)) then
        local view = {}
        for k, v in pairs(request) do view[k] = v end
        view.object = current
        local rview = host.readonly(view)
        local yes, f, took = matches(host, r, rview, cluster)
        if f then failed(r, f.kind, f.message, took)
        elseif yes then
          local t0 = host.now()
          local st, result = host.invoke(r.name, r.mutate, rview, cluster)
          took = took + (host.now() - t0)
          if st ~= "ok" then
            failed(r, st, result, took)
          elseif result ~= nil then
            if type(result) == "table" and rawget(result, "verdict") ~= nil then
              failed(r, "error", ("mutate returned a verdict (%s); a mutate hook returns nil or a JSONPatch (refuse in validate)"):format(key_name(rawget(result, "verdict"))), took)
            elseif type(result) ~= "table" or not readable(result, true) or not is_sequence(result) then
              failed(r, "error", ("mutate returned %s; expected nil or a JSONPatch (patch.new() or a list of operations)"):format(shape(result)), took)
            else
              local list = json.copy(result)
              local after, err = jsonpatch.apply_shared(current, list)
              if not after then
                failed(r, "error", "its patch does not apply: " .. err, took)
              else
                current = after
                for _, op in ipairs(list) do ops[#ops + 1] = op end
                said(r, #list > 0 and "patched" or "allowed", took)
              end
            end
          else
            said(r, "allowed", took)
          end
        end
      end
    end
  end

  local response = { uid = request.uid, allowed = true }
  if #failures > 0 then
    -- fail closed: a broken policy refuses, naming itself
    response.allowed = false
    response.status = { code = 500, reason = "InternalError", message = table.concat(failures, "; ") }
  elseif #denials > 0 then
    local parts = {}
    for i, d in ipairs(denials) do
      parts[i] = d.field and ("%s: %s"):format(d.field, d.message) or d.message
    end
    if n_denials > #denials then
      parts[#parts + 1] = ("and %d more refusals"):format(n_denials - #denials)
    end
    local code = denials[1].code
    response.allowed = false
    response.status = {
      code = code, reason = policy.REASONS[code] or "Forbidden",
      message = table.concat(parts, "; "),
      details = { causes = json.array() },
    }
    for _, d in ipairs(denials) do
      local cause = { message = ("%s (%s)"):format(d.message, d.rule), reason = "FieldValueInvalid" }
      if d.field then cause.field = d.field end
      table.insert(response.status.details.causes, cause)
    end
  end
  if n_warnings > #warnings then
    warnings[#warnings + 1] = ("and %d more warnings"):format(n_warnings - #warnings)
  end
  if #warnings > 0 then response.warnings = json.array(warnings) end
  if response.allowed and #ops > 0 then response.patch = ops end
  if first_failure then return response, first_failure.kind, first_failure.rule, ran end
  if #denials > 0 then return response, "refused", denials[1].rule, ran end
  return response, "allowed", nil, ran
end

-- ---- the binder (DESIGN.md §5, §6; docs/decisions/0024) --------------------

--- Asks the bundle's binder policy to choose among `candidates` (a list of
--- at most 32, in the index's packing order) for claim set `set` (shapes:
--- lua/meta/cozygpu.lua, BinderSet and BinderCandidate). The policy runs
--- through host.invoke (instruction budget, memory cap, deadline) on
--- read-only views, with the cluster view as third argument.
--- Returns the outcome word and the answer: "allowed", position (1-based)
--- or 0 for "none this pass"; or a failure's kind ("error", "budget",
--- "memory", "deadline") and a message naming the file. A bundle without
--- binder.lua answers "allowed", 1 (the packing order).
function M.binder_choose(bundle, set, candidates)
  local b = bundle.binder
  if not b then return "allowed", 1 end
  local host = bundle.host
  -- JSON null (a lone claim's vm, a claim without a node) is nil to the policy
  if set.vm == json.null then set.vm = nil end
  for _, c in ipairs(set.claims or {}) do
    if c.node == json.null then c.node = nil end
  end
  host.restore()
  local st, r = host.invoke(b.file, b.choose, host.readonly(set), host.readonly(candidates), bundle.cluster)
  if st ~= "ok" then return st, ("binder policy %s %s"):format(b.file, describe(st, r)) end
  if r == nil then return "allowed", 0 end
  local n = #candidates
  if math.type(r) ~= "integer" or r < 1 or r > n then
    local what = math.type(r) == "integer" and tostring(r) or shape(r)
    return "error", ("binder policy %s failed: choose returned %s; expected nil or a candidate's position, 1 to %d"):format(b.file, what, n)
  end
  return "allowed", r
end

-- claims(t, want) for budget.check_set: the units held in the namespaces
-- of tenant t's subtree (labelled tenant.cozystack.io/t) whose class
-- satisfies want, read from the binder's state through host.binder_held
-- (its Bound, Attached and Lost claims and the Pending ones this pass
-- allowed; decision 0044). O(pairs of namespace and class holding units),
-- never a walk of claims. No users are listed: a message at bind names
-- only the tenant, the key and the limit.
local function usage_counter(bundle)
  local cluster, held = bundle.cluster, bundle.host.binder_held
  return function(t, want)
    local total, label = 0, tenant.TENANT_PREFIX .. t
    local inside = {}
    for ns, cls, n in held() do
      if want(cls) then
        local yes = inside[ns]
        if yes == nil then
          local o = cluster:namespace(ns)
          yes = o ~= nil and object.label(o, label) ~= nil
          inside[ns] = yes
        end
        if yes then total = total + n end
      end
    end
    return total, {}
  end
end

-- the message a claim over budget carries: the tenant, the key and the
-- limit, never what else uses it (other tenants' objects)
local function bind_message(s, count)
  if s.rule == "R4" then return s.message end
  if s.rule == "quantity" then
    return ("tenant %q: a GPU budget in its ResourceQuotas is not a whole, non-negative number of GPUs; orders under it wait until it is corrected"):format(s.tenant)
  end
  local what = s.rule == "R5" and " (it caps the classes of that resource name together with raw-name VMs)" or ""
  return ("over the budget of tenant %q: %s is %d%s; %d more GPU%s not fit"):format(s.tenant, s.key, s.limit, what,
    count, count == 1 and " does" or "s do")
end

-- the check itself, run under host.invoke
local function check_bind(bundle, ns, class_name, count)
  local cluster = bundle.cluster
  local class = cluster:gpuclass(class_name) or { metadata = { name = class_name }, spec = {} }
  local ok, short = budget.check_set(cluster, ns, { { class = class, count = count } }, { claims = usage_counter(bundle) })
  if ok then return true end
  local s = short[1]
  return false, bind_message(s, count), s.tenant, s.key, s.limit, s.rule
end

--- The budget check at bind (DESIGN.md §5, decision 0020 §3): may `count`
--- units of class `class_name` go Pending -> Bound in namespace `ns`,
--- given the units the binder holds (host.binder_held, decision 0044) and
--- the Running raw-name VMIs of the cluster view? Rules R1–R5 are
--- cozygpu.budget's (check_set), with the claims counted from the binder's
--- held units. Runs under host.invoke (budget,
--- memory cap, deadline). Returns the outcome word and, when "allowed"
--- (the check ran): true, or false, message, tenant, key, limit, rule;
--- on a failure ("error", "budget", "memory", "deadline"): the word and
--- a message (the caller refuses: fail closed).
function M.binder_budget(bundle, ns, class_name, count)
  local host = bundle.host
  local st, ok, message, t, key, limit, rule = host.invoke("budget check at bind", check_bind, bundle, ns, class_name, count)
  if st ~= "ok" then return st, describe(st, ok) end
  return "allowed", ok, message, t, key, limit, rule
end

--- Applies a JSONPatch to a document (for `cozygpu policy test`).
--- Returns the patched document, or nil and a message.
function M.apply_patch(doc, ops)
  return jsonpatch.apply(doc, ops)
end

return M
