---@meta
-- cozygpu.object — reading Kubernetes objects without tripping over absent
-- fields or JSON null (lua/cozygpu/object.lua). None of these raise.
--
-- Source: the ObjectMeta fields of k8s.io/apimachinery meta/v1 (labels,
-- annotations, deletionTimestamp, ownerReferences).

---@class cozygpu.OwnerReference
---@field apiVersion string
---@field kind string
---@field name string
---@field uid string
---@field controller boolean?
---@field blockOwnerDeletion boolean?

---@class cozygpu.object
local object = {}

---Follows the keys (strings) and 1-based array indexes `...` from `obj`.
---Returns nil as soon as a step is absent, JSON null, or not a table.
---`object.get(vmi, "spec", "domain", "devices", "gpus", 1, "deviceName")`.
---@param obj any
---@param ... string|integer
---@return any
function object.get(obj, ...) end

---A value as message text: a string as itself; a number, boolean or nil
---as `tostring` gives it; JSON null as "null"; an object as "<object>",
---an array as "<list>" (never a table's memory address).
---@param v any
---@return string
function object.show(v) end

---`object.get` for a list: the value when it is an array (or an unmarked
---table), otherwise a new empty array, so
---`for _, x in ipairs(object.list(o, "spec", "tolerations"))` is safe.
---@param obj any
---@param ... string|integer
---@return table
function object.list(obj, ...) end

---The value of label `key` (metadata.labels), or nil.
---@param obj cozygpu.Object?
---@param key string
---@return string?
function object.label(obj, key) end

---The value of annotation `key` (metadata.annotations), or nil.
---@param obj cozygpu.Object?
---@param key string
---@return string?
function object.annotation(obj, key) end

---"namespace/name" for a namespaced object, "name" for a cluster-scoped
---one, metadata.generateName when there is no name yet, "?" when neither:
---for messages.
---@param obj cozygpu.Object?
---@return string
function object.ref(obj) end

---True when `obj` has metadata.deletionTimestamp (it is being deleted).
---@param obj cozygpu.Object?
---@return boolean
function object.deleting(obj) end

---The owner reference with `controller: true`, or nil
---(k8s.io/apimachinery meta/v1 GetControllerOf).
---@param obj cozygpu.Object?
---@return cozygpu.OwnerReference?
function object.controller_of(obj) end

return object
