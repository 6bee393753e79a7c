-- Usage records against the API server double, two replicas (DESIGN.md §3
-- "Usage records"; docs/decisions/0028). What is asserted comes from the
-- rule: one Cozystack Workload per GPUClaim while its phase is Bound or
-- Attached (status.kind gpu-device, resources
-- <class>.gpuclass.cozystack.io/devices = spec.count, operational only
-- while Attached), owned by its claim, labelled
-- workloads.cozystack.io/monitor with a WorkloadMonitor the controller
-- owns in the namespace; and from Cozystack's own reconcilers
-- (internal/controller/workload_controller.go deletes a Workload that has
-- no monitor label or whose monitor is missing; emulated below, since the
-- double runs no Cozystack controller).
local P = require "proc"
local E = require "controller_env"
local G = require "gpu_nodes"
local json = H.json

local L40S = G.L40S
local NS = "tenant-b" -- no ResourceQuota: capacity alone decides
local MONITOR_LABEL = "workloads.cozystack.io/monitor"
local KEY = "l40s.gpuclass.cozystack.io/devices"
local WL = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/workloads"
local WM = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/workloadmonitors"
local CLAIMS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims"
local VMIS = "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances"

local function must(d, method, path, body, ctype)
  local v, st = E.send(d, method, path, body, ctype)
  assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st), json.encode(v or {})))
  return v
end

local function add_claim(d, name, count)
  must(d, "POST", CLAIMS, { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
    metadata = { name = name, namespace = NS }, spec = { class = "l40s", count = count or 1 } })
end

local function claim(d, name)
  local c, st = E.get(d, CLAIMS .. "/" .. name)
  return st == 200 and c or nil
end

local function wait_claim(d, name, phase, timeout)
  local last
  assert(P.wait_until(function()
    last = claim(d, name)
    return last and last.status and last.status.phase == phase
  end, timeout or 15), ("claim %s: wanted %s, got %s"):format(name, phase, json.encode(last or {})))
  return last
end

-- every Workload of the namespace, from the double's store (whatever labels it has)
local function workloads(d)
  local out = {}
  for _, w in ipairs(d:state("workloads").items) do
    if w.metadata.namespace == NS then out[#out + 1] = w end
  end
  return out
end

-- the Workloads owned by claim `c` (its uid)
local function records_of(d, c)
  local out = {}
  for _, w in ipairs(workloads(d)) do
    for _, r in ipairs(w.metadata.ownerReferences or {}) do
      if r.kind == "GPUClaim" and r.uid == c.metadata.uid then out[#out + 1] = w end
    end
  end
  return out
end

-- Waits until claim `name` has exactly one record, whose status.operational
-- is `operational` and whose monitor label names an existing monitor.
-- Returns the record and the claim.
local function wait_record(d, name, operational, timeout)
  local c, recs
  assert(P.wait_until(function()
    c = claim(d, name)
    if not c then return false end
    recs = records_of(d, c)
    if #recs ~= 1 then return false end
    local w = recs[1]
    local mon = w.metadata.labels and w.metadata.labels[MONITOR_LABEL]
    return w.status and w.status.operational == operational and mon ~= nil and select(2, E.get(d, WM .. "/" .. mon)) == 200
  end, timeout or 15), ("claim %s: wanted one record, operational %s; have %s"):format(name, tostring(operational),
    json.encode(recs or {})))
  return recs[1], c
end

local function wait_no_record(d, uid, timeout)
  local left
  assert(P.wait_until(function()
    left = records_of(d, { metadata = { uid = uid } })
    return #left == 0
  end, timeout or 15), "records left: " .. json.encode(left or {}))
end

-- Cozystack's WorkloadReconciler (workload_controller.go Reconcile) run
-- on Workload `w` as the tenant's edit left it, before this controller
-- saw the edit: it deletes a Workload without the monitor label, or whose
-- monitor does not exist (`monitor_exists(name)` answers as of that
-- moment). The delete carries w's uid as a precondition, so it removes
-- that very object. Returns true when it deleted.
local function cozystack_reconcile(d, w, monitor_exists)
  local mon = w.metadata.labels and w.metadata.labels[MONITOR_LABEL]
  if mon ~= nil and monitor_exists(mon) then return false end
  local _, st = E.send(d, "DELETE", WL .. "/" .. w.metadata.name, { apiVersion = "v1", kind = "DeleteOptions",
    preconditions = { uid = w.metadata.uid } })
  assert.are.equal(200, st)
  return true
end

local function exists_now(d)
  return function(mon) return select(2, E.get(d, WM .. "/" .. mon)) == 200 end
end

local function lease_holder(d)
  local l = E.get(d, "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
  return l and l.spec and l.spec.holderIdentity
end

local function run_vmi(d, name, claims, node)
  local v = must(d, "POST", VMIS, {
    apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
    metadata = { name = name, namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" },
      annotations = { ["gpu.cozystack.io/claims"] = claims } },
    spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = L40S } } } } } })
  v.status = { phase = "Running", nodeName = node }
  must(d, "PUT", VMIS .. "/" .. name .. "/status", v)
