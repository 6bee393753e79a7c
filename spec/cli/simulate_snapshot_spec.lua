-- `cozygpu simulate` from a snapshot of a live cluster (decision 0041): the
-- objects `kubectl get ... -o yaml` prints (a List, multi-document YAML,
-- JSON, one file or a directory) become the scenario's starting state as a
-- new leader would build it: claims restored from their status, what each
-- node offers computed by runtime.binder.node from its Node, GPUNode and
-- the KubeVirt CR (minus raw-name use), sets from VMs and VMIs. The worked
-- example (examples/scenarios/drain-from-snapshot.yaml) holds; a claim
-- bound in the snapshot is not bound again; a malformed object exits 2
-- naming the file, the object and the field; an unknown kind is skipped.
local json = H.json
local SO = require "sim_output"
local claim_of = SO.claim_of
local node_of = SO.node_of
local G = require "gpu_nodes"
local binder = require "runtime.binder"

local EXAMPLE = "examples/snapshots/cluster.yaml"
local ROOT = io.popen("pwd"):read("l")
local WORKED = "examples/scenarios/drain-from-snapshot.yaml"

local tmp, write_list = SO.tmp, SO.write_list

local EMPTY = tmp(".yaml", "steps: []\n")

--- Runs simulate with --output json; returns the decoded document (nil
--- when it did not exit 0), stdout, stderr and the exit code.
local function run_json(args)
  local a = { "simulate", "--output", "json" }
  for _, x in ipairs(args) do a[#a + 1] = x end
  local out, err, code = H.run(a)
  return code == 0 and json.decode(out) or nil, out, err, code
end

-- ---- a small cluster, built as the leader's specs build one ----------

local CLASS = H.class("l40s", { mode = "Passthrough", resourceName = G.L40S, onCordon = "Move",
  tolerations = { { key = "gpu.cozystack.io/mode", operator = "Equal", value = "passthrough", effect = "NoSchedule" } } })
local KUBEVIRT = H.kubevirt { { "10DE:26B9", G.L40S } }

--- A GPU node: the Node (o.alloc allocatable, default `units`) and its GPUNode.
local function gpu_node(name, units, o)
  o = o or {}
  local node = { apiVersion = "v1", kind = "Node",
    metadata = { name = name, uid = "uid-" .. name, labels = { ["kubernetes.io/hostname"] = name } },
    spec = { taints = { { key = "gpu.cozystack.io/mode", value = "passthrough", effect = "NoSchedule" } } },
    status = { allocatable = { [G.L40S] = tostring(o.alloc or units), cpu = "64" },
      capacity = { [G.L40S] = tostring(units) },
      conditions = { { type = "Ready", status = "True", reason = "KubeletReady" } },
      nodeInfo = { bootID = G.BOOT } } }
  local gpunode = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUNode",
    metadata = { name = name, generation = 1,
      ownerReferences = { { apiVersion = "v1", kind = "Node", name = name, uid = "uid-" .. name } } },
    spec = json.object(), status = G.gpunode_status(o.gpus or units) }
  return node, gpunode
end

--- A GPUClaim of class l40s; status {phase, node, attachedTo, reason} or nil.
local function claim(ns, name, count, st)
  local c = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = name, namespace = ns },
    spec = { class = "l40s", count = count } }
  if st then
    c.status = { phase = st.phase, node = st.node, attachedTo = st.attachedTo,
      conditions = { { type = "Ready", status = (st.phase == "Bound" or st.phase == "Attached") and "True" or "False",
        reason = st.reason or "Placed", message = "" } } }
  end
  return c
end

--- A VirtualMachine naming `claims` in its template's annotation.
local function vm(ns, name, claims, rs)
  return { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine", metadata = { name = name, namespace = ns },
    spec = { runStrategy = rs or "Halted", template = { metadata = { annotations = { ["gpu.cozystack.io/claims"] = claims } },
      spec = { domain = { devices = json.object() } } } } }
end

--- A VMI Running on `node` with `gpus` L40S host devices, naming `claims` (or none).
local function running_vmi(ns, name, node, gpus, claims)
  local v = H.vmi { namespace = ns, name = name, hostDevices = (function()
    local d = {}
    for i = 1, gpus do d[i] = G.L40S end
    return d
  end)() }
  if claims then v.metadata.annotations = { ["gpu.cozystack.io/claims"] = claims } end
  v.status = { phase = "Running", nodeName = node }
  return v
end

