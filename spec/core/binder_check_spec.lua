-- The table-driven C checks of the binder's index (spec/core/binder_check.c:
-- packing order, no overcommit, cordoned/NotReady/pending nodes never
-- candidates, taint tolerance, sets across classes on one node, capacity
-- drops that keep bound claims, and a seeded random run against a
-- brute-force model), compiled and run under ASan/UBSan by
-- spec/core/run-binder-check.sh.
describe("binder index C checks", function()
  it("pass under the sanitizers", function()
    local log = os.tmpname()
    local ran = os.execute("env -u LD_PRELOAD sh spec/core/run-binder-check.sh >" .. H.q(log) .. " 2>&1")
    local out = H.read(log) or ""
    os.remove(log)
    assert.is_true(ran == true, out)
    assert.matches("%d+ passed, 0 failed\n$", out)
  end)
end)
