-- The policies ConfigMap (deploy/21-policies-configmap.yaml) and its
-- generator deploy/gen-policies-configmap.lua (docs/decisions/0007).
-- Every value is decoded by the C loader, which reads YAML as kubectl does
-- (docs/decisions/0002), and compared byte for byte with the file.
local core = H.core
local GEN = "deploy/gen-policies-configmap.lua"
local OUT = "deploy/21-policies-configmap.yaml"
local gen = dofile(GEN)

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("rc=(%d+)\n$"))
  return out:gsub("rc=%d+\n$", ""), rc
end

local function run_gen(dir, extra)
  return sh(("lua5.4 %s %s %s"):format(GEN, extra or "", H.q(dir)))
end

local function mkfiles(files)
  local dir = H.tmpdir()
  for rel, text in pairs(files) do
    local sub = rel:match("^(.*)/[^/]+$")
    if sub then assert(os.execute("mkdir -p " .. H.q(dir .. "/" .. sub))) end
    H.write(dir .. "/" .. rel, text)
  end
  return dir
end

local function P_lines(cmd)
  local p = io.popen(cmd)
  local t = {}
  for l in p:lines() do t[#t + 1] = l end
  p:close()
  local i = 0
  return function() i = i + 1; return t[i] end
end

local function rmrf(dir) os.execute("rm -rf " .. H.q(dir)) end

-- The ConfigMap decoded from YAML text.
local function decode(text)
  local docs = assert(core.yaml(text))
  assert.are.equal(1, #docs)
  return docs[1]
end

-- The ConfigMap in `file` as kubectl itself reads it (`label --local`
-- needs no cluster; its YAML path is the one `kubectl apply` takes), or nil
-- when kubectl is not installed.
local function kubectl_read(file)
  if not os.execute("command -v kubectl >/dev/null 2>&1") then return nil end
  local out, rc = sh("kubectl label --local -o json -f " .. H.q(file) .. " cozygpu-spec=read 2>&1")
  assert.are.equal(0, rc, out)
  return assert(H.json.decode(out))
end

local function policy_files()
  local p = io.popen("find policies -type f -name '*.lua' | sort")
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

describe("the generated policies ConfigMap", function()
  it("is up to date with policies/ (else run the Makefile rule for " .. OUT .. ")", function()
    local fresh, rc = run_gen("policies")
    assert.are.equal(0, rc, fresh)
    assert.are.equal(fresh, H.read(OUT),
      OUT .. " is stale: run `lua5.4 " .. GEN .. " -o " .. OUT .. " policies`")
  end)

  it("is the ConfigMap cozygpu-policies in cozy-gpu, one key per policy file", function()
    local docs = assert(core.manifests(OUT))
    assert.are.equal(1, #docs)
    local cm = docs[1].object
    assert.are.equal("v1", cm.apiVersion)
    assert.are.equal("ConfigMap", cm.kind)
    assert.are.equal("cozygpu-policies", cm.metadata.name)
    assert.are.equal("cozy-gpu", cm.metadata.namespace)
    local files = policy_files()
    assert.is_true(#files > 0)
    local keys = {}
    for k in pairs(cm.data) do keys[#keys + 1] = k end
    table.sort(keys)
    local want = {}
    for i, f in ipairs(files) do
      local rel = f:sub(#"policies/" + 1)
      local mod = rel:match("^lib/(.*)%.lua$")
      want[i] = mod and ("lib." .. mod:gsub("/", ".") .. ".lua") or rel
    end
    table.sort(want)
    assert.are.same(want, keys)
  end)

  it("decodes (kubectl's YAML rules) to every policy file byte for byte", function()
    local cm = assert(core.manifests(OUT))[1].object
    for _, f in ipairs(policy_files()) do
      local rel = f:sub(#"policies/" + 1)
      local mod = rel:match("^lib/(.*)%.lua$")
      local key = mod and ("lib." .. mod:gsub("/", ".") .. ".lua") or rel
      assert.are.equal(H.read(f), cm.data[key], f)
    end
  end)

  it("reads back byte for byte through kubectl's own YAML decoder", function()
    local cm = kubectl_read(OUT)
    if not cm then pending("kubectl not installed") return end
    for _, f in ipairs(policy_files()) do
      local rel = f:sub(#"policies/" + 1)
      local mod = rel:match("^lib/(.*)%.lua$")
      local key = mod and ("lib." .. mod:gsub("/", ".") .. ".lua") or rel
      assert.are.equal(H.read(f), cm.data[key], f)
    end
  end)

  it("is answered the same by the engine as the bundle it was made from", function()
    -- materialise the ConfigMap as the controller does (0007): keys to
    -- files, lib.<a>.<b>.lua to lib/<a>/<b>.lua; load it as the override
    local cm = assert(core.manifests(OUT))[1].object
    local dir = H.tmpdir()
    finally(function() rmrf(dir) end)
    for k, v in pairs(cm.data) do
      local mod = k:match("^lib%.(.*)%.lua$")
      local rel = mod and ("lib/" .. mod:gsub("%.", "/") .. ".lua") or k
      local sub = rel:match("^(.*)/[^/]+$")
      if sub then assert(os.execute("mkdir -p " .. H.q(dir .. "/" .. sub))) end
      H.write(dir .. "/" .. rel, v)
    end
    local snap = { "review", "--cluster", "examples/classes", "--cluster", "examples/cluster",
      "--config", "deploy/20-config.yaml" }
    local base = { table.unpack(snap) }
    base[#base + 1] = "examples/reviews"
    local over = { table.unpack(snap) }
    over[#over + 1] = "--override"
    over[#over + 1] = dir
    over[#over + 1] = "examples/reviews"
    local o1, e1, c1 = H.run(base)
    local o2, e2, c2 = H.run(over)
    assert.are.equal(0, c1, e1)
    assert.are.equal(0, c2, e2)
    -- one answer per example review
    local n = 0
    for _ in P_lines("ls examples/reviews") do n = n + 1 end
    assert.are.equal(n, #H.json_lines(o1))
    assert.are.equal(o1, o2)
  end)
end)

describe("gen-policies-configmap: values round-trip byte-exactly", function()
  local cases = {
    ["no trailing newline"] = "return 1",
    ["one trailing newline"] = "return 1\n",
    ["two trailing newlines"] = "return 1\n\n",
    ["five trailing newlines"] = "a\n\n\n\n\n",
    ["only a newline"] = "\n",
    ["only newlines"] = "\n\n\n",
    ["leading empty lines"] = "\n\nreturn 1\n",
    ["first line indented"] = "  local x = 1\nreturn x\n",
    ["leading empty line, then indented"] = "\n   x\ny\n",
    ["spaces-only first line"] = "   \nx\n",
    ["spaces-only lines inside and at the end"] = "a\n   \n\tb\n      \n",
    ["spaces-only text"] = "   ",
    ["trailing spaces"] = "a  \nb \n",
    ["tab first"] = "\tx = 1\n",
    ["empty line, then tab"] = "\n\tx\n",
    ["tab inside"] = "x\n\ty\n\t\n",
    ["document markers and comments"] = "---\n...\n# not a comment\n--- x\n",
    ["YAML-looking content"] = "key: value\n- item\n&a *a !tag |\n>\n",
    ["quotes and backslashes"] = "s = \"a\\n\\t\" .. 'b'\n",
    ["UTF-8 text"] = "-- Grüße, 日本語, 🙂\n",
    ["long line"] = ("x"):rep(5000) .. "\n",
    ["CRLF-free Windows-ish"] = "a\n\nb",
    ["empty"] = "",
  }
  for name, text in pairs(cases) do
    it(name, function()
      local manifest = assert(gen.render({ { key = "p.lua", path = "p.lua", text = text } }, "test"))
      local cm = decode(manifest)
      assert.are.equal(text, cm.data["p.lua"])
      -- and through the file loader kubectl-style, as deployed
      local f = os.tmpname()
      finally(function() os.remove(f) end)
      H.write(f, manifest)
      assert.are.equal(text, assert(core.manifests(f))[1].object.data["p.lua"])
      local kcm = kubectl_read(f)
      if kcm then
        assert.are.equal(text, kcm.data["p.lua"], "kubectl")
      end
    end)
  end

  it("chooses the chomping indicator by trailing newlines and indents only when needed", function()
    assert.are.equal("|-", (gen.block_scalar("a")))
    assert.are.equal("|", (gen.block_scalar("a\n")))
    assert.are.equal("|+", (gen.block_scalar("a\n\n")))
    assert.are.equal("|2", (gen.block_scalar(" a\n")))
    assert.are.equal("|2-", (gen.block_scalar("\n a")))
    assert.are.equal("|+", (gen.block_scalar("\n")))
    assert.are.equal("|2", (gen.block_scalar("\tx\n")))
    assert.are.equal("|", (gen.block_scalar("x\n\ty\n")))
  end)

  it("keeps many keys apart, in sorted order", function()
    local files = {
      { key = "b.lua", path = "b", text = "b\n\n\n" },
      { key = "a.lua", path = "a", text = " a" },
      { key = "c.lua", path = "c", text = "" },
    }
    table.sort(files, function(x, y) return x.key < y.key end)
    local cm = decode(assert(gen.render(files, "t")))
    assert.are.same({ ["a.lua"] = " a", ["b.lua"] = "b\n\n\n", ["c.lua"] = "" }, cm.data)
  end)
end)

describe("gen-policies-configmap: refusals name the file", function()
  local bad = {
    ["a control character"] = { "x = '\7'\n", "line 1, byte 6: character U%+0007" },
    ["a carriage return"] = { "a\r\nb\n", "line 1, byte 2: character U%+000D" },
    ["invalid UTF-8"] = { "ok\n\255\n", "line 2, byte 4: not valid UTF%-8" },
    ["NEL"] = { "a\u{85}b", "line 1, byte 2: character U%+0085" },
    ["LINE SEPARATOR"] = { "a\n\u{2028}b", "line 2, byte 3: character U%+2028" },
    ["a BOM"] = { "\u{FEFF}return 1\n", "line 1, byte 1: character U%+FEFF" },
    ["DEL"] = { "a\127", "line 1, byte 2: character U%+007F" },
  }
  for name, c in pairs(bad) do
    it(name, function()
      local dir = mkfiles { ["good.lua"] = "return 1\n", ["bad.lua"] = c[1] }
      finally(function() rmrf(dir) end)
      local out, rc = run_gen(dir)
      assert.are.equal(1, rc, out)
      assert.matches(H.pat(dir) .. "/bad.lua: " .. c[2], out, 1, false)
    end)
  end

  it("a file name that is not a valid ConfigMap key", function()
    local dir = mkfiles { ["bad name.lua"] = "return 1\n" }
    finally(function() rmrf(dir) end)
    local out, rc = run_gen(dir)
    assert.are.equal(1, rc, out)
    assert.matches("bad name.lua: key \"bad name.lua\": must consist of alphanumeric characters", out, 1, true)
  end)

  it("a policy file that takes the lib. prefix", function()
    local dir = mkfiles { ["lib.site.lua"] = "return 1\n" }
    finally(function() rmrf(dir) end)
    local out, rc = run_gen(dir)
    assert.are.equal(1, rc, out)
    assert.matches("reserved for lib/ modules", out, 1, true)
  end)

  it("a lib/ module whose path has a '.' in a component", function()
    local dir = mkfiles { ["p.lua"] = "return 1\n", ["lib/site.v2/x.lua"] = "return {}\n" }
    finally(function() rmrf(dir) end)
    local out, rc = run_gen(dir)
    assert.are.equal(1, rc, out)
    assert.matches("module path component \"site.v2\"", out, 1, true)
  end)

  it("a bundle over the 1 MiB a ConfigMap may hold", function()
    local big = ("-- " .. ("x"):rep(1020) .. "\n"):rep(1100)
    local dir = mkfiles { ["big.lua"] = big }
    finally(function() rmrf(dir) end)
    local out, rc = run_gen(dir)
    assert.are.equal(1, rc, out)
    assert.matches("over the 1048576 a ConfigMap may hold", out, 1, true)
  end)

  it("a directory without policies", function()
    local dir = mkfiles { ["README.md"] = "x\n" }
    finally(function() rmrf(dir) end)
    local out, rc = run_gen(dir)
    assert.are.equal(1, rc, out)
    assert.matches("no policy files", out, 1, true)
  end)

  it("leaves no partial output file behind on failure", function()
    local dir = mkfiles { ["bad.lua"] = "\7" }
    local out_file = os.tmpname()
    os.remove(out_file)
    finally(function() rmrf(dir) os.remove(out_file) end)
    local out, rc = run_gen(dir, "-o " .. H.q(out_file))
    assert.are.equal(1, rc, out)
    assert.is_nil(io.open(out_file, "rb"))
    assert.is_nil(io.open(out_file .. ".tmp", "rb"))
  end)
end)

describe("gen-policies-configmap: the bundle's own tests", function()
  it("ships DIR/NAME.test.yaml under its name (the reload gate runs it) and nothing deeper", function()
    local dir = mkfiles {
      ["site.lua"] = 'return rule "site/x" { match = { kind = "Pod" }, validate = function() end }\n',
      ["site.test.yaml"] = "cases: []\n",
      ["tests/other.test.yaml"] = "cases: []\n",
    }
    finally(function() rmrf(dir) end)
    local cm = decode(assert(gen.generate(dir)))
    assert.are.equal("cases: []\n", cm.data["site.test.yaml"])
    assert.is_nil(cm.data["other.test.yaml"])
    assert.is_nil(cm.data["tests.other.test.yaml"])
  end)
end)

describe("gen-policies-configmap: lib/ modules", function()
  it("ships lib/a/b.lua as lib.a.b.lua, and the engine requires it from the override", function()
    local dir = mkfiles {
      ["site-tier.lua"] = table.concat({
        'local tier = require "site.tier"',
        'return rule "site/tier" {',
        '  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },',
        '  validate = function(req, cluster)',
        '    if gpu.count(req.object, cluster) > 0 then return deny(tier.message) end',
        '  end,',
        '}',
      }, "\n") .. "\n",
      ["lib/site/tier.lua"] = 'return { message = "GPU VMs need a billing tier" }\n',
      ["notes.txt"] = "not shipped\n",
    }
    finally(function() rmrf(dir) end)
    local out, rc = run_gen(dir)
    assert.are.equal(0, rc, out)
    assert.matches("notes.txt is not a policy, a NAME.test.yaml or a lib/ module", out, 1, true)
    local manifest = assert(gen.generate(dir))
    local cm = decode(manifest)
    assert.are.same({ "lib.site.tier.lua", "site-tier.lua" }, (function()
      local k = {}
      for key in pairs(cm.data) do k[#k + 1] = key end
      table.sort(k)
      return k
    end)())
    -- materialise as the controller does and review a GPU VMI with it
    local over = H.tmpdir()
    finally(function() rmrf(over) end)
    assert(os.execute("mkdir -p " .. H.q(over .. "/lib/site")))
    H.write(over .. "/site-tier.lua", cm.data["site-tier.lua"])
    H.write(over .. "/lib/site/tier.lua", cm.data["lib.site.tier.lua"])
    local o, e, code = H.run { "review", "--cluster", "examples/classes", "--cluster", "examples/cluster",
      "--override", over, "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml" }
    assert.are.equal(0, code, e)
    local r = H.json_lines(o)
    assert.is_false(r[1].response.allowed)
    assert.matches("GPU VMs need a billing tier", r[1].response.status.message, 1, true)
  end)

  it("a default is neutralised by a same-named rule whose match is never true (0007)", function()
    local over = mkfiles {
      ["vmi-record.lua"] = 'return rule "gpu/vmi-record" {\n'
        .. '  description = "disabled by the hoster",\n'
        .. '  match = function() return false end,\n'
        .. '  mutate = function() return nil end,\n'
        .. '}\n',
    }
    finally(function() rmrf(over) end)
    local args = { "review", "--cluster", "examples/classes", "--cluster", "examples/cluster",
      "--webhook", "mutating", "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml" }
    local o1, e1, c1 = H.run(args)
    assert.are.equal(0, c1, e1)
    assert.is_not_nil(H.patch_of(H.json_lines(o1)[1].response))
    table.insert(args, 2, "--override")
    table.insert(args, 3, over)
    local o2, e2, c2 = H.run(args)
    assert.are.equal(0, c2, e2)
    assert.is_nil(H.patch_of(H.json_lines(o2)[1].response))
  end)
end)
