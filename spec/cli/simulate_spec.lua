-- `cozygpu simulate`: every scenario of examples/scenarios holds its expect
-- lines (each is a DESIGN.md §6 case a hoster would recognise), the JSON
-- output carries the same, a failed expect line exits 1, and bad input
-- exits 2 naming the file, the object and the field, with nothing printed
-- (the scenario is replayed silently first, so no step is half-applied).
local json = H.json

local function scenarios()
  local p = assert(io.popen("ls examples/scenarios/*.yaml"))
  local list = {}
  for f in p:lines() do list[#list + 1] = f end
  p:close()
  return list
end

local function write(text)
  local path = os.tmpname() .. ".yaml"
  H.write(path, text)
  return path
end

local BASE = [[
classes:
  - name: l40s
nodes:
  - name: gpu-1
    capacity: {l40s: 2}
claims:
  - {namespace: t, name: c1, class: l40s, count: 1}
  - {namespace: t, name: c2, class: l40s, count: 1}
vms:
  - {namespace: t, name: vm, claims: [c1], runStrategy: Always}
]]

describe("cozygpu simulate", function()
  it("holds every expect line of every example scenario", function()
    local list = scenarios()
    assert.is_true(#list >= 8, "at least eight scenarios")
    for _, f in ipairs(list) do
      local out, err, code = H.run({ "simulate", f })
      assert.are.equal(0, code, f .. "\n" .. out .. err)
      assert.matches("\n(%d+) expect lines held, 0 failed\n$", out, nil, f)
      local held = tonumber(out:match("\n(%d+) expect lines held"))
      assert.is_true(held > 0, f .. ": has expect lines")
      assert.are.equal("", err, f)
    end
  end)

  it("prints the same as one JSON document with --output json", function()
    local out, err, code = H.run({ "simulate", "--output", "json", "examples/scenarios/drain-move.yaml" })
    assert.are.equal(0, code, err)
    local doc = assert(json.decode(out))
    assert.are.equal(0, doc.expectFailed)
    assert.are.equal(9, doc.expectPassed)
    assert.are.equal("initial", doc.steps[1].name)
    local cordon = doc.steps[3]
    assert.are.equal("kubectl cordon gpu-1", cordon.name)
    local moved
    for _, e in ipairs(cordon.events) do
      if e.kind == "claim" and e.claim == "tenant-a/db-gpu" then moved = e end
    end
    assert.are.same({ kind = "claim", claim = "tenant-a/db-gpu", from = "Bound", to = "Bound", fromNode = "gpu-1",
      toNode = "gpu-2", reason = "Placed", message = moved.message }, moved)
    for _, c in ipairs(cordon.claims) do
      if c.claim == "tenant-a/web-gpu" then
        assert.are.equal("Attached", c.phase)
        assert.are.equal("web", c.attachedTo)
      end
    end
  end)

  it("exits 1 when an expect line fails, and says what it got", function()
    local f = write(BASE .. [[
steps:
  - name: wrong
    expect:
      - {claim: t/c1, phase: Bound, node: gpu-1}
]])
    local out, _, code = H.run({ "simulate", f })
    os.remove(f)
    assert.are.equal(1, code)
    assert.matches("expect claim t/c1 phase=Bound node=gpu%-1: FAILED, got Attached node=gpu%-1 reason=Attached", out)
    assert.matches("0 expect lines held, 1 failed\n$", out)
  end)

  local bad = {
    { "an unknown class", [[
classes: [{name: l40s}]
claims: [{namespace: t, name: c, class: a100, count: 1}]
]], "claims%[0%]%.class: unknown class \"a100\"" },
    { "a count of zero", [[
classes: [{name: l40s}]
claims: [{namespace: t, name: c, class: l40s, count: 0}]
]], "claims%[0%]%.count: must be a whole number from 1 to 4096" },
    { "a malformed count", [[
classes: [{name: l40s}]
claims: [{namespace: t, name: c, class: l40s, count: two}]
]], "claims%[0%]%.count: must be a whole number" },
    { "a claim named twice by one VM", [[
classes: [{name: l40s}]
claims: [{namespace: t, name: c, class: l40s, count: 1}]
vms: [{namespace: t, name: vm, claims: [c, c]}]
]], "vms%[0%]%.claims%[1%]: claim \"c\" is named twice" },
    { "a claim named by two VMs", [[
classes: [{name: l40s}]
claims: [{namespace: t, name: c, class: l40s, count: 1}]
vms: [{namespace: t, name: a, claims: [c]}, {namespace: t, name: b, claims: [c]}]
]], "vms%[1%]%.claims%[0%]: claim \"c\" is named by VM a too" },
    { "a claim of another namespace", [[
classes: [{name: l40s}]
claims: [{namespace: t, name: c, class: l40s, count: 1}]
vms: [{namespace: u, name: vm, claims: [c]}]
]], "vms%[0%]%.claims%[0%]: no claim \"c\" in namespace u" },
    { "an unknown node in a step", BASE .. [[
steps:
  - cordon: gpu-9
]], "steps%[0%]%.cordon: unknown node \"gpu%-9\"" },
    { "an unknown VM in a step", BASE .. [[
steps:
  - start: t/nope
]], "steps%[0%]%.start: unknown VM \"t/nope\"" },
    { "an unknown VMI in an expect line", BASE .. [[
steps:
  - expect: [{vmi: t/nope, phase: Running}]
]], "steps%[0%]%.expect%[0%]: unknown VM \"t/nope\"" },
    { "an unknown field", BASE .. [[
steps:
  - drain: gpu-1
]], "steps%[0%]%.drain: unknown field" },
    { "a reason decision 0020 does not list", BASE .. [[
steps:
  - expect: [{claim: t/c1, reason: Busy}]
]], "steps%[0%]%.expect%[0%]%.reason: \"Busy\" is not a reason of decision 0020" },
    { "a VM naming claims and asking for template GPUs", [[
classes: [{name: l40s}]
claims: [{namespace: t, name: c, class: l40s, count: 1}]
vms: [{namespace: t, name: vm, claims: [c], gpus: [{class: l40s, count: 1}]}]
]], "vms%[0%]: name claims or ask for gpus %(template claims%), not both" },
    { "a template GPU of an unknown class", [[
classes: [{name: l40s}]
vms: [{namespace: t, name: vm, gpus: [{class: a100, count: 1}]}]
]], "vms%[0%]%.gpus%[0%]%.class: unknown class \"a100\"" },
    { "a ResourceQuota without a namespace", BASE .. [[
resourceQuotas: [{metadata: {name: gpu}, spec: {hard: {gpuclass.cozystack.io/devices: "1"}}}]
]], "resourceQuotas%[0%]%.metadata%.namespace: must be a non%-empty string" },
    { "a namespace that is no object", BASE .. [[
namespaces: [tenant-a]
]], "namespaces%[0%]: must be a Namespace object" },
    { "a bad runStrategy", [[
classes: [{name: l40s}]
claims: [{namespace: t, name: c, class: l40s, count: 1}]
vms: [{namespace: t, name: vm, claims: [c], runStrategy: Sometimes}]
]], "vms%[0%]%.runStrategy: must be Always, RerunOnFailure, Once, Manual or Halted" },
  }
  for _, case in ipairs(bad) do
    it("refuses " .. case[1] .. " with exit 2, naming the file, object and field", function()
      local f = write(case[2])
      local out, err, code = H.run({ "simulate", f })
      os.remove(f)
      assert.are.equal(2, code, out .. err)
      assert.are.equal("", out)
      assert.matches("^cozygpu simulate: " .. H.pat(f) .. ": " .. case[3], err)
    end)
  end

  it("applies nothing of a scenario whose later step is bad", function()
    local f = write(BASE .. [[
steps:
  - cordon: gpu-1
  - deleteClaim: t/nope
]])
    local out, err, code = H.run({ "simulate", f })
    os.remove(f)
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.matches("steps%[1%]%.deleteClaim: unknown claim \"t/nope\"", err)
  end)

  it("names the line and column of a YAML syntax error", function()
    local f = write("classes: [\n  - name: x\n")
    local _, err, code = H.run({ "simulate", f })
    os.remove(f)
    assert.are.equal(2, code)
    assert.matches(H.pat(f) .. ":%d+:%d+: ", err)
  end)
end)

-- The leader's own code runs the scenario (decision 0041): what a step
-- shows depends only on the steps before it, a class being deleted goes
-- as the leader lets it go, and a pod runs only where kube-scheduler
-- would put it.
describe("cozygpu simulate runs the leader's placement model", function()
  local function run_json(text)
    local f = write(text)
    local out, err, code = H.run { "simulate", "--output", "json", f }
    os.remove(f)
    return json.decode(out), out .. err, code
  end
  local function claim(step, ref)
    for _, c in ipairs(step.claims) do
      if c.claim == ref then return c end
    end
  end

  it("shows at step 0 what a scenario without its later steps shows (a later deleteClaim changes nothing before it)", function()
    local two = [[
classes: [{name: l40s}]
nodes:
  - {name: gpu-1, capacity: {l40s: 1}}
  - {name: gpu-2, capacity: {l40s: 2}}
claims:
  - {namespace: t, name: a, class: l40s, count: 1}
  - {namespace: t, name: b, class: l40s, count: 1}
vms: [{namespace: t, name: vm, claims: [a, b]}]
]]
    local without, o1 = run_json(two .. "steps: []\n")
    local with, o2 = run_json(two .. "steps:\n  - deleteClaim: t/b\n")
    assert.is_not_nil(without, o1)
    assert.is_not_nil(with, o2)
    -- a VM's claims go to one node (DESIGN.md §6): the one with room for both
    for _, doc in ipairs { without, with } do
      assert.are.same({ "Bound", "gpu-2" }, { claim(doc.steps[1], "t/a").phase, claim(doc.steps[1], "t/a").node })
      assert.are.same({ "Bound", "gpu-2" }, { claim(doc.steps[1], "t/b").phase, claim(doc.steps[1], "t/b").node })
    end
    assert.are.same(without.steps[1].claims, with.steps[1].claims)
    -- and the deleted claim goes: nothing runs on it (its finalizer is let go)
    assert.is_nil(claim(with.steps[2], "t/b"))
  end)

  it("deletes a class no claim names at once, and keeps one a claim names (its protection finalizer, decision 0037)", function()
    local doc, out = run_json([[
classes: [{name: l40s}, {name: h100}]
nodes: [{name: gpu-1, capacity: {l40s: 2, h100: 1}}]
claims: [{namespace: t, name: a, class: l40s, count: 1}]
steps:
  - classDeleting: [l40s, h100]
  - addClaims: [{namespace: t, name: late, class: l40s, count: 1}]
]])
    assert.is_not_nil(doc, out)
    local s = doc.steps[3]
    assert.are.same({ "Bound", "gpu-1" }, { claim(s, "t/a").phase, claim(s, "t/a").node })
    -- an order made after the delete is refused by the GPUClaim webhook
    -- (the class takes no new order), as kube-apiserver would answer it
    assert.is_nil(claim(s, "t/late"))
    local refused
    for _, e in ipairs(s.events) do
      if e.kind == "refused" and e.object == "GPUClaim t/late" then refused = e.message end
    end
    assert.matches('GPUClass "l40s" is being deleted', refused or "", 1, true)
    local offers = s.nodes[1].offers
    assert.is_nil(offers.h100, "h100 went: no claim held it")
    assert.are.equal(2, offers.l40s)
  end)

  it("runs a VMI only on a node whose NoSchedule taints its pod tolerates (the classes' tolerations)", function()
    local doc, out = run_json([[
classes:
  - {name: plain}
  - {name: tolerant, tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]}
nodes:
  - {name: gpu-1, capacity: {plain: 1, tolerant: 1}, taints: [{key: dedicated, value: gpu, effect: NoSchedule}]}
claims:
  - {namespace: t, name: p, class: plain, count: 1}
  - {namespace: t, name: q, class: tolerant, count: 1}
vms:
  - {namespace: t, name: vp, claims: [p], runStrategy: Always}
  - {namespace: t, name: vq, claims: [q], runStrategy: Always}
]])
    assert.is_not_nil(doc, out)
    local s = doc.steps[1]
    -- the binder reads only gpu.cozystack.io/ taints: both claims are bound
    assert.are.same({ "Bound", "gpu-1" }, { claim(s, "t/p").phase, claim(s, "t/p").node })
    assert.are.same({ "Attached", "gpu-1" }, { claim(s, "t/q").phase, claim(s, "t/q").node })
    local vms = {}
    for _, v in ipairs(s.vms) do vms[v.vm] = v end
    assert.are.equal("Pending", vms["t/vp"].vmi) -- its pod does not tolerate dedicated=gpu
    assert.are.same({ "Running", "gpu-1" }, { vms["t/vq"].vmi, vms["t/vq"].node })
  end)
end)

describe("cozygpu simulate options", function()
  it("refuses an unknown option or one without its value with exit 2, naming it", function()
    local _, err, code = H.run { "simulate", "--bogus", "examples/scenarios/drain-move.yaml" }
    assert.are.equal(2, code)
    assert.matches("^cozygpu simulate: %-%-bogus: unknown option\n", err)
    _, err, code = H.run { "simulate", "examples/scenarios/drain-move.yaml", "--output" }
    assert.are.equal(2, code)
    assert.matches("^cozygpu simulate: %-%-output: needs a value\n", err)
  end)
end)
