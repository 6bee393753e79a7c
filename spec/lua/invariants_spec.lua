-- The invariant checker itself (spec/support/invariants.lua; decision 0036):
-- hand-built states whose right answer follows from DESIGN.md §3/§5 and
-- decision 0028, one broken at a time.
local I = require "invariants"
local json = H.json

local R = "nvidia.com/AD102GL_L40S" -- examples/classes/l40s.yaml's resourceName

local function ns(name, tenants)
  local labels = {}
  for _, t in ipairs(tenants) do labels["tenant.cozystack.io/" .. t] = "" end
  return { metadata = { name = name, labels = labels } }
end

local function claim(namespace, name, phase, count, node, extra)
  local c = { metadata = { namespace = namespace, name = name, uid = "c-" .. name }, spec = { class = "l40s", count = count or 1 },
    status = { phase = phase, node = node or "gpu-1" } }
  for k, v in pairs(extra or {}) do c.metadata[k] = v end
  return c
end

local function record(namespace, name, n)
  return { metadata = { namespace = namespace, name = name },
    status = { kind = "gpu-device", type = "l40s", resources = { ["l40s.gpuclass.cozystack.io/devices"] = tostring(n) } } }
end

local function vmi(namespace, name, phase, gpus, claims)
  local g = {}
  for i = 1, gpus do g[i] = { name = "gpu" .. i, deviceName = R } end
  return { metadata = { namespace = namespace, name = name, uid = "v-" .. name,
      annotations = claims and { ["gpu.cozystack.io/claims"] = claims } or nil },
    spec = { domain = { devices = { gpus = g } } }, status = { phase = phase } }
end

local function launcher(v, gpus, zeroed)
  return { metadata = { namespace = v.metadata.namespace, name = "virt-launcher-" .. v.metadata.name,
      ownerReferences = { { kind = "VirtualMachineInstance", name = v.metadata.name, uid = v.metadata.uid } },
      annotations = zeroed and { ["workload.cozystack.io/resources"] = json.encode { [R] = "0" } } or nil },
    spec = { containers = { { name = "compute", resources = { requests = { [R] = tostring(gpus) } } } } } }
end

-- tenant-a (budget 2 over its subtree) runs one VM on one Attached claim,
-- billed by its record; its launcher pod's GPU is zeroed (decision 0028 §7)
local function base()
  local v = vmi("tenant-a", "vm1", "Running", 1, "c1")
  return {
    classes = { { metadata = { name = "l40s" }, spec = { resourceName = R } } },
    namespaces = { ns("tenant-root", { "tenant-root" }), ns("tenant-a", { "tenant-root", "tenant-a" }),
      ns("tenant-b", { "tenant-root", "tenant-b" }), { metadata = { name = "cozy-gpu" } } },
    quotas = { { metadata = { namespace = "tenant-a", name = "gpu" }, spec = { hard = { ["gpuclass.cozystack.io/devices"] = "2" } } } },
    nodes = { { metadata = { name = "gpu-1" }, status = { allocatable = { [R] = "2" } } } },
    claims = { claim("tenant-a", "c1", "Attached") },
    records = { record("tenant-a", "gpu-c1", 1) },
    vmis = { v },
    pods = { launcher(v, 1, true) },
    events = {},
  }
end

