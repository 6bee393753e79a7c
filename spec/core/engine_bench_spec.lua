-- The engine bench's --instructions mode (bench/engine.c; counted by
-- bench/engine-instructions.sh under callgrind, `make bench`), checked for
-- what it runs, not for its figures: every example review goes through the
-- server's engine path without a failure, and the answers it hashes are
-- those of the committed baseline (bench/engine-instructions.baseline), so
-- that the instruction counts compare the same work (issue target: the
-- answers stay the same while reviews get cheaper).
describe("the engine bench's instruction mode", function()
  local function run(args) return H.run_tool("cozygpu-engine-bench", args) end

  it("runs every example review through the engine path and answers as the baseline did", function()
    local out, code = run("--instructions --rounds 2 --cluster examples/classes --cluster examples/cluster examples/reviews")
    assert.equal(0, code, out)
    local n = 0
    for f in io.popen("ls examples/reviews"):lines() do
      if f:match("%.ya?ml$") or f:match("%.json$") then n = n + 1 end
    end
    assert.equal(("reviews %d"):format(2 * n), out:match("reviews %d+"), out)
    assert.equal("failed 0", out:match("failed %d+"), out)
    local base = H.read("bench/engine-instructions.baseline")
    local want = base:match("answers_fnv1a (%x+)")
    assert.truthy(want, "no answers_fnv1a in the baseline")
    assert.equal(want, out:match("answers%-fnv1a (%x+)"), "the answers differ from the baseline's")
    assert.equal(tonumber(base:match("answer_bytes_per_round (%d+)")) * 2, tonumber(out:match("answer%-bytes (%d+)")))
  end)
end)
