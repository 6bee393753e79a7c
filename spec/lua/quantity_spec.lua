-- cozygpu.quantity read as k8s.io/apimachinery reads a resource.Quantity
-- (pkg/api/resource). Expected values follow the upstream rules named over
-- each group, not this module's output; where upstream leaves the int64
-- result open, decision 0013 says what cozygpu does.
local quantity = require "cozygpu.quantity"

local MAX, MIN = math.maxinteger, math.mininteger

local function reads(cases)
  for _, c in ipairs(cases) do
    it(("reads %q as %d"):format(c[1], c[2]), function()
      local v, err = quantity.to_integer(c[1])
      assert.are.equal(c[2], v, err)
      assert.are.equal("integer", math.type(v))
    end)
  end
end

describe("cozygpu.quantity: values from 10^18 up to the int64 maximum are exact", function()
  -- suffix.go interpret: the decimal table is looked up first, so "E" alone
  -- is exa (10^18) and "e"/"E" with digits an exponent; quantity_test.go
  -- TestQuantityParse reads "1E" as 1×10^18 and "12E" as 12×10^18.
  reads {
    { "1E", 1000000000000000000 },
    { "1000P", 1000000000000000000 },
    { "1e18", 1000000000000000000 },
    { "1E18", 1000000000000000000 },
    { "1000000000000000000", 1000000000000000000 },
    { "9E", 9000000000000000000 },
    { "1.7E18", 1700000000000000000 },
    { "9223372036854775807", MAX },
    { "9.223372036854775807E", MAX },
    { "9223372036854775807000m", MAX },
    { "4Ei", 4611686018427387904 },
    { "7Ei", 8070450532247928832 },
    { "8191Pi", 9222246136947933184 },
  }
end)

describe("cozygpu.quantity: values beyond int64", function()
  -- quantity.go ParseQuantity caps a binary-suffixed value at 2^63-1 while
  -- parsing (quantity_test.go: "9Ei" and "9223372036854775807Ki" parse as
  -- maxAllowed), before any whole-number question, so "8.5Ei" is 2^63-1 too.
  reads {
    { "8Ei", MAX },
    { "9Ei", MAX },
    { "16Ei", MAX },
    { "100Ei", MAX },
    { "8.5Ei", MAX },
    { "8192Pi", MAX },
    { "9223372036854775807Ki", MAX },
    { "99999999999999999999999999Ei", MAX },
  }
  -- A decimal value keeps its exact size upstream (an inf.Dec: the Quantity
  -- doc comment, "18446744073709551616" keeps its value) and Value() is
  -- undefined for it; cozygpu saturates (decision 0013), which compares
  -- like Quantity.Cmp against any count that fits int64.
  reads {
    { "9223372036854775808", MAX },
    { "18446744073709551616", MAX },
    { "10E", MAX },
    { "1e19", MAX },
    { "1e100", MAX },
    { "1e2147483647", MAX },
    { "9.223372036854775808E", MAX },
  }
end)

describe("cozygpu.quantity: negative values", function()
  -- ParseQuantity caps the magnitude of a binary value and then restores the
  -- sign, so "-8Ei" is -(2^63-1), not -2^63; a decimal -2^63 fits int64
  -- exactly, and below it cozygpu saturates to math.mininteger (0013).
  reads {
    { "-1", -1 },
    { "-1E", -1000000000000000000 },
    { "-4Ei", -4611686018427387904 },
    { "-9223372036854775807", -MAX },
    { "-9223372036854775808", MIN },
    { "-8Ei", -MAX },
    { "-100Ei", -MAX },
    { "-9223372036854775809", MIN },
    { "-1e100", MIN },
    { "-0", 0 },
  }
end)

describe("cozygpu.quantity: rounding", function()
  -- ParseQuantity keeps a value only down to nano and rounds a finer
  -- non-zero one away from zero (quantity_test.go: "0.9n" → 1n, "3.001n" →
  -- 4n, "0.000000000001Ki" → 2n), so a value within 1n below a whole number
  -- is that whole number.
  reads {
    { "0.9999999999", 1 },
    { "1.9999999999", 2 },
    { "0.99999999990000", 1 },
    { "999999999.9999999999m", 1000000 },
    { "-0.9999999999", -1 },
  }
  -- Value() (and AsScaledInt64 / negativeScaleInt64 in amount.go, math.go)
  -- would round the rest up away from zero: "1.5" → 2, "100m" → 1,
  -- "-1.5" → -2. GPUs are whole devices, so cozygpu refuses them instead
  -- (decision 0010; the API server likewise refuses a fractional extended
  -- resource): the message names the value.
  for _, q in ipairs { "1.5", "100m", "-1.5", "500m", "0.999999999", "0.0000000001", "1n", "0.1Ki",
    "0.000000000001Ki", "100.035Ki", "1E-3", "100000000000000000000.5" } do
    it(("refuses %q: not a whole number"):format(q), function()
      local v, err = quantity.to_integer(q)
      assert.is_nil(v)
      assert.are.equal(q .. " is not a whole number", err)
    end)
  end
end)

