-- The editor stubs (lua/meta/) against what they describe: every stubbed
-- function exists in the real module with the same parameter names, and
-- every public function of a module has a stub. Reads lua/meta/ and
-- lua/cozygpu/ by relative path: run from the repository root, as the
-- Makefile does.

-- Public functions deliberately left without a stub, by "<stub table>.<name>":
-- docs/policy-api.md, "functions not listed in the Reference belong to the
-- runtime and may change".
local OMIT = {
  ["jsonpatch.apply_shared"] = true, -- runtime.admission applies each rule's patch with it
  ["cluster.new"] = true, -- builds the view; the runtime does, a policy never (stub: the view only)
}
-- Library modules without a stub file of their own.
local NO_STUB = {
  policy = true, -- its rule, deny and warn are the globals of lua/meta/cozygpu.lua
}

-- Parameter names of a Lua function, "..." last when it is vararg; nil for
-- a C function (it has none).
local function params(fn)
  local info = debug.getinfo(fn, "Su")
  if info.what == "C" then return nil end
  local p = {}
  for i = 1, info.nparams do p[i] = (debug.getlocal(fn, i)) end
  if info.isvararg then p[#p + 1] = "..." end
  return p
end

--- Checks stub text `text` (named `file` in messages) against `targets`:
--- the real table behind each table name the stub uses ("_G" for its
--- globals). Stubs are one line each: `function t.f(a, b) end`,
--- `function T:m(a) end`, `function g(a) end`, `g = require "mod"`.
--- A `:` method's real first parameter is the receiver: self, or _ where
--- the real method ignores it (most of the cluster view's). Returns the
--- problems found, sorted; empty when the stub is honest.
local function check(file, text, targets, omit)
  local problems, stubbed = {}, {}
  local function problem(fmt, ...) problems[#problems + 1] = file .. ": " .. fmt:format(...) end
  local function mark(tbl, name) stubbed[tbl] = stubbed[tbl] or {}; stubbed[tbl][name] = true end
  for line in text:gmatch("[^\n]+") do
    local tbl, sep, name, plist = line:match("^function ([%w_]+)([%.:])([%w_]+)%(([^)]*)%)")
    if not tbl then
      name, plist = line:match("^function ([%w_]+)%(([^)]*)%)")
      tbl, sep = "_G", "."
    end
    local global, mod = line:match('^([%w_]+)%s*=%s*require%s*%(?%s*"([%w_.]+)"')
    if name then
      mark(tbl, name)
      local label = (tbl == "_G" and "" or tbl .. sep) .. name
      local real = targets[tbl] and targets[tbl][name]
      if not targets[tbl] then problem("%s: no real table %q to check against", label, tbl)
      elseif type(real) ~= "function" then
        problem("%s: the real one is %s, not a function", label, type(real))
      else
        local want, have = params(real), {}
        for x in plist:gmatch("[^,%s]+") do have[#have + 1] = x end
        if want and sep == ":" then
          local recv = table.remove(want, 1)
          if recv ~= "self" and recv ~= "_" then
            problem("%s: a method in the stub, but the real first parameter is %s, not self", label, tostring(recv))
          end
        end
        if want and table.concat(want, ", ") ~= table.concat(have, ", ") then
          problem("%s: parameters (%s) in the stub, (%s) in the module", label,
            table.concat(have, ", "), table.concat(want, ", "))
        end
      end
    elseif global then
      mark("_G", global)
      local ok, m = pcall(require, mod)
      if not ok or (targets._G or {})[global] ~= m then
        problem("%s: the real global is not require %q", global, mod)
      end
    end
  end
  -- the other way: what the module has and the stub lacks (functions; for
  -- the globals, every value)
  for tbl, real in pairs(targets) do
    for k, v in pairs(real) do
      if type(k) == "string" and k:sub(1, 1) ~= "_" and (type(v) == "function" or tbl == "_G")
        and not (stubbed[tbl] or {})[k] and not (omit or {})[tbl .. "." .. k] then
        problem("%s%s: in the module, but no stub", tbl == "_G" and "" or tbl .. ".", k)
      end
    end
  end
  table.sort(problems)
  return problems
end

local function ls(dir) -- module names of the .lua files in `dir`
  local out, p = {}, assert(io.popen("ls " .. dir))
  for f in p:lines() do out[#out + 1] = f:match("^(.*)%.lua$") end
  p:close()
  return out
end

local function assert_honest(problems) assert(#problems == 0, "\n" .. table.concat(problems, "\n")) end

-- The real tables behind the tables a stub file names.
local function targets_for(mod, text)
  if mod == "cluster" then -- the stub documents the view the module builds
    return { Cluster = require("cozygpu.cluster").new({}, {}), cluster = require "cozygpu.cluster" }
  end
  local t = { [assert(text:match("\nreturn ([%w_]+)"), "no `return <table>`")] = require("cozygpu." .. mod) }
  if mod == "jsonpatch" then t.Patch = debug.getmetatable(t.jsonpatch.new()).__index end
  return t
end

describe("editor stubs (lua/meta/)", function()
  for _, mod in ipairs(ls("lua/meta/cozygpu")) do
    local file = "lua/meta/cozygpu/" .. mod .. ".lua"
    it(file .. " matches cozygpu." .. mod, function()
      local text = H.read(file)
      assert_honest(check(file, text, targets_for(mod, text), OMIT))
    end)
  end

  it("lua/meta/cozygpu.lua matches the globals the runtime gives every policy", function()
    local env = {}
    require("runtime.admission").load { base = env, policy_files = {} }
    assert_honest(check("lua/meta/cozygpu.lua", H.read("lua/meta/cozygpu.lua"), { _G = env }, OMIT))
  end)

  it("every library module has a stub file", function()
    local stubs = {}
    for _, m in ipairs(ls("lua/meta/cozygpu")) do stubs[m] = true end
    for _, m in ipairs(ls("lua/cozygpu")) do
      assert(stubs[m] or NO_STUB[m], "lua/cozygpu/" .. m .. ".lua has no stub lua/meta/cozygpu/" .. m .. ".lua")
    end
  end)

  it("every allowed omission is still a function of its module (the list does not go stale)", function()
    for k in pairs(OMIT) do
      local mod, name = k:match("^(.-)%.(.*)$")
      assert(type(require("cozygpu." .. mod)[name]) == "function", "OMIT lists " .. k .. ", which cozygpu." .. mod .. " no longer has")
    end
  end)

  it("the checker reports a wrong parameter name, and only that", function()
    local stub = "local m = {}\n---@param a any\nfunction m.f(a, wrong) end\nreturn m\n"
    local real = { f = function(a, b) return a, b end }
    assert.are.same({ "fake.lua: m.f: parameters (a, wrong) in the stub, (a, b) in the module" },
      check("fake.lua", stub, { m = real }))
  end)

  it("the checker reports missing functions, missing stubs and a method that is not one", function()
    local stub = "function m.gone() end\nfunction M:len() end\nx = require \"cozygpu.object\"\n"
    local real = { extra = function() end, _private = function() end }
    assert.are.same({
      "fake.lua: M:len: a method in the stub, but the real first parameter is nil, not self",
      "fake.lua: extra: in the module, but no stub",
      "fake.lua: m.extra: in the module, but no stub",
      "fake.lua: m.gone: the real one is nil, not a function",
      "fake.lua: x: the real global is not require \"cozygpu.object\"",
    }, check("fake.lua", stub, { m = real, M = { len = function() end }, _G = { extra = print } }))
  end)
end)
