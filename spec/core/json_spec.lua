-- JSON <-> Lua conversion (core/engine/luajson.c): lossless for Kubernetes objects.
local json = H.json

describe("cozygpu.json", function()
  it("keeps {} an object and [] an array across a round trip", function()
    local v = json.decode('{"emptyDir":{},"ports":[],"a":{"b":[]}}')
    assert.are.equal("object", json.kind(v.emptyDir))
    assert.are.equal("array", json.kind(v.ports))
    assert.are.equal('{"a":{"b":[]},"emptyDir":{},"ports":[]}', json.encode(v))
  end)

  it("keeps null apart from absent", function()
    local v = json.decode('{"a":null}')
    assert.are.equal(json.null, v.a)
    assert.is_nil(v.b)
    assert.are.equal('{"a":null}', json.encode(v))
  end)

  it("keeps integers exact beyond double precision and reals as reals", function()
    local v = json.decode('{"i":9007199254740993,"n":-9223372036854775808,"r":1.5}')
    assert.are.equal(9007199254740993, v.i)
    assert.are.equal(math.mininteger, v.n)
    assert.are.equal("integer", math.type(v.i))
    assert.are.equal("float", math.type(v.r))
    assert.are.equal('{"i":9007199254740993,"n":-9223372036854775808,"r":1.5}', json.encode(v))
  end)

  it("emits object keys in a stable (sorted) order", function()
    local t = { zeta = 1, alpha = 2, mid = { y = 1, b = 2 } }
    assert.are.equal('{"alpha":2,"mid":{"b":2,"y":1},"zeta":1}', json.encode(t))
  end)

  it("refuses what JSON cannot carry, naming the path", function()
    local s, err = json.encode({ spec = { f = function() end } })
    assert.is_nil(s)
    assert.are.equal("spec.f: cannot encode a function", err)
    s, err = json.encode({ x = 0 / 0 })
    assert.is_nil(s)
    assert.matches("cannot encode NaN", err)
  end)

  it("reports the position of a syntax error", function()
    local v, err = json.decode('{"a": [1, 2}')
    assert.is_nil(v)
    assert.matches("^line 1, column %d+:", err)
  end)

  it("makes read-only views that read through and refuse writes", function()
    local t = json.decode('{"a":{"b":[1,2,3]}}')
    local ro = json.readonly(t)
    assert.are.equal(2, ro.a.b[2])
    assert.are.equal(3, #ro.a.b)
    assert.has_error(function() ro.a.c = 1 end)
    assert.are.equal(ro.a, ro.a) -- one view per table
    assert.are.equal('{"a":{"b":[1,2,3]}}', json.encode(ro))
    local n = 0
    for _, v in ipairs(ro.a.b) do n = n + v end
    assert.are.equal(6, n)
  end)

  -- json.get is cozygpu.object.get: the walk the Lua version made, step by
  -- step with indexing (`v[k]`), in one C call
  it("json.get follows keys and indexes, nil at an absent, null or non-table step", function()
    local t = json.decode('{"metadata":{"labels":{"a":"1"},"owners":[{"kind":"VM"}],"gone":null},"s":"text"}')
    assert.are.equal("1", json.get(t, "metadata", "labels", "a"))
    assert.are.equal("VM", json.get(t, "metadata", "owners", 1, "kind"))
    assert.is_nil(json.get(t, "metadata", "owners", 2, "kind"))
    assert.is_nil(json.get(t, "metadata", "gone"))          -- null reads as absent
    assert.is_nil(json.get(t, "metadata", "gone", "x"))
    assert.is_nil(json.get(t, "s", "len"))                  -- a string is no table (not string.len)
    assert.is_nil(json.get(t, "metadata", "labels", "a", "b"))
    assert.is_nil(json.get(nil, "a"))
    assert.is_nil(json.get(t, "missing", nil))
    assert.are.equal(t, json.get(t))                        -- no keys: the value itself
    assert.are.equal(json.null, json.get(json.null))
    assert.is_nil(json.get())
    -- other tables are indexed as t[k] is: metamethods included
    local proxied = setmetatable({}, { __index = function(_, k) return { k = k } end })
    assert.are.equal("x", json.get(proxied, "x", "k"))
  end)

  it("json.get keeps what it reaches through a read-only view read-only, and the same view each time", function()
    local ro = json.readonly(json.decode('{"spec":{"domain":{"devices":{"gpus":[{"name":"g"}]}}}}'))
    local gpus = json.get(ro, "spec", "domain", "devices", "gpus")
    assert.are.equal("read-only", getmetatable(gpus))
    assert.are.equal(ro.spec.domain.devices.gpus, gpus)     -- the view indexing gives
    assert.are.equal("g", gpus[1].name)
    assert.has_error(function() gpus[1].name = "h" end)
    assert.are.equal("array", json.kind(gpus))
    -- a plain table holding a view: the view's tables stay read-only
    local mixed = { inner = ro }
    assert.has_error(function() json.get(mixed, "inner", "spec").domain = 1 end)
  end)
end)
