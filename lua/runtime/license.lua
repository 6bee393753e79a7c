--- runtime.license — what the leader's license copier
--- (core/controller/license.c) asks of Lua: which namespaces are entitled
--- to vGPU, and whose entitlement a Namespace event changed. The rule is
--- cozygpu.tenant's vgpu_entitled (DESIGN.md §5), the same the admission
--- rules use; this module keeps the Namespaces it was given and an index
--- from each tenant to the namespaces below it, so that one Namespace
--- event recomputes only that namespace and its descendants
--- (docs/decisions/0029), never every namespace.
---
--- State lives in this module's upvalues: one engine per copier thread,
--- dropped (M.reset) when the replica stops leading.
local tenant = require "cozygpu.tenant"
local object = require "cozygpu.object"

local M = {}

local settings = {}
local namespaces = {} -- name -> Namespace object
local below = {}      -- ancestor name -> {[name] = true}: namespaces whose chain names it
local chain_of = {}   -- name -> the ancestors it was indexed under
local entitled = {}   -- name -> true (absent: not entitled)

-- the view tenant.vgpu_entitled reads: namespaces by name, and settings
local view = {
  settings = settings,
  namespace = function(_, name) return namespaces[name] end,
}

--- Forgets every namespace (a replica that stops leading).
function M.reset()
  namespaces, below, chain_of, entitled = {}, {}, {}, {}
end

--- Takes the settings (DESIGN.md §10; tenantRoot is what matters here).
--- @param s table the settings object
function M.settings(s)
  settings = s or {}
  view.settings = settings
end

local function unindex(name)
  for _, a in ipairs(chain_of[name] or {}) do
    local set = below[a]
    if set then
      set[name] = nil
      if next(set) == nil then below[a] = nil end
    end
  end
  chain_of[name] = nil
end

local function index(name, ns)
  local chain = tenant.ancestors(ns, object.get(settings, "tenantRoot"))
  for _, a in ipairs(chain) do
    if a ~= name then
      below[a] = below[a] or {}
      below[a][name] = true
    end
  end
  chain_of[name] = chain
end

-- Recomputes `name` and every namespace indexed below it; returns the
-- names whose answer changed, sorted.
local function recompute(name)
  local names = { name }
  for n in pairs(below[name] or {}) do names[#names + 1] = n end
  local changed = {}
  for _, n in ipairs(names) do
    local now = namespaces[n] ~= nil and tenant.vgpu_entitled(view, n) == true or nil
    if now ~= entitled[n] then
      entitled[n] = now
      changed[#changed + 1] = n
    end
  end
  table.sort(changed)
  return changed
end

--- Takes Namespace `ns` (added or changed). Returns the names (sorted)
--- whose entitlement changed: ns itself and the namespaces below it in
--- the tenant tree. Raises on a Namespace without metadata.name.
--- @param ns table a core/v1 Namespace
--- @return string[]
function M.namespace_set(ns)
  local name = object.get(ns, "metadata", "name")
  if type(name) ~= "string" then error("a Namespace without metadata.name") end
  local old = namespaces[name]
  -- what the rule reads of a namespace: its vGPU label and its ancestors;
  -- any other change (an annotation, another label) changes nobody's
  -- answer, so the namespaces below are not recomputed
  if old ~= nil and object.label(old, tenant.VGPU_LABEL) == object.label(ns, tenant.VGPU_LABEL) then
    local chain = tenant.ancestors(ns, object.get(settings, "tenantRoot"))
    local was = chain_of[name] or {}
    local same = #chain == #was
    for i = 1, #chain do same = same and chain[i] == was[i] end
    if same then
      namespaces[name] = ns
      return {}
    end
  end
  unindex(name)
  namespaces[name] = ns
  index(name, ns)
  return recompute(name)
end

--- Forgets Namespace `name` (deleted). Returns the names (sorted) whose
--- entitlement changed, as M.namespace_set.
--- @param name string
--- @return string[]
function M.namespace_gone(name)
  unindex(name)
  namespaces[name] = nil
  return recompute(name)
end

--- Whether namespace `name` is entitled to vGPU now (tenant.vgpu_entitled
--- over the namespaces taken so far).
--- @param name string
--- @return boolean
function M.entitled(name)
  return entitled[name] == true
end

return M
