-- `cozygpu simulate` applies the DESIGN.md §6 rules the leader's binder
-- loop applies (core/controller/bind.c), in a scenario and from a
-- snapshot: a set is limited to the nodes its bound volume allows (a VM's
-- `volumeNodes`; a snapshot's PVCs and PVs, read as the leader reads
-- them); a template VMI that failed on a node sends its VM's next sets
-- elsewhere (unless every node is one it failed on; a leader change
-- forgets); and a claim of a template name that the VMI does not own is
-- never taken over nor deleted (decision 0027).
local json = H.json
local SO = require "sim_output"
local claim_of = SO.claim_of
local vm_of = SO.vm_of
local G = require "gpu_nodes"

local tmp, write_list = SO.tmp, SO.write_list

--- Runs simulate with --output json on scenario text `sc` (and snapshot
--- objects `objs`, when given): the decoded document (nil unless it
--- exited 0), stdout, stderr and the exit code.
local function run_json(sc, objs)
  local f = tmp(".yaml", sc)
  local args = { "simulate", "--output", "json" }
  local snap
  if objs then
    snap = write_list(objs)
    args[#args + 1] = "--snapshot"
    args[#args + 1] = snap
  end
  args[#args + 1] = f
  local out, err, code = H.run(args)
  os.remove(f)
  if snap then os.remove(snap) end
  return code == 0 and json.decode(out) or nil, out, err, code
end

local function notes(step)
  local list = {}
  for _, e in ipairs(step.events) do
    if e.kind == "note" then list[#list + 1] = e.message end
  end
  return table.concat(list, "\n")
end

-- ---- snapshot objects, as simulate_snapshot_spec builds them ----------

local CLASS = H.class("l40s", { mode = "Passthrough", resourceName = G.L40S, onCordon = "Move",
  tolerations = { { key = "gpu.cozystack.io/mode", operator = "Equal", value = "passthrough", effect = "NoSchedule" } } })
local KUBEVIRT = H.kubevirt { { "10DE:26B9", G.L40S } }

--- A GPU node with `units` L40S: its Node and GPUNode.
local function gpu_node(name, units)
  local node = { apiVersion = "v1", kind = "Node",
    metadata = { name = name, uid = "uid-" .. name, labels = { ["kubernetes.io/hostname"] = name } },
    spec = { taints = { { key = "gpu.cozystack.io/mode", value = "passthrough", effect = "NoSchedule" } } },
    status = { allocatable = { [G.L40S] = tostring(units), cpu = "64" }, capacity = { [G.L40S] = tostring(units) },
      conditions = { { type = "Ready", status = "True", reason = "KubeletReady" } }, nodeInfo = { bootID = G.BOOT } } }
  local gpunode = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUNode",
    metadata = { name = name, generation = 1,
      ownerReferences = { { apiVersion = "v1", kind = "Node", name = name, uid = "uid-" .. name } } },
    spec = json.object(), status = G.gpunode_status(units) }
  return node, gpunode
end

--- A GPUClaim of class l40s; st = {phase, node, attachedTo, reason} or nil;
--- md: metadata fields to add (labels, ownerReferences).
local function claim(ns, name, count, st, md)
  local c = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = name, namespace = ns },
    spec = { class = "l40s", count = count } }
  for k, v in pairs(md or {}) do c.metadata[k] = v end
  if st then
    c.status = { phase = st.phase, node = st.node, attachedTo = st.attachedTo,
      conditions = { { type = "Ready", status = (st.phase == "Bound" or st.phase == "Attached") and "True" or "False",
        reason = st.reason or "Placed", message = "" } } }
  end
  return c
end

--- The markers of VMI uid `uid`'s template claim (decision 0027).
local function template_md(vmi_name, uid)
  return { labels = { ["gpu.cozystack.io/template-claim"] = "true" },
    ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = vmi_name, uid = uid,
      controller = true, blockOwnerDeletion = true } } }
end

