--- cozygpu.quantity — Kubernetes resource quantities
--- (k8s.io/apimachinery/pkg/api/resource, Quantity: `<signedNumber><suffix>`,
--- suffix a binary SI (Ki..Ei), decimal SI (n, u, m, "", k, M, G, T, P, E)
--- or decimal exponent (e/E followed by a signed integer)).
---
--- GPUs are whole devices, so the one conversion offered is to an exact
--- integer; a quantity that is not a whole number is an error.
local M = {}

local DECIMAL = { n = -9, u = -6, m = -3, [""] = 0, k = 3, M = 6, G = 9, T = 12, P = 15, E = 18 }
local BINARY = { Ki = 10, Mi = 20, Gi = 30, Ti = 40, Pi = 50, Ei = 60 }
local MAX = math.maxinteger

--- Parses `q` (a string, or an integer as JSON may carry it).
--- Returns {negative=bool, digits=string, exp10=int, exp2=int}, meaning
--- ±digits × 10^exp10 × 2^exp2, or nil and a message.
function M.parse(q)
  if math.type(q) == "integer" then
    return { negative = q < 0, digits = tostring(q < 0 and -q or q), exp10 = 0, exp2 = 0 }
  end
  if type(q) ~= "string" then return nil, "must be a quantity string" end
  local sign, int, frac, suffix = q:match("^([+-]?)(%d*)%.?(%d*)(.*)$")
  if not sign or (int == "" and frac == "") then return nil, ("invalid quantity %q"):format(q) end
  if q:find("%.") and not q:match("^[+-]?%d*%.%d*") then return nil, ("invalid quantity %q"):format(q) end
  local exp10, exp2 = -#frac, 0
  if DECIMAL[suffix] then
    exp10 = exp10 + DECIMAL[suffix]
  elseif BINARY[suffix] then
    exp2 = BINARY[suffix]
  else
    local e = suffix:match("^[eE]([+-]?%d+)$")
    if not e then return nil, ("invalid quantity %q: unknown suffix %q"):format(q, suffix) end
    exp10 = exp10 + tonumber(e)
  end
  local digits = (int .. frac):gsub("^0+", "")
  if digits == "" then digits = "0" end
  return { negative = sign == "-", digits = digits, exp10 = exp10, exp2 = exp2 }
end

--- Converts `q` to an exact integer. Returns the integer, or nil and a
--- message: "invalid quantity", "must be a whole number" (e.g. "500m",
--- "1.5"), "too large".
--- @param q string|integer
--- @return integer|nil, string?
function M.to_integer(q)
  local p, err = M.parse(q)
  if not p then return nil, err end
  local digits, exp10 = p.digits, p.exp10
  -- drop trailing zeros into the exponent, then any negative exponent must
  -- divide out exactly
  while exp10 < 0 and #digits > 1 and digits:sub(-1) == "0" do
    digits, exp10 = digits:sub(1, -2), exp10 + 1
  end
  if digits == "0" then return 0 end
  if exp10 < 0 then
    -- a binary multiplier can still make it whole (e.g. 0.5Ki = 512)
    local n = tonumber(digits)
    if math.type(n) ~= "integer" then return nil, "too large" end
    local den = 10 ^ -exp10
    local v = n * (2 ^ p.exp2) / den
    if v ~= math.floor(v) then return nil, ("%s is not a whole number"):format(tostring(q)) end
    if v > 2 ^ 53 then return nil, "too large" end
    v = math.tointeger(v)
    return p.negative and -v or v
  end
  if #digits + exp10 > 18 then return nil, "too large" end
  local n = math.tointeger(tonumber(digits))
  if not n then return nil, "too large" end
  for _ = 1, exp10 do n = n * 10 end
  for _ = 1, p.exp2 do
    if n > MAX // 2 then return nil, "too large" end
    n = n * 2
  end
  return p.negative and -n or n
end

return M
