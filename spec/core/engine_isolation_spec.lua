-- One hoster policy must not be able to change what another rule decides,
-- crash the process, or run outside its budget (DESIGN.md §9, fail closed).
-- Each case is an attack a fresh user found after decision 0012 landed its
-- structure; each broke the promise before the fix:
--   unwrap:   `pairs({})` handed out Lua's real `next`, which reads through a
--             read-only view and returns the table behind it, so a policy
--             could replace gpu.entries for every rule;
--   marker:   getmetatable(json.object{}) was the shared, writable marker
--             metatable, so a policy could give every JSON object an __index;
--   panic:    a verdict whose message had metamethods aborted the process
--             (converted outside the protected call);
--   hangs:    the runtime read policy-returned values (a match table, a
--             file's result, a message) through metamethods with no budget;
--   rename:   a rule could rename itself after the load and blame another.
local function review(dir, file)
  return H.run({ "review", "--override", dir, "--cluster", "examples/classes", "--cluster", "examples/cluster",
    "--config", "examples/config.yaml", "--output", "table", file }, "timeout 60 env ")
end

local HARMLESS = 'return rule "site/harmless" { match = function() return false end, validate = function() end }\n'

describe("policy isolation", function()
  it("cannot unwrap a read-only view through the `next` that pairs returns", function()
    local dir = H.policy_dir { ["00-unwrap.lua"] = [[
local rawnext = pairs({})
pcall(function()
  local _, target = rawnext(gpu)
  target.entries = function() return {} end
end)
pcall(function() local _, t = rawnext(gpu); rawset(t, "entries", function() return {} end) end)
]] .. HARMLESS }
    local out, err, code = review(dir, "examples/reviews/02-vmi-two-vgpu-classes.yaml")
    assert.equal(0, code, err)
    assert.truthy(out:find("^DENIED"), out)
    assert.truthy(out:find("vGPU devices of more than one class", 1, true), out)
  end)

  it("cannot change a library module or a standard library through its frozen view (decision 0050)", function()
    -- each write must raise; one that does not fails the file's load
    local dir = H.policy_dir { ["00-frozen.lua"] = [[
local function refused(f) assert(not pcall(f), "a write through a frozen view went through") end
refused(function() string.format = function() return "x" end end)
refused(function() table.concat = nil end)
refused(function() math.type = nil end)
refused(function() gpu.entries = function() return {} end end)
local p = require "cozygpu.policy"
refused(function() p.REASONS[403] = "Hacked" end)
for _, v in pairs(p) do
  if type(v) == "table" then refused(function() v.extra = 1 end) end
end
assert(getmetatable(string) == "read-only" and getmetatable(p.REASONS) == "read-only")
assert(rawequal(require "cozygpu.policy", p), "one view per module")
assert(rawget(gpu, "entries") == nil and type(gpu.entries) == "function")
]] .. HARMLESS }
    local out, err, code = review(dir, "examples/reviews/02-vmi-two-vgpu-classes.yaml")
    assert.equal(0, code, err)
    assert.truthy(out:find("^DENIED"), out)
    assert.truthy(out:find("vGPU devices of more than one class", 1, true), out)
  end)

  it("cannot change the shared JSON marker metatables", function()
    local dir = H.policy_dir { ["00-marker.lua"] = [[
pcall(function()
  getmetatable(json.object {}).__index = function(t, k) if k == "gpu.cozystack.io/vgpu" then return "true" end end
end)
assert(type(getmetatable(json.object {})) == "string" and type(getmetatable(json.array {})) == "string")
assert(type(getmetatable(patch.new())) == "string")
]] .. HARMLESS }
    local out, err, code = review(dir, "examples/reviews/05-vmi-vgpu-not-entitled.yaml")
    assert.equal(0, code, err)
    assert.truthy(out:find("^DENIED"), out)
  end)

  it("refuses, never aborts, on a verdict whose message has metamethods", function()
    local dir = H.policy_dir { ["zz-panic.lua"] = [[
local mm = setmetatable({}, { __index = function() error("outside the pcall") end })
return rule "site/panic" {
  validate = function() return { verdict = "warn", message = setmetatable({}, mm) } end,
}
]] }
    local out, err, code = review(dir, "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml")
    assert.equal(0, code, err)
    assert.truthy(out:find('500 policy "site/panic" failed: validate returned a warn verdict without a message', 1, true), out)
  end)

  local hangs = {
    { "a match table with metamethods", [[
local n = 0
local m = setmetatable({}, { __pairs = function() return function() end end,
  __index = function() n = n + 1; if n > 2 then while true do end end end })
return rule "site/match" { match = m, validate = function() end }
]], "^ALLOWED" },
    { "a message with __tostring", [[
return rule "site/loop-tostring" {
  validate = function()
    return { verdict = "deny", message = setmetatable({}, { __tostring = function() while true do end end }), code = 403 }
  end,
}
]], '500 policy "site/loop-tostring" failed: validate returned a deny verdict without a message' },
  }
  for _, c in ipairs(hangs) do
    it("answers, within its budget, a policy returning " .. c[1], function()
      local t0 = os.time()
      local out, err, code = review(H.policy_dir { ["p.lua"] = c[2] }, "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml")
      assert.equal(0, code, err)
      assert.is_true(os.time() - t0 < 20)
      assert.truthy(out:find(c[3], 1, not c[3]:find("^%^")), out)
    end)
  end

  it("refuses to load, without hanging, a file whose result has metamethods", function()
    local t0 = os.time()
    local _, err, code = review(H.policy_dir { ["p.lua"] = "return setmetatable({}, { __index = function() while true do end end, __len = function() while true do end end })\n" },
      "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml")
    assert.equal(2, code)
    assert.is_true(os.time() - t0 < 20)
    assert.truthy(err:find("p.lua: a policy file must return a rule or a list of rules", 1, true), err)
  end)

  it("does not let a rule rename itself after its declaration was checked", function()
    local dir = H.policy_dir { ["zz-blame.lua"] = [[
local r
r = rule "site/innocent" {
  validate = function()
    r.name = "gpu/vmi-gpus"
    error("boom")
  end,
}
return r
]] }
    local out, err, code = review(dir, "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml")
    assert.equal(0, code, err)
    assert.truthy(out:find('500 policy "site/innocent" failed: ', 1, true), out)
    assert.truthy(out:find("attempt to modify a read-only value (field 'name')", 1, true), out)
    assert.falsy(out:find('policy "gpu/vmi-gpus"', 1, true), out)
  end)

  it("does not take a table that merely looks like a rule", function()
    local _, err, code = review(H.policy_dir { ["p.lua"] = "return { __rule = true, name = 'site/fake', validate = function() end }\n" },
      "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml")
    assert.equal(2, code)
    assert.truthy(err:find("p.lua: a policy file must return a rule or a list of rules (got table)", 1, true), err)
    _, err, code = review(H.policy_dir { ["p.lua"] = "return { { __rule = true, name = 'site/fake', validate = function() end } }\n" },
      "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml")
    assert.equal(2, code)
    assert.truthy(err:find('p.lua: item 1 is not a rule (declare it with rule "name" {...})', 1, true), err)
  end)
end)
