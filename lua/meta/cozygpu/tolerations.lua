---@meta
-- cozygpu.tolerations — validating, comparing and merging pod tolerations
-- (lua/cozygpu/tolerations.lua).
--
-- Source: Kubernetes pod validation of tolerations (k8s.io/kubernetes
-- pkg/apis/core/validation/validation.go, ValidateTolerations), narrowed by
-- DESIGN.md §3: a GPUClass uses only the operators Exists and Equal; and
-- k8s.io/api core/v1 Toleration.ToleratesTaint for matching.

---A core/v1 Toleration. An empty or absent operator means Equal, an empty
---key with Exists matches every taint, an empty effect every effect.
---@class cozygpu.Toleration
---@field key string?
---@field operator ("Exists"|"Equal"|"")?
---@field value string?
---@field effect ("NoSchedule"|"PreferNoSchedule"|"NoExecute"|"")?
---@field tolerationSeconds integer?

---A core/v1 Taint.
---@class cozygpu.Taint
---@field key string
---@field value string?
---@field effect "NoSchedule"|"PreferNoSchedule"|"NoExecute"

---One validation error, as Kubernetes' field errors: the path of the
---offending field and what is wrong with it.
---@class cozygpu.FieldError
---@field field string e.g. "spec.tolerations[1].operator" (0-based indexes, as the API server prints them)
---@field message string e.g. 'Unsupported value: "Gt": supported values: "Equal", "Exists"'

---@class cozygpu.tolerations
local tolerations = {}

---Validates a list of tolerations as pod validation would, allowing only
---Exists and Equal. `path` is the field path of the list
---("spec.tolerations"). Returns every error (an empty list when valid; nil
---or json.null is an empty list; a value that is not a list is one error
---"must be a list" at `path`, an item that is not an object "must be an
---object" at `path[i]`). Checks: only the fields key, operator,
---value, effect, tolerationSeconds; key a qualified name
---(validation.qualified_name), or empty only with Exists; Exists carries no
---value; an Equal value is a label value (validation.label_value); effect
---empty or NoSchedule, PreferNoSchedule, NoExecute; tolerationSeconds an
---integer and only with NoExecute. Never raises.
---@param list cozygpu.Toleration[]?
---@param path string
---@return cozygpu.FieldError[]
function tolerations.validate(list, path) end

---True when `a` and `b` are the same toleration: equal key, operator
---(empty means Equal), value, effect and tolerationSeconds. Never raises.
---@param a cozygpu.Toleration
---@param b cozygpu.Toleration
---@return boolean
function tolerations.same(a, b) end

---The tolerations of `wanted` that are neither in `present` nor earlier in
---`wanted` (compared with `same`), in order, as writable copies: what a
---patch must add so that `present` holds all of `wanted`. Raises when
---`wanted` is not a list or `present` is neither nil nor a list (json.null
---included: read it with object.get, which turns null into nil).
---@param present cozygpu.Toleration[]?
---@param wanted cozygpu.Toleration[]
---@return cozygpu.Toleration[]
function tolerations.missing(present, wanted) end

---True when toleration `t` tolerates `taint` (core/v1
---Toleration.ToleratesTaint: effect empty or equal, key empty or equal,
---then Exists, or Equal with equal values). tolerationSeconds plays no
---part. Never raises.
---@param t cozygpu.Toleration
---@param taint cozygpu.Taint
---@return boolean
function tolerations.tolerates(t, taint) end

return tolerations
