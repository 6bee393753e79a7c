-- Usage records on a real control plane, two replicas (DESIGN.md §3
-- "Usage records"; docs/decisions/0028). What is asserted
-- comes from the rule: one Cozystack Workload per GPUClaim while its phase
-- is Bound or Attached (status.kind gpu-device, resources
-- <class>.gpuclass.cozystack.io/devices = spec.count, operational only
-- while Attached), owned by its claim, labelled
-- workloads.cozystack.io/monitor with a WorkloadMonitor the controller
-- owns in the namespace; from Cozystack's own reconcilers
-- (internal/controller/workload_controller.go deletes a Workload that has
-- no monitor label or whose monitor is missing; emulated below, since no
-- Cozystack controller runs here); and from Cozystack's tenant roles
-- (packages/system/cozystack-basics/templates/clusterroles.yaml,
-- cozy:tenant:base and cozy:tenant:view:base: `workloads` and
-- `workloadmonitors` get, list, watch and nothing more), which the API
-- server's RBAC authorizer enforces.
--
-- The tenant is the user bob in tenant-b (no ResourceQuota: capacity alone
-- decides), with cluster/tenant-users.yaml's GPU tenant role (claims,
-- VMIs) and Cozystack's read-only rule on the usage kinds. The edits of
-- records and monitors need more than that: a real tenant is refused them
-- (asserted first); the tests of what the controller does about such
-- edits then give bob write access to the two kinds, as a hoster granting
-- tenants more than Cozystack's roles would (or any other user with those
-- rights), and edit through the API server as bob.
--
-- No kubelet and no virt-handler run: the test writes a VMI's status as
-- virt-handler would (KubeVirt's VMI CRD has no status subresource).
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local json = H.json

local NS = "tenant-b"
local MONITOR_LABEL = "workloads.cozystack.io/monitor"
local KEY = "l40s.gpuclass.cozystack.io/devices"
local WL = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/workloads"
local WM = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/workloadmonitors"
local CLAIMS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims"
local VMIS = "/apis/kubevirt.io/v1/namespaces/" .. NS .. "/virtualmachineinstances"
local LEASE = "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller"

local WRITE_VERBS = { create = true, update = true, patch = true, delete = true, deletecollection = true }

-- deadlines: the machine runs several control planes at once
local T = 60

local now, epoch = K.now, K.epoch

-- the JSON log records of a replica
local function log_records(r)
  local out = {}
  for line in (P.read(r.log) or ""):gmatch("[^\n]+") do
    local ok, v = pcall(json.decode, line)
    if ok and type(v) == "table" then out[#out + 1] = v end
  end
  return out
end

-- helpers over the cluster env.c (set by a describe block's setup), the
-- tenant acting through kubeconfig env.user
local function helpers(env)
  local h = {}

  -- kubectl as the tenant: stdout, stderr, exit code
  function h.tenant(args, stdin)
    return env.c:kubectl(args, { kubeconfig = env.user, stdin = stdin })
  end

  function h.must_tenant(args, stdin)
    local out, err, code = h.tenant(args, stdin)
    assert(code == 0, ("kubectl (tenant) %s: exit %s\n%s%s"):format(table.concat(args, " "), tostring(code), out, err))
    return out
  end

  -- the tenant orders a claim
  function h.add_claim(name, count)
    h.must_tenant({ "create", "-f", "-" }, json.encode { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = name, namespace = NS }, spec = { class = "l40s", count = count or 1 } })
  end

  function h.claim(name)
    return (env.c:get(CLAIMS .. "/" .. name))
  end

  function h.wait_claim(name, phase, timeout)
    local last
    assert(P.wait_until(function()
      last = h.claim(name)
      return last and last.status and last.status.phase == phase
    end, timeout or T, 0.3), ("claim %s: wanted %s, got %s"):format(name, phase, json.encode(last or {})))
    return last
  end

  -- every Workload of the namespace, as the API server lists it
  function h.workloads()
    local out = {}
    for _, w in ipairs(env.c:state("workloads").items) do
      if w.metadata.namespace == NS then out[#out + 1] = w end
    end
    return out
  end

  -- the Workloads owned by claim `cl` (its uid)
  function h.records_of(cl)
    local out = {}
    for _, w in ipairs(h.workloads()) do
      for _, r in ipairs(w.metadata.ownerReferences or {}) do
        if r.kind == "GPUClaim" and r.uid == cl.metadata.uid then out[#out + 1] = w end
      end
    end
    return out
  end

  -- Waits until claim `name` has exactly one record, whose
  -- status.operational is `operational` and whose monitor label names an
  -- existing monitor. Returns the record and the claim.
  function h.wait_record(name, operational, timeout)
    local cl, recs
    assert(P.wait_until(function()
      cl = h.claim(name)
      if not cl then return false end
      recs = h.records_of(cl)
      if #recs ~= 1 then return false end
      local w = recs[1]
      local mon = w.metadata.labels and w.metadata.labels[MONITOR_LABEL]
      return w.status and w.status.operational == operational and mon ~= nil and env.c:get(WM .. "/" .. mon) ~= nil
    end, timeout or T, 0.3), ("claim %s: wanted one record, operational %s; have %s"):format(name,
      tostring(operational), json.encode(recs or {})))
    return recs[1], cl
  end

  function h.wait_no_record(uid, timeout)
    local left
    assert(P.wait_until(function()
      left = h.records_of { metadata = { uid = uid } }
      return #left == 0
    end, timeout or T, 0.3), "records left: " .. json.encode(left or {}))
  end

  -- Cozystack's WorkloadReconciler (workload_controller.go Reconcile) run
  -- on Workload `w` as the edit left it, before this controller saw the
  -- edit: it deletes a Workload without the monitor label, or whose
  -- monitor does not exist (`monitor_exists(name)` answers as of that
  -- moment). The delete carries w's uid as a precondition, so it removes
  -- that very object; it is Cozystack's controller, not the tenant, that
  -- deletes (as the admin here). Returns true when it deleted.
  function h.cozystack_reconcile(w, monitor_exists)
    local mon = w.metadata.labels and w.metadata.labels[MONITOR_LABEL]
    if mon ~= nil and monitor_exists(mon) then return false end
    local st, v = env.c:request("DELETE", WL .. "/" .. w.metadata.name, { apiVersion = "v1", kind = "DeleteOptions",
      preconditions = { uid = w.metadata.uid } })
    assert(st == 200, ("DELETE %s -> %s %s"):format(w.metadata.name, tostring(st), json.encode(v)))
    return true
  end

  function h.exists_now(mon) return env.c:get(WM .. "/" .. mon) ~= nil end

  function h.lease_holder()
    local l = env.c:get(LEASE)
    return l and l.spec and l.spec.holderIdentity
  end

  -- the tenant runs a VMI naming `claims` with `gpus` GPU entries (one per
  -- claimed GPU, as VMI admission requires); virt-handler's part (status
  -- Running on `node`) is written by the test, with the object: KubeVirt's
  -- VMI CRD has no status subresource
  function h.run_vmi(name, claims, node, gpus)
    local entries = {}
    for i = 1, gpus or 1 do entries[i] = { name = "gpu" .. i, deviceName = G.L40S } end
    h.must_tenant({ "create", "-f", "-" }, json.encode {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = NS, labels = { ["gpu.cozystack.io/class-reference"] = "true" },
        annotations = { ["gpu.cozystack.io/claims"] = claims } },
      spec = { domain = { devices = { gpus = entries },
        resources = { requests = { memory = "1Gi" } } } } })
    for _ = 1, 20 do
      local v = assert(env.c:get(VMIS .. "/" .. name))
      v.status = { phase = "Running", nodeName = node }
      local st, out = env.c:request("PUT", VMIS .. "/" .. name, v)
      if st == 200 then return end
      assert(st == 409, ("PUT VMI %s -> %s %s"):format(name, tostring(st), json.encode(out)))
    end
    error("VMI " .. name .. ": status not written (409 twenty times)")
  end

  -- Returns once the leader's usage writer has done every key it had
  -- queued at the call. It publishes no "applied up to" of its own (the
  -- binder's gauge, decision 0040, is not its thread's), but it takes its
  -- queue whole, one batch after the other, and puts back a record's
  -- monitor label in place: the record of claim `poke` (another claim's,
  -- not one under test) is pointed at another monitor (as the admin), and
  -- the label waited back, twice. The second edit is queued after the
  -- first put-back was written, so its batch was taken after the batch
  -- holding the first edit, and with it every key queued before, was done.
  function h.usage_done(poke)
    local rec = h.records_of(assert(h.claim(poke), "no claim " .. poke))[1]
    assert(rec, "claim " .. poke .. " has no record to poke")
    local mon = rec.metadata.labels[MONITOR_LABEL]
    for i = 1, 2 do
      local st, v = env.c:request("PATCH", WL .. "/" .. rec.metadata.name,
        { metadata = { labels = { [MONITOR_LABEL] = "spec-poke-" .. i } } }, "application/merge-patch+json")
      assert(st == 200, ("PATCH record %s -> %s %s"):format(rec.metadata.name, tostring(st), json.encode(v)))
      local last
      assert(P.wait_until(function()
        last = env.c:get(WL .. "/" .. rec.metadata.name)
        return last and last.metadata.labels and last.metadata.labels[MONITOR_LABEL] == mon
      end, T, 0.1), ("the usage writer did not put back record %s's monitor label: %s"):format(rec.metadata.name,
        json.encode(last or {})))
    end
  end

  -- a tenant's merge patch of a Workload (kind "workload") or monitor, as
  -- bob: the patched object
  function h.tenant_patch(kind, name, patch)
    return json.decode(h.must_tenant { "-n", NS, "patch", kind, name, "--type", "merge", "-p", json.encode(patch),
      "-o", "json" })
  end

  return h
end

-- Cozystack's tenant rule on the usage kinds (cozy:tenant:base,
-- cozy:tenant:view:base), and write access beyond it (granted later)
local TENANT_RBAC = [[
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cozystack-tenant-usage-view, namespace: tenant-b}
rules:
  - apiGroups: ["cozystack.io"]
    resources: ["workloads", "workloadmonitors"]
    verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-usage-view, namespace: tenant-b}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cozystack-tenant-usage-view}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-gpu-tenant, namespace: tenant-b}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: example-gpu-tenant}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}
]]

