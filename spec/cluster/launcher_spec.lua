-- The launcher pod of a VMI naming GPUClaims, on a real control plane
-- (DESIGN.md §4, decisions 0020, 0025, 0033): kube-apiserver calls
-- /mutate/launcher, which pins a pod whose claims are attached to its VMI
-- to the claims' node, or gates it (gpu.cozystack.io/claims); then
-- kube-scheduler, not the spec, decides where the pod goes. A gated pod
-- stays unscheduled until the leader binds its claims, pins the pod and
-- removes the gate. Nodes are objects with allocatable and a Ready
-- condition (no kubelet: no container starts). The pin's shape (ANDed into
-- each non-empty required term, cozygpu.pin) is checked against what
-- kube-apiserver accepts on a gated pod (KEP-3838).
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local pin = require "cozygpu.pin"
local json = H.json

local NS = "tenant-a"
-- tenant-a's budget (examples/cluster/quotas.yaml: 2 GPUs) is taken by the
-- first two claims; the later ones are in tenant-b (capacity alone)
local NS_B = "tenant-b"
local function claims_path(ns) return "/apis/cozystack.io/v1alpha1/namespaces/" .. (ns or NS) .. "/gpuclaims/" end
local function pods_path(ns) return "/api/v1/namespaces/" .. (ns or NS) .. "/pods/" end
local GATE = "gpu.cozystack.io/claims"
-- the user KubeVirt's virt-controller creates launcher pods as (the
-- KubeVirt CR is in cozy-kubevirt: examples/cluster/kubevirt.yaml)
local VIRT_CONTROLLER = "system:serviceaccount:cozy-kubevirt:kubevirt-controller"
-- a gate of someone else's (another controller's), kept as it is
local OTHER = "example.com/quota"
-- gpu/launcher-billing's annotation: the claims' GPUs reported as "0" to
-- Cozystack's pod Workload (decision 0028)
local BILLING = "workload.cozystack.io/resources"

local function expr(key, op, values) return { key = key, operator = op, values = values } end
local function pinned(node) return expr("metadata.name", "In", { node }) end

