-- virt-launcher pod mutation (policies/launcher-tolerations.lua): the union
-- of the classes' tolerations, whether or not spec.tolerations exists, never
-- duplicating one already there.
local json = H.json

local L40S, L40S_24C = "nvidia.com/AD102GL_L40S", "nvidia.com/L40S-24C"
local T_MODE = { key = "gpu.cozystack.io/mode", operator = "Equal", value = "passthrough", effect = "NoSchedule" }
local T_GPU = { key = "gpu.cozystack.io/gpu", operator = "Exists", effect = "NoSchedule" }
local T_VGPU = { key = "gpu.cozystack.io/mode", operator = "Equal", value = "vgpu", effect = "NoSchedule" }
local T_DEFAULT = { key = "node.kubernetes.io/not-ready", operator = "Exists", effect = "NoExecute", tolerationSeconds = 300 }

local e
before_each(function()
  e = H.engine {
    H.class("l40s", { mode = "Passthrough", resourceName = L40S, tolerations = json.array { T_MODE, T_GPU } }),
    H.class("l40s-24c", { mode = "VGPU", profile = "L40S-24C", resourceName = L40S_24C, maxCount = 2, tolerations = json.array { T_VGPU, T_GPU } }),
  }
end)

local function mutate(pod)
  local resp = assert(e:review(H.request(pod)))
  assert.is_true(resp.allowed)
  return H.patch_of(resp)
end

describe("virt-launcher tolerations", function()
  it("adds the list when the pod has no tolerations", function()
    assert.are.same({ { op = "add", path = "/spec/tolerations", value = { T_MODE, T_GPU } } },
      mutate(H.launcher("vm1", { [L40S] = "1" })))
  end)

  it("appends to the tolerations the pod has", function()
    assert.are.same({
      { op = "add", path = "/spec/tolerations/-", value = T_MODE },
      { op = "add", path = "/spec/tolerations/-", value = T_GPU },
    }, mutate(H.launcher("vm1", { [L40S] = "1" }, { T_DEFAULT })))
  end)

  it("does not add a toleration already present (empty operator is Equal)", function()
    local present = { key = T_MODE.key, value = T_MODE.value, effect = T_MODE.effect } -- operator omitted
    assert.are.same({ { op = "add", path = "/spec/tolerations/-", value = T_GPU } },
      mutate(H.launcher("vm1", { [L40S] = "1" }, { T_DEFAULT, present })))
    assert.is_nil(mutate(H.launcher("vm1", { [L40S] = "1" }, { T_MODE, T_GPU })))
  end)

  it("takes the union over classes without duplicates", function()
    assert.are.same({ { op = "add", path = "/spec/tolerations", value = { T_MODE, T_GPU, T_VGPU } } },
      mutate(H.launcher("vm1", { [L40S] = "1", [L40S_24C] = "2" })))
  end)

  it("leaves pods that are not virt-launcher pods, or request no GPU, alone", function()
    local pod = H.launcher("vm1", { [L40S] = "1" })
    pod.metadata.ownerReferences = nil
    assert.is_nil(mutate(pod))
    assert.is_nil(mutate(H.launcher("vm1", { cpu = "1" })))
  end)

  it("produces a patch that applies to the pod (checked with the RFC 6902 implementation)", function()
    local pod = H.launcher("vm1", { [L40S] = "1" }, { T_DEFAULT })
    local patched = assert(require("cozygpu.jsonpatch").apply(pod, mutate(pod)))
    assert.are.equal(3, #patched.spec.tolerations)
  end)
end)
