-- The binder's rules (DESIGN.md §6, decision 0020) as C checks of the state
-- machine (spec/core/binder_rules_check.c: sets on one node, Lost before new
-- orders without head-of-line blocking, keeping a node, cordon Move/Stay,
-- NotReady and back, leaving Attached, deleting a pending VMI so its set can
-- move, class being deleted, no overcommit across a leader change, budgets,
-- the chooser hook, and the seeded random run whose incremental passes must
-- equal a full-pass twin after every step), compiled and run under ASan/UBSan by
-- spec/core/run-binder-rules-check.sh.
describe("binder rules C checks", function()
  it("pass under the sanitizers", function()
    H.sanitized_check("spec/core/run-binder-rules-check.sh")
  end)
end)
