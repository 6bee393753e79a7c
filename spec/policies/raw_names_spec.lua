-- The raw-name policy (policies/raw-names.lua; DESIGN.md §4 "Raw-name
-- policy", §10 rawResourceNames).
local json = H.json

local L40S, CX7 = "nvidia.com/AD102GL_L40S", "nvidia.com/cx7_vf"
local VIRT_CONTROLLER = "system:serviceaccount:cozy-kubevirt:kubevirt-controller"

local function snapshot()
  return {
    H.class("l40s", { mode = "Passthrough", model = "L40S", resourceName = L40S }),
    H.kubevirt({ { "10DE:26B9", L40S }, { "15B3:101E", CX7 } }),
    H.tenant({ "tenant-root" }),
    H.tenant({ "tenant-root", "tenant-a" }),
    H.namespace("default"),
  }
end

local function engine(mode)
  return H.engine(snapshot(), { rawResourceNames = mode })
end

-- a pod with one container requesting `resources`
local function pod(resources, o)
  o = o or {}
  local p = {
    apiVersion = "v1", kind = "Pod",
    metadata = { name = "p", namespace = o.namespace or "tenant-a", labels = o.labels, ownerReferences = o.owners },
    spec = { containers = json.array { { name = "main", image = "busybox", resources = { limits = resources } } } },
  }
  if o.init then
    p.spec.initContainers = json.array { { name = "init", image = "busybox", resources = { limits = o.init } } }
  end
  return p
end

local VMI_OWNER = json.array { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "vm1",
  uid = "6e7b3e0c-0000-4000-8000-000000000001", controller = true } }

local function review(e, obj, user)
  local req = H.request(obj)
  req.userInfo = { username = user or "alice@tenant-a" }
  return assert(e:review(req, "validating"))
end

describe("raw-name policy under Forbidden", function()
  local e
  before_each(function() e = engine("Forbidden") end)

  it("refuses a tenant pod that requests a GPU by device-plugin name", function()
    local r = review(e, pod { [L40S] = "1" })
    assert.is_false(r.allowed)
    assert.equal(403, r.status.code)
    assert.truthy(r.status.message:find("spec.containers[0].resources.limits[" .. L40S .. "]", 1, true), r.status.message)
  end)

  it("refuses the same pod with a forged owner reference to a VMI", function()
    assert.is_false(review(e, pod({ [L40S] = "1" }, { owners = VMI_OWNER })).allowed)
  end)

  it("refuses the same pod with a forged kubevirt.io label", function()
    assert.is_false(review(e, pod({ [L40S] = "1" }, { labels = { ["kubevirt.io"] = "virt-launcher" }, owners = VMI_OWNER })).allowed)
  end)

  it("refuses a pod from virt-controller that no VMI owns", function()
    assert.is_false(review(e, pod { [L40S] = "1" }, VIRT_CONTROLLER).allowed)
  end)

  it("allows a virt-launcher pod created by virt-controller and owned by a VMI", function()
    local r = review(e, H.launcher("vm1", { [L40S] = "1" }), VIRT_CONTROLLER)
    assert.is_true(r.allowed)
  end)

  it("makes no exception on a guess when there is neither virtControllerUser nor a KubeVirt CR", function()
    local objs = snapshot()
    table.remove(objs, 2) -- the KubeVirt CR
    objs[#objs + 1] = H.class("l40s-extra", { mode = "Passthrough", model = "L40S", resourceName = "nvidia.com/EXTRA" })
    local e2 = H.engine(objs, { rawResourceNames = "Forbidden" })
    local r = review(e2, H.launcher("vm1", { ["nvidia.com/EXTRA"] = "1" }), "system:serviceaccount:kubevirt:kubevirt-controller")
    assert.is_false(r.allowed)
  end)

  it("never treats a NIC passed through under an nvidia.com/ name as a GPU", function()
    assert.is_true(review(e, pod { [CX7] = "1" }).allowed)
  end)

  it("sees GPUs requested by init containers", function()
    local r = review(e, pod({ cpu = "1" }, { init = { [L40S] = "1" } }))
    assert.is_false(r.allowed)
    assert.truthy(r.status.message:find("spec.initContainers[0]", 1, true))
  end)

  it("sees a GPU device class in the DRA extended-resource form, and not another class", function()
    assert.is_false(review(e, pod { ["deviceclass.resource.kubernetes.io/gpu.nvidia.com"] = "1" }).allowed)
    assert.is_true(review(e, pod { ["deviceclass.resource.kubernetes.io/nic.example.com"] = "1" }).allowed)
  end)

  it("sees a pod resource claim whose template asks for a GPU device class, and not a NIC class", function()
    local function template(name, class)
      return { apiVersion = "resource.k8s.io/v1beta1", kind = "ResourceClaimTemplate",
        metadata = { name = name, namespace = "tenant-a" },
        spec = { spec = { devices = { requests = json.array { { name = "dev", deviceClassName = class } } } } } }
    end
    local objs = snapshot()
    objs[#objs + 1] = template("one-gpu", "gpu.nvidia.com")
    objs[#objs + 1] = template("one-nic", "nic.example.com")
    local e2 = H.engine(objs, { rawResourceNames = "Forbidden" })
    local function dra_pod(tname)
      local p = pod { cpu = "1" }
      p.spec.resourceClaims = json.array { { name = "dev", resourceClaimTemplateName = tname } }
      return p
    end
    local r = review(e2, dra_pod "one-gpu")
    assert.is_false(r.allowed)
    assert.truthy(r.status.message:find("spec.resourceClaims[0]", 1, true), r.status.message)
    assert.is_true(review(e2, dra_pod "one-nic").allowed)
    -- a claim that cannot be looked up is refused (fail closed), saying why
    r = review(e2, dra_pod "missing")
    assert.is_false(r.allowed)
    assert.truthy(r.status.message:find("ResourceClaimTemplate tenant-a/missing is not in the cluster state", 1, true), r.status.message)
  end)

  it("leaves pods outside the tenant tree alone", function()
    assert.is_true(review(e, pod({ [L40S] = "1" }, { namespace = "default" })).allowed)
  end)

  it("refuses GPU entries on a VMI without a class reference, and allows one with it", function()
    local r = review(e, H.vmi { gpus = { L40S } })
    assert.is_false(r.allowed)
    assert.truthy(r.status.message:find("ordered by device-plugin name", 1, true))
    local v = H.vmi { gpus = { L40S }, labels = { ["gpu.cozystack.io/class-reference"] = "true" } }
    assert.is_true(review(e, v).allowed)
  end)
end)

describe("raw-name policy under Warn and Allowed", function()
  it("allows the tenant pod with a warning under Warn", function()
    local r = review(engine("Warn"), pod { [L40S] = "1" })
    assert.is_true(r.allowed)
    assert.equal(1, #r.warnings)
    assert.truthy(r.warnings[1]:find(L40S, 1, true))
  end)

  it("says nothing under Allowed", function()
    local r = review(engine("Allowed"), pod { [L40S] = "1" })
    assert.is_true(r.allowed)
    assert.is_nil(r.warnings)
  end)
end)
