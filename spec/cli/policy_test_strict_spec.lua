-- Found in hardening: "policy test accepts typos. Unknown keys in a case or
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

-- Required of `policy test`: "a test file may name the policies and overrides
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

-- A new user's findings: inline snapshots read as
-- strictly as kubectl reads a List (items a list of objects with
-- apiVersion and kind, no List in a List), one line per case, and a
-- warning mismatch that shows the warnings there were.
describe("cozygpu policy test, inline snapshots and case names", function()
  local function file(text)
    local dir = H.tmpdir()
    H.write(dir .. "/t.yaml", text)
    return H.run { "policy", "test", dir .. "/t.yaml" }
  end
  local case = "cases:\n- name: x\n  object: {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: a}}\n  expect: {allowed: true}\n"

  for _, c in ipairs {
    { "cluster: [{apiVersion: v1, kind: List, items: [{apiVersion: v1, kind: Namespace, metadata: {name: a}}, 1]}]\n",
      "cluster: List: items[1] is not an object with apiVersion and kind" },
    { "cluster: [{apiVersion: v1, kind: List, items: 3}]\n", "cluster: List: items must be a list of objects" },
    { "cluster: [{apiVersion: v1, kind: List, items: [{apiVersion: v1, kind: List, items: []}]}]\n",
      "cluster: List: items[0] is a List (a List in a List)" },
  } do
    it("refuses an inline snapshot " .. c[2]:match(": ([^:]+)$"), function()
      local out, _, code = file(c[1] .. case)
      assert.equal(2, code, out)
      assert.truthy(out:find(c[2], 1, true), out)
    end)
  end

  it("takes a NamespaceList inline, item by item", function()
    local out, _, code = file("cluster: [{apiVersion: v1, kind: NamespaceList, items: [{apiVersion: v1, kind: Namespace, metadata: {name: a}}]}]\n" .. case)
    assert.equal(0, code, out)
  end)

  it("fails a case whose name is not a single-line string", function()
    for _, name in ipairs { "42", "{a: b}", '"two\\nlines"' } do
      local out, _, code = file(case:gsub("name: x", "name: " .. name))
      assert.equal(1, code, out)
      assert.truthy(out:find("FAIL [^\n]*: %(case with a bad name%)\n     name must be a single%-line string"), out)
    end
  end)

  it("shows the warnings there were when none contains the expected text", function()
    local dir = H.tmpdir()
    os.execute("mkdir -p '" .. dir .. "/site'")
    H.write(dir .. "/site/w.lua", [[return rule "site/w" { match = { kind = "Pod" },
      validate = function() return { warn("first"), warn("second") } end }]])
    H.write(dir .. "/t.yaml", "override: site\n" .. case:gsub("allowed: true}", "allowed: true, warnings: [third]}"))
    local out, _, code = H.run { "policy", "test", dir .. "/t.yaml" }
    assert.equal(1, code, out)
    assert.truthy(out:find('no warning contains "third"; the warnings: ["first","second"]', 1, true), out)
  end)
end)
