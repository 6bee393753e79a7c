-- The leader's binder on a real control plane (DESIGN.md §3, §4, §5, §6;
-- decisions 0020, 0025, 0026, 0027): two controller replicas as the
-- cozygpu-controller ServiceAccount, kube-apiserver calling cozygpu's
-- webhooks, kube-controller-manager (garbage collector, node lifecycle,
-- persistent-volume binder, pod GC) and kube-scheduler running. No kubelet,
-- virt-controller or virt-handler runs: the spec plays them, creating
-- VMIs, VMs and virt-launcher pods and writing VMI status (KubeVirt's VMI
-- CRD has no status subresource: the status is written with the object)
-- and Node status (spec/support/gpu_nodes.lua).
--
-- One control plane for the file. The first block is one history (as a
-- cluster lives it, ending with the leader killed); every case of the
-- second block starts from an empty cluster (no Node, GPUNode, claim, VMI,
-- VM, pod or volume; the l40s class as examples/classes has it), so what
-- one case leaves cannot steer another.
--
-- Ported from the double (spec/controller/binder_spec.lua, decision 0034);
-- what the real server does differently is said where a case meets it.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local json = H.json

local L40S = G.L40S
local NS = "tenant-b" -- no ResourceQuota (examples/cluster/quotas.yaml budgets tenant-a): capacity alone decides
local GATE = "gpu.cozystack.io/claims"
local CLASS = "/apis/cozystack.io/v1alpha1/gpuclasses/l40s"

local function claims_path(ns) return "/apis/cozystack.io/v1alpha1/namespaces/" .. ns .. "/gpuclaims" end
local function vmis_path(ns) return "/apis/kubevirt.io/v1/namespaces/" .. ns .. "/virtualmachineinstances" end
local function vms_path(ns) return "/apis/kubevirt.io/v1/namespaces/" .. ns .. "/virtualmachines" end
local function pods_path(ns) return "/api/v1/namespaces/" .. ns .. "/pods" end
local function pvcs_path(ns) return "/api/v1/namespaces/" .. ns .. "/persistentvolumeclaims" end

local function ready_cond(obj) return K.condition(obj, "Ready") end

