-- What a review came to, as a code (engine.h engine_outcome): the webhook,
-- the CLI and the metrics switch on it, never on an HTTP status or a
-- message. Also: hoster sources from memory, keyed as the policies
-- ConfigMap is (docs/decisions/0007), and the runtime's own Lua out of a
-- policy's reach (DESIGN.md §9, decision 0012).
local core, json = H.core, H.json

local function pod_rule(name, body)
  return ("return rule %q { match = { kind = 'Pod' }, validate = function(req, cluster) %s end }"):format(name, body)
end

describe("review outcome", function()
  local cases = {
    { "allowed", pod_rule("site/ok", "return nil"), "allowed", nil, true, nil },
    { "a denial", pod_rule("site/no", "return deny('no pods here')"), "refused", "site/no", false, 403 },
    { "a runtime error", pod_rule("site/boom", "error('boom')"), "error", "site/boom", false, 500 },
    { "a result that is not a verdict", pod_rule("site/odd", "return 42"), "error", "site/odd", false, 500 },
    { "a loop", pod_rule("site/loop", "while true do end"), "budget", "site/loop", false, 500 },
    { "an allocation without bound", pod_rule("site/hog", "local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(64) .. i end"),
      "memory", "site/hog", false, 500 },
  }
  for _, c in ipairs(cases) do
    it(("names %s %q, with the rule"):format(c[1], c[3]), function()
      local e = assert(core.engine { policies = H.policy_dir { ["p.lua"] = c[2] }, instructions = 2000000, memory = 1024 * 1024 })
      local resp, outcome, rule = e:review(H.pod_request())
      assert.equal(c[3], outcome)
      assert.equal(c[4], rule)
      assert.equal(c[5], resp.allowed)
      assert.equal(c[6], resp.status and resp.status.code)
      e:close()
    end)
  end

  it("lets a failing rule win over a denial, and names the first failure in bundle order", function()
    local e = assert(core.engine { policies = H.policy_dir {
      ["a.lua"] = pod_rule("site/a-deny", "return deny('no')"),
      ["b.lua"] = pod_rule("site/b-error", "error('first failure')"),
      ["c.lua"] = pod_rule("site/c-loop", "while true do end"),
    }, instructions = 100000 })
    local resp, outcome, rule = e:review(H.pod_request())
    assert.equal("error", outcome)
    assert.equal("site/b-error", rule)
    assert.equal(500, resp.status.code)
    e:close()
  end)

  it("is what `review_document` reports for the CLI", function()
    local e = assert(core.engine { policies = H.policy_dir { ["p.lua"] = pod_rule("site/no", "return deny('no')") } })
    local doc = { apiVersion = "v1", kind = "Pod", metadata = { name = "p", namespace = "tenant-a" }, spec = { containers = json.array{} } }
    local out, outcome = e:review_document(doc, { user = "u" })
    assert.is_false(out.response.allowed)
    assert.equal("refused", outcome)
    e:close()
  end)
end)

describe("hoster sources from memory", function()
  it("name the ConfigMap key in messages and serve lib.* keys to require", function()
    local e = assert(core.engine { sources = {
      ["lib.site.names.lua"] = "return { banned = 'p' }\n",
      ["site-names.lua"] = "local n = require 'site.names'\n" .. pod_rule("site/names", "if req.object.metadata.name == n.banned then return deny('banned name') end"),
    } })
    local resp, outcome, rule = e:review(H.pod_request())
    assert.equal("refused", outcome)
    assert.equal("site/names", rule)
    assert.equal("banned name", resp.status.message)
    e:close()
  end)

  it("replace a default of the same name", function()
    local e = assert(core.engine { policies = H.policy_dir { ["p.lua"] = pod_rule("site/default", "return deny('default')") },
      sources = { ["p.lua"] = pod_rule("site/hoster", "return deny('hoster')") } })
    local resp = e:review(H.pod_request())
    assert.equal("hoster", resp.status.message)
    assert.equal(1, e:rules())
    e:close()
  end)

  it("report a syntax error as KEY:LINE", function()
    local e, err = core.engine { sources = { ["site-broken.lua"] = "return rule 'x' {\n  match = {\n" } }
    assert.is_nil(e)
    assert.matches("^site%-broken%.lua:3: ", err)
  end)

  it("refuse a module key without a name, and a key that is not a policy file name", function()
    local e, err, kind = core.engine { sources = { ["lib.lua"] = "return {}\n" } }
    assert.is_nil(e)
    assert.equal("data[lib.lua]: a module key needs a name", err)
    assert.equal("policy error", kind)
    e, err, kind = core.engine { sources = { ["notes.txt"] = "hello" } }
    assert.is_nil(e)
    assert.equal("invalid input", kind)
    assert.matches("notes.txt: not a policy file name", err, 1, true)
  end)
end)

