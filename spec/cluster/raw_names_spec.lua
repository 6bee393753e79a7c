-- The raw-name policy through a real API server (decision 0033, DESIGN.md
-- §4, policies/raw-names.lua): every way a tenant can ask for a GPU
-- without a GPUClass on Kubernetes 1.36 — a device-plugin name, and DRA at
-- resource.k8s.io/v1 (a ResourceClaim's `exactly` or `firstAvailable`
-- request, a ResourceClaimTemplate, the implicit extended resource name of
-- a device class, a DeviceClass's own extended resource name, and a VMI's
-- spec.resourceClaims with gpus[].claimName, KubeVirt's DRA path) — is
-- refused under `Forbidden` by kube-apiserver with cozygpu's message, and
-- admitted with a warning under `Warn`, as kubectl prints them. A DRA
-- claim of a device class that is no GPU class is admitted.
local P = require "proc"
local K = require "kube_cluster"
local json = H.json

local NS = "tenant-a"
local GPU_CLASS = "gpu.nvidia.com"   -- in gpuDeviceClasses (deploy/20-config.yaml)

local function mode(m)
  return function(text)
    local out, n = text:gsub("rawResourceNames: %a+", "rawResourceNames: " .. m)
    assert(n == 1, "config.yaml has no rawResourceNames line")
    return out
  end
end

local function pod(name, o)
  o = o or {}
  return { apiVersion = "v1", kind = "Pod", metadata = { name = name, namespace = NS },
    spec = { containers = { { name = "main", image = "registry.example.com/cuda:12",
      resources = o.limits and { limits = o.limits } or nil } }, resourceClaims = o.claims } }
end

local function claim(name, requests)
  return { apiVersion = "resource.k8s.io/v1", kind = "ResourceClaim", metadata = { name = name, namespace = NS },
    spec = { devices = { requests = requests } } }
end

local function vmi(name, o)
  return { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", metadata = { name = name, namespace = NS },
    spec = { domain = { devices = { gpus = o.gpus }, resources = { requests = { memory = "1Gi" } } },
      resourceClaims = o.claims } }
end

describe("raw names through kube-apiserver", function()
  local c

  -- kubectl create of obj; returns exit code, stdout .. stderr
  local function create(obj)
    local out, err, code = c:kubectl({ "create", "-f", "-" }, { stdin = json.encode(obj) })
    return code, out .. err
  end
  local function refused(obj, field)
    local code, text = create(obj)
    assert.are_not.equal(0, code, text)
    assert.matches("Error from server (Forbidden)", text, 1, true)
    assert.matches('denied the request: ', text, 1, true)
    if field then assert.matches(field, text, 1, true) end
    return text
  end
  local function admitted(obj)
    local code, text = create(obj)
    assert.are.equal(0, code, text)
    return text
  end

  local session = K.session { invariants = true, deploy = { replicas = 1, config_edit = mode("Forbidden") }, prepare = function(cl)
    c = cl
    -- the tenant's DRA objects exist before its pods name them (as the
    -- policy reads them from the controller's caches)
    c:must({ "create", "-f", "-" }, { stdin = json.encode { apiVersion = "resource.k8s.io/v1", kind = "DeviceClass",
      metadata = { name = "vfio.gpu.nvidia.com" }, spec = { extendedResourceName = "example.com/gpu" } } })
    c:must({ "create", "-f", "-" }, { stdin = json.encode(claim("exactly-gpu",
      { { name = "gpu", exactly = { deviceClassName = GPU_CLASS } } })) })
    c:must({ "create", "-f", "-" }, { stdin = json.encode(claim("first-available-gpu",
      { { name = "gpu", firstAvailable = { { name = "small", deviceClassName = "nic.example.com" },
        { name = "big", deviceClassName = GPU_CLASS } } } })) })
    c:must({ "create", "-f", "-" }, { stdin = json.encode(claim("nic",
      { { name = "nic", exactly = { deviceClassName = "nic.example.com" } } })) })
    c:must({ "create", "-f", "-" }, { stdin = json.encode { apiVersion = "resource.k8s.io/v1",
      kind = "ResourceClaimTemplate", metadata = { name = "gpu-template", namespace = NS },
      spec = { spec = { devices = { requests = { { name = "gpu", exactly = { deviceClassName = GPU_CLASS } } } } } } } })
    -- the controller's caches hold them before the first review: each
    -- replica's cozygpu_watch_cache_objects of a DRA kind counts what the
    -- API server lists of it
    for _, r in pairs(c.replicas) do
      local last = {}
      assert(P.wait_until(function()
        local m = c:metrics(r)
        if not m then return false end
        for _, res in ipairs { "deviceclasses", "resourceclaims", "resourceclaimtemplates" } do
          local st, list = c:request("GET", "/apis/resource.k8s.io/v1/" .. res)
          assert(st == 200, "GET " .. res .. " -> " .. tostring(st))
          local have = m[('cozygpu_watch_cache_objects{resource="%s"}'):format(res)] or 0
          last[res] = ("%d of %d"):format(have, #list.items)
          if have ~= #list.items then return false end
        end
        return true
      end, 30, 0.2), ("replica %s's caches do not hold the DRA objects: %s"):format(r.identity, json.encode(last)))
    end
  end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

  describe("under Forbidden", function()
    it("refuses a pod asking for a device-plugin GPU name", function()
      refused(pod("raw", { limits = { ["nvidia.com/AD102GL_L40S"] = "1" } }),
        "spec.containers[0].resources.limits[nvidia.com/AD102GL_L40S]: pod requests GPU")
    end)

    it("refuses a VMI asking for a device-plugin GPU name without a class", function()
      refused(vmi("raw", { gpus = { { name = "g", deviceName = "nvidia.com/AD102GL_L40S" } } }),
        "spec.domain.devices.gpus[0].deviceName: ")
    end)

    it("refuses a pod naming a ResourceClaim whose `exactly` request is a GPU device class", function()
      refused(pod("dra-exactly", { claims = { { name = "gpu", resourceClaimName = "exactly-gpu" } } }),
        "spec.resourceClaims[0]: pod requests GPU \"DRA device class gpu.nvidia.com\"")
    end)

    it("refuses a pod naming a ResourceClaim with a GPU class among its `firstAvailable` subrequests", function()
      refused(pod("dra-first", { claims = { { name = "gpu", resourceClaimName = "first-available-gpu" } } }),
        "spec.resourceClaims[0]: pod requests GPU \"DRA device class gpu.nvidia.com\"")
    end)

    it("refuses a pod naming a ResourceClaimTemplate of a GPU device class", function()
      refused(pod("dra-template", { claims = { { name = "gpu", resourceClaimTemplateName = "gpu-template" } } }),
        "spec.resourceClaims[0]: pod requests GPU \"DRA device class gpu.nvidia.com\"")
    end)

    it("refuses a pod asking for a GPU device class's implicit extended resource name", function()
      refused(pod("dra-implicit", { limits = { ["deviceclass.resource.kubernetes.io/" .. GPU_CLASS] = "1" } }),
        "spec.containers[0].resources.limits[deviceclass.resource.kubernetes.io/gpu.nvidia.com]: ")
    end)

    it("refuses a pod asking for the extended resource name a GPU DeviceClass declares", function()
      local dc = c:get("/apis/resource.k8s.io/v1/deviceclasses/vfio.gpu.nvidia.com")
      -- the API server keeps the field only where the DRAExtendedResource
      -- feature is on; this spec needs it kept
      assert.are.equal("example.com/gpu", dc.spec.extendedResourceName)
      refused(pod("dra-extended", { limits = { ["example.com/gpu"] = "1" } }),
        "spec.containers[0].resources.limits[example.com/gpu]: pod requests GPU \"example.com/gpu (DRA extended resource of device class vfio.gpu.nvidia.com)\"")
    end)

    it("refuses a VMI whose GPU is a DRA claim (spec.resourceClaims, gpus[].claimName)", function()
      refused(vmi("dra-vmi", { claims = { { name = "gpu", resourceClaimName = "exactly-gpu" } },
        gpus = { { name = "g", claimName = "gpu", requestName = "gpu" } } }), "spec.domain.devices.gpus[0].claimName: ")
    end)

    it("refuses a VMI with a GPU DRA claim that no device names (its launcher pod would get it)", function()
      local v = vmi("dra-vmi-unnamed", { claims = { { name = "gpu", resourceClaimName = "exactly-gpu" } } })
      v.spec.domain.devices = { disks = { { name = "root", disk = { bus = "virtio" } } } }
      refused(v, "spec.resourceClaims[0]")
    end)

    it("admits a pod whose DRA claim is of a device class that is no GPU class", function()
      admitted(pod("dra-nic", { claims = { { name = "nic", resourceClaimName = "nic" } } }))
    end)
  end)

  describe("under Warn", function()
    setup(function() c:reconfigure(mode("Warn")) end)

    it("admits a pod asking for a device-plugin GPU name, with a warning kubectl prints", function()
      local text = admitted(pod("raw-warn", { limits = { ["nvidia.com/AD102GL_L40S"] = "1" } }))
      assert.matches("Warning: [^\n]*nvidia.com/AD102GL_L40S", text)
    end)

    it("admits a pod naming a GPU ResourceClaim, with a warning", function()
      local text = admitted(pod("dra-warn", { claims = { { name = "gpu", resourceClaimName = "exactly-gpu" } } }))
      assert.matches("Warning: [^\n]*gpu.nvidia.com", text)
    end)
  end)
end)
