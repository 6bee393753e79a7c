--- cozygpu.cluster — the read-only view of cluster state that policies get
--- as their second argument.
---
--- The view is built once per snapshot (or per cache refresh in the
--- controller) from a list of Kubernetes objects. Every object it returns is
--- a read-only view (assignment raises). Lookups that find nothing return
--- nil; lists are never nil.
local json = require "cozygpu.json"
local object = require "cozygpu.object"

local M = {}

local function key(ns, name) return (ns or "") .. "/" .. (name or "") end

--- Builds a view.
--- @param objects table[] Kubernetes objects (GPUClass, Namespace,
---   ResourceQuota, KubeVirt, Node, GPUClaim, ...; unknown kinds are kept
---   and reachable through `list(kind)`)
--- @param settings table settings (config.h shape)
--- @return table view with the methods below (call with `:`)
function M.new(objects, settings)
  local by_kind = {}          -- kind -> array
  local by_name = {}          -- kind -> "ns/name" -> object
  local by_ns = {}            -- kind -> namespace -> array (namespaced objects, in snapshot order)
  local class_by_resource = {} -- resourceName -> array of classes
  for _, o in ipairs(objects) do
    local kind = object.get(o, "kind")
    if type(kind) == "string" then
      by_kind[kind] = by_kind[kind] or {}
      table.insert(by_kind[kind], o)
      by_name[kind] = by_name[kind] or {}
      local ns = object.get(o, "metadata", "namespace")
      by_name[kind][key(ns, object.get(o, "metadata", "name"))] = o
      if type(ns) == "string" then
        local k = by_ns[kind]
        if not k then k = {}; by_ns[kind] = k end
        local l = k[ns]
        if not l then l = {}; k[ns] = l end
        l[#l + 1] = o
      end
      if kind == "GPUClass" then
        local rn = object.get(o, "spec", "resourceName")
        if type(rn) == "string" then
          class_by_resource[rn] = class_by_resource[rn] or {}
          table.insert(class_by_resource[rn], o)
        end
      end
    end
  end
  local ro = json.readonly
  local view = {}
  local empty = ro(json.array())

  --- All objects of `kind` (e.g. "Node"), in snapshot order.
  function view.list(_, kind) return ro(by_kind[kind] or empty) end
  --- One object by kind, namespace (nil for cluster-scoped) and name.
  function view.get(_, kind, ns, name)
    local t = by_name[kind]
    return t and ro(t[key(ns, name)]) or nil
  end
  --- GPUClass by name.
  function view.gpuclass(self, name) return self:get("GPUClass", nil, name) end
  --- Every GPUClass.
  function view.gpuclasses(self) return self:list("GPUClass") end
  --- The GPUClasses whose spec.resourceName is `name` (normally at most
  --- one: DESIGN.md §3, one resource name per offer).
  function view.classes_for_resource(_, name) return ro(class_by_resource[name] or empty) end
  --- Namespace by name.
  function view.namespace(self, name) return self:get("Namespace", nil, name) end
  -- the namespaced objects of `kind` in namespace `ns` (indexed once per
  -- view: a lookup never walks the cluster)
  local function in_ns(kind, ns)
    local k = by_ns[kind]
    return ro(k and k[ns] or empty)
  end
  --- ResourceQuotas of namespace `ns`, in snapshot order.
  function view.resourcequotas(_, ns) return in_ns("ResourceQuota", ns) end
  --- The KubeVirt CR (the first one; a cluster has one), or nil.
  function view.kubevirt(_) return by_kind.KubeVirt and ro(by_kind.KubeVirt[1]) or nil end
  --- The user KubeVirt's virt-controller acts as (it creates the
  --- virt-launcher pods): the setting virtControllerUser, or KubeVirt's
  --- service account kubevirt-controller in the namespace of the KubeVirt
  --- CR (its install manifests). nil when neither says: then nobody is the
  --- virt-controller (fail closed: no exception granted on a guess).
  function view.virt_controller(self)
    local u = object.get(settings, "virtControllerUser")
    if type(u) == "string" and u ~= "" then return u end
    local kv = self:kubevirt()
    local ns = kv and object.get(kv, "metadata", "namespace")
    if type(ns) ~= "string" then return nil end
    return ("system:serviceaccount:%s:kubevirt-controller"):format(ns)
  end
  --- Node by name.
  function view.node(self, name) return self:get("Node", nil, name) end
  --- Every Node.
  function view.nodes(self) return self:list("Node") end
  --- GPUClaims of namespace `ns` (in snapshot order), or of every
  --- namespace when ns is nil.
  function view.gpuclaims(_, ns)
    if ns == nil then return ro(by_kind.GPUClaim or empty) end
    return in_ns("GPUClaim", ns)
  end
  view.settings = settings
  return ro(view)
end

return M
