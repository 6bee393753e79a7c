-- runtime.license (docs/decisions/0029): the vGPU entitlement of
-- DESIGN.md §5 (the label gpu.cozystack.io/vgpu=true on the namespace and
-- on every tenant ancestor) kept per namespace, and which namespaces a
-- Namespace event changes. Each expectation is worked out from that rule
-- in a comment beside it; the module's answers are also checked against
-- cozygpu.tenant.vgpu_entitled over a full cluster view.
local json = H.json
local license = require "runtime.license"
local tenant = require "cozygpu.tenant"
local cluster = require "cozygpu.cluster"

local SETTINGS = { tenantRoot = "tenant-root" }

local function ns(name, parents, vgpu, extra)
  local labels = { ["tenant.cozystack.io/tenant-root"] = "", ["tenant.cozystack.io/" .. name] = "" }
  for _, p in ipairs(parents) do labels["tenant.cozystack.io/" .. p] = "" end
  if vgpu then labels["gpu.cozystack.io/vgpu"] = "true" end
  for k, v in pairs(extra or {}) do labels[k] = v end
  return { apiVersion = "v1", kind = "Namespace", metadata = { name = name, labels = labels } }
end

describe("runtime.license", function()
  local objs

  before_each(function()
    license.reset()
    license.settings(SETTINGS)
    objs = {
      ns("tenant-root", {}, true),
      ns("tenant-a", {}, true),
      ns("tenant-a-b", { "tenant-a" }, true),
      ns("tenant-c", {}, false),
      ns("tenant-c-d", { "tenant-c" }, true),
    }
  end)

  local function agrees()
    local view = cluster.new(objs, SETTINGS)
    for _, o in ipairs(objs) do
      local n = o.metadata.name
      assert.are.equal(tenant.vgpu_entitled(view, n) == true, license.entitled(n), n)
    end
  end

  it("answers as tenant.vgpu_entitled, whatever order the namespaces come in", function()
    -- children first: tenant-a-b is not entitled until tenant-a and the root are known
    assert.are.same({}, license.namespace_set(objs[3]))
    assert.are.same({}, license.namespace_set(objs[2]))        -- its root is not known yet
    -- the root arrives: itself, tenant-a and tenant-a-b become entitled
    assert.are.same({ "tenant-a", "tenant-a-b", "tenant-root" }, license.namespace_set(objs[1]))
    license.namespace_set(objs[4])
    -- tenant-c-d carries the label, its parent does not (§5: no self-grant)
    assert.are.same({}, license.namespace_set(objs[5]))
    agrees()
  end)

  it("reports the namespaces below one whose label changes, and only those", function()
    for _, o in ipairs(objs) do license.namespace_set(o) end
    objs[2] = ns("tenant-a", {}, false)
    -- tenant-a loses the label: itself and tenant-a-b lose the entitlement
    assert.are.same({ "tenant-a", "tenant-a-b" }, license.namespace_set(objs[2]))
    agrees()
    objs[4] = ns("tenant-c", {}, true)
    -- tenant-c gains it: itself and tenant-c-d (labelled) gain it
    assert.are.same({ "tenant-c", "tenant-c-d" }, license.namespace_set(objs[4]))
    agrees()
    -- another label changes nobody's answer
    assert.are.same({}, license.namespace_set(ns("tenant-root", {}, true, { team = "x" })))
    -- the root goes: every namespace under it that was entitled loses it
    -- (tenant-a and tenant-a-b already had, with tenant-a's label)
    table.remove(objs, 1)
    assert.are.same({ "tenant-c", "tenant-c-d", "tenant-root" }, license.namespace_gone("tenant-root"))
    assert.is_false(license.entitled("tenant-a-b"))
  end)

  it("treats a namespace outside the tree by its own label, and forgets everything on reset", function()
    local outside = { apiVersion = "v1", kind = "Namespace",
      metadata = { name = "lab", labels = { ["gpu.cozystack.io/vgpu"] = "true" } } }
    assert.are.same({ "lab" }, license.namespace_set(outside))
    objs[#objs + 1] = outside
    for _, o in ipairs(objs) do license.namespace_set(o) end
    agrees()
    license.reset()
    assert.is_false(license.entitled("lab"))
    assert.is_false(license.entitled("tenant-root"))
    assert.has_error(function() license.namespace_set(json.object()) end)
  end)
end)
