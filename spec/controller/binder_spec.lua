-- On the API server double by design (docs/decisions/0034 item 2): these
-- cases need a slow write injected on demand (the double's latency), which
-- a real server cannot make. Every other case of the leader's binder runs
-- on the real control plane: spec/cluster/binder_spec.lua.
--
-- The leader's binder against the API server double, two replicas
-- (DESIGN.md §6; docs/decisions/0020, 0026): a claim deleted and created
-- again under its name reaches the leader in one batch with the old one's
-- deletion, and is judged as the new claim it is; a node deleted in one
-- batch with a class change leaves the state.
local P = require "proc"
local E = require "controller_env"
local G = require "gpu_nodes"
local json = H.json

local NS = "tenant-b" -- no ResourceQuota (examples/cluster/quotas.yaml budgets tenant-a): capacity alone decides

local function must(d, method, path, body, ctype)
  local v, st = E.send(d, method, path, body, ctype)
  assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st), json.encode(v or {})))
  return v
end

local function add_claim(d, name, count, class)
  local f = H.tmpdir() .. "/in.json"
  H.write(f, json.encode { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
    metadata = { name = name, namespace = NS }, spec = { class = class or "l40s", count = count } })
  local out, code = E.kubectl(d, { "apply", "-f", f })
  assert(code == 0, out)
end

local function claim(d, name)
  return (E.get(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/" .. name))
end

local function ready_cond(c)
  for _, x in ipairs(c and c.status and c.status.conditions or {}) do
    if x.type == "Ready" then return x end
  end
  return nil
end

-- waits until the double holds a request in a latency rule (the leader's
-- slow write has started): what comes next reaches the leader in one batch
local function wait_delayed(d, what)
  assert(P.wait_until(function() return (d:state().delayed or 0) >= 1 end, 15, 0.02),
    "the leader's " .. what .. " never reached the double's latency rule")
end

-- units held per node by Bound/Attached claims, from the API
local function held(d)
  local out = {}
  for _, c in ipairs(d:state("gpuclaims").items) do
    local st = c.status or {}
    if (st.phase == "Bound" or st.phase == "Attached") and st.node then
      out[st.node] = (out[st.node] or 0) + c.spec.count
    end
  end
  return out
end

describe("the leader's binder against the double (an injected slow write)", function()
  local d, cluster

  before_each(function()
    cluster = E.start_cluster {}
    d = cluster.d
  end)

  after_each(function() E.stop_cluster(cluster) end)

  teardown(function() P.stop_all() end)

  it("a claim deleted and created again under its name (another uid) is a new claim, not the old one's hold", function()
    G.add_node(d, "gpu-1", 2)
    add_claim(d, "r1", 1)
    assert(P.wait_until(function()
      local c = claim(d, "r1")
      return c and c.status and c.status.phase == "Bound" and c.status.node == "gpu-1"
    end, 15), json.encode(claim(d, "r1") or {}))
    -- keep the leader busy in a slow write so that the delete and the
    -- create reach it in one batch (its watch then holds only the new one)
    d:latency { method = "PUT", path = "/apis/cozystack.io/v1alpha1/namespaces/", ms = 1500, count = 1 }
    add_claim(d, "busy", 1)
    wait_delayed(d, "status write of claim busy")
    -- r1 is unused: the tenant may take the protection finalizer off
    -- (as with kubernetes.io/pvc-protection) and delete it at once
    must(d, "PATCH", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/r1",
      { metadata = { finalizers = json.null } })
    must(d, "DELETE", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/r1")
    add_claim(d, "r1", 1, "a100-40c") -- a class no node offers
    local c
    assert(P.wait_until(function()
      c = claim(d, "r1")
      return ready_cond(c) and ready_cond(c).reason == "NoNodeWithRoom"
    end, 15), json.encode(c or {}))
    assert.are.equal("Pending", c.status.phase)
    assert.is_nil(c.status.node)
    assert.are.equal(1, held(d)["gpu-1"]) -- busy alone
  end)

  it("a node deleted in one batch with a class change leaves the class's capacity", function()
    -- A class change re-reads every node the cache holds; the node deleted
    -- in the same batch is not among them and must leave the state all the
    -- same. It stayed, offering its unit, until a leader change (GPUClass
    -- status kept free 1 with no node: seen on the real control plane under
    -- load, spec/cluster/binder_spec.lua's reset).
    local path = "/apis/cozystack.io/v1alpha1/gpuclasses/l40s"
    local function free()
      local c = E.get(d, path)
      return c and c.status and c.status.free
    end
    G.add_node(d, "gpu-1", 1)
    G.add_node(d, "gpu-2", 1)
    assert(P.wait_until(function() return free() == 2 end, 15), "free: " .. tostring(free()))
    -- the leader's next class status write (free 1, once gpu-2 is gone)
    -- takes 1.5 s; meanwhile gpu-1 goes and the class's spec changes, so
    -- the three reach the leader in one batch
    d:latency { method = "PATCH", path = path, ms = 1500, count = 1 }
    -- (each GPUNode goes with its Node: the double's garbage collector)
    must(d, "DELETE", "/api/v1/nodes/gpu-2")
    wait_delayed(d, "class status write (free 1)")
    must(d, "DELETE", "/api/v1/nodes/gpu-1")
    must(d, "PATCH", path, { spec = { displayName = "NVIDIA L40S, no node left" } }, "application/merge-patch+json")
    assert(P.wait_until(function() return free() == 0 end, 15),
      "the leader still counts a deleted node: free " .. tostring(free()))
  end)
end)
