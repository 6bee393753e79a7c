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

-- DRA as Kubernetes serves it today (resource.k8s.io/v1, 1.34+; k8s.io/api
-- resource/v1 types.go: DeviceRequest.exactly / firstAvailable,
-- DeviceClassSpec.extendedResourceName), the older shapes the controller
-- may read instead (v1beta2 as v1; v1beta1 with deviceClassName on the
-- request), and KubeVirt's DRA path (kubevirt.io/api v1.9.0 core/v1:
-- VirtualMachineInstanceSpec.resourceClaims, GPU/HostDevice claimName +
-- requestName).
describe("raw-name policy and DRA", function()
  local NS = "tenant-a"

  local function exactly(name, class) return { name = name, exactly = { deviceClassName = class } } end
  local function first_available(name, classes)
    local subs = json.array()
    for i, c in ipairs(classes) do subs[i] = { name = "s" .. i, deviceClassName = c } end
    return { name = name, firstAvailable = subs }
  end
  local function claim(name, requests, version)
    return { apiVersion = "resource.k8s.io/" .. (version or "v1"), kind = "ResourceClaim",
      metadata = { name = name, namespace = NS }, spec = { devices = { requests = json.array(requests) } } }
  end
  local function template(name, requests)
    return { apiVersion = "resource.k8s.io/v1", kind = "ResourceClaimTemplate", metadata = { name = name, namespace = NS },
      spec = { spec = { devices = { requests = json.array(requests) } } } }
  end
  local function device_class(name, extended)
    return { apiVersion = "resource.k8s.io/v1", kind = "DeviceClass", metadata = { name = name },
      spec = { extendedResourceName = extended, selectors = json.array { { cel = { expression = "true" } } } } }
  end

  local function dra_engine(mode)
    local objs = snapshot()
    for _, o in ipairs {
      claim("gpu", { exactly("gpu", "gpu.nvidia.com") }),
      claim("nic", { exactly("nic", "nic.example.com") }),
      claim("fallback-mig", { first_available("dev", { "nic.example.com", "mig.nvidia.com" }) }),
      claim("fallback-nics", { first_available("dev", { "nic.example.com", "nic2.example.com" }) }),
      claim("gpu-and-nic", { exactly("gpu", "vfio.gpu.nvidia.com"), exactly("nic", "nic.example.com") }),
      claim("beta2", { exactly("gpu", "gpu.nvidia.com") }, "v1beta2"),
      claim("beta1", { { name = "gpu", deviceClassName = "gpu.nvidia.com" } }, "v1beta1"),
      claim("beta1-fallback", { first_available("dev", { "nic.example.com", "gpu.nvidia.com" }) }, "v1beta1"),
      template("gpu-tmpl", { exactly("gpu", "gpu.nvidia.com") }),
      template("nic-tmpl", { exactly("nic", "nic.example.com") }),
      device_class("gpu.nvidia.com", "example.com/gpu"),
      device_class("nic.example.com", "example.com/nic"),
    } do objs[#objs + 1] = o end
    return H.engine(objs, { rawResourceNames = mode })
  end

  -- a tenant pod with resource claims ({claim = name} or {template = name})
  local function claim_pod(refs, o)
    local p = o and o.launcher and H.launcher("vm1", { cpu = "1" }) or pod { cpu = "1" }
    local rc = json.array()
    for i, r in ipairs(refs) do
      rc[i] = { name = "c" .. i, resourceClaimName = r.claim, resourceClaimTemplateName = r.template }
    end
    p.spec.resourceClaims = rc
    return p
  end

  -- a VMI with DRA devices: o = {claims = {{name, claim=|template=}}, gpus = {{claim, request}},
  -- hostDevices = {{claim, request}}, resources = {name = qty}, labels}
  local function dra_vmi(o)
    local v = H.vmi { resources = o.resources, labels = o.labels }
    local rc = json.array()
    for i, c in ipairs(o.claims or {}) do
      rc[i] = { name = c[1], resourceClaimName = c.claim, resourceClaimTemplateName = c.template }
    end
    if #rc > 0 then v.spec.resourceClaims = rc end
    for _, f in ipairs { "gpus", "hostDevices" } do
      if o[f] then
        local l = json.array()
        for i, d in ipairs(o[f]) do l[i] = { name = f:sub(1, 3) .. i, claimName = d[1], requestName = d[2] } end
        v.spec.domain.devices[f] = l
      end
    end
    return v
  end

  local function refused(r, field)
    assert.is_false(r.allowed, "allowed")
    assert.truthy(r.status.message:find(field, 1, true), r.status.message)
  end

  describe("under Forbidden", function()
    local e
    setup(function() e = dra_engine("Forbidden") end)

    it("names the JSON type of a non-string name in its message, never a table's address", function()
      local v = dra_vmi {}
      v.spec.domain.devices.gpus = json.array { { name = { x = 1 }, claimName = json.array { "a" }, requestName = { y = 2 } } }
      local r = review(e, v)
      assert.is_false(r.allowed)
      assert.truthy(r.status.message:find('GPU "<object>" ordered through DRA claim "<list>" (request "<object>")', 1, true), r.status.message)
      assert.is_nil(r.status.message:find("0x", 1, true), r.status.message)
    end)

    it("refuses a pod claim whose v1 request asks for a GPU class exactly, and allows a NIC class", function()
      refused(review(e, claim_pod { { claim = "gpu" } }), "spec.resourceClaims[0]")
      assert.is_true(review(e, claim_pod { { claim = "nic" } }).allowed)
    end)

    it("counts a GPU class in any firstAvailable subrequest, and none when every subrequest is another class", function()
      local r = review(e, claim_pod { { claim = "nic" }, { claim = "fallback-mig" } })
      refused(r, "spec.resourceClaims[1]")
      assert.truthy(r.status.message:find("mig.nvidia.com", 1, true), r.status.message)
      assert.is_true(review(e, claim_pod { { claim = "fallback-nics" } }).allowed)
    end)

    it("reads the claim template's spec.spec, and the v1beta2 and v1beta1 shapes", function()
      refused(review(e, claim_pod { { template = "gpu-tmpl" } }), "spec.resourceClaims[0]")
      assert.is_true(review(e, claim_pod { { template = "nic-tmpl" } }).allowed)
      refused(review(e, claim_pod { { claim = "beta2" } }), "spec.resourceClaims[0]")
      refused(review(e, claim_pod { { claim = "beta1" } }), "spec.resourceClaims[0]")
      refused(review(e, claim_pod { { claim = "beta1-fallback" } }), "spec.resourceClaims[0]")
    end)

    it("refuses a claim it cannot look up, and one naming no object at all (fail closed)", function()
      local r = review(e, claim_pod { { claim = "gone" } })
      refused(r, "spec.resourceClaims[0]")
      assert.truthy(r.status.message:find("ResourceClaim tenant-a/gone is not in the cluster state", 1, true), r.status.message)
      refused(review(e, claim_pod { {} }), "spec.resourceClaims[0]")
    end)

    it("refuses the extended resource a GPU DeviceClass declares, and the implicit name; not a NIC class's", function()
      local r = review(e, pod { ["example.com/gpu"] = "1" })
      refused(r, "spec.containers[0].resources.limits[example.com/gpu]")
      assert.truthy(r.status.message:find("device class gpu.nvidia.com", 1, true), r.status.message)
      refused(review(e, pod { ["deviceclass.resource.kubernetes.io/mig.nvidia.com"] = "1" }),
        "spec.containers[0].resources.limits[deviceclass.resource.kubernetes.io/mig.nvidia.com]")
      refused(review(e, pod({ cpu = "1" }, { init = { ["example.com/gpu"] = "1" } })), "spec.initContainers[0]")
      assert.is_true(review(e, pod { ["example.com/nic"] = "1" }).allowed)
    end)

    it("allows KubeVirt's virt-launcher pod its VMI's claims", function()
      assert.is_true(review(e, claim_pod({ { claim = "gpu" } }, { launcher = true }), VIRT_CONTROLLER).allowed)
      refused(review(e, claim_pod({ { claim = "gpu" } }, { launcher = true })), "spec.resourceClaims[0]")
    end)

    it("refuses a VMI host device whose claim request is a GPU class, naming its claimName; allows a NIC", function()
      local r = review(e, dra_vmi { claims = { { "a", claim = "gpu" } }, hostDevices = { { "a", "gpu" } } })
      refused(r, "spec.domain.devices.hostDevices[0].claimName")
      assert.truthy(r.status.message:find("through DRA claim", 1, true), r.status.message)
      assert.is_nil(r.status.message:find("spec.resourceClaims[0]", 1, true), r.status.message)
      assert.is_true(review(e, dra_vmi { claims = { { "a", claim = "nic" } }, hostDevices = { { "a", "nic" } } }).allowed)
      refused(review(e, dra_vmi { claims = { { "a", template = "gpu-tmpl" } }, hostDevices = { { "a", "gpu" } } }),
        "spec.domain.devices.hostDevices[0].claimName")
      refused(review(e, dra_vmi { claims = { { "a", claim = "fallback-mig" } }, hostDevices = { { "a", "dev/s1" } } }),
        "spec.domain.devices.hostDevices[0].claimName")
    end)

    it("refuses a VMI gpus entry with a DRA claim, naming its claimName", function()
      local r = review(e, dra_vmi { claims = { { "a", claim = "gpu" } }, gpus = { { "a", "gpu" } } })
      refused(r, "spec.domain.devices.gpus[0].claimName")
      assert.truthy(r.status.message:find('DRA claim "a" (request "gpu")', 1, true), r.status.message)
    end)

    it("refuses a GPU request of a VMI claim that no device names (the launcher pod gets it)", function()
      refused(review(e, dra_vmi { claims = { { "a", template = "gpu-tmpl" } } }), "spec.resourceClaims[0]")
      assert.is_true(review(e, dra_vmi { claims = { { "a", template = "nic-tmpl" } } }).allowed)
      -- the NIC request named by a host device, the GPU request of the same claim not
      local r = review(e, dra_vmi { claims = { { "a", claim = "gpu-and-nic" } }, hostDevices = { { "a", "nic" } } })
      refused(r, "spec.resourceClaims[0]")
      assert.truthy(r.status.message:find('request \\"gpu\\"', 1, true) or r.status.message:find('request "gpu"', 1, true), r.status.message)
    end)

    it("refuses DRA GPUs on a class-referencing VMI too", function()
      local labels = { ["gpu.cozystack.io/class-reference"] = "true" }
      refused(review(e, dra_vmi { labels = labels, claims = { { "a", claim = "gpu" } }, hostDevices = { { "a", "gpu" } } }),
        "spec.domain.devices.hostDevices[0].claimName")
      refused(review(e, dra_vmi { labels = labels, claims = { { "a", claim = "gpu" } } }), "spec.resourceClaims[0]")
    end)

    it("refuses a VMI claim it cannot look up, or a device naming a claim or request the VMI does not have", function()
      local r = review(e, dra_vmi { claims = { { "a", claim = "gone" } }, hostDevices = { { "a", "gpu" } } })
      refused(r, "spec.domain.devices.hostDevices[0].claimName")
      assert.truthy(r.status.message:find("ResourceClaim tenant-a/gone is not in the cluster state", 1, true), r.status.message)
      refused(review(e, dra_vmi { claims = { { "a", claim = "gone" } } }), "spec.resourceClaims[0]")
      refused(review(e, dra_vmi { hostDevices = { { "b", "gpu" } } }), "spec.domain.devices.hostDevices[0].claimName")
      refused(review(e, dra_vmi { claims = { { "a", claim = "nic" } }, hostDevices = { { "a", "other" } } }),
        "spec.domain.devices.hostDevices[0].claimName")
    end)

    it("refuses a DRA extended resource of a GPU class in a VMI's domain.resources, not a NIC class's", function()
      refused(review(e, dra_vmi { resources = { ["example.com/gpu"] = "1" } }), "spec.domain.resources.limits[example.com/gpu]")
      refused(review(e, dra_vmi { resources = { ["deviceclass.resource.kubernetes.io/gpu.nvidia.com"] = "1" } }),
        "spec.domain.resources.limits[deviceclass.resource.kubernetes.io/gpu.nvidia.com]")
      assert.is_true(review(e, dra_vmi { resources = { ["example.com/nic"] = "1" } }).allowed)
    end)
  end)

  describe("under Warn", function()
    local e
    setup(function() e = dra_engine("Warn") end)

    it("allows each DRA form with a warning naming it", function()
      for _, c in ipairs {
        { claim_pod { { claim = "gpu" } }, "DRA device class gpu.nvidia.com" },
        { claim_pod { { claim = "fallback-mig" } }, "DRA device class mig.nvidia.com" },
        { pod { ["example.com/gpu"] = "1" }, "example.com/gpu" },
        { dra_vmi { claims = { { "a", claim = "gpu" } }, hostDevices = { { "a", "gpu" } } }, 'host device "hos1"' },
        { dra_vmi { claims = { { "a", claim = "gpu" } }, gpus = { { "a", "gpu" } } }, 'DRA claim "a"' },
        { dra_vmi { claims = { { "a", template = "gpu-tmpl" } } }, 'DRA claim "a" asks for a GPU' },
        { dra_vmi { resources = { ["example.com/gpu"] = "1" } }, "DRA extended resource" },
      } do
        local r = review(e, c[1])
        assert.is_true(r.allowed)
        assert.are.equal(1, #(r.warnings or {}), c[2])
        assert.truthy(r.warnings[1]:find(c[2], 1, true), r.warnings[1])
      end
      assert.is_nil(review(e, claim_pod { { claim = "nic" } }).warnings)
    end)
  end)
end)
