--- cozygpu.policy — what a policy file is made of: rules and verdicts.
--- These are globals in every policy's environment (rule, deny, warn);
--- docs/policy-api.md describes them for hosters.
local json = require "cozygpu.json"

local M = {}

-- what rule() made: the read-only view it returned -> the declaration
-- behind it (weak keys: a view nobody holds goes)
local made = setmetatable({}, { __mode = "k" })

local HOOKS = { validate = true, mutate = true }
local FIELDS = { match = true, validate = true, mutate = true, description = true }
local MATCH_FIELDS = { kind = true, group = true, operations = true, ["function"] = true }
local OPERATIONS = { CREATE = true, UPDATE = true, DELETE = true, CONNECT = true }

local function string_or_list(v)
  if type(v) == "string" then return true end
  if type(v) ~= "table" then return false end
  for _, x in ipairs(v) do if type(x) ~= "string" then return false end end
  return true
end

--- Declares a rule: `rule "site/name" { match = ..., validate = fn, mutate = fn }`.
--- `match` is a table {kind = "Pod" | {...}, group = "kubevirt.io" | {...},
--- operations = {"CREATE", ...}} (all optional; absent means any) or a
--- function(req) returning true to run. `validate(req, cluster)` returns
--- nil (allow), a verdict, or a list of verdicts; `mutate(req, cluster)`
--- returns nil or a JSONPatch (patch.new() or a list of operations).
--- Raises on a malformed declaration, naming the rule and the field.
--- @param name string unique rule name, e.g. "gpu/vmi-entries"
--- @return fun(spec: table): table
function M.rule(name)
  if type(name) ~= "string" or not name:match("^[%w][%w%-%._/]*$") then
    error("rule: the name must be a string of letters, digits, '-', '.', '_' or '/'", 2)
  end
  -- where the declaration stands ("site.lua:12: "): `return rule "x" {...}`
  -- calls the function below as a tail call, whose caller's frame is gone
  -- by the time it raises, so the position is taken now
  local _, where = pcall(error, "", 3)
  local function fail(message) error(where .. message, 0) end
  return function(spec)
    if type(spec) ~= "table" then fail(("rule %q: expected a table"):format(name)) end
    for k in pairs(spec) do
      if not FIELDS[k] then fail(("rule %q: unknown field %q (known: match, validate, mutate, description)"):format(name, tostring(k))) end
    end
    local hooks = 0
    for h in pairs(HOOKS) do
      if spec[h] ~= nil then
        if type(spec[h]) ~= "function" then fail(("rule %q: %s must be a function"):format(name, h)) end
        hooks = hooks + 1
      end
    end
    if hooks == 0 then fail(("rule %q: needs a validate or mutate function"):format(name)) end
    local m = spec.match
    if m ~= nil and type(m) ~= "function" then
      if type(m) ~= "table" then fail(("rule %q: match must be a table or a function"):format(name)) end
      -- a plain copy of strings is what the runtime reads at review time
      -- (outside the rule's budget): nothing the policy's tables do then
      local copy = {}
      for k, v in pairs(m) do
        if not MATCH_FIELDS[k] then fail(("rule %q: match: unknown field %q (known: kind, group, operations)"):format(name, tostring(k))) end
        if not string_or_list(v) then fail(("rule %q: match.%s must be a string or a list of strings"):format(name, k)) end
        if type(v) == "string" then copy[k] = v
        else
          local list = {}
          for i, x in ipairs(v) do list[i] = x end
          copy[k] = list
        end
      end
      for _, op in ipairs(type(copy.operations) == "table" and copy.operations or { copy.operations }) do
        if not OPERATIONS[op] then fail(("rule %q: match.operations: unknown operation %q"):format(name, tostring(op))) end
      end
      m = copy
    end
    local r = { name = name, match = m, validate = spec.validate, mutate = spec.mutate, description = spec.description }
    -- the policy gets a read-only view: it cannot rename the rule or swap a
    -- hook after the declaration was checked
    local view = json.readonly(r)
    made[view] = r
    return view
  end
end

--- The declaration behind `v`, a value `rule(name)(spec)` returned, as a
--- new plain table {name, match, validate, mutate, description} (match
--- copied), or nil when `v` is not one. The runtime's loader takes rules
--- through this only, so a table that merely looks like a rule is refused.
--- @param v any
--- @return table|nil
function M.declared(v)
  local r = made[v]
  if not r then return nil end
  local m = r.match
  if type(m) == "table" then
    local copy = {}
    for k, x in next, m do
      if type(x) == "table" then
        local list = {}
        for i = 1, #x do list[i] = x[i] end
        copy[k] = list
      else copy[k] = x end
    end
    m = copy
  end
  return { name = r.name, match = m, validate = r.validate, mutate = r.mutate, description = r.description }
end

-- what binder() made: the read-only view -> the declaration behind it
local made_binder = setmetatable({}, { __mode = "k" })
local BINDER_FIELDS = { choose = true, description = true }

--- Declares the binder policy, the one thing `policies/binder.lua` returns
--- (docs/decisions/0024): `return binder { choose = fn, description = "..." }`.
--- `choose(set, candidates, cluster)` gets a claim set {namespace, vm (nil
--- for a lone claim), claims = {{name, class, count, phase, node}, ...}},
--- at most 32 candidate nodes in the index's packing order (each {node,
--- classes = {[class] = {offered, bound, free}}, labels = {...}}) and the
--- cluster view, all read-only; it returns the position (1..#candidates)
--- of the node to bind the set to, or nil to place it nowhere this pass.
--- Raises on a spec that is not a table, an unknown field, or a missing
--- or non-function choose.
--- @param spec table {choose = function, description = string?}
--- @return table the declaration (read-only)
function M.binder(spec)
  if type(spec) ~= "table" then error("binder: expected a table { choose = function(set, candidates, cluster) ... end }", 2) end
  for k in pairs(spec) do
    if not BINDER_FIELDS[k] then error(("binder: unknown field %q (known: choose, description)"):format(tostring(k)), 2) end
  end
  if type(spec.choose) ~= "function" then error("binder: choose must be a function(set, candidates, cluster)", 2) end
  if spec.description ~= nil and type(spec.description) ~= "string" then error("binder: description must be a string", 2) end
  local b = { choose = spec.choose, description = spec.description }
  local view = json.readonly(b)
  made_binder[view] = b
  return view
end

--- The declaration behind `v`, a value binder(spec) returned, as a new
--- plain table {choose, description}, or nil when `v` is not one.
--- @param v any
--- @return table|nil
function M.declared_binder(v)
  local b = made_binder[v]
  if not b then return nil end
  return { choose = b.choose, description = b.description }
end

local REASONS = { [400] = "BadRequest", [403] = "Forbidden", [404] = "NotFound", [409] = "Conflict",
  [422] = "Invalid", [429] = "TooManyRequests", [500] = "InternalError" }
M.REASONS = REASONS

--- A refusal. `opts.field` is the field path it is about
--- ("spec.tolerations[2].operator"), `opts.code` the HTTP status code
--- (403 by default; 422 for an invalid object, as the API server uses;
--- 400-499 only: a refusal is the client's, 500 means a policy failed).
--- @param message string
--- @param opts {field:string?, code:integer?}|nil
function M.deny(message, opts)
  if type(message) ~= "string" then error("deny: message must be a string", 2) end
  opts = opts or {}
  local code = opts.code or 403
  -- a refusal is the client's (4xx); 500 is what the runtime answers when a
  -- policy fails, and a deny must not look like one (decision 0001)
  if math.type(code) ~= "integer" or code < 400 or code > 499 then error("deny: code must be an HTTP 4xx status (400-499)", 2) end
  return { verdict = "deny", message = message, field = opts.field, code = code }
end

--- An admission warning (allowed, shown to the client: kubectl prints it).
--- @param message string
function M.warn(message)
  if type(message) ~= "string" then error("warn: message must be a string", 2) end
  return { verdict = "warn", message = message }
end

return M
