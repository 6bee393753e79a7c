-- cozygpu.budget over a three-level tenant tree: tenant-root > tenant-a >
-- tenant-a-b (and tenant-b beside tenant-a). Each case names the rule of
-- DESIGN.md §5 it checks (see lua/cozygpu/budget.lua: R1..R6).
local json = H.json
local budget = require "cozygpu.budget"
local cluster = require "cozygpu.cluster"

local L40S, VGPU, A100 = "nvidia.com/AD102GL_L40S", "nvidia.com/NVIDIA_L40S-24C", "nvidia.com/GA100_A100_PCIE_40GB"

local CLASSES = {
  H.class("l40s", { mode = "Passthrough", resourceName = L40S, model = "L40S" }),
  -- a second passthrough offer of the same device-plugin name is not allowed
  -- by GPUClass admission, so same-name sharing is modelled by the VGPU
  -- class on its own name and A100 on another
  H.class("l40s-24c", { mode = "VGPU", profile = "L40S-24C", resourceName = VGPU, model = "L40S", maxCount = 2 }),
  H.class("a100", { mode = "Passthrough", resourceName = A100, model = "A100" }),
}

local NAMESPACES = {
  H.tenant { "tenant-root" },
  H.tenant { "tenant-root", "tenant-a" },
  H.tenant { "tenant-root", "tenant-a", "tenant-a-b" },
  H.tenant { "tenant-root", "tenant-b" },
  H.namespace("default"),
}

local function quota(ns, hard, name)
  return { apiVersion = "v1", kind = "ResourceQuota", metadata = { name = name or "gpu", namespace = ns }, spec = { hard = hard } }
end

local function claim(ns, class, count, phase, name)
  return {
    apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
    metadata = { name = name or ("c-" .. class .. "-" .. count), namespace = ns },
    spec = { class = class, count = count }, status = { phase = phase or "Bound" },
  }
end

local function raw_vmi(ns, rn, n, phase, classref)
  local hd = {}
  for i = 1, n do hd[i] = rn end
  local v = H.vmi { namespace = ns, name = "raw-" .. ns .. "-" .. n, hostDevices = hd,
    labels = classref and { ["gpu.cozystack.io/class-reference"] = "true" } or nil }
  v.status = { phase = phase or "Running" }
  return v
end

local function kubevirt()
  -- H100 is permitted by KubeVirt (a GPU resource name) but no class carries it
  return H.kubevirt({ { "10DE:26B9", L40S }, { "10DE:20B5", A100 }, { "10DE:2331", "nvidia.com/GH100_H100_PCIE" } },
    { { "NVIDIA L40S-24C", VGPU } })
end

