-- Found in hardening: "A malformed verdict is allowed. A validate hook that
-- returns a table with only named keys ({message = "...", code = 403},
-- {verdict = "allow"}) is treated as an empty list: the review is allowed,
-- silently. A mutate hook that returns deny(...) is allowed too. A
-- hand-written {verdict = "deny"} denies with status code 0."
-- A verdict the engine cannot read is a refusal with 500 naming the rule and
-- what it returned (fail closed, DESIGN.md §9); a deny carries a 4xx code.
local core, json = H.core, H.json

local function engine_with(hook, body)
  local dir = H.tmpdir()
  H.write(dir .. "/p.lua", ("return rule 'site/x' { match = { kind = 'Pod' }, %s = function(req, cluster) %s end }"):format(hook, body))
  return assert(core.engine { policies = dir, instructions = 1000000 })
end

describe("verdicts the engine cannot read", function()
  local refused = {
    { "validate", "return { message = 'no', code = 403 }", "validate returned a table with keys code, message" },
    { "validate", "return { verdict = 'allow' }", "validate returned a table with keys verdict" },
    { "validate", "return { verdict = 'deny' }", "validate returned a deny verdict without a message" },
    { "validate", "return { verdict = 'deny', message = 'no' }", "validate returned a deny verdict without a 4xx code" },
    { "validate", "return { verdict = 'deny', message = 'no', code = 500 }", "validate returned a deny verdict without a 4xx code" },
    { "validate", "return { verdict = 'deny', message = 'no', code = 403, cod = 1 }", 'validate returned a deny verdict with an unknown key "cod"' },
    { "validate", "return { deny('a'), 5 }", "validate returned a list whose item 2 is a number" },
    { "validate", "return 'no'", "validate returned a string" },
    { "validate", "return setmetatable({}, { __index = function() return deny('hidden') end })", "validate returned a table with a metatable" },
    { "validate", "return setmetatable({}, { __index = function() while true do end end, __pairs = function() while true do end end })",
      "validate returned a table with a metatable" },
    { "validate", "return deny('no', { code = 500 })", "deny: code must be an HTTP 4xx status (400-499)" },
    { "mutate", "return deny('no')", "mutate returned a verdict (deny); a mutate hook returns nil or a JSONPatch" },
    { "mutate", "return warn('careful')", "mutate returned a verdict (warn)" },
    { "mutate", "return { op = 'add', path = '/metadata/labels', value = {} }", "mutate returned a table with keys op, path, value" },
    { "mutate", "return 42", "mutate returned a number" },
  }
  for _, c in ipairs(refused) do
    it(("refuse with 500 when %s returns `%s`"):format(c[1], c[2]), function()
      local e = engine_with(c[1], c[2])
      local resp, outcome, rule = e:review(H.pod_request())
      assert.equal("error", outcome)
      assert.equal("site/x", rule)
      assert.is_false(resp.allowed)
      assert.equal(500, resp.status.code)
      assert.truthy(resp.status.message:find('policy "site/x" failed', 1, true), resp.status.message)
      assert.truthy(resp.status.message:find(c[3], 1, true), resp.status.message)
      e:close()
    end)
  end

  local read = {
    { "validate", "return { verdict = 'deny', message = 'hand-written', code = 409 }", "refused", 409 },
    { "validate", "return {}", "allowed", nil },
    { "validate", "return json.array{}", "allowed", nil },
    { "validate", "return json.array{ deny('a', { code = 422 }), warn('w') }", "refused", 422 },
    { "validate", "return { warn('only a warning') }", "allowed", nil },
    { "mutate", "return patch.new()", "allowed", nil },
    { "mutate", "return {}", "allowed", nil },
    { "mutate", "return patch.new():add('/metadata/labels', json.object{ a = 'b' })", "allowed", nil },
    { "mutate", "return { { op = 'add', path = '/metadata/labels', value = json.object{} } }", "allowed", nil },
  }
  for _, c in ipairs(read) do
    it(("read `%s` from %s as %s"):format(c[2], c[1], c[3]), function()
      local e = engine_with(c[1], c[2])
      local resp, outcome = e:review(H.pod_request())
      assert.equal(c[3], outcome, resp.status and resp.status.message)
      assert.equal(c[4], resp.status and resp.status.code)
      e:close()
    end)
  end
end)