local function cluster(...)
  local objs = { CLASS, KUBEVIRT }
  for _, x in ipairs { ... } do objs[#objs + 1] = x end
  return objs
end

describe("cozygpu simulate from a snapshot", function()
  it("holds every expect line of the worked example, with the snapshot named in the scenario", function()
    local out, err, code = H.run { "simulate", WORKED }
    assert.are.equal(0, code, out .. err)
    assert.are.equal("", err)
    assert.matches("\n20 expect lines held, 0 failed\n$", out)
    -- gpu-3's GPUNode lists 4, its kubelet 3: the leader's problem, shown
    assert.matches("note: snapshot: node gpu%-3: the GPUNode shows 4 of nvidia%.com/AD102GL_L40S, status%.allocatable 3", out)
    assert.matches("note: snapshot: 1 Node without a GPUNode offers nothing", out)
  end)

  it("reads the same snapshot given with --snapshot, as one file or as a directory of files", function()
    local sc = tmp(".yaml", [[
steps:
  - name: kubectl cordon gpu-1
    cordon: gpu-1
    expect:
      - {claim: tenant-a/db-gpu, phase: Bound, node: gpu-3, reason: Placed}
      - {claim: tenant-a/train-gpu, phase: Attached, node: gpu-1}
      - {claim: tenant-b/batch-gpu, phase: Pending, reason: NoNodeWithRoom}
]])
    local out, err, code = H.run { "simulate", "--snapshot", EXAMPLE, sc }
    assert.are.equal(0, code, out .. err)
    assert.matches("\n3 expect lines held, 0 failed\n$", out)
    -- a directory: one JSON file per object, and the namespaces as one
    -- multi-document YAML file
    local dir = H.tmpdir()
    local docs = {}
    for i, o in ipairs(H.objects(EXAMPLE)) do
      if o.kind == "Namespace" then docs[#docs + 1] = "---\n" .. json.encode(o) .. "\n"
      else H.write(("%s/%02d-%s.json"):format(dir, i, o.kind:lower()), json.encode(o)) end
    end
    H.write(dir .. "/namespaces.yaml", table.concat(docs))
    out, err, code = H.run { "simulate", "--snapshot", dir, sc }
    os.execute("rm -rf '" .. dir .. "'")
    os.remove(sc)
    assert.are.equal(0, code, out .. err)
    assert.matches("\n3 expect lines held, 0 failed\n$", out)
  end)

  it("restores a claim bound in the snapshot where its status says, never binding it again", function()
    local n1, g1 = gpu_node("gpu-1", 4)
    local n2, g2 = gpu_node("gpu-2", 4)
    local objs = cluster(n1, g1, n2, g2,
      claim("t", "a", 1, { phase = "Bound", node = "gpu-1" }), vm("t", "va", "a"),
      claim("t", "b", 1, { phase = "Bound", node = "gpu-2" }), vm("t", "vb", "b"),
      claim("t", "c", 1, { phase = "Attached", node = "gpu-2", attachedTo = "vc", reason = "Attached" }),
      vm("t", "vc", "c", "Always"), running_vmi("t", "vc", "gpu-2", 1, "c"))
    local snap = write_list(objs)
    local doc, out, err = run_json { "--snapshot", snap, EMPTY }
    assert.is_not_nil(doc, out .. err)
    local s0 = doc.steps[1]
    assert.are.same({ "Bound", "gpu-1" }, { claim_of(s0, "t/a").phase, claim_of(s0, "t/a").node })
    assert.are.same({ "Bound", "gpu-2" }, { claim_of(s0, "t/b").phase, claim_of(s0, "t/b").node })
    assert.are.same({ "Attached", "gpu-2", "vc" },
      { claim_of(s0, "t/c").phase, claim_of(s0, "t/c").node, claim_of(s0, "t/c").attachedTo })
    for _, e in ipairs(s0.events) do
      assert.are_not.equal("claim", e.kind, "no claim changes when the snapshot is settled: " .. json.encode(e))
    end
    -- the same claim b without a status is placed by the chooser, which
    -- packs it onto gpu-1 (it holds units already, with fewer free)
    for i, o in ipairs(objs) do
      if o.kind == "GPUClaim" and o.metadata.name == "b" then objs[i] = claim("t", "b", 1) end
    end
    os.remove(snap)
    snap = write_list(objs)
    doc, out, err = run_json { "--snapshot", snap, EMPTY }
    os.remove(snap)
    assert.is_not_nil(doc, out .. err)
    assert.are.same({ "Bound", "gpu-1" }, { claim_of(doc.steps[1], "t/b").phase, claim_of(doc.steps[1], "t/b").node })
  end)

  it("computes what each node offers as the leader does: runtime.binder.node over Node, GPUNode, KubeVirt and raw use", function()
    local n1, g1 = gpu_node("gpu-1", 4)
    local n2, g2 = gpu_node("gpu-2", 4, { alloc = 1 })   -- the kubelet advertises fewer than the GPUNode lists
    local n3, g3 = gpu_node("gpu-3", 4, { gpus = 2 })    -- the GPUNode lists fewer than the kubelet
    n3.spec.unschedulable = true
    -- a running VM using a GPU on gpu-1 with no claim (a raw-name VM)
    local raw = running_vmi("t", "raw", "gpu-1", 1)
    local objs = cluster(n1, g1, n2, g2, n3, g3, raw, claim("t", "big", 2), vm("t", "vbig", "big"))
    local snap = write_list(objs)
    local doc, out, err = run_json { "--snapshot", snap, EMPTY }
    os.remove(snap)
    assert.is_not_nil(doc, out .. err)
    local s0 = doc.steps[1]
    local want = {
      ["gpu-1"] = binder.node(n1, g1, KUBEVIRT, json.array { CLASS }, { [G.L40S] = 1 }),
      ["gpu-2"] = binder.node(n2, g2, KUBEVIRT, json.array { CLASS }),
      ["gpu-3"] = binder.node(n3, g3, KUBEVIRT, json.array { CLASS }),
    }
    assert.are.equal(3, want["gpu-1"].offers.l40s)
    assert.are.equal(1, want["gpu-2"].offers.l40s)
    assert.are.equal(2, want["gpu-3"].offers.l40s)
    for name, w in pairs(want) do
      local got = node_of(s0, name)
      assert.are.equal(w.offers.l40s, got.offers.l40s or 0, name)
      assert.are.equal(w.ready, got.ready, name)
      assert.are.equal(w.schedulable, got.schedulable, name)
      assert.are.equal(w.layout_pending, got.layoutPending, name)
    end
    -- 2 units: gpu-1 has 3 (4 less the raw VM's 1), gpu-2 only 1, gpu-3 is cordoned
    assert.are.same({ "Bound", "gpu-1" }, { claim_of(s0, "t/big").phase, claim_of(s0, "t/big").node })
    local notes = {}
    for _, e in ipairs(s0.events) do
      if e.kind == "note" then notes[#notes + 1] = e.message end
    end
    notes = table.concat(notes, "\n")
    assert.matches("VMI t/raw uses GPUs on gpu%-1 that no claim of it covers", notes)
    assert.matches("node gpu%-2: the GPUNode shows 4 of nvidia%.com/AD102GL_L40S, status%.allocatable 1", notes)
  end)

  it("skips objects of a kind it does not read, with a note, and reads the rest", function()
    local n1, g1 = gpu_node("gpu-1", 2)
    local objs = cluster(n1, g1, claim("t", "a", 1), vm("t", "va", "a"),
      { apiVersion = "v1", kind = "Pod", metadata = { name = "virt-launcher-x", namespace = "t" } },
      { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "m1", namespace = "t" } },
      { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "m2", namespace = "t" } })
    local snap = write_list(objs)
    local out, err, code = H.run { "simulate", "--snapshot", snap, EMPTY }
    local doc = run_json { "--snapshot", snap, EMPTY }
    os.remove(snap)
    assert.are.equal(0, code, out .. err)
    assert.matches("note: snapshot: skipped 1 Pod object %(not a kind simulate reads%)", out)
    assert.matches("note: snapshot: skipped 2 ConfigMap objects", out)
    assert.matches("t/a%s+l40s%s+1%s+Bound%s+gpu%-1", out)
    local found
    for _, e in ipairs(doc.steps[1].events) do
      if e.kind == "note" and e.message:match("skipped 1 Pod") then found = true end
    end
    assert.is_true(found)
  end)

  it("lets a claim being deleted go once nothing uses it, as the leader lets its finalizer go", function()
    local n1, g1 = gpu_node("gpu-1", 4)
    local d1 = claim("t", "d1", 1, { phase = "Bound", node = "gpu-1" })
    local d2 = claim("t", "d2", 1, { phase = "Attached", node = "gpu-1", attachedTo = "vd2", reason = "Attached" })
    -- as the API server shows a claim being deleted: the leader's
    -- protection finalizer holds it (an object with none would be gone)
    for _, d in ipairs { d1, d2 } do
      d.metadata.deletionTimestamp = "2026-12-01T10:00:00Z"
      d.metadata.finalizers = { "gpu.cozystack.io/claim-protection" }
    end
    local snap = write_list(cluster(n1, g1, d1, vm("t", "vd1", "d1"), d2, vm("t", "vd2", "d2", "Always"),
      running_vmi("t", "vd2", "gpu-1", 1, "d2")))
    local sc = tmp(".yaml", [[
steps:
  - name: d1 is used by nothing, d2 by a running VMI
    expect:
      - {claim: t/d1, absent: true}
      - {claim: t/d2, phase: Attached, node: gpu-1}
  - name: its VMI stops
    stop: t/vd2
    expect:
      - {claim: t/d2, absent: true}
]])
    local out, err, code = H.run { "simulate", "--snapshot", snap, sc }
    os.remove(snap)
    os.remove(sc)
    assert.are.equal(0, code, out .. err)
    assert.matches("\n3 expect lines held, 0 failed\n$", out)
    assert.matches("note: snapshot: GPUClaim t/d1 is being deleted: it goes once nothing uses it", out)
  end)

  it("reads a runStrategy or VMI phase it does not model with a note, not a refusal", function()
    local n1, g1 = gpu_node("gpu-1", 2)
    local v = vm("t", "va", "a")
    v.spec.runStrategy = "WaitAsReceiver"
    local vmi = running_vmi("t", "va", "gpu-1", 1, "a")
    vmi.status.phase = "WaitingForSync"
    local snap = write_list(cluster(n1, g1, claim("t", "a", 1, { phase = "Attached", node = "gpu-1",
      attachedTo = "va", reason = "Attached" }), v, vmi))
    local out, err, code = H.run { "simulate", "--snapshot", snap, EMPTY }
    os.remove(snap)
    assert.are.equal(0, code, out .. err)
    assert.matches("VirtualMachine t/va: runStrategy WaitAsReceiver is not modelled; replayed as Manual", out)
    assert.matches("VirtualMachineInstance t/va: status%.phase WaitingForSync is read as Running", out)
    assert.matches("t/a%s+l40s%s+1%s+Attached%s+gpu%-1", out)
  end)

  it("lets the scenario add claims and VMs to the snapshot, and survives a leader change", function()
    local sc = tmp(".yaml", ([[
snapshot: %s
claims:
  - {namespace: tenant-b, name: extra-gpu, class: l40s, count: 2}
vms:
  - {namespace: tenant-b, name: extra, claims: [extra-gpu], runStrategy: Halted}
steps:
  - name: the new claim takes the only node with 2 free
    expect:
      - {claim: tenant-b/extra-gpu, phase: Bound, node: gpu-2, reason: Placed}
      - {claim: tenant-a/train-gpu, phase: Attached, node: gpu-1}
  - name: a new leader
    leaderChange: true
    expect:
      - {claim: tenant-b/extra-gpu, phase: Bound, node: gpu-2}
      - {claim: tenant-a/db-gpu, phase: Bound, node: gpu-1}
      - {claim: tenant-b/batch-gpu, phase: Pending, reason: NoNodeWithRoom}
]]):format(ROOT .. "/" .. EXAMPLE))
    local out, err, code = H.run { "simulate", sc }
    os.remove(sc)
    assert.are.equal(0, code, out .. err)
    assert.matches("\n5 expect lines held, 0 failed\n$", out)
  end)

  it("counts the snapshot's claims against the tenant budgets at bind", function()
    -- tenant-a may hold 4 (its ResourceQuota in the snapshot) and holds 3
    local sc = tmp(".yaml", ([[
snapshot: %s
claims:
  - {namespace: tenant-a, name: more-gpu, class: l40s, count: 2}
  - {namespace: tenant-a, name: one-gpu, class: l40s, count: 1}
vms:
  - {namespace: tenant-a, name: more, claims: [more-gpu], runStrategy: Halted}
  - {namespace: tenant-a, name: one, claims: [one-gpu], runStrategy: Halted}
steps:
  - expect:
      - {claim: tenant-a/more-gpu, phase: Pending, reason: OverBudget}
      - {claim: tenant-a/one-gpu, phase: Bound, reason: Placed}
]]):format(ROOT .. "/" .. EXAMPLE))
    local out, err, code = H.run { "simulate", sc }
    os.remove(sc)
    assert.are.equal(0, code, out .. err)
    assert.matches("\n2 expect lines held, 0 failed\n$", out)
  end)

  local bad = {
    { "a claim's count that is no number", function(o) o.claim.spec.count = "two" end,
      "GPUClaim t/a: spec%.count: must be a whole number from 1 to 4096" },
    { "a claim without a class", function(o) o.claim.spec.class = nil end, "GPUClaim t/a: spec%.class: required" },
    { "a claim phase no binder writes", function(o) o.claim.status = { phase = "Reserved" } end,
      "GPUClaim t/a: status%.phase: must be Pending, Bound, Attached or Lost, not \"Reserved\"" },
    { "a Ready reason decision 0020 does not list", function(o)
        o.claim.status = { phase = "Pending", conditions = { { type = "Ready", status = "False", reason = "Busy" } } }
      end, "GPUClaim t/a: status%.conditions%[0%]%.reason: \"Busy\" is not a reason of decision 0020" },
    { "a node whose unschedulable is no boolean", function(o) o.node.spec.unschedulable = "yes" end,
      "Node gpu%-1: spec%.unschedulable: must be true or false" },
    { "a node taint that is no mapping", function(o) o.node.spec.taints = { "gpu" } end,
      "Node gpu%-1: spec%.taints%[0%]: must be a mapping" },
    { "a class onCordon neither Move nor Stay", function(o) o.class.spec.onCordon = "Drain" end,
      "GPUClass l40s: spec%.onCordon: must be Move or Stay, not \"Drain\"" },
    { "a VM runStrategy that is no string", function(o) o.vm.spec.runStrategy = 3 end,
      "VirtualMachine t/va: spec%.runStrategy: must be a string" },
    { "a VMI phase that is no string", function(o) o.vmi.status.phase = { "Running" } end,
      "VirtualMachineInstance t/va: status%.phase: must be a string" },
    { "a VMI's host device that is no mapping", function(o) o.vmi.spec.domain.devices.hostDevices = { "gpu" } end,
      "VirtualMachineInstance t/va: spec%.domain%.devices%.hostDevices%[0%]: must be a mapping" },
    { "a claims annotation that is no string", function(o)
        o.vmi.metadata.annotations["gpu.cozystack.io/claims"] = { "a" }
      end, "VirtualMachineInstance t/va: metadata%.annotations%.gpu%.cozystack%.io/claims: must be a string" },
    { "a namespaced object without a namespace", function(o) o.claim.metadata.namespace = nil end,
      "GPUClaim a: metadata%.namespace: required" },
    { "a ResourceQuota without spec.hard", function(o) o.extra = { apiVersion = "v1", kind = "ResourceQuota",
        metadata = { name = "gpu", namespace = "t" }, spec = json.object() } end,
      "ResourceQuota t/gpu: spec%.hard: must be a mapping" },
    { "an object given twice", function(o) o.extra = o.claim end, "GPUClaim t/a: given twice" },
    { "an object without a kind", function(o) o.extra = { apiVersion = "v1", metadata = { name = "x" } } end,
      "object x: kind: required" },
  }
  for _, case in ipairs(bad) do
    it("refuses " .. case[1] .. " with exit 2, naming the file, the object and the field, printing nothing", function()
      local n1, g1 = gpu_node("gpu-1", 2)
      local o = { class = json.decode(json.encode(CLASS)), node = n1, claim = claim("t", "a", 1),
        vm = vm("t", "va", "a", "Always"), vmi = running_vmi("t", "va", "gpu-1", 1, "a") }
      o.vmi.metadata.annotations = o.vmi.metadata.annotations or {}
      case[2](o)
      local objs = { o.class, KUBEVIRT, o.node, g1, o.claim, o.vm, o.vmi, o.extra }
      local snap = write_list(objs)
      local out, err, code = H.run { "simulate", "--snapshot", snap, EMPTY }
      os.remove(snap)
      assert.are.equal(2, code, out .. err)
      assert.are.equal("", out)
      assert.matches("^cozygpu simulate: " .. H.pat(snap) .. ": " .. case[3], err)
    end)
  end

  it("refuses a scenario class that the snapshot has already", function()
    local sc = tmp(".yaml", "snapshot: " .. ROOT .. "/" .. EXAMPLE .. "\nclasses: [{name: l40s}]\n")
    local out, err, code = H.run { "simulate", sc }
    os.remove(sc)
    assert.are.equal(2, code, out .. err)
    assert.matches("classes%[0%]%.name: class l40s is defined twice %(or is in the snapshot%)", err)
  end)

  it("names the snapshot that cannot be read, and the line of a YAML error in it", function()
    local _, err, code = H.run { "simulate", "--snapshot", "/nonexistent/snap.yaml", EMPTY }
    assert.are.equal(2, code)
    assert.matches("^cozygpu simulate: snapshot: /nonexistent/snap%.yaml", err)
    local snap = tmp(".yaml", "apiVersion: v1\nkind: List\nitems: [\n")
    _, err, code = H.run { "simulate", "--snapshot", snap, EMPTY }
    os.remove(snap)
    assert.are.equal(2, code)
    assert.matches(H.pat(snap) .. ":%d+:%d+: ", err)
  end)
end)
