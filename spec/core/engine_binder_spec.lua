-- The binder's decisions in Lua (core/engine/binderlua.c, engine.h "the
-- binder's Lua"; docs/decisions/0024): the chooser of policies/binder.lua
-- and what happens when a hoster's replacement fails, and the budget check
-- at bind (DESIGN.md §5 R1–R5 through lua/cozygpu/budget.lua) over the
-- units the caller's binder state holds (decision 0044; here a table
-- { [namespace] = { [class] = units } } stands for it).
local core, json = H.core, H.json

-- a candidate as engine_binder_choose documents it: units of class l40s
local function cand(node, offered, bound, labels)
  return { node = node, classes = { l40s = { offered = offered, bound = bound, free = offered - bound } },
    labels = labels or json.object() }
end

local function lone_set(ns)
  return { namespace = ns or "tenant-a", vm = json.null,
    claims = { { name = "c", class = "l40s", count = 1, phase = "Pending", node = json.null } } }
end

local SPREAD = H.read("examples/binder-spread/binder.lua")

describe("the binder's chooser (policies/binder.lua)", function()
  it("packs by default: a node holding units of the class first, then the fewest free units", function()
    local e = assert(core.engine {})
    -- DESIGN.md §6 / index.h packing order: untouched nodes come after touched ones
    -- whatever their free units; among touched ones the fewest free wins
    local cands = { cand("untouched", 4, 0), cand("half", 4, 2), cand("one-used", 4, 1), cand("untouched-small", 1, 0) }
    local pos, outcome, msg = e:binder_choose(lone_set(), cands)
    assert.are.same({ 2, "allowed", "" }, { pos, outcome, msg })
    -- a touched node with more free units still beats an untouched small one
    pos = e:binder_choose(lone_set(), { cand("untouched-small", 1, 0), cand("one-used", 4, 1) })
    assert.are.equal(2, pos)
    e:close()
  end)

  it("keeps the index order between equals", function()
    local e = assert(core.engine {})
    local pos = e:binder_choose(lone_set(), { cand("a", 4, 2), cand("b", 4, 2), cand("c", 4, 2) })
    assert.are.equal(1, pos)
    pos = e:binder_choose(lone_set(), { cand("a", 8, 0), cand("b", 4, 0) })
    assert.are.equal(2, pos, "untouched both: the fewest free units")
    e:close()
  end)

  it("adds up a set's classes", function()
    local e = assert(core.engine {})
    local set = { namespace = "t", vm = "vm", claims = {
      { name = "a", class = "l40s", count = 1, phase = "Pending", node = json.null },
      { name = "b", class = "a100", count = 1, phase = "Pending", node = json.null } } }
    local function two(node, l, a)
      return { node = node, classes = { l40s = { offered = 4, bound = 4 - l, free = l },
        a100 = { offered = 4, bound = 4 - a, free = a } }, labels = json.object() }
    end
    assert.are.equal(2, (e:binder_choose(set, { two("n1", 3, 3), two("n2", 1, 4) })))
    e:close()
  end)

  it("is replaced by a hoster's binder.lua from an override directory or the policies ConfigMap", function()
    local dir = H.policy_dir { ["binder.lua"] = SPREAD }
    local cands = { cand("full", 4, 3), cand("empty", 4, 0), cand("half", 4, 2) }
    for _, opts in ipairs { { override = dir }, { sources = { ["binder.lua"] = SPREAD } } } do
      local e = assert(core.engine(opts))
      assert.are.same({ 2, "allowed", "" }, { e:binder_choose(lone_set(), cands) })
      -- it filters by the node labels the candidates carry
      local m = { ["gpu.example.com/maintenance"] = "true" }
      assert.are.equal(3, (e:binder_choose(lone_set(), { cand("full", 4, 3), cand("empty", 4, 0, m), cand("half", 4, 2) })))
      -- every candidate filtered: none this pass
      local pos, outcome = e:binder_choose(lone_set(), { cand("empty", 4, 0, m) })
      assert.is_nil(pos)
      assert.are.equal("allowed", outcome)
      e:close()
    end
  end)

  it("hands the policy nil for a lone claim's vm and read-only arguments", function()
    local dir = H.policy_dir { ["binder.lua"] = [[
return binder { choose = function(set, candidates, cluster)
  if set.vm ~= nil or set.claims[1].node ~= nil then return 1 end
  if pcall(function() candidates[1].node = "x" end) then return 1 end
  if type(cluster.namespace) ~= "function" then return 1 end
  return #candidates
end }]] }
    local e = assert(core.engine { override = dir })
    assert.are.same({ 3, "allowed", "" }, { e:binder_choose(lone_set(), { cand("a", 1, 0), cand("b", 1, 0), cand("c", 1, 0) }) })
    e:close()
  end)

  local failing = {
    { "raises", "error('no such rack')", "error", "binder%.lua:%d+: no such rack" },
    { "loops past its instruction budget", "while true do end", "budget", "instruction budget" },
    { "runs out of memory", "local t = {} for i = 1, 1e6 do t[i] = ('x'):rep(65536) .. i end", "memory", "memory cap" },
    { "returns a position past the list", "return 7", "error", "choose returned 7; expected nil or a candidate's position, 1 to 2" },
    { "returns a string", "return 'gpu-1'", "error", "choose returned a string" },
  }
  for _, f in ipairs(failing) do
    it("falls back to the packing order when the policy " .. f[1] .. ", naming the file (decision 0024)", function()
      local dir = H.policy_dir { ["binder.lua"] = ("return binder { choose = function(set, candidates) %s end }"):format(f[2]) }
      local e = assert(core.engine { override = dir, instructions = 200000, memory = 4 * 1024 * 1024 })
      local pos, outcome, msg = e:binder_choose(lone_set(), { cand("a", 4, 0), cand("b", 4, 3) })
      assert.are.equal(1, pos, "the first candidate: the index's packing order")
      assert.are.equal(f[3], outcome)
      assert.matches("binder policy .*binder%.lua", msg)
      assert.matches(f[4], msg)
      e:close()
    end)
  end

  it("falls back when the policy is still running at the deadline", function()
    local dir = H.policy_dir { ["binder.lua"] = "return binder { choose = function() while true do end end }" }
    local e = assert(core.engine { override = dir })
    e:set_deadline(20)
    local pos, outcome, msg = e:binder_choose(lone_set(), { cand("a", 4, 0) })
    assert.are.same({ 1, "deadline" }, { pos, outcome })
    assert.matches("deadline", msg)
    e:set_deadline(nil)
    e:close()
  end)

  it("answers again after a failure", function()
    local dir = H.policy_dir { ["binder.lua"] = [[
local n = 0
return binder { choose = function(set, candidates)
  if set.namespace == "boom" then error("boom") end
  return 2
end }]] }
    local e = assert(core.engine { override = dir })
    assert.are.equal("error", select(2, e:binder_choose(lone_set("boom"), { cand("a", 4, 0), cand("b", 4, 0) })))
    assert.are.same({ 2, "allowed", "" }, { e:binder_choose(lone_set(), { cand("a", 4, 0), cand("b", 4, 0) }) })
    e:close()
  end)

  it("takes the packing order in a bundle without binder.lua", function()
    local dir = H.policy_dir { ["site.lua"] = "return rule 'site/x' { validate = function() end }" }
    local e = assert(core.engine { policies = dir })
    assert.are.same({ 1, "allowed", "" }, { e:binder_choose(lone_set(), { cand("a", 4, 0), cand("b", 4, 3) }) })
    e:close()
  end)

  it("refuses a bundle whose binder.lua returns no binder, or whose rule file returns one", function()
    local e, err = core.engine { override = H.policy_dir { ["binder.lua"] = "return rule 'x' { validate = function() end }" } }
    assert.is_nil(e)
    assert.matches("binder%.lua: the binder policy must return binder {", err)
    e, err = core.engine { override = H.policy_dir { ["site.lua"] = "return binder { choose = function() end }" } }
    assert.is_nil(e)
    assert.matches("site%.lua: binder { ... } belongs in binder%.lua", err)
    e, err = core.engine { override = H.policy_dir { ["binder.lua"] = "return binder { choose = 1 }" } }
    assert.is_nil(e)
    assert.matches("binder: choose must be a function", err)
  end)

  it("refuses input of the wrong shape (a caller's bug, not the policy's)", function()
    local e = assert(core.engine {})
    local many = {}
    for i = 1, 33 do many[i] = cand("n" .. i, 4, 0) end
    local pos, err = e:binder_choose(lone_set(), many)
    assert.is_nil(pos)
    assert.matches("1 to 32", err)
    pos, err = e:binder_choose(lone_set(), json.array {})
    assert.is_nil(pos)
    assert.matches("1 to 32", err)
    pos, err = e:binder_choose({ claims = {} }, { cand("a", 1, 0) })
    assert.is_nil(pos)
    assert.matches("namespace", err)
    e:close()
  end)
end)

