-- `cozygpu policy test`, per-rule results: `expect.rules` pins
-- what each rule said (core/admission/policytest.c, engine_last_rules),
-- and a failed case shows what every rule that ran said and how long it
-- took. The expected words follow the admission driver's order
-- (lua/runtime/admission.lua, docs/policy-api.md): validate hooks run
-- first; a denial or a failure stops the mutate phase, so the mutating
-- rules of a refused review did not run ("skipped"); a rule whose match
-- does not take the kind did not run either.
local function run(cases, override, flags)
  local dir = H.tmpdir()
  local root = io.popen("pwd"):read("l")
  local head = ("cluster: [%s/examples/classes, %s/examples/cluster]\n"):format(root, root)
  if override then
    os.execute("mkdir -p " .. H.q(dir .. "/site"))
    for name, text in pairs(override) do H.write(dir .. "/site/" .. name, text) end
    head = head .. "override: site\n"
  end
  os.execute("mkdir -p " .. H.q(dir .. "/tests"))
  H.write(dir .. "/tests/t.yaml", head:gsub("override: site", "override: ../site") .. "cases:\n" .. cases:gsub("@", root))
  local args = { "policy", "test" }
  for _, f in ipairs(flags or {}) do args[#args + 1] = (f:gsub("@dir", dir)) end
  args[#args + 1] = dir .. "/tests"
  if flags then
    for _, f in ipairs(flags) do
      if f:match("^@dir/") then H.write(f:gsub("@dir", dir), flags[f]) end
    end
  end
  return H.run(args)
end

describe("cozygpu policy test, per-rule results", function()
  it("passes when every rule named in expect.rules said that", function()
    local out, _, code = run([[
- name: a VMI with an L40S
  input: @/examples/reviews/01-vmi-l40s-and-connectx-vf.yaml
  expect:
    allowed: true
    rules: {gpu/vmi-entries: allowed, gpu/vmi-record: patched, gpu/gpuclaim: skipped}
- name: two vGPU classes
  input: @/examples/reviews/02-vmi-two-vgpu-classes.yaml
  expect:
    allowed: false
    rules: {gpu/vmi-entries: denied, gpu/vmi-record: skipped}
]])
    assert.equal(0, code, out)
    assert.truthy(out:find("2 passed, 0 failed", 1, true), out)
  end)

  it("fails a case whose rule said something else, and shows what each rule said", function()
    local out, _, code = run([[
- name: expects the wrong rule to refuse
  input: @/examples/reviews/02-vmi-two-vgpu-classes.yaml
  expect:
    allowed: false
    rules: {gpu/vmi-entries: allowed}
]])
    assert.equal(1, code, out)
    assert.truthy(out:find('rule "gpu/vmi-entries": expected allowed, got denied', 1, true), out)
    assert.truthy(out:match("\n     rules: [^\n]*gpu/vmi%-entries denied %([%d.]+ ms%)"), out)
    -- the mutating rule did not run: it is not listed
    assert.falsy(out:match("\n     rules: [^\n]*gpu/vmi%-record"), out)
  end)

  it("names a failing rule's failure kind", function()
    local out, _, code = run([[
- name: a rule that errors
  input: @/examples/reviews/01-vmi-l40s-and-connectx-vf.yaml
  expect:
    allowed: false
    code: 500
    rules: {site/boom: error, gpu/vmi-entries: allowed, gpu/vmi-record: skipped}
- name: a rule that loops
  input: @/examples/reviews/02-vmi-two-vgpu-classes.yaml
  expect:
    allowed: false
    rules: {site/loop: budget}
]], {
      ["boom.lua"] = [[return rule "site/boom" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) if req.object.metadata.name == "train-1" then error("boom") end end }]],
      ["loop.lua"] = [[return rule "site/loop" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) if req.object.metadata.name ~= "train-1" then while true do end end end }]],
    })
    assert.equal(0, code, out)
    assert.truthy(out:find("2 passed, 0 failed", 1, true), out)
  end)

  it("fails a case naming a rule the bundle does not have, even as skipped", function()
    local out, _, code = run([[
- name: a typo in a rule name
  input: @/examples/reviews/01-vmi-l40s-and-connectx-vf.yaml
  expect:
    allowed: true
    rules: {gpu/vmi-entrie: skipped}
]])
    assert.equal(1, code, out)
    assert.truthy(out:find('expect.rules: the bundle has no rule "gpu/vmi-entrie"', 1, true), out)
  end)

  it("runs files without config: under --config, and each review under --review-timeout, as the controller does", function()
    local loop = { ["loop.lua"] = [[return rule "site/loop" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) while true do end end }]] }
    local case = [[
- name: a rule that loops
  input: @/examples/reviews/01-vmi-l40s-and-connectx-vf.yaml
  expect:
    allowed: false
    rules: {site/loop: %s}
]]
    -- the default budget (10,000,000 instructions) stops it: budget
    local out, _, code = run(case:format("budget"), loop)
    assert.equal(0, code, out)
    -- a budget no review reaches and a 300 ms deadline: deadline, as the
    -- controller's reload gate would answer under those settings
    local flags = { "--config", "@dir/settings.yaml", "--review-timeout", "300ms",
      ["@dir/settings.yaml"] = "policyBudget: {instructions: 100000000000, memoryBytes: 67108864}\n" }
    out, _, code = run(case:format("deadline"), loop, flags)
    assert.equal(0, code, out)
    assert.truthy(out:find("1 passed, 0 failed", 1, true), out)
  end)

  it("refuses a result word it does not know, naming the rule", function()
    local out, _, code = run([[
- name: a typo in a result
  input: @/examples/reviews/01-vmi-l40s-and-connectx-vf.yaml
  expect:
    allowed: true
    rules: {gpu/vmi-entries: alowed}
]])
    assert.equal(1, code, out)
    assert.truthy(out:find("expect.rules.gpu/vmi-entries must be one of allowed, denied, patched, error, budget, memory, deadline, skipped", 1, true), out)
  end)
end)
