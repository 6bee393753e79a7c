-- A hoster's binder policy (docs/decisions/0024): spread instead of pack,
-- and keep new sets off nodes the hoster marked for maintenance.
--
-- Shipped in the policies ConfigMap under the key binder.lua, it replaces
-- the default policies/binder.lua. Try it with
--   cozygpu simulate examples/scenarios/binder-spread.yaml
-- (the scenario names this directory as its `override`).
--
-- The candidates are already right for capacity, taints and readiness
-- (C checked them); this file only picks one, or none (nil: the set waits
-- this pass with reason NoNodeWithRoom).

local MAINTENANCE = "gpu.example.com/maintenance"

--- Free units of the set's classes on a candidate.
--- @param c table a candidate {node, classes = {[class] = {offered, bound, free}}, labels}
--- @return integer
local function free_units(c)
  local free = 0
  for _, u in pairs(c.classes) do free = free + u.free end
  return free
end

return binder {
  description = "spread: the node with the most free units of the set's classes; never a node in maintenance",
  --- Returns the position of the least-allocated candidate not in
  --- maintenance (ties: the order given), or nil when every one is.
  choose = function(set, candidates, cluster)
    local best, most
    for i, c in ipairs(candidates) do
      if c.labels[MAINTENANCE] ~= "true" then
        local free = free_units(c)
        if most == nil or free > most then best, most = i, free end
      end
    end
    return best
  end,
}