-- Cluster for the budget checks: tenant-root > tenant-a > {tenant-a-b,
-- tenant-a-c}, and tenant-d; GPUClass l40s behind resource name
-- nvidia.com/L40S.
local function tree(quotas, extra)
  local objs = {
    H.tenant { "tenant-root" },
    H.tenant { "tenant-root", "tenant-a" },
    H.tenant { "tenant-root", "tenant-a", "tenant-a-b" },
    H.tenant { "tenant-root", "tenant-a", "tenant-a-c" },
    H.tenant { "tenant-root", "tenant-d" },
    H.namespace("outside"),
    H.class("l40s", { resourceName = "nvidia.com/L40S" }),
    H.kubevirt({ { "10DE:26B9", "nvidia.com/L40S" } }),
  }
  for ns, hard in pairs(quotas) do
    objs[#objs + 1] = { apiVersion = "v1", kind = "ResourceQuota", metadata = { name = "gpu", namespace = ns },
      spec = { hard = hard } }
  end
  for _, o in ipairs(extra or {}) do objs[#objs + 1] = o end
  return H.engine(objs)
end

local TOTAL, CLASS = "gpuclass.cozystack.io/devices", "l40s.gpuclass.cozystack.io/devices"

describe("the budget check at bind (engine_binder_budget)", function()
  it("R1: a parent's key caps its children together, naming the parent, the key and the limit only", function()
    local e = tree { ["tenant-a"] = { [TOTAL] = "3" } }
    local held = { ["tenant-a-b"] = { l40s = 2 } }
    assert.is_true((e:binder_budget("tenant-a-c", "l40s", 1, held)), "2 + 1 fits in 3")
    held["tenant-a-c"] = { l40s = 1 }
    local ok, outcome, msg, rule, t, key, limit = e:binder_budget("tenant-a-b", "l40s", 1, held)
    assert.is_false(ok)
    assert.are.same({ "allowed", "R1", "tenant-a", TOTAL, 3 }, { outcome, rule, t, key, limit })
    assert.matches('tenant "tenant%-a"', msg)
    assert.matches(H.pat(TOTAL) .. " is 3", msg)
    -- never another tenant's objects: not the sibling, not what uses the budget
    assert.not_matches("tenant%-a%-c", msg)
    assert.not_matches("GPUClaim", msg)
    -- tenant-d, outside tenant-a's subtree, is not capped by it (R3: no key)
    assert.is_true((e:binder_budget("tenant-d", "l40s", 8, held)))
    assert.is_true((e:binder_budget("outside", "l40s", 8, held)), "outside the tenant tree")
    e:close()
  end)

  it("R2: a child's key only adds a limit; it never lifts its parent's", function()
    local e = tree { ["tenant-a"] = { [TOTAL] = "3" }, ["tenant-a-b"] = { [CLASS] = "10" },
      ["tenant-a-c"] = { [CLASS] = "1" } }
    local ok, _, _, _, t, key, limit = e:binder_budget("tenant-a-b", "l40s", 2, { ["tenant-a-b"] = { l40s = 2 } })
    assert.is_false(ok)
    assert.are.same({ "tenant-a", TOTAL, 3 }, { t, key, limit }, "the parent's 3, not the child's 10")
    -- tenant-a-c's own 1 caps it although its parent has room
    ok, _, _, _, t, key, limit = e:binder_budget("tenant-a-c", "l40s", 1, { ["tenant-a-c"] = { l40s = 1 } })
    assert.is_false(ok)
    assert.are.same({ "tenant-a-c", CLASS, 1 }, { t, key, limit })
    e:close()
  end)

  it("counts the held units per namespace and class: another class is not under a class key", function()
    local e = tree { ["tenant-a"] = { [CLASS] = "2" } }
    local held = { ["tenant-a-b"] = { l40s = 1, a100 = 5 } }
    assert.is_true((e:binder_budget("tenant-a-c", "l40s", 1, held)), "1 l40s held + 1 fits in 2; the 5 a100 do not count")
    held["tenant-a-c"] = { l40s = 1 }
    assert.is_false((e:binder_budget("tenant-a-c", "l40s", 1, held)), "2 held + 1 > 2")
    held["tenant-a-b"].l40s = nil
    assert.is_true((e:binder_budget("tenant-a-c", "l40s", 1, held)))
    assert.is_true((e:binder_budget("tenant-a-c", "l40s", 2)), "nothing held")
    assert.is_false((e:binder_budget("tenant-a-c", "l40s", 3)), "3 > 2 with nothing held")
    e:close()
  end)

  it("R4 and R5: a raw key blocks class orders without the class or total key, and caps them with raw-name VMIs", function()
    local e = tree { ["tenant-a"] = { ["requests.nvidia.com/L40S"] = "2" } }
    local ok, _, msg, rule = e:binder_budget("tenant-a-b", "l40s", 1)
    assert.is_false(ok)
    assert.are.equal("R4", rule)
    assert.matches("requests%.nvidia%.com/L40S", msg)
    e:close()
    local raw = H.vmi { namespace = "tenant-a-c", name = "raw", gpus = { "nvidia.com/L40S" } }
    raw.status = { phase = "Running" }
    e = tree({ ["tenant-a"] = { ["requests.nvidia.com/L40S"] = "2", [TOTAL] = "10" } }, { raw })
    ok, _, msg, rule = e:binder_budget("tenant-a-b", "l40s", 1, { ["tenant-a-b"] = { l40s = 1 } })
    assert.is_false(ok, "1 claimed + 1 raw-name VMI + 1 more > 2")
    assert.are.equal("R5", rule)
    assert.not_matches("tenant%-a%-c", msg, nil, nil, "the VMI and its namespace are not named")
    assert.not_matches("VirtualMachineInstance", msg)
    e:close()
  end)

  it("refuses under a budget that is not a whole number, without naming the object", function()
    local e = tree { ["tenant-a"] = { [TOTAL] = "1500m" } }
    local ok, outcome, msg, rule = e:binder_budget("tenant-a-b", "l40s", 1)
    assert.are.same({ false, "allowed", "quantity" }, { ok, outcome, rule })
    assert.matches('tenant "tenant%-a"', msg)
    e:close()
  end)

  it("fails closed: a Lua failure refuses the bind, saying the check failed", function()
    local e = tree { ["tenant-a"] = { [TOTAL] = "3" } }
    e:fail_alloc_after(1)
    local ok, outcome, msg = e:binder_budget("tenant-a-b", "l40s", 1)
    assert.is_false(ok)
    assert.are.equal("memory", outcome)
    assert.matches("^the budget check failed %(memory%)", msg)
    assert.is_true((e:binder_budget("tenant-a-b", "l40s", 1)), "and answers again")
    e:close()
  end)
end)
