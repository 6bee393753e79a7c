-- The table-driven C checks of the YAML loader (spec/core/yamlload_check.c:
-- scalars, errors with line/column, fixtures), compiled and run under
-- ASan/UBSan by spec/core/run-yamlload-check.sh.
describe("yamlload C checks", function()
  it("pass under the sanitizers", function()
    local p = io.popen("env -u LD_PRELOAD bash spec/core/run-yamlload-check.sh " .. H.q(H.fixtures .. "/kubevirt") .. " 2>&1")
    local out = p:read("a")
    local ok = p:close()
    assert.is_true(ok, out)
    assert.matches("(%d+) passed, 0 failed", out)
  end)
end)
