-- `cozygpu simulate` with the binder's Lua (docs/decisions/0024): the
-- chooser is policies/binder.lua (packing), replaced by a hoster's file
-- through --override, --policies or the scenario's `override`; a failing
-- chooser places in the packing order and is counted; the budget check at
-- bind reads the scenario's namespaces and resourceQuotas (DESIGN.md §5),
-- and a Lost claim's rebind is never checked.
local json = H.json

local function write(text)
  local path = os.tmpname() .. ".yaml"
  H.write(path, text)
  return path
end

-- runs the scenario with --output json; returns the document
local function sim(args)
  local argv = { "simulate", "--output", "json" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local out, err, code = H.run(argv)
  assert.are.equal(0, code, out .. err)
  return assert(json.decode(out))
end

-- claim -> its row in step i (1-based: 1 is the initial step)
local function claims_at(doc, i)
  local by = {}
  for _, c in ipairs(doc.steps[i].claims) do by[c.claim] = c end
  return by
end

local SPREAD_SCENARIO = H.read("examples/scenarios/binder-spread.yaml")
-- the same cluster and claims without the hoster's policy
local PLAIN = SPREAD_SCENARIO:gsub("\noverride: [^\n]*", ""):gsub("\nsteps:.*$", "\n")
local SPREAD = H.read("examples/binder-spread/binder.lua")

describe("cozygpu simulate: the chooser", function()
  it("packs with the default policies/binder.lua: two small claims share one node", function()
    local f = write(PLAIN)
    local doc = sim { f }
    os.remove(f)
    local c = claims_at(doc, 1)
    assert.are.equal("gpu-1", c["tenant-a/one"].node)
    assert.are.equal("gpu-1", c["tenant-a/two"].node)
    assert.are.same({ error = 0, budget = 0, memory = 0, deadline = 0 }, doc.binderPolicy.failures)
    assert.is_true(doc.binderPolicy.calls >= 2)
  end)

  it("spreads with a hoster's binder.lua, from --override, --policies or the scenario's override", function()
    local f = write(PLAIN)
    local dir = H.policy_dir { ["binder.lua"] = SPREAD }
    for _, args in ipairs { { f, "--override", dir }, { f, "--policies", dir }, { "examples/scenarios/binder-spread.yaml" } } do
      local c = claims_at(sim(args), 1)
      assert.are.equal("Bound", c["tenant-a/one"].phase)
      assert.are.equal("Bound", c["tenant-a/two"].phase)
      assert.are_not.equal(c["tenant-a/one"].node, c["tenant-a/two"].node, table.concat(args, " "))
      assert.are_not.equal("gpu-3", c["tenant-a/one"].node, "gpu-3 is in maintenance")
      assert.are_not.equal("gpu-3", c["tenant-a/two"].node, "gpu-3 is in maintenance")
    end
    os.remove(f)
  end)

  it("places in the packing order when the hoster's binder.lua fails, counts it and says so", function()
    local f = write(PLAIN)
    local dir = H.policy_dir { ["binder.lua"] = "return binder { choose = function() error('rack map missing') end }" }
    local doc = sim { f, "--override", dir }
    local c = claims_at(doc, 1)
    -- what the default packing would do: both on gpu-1
    assert.are.equal("gpu-1", c["tenant-a/one"].node)
    assert.are.equal("gpu-1", c["tenant-a/two"].node)
    assert.is_true(doc.binderPolicy.failures.error >= 2)
    assert.are.equal(doc.binderPolicy.calls, doc.binderPolicy.failures.error)
    local shown = 0
    for _, e in ipairs(doc.steps[1].events) do
      if e.kind == "binderPolicy" then
        shown = shown + 1
        assert.are.equal("error", e.outcome)
        assert.are.equal("packing order", e.fallback)
        assert.matches("binder%.lua:1: rack map missing", e.message)
      end
    end
    assert.are.equal(doc.binderPolicy.failures.error, shown)
    -- the table output says it too
    local out, _, code = H.run { "simulate", f, "--override", dir }
    assert.are.equal(0, code)
    assert.matches("binder policy failed %(error%): .*rack map missing; placed in the packing order instead", out)
    assert.matches("the binder policy failed %d+ of %d+ times", out)
    os.remove(f)
  end)

  it("places in the packing order when the policy runs past its instruction budget", function()
    local f = write(PLAIN)
    local dir = H.policy_dir { ["binder.lua"] = "return binder { choose = function() while true do end end }" }
    local cfg = write("policyBudget: {instructions: 100000, memoryBytes: 67108864}\n")
    local doc = sim { f, "--override", dir, "--config", cfg }
    local c = claims_at(doc, 1)
    assert.are.equal("gpu-1", c["tenant-a/two"].node)
    assert.is_true(doc.binderPolicy.failures.budget >= 2)
    os.remove(f)
    os.remove(cfg)
  end)

  it("refuses a hoster bundle whose binder.lua does not load, before replaying anything", function()
    local f = write(PLAIN)
    local dir = H.policy_dir { ["binder.lua"] = "return 42" }
    local out, err, code = H.run { "simulate", f, "--override", dir }
    os.remove(f)
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.matches("binder%.lua: the binder policy must return binder", err)
  end)
end)

describe("cozygpu simulate: budgets at bind", function()
  local doc = sim { "examples/scenarios/tenant-tree-budget.yaml" }

  it("lets a parent tenant cap two children together (R1), naming the parent, the key and the limit", function()
    local c = claims_at(doc, 1)
    -- tenant-a's 3: train (2, tenant-a-b) + web-gpu (1, tenant-a-c) leave no room for batch
    assert.are.equal("Bound", c["tenant-a-b/train"].phase)
    assert.are.equal("Attached", c["tenant-a-c/web-gpu"].phase)
    local batch = c["tenant-a-c/batch"]
    assert.are.same({ "Pending", "OverBudget" }, { batch.phase, batch.reason })
    assert.matches('^claim batch: over the budget of tenant "tenant%-a": gpuclass%.cozystack%.io/devices is 3', batch.message)
    assert.not_matches("tenant%-a%-b", batch.message, nil, nil, "the sibling tenant is not named")
    assert.not_matches("train", batch.message)
    -- tenant-d has no key (R3)
    assert.are.equal("Bound", c["tenant-d/free"].phase)
  end)

  it("never checks a Lost claim's rebind, even with the budget full (DESIGN.md §5)", function()
    -- step 3: web's VMI failed; the Lost claim is placed again while batch
    -- still waits OverBudget in the same step, so the budget was full
    local step = doc.steps[4]
    local rebound
    for _, e in ipairs(step.events) do
      if e.kind == "claim" and e.claim == "tenant-a-c/web-gpu" and e.from == "Lost" and e.to == "Bound" then rebound = e end
    end
    assert.is_truthy(rebound, "web-gpu went Lost -> Bound")
    assert.are.equal("Placed", rebound.reason)
    local c = claims_at(doc, 4)
    assert.are.same({ "Pending", "OverBudget" }, { c["tenant-a-c/batch"].phase, c["tenant-a-c/batch"].reason })
  end)

  it("frees the budget when a claim is deleted, and a child's own larger key never lifts its parent's (R2)", function()
    assert.are.equal("Bound", claims_at(doc, 5)["tenant-a-c/batch"].phase)
    -- the new order is refused when made (the GPUClaim webhook checks the
    -- same budgets at order time) on tenant-a's 3, not tenant-a-b's own 10
    assert.is_nil(claims_at(doc, 6)["tenant-a-b/train2"])
    local refused
    for _, e in ipairs(doc.steps[6].events) do
      if e.kind == "refused" and e.object == "GPUClaim tenant-a-b/train2" then refused = e.message end
    end
    assert.matches('tenant "tenant%-a": gpuclass%.cozystack%.io/devices is 3, 2 in use elsewhere in the tenant tree; 2 more is short by 1',
      refused or "")
    assert.are.equal(0, doc.expectFailed)
  end)

  it("checks a VM's claims together: a refused claim keeps the whole set waiting and frees what its other claims were allowed", function()
    local f = write([[
classes: [{name: l40s}]
nodes: [{name: gpu-1, capacity: {l40s: 8}}]
namespaces:
  - metadata: {name: tenant-root, labels: {tenant.cozystack.io/tenant-root: ""}}
  - metadata: {name: tenant-a, labels: {tenant.cozystack.io/tenant-root: "", tenant.cozystack.io/tenant-a: ""}}
resourceQuotas:
  - metadata: {name: gpu, namespace: tenant-a}
    spec: {hard: {gpuclass.cozystack.io/devices: "2"}}
claims:
  - {namespace: tenant-a, name: a, class: l40s, count: 1}
  - {namespace: tenant-a, name: b, class: l40s, count: 2}
  - {namespace: tenant-a, name: c, class: l40s, count: 2}
vms:
  - {namespace: tenant-a, name: vm, claims: [a, b]}
]])
    local d = sim { f }
    os.remove(f)
    -- first pass: a (1) then b (2) is 3 > 2, so the set {a, b} waits whole,
    -- each claim saying why; a's 1 is taken back, so c's 2 fits alone
    local first = {}
    for _, e in ipairs(d.steps[1].events) do
      if e.kind == "claim" and not first[e.claim] then first[e.claim] = e end
    end
    for _, n in ipairs { "tenant-a/a", "tenant-a/b" } do
      assert.are.same({ "Pending", "OverBudget" }, { first[n].to, first[n].reason })
      assert.matches('^claim b: over the budget of tenant "tenant%-a": gpuclass%.cozystack%.io/devices is 2; 2 more GPUs', first[n].message)
    end
    assert.are.same({ "Bound", "Placed" }, { first["tenant-a/c"].to, first["tenant-a/c"].reason })
    -- settled: c holds the 2, so the set still waits (now on a's 1)
    local c = claims_at(d, 1)
    assert.are.equal("Bound", c["tenant-a/c"].phase)
    for _, n in ipairs { "tenant-a/a", "tenant-a/b" } do
      assert.are.same({ "Pending", "OverBudget" }, { c[n].phase, c[n].reason })
      assert.matches('^claim a: over the budget of tenant "tenant%-a"', c[n].message)
    end
  end)

  it("keeps counting across a leader change (the usage is counted again from the claims' status)", function()
    local f = write([[
classes: [{name: l40s}]
nodes: [{name: gpu-1, capacity: {l40s: 4}}]
namespaces:
  - metadata: {name: tenant-root, labels: {tenant.cozystack.io/tenant-root: ""}}
  - metadata: {name: tenant-a, labels: {tenant.cozystack.io/tenant-root: "", tenant.cozystack.io/tenant-a: ""}}
resourceQuotas:
  - metadata: {name: gpu, namespace: tenant-a}
    spec: {hard: {gpuclass.cozystack.io/devices: "2"}}
claims:
  - {namespace: tenant-a, name: a, class: l40s, count: 1}
  - {namespace: tenant-a, name: b, class: l40s, count: 1}
  - {namespace: tenant-a, name: c, class: l40s, count: 1}
steps:
  - name: a new leader
    leaderChange: true
    expect:
      - {claim: tenant-a/a, phase: Bound}
      - {claim: tenant-a/b, phase: Bound}
      - {claim: tenant-a/c, phase: Pending, reason: OverBudget}
  - name: a is deleted; c fits (1 + 1 = 2)
    deleteClaim: tenant-a/a
    expect:
      - {claim: tenant-a/c, phase: Bound}
]])
    local d = sim { f }
    os.remove(f)
    assert.are.equal(0, d.expectFailed)
  end)
end)

describe("cozygpu simulate: the budget is checked before the chooser", function()
  -- decision 0026: a set over its tenant's budget costs no call of
  -- binder.lua (a slow or failing hoster policy is never run for it)
  it("asks the chooser only for the claims within the budget", function()
    local f = write([[
classes:
  - name: l40s
nodes:
  - name: gpu-1
    capacity: {l40s: 8}
namespaces:
  - metadata: {name: tenant-root, labels: {tenant.cozystack.io/tenant-root: ""}}
  - metadata: {name: tenant-a, labels: {tenant.cozystack.io/tenant-root: "", tenant.cozystack.io/tenant-a: ""}}
resourceQuotas:
  - metadata: {name: gpu, namespace: tenant-a}
    spec: {hard: {gpuclass.cozystack.io/devices: "1"}}
claims:
  - {namespace: tenant-a, name: c1, class: l40s, count: 1}
  - {namespace: tenant-a, name: c2, class: l40s, count: 1}
  - {namespace: tenant-a, name: c3, class: l40s, count: 1}
  - {namespace: tenant-a, name: c4, class: l40s, count: 1}
steps:
  - name: nothing changes; the waiting claims are asked again
    cordon: gpu-1
  - name: uncordoned
    uncordon: gpu-1
]])
    local doc = sim { f }
    os.remove(f)
    local c = claims_at(doc, 1)
    assert.are.equal("Bound", c["tenant-a/c1"].phase)
    for _, n in ipairs { "c2", "c3", "c4" } do
      assert.are.equal("OverBudget", c["tenant-a/" .. n].reason)
    end
    -- c1 once; c2..c4 are refused by the budget on every pass, never by the chooser
    assert.are.equal(1, doc.binderPolicy.calls)
  end)
end)