local USAGE_WRITE = [[
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: usage-write-beyond-cozystack, namespace: tenant-b}
rules:
  - apiGroups: ["cozystack.io"]
    resources: ["workloads", "workloadmonitors"]
    verbs: ["create", "update", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-usage-write, namespace: tenant-b}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: usage-write-beyond-cozystack}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}
]]

describe("usage records (two replicas through kube-apiserver)", function()
  local c
  local env = {}
  local h = helpers(env)
  local session = K.session { invariants = true, deploy = { replicas = 2 }, prepare = function(cl)
    c, env.c = cl, cl
    c:must({ "apply", "-f", "-" }, { stdin = H.read("cluster/tenant-users.yaml") })
    c:must({ "apply", "-f", "-" }, { stdin = TENANT_RBAC })
    local out, code = P.sh(("cluster/cluster.sh user %s bob 2>&1"):format(P.q(c.dir)))
    assert(code == 0, out)
    env.user = (out:gsub("%s+$", ""))
  end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

  it("a Bound claim has one record: gpu-device, its class and count, not operational, owned by the claim, under a monitor the controller owns", function()
    G.add_node(c, "gpu-1", 2)
    h.add_claim("u1", 2)
    local cl = h.wait_claim("u1", "Bound")
    local w = h.wait_record("u1", false)
    assert.are.equal("gpu-device", w.status.kind)
    assert.are.equal("l40s", w.status.type)
    local keys = {}
    for k in pairs(w.status.resources) do keys[#keys + 1] = k end
    assert.are.same({ KEY }, keys)
    assert.are.equal(2, tonumber(w.status.resources[KEY]))
    assert.are.same({ { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", name = "u1",
      uid = cl.metadata.uid, controller = true } }, w.metadata.ownerReferences)
    -- the monitor: in the namespace, labelled as the controller's, kind
    -- gpu-device, and a selector that is not empty (an empty one selects
    -- every pod) and uses only our label domain, which no pod carries
    local mon = c:get(WM .. "/" .. w.metadata.labels[MONITOR_LABEL])
    assert.is_truthy(mon)
    assert.are.equal("cozygpu", mon.metadata.labels["app.kubernetes.io/managed-by"])
    assert.are.equal("gpu-device", mon.spec.kind)
    local n = 0
    for k in pairs(mon.spec.selector) do
      n = n + 1
      assert.matches("^gpu%.cozystack%.io/", k)
    end
    assert.is_true(n > 0)
    -- as kubectl shows it to the tenant (Cozystack's roles let it read them)
    local out = h.must_tenant { "get", "workloads", "-n", NS }
    assert.matches(w.metadata.name, out, 1, true)
  end)

  it("a tenant with Cozystack's roles reads its record and monitor but may not edit, delete or create them (Forbidden)", function()
    local w = h.wait_record("u1", false)
    local mname = w.metadata.labels[MONITOR_LABEL]
    local function refused(verb, resource, args, stdin)
      local out, err, code = h.tenant(args, stdin)
      assert.are_not.equal(0, code, out)
      assert.matches(('User "bob" cannot %s resource "%s" in API group "cozystack.io" in the namespace "%s"')
        :format(verb, resource, NS), err, 1, true)
    end
    refused("patch", "workloads", { "-n", NS, "label", "workload", w.metadata.name, MONITOR_LABEL .. "-" })
    refused("delete", "workloads", { "-n", NS, "delete", "workload", w.metadata.name })
    refused("create", "workloads", { "create", "-f", "-" }, json.encode { apiVersion = "cozystack.io/v1alpha1",
      kind = "Workload", metadata = { name = "gpu-squat", namespace = NS },
      status = { kind = "gpu-device", resources = { [KEY] = "8" } } })
    refused("patch", "workloadmonitors", { "-n", NS, "patch", "workloadmonitor", mname, "--type", "merge", "-p",
      '{"spec":{"selector":{"app.kubernetes.io/instance":"vm-u1"}}}' })
    refused("delete", "workloadmonitors", { "-n", NS, "delete", "workloadmonitor", mname })
    -- nothing changed
    local again = h.wait_record("u1", false)
    assert.are.same({ w.metadata.uid, w.metadata.resourceVersion }, { again.metadata.uid, again.metadata.resourceVersion })
  end)

  it("is operational while the claim is Attached, and not once the VMI is gone (Bound again)", function()
    local node = h.claim("u1").status.node
    h.run_vmi("vm-u1", "u1", node, 2) -- u1 holds 2
    h.wait_claim("u1", "Attached")
    local w1 = h.wait_record("u1", true)
    h.must_tenant { "-n", NS, "delete", "vmi", "vm-u1" }
    h.wait_claim("u1", "Bound")
    local w2 = h.wait_record("u1", false)
    assert.are.equal(w1.metadata.uid, w2.metadata.uid) -- the same record, updated
  end)

  it("disappears when the claim goes Lost (node deleted, no room elsewhere) and returns when it is rebound", function()
    local cl = h.claim("u1")
    c:must { "delete", "node", cl.status.node }
    h.wait_claim("u1", "Lost")
    h.wait_no_record(cl.metadata.uid)
    G.add_node(c, "gpu-2", 3)
    h.wait_claim("u1", "Bound")
    h.wait_record("u1", false)
  end)

  it("a deleted claim still Attached stays billed until its VMI ends, then its record goes", function()
    h.add_claim("u2", 1)
    local cl = h.wait_claim("u2", "Bound")
    h.run_vmi("vm-u2", "u2", cl.status.node)
    h.wait_claim("u2", "Attached")
    local w = h.wait_record("u2", true)
    h.must_tenant { "-n", NS, "delete", "gpuclaim", "u2", "--wait=false" }
    -- the protection finalizer holds it (decision 0026)
    cl = h.claim("u2")
    assert.is_truthy(cl and cl.metadata.deletionTimestamp)
    -- the leader's binder has taken the deletion (and kept it Attached),
    -- and its usage writer has done the claim's key (queued by the watch
    -- before the binder's, usage_done): the record must not go
    assert(c:wait_applied("gpuclaims", cl.metadata.resourceVersion),
      "the leader did not apply the deletion of u2 at resourceVersion " .. cl.metadata.resourceVersion)
    h.usage_done("u1")
    local still = h.wait_record("u2", true)
    assert.are.equal(w.metadata.uid, still.metadata.uid)
    h.must_tenant { "-n", NS, "delete", "vmi", "vm-u2" }
    assert(P.wait_until(function() return h.claim("u2") == nil end, T, 0.3),
      "the claim was not released: " .. json.encode(h.claim("u2") or {}))
    h.wait_no_record(cl.metadata.uid)
  end)

  it("a record's monitor label removed: restored in place, or recreated when Cozystack's reconciler deleted the record first", function()
    -- write access beyond Cozystack's tenant roles (see the top)
    c:must({ "apply", "-f", "-" }, { stdin = USAGE_WRITE })
    local w = h.wait_record("u1", false)
    local mname = w.metadata.labels[MONITOR_LABEL]
    -- nothing deletes it: the controller puts the label back on the same object
    h.tenant_patch("workload", w.metadata.name,
      { metadata = { labels = { [MONITOR_LABEL] = json.null, ["example.com/team"] = "ml" } } })
    local w2
    assert(P.wait_until(function()
      w2 = h.wait_record("u1", false)
      return w2.metadata.labels["example.com/team"] == "ml"
    end, T, 0.3), json.encode(w2))
    assert.are.equal(w.metadata.uid, w2.metadata.uid)
    assert.are.equal(mname, w2.metadata.labels[MONITOR_LABEL])
    -- Cozystack's reconciler sees the unlabelled record first and deletes it
    local edited = h.tenant_patch("workload", w.metadata.name, { metadata = { labels = { [MONITOR_LABEL] = json.null } } })
    assert.is_true(h.cozystack_reconcile(edited, h.exists_now))
    local w3 = h.wait_record("u1", false)
    assert.are_not.equal(w.metadata.uid, w3.metadata.uid)
    assert.are.equal(mname, w3.metadata.labels[MONITOR_LABEL])
  end)

  it("a record pointed at another monitor, or without the controller's label, does not drop billing", function()
    local w = h.wait_record("u1", false)
    local mname = w.metadata.labels[MONITOR_LABEL]
    local edited = h.tenant_patch("workload", w.metadata.name, { metadata = { labels = { [MONITOR_LABEL] = "elsewhere" } } })
    assert.is_true(h.cozystack_reconcile(edited, h.exists_now)) -- no monitor "elsewhere"
    w = h.wait_record("u1", false)
    assert.are.equal(mname, w.metadata.labels[MONITOR_LABEL])
    -- the record leaves the controller's selected watch: it is read by name
    h.tenant_patch("workload", w.metadata.name, { metadata = { labels = { ["app.kubernetes.io/managed-by"] = json.null } } })
    local w2
    assert(P.wait_until(function()
      w2 = h.wait_record("u1", false)
      return w2.metadata.labels["app.kubernetes.io/managed-by"] == "cozygpu"
    end, T, 0.3), json.encode(w2))
    assert.are.equal(w.metadata.uid, w2.metadata.uid)
  end)

  it("the monitor's selector or labels changed, or the monitor deleted, does not drop billing", function()
    local w = h.wait_record("u1", false)
    local mname = w.metadata.labels[MONITOR_LABEL]
    local before = assert(c:get(WM .. "/" .. mname))
    -- a selector that would bill the tenant's own pods under our monitor
    -- (a merge patch adds the key to the selector map)
    local edited = h.tenant_patch("workloadmonitor", mname, { metadata = { labels = { ["app.kubernetes.io/managed-by"] = json.null } },
      spec = { selector = { ["app.kubernetes.io/instance"] = "vm-u1" } } })
    assert.are.equal("vm-u1", edited.spec.selector["app.kubernetes.io/instance"])
    local mon
    assert(P.wait_until(function()
      mon = c:get(WM .. "/" .. mname)
      return mon and mon.metadata and mon.metadata.labels and mon.metadata.labels["app.kubernetes.io/managed-by"] == "cozygpu"
        and json.encode(mon.spec.selector) == json.encode(before.spec.selector)
    end, T, 0.3), "the monitor was not restored: " .. json.encode(mon or {}))
    assert.are.equal(before.metadata.uid, mon.metadata.uid)
    -- deleted: Cozystack's reconciler then deletes the records under it
    h.must_tenant { "-n", NS, "delete", "workloadmonitor", mname, "--wait=false" }
    assert.is_true(h.cozystack_reconcile(w, function() return false end))
    local w2 = h.wait_record("u1", false)
    assert.are_not.equal(w.metadata.uid, w2.metadata.uid)
    local mon2 = c:get(WM .. "/" .. mname)
    assert.is_truthy(mon2)
    assert.are_not.equal(before.metadata.uid, mon2.metadata.uid)
  end)

  it("after the leader is killed, the other replica creates no duplicate and rewrites no record", function()
    h.add_claim("u3", 1)
    h.wait_claim("u3", "Bound")
    local before = {}
    for _, n in ipairs { "u1", "u3" } do before[n] = h.wait_record(n, false).metadata end
    local mname = h.wait_record("u1", false).metadata.labels[MONITOR_LABEL]
    local mon_before = assert(c:get(WM .. "/" .. mname)).metadata
    local holder = h.lease_holder()
    assert.is_truthy(c.replicas[holder], tostring(holder))
    local killed = now()
    P.kill(c.replicas[holder].pid, 9)
    c.replicas[holder] = nil
    local other = holder == "replica-a" and "replica-b" or "replica-a"
    assert(P.wait_until(function() return h.lease_holder() == other end, 90, 0.5),
      "the Lease did not move to " .. other .. ": " .. json.encode(c:get(LEASE)))
    h.add_claim("u4", 1) -- an order under the new leader
    h.wait_claim("u4", "Pending") -- gpu-2 offers 3: u1 (2) and u3 hold them
    G.add_node(c, "gpu-3", 1)
    h.wait_claim("u4", "Bound")
    -- u4's record is written in the new leader's first comparison or after
    -- it (it compares every claim when it takes the lead)
    h.wait_record("u4", false)
    -- the records and the monitor that were right are the same objects,
    -- not written (a write changes resourceVersion)
    for n, md in pairs(before) do
      local w = h.wait_record(n, false)
      assert.are.same({ md.uid, md.resourceVersion }, { w.metadata.uid, w.metadata.resourceVersion },
        n .. "'s record was replaced or rewritten")
    end
    local mon = assert(c:get(WM .. "/" .. mname))
    assert.are.same({ mon_before.uid, mon_before.resourceVersion }, { mon.metadata.uid, mon.metadata.resourceVersion })
    -- since the kill, the new leader wrote u4's record and nothing else, as
    -- the API server's audit log has it (a replica names itself in its user
    -- agent)
    local writes_by_other = {}
    for _, ev in ipairs(c:audit(function(ev)
      local r = ev.objectRef
      -- writes only: the audit policy logs every request of the controller's
      -- ServiceAccount, and a new leader lists both types once (whether
      -- they are served)
      return r and (r.resource == "workloads" or r.resource == "workloadmonitors")
        and WRITE_VERBS[ev.verb]
        and (ev.userAgent or ""):find("(" .. other .. ")", 1, true) ~= nil
        and epoch(ev.requestReceivedTimestamp) >= killed
    end)) do
      writes_by_other[#writes_by_other + 1] = { ev.verb, ev.objectRef.resource, ev.objectRef.name,
        ev.responseStatus and ev.responseStatus.code }
    end
    assert.are.same({ { "create", "workloads", "gpu-u4", 201 } }, writes_by_other)
    -- and counts it so
    local m = c:metrics(c.replicas[other])
    assert(m, "no metrics from " .. other)
    local writes = {}
    for k, v in pairs(m) do
      if k:find("^cozygpu_usage_record_writes_total") and v > 0 then writes[k] = v end
    end
    assert.are.same({ ['cozygpu_usage_record_writes_total{object="record",op="create",result="ok"}'] = 1 }, writes)
    assert.are.equal(1, m["cozygpu_usage_records_available"])
    -- one record per held claim, nothing else
    local held = 0
    for _, cl in ipairs(c:state("gpuclaims").items) do
      if cl.metadata.namespace == NS and cl.status and (cl.status.phase == "Bound" or cl.status.phase == "Attached") then
        held = held + 1
      end
    end
    assert.are.equal(held, #h.workloads())
  end)

  it("a Workload made under a claim's record name before the claim is taken over: the claim's owner, labels and count", function()
    -- made before the claim, claiming 8 devices and no owner
    h.must_tenant({ "create", "-f", "-" }, json.encode { apiVersion = "cozystack.io/v1alpha1", kind = "Workload",
      metadata = { name = "gpu-forged", namespace = NS, labels = { ["example.com/team"] = "ml" } },
      status = { kind = "gpu-device", type = "l40s", resources = { [KEY] = "8" }, operational = true } })
    G.add_node(c, "gpu-5", 1)
    h.add_claim("forged", 1)
    local cl = h.wait_claim("forged", "Bound")
    local w = h.wait_record("forged", false)
    assert.are.equal("gpu-forged", w.metadata.name)
    assert.are.equal(1, tonumber(w.status.resources[KEY]))
    assert.are.equal(cl.metadata.uid, w.metadata.ownerReferences[1].uid)
    assert.are.equal("cozygpu", w.metadata.labels["app.kubernetes.io/managed-by"])
    assert.are.equal("ml", w.metadata.labels["example.com/team"]) -- the other labels stay
  end)

  it("names each record after its claim; names too long for gpu-<claim> are cut with a hash, distinct and valid", function()
    G.add_node(c, "gpu-4", 3)
    local base = ("a"):rep(237) .. ".b" -- a '.' where the cut falls
    local long1, long2 = base .. ("x"):rep(10), base .. ("y"):rep(10)
    for _, n in ipairs { "short-1", long1, long2 } do h.add_claim(n, 1) end
    local names = {}
    for _, n in ipairs { "short-1", long1, long2 } do
      h.wait_claim(n, "Bound")
      local w = h.wait_record(n, false)
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
    -- a cut name is read back as its claim's (not from an owner reference,
    -- which anyone with write access may take off): stripped of its owner
    -- and zeroed, long1's record gets both back
    local st = c:request("PATCH", WL .. "/" .. names[long1], { metadata = { ownerReferences = json.null } },
      "application/merge-patch+json")
    assert.are.equal(200, st)
    local w = h.wait_record(long1, false)
    assert.are.equal(names[long1], w.metadata.name)
  end)

  it("never gives two claims one record: a claim named after another's cut record name keeps its own", function()
    -- a tenant names a second claim so that "gpu-" and its name spell the
    -- first claim's cut record name; each claim must keep its own record,
    -- and neither is written over and over
    G.add_node(c, "gpu-9", 3)
    local long = ("a"):rep(251)
    h.add_claim(long, 1)
    h.wait_claim(long, "Bound")
    local first = h.wait_record(long, false)
    local twin = first.metadata.name:sub(5) -- whatever follows "gpu" and one more character
    if #twin > 249 then twin = twin:sub(1, 249) end
    twin = twin:gsub("^[^a-z0-9]+", "")
    h.add_claim(twin, 2)
    h.wait_claim(twin, "Bound")
    local second = h.wait_record(twin, false)
    assert.are_not.equal(first.metadata.name, second.metadata.name)
    first = h.wait_record(long, false)
    -- the usage writer has done all it had queued, twice over (a write of
    -- either record queues the key of the other's fight: usage_done); no
    -- write must have come
    h.usage_done("short-1")
    h.usage_done("short-1")
    -- still the same two objects, not written again (resourceVersion)
    local again1 = h.wait_record(long, false)
    local again2 = h.wait_record(twin, false)
    assert.are.same({ first.metadata.uid, first.metadata.resourceVersion },
      { again1.metadata.uid, again1.metadata.resourceVersion })
    assert.are.same({ second.metadata.uid, second.metadata.resourceVersion },
      { again2.metadata.uid, again2.metadata.resourceVersion })
  end)

  it("records re-pointed at each other's claims and zeroed go back to their own claims and counts, also under a new leader (issue 20 defect 1)", function()
    -- write access beyond Cozystack's tenant roles (see the top)
    c:must({ "apply", "-f", "-" }, { stdin = USAGE_WRITE })
    local I = require "invariants"
    local function invariants_hold(what) I.hold(c, { timeout = T, what = what }) end
    -- two replicas: one an earlier test killed starts again on its port
    -- (the webhook Service's stand-in lists it there)
    local cfg = P.read(c.dir .. "/haproxy.cfg") or ""
    for id, port, probe in cfg:gmatch("server (replica%-%a) 127%.0%.0%.1:(%d+) check port (%d+)") do
      if not c.replicas[id] then
        local r = c:start_controller { identity = id, port = tonumber(port), probe_port = tonumber(probe) }
        assert(P.wait_until(function()
          return P.http { url = ("http://127.0.0.1:%d/readyz"):format(r.probe_port), timeout = 2 } == 200
        end, 60, 0.3), ("%s is not ready after 60 s; its log:\n%s"):format(id, P.read(r.log) or ""))
      end
    end
    local n = 0
    for _ in pairs(c.replicas) do n = n + 1 end
    assert.are.equal(2, n)

    G.add_node(c, "gpu-6", 5)
    h.add_claim("ra", 2)
    h.add_claim("rb", 3)
    local counts = { ra = 2, rb = 3 }
    local cl = {}
    for name in pairs(counts) do cl[name] = h.wait_claim(name, "Bound") end
    -- each claim: one record, its own name, its own count, owned by it alone
    local function wait_restored(what)
      local got
      assert(P.wait_until(function()
        got = {}
        for name, count in pairs(counts) do
          local w = c:get(WL .. "/gpu-" .. name)
          local refs = w and w.metadata.ownerReferences or {}
          if not (w and #refs == 1 and refs[1].uid == cl[name].metadata.uid and refs[1].name == name
              and w.status and tonumber(w.status.resources[KEY]) == count
              and #h.records_of(cl[name]) == 1) then
            got[#got + 1] = w or ("no gpu-" .. name)
          end
        end
        return #got == 0
      end, T, 0.3), what .. ": " .. json.encode(got))
      invariants_hold(what)
    end
    wait_restored("the records of ra and rb")
    -- the tenant points each record at the other claim and zeroes it: 5
    -- devices billed as 0
    local function swap_and_zero()
      for name, other in pairs { ra = "rb", rb = "ra" } do
        local o = cl[other].metadata
        local w = h.tenant_patch("workload", "gpu-" .. name, {
          metadata = { ownerReferences = { { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", name = o.name,
            uid = o.uid, controller = true } } },
          status = { resources = { [KEY] = "0" } } })
        assert.are.equal(o.uid, w.metadata.ownerReferences[1].uid)
      end
    end
    local before = c:get(WL .. "/gpu-ra").metadata.uid
    swap_and_zero()
    wait_restored("the leader restores the swapped records")
    assert.are.equal(before, c:get(WL .. "/gpu-ra").metadata.uid) -- the same object, put right in place

    -- the same while no replica leads (the leader killed): the next leader
    -- puts them right in its first comparison
    local holder = h.lease_holder()
    assert.is_truthy(c.replicas[holder], tostring(holder))
    P.kill(c.replicas[holder].pid, "KILL")
    assert(P.wait_exit(c.replicas[holder].pid, 10), "the leader did not exit")
    c.replicas[holder] = nil
    swap_and_zero()
    local other = next(c.replicas)
    assert(P.wait_until(function() return h.lease_holder() == other end, 90, 0.5),
      "the Lease did not move to " .. other .. ": " .. json.encode(c:get(LEASE)))
    wait_restored("the new leader restores the swapped records")

    -- a record pointed at the other claim, then its own claim deleted: it
    -- goes (it is ra's, not rb's), and rb keeps exactly one record
    local ro = cl.rb.metadata
    h.tenant_patch("workload", "gpu-ra", { metadata = { ownerReferences = { { apiVersion = "cozystack.io/v1alpha1",
      kind = "GPUClaim", name = ro.name, uid = ro.uid, controller = true } } } })
    h.must_tenant { "-n", NS, "delete", "gpuclaim", "ra", "--wait=false" }
    counts.ra = nil
    assert(P.wait_until(function() return h.claim("ra") == nil end, T, 0.3),
      "claim ra stays: " .. json.encode(h.claim("ra") or {}))
    assert(P.wait_until(function() return c:get(WL .. "/gpu-ra") == nil end, T, 0.3),
      "gpu-ra stays: " .. json.encode(c:get(WL .. "/gpu-ra") or {}))
    wait_restored("rb after ra is deleted")
  end)
end)

describe("usage records on a cluster without Cozystack's Workload types", function()
  local c
  local env = {}
  local h = helpers(env)
  -- claims made as the admin: this block is not about a tenant's rights
  local session = K.session { start = { cozystack_workloads = false }, deploy = { replicas = 2 },
    prepare = function(cl) c, env.c, env.user = cl, cl, cl.kubeconfig end }
  setup(session.setup)
  teardown(session.teardown)

  it("serves no Workloads or WorkloadMonitors", function()
    local _, st = c:get(WL)
    assert.are.equal(404, st)
    _, st = c:get(WM)
    assert.are.equal(404, st)
  end)

  it("claims still bind; the leader warns in its log and with an Event on its Lease, and says 0 in a gauge; nothing crashes", function()
    G.add_node(c, "gpu-1", 1)
    h.add_claim("n1", 1)
    h.wait_claim("n1", "Bound")
    local function usage_events()
      local out = {}
      for _, e in ipairs(json.decode(c:must { "-n", "cozy-gpu", "get", "events", "-o", "json" }).items) do
        if e.reason == "UsageRecordsUnavailable" then out[#out + 1] = e end
      end
      return out
    end
    local ev
    assert(P.wait_until(function()
      ev = usage_events()[1]
      return ev
    end, T, 0.5), "no UsageRecordsUnavailable Event")
    assert.are.equal("Warning", ev.type)
    assert.are.equal("Lease", ev.involvedObject.kind)
    assert.are.equal("cozygpu-controller", ev.involvedObject.name)
    local lease = assert(c:get(LEASE))
    assert.are.equal(lease.metadata.uid, ev.involvedObject.uid)
    local r = c.replicas[lease.spec.holderIdentity]
    assert.is_truthy(r, tostring(lease.spec.holderIdentity))
    local warned = false
    for _, rec in ipairs(log_records(r)) do
      if rec.level == "warn" and tostring(rec.msg or rec.message):find("usage records are not written", 1, true) then
        warned = true
      end
    end
    assert.is_true(warned, P.read(r.log))
    local m = c:metrics(r)
    assert(m, "no metrics from " .. r.identity)
    assert.are.equal(0, m["cozygpu_usage_records_available"])
    for id, x in pairs(c.replicas) do assert.is_true(P.alive(x.pid), id .. " died") end
    -- the Event is rate-limited: one, not one per claim or per second; n2
    -- waits for room (the leader has handled it) before the count
    h.add_claim("n2", 1)
    local n2
    assert(P.wait_until(function()
      n2 = h.claim("n2")
      local cond = K.condition(n2, "Ready")
      return n2 and n2.status and n2.status.phase == "Pending" and cond and cond.reason == "NoNodeWithRoom"
    end, T, 0.3), json.encode(n2 or {}))
    assert.are.equal(1, #usage_events())
    for id, x in pairs(c.replicas) do assert.is_true(P.alive(x.pid), id .. " died") end
  end)
end)
