-- examples/rules: the example hoster rules and their `cozygpu policy test`
-- cases (docs/policy-api.md "Your first rule", "Policy tests").
--
-- The cases are the source of truth: this spec reads them, counts them and
-- checks that the binary agrees with every one, exactly. `expect.message`
-- and `expect.warnings` are fragments to `policy test`; here each refusal
-- message and each warning list is also compared whole, against
-- `cozygpu review` on the same input and snapshot, so a case cannot pass
-- while an unexpected second refusal or warning hides beside the expected
-- one.
local json = H.json

local RULES = "examples/rules"
local TESTS = RULES .. "/tests"

local function cwd()
  local p = assert(io.popen("pwd"))
  local d = p:read("l")
  p:close()
  return d
end

local function dirname(path) return (path:match("^(.*)/[^/]*$") or ".") end

-- `rel` as the binary resolves it: absolute, or relative to the test file.
local function resolve(file, rel)
  if rel:sub(1, 1) == "/" then return rel end
  return dirname(file) .. "/" .. rel
end

local function list(v)
  if v == nil then return {} end
  if type(v) == "string" then return { v } end
  return v
end

-- The test files under examples/rules/tests, sorted, with their documents.
local function test_files()
  local p = assert(io.popen("find " .. H.q(TESTS) .. " -type f \\( -name '*.yaml' -o -name '*.yml' -o -name '*.json' \\) | sort"))
  local out = {}
  for path in p:lines() do
    local recs = assert(H.core.manifests(path))
    assert.are.equal(1, #recs, path .. ": one test document")
    out[#out + 1] = { path = path, doc = recs[1].object }
  end
  p:close()
  return out
end

local function all_cases()
  local out = {}
  for _, f in ipairs(test_files()) do
    for _, c in ipairs(f.doc.cases) do out[#out + 1] = { file = f.path, doc = f.doc, case = c } end
  end
  return out
end

-- A new scratch file name ending in .json; returns it and a cleanup.
local function tmpjson()
  local base = os.tmpname()
  local path = base .. ".json"
  return path, function() os.remove(path) os.remove(base) end
end

local function policy_test(paths, override)
  local args = { "policy", "test" }
  if override then args[#args + 1] = "--override" args[#args + 1] = override end
  for _, p in ipairs(paths) do args[#args + 1] = p end
  local out, err, code = H.run(args)
  local pass, fail = {}, {}
  for line in out:gmatch("[^\n]+") do
    local name = line:match("^PASS (.*)$")
    if name then pass[#pass + 1] = name end
    name = line:match("^FAIL (.*)$")
    if name then fail[#fail + 1] = name end
  end
  return { out = out, err = err, code = code, pass = pass, fail = fail }
end

describe("examples/rules", function()
  it("has at least three rules, and cases that allow, refuse, patch and warn", function()
    local p = assert(io.popen("ls " .. H.q(RULES) .. "/*.lua"))
    local rules = 0
    for _ in p:lines() do rules = rules + 1 end
    p:close()
    assert.is_true(rules >= 3, "at least three hoster rules")
    local allowed, refused, patched, warned = 0, 0, 0, 0
    for _, c in ipairs(all_cases()) do
      local x = c.case.expect
      if x.allowed == true then allowed = allowed + 1 else refused = refused + 1 end
      if type(x.patch) == "table" and #x.patch > 0 then patched = patched + 1 end
      if type(x.warnings) == "table" and #x.warnings > 0 then warned = warned + 1 end
    end
    assert.is_true(allowed > 0 and refused > 0 and patched > 0 and warned > 0,
      ("allowed %d, refused %d, patched %d, warned %d"):format(allowed, refused, patched, warned))
  end)

  it("passes every case of `cozygpu policy test --override examples/rules`", function()
    local cases = all_cases()
    assert.is_true(#cases > 0)
    local r = policy_test({ TESTS }, RULES)
    assert.are.equal(0, r.code, r.out .. r.err)
    assert.are.same({}, r.fail)
    assert.are.equal(#cases, #r.pass)
    for i, c in ipairs(cases) do
      assert.are.equal(c.file .. ": " .. c.case.name, r.pass[i])
    end
    assert.matches("\n" .. #cases .. " passed, 0 failed\n$", "\n" .. r.out)
  end)

  it("owes every refusal in the cases to the site rules (without them, each refused case fails)", function()
    local r = policy_test({ TESTS }, nil)
    assert.are.equal(1, r.code, r.out .. r.err)
    local failed = {}
    for _, name in ipairs(r.fail) do failed[name] = true end
    for _, c in ipairs(all_cases()) do
      if c.case.expect.allowed == false then
        assert.is_true(failed[c.file .. ": " .. c.case.name], c.case.name)
      end
    end
  end)

  it("answers each case with exactly the expected message and warnings (cozygpu review)", function()
    local cleanups = {}
    for _, c in ipairs(all_cases()) do
      local x = c.case.expect
      local args = { "review", "--override", RULES, "--webhook", c.case.webhook or "all" }
      if c.doc.config then
        args[#args + 1] = "--config" args[#args + 1] = resolve(c.file, c.doc.config)
      end
      for _, p in ipairs(list(c.case.cluster or c.doc.cluster)) do
        args[#args + 1] = "--cluster" args[#args + 1] = resolve(c.file, p)
      end
      if c.case.user then args[#args + 1] = "--user" args[#args + 1] = c.case.user end
      for _, g in ipairs(list(c.case.groups)) do args[#args + 1] = "--group" args[#args + 1] = g end
      local input
      if c.case.input then
        input = resolve(c.file, c.case.input)
      else
        local done
        input, done = tmpjson()
        H.write(input, assert(json.encode(c.case.object)))
        cleanups[#cleanups + 1] = done
      end
      args[#args + 1] = input
      local out, err, code = H.run(args)
      assert.are.equal(0, code, c.case.name .. ": " .. err)
      local resp = H.json_lines(out)[1].response
      assert.are.equal(x.allowed, resp.allowed, c.case.name)
      if x.message ~= nil then
        assert.are.equal(x.message, resp.status.message, c.case.name)
      end
      if x.code ~= nil then
        assert.are.equal(x.code, resp.status.code, c.case.name)
      end
      if x.warnings ~= nil then
        local got = {}
        for i, w in ipairs(resp.warnings or {}) do got[i] = w end
        local want = {}
        for i, w in ipairs(x.warnings) do want[i] = w end
        assert.are.same(want, got, c.case.name)
      end
    end
    for _, done in ipairs(cleanups) do done() end
  end)

  it("fails a case whose expected message was changed, and only that case", function()
    -- the first test file with a case that expects a message
    local f, changed
    for _, tf in ipairs(test_files()) do
      for i, c in ipairs(tf.doc.cases) do
        if type(c.expect.message) == "string" then f, changed = tf, i break end
      end
      if f then break end
    end
    assert.is_not_nil(f, "a case with expect.message")
    local doc = f.doc
    doc.cases[changed].expect.message = doc.cases[changed].expect.message .. " (changed)"
    -- the copy lives elsewhere: its relative paths are made absolute
    local here = cwd()
    local function absolute(p) return p:sub(1, 1) == "/" and p or (here .. "/" .. resolve(f.path, p)) end
    if doc.config then doc.config = absolute(doc.config) end
    local function absolute_list(v)
      if v == nil then return nil end
      if type(v) == "string" then return absolute(v) end
      local out = json.array()
      for i, p in ipairs(v) do out[i] = absolute(p) end
      return out
    end
    doc.cluster = absolute_list(doc.cluster)
    for _, c in ipairs(doc.cases) do
      c.cluster = absolute_list(c.cluster)
      if c.input then c.input = absolute(c.input) end
    end
    local copy, done = tmpjson()
    H.write(copy, assert(json.encode(doc)))
    local r = policy_test({ copy }, RULES)
    done()
    assert.are.equal(1, r.code, r.out .. r.err)
    assert.are.same({ copy .. ": " .. doc.cases[changed].name }, r.fail)
    assert.are.equal(#doc.cases - 1, #r.pass)
    assert.matches('does not contain "' .. H.pat(doc.cases[changed].expect.message) .. '"', r.out)
    assert.matches("\n" .. (#doc.cases - 1) .. " passed, 1 failed\n$", "\n" .. r.out)
  end)
end)
