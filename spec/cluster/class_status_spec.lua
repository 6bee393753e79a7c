-- GPUClass status.free and status.maxFreePerNode, and the leader's
-- per-class metrics, on a real control plane with two controller replicas
-- running as their ServiceAccount (DESIGN.md §3 "status.free,
-- status.maxFreePerNode ... nothing else";
-- docs/decisions/0030).
--
-- What the status should say is worked out here from what the API shows,
-- by the rule, never from what the controller prints: a node counts when
-- it is present, Ready and not cordoned (the candidates of DESIGN.md §6;
-- the nodes here carry the taint examples/classes/l40s.yaml tolerates, and
-- whatever the node-lifecycle controller adds); its free units are its
-- L40S (GPUNode functions capped at allocatable) minus the units of the
-- claims booked there (Bound, Attached, or Lost waiting on it); free adds
-- them up, maxFreePerNode is the most on one node (l40s has no maxCount:
-- no cap). Writes are counted by kube-apiserver itself
-- (apiserver_request_total), no-op writes included.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local json = H.json

local NS = "tenant-b" -- no ResourceQuota: capacity alone decides
local CLASS_PATH = "/apis/cozystack.io/v1alpha1/gpuclasses/"
local CLAIMS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims"
-- every verb that writes (kube-apiserver's names: a PUT is UPDATE)
local WRITES = { CREATE = true, UPDATE = true, PATCH = true, APPLY = true, DELETE = true, DELETECOLLECTION = true }

describe("GPUClass status (two replicas on a real control plane)", function()
  local c
  local nodes = {} -- name -> {units, alloc, ready, cordoned}

  local session = K.session { invariants = true, deploy = { replicas = 2 }, prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

  local function must(method, path, body)
    local st, v = c:request(method, path, body)
    assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st),
      type(v) == "table" and json.encode(v) or tostring(v)))
    return v
  end

  -- the status the rule gives from the API's nodes and claims
  local function expected()
    local booked = {}
    for _, cl in ipairs(c:state("gpuclaims").items) do
      local st = cl.status or {}
      if st.node and (st.phase == "Bound" or st.phase == "Attached" or st.phase == "Lost") and cl.spec.class == "l40s" then
        booked[st.node] = (booked[st.node] or 0) + cl.spec.count
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
    return (c:get(CLASS_PATH .. (name or "l40s")))
  end

  -- waits until the l40s status shows what the rule gives, and the claims
  -- have settled (what the rule reads is itself the binder's outcome)
  local function wait_status(what)
    local free, max, cl
    local ok = P.wait_until(function()
      free, max = expected()
      cl = class()
      local st = cl and cl.status or {}
      return st.free == free and st.maxFreePerNode == max
    end, 60, 0.2)
    assert(ok, ("%s: within 60 s, l40s status %s, the rule gives free %s, maxFreePerNode %s"):format(what,
      json.encode(cl and cl.status or {}), tostring(free), tostring(max)))
    return free, max
  end

  local function add_node(name, units)
    G.add_node(c, name, units)
    nodes[name] = { units = units, ready = true, cordoned = false }
  end

  local function add_claim(name, count)
    must("POST", CLAIMS, { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = name, namespace = NS }, spec = { class = "l40s", count = count } })
  end

  local function wait_phase(name, phase)
    local cl
    assert(P.wait_until(function()
      cl = c:get(CLAIMS .. "/" .. name)
      return cl and cl.status and cl.status.phase == phase
    end, 60, 0.2), ("claim %s: wanted %s within 60 s, got %s"):format(name, phase, json.encode(cl or {})))
    return cl
  end

  -- what kube-apiserver has counted of writes to GPUClasses (any
  -- subresource), and every class's resourceVersion
  local function class_writes()
    return c:apiserver_requests({ group = "cozystack.io", resource = "gpuclasses" }, WRITES)
  end
  local function class_versions()
    local v = {}
    for _, x in ipairs(c:state("gpuclasses").items) do v[x.metadata.name] = x.metadata.resourceVersion end
    return v
  end

  -- waits until the leader has applied every object the class status is
  -- made of, as the API server holds it now (the newest resourceVersion of
  -- each kind; cozygpu_binder_applied_resource_version, decision 0040)
  local function caught_up(what)
    for _, res in ipairs { "nodes", "gpunodes", "gpuclaims", "gpuclasses" } do
      local newest = 0
      for _, x in ipairs(c:state(res).items) do
        newest = math.max(newest, tonumber(x.metadata.resourceVersion))
      end
      assert(newest == 0 or c:wait_applied(res, newest),
        ("%s: the leader did not apply %s up to resourceVersion %d"):format(what, res, newest))
    end
  end
  -- a change the status does not read (an annotation on a node), taken by
  -- the leader through a whole pass and flush (its applied gauge says when)
  local touches = 0
  local function touch(what)
    local name = next(nodes)
    touches = touches + 1
    local st, n = c:request("PATCH", "/api/v1/nodes/" .. name,
      { metadata = { annotations = { ["spec.cozygpu.test/touch"] = tostring(touches) } } }, "application/merge-patch+json")
    assert(st == 200, ("PATCH node %s -> %s %s"):format(name, tostring(st), json.encode(n)))
    assert(c:wait_applied("nodes", n.metadata.resourceVersion),
      ("%s: the leader did not apply node %s at resourceVersion %s"):format(what, name, n.metadata.resourceVersion))
  end

  it("shows 0 free while no node offers the class, then what the nodes offer", function()
    wait_status("no node")
    assert.are.equal(0, class().status.free)
    add_node("gpu-1", 4)
    add_node("gpu-2", 2)
    local free, max = wait_status("two nodes")
    assert.are.equal(6, free) -- the spec's own arithmetic: 4 + 2
    assert.are.equal(4, max)
  end)

  it("caps maxFreePerNode at the class's maxCount (one VM takes no more)", function()
    -- l40s-24c is a vGPU class: maxCount defaults to 1 (DESIGN.md §3); no
    -- node here offers it, so both are 0; give l40s a maxCount of 1 (a
    -- merge patch through the API server and its GPUClass webhook, which
    -- refuses a maxCount change while a GPUClaim uses the class: so before
    -- the first order)
    c:must { "patch", "gpuclass", "l40s", "--type", "merge", "-p", '{"spec":{"maxCount":1}}' }
    local st
    assert(P.wait_until(function()
      st = class().status
      return st.maxFreePerNode == 1
    end, 60, 0.2), "maxFreePerNode not 1 within 60 s: " .. json.encode(st))
    local free = expected()
    assert.are.equal(free, st.free) -- free is not capped
    c:must { "patch", "gpuclass", "l40s", "--type", "merge", "-p", '{"spec":{"maxCount":null}}' }
    assert.is_nil(class().spec.maxCount)
    wait_status("maxCount unset again")
  end)

  it("follows new orders: a bound claim's units are no longer free", function()
    add_claim("c1", 3)
    wait_phase("c1", "Bound")
    local free, max = wait_status("c1 bound")
    assert.are.equal(3, free)
    assert.are.equal(2, max)
  end)

  it("leaves out a cordoned node and a node that is not Ready, and counts them again when they return", function()
    c:must { "cordon", "gpu-2" }
    nodes["gpu-2"].cordoned = true
    local free = wait_status("gpu-2 cordoned")
    assert.are.equal(1, free)
    c:must { "uncordon", "gpu-2" }
    nodes["gpu-2"].cordoned = false
    wait_status("gpu-2 uncordoned")
    -- the node-lifecycle controller taints it unreachable too, as in any
    -- cluster; the count follows the Ready condition either way
    G.node_status(c, "gpu-2", { units = 2, ready = "Unknown" })
    nodes["gpu-2"].ready = false
    free = wait_status("gpu-2 NotReady")
    assert.are.equal(1, free)
    G.node_status(c, "gpu-2", { units = 2 })
    nodes["gpu-2"].ready = true
    wait_status("gpu-2 Ready again")
  end)

  it("follows node loss: a deleted node's units are gone, its claims placed elsewhere when they fit", function()
    add_node("gpu-3", 4)
    wait_status("gpu-3 added")
    must("DELETE", "/api/v1/nodes/gpu-1")
    nodes["gpu-1"] = nil
    -- moved to gpu-3, the only node with 3 free
    local cl
    assert(P.wait_until(function()
      cl = c:get(CLAIMS .. "/c1")
      return cl.status.phase == "Bound" and cl.status.node == "gpu-3"
    end, 60, 0.2), "c1 not Bound on gpu-3 within 60 s: " .. json.encode(cl))
    local free, max = wait_status("gpu-1 deleted")
    assert.are.equal(3, free) -- gpu-2: 2, gpu-3: 4 - 3
    assert.are.equal(2, max)
  end)

  it("shows kubectl get gpuclass with Free, Max-Free-Per-Node and Accepted as the status has them", function()
    local free, max = wait_status("before kubectl")
    local out = c:must { "get", "gpuclass", "l40s" }
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
    local holder, lead = c:leader()
    assert(lead, "the Lease holder " .. tostring(holder) .. " is none of the replicas")
    local follower
    for id, r in pairs(c.replicas) do
      if id ~= holder then follower = r end
    end
    local m
    assert(P.wait_until(function()
      m = c:metrics(lead)
      return m and m['cozygpu_class_capacity_devices{class="l40s"}'] == 6
    end, 30, 0.2), "the leader's capacity of l40s is not 6 within 30 s: " .. json.encode(m or {}))
    -- by phase, from the API's claims
    local want = { Pending = 0, Bound = 0, Attached = 0, Lost = 0 }
    for _, cl in ipairs(c:state("gpuclaims").items) do
      if cl.spec.class == "l40s" then want[cl.status.phase] = want[cl.status.phase] + cl.spec.count end
    end
    for ph, u in pairs(want) do
      assert.are.equal(u, m[('cozygpu_class_claimed_devices{class="l40s",phase="%s"}'):format(ph)], ph)
    end
    local free = expected()
    assert.are.equal(free, m['cozygpu_class_free_devices{class="l40s"}'])
    assert.is_true((m['cozygpu_binder_placements_total{class="l40s"}'] or 0) >= 1)
    assert.is_true((m['cozygpu_binder_refusals_total{class="l40s",reason="NoNodeWithRoom"}'] or 0) >= 1)
    local fm = assert(c:metrics(follower), "the follower serves no /metrics")
    assert.is_nil(fm['cozygpu_class_capacity_devices{class="l40s"}'])
    assert.is_nil(fm['cozygpu_class_free_devices{class="l40s"}'])
  end)

  it("writes nothing while nothing changes, and a new leader writes nothing that is already shown", function()
    wait_status("settled")
    -- the leader has taken everything the status is made of: a write from
    -- here on is one it should not make
    caught_up("settled")
    local writes, versions = class_writes(), class_versions()
    -- the count is live: the classes' creation and the leader's status
    -- writes so far are in it
    assert.is_true(writes > 0, "kube-apiserver's metrics show no GPUClass write at all")
    local holder, lead = c:leader()
    local m0 = assert(c:metrics(lead))
    -- "nothing happens" is observed over whole passes of the leader's
    -- binder, each ending in a flush of class status, instead of a window
    -- of time: two changes the status does not read, each taken and flushed
    touch("nothing changed")
    touch("nothing changed")
    assert.are.equal(0, class_writes() - writes, "kube-apiserver counted GPUClass writes while nothing changed")
    assert.are.same(versions, class_versions())
    local m1 = assert(c:metrics(lead))
    assert.are.equal(m0['cozygpu_class_status_writes_total{result="ok"}'], m1['cozygpu_class_status_writes_total{result="ok"}'])
    -- kill the leader: the other replica takes over with the same view
    -- once the Lease (15 s by default) has expired
    P.kill(lead.pid, 9)
    c.replicas[holder] = nil
    local new
    assert(P.wait_until(function()
      local id, r = c:leader()
      new = r
      return id and r ~= nil
    end, 90, 0.5), "no replica took over the Lease within 90 s")
    local m
    assert(P.wait_until(function()
      m = c:metrics(new)
      return m and m['cozygpu_leader'] == 1 and m['cozygpu_class_capacity_devices{class="l40s"}'] == 6
    end, 60, 0.2), "the new leader never built its state within 60 s: " .. json.encode(m or {}))
    -- its binder has flushed once (the gauges come from the flush); it has
    -- applied everything the status is made of, and then passes over two
    -- changes the status does not read: still nothing written
    caught_up("after the take-over")
    touch("after the take-over")
    touch("after the take-over")
    wait_status("after the take-over")
    assert.are.equal(0, class_writes() - writes, "kube-apiserver counted GPUClass writes after the take-over")
    assert.are.same(versions, class_versions())
    m = c:metrics(new)
    assert.are.equal(0, m['cozygpu_class_status_writes_total{result="ok"}'] or 0)
    assert.are.equal(0, m['cozygpu_class_status_writes_total{result="error"}'] or 0)
  end)
end)