describe("launcher pods placed by kube-scheduler", function()
  local c

  -- creates obj as the admin, or as user `as` (impersonated by the admin)
  local function create(obj, as)
    local args = { "create", "-f", "-", "-o", "json" }
    if as then args[#args + 1] = "--as=" .. as end
    local out, err, code = c:kubectl(args, { stdin = json.encode(obj) })
    assert(code == 0, ("kubectl create %s/%s: %s%s"):format(obj.kind, obj.metadata.name, out, err))
    return json.decode(out)
  end
  local function claim(name, ns)
    return create { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = name, namespace = ns or NS }, spec = { class = "l40s", count = 1 } }
  end
  local function claim_status(name, ns)
    local cl = c:get(claims_path(ns) .. name)
    return cl and cl.status or {}
  end
  -- a VMI naming claims, as a tenant creates it (its VM controller would),
  -- with `gpus` L40S entries (default 1: one per claim of one unit)
  local function vmi(name, claims, ns, gpus)
    local list = {}
    for i = 1, gpus or 1 do list[i] = { name = "gpu" .. i, deviceName = G.L40S } end
    return create { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = ns or NS, annotations = { [GATE] = claims } },
      spec = { domain = { devices = { gpus = list }, resources = { requests = { memory = "1Gi" } } } } }
  end
  -- the virt-launcher pod virt-controller creates for VMI v (label, owner,
  -- the claims annotation copied, the GPU in the compute container), as
  -- virt-controller's ServiceAccount creates it (the request's user, which
  -- gpu/launcher-billing trusts, decision 0028), with
  -- `extra` fields of its spec (the VMI's affinity, gates of others)
  local function launcher(v, extra)
    -- KubeVirt renders each gpus entry as one unit of its deviceName
    local units = tostring(#v.spec.domain.devices.gpus)
    local spec = { containers = { { name = "compute", image = "quay.io/kubevirt/virt-launcher:v1.9.0",
      resources = { limits = { [G.L40S] = units }, requests = { [G.L40S] = units } } } } }
    for k, x in pairs(extra or {}) do spec[k] = x end
    return create({ apiVersion = "v1", kind = "Pod",
      metadata = { name = "virt-launcher-" .. v.metadata.name .. "-abcde", namespace = v.metadata.namespace,
        labels = { ["kubevirt.io"] = "virt-launcher", ["vm.kubevirt.io/name"] = v.metadata.name },
        annotations = { [GATE] = v.metadata.annotations[GATE], ["kubevirt.io/domain"] = v.metadata.name },
        ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = v.metadata.name,
          uid = v.metadata.uid, controller = true, blockOwnerDeletion = true } } },
      spec = spec }, VIRT_CONTROLLER)
  end
  local function pod(name, ns) return c:get(pods_path(ns) .. name) end
  -- waits until the leader has applied `obj` as it is now (its watch event
  -- of `resource`, decision 0040): what a "must stay" check waits for
  local function applied(resource, obj)
    assert(c:wait_applied(resource, obj.metadata.resourceVersion),
      ("the leader did not apply %s %s at resourceVersion %s"):format(resource, obj.metadata.name,
        tostring(obj.metadata.resourceVersion)))
  end
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

  local session = K.session { invariants = true, prepare = function(cl)
    c = cl
    -- what KubeVirt's ClusterRole grants virt-controller of pods, enough
    -- for the spec to create launcher pods as it
    c:must { "create", "clusterrole", "spec-virt-controller-pods", "--verb=create,get", "--resource=pods" }
    c:must { "create", "clusterrolebinding", "spec-virt-controller-pods", "--clusterrole=spec-virt-controller-pods",
      "--serviceaccount=cozy-kubevirt:kubevirt-controller" }
    G.add_node(c, "gpu-node-1", 1)
  end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

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

  it("a pod whose claims are Bound is gated at create; the leader pins it to the claims' node, ungates it, and it is scheduled there", function()
    claim("bound-a")
    assert(P.wait_until(function() return claim_status("bound-a").phase == "Bound" end, 30, 0.2),
      json.encode(claim_status("bound-a")))
    local node = claim_status("bound-a").node
    assert.are.equal("gpu-node-1", node)
    local v = vmi("ready", "bound-a")
    -- gated by the webhook: a Bound claim is attached to no VMI yet, and
    -- which VMI gets it is the leader's decision (decision 0036)
    local p = launcher(v)
    assert.is_true(gated(p))
    assert.is_nil(p.spec.affinity)
    assert(P.wait_until(function()
      p = pod(p.metadata.name)
      return p and not gated(p)
    end, 30, 0.2), "the leader did not ungate the pod: " .. json.encode(p and p.spec))
    -- the pin: a required node affinity to the claims' node, the one term
    -- of a pod that had none (cozygpu.pin, decision 0025)
    assert.are.same({ nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = {
      nodeSelectorTerms = { { matchFields = { pinned(node) } } } } } }, p.spec.affinity)
    -- the class's toleration of the node's GPU taint, once
    local tol = {}
    for _, t in ipairs(p.spec.tolerations or {}) do
      if t.key == "gpu.cozystack.io/mode" then tol[#tol + 1] = t end
    end
    assert.are.same({ { key = "gpu.cozystack.io/mode", operator = "Equal", value = "passthrough", effect = "NoSchedule" } }, tol)
    -- the claims' GPU reported as 0 to Cozystack's pod Workload: the usage
    -- record bills it (decision 0028)
    assert.are.same({ [G.L40S] = "0" }, json.decode(p.metadata.annotations[BILLING]))
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
    -- the leader has taken the VMI and the pod as kube-scheduler left it:
    -- the pod stays gated, so unscheduled
    applied("virtualmachineinstances", v)
    applied("pods", pod(p.metadata.name))
    assert.is_true(gated(pod(p.metadata.name)))
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

  it("a gated pod keeps another's gate and its own affinity: the leader ANDs the pin into each non-empty term and removes only its gate", function()
    -- every node is full (gpu-node-1: bound-a, gpu-node-2: waiting)
    claim("queued", NS_B)
    assert(P.wait_until(function() return claim_status("queued", NS_B).phase == "Pending" end, 30, 0.2))
    local v = vmi("queued", "queued", NS_B)
    -- the VMI's own affinity, copied to its pod: three ORed terms, the last
    -- empty (it matches no node), and a preference
    local terms = {
      { matchExpressions = { expr("topology.kubernetes.io/zone", "In", { "a" }) } },
      { matchExpressions = { expr("topology.kubernetes.io/zone", "In", { "b" }) },
        matchFields = { expr("metadata.name", "NotIn", { "gpu-node-9" }) } },
      json.object(),
    }
    local pref = { { weight = 10, preference = { matchExpressions = { { key = "example.com/fast", operator = "Exists" } } } } }
    local p = launcher(v, { schedulingGates = { { name = OTHER } }, affinity = { nodeAffinity = {
      requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = terms },
      preferredDuringSchedulingIgnoredDuringExecution = pref } } })
    -- the webhook appends its gate after the other one and leaves the
    -- affinity alone until the claim is bound
    assert.are.same({ { name = OTHER }, { name = GATE } }, p.spec.schedulingGates)
    assert.are.same(terms[1], p.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[1])
    assert.are.same({ [G.L40S] = "0" }, json.decode(p.metadata.annotations[BILLING]))
    -- a reinvocation (reinvocationPolicy IfNeeded: the API server calls
    -- the webhook again with the pod as mutated) changes nothing
    local _, r = next(c.replicas)
    local st, body = P.http { method = "POST", url = r.url .. "/mutate/launcher", cacert = r.cacert, timeout = 15,
      headers = { "Content-Type: application/json" }, body = json.encode { apiVersion = "admission.k8s.io/v1",
        kind = "AdmissionReview", request = H.request((pod(p.metadata.name, NS_B))) } }
    assert.are.equal(200, st)
    local review = json.decode(body)
    assert.is_true(review.response.allowed, body)
    assert.is_nil(H.patch_of(review.response))

    -- room on a new node in zone b: the leader binds the claim there, pins
    -- the stored pod and removes its gate, through kube-apiserver's
    -- validation of a gated pod's update (KEP-3838)
    G.add_node(c, "gpu-node-3", 1)
    c:must { "label", "node", "gpu-node-3", "topology.kubernetes.io/zone=b" }
    local x
    assert(P.wait_until(function()
      x = pod(p.metadata.name, NS_B)
      return x and not gated(x)
    end, 60, 0.2), "the leader did not remove its gate within 60 s: " .. json.encode(x))
    assert.are.equal("gpu-node-3", claim_status("queued", NS_B).node)
    assert.are.same({ { name = OTHER } }, x.spec.schedulingGates)
    assert.are.same({
      { matchExpressions = terms[1].matchExpressions, matchFields = { pinned("gpu-node-3") } },
      { matchExpressions = terms[2].matchExpressions,
        matchFields = { expr("metadata.name", "NotIn", { "gpu-node-9" }), pinned("gpu-node-3") } },
      {},
    }, x.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
    assert.are.same(pref, x.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution)
    -- narrowing the stored pod again is a no-op, so a leader that retries
    -- after a lost answer writes nothing
    assert.are.equal(0, #assert(pin.narrow(x, "gpu-node-3")))
    -- the other gate holds it: kube-scheduler leaves it alone
    assert.are.equal("SchedulingGated", (K.condition(x, "PodScheduled") or {}).reason, json.encode(x.status))
    assert.is_nil(x.spec.nodeName)
    -- its owner lifts that gate: the second term (zone b, and the pin)
    -- matches gpu-node-3, and kube-scheduler places the pod there
    c:must { "patch", "pod", p.metadata.name, "-n", NS_B, "--type", "json", "-p", json.encode {
      { op = "test", path = "/spec/schedulingGates/0/name", value = OTHER },
      { op = "remove", path = "/spec/schedulingGates/0" } } }
    local placed = P.wait_until(function()
      local y = pod(p.metadata.name, NS_B)
      return y and y.spec.nodeName
    end, 60, 0.2)
    assert.are.equal("gpu-node-3", placed, json.encode(pod(p.metadata.name, NS_B)))
  end)

  it("kube-apiserver refuses the pin as a new term beside a gated pod's terms, or in its empty term (why the pin is ANDed into each non-empty term)", function()
    -- every node is full again: this claim waits, the pod stays gated
    claim("later", NS_B)
    assert(P.wait_until(function() return claim_status("later", NS_B).phase == "Pending" end, 30, 0.2))
    local terms = { { matchExpressions = { expr("zone", "In", { "a" }) } }, json.object() }
    local p = launcher(vmi("later", "later", NS_B), { affinity = { nodeAffinity = {
      requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = terms } } } })
    assert.are.same({ { name = GATE } }, p.spec.schedulingGates)
    local TERMS = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
    local function patch(ops)
      return c:kubectl { "patch", "pod", p.metadata.name, "-n", NS_B, "--type", "json", "-p", json.encode(ops) }
    end
    -- pkg/apis/core/validation validateNodeAffinityMutation: while the pod
    -- has scheduling gates, a non-empty term list keeps its length ...
    local out, err, code = patch { { op = "add", path = TERMS .. "/-", value = { matchFields = { pinned("gpu-node-2") } } } }
    assert.are_not.equal(0, code, out)
    assert.matches("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: Invalid value",
      err, 1, true)
    assert.matches("no additions/deletions to non-empty NodeSelectorTerms list are allowed", err, 1, true)
    -- ... an empty term stays empty (a requirement would widen it from no
    -- node to one) ...
    out, err, code = patch { { op = "add", path = TERMS .. "/1/matchFields", value = { pinned("gpu-node-2") } } }
    assert.are_not.equal(0, code, out)
    assert.matches("nodeSelectorTerms[1]: Invalid value", err, 1, true)
    assert.matches("only additions are allowed (no mutations or deletions)", err, 1, true)
    -- ... and a term's own requirements stay as they are, first
    out, err, code = patch { { op = "replace", path = TERMS .. "/0/matchExpressions/0/values/0", value = "b" } }
    assert.are_not.equal(0, code, out)
    assert.matches("nodeSelectorTerms[0]: Invalid value", err, 1, true)
    -- the stored pod is as created
    local x = pod(p.metadata.name, NS_B)
    assert.are.same({ { matchExpressions = { expr("zone", "In", { "a" }) } }, {} },
      x.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
    assert.is_true(gated(x))
  end)

  it("a new launcher pod of a running VMI whose claims are Attached is pinned to their node, with no gate", function()
    -- a node with room for both claims, and for the older order "later"
    -- that waits (the binder serves it first); every other node is full
    G.add_node(c, "gpu-node-4", 3)
    claim("twin-a", NS_B)
    claim("twin-b", NS_B)
    assert(P.wait_until(function()
      return claim_status("twin-a", NS_B).node == "gpu-node-4" and claim_status("twin-b", NS_B).node == "gpu-node-4"
    end, 60, 0.2), json.encode { claim_status("twin-a", NS_B), claim_status("twin-b", NS_B) })
    -- the VMI naming both runs there (virt-handler's part, written by the
    -- spec: KubeVirt's VMI CRD has no status subresource): the leader marks
    -- both claims Attached to it
    local v = vmi("twin", "twin-a, twin-b", NS_B, 2)
    v.status = { phase = "Running", nodeName = "gpu-node-4" }
    c:must({ "replace", "-f", "-" }, { stdin = json.encode(v) })
    assert(P.wait_until(function()
      return claim_status("twin-a", NS_B).phase == "Attached" and claim_status("twin-b", NS_B).phase == "Attached"
    end, 60, 0.2), json.encode { claim_status("twin-a", NS_B), claim_status("twin-b", NS_B) })
    assert.are.equal("twin", claim_status("twin-b", NS_B).attachedTo)
    -- another launcher pod for it (as virt-controller makes a migration
    -- target; that one's anti-affinity to the source node would then keep
    -- it unschedulable, decision 0025 "Consequences"; this one has none):
    -- the claims are on one node, so the webhook pins it there, no gate
    local p = launcher(v)
    assert.is_nil(p.spec.schedulingGates)
    assert.are.same({ nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = {
      nodeSelectorTerms = { { matchFields = { pinned("gpu-node-4") } } } } } }, p.spec.affinity)
    assert.are.same({ [G.L40S] = "0" }, json.decode(p.metadata.annotations[BILLING]))
    -- kube-scheduler takes it (no SchedulingGated), to that node
    local placed = P.wait_until(function()
      local y = pod(p.metadata.name, NS_B)
      return y and y.spec.nodeName
    end, 60, 0.2)
    assert.are.equal("gpu-node-4", placed, json.encode(pod(p.metadata.name, NS_B)))
  end)

  it("two VMIs naming one Bound claim, admitted at once: the leader ungates one launcher pod, the other stays gated (issue 20 defect 5)", function()
    -- Two VMIs created at the same moment are judged before the webhook's
    -- cache shows either, so both may be admitted (on two replicas this is
    -- the rule, here one replica's cache lag); the gate, which only the
    -- leader removes and only for the VMI its set gives the claim to, is
    -- the serialization point. Tries a few times for a pair both admitted;
    -- the webhook usually wins that race on one replica, and then the
    -- second is the other replica's VMI, seen through its launcher pod.
    G.add_node(c, "gpu-node-5", 1)
    claim("shared", NS_B)
    local node
    assert(P.wait_until(function()
      local st = claim_status("shared", NS_B)
      node = st.phase == "Bound" and st.node
      return node
    end, 60, 0.2), json.encode(claim_status("shared", NS_B)))
    local function vmi_obj(name)
      return { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
        metadata = { name = name, namespace = NS_B, annotations = { [GATE] = "shared" } },
        spec = { domain = { devices = { gpus = { { name = "gpu1", deviceName = G.L40S } } },
          resources = { requests = { memory = "1Gi" } } } } }
    end
    -- both kubectl processes at once; returns the created objects (nil: refused)
    local function create_at_once(objs)
      local cmds, files = {}, {}
      for i, o in ipairs(objs) do
        local f = os.tmpname()
        local h = assert(io.open(f, "w"))
        h:write(json.encode(o))
        h:close()
        files[i] = f
        cmds[#cmds + 1] = ("(timeout 60 %s --kubeconfig %s create -f %s -o json >%s.out 2>%s.err) &"):format(
          P.q(K.kubectl_bin), P.q(c.kubeconfig), P.q(f), P.q(f), P.q(f))
      end
      P.sh(table.concat(cmds, " ") .. " wait")
      local out = {}
      for i, f in ipairs(files) do
        local ok, v = pcall(json.decode, P.read(f .. ".out") or "")
        out[i] = ok and type(v) == "table" and v.metadata and v or nil
        os.remove(f); os.remove(f .. ".out"); os.remove(f .. ".err")
      end
      return out
    end
    local pair
    for try = 1, 3 do
      local got = create_at_once { vmi_obj("dup-" .. try .. "a"), vmi_obj("dup-" .. try .. "b") }
      if got[1] and got[2] then
        print(("# both VMIs admitted at once (try %d)"):format(try))
        pair = got
        break
      end
      if try == 3 and (got[1] or got[2]) then
        -- the webhook's cache won every race here: the second VMI stands
        -- as one another replica admitted (its watch lagging), seen only
        -- through the launcher pod virt-controller makes for it (a
        -- made-up uid; the leader finds no such VMI, as it would not yet)
        local v = got[1] or got[2]
        local twin = json.decode(json.encode(v))
        twin.metadata.name = v.metadata.name .. "-twin"
        twin.metadata.uid = "d5e00000-0000-4000-8000-000000000005"
        print("# one VMI admitted each try: the second is a launcher pod of a VMI the leader does not know")
        pair = { v, twin }
        break
      end
      for _, v in pairs(got) do c:must { "delete", "vmi", "-n", NS_B, v.metadata.name, "--wait=true" } end
    end
    assert(pair, "no VMI naming the claim was admitted")
    local pods = { launcher(pair[1]), launcher(pair[2]) }
    assert.is_true(gated(pods[1]))
    assert.is_true(gated(pods[2]))
    -- the leader ungates exactly one, pinned to the claim's node
    local open
    assert(P.wait_until(function()
      open = {}
      for i, p in ipairs(pods) do
        local x = pod(p.metadata.name, NS_B)
        if x and not gated(x) then open[#open + 1] = x end
      end
      return #open > 0
    end, 30, 0.2), "the leader ungated neither launcher pod")
    assert.are.equal(1, #open)
    assert.are.same({ { matchFields = { pinned(node) } } },
      open[1].spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
    -- the other stays gated once the leader has taken every launcher pod
    -- and VMI as they are now (its own ungate among them) and the claim
    for _, p in ipairs(pods) do
      local x = pod(p.metadata.name, NS_B)
      if x then applied("pods", x) end
    end
    for _, v in ipairs(pair) do
      local x = c:get("/apis/kubevirt.io/v1/namespaces/" .. NS_B .. "/virtualmachineinstances/" .. v.metadata.name)
      if x then applied("virtualmachineinstances", x) end
    end
    applied("gpuclaims", c:get(claims_path(NS_B) .. "shared"))
    -- (a pod gone counts as not ungated: the garbage collector takes the
    -- made-up VMI's pod, whose owner does not exist)
    local n = 0
    for _, p in ipairs(pods) do
      local x = pod(p.metadata.name, NS_B)
      if x and not gated(x) then n = n + 1 end
    end
    assert.are.equal(1, n)
  end)
end)
