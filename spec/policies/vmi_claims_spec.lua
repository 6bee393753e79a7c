-- A VMI naming its GPUClaims in gpu.cozystack.io/claims (policies/vmi-gpus.lua,
-- lua/cozygpu/claims.lua; DESIGN.md §3 "GPUClaim",
-- docs/decisions/0019).
--
-- The expected messages below are built from what the rule is about (the
-- claim's name, its class and count, the entries the VMI has), and the
-- codes from decision 0001 (422 for a malformed annotation, an invalid
-- object) and 0019 (403 for what the claims' state refuses, 409 for a
-- claim another live VMI holds).
local json = H.json

local L40S, L40S_24C, A100_40C, CX7 = "nvidia.com/AD102GL_L40S", "nvidia.com/L40S-24C", "nvidia.com/A100-40C", "nvidia.com/cx7_vf"
local ANN = "gpu.cozystack.io/claims"
local FIELD = "metadata.annotations[gpu.cozystack.io/claims]"

local function claim(name, class, count, o)
  o = o or {}
  local c = {
    apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
    metadata = { name = name, namespace = o.namespace or "tenant-a" },
    spec = { class = class, count = count },
  }
  if o.deleting then
    c.metadata.deletionTimestamp = "2026-11-30T00:00:00Z"
    c.metadata.finalizers = json.array { "gpu.cozystack.io/claims" }
  end
  if o.phase then c.status = { phase = o.phase, node = o.node, attachedTo = o.attachedTo } end
  return c
end

-- a VMI already in the cluster: name, namespace, claims annotation, phase
local function running(name, claims_value, o)
  o = o or {}
  local v = H.vmi { name = name, namespace = o.namespace, gpus = o.gpus or { L40S } }
  v.metadata.annotations = { [ANN] = claims_value }
  v.status = { phase = o.phase or "Running" }
  if o.deleting then v.metadata.deletionTimestamp = "2026-11-30T00:00:00Z" end
  return v
end

local function snapshot(extra)
  local objs = {
    H.class("l40s", { mode = "Passthrough", model = "L40S", resourceName = L40S }),
    H.class("l40s-24c", { mode = "VGPU", model = "L40S", profile = "L40S-24C", resourceName = L40S_24C, maxCount = 2 }),
    H.class("a100-40c", { mode = "VGPU", model = "A100", profile = "A100-40C", resourceName = A100_40C }),
    H.kubevirt({ { "10DE:26B9", L40S }, { "10DE:26B9", L40S_24C }, { "15B3:101E", CX7 } }, { { "NVIDIA A100-40C", A100_40C } }),
    H.tenant({ "tenant-root" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
    H.tenant({ "tenant-root", "tenant-a" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
    H.tenant({ "tenant-root", "tenant-b" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
    claim("train", "l40s", 2),
    claim("solo", "l40s", 1),
    claim("vgpu", "l40s-24c", 1),
    claim("vgpu2", "l40s-24c", 1),
  }
  for _, o in ipairs(extra or {}) do objs[#objs + 1] = o end
  return objs
end

local e
before_each(function() e = H.engine(snapshot()) end)

-- A VMI of tenant-a naming `value`, with the class-reference label.
local function vmi(value, o)
  o = o or {}
  local v = H.vmi { name = o.name or "vm1", namespace = o.namespace, gpus = o.gpus, hostDevices = o.hostDevices,
    resources = o.resources, labels = o.labels or { ["gpu.cozystack.io/class-reference"] = "true" } }
  if value ~= nil then v.metadata.annotations = { [ANN] = value } end
  return v
end

local function review(object)
  -- each case twice on one engine: a policy keeping state (the holders
  -- index is memoized per view) would answer differently
  local first = assert(e:review(H.request(object)))
  local second = assert(e:review(H.request(object)))
  assert.are.same(first, second)
  return first
end

-- the refusal messages, one per denial, without their field prefixes
local function causes(resp)
  local out = {}
  for i, c in ipairs(resp.status.details.causes) do out[i] = c.message:gsub(" %(gpu/vmi%-entries%)$", "") end
  return out
end

local function refused(resp, code, messages)
  assert.is_false(resp.allowed)
  assert.are.equal(code, resp.status.code, resp.status.message)
  assert.are.same(messages, causes(resp))
end

describe("a VMI naming GPUClaims: the annotation's syntax (decision 0019)", function()
  it("allows a VMI whose entries match the claims it names", function()
    local resp = review(vmi("train", { gpus = { L40S, L40S } }))
    assert.is_true(resp.allowed, resp.status and resp.status.message)
    -- two claims of one class add up: 2 + 1 entries of l40s
    assert.is_true(review(vmi("train,solo", { gpus = { L40S, L40S, L40S } })).allowed)
  end)

  it("trims ASCII whitespace around each name, as Multus does for its network list", function()
    assert.is_true(review(vmi(" train ,\tsolo\n", { gpus = { L40S, L40S, L40S } })).allowed)
  end)

  it("refuses an empty value, empty items, duplicates and non-DNS-1123 names with 422, naming each", function()
    refused(review(vmi("", { gpus = { L40S } })), 422, { "is empty: name at least one GPUClaim, or remove the annotation" })
    refused(review(vmi("  ", { gpus = { L40S } })), 422, { "is empty: name at least one GPUClaim, or remove the annotation" })
    refused(review(vmi("train,,solo", { gpus = { L40S, L40S, L40S } })), 422,
      { "item 2 is empty: GPUClaim names are separated by single commas" })
    refused(review(vmi("train,", { gpus = { L40S, L40S } })), 422,
      { "item 2 is empty: GPUClaim names are separated by single commas" })
    refused(review(vmi("train, train", { gpus = { L40S, L40S } })), 422, { '"train" is named twice' })
    local resp = review(vmi("Train,my claim,-x", { gpus = { L40S, L40S } }))
    assert.is_false(resp.allowed)
    assert.are.equal(422, resp.status.code)
    local c = causes(resp)
    assert.are.equal(3, #c)
    assert.truthy(c[1]:find('"Train" is not a GPUClaim name: must consist of lower case alphanumeric', 1, true), c[1])
    assert.truthy(c[2]:find('"my claim" is not a GPUClaim name', 1, true), c[2])
    assert.truthy(c[3]:find('"-x" is not a GPUClaim name', 1, true), c[3])
    -- every refusal points at the annotation
    for _, cause in ipairs(resp.status.details.causes) do assert.are.equal(FIELD, cause.field) end
    -- a name of 254 characters is too long for metadata.name
    resp = review(vmi(("a"):rep(254), { gpus = { L40S } }))
    assert.are.equal(422, resp.status.code)
    assert.truthy(causes(resp)[1]:find("must be 1 to 253 characters", 1, true))
  end)

  it("judges nothing else of the claims when the annotation is malformed (a partial list would mislead)", function()
    -- "nope" does not exist, but the duplicate is the refusal
    refused(review(vmi("nope,nope", { gpus = { L40S } })), 422, { '"nope" is named twice' })
  end)

  it("keeps a long run of blanks cheap (linear trimming, no budget failure)", function()
    local resp = review(vmi(("train" .. (" "):rep(100000)), { gpus = { L40S, L40S } }))
    assert.is_true(resp.allowed, resp.status and resp.status.message)
    -- blanks only, and blanks before a name, are linear too
    resp = review(vmi((" "):rep(100000) .. "," .. (" "):rep(100000) .. "train", { gpus = { L40S, L40S } }))
    assert.are.equal(422, resp.status.code)
    assert.are.same({ "item 1 is empty: GPUClaim names are separated by single commas" }, causes(resp))
  end)

  it("lists 15 problems of a huge annotation and counts the rest (the answer stays small)", function()
    -- 100,000 commas: 100,001 empty items; listing each made a 30 MB answer
    local resp = review(vmi((","):rep(100000), { gpus = { L40S } }))
    assert.are.equal(422, resp.status.code)
    local c = causes(resp)
    assert.are.equal(16, #c)
    assert.are.equal("item 15 is empty: GPUClaim names are separated by single commas", c[15])
    assert.are.equal("and 99986 more problems", c[16])
    assert.is_true(#H.json.encode(resp) < 8192)
  end)
end)

describe("a VMI naming GPUClaims: the claims (DESIGN.md §3)", function()
  it("refuses a claim that does not exist in the VMI's namespace, never reading another tenant's", function()
    -- tenant-b has a claim "elsewhere"; tenant-a does not
    e = H.engine(snapshot { claim("elsewhere", "l40s", 1, { namespace = "tenant-b" }) })
    local resp = review(vmi("elsewhere", { gpus = { L40S } }))
    refused(resp, 403, { 'GPUClaim "elsewhere" does not exist in namespace "tenant-a"' })
    assert.is_nil(resp.status.message:find("tenant-b", 1, true))
    assert.are.equal(FIELD .. ': GPUClaim "elsewhere" does not exist in namespace "tenant-a"', resp.status.message)
    -- the same VMI in tenant-b uses it
    assert.is_true(review(vmi("elsewhere", { namespace = "tenant-b", gpus = { L40S } })).allowed)
  end)

  it("refuses a claim being deleted", function()
    e = H.engine(snapshot { claim("dying", "l40s", 1, { deleting = true }) })
    refused(review(vmi("dying", { gpus = { L40S } })), 403, { 'GPUClaim "dying" is being deleted' })
  end)

  it("refuses a claim of another class than the VMI's entries, naming claim and classes", function()
    refused(review(vmi("vgpu", { gpus = { L40S } })), 403, {
      'GPUClaim "vgpu" is of class "l40s-24c", but the VMI has no GPU entry of that class (its GPU entries are of class "l40s")',
      '1 GPU entry of class "l40s", but none of the named GPUClaims ("vgpu") is of that class',
    })
  end)

  it("refuses claims and no GPU entries at all", function()
    refused(review(vmi("solo", {})), 403,
      { 'GPUClaim "solo" is of class "l40s", but the VMI has no GPU entry of that class (it has no GPU entry of any class)' })
    -- a NIC VF is not a GPU entry
    refused(review(vmi("solo", { hostDevices = { CX7 } })), 403,
      { 'GPUClaim "solo" is of class "l40s", but the VMI has no GPU entry of that class (it has no GPU entry of any class)' })
  end)

  it("refuses entries that are not one per claimed GPU, class by class", function()
    -- train holds 2 L40S: one entry is too few, three too many
    refused(review(vmi("train", { gpus = { L40S } })), 403,
      { 'class "l40s": GPUClaim "train" holds 2 GPUs, the VMI has 1 GPU entry of that class; it needs one entry per claimed GPU' })
    refused(review(vmi("train", { gpus = { L40S, L40S }, hostDevices = { L40S } })), 403,
      { 'class "l40s": GPUClaim "train" holds 2 GPUs, the VMI has 3 GPU entries of that class; it needs one entry per claimed GPU' })
    -- entries in spec.domain.resources count by their quantity
    assert.is_true(review(vmi("train", { resources = { [L40S] = "2" } })).allowed)
    -- two claims of one class: 2 + 1 = 3 wanted
    refused(review(vmi("train,solo", { gpus = { L40S, L40S } })), 403,
      { 'class "l40s": GPUClaims "train", "solo" hold 3 GPUs, the VMI has 2 GPU entries of that class; it needs one entry per claimed GPU' })
  end)

  it("refuses an entry of a class none of the named claims is of (decision 0019)", function()
    refused(review(vmi("solo", { gpus = { L40S, A100_40C } })), 403,
      { '1 GPU entry of class "a100-40c", but none of the named GPUClaims ("solo") is of that class' })
    -- with a claim for each class, the same VMI is allowed
    e = H.engine(snapshot { claim("a100", "a100-40c", 1) })
    assert.is_true(review(vmi("solo,a100", { gpus = { L40S, A100_40C } })).allowed)
  end)

  it("refuses a GPU entry no class carries, with or without the class-reference label", function()
    local nolabel = vmi("solo", { gpus = { L40S }, labels = json.object() })
    nolabel.spec.domain.devices.hostDevices = json.array { { name = "p40", deviceName = "nvidia.com/GP102GL_Tesla_P40" } }
    local objs = snapshot()
    objs[4] = H.kubevirt({ { "10DE:26B9", L40S }, { "10DE:1B38", "nvidia.com/GP102GL_Tesla_P40" } })
    e = H.engine(objs)
    refused(review(nolabel), 403, {
      'no GPUClass has resource name "nvidia.com/GP102GL_Tesla_P40"; a VMI that names GPUClaims (gpu.cozystack.io/claims) takes every GPU from them',
    })
    -- without the annotation the same VMI orders by raw name and is allowed
    nolabel.metadata.annotations = nil
    assert.is_true(review(nolabel).allowed)
  end)

  it("refuses a DRA GPU entry next to named claims", function()
    local v = vmi("solo", { gpus = { L40S }, labels = json.object() })
    v.spec.domain.devices.gpus[2] = { name = "dra", claimName = "gpu-claim" }
    refused(review(v), 403,
      { "a DRA GPU entry (claimName) cannot take its GPU from the GPUClaims named in gpu.cozystack.io/claims" })
  end)

  it("refuses a claim whose spec is unusable, and does not count entries against it", function()
    local broken = claim("broken", "l40s", 0)
    e = H.engine(snapshot { broken })
    refused(review(vmi("broken", { gpus = { L40S } })), 403, { 'GPUClaim "broken" has no valid spec.class and spec.count' })
  end)

  it("names every missing claim and skips the per-class count, which a missing claim would make wrong", function()
    refused(review(vmi("nope,solo,gone", { gpus = { L40S } })), 403, {
      'GPUClaim "nope" does not exist in namespace "tenant-a"',
      'GPUClaim "gone" does not exist in namespace "tenant-a"',
    })
  end)
end)

describe("a VMI naming GPUClaims: held by another live VMI", function()
  it("refuses with 409 a claim attached to another VMI that is not final", function()
    e = H.engine(snapshot {
      claim("held", "l40s", 1, { phase = "Attached", node = "gpu-1", attachedTo = "other" }),
      running("other", "held"),
    })
    refused(review(vmi("held", { gpus = { L40S } })), 409,
      { 'GPUClaim "held" is attached to VirtualMachineInstance "other", which is not final; it can be used once that VMI has stopped' })
  end)

  it("keeps refusing while the attached VMI only has a deletion timestamp (DESIGN.md §6)", function()
    e = H.engine(snapshot {
      claim("held", "l40s", 1, { phase = "Attached", node = "gpu-1", attachedTo = "other" }),
      running("other", "held", { deleting = true }),
    })
    refused(review(vmi("held", { gpus = { L40S } })), 409,
      { 'GPUClaim "held" is attached to VirtualMachineInstance "other", which is not final; it can be used once that VMI has stopped' })
  end)

  it("allows a claim whose attached VMI is final or gone (the binder's release is due)", function()
    for _, phase in ipairs { "Succeeded", "Failed" } do
      e = H.engine(snapshot {
        claim("held", "l40s", 1, { phase = "Attached", node = "gpu-1", attachedTo = "other" }),
        running("other", "held", { phase = phase }),
      })
      assert.is_true(review(vmi("held", { gpus = { L40S } })).allowed, phase)
    end
    e = H.engine(snapshot { claim("held", "l40s", 1, { phase = "Attached", node = "gpu-1", attachedTo = "other" }) })
    assert.is_true(review(vmi("held", { gpus = { L40S } })).allowed)
  end)

  it("allows the VMI a claim is still recorded as attached to (a restart: same name, the old one is gone)", function()
    e = H.engine(snapshot { claim("held", "l40s", 1, { phase = "Attached", node = "gpu-1", attachedTo = "vm1" }) })
    assert.is_true(review(vmi("held", { name = "vm1", gpus = { L40S } })).allowed)
    -- even while a lagging view still shows the previous vm1 running: names
    -- are unique, so the VMI being created is its successor
    e = H.engine(snapshot {
      claim("held", "l40s", 1, { phase = "Attached", node = "gpu-1", attachedTo = "vm1" }),
      running("vm1", "held", { deleting = true }),
    })
    assert.is_true(review(vmi("held", { name = "vm1", gpus = { L40S } })).allowed)
    -- the same view refuses any other VMI naming the claim
    assert.are.equal(409, review(vmi("held", { name = "vm2", gpus = { L40S } })).status.code)
  end)

  it("refuses with 409 a claim another live VMI of the namespace names, and not one a final or deleted VMI names", function()
    e = H.engine(snapshot { running("other", "solo", { phase = "Scheduling" }) })
    refused(review(vmi("solo", { gpus = { L40S } })), 409,
      { 'GPUClaim "solo" is named by VirtualMachineInstance "other", which is not final; it can be used once that VMI has stopped' })
    -- a VMI with no status yet (just created) is not final either
    local fresh = running("other", "solo")
    fresh.status = nil
    e = H.engine(snapshot { fresh })
    assert.are.equal(409, review(vmi("solo", { gpus = { L40S } })).status.code)
    for _, o in ipairs { { phase = "Succeeded" }, { phase = "Failed" }, { deleting = true } } do
      e = H.engine(snapshot { running("other", "solo", o) })
      assert.is_true(review(vmi("solo", { gpus = { L40S } })).allowed, json.encode(o))
    end
    -- a VMI of another namespace naming a claim of the same name is another tenant's business
    e = H.engine(snapshot { running("other", "solo", { namespace = "tenant-b" }) })
    assert.is_true(review(vmi("solo", { gpus = { L40S } })).allowed)
    -- the annotation of the other VMI is read with the same syntax
    e = H.engine(snapshot { running("other", "train , solo") })
    assert.are.equal(409, review(vmi("solo", { gpus = { L40S } })).status.code)
  end)

  it("puts the 409 last, so a refusal a retry cannot cure decides the code", function()
    e = H.engine(snapshot {
      claim("held", "l40s", 1, { phase = "Attached", node = "gpu-1", attachedTo = "other" }),
      running("other", "held"),
    })
    refused(review(vmi("held,nope", { gpus = { L40S } })), 403, {
      'GPUClaim "nope" does not exist in namespace "tenant-a"',
      'GPUClaim "held" is attached to VirtualMachineInstance "other", which is not final; it can be used once that VMI has stopped',
    })
  end)
end)

describe("a VMI naming GPUClaims: the other VMI rules", function()
  local function quota(ns, hard)
    return { apiVersion = "v1", kind = "ResourceQuota", metadata = { name = "gpu", namespace = ns }, spec = { hard = hard } }
  end

  it("does not count the claimed GPUs against the budget a second time (§5 R6: the claims count)", function()
    -- tenant-a's budget for l40s is 3; its claims train (2) and solo (1) use all of it
    e = H.engine(snapshot { quota("tenant-a", { ["l40s.gpuclass.cozystack.io/devices"] = "3" }) })
    assert.is_true(review(vmi("train,solo", { gpus = { L40S, L40S, L40S } })).allowed)
    -- the same VMI without the annotation would be a new order of 3 over it
    local resp = review(vmi(nil, { gpus = { L40S, L40S, L40S } }))
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find("3 more is short by 3", 1, true), resp.status.message)
  end)

  it("lets a class being deleted serve the claims a VMI names (DESIGN.md §6), and refuses new orders of it", function()
    local objs = snapshot()
    objs[1].metadata.deletionTimestamp = "2026-11-30T00:00:00Z"
    e = H.engine(objs)
    assert.is_true(review(vmi("solo", { gpus = { L40S } })).allowed)
    refused(review(vmi(nil, { gpus = { L40S } })), 403, { 'GPUClass "l40s" is being deleted' })
  end)

  it("still applies maxCount and the vGPU entitlement", function()
    -- two claims of l40s-24c (1 each) add up over nothing, but three entries exceed maxCount 2
    e = H.engine(snapshot { claim("vgpu3", "l40s-24c", 1) })
    local resp = review(vmi("vgpu,vgpu2,vgpu3", { gpus = { L40S_24C, L40S_24C, L40S_24C } }))
    refused(resp, 403, { '3 GPUs of class "l40s-24c", more than its maxCount 2' })
    local objs = snapshot { claim("vgpu", "l40s-24c", 1, { namespace = "tenant-b" }) }
    objs[7] = H.tenant({ "tenant-root", "tenant-b" })
    e = H.engine(objs)
    resp = review(vmi("vgpu", { namespace = "tenant-b", gpus = { L40S_24C } }))
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find('namespace "tenant-b" is not entitled to vGPU', 1, true), resp.status.message)
  end)

  it("leaves a VMI with neither GPU entries nor the annotation alone", function()
    local resp = review(vmi(nil, {}))
    assert.is_true(resp.allowed)
    assert.is_nil(resp.warnings)
  end)

  it("records the classes of a VMI that names claims, as of any other (gpu/vmi-record)", function()
    local resp = review(vmi("train", { gpus = { L40S, L40S } }))
    local p = H.patch_of(resp)
    assert.are.same({ op = "add", path = "/metadata/annotations/gpu.cozystack.io~1classes", value = "l40s=2" }, p[1])
  end)
end)

describe("cozygpu.claims", function()
  local claims = require "cozygpu.claims"

  it("parses names in order, each once, with the problems apart", function()
    local names, problems = claims.parse("a, b.c ,a,,X")
    assert.are.same({ "a", "b.c" }, names)
    assert.are.same({ '"a" is named twice', "item 4 is empty: GPUClaim names are separated by single commas",
      '"X" is not a GPUClaim name: must consist of lower case alphanumeric characters, \'-\' or \'.\', and must start and end with an alphanumeric character' },
      problems)
    names, problems = claims.parse(7)
    assert.are.same({}, names)
    assert.are.same({ "must be a string of comma-separated GPUClaim names" }, problems)
  end)

  it("reads a VMI's annotation: nil without it", function()
    assert.is_nil(claims.of(H.vmi {}))
    assert.are.same({ "x" }, (claims.of(running("v", "x"))))
  end)

  it("calls a VMI final only in Succeeded or Failed", function()
    assert.is_true(claims.final(running("v", "x", { phase = "Succeeded" })))
    assert.is_true(claims.final(running("v", "x", { phase = "Failed" })))
    for _, p in ipairs { "Pending", "Scheduling", "Scheduled", "Running", "Unknown" } do
      assert.is_false(claims.final(running("v", "x", { phase = p })), p)
    end
    assert.is_false(claims.final(running("v", "x", { deleting = true })))
  end)
end)
