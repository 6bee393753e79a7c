-- GPUClass status.free and status.maxFreePerNode, and the leader's
-- per-class metrics, against the API server double with two replicas
-- (DESIGN.md §3 "status.free, status.maxFreePerNode ... nothing else";
-- issue 13 items 2 and 3; docs/decisions/0030).
--
-- What the status should say is worked out here from what the API shows,
-- by the rule, never from what the controller prints: a node counts when
-- it is present, Ready and not cordoned (the candidates of DESIGN.md §6;
-- the nodes here carry only the taint examples/classes/l40s.yaml
-- tolerates); its free units are its L40S (GPUNode functions capped at
-- allocatable) minus the units of the claims booked there (Bound,
-- Attached, or Lost waiting on it); free adds them up, maxFreePerNode is
-- the most on one node (l40s has no maxCount: no cap).
local P = require "proc"
local E = require "controller_env"
local G = require "gpu_nodes"
local json = H.json

local NS = "tenant-b" -- no ResourceQuota: capacity alone decides
local CLASS_PATH = "/apis/cozystack.io/v1alpha1/gpuclasses/"

local function must(d, method, path, body)
  local v, st = E.send(d, method, path, body)
  assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st), json.encode(v or {})))
  return v
end

local function lease_holder(d)
  local l = E.get(d, "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
  return l and l.spec and l.spec.holderIdentity
end

describe("GPUClass status (two replicas against the double)", function()
  local cluster, d, replicas
  local nodes = {} -- name -> {units, alloc, ready, cordoned}

  -- the status the rule gives from the API's nodes and claims
  local function expected()
    local booked = {}
    for _, c in ipairs(d:state("gpuclaims").items) do
      local st = c.status or {}
      if st.node and (st.phase == "Bound" or st.phase == "Attached" or st.phase == "Lost") and c.spec.class == "l40s" then
        booked[st.node] = (booked[st.node] or 0) + c.spec.count
      end
    end
    local free, max = 0, 0
    for n, s in pairs(nodes) do
      if s.ready and not s.cordoned then
        local f = math.max(0, math.min(s.units, s.alloc or s.units) - (booked[n] or 0))
        free = free + f
        if f > max then max = f end
      end
    end
    return free, max
  end

  local function class(name)
    return (E.get(d, CLASS_PATH .. (name or "l40s")))
  end

  -- waits until the l40s status shows what the rule gives, and the claims
  -- have settled (what the rule reads is itself the binder's outcome)
  local function wait_status(what)
    local free, max, c
    local ok = P.wait_until(function()
      free, max = expected()
      c = class()
      local st = c and c.status or {}
      return st.free == free and st.maxFreePerNode == max
    end, 15)
    assert(ok, ("%s: l40s status %s, the rule gives free %s, maxFreePerNode %s"):format(what,
      json.encode(c and c.status or {}), tostring(free), tostring(max)))
    return free, max
  end

  local function add_node(name, units)
    G.add_node(d, name, units)
    nodes[name] = { units = units, ready = true, cordoned = false }
  end

  local function add_claim(name, count)
    must(d, "POST", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims", { apiVersion = "cozystack.io/v1alpha1",
      kind = "GPUClaim", metadata = { name = name, namespace = NS }, spec = { class = "l40s", count = count } })
  end

  local function wait_phase(name, phase)
    local c
    assert(P.wait_until(function()
      c = E.get(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/" .. name)
      return c and c.status and c.status.phase == phase
    end, 15), ("claim %s: wanted %s, got %s"):format(name, phase, json.encode(c or {})))
    return c
  end

  setup(function()
    cluster = E.start_cluster {}
    d, replicas = cluster.d, cluster.replicas
  end)

  teardown(function()
    E.stop_cluster(cluster)
    P.stop_all()
  end)

  it("shows 0 free while no node offers the class, then what the nodes offer", function()
    wait_status("no node")
    assert.are.equal(0, class().status.free)
    add_node("gpu-1", 4)
    add_node("gpu-2", 2)
    local free, max = wait_status("two nodes")
    assert.are.equal(6, free) -- the spec's own arithmetic: 4 + 2
    assert.are.equal(4, max)
  end)

  it("follows new orders: a bound claim's units are no longer free", function()
    add_claim("c1", 3)
    wait_phase("c1", "Bound")
    local free, max = wait_status("c1 bound")
    assert.are.equal(3, free)
    assert.are.equal(2, max)
  end)

  it("leaves out a cordoned node and a node that is not Ready, and counts them again when they return", function()
    local out, code = E.kubectl(d, { "cordon", "gpu-2" })
    assert.are.equal(0, code, out)
    nodes["gpu-2"].cordoned = true
    local free = wait_status("gpu-2 cordoned")
    assert.are.equal(1, free)
    out, code = E.kubectl(d, { "uncordon", "gpu-2" })
    assert.are.equal(0, code, out)
    nodes["gpu-2"].cordoned = false
    wait_status("gpu-2 uncordoned")
    G.node_status(d, "gpu-2", { units = 2, ready = "Unknown" })
    nodes["gpu-2"].ready = false
    free = wait_status("gpu-2 NotReady")
    assert.are.equal(1, free)
    G.node_status(d, "gpu-2", { units = 2 })
    nodes["gpu-2"].ready = true
    wait_status("gpu-2 Ready again")
  end)

  it("follows node loss: a deleted node's units are gone, its claims placed elsewhere when they fit", function()
    add_node("gpu-3", 4)
    wait_status("gpu-3 added")
    must(d, "DELETE", "/api/v1/nodes/gpu-1")
    nodes["gpu-1"] = nil
    local c = wait_phase("c1", "Bound") -- moved to gpu-3, the only node with 3 free
    assert(P.wait_until(function()
      c = E.get(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/c1")
      return c.status.node == "gpu-3"
    end, 15), json.encode(c))
    local free, max = wait_status("gpu-1 deleted")
    assert.are.equal(3, free) -- gpu-2: 2, gpu-3: 4 - 3
    assert.are.equal(2, max)
  end)

  it("shows kubectl get gpuclass with Free, Max-Free-Per-Node and Accepted as the status has them", function()
    local free, max = wait_status("before kubectl")
    local out, code = E.kubectl(d, { "get", "gpuclass", "l40s" })
    assert.are.equal(0, code, out)
    local header, row = out:match("([^\n]+)\n([^\n]+)")
    -- kubectl aligns each cell under its header; an empty cell (PROFILE of
    -- a passthrough class) is blank, so cut the row at the headers' offsets
    local function cell(name)
      local from = header:find(name, 1, true)
      assert(from, out)
      local to = header:find("%S", header:find("%s", from) or #header + 1)
      return (row:sub(from, to and to - 1 or -1):gsub("%s+$", ""))
    end
    assert.are.equal(tostring(free), cell("FREE"), out)
    assert.are.equal(tostring(max), cell("MAX-FREE-PER-NODE"), out)
    -- the Accepted condition's status (a JSONPath filter on the conditions)
    assert.are.equal("True", cell("ACCEPTED"), out)
  end)

  it("caps maxFreePerNode at the class's maxCount (one VM takes no more)", function()
    -- l40s-24c is a vGPU class: maxCount defaults to 1 (DESIGN.md §3); no
    -- node here offers it, so both are 0; give l40s a maxCount of 1
    local c = class()
    c.spec.maxCount = 1
    must(d, "PUT", CLASS_PATH .. "l40s", c)
    local st
    assert(P.wait_until(function()
      st = class().status
      return st.maxFreePerNode == 1
    end, 15), json.encode(st))
    local free = expected()
    assert.are.equal(free, st.free) -- free is not capped
    c = class()
    c.spec.maxCount = nil
    must(d, "PUT", CLASS_PATH .. "l40s", c)
    wait_status("maxCount unset again")
  end)

  it("shows nothing else: no capacity, bound, lost or pending counts, no node names", function()
    add_claim("big", 8) -- fits nowhere: Pending, 8 pending units
    wait_phase("big", "Pending")
    local free, max = wait_status("big pending")
    local st = class().status
    local keys = {}
    for k in pairs(st) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.are.same({ "conditions", "free", "maxFreePerNode" }, keys)
    local text = json.encode(st)
    for n in pairs { ["gpu-1"] = 1, ["gpu-2"] = 1, ["gpu-3"] = 1 } do
      assert.is_nil(text:find(n, 1, true), text)
    end
    -- the hidden figures (offered 6, bound 3, pending 8) appear in no
    -- condition either; only free and maxFreePerNode carry numbers
    for _, cond in ipairs(st.conditions) do
      for k, v in pairs(cond) do
        if k ~= "lastTransitionTime" and k ~= "observedGeneration" then
          assert.is_nil(tostring(v):find("%d"), k .. ": " .. tostring(v))
        end
      end
    end
    assert.are.equal(free, st.free)
    assert.are.equal(max, st.maxFreePerNode)
  end)

  it("exports capacity and claimed units per class on the leader only", function()
    local holder = lease_holder(d)
    local lead, follower
    for id, c in pairs(replicas) do
      if id == holder then lead = c else follower = c end
    end
    local m
    assert(P.wait_until(function()
      m = E.metrics(lead)
      return m['cozygpu_class_capacity_devices{class="l40s"}'] == 6
    end, 10), json.encode(m or {}))
    -- by phase, from the API's claims
    local want = { Pending = 0, Bound = 0, Attached = 0, Lost = 0 }
    for _, c in ipairs(d:state("gpuclaims").items) do
      if c.spec.class == "l40s" then want[c.status.phase] = want[c.status.phase] + c.spec.count end
    end
    for ph, u in pairs(want) do
      assert.are.equal(u, m[('cozygpu_class_claimed_devices{class="l40s",phase="%s"}'):format(ph)], ph)
    end
    local free = expected()
    assert.are.equal(free, m['cozygpu_class_free_devices{class="l40s"}'])
    assert.is_true((m['cozygpu_binder_placements_total{class="l40s"}'] or 0) >= 1)
    assert.is_true((m['cozygpu_binder_refusals_total{class="l40s",reason="NoNodeWithRoom"}'] or 0) >= 1)
    local fm = E.metrics(follower)
    assert.is_nil(fm['cozygpu_class_capacity_devices{class="l40s"}'])
  end)

  it("writes nothing while nothing changes, and a new leader writes nothing that is already shown", function()
    wait_status("settled")
    must(d, "DELETE", "/_double/log")
    P.sleep(2)
    local function status_writes()
      local n = 0
      for _, r in ipairs(must(d, "GET", "/_double/log")) do
        if r.path:find("^/apis/cozystack.io/v1alpha1/gpuclasses/[^/]+/status") and r.method ~= "GET" then
          n = n + 1
        end
      end
      return n
    end
    assert.are.equal(0, status_writes())
    -- kill the leader: the other replica takes over with the same view
    local holder = lease_holder(d)
    P.kill(replicas[holder].pid, 9)
    replicas[holder] = nil
    assert(P.wait_until(function()
      local h = lease_holder(d)
      return h and replicas[h] ~= nil
    end, 30), "no replica took over")
    local m
    local lead = replicas[lease_holder(d)]
    assert(P.wait_until(function()
      m = E.metrics(lead)
      return m['cozygpu_class_capacity_devices{class="l40s"}'] == 6
    end, 15), "the new leader never built its state")
    P.sleep(1)
    wait_status("after the take-over")
    -- the Accepted condition writer (status.c) PUTs when its condition
    -- changes; free and maxFreePerNode are PATCHed: none of those
    local n = 0
    for _, r in ipairs(must(d, "GET", "/_double/log")) do
      if r.path:find("^/apis/cozystack.io/v1alpha1/gpuclasses/[^/]+/status") and r.method == "PATCH" then n = n + 1 end
    end
    assert.are.equal(0, n)
  end)
end)