describe("the runtime's own Lua", function()
  it("is out of a policy's reach; the public library is not", function()
    local body = [[
      local out = {}
      for _, m in ipairs { "runtime.admission", "runtime.layout", "cozygpu.admission", "cozygpu.layout" } do
        if pcall(require, m) then out[#out + 1] = m end
      end
      if not pcall(require, "cozygpu.object") then out[#out + 1] = "cozygpu.object missing" end
      return deny("reached: " .. table.concat(out, ","))
    ]]
    local e = assert(core.engine { policies = H.policy_dir { ["p.lua"] = pod_rule("site/probe", body) } })
    local resp = e:review(H.pod_request())
    assert.equal("reached: ", resp.status.message)
    e:close()
  end)
end)

-- Reported while writing the policy reference (decision 0012): json.object and
-- json.array replaced the metatable of a read-only view, so one rule could
-- blank the request for every rule after it (a two-vGPU-class VMI was then
-- allowed) and the cluster view for every later review.
describe("read-only views", function()
  it("cannot be marked by json.object or json.array; the next rule still sees the request", function()
    local dir = H.tmpdir()
    -- a and b catch the error, so only c's view of the request decides
    H.write(dir .. "/a.lua", pod_rule("site/a-mark", "if pcall(json.object, req.object.spec) then return deny('marked the request') end"))
    H.write(dir .. "/b.lua", pod_rule("site/b-array", "if pcall(json.array, cluster:list('Node')) then return deny('marked the cluster view') end"))
    H.write(dir .. "/c.lua", pod_rule("site/c-reads", "if req.object.spec.containers == nil then return deny('spec was blanked') end"))
    local e = assert(core.engine { policies = dir })
    for _ = 1, 2 do
      local resp, outcome, rule = e:review(H.pod_request())
      assert.equal("allowed", outcome, resp.status and resp.status.message)
      assert.is_nil(rule)
    end
    local ok, err = pcall(json.object, json.readonly({ a = 1 }))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("a read-only view cannot be marked", 1, true), err)
    e:close()
  end)
end)

-- The answer is built outside every rule's memory cap and goes back whole
-- to the API server and the tenant's client: a rule that refuses once per
-- item of tenant data must not make it unbounded (lua/runtime/admission.lua,
-- MAX_LISTED and MAX_MESSAGE; a 100,000-item annotation made a 30 MB
-- answer before).
describe("review answer size", function()
  it("lists the first 16 refusals and warnings, says how many more, and cuts long messages", function()
    local e = assert(core.engine { policies = H.policy_dir {
      ["many.lua"] = pod_rule("site/many", [[
        local out = {}
        for i = 1, 1000 do out[#out + 1] = deny("refusal " .. i) end
        for i = 1, 500 do out[#out + 1] = warn("warning " .. i) end
        out[#out + 1] = deny(("é"):rep(5000))
        return out]]),
    } })
    local resp, outcome = e:review(H.pod_request())
    assert.equal("refused", outcome)
    local causes = resp.status.details.causes
    assert.equal(16, #causes)
    assert.equal("refusal 1 (site/many)", causes[1].message)
    assert.equal("refusal 16 (site/many)", causes[16].message)
    -- 1,001 refusals: 16 listed, 985 counted
    assert.truthy(resp.status.message:find("refusal 16; and 985 more refusals", 1, true), resp.status.message)
    assert.falsy(resp.status.message:find("refusal 17", 1, true))
    assert.equal(17, #resp.warnings)
    assert.equal("warning 16", resp.warnings[16])
    assert.equal("and 484 more warnings", resp.warnings[17])
    assert.is_true(#json.encode(resp) < 8192)
    e:close()
  end)

  it("cuts a long message at 2048 bytes on a character boundary", function()
    local e = assert(core.engine { policies = H.policy_dir {
      ["long.lua"] = pod_rule("site/long", [[return deny(("é"):rep(5000))]]),
    } })
    local resp = e:review(H.pod_request())
    local msg = resp.status.message
    -- "é" is 2 bytes: 1024 of them fill 2048 bytes exactly, then "…"
    assert.equal(("é"):rep(1024) .. "…", msg)
    assert.truthy(utf8.len(msg), "not valid UTF-8")
    e:close()
  end)
end)