-- quotas: {ns = {hard} | {{hard}, {hard}}}; objects: extra objects
local function run(c)
  local objs = {}
  for _, o in ipairs(CLASSES) do objs[#objs + 1] = o end
  for _, o in ipairs(NAMESPACES) do objs[#objs + 1] = o end
  objs[#objs + 1] = kubevirt()
  for ns, q in pairs(c.quotas or {}) do
    if q[1] then
      for i, h in ipairs(q) do objs[#objs + 1] = quota(ns, h, "gpu-" .. i) end
    else
      objs[#objs + 1] = quota(ns, q)
    end
  end
  for _, o in ipairs(c.objects or {}) do objs[#objs + 1] = o end
  local view = cluster.new(json.decode(json.encode(objs)), assert(H.core.config_from(json.object())))
  local cls = view:gpuclass(c.order[2])
  return budget.check(view, c.order[1], cls, c.order[3])
end

local CASES = {
  -- R3: no key anywhere
  { "no quota anywhere: capacity only", "R3", {}, {}, { "tenant-a-b", "l40s", 4 }, true },
  { "a quota without GPU keys: capacity only", "R3", { ["tenant-a"] = { pods = "10" } }, {}, { "tenant-a", "l40s", 8 }, true },
  { "outside the tenant tree: no budget", "R3", { default = { [ "gpuclass.cozystack.io/devices" ] = "0" } }, {}, { "default", "l40s", 3 }, true },
  { "a key on a sibling does not apply", "R3", { ["tenant-b"] = { ["l40s.gpuclass.cozystack.io/devices"] = "0" } }, {}, { "tenant-a", "l40s", 1 }, true },
  { "a key on a descendant does not apply to the parent's own order", "R3", { ["tenant-a-b"] = { ["l40s.gpuclass.cozystack.io/devices"] = "0" } }, {}, { "tenant-a", "l40s", 2 }, true },
  -- R1: class key
  { "class key on self: fits", "R1", { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "2" } }, {}, { "tenant-a", "l40s", 2 }, true },
  { "class key on self: one over", "R1", { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "2" } }, {}, { "tenant-a", "l40s", 3 }, { { "tenant-a", "l40s.gpuclass.cozystack.io/devices", 1 } } },
  { "class key counts claims in the subtree", "R1", { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "3" } },
    { claim("tenant-a", "l40s", 1), claim("tenant-a-b", "l40s", 2) }, { "tenant-a", "l40s", 1 }, { { "tenant-a", "l40s.gpuclass.cozystack.io/devices", 1 } } },
  { "class key on the root caps a grandchild", "R1", { ["tenant-root"] = { ["l40s.gpuclass.cozystack.io/devices"] = "2" } },
    { claim("tenant-b", "l40s", 2) }, { "tenant-a-b", "l40s", 1 }, { { "tenant-root", "l40s.gpuclass.cozystack.io/devices", 1 } } },
  { "class key of another class does not apply", "R1", { ["tenant-a"] = { ["a100.gpuclass.cozystack.io/devices"] = "0" } }, {}, { "tenant-a", "l40s", 1 }, true },
  { "claims of another class do not use the class key", "R1", { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "1" } },
    { claim("tenant-a", "a100", 4) }, { "tenant-a", "l40s", 1 }, true },
  { "claims outside the subtree do not count", "R1", { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "1" } },
    { claim("tenant-b", "l40s", 4), claim("tenant-root", "l40s", 4) }, { "tenant-a-b", "l40s", 1 }, true },
  -- R1: total key
  { "total key counts every class", "R1", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "3" } },
    { claim("tenant-a", "a100", 2), claim("tenant-a-b", "l40s-24c", 1) }, { "tenant-a", "l40s", 1 }, { { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
  { "total key: fits exactly", "R1", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "4" } },
    { claim("tenant-a", "a100", 2), claim("tenant-a-b", "l40s-24c", 1) }, { "tenant-a-b", "l40s", 1 }, true },
  { "class and total key both short", "R1", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "1", ["l40s.gpuclass.cozystack.io/devices"] = "1" } },
    { claim("tenant-a", "l40s", 1) }, { "tenant-a", "l40s", 1 },
    { { "tenant-a", "l40s.gpuclass.cozystack.io/devices", 1 }, { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
  -- R2: a child only adds limits
  { "child grants more than the parent: the parent still caps", "R2",
    { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "1" }, ["tenant-a-b"] = { ["l40s.gpuclass.cozystack.io/devices"] = "5" } },
    {}, { "tenant-a-b", "l40s", 2 }, { { "tenant-a", "l40s.gpuclass.cozystack.io/devices", 1 } } },
  { "child limits below the parent", "R2",
    { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "5" }, ["tenant-a-b"] = { ["l40s.gpuclass.cozystack.io/devices"] = "1" } },
    {}, { "tenant-a-b", "l40s", 2 }, { { "tenant-a-b", "l40s.gpuclass.cozystack.io/devices", 1 } } },
  { "both levels short, reported root first", "R2",
    { ["tenant-root"] = { ["gpuclass.cozystack.io/devices"] = "1" }, ["tenant-a-b"] = { ["l40s.gpuclass.cozystack.io/devices"] = "0" } },
    {}, { "tenant-a-b", "l40s", 2 },
    { { "tenant-root", "gpuclass.cozystack.io/devices", 1 }, { "tenant-a-b", "l40s.gpuclass.cozystack.io/devices", 2 } } },
  { "the parent's limit is shared by siblings' subtrees", "R2", { ["tenant-root"] = { ["gpuclass.cozystack.io/devices"] = "4" } },
    { claim("tenant-b", "a100", 3) }, { "tenant-a-b", "l40s", 2 }, { { "tenant-root", "gpuclass.cozystack.io/devices", 1 } } },
  { "a child key on the sibling branch does not add a limit here", "R2",
    { ["tenant-root"] = { ["gpuclass.cozystack.io/devices"] = "10" }, ["tenant-b"] = { ["gpuclass.cozystack.io/devices"] = "0" } },
    {}, { "tenant-a", "a100", 3 }, true },
  -- R6: what counts
  { "Lost claims count", "R6", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "2" } },
    { claim("tenant-a", "l40s", 2, "Lost") }, { "tenant-a", "l40s", 1 }, { { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
  { "Pending claims count", "R6", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "2" } },
    { claim("tenant-a", "l40s", 2, "Pending") }, { "tenant-a", "l40s", 1 }, { { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
  { "Attached claims count", "R6", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "3" } },
    { claim("tenant-a", "l40s", 2, "Attached") }, { "tenant-a", "l40s", 1 }, true },
  { "running raw-name VMIs count against the raw key", "R6",
    { ["tenant-a"] = { ["requests." .. L40S] = "2", ["l40s.gpuclass.cozystack.io/devices"] = "9" } },
    { raw_vmi("tenant-a-b", L40S, 2) }, { "tenant-a", "l40s", 1 }, { { "tenant-a", "requests." .. L40S, 1 } } },
  { "stopped raw-name VMIs do not count", "R6",
    { ["tenant-a"] = { ["requests." .. L40S] = "2", ["l40s.gpuclass.cozystack.io/devices"] = "9" } },
    { raw_vmi("tenant-a-b", L40S, 2, "Succeeded") }, { "tenant-a", "l40s", 2 }, true },
  { "class-ordered VMIs are counted by their claims, not as raw", "R6",
    { ["tenant-a"] = { ["requests." .. L40S] = "2", ["l40s.gpuclass.cozystack.io/devices"] = "9" } },
    { raw_vmi("tenant-a", L40S, 2, "Running", true) }, { "tenant-a", "l40s", 2 }, true },
  { "running raw-name VMIs count against the class key of their names' class (no escape by dropping the label)", "R6",
    { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "3" } },
    { raw_vmi("tenant-a", L40S, 3) }, { "tenant-a", "l40s", 1 }, { { "tenant-a", "l40s.gpuclass.cozystack.io/devices", 1 } } },
  { "running raw-name VMIs count against the total key too", "R6",
    { ["tenant-root"] = { ["gpuclass.cozystack.io/devices"] = "2" } },
    { raw_vmi("tenant-b", L40S, 2) }, { "tenant-a", "a100", 1 }, { { "tenant-root", "gpuclass.cozystack.io/devices", 1 } } },
  -- R4: raw key blocks until the class or total key is granted there
  { "raw key alone blocks the class", "R4", { ["tenant-a"] = { ["requests." .. L40S] = "8" } }, {}, { "tenant-a", "l40s", 1 },
    { { "tenant-a", "requests." .. L40S, 1 } } },
  { "raw key with the class key granted there: allowed", "R4",
    { ["tenant-a"] = { ["requests." .. L40S] = "8", ["l40s.gpuclass.cozystack.io/devices"] = "8" } }, {}, { "tenant-a", "l40s", 1 }, true },
  { "raw key with the total key granted there: allowed", "R4",
    { ["tenant-a"] = { ["requests." .. L40S] = "8", ["gpuclass.cozystack.io/devices"] = "8" } }, {}, { "tenant-a", "l40s", 1 }, true },
  { "raw key at the root, class key only below: still blocked", "R4",
    { ["tenant-root"] = { ["requests." .. L40S] = "8" }, ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "8" } },
    {}, { "tenant-a-b", "l40s", 1 }, { { "tenant-root", "requests." .. L40S, 1 } } },
  { "raw key for another resource name does not block", "R4", { ["tenant-a"] = { ["requests." .. A100] = "0" } }, {}, { "tenant-a", "l40s", 1 }, true },
  { "raw key in a quota of its own, class key in another quota of the same tenant", "R4",
    { ["tenant-a"] = { { ["requests." .. L40S] = "8" }, { ["l40s.gpuclass.cozystack.io/devices"] = "8" } } }, {}, { "tenant-a", "l40s", 1 }, true },
  -- R5: the raw key caps claims and raw VMIs together
  { "raw key caps claims and raw VMIs together", "R5",
    { ["tenant-a"] = { ["requests." .. L40S] = "3", ["gpuclass.cozystack.io/devices"] = "10" } },
    { claim("tenant-a", "l40s", 1), raw_vmi("tenant-a-b", L40S, 1) }, { "tenant-a", "l40s", 2 }, { { "tenant-a", "requests." .. L40S, 1 } } },
  { "raw key: fits exactly", "R5",
    { ["tenant-a"] = { ["requests." .. L40S] = "3", ["gpuclass.cozystack.io/devices"] = "10" } },
    { claim("tenant-a", "l40s", 1), raw_vmi("tenant-a-b", L40S, 1) }, { "tenant-a", "l40s", 1 }, true },
  { "raw key ignores claims of classes with other names", "R5",
    { ["tenant-a"] = { ["requests." .. L40S] = "1", ["gpuclass.cozystack.io/devices"] = "10" } },
    { claim("tenant-a", "a100", 5) }, { "tenant-a", "l40s", 1 }, true },
  -- zero budgets
  { "zero class key refuses", "R1", { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "0" } }, {}, { "tenant-a", "l40s", 1 },
    { { "tenant-a", "l40s.gpuclass.cozystack.io/devices", 1 } } },
  { "zero total key at the root refuses everyone below", "R1", { ["tenant-root"] = { ["gpuclass.cozystack.io/devices"] = "0" } }, {}, { "tenant-a-b", "a100", 1 },
    { { "tenant-root", "gpuclass.cozystack.io/devices", 1 } } },
  { "zero raw key with the class key granted: the raw cap refuses", "R5",
    { ["tenant-a"] = { ["requests." .. L40S] = "0", ["l40s.gpuclass.cozystack.io/devices"] = "4" } }, {}, { "tenant-a", "l40s", 1 },
    { { "tenant-a", "requests." .. L40S, 1 } } },
  -- quantities in every accepted form
  { "quantity 2k", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "2k" } }, {}, { "tenant-a", "l40s", 2000 }, true },
  { "quantity 2k, one over", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "2k" } }, {}, { "tenant-a", "l40s", 2001 },
    { { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
  { "quantity 1e3", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "1e3" } }, {}, { "tenant-a", "l40s", 1000 }, true },
  { "quantity as a JSON integer", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = 3 } }, {}, { "tenant-a", "l40s", 4 },
    { { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
  { "quantity 4000m is 4", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "4000m" } }, {}, { "tenant-a", "l40s", 4 }, true },
  { "quantity 1Ki is 1024", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "1Ki" } }, {}, { "tenant-a", "l40s", 1025 },
    { { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
  { "a fraction of a GPU is refused, naming the quota", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "1500m" } }, {}, { "tenant-a", "l40s", 1 },
    { { "tenant-a", "quantity" } } },
  -- a quota written huge means "no limit" (k8s.io/apimachinery
  -- ParseQuantity caps "8Ei" at 2^63-1; decimal values beyond int64 compare
  -- as larger than any count: decision 0013)
  { "quantity 8Ei is no limit", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "8Ei" } },
    { claim("tenant-a", "l40s", 7) }, { "tenant-a", "l40s", 1000000 }, true },
  { "quantity 100Ei at the root is no limit", "quantity", { ["tenant-root"] = { ["gpuclass.cozystack.io/devices"] = "100Ei" } },
    { claim("tenant-a", "l40s", 7) }, { "tenant-a-b", "a100", 1000000 }, true },
  { "quantity 1e100 is no limit", "quantity", { ["tenant-a"] = { ["l40s.gpuclass.cozystack.io/devices"] = "1e100" } },
    { claim("tenant-a", "l40s", 7) }, { "tenant-a", "l40s", 1000000 }, true },
  { "quantity 1E (10^18) is exact", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "1E" } },
    { claim("tenant-a", "l40s", 7) }, { "tenant-a", "l40s", 1000000000000000000 - 7 }, true },
  { "quantity 1E (10^18), one over", "quantity", { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "1E" } },
    { claim("tenant-a", "l40s", 7) }, { "tenant-a", "l40s", 1000000000000000000 - 6 },
    { { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
  { "an order of 2^63-1 over a small budget with usage is refused (no wrap-around)", "quantity",
    { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "10" } },
    { claim("tenant-a", "l40s", 7) }, { "tenant-a", "l40s", math.maxinteger },
    { { "tenant-a", "gpuclass.cozystack.io/devices", math.maxinteger - 3 } } },
  { "two quotas: the smaller wins", "R1", { ["tenant-a"] = { { ["gpuclass.cozystack.io/devices"] = "5" }, { ["gpuclass.cozystack.io/devices"] = "2" } } }, {}, { "tenant-a", "l40s", 3 },
    { { "tenant-a", "gpuclass.cozystack.io/devices", 1 } } },
}

