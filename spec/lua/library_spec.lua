-- The policy library (lua/cozygpu), used directly.
local json = H.json
local jsonpatch = require "cozygpu.jsonpatch"
local quantity = require "cozygpu.quantity"
local validation = require "cozygpu.validation"

describe("cozygpu.jsonpatch (RFC 6902 / RFC 6901)", function()
  it("escapes ~ and / in pointer tokens", function()
    assert.are.equal("/metadata/annotations/gpu.cozystack.io~1classes", jsonpatch.pointer { "metadata", "annotations", "gpu.cozystack.io/classes" })
    assert.are.same({ "a/b", "c~d" }, jsonpatch.split("/a~1b/c~0d"))
  end)

  it("applies add, remove, replace, move, copy and test, without touching the input", function()
    local doc = json.decode('{"a":[1,2],"b":{"c":1}}')
    local out = assert(jsonpatch.apply(doc, {
      { op = "add", path = "/a/-", value = 3 },
      { op = "add", path = "/a/0", value = 0 },
      { op = "replace", path = "/b/c", value = 2 },
      { op = "copy", from = "/b", path = "/d" },
      { op = "move", from = "/d/c", path = "/e" },
      { op = "remove", path = "/b" },
      { op = "test", path = "/e", value = 2 },
    }))
    assert.are.equal('{"a":[0,1,2,3],"d":{},"e":2}', json.encode(out))
    assert.are.equal('{"a":[1,2],"b":{"c":1}}', json.encode(doc))
  end)

  it("says which operation fails and why", function()
    local out, err = jsonpatch.apply(json.decode('{"spec":{}}'), { { op = "add", path = "/spec/tolerations/-", value = 1 } })
    assert.is_nil(out)
    assert.are.equal('operation 1 (add /spec/tolerations/-): member "tolerations" does not exist', err)
    out, err = jsonpatch.apply(json.decode('{"a":[1]}'), { { op = "add", path = "/a/5", value = 1 } })
    assert.matches("out of range", err)
    out, err = jsonpatch.apply(json.decode('{"a":1}'), { { op = "test", path = "/a", value = 2 } })
    assert.matches("test failed", err)
  end)
end)

describe("cozygpu.quantity (Kubernetes resource.Quantity)", function()
  local whole = { { "2", 2 }, { "2k", 2000 }, { "1e3", 1000 }, { "1E3", 1000 }, { "1Ki", 1024 }, { "0.5Ki", 512 },
    { "1000m", 1 }, { "+3", 3 }, { "0", 0 }, { 4, 4 }, { "1.0", 1 } }
  for _, c in ipairs(whole) do
    it(("reads %s as %d"):format(tostring(c[1]), c[2]), function()
      assert.are.equal(c[2], quantity.to_integer(c[1]))
    end)
  end
  for _, q in ipairs { "500m", "1.5", "0.1" } do
    it("refuses the fraction " .. q, function()
      local v, err = quantity.to_integer(q)
      assert.is_nil(v)
      assert.matches("not a whole number", err)
    end)
  end
  for _, q in ipairs { "", "abc", "1x", "1.2.3", "Ki" } do
    it("refuses the malformed quantity " .. ("%q"):format(q), function()
      assert.is_nil((quantity.to_integer(q)))
    end)
  end
end)

describe("cozygpu.validation (apimachinery names)", function()
  it("checks qualified names, label values and extended resource names", function()
    assert.is_nil(validation.qualified_name("gpu.cozystack.io/mode"))
    assert.is_nil(validation.qualified_name("dedicated"))
    assert.is_not_nil(validation.qualified_name("gpu.cozystack.io/"))
    assert.is_not_nil(validation.qualified_name("a/b/c"))
    assert.is_nil(validation.label_value(""))
    assert.is_not_nil(validation.label_value(("x"):rep(64)))
    assert.is_nil(validation.extended_resource_name("nvidia.com/AD102GL_L40S"))
    assert.is_not_nil(validation.extended_resource_name("nvidia.com/"))
    assert.is_not_nil(validation.extended_resource_name("requests.nvidia.com/x"))
    assert.is_nil(validation.dns1123_label("l40s-24c"))
    assert.is_not_nil(validation.dns1123_label("L40S"))
  end)
end)
