-- The table-driven C checks of the base helpers (spec/core/base_check.c:
-- base64 against RFC 4648 §10 and Go's StdEncoding, UTF-8 against RFC 3629,
-- buffer ceilings, array growth, capped file reads, sorted listings),
-- compiled and run under ASan/UBSan by spec/core/run-base-check.sh.
describe("base helpers C checks", function()
  it("pass under the sanitizers", function()
    local log = os.tmpname()
    local ran = os.execute("env -u LD_PRELOAD sh spec/core/run-base-check.sh >" .. H.q(log) .. " 2>&1")
    local out = H.read(log) or ""
    os.remove(log)
    assert.is_true(ran == true, out)
    assert.matches("%d+ passed, 0 failed\n$", out)
  end)
end)
