-- The leader's binder on a real control plane (DESIGN.md §6, decisions
-- 0020, 0026): cordons, a node whose Ready condition turns (with the
-- node-lifecycle controller tainting it as in any cluster), and a node
-- deleted (its GPUNode collected through the owner reference). The same
-- rules as spec/controller/binder_spec.lua, through kube-apiserver and
-- kube-controller-manager instead of the double.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local json = H.json

local NS = "tenant-a"
local CLAIMS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/"
local VMIS = "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances/"

local function ready_cond(obj) return K.condition(obj, "Ready") end

describe("the leader's binder through kube-apiserver", function()
  local c
  local session = K.session { prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)

  local function claim(name)
    c:must({ "create", "-f", "-" }, { stdin = json.encode { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = name, namespace = NS }, spec = { class = "l40s", count = 1 } } })
  end
  -- waits until claim `name` has `phase` (and `node`, when given: false
  -- for none); returns it
  local function wait_claim(name, phase, node)
    local last
    local cl = P.wait_until(function()
      last = c:get(CLAIMS .. name)
      local st = last and last.status or {}
      if st.phase ~= phase then return nil end
      if node == false and st.node ~= nil then return nil end
      if node and st.node ~= node then return nil end
      return last
    end, 60, 0.2)
    assert(cl, ("claim %s: wanted %s on %s, have %s"):format(name, phase, tostring(node), json.encode(last and last.status)))
    return cl
  end
  local function running_vmi(name, claims, node)
    local out = c:must({ "create", "-f", "-", "-o", "json" }, { stdin = json.encode {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = NS, annotations = { ["gpu.cozystack.io/claims"] = claims } },
      spec = { domain = { devices = { gpus = { { name = "g", deviceName = G.L40S } } },
        resources = { requests = { memory = "1Gi" } } } } } })
    -- virt-handler's part: the VMI runs on the node (KubeVirt's VMI CRD has
    -- no status subresource: the status is written with the object)
    local v = json.decode(out)
    v.status = { phase = "Running", nodeName = node }
    c:must({ "replace", "-f", "-" }, { stdin = json.encode(v) })
  end
  local function set_ready(node, status)
    for _ = 1, 20 do
      local n = c:get("/api/v1/nodes/" .. node)
      for _, cond in ipairs(n.status.conditions) do
        if cond.type == "Ready" then
          cond.status = status
          cond.reason = status == "True" and "KubeletReady" or "NodeStatusUnknown"
          cond.lastTransitionTime = os.date("!%Y-%m-%dT%H:%M:%SZ")
        end
      end
      local st = c:request("PUT", "/api/v1/nodes/" .. node .. "/status", n)
      if st == 200 then return end
      assert.are.equal(409, st)
    end
    error("node " .. node .. ": status not written")
  end

  it("moves an unattached claim off a cordoned node (onCordon Move) to a node with room", function()
    G.add_node(c, "gpu-1", 1)
    claim("c1")
    wait_claim("c1", "Bound", "gpu-1")
    G.add_node(c, "gpu-2", 1)
    c:must { "cordon", "gpu-1" }
    local cl = wait_claim("c1", "Bound", "gpu-2")
    assert.matches("moved from node gpu-1 (node cordoned, onCordon Move) to node gpu-2", ready_cond(cl).message, 1, true)
    c:must { "delete", "gpuclaim", "c1", "-n", NS }
    c:must { "uncordon", "gpu-1" }
  end)

  it("node NotReady: the attached claim goes Lost waiting for its VMI, and Attached again when the node returns", function()
    claim("a1")
    local n = wait_claim("a1", "Bound").status.node
    running_vmi("vm-a", "a1", n)
    wait_claim("a1", "Attached", n)
    set_ready(n, "Unknown")
    -- the node-lifecycle controller taints it, as in any cluster
    assert(P.wait_until(function()
      for _, t in ipairs(c:get("/api/v1/nodes/" .. n).spec.taints or {}) do
        if t.key == "node.kubernetes.io/unreachable" then return true end
      end
    end, 30, 0.2), json.encode(c:get("/api/v1/nodes/" .. n).spec))
    local cl = wait_claim("a1", "Lost", n)
    assert.are.same({ "False", "WaitingForVMIEnd" }, { ready_cond(cl).status, ready_cond(cl).reason })
    set_ready(n, "True")
    cl = wait_claim("a1", "Attached", n)
    assert.are.equal("vm-a", cl.status.attachedTo)
    c:must { "delete", "vmi", "vm-a", "-n", NS }
    c:must { "delete", "gpuclaim", "a1", "-n", NS }
  end)

  it("node deleted with no room elsewhere: the claim goes Lost, and is rebound before a newer order when room returns", function()
    -- every node but gpu-1 is cordoned: gpu-1's unit is the only room
    c:must { "cordon", "gpu-2" }
    claim("l1")
    wait_claim("l1", "Bound", "gpu-1")
    c:must { "delete", "node", "gpu-1" }
    local cl = wait_claim("l1", "Lost", false)
    assert.are.equal("NodeLost", ready_cond(cl).reason)
    claim("n1") -- a newer order, waiting too
    assert(P.wait_until(function()
      local x = c:get(CLAIMS .. "n1")
      return x and ready_cond(x) and ready_cond(x).reason == "NoNodeWithRoom"
    end, 30, 0.2), json.encode(c:get(CLAIMS .. "n1")))
    G.add_node(c, "gpu-9", 1) -- room for one
    wait_claim("l1", "Bound", "gpu-9")
    cl = wait_claim("n1", "Pending")
    assert.are.equal("NoNodeWithRoom", ready_cond(cl).reason)
  end)
end)
