--- cozygpu.object — reading Kubernetes objects safely.
---
--- JSON null (json.null) and absent fields both read as nil through `get`,
--- so a policy never indexes a null by mistake.
local json = require "cozygpu.json"

local M = {}

--- Follows `...` (keys and 1-based indexes) from `obj`; returns nil as soon
--- as a step is absent, null, or not a table.
--- @param obj any
--- @return any
--- (json.get: one C call for the walk.)
M.get = json.get

--- `get` for a list: returns the value when it is an array, else an empty
--- array, so `for _, x in ipairs(object.list(o, "spec", "items"))` is safe.
function M.list(obj, ...)
  local v = M.get(obj, ...)
  if type(v) == "table" and json.kind(v) ~= "object" then return v end
  return json.array()
end

--- The value of label `key` on `obj`, or nil.
function M.label(obj, key) return M.get(obj, "metadata", "labels", key) end

--- The value of annotation `key` on `obj`, or nil.
function M.annotation(obj, key) return M.get(obj, "metadata", "annotations", key) end

--- A value as text for a message a tenant reads: a string as itself; a
--- number, boolean or nil as `tostring` gives it; JSON null as "null"; an
--- object as "<object>" and an array as "<list>". `tostring` of a table
--- (or of a read-only view) would print a memory address, which says
--- nothing to the tenant and tells them about the process (found by a
--- hostile-tenant review: a GPUClass with `spec.mode: {}`).
--- @param v any
--- @return string
function M.show(v)
  local t = type(v)
  if t == "string" or t == "number" or t == "boolean" or t == "nil" then return tostring(v) end
  local k = json.kind(v)
  if k == "array" then return "<list>" end
  if k == "object" or k == "table" then return "<object>" end
  return k -- "null", or the Lua type of anything else
end

--- "namespace/name" or "name" for messages.
function M.ref(obj)
  local ns, name = M.get(obj, "metadata", "namespace"), M.get(obj, "metadata", "name")
  if ns then return ns .. "/" .. tostring(name) end
  return tostring(name or M.get(obj, "metadata", "generateName") or "?")
end

--- True when `obj` has a deletionTimestamp (it is being deleted).
function M.deleting(obj) return M.get(obj, "metadata", "deletionTimestamp") ~= nil end

--- The controller owner reference of `obj` ({apiVersion, kind, name, uid,
--- controller=true}), or nil. Kubernetes: metav1.GetControllerOf.
function M.controller_of(obj)
  for _, ref in ipairs(M.list(obj, "metadata", "ownerReferences")) do
    if M.get(ref, "controller") == true then return ref end
  end
  return nil
end

return M