--- A template VMI (class-reference label, one L40S GPU, no claims
--- annotation) of uid `uid`, in `phase` on `node` (nil: Pending).
local function template_vmi(ns, name, uid, phase, node)
  local v = H.vmi { namespace = ns, name = name, gpus = { G.L40S },
    labels = { ["gpu.cozystack.io/class-reference"] = "true" } }
  v.metadata.uid = uid
  v.status = { phase = phase or "Pending", nodeName = node }
  return v
end

--- A VirtualMachine under `rs`; its template names claim `claims` (or asks
--- for one L40S by class when nil) and mounts `volumes` ({{name, pvc} or
--- {name, dv}}).
local function vm(ns, name, rs, claims, volumes)
  local vols = json.array()
  for i, x in ipairs(volumes or {}) do
    vols[i] = x.dv and { name = x.name, dataVolume = { name = x.dv } }
      or { name = x.name, persistentVolumeClaim = { claimName = x.pvc } }
  end
  local tm = { metadata = json.object(), spec = { domain = { devices = json.object() }, volumes = vols } }
  if claims then
    tm.metadata = { annotations = { ["gpu.cozystack.io/claims"] = claims } }
  else
    tm.metadata = { labels = { ["gpu.cozystack.io/class-reference"] = "true" } }
    tm.spec.domain.devices = { gpus = { { name = "gpu0", deviceName = G.L40S } } }
  end
  return { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine", metadata = { name = name, namespace = ns },
    spec = { runStrategy = rs, template = tm } }
end

--- A PVC bound to PV `pv`, and that PV: a local volume whose node
--- affinity lists `nodes` (by kubernetes.io/hostname, or by metadata.name
--- when `fields`).
local function local_volume(ns, pvc, pv, nodes, fields)
  local req = { key = fields and "metadata.name" or "kubernetes.io/hostname", operator = "In", values = nodes }
  local term = fields and { matchFields = { req } } or { matchExpressions = { req } }
  return { apiVersion = "v1", kind = "PersistentVolumeClaim", metadata = { name = pvc, namespace = ns },
      spec = { accessModes = { "ReadWriteOnce" }, storageClassName = "local", volumeName = pv,
        resources = { requests = { storage = "10Gi" } } } },
    { apiVersion = "v1", kind = "PersistentVolume", metadata = { name = pv },
      spec = { capacity = { storage = "10Gi" }, accessModes = { "ReadWriteOnce" }, storageClassName = "local",
        ["local"] = { path = "/mnt/disks/" .. pv }, claimRef = { namespace = ns, name = pvc },
        nodeAffinity = { required = { nodeSelectorTerms = { term } } } } }
end

