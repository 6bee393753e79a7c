-- The binder bench (bench/binder.c) at small sizes, as a check of what it
-- verifies, not of its figures (those are `make bench-binder`'s, never a
-- timed test): the state it builds passes binder_state_verify after the
-- build and after every kind of event, and a full pass
-- (binder_reconcile_all) then finds nothing the incremental passes left
-- undone (decisions 0023, 0042); the bench exits 1 when not.
describe("the binder bench", function()
  local function run(args) return H.run_tool("cozygpu-binder-bench", args) end

  it("runs every event kind on a settled state, and a full pass then finds nothing left", function()
    local out, code = run("--seed 7 --max-nodes 100 --runs 1 --events 20 --state-max-nodes 1000 --state-events 20")
    assert.equal(0, code, out)
    for _, kind in ipairs({ "claim created", "claim deleted", "node lost", "node back", "node cordoned",
                            "node uncordoned", "capacity cut", "capacity back", "VMI ended" }) do
      assert.truthy(out:find(kind .. " [%d.]+ / [%d.]+ %(", 1), kind .. " not timed:\n" .. out)
    end
    local _, passes = out:gsub("then a full pass %(binder_reconcile_all%) finds nothing left to do", "")
    assert.equal(2, passes, out)
    -- n log n's exponent from 1k to 10k claims: log(10^4 ln 10^4 / (10^3 ln 10^3)) / ln 10 = 1 + log10(4/3)
    assert.truthy(out:find("100 %->   1000 nodes %(n log n: 1%.12%)"), out)
  end)

  it("refuses --instructions outside callgrind, exit 2", function()
    local out, code = run("--instructions")
    assert.equal(2, code, out)
    assert.truthy(out:find("valgrind %-%-tool=callgrind", 1), out)
  end)
end)