-- vGPU entitlement over the same tree (DESIGN.md §5 "vGPU entitlement",
-- rule E): the label gpu.cozystack.io/vgpu=true holds only where every
-- ancestor has it too. {name, labelled tenants, namespace, entitled,
-- the tenant the refusal names}
local tenant = require "cozygpu.tenant"
local ENTITLEMENT = {
  { "every level labelled", { "tenant-root", "tenant-a", "tenant-a-b" }, "tenant-a-b", true },
  { "missing on the middle tenant", { "tenant-root", "tenant-a-b" }, "tenant-a-b", false, "tenant-a" },
  { "missing on the root", { "tenant-a", "tenant-a-b" }, "tenant-a-b", false, "tenant-root" },
  { "missing on the namespace itself", { "tenant-root", "tenant-a" }, "tenant-a-b", false, "tenant-a-b" },
  { "a child's label does not entitle its parent", { "tenant-root", "tenant-a-b" }, "tenant-a", false, "tenant-a" },
  { "the root alone", { "tenant-root" }, "tenant-root", true },
}

describe("vGPU entitlement (DESIGN.md §5) over root > child > grandchild", function()
  for _, c in ipairs(ENTITLEMENT) do
    it("E: " .. c[1], function()
      local labelled = {}
      for _, t in ipairs(c[2]) do labelled[t] = true end
      local objs = {}
      for _, chain in ipairs { { "tenant-root" }, { "tenant-root", "tenant-a" }, { "tenant-root", "tenant-a", "tenant-a-b" } } do
        local name = chain[#chain]
        objs[#objs + 1] = H.tenant(chain, labelled[name] and { ["gpu.cozystack.io/vgpu"] = "true" } or nil)
      end
      local view = cluster.new(json.decode(json.encode(objs)), assert(H.core.config_from(json.object())))
      local ok, why = tenant.vgpu_entitled(view, c[3])
      assert.equal(c[4], ok, why)
      if not c[4] then assert.truthy(why:find('"' .. c[5] .. '"', 1, true), why) end
    end)
  end
end)

describe("cozygpu.budget (DESIGN.md §5) over root > child > grandchild", function()
  it("has at least 40 cases, each naming its rule", function()
    assert.is_true(#CASES >= 40)
    for _, c in ipairs(CASES) do assert.truthy(c[2]:match("^R%d$") or c[2] == "quantity", c[1]) end
  end)
  for _, c in ipairs(CASES) do
    it(("%s: %s"):format(c[2], c[1]), function()
      local ok, shorts = run { quotas = c[3], objects = c[4], order = c[5] }
      if c[6] == true then
        assert.is_true(ok, shorts and json.encode(shorts) or "")
        return
      end
      assert.is_false(ok)
      assert.equal(#c[6], #shorts, json.encode(shorts))
      for i, want in ipairs(c[6]) do
        assert.equal(want[1], shorts[i].tenant)
        if want[2] == "quantity" then
          assert.equal("quantity", shorts[i].rule)
          assert.truthy(shorts[i].message:find("ResourceQuota tenant-a/gpu: spec.hard[gpuclass.cozystack.io/devices]", 1, true), shorts[i].message)
        else
          assert.equal(want[2], shorts[i].key)
          assert.equal(want[3], shorts[i].short)
          -- the message says which tenant's which key, by how much
          assert.truthy(shorts[i].message:find(want[1], 1, true))
          assert.truthy(shorts[i].message:find(want[2], 1, true))
        end
      end
    end)
  end

  it("R1: checks the total key with the whole set a VM asks for", function()
    local objs = {}
    for _, o in ipairs(CLASSES) do objs[#objs + 1] = o end
    for _, o in ipairs(NAMESPACES) do objs[#objs + 1] = o end
    objs[#objs + 1] = quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "2", ["a100.gpuclass.cozystack.io/devices"] = "1" })
    local view = cluster.new(json.decode(json.encode(objs)), assert(H.core.config_from(json.object())))
    -- each alone fits; together 3 > 2
    assert.is_true((budget.check(view, "tenant-a", view:gpuclass("l40s"), 2)))
    assert.is_true((budget.check(view, "tenant-a", view:gpuclass("a100"), 1)))
    local ok, shorts = budget.check_set(view, "tenant-a",
      { { class = view:gpuclass("l40s"), count = 2 }, { class = view:gpuclass("a100"), count = 1 } })
    assert.is_false(ok)
    assert.equal(1, #shorts)
    assert.equal("gpuclass.cozystack.io/devices", shorts[1].key)
    assert.equal(1, shorts[1].short)
    -- the class key counts only its class's part of the set
    ok, shorts = budget.check_set(view, "tenant-a", { { class = view:gpuclass("a100"), count = 2 } })
    assert.is_false(ok)
    assert.equal("a100.gpuclass.cozystack.io/devices", shorts[1].key)
  end)

  local function view_of(extra)
    local objs = {}
    for _, o in ipairs(CLASSES) do objs[#objs + 1] = o end
    for _, o in ipairs(NAMESPACES) do objs[#objs + 1] = o end
    objs[#objs + 1] = kubevirt()
    for _, o in ipairs(extra) do objs[#objs + 1] = o end
    return cluster.new(json.decode(json.encode(objs)), assert(H.core.config_from(json.object())))
  end

  it("R4/R5: a raw key does not block a raw-name order, it caps it", function()
    local view = view_of { quota("tenant-root", { ["requests." .. L40S] = "2" }), raw_vmi("tenant-b", L40S, 1) }
    -- a VMI without the class reference asking for one L40S: raw order
    local ok = budget.check_set(view, "tenant-a-b", { { class = view:gpuclass("l40s"), count = 1 } }, { raw = true })
    assert.is_true(ok)
    local ok2, shorts = budget.check_set(view, "tenant-a-b", { { class = view:gpuclass("l40s"), count = 2 } }, { raw = true })
    assert.is_false(ok2)
    assert.equal("requests." .. L40S, shorts[1].key)
    assert.equal("R5", shorts[1].rule)
    assert.equal(1, shorts[1].short)
  end)

  it("R5: a raw key on a name no class carries caps raw-name VMs", function()
    local H100 = "nvidia.com/GH100_H100_PCIE"
    local view = view_of { quota("tenant-root", { ["requests." .. H100] = "1" }), raw_vmi("tenant-b", H100, 1) }
    local ok, shorts = budget.check_set(view, "tenant-a-b", { { rn = H100, count = 1 } }, { raw = true })
    assert.is_false(ok)
    assert.equal("requests." .. H100, shorts[1].key)
    -- the VM using it is tenant-b's, which tenant-a-b's users cannot read:
    -- counted, not named (decision 0036, item 4)
    assert.truthy(shorts[1].message:find("is 1, 1 in use elsewhere in the tenant tree; 1 more is short by 1", 1, true), shorts[1].message)
    assert.is_nil(shorts[1].message:find("tenant-b/", 1, true), shorts[1].message)
    -- and named to tenant-b's own users
    local ok_b, shorts_b = budget.check_set(view, "tenant-b", { { rn = H100, count = 1 } }, { raw = true })
    assert.is_false(ok_b)
    assert.truthy(shorts_b[1].message:find("VirtualMachineInstance tenant-b/raw-tenant-b-1 (1)", 1, true), shorts_b[1].message)
  end)

  it("a namespace with a tenant label but outside the root's tree is not a tenant", function()
    local rogue = H.namespace("rogue", { ["tenant.cozystack.io/rogue"] = "" })
    local view = view_of { rogue, quota("rogue", { ["gpuclass.cozystack.io/devices"] = "0" }) }
    assert.is_true((budget.check(view, "rogue", view:gpuclass("l40s"), 1)))
  end)

  it("names what is using the budget", function()
    local ok, shorts = run { quotas = { ["tenant-a"] = { ["gpuclass.cozystack.io/devices"] = "3" } },
      objects = { claim("tenant-a-b", "a100", 2, "Lost", "old-claim"), claim("tenant-a", "l40s", 1, "Bound", "web") },
      order = { "tenant-a", "l40s", 1 } }
    assert.is_false(ok)
    assert.truthy(shorts[1].message:find("GPUClaim tenant-a-b/old-claim (2)", 1, true), shorts[1].message)
    assert.truthy(shorts[1].message:find("GPUClaim tenant-a/web (1)", 1, true), shorts[1].message)
    assert.truthy(shorts[1].message:find("short by 1", 1, true), shorts[1].message)
  end)

  -- usage is remembered per view (budget.lua's memo): the same view answers
  -- the same, a new snapshot's view counts anew, and one view's sums never
  -- leak into another's
  it("counts each view's own claims and VMIs, however often it is asked", function()
    local function view_with(objects)
      local objs = {}
      for _, o in ipairs(CLASSES) do objs[#objs + 1] = o end
      for _, o in ipairs(NAMESPACES) do objs[#objs + 1] = o end
      objs[#objs + 1] = kubevirt()
      objs[#objs + 1] = quota("tenant-a", { ["l40s.gpuclass.cozystack.io/devices"] = "2", ["requests." .. L40S] = "3" })
      for _, o in ipairs(objects) do objs[#objs + 1] = o end
      return cluster.new(json.decode(json.encode(objs)), assert(H.core.config_from(json.object())))
    end
    local one = view_with { claim("tenant-a", "l40s", 1, "Bound", "first") }
    local two = view_with { claim("tenant-a", "l40s", 1, "Bound", "first"), claim("tenant-a-b", "l40s", 1, "Bound", "second") }
    for _ = 1, 3 do
      assert.is_true((budget.check(one, "tenant-a", one:gpuclass("l40s"), 1)))
      local ok, shorts = budget.check(two, "tenant-a", two:gpuclass("l40s"), 1)
      assert.is_false(ok)
      assert.are.equal(2, shorts[1].used)
      assert.truthy(shorts[1].message:find("GPUClaim tenant-a-b/second (1)", 1, true), shorts[1].message)
    end
    -- the raw key with a running raw-name VMI: its entries count once, in
    -- the view that has it
    local three = view_with { claim("tenant-a", "l40s", 1, "Bound", "first"), raw_vmi("tenant-a", L40S, 2) }
    local ok, shorts = budget.check_set(three, "tenant-a", { { rn = L40S, count = 1 } }, { raw = true })
    assert.is_false(ok)
    assert.are.equal("R5", shorts[1].rule)
    assert.are.equal(3, shorts[1].used)
    assert.is_true((budget.check_set(one, "tenant-a", { { rn = L40S, count = 2 } }, { raw = true })))
  end)
end)
