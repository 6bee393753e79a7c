-- VMI create rules (policies/vmi-gpus.lua, policies/vmi-record.lua;
-- DESIGN.md §4 "VMI create").
local json = H.json

local L40S, L40S_24C, A100_40C, CX7 = "nvidia.com/AD102GL_L40S", "nvidia.com/L40S-24C", "nvidia.com/A100-40C", "nvidia.com/cx7_vf"

local function snapshot(extra)
  local objs = {
    H.class("l40s", { mode = "Passthrough", model = "L40S", resourceName = L40S }),
    H.class("l40s-24c", { mode = "VGPU", model = "L40S", profile = "L40S-24C", resourceName = L40S_24C, maxCount = 2,
      license = { secretRef = { name = "nvidia-vgpu-license", namespace = "cozy-gpu" }, featureType = 1 } }),
    H.class("a100-40c", { mode = "VGPU", model = "A100", profile = "A100-40C", resourceName = A100_40C }),
    H.kubevirt({ { "10DE:26B9", L40S }, { "10DE:26B9", L40S_24C }, { "15B3:101E", CX7 } }, { { "NVIDIA A100-40C", A100_40C } }),
    H.tenant({ "tenant-root" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
    H.tenant({ "tenant-root", "tenant-a" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
    H.tenant({ "tenant-root", "tenant-b" }),
    -- entitled by its own label, but its parent tenant-b is not
    H.tenant({ "tenant-root", "tenant-b", "tenant-b-c" }, { ["gpu.cozystack.io/vgpu"] = "true" }),
  }
  for _, o in ipairs(extra or {}) do objs[#objs + 1] = o end
  return objs
end

local e
before_each(function() e = H.engine(snapshot()) end)

local function review(vmi)
  -- each case twice on one state: a policy keeping state in globals would
  -- answer differently
  local first = assert(e:review(H.request(vmi)))
  local second = assert(e:review(H.request(vmi)))
  assert.are.same(first, second)
  return first
end

describe("VMI GPU entries", function()
  it("allows one GPU and a ConnectX VF passed through under an nvidia.com/ name", function()
    local resp = review(H.vmi { gpus = { L40S }, hostDevices = { CX7 } })
    assert.is_true(resp.allowed)
    -- the NIC is not a GPU entry: only the L40S is recorded
    assert.are.same({ { op = "add", path = "/metadata/annotations", value = { ["gpu.cozystack.io/classes"] = "l40s=1" } } }, H.patch_of(resp))
  end)

  it("refuses vGPUs of two classes in one VMI", function()
    local resp = review(H.vmi { gpus = { L40S_24C, A100_40C } })
    assert.is_false(resp.allowed)
    assert.are.equal(403, resp.status.code)
    assert.are.equal("spec.domain.devices: vGPU devices of more than one class in one VM (l40s-24c, a100-40c); a VM takes vGPUs of one class only", resp.status.message)
  end)

  it("allows a passthrough GPU next to vGPUs of one class", function()
    assert.is_true(review(H.vmi { gpus = { L40S, L40S_24C, L40S_24C } }).allowed)
  end)

  it("refuses more GPUs of a class than its maxCount, counting every entry kind", function()
    local resp = review(H.vmi { gpus = { L40S_24C, L40S_24C }, hostDevices = { L40S_24C } })
    assert.is_false(resp.allowed)
    assert.are.equal('spec.domain.devices.gpus[0].deviceName: 3 GPUs of class "l40s-24c", more than its maxCount 2', resp.status.message)
    -- a vGPU class without maxCount allows 1 (DESIGN.md §3)
    resp = review(H.vmi { gpus = { A100_40C, A100_40C } })
    assert.matches('2 GPUs of class "a100%-40c", more than its maxCount 1', resp.status.message)
    -- passthrough without maxCount: no per-VM limit here
    assert.is_true(review(H.vmi { gpus = { L40S, L40S, L40S, L40S, L40S, L40S, L40S, L40S } }).allowed)
  end)

  it("refuses a resource name KubeVirt does not permit", function()
    local resp = review(H.vmi { gpus = { "nvidia.com/GP102GL_Tesla_P40" } })
    assert.is_false(resp.allowed)
    assert.are.equal('spec.domain.devices.gpus[0].deviceName: resource name "nvidia.com/GP102GL_Tesla_P40" is not permitted by KubeVirt (not in spec.configuration.permittedHostDevices of KubeVirt cozy-kubevirt/kubevirt)', resp.status.message)
  end)

  it("refuses an unknown class on a VMI that orders by class", function()
    local vmi = H.vmi { gpus = { "nvidia.com/GH100_H100_PCIE" }, labels = { ["gpu.cozystack.io/class-reference"] = "true" } }
    local objs = snapshot()
    objs[4] = H.kubevirt({ { "10DE:2331", "nvidia.com/GH100_H100_PCIE" } })
    e = H.engine(objs)
    local resp = review(vmi)
    assert.is_false(resp.allowed)
    assert.matches('unknown GPU class: no GPUClass has resource name "nvidia.com/GH100_H100_PCIE"', resp.status.message)
    -- without the label it is a raw name, allowed under rawResourceNames: Allowed
    vmi.metadata.labels = nil
    assert.is_true(review(vmi).allowed)
  end)

  it("refuses a class that is being deleted", function()
    local dying = H.class("l40s", { mode = "Passthrough", resourceName = L40S })
    dying.metadata.deletionTimestamp = "2026-11-30T00:00:00Z"
    local objs = snapshot()
    objs[1] = dying
    e = H.engine(objs)
    local resp = review(H.vmi { gpus = { L40S } })
    assert.matches('GPUClass "l40s" is being deleted', resp.status.message)
  end)

  it("refuses vGPU in a namespace without the entitlement, and where an ancestor lacks it", function()
    local resp = review(H.vmi { namespace = "tenant-b", gpus = { L40S_24C } })
    assert.is_false(resp.allowed)
    assert.matches('namespace "tenant%-b" is not entitled to vGPU', resp.status.message)
    resp = review(H.vmi { namespace = "tenant-b-c", gpus = { L40S_24C } })
    assert.is_false(resp.allowed)
    assert.matches('its ancestor "tenant%-b" lacks the label gpu.cozystack.io/vgpu=true', resp.status.message)
    -- passthrough needs no entitlement
    assert.is_true(review(H.vmi { namespace = "tenant-b", gpus = { L40S } }).allowed)
  end)

  it("counts GPU resource names in spec.domain.resources and refuses fractions", function()
    local resp = review(H.vmi { resources = { [L40S_24C] = "3" } })
    assert.matches("3 GPUs of class", resp.status.message)
    resp = review(H.vmi { resources = { [L40S] = "500m" } })
    assert.is_false(resp.allowed)
    assert.matches("GPUs are whole devices", resp.status.message)
  end)

  it("records classes and adds the license volume of a licensed vGPU class", function()
    local resp = review(H.vmi { gpus = { L40S_24C, L40S_24C } })
    assert.is_true(resp.allowed)
    assert.are.same({
      { op = "add", path = "/metadata/annotations", value = { ["gpu.cozystack.io/classes"] = "l40s-24c=2" } },
      { op = "add", path = "/spec/volumes/-", value = { name = "gpu-license-l40s-24c", secret = { secretName = "gpu-license-l40s-24c" } } },
      { op = "add", path = "/spec/domain/devices/disks/-", value = { name = "gpu-license-l40s-24c", disk = { bus = "virtio" } } },
    }, H.patch_of(resp))
  end)

  it("leaves a VMI without GPUs alone", function()
    local resp = review(H.vmi {})
    assert.is_true(resp.allowed)
    assert.is_nil(resp.patch)
    assert.is_nil(resp.warnings)
  end)

  it("warns, and does not refuse, when the snapshot has no KubeVirt CR", function()
    local objs = snapshot()
    table.remove(objs, 4)
    e = H.engine(objs)
    local resp = review(H.vmi { gpus = { "nvidia.com/GP102GL_Tesla_P40" } })
    assert.is_true(resp.allowed)
    assert.are.equal("no KubeVirt CR in the cluster state: permittedHostDevices was not checked", resp.warnings[1])
  end)
end)

describe("VMI budgets (DESIGN.md §5)", function()
  local function quota(ns, hard)
    return { apiVersion = "v1", kind = "ResourceQuota", metadata = { name = "gpu", namespace = ns }, spec = { hard = hard } }
  end
  local function claim(ns, class, count)
    return { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "held", namespace = ns },
      spec = { class = class, count = count }, status = { phase = "Lost" } }
  end

  it("refuses the set a VM asks for when it is over a tenant's budget, naming the key and the shortfall", function()
    e = H.engine(snapshot { quota("tenant-root", { ["gpuclass.cozystack.io/devices"] = "3" }), claim("tenant-a", "l40s", 2) })
    local resp = review(H.vmi { gpus = { L40S, L40S } })
    assert.is_false(resp.allowed)
    assert.are.equal(403, resp.status.code)
    assert.are.equal('spec.domain.devices.gpus[0].deviceName: tenant "tenant-root": gpuclass.cozystack.io/devices is 3, 2 in use by GPUClaim tenant-a/held (2); 2 more is short by 1',
      resp.status.message)
  end)

  it("checks the classes of one VM together against the total key", function()
    e = H.engine(snapshot { quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "2" }) })
    assert.is_true(review(H.vmi { gpus = { L40S, L40S } }).allowed)
    local resp = review(H.vmi { gpus = { L40S, L40S_24C } , hostDevices = {} })
    -- two classes, one of them vGPU: allowed by the class rules, 2 <= 2
    assert.is_true(resp.allowed)
    e = H.engine(snapshot { quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "1" }) })
    resp = review(H.vmi { gpus = { L40S, L40S_24C } })
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find("short by 1", 1, true), resp.status.message)
  end)

  it("lets a raw key cap a VMI without the class reference instead of blocking it (R4 is for class orders)", function()
    e = H.engine(snapshot { quota("tenant-root", { ["requests." .. L40S] = "1" }) })
    assert.is_true(review(H.vmi { hostDevices = { L40S } }).allowed)
    local resp = review(H.vmi { hostDevices = { L40S, L40S } })
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find("requests." .. L40S .. " is 1, none in use; 2 more is short by 1", 1, true), resp.status.message)
    -- the same names ordered by class are blocked until a class or total key is granted there
    resp = review(H.vmi { hostDevices = { L40S }, labels = { ["gpu.cozystack.io/class-reference"] = "true" } })
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find("wait until the class or total key is granted there", 1, true), resp.status.message)
  end)

  it("says none is in use when nothing holds the key, and who holds it otherwise", function()
    e = H.engine(snapshot { quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "1" }) })
    local resp = review(H.vmi { gpus = { L40S, L40S } })
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find('tenant "tenant-a": gpuclass.cozystack.io/devices is 1, none in use; 2 more is short by 1',
      1, true), resp.status.message)
    assert.is_nil(resp.status.message:find("0 in use", 1, true), resp.status.message)
    assert.is_nil(resp.status.message:find("by nothing", 1, true), resp.status.message)
    e = H.engine(snapshot { quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "1" }), claim("tenant-a", "l40s", 1) })
    resp = review(H.vmi { gpus = { L40S } })
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find("is 1, 1 in use by GPUClaim tenant-a/", 1, true), resp.status.message)
  end)

  it("reads a huge quota as no limit, and a huge count as over any budget (no wrap-around)", function()
    -- "8Ei" is 2^63-1 as Kubernetes caps it (decision 0013)
    e = H.engine(snapshot { quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "8Ei" }), claim("tenant-a", "l40s", 2) })
    assert.is_true(review(H.vmi { gpus = { L40S, L40S } }).allowed)
    -- 2^63-1 GPUs by resources plus one more by gpus stays 2^63-1, not negative
    e = H.engine(snapshot { quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "5" }) })
    local resp = review(H.vmi { resources = { [L40S] = "8Ei" }, gpus = { L40S } })
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find("gpuclass.cozystack.io/devices is 5, none in use; 9223372036854775807 more", 1, true),
      resp.status.message)
  end)

  it("names only the class rule when the order is wrong anyway", function()
    e = H.engine(snapshot { quota("tenant-a", { ["gpuclass.cozystack.io/devices"] = "0" }) })
    local resp = review(H.vmi { gpus = { L40S_24C, L40S_24C, L40S_24C } })
    assert.is_false(resp.allowed)
    assert.truthy(resp.status.message:find("more than its maxCount 2", 1, true))
    assert.is_nil(resp.status.message:find("gpuclass.cozystack.io/devices", 1, true))
  end)
end)
