-- License token copies on a real control plane (DESIGN.md §8, decisions
-- 0029, 0035): the leader, as its ServiceAccount, copies the token of the
-- licensed vGPU class l40s-24c (examples/classes) into tenant-a, entitled
-- and using the class, through RBAC that lets it write but not read
-- Secrets outside cozy-gpu, and the ValidatingAdmissionPolicy that narrows
-- its writes to copies (deploy/56). A tenant can neither delete the copy
-- nor squat its name (deploy/55), as kube-apiserver answers a user.
local P = require "proc"
local K = require "kube_cluster"
local json = H.json

local NS = "tenant-a"
local COPY = "gpu-license-l40s-24c"
local KEY = "client_configuration_token.tok"
local TOKEN = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzZXJ2aWNlX2luc3RhbmNlIjoiMSJ9.c2lnbmF0dXJlLTE=\n"

describe("license copies through kube-apiserver", function()
  local c, alice
  local session = K.session { prepare = function(cl)
    c = cl
    -- the hoster's token Secret, where the class's secretRef points
    local dir = c.dir .. "/token"
    assert(os.execute("mkdir -p " .. P.q(dir)))
    H.write(dir .. "/" .. KEY, TOKEN)
    c:must { "-n", "cozy-gpu", "create", "secret", "generic", "nvidia-vgpu-license", "--from-file=" .. dir .. "/" .. KEY }
    c:must({ "apply", "-f", "-" }, { stdin = H.read("cluster/tenant-users.yaml") })
    local out, code = P.sh(("cluster/cluster.sh user %s alice 2>&1"):format(P.q(c.dir)))
    assert(code == 0, out)
    alice = (out:gsub("%s+$", ""))
  end }
  setup(session.setup)
  teardown(session.teardown)

  local function copy()
    return c:get("/api/v1/namespaces/" .. NS .. "/secrets/" .. COPY)
  end

  it("copies the token into the entitled namespace that orders the class", function()
    local out, err, code = c:kubectl({ "create", "-f", "-" }, { kubeconfig = alice, stdin = json.encode {
      apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "vgpu", namespace = NS },
      spec = { class = "l40s-24c", count = 1 } } })
    assert.are.equal(0, code, out .. err)
    local s = P.wait_until(copy, 30, 0.2)
    assert(s, P.read(c.replicas["replica-a"].log))
    assert.are.equal(TOKEN, H.unbase64(s.data[KEY]))
    assert.is_true(s.immutable)
    assert.are.equal("l40s-24c", s.metadata.labels["gpu.cozystack.io/license-class"])
    -- owned by its user, the claim: it goes with the last one
    assert.are.equal("GPUClaim", s.metadata.ownerReferences[1].kind)
    assert.are.equal("vgpu", s.metadata.ownerReferences[1].name)
  end)

  it("refuses a tenant's delete of the copy and a Secret squatting a copy's name", function()
    -- alice may not touch Secrets at all under her role; a tenant admin may,
    -- so grant her Secrets in tenant-a to see the policy answer
    c:must { "-n", NS, "create", "role", "secrets-admin", "--verb=*", "--resource=secrets" }
    c:must { "-n", NS, "create", "rolebinding", "alice-secrets", "--role=secrets-admin", "--user=alice" }
    local _, err, code = c:kubectl({ "-n", NS, "delete", "secret", COPY }, { kubeconfig = alice })
    assert.are_not.equal(0, code)
    assert.matches("cozygpu-license-copies", err, 1, true)
    assert.truthy(copy())
    _, err, code = c:kubectl({ "-n", NS, "create", "secret", "generic", "gpu-license-a100-40c",
      "--from-literal=" .. KEY .. "=forged" }, { kubeconfig = alice })
    assert.are_not.equal(0, code)
    assert.matches("ValidatingAdmissionPolicy", err, 1, true)
    -- and the controller itself reads no Secret of the tenant's
    local out = c:kubectl { "auth", "can-i", "get", "secret/" .. COPY, "-n", NS,
      "--as=system:serviceaccount:cozy-gpu:cozygpu-controller" }
    assert.are.equal("no", (out:gsub("%s+$", "")))
  end)
end)
