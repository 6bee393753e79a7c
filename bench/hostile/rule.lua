-- bench/hostile/rule.lua — a hoster rule with a pattern that tenant data
-- can make expensive (decision 0016): lazy captures over a tenant's
-- annotation. `make bench` adds it to the controller's bundle (as the
-- ConfigMap key bench-hostile.lua) and sends bench/hostile/review.yaml
-- back to back, so that one review thread is always busy with it while
-- the fixed-rate load runs. The engine stops each such review at its
-- instruction budget or deadline and refuses it, naming this rule.
-- Every other review passes the rule at the cost of one table lookup.
local object = require "cozygpu.object"

return rule "bench/hostile-pattern" {
  description = "bench only: a pattern whose cost a tenant's annotation decides",
  match = { kind = "VirtualMachineInstance", group = "kubevirt.io", operations = { "CREATE" } },
  validate = function(req)
    local note = object.get(req.object, "metadata", "annotations", "bench.cozygpu.io/note")
    if note == nil then return nil end
    local subject = string.rep(note, 5000 // #note + 1)
    if subject:match(string.rep("(.-)", 30) .. "c") then
      return deny("the note matched")
    end
    return nil
  end,
}
