-- The launcher pod of a VMI naming GPUClaims, on a real control plane
-- (issue 19, DESIGN.md §4, decisions 0020, 0025): kube-apiserver calls
-- /mutate/launcher, which pins a pod whose claims are bound to the claims'
-- node or gates it (gpu.cozystack.io/claims) while a claim waits; then
-- kube-scheduler, not the spec, decides where the pod goes. A gated pod
-- stays unscheduled until the leader binds its claims, pins the pod and
-- removes the gate. Nodes are objects with allocatable and a Ready
-- condition (no kubelet: no container starts).
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local json = H.json

local NS = "tenant-a"
local CLAIMS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/"
local PODS = "/api/v1/namespaces/" .. NS .. "/pods/"
local GATE = "gpu.cozystack.io/claims"

describe("launcher pods placed by kube-scheduler", function()
  local c

  local function create(obj)
    local out, err, code = c:kubectl({ "create", "-f", "-", "-o", "json" }, { stdin = json.encode(obj) })
    assert(code == 0, ("kubectl create %s/%s: %s%s"):format(obj.kind, obj.metadata.name, out, err))
    return json.decode(out)
  end
  local function claim(name)
    return create { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = name, namespace = NS }, spec = { class = "l40s", count = 1 } }
  end
  local function claim_status(name)
    local cl = c:get(CLAIMS .. name)
    return cl and cl.status or {}
  end
  -- a VMI naming claims, as a tenant creates it (its VM controller would)
  local function vmi(name, claims)
    return create { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = NS, annotations = { [GATE] = claims } },
      spec = { domain = { devices = { gpus = { { name = "gpu1", deviceName = G.L40S } } },
        resources = { requests = { memory = "1Gi" } } } } }
  end
  -- the virt-launcher pod virt-controller creates for VMI v (label, owner,
  -- the claims annotation copied, the GPU in the compute container)
  local function launcher(v)
    return create { apiVersion = "v1", kind = "Pod",
      metadata = { name = "virt-launcher-" .. v.metadata.name .. "-abcde", namespace = NS,
        labels = { ["kubevirt.io"] = "virt-launcher", ["vm.kubevirt.io/name"] = v.metadata.name },
        annotations = { [GATE] = v.metadata.annotations[GATE], ["kubevirt.io/domain"] = v.metadata.name },
        ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = v.metadata.name,
          uid = v.metadata.uid, controller = true, blockOwnerDeletion = true } } },
      spec = { containers = { { name = "compute", image = "quay.io/kubevirt/virt-launcher:v1.9.0",
        resources = { limits = { [G.L40S] = "1" }, requests = { [G.L40S] = "1" } } } } } }
  end
  local function pod(name) return c:get(PODS .. name) end
  local function gated(p)
    for _, g in ipairs(p.spec.schedulingGates or {}) do
      if g.name == GATE then return true end
    end
    return false
  end
  local function scheduled_cond(p)
    for _, x in ipairs(p.status and p.status.conditions or {}) do
      if x.type == "PodScheduled" then return x end
    end
  end

  local session = K.session { prepare = function(cl)
    c = cl
    G.add_node(c, "gpu-node-1", 1)
  end }
  setup(session.setup)
  teardown(session.teardown)

  it("the catalog shows the node's free unit, as kubectl prints it (decision 0030)", function()
    -- the leader's merge patch of GPUClass status, through the status
    -- subresource; the printer columns of deploy/crds
    assert(P.wait_until(function()
      local out = c:must { "get", "gpuclass", "l40s", "-o", "jsonpath={.status.free}/{.status.maxFreePerNode}" }
      return out == "1/1"
    end, 30, 0.2), c:must { "get", "gpuclass", "l40s", "-o", "yaml" })
    local out = c:must { "get", "gpuclass", "l40s" }
    local header, row = out:match("^([^\n]+)\n([^\n]+)")
    -- kubectl aligns the columns: a cell starts where its header does
    -- (empty cells, e.g. PROFILE of a passthrough class, stay empty)
    local by, starts = {}, {}
    for pos, col in header:gmatch("()(%S+)") do starts[#starts + 1] = { pos, col } end
    for i, st in ipairs(starts) do
      local last = starts[i + 1] and starts[i + 1][1] - 1 or #row
      by[st[2]] = (row:sub(st[1], last):gsub("^%s+", ""):gsub("%s+$", ""))
    end
    assert.are.same({ "l40s", "Passthrough", "1", "1" }, { by.NAME, by.MODE, by.FREE, by["MAX-FREE-PER-NODE"] })
  end)

  it("a pod whose claims are Bound is pinned at create and scheduled onto the claims' node", function()
    claim("bound-a")
    assert(P.wait_until(function() return claim_status("bound-a").phase == "Bound" end, 30, 0.2),
      json.encode(claim_status("bound-a")))
    local node = claim_status("bound-a").node
    assert.are.equal("gpu-node-1", node)
    local v = vmi("ready", "bound-a")
    local p = launcher(v)
    assert.is_false(gated(p))
    -- the pin: a required node affinity to the claims' node (decision 0025)
    local terms = p.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
    assert.are.same({ { key = "metadata.name", operator = "In", values = { node } } }, terms[1].matchFields)
    -- kube-scheduler binds it there (the class's toleration of the node's
    -- GPU taint came from the webhook too)
    local placed = P.wait_until(function()
      local x = pod(p.metadata.name)
      return x and x.spec.nodeName
    end, 30, 0.2)
    assert.are.equal(node, placed)
  end)

  it("a pod whose claim waits is gated, stays unscheduled, and goes to the node its claim is bound to", function()
    -- gpu-node-1's one unit is held by bound-a: this claim waits for room
    claim("waiting")
    assert(P.wait_until(function() return claim_status("waiting").phase == "Pending" end, 30, 0.2))
    local v = vmi("queued", "waiting")
    local p = launcher(v)
    assert.is_true(gated(p))
    -- kube-scheduler leaves a gated pod alone and says so
    -- (KEP-3521: PodScheduled False, reason SchedulingGated)
    assert(P.wait_until(function()
      local x = pod(p.metadata.name)
      local sc = x and scheduled_cond(x)
      return sc and sc.reason == "SchedulingGated"
    end, 30, 0.2), json.encode(pod(p.metadata.name)))
    P.sleep(2)
    assert.is_nil(pod(p.metadata.name).spec.nodeName)
    -- room: the leader binds the claim to the new node, pins the pod and
    -- removes the gate; kube-scheduler then places it there
    G.add_node(c, "gpu-node-2", 1)
    local placed = P.wait_until(function()
      local x = pod(p.metadata.name)
      return x and x.spec.nodeName
    end, 60, 0.2)
    assert.are.equal("gpu-node-2", placed, json.encode(pod(p.metadata.name)))
    assert.are.equal("gpu-node-2", claim_status("waiting").node)
    assert.is_false(gated(pod(p.metadata.name)))
  end)
end)
