-- The table-driven C checks of the binder's index (spec/core/binder_check.c:
-- packing order, no overcommit, cordoned/NotReady/pending nodes never
-- candidates, taint tolerance, sets across classes on one node, capacity
-- drops that keep bound claims, and a seeded random run against a
-- brute-force model), compiled and run under ASan/UBSan by
-- spec/core/run-binder-check.sh.
describe("binder index C checks", function()
  it("pass under the sanitizers", function()
    H.sanitized_check("spec/core/run-binder-check.sh")
  end)
end)
