-- The CPU slice a review gets on the webhook's I/O thread (engine_set_slice,
-- docs/decisions/0052): a policy still running when the slice is spent is
-- stopped and the engine says so (the server then runs the review again on
-- a review thread, without a slice); a review within its slice answers
-- exactly as without one.
local core = H.core

local bundle = H.bundle
local pod_request = H.pod_request
local pod_rule = H.pod_rule

-- about three million instructions: tens of milliseconds, far past 1 ms
local LONG = "local x = 0 for i = 1, 1000000 do x = x + i end return deny('finished ' .. x)"

describe("a review's CPU slice", function()
  it("stops a policy that runs past it, says so, and is gone once cleared", function()
    local e = assert(core.engine { policies = bundle { ["p.lua"] = pod_rule("site/long", LONG) },
      instructions = 1000000000000 })
    local resp, outcome = e:review(pod_request())
    assert.equal("refused", outcome)
    assert.equal("finished 500000500000", resp.status.message)
    assert.is_false(e:sliced())

    e:set_slice(1000)
    local rule
    resp, outcome, rule = e:review(pod_request())
    assert.is_true(e:sliced())
    assert.equal("site/long", rule)
    assert.equal("deadline", outcome) -- reported as late; the server drops it and runs the review again
    assert.is_false(resp.allowed)

    e:set_slice(nil)
    assert.is_false(e:sliced())
    resp, outcome = e:review(pod_request())
    assert.equal("refused", outcome)
    assert.equal("finished 500000500000", resp.status.message)
    e:close()
  end)

  it("stops every later policy of the review at its first instruction", function()
    local e = assert(core.engine { policies = bundle {
      ["a.lua"] = pod_rule("site/a-long", LONG),
      ["b.lua"] = pod_rule("site/b-short", "return deny('b ran')"),
    }, instructions = 1000000000000 })
    e:set_slice(1000)
    local resp = e:review(pod_request())
    assert.is_true(e:sliced())
    assert.is_nil(resp.status.message:find("b ran", 1, true), resp.status.message)
    e:set_slice(nil)
    resp = e:review(pod_request())
    assert.truthy(resp.status.message:find("b ran", 1, true), resp.status.message)
    e:close()
  end)

  it("leaves a review that fits in it as it is", function()
    local e = assert(core.engine { policies = bundle { ["p.lua"] = pod_rule("site/short", "return deny('short')") } })
    local plain, o1 = e:review(pod_request())
    e:set_slice(1000000)
    local sliced, o2 = e:review(pod_request())
    assert.is_false(e:sliced())
    e:set_slice(nil)
    assert.equal(o1, o2)
    assert.same(plain, sliced)
    e:close()
  end)
end)