end

describe("usage records (two replicas against the double)", function()
  local cluster, d

  setup(function()
    cluster = E.start_cluster {}
    d = cluster.d
  end)

  teardown(function()
    E.stop_cluster(cluster)
    P.stop_all()
  end)

  it("a Bound claim has one record: gpu-device, its class and count, not operational, owned by the claim, under a monitor the controller owns", function()
    G.add_node(d, "gpu-1", 2)
    add_claim(d, "u1", 2)
    local c = wait_claim(d, "u1", "Bound")
    local w = wait_record(d, "u1", false)
    assert.are.equal("gpu-device", w.status.kind)
    assert.are.equal("l40s", w.status.type)
    local keys = {}
    for k in pairs(w.status.resources) do keys[#keys + 1] = k end
    assert.are.same({ KEY }, keys)
    assert.are.equal(2, tonumber(w.status.resources[KEY]))
    assert.are.same({ { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", name = "u1",
      uid = c.metadata.uid, controller = true } }, w.metadata.ownerReferences)
    -- the monitor: in the namespace, labelled as the controller's, kind
    -- gpu-device, and a selector that is not empty (an empty one selects
    -- every pod) and uses only our label domain, which no pod carries
    local mon, st = E.get(d, WM .. "/" .. w.metadata.labels[MONITOR_LABEL])
    assert.are.equal(200, st)
    assert.are.equal("cozygpu", mon.metadata.labels["app.kubernetes.io/managed-by"])
    assert.are.equal("gpu-device", mon.spec.kind)
    local n = 0
    for k in pairs(mon.spec.selector) do
      n = n + 1
      assert.matches("^gpu%.cozystack%.io/", k)
    end
    assert.is_true(n > 0)
    -- as kubectl shows it
    local out, code = E.kubectl(d, { "get", "workloads", "-n", NS })
    assert.are.equal(0, code, out)
    assert.matches(w.metadata.name, out, 1, true)
  end)

  it("is operational while the claim is Attached, and not once the VMI is gone (Bound again)", function()
    local node = claim(d, "u1").status.node
    run_vmi(d, "vm-u1", "u1", node)
    wait_claim(d, "u1", "Attached")
    local w1 = wait_record(d, "u1", true)
    must(d, "DELETE", VMIS .. "/vm-u1")
    wait_claim(d, "u1", "Bound")
    local w2 = wait_record(d, "u1", false)
    assert.are.equal(w1.metadata.uid, w2.metadata.uid) -- the same record, updated
  end)

  it("disappears when the claim goes Lost (node deleted, no room elsewhere) and returns when it is rebound", function()
    local c = claim(d, "u1")
    local out, code = E.kubectl(d, { "delete", "node", c.status.node })
    assert.are.equal(0, code, out)
    wait_claim(d, "u1", "Lost")
    wait_no_record(d, c.metadata.uid)
    G.add_node(d, "gpu-2", 3)
    wait_claim(d, "u1", "Bound")
    wait_record(d, "u1", false)
  end)

  it("a deleted claim still Attached stays billed until its VMI ends, then its record goes", function()
    add_claim(d, "u2", 1)
    local c = wait_claim(d, "u2", "Bound")
    run_vmi(d, "vm-u2", "u2", c.status.node)
    wait_claim(d, "u2", "Attached")
    wait_record(d, "u2", true)
    must(d, "DELETE", CLAIMS .. "/u2")
    -- the protection finalizer holds it (decision 0026)
    c = claim(d, "u2")
    assert.is_truthy(c and c.metadata.deletionTimestamp)
    P.sleep(2)
    wait_record(d, "u2", true)
    must(d, "DELETE", VMIS .. "/vm-u2")
    assert(P.wait_until(function() return claim(d, "u2") == nil end, 15), "the claim was not released: " .. json.encode(claim(d, "u2") or {}))
    wait_no_record(d, c.metadata.uid)
  end)

  it("a tenant removing the monitor label: restored in place, or recreated when Cozystack's reconciler deleted the record first", function()
    local w = wait_record(d, "u1", false)
    local mname = w.metadata.labels[MONITOR_LABEL]
    local path = WL .. "/" .. w.metadata.name
    -- nothing deletes it: the controller puts the label back on the same object
    must(d, "PATCH", path, { metadata = { labels = { [MONITOR_LABEL] = json.null, ["example.com/team"] = "ml" } } })
    local w2 = wait_record(d, "u1", false)
    assert.are.equal(w.metadata.uid, w2.metadata.uid)
    assert.are.equal(mname, w2.metadata.labels[MONITOR_LABEL])
    -- Cozystack's reconciler sees the unlabelled record first and deletes it
    local edited = must(d, "PATCH", path, { metadata = { labels = { [MONITOR_LABEL] = json.null } } })
    assert.is_true(cozystack_reconcile(d, edited, exists_now(d)))
    local w3 = wait_record(d, "u1", false)
    assert.are_not.equal(w.metadata.uid, w3.metadata.uid)
    assert.are.equal(mname, w3.metadata.labels[MONITOR_LABEL])
  end)

  it("a tenant pointing the record at another monitor, or removing the controller's label from it, does not drop billing", function()
    local w = wait_record(d, "u1", false)
    local mname = w.metadata.labels[MONITOR_LABEL]
    local edited = must(d, "PATCH", WL .. "/" .. w.metadata.name,
      { metadata = { labels = { [MONITOR_LABEL] = "elsewhere" } } })
    assert.is_true(cozystack_reconcile(d, edited, exists_now(d))) -- no monitor "elsewhere"
    w = wait_record(d, "u1", false)
    assert.are.equal(mname, w.metadata.labels[MONITOR_LABEL])
    -- the record leaves the controller's selected watch: it is read by name
    must(d, "PATCH", WL .. "/" .. w.metadata.name, { metadata = { labels = { ["app.kubernetes.io/managed-by"] = json.null } } })
    local w2 = wait_record(d, "u1", false)
    assert.are.equal(w.metadata.uid, w2.metadata.uid)
    assert.are.equal("cozygpu", w2.metadata.labels["app.kubernetes.io/managed-by"])
  end)

  it("a tenant changing the monitor's selector or labels, or deleting it, does not drop billing", function()
    local w = wait_record(d, "u1", false)
    local mname = w.metadata.labels[MONITOR_LABEL]
    local before, bst = E.get(d, WM .. "/" .. mname)
    assert.are.equal(200, bst)
    -- a selector that would bill the tenant's own pods under our monitor
    must(d, "PATCH", WM .. "/" .. mname, { metadata = { labels = { ["app.kubernetes.io/managed-by"] = json.null } },
      spec = { selector = { ["app.kubernetes.io/instance"] = "vm-u1" } } })
    local mon
    assert(P.wait_until(function()
      mon = E.get(d, WM .. "/" .. mname)
      return mon and mon.metadata and mon.metadata.labels and mon.metadata.labels["app.kubernetes.io/managed-by"] == "cozygpu"
        and json.encode(mon.spec.selector) == json.encode(before.spec.selector)
    end, 15), "the monitor was not restored: " .. json.encode(mon or {}))
    assert.are.equal(before.metadata.uid, mon.metadata.uid)
    -- deleted: Cozystack's reconciler then deletes the records under it
    must(d, "DELETE", WM .. "/" .. mname)
    assert.is_true(cozystack_reconcile(d, w, function() return false end))
    local w2 = wait_record(d, "u1", false)
    assert.are_not.equal(w.metadata.uid, w2.metadata.uid)
    assert.are.equal(200, select(2, E.get(d, WM .. "/" .. mname)))
  end)

  it("after the leader is killed, the other replica creates no duplicate and loses no record", function()
    add_claim(d, "u3", 1)
    wait_claim(d, "u3", "Bound")
    local before = {}
    for _, n in ipairs { "u1", "u3" } do before[n] = wait_record(d, n, false).metadata.uid end
    local holder = lease_holder(d)
    assert.is_truthy(cluster.replicas[holder], tostring(holder))
    P.kill(cluster.replicas[holder].pid, 9)
    cluster.replicas[holder] = nil
    d:reset_log()
    local other = holder == "replica-a" and "replica-b" or "replica-a"
    assert(P.wait_until(function() return lease_holder(d) == other end, 20), "the Lease did not move")
    add_claim(d, "u4", 1) -- an order under the new leader
    wait_claim(d, "u4", "Pending") -- gpu-2 offers 3: u1 (2) and u3 hold them
    G.add_node(d, "gpu-3", 1)
    wait_claim(d, "u4", "Bound")
    wait_record(d, "u4", false)
    P.sleep(2) -- the new leader's comparison has run
    for n, uid in pairs(before) do
      local w = wait_record(d, n, false)
      assert.are.equal(uid, w.metadata.uid, n .. "'s record was replaced")
    end
    -- the new leader compared everything and wrote only u4's record:
    -- no update and no delete of a record or a monitor that was right
    local created = 0
    for _, r in ipairs(d:log()) do
      if r.path:find("/workload", 1, true) and r.method ~= "GET" then
        assert.are.equal("POST", r.method, json.encode(r))
        if r.status == 201 then created = created + 1 end
      end
    end
    assert.are.equal(1, created)
    -- one record per held claim, nothing else
    local held = 0
    for _, c in ipairs(d:state("gpuclaims").items) do
      if c.metadata.namespace == NS and c.status and (c.status.phase == "Bound" or c.status.phase == "Attached") then
        held = held + 1
      end
    end
    assert.are.equal(held, #workloads(d))
    local m = E.metrics(cluster.replicas[other])
    assert.is_true((m['cozygpu_usage_record_writes_total{object="record",op="create",result="ok"}'] or 0) >= 1)
    assert.are.equal(1, m["cozygpu_usage_records_available"])
  end)

  it("a Workload a tenant made under a claim's record name is taken over: the claim's owner, labels and count", function()
    -- made before the claim, claiming 8 devices and no owner
    must(d, "POST", WL, { apiVersion = "cozystack.io/v1alpha1", kind = "Workload",
      metadata = { name = "gpu-forged", namespace = NS, labels = { ["example.com/team"] = "ml" } },
      status = { kind = "gpu-device", type = "l40s", resources = { [KEY] = "8" }, operational = true } })
    G.add_node(d, "gpu-5", 1)
    add_claim(d, "forged", 1)
    local c = wait_claim(d, "forged", "Bound")
    local w = wait_record(d, "forged", false)
    assert.are.equal("gpu-forged", w.metadata.name)
    assert.are.equal(1, tonumber(w.status.resources[KEY]))
    assert.are.equal(c.metadata.uid, w.metadata.ownerReferences[1].uid)
    assert.are.equal("ml", w.metadata.labels["example.com/team"]) -- the tenant's other labels stay
  end)

  it("names each record after its claim; names too long for gpu-<claim> are cut with a hash, distinct and valid", function()
    G.add_node(d, "gpu-4", 3)
    local base = ("a"):rep(237) .. ".b" -- a '.' where the cut falls
    local long1, long2 = base .. ("x"):rep(10), base .. ("y"):rep(10)
    for _, n in ipairs { "short-1", long1, long2 } do add_claim(d, n, 1) end
    local names = {}
    for _, n in ipairs { "short-1", long1, long2 } do
      wait_claim(d, n, "Bound")
      local w = wait_record(d, n, false)
      names[n] = w.metadata.name
      assert.is_true(#w.metadata.name <= 253, w.metadata.name)
      -- a DNS subdomain: labels of [a-z0-9-], alphanumeric at both ends
      for label in (w.metadata.name .. "."):gmatch("([^.]*)%.") do
        assert.matches("^[a-z0-9][-a-z0-9]*$", label)
        assert.matches("[a-z0-9]$", label)
      end
    end
    assert.are.equal("gpu-short-1", names["short-1"])
    assert.are_not.equal(names[long1], names[long2])
  end)

  it("never gives two claims one record: a claim named after another's cut record name keeps its own", function()
    -- a tenant names a second claim so that "gpu-" and its name spell the
    -- first claim's cut record name; each claim must keep its own record,
    -- and neither is written over and over
    G.add_node(d, "gpu-9", 3)
    local long = ("a"):rep(251)
    add_claim(d, long, 1)
    wait_claim(d, long, "Bound")
    local first = wait_record(d, long, false)
    local twin = first.metadata.name:sub(5) -- whatever follows "gpu" and one more character
    if #twin > 249 then twin = twin:sub(1, 249) end
    twin = twin:gsub("^[^a-z0-9]+", "")
    add_claim(d, twin, 2)
    wait_claim(d, twin, "Bound")
    local second = wait_record(d, twin, false)
    assert.are_not.equal(first.metadata.name, second.metadata.name)
    P.sleep(2)
    -- still the same two objects: nothing deleted and made again
    local again1 = wait_record(d, long, false)
    local again2 = wait_record(d, twin, false)
    assert.are.equal(first.metadata.uid, again1.metadata.uid)
    assert.are.equal(second.metadata.uid, again2.metadata.uid)
  end)
end)

describe("usage records on a cluster without Cozystack's Workload types", function()
  local cluster, d, replicas

  setup(function()
    cluster = E.start_cluster { double_args = { "--without", "workloads,workloadmonitors" } }
    d, replicas = cluster.d, cluster.replicas
  end)

  teardown(function()
    E.stop_cluster(cluster)
    P.stop_all()
  end)

  it("serves no Workloads (the double is what the case needs)", function()
    local _, st = E.get(d, WL)
    assert.are.equal(404, st)
  end)

  it("claims still bind; the leader warns in its log and with an Event on its Lease, and says 0 in a gauge; nothing crashes", function()
    G.add_node(d, "gpu-1", 1)
    add_claim(d, "n1", 1)
    wait_claim(d, "n1", "Bound")
    local ev
    assert(P.wait_until(function()
      local list = E.get(d, "/api/v1/namespaces/cozy-gpu/events")
      for _, e in ipairs(list and list.items or {}) do
        if e.reason == "UsageRecordsUnavailable" then ev = e return true end
      end
      return false
    end, 15), "no UsageRecordsUnavailable Event")
    assert.are.equal("Warning", ev.type)
    assert.are.equal("Lease", ev.involvedObject.kind)
    assert.are.equal("cozygpu-controller", ev.involvedObject.name)
    local holder = lease_holder(d)
    local r = replicas[holder]
    local warned = false
    for _, rec in ipairs(E.log_records(r)) do
      if rec.level == "warn" and tostring(rec.msg or rec.message):find("usage records are not written", 1, true) then
        warned = true
      end
    end
    assert.is_true(warned, P.read(r.log))
    local m = E.metrics(r)
    assert.are.equal(0, m["cozygpu_usage_records_available"])
    for id, c in pairs(replicas) do assert.is_true(P.alive(c.pid), id .. " died") end
    -- the Event is rate-limited: one, not one per claim or per second
    add_claim(d, "n2", 1)
    P.sleep(3)
    local n = 0
    for _, e in ipairs(E.get(d, "/api/v1/namespaces/cozy-gpu/events").items) do
      if e.reason == "UsageRecordsUnavailable" then n = n + 1 end
    end
    assert.are.equal(1, n)
  end)
end)
