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
end)
