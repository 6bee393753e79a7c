-- cozygpu on a real API server (decision 0033): deploy/ applied with kubectl
-- apply -k, the controller running as its ServiceAccount, the webhooks
-- registered by the manifests and called by kube-apiserver over TLS. What a
-- tenant sees is what kubectl prints.
local P = require "proc"
local K = require "kube_cluster"
local json = H.json

local NS = "tenant-a"

local function claim(name, class, count)
  return json.encode { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
    metadata = { name = name, namespace = NS }, spec = { class = class, count = count } }
end

describe("admission through kube-apiserver", function()
  local c

  -- the controller runs as its ServiceAccount: no request may be forbidden
  local session = K.session { invariants = true, prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

  it("refuses the over-budget order (examples/reviews/10) with cozygpu's message, as kubectl prints it", function()
    -- tenant-a's budget is 2 devices of any class (examples/cluster/quotas.yaml)
    local out, err, code = c:kubectl({ "create", "-f", "-" }, { stdin = claim("training", "l40s", 3) })
    assert.are_not.equal(0, code, out)
    -- kubectl prints the API server's Status message: the webhook's name,
    -- then cozygpu's reason (k8s.io/apiserver admission webhook errors:
    -- `admission webhook "<name>" denied the request: <message>`)
    assert.matches('admission webhook "gpuclaim.validate.gpu.cozystack.io" denied the request: ', err, 1, true)
    assert.matches('tenant "tenant-a"', err, 1, true)
    assert.matches("gpuclass.cozystack.io/devices", err, 1, true)
    -- nothing was stored
    local _, st = c:get("/apis/cozystack.io/v1alpha1/namespaces/tenant-a/gpuclaims/training")
    assert.are.equal(404, st)
  end)

  it("admits an order within the budget; the leader binds it when a node has room", function()
    local out, err, code = c:kubectl({ "create", "-f", "-" }, { stdin = claim("small", "l40s", 1) })
    assert.are.equal(0, code, out .. err)
    local cl = c:get("/apis/cozystack.io/v1alpha1/namespaces/tenant-a/gpuclaims/small")
    assert.truthy(cl)
    -- the leader's binder put its protection finalizer on (decision 0026)
    assert(P.wait_until(function()
      local x = c:get("/apis/cozystack.io/v1alpha1/namespaces/tenant-a/gpuclaims/small")
      for _, f in ipairs(x and x.metadata.finalizers or {}) do
        if f == "gpu.cozystack.io/claim-protection" then return true end
      end
    end, 30, 0.2), "no finalizer; controller log:\n" .. (P.read(c.replicas["replica-a"].log) or ""))
  end)
end)
