-- The table-driven C checks of the base helpers (spec/core/base_check.c:
-- base64 against RFC 4648 §10 and Go's StdEncoding, UTF-8 against RFC 3629,
-- buffer ceilings, array growth, capped file reads, sorted listings, the CPUs
-- available under a cgroup v2 cpu.max quota),
-- compiled and run under ASan/UBSan by spec/core/run-base-check.sh.
describe("base helpers C checks", function()
  it("pass under the sanitizers", function()
    H.sanitized_check("spec/core/run-base-check.sh")
  end)
end)
