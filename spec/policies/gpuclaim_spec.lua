-- GPUClaim create/update (policies/gpuclaim.lua; DESIGN.md §4 "GPUClaim
-- create/update", §5).
local json = H.json

local L40S, L40S_24C = "nvidia.com/AD102GL_L40S", "nvidia.com/L40S-24C"

local function claim(ns, class, count, name)
  return {
    apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
    metadata = { name = name or "c1", namespace = ns }, spec = { class = class, count = count },
  }
end

local function quota(ns, hard)
  return { apiVersion = "v1", kind = "ResourceQuota", metadata = { name = "gpu", namespace = ns }, spec = { hard = hard } }
end

local function snapshot(extra)
  local deleting = H.class("old", { mode = "Passthrough", model = "L40S", resourceName = "nvidia.com/OLD" })
  deleting.metadata.deletionTimestamp = "2026-11-30T00:00:00Z"
  deleting.metadata.finalizers = json.array { "gpu.cozystack.io/claims" }
  local objs = {
    H.class("l40s", { mode = "Passthrough", model = "L40S", resourceName = L40S, maxCount = 4 }),
    H.class("l40s-24c", { mode = "VGPU", model = "L40S", profile = "L40S-24C", resourceName = L40S_24C, maxCount = 2 }),
    deleting,
    H.tenant({ "tenant-root" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
    H.tenant({ "tenant-root", "tenant-a" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
    H.tenant({ "tenant-root", "tenant-a", "tenant-a-b" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
    -- the middle tenant is not entitled: its child's own label does not help
    H.tenant({ "tenant-root", "tenant-b" }),
    H.tenant({ "tenant-root", "tenant-b", "tenant-b-c" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
  }
  for _, o in ipairs(extra or {}) do objs[#objs + 1] = o end
  return objs
end

local function review(objs, obj, op, old)
  local e = H.engine(snapshot(objs))
  local first = assert(e:review(H.request(obj, op, old), "validating"))
  local second = assert(e:review(H.request(obj, op, old), "validating"))
  assert.are.same(first, second)
  return first
end

describe("GPUClaim admission", function()
  it("allows a claim of a known class within maxCount and budget", function()
    local r = review({ quota("tenant-a", { ["l40s.gpuclass.cozystack.io/devices"] = "4" }) }, claim("tenant-a-b", "l40s", 4))
    assert.is_true(r.allowed)
  end)

  it("refuses an unknown class", function()
    local r = review({}, claim("tenant-a", "h100", 1))
    assert.is_false(r.allowed)
    assert.equal(403, r.status.code)
    assert.equal('spec.class: unknown GPU class "h100"', r.status.message)
  end)

  it("refuses a class being deleted", function()
    local r = review({}, claim("tenant-a", "old", 1))
    assert.is_false(r.allowed)
    assert.equal('spec.class: GPUClass "old" is being deleted', r.status.message)
  end)

  it("refuses more than the class's maxCount", function()
    local r = review({}, claim("tenant-a", "l40s", 5))
    assert.is_false(r.allowed)
    assert.equal('spec.count: 5 GPUs of class "l40s", more than its maxCount 4', r.status.message)
  end)

  it("refuses a vGPU class where a middle tenant is not entitled", function()
    local r = review({}, claim("tenant-b-c", "l40s-24c", 1))
    assert.is_false(r.allowed)
    assert.truthy(r.status.message:find('its ancestor "tenant-b" lacks the label gpu.cozystack.io/vgpu=true', 1, true), r.status.message)
    assert.is_true(review({}, claim("tenant-a-b", "l40s-24c", 1)).allowed)
  end)

  it("refuses an order over a budget, saying which tenant's key, by how much and what uses it", function()
    local used = claim("tenant-a-b", "l40s", 3, "held")
    used.status = { phase = "Lost" }
    local r = review({ quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "4" }), used }, claim("tenant-a", "l40s", 2))
    assert.is_false(r.allowed)
    assert.equal(403, r.status.code)
    assert.equal('spec.count: tenant "tenant-a": gpuclass.cozystack.io/devices is 4, 3 in use by GPUClaim tenant-a-b/held (3); 2 more is short by 1',
      r.status.message)
  end)

  -- decision 0036, item 4: a budget shared with an ancestor or a sibling
  -- names only what the ordering namespace's users may read (their own
  -- namespace and those below it)
  it("names no object of an ancestor or a sibling in a refusal: counts them", function()
    local mine = claim("tenant-a-b", "l40s", 1, "mine")
    mine.status = { phase = "Bound" }
    local theirs = claim("tenant-a", "l40s", 2, "theirs")
    theirs.status = { phase = "Bound" }
    local r = review({ quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "3" }), mine, theirs }, claim("tenant-a-b", "l40s", 1))
    assert.is_false(r.allowed)
    assert.equal('spec.count: tenant "tenant-a": gpuclass.cozystack.io/devices is 3, 3 in use by GPUClaim tenant-a-b/mine (1), and 2 elsewhere in the tenant tree; 1 more is short by 1',
      r.status.message)
    r = review({ quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "2" }), theirs }, claim("tenant-a-b", "l40s", 1))
    assert.equal('spec.count: tenant "tenant-a": gpuclass.cozystack.io/devices is 2, 2 in use elsewhere in the tenant tree; 1 more is short by 1',
      r.status.message)
  end)

  -- decision 0036, item 4: a running VMI's class GPUs are its claims' units
  it("counts a running VMI's GPUs once: the claims it names, not the VMI beside them", function()
    local held = claim("tenant-a", "l40s", 1, "held")
    held.status = { phase = "Attached", node = "gpu-1" }
    local vmi = H.vmi { gpus = { "nvidia.com/AD102GL_L40S" } }
    vmi.metadata.annotations = { ["gpu.cozystack.io/claims"] = "held" }
    vmi.status = { phase = "Running", nodeName = "gpu-1" }
    local q = quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "2" })
    assert.is_true(review({ q, held, vmi }, claim("tenant-a", "l40s", 1)).allowed)
    local r = review({ q, held, vmi }, claim("tenant-a", "l40s", 2))
    assert.equal('spec.count: tenant "tenant-a": gpuclass.cozystack.io/devices is 2, 1 in use by GPUClaim tenant-a/held (1); 2 more is short by 1',
      r.status.message)
    -- the same VMI without the annotation runs a raw-name GPU: it counts
    vmi.metadata.annotations = nil
    r = review({ q, held, vmi }, claim("tenant-a", "l40s", 1))
    assert.is_false(r.allowed)
  end)

  it("refuses a change of spec on update, and allows status and label changes", function()
    local old = claim("tenant-a", "l40s", 1)
    local new = json.decode(json.encode(old))
    new.spec.count = 2
    local r = review({}, new, "UPDATE", old)
    assert.is_false(r.allowed)
    assert.equal(422, r.status.code)
    assert.equal("spec: spec is immutable; create a new GPUClaim instead", r.status.message)
    local relabelled = json.decode(json.encode(old))
    relabelled.metadata.labels = { team = "x" }
    relabelled.status = { phase = "Bound", node = "gpu-1" }
    assert.is_true(review({}, relabelled, "UPDATE", old).allowed)
  end)

  it("refuses a claim with no class or a count below one as invalid", function()
    local r = review({}, claim("tenant-a", "", 1))
    assert.equal(422, r.status.code)
    r = review({}, claim("tenant-a", "l40s", 0))
    assert.equal(422, r.status.code)
    assert.equal("spec.count: must be a whole number of GPUs, at least 1", r.status.message)
  end)
end)
