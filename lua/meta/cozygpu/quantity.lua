---@meta
-- cozygpu.quantity — Kubernetes resource quantities
-- (lua/cozygpu/quantity.lua).
--
-- Source: k8s.io/apimachinery/pkg/api/resource, Quantity
-- (`<signedNumber><suffix>`; a number "1", "1.5", "1." or ".5"; suffix
-- binary Ki..Ei, decimal n u m "" k M G T P E, or an exponent e/E<int64>,
-- of which Kubernetes keeps the low 32 bits). Read as ParseQuantity reads
-- it: finer than 1n rounds away from zero to the next 1n, a binary value is
-- capped at 2^63-1 in magnitude. GPUs are whole devices, so the one
-- conversion offered is to an integer (decision 0013).
--
-- No function raises: a bad value returns nil and a message.

---±digits × 10^exp10 × 2^exp2.
---@class cozygpu.ParsedQuantity
---@field negative boolean
---@field digits string decimal digits without leading zeros ("0" for zero)
---@field exp10 integer
---@field exp2 integer 0, or 10..60 for Ki..Ei

---@class cozygpu.quantity
local quantity = {}

---Parses `q`: a quantity string, or a Lua integer as JSON may carry one.
---Returns the parts, or nil and 'invalid quantity "<q>"' (no digit, or
---not the grammar), 'invalid quantity "<q>": unknown suffix "<s>"',
---'invalid quantity "<q>": the exponent is beyond int64' or "must be a
---quantity string" (for a float or any other type).
---@param q string|integer
---@return cozygpu.ParsedQuantity|nil
---@return string? err
function quantity.parse(q) end

---`q` as an integer, what resource.Quantity's Value() gives where that is
---defined ("2" → 2, "2k" → 2000, "1e3" → 1000, "0.5Ki" → 512, "1000m" → 1,
---"1E" → 10^18, "9223372036854775807" → itself, "-1" → -1,
---"0.9999999999" → 1 as parsing rounds to 1n). Beyond int64: a binary
---value is capped at ±(2^63-1) as Kubernetes caps it ("8Ei", "100Ei" →
---math.maxinteger); a decimal one saturates to math.maxinteger or
---math.mininteger ("1e100", "9223372036854775808"). Returns nil and a
---message for a value that is not a quantity (as `parse`) or not whole
---('<q> is not a whole number', e.g. "500m", "1.5", where Value() would
---round up).
---@param q string|integer
---@return integer|nil
---@return string? err
function quantity.to_integer(q) end

---`a + b` for integer counts, saturating at math.maxinteger and
---math.mininteger instead of wrapping around.
---@param a integer
---@param b integer
---@return integer
function quantity.add(a, b) end

return quantity