local function cluster(...)
  local objs = { CLASS, KUBEVIRT }
  for _, x in ipairs { ... } do objs[#objs + 1] = x end
  return objs
end

local TWO = [[
classes: [{name: l40s}]
nodes:
  - {name: gpu-1, capacity: {l40s: 1}}
  - {name: gpu-2, capacity: {l40s: 1}}
]]

describe("cozygpu simulate: the leader's volume rule (DESIGN.md §6, WaitForFirstConsumer)", function()
  it("places a template VM's claims only on its volumeNodes, and keeps the limit across a leader change", function()
    local doc, out, err = run_json(TWO .. [[
vms:
  - {namespace: pool, name: w, gpus: [{class: l40s, count: 1}], runStrategy: Always, volumeNodes: [gpu-2]}
steps:
  - leaderChange: true
  - name: its node goes; no other node its volume allows, so it waits
    vmiFinal: {vm: pool/w, phase: Succeeded}
    capacity: {node: gpu-2, class: l40s, units: 0}
]])
    assert.is_not_nil(doc, out .. err)
    assert.are.same({ "Attached", "gpu-2" }, { claim_of(doc.steps[1], "pool/w-l40s").phase,
      claim_of(doc.steps[1], "pool/w-l40s").node })
    assert.are.equal("gpu-2", claim_of(doc.steps[2], "pool/w-l40s").node)
    local c = claim_of(doc.steps[3], "pool/w-l40s")
    assert.are.same({ "Pending", "NoNodeWithRoom" }, { c.phase, c.reason }, json.encode(c))
  end)

  it("reads a snapshot's PVCs and PVs as the leader does: hostname or metadata.name affinity, PVC or DataVolume", function()
    local n1, g1 = gpu_node("gpu-1", 4)
    local n2, g2 = gpu_node("gpu-2", 4)
    local n3, g3 = gpu_node("gpu-3", 4)
    local pvc_a, pv_a = local_volume("t", "disk-a", "pv-a", { "gpu-2" })
    local pvc_b, pv_b = local_volume("t", "disk-b", "pv-b", { "gpu-3" }, true)
    local pvc_c, pv_c = local_volume("t", "disk-c", "pv-c", { "gpu-2" })
    local objs = cluster(n1, g1, n2, g2, n3, g3, pvc_a, pv_a, pvc_b, pv_b, pvc_c, pv_c,
      claim("t", "ca", 1), vm("t", "va", "Halted", "ca", { { name = "d", pvc = "disk-a" } }),
      claim("t", "cb", 1), vm("t", "vb", "Halted", "cb", { { name = "d", dv = "disk-b" } }),
      -- volumes on two nodes: no node in common, the set waits
      claim("t", "cc", 1), vm("t", "vc", "Halted", "cc", { { name = "d", pvc = "disk-a" }, { name = "e", pvc = "disk-b" } }),
      -- a PVC the snapshot lacks, or one bound to a PV with no such affinity, does not limit
      claim("t", "cd", 1), vm("t", "vd", "Halted", "cd", { { name = "d", pvc = "nope" } }),
      -- a template VM's sets are limited from its template's volumes
      vm("t", "pool", "Always", nil, { { name = "d", pvc = "disk-c" } }))
    local doc, out, err = run_json("steps: []\n", objs)
    assert.is_not_nil(doc, out .. err)
    local s0 = doc.steps[1]
    assert.are.equal("gpu-2", claim_of(s0, "t/ca").node)
    assert.are.equal("gpu-3", claim_of(s0, "t/cb").node)
    assert.are.same({ "Pending", json.null }, { claim_of(s0, "t/cc").phase, claim_of(s0, "t/cc").node })
    assert.are.equal("Bound", claim_of(s0, "t/cd").phase)
    assert.is_nil(notes(s0):find("VM t/vd", 1, true))
    assert.are.same({ "Attached", "gpu-2" }, { claim_of(s0, "t/pool-l40s").phase, claim_of(s0, "t/pool-l40s").node },
      out)
    assert.matches("VM t/va: its bound volumes allow only gpu%-2", notes(s0))
    assert.matches("VM t/vc: its bound volumes allow only %(no node: its volumes allow none in common%)", notes(s0))
  end)

  local bad = {
    { "a volumeNodes that is not a list", "volumeNodes: gpu-2", "vms%[0%]%.volumeNodes: must be a list of 1 to 32 node names" },
    { "an empty volumeNodes", "volumeNodes: []", "vms%[0%]%.volumeNodes: must be a list of 1 to 32 node names" },
    { "a volumeNodes naming an unknown node", "volumeNodes: [gpu-2, gpu-9]", "vms%[0%]%.volumeNodes%[1%]: unknown node \"gpu%-9\"" },
    { "a volumeNodes naming a node twice", "volumeNodes: [gpu-2, gpu-2]", "vms%[0%]%.volumeNodes%[1%]: node \"gpu%-2\" is named twice" },
    { "a volumeNodes entry that is no name", "volumeNodes: [{name: gpu-2}]", "vms%[0%]%.volumeNodes%[0%]: must be a node name" },
  }
  for _, case in ipairs(bad) do
    it("refuses " .. case[1] .. " with exit 2, naming the field, printing nothing", function()
      local f = tmp(".yaml", TWO .. "claims: [{namespace: t, name: c, class: l40s, count: 1}]\nvms:\n  - namespace: t\n"
        .. "    name: v\n    claims: [c]\n    " .. case[2] .. "\n")
      local out, err, code = H.run { "simulate", f }
      os.remove(f)
      assert.are.equal(2, code, out .. err)
      assert.are.equal("", out)
      assert.matches("^cozygpu simulate: " .. H.pat(f) .. ": " .. case[3], err)
    end)
  end

  it("refuses a snapshot PV whose node affinity is malformed, naming the file, the object and the field", function()
    local pvc, pv = local_volume("t", "disk-a", "pv-a", { "gpu-2" })
    pv.spec.nodeAffinity.required.nodeSelectorTerms[1].matchExpressions[1].values = "gpu-2"
    local f = tmp(".yaml", "steps: []\n")
    local snap = write_list(cluster(pvc, pv))
    local out, err, code = H.run { "simulate", "--snapshot", snap, f }
    os.remove(f)
    os.remove(snap)
    assert.are.equal(2, code, out .. err)
    assert.are.equal("", out)
    assert.matches(H.pat(snap) .. ": PersistentVolume pv%-a: spec%.nodeAffinity%.required%.nodeSelectorTerms%[0%]"
      .. "%.matchExpressions%[0%]%.values: must be a list", err)
  end)
end)

describe("cozygpu simulate: the nodes a template VMI failed on (DESIGN.md §6, last rule)", function()
  it("sends the next VMI elsewhere, shows it in the JSON events, and forgets it at a leader change", function()
    local doc, out, err = run_json(TWO .. [[
vms:
  - {namespace: pool, name: w, gpus: [{class: l40s, count: 1}], runStrategy: Always}
steps:
  - vmiFinal: {vm: pool/w, phase: Failed}
  - leaderChange: true
  - vmiFinal: {vm: pool/w, phase: Failed}
  - vmiFinal: {vm: pool/w, phase: Failed}
]])
    assert.is_not_nil(doc, out .. err)
    local function refused(step)
      for _, e in ipairs(step.events) do
        if e.kind == "refusedNodes" then return e end
      end
    end
    assert.are.equal("gpu-1", claim_of(doc.steps[1], "pool/w-l40s").node) -- packing order
    assert.are.equal("gpu-2", claim_of(doc.steps[2], "pool/w-l40s").node) -- failed on gpu-1
    assert.are.same({ kind = "refusedNodes", vm = "pool/w", leftOut = 1, triedAgain = false }, refused(doc.steps[2]))
    -- the new leader does not know gpu-1 was refused: failed on gpu-2, only
    -- gpu-2 is left out, and it goes to gpu-1
    assert.are.same({ kind = "refusedNodes", vm = "pool/w", leftOut = 1, triedAgain = false }, refused(doc.steps[4]))
    assert.are.equal("gpu-1", claim_of(doc.steps[4], "pool/w-l40s").node)
    -- failed there too: every node is one it failed on, so all are tried again
    assert.are.same({ kind = "refusedNodes", vm = "pool/w", leftOut = 2, triedAgain = true }, refused(doc.steps[5]))
    assert.are.equal("Attached", claim_of(doc.steps[5], "pool/w-l40s").phase)
  end)

  it("leaves a VM naming its claims alone: only template sets avoid the nodes they failed on", function()
    local doc, out, err = run_json(TWO .. [[
claims: [{namespace: t, name: c, class: l40s, count: 1}]
vms: [{namespace: t, name: v, claims: [c], runStrategy: RerunOnFailure}]
steps:
  - vmiFinal: {vm: t/v, phase: Failed}
]])
    assert.is_not_nil(doc, out .. err)
    assert.are.same({ "Attached", "gpu-1" }, { claim_of(doc.steps[2], "t/c").phase, claim_of(doc.steps[2], "t/c").node })
  end)

  it("remembers the node of a snapshot's Failed template VMI, whose VM starts the next one elsewhere", function()
    local n1, g1 = gpu_node("gpu-1", 1)
    local n2, g2 = gpu_node("gpu-2", 1)
    local objs = cluster(n1, g1, n2, g2, vm("t", "w", "Always"),
      template_vmi("t", "w", "uid-w-1", "Failed", "gpu-1"),
      claim("t", "w-l40s", 1, { phase = "Bound", node = "gpu-1" }, template_md("w", "uid-w-1")))
    local doc, out, err = run_json("steps: []\n", objs)
    assert.is_not_nil(doc, out .. err)
    local s0 = doc.steps[1]
    assert.matches("template claim t/w%-l40s deleted %(its VMI is final%)", notes(s0))
    assert.are.same({ "Attached", "gpu-2" }, { claim_of(s0, "t/w-l40s").phase, claim_of(s0, "t/w-l40s").node })
    assert.are.same({ "Running", "gpu-2" }, { vm_of(s0, "t/w").vmi, vm_of(s0, "t/w").node })
  end)
end)

describe("cozygpu simulate: a claim of a template name the VMI does not own (decision 0027)", function()
  local n1, g1 = gpu_node("gpu-1", 4) -- room for the claim and the VMI's device no claim of its own covers

  --- A snapshot with VMI t/w (uid-w, `phase` on gpu-1) and GPUClaim
  --- t/w-l40s Bound on gpu-1 with metadata `md` and count `count`.
  local function snapshot(phase, md, count)
    return cluster(n1, g1, template_vmi("t", "w", "uid-w", phase, "gpu-1"),
      claim("t", "w-l40s", count or 1, { phase = "Bound", node = "gpu-1" }, md))
  end

  it("takes the VMI's own claim (label, owner uid, class, count), as before", function()
    local doc, out, err = run_json("steps: []\n", snapshot("Running", template_md("w", "uid-w")))
    assert.is_not_nil(doc, out .. err)
    local c = claim_of(doc.steps[1], "t/w-l40s")
    assert.are.same({ "Attached", "gpu-1", "w" }, { c.phase, c.node, c.attachedTo })
  end)

  local others = {
    { "no template label", {} },
    { "another owner uid", template_md("w", "uid-earlier") },
    { "another count", template_md("w", "uid-w"), 2 },
  }
  for _, case in ipairs(others) do
    it("never takes over one with " .. case[1] .. ": the set waits, and the final VMI does not delete it", function()
      local doc, out, err = run_json("steps: []\n", snapshot("Running", case[2], case[3]))
      assert.is_not_nil(doc, out .. err)
      local s0 = doc.steps[1]
      local c = claim_of(s0, "t/w-l40s")
      assert.are.same({ "Bound", "gpu-1", json.null }, { c.phase, c.node, c.attachedTo }, json.encode(c))
      assert.matches("GPUClaim t/w%-l40s is not VMI t/w's own template claim .*never taken over, the VMI's set waits",
        notes(s0))
      -- the VMI is final: the claim is not its own, so it stays
      doc, out, err = run_json("steps: []\n", snapshot("Succeeded", case[2], case[3]))
      assert.is_not_nil(doc, out .. err)
      s0 = doc.steps[1]
      assert.is_not_nil(claim_of(s0, "t/w-l40s"), json.encode(s0.claims))
      assert.matches("GPUClaim t/w%-l40s is not VMI t/w's own template claim .*kept, though the VMI is final", notes(s0))
    end)
  end

  it("deletes the final VMI's own claim", function()
    local doc, out, err = run_json("steps: []\n", snapshot("Succeeded", template_md("w", "uid-w")))
    assert.is_not_nil(doc, out .. err)
    assert.is_nil(claim_of(doc.steps[1], "t/w-l40s"))
  end)

  it("in a scenario: a VM's template set waits behind a claim of its name, and runs once that claim is gone", function()
    local doc, out, err = run_json(TWO .. [[
claims: [{namespace: pool, name: w-l40s, class: l40s, count: 1}]
vms: [{namespace: pool, name: w, gpus: [{class: l40s, count: 1}], runStrategy: Always}]
steps:
  - name: the VMI ends; the tenant's claim is not its own and stays
    vmiFinal: {vm: pool/w, phase: Failed}
    expect:
      - {claim: pool/w-l40s, phase: Bound}
      - {vmi: pool/w, phase: Pending}
  - deleteClaim: pool/w-l40s
    expect:
      - {claim: pool/w-l40s, phase: Attached}
      - {vmi: pool/w, phase: Running}
]])
    assert.is_not_nil(doc, out .. err)
    assert.are.equal(4, doc.expectPassed)
    local s0 = doc.steps[1]
    assert.are.equal("Pending", vm_of(s0, "pool/w").vmi)
    assert.are.same({ "Bound", json.null }, { claim_of(s0, "pool/w-l40s").phase, claim_of(s0, "pool/w-l40s").attachedTo })
  end)
end)