describe("cozygpu.quantity: the grammar", function()
  -- the Quantity doc comment's grammar: <sign>? <number> <suffix>, a number
  -- "1", "1.5", "1." or ".5"; suffixes Ki..Ei, n u m "" k M G T P E, or
  -- e/E with a signed integer (quantity_test.go: "1.", "1.G", ".001",
  -- "1.3E+6", "1E-3" parse).
  reads {
    { "1.", 1 },
    { "1.G", 1000000000 },
    { ".5k", 500 },
    { "+3", 3 },
    { "007", 7 },
    { "1e+3", 1000 },
    { "1000E-3", 1 },
    { "0.5e1", 5 },
    { "1e0", 1 },
    { "1.3E+6", 1300000 },
    { "0.5Ki", 512 },
    { "1.5Ki", 1536 },
    { "0.5Mi", 524288 },
    { "0", 0 },
    { "0.000", 0 },
    { "0Ei", 0 },
    { "0e100", 0 },
  }
  -- suffix.go interpret parses the exponent as an int64 and keeps its low
  -- 32 bits (int32 conversion): 2^32 reads as 0, 2^32+3 as 3, 2^63-1 as -1.
  reads {
    { "1e4294967296", 1 },
    { "1e4294967299", 1000 },
    { "10e9223372036854775807", 1 },
  }
  -- a JSON integer is read as itself
  it("reads a JSON integer as itself", function()
    assert.are.equal(MAX, quantity.to_integer(MAX))
    assert.are.equal(MIN, quantity.to_integer(MIN))
    assert.are.equal(4, quantity.to_integer(4))
  end)

  -- ParseQuantity refuses these (quantity_test.go TestQuantityParse
  -- "invalid": "1.1.M", "1+1.0M", "0.1mi", "aoeu", "1i", " 1", "1 ",
  -- "-3.01e-"; an empty string; a suffix outside the tables; an exponent
  -- that is not an int64).
  local invalid = { "", "1.5.2", "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", "1i", ".5i", "1KiB", "1K", "1k1",
    " 1", "1 ", "0x10", "1e", "1e+", "-3.01e-", "1e1.5", "1e9223372036854775808", "1e99999999999999999999", "1,5" }
  -- ParseQuantity also takes a sign or a suffix without any digit ("+",
  -- "Ki") as 0; the documented grammar and the CRD schema pattern for a
  -- Quantity need a digit, and so does cozygpu (decision 0013).
  for _, q in ipairs { "+", "-", ".", "Ki", "m", "E", "e3", "-." } do invalid[#invalid + 1] = q end
  for _, q in ipairs(invalid) do
    it(("refuses the malformed %q"):format(q), function()
      local v, err = quantity.to_integer(q)
      assert.is_nil(v)
      assert.truthy(err:find(("invalid quantity %q"):format(q), 1, true), err)
      assert.is_nil((quantity.parse(q)))
    end)
  end
  it("refuses what is neither a string nor an integer", function()
    for _, q in ipairs { 1.5, 1e20, true } do
      local v, err = quantity.to_integer(q)
      assert.is_nil(v)
      assert.are.equal("must be a quantity string", err)
    end
  end)
end)

describe("cozygpu.quantity.parse", function()
  it("keeps the parts: ±digits × 10^exp10 × 2^exp2", function()
    assert.are.same({ negative = false, digits = "15", exp10 = -1, exp2 = 10 }, quantity.parse("1.5Ki"))
    assert.are.same({ negative = true, digits = "1", exp10 = 18, exp2 = 0 }, quantity.parse("-1E"))
    assert.are.same({ negative = false, digits = "25", exp10 = 1, exp2 = 0 }, quantity.parse("0.25e3"))
    assert.are.same({ negative = false, digits = "0", exp10 = 0, exp2 = 0 }, quantity.parse("0"))
    assert.are.same({ negative = true, digits = "9223372036854775808", exp10 = 0, exp2 = 0 }, quantity.parse(MIN))
  end)
end)

describe("cozygpu.quantity.add", function()
  it("adds counts, saturating at the int64 bounds instead of wrapping", function()
    assert.are.equal(5, quantity.add(2, 3))
    assert.are.equal(-1, quantity.add(2, -3))
    assert.are.equal(MAX, quantity.add(MAX, 1))
    assert.are.equal(MAX, quantity.add(MAX, MAX))
    assert.are.equal(MAX, quantity.add(1, MAX))
    assert.are.equal(MAX - 1, quantity.add(MAX, -1))
    assert.are.equal(MIN, quantity.add(MIN, -1))
    assert.are.equal(MIN, quantity.add(-2, MIN))
    assert.are.equal(-1, quantity.add(MIN, MAX))
  end)
end)
