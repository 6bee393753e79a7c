-- The API server double serves core/v1 Secrets as the license copier uses
-- them (docs/decisions/0029), driven by kubectl v1.32: created, read,
-- listed by label, their type fixed and, once `immutable: true` is stored,
-- their data fixed while metadata may still change and deletion is
-- allowed; and collected by the garbage collector only once ALL their
-- owners (a GPUClaim and a VMI) are gone. Expected values come from the
-- Kubernetes v1.32 sources:
--   SV = pkg/apis/core/validation/validation.go ValidateSecretUpdate
--        (ValidateImmutableField(type), "field is immutable when
--        `immutable` is set" for immutable and data);
--   GC = pkg/controller/garbagecollector/garbagecollector.go
--        attemptToDeleteItem, classifyReferences (a dependent with one
--        live owner stays and loses its dangling references).
local D = require "double"
local json = H.json

local NS = "sec"

describe("kube-double: Secrets", function()
  local d, dir

  local function file(name, obj)
    local f = dir .. "/" .. name .. ".json"
    H.write(f, json.encode(obj))
    return f
  end
  local function kubectl(args)
    local out, err, code = d:kubectl(args)
    return out or "", err or "", code
  end
  local function get(kind, name)
    local out, err, code = kubectl { "get", kind, name, "-n", NS, "-o", "json" }
    if code ~= 0 then
      assert.truthy(err:find("NotFound", 1, true), err)
      return nil
    end
    return json.decode(out)
  end
  local function secret(name, extra)
    local o = { apiVersion = "v1", kind = "Secret", metadata = { name = name, namespace = NS,
      labels = { ["app.kubernetes.io/managed-by"] = "cozygpu" } }, type = "Opaque",
      data = { ["client_configuration_token.tok"] = "dG9rZW4=" } }
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
  end

  setup(function()
    dir = H.tmpdir()
    d = D.start()
    assert(d:kubectl { "apply", "-f", "deploy/crds" })
    local st = d:request("POST", "/api/v1/namespaces", { apiVersion = "v1", kind = "Namespace", metadata = { name = NS } })
    assert.are.equal(201, st)
  end)
  teardown(function() if d then d:stop() end end)

  it("creates, gets and lists a Secret by label with kubectl", function()
    local _, err, code = kubectl { "create", "-f", file("s1", secret("s1")) }
    assert.are.equal(0, code, err)
    local s = assert(get("secret", "s1"))
    assert.are.equal("dG9rZW4=", s.data["client_configuration_token.tok"])
    local out
    out, err, code = kubectl { "get", "secrets", "-A", "-l", "app.kubernetes.io/managed-by=cozygpu", "-o",
      "jsonpath={.items[*].metadata.name}" }
    assert.are.equal(0, code, err)
    assert.are.equal("s1", out)
  end)

  it("refuses a change of type (SV: ValidateImmutableField)", function()
    local _, err, code = kubectl { "patch", "secret", "s1", "-n", NS, "--type=merge", "-p",
      '{"type":"kubernetes.io/tls"}' }
    assert.are_not.equal(0, code)
    assert.truthy(err:find('Secret "s1" is invalid: type: Invalid value: "kubernetes.io/tls": field is immutable', 1, true), err)
  end)

  it("allows a change of data while immutable is not set (kept)", function()
    local _, err, code = kubectl { "patch", "secret", "s1", "-n", NS, "--type=merge", "-p",
      '{"data":{"client_configuration_token.tok":"b3RoZXI="}}' }
    assert.are.equal(0, code, err)
    assert.are.equal("b3RoZXI=", get("secret", "s1").data["client_configuration_token.tok"])
  end)

  describe("with immutable: true (SV)", function()
    setup(function()
      local _, err, code = kubectl { "create", "-f", file("s2", secret("s2", { immutable = true })) }
      assert.are.equal(0, code, err)
    end)

    it("refuses a change of data, naming the field", function()
      local _, err, code = kubectl { "patch", "secret", "s2", "-n", NS, "--type=merge", "-p",
        '{"data":{"client_configuration_token.tok":"b3RoZXI="}}' }
      assert.are_not.equal(0, code)
      assert.truthy(err:find('Secret "s2" is invalid: data: Forbidden: field is immutable when `immutable` is set', 1, true), err)
      assert.are.equal("dG9rZW4=", get("secret", "s2").data["client_configuration_token.tok"])
    end)

    it("refuses a key added to data", function()
      local _, err, code = kubectl { "patch", "secret", "s2", "-n", NS, "--type=merge", "-p", '{"data":{"x":"eA=="}}' }
      assert.are_not.equal(0, code)
      assert.truthy(err:find("data: Forbidden: field is immutable when `immutable` is set", 1, true), err)
    end)

    it("refuses clearing immutable, naming immutable", function()
      local _, err, code = kubectl { "patch", "secret", "s2", "-n", NS, "--type=merge", "-p", '{"immutable":false}' }
      assert.are_not.equal(0, code)
      assert.truthy(err:find('Secret "s2" is invalid: immutable: Forbidden: field is immutable when `immutable` is set', 1, true), err)
    end)

    it("allows metadata changes and deletion (kept)", function()
      local _, err, code = kubectl { "label", "secret", "s2", "-n", NS, "extra=yes" }
      assert.are.equal(0, code, err)
      assert.are.equal("yes", get("secret", "s2").metadata.labels.extra)
      _, err, code = kubectl { "delete", "secret", "s2", "-n", NS }
      assert.are.equal(0, code, err)
      assert.is_nil(get("secret", "s2"))
    end)
  end)

  it("collects a Secret owned by a GPUClaim and a VMI only once both are gone (GC)", function()
    local claim = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "c1", namespace = NS },
      spec = { class = "x", count = 1 } }
    local vmi = { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", metadata = { name = "v1", namespace = NS },
      spec = {} }
    for _, o in ipairs { claim, vmi } do
      local _, err, code = kubectl { "create", "-f", file(o.metadata.name, o) }
      assert.are.equal(0, code, err)
    end
    local cu, vu = get("gpuclaim", "c1").metadata.uid, get("vmi", "v1").metadata.uid
    local refs = json.array {
      { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", name = "c1", uid = cu },
      { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "v1", uid = vu },
    }
    local s = secret("owned", { immutable = true })
    s.metadata.ownerReferences = refs
    local _, err, code = kubectl { "create", "-f", file("owned", s) }
    assert.are.equal(0, code, err)
    _, err, code = kubectl { "delete", "gpuclaim", "c1", "-n", NS }
    assert.are.equal(0, code, err)
    local left = assert(get("secret", "owned"), "collected while the VMI still owns it")
    assert.are.same({ { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "v1", uid = vu } },
      left.metadata.ownerReferences)
    _, err, code = kubectl { "delete", "vmi", "v1", "-n", NS }
    assert.are.equal(0, code, err)
    assert.is_nil(get("secret", "owned"))
  end)
end)
