---@meta
-- cozygpu.json — JSON values in Lua (C: core/engine/luajson.c, jansson). Also the
-- global `json` of every policy.
--
-- Mapping: a JSON object is a table marked "object", an array a table
-- marked "array" (1-based), null is `json.null` (a light userdata), absent
-- members are nil. Integers stay Lua integers, other numbers are floats.
-- An unmarked table encodes as an array when its keys are exactly 1..n
-- (n > 0), else as an object; so an empty unmarked `{}` encodes as `{}`.

---@class cozygpu.json
---JSON null. Compare with `v == json.null`; `object.get` reads it as nil.
---@field null lightuserdata
local json = {}

---Encodes `v` as compact JSON with sorted keys (indented by two with
---`opts.pretty`). Read-only views are encoded as their content.
---Returns nil and a message naming the path ("spec.x: cannot encode a
---function", "cannot encode nil (use json.null)", "string is not valid
---UTF-8", "nested too deep (a cycle?)"); raises only when called without an
---argument.
---@param v any
---@param opts {pretty: boolean?}?
---@return string|nil text
---@return string? err
function json.encode(v, opts) end

---Decodes one JSON value (any type at the top level; duplicate object keys
---are an error). Returns nil and "line L, column C: <reason>" for bad
---text; raises when `s` is not a string.
---@param s string
---@return any|nil value
---@return string? err
function json.decode(s) end

---Marks table `t` (a new one when nil) as a JSON object, so an empty one
---encodes as `{}`, and returns it. Raises when `t` is neither nil nor a
---table, or is a read-only view (a value a policy received: copy it with
---`json.copy` first). Replaces the table's metatable: never call it on a
---patch (see docs/policy-api.md, "Pitfalls").
---@generic T: table
---@param t T?
---@return T
function json.object(t) end

---Marks table `t` (a new one when nil) as a JSON array, so an empty one
---encodes as `[]`, and returns it. Same rules as `json.object`.
---@generic T: table
---@param t T?
---@return T
function json.array(t) end

---What `v` is as JSON: "object" or "array" (a marked table, also through a
---read-only view), "table" (an unmarked table), "null" (json.null), or
---Lua's type name otherwise ("string", "number", "boolean", "nil",
---"function", "userdata", "thread"). Never raises.
---@param v any
---@return "object"|"array"|"table"|"null"|"string"|"number"|"boolean"|"nil"|"function"|"userdata"|"thread"
function json.kind(v) end

---A deep, writable copy of a JSON value: read-only views are unwrapped,
---object/array marks kept, unmarked tables marked by the encoding rule.
---Raises "json.copy: <path>: <reason>" when `v` holds something JSON cannot
---(a function, a table mixing integer and string keys, an array with
---holes, a string that is not UTF-8).
---@generic T
---@param v T
---@return T
function json.copy(v) end

---The value at the path `...` (keys and 1-based indexes) from `v`: nil as
---soon as a step is absent, JSON null or not a table; `v` itself with no
---keys. A table reached through a read-only view comes back read-only.
---One call for the whole walk (cozygpu.object.get is this function).
---@param v any
---@param ... any
---@return any
function json.get(v, ...) end

---A read-only view of `v` (`v` itself when it is not a table): reads go
---through, assignment raises, `pairs`, `ipairs`, `#` and `next` work.
---Raises only when called without an argument.
---@generic T
---@param v T
---@return T
function json.readonly(v) end

return json
