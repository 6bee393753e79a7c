---@meta
-- Editor stubs for the policy environment (docs/policy-api.md). Not loaded
-- at run time.

---@class cozygpu.Verdict
---@field verdict "deny"|"warn"
---@field message string
---@field field string?
---@field code integer?

---@class cozygpu.Rule
---@field name string

---Declares a rule. Raises on an unknown field or a hook that is not a function.
---@param name string
---@return fun(spec: {match: table|function|nil, validate: function?, mutate: function?, description: string?}): cozygpu.Rule
function rule(name) end

---A refusal (403 unless opts.code; 422 for invalid objects).
---@param message string
---@param opts {field: string?, code: integer?}|nil
---@return cozygpu.Verdict
function deny(message, opts) end

---An admission warning.
---@param message string
---@return cozygpu.Verdict
function warn(message) end

---@class cozygpu.json
---@field null lightuserdata JSON null
json = {}
---@return table t marked as a JSON array
function json.array(t) end
---@return table t marked as a JSON object
function json.object(t) end
---@return "object"|"array"|"null"|"string"|"number"|"boolean"|"nil"|"table"
function json.kind(v) end
---@return string|nil json, string? err
function json.encode(v, opts) end
---@return any|nil value, string? err
function json.decode(s) end
---@return any a writable deep copy (read-only views unwrapped)
function json.copy(v) end
---@return any a read-only view
function json.readonly(v) end

---@class cozygpu.Patch
local Patch = {}
---@return cozygpu.Patch
function Patch:add(path, value) end
---@return cozygpu.Patch
function Patch:replace(path, value) end
---@return cozygpu.Patch
function Patch:remove(path) end
---@return cozygpu.Patch
function Patch:test(path, value) end

patch = {}
---@return cozygpu.Patch
function patch.new() end
---@return string pointer
function patch.pointer(segments) end
---@return any|nil doc, string? err
function patch.apply(doc, ops) end

gpu = {}
---GPU entries of a VMI spec (see lua/cozygpu/gpu.lua).
---@return table[]
function gpu.entries(spec, cluster, prefix) end
---@return integer
function gpu.count(vmi, cluster, filter) end
---@return table|nil class, string? problem
function gpu.class_for(cluster, name) end
---@return table<string,string>|nil
function gpu.permitted(cluster) end
---@return table<string,string>
function gpu.resource_names(cluster) end
---@return integer|nil
function gpu.max_count(class) end
---@return table[]
function gpu.pod_requests(pod, cluster) end
---Extended resources of a pod whose names `accept` takes.
---@param accept fun(name: string): boolean
---@return table[]
function gpu.pod_resources(pod, accept) end

---@class cozygpu.Shortfall
---@field tenant string the tenant namespace whose key is short
---@field key string the ResourceQuota key
---@field rule string "R1".."R5" or "quantity" (lua/cozygpu/budget.lua)
---@field limit integer
---@field used integer
---@field short integer GPUs missing
---@field message string

---cozygpu.budget (require "cozygpu.budget"): DESIGN.md §5 budgets.
local budget = {}
---An order of `count` GPUs of `class` in namespace `ns`.
---@return boolean ok, cozygpu.Shortfall[]? shortfalls
function budget.check(cluster, ns, class, count) end
---The classes one VM asks for, checked together.
---@param set {class: table, count: integer}[]
---@return boolean ok, cozygpu.Shortfall[]? shortfalls
function budget.check_set(cluster, ns, set) end
