-- The engine's string matcher (core/engine/pattern.c, decision 0016)
-- against Lua 5.4's own string library, which is the oracle here: busted
-- runs under real Lua. Results (values and their integer/float kind) and
-- error messages must be equal, over every feature of the pattern language
-- (manual §6.4.1) and of find, match, gmatch and gsub (§6.4). Then the
-- hostile case of decision 0016: one pattern call inside a policy is
-- stopped by the instruction budget and by the review deadline.
local core = H.core
local bounded = core.pattern

-- Calls `fn` from a local of the same name for both libraries, so that an
-- argument error names the function alike ("bad argument #1 to 'fn'").
local function call(fn, ...)
  local r = table.pack(fn(...))
  return r
end

local function gmatch_all(fn, ...)
  local it = fn(...)
  local out = {}
  while #out < 200 do
    local r = table.pack(it())
    if r[1] == nil then break end
    out[#out + 1] = r
  end
  return out
end

local function show(v)
  if type(v) == "table" then
    local parts = {}
    for i = 1, (v.n or #v) do parts[#parts + 1] = show(v[i]) end
    return "{" .. table.concat(parts, ", ") .. "}"
  elseif math.type(v) == "float" then
    return ("%.17g(float)"):format(v)
  elseif type(v) == "string" then
    return ("%q"):format(v)
  end
  return tostring(v)
end

local compared = 0

-- Runs `how` (call or gmatch_all) with the real and the bounded function
-- named `name`, and returns nil when both agree, else a description.
local function differ(how, name, ...)
  compared = compared + 1
  local ok1, r1 = pcall(how, string[name], ...)
  local ok2, r2 = pcall(how, bounded[name], ...)
  local a, b = show(ok1) .. " " .. show(r1), show(ok2) .. " " .. show(r2)
  if a ~= b then
    local args = table.pack(...)
    return ("%s(%s):\n  lua:     %s\n  bounded: %s"):format(name, show(args), a, b)
  end
end

local subjects = {
  "", "a", "abc", "aaa", "aaab", "hello world", "  key = value  ", "THE (quick) fox", "[[x]]", "a.b.c",
  "x=1, y=22, z=333", "f(a(b)c)d", "%d%%", "\195\188ber \195\177", "\0a\0b", "line1\nline2\n", "abcabcabc",
  "aXbXc", "  ", "1.5e10", "((()))", "ab)(cd", "THE (quick) brown fox jumps over the lazy dog 12345",
  "x$y^z", "-+*?", "\t\r\v\f !~\127\128\255",
}

local patterns = {
  -- plain characters, '.', anchors
  "", "a", "b", "ab", "abc", "z", ".", "..", "^a", "^", "$", "^$", "a$", "c$", "^abc$", "^.", ".$", "a$b", "$a",
  "^^a", "a^", "%$", "[$^]", "x$y", "^x$y", "\0", "%z", "a\0",
  -- quantifiers
  "a*", "a+", "a-", "a?", "a-b", "a*b", "a+b", "a?b", "a?a?a?b", ".-", ".*", ".+", ".?", "^.*$", "^.-$",
  "[%w_]*", "%d*", "%d?%d", "b*", "x*$", "^a-", "^a-$", ".-b", ".*b", "*", "+", "?", "-", "a**", "a*+",
  -- classes
  "%a+", "%A+", "%c", "%C+", "%d+", "%D+", "%g+", "%G", "%l+", "%L+", "%p+", "%P+", "%s+", "%S+",
  "%u+", "%U+", "%w+", "%W+", "%x+", "%X+", "%.", "%%", "%(", "%)", "%[", "%]", "%-", "%*", "%?", "%^",
  "%e", "%Q", "%_",
  -- sets
  "[abc]", "[^abc]", "[a-c]+", "[%a_][%w_]*", "[%d.]+", "[]]", "[^]]+", "[a-]", "[-a]", "[%]]", "[a%-z]+",
  "[^%s]+", "[.]", "[%w%p]+", "[z-a]", "[^]", "[]", "[^a-z%d]", "[%]%[]+", "[a-c-e]", "[%a-z]", "[\0-\31]",
  "[\128-\255]+", "[%^]", "[^^]", "[^%^a]+",
  -- captures
  "(.-)", "(.*)", "(a*(.)%w(%s*))", "()", "()a()", "(a)(b)(c)", "(%w+)=(%w+)", "(%w+) *= *(%w+)",
  "%s*(.-)%s*$", "^%s*(.-)%s*$", "(h)(e)(l)(l)(o)", "(()a)", "((a)(b))", "(a)()", "(x*)", "()()",
  "(%d+)%.?(%d*)", "(\0)",
  -- back-references
  "(.)%1", "(a)%1", "((a)%2)", "(%a)(%a)%2%1", "(.)(.)%2", "()%1", "(a*)%1", "([%a])%1+",
  -- %b and %f
  "%bxy", "%b()", "%b[]", "%b))", "%baa", "%b()%b()", "(%b())", "%f[%w]%w+", "%f[%W]", "%f[%a]",
  "%f[%z]", "%f[^%z]", "%f[%l]%a", "%f[%s]", "%f[^a]", "%f[a]", "%f[%d]%d+%f[%D]", "%f[]]", "%f[%w]",
  -- malformed (errors are raised when the matcher reaches the item)
  "%", "a%", "[a", "[^", "[", "[]", "[%", "[a%]", "[^]", "%f", "%fa", "%f[a", "%b", "%bx", "(", "(a",
  ")", "a)", "%1", "(a)%2", "(a%1)", "%0", "(()", "(a))", "x[", "a(", "%9", "b%",
  ("(a)"):rep(33), ("()"):rep(32), ("()"):rep(33), ("(a?)"):rep(20),
  ("a?"):rep(150), ("a?"):rep(199), ("a?"):rep(200), ("a?"):rep(201), ("a?"):rep(260),
  ("(.-)"):rep(3) .. "c", ("a-"):rep(5) .. "b",
}

local long_a = ("a"):rep(260)

describe("the bounded matcher agrees with Lua 5.4's string library", function()
  local function check_pattern(p)
    local failures = {}
    local function note(d) if d and #failures < 10 then failures[#failures + 1] = d end end
    local subj = { table.unpack(subjects) }
    if p:find("a?", 1, true) then subj[#subj + 1] = long_a end
    for _, s in ipairs(subj) do
      note(differ(call, "find", s, p))
      note(differ(call, "find", s, p, 2))
      note(differ(call, "find", s, p, -3))
      note(differ(call, "find", s, p, #s + 1))
      note(differ(call, "find", s, p, 1, true))
      note(differ(call, "match", s, p))
      note(differ(call, "match", s, p, -2))
      note(differ(gmatch_all, "gmatch", s, p))
      note(differ(gmatch_all, "gmatch", s, p, 3))
      note(differ(call, "gsub", s, p, "<%0>"))
      note(differ(call, "gsub", s, p, "[%1]", 2))
      note(differ(call, "gsub", s, p, function(...) return table.concat({ ... }, "|") .. ";" end))
      note(differ(call, "gsub", s, p, { a = "A", abc = 1, hello = "HI", [""] = "E", b = false }))
    end
    assert(#failures == 0, table.concat(failures, "\n"))
  end
  for i, p in ipairs(patterns) do
    it(("pattern %d %s"):format(i, show(p):sub(1, 60)), function() check_pattern(p) end)
  end

  it("string.find: init beyond the length, negative, zero; plain; no specials", function()
    local failures = {}
    local function note(d) if d then failures[#failures + 1] = d end end
    for _, s in ipairs { "", "abc", "hello hello", "a+b" } do
      for _, init in ipairs { 1, 2, 0, -1, -2, -3, -100, #s, #s + 1, #s + 2, 100, math.mininteger, math.maxinteger } do
        for _, p in ipairs { "", "l", "lo", "a+b", "+", "%a", "^h", "o$", "h.", "llo hello x" } do
          note(differ(call, "find", s, p, init))
          note(differ(call, "find", s, p, init, true))
          note(differ(call, "find", s, p, init, false))
          note(differ(call, "find", s, p, init, 0))
          note(differ(call, "match", s, p, init))
          note(differ(gmatch_all, "gmatch", s, p, init))
        end
      end
    end
    assert(#failures == 0, table.concat(failures, "\n"))
  end)

  it("string.gsub: replacement strings, tables, functions, counts", function()
    local failures = {}
    local function note(d) if d then failures[#failures + 1] = d end end
    local repls = {
      "%0", "<%1>", "%2", "%%", "x%", "%a", "%1%1", "[%9]", "", "%%%1%%", 5, 2.5, "%1()",
      function(a) return a and a:upper() end, function() return nil end, function() return false end,
      function() return {} end, function() return 7 end, function() return 1.5 end, function() return true end,
      function(...) return select("#", ...) end,
      { a = "A", hello = "HELLO", [""] = "E", x = false, b = {}, ["1"] = "one", l = 3 },
      setmetatable({}, { __index = function(_, k) return "<" .. k .. ">" end }),
      nil, true,
    }
    local pats = { "", "a", "l+", "(l)(l)", "%w+", "(%w+)", "()", "(h)()", "^h", "^", "$", "x*", "(%w)(%w*)", "%s" }
    for _, s in ipairs { "", "hello world", "abc", "a b c", "aaa", "1 22 333" } do
      for _, p in ipairs(pats) do
        for ri = 1, #repls + 2 do
          local r = repls[ri]
          for _, n in ipairs { "none", 0, 1, 2, -1, 100, 1.5, "2", "x" } do
            if n == "none" then note(differ(call, "gsub", s, p, r))
            else note(differ(call, "gsub", s, p, r, n)) end
          end
        end
      end
    end
    assert(#failures == 0, table.concat(failures, "\n"))
  end)

  it("string.gmatch: anchors are literal, empty matches, init", function()
    local failures = {}
    local function note(d) if d then failures[#failures + 1] = d end end
    for _, s in ipairs { "", "abc", "^abc^", "a,b,,c", "one two  three", "aaa" } do
      for _, p in ipairs { "", "^", "^a", "a*", "[^,]*", "()", "(%w+)", "%w*", ".-", "$", "a$", "x?" } do
        for _, init in ipairs { 1, 2, 0, -1, -2, -100, 4, 7, 100 } do
          note(differ(gmatch_all, "gmatch", s, p, init))
        end
      end
    end
    assert(#failures == 0, table.concat(failures, "\n"))
  end)

  it("checks its arguments as Lua does", function()
    local failures = {}
    local function note(d) if d then failures[#failures + 1] = d end end
    local odd = { nil, true, {}, 12, 1.5, "x" }
    for _, name in ipairs { "find", "match", "gmatch", "gsub" } do
      local how = name == "gmatch" and gmatch_all or call
      for i = 1, #odd + 1 do
        for j = 1, #odd + 1 do
          note(differ(how, name, odd[i], odd[j]))
          note(differ(how, name, "12.5x", odd[j], odd[i]))
          note(differ(how, name, odd[i], "%d", "y", odd[j]))
        end
      end
      note(differ(how, name, 12345, 3))
      note(differ(how, name, 12345, 3, 2.0))
      note(differ(how, name, "abc", "b", "2"))
    end
    assert(#failures == 0, table.concat(failures, "\n"))
  end)

  it("compared many cases", function()
    -- runs last in this file: the count of the comparisons above
    assert.is_true(compared > 10000, tostring(compared))
    print(("\npattern_spec: %d comparisons"):format(compared))
  end)
end)

-- ---- the hostile case of decision 0016 -----------------------------------


local bundle = H.bundle
local pod_request = H.pod_request
local pod_rule = H.pod_rule

local hostile = [[
  local s = ("ab"):rep(2500)
  local p = ("(.-)"):rep(30) .. "c"
  ]]

local function now()
  local f = io.popen("date +%s.%N")
  local t = tonumber(f:read("l"))
  f:close()
  return t
end

describe("one pattern call inside a policy", function()
  local cases = {
    { "string.find", hostile .. "string.find(s, p) return deny('finished')" },
    { "a method call", hostile .. "s:match(p) return deny('finished')" },
    { "gsub", hostile .. "s:gsub(p, '') return deny('finished')" },
    { "gmatch", hostile .. "for _ in s:gmatch(p) do end return deny('finished')" },
    { "retries under pcall", hostile .. "for i = 1, 1e9 do pcall(string.find, s, p) end return deny('finished')" },
    { "retries in a pcall loop without Lua in between",
      hostile .. "local f = string.find for i = 1, 1e9 do pcall(f, s, p) pcall(f, s, p) end return deny('finished')" },
  }
  for _, c in ipairs(cases) do
    it(("is stopped by the instruction budget: %s"):format(c[1]), function()
      local e = assert(core.engine { policies = bundle { ["p.lua"] = pod_rule("site/hostile", c[2]) }, instructions = 200000 })
      local t0 = now()
      local resp, outcome, rule = e:review(pod_request())
      local took = now() - t0
      assert.equal("budget", outcome)
      assert.equal("site/hostile", rule)
      assert.equal(500, resp.status.code)
      assert.is_true(took < 1, ("took %.3f s"):format(took))
      print(("\nhostile pattern, %s: budget after %.3f s"):format(c[1], took))
      e:close()
    end)
  end

  it("is stopped by the review deadline", function()
    local e = assert(core.engine { policies = bundle { ["p.lua"] = pod_rule("site/hostile", cases[1][2]) },
      instructions = 1000000000000 })
    e:set_deadline(300)
    local t0 = now()
    local resp, outcome, rule = e:review(pod_request())
    local took = now() - t0
    assert.equal("deadline", outcome)
    assert.equal("site/hostile", rule)
    assert.matches("did not finish before the review deadline", resp.status.message, 1, true)
    assert.is_true(took < 1, ("took %.3f s"):format(took))
    print(("\nhostile pattern: deadline (300 ms) after %.3f s"):format(took))
    e:set_deadline(nil)
    e:close()
  end)

  it("leaves ordinary matching alone, also as methods on strings", function()
    local e = assert(core.engine { policies = bundle { ["p.lua"] = pod_rule("site/ok",
      "local a, b, c = ('key = value'):match('^(%w+)%s*=%s*(%w+)$') " ..
      "local n = select(2, ('a,b,c'):gsub(',', ';')) " ..
      "local w = {} for x in string.gmatch('one two', '%a+') do w[#w + 1] = x end " ..
      "return deny(table.concat({ a, b, tostring(n), table.concat(w, '+'), tostring(('x.y'):find('.', 1, true)) }, ' '))") } })
    local resp = e:review(pod_request())
    assert.equal("key value 2 one+two 2", resp.status.message)
    e:close()
  end)
end)
