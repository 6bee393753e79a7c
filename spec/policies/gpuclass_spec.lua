-- GPUClass validation (policies/gpuclass.lua): the tolerations rule of
-- DESIGN.md §3 follows Kubernetes pod validation (ValidateTolerations).
local json = H.json

local function class(tolerations, extra)
  local spec = { mode = "Passthrough", model = "L40S", resourceName = "nvidia.com/AD102GL_L40S", tolerations = json.array(tolerations or {}) }
  for k, v in pairs(extra or {}) do spec[k] = v end
  return H.class("l40s", spec)
end

local e
before_each(function() e = H.engine({}) end)

local function review(obj, op, old)
  return assert(e:review(H.request(obj, op, old)))
end

describe("GPUClass tolerations", function()
  local cases = {
    { "operator Gt", { key = "gpu.cozystack.io/gen", operator = "Gt", value = "3" },
      'spec.tolerations[0].operator: Unsupported value: "Gt": supported values: "Equal", "Exists"' },
    { "operator Lt", { key = "k", operator = "Lt", value = "3" }, 'spec.tolerations[0].operator: Unsupported value: "Lt"' },
    { "Exists with a value", { key = "gpu.cozystack.io/mode", operator = "Exists", value = "vgpu" },
      "spec.tolerations[0].operator: value must be empty when `operator` is 'Exists'" },
    { "tolerationSeconds without NoExecute", { key = "k", operator = "Exists", effect = "NoSchedule", tolerationSeconds = 30 },
      "spec.tolerations[0].effect: effect must be 'NoExecute' when `tolerationSeconds` is set" },
    { "tolerationSeconds with no effect", { key = "k", operator = "Exists", tolerationSeconds = 30 },
      "spec.tolerations[0].effect: effect must be 'NoExecute' when `tolerationSeconds` is set" },
    { "empty key with Equal", { operator = "Equal", value = "x" }, "spec.tolerations[0].operator: must be Exists when `key` is empty" },
    { "bad key", { key = "-bad key", operator = "Exists" }, "spec.tolerations[0].key: name part must consist of alphanumeric characters" },
    { "bad value", { key = "k", operator = "Equal", value = "not a label value!" }, "spec.tolerations[0].value: a valid label must be an empty string" },
    { "unknown effect", { key = "k", operator = "Exists", effect = "NoRun" }, 'spec.tolerations[0].effect: Unsupported value: "NoRun"' },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. c[1], function()
      local resp = review(class { c[2] })
      assert.is_false(resp.allowed)
      assert.are.equal(422, resp.status.code)
      assert.are.equal("Invalid", resp.status.reason)
      assert.are.equal(c[3], resp.status.message:sub(1, #c[3]))
    end)
  end

  local good = {
    { "Exists with a key", { key = "gpu.cozystack.io/mode", operator = "Exists" } },
    { "Exists without a key (all taints)", { operator = "Exists" } },
    { "Equal with a value and an effect", { key = "gpu.cozystack.io/mode", operator = "Equal", value = "vgpu", effect = "NoSchedule" } },
    { "empty operator (Equal)", { key = "k", value = "v" } },
    { "tolerationSeconds with NoExecute", { key = "node.kubernetes.io/unreachable", operator = "Exists", effect = "NoExecute", tolerationSeconds = 300 } },
  }
  for _, c in ipairs(good) do
    it("accepts " .. c[1], function()
      assert.is_true(review(class { c[2] }).allowed)
    end)
  end

  it("refuses more than the CRD's 16 tolerations (maxItems), 16 are fine", function()
    local list = {}
    for i = 1, 16 do list[i] = { key = "gpu.cozystack.io/t" .. i, operator = "Exists" } end
    assert.is_true(review(class(list)).allowed)
    list[17] = { key = "gpu.cozystack.io/t17", operator = "Exists" }
    local resp = review(class(list))
    assert.is_false(resp.allowed)
    assert.are.equal(422, resp.status.code)
    assert.matches("spec.tolerations: Too many: 17: must have at most 16 items", resp.status.message, 1, true)
  end)

  it("names the JSON type of a non-string value, never a table's address", function()
    local resp = review(class({ { key = "k", operator = { x = 1 }, effect = json.array { "NoSchedule" } } },
      { mode = json.array { "VGPU" }, onCordon = { y = 2 } }))
    assert.is_false(resp.allowed)
    local m = resp.status.message
    for _, want in ipairs {
      'spec.mode: Unsupported value: "<list>"', 'spec.onCordon: Unsupported value: "<object>"',
      'spec.tolerations[0].operator: Unsupported value: "<object>"', 'spec.tolerations[0].effect: Unsupported value: "<list>"',
    } do
      assert.truthy(m:find(want, 1, true), m)
    end
    assert.is_nil(m:find("0x", 1, true), m)
  end)

  it("reports every invalid toleration with its index", function()
    local resp = review(class { { key = "ok", operator = "Exists" }, { key = "a", operator = "Gt" }, { key = "b", operator = "Exists", value = "x" } })
    assert.matches("^spec.tolerations%[1%]%.operator: .*; spec.tolerations%[2%]%.operator: value must be empty", resp.status.message)
  end)
end)

describe("GPUClass consistency", function()
  it("requires a profile on VGPU and refuses one on Passthrough", function()
    local resp = review(H.class("v", { mode = "VGPU", resourceName = "nvidia.com/L40S-24C" }))
    assert.matches("^spec.profile: Required value", resp.status.message)
    resp = review(H.class("p", { mode = "Passthrough", profile = "L40S-24C", resourceName = "nvidia.com/AD102GL_L40S" }))
    assert.matches("^spec.profile: must be empty for a Passthrough class", resp.status.message)
  end)

  it("refuses a resource name that is not an extended resource name", function()
    local resp = review(H.class("p", { mode = "Passthrough", resourceName = "gpu" }))
    assert.matches("^spec.resourceName: must be a domain%-prefixed name", resp.status.message)
    resp = review(H.class("p", { mode = "Passthrough", resourceName = "kubernetes.io/gpu" }))
    assert.matches("kubernetes.io domain", resp.status.message)
  end)

  it("refuses a second class with the same resource name (one resource name per offer)", function()
    e = H.engine({ class() })
    local resp = review(H.class("l40s-copy", { mode = "Passthrough", resourceName = "nvidia.com/AD102GL_L40S" }))
    assert.matches('already belongs to GPUClass "l40s"', resp.status.message)
    -- updating the class itself is fine
    assert.is_true(review(class(), "UPDATE", class()).allowed)
  end)

  it("freezes maxCount while claims use the class", function()
    local claim = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "c1", namespace = "tenant-a" }, spec = { class = "l40s", count = 1 } }
    e = H.engine({ class(), claim })
    local resp = review(class(nil, { maxCount = 4 }), "UPDATE", class(nil, { maxCount = 2 }))
    assert.is_false(resp.allowed)
    assert.matches("spec.maxCount: cannot change while 1 GPUClaim%(s%) use the class", resp.status.message)
    e = H.engine({ class() })
    assert.is_true(review(class(nil, { maxCount = 4 }), "UPDATE", class(nil, { maxCount = 2 })).allowed)
  end)

  it("accepts the example classes", function()
    for _, o in ipairs(H.objects("examples/classes")) do
      local resp = review(o)
      assert.is_true(resp.allowed, o.metadata.name .. ": " .. tostring(resp.status and resp.status.message))
    end
  end)
end)
