-- The leader's binder against the API server double, two replicas
-- (DESIGN.md §3, §4, §6; docs/decisions/0020, 0026). Nodes carry what the
-- kubelet and the agent would write: Ready, allocatable of the L40S
-- resource name, a boot ID, and a GPUNode built from a fake sysfs tree of
-- L40S GPUs on vfio-pci (each in its own IOMMU group), so a node's offer
-- is computed by cozygpu.capacity exactly as in a cluster. Everything the
-- spec asserts is read back from the double with kubectl or GET.
local P = require "proc"
local E = require "controller_env"
local G = require "gpu_nodes"
local json = H.json

local L40S = G.L40S
local NS = "tenant-b" -- no ResourceQuota (examples/cluster/quotas.yaml budgets tenant-a): capacity alone decides

local function kubectl(d, args, stdin)
  if stdin then
    local f = H.tmpdir() .. "/in.json"
    H.write(f, type(stdin) == "string" and stdin or json.encode(stdin))
    args[#args + 1] = "-f"
    args[#args + 1] = f
  end
  local out, code = E.kubectl(d, args)
  return out, code
end

local function must(d, method, path, body, ctype)
  local v, st = E.send(d, method, path, body, ctype)
  assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st), json.encode(v or {})))
  return v
end

local function add_node(d, name, units)
  G.add_node(d, name, units)
end

local function add_claim(d, name, count, class)
  local out, code = kubectl(d, { "apply" }, { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
    metadata = { name = name, namespace = NS }, spec = { class = class or "l40s", count = count } })
  assert(code == 0, out)
end

-- Creates a virt-launcher pod of VMI `vmi` (the object as created) with
-- kubectl, as KubeVirt would (label kubevirt.io=virt-launcher, controller
-- ownerReference to the VMI); o = {annotations, gates (list of names),
-- affinity, resources}. Returns nothing; fails on a refusal.
local function launcher(d, name, vmi, o)
  o = o or {}
  local gates
  if o.gates then
    gates = {}
    for i, g in ipairs(o.gates) do gates[i] = { name = g } end
  end
  local out, code = kubectl(d, { "create" }, {
    apiVersion = "v1", kind = "Pod",
    metadata = { name = name, namespace = NS, labels = { ["kubevirt.io"] = "virt-launcher" },
      annotations = o.annotations,
      ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = vmi.metadata.name,
        uid = vmi.metadata.uid, controller = true, blockOwnerDeletion = true } } },
    spec = { schedulingGates = gates, affinity = o.affinity,
      containers = { { name = "compute", image = "quay.io/kubevirt/virt-launcher:v1.4.0", resources = o.resources } } } })
  assert.are.equal(0, code, out)
end

local function required_terms(terms)
  return { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = terms } } }
end

-- Waits until GET `path` on the double answers 404 (the object is gone).
local function wait_gone(d, path, timeout, msg)
  local st
  assert(P.wait_until(function()
    st = select(2, E.get(d, path))
    return st == 404
  end, timeout or 15), (msg or path .. " is still there") .. " (last status " .. tostring(st) .. ")")
end

-- Creates a template VMI (decision 0027: the class-reference label, no
-- claims annotation) with `gpus` (default 1) L40S entries; returns it.
local function template_vmi(d, name, gpus)
  local list = {}
  for i = 1, gpus or 1 do list[i] = { name = "gpu" .. (i - 1), deviceName = L40S } end
  return must(d, "POST", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances", {
    apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
    metadata = { name = name, namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" } },
    spec = { domain = { devices = { gpus = list } } } })
end

