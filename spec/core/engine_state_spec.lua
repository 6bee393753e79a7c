-- Decision 0014: "Rule globals leak between reviews. counter = (counter
-- or 0) + 1 in a rule gives different answers per worker and per history in
-- the controller; only policy test's double run notices." Each policy's
-- globals as loaded are put back before every review.
-- Decision 0014: "A finalizer escapes every limit": a __gc metamethod
-- runs when the collector decides, outside the rule's call, its budget and
-- its deadline; policies cannot set one (docs/decisions/0014).
local core, json = H.core, H.json

local function engine_with(files)
  local dir = H.tmpdir()
  for name, text in pairs(files) do H.write(dir .. "/" .. name, text) end
  return assert(core.engine { policies = dir, instructions = 1000000 })
end

describe("a policy's globals", function()
  it("are as loaded at every review: a counter counts one each time", function()
    local e = engine_with { ["p.lua"] = [[
counter = 0
return rule "site/count" { match = { kind = "Pod" }, validate = function()
  counter = counter + 1
  calls = (calls or 0) + 1
  return deny(("counter %d, calls %d"):format(counter, calls))
end }
]] }
    for _ = 1, 3 do
      local resp = e:review(H.pod_request())
      assert.equal("counter 1, calls 1", resp.status.message)
    end
    e:close()
  end)

  it("are put back when a hook replaces _ENV itself", function()
    local e = engine_with { ["p.lua"] = [[
return rule "site/env" { match = { kind = "Pod" }, validate = function()
  local d, sm = deny, setmetatable
  _ENV = sm({ n = (n or 0) + 1 }, { __index = _ENV })
  return d("n " .. n)
end }
]] }
    for _ = 1, 3 do
      assert.equal("n 1", e:review(H.pod_request()).status.message)
    end
    e:close()
  end)

  it("keep tables the file built read-only, so their contents cannot carry over either", function()
    local e = engine_with { ["p.lua"] = [[
SEEN = { "a" }
return rule "site/seen" { match = { kind = "Pod" }, validate = function()
  SEEN[#SEEN + 1] = "b"
end }
]] }
    for _ = 1, 2 do
      local resp, outcome = e:review(H.pod_request())
      assert.equal("error", outcome)
      assert.truthy(resp.status.message:find("attempt to modify a read-only value", 1, true), resp.status.message)
    end
    e:close()
  end)

  it("of a lib module are put back too", function()
    local dir = H.tmpdir()
    os.execute("mkdir -p '" .. dir .. "/lib/site'")
    H.write(dir .. "/lib/site/count.lua", "total = 0\nreturn { bump = function() total = total + 1; return total end }\n")
    H.write(dir .. "/p.lua", [[
local count = require "site.count"
return rule "site/lib" { match = { kind = "Pod" }, validate = function() return deny("total " .. count.bump()) end }
]])
    local e = assert(core.engine { policies = dir })
    for _ = 1, 3 do
      assert.equal("total 1", e:review(H.pod_request()).status.message)
    end
    e:close()
  end)
end)

describe("finalizers", function()
  for _, gc in ipairs { "function() while true do end end", "true" } do
    it("are refused: setmetatable with __gc = " .. gc .. " is a policy error naming the rule", function()
      local e = engine_with { ["p.lua"] = ([[
return rule "site/gc" { match = { kind = "Pod" }, validate = function()
  setmetatable({}, { __gc = %s })
end }
]]):format(gc) }
      local resp, outcome, rule = e:review(H.pod_request())
      assert.equal("error", outcome)
      assert.equal("site/gc", rule)
      assert.truthy(resp.status.message:find("a metatable with __gc is not allowed in a policy", 1, true), resp.status.message)
      e:close()
    end)
  end

  it("cannot be slipped in at load time, and `review` answers instead of hanging", function()
    local dir = H.tmpdir()
    H.write(dir .. "/p.lua", [[
local keep = setmetatable({}, { __gc = function() while true do end end })
return rule "site/gc-load" { validate = function() end }
]])
    local t0 = os.time()
    local _, err, code = H.run({ "review", "--override", dir, "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml" }, "timeout 60 env ")
    assert.equal(2, code)
    assert.is_true(os.time() - t0 < 20)
    assert.truthy(err:find("a metatable with __gc is not allowed in a policy", 1, true), err)
  end)

  it("added to a metatable after setmetatable never run (Lua 5.4 manual 2.5.3)", function()
    local e = engine_with { ["p.lua"] = [[
return rule "site/gc-late" { match = { kind = "Pod" }, validate = function()
  local mt = {}
  local t = setmetatable({}, mt)
  mt.__gc = function() while true do end end
  t = nil
  local junk = {}
  for i = 1, 20000 do junk[i] = { i } end
end }
]] }
    for _ = 1, 3 do
      local resp, outcome = e:review(H.pod_request())
      assert.equal("allowed", outcome, resp.status and resp.status.message)
    end
    e:close()
  end)
end)
