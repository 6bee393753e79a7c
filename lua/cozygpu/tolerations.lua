--- cozygpu.tolerations — toleration validation and merging.
---
--- Validation follows Kubernetes pod validation of tolerations
--- (k8s.io/kubernetes pkg/apis/core/validation/validation.go,
--- ValidateTolerations) narrowed by DESIGN.md §3: a GPUClass may only use the
--- operators Exists and Equal (an empty operator means Equal, as in a pod).
local json = require "cozygpu.json"
local object = require "cozygpu.object"
local validation = require "cozygpu.validation"

local M = {}

local EFFECTS = { NoSchedule = true, PreferNoSchedule = true, NoExecute = true }

--- Validates a list of tolerations. Returns a list of errors
--- `{field = "<path>[i].<field>", message = ...}`, empty when valid.
--- @param list table|nil  the tolerations (array of Toleration objects)
--- @param path string     field path of the list, e.g. "spec.tolerations"
--- @return {field:string, message:string}[]
function M.validate(list, path)
  local errors = {}
  local function bad(i, field, msg)
    errors[#errors + 1] = { field = ("%s[%d]%s"):format(path, i - 1, field and ("." .. field) or ""), message = msg }
  end
  if list == nil or list == json.null then return errors end
  if json.kind(list) ~= "array" and json.kind(list) ~= "table" then
    errors[1] = { field = path, message = "must be a list" }
    return errors
  end
  for i, t in ipairs(list) do
    if json.kind(t) ~= "object" and json.kind(t) ~= "table" then
      bad(i, nil, "must be an object")
    else
      for k in pairs(t) do
        if k ~= "key" and k ~= "operator" and k ~= "value" and k ~= "effect" and k ~= "tolerationSeconds" then
          bad(i, k, "unknown field")
        end
      end
      local key, op = object.get(t, "key"), object.get(t, "operator")
      local value, effect = object.get(t, "value"), object.get(t, "effect")
      local seconds = object.get(t, "tolerationSeconds")
      if key ~= nil and type(key) ~= "string" then bad(i, "key", "must be a string") key = nil end
      if value ~= nil and type(value) ~= "string" then bad(i, "value", "must be a string") value = nil end
      if op == nil or op == "" then op = "Equal" end
      if op ~= "Exists" and op ~= "Equal" then
        bad(i, "operator", ("Unsupported value: %q: supported values: \"Equal\", \"Exists\""):format(object.show(op)))
      end
      if key ~= nil and key ~= "" then
        local err = validation.qualified_name(key)
        if err then bad(i, "key", err) end
      elseif op ~= "Exists" then
        bad(i, "operator", "must be Exists when `key` is empty, which means \"match all values and all keys\"")
      end
      if op == "Exists" and value ~= nil and value ~= "" then
        bad(i, "operator", "value must be empty when `operator` is 'Exists'")
      elseif op == "Equal" and value ~= nil then
        local err = validation.label_value(value)
        if err then bad(i, "value", err) end
      end
      if effect ~= nil and effect ~= "" and not EFFECTS[effect] then
        bad(i, "effect", ("Unsupported value: %q: supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""):format(object.show(effect)))
      end
      if seconds ~= nil then
        if math.type(seconds) ~= "integer" then
          bad(i, "tolerationSeconds", "must be an integer")
        elseif effect ~= "NoExecute" then
          bad(i, "effect", "effect must be 'NoExecute' when `tolerationSeconds` is set")
        end
      end
    end
  end
  return errors
end

local function norm(t)
  local op = object.get(t, "operator")
  if op == nil or op == "" then op = "Equal" end
  return {
    key = object.get(t, "key") or "",
    operator = op,
    value = object.get(t, "value") or "",
    effect = object.get(t, "effect") or "",
    seconds = object.get(t, "tolerationSeconds"),
  }
end

--- True when tolerations `a` and `b` are the same toleration: equal key,
--- operator (empty means Equal), value, effect and tolerationSeconds.
function M.same(a, b)
  local x, y = norm(a), norm(b)
  return x.key == y.key and x.operator == y.operator and x.value == y.value and x.effect == y.effect
    and x.seconds == y.seconds
end

--- Returns the tolerations of `wanted` that are not already in `present`
--- (nor earlier in `wanted`), in order, as plain copies.
--- @param present table|nil existing tolerations
--- @param wanted table list of tolerations to add
--- @return table[]
function M.missing(present, wanted)
  local have, out = {}, {}
  for _, t in ipairs(present or {}) do have[#have + 1] = t end
  for _, w in ipairs(wanted) do
    local dup = false
    for _, h in ipairs(have) do
      if M.same(h, w) then dup = true break end
    end
    if not dup then
      local copy = json.copy(w)
      have[#have + 1] = copy
      out[#out + 1] = copy
    end
  end
  return out
end

--- True when toleration `t` tolerates taint `taint` ({key, value, effect}),
--- as k8s.io/api core/v1 Toleration.ToleratesTaint does.
function M.tolerates(t, taint)
  local x = norm(t)
  local effect = object.get(taint, "effect") or ""
  if x.effect ~= "" and x.effect ~= effect then return false end
  local key = object.get(taint, "key") or ""
  if x.key ~= "" and x.key ~= key then return false end
  if x.operator == "Exists" then return true end
  return x.value == (object.get(taint, "value") or "")
end

return M