-- short leases, so that the lead changes hands in seconds when its holder
-- is killed (the double's spec ran with 3 s; a contended machine gets more)
local LEASE = { "--lease-duration", "6s", "--renew-deadline", "4s", "--retry-period", "1s", "--status-interval", "5s" }

describe("the leader's binder through kube-apiserver (two replicas)", function()
  local c
  local session = K.session { deploy = { replicas = 2, extra = LEASE }, prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)

  local function enc(v) return type(v) == "table" and json.encode(v) or tostring(v) end

  -- the collections a case created objects in (POST through must), for reset
  local dirty = {}
  -- an API call that must succeed (2xx); returns the decoded body
  local function must(method, path, body, ctype)
    local st, v = c:request(method, path, body, ctype)
    assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st), enc(v)))
    if method == "POST" then dirty[path] = true end
    return v
  end
  local function merge_patch(path, body) return must("PATCH", path, body, "application/merge-patch+json") end

  -- A VMI's claims annotation edited after creation: deploy/58's policy
  -- refuses it (shown first); the leader's own check is what a cluster
  -- without that policy relies on, so the policy's binding is taken away
  -- for the edit and put back (each once the API server applies it).
  -- Returns the VMI as the edit left it.
  local function edit_claims_annotation(name, value)
    local path = vmis_path(NS) .. "/" .. name
    local MP = "application/merge-patch+json"
    local function body(v) return { metadata = { annotations = { [GATE] = v } } } end
    local st, v = c:request("PATCH", path, body(value), MP)
    assert.are.equal(403, st, enc(v))
    assert.matches("cozygpu-vmi-claims-fixed", enc(v), 1, true)
    c:must { "delete", "validatingadmissionpolicybinding", "cozygpu-vmi-claims-fixed" }
    assert(P.wait_until(function() return c:request("PATCH", path .. "?dryRun=All", body(value), MP) == 200 end, 20, 0.2),
      "policy cozygpu-vmi-claims-fixed still refused after its binding went")
    local edited = merge_patch(path, body(value))
    c:must { "apply", "-f", "deploy/58-tenant-edits-policy.yaml" }
    assert(P.wait_until(function() return c:request("PATCH", path .. "?dryRun=All", body(value .. "-x"), MP) == 403 end, 20, 0.2),
      "policy cozygpu-vmi-claims-fixed not back in force")
    return edited
  end

  local function add_claim(name, count, class, ns)
    return must("POST", claims_path(ns or NS), { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = name, namespace = ns or NS }, spec = { class = class or "l40s", count = count or 1 } })
  end
  local function claim(name, ns) return (c:get(claims_path(ns or NS) .. "/" .. name)) end

  -- waits until claim `name` has `phase` (and `node`, when given: false
  -- for none); returns it
  local function wait_claim(name, phase, node, ns)
    local last
    local cl = P.wait_until(function()
      last = claim(name, ns)
      local st = last and last.status or {}
      if st.phase ~= phase then return nil end
      if node == false and st.node ~= nil then return nil end
      if node and st.node ~= node then return nil end
      return last
    end, 60, 0.2)
    assert(cl, ("claim %s: wanted %s on %s, have %s"):format(name, phase, tostring(node), enc(last)))
    return cl
  end
  local function wait_reason(name, reason, ns)
    local last
    local cl = P.wait_until(function()
      last = claim(name, ns)
      return ready_cond(last) and ready_cond(last).reason == reason and last
    end, 60, 0.2)
    assert(cl, ("claim %s: wanted reason %s, have %s"):format(name, reason, enc(last)))
    return cl
  end
  local function wait_gone(path, msg)
    local st
    assert(P.wait_until(function()
      st = select(2, c:get(path))
      return st == 404
    end, 60, 0.2), (msg or path .. " is still there") .. " (last status " .. tostring(st) .. ")")
  end

  -- A VMI naming `claims` (nil: a raw-name VMI, with neither the
  -- class-reference label nor the annotation), created through the API
  -- server (cozygpu's VMI webhooks judge it); with `phase`, virt-handler's
  -- part too: its status written (phase, node).
  local function vmi(name, claims, phase, node)
    local v = must("POST", vmis_path(NS), { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = NS,
        labels = claims and { ["gpu.cozystack.io/class-reference"] = "true" } or nil,
        annotations = claims and { [GATE] = claims } or nil },
      spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } },
        resources = { requests = { memory = "1Gi" } } } } })
    if phase then
      v.status = { phase = phase, nodeName = node }
      v = must("PUT", vmis_path(NS) .. "/" .. name, v)
    end
    return v
  end
  -- virt-handler's (or virt-controller's) status write of VMI `name`: the
  -- whole object (no status subresource), retried on a conflict
  local function vmi_phase(name, phase, node)
    for _ = 1, 20 do
      local v = must("GET", vmis_path(NS) .. "/" .. name)
      v.status = { phase = phase, nodeName = node }
      local st, body = c:request("PUT", vmis_path(NS) .. "/" .. name, v)
      if st == 200 then return body end
      assert(st == 409, ("PUT VMI %s status -> %s %s"):format(name, tostring(st), enc(body)))
    end
    error("VMI " .. name .. ": status not written")
  end
  -- A template VMI (decision 0027: the class-reference label, no claims
  -- annotation) with `gpus` (default 1) L40S entries; returns it.
  local function template_vmi(name, gpus)
    local list = {}
    for i = 1, gpus or 1 do list[i] = { name = "gpu" .. (i - 1), deviceName = L40S } end
    return must("POST", vmis_path(NS), { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" } },
      spec = { domain = { devices = { gpus = list }, resources = { requests = { memory = "1Gi" } } } } })
  end
  local function vm(name, run, template)
    return must("POST", vms_path(NS), { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
      metadata = { name = name, namespace = NS }, spec = { runStrategy = run, template = template } })
  end

  -- A virt-launcher pod of VMI `v` (the object as created), as
  -- virt-controller makes it (label kubevirt.io=virt-launcher, controller
  -- ownerReference to the VMI); o = {annotations, labels, gates (list of
  -- names), affinity, resources}. cozygpu's launcher webhook is called
  -- only for a pod that requests a device (its matchConditions), and
  -- leaves a pod alone that already carries the gate.
  local function launcher(name, v, o)
    o = o or {}
    local gates
    if o.gates then
      gates = {}
      for i, g in ipairs(o.gates) do gates[i] = { name = g } end
    end
    local labels = { ["kubevirt.io"] = "virt-launcher" }
    for k, x in pairs(o.labels or {}) do labels[k] = x end
    return must("POST", pods_path(NS), { apiVersion = "v1", kind = "Pod",
      metadata = { name = name, namespace = NS, labels = labels, annotations = o.annotations,
        ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = v.metadata.name,
          uid = v.metadata.uid, controller = true, blockOwnerDeletion = true } } },
      spec = { schedulingGates = gates, affinity = o.affinity,
        containers = { { name = "compute", image = "quay.io/kubevirt/virt-launcher:v1.9.0", resources = o.resources } } } })
  end
  local function pod(name) return (c:get(pods_path(NS) .. "/" .. name)) end
  local function required_terms(terms)
    return { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = terms } } }
  end

  -- the kubelet's Ready condition of `node` turned to `status`, the other
  -- conditions kept (a read-modify-write: the node-lifecycle controller
  -- writes Nodes too); returns the Node as written
  local function set_ready(node, status)
    for _ = 1, 20 do
      local n = must("GET", "/api/v1/nodes/" .. node)
      for _, cond in ipairs(n.status.conditions) do
        if cond.type == "Ready" then
          cond.status = status
          cond.reason = status == "True" and "KubeletReady" or "NodeStatusUnknown"
          cond.lastTransitionTime = os.date("!%Y-%m-%dT%H:%M:%SZ")
        end
      end
      local st, body = c:request("PUT", "/api/v1/nodes/" .. node .. "/status", n)
      if st == 200 then return body end
      assert(st == 409, ("PUT node %s status -> %s %s"):format(node, tostring(st), enc(body)))
    end
    error("node " .. node .. ": status not written")
  end

  -- what `kubectl cordon` writes
  local function cordon(node) return merge_patch("/api/v1/nodes/" .. node, { spec = { unschedulable = true } }) end
  -- waits until the leader has applied the write that returned `obj`
  -- (decision 0040): what a "must stay" check waits for
  local function applied(resource, obj)
    assert(c:wait_applied(resource, obj.metadata.resourceVersion),
      ("the leader did not apply %s %s"):format(resource, obj.metadata.name))
  end

  local function lease_holder()
    local l = c:get("/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
    return l and l.spec and l.spec.holderIdentity
  end

  -- units held per node by Bound/Attached claims, from the API
  local function held()
    local out = {}
    for _, cl in ipairs(c:state("gpuclaims").items) do
      local st = cl.status or {}
      if (st.phase == "Bound" or st.phase == "Attached") and st.node then
        out[st.node] = (out[st.node] or 0) + cl.spec.count
      end
    end
    return out
  end

  -- Empties collection `path`: one DELETE of the collection (grace 0: no
  -- kubelet confirms a pod's end), then, for what a finalizer keeps
  -- (KubeVirt's on a VMI, cozygpu's claim protection, pv- and
  -- pvc-protection), the finalizers taken off (after the deletion no
  -- controller can add one back) until the list is empty.
  local function clear(path)
    local st, v = c:request("DELETE", path .. "?gracePeriodSeconds=0")
    assert(st == 200, ("DELETE %s -> %s %s"):format(path, tostring(st), enc(v)))
    local kept = false
    for _, o in ipairs(v.items or {}) do
      if o.metadata.finalizers and #o.metadata.finalizers > 0 then kept = true end
    end
    if not kept then return end
    local n
    assert(P.wait_until(function()
      local l = must("GET", path)
      n = #(l.items or {})
      for _, o in ipairs(l.items or {}) do
        local p = path .. "/" .. o.metadata.name
        if o.metadata.deletionTimestamp then
          local pst = c:request("PATCH", p, { metadata = { finalizers = json.null } }, "application/merge-patch+json")
          assert(pst == 200 or pst == 404 or pst == 409, ("PATCH %s finalizers -> %s"):format(p, tostring(pst)))
        else
          c:request("DELETE", p .. "?gracePeriodSeconds=0") -- created after the collection's DELETE
        end
      end
      return n == 0
    end, 60, 0.2), ("reset: %d objects left in %s"):format(n or -1, path))
  end

  -- An empty cluster for a case: what uses units first (the VMs, VMIs,
  -- pods and volumes the case created, every claim of tenant-b and, once a
  -- case used it, tenant-a), then the nodes and their GPUNodes (the claims
  -- gone first: none turns Lost); the l40s class as examples/classes has
  -- it; tenant-a's budget as examples/cluster/quotas.yaml has it. Then
  -- waits until the leader shows the empty cluster in the class's status
  -- (no node: nothing free), so its caches have caught up.
  local used_a = false
  local function reset()
    local paths = {}
    for _, ns in ipairs(used_a and { NS, "tenant-a" } or { NS }) do
      for _, f in ipairs { vms_path, vmis_path, pods_path, claims_path, pvcs_path } do
        local p = f(ns)
        if dirty[p] or f == claims_path then paths[#paths + 1] = p end
      end
    end
    for _, p in ipairs { "/api/v1/persistentvolumes", "/apis/storage.k8s.io/v1/storageclasses" } do
      if dirty[p] then paths[#paths + 1] = p end
    end
    paths[#paths + 1] = "/api/v1/nodes"
    paths[#paths + 1] = "/apis/cozystack.io/v1alpha1/gpunodes"
    for _, p in ipairs(paths) do clear(p) end
    dirty = {}
    local cls = c:get(CLASS)
    if cls and cls.metadata.deletionTimestamp then
      merge_patch(CLASS, { metadata = { finalizers = json.null } })
      wait_gone(CLASS)
      cls = nil
    end
    if not cls then
      c:must { "create", "-f", "examples/classes/l40s.yaml" }
    elseif cls.spec.onCordon ~= "Move" then
      merge_patch(CLASS, { spec = { onCordon = "Move" } })
    end
    if used_a then
      merge_patch("/api/v1/namespaces/tenant-a/resourcequotas/gpu", { spec = { hard = { ["gpuclass.cozystack.io/devices"] = "2" } } })
      used_a = false
    end
    local last
    assert(P.wait_until(function()
      last = c:get(CLASS)
      return last and (last.status == nil or (last.status.free or 0) == 0)
    end, 60, 0.2), "reset: the class still shows free units: " .. enc(last and last.status))
  end

  describe("one history", function()
    it("binds a claim on a node with room and says so in status, as kubectl shows it", function()
      G.add_node(c, "gpu-1", 2)
      add_claim("c1", 1)
      local cl = wait_claim("c1", "Bound", "gpu-1")
      local r = ready_cond(cl)
      assert.are.equal("True", r.status)
      assert.are.equal("Placed", r.reason)
      assert.are.equal(cl.metadata.generation, cl.status.observedGeneration)
      assert.is_string(r.lastTransitionTime)
      -- the CRD's printer columns, as kube-apiserver serves them
      local out = c:must { "get", "gpuclaims", "-n", NS, "-o", "wide" }
      assert.matches("c1%s+l40s%s+1%s+Bound%s+gpu%-1", out)
    end)

    it("keeps a claim that fits nowhere Pending with NoNodeWithRoom, naming the class", function()
      add_claim("big", 4) -- gpu-1 offers 2 L40S
      local cl = wait_reason("big", "NoNodeWithRoom")
      assert.are.equal("Pending", cl.status.phase)
      assert.are.equal("False", ready_cond(cl).status)
      assert.matches("l40s", ready_cond(cl).message)
      -- no inventory leaks into it: no node names, no counts of free units
      -- elsewhere (decision 0020 §2: capacity is the hoster's business)
      assert.is_nil(ready_cond(cl).message:find("gpu-1", 1, true), ready_cond(cl).message)
    end)

    it("marks a claim Attached while its VMI runs on the claim's node, and Bound again once the VMI is gone", function()
      vmi("vm1", "c1", "Running", "gpu-1")
      local cl = wait_claim("c1", "Attached", "gpu-1")
      assert.are.equal("vm1", cl.status.attachedTo)
      assert.are.equal("Attached", ready_cond(cl).reason)
      must("DELETE", vmis_path(NS) .. "/vm1")
      cl = wait_claim("c1", "Bound", "gpu-1")
      assert.is_nil(cl.status.attachedTo)
    end)

    it("pins a gated launcher pod to its claims' node and removes the gate", function()
      -- gated by its creator, so cozygpu's webhook leaves it to the leader;
      -- the leader's pin narrows the existing term, which kube-apiserver
      -- accepts on a gated pod only as a narrowing (KEP-3838)
      local v = vmi("vm2", "c1")
      launcher("virt-launcher-vm2-abcde", v, {
        annotations = { [GATE] = "c1" }, gates = { GATE },
        affinity = required_terms { { matchExpressions = { { key = "kubernetes.io/arch", operator = "In", values = { "amd64" } } } } },
        resources = { limits = { [L40S] = "1" }, requests = { [L40S] = "1" } } })
      local p
      assert(P.wait_until(function()
        p = pod("virt-launcher-vm2-abcde")
        return p and p.spec.schedulingGates == nil
      end, 60, 0.2), enc(p))
      local terms = p.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
      assert.are.equal(1, #terms)
      assert.are.same({ { key = "kubernetes.io/arch", operator = "In", values = { "amd64" } } }, terms[1].matchExpressions)
      assert.are.same({ { key = "metadata.name", operator = "In", values = { "gpu-1" } } }, terms[1].matchFields)
      must("DELETE", pods_path(NS) .. "/virt-launcher-vm2-abcde?gracePeriodSeconds=0")
      must("DELETE", vmis_path(NS) .. "/vm2")
    end)

    it("after the leader is killed, the other replica rebuilds from status and never books a unit twice", function()
      G.add_node(c, "gpu-2", 2)
      local holder = lease_holder()
      assert.is_truthy(c.replicas[holder], tostring(holder))
      local other = holder == "replica-a" and "replica-b" or "replica-a"
      -- the webhooks call one replica (a URL, no Service here): the
      -- survivor, as the Service would once the killed one is not ready
      c:target_webhooks(other)
      local dead = c.replicas[holder]
      P.kill(dead.pid, 9)
      c.replicas[holder] = nil
      -- orders while and after the lead changes hands; an order the API
      -- server could not yet send to the survivor's webhook is retried, as
      -- a client would
      for i = 1, 4 do
        local st, body
        assert(P.wait_until(function()
          st, body = c:request("POST", claims_path(NS), { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
            metadata = { name = "k" .. i, namespace = NS }, spec = { class = "l40s", count = 1 } })
          return st == 201
        end, 60, 0.5), ("order k%d: %s %s"):format(i, tostring(st), enc(body)))
      end
      assert(P.wait_until(function() return lease_holder() == other end, 60, 0.2), "the Lease did not move")
      -- gpu-1 and gpu-2 offer 2 each; c1 holds one on gpu-1: three of k1..k4 fit
      local last
      assert(P.wait_until(function()
        local bound, pending = 0, 0
        last = {}
        for i = 1, 4 do
          local cl = claim("k" .. i)
          local ph = cl and cl.status and cl.status.phase
          last[i] = ph
          if ph == "Bound" then bound = bound + 1 elseif ph == "Pending" and ready_cond(cl) then pending = pending + 1 end
        end
        return bound == 3 and pending == 1
      end, 60, 0.2), enc(last))
      local h = held()
      assert.are.equal(2, h["gpu-1"])
      assert.are.equal(2, h["gpu-2"])
      assert.are.equal("gpu-1", claim("c1").status.node)
      -- the killed replica comes back (a new pod of the Deployment)
      local r = c:start_controller { identity = holder, port = dead.port, extra = dead.extra }
      assert(P.wait_until(function()
        return P.http { url = ("http://127.0.0.1:%d/readyz"):format(r.probe_port), timeout = 2 } == 200
      end, 60, 0.2), "the restarted replica is not ready:\n" .. (P.read(r.log) or ""):sub(-3000))
    end)
  end)

  -- the invariants (spec/support/invariants.lua) hold once the leader has
  -- caught up; the spec plays virt-handler without launcher pods for most
  -- running VMIs, so billing (invariant 1) is left to billing_spec
  local function invariants_hold() require("invariants").hold(c, { timeout = 30, skip = { [1] = true } }) end

  describe("rule by rule (DESIGN.md §6), each from an empty cluster", function()
    before_each(reset)

    it("moves an unattached claim off a cordoned node (onCordon Move) to a node with room", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("c1")
      wait_claim("c1", "Bound", "gpu-1")
      G.add_node(c, "gpu-2", 1)
      c:must { "cordon", "gpu-1" }
      local cl = wait_claim("c1", "Bound", "gpu-2")
      assert.matches("moved from node gpu-1 (node cordoned, onCordon Move) to node gpu-2", ready_cond(cl).message, 1, true)
    end)

    it("onCordon Stay: an unattached claim keeps its cordoned node and says why", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("s1")
      wait_claim("s1", "Bound", "gpu-1")
      merge_patch(CLASS, { spec = { onCordon = "Stay" } })
      G.add_node(c, "gpu-2", 1)
      cordon("gpu-1")
      local cl = wait_reason("s1", "NodeCordoned")
      assert.are.equal("Bound", cl.status.phase)
      assert.are.equal("gpu-1", cl.status.node)
      assert.matches("gpu%-1", ready_cond(cl).message)
      -- and a new order does not take gpu-1 while it is cordoned
      add_claim("s2")
      wait_claim("s2", "Bound", "gpu-2")
    end)

    it("a class changed from Move to Stay while its claim waits on a cordoned node: the message says Stay", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("m1")
      wait_claim("m1", "Bound", "gpu-1")
      cordon("gpu-1")
      local cl = wait_reason("m1", "NodeCordoned")
      assert.matches("onCordon: Move", ready_cond(cl).message, 1, true)
      merge_patch(CLASS, { spec = { onCordon = "Stay" } })
      assert(P.wait_until(function()
        cl = claim("m1")
        return ready_cond(cl).message:find("onCordon: Stay", 1, true) ~= nil
      end, 60, 0.2), enc(cl))
      assert.are.equal("Bound", cl.status.phase)
    end)

    it("node NotReady: the attached claim goes Lost waiting for its VMI, and Attached again when the node returns", function()
      G.add_node(c, "gpu-1", 1)
      G.add_node(c, "gpu-2", 1)
      add_claim("a1")
      local n = wait_claim("a1", "Bound").status.node
      vmi("vm-a", "a1", "Running", n)
      wait_claim("a1", "Attached", n)
      set_ready(n, "Unknown")
      -- the node-lifecycle controller taints it, as in any cluster
      assert(P.wait_until(function()
        for _, t in ipairs(c:get("/api/v1/nodes/" .. n).spec.taints or {}) do
          if t.key == "node.kubernetes.io/unreachable" then return true end
        end
      end, 60, 0.2), enc(c:get("/api/v1/nodes/" .. n).spec))
      local cl = wait_claim("a1", "Lost", n)
      assert.are.same({ "False", "WaitingForVMIEnd" }, { ready_cond(cl).status, ready_cond(cl).reason })
      set_ready(n, "True")
      cl = wait_claim("a1", "Attached", n)
      assert.are.equal("vm-a", cl.status.attachedTo)
    end)

    it("node NotReady and the VMI fails: the claim is rebound on another node", function()
      G.add_node(c, "gpu-1", 1)
      G.add_node(c, "gpu-2", 1)
      add_claim("f1")
      local n = wait_claim("f1", "Bound").status.node
      local other = n == "gpu-1" and "gpu-2" or "gpu-1"
      vmi("vm-f", "f1", "Running", n)
      wait_claim("f1", "Attached", n)
      set_ready(n, "False")
      wait_claim("f1", "Lost", n)
      -- a deletion timestamp alone does not end Attached/Lost: only a final VMI does
      vmi_phase("vm-f", "Failed", n)
      local cl = wait_claim("f1", "Bound", other)
      assert.are.equal("Placed", ready_cond(cl).reason)
      assert.is_nil(cl.status.attachedTo)
    end)

    it("node deleted with no room elsewhere: the claim goes Lost, and is rebound before a newer order when room returns", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("l1")
      wait_claim("l1", "Bound", "gpu-1")
      must("DELETE", "/api/v1/nodes/gpu-1")
      local cl = wait_claim("l1", "Lost", false)
      assert.are.equal("NodeLost", ready_cond(cl).reason)
      add_claim("n1") -- a newer order, waiting too
      wait_reason("n1", "NoNodeWithRoom")
      G.add_node(c, "gpu-9", 1) -- room for one
      wait_claim("l1", "Bound", "gpu-9")
      cl = wait_claim("n1", "Pending")
      assert.are.equal("NoNodeWithRoom", ready_cond(cl).reason)
    end)

    it("a set that must move while its VMI is Pending has that VMI deleted (its launcher pod was pinned to the old node)", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("p1")
      local n = wait_claim("p1", "Bound").status.node
      vmi("vm-p", "p1", "Pending")
      G.add_node(c, "gpu-2", 1)
      cordon(n)
      wait_claim("p1", "Bound", "gpu-2")
      wait_gone(vmis_path(NS) .. "/vm-p", "the pending VMI was not deleted")
    end)

    it("a class being deleted keeps its Bound claim and leaves a waiting order waiting with a reason", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("d1")
      wait_claim("d1", "Bound", "gpu-1")
      -- on a real server the order must come before the deletion: cozygpu's
      -- webhook refuses a new order of a class being deleted (below)
      add_claim("d2")
      wait_reason("d2", "NoNodeWithRoom")
      -- the leader's finalizer keeps the class while claims of it exist
      -- (decision 0037)
      assert(P.wait_until(function()
        local cls = c:get(CLASS)
        for _, f in ipairs(cls and cls.metadata.finalizers or {}) do
          if f == "gpu.cozystack.io/class-protection" then return true end
        end
      end, 30, 0.2), "the leader put no class-protection finalizer on l40s")
      must("DELETE", CLASS)
      G.add_node(c, "gpu-2", 1) -- room for d2, which must not take it
      local cl = wait_reason("d2", "ClassBeingDeleted")
      assert.are.equal("Pending", cl.status.phase)
      assert.is_nil(cl.status.node)
      cl = claim("d1")
      assert.are.equal("Bound", cl.status.phase)
      assert.are.equal("gpu-1", cl.status.node)
      -- and admission refuses a new order of it
      local st, body = c:request("POST", claims_path(NS), { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
        metadata = { name = "d3", namespace = NS }, spec = { class = "l40s", count = 1 } })
      assert.are_not.equal(201, st)
      assert.matches('GPUClass "l40s" is being deleted', type(body) == "table" and body.message or enc(body), 1, true)
    end)

    it("an ungated launcher pod pinned where its claims are not (a stale cache at creation) has its Pending VMI deleted", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("st1")
      wait_claim("st1", "Bound", "gpu-1")
      local v = vmi("vm-st", "st1", "Pending")
      -- no device request: the launcher webhook is not called, so the pod
      -- arrives pinned as the creator wrote it (as a stale webhook cache would)
      launcher("virt-launcher-vm-st-x", v, { annotations = { [GATE] = "st1" },
        affinity = required_terms { { matchFields = { { key = "metadata.name", operator = "In", values = { "gpu-old" } } } } } })
      wait_gone(vmis_path(NS) .. "/vm-st", "the VMI of a pod pinned to the wrong node was not deleted")
    end)

    it("pins into every term that has a requirement and leaves an empty term empty (KEP-3838)", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("e1")
      wait_claim("e1", "Bound", "gpu-1")
      local v = vmi("vm-e", "e1", "Pending")
      -- kube-apiserver takes an empty term at create, and on a gated pod
      -- only narrowing updates of the terms (an empty term matches nothing:
      -- a requirement added to it would widen it)
      launcher("virt-launcher-vm-e-x", v, { gates = { "example.com/other", GATE },
        affinity = required_terms { json.object(), { matchExpressions = { { key = "zone", operator = "In", values = { "a" } } } } } })
      local p
      assert(P.wait_until(function()
        p = pod("virt-launcher-vm-e-x")
        return #(p.spec.schedulingGates or {}) == 1
      end, 60, 0.2), enc(p))
      -- only our gate went; another controller's stays
      assert.are.same({ { name = "example.com/other" } }, p.spec.schedulingGates)
      local terms = p.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
      assert.are.equal(2, #terms)
      assert.is_nil(next(terms[1]))
      assert.are.same({ { key = "metadata.name", operator = "In", values = { "gpu-1" } } }, terms[2].matchFields)
    end)

    it("a VMI naming claims another VMI is attached to: refused at admission, and its launcher pod stays gated", function()
      G.add_node(c, "gpu-1", 2)
      add_claim("o1")
      wait_claim("o1", "Bound", "gpu-1")
      vmi("vm-o1", "o1", "Running", "gpu-1")
      wait_claim("o1", "Attached", "gpu-1")
      -- the real server calls cozygpu's VMI webhook: the claim is held by
      -- another live VMI (409)
      local st, body = c:request("POST", vmis_path(NS), { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
        metadata = { name = "vm-o2", namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" },
          annotations = { [GATE] = "o1" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } },
          resources = { requests = { memory = "1Gi" } } } } })
      assert.are.equal(409, st, enc(body))
      -- the annotation edited in after creation (no webhook judges an
      -- update; deploy/58's policy refuses it, edit_claims_annotation): the
      -- leader still does not pin it
      local v2 = vmi("vm-o2", nil, "Pending")
      local edited = edit_claims_annotation("vm-o2", "o1")
      local lp = launcher("virt-launcher-vm-o2-x", v2, { annotations = { [GATE] = "o1" }, gates = { GATE } })
      -- the leader has taken the edit (VMI watch) and the pod (pod watch):
      -- the pod must stay as it is
      applied("virtualmachineinstances", edited)
      applied("pods", lp)
      local p = pod("virt-launcher-vm-o2-x")
      assert.are.same({ { name = GATE } }, p.spec.schedulingGates)
      assert.is_nil(p.spec.affinity)
    end)

    it("a running VMI takes its claim from a stopped VM that names it too", function()
      G.add_node(c, "gpu-1", 1)
      G.add_node(c, "gpu-2", 1)
      add_claim("s1")
      vm("vm-stopped", "Halted", { metadata = { annotations = { [GATE] = "s1" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
      local n = wait_claim("s1", "Bound").status.node
      vmi("vm-running", "s1", "Running", n)
      local cl = wait_claim("s1", "Attached", n)
      assert.are.equal("vm-running", cl.status.attachedTo)
      -- and a cordon does not move it from under the running VM
      applied("nodes", cordon(n)) -- the claim must stay
      cl = claim("s1")
      assert.are.equal("Attached", cl.status.phase)
      assert.are.equal(n, cl.status.node)
    end)

    it("a running VMI whose claims annotation names nothing real still uses its node's GPUs", function()
      G.add_node(c, "gpu-1", 1)
      -- a raw-name VM runs there: the node has no room
      vmi("raw", nil, "Running", "gpu-1")
      add_claim("w1")
      wait_reason("w1", "NoNodeWithRoom")
      -- the tenant annotates the running VMI with claims that do not exist
      applied("virtualmachineinstances", edit_claims_annotation("raw", "nothing")) -- the claim must keep waiting
      local cl = claim("w1")
      assert.are.equal("Pending", cl.status.phase)
      assert.are.equal("NoNodeWithRoom", ready_cond(cl).reason)
    end)

    it("a claim deleted while its VMI runs keeps its hold until the VMI ends (finalizer gpu.cozystack.io/claim-protection)", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("u1")
      local cl = wait_claim("u1", "Bound", "gpu-1")
      assert(P.wait_until(function()
        cl = claim("u1")
        for _, f in ipairs(cl.metadata.finalizers or {}) do
          if f == "gpu.cozystack.io/claim-protection" then return true end
        end
      end, 60, 0.2), enc(cl))
      vmi("vm-u", "u1", "Running", "gpu-1")
      wait_claim("u1", "Attached", "gpu-1")
      must("DELETE", claims_path(NS) .. "/u1")
      add_claim("u2") -- the unit is still in use: it waits
      wait_reason("u2", "NoNodeWithRoom")
      cl = claim("u1")
      assert.is_string(cl.metadata.deletionTimestamp)
      assert.are.equal("Attached", cl.status.phase)
      -- the VMI ends: the deleted claim goes, and its unit is free again
      vmi_phase("vm-u", "Succeeded", "gpu-1")
      wait_gone(claims_path(NS) .. "/u1", "the deleted claim was kept after its VMI ended")
      wait_claim("u2", "Bound", "gpu-1")
    end)

    it("a template VMI gets its claims while it lives: created owned by it, bound, attached, deleted once it is final", function()
      G.add_node(c, "gpu-1", 2)
      local v = template_vmi("pool-w1", 2)
      -- one claim for the class, two units, named <vmi>-<class> (decision 0027)
      local cl = wait_claim("pool-w1-l40s", "Bound", "gpu-1")
      assert.are.equal(2, cl.spec.count)
      assert.are.equal("l40s", cl.spec.class)
      assert.are.equal("true", cl.metadata.labels["gpu.cozystack.io/template-claim"])
      local ref = cl.metadata.ownerReferences[1]
      assert.are.same({ "VirtualMachineInstance", "pool-w1", v.metadata.uid, true },
        { ref.kind, ref.name, ref.uid, ref.controller })
      -- its launcher pod, gated (as the webhook gates it, decision 0027), is pinned there
      launcher("virt-launcher-pool-w1-x", v, { gates = { GATE }, labels = { ["gpu.cozystack.io/class-reference"] = "true" },
        resources = { limits = { [L40S] = "2" }, requests = { [L40S] = "2" } } })
      local p
      assert(P.wait_until(function()
        p = pod("virt-launcher-pool-w1-x")
        return p.spec.schedulingGates == nil
      end, 60, 0.2), enc(p))
      assert.are.same({ { matchFields = { { key = "metadata.name", operator = "In", values = { "gpu-1" } } } } },
        p.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
      -- it runs there: Attached
      vmi_phase("pool-w1", "Running", "gpu-1")
      cl = wait_claim("pool-w1-l40s", "Attached", "gpu-1")
      assert.are.equal("pool-w1", cl.status.attachedTo)
      -- final: the claim goes (pay only while running), and its units are free
      vmi_phase("pool-w1", "Succeeded", "gpu-1")
      wait_gone(claims_path(NS) .. "/pool-w1-l40s", "the template claim of a final VMI was kept")
      add_claim("after", 2)
      wait_claim("after", "Bound", "gpu-1")
    end)

    it("a claim of a template name the VMI does not own is never taken over", function()
      G.add_node(c, "gpu-1", 2)
      add_claim("pool-w3-l40s") -- the tenant's own claim, of the name the VMI's would have
      wait_claim("pool-w3-l40s", "Bound", "gpu-1")
      local v = template_vmi("pool-w3")
      local lp = launcher("virt-launcher-pool-w3-x", v, { gates = { GATE }, labels = { ["gpu.cozystack.io/class-reference"] = "true" } })
      applied("virtualmachineinstances", v)
      applied("pods", lp) -- the pod must stay gated
      local p = pod("virt-launcher-pool-w3-x")
      assert.are.same({ { name = GATE } }, p.spec.schedulingGates)
      local cl = claim("pool-w3-l40s")
      assert.are.same({}, cl.metadata.ownerReferences or {})
      -- it runs anyway (say the webhook was off): the claim is not attached to it
      applied("virtualmachineinstances", vmi_phase("pool-w3", "Running", "gpu-1"))
      cl = claim("pool-w3-l40s")
      assert.are.equal("Bound", cl.status.phase)
      assert.is_nil(cl.status.attachedTo)
      -- and when the VMI is final, the tenant's claim is not deleted with it
      applied("virtualmachineinstances", vmi_phase("pool-w3", "Succeeded", "gpu-1"))
      cl = claim("pool-w3-l40s")
      assert.are.equal("pool-w3-l40s", cl.metadata.name)
      assert.is_nil(cl.metadata.deletionTimestamp)
    end)

    it("a template VM whose VMI failed on a node gets its next VMI's claims placed elsewhere (DESIGN.md §6, last rule)", function()
      G.add_node(c, "gpu-1", 1)
      G.add_node(c, "gpu-2", 1)
      -- the VM whose controller replaces the VMI: what its VMIs failed on is
      -- remembered while the VM exists, also between two of its VMIs
      vm("pool-f1", "Always", { metadata = { labels = { ["gpu.cozystack.io/class-reference"] = "true" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
      template_vmi("pool-f1")
      local first = wait_claim("pool-f1-l40s", "Bound").status.node
      local other = first == "gpu-1" and "gpu-2" or "gpu-1"
      vmi_phase("pool-f1", "Failed", first) -- it failed there (say the device would not attach)
      wait_gone(claims_path(NS) .. "/pool-f1-l40s")
      -- the VM controller replaces the VMI (same name): its claim goes to the other node
      must("DELETE", vmis_path(NS) .. "/pool-f1")
      wait_gone(vmis_path(NS) .. "/pool-f1")
      template_vmi("pool-f1")
      wait_claim("pool-f1-l40s", "Bound", other)
    end)

    it("a template VM that failed on the only node with room tries that node again", function()
      G.add_node(c, "gpu-1", 1)
      template_vmi("pool-one")
      wait_claim("pool-one-l40s", "Bound", "gpu-1")
      vmi_phase("pool-one", "Failed", "gpu-1")
      wait_gone(claims_path(NS) .. "/pool-one-l40s")
      must("DELETE", vmis_path(NS) .. "/pool-one")
      wait_gone(vmis_path(NS) .. "/pool-one")
      template_vmi("pool-one")
      wait_claim("pool-one-l40s", "Bound", "gpu-1")
    end)

    it("a template VMI's ungated launcher pod pinned where its claims are not has its Pending VMI deleted", function()
      G.add_node(c, "gpu-1", 1)
      local v = template_vmi("pool-sp")
      wait_claim("pool-sp-l40s", "Bound", "gpu-1")
      -- no device request: the launcher webhook is not called
      launcher("virt-launcher-pool-sp-x", v, { labels = { ["gpu.cozystack.io/class-reference"] = "true" },
        affinity = required_terms { { matchFields = { { key = "metadata.name", operator = "In", values = { "gpu-old" } } } } } })
      wait_gone(vmis_path(NS) .. "/pool-sp", "the template VMI of a pod pinned to the wrong node was not deleted")
    end)

    it("a node deleted and registered again while its VMI runs: the claim goes back to Attached there and keeps its unit", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("rr1")
      wait_claim("rr1", "Bound", "gpu-1")
      vmi("vm-rr", "rr1", "Running", "gpu-1")
      wait_claim("rr1", "Attached", "gpu-1")
      must("DELETE", "/api/v1/nodes/gpu-1")
      local cl = wait_claim("rr1", "Lost")
      assert.are.equal("WaitingForVMIEnd", ready_cond(cl).reason)
      -- the garbage collector takes the node's GPUNode (owned by the Node)
      wait_gone("/apis/cozystack.io/v1alpha1/gpunodes/gpu-1", "the deleted node's GPUNode was not collected")
      -- the kubelet registers the node again, the agent its GPUNode; the VMI never stopped
      G.add_node(c, "gpu-1", 1)
      cl = wait_claim("rr1", "Attached", "gpu-1")
      assert.are.equal("vm-rr", cl.status.attachedTo)
      add_claim("rr2")
      wait_reason("rr2", "NoNodeWithRoom")
    end)

    it("a VM whose volume was bound on a node (WaitForFirstConsumer) gets its claims only where the volume allows", function()
      G.add_node(c, "gpu-1", 1)
      G.add_node(c, "gpu-2", 1)
      -- a local volume on gpu-2 of a WaitForFirstConsumer StorageClass,
      -- bound to the VM's PVC (as it stays once the VM first ran there);
      -- kube-controller-manager's volume binder binds the pair
      must("POST", "/apis/storage.k8s.io/v1/storageclasses", { apiVersion = "storage.k8s.io/v1", kind = "StorageClass",
        metadata = { name = "local" }, provisioner = "kubernetes.io/no-provisioner", volumeBindingMode = "WaitForFirstConsumer" })
      must("POST", "/api/v1/persistentvolumes", { apiVersion = "v1", kind = "PersistentVolume",
        metadata = { name = "local-pv-gpu2" },
        spec = { capacity = { storage = "10Gi" }, accessModes = { "ReadWriteOnce" }, storageClassName = "local",
          ["local"] = { path = "/mnt/disks/vol1" }, claimRef = { namespace = NS, name = "disk-w1" },
          nodeAffinity = { required = { nodeSelectorTerms = { { matchExpressions = {
            { key = "kubernetes.io/hostname", operator = "In", values = { "gpu-2" } } } } } } } } })
      must("POST", pvcs_path(NS), { apiVersion = "v1", kind = "PersistentVolumeClaim",
        metadata = { name = "disk-w1", namespace = NS },
        spec = { accessModes = { "ReadWriteOnce" }, storageClassName = "local", volumeName = "local-pv-gpu2",
          resources = { requests = { storage = "10Gi" } } } })
      local pvc
      assert(P.wait_until(function()
        pvc = c:get(pvcs_path(NS) .. "/disk-w1")
        return pvc and pvc.status and pvc.status.phase == "Bound"
      end, 60, 0.2), "the PVC was not bound: " .. enc(pvc))
      vm("vm-w1", "Halted", { metadata = { annotations = { [GATE] = "v1" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } },
          volumes = { { name = "disk", persistentVolumeClaim = { claimName = "disk-w1" } } } } })
      add_claim("v1") -- ordered after the VM names it
      -- packing order alone would take gpu-1 (both are empty; it comes first)
      wait_claim("v1", "Bound", "gpu-2")
      -- cordoned, with no other node the volume allows: it keeps its hold
      cordon("gpu-2")
      local cl = wait_reason("v1", "NodeCordoned")
      assert.are.equal("gpu-2", cl.status.node)
    end)

    it("a running raw-name VMI asking for GPUs through domain.resources uses its node's units", function()
      G.add_node(c, "gpu-1", 1)
      local v = must("POST", vmis_path(NS), { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
        metadata = { name = "rawres", namespace = NS },
        -- KubeVirt's CRD schema requires spec.domain.devices (the double stored it without)
        spec = { domain = { devices = json.object(), resources = { limits = { [L40S] = "1" }, requests = { [L40S] = "1", memory = "1Gi" } } } } })
      v.status = { phase = "Running", nodeName = "gpu-1" }
      must("PUT", vmis_path(NS) .. "/rawres", v)
      add_claim("rr")
      wait_reason("rr", "NoNodeWithRoom")
    end)

    it("a claim deleted while its VMI is Pending (its launcher pod may be pinned) keeps its hold", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("pd1")
      wait_claim("pd1", "Bound", "gpu-1")
      vmi("vm-pd", "pd1", "Pending")
      must("DELETE", claims_path(NS) .. "/pd1")
      add_claim("pd2")
      wait_reason("pd2", "NoNodeWithRoom")
      local cl = claim("pd1")
      assert.is_string(cl.metadata.deletionTimestamp)
      assert.are.equal("Bound", cl.status.phase)
    end)

    it("a node's capacity drops under its claims: the most recently bound unattached one moves", function()
      G.add_node(c, "gpu-1", 2)
      add_claim("cap1")
      wait_claim("cap1", "Bound", "gpu-1")
      add_claim("cap2")
      wait_claim("cap2", "Bound", "gpu-1")
      G.add_node(c, "gpu-2", 1)
      -- the kubelet now advertises one L40S on gpu-1 (a GPU failed)
      G.node_status(c, "gpu-1", { units = 2, alloc = 1 })
      wait_claim("cap2", "Bound", "gpu-2")
      assert.are.equal("gpu-1", claim("cap1").status.node) -- it keeps its node: it still has the capacity
    end)

    it("a layout change pending on a node: its unattached claim moves, or keeps its hold saying why", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("lay1")
      wait_claim("lay1", "Bound", "gpu-1")
      -- the agent has a vGPU layout change to apply (GPUNode status subresource)
      local g = must("GET", "/apis/cozystack.io/v1alpha1/gpunodes/gpu-1")
      g.status.layout = g.status.layout or {}
      g.status.layout.pending = true
      must("PUT", "/apis/cozystack.io/v1alpha1/gpunodes/gpu-1/status", g)
      local cl = wait_reason("lay1", "LayoutChangePending")
      assert.are.equal("gpu-1", cl.status.node)
      G.add_node(c, "gpu-2", 1)
      wait_claim("lay1", "Bound", "gpu-2")
    end)

    it("a large Lost set that fits nowhere does not block a smaller order that fits", function()
      G.add_node(c, "gpu-1", 4)
      for _, n in ipairs { "big1", "big2", "big3" } do add_claim(n) end
      vm("vm-big", "Halted", { metadata = { annotations = { [GATE] = "big1,big2,big3" } },
        spec = { domain = { devices = { gpus = { { name = "g1", deviceName = L40S }, { name = "g2", deviceName = L40S },
          { name = "g3", deviceName = L40S } } } } } })
      for _, n in ipairs { "big1", "big2", "big3" } do wait_claim(n, "Bound", "gpu-1") end
      must("DELETE", "/api/v1/nodes/gpu-1")
      for _, n in ipairs { "big1", "big2", "big3" } do wait_claim(n, "Lost") end
      add_claim("small")
      G.add_node(c, "gpu-2", 2) -- room for the small order, not for the Lost set of three
      wait_claim("small", "Bound", "gpu-2")
      for _, n in ipairs { "big1", "big2", "big3" } do
        local cl = claim(n)
        assert.are.equal("Lost", cl.status.phase)
        assert.are.equal("NodeLost", ready_cond(cl).reason)
      end
    end)

    it("a claim stays Attached while its VMI is being deleted, and leaves Attached only once the VMI is final", function()
      G.add_node(c, "gpu-1", 1)
      add_claim("dt1")
      wait_claim("dt1", "Bound", "gpu-1")
      local v = must("POST", vmis_path(NS), { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
        metadata = { name = "vm-dt", namespace = NS, finalizers = { "kubevirt.io/virtualMachineControllerFinalize" },
          labels = { ["gpu.cozystack.io/class-reference"] = "true" }, annotations = { [GATE] = "dt1" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } },
          resources = { requests = { memory = "1Gi" } } } } })
      v.status = { phase = "Running", nodeName = "gpu-1" }
      must("PUT", vmis_path(NS) .. "/vm-dt", v)
      wait_claim("dt1", "Attached", "gpu-1")
      -- deleted: KubeVirt's finalizer keeps it while the guest shuts down
      -- (the DELETE answers the object with its deletionTimestamp: an
      -- update on the VMI watch)
      local deleting = must("DELETE", vmis_path(NS) .. "/vm-dt")
      assert.is_string(deleting.metadata.deletionTimestamp, enc(deleting))
      applied("virtualmachineinstances", deleting) -- the claim must stay Attached
      local cl = claim("dt1")
      assert.are.equal("Attached", cl.status.phase) -- DESIGN §6: not on a deletion timestamp alone
      vmi_phase("vm-dt", "Succeeded", "gpu-1")
      cl = wait_claim("dt1", "Bound", "gpu-1")
      assert.is_nil(cl.status.attachedTo)
    end)

    it("a gated launcher pod whose claims are not bound stays gated", function()
      add_claim("g1") -- no node at all
      wait_reason("g1", "NoNodeWithRoom")
      local v = vmi("vm-g", "g1", "Pending")
      local lp = launcher("virt-launcher-vm-g-x", v, { gates = { GATE } })
      applied("virtualmachineinstances", v)
      applied("pods", lp) -- the pod must stay gated
      local p = pod("virt-launcher-vm-g-x")
      assert.are.same({ { name = GATE } }, p.spec.schedulingGates)
      assert.is_nil(p.spec.affinity)
      -- room arrives: bound, then pinned and ungated
      G.add_node(c, "gpu-3", 1)
      wait_claim("g1", "Bound", "gpu-3")
      assert(P.wait_until(function()
        p = pod("virt-launcher-vm-g-x")
        return p.spec.schedulingGates == nil
      end, 60, 0.2), enc(p))
      assert.are.same({ { matchFields = { { key = "metadata.name", operator = "In", values = { "gpu-3" } } } } },
        p.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
    end)

    it("a claim Lost with the budget full is rebound without a budget check (DESIGN.md §5)", function()
      local A = "tenant-a" -- examples/cluster/quotas.yaml: 2 devices
      used_a = true
      G.add_node(c, "gpu-1", 2)
      add_claim("a1", 1, nil, A)
      add_claim("a2", 1, nil, A)
      wait_claim("a1", "Bound", "gpu-1", A)
      wait_claim("a2", "Bound", "gpu-1", A)
      -- the budget (2) is full; the node goes away: both Lost
      must("DELETE", "/api/v1/nodes/gpu-1")
      wait_claim("a1", "Lost", nil, A)
      wait_claim("a2", "Lost", nil, A)
      -- a new order now is refused at admission: the Lost claims count
      local st, body = c:request("POST", claims_path(A), { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
        metadata = { name = "a3", namespace = A }, spec = { class = "l40s", count = 1 } })
      assert.are.equal(403, st, enc(body))
      assert.matches("gpuclass.cozystack.io/devices is 2", type(body) == "table" and body.message or enc(body), 1, true)
      -- so it gets in the way a hoster's change lets it: ordered while the
      -- budget was 3, which is then lowered to 2 again
      merge_patch("/api/v1/namespaces/tenant-a/resourcequotas/gpu", { spec = { hard = { ["gpuclass.cozystack.io/devices"] = "3" } } })
      assert(P.wait_until(function()
        st, body = c:request("POST", claims_path(A), { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
          metadata = { name = "a3", namespace = A }, spec = { class = "l40s", count = 1 } })
        return st == 201
      end, 60, 0.5), "a3 not admitted with a budget of 3: " .. tostring(st) .. " " .. enc(body))
      wait_reason("a3", "NoNodeWithRoom", A)
      merge_patch("/api/v1/namespaces/tenant-a/resourcequotas/gpu", { spec = { hard = { ["gpuclass.cozystack.io/devices"] = "2" } } })
      -- the webhook's replica shows the lowered budget (a server-side dry
      -- run is judged by it; the leader reads the same watch)
      assert(P.wait_until(function()
        st, body = c:request("POST", claims_path(A) .. "?dryRun=All", { apiVersion = "cozystack.io/v1alpha1",
          kind = "GPUClaim", metadata = { name = "probe", namespace = A }, spec = { class = "l40s", count = 1 } })
        return st == 403 and type(body) == "table" and (body.message or ""):find("gpuclass.cozystack.io/devices is 2", 1, true)
      end, 60, 0.5), "the lowered budget is not seen: " .. tostring(st) .. " " .. enc(body))
      -- room returns for all three: the Lost claims go back without a budget
      -- check though the budget is full (they keep counting while Lost), and
      -- the new order is refused by the budget, not by room
      G.add_node(c, "gpu-2", 4)
      wait_claim("a1", "Bound", "gpu-2", A)
      wait_claim("a2", "Bound", "gpu-2", A)
      local c3 = wait_reason("a3", "OverBudget", A)
      assert.are.equal("Pending", c3.status.phase)
      assert.are.equal(2, held()["gpu-2"])
      -- the condition names the tenant, the key and its limit, nothing else's
      local r = ready_cond(c3)
      assert.are.equal("False", r.status)
      assert.matches('tenant "tenant-a"', r.message, 1, true)
      assert.matches("gpuclass.cozystack.io/devices is 2", r.message, 1, true)
      -- room in the budget returns: a Bound claim deleted (unused: its
      -- protection finalizer is released), the waiting one binds
      must("DELETE", claims_path(A) .. "/a1")
      wait_gone(claims_path(A) .. "/a1", "the unused deleted claim was kept")
      wait_claim("a3", "Bound", "gpu-2", A)
    end)

    it("a node going NotReady keeps a stopped VM's hold when a running VMI's claim there goes Lost (decision 0021 §2)", function()
      -- decision 0021: gpu-1 offers 2; nr-a attached to a running VMI, nr-b
      -- held for a stopped VM; no other node
      G.add_node(c, "gpu-1", 2)
      add_claim("nr-a")
      wait_claim("nr-a", "Bound", "gpu-1")
      vm("vm-nr-b", "Halted", { metadata = { annotations = { [GATE] = "nr-b" } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
      add_claim("nr-b")
      wait_claim("nr-b", "Bound", "gpu-1")
      vmi("vm-nr-a", "nr-a", "Running", "gpu-1")
      wait_claim("nr-a", "Attached", "gpu-1")
      invariants_hold()
      local notready = set_ready("gpu-1", "False")
      local cl = wait_claim("nr-a", "Lost", "gpu-1")
      assert.are.equal("WaitingForVMIEnd", ready_cond(cl).reason)
      -- the leader has taken the NotReady node and its own write of nr-a
      -- (Lost): nr-b must keep its hold (the running VMI's unit is its Lost
      -- claim's, not raw use on top of it)
      applied("nodes", notready)
      applied("gpuclaims", cl)
      cl = claim("nr-b")
      assert.are.same({ "Bound", "gpu-1" }, { cl.status.phase, cl.status.node }, enc(cl.status))
      invariants_hold()
      -- the node returns: nr-a Attached again, nr-b still there
      set_ready("gpu-1", "True")
      wait_claim("nr-a", "Attached", "gpu-1")
      assert.are.equal("gpu-1", claim("nr-b").status.node)
      invariants_hold()
    end)

    -- a stopped VM (Halted) naming claim `x` whose last VMI `vm` ended
    -- (Succeeded) and is still there, as KubeVirt keeps it; returns the node
    local function stopped_vm_with_final_vmi(vmname, x)
      add_claim(x)
      vm(vmname, "Halted", { metadata = { annotations = { [GATE] = x } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
      local n = wait_claim(x, "Bound").status.node
      vmi(vmname, x, "Running", n)
      wait_claim(x, "Attached", n)
      vmi_phase(vmname, "Succeeded", n)
      wait_claim(x, "Bound", n)
      return n
    end

    it("a live VMI takes its claim from a stopped VM whose final VMI still exists (decision 0026 §6)", function()
      -- decision 0026: a live VMI's claims are given up with its VM
      G.add_node(c, "gpu-1", 1)
      local n = stopped_vm_with_final_vmi("vm-fs", "fs1")
      vmi("vm-fs-live", "fs1", "Running", n)
      local cl = wait_claim("fs1", "Attached", n)
      assert.are.equal("vm-fs-live", cl.status.attachedTo)
      invariants_hold()
      -- the live VMI ends: the claim is Bound again and the stopped VM's set can have it
      vmi_phase("vm-fs-live", "Succeeded", n)
      wait_claim("fs1", "Bound", n)
      invariants_hold()
    end)

    it("the launcher pod of a live VMI naming a stopped VM's claim (final VMI kept) is ungated by a new leader", function()
      -- decision 0026, the variant: the new leader rebuilds with both there
      G.add_node(c, "gpu-1", 1)
      local n = stopped_vm_with_final_vmi("vm-fl", "fl1")
      local holder = lease_holder()
      assert.is_truthy(c.replicas[holder], tostring(holder))
      local other = holder == "replica-a" and "replica-b" or "replica-a"
      c:target_webhooks(other)
      local dead = c.replicas[holder]
      P.kill(dead.pid, 9)
      c.replicas[holder] = nil
      -- created while the lead is vacant: the new leader finds them at take-over
      local v
      assert(P.wait_until(function()
        local st, body = c:request("POST", vmis_path(NS), { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
          metadata = { name = "vm-fl-live", namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" },
            annotations = { [GATE] = "fl1" } },
          spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } },
            resources = { requests = { memory = "1Gi" } } } } })
        if st == 201 then v = body end
        return st == 201
      end, 60, 0.5), "the live VMI was not admitted")
      dirty[vmis_path(NS)] = true
      launcher("virt-launcher-vm-fl-live-x", v, { annotations = { [GATE] = "fl1" }, gates = { GATE } })
      assert(P.wait_until(function() return lease_holder() == other end, 60, 0.2), "the Lease did not move")
      local p
      assert(P.wait_until(function()
        p = pod("virt-launcher-vm-fl-live-x")
        return p and p.spec.schedulingGates == nil
      end, 60, 0.2), "the launcher pod stays gated: " .. enc(p and p.spec))
      assert.are.same({ { matchFields = { { key = "metadata.name", operator = "In", values = { n } } } } },
        p.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
      vmi_phase("vm-fl-live", "Running", n)
      local cl = wait_claim("fl1", "Attached", n)
      assert.are.equal("vm-fl-live", cl.status.attachedTo)
      invariants_hold()
      -- the killed replica comes back (a new pod of the Deployment)
      local r = c:start_controller { identity = holder, port = dead.port, extra = dead.extra }
      assert(P.wait_until(function()
        return P.http { url = ("http://127.0.0.1:%d/readyz"):format(r.probe_port), timeout = 2 } == 200
      end, 60, 0.2), "the restarted replica is not ready:\n" .. (P.read(r.log) or ""):sub(-3000))
    end)
  end)
end)
