--- cozygpu.quantity — Kubernetes resource quantities
--- (k8s.io/apimachinery/pkg/api/resource, Quantity: `<signedNumber><suffix>`,
--- a number "1", "1.5", "1." or ".5"; suffix a binary SI (Ki..Ei), decimal
--- SI (n, u, m, "", k, M, G, T, P, E) or decimal exponent (e/E followed by
--- a signed int64, of which Kubernetes keeps the low 32 bits)).
---
--- Values are read as ParseQuantity reads them: a value finer than 1n is
--- rounded away from zero to the next 1n, and a binary-suffixed value is
--- capped at 2^63-1 in magnitude. GPUs are whole devices, so the one
--- conversion offered is to an integer: a value that is not a whole number
--- is an error, a decimal value beyond int64 saturates (decision 0013).
local M = {}

local DECIMAL = { n = -9, u = -6, m = -3, [""] = 0, k = 3, M = 6, G = 9, T = 12, P = 15, E = 18 }
local BINARY = { Ki = 10, Mi = 20, Gi = 30, Ti = 40, Pi = 50, Ei = 60 }
local MAX_DIGITS = "9223372036854775807" -- math.maxinteger, 2^63-1
local MIN_DIGITS = "9223372036854775808" -- -math.mininteger, 2^63

-- compares two digit strings without leading zeros: -1, 0 or 1
local function cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end

-- the exponent digits `d` (sign `s`) as Kubernetes keeps them: an int64, or
-- nil when it is none, cut to its low 32 bits as a signed int32
local function exponent(s, d)
  d = d:gsub("^0+", "")
  if cmp(d, s == "-" and MIN_DIGITS or MAX_DIGITS) > 0 then return nil end
  local n = 0
  for i = 1, #d do n = n * 10 + (d:byte(i) - 48) end -- wraps: only the low bits count
  if s == "-" then n = -n end
  n = n & 0xffffffff
  return n >= 0x80000000 and n - 0x100000000 or n
end

--- Parses `q` (a string, or an integer as JSON may carry it).
--- Returns {negative=bool, digits=string, exp10=int, exp2=int}, meaning
--- ±digits × 10^exp10 × 2^exp2, or nil and a message.
function M.parse(q)
  if math.type(q) == "integer" then
    return { negative = q < 0, digits = (tostring(q):gsub("^-", "")), exp10 = 0, exp2 = 0 }
  end
  if type(q) ~= "string" then return nil, "must be a quantity string" end
  local sign, int, frac, suffix = q:match("^([+-]?)(%d*)%.?(%d*)(.*)$")
  -- the grammar needs a digit ("+", ".", "Ki" are no quantities)
  if not sign or (int == "" and frac == "") then return nil, ("invalid quantity %q"):format(q) end
  local exp10, exp2 = -#frac, 0
  if DECIMAL[suffix] then
    exp10 = exp10 + DECIMAL[suffix]
  elseif BINARY[suffix] then
    exp2 = BINARY[suffix]
  else
    local es, ed = suffix:match("^[eE]([+-]?)(%d+)$")
    if not es then return nil, ("invalid quantity %q: unknown suffix %q"):format(q, suffix) end
    local e = exponent(es, ed)
    if not e then return nil, ("invalid quantity %q: the exponent is beyond int64"):format(q) end
    exp10 = exp10 + e
  end
  local digits = (int .. frac):gsub("^0+", "")
  if digits == "" then digits = "0" end
  return { negative = sign == "-", digits = digits, exp10 = exp10, exp2 = exp2 }
end

-- digit string `d` times 2^n, exactly
local function times_pow2(d, n)
  for _ = 1, n do
    local out, carry = {}, 0
    for i = #d, 1, -1 do
      local v = (d:byte(i) - 48) * 2 + carry
      out[#out + 1] = string.char(48 + v % 10)
      carry = v // 10
    end
    if carry > 0 then out[#out + 1] = string.char(48 + carry) end
    d = table.concat(out):reverse()
  end
  return d
end

-- digit string `d` plus one
local function plus_one(d)
  local i = #d
  while i > 0 and d:sub(i, i) == "9" do i = i - 1 end
  if i == 0 then return "1" .. ("0"):rep(#d) end
  return d:sub(1, i - 1) .. string.char(d:byte(i) + 1) .. ("0"):rep(#d - i)
end

--- Converts `q` to an integer, as resource.Quantity's Value() reads it
--- where that is defined. Returns the integer, or nil and a message:
--- 'invalid quantity "<q>"...' (as `parse`), "must be a quantity string",
--- or "<q> is not a whole number" (e.g. "500m", "1.5": where Value() would
--- round up, a GPU count refuses). A binary-suffixed value beyond int64 is
--- capped at ±(2^63-1) as ParseQuantity caps it ("8Ei" → 2^63-1); a decimal
--- one saturates to math.maxinteger or math.mininteger ("1e100").
--- @param q string|integer
--- @return integer|nil, string?
function M.to_integer(q)
  if math.type(q) == "integer" then return q end
  local p, err = M.parse(q)
  if not p then return nil, err end
  local digits, exp10 = times_pow2(p.digits, p.exp2), p.exp10
  if digits == "0" then return 0 end
  local zeros = #digits:match("0*$")
  digits, exp10 = digits:sub(1, #digits - zeros), exp10 + zeros
  -- |value| = digits × 10^exp10, digits without trailing zeros: split it
  -- into the whole part and whether a fraction remains
  local whole, fraction, over = "0", false, false
  if exp10 >= 0 then
    if #digits + exp10 > #MAX_DIGITS then over = true else whole = digits .. ("0"):rep(exp10) end
  else
    local k = -exp10 -- fraction digits; the last is not zero
    fraction = true
    local fdigits
    if #digits > k then
      whole, fdigits = digits:sub(1, #digits - k), digits:sub(#digits - k + 1)
    elseif #digits == k then
      fdigits = digits
    end -- else the fraction starts with a zero
    -- ParseQuantity rounds a value finer than 1n away from zero to the next
    -- 1n: a fraction .999999999x (x not all zeros) becomes the next integer
    if fdigits and k > 9 and fdigits:sub(1, 9) == "999999999" then
      whole, fraction = plus_one(whole), false
    end
  end
  if p.exp2 > 0 and (over or cmp(whole, MAX_DIGITS) > 0 or (fraction and whole == MAX_DIGITS)) then
    return p.negative and -math.maxinteger or math.maxinteger -- the BinarySI cap
  end
  if fraction then return nil, ("%s is not a whole number"):format(q) end
  if p.negative then
    if over or cmp(whole, MIN_DIGITS) >= 0 then return math.mininteger end
    return -math.tointeger(tonumber(whole))
  end
  if over or cmp(whole, MAX_DIGITS) > 0 then return math.maxinteger end
  return math.tointeger(tonumber(whole))
end

--- `a + b` for integer counts, saturating at math.maxinteger and
--- math.mininteger instead of wrapping around: a count read as 2^63-1
--- ("8Ei") plus one more is still 2^63-1.
--- @param a integer
--- @param b integer
--- @return integer
function M.add(a, b)
  if b > 0 and a > math.maxinteger - b then return math.maxinteger end
  if b < 0 and a < math.mininteger - b then return math.mininteger end
  return a + b
end

return M
