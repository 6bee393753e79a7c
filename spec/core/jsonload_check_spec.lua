-- The fast JSON parse (core/base/jsonload.c, decision 0046) against
-- jansson's json_loadb, as C checks (spec/core/jsonload_check.c): the same
-- acceptance, value, key order and error for hand-made edge cases (duplicate
-- keys, NUL and surrogate escapes, integers and reals out of range, bad
-- UTF-8, trailing text, nesting around jansson's limit), the examples'
-- JSON, the fuzz seeds and seeded mutations of them; compiled and run under
-- ASan/UBSan by spec/core/run-jsonload-check.sh.
describe("jsonload C checks", function()
  it("answer as json_loadb does, under the sanitizers", function()
    H.sanitized_check("spec/core/run-jsonload-check.sh")
  end)
end)