local function claim(d, name)
  return (E.get(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/" .. name))
end

local function ready_cond(c)
  for _, x in ipairs(c and c.status and c.status.conditions or {}) do
    if x.type == "Ready" then return x end
  end
  return nil
end

-- Waits until claim `name` has `phase` (and `node`, when given: false for
-- none). Returns the claim.
local function wait_claim(d, name, phase, node, timeout)
  local last
  local ok = P.wait_until(function()
    last = claim(d, name)
    local st = last and last.status or {}
    if st.phase ~= phase then return false end
    if node == false then return st.node == nil end
    return node == nil or st.node == node
  end, timeout or 15)
  assert(ok, ("claim %s: wanted %s on %s, got %s"):format(name, phase, tostring(node), json.encode(last or {})))
  return last
end

local function lease_holder(d)
  local l = E.get(d, "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
  return l and l.spec and l.spec.holderIdentity
end

-- units held per node by Bound/Attached claims, from the API
local function held(d)
  local out = {}
  for _, c in ipairs(d:state("gpuclaims").items) do
    local st = c.status or {}
    if (st.phase == "Bound" or st.phase == "Attached") and st.node then
      out[st.node] = (out[st.node] or 0) + c.spec.count
    end
  end
  return out
end

describe("the leader's binder (two replicas against the double)", function()
  local dir, d, certs
  local replicas = {}

  setup(function()
    dir = H.tmpdir()
    certs = P.certs(dir, { "cozygpu-webhook.cozy-gpu.svc" })
    d = E.start_double()
    E.load_examples(d)
    for _, id in ipairs { "replica-a", "replica-b" } do
      replicas[id] = E.start_controller { double = d, dir = dir, certs = certs, identity = id }
    end
    assert(P.wait_until(function() return lease_holder(d) ~= nil end, 20), "no replica took the Lease")
  end)

  teardown(function()
    for _, c in pairs(replicas) do P.stop(c.pid, 5) end
    d:stop()
    P.stop_all()
  end)

  it("binds a claim on a node with room and says so in status, as kubectl shows it", function()
    add_node(d, "gpu-1", 2)
    add_claim(d, "c1", 1)
    local c = wait_claim(d, "c1", "Bound", "gpu-1")
    local r = ready_cond(c)
    assert.are.equal("True", r.status)
    assert.are.equal("Placed", r.reason)
    assert.are.equal(c.metadata.generation, c.status.observedGeneration)
    assert.is_string(r.lastTransitionTime)
    local out, code = E.kubectl(d, { "get", "gpuclaims", "-n", NS, "-o", "wide" })
    assert.are.equal(0, code, out)
    assert.matches("c1%s+l40s%s+1%s+Bound%s+gpu%-1", out)
  end)

  it("keeps a claim that fits nowhere Pending with NoNodeWithRoom, naming the class", function()
    add_claim(d, "big", 4) -- gpu-1 offers 2 L40S
    local c = wait_claim(d, "big", "Pending")
    assert(P.wait_until(function()
      c = claim(d, "big")
      return ready_cond(c) and ready_cond(c).reason == "NoNodeWithRoom"
    end, 10), json.encode(c))
    assert.are.equal("False", ready_cond(c).status)
    assert.matches("l40s", ready_cond(c).message)
    -- no inventory leaks into it: no node names, no counts of free units
    -- elsewhere (decision 0020 §2: capacity is the hoster's business)
    assert.is_nil(ready_cond(c).message:find("gpu-1", 1, true), ready_cond(c).message)
  end)

  it("moves an unattached claim off a cordoned node (onCordon Move) to a node with room", function()
    add_node(d, "gpu-2", 2)
    local out, code = E.kubectl(d, { "cordon", "gpu-1" })
    assert.are.equal(0, code, out)
    wait_claim(d, "c1", "Bound", "gpu-2")
    out, code = E.kubectl(d, { "uncordon", "gpu-1" })
    assert.are.equal(0, code, out)
  end)

  it("marks a claim Attached while its VMI runs on the claim's node, and Bound again once the VMI is gone", function()
    local vmi = must(d, "POST", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances", {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = "vm1", namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" },
        annotations = { ["gpu.cozystack.io/claims"] = "c1" } },
      spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
    vmi.status = { phase = "Running", nodeName = "gpu-2" }
    must(d, "PUT", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/vm1/status", vmi)
    local c = wait_claim(d, "c1", "Attached", "gpu-2")
    assert.are.equal("vm1", c.status.attachedTo)
    assert.are.equal("Attached", ready_cond(c).reason)
    must(d, "DELETE", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/vm1")
    c = wait_claim(d, "c1", "Bound", "gpu-2")
    assert.is_nil(c.status.attachedTo)
  end)

  it("pins a gated launcher pod to its claims' node and removes the gate", function()
    local vmi = must(d, "POST", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances", {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = "vm2", namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" },
        annotations = { ["gpu.cozystack.io/claims"] = "c1" } },
      spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
    launcher(d, "virt-launcher-vm2-abcde", vmi, {
      annotations = { ["gpu.cozystack.io/claims"] = "c1" },
      gates = { "gpu.cozystack.io/claims" },
      affinity = required_terms { { matchExpressions = { { key = "kubernetes.io/arch", operator = "In", values = { "amd64" } } } } },
      resources = { limits = { [L40S] = "1" }, requests = { [L40S] = "1" } } })
    local pod
    assert(P.wait_until(function()
      pod = E.get(d, "/api/v1/namespaces/" .. NS .. "/pods/virt-launcher-vm2-abcde")
      return pod and pod.spec.schedulingGates == nil
    end, 15), json.encode(pod or {}))
    -- the existing term is narrowed (KEP-3838: a requirement added to every term)
    local terms = pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
    assert.are.equal(1, #terms)
    assert.are.same({ { key = "kubernetes.io/arch", operator = "In", values = { "amd64" } } }, terms[1].matchExpressions)
    assert.are.same({ { key = "metadata.name", operator = "In", values = { "gpu-2" } } }, terms[1].matchFields)
    must(d, "DELETE", "/api/v1/namespaces/" .. NS .. "/pods/virt-launcher-vm2-abcde")
    must(d, "DELETE", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/vm2")
  end)

  it("after the leader is killed, the other replica rebuilds from status and never books a unit twice", function()
    local holder = lease_holder(d)
    assert.is_truthy(replicas[holder], tostring(holder))
    P.kill(replicas[holder].pid, 9)
    replicas[holder] = nil
    -- orders while and after the lead changes hands
    for i = 1, 4 do add_claim(d, "k" .. i, 1) end
    local other = holder == "replica-a" and "replica-b" or "replica-a"
    assert(P.wait_until(function() return lease_holder(d) == other end, 20), "the Lease did not move")
    -- gpu-1 and gpu-2 offer 2 each; c1 holds one on gpu-2: three of k1..k4 fit
    assert(P.wait_until(function()
      local bound, pending = 0, 0
      for i = 1, 4 do
        local c = claim(d, "k" .. i)
        local ph = c and c.status and c.status.phase
        if ph == "Bound" then bound = bound + 1 elseif ph == "Pending" and ready_cond(c) then pending = pending + 1 end
      end
      return bound == 3 and pending == 1
    end, 20))
    local h = held(d)
    assert.are.equal(2, h["gpu-1"])
    assert.are.equal(2, h["gpu-2"])
    assert.are.equal("c1", (function()
      for _, c in ipairs(d:state("gpuclaims").items) do
        if c.metadata.name == "c1" then return c.metadata.name .. (c.status.node == "gpu-2" and "" or "?") end
      end
    end)())
  end)
end)

-- One case per rule of DESIGN.md §6, each in a fresh cluster with two
-- replicas, so that what one case leaves cannot steer another.
describe("the leader's binder, rule by rule (DESIGN.md §6)", function()
  local d, certs, cluster

  before_each(function()
    cluster = E.start_cluster { certs = certs }
    d, certs = cluster.d, cluster.certs
  end)

  after_each(function() E.stop_cluster(cluster) end)

  teardown(function() P.stop_all() end)

  local function set_ready(name, status)
    local node = must(d, "GET", "/api/v1/nodes/" .. name)
    local units = tonumber(node.status.capacity[L40S])
    G.node_status(d, name, { units = units, ready = status })
  end

  local function vmi(name, claims, phase, node)
    local v = must(d, "POST", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances", {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = NS,
        -- a raw-name VMI (claims nil) has neither the label nor the annotation
        labels = claims and { ["gpu.cozystack.io/class-reference"] = "true" } or nil,
        annotations = claims and { ["gpu.cozystack.io/claims"] = claims } or nil },
      spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
    if phase then
      v.status = { phase = phase, nodeName = node }
      v = must(d, "PUT", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/" .. name .. "/status", v)
    end
    return v
  end

  local function vmi_phase(name, phase, node)
    local v = must(d, "GET", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/" .. name)
    v.status = { phase = phase, nodeName = node }
    must(d, "PUT", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/" .. name .. "/status", v)
  end

  local function wait_reason(name, reason)
    local c
    assert(P.wait_until(function()
      c = claim(d, name)
      return ready_cond(c) and ready_cond(c).reason == reason
    end, 15), ("claim %s: wanted reason %s, got %s"):format(name, reason, json.encode(c or {})))
    return c
  end

  it("onCordon Stay: an unattached claim keeps its cordoned node and says why", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "s1", 1)
    wait_claim(d, "s1", "Bound", "gpu-1")
    local out, code = E.kubectl(d, { "patch", "gpuclass", "l40s", "--type=merge", "-p", '{"spec":{"onCordon":"Stay"}}' })
    assert.are.equal(0, code, out)
    add_node(d, "gpu-2", 1)
    out, code = E.kubectl(d, { "cordon", "gpu-1" })
    assert.are.equal(0, code, out)
    local c = wait_reason("s1", "NodeCordoned")
    assert.are.equal("Bound", c.status.phase)
    assert.are.equal("gpu-1", c.status.node)
    assert.matches("gpu%-1", ready_cond(c).message)
    -- and a new order does not take gpu-1 while it is cordoned
    add_claim(d, "s2", 1)
    wait_claim(d, "s2", "Bound", "gpu-2")
  end)

  it("a class changed from Move to Stay while its claim waits on a cordoned node: the message says Stay", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "m1", 1)
    wait_claim(d, "m1", "Bound", "gpu-1")
    local out, code = E.kubectl(d, { "cordon", "gpu-1" })
    assert.are.equal(0, code, out)
    local c = wait_reason("m1", "NodeCordoned")
    assert.matches("onCordon: Move", ready_cond(c).message, 1, true)
    out, code = E.kubectl(d, { "patch", "gpuclass", "l40s", "--type=merge", "-p", '{"spec":{"onCordon":"Stay"}}' })
    assert.are.equal(0, code, out)
    assert(P.wait_until(function()
      c = claim(d, "m1")
      return ready_cond(c).message:find("onCordon: Stay", 1, true) ~= nil
    end, 15), json.encode(c))
    assert.are.equal("Bound", c.status.phase)
  end)

  it("node NotReady: the attached claim goes Lost waiting for its VMI, and Attached again when the node returns", function()
    add_node(d, "gpu-1", 1)
    add_node(d, "gpu-2", 1)
    add_claim(d, "a1", 1)
    local n = wait_claim(d, "a1", "Bound").status.node
    vmi("vm-a", "a1", "Running", n)
    wait_claim(d, "a1", "Attached", n)
    set_ready(n, "Unknown")
    local c = wait_claim(d, "a1", "Lost", n)
    assert.are.equal("WaitingForVMIEnd", ready_cond(c).reason)
    assert.are.equal("False", ready_cond(c).status)
    set_ready(n, "True")
    c = wait_claim(d, "a1", "Attached", n)
    assert.are.equal("vm-a", c.status.attachedTo)
  end)

  it("node NotReady and the VMI fails: the claim is rebound on another node", function()
    add_node(d, "gpu-1", 1)
    add_node(d, "gpu-2", 1)
    add_claim(d, "f1", 1)
    local n = wait_claim(d, "f1", "Bound").status.node
    local other = n == "gpu-1" and "gpu-2" or "gpu-1"
    vmi("vm-f", "f1", "Running", n)
    wait_claim(d, "f1", "Attached", n)
    set_ready(n, "False")
    wait_claim(d, "f1", "Lost", n)
    -- a deletion timestamp alone does not end Attached/Lost: only a final VMI does
    vmi_phase("vm-f", "Failed", n)
    local c = wait_claim(d, "f1", "Bound", other)
    assert.are.equal("Placed", ready_cond(c).reason)
    assert.is_nil(c.status.attachedTo)
  end)

  it("node deleted with no room elsewhere: the claim goes Lost, and is rebound before a newer order when room returns", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "l1", 1)
    wait_claim(d, "l1", "Bound", "gpu-1")
    local out, code = E.kubectl(d, { "delete", "node", "gpu-1" })
    assert.are.equal(0, code, out)
    local c = wait_claim(d, "l1", "Lost", false)
    assert.are.equal("NodeLost", ready_cond(c).reason)
    add_claim(d, "n1", 1) -- a newer order, waiting too
    wait_reason("n1", "NoNodeWithRoom")
    add_node(d, "gpu-9", 1) -- room for one
    wait_claim(d, "l1", "Bound", "gpu-9")
    c = wait_claim(d, "n1", "Pending")
    assert.are.equal("NoNodeWithRoom", ready_cond(c).reason)
  end)

  it("a set that must move while its VMI is Pending has that VMI deleted (its launcher pod was pinned to the old node)", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "p1", 1)
    local n = wait_claim(d, "p1", "Bound").status.node
    vmi("vm-p", "p1", "Pending")
    add_node(d, "gpu-2", 1)
    local out, code = E.kubectl(d, { "cordon", n })
    assert.are.equal(0, code, out)
    wait_claim(d, "p1", "Bound", "gpu-2")
    wait_gone(d, "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/vm-p", 15, "the pending VMI was not deleted")
  end)

  -- the class stays through the leader's own finalizer (decision 0037);
  -- the order d2 reaches the double without the webhook, so it waits
  it("a class being deleted keeps its Bound claim and leaves a new order waiting with a reason, and goes with its last claim", function()
    local CLASS = "/apis/cozystack.io/v1alpha1/gpuclasses/l40s"
    add_node(d, "gpu-1", 2)
    add_claim(d, "d1", 1)
    wait_claim(d, "d1", "Bound", "gpu-1")
    assert(P.wait_until(function()
      local k = E.get(d, CLASS)
      return k and table.concat(k.metadata.finalizers or {}, ","):find("gpu.cozystack.io/class-protection", 1, true)
    end, 15, 0.1), "no class-protection finalizer on l40s")
    local out, code = E.kubectl(d, { "delete", "gpuclass", "l40s", "--wait=false" })
    assert.are.equal(0, code, out)
    add_claim(d, "d2", 1)
    local c = wait_reason("d2", "ClassBeingDeleted")
    assert.are.equal("Pending", c.status.phase)
    c = claim(d, "d1")
    assert.are.equal("Bound", c.status.phase)
    assert.are.equal("gpu-1", c.status.node)
    assert.is_string((E.get(d, CLASS)).metadata.deletionTimestamp)
    for _, n in ipairs { "d1", "d2" } do
      out, code = E.kubectl(d, { "delete", "gpuclaim", n, "-n", NS, "--wait=false" })
      assert.are.equal(0, code, out)
    end
    wait_gone(d, CLASS, 15, "the class stayed after its last claim went")
  end)

  it("an ungated launcher pod pinned where its claims are not (a stale cache at creation) has its Pending VMI deleted", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "st1", 1)
    wait_claim(d, "st1", "Bound", "gpu-1")
    local v = vmi("vm-st", "st1", "Pending")
    launcher(d, "virt-launcher-vm-st-x", v, {
      annotations = { ["gpu.cozystack.io/claims"] = "st1" },
      affinity = required_terms { { matchFields = { { key = "metadata.name", operator = "In", values = { "gpu-old" } } } } } })
    wait_gone(d, "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/vm-st", 15, "the VMI of a pod pinned to the wrong node was not deleted")
  end)

  it("pins into every term that has a requirement and leaves an empty term empty (KEP-3838)", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "e1", 1)
    wait_claim(d, "e1", "Bound", "gpu-1")
    local v = vmi("vm-e", "e1", "Pending")
    launcher(d, "virt-launcher-vm-e-x", v, {
      gates = { "example.com/other", "gpu.cozystack.io/claims" },
      affinity = required_terms { json.object(), { matchExpressions = { { key = "zone", operator = "In", values = { "a" } } } } } })
    local pod
    assert(P.wait_until(function()
      pod = E.get(d, "/api/v1/namespaces/" .. NS .. "/pods/virt-launcher-vm-e-x")
      return #(pod.spec.schedulingGates or {}) == 1
    end, 15), json.encode(pod or {}))
    -- only our gate went; another controller's stays
    assert.are.same({ { name = "example.com/other" } }, pod.spec.schedulingGates)
    local terms = pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
    assert.are.equal(2, #terms)
    assert.is_nil(next(terms[1]))
    assert.are.same({ { key = "metadata.name", operator = "In", values = { "gpu-1" } } }, terms[2].matchFields)
  end)

  it("a claim deleted and created again under its name (another uid) is a new claim, not the old one's hold", function()
    add_node(d, "gpu-1", 2)
    add_claim(d, "r1", 1)
    wait_claim(d, "r1", "Bound", "gpu-1")
    -- keep the leader busy in a slow write so that the delete and the
    -- create reach it in one batch (its watch then holds only the new one)
    d:latency { method = "PUT", path = "/apis/cozystack.io/v1alpha1/namespaces/", ms = 1500, count = 1 }
    add_claim(d, "busy", 1)
    P.sleep(0.3)
    -- r1 is unused: the tenant may take the protection finalizer off
    -- (as with kubernetes.io/pvc-protection) and delete it at once
    must(d, "PATCH", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/r1",
      { metadata = { finalizers = json.null } })
    must(d, "DELETE", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/r1")
    add_claim(d, "r1", 1, "a100-40c") -- a class no node offers
    local c = wait_reason("r1", "NoNodeWithRoom")
    assert.are.equal("Pending", c.status.phase)
    assert.is_nil(c.status.node)
    assert.are.equal(1, held(d)["gpu-1"]) -- busy alone
  end)

  it("a VMI naming claims another VMI is attached to: its launcher pod stays gated", function()
    add_node(d, "gpu-1", 2)
    add_claim(d, "o1", 1)
    wait_claim(d, "o1", "Bound", "gpu-1")
    vmi("vm-o1", "o1", "Running", "gpu-1")
    wait_claim(d, "o1", "Attached", "gpu-1")
    local v2 = vmi("vm-o2", "o1", "Pending")
    launcher(d, "virt-launcher-vm-o2-x", v2, { annotations = { ["gpu.cozystack.io/claims"] = "o1" },
      gates = { "gpu.cozystack.io/claims" } })
    P.sleep(1.5)
    local pod = E.get(d, "/api/v1/namespaces/" .. NS .. "/pods/virt-launcher-vm-o2-x")
    assert.are.same({ { name = "gpu.cozystack.io/claims" } }, pod.spec.schedulingGates)
    assert.is_nil(pod.spec.affinity)
  end)

  it("a running VMI takes its claim from a stopped VM that names it too", function()
    add_node(d, "gpu-1", 1)
    add_node(d, "gpu-2", 1)
    add_claim(d, "s1", 1)
    local out, code = kubectl(d, { "apply" }, { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
      metadata = { name = "vm-stopped", namespace = NS },
      spec = { runStrategy = "Halted", template = { metadata = { annotations = { ["gpu.cozystack.io/claims"] = "s1" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } } } })
    assert.are.equal(0, code, out)
    local n = wait_claim(d, "s1", "Bound").status.node
    vmi("vm-running", "s1", "Running", n)
    local c = wait_claim(d, "s1", "Attached", n)
    assert.are.equal("vm-running", c.status.attachedTo)
    -- and a cordon does not move it from under the running VM
    out, code = E.kubectl(d, { "cordon", n })
    assert.are.equal(0, code, out)
    P.sleep(1.5)
    c = claim(d, "s1")
    assert.are.equal("Attached", c.status.phase)
    assert.are.equal(n, c.status.node)
  end)

  it("a running VMI whose claims annotation names nothing real still uses its node's GPUs", function()
    add_node(d, "gpu-1", 1)
    -- a raw-name VM runs there: the node has no room
    vmi("raw", nil, "Running", "gpu-1")
    add_claim(d, "w1", 1)
    wait_reason("w1", "NoNodeWithRoom")
    -- the tenant annotates the running VMI with claims that do not exist
    local out, code = E.kubectl(d, { "annotate", "vmi", "raw", "-n", NS, "gpu.cozystack.io/claims=nothing" })
    assert.are.equal(0, code, out)
    P.sleep(1.5)
    local c = claim(d, "w1")
    assert.are.equal("Pending", c.status.phase)
    assert.are.equal("NoNodeWithRoom", ready_cond(c).reason)
  end)

  it("a claim deleted while its VMI runs keeps its hold until the VMI ends (finalizer gpu.cozystack.io/claim-protection)", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "u1", 1)
    local c = wait_claim(d, "u1", "Bound", "gpu-1")
    assert(P.wait_until(function()
      c = claim(d, "u1")
      for _, f in ipairs(c.metadata.finalizers or {}) do
        if f == "gpu.cozystack.io/claim-protection" then return true end
      end
    end, 10), json.encode(c))
    vmi("vm-u", "u1", "Running", "gpu-1")
    wait_claim(d, "u1", "Attached", "gpu-1")
    local out, code = E.kubectl(d, { "delete", "gpuclaim", "u1", "-n", NS, "--wait=false" })
    assert.are.equal(0, code, out)
    add_claim(d, "u2", 1) -- the unit is still in use: it waits
    wait_reason("u2", "NoNodeWithRoom")
    c = claim(d, "u1")
    assert.is_string(c.metadata.deletionTimestamp)
    assert.are.equal("Attached", c.status.phase)
    -- the VMI ends: the deleted claim goes, and its unit is free again
    vmi_phase("vm-u", "Succeeded", "gpu-1")
    wait_gone(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/u1", 15, "the deleted claim was kept after its VMI ended")
    wait_claim(d, "u2", "Bound", "gpu-1")
  end)

  it("a template VMI gets its claims while it lives: created owned by it, bound, attached, deleted once it is final", function()
    add_node(d, "gpu-1", 2)
    local v = template_vmi(d, "pool-w1", 2)
    -- one claim for the class, two units, named <vmi>-<class> (decision 0027)
    local c = wait_claim(d, "pool-w1-l40s", "Bound", "gpu-1")
    assert.are.equal(2, c.spec.count)
    assert.are.equal("l40s", c.spec.class)
    assert.are.equal("true", c.metadata.labels["gpu.cozystack.io/template-claim"])
    local ref = c.metadata.ownerReferences[1]
    assert.are.same({ "VirtualMachineInstance", "pool-w1", v.metadata.uid, true },
      { ref.kind, ref.name, ref.uid, ref.controller })
    -- its launcher pod, gated by the webhook (decision 0027), is pinned there
    launcher(d, "virt-launcher-pool-w1-x", v, { gates = { "gpu.cozystack.io/claims" },
      resources = { limits = { [L40S] = "2" }, requests = { [L40S] = "2" } } })
    local pod
    assert(P.wait_until(function()
      pod = E.get(d, "/api/v1/namespaces/" .. NS .. "/pods/virt-launcher-pool-w1-x")
      return pod.spec.schedulingGates == nil
    end, 15), json.encode(pod or {}))
    assert.are.same({ { matchFields = { { key = "metadata.name", operator = "In", values = { "gpu-1" } } } } },
      pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
    -- it runs there: Attached
    vmi_phase("pool-w1", "Running", "gpu-1")
    c = wait_claim(d, "pool-w1-l40s", "Attached", "gpu-1")
    assert.are.equal("pool-w1", c.status.attachedTo)
    -- final: the claim goes (pay only while running), and its units are free
    vmi_phase("pool-w1", "Succeeded", "gpu-1")
    wait_gone(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/pool-w1-l40s", 15, "the template claim of a final VMI was kept")
    add_claim(d, "after", 2)
    wait_claim(d, "after", "Bound", "gpu-1")
  end)

  it("a claim of a template name the VMI does not own is never taken over", function()
    add_node(d, "gpu-1", 2)
    add_claim(d, "pool-w3-l40s", 1) -- the tenant's own claim, of the name the VMI's would have
    wait_claim(d, "pool-w3-l40s", "Bound", "gpu-1")
    local v = template_vmi(d, "pool-w3")
    launcher(d, "virt-launcher-pool-w3-x", v, { gates = { "gpu.cozystack.io/claims" } })
    P.sleep(1.5)
    local pod = E.get(d, "/api/v1/namespaces/" .. NS .. "/pods/virt-launcher-pool-w3-x")
    assert.are.same({ { name = "gpu.cozystack.io/claims" } }, pod.spec.schedulingGates)
    local c = claim(d, "pool-w3-l40s")
    assert.are.same({}, c.metadata.ownerReferences or {})
    -- it runs anyway (say the webhook was off): the claim is not attached to it
    vmi_phase("pool-w3", "Running", "gpu-1")
    P.sleep(1.5)
    c = claim(d, "pool-w3-l40s")
    assert.are.equal("Bound", c.status.phase)
    assert.is_nil(c.status.attachedTo)
    -- and when the VMI is final, the tenant's claim is not deleted with it
    vmi_phase("pool-w3", "Succeeded", "gpu-1")
    P.sleep(1.5)
    c = claim(d, "pool-w3-l40s")
    assert.are.equal("pool-w3-l40s", c.metadata.name)
    assert.is_nil(c.metadata.deletionTimestamp)
  end)

  it("a template VM whose VMI failed on a node gets its next VMI's claims placed elsewhere (DESIGN.md §6, last rule)", function()
    add_node(d, "gpu-1", 1)
    add_node(d, "gpu-2", 1)
    -- the VM whose controller replaces the VMI: what its VMIs failed on is
    -- remembered while the VM exists, also between two of its VMIs
    must(d, "POST", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachines", {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachine", metadata = { name = "pool-f1", namespace = NS },
      spec = { runStrategy = "Always", template = {
        metadata = { labels = { ["gpu.cozystack.io/class-reference"] = "true" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } } } })
    local function start()
      return template_vmi(d, "pool-f1")
    end
    start()
    local first = wait_claim(d, "pool-f1-l40s", "Bound").status.node
    local other = first == "gpu-1" and "gpu-2" or "gpu-1"
    vmi_phase("pool-f1", "Failed", first) -- it failed there (say the device would not attach)
    wait_gone(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/pool-f1-l40s", 15)
    -- the VM controller replaces the VMI (same name): its claim goes to the other node
    must(d, "DELETE", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/pool-f1")
    wait_gone(d, "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/pool-f1", 10)
    start()
    wait_claim(d, "pool-f1-l40s", "Bound", other)
  end)

  it("a template VMI deleted before it ends: garbage collection and the binder remove its claims", function()
    add_node(d, "gpu-1", 1)
    template_vmi(d, "pool-w2")
    wait_claim(d, "pool-w2-l40s", "Bound", "gpu-1")
    local out, code = E.kubectl(d, { "delete", "vmi", "pool-w2", "-n", NS, "--wait=false" })
    assert.are.equal(0, code, out)
    wait_gone(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/pool-w2-l40s", 15, "the template claim outlived its VMI")
  end)

  it("a node deleted and registered again while its VMI runs: the claim goes back to Attached there and keeps its unit", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "rr1", 1)
    wait_claim(d, "rr1", "Bound", "gpu-1")
    vmi("vm-rr", "rr1", "Running", "gpu-1")
    wait_claim(d, "rr1", "Attached", "gpu-1")
    local out, code = E.kubectl(d, { "delete", "node", "gpu-1" })
    assert.are.equal(0, code, out)
    local c = wait_claim(d, "rr1", "Lost")
    assert.are.equal("WaitingForVMIEnd", ready_cond(c).reason)
    -- the kubelet registers the node again; the VMI never stopped
    add_node(d, "gpu-1", 1)
    c = wait_claim(d, "rr1", "Attached", "gpu-1")
    assert.are.equal("vm-rr", c.status.attachedTo)
    add_claim(d, "rr2", 1)
    wait_reason("rr2", "NoNodeWithRoom")
  end)

  it("a VM whose volume was bound on a node (WaitForFirstConsumer) gets its claims only where the volume allows", function()
    add_node(d, "gpu-1", 1)
    add_node(d, "gpu-2", 1)
    -- a local volume on gpu-2, bound to the VM's PVC (as a WaitForFirstConsumer
    -- StorageClass leaves it once the VM first ran there)
    must(d, "POST", "/api/v1/persistentvolumes", { apiVersion = "v1", kind = "PersistentVolume",
      metadata = { name = "local-pv-gpu2" },
      spec = { capacity = { storage = "10Gi" }, accessModes = { "ReadWriteOnce" }, storageClassName = "local",
        ["local"] = { path = "/mnt/disks/vol1" }, claimRef = { namespace = NS, name = "disk-w1" },
        nodeAffinity = { required = { nodeSelectorTerms = { { matchExpressions = {
          { key = "kubernetes.io/hostname", operator = "In", values = { "gpu-2" } } } } } } } } })
    must(d, "POST", "/api/v1/namespaces/" .. NS .. "/persistentvolumeclaims", { apiVersion = "v1",
      kind = "PersistentVolumeClaim", metadata = { name = "disk-w1", namespace = NS },
      spec = { accessModes = { "ReadWriteOnce" }, storageClassName = "local", volumeName = "local-pv-gpu2",
        resources = { requests = { storage = "10Gi" } } } })
    local out, code = kubectl(d, { "apply" }, { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
      metadata = { name = "vm-w1", namespace = NS },
      spec = { runStrategy = "Halted", template = { metadata = { annotations = { ["gpu.cozystack.io/claims"] = "v1" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } },
          volumes = { { name = "disk", persistentVolumeClaim = { claimName = "disk-w1" } } } } } } })
    assert.are.equal(0, code, out)
    add_claim(d, "v1", 1) -- ordered after the VM names it
    -- packing order alone would take gpu-1 (both are empty; it comes first)
    wait_claim(d, "v1", "Bound", "gpu-2")
    -- cordoned, with no other node the volume allows: it keeps its hold
    out, code = E.kubectl(d, { "cordon", "gpu-2" })
    assert.are.equal(0, code, out)
    local c = wait_reason("v1", "NodeCordoned")
    assert.are.equal("gpu-2", c.status.node)
  end)

  it("a running raw-name VMI asking for GPUs through domain.resources uses its node's units", function()
    add_node(d, "gpu-1", 1)
    local v = must(d, "POST", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances", {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", metadata = { name = "rawres", namespace = NS },
      spec = { domain = { resources = { limits = { [L40S] = "1" }, requests = { [L40S] = "1" } } } } })
    v.status = { phase = "Running", nodeName = "gpu-1" }
    must(d, "PUT", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/rawres/status", v)
    add_claim(d, "rr", 1)
    wait_reason("rr", "NoNodeWithRoom")
  end)

  it("a claim deleted while its VMI is Pending (its launcher pod may be pinned) keeps its hold", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "pd1", 1)
    wait_claim(d, "pd1", "Bound", "gpu-1")
    vmi("vm-pd", "pd1", "Pending")
    local out, code = E.kubectl(d, { "delete", "gpuclaim", "pd1", "-n", NS, "--wait=false" })
    assert.are.equal(0, code, out)
    add_claim(d, "pd2", 1)
    wait_reason("pd2", "NoNodeWithRoom")
    local c = claim(d, "pd1")
    assert.is_string(c.metadata.deletionTimestamp)
    assert.are.equal("Bound", c.status.phase)
  end)

  it("a template VM that failed on the only node with room tries that node again", function()
    add_node(d, "gpu-1", 1)
    local function start()
      return template_vmi(d, "pool-one")
    end
    start()
    wait_claim(d, "pool-one-l40s", "Bound", "gpu-1")
    vmi_phase("pool-one", "Failed", "gpu-1")
    wait_gone(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/pool-one-l40s")
    must(d, "DELETE", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/pool-one")
    wait_gone(d, "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/pool-one", 10)
    start()
    wait_claim(d, "pool-one-l40s", "Bound", "gpu-1")
  end)

  it("a template VMI's ungated launcher pod pinned where its claims are not has its Pending VMI deleted", function()
    add_node(d, "gpu-1", 1)
    local v = template_vmi(d, "pool-sp")
    wait_claim(d, "pool-sp-l40s", "Bound", "gpu-1")
    local out, code = kubectl(d, { "create" }, {
      apiVersion = "v1", kind = "Pod",
      metadata = { name = "virt-launcher-pool-sp-x", namespace = NS,
        labels = { ["kubevirt.io"] = "virt-launcher", ["gpu.cozystack.io/class-reference"] = "true" },
        ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "pool-sp",
          uid = v.metadata.uid, controller = true } } },
      spec = { affinity = required_terms { { matchFields = { { key = "metadata.name", operator = "In", values = { "gpu-old" } } } } },
        containers = { { name = "compute", image = "virt-launcher" } } } })
    assert.are.equal(0, code, out)
    wait_gone(d, "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/pool-sp", 15,
      "the template VMI of a pod pinned to the wrong node was not deleted")
  end)

  it("a node's capacity drops under its claims: the most recently bound unattached one moves", function()
    add_node(d, "gpu-1", 2)
    add_claim(d, "cap1", 1)
    wait_claim(d, "cap1", "Bound", "gpu-1")
    add_claim(d, "cap2", 1)
    wait_claim(d, "cap2", "Bound", "gpu-1")
    add_node(d, "gpu-2", 1)
    -- the kubelet now advertises one L40S on gpu-1 (a GPU failed)
    G.node_status(d, "gpu-1", { units = 2, alloc = 1 })
    wait_claim(d, "cap2", "Bound", "gpu-2")
    local c = claim(d, "cap1")
    assert.are.equal("gpu-1", c.status.node) -- it keeps its node: it still has the capacity
  end)

  it("a layout change pending on a node: its unattached claim moves, or keeps its hold saying why", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "lay1", 1)
    wait_claim(d, "lay1", "Bound", "gpu-1")
    local function pending(name, on)
      local g = must(d, "GET", "/apis/cozystack.io/v1alpha1/gpunodes/" .. name)
      g.status.layout = g.status.layout or {}
      g.status.layout.pending = on
      must(d, "PUT", "/apis/cozystack.io/v1alpha1/gpunodes/" .. name .. "/status", g)
    end
    pending("gpu-1", true) -- the agent has a vGPU layout change to apply
    local c = wait_reason("lay1", "LayoutChangePending")
    assert.are.equal("gpu-1", c.status.node)
    add_node(d, "gpu-2", 1)
    wait_claim(d, "lay1", "Bound", "gpu-2")
  end)

  it("a large Lost set that fits nowhere does not block a smaller order that fits", function()
    add_node(d, "gpu-1", 4)
    add_claim(d, "big1", 1)
    add_claim(d, "big2", 1)
    add_claim(d, "big3", 1)
    local out, code = kubectl(d, { "apply" }, { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
      metadata = { name = "vm-big", namespace = NS },
      spec = { runStrategy = "Halted", template = { metadata = { annotations = { ["gpu.cozystack.io/claims"] = "big1,big2,big3" } },
        spec = { domain = { devices = { gpus = { { name = "g1", deviceName = L40S }, { name = "g2", deviceName = L40S },
          { name = "g3", deviceName = L40S } } } } } } } })
    assert.are.equal(0, code, out)
    for _, n in ipairs { "big1", "big2", "big3" } do wait_claim(d, n, "Bound", "gpu-1") end
    out, code = E.kubectl(d, { "delete", "node", "gpu-1" })
    assert.are.equal(0, code, out)
    for _, n in ipairs { "big1", "big2", "big3" } do wait_claim(d, n, "Lost") end
    add_claim(d, "small", 1)
    add_node(d, "gpu-2", 2) -- room for the small order, not for the Lost set of three
    wait_claim(d, "small", "Bound", "gpu-2")
    for _, n in ipairs { "big1", "big2", "big3" } do
      local c = claim(d, n)
      assert.are.equal("Lost", c.status.phase)
      assert.are.equal("NodeLost", ready_cond(c).reason)
    end
  end)

  it("a claim stays Attached while its VMI is being deleted, and leaves Attached only once the VMI is final", function()
    add_node(d, "gpu-1", 1)
    add_claim(d, "dt1", 1)
    wait_claim(d, "dt1", "Bound", "gpu-1")
    local v = must(d, "POST", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances", {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = "vm-dt", namespace = NS, finalizers = { "kubevirt.io/virtualMachineControllerFinalize" },
        labels = { ["gpu.cozystack.io/class-reference"] = "true" }, annotations = { ["gpu.cozystack.io/claims"] = "dt1" } },
      spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
    v.status = { phase = "Running", nodeName = "gpu-1" }
    must(d, "PUT", "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/vm-dt/status", v)
    wait_claim(d, "dt1", "Attached", "gpu-1")
    -- deleted: KubeVirt's finalizer keeps it while the guest shuts down
    local out, code = E.kubectl(d, { "delete", "vmi", "vm-dt", "-n", NS, "--wait=false" })
    assert.are.equal(0, code, out)
    P.sleep(1.5)
    local c = claim(d, "dt1")
    assert.are.equal("Attached", c.status.phase) -- DESIGN §6: not on a deletion timestamp alone
    vmi_phase("vm-dt", "Succeeded", "gpu-1")
    c = wait_claim(d, "dt1", "Bound", "gpu-1")
    assert.is_nil(c.status.attachedTo)
  end)

  it("a gated launcher pod whose claims are not bound stays gated", function()
    add_claim(d, "g1", 1) -- no node at all
    wait_reason("g1", "NoNodeWithRoom")
    local v = vmi("vm-g", "g1", "Pending")
    launcher(d, "virt-launcher-vm-g-x", v, { gates = { "gpu.cozystack.io/claims" } })
    P.sleep(1.5)
    local pod = E.get(d, "/api/v1/namespaces/" .. NS .. "/pods/virt-launcher-vm-g-x")
    assert.are.same({ { name = "gpu.cozystack.io/claims" } }, pod.spec.schedulingGates)
    assert.is_nil(pod.spec.affinity)
    -- room arrives: bound, then pinned and ungated
    add_node(d, "gpu-3", 1)
    wait_claim(d, "g1", "Bound", "gpu-3")
    assert(P.wait_until(function()
      pod = E.get(d, "/api/v1/namespaces/" .. NS .. "/pods/virt-launcher-vm-g-x")
      return pod.spec.schedulingGates == nil
    end, 15), json.encode(pod))
    assert.are.same({ { matchFields = { { key = "metadata.name", operator = "In", values = { "gpu-3" } } } } },
      pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
  end)
end)
