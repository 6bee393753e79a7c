--- Helpers of the simulate specs: temporary scenario and snapshot files,
--- and lookups in the JSON output of `cozygpu simulate --output json`: a step
--- holds lists `claims` ({claim = "ns/name", ...}), `vms` ({vm =
--- "ns/name", ...}) and `nodes` ({node = name, ...}).
local S = {}

local function find(list, field, value)
  for _, x in ipairs(list or {}) do
    if x[field] == value then return x end
  end
end

--- The claim row "ns/name" of a step, or nil.
function S.claim_of(step, ref) return find(step.claims, "claim", ref) end

--- The VM row "ns/name" of a step, or nil.
function S.vm_of(step, ref) return find(step.vms, "vm", ref) end

--- The node row `name` of a step, or nil.
function S.node_of(step, name) return find(step.nodes, "node", name) end

--- Writes `text` to a new temporary file ending in `ext`; returns its path.
function S.tmp(ext, text)
  local p = os.tmpname() .. ext
  H.write(p, text)
  return p
end

--- Writes `objects` as one kubectl List (JSON), as a snapshot file;
--- returns its path.
function S.write_list(objects)
  return S.tmp(".json", H.json.encode { apiVersion = "v1", kind = "List", items = H.json.array(objects),
    metadata = { resourceVersion = "" } })
end

return S
