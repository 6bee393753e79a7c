-- The billing annotation of virt-launcher pods (policies/launcher-billing.lua;
-- DESIGN.md §3 "Usage records": a virt-launcher pod must not report GPUs
-- a second time; docs/decisions/0028). Cozystack's monitor reconciler
-- reads workload.cozystack.io/resources as a JSON object of name ->
-- quantity string and overrides those keys of the pod's summed requests
-- (cozystack internal/controller/workloadmonitor_controller.go); a value
-- that does not decode into map[string]string is ignored whole. Each case
-- runs twice on one engine (a leaked global would show as a difference).
local json = H.json

local L40S, A100_40C = "nvidia.com/AD102GL_L40S", "nvidia.com/A100-40C"
local KEY = "workload.cozystack.io/resources"
local T_MODE = { key = "gpu.cozystack.io/mode", operator = "Equal", value = "passthrough", effect = "NoSchedule" }
local T_VGPU = { key = "gpu.cozystack.io/mode", operator = "Equal", value = "vgpu", effect = "NoSchedule" }
local GATE = { name = "gpu.cozystack.io/claims" }

local e
before_each(function()
  e = H.engine {
    H.class("l40s", { mode = "Passthrough", resourceName = L40S, tolerations = json.array { T_MODE } }),
    H.class("a100-40c", { mode = "VGPU", profile = "A100-40C", resourceName = A100_40C, maxCount = 2,
      tolerations = json.array { T_VGPU } }),
    { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "a1", namespace = "tenant-a" },
      spec = { class = "l40s", count = 1 }, status = { phase = "Bound", node = "gpu-1" } },
    -- KubeVirt installed in cozy-kubevirt: its virt-controller is the
    -- service account kubevirt-controller there (H.request's user)
    { apiVersion = "kubevirt.io/v1", kind = "KubeVirt", metadata = { name = "kubevirt", namespace = "cozy-kubevirt" } },
  }
end)

-- A gated launcher pod (so the claims rule adds nothing) tolerating both
-- classes (so the tolerations rule adds nothing): the patch is the
-- billing rule's alone. o = {annotations, labels}.
local function pod(resources, o)
  local p = H.launcher("vm1", resources, { T_MODE, T_VGPU })
  p.metadata.annotations = o.annotations
  for k, v in pairs(o.labels or {}) do p.metadata.labels[k] = v end
  p.spec.schedulingGates = json.array { GATE }
  return p
end

-- The annotation after the patch (decoded), or nil when there is no patch;
-- `user` (default: the virt-controller, H.request's) creates the pod.
local function billed(p, user)
  local ops
  for _ = 1, 2 do
    local req = H.request(p)
    if user then req.userInfo = { username = user } end
    local resp = assert(e:review(req))
    assert.is_true(resp.allowed)
    local got = H.patch_of(resp)
    if ops ~= nil then assert.are.same(ops, got or false) end
    ops = got or false
  end
  if not ops then return nil end
  local patched = assert(require("cozygpu.jsonpatch").apply(p, ops))
  return assert(json.decode(patched.metadata.annotations[KEY])), ops
end

describe("virt-launcher billing annotation", function()
  local claims = { ["gpu.cozystack.io/claims"] = "a1" }

  it("sets each class GPU of a claims pod to \"0\", and only those", function()
    assert.are.same({ [L40S] = "0" }, (billed(pod({ [L40S] = "1", cpu = "2" }, { annotations = claims }))))
  end)

  it("zeroes nothing in a pod someone else than the virt-controller creates, however it is labelled", function()
    -- labels and owner references are the creator's to write: a tenant's
    -- own pod dressed as a launcher keeps its GPUs billed
    assert.is_nil(billed(pod({ [L40S] = "4" }, { annotations = claims }), "tenant-a-admin"))
    -- nor when the virt-controller is not known (no setting, no KubeVirt CR)
    e = H.engine { H.class("l40s", { mode = "Passthrough", resourceName = L40S, tolerations = json.array { T_MODE } }) }
    assert.is_nil(billed(pod({ [L40S] = "1" }, { annotations = claims })))
  end)

  it("keeps the other keys of an annotation copied from the VMI", function()
    local a = { ["gpu.cozystack.io/claims"] = "a1", [KEY] = '{"memory":"8Gi","' .. L40S .. '":"1"}' }
    assert.are.same({ memory = "8Gi", [L40S] = "0" }, (billed(pod({ [L40S] = "1" }, { annotations = a }))))
  end)

  for _, bad in ipairs { "memory=8Gi", '{"cpu":2}', '["x"]', "null" } do
    it("replaces an annotation Cozystack ignores whole: " .. bad, function()
      local a = { ["gpu.cozystack.io/claims"] = "a1", [KEY] = bad }
      assert.are.same({ [L40S] = "0" }, (billed(pod({ [L40S] = "1" }, { annotations = a }))))
    end)
  end

  it("adds nothing when the annotation says \"0\" already", function()
    local a = { ["gpu.cozystack.io/claims"] = "a1", [KEY] = '{"' .. L40S .. '":"0"}' }
    assert.is_nil(billed(pod({ [L40S] = "1" }, { annotations = a })))
  end)

  it("adds the annotations of a template VMI's pod, one key per class", function()
    local a, ops = billed(pod({ [L40S] = "2", [A100_40C] = "1" },
      { labels = { ["gpu.cozystack.io/class-reference"] = "true" } }))
    assert.are.same({ [L40S] = "0", [A100_40C] = "0" }, a)
    assert.are.equal("/metadata/annotations", ops[1].path)
  end)

  -- decision 0036, item 4: a raw-name GPU has no claim and no record; an
  -- override copied from the VMI would leave it unbilled
  it("removes an override of a GPU no claim covers, keeping the other keys: the pod bills it", function()
    local a = { [KEY] = '{"memory":"8Gi","' .. L40S .. '":"0"}' }
    assert.are.same({ memory = "8Gi" }, (billed(pod({ [L40S] = "1" }, { annotations = a }))))
    -- whoever creates the pod: nothing is zeroed for a tenant, and nothing
    -- may be zeroed by one either
    assert.are.same({ memory = "8Gi" }, (billed(pod({ [L40S] = "1" }, { annotations = a }), "tenant-a-admin")))
    -- a tenant's pod naming claims: nothing zeroed, the override removed
    local mixed = { ["gpu.cozystack.io/claims"] = "a1", [KEY] = '{"' .. A100_40C .. '":"0"}' }
    assert.are.same({}, (billed(pod({ [L40S] = "1", [A100_40C] = "1" }, { annotations = mixed }), "tenant-a-admin")))
  end)

  it("leaves an annotation Cozystack ignores whole on a raw-name pod (it bills the requests already)", function()
    assert.is_nil(billed(pod({ [L40S] = "1" }, { annotations = { [KEY] = '{"' .. L40S .. '":0}' } })))
  end)

  it("leaves raw-name pods and pods no VMI owns alone", function()
    assert.is_nil(billed(pod({ [L40S] = "1" }, {})))
    local p = pod({ [L40S] = "1" }, { annotations = claims })
    p.metadata.ownerReferences = nil
    assert.is_nil(billed(p))
  end)
end)
