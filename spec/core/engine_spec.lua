-- The Lua policy host (core/engine/engine.c): sandbox, budgets, fail-closed errors,
-- override directory (DESIGN.md §9).
local core, json = H.core, H.json

-- a policy that validates pods with `body` as its validate function body
local function pod_rule(name, body)
  return ("return rule %q { match = { kind = 'Pod' }, validate = function(req, cluster) %s end }"):format(name, body)
end

describe("policy engine", function()
  it("loads the default bundle", function()
    local e = assert(core.engine {})
    assert.is_true(e:rules() >= 4)
    e:close()
  end)

  it("runs a policy in a sandbox without io, os.execute, load, debug or require outside the bundle", function()
    local probes = {
      "io", "debug", "load", "loadfile", "dofile", "package", "coroutine", "collectgarbage", "print",
    }
    local body = {}
    for _, g in ipairs(probes) do body[#body + 1] = ("if %s ~= nil then return deny('has %s') end"):format(g, g) end
    body[#body + 1] = "if os.execute ~= nil or os.getenv ~= nil or os.exit ~= nil then return deny('has os.*') end"
    body[#body + 1] = "if type(os.time()) ~= 'number' then return deny('no os.time') end"
    body[#body + 1] = "local ok = pcall(require, 'os') if ok then return deny('require os') end"
    body[#body + 1] = "if getmetatable('') ~= 'string' then return deny('string metatable visible') end"
    body[#body + 1] = "return deny('sandbox ok')"
    local dir = H.policy_dir { ["probe.lua"] = pod_rule("probe", table.concat(body, "\n")) }
    local e = assert(core.engine { policies = dir })
    local resp = assert(e:review(H.pod_request()))
    assert.are.equal("sandbox ok", resp.status.message)
  end)

  it("refuses a policy that loops forever within its budget, naming it, and answers the next review", function()
    local dir = H.policy_dir {
      ["a-loop.lua"] = pod_rule("site/loop", "while true do end"),
    }
    local e = assert(core.engine { policies = dir, instructions = 100000 })
    local resp = assert(e:review(H.pod_request()))
    assert.is_false(resp.allowed)
    assert.are.equal(500, resp.status.code)
    assert.are.equal('policy "site/loop" exceeded its instruction budget of 100000 instructions', resp.status.message)
    resp = assert(e:review(H.pod_request()))
    assert.is_false(resp.allowed)
    assert.matches("site/loop", resp.status.message)
  end)

  it("keeps refusing a policy that catches the budget error with pcall", function()
    local dir = H.policy_dir {
      ["p.lua"] = pod_rule("site/sneaky", "for i = 1, 100 do pcall(function() while true do end end) end return nil"),
    }
    local e = assert(core.engine { policies = dir, instructions = 100000 })
    local resp = assert(e:review(H.pod_request()))
    assert.is_false(resp.allowed)
    assert.matches("site/sneaky.*instruction budget", resp.status.message)
  end)

  it("refuses a policy that allocates without bound, and the state keeps serving", function()
    local dir = H.policy_dir {
      ["a.lua"] = pod_rule("site/hog", "local t = {} local i = 0 while true do i = i + 1 t[i] = ('x'):rep(1024) .. i end"),
      ["b.lua"] = pod_rule("site/fine", "return warn('fine ran')"),
    }
    local e = assert(core.engine { policies = dir, memory = 8 * 1024 * 1024, instructions = 1000000000 })
    local before = e:memory()
    local resp = assert(e:review(H.pod_request()))
    assert.is_false(resp.allowed)
    assert.are.equal('policy "site/hog" exceeded its memory cap of 8388608 bytes', resp.status.message)
    -- memory was given back, and the next review is answered
    assert.is_true(e:memory() < before + 8 * 1024 * 1024)
    resp = assert(e:review(H.pod_request()))
    assert.matches("site/hog", resp.status.message)
  end)

  it("turns the failure of the Nth allocation into a refusal (test switch)", function()
    local dir = H.policy_dir { ["a.lua"] = pod_rule("site/alloc", "local t = {} for i = 1, 100 do t[i] = {i} end return nil") }
    local e = assert(core.engine { policies = dir })
    e:fail_alloc_after(5)
    local resp = assert(e:review(H.pod_request()))
    assert.is_false(resp.allowed)
    assert.matches('policy "site/alloc" exceeded its memory cap', resp.status.message)
    resp = assert(e:review(H.pod_request()))
    assert.is_true(resp.allowed)
  end)

  it("names the policy, file and line of a runtime error (fail closed)", function()
    local dir = H.policy_dir { ["broken.lua"] = pod_rule("site/broken", "\nlocal x = nil\nreturn x.field") }
    local e = assert(core.engine { policies = dir })
    local resp = assert(e:review(H.pod_request()))
    assert.is_false(resp.allowed)
    assert.are.equal(500, resp.status.code)
    assert.matches('^policy "site/broken" failed: .*broken.lua:3: attempt to index a nil value', resp.status.message)
  end)

  it("refuses to load a bundle with a syntax error, naming file and line", function()
    local dir = H.policy_dir { ["bad.lua"] = "return rule 'x' {\n validate = function( end }" }
    local e, err = core.engine { policies = dir }
    assert.is_nil(e)
    assert.matches("bad.lua:2:", err)
  end)

  it("refuses a malformed rule declaration", function()
    local dir = H.policy_dir { ["x.lua"] = "return rule 'x' { valdate = function() end }" }
    local e, err = core.engine { policies = dir }
    assert.is_nil(e)
    assert.matches('rule "x": unknown field "valdate"', err)
  end)

  -- A fresh hoster's report (decision 0012): a misspelt rule field was reported at
  -- a line of lua/cozygpu/policy.lua, not of the hoster's file, because
  -- `return rule "x" {...}` is a tail call and the message handler then put
  -- the library's own line in front.
  it("names the line of the declaration in the policy's file for a malformed rule, not the library's", function()
    local cases = {
      { "-- site rule\n\nreturn rule 'site/x' {\n  valdate = function() end,\n}\n", 'x.lua:3: rule "site/x": unknown field "valdate"' },
      { "local r = rule 'site/y' { match = { kind = 'Pod', operation = 'CREATE' }, validate = function() end }\nreturn r\n",
        'x.lua:1: rule "site/y": match: unknown field "operation"' },
      { "\nreturn rule 'bad name!' { validate = function() end }\n", "x.lua:2: rule: the name must be" },
    }
    for _, c in ipairs(cases) do
      local e, err = core.engine { policies = H.policy_dir { ["x.lua"] = c[1] } }
      assert.is_nil(e)
      assert.truthy(err:find(c[2], 1, true), err)
      assert.falsy(err:find("cozygpu/policy.lua", 1, true), err)
    end
  end)

  it("lets an override file replace a default of the same name and add new ones", function()
    local defaults = H.policy_dir {
      ["one.lua"] = pod_rule("site/one", "return deny('default one')"),
      ["two.lua"] = pod_rule("site/two", "return warn('default two')"),
    }
    local override = H.policy_dir {
      ["one.lua"] = pod_rule("site/one", "return warn('hoster one')"),
      ["three.lua"] = pod_rule("site/three", "return warn('hoster three')"),
    }
    local e = assert(core.engine { policies = defaults, override = override })
    local resp = assert(e:review(H.pod_request()))
    assert.is_true(resp.allowed)
    local got = {}
    for _, w in ipairs(resp.warnings) do got[w] = true end
    assert.are.same({ ["hoster one"] = true, ["hoster three"] = true, ["default two"] = true }, got)
    assert.are.equal(3, #resp.warnings)
  end)

  it("gives policies read-only views of the request and the cluster", function()
    local dir = H.policy_dir {
      ["w.lua"] = pod_rule("site/writer", "req.object.metadata.name = 'x' return nil"),
      ["c.lua"] = pod_rule("site/cluster-writer", "cluster:namespace('tenant-a').metadata.labels.x = 'y' return nil"),
    }
    local e = assert(core.engine { policies = dir })
    assert(e:set_cluster(json.array { H.namespace("tenant-a", { a = "b" }) }))
    local resp = assert(e:review(H.pod_request()))
    assert.is_false(resp.allowed)
    assert.matches("site/cluster%-writer.*read%-only", resp.status.message)
    assert.matches("site/writer.*read%-only", resp.status.message)
  end)

  it("does not let next() expose the table behind a read-only view", function()
    local dir = H.policy_dir {
      ["n.lua"] = pod_rule("site/next", "local k, v = next(req.object) if type(k) ~= 'string' then return deny('leak') end local ok = pcall(function() v.x = 1 end) if ok then return deny('writable') end return nil"),
    }
    local e = assert(core.engine { policies = dir })
    local resp = assert(e:review(H.pod_request()))
    assert.is_true(resp.allowed)
  end)

  it("does not let one policy change what another sees (globals are per policy)", function()
    local dir = H.policy_dir {
      ["a.lua"] = pod_rule("site/a", "string = nil; deny = nil; return nil"),
      ["b.lua"] = pod_rule("site/b", "return warn(string.upper('b sees string'))"),
    }
    local e = assert(core.engine { policies = dir })
    local resp = assert(e:review(H.pod_request()))
    assert.is_true(resp.allowed)
    assert.are.equal("B SEES STRING", resp.warnings[1])
  end)
end)
