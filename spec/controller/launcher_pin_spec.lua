-- The launcher pod's gate and pin end to end (DESIGN.md §4, issue 12 item
-- 4, docs/decisions/0020 item 5 and 0025): a controller replica answers
-- /mutate/launcher over TLS from its watch caches of the API server
-- double; the pod with the webhook's patch applied is created with kubectl
-- (the double, as kube-apiserver v1.32, validates the result); then, for a
-- gated pod, the leader's two writes are made with kubectl — the pin added
-- to every required term (cozygpu.pin.narrow, the shape the leader's C
-- writes) and the gate removed — and the double accepts exactly that
-- sequence under KEP-3838's rules (spec/double/scheduling_gates_spec.lua).
-- The double runs no admission, so the review is sent by the spec.
local P = require "proc"
local E = require "controller_env"
local pin = require "cozygpu.pin"
local jsonpatch = require "cozygpu.jsonpatch"
local json = H.json

local NS = "tenant-a"
local L40S = "nvidia.com/AD102GL_L40S"
local CLAIMS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims"
local VMIS = "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances"
local PODS = "/api/v1/namespaces/" .. NS .. "/pods"
local GATE = "gpu.cozystack.io/claims"
local OTHER = "example.com/quota"
-- gpu/launcher-billing's op, first in every patch below: the claims' GPUs
-- reported as "0" to Cozystack's pod Workload (decision 0028)
local BILLING = { op = "add", path = "/metadata/annotations/workload.cozystack.io~1resources",
  value = '{"' .. L40S .. '":"0"}' }

local function expr(key, op, values) return { key = key, operator = op, values = values } end
local function pinned(node) return expr("metadata.name", "In", { node }) end

