-- Template claims and usage records on a real control plane (decisions
-- 0027, 0028, 0033): a VMI with GPU entries and no claims annotation
-- gets a claim the leader creates, owned by the VMI; the claim's usage
-- record (a Cozystack Workload) is owned by the claim. When the VMI goes,
-- kube-controller-manager's garbage collector, not cozygpu, deletes the
-- claim (its claim-protection finalizer released by the leader once no VMI
-- uses it), and then the record.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local json = H.json

local NS = "tenant-a"
local CLAIMS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/"
local RECORDS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/workloads/"

describe("template claims collected by the garbage collector", function()
  local c

  local session = K.session { invariants = true, prepare = function(cl)
    c = cl
    G.add_node(c, "gpu-node-1", 2)
  end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

  it("a VMI's template claim and its usage record go with the VMI", function()
    local out, err, code = c:kubectl({ "create", "-f", "-", "-o", "json" }, { stdin = json.encode {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      -- a class-referencing VMI (label gpu.cozystack.io/class-reference,
      -- decision 0027) without the claims annotation
      metadata = { name = "infer", namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" } },
      spec = { domain = { devices = { gpus = { { name = "gpu1", deviceName = G.L40S } } },
        resources = { requests = { memory = "1Gi" } } } } } })
    assert.are.equal(0, code, out .. err)
    local vmi = json.decode(out)
    -- the leader creates infer-l40s (decision 0027: <VMI>-<class>), owned by
    -- the VMI, and binds it
    local claim = P.wait_until(function()
      local cl = c:get(CLAIMS .. "infer-l40s")
      return cl and cl.status and cl.status.phase == "Bound" and cl
    end, 30, 0.2)
    assert(claim, json.encode(c:state("gpuclaims")))
    local ref = claim.metadata.ownerReferences[1]
    assert.are.same({ "VirtualMachineInstance", "infer", vmi.metadata.uid, true },
      { ref.kind, ref.name, ref.uid, ref.controller })
    assert.are.equal("true", claim.metadata.labels["gpu.cozystack.io/template-claim"])
    -- its usage record, owned by the claim
    local record = P.wait_until(function() return c:get(RECORDS .. "gpu-infer-l40s") end, 30, 0.2)
    assert(record, json.encode(c:state("workloads")))
    assert.are.equal(claim.metadata.uid, record.metadata.ownerReferences[1].uid)
    assert.are.equal("1", tostring(record.status.resources["l40s.gpuclass.cozystack.io/devices"]))
    -- the VMI goes: the collector deletes the claim, then the record
    c:must { "delete", "vmi", "infer", "-n", NS, "--wait=false" }
    assert(P.wait_until(function()
      local _, st = c:get(CLAIMS .. "infer-l40s")
      return st == 404
    end, 60, 0.2), json.encode(c:get(CLAIMS .. "infer-l40s") or {}) .. "\n" .. (c:log_tail("kube-controller-manager", 20))
      .. (c:log_tail("../replica-a", 30)))
    assert(P.wait_until(function()
      local _, st = c:get(RECORDS .. "gpu-infer-l40s")
      return st == 404
    end, 60, 0.2), json.encode(c:get(RECORDS .. "gpu-infer-l40s")))
  end)
end)
