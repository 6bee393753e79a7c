-- Manifests and YAML as kubectl reads them (core/format/manifest.c, core/format/yamlload.c,
-- docs/decisions/0002-yaml-scalars.md).
local core, json = H.core, H.json

describe("YAML manifests", function()
  it("reads multi-document streams and skips empty documents", function()
    local docs = assert(core.yaml("---\na: 1\n---\n---\nb: 2\n...\n"))
    assert.are.equal(2, #docs)
    assert.are.equal(1, docs[1].a)
    assert.are.equal(2, docs[2].b)
  end)

  it("reads the scalars people write in manifests the way kubectl does", function()
    local d = assert(core.yaml([[
plain: hello
quoted: "yes"
single: 'on'
yes_: yes
on_: on
off_: off
true_: True
null1: ~
null2: null
int: 42
neg: -7
hex: 0x1F
float: 1.5
exp: 1e3
big: 9007199254740993
block: |
  line one
  line two
folded: >
  folded
  text
empty_map: {}
empty_list: []
]]))[1]
    assert.are.equal("hello", d.plain)
    assert.are.equal("yes", d.quoted)
    assert.are.equal("on", d.single)
    assert.are.equal(true, d.yes_)      -- YAML 1.1 booleans, as go-yaml v2
    assert.are.equal(true, d.on_)
    assert.are.equal(false, d.off_)
    assert.are.equal(true, d.true_)
    assert.are.equal(json.null, d.null1)
    assert.are.equal(json.null, d.null2)
    assert.are.equal(42, d.int)
    assert.are.equal(-7, d.neg)
    assert.are.equal(31, d.hex)
    assert.are.equal(1.5, d.float)
    assert.are.equal(1000, d.exp)
    assert.are.equal("integer", math.type(d.exp)) -- kubectl holds 1e3 as int64 1000
    assert.are.equal(9007199254740993, d.big)
    assert.are.equal("line one\nline two\n", d.block)
    assert.are.equal("folded text\n", d.folded)
    assert.are.equal("object", json.kind(d.empty_map))
    assert.are.equal("array", json.kind(d.empty_list))
  end)

  it("reports a tab used for indentation with its line and column", function()
    local docs, err = core.yaml("a:\n\tb: 1\n", "tab.yaml")
    assert.is_nil(docs)
    assert.are.equal(2, err.line)
    assert.are.equal(1, err.column)
    assert.matches("cannot start any token", err.message)
  end)

  it("expands anchors, aliases and merge keys", function()
    local d = assert(core.yaml("base: &b {p: 1, q: 2}\nuse:\n  <<: *b\n  q: 3\nref: *b\n"))[1]
    assert.are.same({ p = 1, q = 3 }, { p = d.use.p, q = d.use.q })
    assert.are.equal(2, d.ref.q)
    -- go-yaml v2 reads a plain `y` as a boolean, so as a key it becomes "true"
    assert.are.equal(1, assert(core.yaml("y: 1\n"))[1]["true"])
  end)

  it("refuses a double-quoted escape kubectl refuses, at the backslash, and keeps backslashes elsewhere as text", function()
    -- go-yaml v2 scannerc.go knows 0 a b t TAB n v f r e SPACE " ' \\ N _ L P x u U;
    -- libyaml 0.2.5 also decodes "\/"
    local docs, err = core.yaml('kind: ConfigMap\ndata:\n  url: "https:\\/\\/example.com"\n', "cm.yaml")
    assert.is_nil(docs)
    assert.are.equal(3, err.line)
    assert.are.equal(15, err.column)
    assert.are.equal("found unknown escape character (while parsing a quoted scalar at line 3, column 8)", err.message)
    local d = assert(core.yaml("a: 'x\\/'\nb: x\\/\nc: |\n  \\/\nd: \"\\\\/ \\u00e9\\x41\"\n"))[1]
    assert.are.same({ "x\\/", "x\\/", "\\/\n", "\\/ \u{e9}A" }, { d.a, d.b, d.c, d.d })
  end)

  it("reads \\' in double quotes as ' (go-yaml does; libyaml 0.2.5 alone refuses it)", function()
    local d = assert(core.yaml("msg: \"don\\'t\"\nq: \"\\\"\\'\\\"\"\n"))[1]
    assert.are.equal("don't", d.msg)
    assert.are.equal("\"'\"", d.q)
  end)

  it("refuses duplicate keys, naming the key", function()
    local docs, err = core.yaml("a: 1\na: 2\n")
    assert.is_nil(docs)
    assert.matches('"a"', err.message)
  end)

  it("expands kind: List and reads every fixture manifest", function()
    local dir = H.tmpdir()
    H.write(dir .. "/list.yaml", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n")
    local recs = assert(core.manifests(dir))
    assert.are.equal(2, #recs)
    assert.are.equal("b", recs[2].object.metadata.name)
    local kv = assert(core.manifests(H.fixtures .. "/kubevirt/cozystack/gpu-passthrough-defaults.yaml"))
    assert.are.equal("nvidia.com/AD102GL_L40S", (function()
      for _, d in ipairs(kv[1].object.pciHostDevices) do
        if d.pciVendorSelector == "10DE:26B9" then return d.resourceName end
      end
    end)())
  end)

  it("reads uint64 values beyond int64 as Kubernetes does (a float), in JSON and YAML", function()
    local recs = assert(core.manifests(H.fixtures .. "/kubevirt/kubevirt-api-testdata/kubevirt.io.v1.VirtualMachineInstance.json"))
    assert.are.equal("VirtualMachineInstance", recs[1].object.kind)
    recs = assert(core.manifests(H.fixtures .. "/kubevirt/kubevirt-api-testdata/kubevirt.io.v1.VirtualMachineInstance.yaml"))
    assert.are.equal("VirtualMachineInstance", recs[1].object.kind)
  end)
end)

describe("settings file", function()
  it("fills defaults and refuses unknown keys, naming file and key", function()
    local s = assert(core.config_from({ rawResourceNames = "Warn" }))
    assert.are.equal("Warn", s.rawResourceNames)
    assert.are.equal("tenant-root", s.tenantRoot)
    assert.are.equal(10000000, s.policyBudget.instructions)
    local bad, err = core.config_from({ rawResourceName = "Warn" }, "site.yaml")
    assert.is_nil(bad)
    assert.matches('^site.yaml: unknown key "rawResourceName"', err)
    bad, err = core.config_from({ rawResourceNames = "Maybe" }, "site.yaml")
    assert.is_nil(bad)
    assert.matches("rawResourceNames: must be one of Allowed, Warn, Forbidden", err)
  end)

  it("reads the example settings and the ConfigMap form", function()
    local s = assert(core.config("examples/config.yaml"))
    assert.are.equal("Allowed", s.rawResourceNames)
    local dir = H.tmpdir()
    H.write(dir .. "/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cozygpu-config}\ndata:\n  config.yaml: |\n    rawResourceNames: Forbidden\n")
    s = assert(core.config(dir .. "/cm.yaml"))
    assert.are.equal("Forbidden", s.rawResourceNames)
  end)
end)