local function only(bad, n)
  assert.are.equal(1, #bad, I.report(bad))
  assert.are.equal(n, bad[1].invariant, I.report(bad))
  return bad[1]
end

describe("the invariant checker", function()
  it("finds nothing in a consistent state", function()
    assert.are.same({}, I.check(base()))
  end)

  it("1: a zeroed record of a running VM's claim bills 0 of 1", function()
    local s = base()
    s.records[1].status.resources["l40s.gpuclass.cozystack.io/devices"] = "0"
    local v = only(I.check(s), 1)
    assert.are.equal("namespace tenant-a, " .. R .. ": 1 units held or running, 0 billed", v.message)
  end)

  it("1: a running VM whose claim was deleted is still using a GPU, and its zeroed pod bills nothing", function()
    local s = base()
    s.claims, s.records = {}, {}
    local v = only(I.check(s), 1)
    assert.are.equal("namespace tenant-a, " .. R .. ": 1 units held or running, 0 billed", v.message)
    assert.matches("VirtualMachineInstance tenant-a/vm1 Running", v.objects[1], 1, true)
  end)

  it("1: a raw-name VM is billed by its pod; zeroing it by annotation breaks billing", function()
    local s = base()
    local raw = vmi("tenant-b", "raw", "Running", 1, nil)
    s.vmis[#s.vmis + 1] = raw
    s.pods[#s.pods + 1] = launcher(raw, 1, false)
    assert.are.same({}, I.check(s))
    s.pods[#s.pods] = launcher(raw, 1, true)
    assert.are.equal("namespace tenant-b, " .. R .. ": 1 units held or running, 0 billed", only(I.check(s), 1).message)
  end)

  it("1: an annotation Cozystack cannot read (not a map of strings) is ignored whole", function()
    local s = base()
    local raw = vmi("tenant-b", "raw", "Running", 1, nil)
    local p = launcher(raw, 1, false)
    p.metadata.annotations = { ["workload.cozystack.io/resources"] = json.encode { [R] = 0 } }
    s.vmis[#s.vmis + 1], s.pods[#s.pods + 1] = raw, p
    assert.are.same({}, I.check(s))
  end)

  it("2: three units held over a budget of 2, counted over the tenant's subtree", function()
    local s = base()
    s.namespaces[#s.namespaces + 1] = ns("tenant-a-b", { "tenant-root", "tenant-a", "tenant-a-b" })
    s.claims[#s.claims + 1] = claim("tenant-a-b", "c2", "Bound")
    s.claims[#s.claims + 1] = claim("tenant-a-b", "c3", "Lost")
    s.records[#s.records + 1] = record("tenant-a-b", "gpu-c2", 1)
    s.nodes[1].status.allocatable[R] = "4"
    assert.are.equal("tenant tenant-a: gpuclass.cozystack.io/devices is 2, 3 held or running", only(I.check(s), 2).message)
  end)

  it("3: one claim serving two running VMIs", function()
    local s = base()
    local v2 = vmi("tenant-a", "vm2", "Running", 1, "c1")
    s.vmis[#s.vmis + 1] = v2
    s.pods[#s.pods + 1] = launcher(v2, 1, false) -- billed by its pod: billing holds, the unit does not
    local bad = I.check(s)
    local three = {}
    for _, b in ipairs(bad) do if b.invariant == 3 then three[#three + 1] = b.message end end
    assert.are.same({ "GPUClaim tenant-a/c1 serves 2 live VMIs: tenant-a/vm1, tenant-a/vm2" }, three)
  end)

  it("3: more units promised on a node than it has allocatable", function()
    local s = base()
    s.claims[#s.claims + 1] = claim("tenant-b", "big", "Bound", 2)
    s.records[#s.records + 1] = record("tenant-b", "gpu-big", 2)
    assert.are.equal("node gpu-1: 3 units of " .. R .. " promised (2 Bound, 1 Attached), 2 allocatable", only(I.check(s), 3).message)
  end)

  it("3: capacity that dropped under a running VM is no double promise", function()
    local s = base()
    s.nodes[1].status.allocatable[R] = "0"
    assert.are.same({}, I.check(s))
  end)

  it("4: a claim condition or Event naming another tenant's object; the controller's namespace is not a tenant's", function()
    local s = base()
    s.claims[1].status.conditions = { { type = "Ready", message = "2 in use by GPUClaim tenant-b/other (2)" } }
    assert.matches("GPUClaim tenant-a/c1 condition Ready names an object of namespace tenant-b", only(I.check(s), 4).message, 1, true)
    s = base()
    -- a parent's users read its children: tenant-a may name tenant-a-b's objects
    s.namespaces[#s.namespaces + 1] = ns("tenant-a-b", { "tenant-root", "tenant-a", "tenant-a-b" })
    s.events = { { metadata = { namespace = "cozy-gpu", name = "e1" }, message = "moved tenant-a/c1" },
      { metadata = { namespace = "tenant-a", name = "e0" }, message = "2 in use by GPUClaim tenant-a-b/x (2)" },
      { metadata = { namespace = "tenant-a", name = "e2" }, message = "names tenant-a/c1 and tenant-root/x" } }
    assert.matches("Event tenant-a/e2 names an object of namespace tenant-root", only(I.check(s), 4).message, 1, true)
  end)
end)
