-- The binder's chooser (DESIGN.md §6, docs/decisions/0020 §4 and 0024):
-- among the candidate nodes C found for a claim set (at most 32, each
-- already Ready, schedulable, without a pending layout, its GPU taints
-- tolerated, with room for every class of the set), pick the one the set
-- is bound to. A hoster replaces this file through the policies ConfigMap
-- (key binder.lua), as any policy file.
--
-- Default: pack, most-allocated first, so that whole nodes stay free for
-- large sets (DESIGN.md §6): a node already holding units of the set's
-- classes before an untouched one, then the fewest free units of those
-- classes; ties keep the order the candidates came in (the index's
-- packing order, where the node that waited longest comes first).

--- Sums a candidate's units over the set's classes: bound, free.
--- @param c table a candidate {node, classes = {[class] = {offered, bound, free}}, labels}
--- @return integer bound, integer free
local function units(c)
  local bound, free = 0, 0
  for _, u in pairs(c.classes) do
    bound = bound + u.bound
    free = free + u.free
  end
  return bound, free
end

return binder {
  description = "pack: nodes holding units of the set's classes first, then the fewest free units",
  --- Returns the position of the most-allocated candidate (see above).
  choose = function(set, candidates, cluster)
    local best, best_touched, best_free
    for i, c in ipairs(candidates) do
      local bound, free = units(c)
      local touched = bound > 0
      if best == nil or (touched and not best_touched) or (touched == best_touched and free < best_free) then
        best, best_touched, best_free = i, touched, free
      end
    end
    return best
  end,
}
