-- The one-pass review decode (core/engine/luadecode.c, decision 0049)
-- against what it replaces, cozy_json_loadb then luajson_push of the
-- request, as C checks (spec/core/luadecode_check.c): the same acceptance
-- and error, the same document but for request.object and
-- request.oldObject, the same Lua request (types, integer and float
-- subtypes, json.null, markers), the example reviews on the fast way with
-- the same answers, and seeded mutations of them; compiled and run under
-- ASan/UBSan by spec/core/run-luadecode-check.sh.
describe("review decode C checks", function()
  it("read a review as cozy_json_loadb and luajson_push do, under the sanitizers", function()
    H.sanitized_check("spec/core/run-luadecode-check.sh")
  end)
end)
