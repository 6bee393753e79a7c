-- cozygpu.claims, template claims (DESIGN.md §3,
-- docs/decisions/0027): the naming contract `<vmi>-<class>` shared with the
-- leader's C side, the 253-character limit of a GPUClaim name, the set a
-- VMI gets and the one its virt-launcher pod asks for, and how a claim is
-- told to be that VMI's template claim.
local json = H.json
local claims = require "cozygpu.claims"
local cluster = require "cozygpu.cluster"

local function class(name, rn, mode)
  return { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", metadata = { name = name },
    spec = { resourceName = rn, mode = mode or "Passthrough" } }
end
local function view(extra)
  local objs = { class("l40s", "nvidia.com/AD102GL_L40S"), class("a100-40c", "nvidia.com/A100-40C", "VGPU"),
    class("dup-a", "example.com/dup"), class("dup-b", "example.com/dup") }
  for _, o in ipairs(extra or {}) do objs[#objs + 1] = o end
  return cluster.new(json.decode(json.encode(objs)), json.decode(json.encode { gpuResourceNames = { "example.com/raw" } }))
end
local REF = { ["gpu.cozystack.io/class-reference"] = "true" }
local function vmi(name, gpus, labels, annotations, resources)
  local list = {}
  for i, d in ipairs(gpus) do list[i] = { name = "g" .. i, deviceName = d } end
  return json.decode(json.encode { kind = "VirtualMachineInstance",
    metadata = { name = name, namespace = "t", labels = labels or REF, annotations = annotations },
    spec = { domain = { devices = { gpus = list }, resources = resources } } })
end
local function pod(limits, labels, annotations, other)
  local containers = { { name = "compute", resources = { limits = limits, requests = limits } } }
  if other then containers[2] = { name = "sidecar", resources = { limits = other } } end
  return json.decode(json.encode { kind = "Pod",
    metadata = { namespace = "t", labels = labels or { ["kubevirt.io"] = "virt-launcher", ["gpu.cozystack.io/class-reference"] = "true" },
      annotations = annotations },
    spec = { containers = containers } })
end

describe("cozygpu.claims template claims", function()
  it("names a template claim <vmi>-<class>, up to 253 characters", function()
    assert.are.equal("trainer-l40s", claims.template_name("trainer", "l40s"))
    local n = claims.template_name(("v"):rep(248), "l40s")
    assert.are.equal(253, #n)
    local none, why = claims.template_name(("v"):rep(249), "l40s")
    assert.is_nil(none)
    assert.are.equal('the template GPUClaim of class "l40s" would be named <VMI name>-l40s, 254 characters, more than 253: name the VMI with at most 248 characters', why)
    -- a VMI name that is no object name (review input only) is caught too
    assert.is_nil((claims.template_name("Trainer", "l40s")))
    assert.are.same({ nil, "the VMI has no name" }, { claims.template_name("", "l40s") })
    assert.are.same({ nil, "the class has no name" }, { claims.template_name("v", nil) })
  end)

  it("tells a VMI (or its pod) with template claims: the class-reference label and no claims annotation", function()
    assert.is_true(claims.templated(vmi("v", {})))
    assert.is_false(claims.templated(vmi("v", {}, {})))
    assert.is_false(claims.templated(vmi("v", {}, { ["gpu.cozystack.io/class-reference"] = "false" })))
    assert.is_false(claims.templated(vmi("v", {}, nil, { ["gpu.cozystack.io/claims"] = "a" })))
    assert.is_true(claims.templated(vmi("v", {}, nil, { other = "x" })))
  end)

  it("gives one claim per class of the entries, in their order, counting a resources entry by its quantity", function()
    local v = vmi("trainer", { "nvidia.com/A100-40C", "nvidia.com/AD102GL_L40S", "nvidia.com/AD102GL_L40S" }, nil, nil,
      { limits = { ["nvidia.com/AD102GL_L40S"] = "2" } })
    assert.are.same({ { name = "trainer-a100-40c", class = "a100-40c", count = 1 },
      { name = "trainer-l40s", class = "l40s", count = 4 } }, claims.template_names(v, view()))
  end)

  it("gives none to a VMI without the label, with the claims annotation, or without GPU entries", function()
    local c = view()
    assert.are.same({}, claims.template_names(vmi("v", { "nvidia.com/AD102GL_L40S" }, {}), c))
    assert.are.same({}, claims.template_names(vmi("v", { "nvidia.com/AD102GL_L40S" }, nil, { ["gpu.cozystack.io/claims"] = "a" }), c))
    assert.are.same({}, claims.template_names(vmi("v", {}), c))
  end)

  it("returns the problems when the set cannot be formed: entries without one class (entry), names too long (name), no name (unnamed)", function()
    local c = view()
    local set, problems = claims.template_names(vmi(("v"):rep(245), { "nvidia.com/AD102GL_L40S", "example.com/dup", "example.com/raw", "nvidia.com/A100-40C" }), c)
    assert.is_nil(set)
    local got = {}
    for i, p in ipairs(problems) do got[i] = { p.reason, p.field } end
    assert.are.same({ { "entry", "spec.domain.devices.gpus[1].deviceName" }, { "entry", "spec.domain.devices.gpus[2].deviceName" },
      { "name", "metadata.name" } }, got)
    assert.matches('class "a100%-40c"', problems[3].message)
    set, problems = claims.template_names(vmi(nil, { "nvidia.com/AD102GL_L40S" }), c)
    assert.is_nil(set)
    assert.are.same({ "unnamed", "metadata.name" }, { problems[1].reason, problems[1].field })
  end)

  it("reads the same set from the launcher pod: the compute container's GPU resource names, by class", function()
    local c = view()
    local p = pod { ["nvidia.com/AD102GL_L40S"] = "2", ["nvidia.com/A100-40C"] = "1", cpu = "4" }
    assert.are.same({ { name = "trainer-a100-40c", class = "a100-40c", count = 1 },
      { name = "trainer-l40s", class = "l40s", count = 2 } }, claims.template_names_of_pod(p, "trainer", c))
    -- not a template pod, or no GPU: none
    assert.are.same({}, claims.template_names_of_pod(pod({ ["nvidia.com/AD102GL_L40S"] = "1" }, { ["kubevirt.io"] = "virt-launcher" }), "v", c))
    assert.are.same({}, claims.template_names_of_pod(pod({ ["nvidia.com/AD102GL_L40S"] = "1" }, nil, { ["gpu.cozystack.io/claims"] = "a" }), "v", c))
    assert.are.same({}, claims.template_names_of_pod(pod { cpu = "1" }, "v", c))
  end)

  it("cannot tell a pod's set, so returns problems, for a name no single class carries, a GPU outside compute, a name too long", function()
    local c = view()
    local function reasons(p, name)
      local set, problems = claims.template_names_of_pod(p, name or "v", c)
      assert.is_nil(set)
      local r = {}
      for i, x in ipairs(problems) do r[i] = x.reason end
      return r
    end
    assert.are.same({ "entry" }, reasons(pod { ["example.com/raw"] = "1" }))
    assert.are.same({ "entry" }, reasons(pod { ["example.com/dup"] = "1" }))
    assert.are.same({ "entry" }, reasons(pod({ ["nvidia.com/AD102GL_L40S"] = "1" }, nil, nil, { ["nvidia.com/A100-40C"] = "1" })))
    assert.are.same({ "name" }, reasons(pod { ["nvidia.com/AD102GL_L40S"] = "1" }, ("v"):rep(249)))
  end)

  it("knows a VMI's own template claim: label, controller owner with the VMI's uid, class and count", function()
    local want = { name = "v-l40s", class = "l40s", count = 2 }
    local function claim(over)
      local c = { kind = "GPUClaim", metadata = { name = "v-l40s", namespace = "t",
        labels = { ["gpu.cozystack.io/template-claim"] = "true" }, annotations = { ["gpu.cozystack.io/vmi"] = "v" },
        ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "v", uid = "u1", controller = true } } },
        spec = { class = "l40s", count = 2 } }
      if over then over(c) end
      return json.decode(json.encode(c))
    end
    assert.is_nil(claims.template_mismatch(claim(), want, "v", "u1"))
    assert.matches("not a template claim", claims.template_mismatch(claim(function(c) c.metadata.labels = nil end), want, "v", "u1"))
    assert.matches("not owned by", claims.template_mismatch(claim(function(c) c.metadata.ownerReferences[1].controller = false end), want, "v", "u1"))
    assert.matches("not owned by", claims.template_mismatch(claim(function(c) c.metadata.ownerReferences[1].kind = "VirtualMachine" end), want, "v", "u1"))
    assert.matches("another VirtualMachineInstance", claims.template_mismatch(claim(), want, "v", "u2"))
    assert.matches("another VirtualMachineInstance", claims.template_mismatch(claim(), want, "v", nil))
    assert.matches("is not 2 of class", claims.template_mismatch(claim(function(c) c.spec.count = 1 end), want, "v", "u1"))
    assert.matches("is not 2 of class", claims.template_mismatch(claim(function(c) c.spec.class = "a100-40c" end), want, "v", "u1"))
  end)
end)
