---@meta
-- cozygpu.quantity — Kubernetes resource quantities
-- (lua/cozygpu/quantity.lua).
--
-- Source: k8s.io/apimachinery/pkg/api/resource, Quantity
-- (`<signedNumber><suffix>`; suffix binary Ki..Ei, decimal n u m "" k M G
-- T P E, or an exponent e/E<integer>). GPUs are whole devices, so the one
-- conversion offered is to an exact integer.
--
-- Neither function raises: a bad value returns nil and a message.

---±digits × 10^exp10 × 2^exp2.
---@class cozygpu.ParsedQuantity
---@field negative boolean
---@field digits string decimal digits without leading zeros ("0" for zero)
---@field exp10 integer
---@field exp2 integer 0, or 10..60 for Ki..Ei

---@class cozygpu.quantity
local quantity = {}

---Parses `q`: a quantity string, or a Lua integer as JSON may carry one.
---Returns the parts, or nil and 'invalid quantity "<q>"', 'invalid
---quantity "<q>": unknown suffix "<s>"' or "must be a quantity string"
---(for a float or any other type).
---@param q string|integer
---@return cozygpu.ParsedQuantity|nil
---@return string? err
function quantity.parse(q) end

---`q` as an exact integer ("2" → 2, "2k" → 2000, "1e3" → 1000, "0.5Ki"
---→ 512, "1000m" → 1, "-1" → -1). Returns nil and a message for a value
---that is not a quantity (as `parse`), not whole ('<q> is not a whole
---number', e.g. "500m", "1.5"), or beyond what it converts exactly ("too
---large"; conservative: a decimal value from 10^18 up, a value written
---with a fraction or a sub-unit suffix from 2^53 up).
---@param q string|integer
---@return integer|nil
---@return string? err
function quantity.to_integer(q) end

return quantity
