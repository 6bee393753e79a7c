-- `cozygpu` commands and subcommands (core/cli/main.c):
-- --help exits 0 with the usage on stdout, for every command and for
-- `policy`, which has a subcommand; an unknown command or subcommand is
-- named, the valid ones listed, exit 2.
local COMMANDS = { "review", "policy", "controller", "inventory", "agent", "simulate", "version" }

describe("cozygpu", function()
  for _, cmd in ipairs { "review", "policy", "policy test", "controller", "inventory", "agent", "simulate" } do
    it(cmd .. " --help exits 0 with its usage on stdout", function()
      local args = {}
      for w in cmd:gmatch("%S+") do args[#args + 1] = w end
      args[#args + 1] = "--help"
      local out, err, code = H.run(args)
      assert.are.equal(0, code, err)
      assert.matches("usage: cozygpu " .. H.pat(cmd:match("^%S+")), out)
    end)
  end

  it("--help lists every command", function()
    local out, _, code = H.run { "--help" }
    assert.are.equal(0, code)
    for _, c in ipairs(COMMANDS) do assert.matches("\n  " .. c .. " ", out) end
  end)

  it("names an unknown command and lists the valid ones, exit 2", function()
    local out, err, code = H.run { "polic" }
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.matches('unknown command "polic"', err, 1, true)
    for _, c in ipairs(COMMANDS) do assert.matches("\n  " .. c .. " ", err) end
  end)

  it("policy: names an unknown subcommand and lists the valid one, exit 2", function()
    local out, err, code = H.run { "policy", "tset", "x.yaml" }
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.matches('cozygpu policy: unknown subcommand "tset" (valid: test)', err, 1, true)
  end)

  it("policy: says that the subcommand is missing, exit 2", function()
    local out, err, code = H.run { "policy" }
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.matches("cozygpu policy: no subcommand (valid: test)", err, 1, true)
  end)
end)

-- The kinds of the controller's cluster view (core/controller/controller.c
-- cluster_kinds, named in core/kube/kube.c), which a --cluster snapshot
-- stands in for.
describe("cozygpu review --help", function()
  local function cluster_kinds()
    local kube = H.read("core/kube/kube.c")
    local kind_of = {}
    for var, kind in kube:gmatch('KUBE_(%u+) = {"[^"]*",%s*"[^"]*",%s*"[^"]*",%s*"(%w+)"') do kind_of[var] = kind end
    local list = H.read("core/controller/controller.c"):match("cluster_kinds%[%] = (%b{})")
    assert(list, "no cluster_kinds in core/controller/controller.c")
    local out = {}
    for var in list:gmatch("&KUBE_(%u+)") do out[#out + 1] = assert(kind_of[var], var) end
    return out
  end

  it("names every kind the controller's cluster view holds", function()
    local help, _, code = H.run { "review", "--help" }
    assert.are.equal(0, code)
    local text = help:gsub("%s+", " ")
    local kinds = cluster_kinds()
    assert.is_true(#kinds >= 9)
    for _, k in ipairs(kinds) do
      assert.is_truthy(text:find(k .. "e?s[,; )]") or text:find(k .. " CR"), k .. " is not in `cozygpu review --help`")
    end
  end)
end)
