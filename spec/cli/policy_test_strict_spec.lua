-- Issue 11, defect 5: "policy test accepts typos. Unknown keys in a case or
-- in expect (alowed, mesage, cod) are ignored, so a misspelt expectation
-- passes. A failed patched expectation shows no actual object or diff."
local function run(cases)
  local dir = H.tmpdir()
  local root = io.popen("pwd"):read("l")
  H.write(dir .. "/t.yaml", ("cluster: [%s/examples/classes, %s/examples/cluster]\ncases:\n%s"):format(root, root,
    cases:gsub("@", root)))
  return H.run { "policy", "test", dir }
end

describe("cozygpu policy test, strict", function()
  local typos = {
    { "expect: {alowed: false}", 'expect: unknown key "alowed" (known: allowed, code, message, warnings, patch, patched, rules)' },
    { "expect: {allowed: false, mesage: 'certainly not in the message'}", 'expect: unknown key "mesage"' },
    { "expect: {allowed: false, cod: 200}", 'expect: unknown key "cod"' },
    { "webhok: validating\n  expect: {allowed: false}", 'unknown key "webhok" (known: name, input, object, expect, cluster, user, groups, webhook)' },
    { "expect: {allowed: false, code: '403'}", "expect.code must be an integer" },
    { "expect: {allowed: false, warnings: 'w'}", "expect.warnings must be a list of strings" },
  }
  for _, c in ipairs(typos) do
    it("fails a case with " .. c[1]:gsub("\n.*", ""), function()
      local out, _, code = run(("- name: typo\n  input: @/examples/reviews/02-vmi-two-vgpu-classes.yaml\n  %s\n"):format(c[1]))
      assert.equal(1, code, out)
      assert.truthy(out:find("FAIL [^\n]*t%.yaml: typo\n"), out)
      assert.truthy(out:find(c[2], 1, true), out)
      assert.truthy(out:find("0 passed, 1 failed", 1, true), out)
    end)
  end

  it("shows where a patched object differs, with both values", function()
    local out, _, code = run([[
- name: wrong label value
  input: @/examples/reviews/06-vmi-vgpu-licensed.yaml
  expect:
    allowed: true
    patched:
      metadata: {annotations: {gpu.cozystack.io/classes: l40s-24c=3}}
- name: a field the patch never adds
  input: @/examples/reviews/06-vmi-vgpu-licensed.yaml
  expect:
    allowed: true
    patched:
      metadata: {labels: {tier: gold}}
]])
    assert.equal(1, code, out)
    -- RFC 6901: "/" in a key is written ~1
    assert.truthy(out:find('patched object differs from expect.patched at /metadata/annotations/gpu.cozystack.io~1classes:\n       expected "l40s-24c=3"\n       got      "l40s-24c=2"', 1, true), out)
    assert.truthy(out:find("at /metadata/labels", 1, true), out)
    assert.truthy(out:find('got      (absent)', 1, true), out)
  end)

  it("shows the expected patch beside the one it got", function()
    local out, _, code = run([[
- name: wrong patch
  input: @/examples/reviews/01-vmi-l40s-and-connectx-vf.yaml
  expect:
    allowed: true
    patch: []
]])
    assert.equal(1, code, out)
    assert.truthy(out:find('patch differs:\n       expected []\n       got      [{"op":"add","path":"/metadata/annotations"', 1, true), out)
  end)
end)

-- Issue 11 (policy test): "a test file may name the policies and overrides
-- it needs", so `cozygpu policy test DIR` runs each file against the rules
-- it was written for.
describe("cozygpu policy test, files that name their rules", function()
  it("loads the override a file names, relative to the file", function()
    local dir = H.tmpdir()
    os.execute("mkdir -p '" .. dir .. "/site'")
    H.write(dir .. "/site/site-no-tenant-a.lua", [[
return rule "site/no-tenant-a" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) if req.namespace == "tenant-a" then return deny("not in tenant-a") end end,
}
]])
    local root = io.popen("pwd"):read("l")
    H.write(dir .. "/t.yaml", ([[
override: site
cluster: [%s/examples/classes, %s/examples/cluster]
cases:
- name: refused by the site rule the file names
  input: %s/examples/reviews/01-vmi-l40s-and-connectx-vf.yaml
  expect: {allowed: false, code: 403, message: "not in tenant-a"}
]]):gsub("%%s", root))
    local out, _, code = H.run { "policy", "test", dir .. "/t.yaml" }
    assert.equal(0, code, out)
    assert.truthy(out:find("1 passed, 0 failed", 1, true), out)
    -- without the key the default rules allow it: the key is what loads the rule
    H.write(dir .. "/u.yaml", (H.read(dir .. "/t.yaml"):gsub("^override: site\n", "")))
    out, _, code = H.run { "policy", "test", dir .. "/u.yaml" }
    assert.equal(1, code, out)
  end)

  it("refuses a policies or override value that is not a path", function()
    local dir = H.tmpdir()
    H.write(dir .. "/t.yaml", "override: [a, b]\ncases:\n- name: x\n  object: {apiVersion: v1, kind: Pod, metadata: {name: p}}\n  expect: {allowed: true}\n")
    local out, _, code = H.run { "policy", "test", dir .. "/t.yaml" }
    assert.is_true(code ~= 0)
    assert.truthy(out:find("override: must be a folder path (relative to the test file)", 1, true), out)
  end)
end)
