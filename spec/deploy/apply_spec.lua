-- `kubectl apply -k deploy/` against the API server double
-- (build/bin/kube-double, spec/support/kube-double/). The double serves the
-- kinds the controller uses and, stored but not acted on,
-- every kind of deploy/ (RBAC, apps, policy, admissionregistration, and
-- cert-manager's as if its CRDs were installed): the manifests are accepted
-- by an API server's decoding, strict field validation for the CRDs, and
-- kubectl's client side. No RBAC is evaluated and no Deployment runs.
local P = require "proc"

local DOUBLE = H.build .. "/bin/kube-double"
-- The kustomize base: kubectl renders it (kustomize is built in) and
-- applies the objects; the double sees an ordinary apply.
local SERVED = "-k deploy/"

local function have(cmd) return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") end

describe("kubectl apply -k deploy/ against the API server double", function()
  if not io.open(DOUBLE, "rb") then
    pending(DOUBLE .. " not built (make kube-double)")
    return
  end
  if not have("kubectl") then
    pending("kubectl not installed")
    return
  end

  local dir, pid, server
  setup(function()
    dir = H.tmpdir()
    local port_file = dir .. "/port"
    pid = P.spawn({ DOUBLE, "--address", "127.0.0.1", "--port", "0", "--port-file", port_file }, dir .. "/double.log")
    local port = P.wait_until(function()
      local f = io.open(port_file, "r")
      if not f then return nil end
      local s = f:read("a")
      f:close()
      return tonumber(s:match("%d+"))
    end, 10)
    assert(port, "kube-double did not write its port: " .. (io.open(dir .. "/double.log"):read("a")))
    server = "http://127.0.0.1:" .. port
  end)
  teardown(function()
    if pid then P.stop(pid, 2) end
    if dir then os.execute("rm -rf " .. H.q(dir)) end
  end)

  local function kubectl(args)
    -- a discovery cache of its own: kubectl keys it by host:port, and a
    -- port reused from another double would bring that double's kinds
    local out, code = P.sh(("KUBECONFIG=/dev/null kubectl --cache-dir %s --server %s %s 2>&1"):format(
      H.q(dir .. "/kube-cache"), server, args))
    return out, code
  end

  it("creates the served objects, then finds them unchanged on a second apply", function()
    -- kube-apiserver makes the namespace "default" itself (its system
    -- namespaces controller); the double starts empty
    H.write(dir .. "/default-ns.json", '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"default"}}')
    local nout, ncode = kubectl("create -f " .. H.q(dir .. "/default-ns.json"))
    assert.are.equal(0, ncode, nout)
    local out, code = kubectl("apply " .. SERVED)
    assert.are.equal(0, code, out)
    assert.matches("customresourcedefinition.apiextensions.k8s.io/gpuclasses.cozystack.io created", out, 1, true)
    assert.matches("configmap/cozygpu-policies created", out, 1, true)
    for _, what in ipairs {
      "serviceaccount/cozygpu-controller created", "clusterrole.rbac.authorization.k8s.io/cozygpu-controller created",
      "deployment.apps/cozygpu-controller created", "service/cozygpu-webhook created",
      "validatingwebhookconfiguration.admissionregistration.k8s.io/cozygpu created",
      "mutatingwebhookconfiguration.admissionregistration.k8s.io/cozygpu created",
    } do assert.matches(what, out, 1, true) end
    out, code = kubectl("apply " .. SERVED)
    assert.are.equal(0, code, out)
    assert.matches("configmap/cozygpu-policies unchanged", out, 1, true)
    assert.matches("configmap/cozygpu-config unchanged", out, 1, true)
  end)

  it("applies the optional NetworkPolicy once its source is set", function()
    local f = dir .. "/netpol.yaml"
    H.write(f, (H.read("deploy/optional/45-webhook-networkpolicy.yaml"):gsub("SET%-THE%-API%-SERVER%-ADDRESSES",
      "10.0.0.10/32")))
    local out, code = kubectl("apply -f " .. H.q(f))
    assert.are.equal(0, code, out)
    assert.matches("networkpolicy.networking.k8s.io/cozygpu-webhook created", out, 1, true)
    out, code = kubectl("get networkpolicy -n cozy-gpu cozygpu-webhook -o json")
    assert.are.equal(0, code, out)
    assert.are.equal("10.0.0.10/32", H.json.decode(out).spec.ingress[1].from[1].ipBlock.cidr)
  end)

  it("stores every policy file byte for byte in the policies ConfigMap", function()
    local out, code = kubectl("get configmap -n cozy-gpu cozygpu-policies -o json")
    assert.are.equal(0, code, out)
    local cm = assert(H.json.decode(out))
    local p = io.popen("find policies -maxdepth 1 -type f -name '*.lua' | sort")
    local n = 0
    for f in p:lines() do
      n = n + 1
      assert.are.equal(H.read(f), cm.data[f:sub(#"policies/" + 1)], f)
    end
    p:close()
    assert.is_true(n > 0)
  end)

  it("stores settings that load back as settings", function()
    local out, code = kubectl("get configmap -n cozy-gpu cozygpu-config -o yaml")
    assert.are.equal(0, code, out)
    local f = dir .. "/settings.yaml"
    H.write(f, out)
    local cfg = assert(H.core.config(f))
    assert.are.equal("tenant-root", cfg.tenantRoot)
  end)
end)