describe("launcher pod gate and pin through the webhook and the API server double", function()
  local dir, d, c
  local uids = {}

  local function kubectl(args)
    local out, code = E.kubectl(d, args)
    return out, code
  end
  local function file(name, obj)
    local f = dir .. "/" .. name .. ".json"
    H.write(f, json.encode(obj))
    return f
  end
  local function claim(name, status)
    local _, st = E.send(d, "POST", CLAIMS, { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = name, namespace = NS }, spec = { class = "l40s", count = 1 } })
    assert.are.equal(201, st)
    -- the status subresource, as the leader writes it
    local out, code = kubectl { "patch", "gpuclaim", name, "-n", NS, "--subresource", "status", "--type", "merge",
      "-p", json.encode { status = status } }
    assert.are.equal(0, code, out)
  end
  local function vmi(name, claims)
    local v, st = E.send(d, "POST", VMIS, { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = NS, annotations = { [GATE] = claims } },
      spec = { domain = { devices = { gpus = { { name = "gpu1", deviceName = L40S } } } } } })
    assert.are.equal(201, st, json.encode(v))
    uids[name] = v.metadata.uid
  end
  -- the virt-launcher pod KubeVirt renders for VMI `name` (its
  -- annotations copied, filterVMIAnnotationsForPod), with `spec` extras
  local function launcher(name, claims, extra)
    local spec = { containers = { { name = "compute", image = "quay.io/kubevirt/virt-launcher:v1.4.0",
      resources = { limits = { [L40S] = "1" }, requests = { [L40S] = "1" } } } } }
    for k, v in pairs(extra or {}) do spec[k] = v end
    return { apiVersion = "v1", kind = "Pod",
      metadata = { name = "virt-launcher-" .. name .. "-x7k2p", namespace = NS,
        labels = { ["kubevirt.io"] = "virt-launcher", ["vm.kubevirt.io/name"] = name },
        annotations = { [GATE] = claims, ["kubevirt.io/domain"] = name },
        ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = name,
          uid = uids[name], controller = true, blockOwnerDeletion = true } } },
      spec = spec }
  end
  -- the pod as the API server creates it: the webhook's patch applied
  local function admitted(pod)
    local st, body = E.review(c, "/mutate/launcher", { apiVersion = "admission.k8s.io/v1", kind = "AdmissionReview",
      request = H.request(pod) })
    assert.are.equal(200, st)
    assert.is_true(body.response.allowed, json.encode(body.response))
    local ops = H.patch_of(body.response)
    return ops and assert(jsonpatch.apply(pod, ops)) or pod, ops
  end
  local function get(name)
    local p, st = E.get(d, PODS .. "/" .. name)
    assert.are.equal(200, st)
    return p
  end

  setup(function()
    dir = H.tmpdir()
    local certs = P.certs(dir, { "cozygpu-webhook.cozy-gpu.svc" })
    d = E.start_double()
    E.load_examples(d)
    claim("bound-a", { phase = "Bound", node = "gpu-node-1" })
    claim("bound-b", { phase = "Attached", node = "gpu-node-1", attachedTo = "ready" })
    claim("waiting", { phase = "Pending" })
    claim("later", { phase = "Pending" })
    vmi("ready", "bound-a, bound-b")
    vmi("queued", "waiting")
    vmi("later", "later")
    -- no leader election: this replica never runs the binder, so the claim
    -- statuses the spec writes stay as written (the leader's own pins are
    -- spec/cluster/binder_spec.lua)
    c = E.start_controller { double = d, dir = dir, certs = certs, identity = "launcher-pin",
      extra = { "--leader-elect", "false" } }
    assert.truthy(E.wait_ready(c), "not ready; log:\n" .. (P.read(c.log) or ""))
  end)

  teardown(function()
    if c then P.stop(c.pid, 5) end
    if d then d:stop() end
  end)

  it("creates a pod whose claims are bound already with the pin and no gate", function()
    local pod, ops = admitted(launcher("ready", "bound-a, bound-b", {
      tolerations = { { key = "gpu.cozystack.io/mode", operator = "Equal", value = "passthrough", effect = "NoSchedule" } } }))
    assert.are.same({ BILLING, { op = "add", path = "/spec/affinity", value = { nodeAffinity = {
      requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = { { matchFields = { pinned("gpu-node-1") } } } } } } } }, ops)
    local out, code = kubectl { "create", "-f", file("ready", pod) }
    assert.are.equal(0, code, out)
    local p = get(pod.metadata.name)
    assert.is_nil(p.spec.schedulingGates)
    assert.are.same(pod.spec.affinity, p.spec.affinity)
    assert.are.equal(BILLING.value, p.metadata.annotations["workload.cozystack.io/resources"])
    assert.are.same({ phase = "Pending" }, p.status) -- no SchedulingGated condition: the scheduler takes it
  end)

  it("creates a gated pod while a claim is Pending; the leader pins every term and then ungates it", function()
    local terms = {
      { matchExpressions = { expr("topology.kubernetes.io/zone", "In", { "a" }) } },
      { matchExpressions = { expr("topology.kubernetes.io/zone", "In", { "b" }) }, matchFields = { expr("metadata.name", "NotIn", { "gpu-node-9" }) } },
      json.object(),
    }
    local pref = { { weight = 10, preference = { matchExpressions = { expr("example.com/fast", "Exists") } } } }
    local pod, ops = admitted(launcher("queued", "waiting", {
      schedulingGates = { { name = OTHER } },
      tolerations = { { key = "gpu.cozystack.io/mode", operator = "Equal", value = "passthrough", effect = "NoSchedule" } },
      affinity = { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = terms },
        preferredDuringSchedulingIgnoredDuringExecution = pref } } }))
    assert.are.same({ BILLING, { op = "add", path = "/spec/schedulingGates/-", value = { name = GATE } } }, ops)
    local out, code = kubectl { "create", "-f", file("queued", pod) }
    assert.are.equal(0, code, out)
    local p = get(pod.metadata.name)
    assert.are.same({ { name = OTHER }, { name = GATE } }, p.spec.schedulingGates)
    assert.are.equal("SchedulingGated", p.status.conditions[1].reason)

    -- a second call (reinvocation) on the gated pod changes nothing
    local _, again = admitted(p)
    assert.is_nil(again)

    -- the leader binds the set ...
    out, code = kubectl { "patch", "gpuclaim", "waiting", "-n", NS, "--subresource", "status", "--type", "merge",
      "-p", json.encode { status = { phase = "Bound", node = "gpu-node-2" } } }
    assert.are.equal(0, code, out)
    -- ... pins the stored pod (every term with a requirement; the empty one
    -- stays empty: the double refuses a requirement added to it) ...
    local narrow = assert(pin.narrow(p, "gpu-node-2"))
    assert.are.equal(2, #narrow)
    out, code = kubectl { "patch", "pod", pod.metadata.name, "-n", NS, "--type", "json", "-p", json.encode(narrow) }
    assert.are.equal(0, code, out)
    -- ... and removes its own gate, checking it is the one it removes
    out, code = kubectl { "patch", "pod", pod.metadata.name, "-n", NS, "--type", "json", "-p", json.encode {
      { op = "test", path = "/spec/schedulingGates/1/name", value = GATE },
      { op = "remove", path = "/spec/schedulingGates/1" } } }
    assert.are.equal(0, code, out)

    p = get(pod.metadata.name)
    assert.are.same({ { name = OTHER } }, p.spec.schedulingGates)
    assert.are.same({
      { matchExpressions = { expr("topology.kubernetes.io/zone", "In", { "a" }) }, matchFields = { pinned("gpu-node-2") } },
      { matchExpressions = { expr("topology.kubernetes.io/zone", "In", { "b" }) },
        matchFields = { expr("metadata.name", "NotIn", { "gpu-node-9" }), pinned("gpu-node-2") } },
      {},
    }, p.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms)
    assert.are.same(pref, p.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution)
    -- narrowing it again is a no-op, so a leader that retries after a lost
    -- answer writes nothing
    assert.are.equal(0, #assert(pin.narrow(p, "gpu-node-2")))
  end)

  it("would have the double refuse the pin as a new term beside existing ones (why the pin is ANDed into each)", function()
    local pod = admitted(launcher("later", "later", { affinity = { nodeAffinity = {
      requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = { { matchExpressions = { expr("zone", "In", { "a" }) } } } } } } }))
    local out, code = kubectl { "create", "-f", file("later", pod) }
    assert.are.equal(0, code, out)
    assert.are.same({ { name = GATE } }, get(pod.metadata.name).spec.schedulingGates)
    out, code = kubectl { "patch", "pod", pod.metadata.name, "-n", NS, "--type", "json", "-p", json.encode { { op = "add",
      path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/-",
      value = { matchFields = { pinned("gpu-node-2") } } } } }
    assert.are_not.equal(0, code)
    assert.truthy(out:find("no additions/deletions to non-empty NodeSelectorTerms list are allowed", 1, true), out)
  end)
end)
