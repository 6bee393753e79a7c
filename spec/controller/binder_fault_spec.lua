-- On the API server double by design (docs/decisions/0034): a real server
-- cannot inject 409s and 500s, cut watches or compact on demand.
-- A randomized fault run of the leader's binder against the API server
-- double (the binder's required fault run): claim creates and deletes, cordons, node
-- loss and return, node deletion, capacity changes, VM starts, runs and
-- stops (pool workers with template claims too; a claims VMI runs only
-- once the leader has ungated its launcher pod, and two VMIs may start on
-- one claim), a tenant re-pointing and zeroing usage records, leader
-- kills, watch cuts, and 409s and 500s from the double on the status
-- writes and lists. Checked while it runs (every CHECK steps)
-- and once settled (after the run, and again once the cluster is healed):
--   * tenant-a never holds more than its budget (2 devices);
--   * no node ever shows more units booked than it ever offered
--     (settled: than it offers now, unless only Attached claims are over a
--     capacity that dropped under them, DESIGN.md §6);
--   * a claim is on at most one node (status.node is one field: checked
--     as "Bound/Attached claims have a node, Pending ones none");
--   * no claim is Attached to a VMI that is final or gone;
--   * every Pending or Lost claim carries a Ready condition with a reason;
--   * a deleted claim is kept only while a VMI uses it;
--   * a template claim exists only while its VMI is not final;
--   * settled: exactly one usage record (Workload) per Bound or Attached
--     claim, operational exactly while Attached, and none without such a
--     claim (decision 0028), across the leader kills.
-- The seed and step count are printed; COZYGPU_FAULT_SEED and
-- COZYGPU_FAULT_STEPS replay or lengthen a run. The double and the
-- replicas are real processes, so a replay repeats the same steps, not
-- the same interleaving with the replicas' threads.
local P = require "proc"
local I = require "invariants"
local E = require "controller_env"
local G = require "gpu_nodes"
local json = H.json

-- 10,000 steps in `make test`; 3,000 under ASan (`make test-asan` runs the
-- same code sanitized, where each step costs about three times as much)
local STEPS = tonumber(os.getenv("COZYGPU_FAULT_STEPS") or "") or (H.asan and 3000 or 10000)
local SEED = tonumber(os.getenv("COZYGPU_FAULT_SEED") or "") or os.time()
local CHECK = 250
local NODES = { "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6" }
local UNITS = { 4, 4, 2, 2, 1, 8 } -- L40S per node (GPUNode functions)
local NSS = { "tenant-a", "tenant-b" }

describe("binder fault run", function()
  it(("keeps its invariants through %d randomized steps with leader kills, watch cuts, 409s and 500s"):format(STEPS), function()
    print(("\n# binder fault run: seed %d, %d steps (COZYGPU_FAULT_SEED=%d COZYGPU_FAULT_STEPS=%d to replay)")
      :format(SEED, STEPS, SEED, STEPS))
    math.randomseed(SEED)
    local dir = H.tmpdir()
    local certs = P.certs(dir, { "cozygpu-webhook.cozy-gpu.svc" })
    local d = E.start_double()
    E.load_examples(d)
    local replicas, serial = {}, 0
    local function spawn()
      serial = serial + 1
      local id = "replica-" .. serial
      replicas[id] = E.start_controller { double = d, dir = dir, certs = certs, identity = id }
    end
    spawn()
    spawn()

    local function req(method, path, body)
      local v, st = E.send(d, method, path, body)
      return v, st
    end
    local function must(method, path, body)
      local v, st = req(method, path, body)
      assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st), json.encode(v or {})))
      return v
    end

    -- the model of what the driver did (the API is the truth for checks)
    local node = {}   -- name -> {units, alloc, present, ready, cordoned}
    local function put_node_status(n)
      local s = node[n]
      G.node_status(d, n, { units = s.units, alloc = s.alloc, ready = s.ready and "True" or "Unknown" })
    end
    local function create_node(i)
      local n = NODES[i]
      G.add_node(d, n, UNITS[i])
      local s = node[n] or { units = UNITS[i] }
      s.alloc, s.present, s.ready, s.cordoned = UNITS[i], true, true, false
      node[n] = s
    end
    for i = 1, #NODES do create_node(i) end

    local claims, nclaim = {}, 0 -- list of "ns/name"
    local vmis, nvmi = {}, 0     -- list of {ns, name, claims}
    local function claim_path(key)
      local ns, name = key:match("^([^/]+)/(.+)$")
      return "/apis/cozystack.io/v1alpha1/namespaces/" .. ns .. "/gpuclaims/" .. name
    end
    local function vmi_path(v)
      return "/apis/kubevirt.io/v1/namespaces/" .. v.ns .. "/virtualmachineinstances/" .. v.name
    end

    local function items(res)
      return d:state(res).items
    end

    local counts = {}
    local function did(what) counts[what] = (counts[what] or 0) + 1 end

    -- what the API shows booked per node (Bound, Attached, and Lost with a node)
    local function booked(cl)
      local per, bound = {}, {}
      for _, c in ipairs(cl) do
        local st = c.status or {}
        if st.node and (st.phase == "Bound" or st.phase == "Attached" or st.phase == "Lost") then
          per[st.node] = (per[st.node] or 0) + c.spec.count
          if st.phase == "Bound" then bound[st.node] = (bound[st.node] or 0) + c.spec.count end
        end
      end
      return per, bound
    end

    -- tenant-a's budget (examples/cluster/quotas.yaml: 2 devices in all)
    -- holds at every moment: Bound, Attached and Lost claims count
    -- (DESIGN.md §5; a Lost rebind is never checked, but a Lost claim
    -- never stopped counting)
    local function check_budget(cl, when)
      local used = 0
      for _, c in ipairs(cl) do
        local ph = c.status and c.status.phase
        if c.metadata.namespace == "tenant-a" and (ph == "Bound" or ph == "Attached" or ph == "Lost") then
          used = used + c.spec.count
        end
      end
      assert(used <= 2, ("%s (seed %d): tenant-a holds %d devices, its budget is 2"):format(when, SEED, used))
    end

    local function check_running(step)
      check_budget(items("gpuclaims"), "step " .. step)
      local per = booked(items("gpuclaims"))
      for n, u in pairs(per) do
        local s = node[n]
        assert(s, ("step %d: claims booked on unknown node %s"):format(step, n))
        assert(u <= s.units, ("step %d (seed %d): node %s shows %d units booked, it has %d"):format(step, SEED, n, u, s.units))
      end
    end

    -- usage records (DESIGN.md §3, decision 0028): exactly one
    -- Workload per Bound or Attached claim, owned by it (its uid), billing
    -- its count of its class, operational exactly while Attached; and no
    -- record of the controller's without such a claim (a Lost, Pending or
    -- deleted claim is not billed)
    local records = 0 -- usage records seen by the last check
    local function check_records(cl, when)
      local by_uid = {}
      for _, c in ipairs(cl) do by_uid[c.metadata.uid] = c end
      local per_claim = {}
      for _, w in ipairs(items("workloads")) do
        local labels = w.metadata.labels or {}
        if labels["app.kubernetes.io/managed-by"] == "cozygpu" then
          local owner
          for _, o in ipairs(w.metadata.ownerReferences or {}) do
            if o.kind == "GPUClaim" then owner = o end
          end
          local key = w.metadata.namespace .. "/" .. w.metadata.name
          assert(owner, ("%s (seed %d): record %s has no GPUClaim owner"):format(when, SEED, key))
          local c = by_uid[owner.uid]
          assert(c, ("%s (seed %d): record %s outlives its claim %s"):format(when, SEED, key, owner.name))
          local ph = c.status and c.status.phase
          assert(ph == "Bound" or ph == "Attached", ("%s (seed %d): record %s bills claim %s, which is %s"):format(
            when, SEED, key, c.metadata.name, tostring(ph)))
          assert.are.equal(c.metadata.namespace, w.metadata.namespace, key)
          assert.are.equal("gpu-device", w.status.kind, key)
          assert.are.equal(c.spec.count, tonumber(w.status.resources[c.spec.class .. ".gpuclass.cozystack.io/devices"]), key)
          assert.are.equal(ph == "Attached", w.status.operational == true, key .. " operational")
          assert.are.equal("cozygpu-gpus", labels["workloads.cozystack.io/monitor"], key)
          per_claim[owner.uid] = (per_claim[owner.uid] or 0) + 1
        end
      end
      for _, c in ipairs(cl) do
        local ph = c.status and c.status.phase
        local n = per_claim[c.metadata.uid] or 0
        if ph == "Bound" or ph == "Attached" then
          assert(n == 1, ("%s (seed %d): %s/%s is %s with %d usage records"):format(when, SEED, c.metadata.namespace,
            c.metadata.name, ph, n))
        end
      end
      records = 0
      for _, n in pairs(per_claim) do records = records + n end
      -- and each namespace with a record has the monitor naming it
      for _, w in ipairs(items("workloads")) do
        if (w.metadata.labels or {})["app.kubernetes.io/managed-by"] == "cozygpu" then
          local m = E.get(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. w.metadata.namespace .. "/workloadmonitors/cozygpu-gpus")
          assert(m, ("%s (seed %d): no monitor in %s"):format(when, SEED, w.metadata.namespace))
        end
      end
    end

    local function pick(t) return t[math.random(#t)] end

    -- A VMI naming claims `names` in `ns`, and the launcher pod KubeVirt's
    -- virt-controller makes for it, gated as cozygpu's webhook gates a pod
    -- whose claims are not attached to its VMI (decision 0025; the double
    -- calls no webhook): only the leader removes the gate, for the VMI its
    -- set gives the claims to (decision 0036). Returns the VM's entry.
    local GATE = "gpu.cozystack.io/claims"
    local function start_vm(ns, names)
      nvmi = nvmi + 1
      local v = { ns = ns, name = "vm" .. nvmi, claims = names, pod = "virt-launcher-vm" .. nvmi }
      local obj, st = req("POST", "/apis/kubevirt.io/v1/namespaces/" .. ns .. "/virtualmachineinstances", {
        apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
        metadata = { name = v.name, namespace = ns, labels = { ["gpu.cozystack.io/class-reference"] = "true" },
          annotations = { [GATE] = table.concat(names, ",") } },
        spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = G.L40S } } } } } })
      if st ~= 201 then return nil end
      req("POST", "/api/v1/namespaces/" .. ns .. "/pods", {
        apiVersion = "v1", kind = "Pod",
        metadata = { name = v.pod, namespace = ns, labels = { ["kubevirt.io"] = "virt-launcher" },
          annotations = { [GATE] = table.concat(names, ",") },
          ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = v.name,
            uid = obj.metadata.uid, controller = true } } },
        spec = { schedulingGates = { { name = GATE } },
          containers = { { name = "compute", image = "virt-launcher", resources = { limits = { [G.L40S] = "1" } } } } } })
      vmis[#vmis + 1] = v
      return v
    end
    -- a claim ("ns/name") picked at random, or nil when it is named by a
    -- VMI already (or there is none); and the set of the named ones
    local function unused_claim()
      if #claims == 0 then return nil end
      local used = {}
      for _, v in ipairs(vmis) do for _, c in ipairs(v.claims) do used[v.ns .. "/" .. c] = true end end
      local c = pick(claims)
      if used[c] then return nil end
      return c, used
    end
    -- the node the leader pinned v's launcher pod to once it removed the
    -- gate, or nil while it is gated (or has none)
    local function ungated_node(v)
      local p, st = req("GET", "/api/v1/namespaces/" .. v.ns .. "/pods/" .. v.pod)
      if st ~= 200 then return nil end
      for _, g in ipairs(p.spec.schedulingGates or {}) do
        if g.name == GATE then return nil end
      end
      local terms = (((p.spec.affinity or {}).nodeAffinity or {}).requiredDuringSchedulingIgnoredDuringExecution or {})
        .nodeSelectorTerms or {}
      for _, f in ipairs((terms[1] or {}).matchFields or {}) do
        if f.key == "metadata.name" and f.operator == "In" then return f.values[1] end
      end
      return nil
    end

    local records_edited -- tenant edits of records that the API took
    local ran_pods = 0     -- VMIs run once the leader ungated their launcher pod
    local actions = {
      { 14, "create claim", function()
        nclaim = nclaim + 1
        local ns = pick(NSS)
        local name = "c" .. nclaim
        local _, st = req("POST", "/apis/cozystack.io/v1alpha1/namespaces/" .. ns .. "/gpuclaims", {
          apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = name, namespace = ns },
          spec = { class = "l40s", count = math.random(3) } })
        if st == 201 then claims[#claims + 1] = ns .. "/" .. name end
      end },
      { 10, "delete claim", function()
        if #claims == 0 then return end
        local i = math.random(#claims)
        req("DELETE", claim_path(claims[i]))
        table.remove(claims, i)
      end },
      { 6, "cordon or uncordon", function()
        local n = pick(NODES)
        if not node[n].present then return end
        node[n].cordoned = not node[n].cordoned
        req("PATCH", "/api/v1/nodes/" .. n, { spec = { unschedulable = node[n].cordoned } })
      end },
      { 5, "node NotReady or Ready", function()
        local n = pick(NODES)
        if not node[n].present then return end
        node[n].ready = not node[n].ready
        put_node_status(n)
      end },
      { 2, "node deleted or back", function()
        local i = math.random(#NODES)
        local n = NODES[i]
        if node[n].present then
          req("DELETE", "/api/v1/nodes/" .. n)
          node[n].present = false
        else
          create_node(i)
        end
      end },
      { 4, "capacity change", function()
        local n = pick(NODES)
        if not node[n].present then return end
        node[n].alloc = math.random(0, node[n].units)
        put_node_status(n)
      end },
      { 10, "VM start", function()
        local first, used = unused_claim()
        if not first then return end
        local ns = first:match("^([^/]+)/")
        local names = { first:match("/(.+)$") }
        for _, c in ipairs(claims) do
          if #names < 2 and c ~= first and not used[c] and c:match("^([^/]+)/") == ns and math.random() < 0.2 then
            names[#names + 1] = c:match("/(.+)$")
          end
        end
        start_vm(ns, names)
      end },
      { 3, "two VMs start on one claim", function()
        -- both admitted at once on two replicas before either cache showed
        -- the other (decision 0036): the leader ungates one pod
        local c = unused_claim()
        if not c then return end
        local ns, name = c:match("^([^/]+)/(.+)$")
        start_vm(ns, { name })
        start_vm(ns, { name })
      end },
      { 4, "template VM start", function()
        -- a pool worker: no claims annotation, the leader creates
        -- <vmi>-l40s for its 1 or 2 GPUs (decision 0027)
        nvmi = nvmi + 1
        local ns = pick(NSS)
        local v = { ns = ns, name = "pool" .. nvmi, claims = { "pool" .. nvmi .. "-l40s" } }
        local gpus = {}
        for i = 1, math.random(2) do gpus[i] = { name = "gpu" .. i, deviceName = G.L40S } end
        local _, st = req("POST", "/apis/kubevirt.io/v1/namespaces/" .. ns .. "/virtualmachineinstances", {
          apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
          metadata = { name = v.name, namespace = ns, labels = { ["gpu.cozystack.io/class-reference"] = "true" } },
          spec = { domain = { devices = { gpus = gpus } } } })
        if st == 201 then vmis[#vmis + 1] = v end
      end },
      { 10, "VM scheduled and running where its claims are", function()
        if #vmis == 0 then return end
        local v = pick(vmis)
        local obj, st = req("GET", vmi_path(v))
        if st ~= 200 or (obj.status and obj.status.phase) then return end
        local where
        for _, c in ipairs(v.claims) do
          local co = req("GET", claim_path(v.ns .. "/" .. c))
          local cs = type(co) == "table" and co.status or {}
          if cs.phase ~= "Bound" or not cs.node or (where and where ~= cs.node) then return end
          where = cs.node
        end
        if not where or not node[where].present or not node[where].ready then return end
        -- the scheduler places only an ungated pod, where it is pinned
        if v.pod and ungated_node(v) ~= where then return end
        obj.status = { phase = "Running", nodeName = where }
        local _, st2 = req("PUT", vmi_path(v) .. "/status", obj)
        if st2 == 200 and v.pod then ran_pods = ran_pods + 1 end
      end },
      { 6, "VM stopped or failed", function()
        if #vmis == 0 then return end
        local i = math.random(#vmis)
        local v = vmis[i]
        local obj, st = req("GET", vmi_path(v))
        if st ~= 200 then
          table.remove(vmis, i)
          return
        end
        if obj.status and obj.status.phase == "Running" and math.random() < 0.5 then
          obj.status.phase = math.random() < 0.5 and "Succeeded" or "Failed"
          req("PUT", vmi_path(v) .. "/status", obj)
        else
          req("DELETE", vmi_path(v))
          table.remove(vmis, i)
        end
      end },
      { 1, "409s or 500s on status writes and lists", function()
        d:clear() -- the double keeps a bounded number of rules
        if math.random() < 0.7 then
          d:fail { method = "PUT", path = "/apis/cozystack.io/v1alpha1/namespaces/", status = math.random() < 0.5 and 409 or 500,
            count = math.random(1, 6) }
        else
          d:fail { method = "GET", path = "/apis/cozystack.io/v1alpha1/gpuclaims", status = 500, watch = false,
            count = math.random(1, 3) }
        end
      end },
      { 1, "watch cut", function()
        d:cut { mode = math.random() < 0.5 and "abrupt" or "close" }
      end },
      { 2, "record re-pointed at another claim and zeroed", function()
        -- a tenant edit (decision 0036; Cozystack's tenant roles do not
        -- give it, a broader role may): the record of one claim names
        -- another claim of its namespace as owner and bills 0; the leader
        -- puts owner and count back (decision 0028), which the records
        -- check after the run sees
        local recs, by_ns = {}, {}
        for _, w in ipairs(items("workloads")) do
          if (w.metadata.labels or {})["app.kubernetes.io/managed-by"] == "cozygpu" then recs[#recs + 1] = w end
        end
        if #recs == 0 then return end
        local w = pick(recs)
        for _, c in ipairs(items("gpuclaims")) do
          if c.metadata.namespace == w.metadata.namespace then by_ns[#by_ns + 1] = c end
        end
        if #by_ns == 0 then return end
        local o = pick(by_ns).metadata
        local res = {}
        for k in pairs(w.status and w.status.resources or {}) do res[k] = "0" end
        local path = "/apis/cozystack.io/v1alpha1/namespaces/" .. w.metadata.namespace .. "/workloads/" .. w.metadata.name
        local merge = "application/merge-patch+json"
        -- (the double serves Workloads without a status subresource, as
        -- Cozystack's CRD has none: status goes with the object)
        local _, st = E.send(d, "PATCH", path, { metadata = { ownerReferences = { { apiVersion = "cozystack.io/v1alpha1",
          kind = "GPUClaim", name = o.name, uid = o.uid, controller = true } } }, status = { resources = res } }, merge)
        if st == 200 then records_edited = records_edited + 1 end
      end },
    }
    local total = 0
    for _, a in ipairs(actions) do total = total + a[1] end

    local next_kill = math.random(800, 1600)
    records_edited = 0
    for step = 1, STEPS do
      if step == next_kill then
        -- SIGKILL whoever leads (no Lease release), start a replacement
        local l = E.get(d, "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
        local holder = l and l.spec and l.spec.holderIdentity
        if holder and replicas[holder] then
          P.kill(replicas[holder].pid, 9)
          replicas[holder] = nil
          did("leader kill")
          spawn()
        end
        next_kill = step + math.random(800, 1600)
      end
      local r = math.random(total)
      for _, a in ipairs(actions) do
        r = r - a[1]
        if r <= 0 then
          a[3]()
          did(a[2])
          break
        end
      end
      if step % CHECK == 0 then check_running(step) end
    end
    d:clear()

    -- settle: a leader holds the Lease and the claims stop changing; then
    -- check the invariants on what the API shows
    local cl, phases
    local function settle_and_check(label)
      -- settle: a leader holds the Lease and the claims stop changing
      assert(P.wait_until(function()
        local l = E.get(d, "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
        local h = l and l.spec and l.spec.holderIdentity
        return h and replicas[h] ~= nil
      end, 30), "no live replica leads after the run")
      local last, still = nil, 0
      assert(P.wait_until(function()
        local rv = d:state("gpuclaims").resourceVersion
        local rvs = {}
        for _, c in ipairs(items("gpuclaims")) do rvs[#rvs + 1] = c.metadata.resourceVersion end
        rvs[#rvs + 1] = "|" -- and the usage records (decision 0028)
        for _, w in ipairs(items("workloads")) do rvs[#rvs + 1] = w.metadata.resourceVersion end
        local now = table.concat(rvs, ",")
        if now == last then still = still + 1 else still, last = 0, now end
        return still >= 6 and rv
      end, 120, 0.5), "the claims never settled")

      cl = items("gpuclaims")
      check_budget(cl, label)
      check_records(cl, label)
      -- the billing invariants' checker (decision 0036), all but
      -- the first: no virt-controller runs beside the double, so the
      -- launcher pods that bill a running VMI's uncovered GPUs do not exist
      -- here (spec/cluster/billing_spec.lua checks that one with them)
      local bad = I.check(I.gather(d), { [1] = true })
      assert(#bad == 0, ("seed %d (%s): %s"):format(SEED, label, I.report(bad)))
      local live = {}
      for _, v in ipairs(items("virtualmachineinstances")) do live[v.metadata.namespace .. "/" .. v.metadata.name] = v end
      local per, bound = booked(cl)
      phases = {}
      for _, c in ipairs(cl) do
        local st = c.status or {}
        local key = c.metadata.namespace .. "/" .. c.metadata.name
        phases[st.phase or "none"] = (phases[st.phase or "none"] or 0) + 1
        assert(st.phase, key .. " has no phase")
        local cond
        for _, x in ipairs(st.conditions or {}) do if x.type == "Ready" then cond = x end end
        assert(cond and cond.reason and cond.reason ~= "", key .. " has no Ready reason: " .. json.encode(st))
        if st.phase == "Bound" or st.phase == "Attached" then
          assert(st.node, key .. " is " .. st.phase .. " without a node")
          assert(node[st.node] and node[st.node].present, key .. " is " .. st.phase .. " on deleted node " .. tostring(st.node))
        end
        if st.phase == "Pending" then assert.is_nil(st.node, key) end
        -- a deleted claim is kept only while a VMI uses it (the protection
        -- finalizer, decision 0026)
        -- a template claim lives only with its VMI, until the VMI is final
        if (c.metadata.labels or {})["gpu.cozystack.io/template-claim"] == "true" and not c.metadata.deletionTimestamp then
          local owner = (c.metadata.ownerReferences or {})[1]
          local v = owner and live[c.metadata.namespace .. "/" .. owner.name]
          local vp = v and v.status and v.status.phase
          assert(v and v.metadata.uid == owner.uid and vp ~= "Succeeded" and vp ~= "Failed",
            key .. " is a template claim whose VMI is final or gone")
        end
        if c.metadata.deletionTimestamp then
          assert(st.phase == "Attached" or (st.phase == "Lost" and st.node) or st.phase == "Bound",
            key .. " is deleted and unused but still there: " .. json.encode(st))
          if st.phase == "Bound" then
            -- in use while a VMI naming it has not ended (Pending,
            -- Scheduled, Running: its launcher pod may be pinned already),
            -- as kubernetes.io/pvc-protection counts every pod not
            -- terminated (decision 0026 item 7)
            local users = 0
            for _, v in pairs(live) do
              local ann = v.metadata.annotations and v.metadata.annotations["gpu.cozystack.io/claims"] or ""
              local vp = v.status and v.status.phase
              if v.metadata.namespace == c.metadata.namespace and vp ~= "Succeeded" and vp ~= "Failed" then
                for n in ann:gmatch("[^,]+") do if n == c.metadata.name then users = users + 1 end end
              end
            end
            assert(users > 0, key .. " is deleted, Bound and used by no VMI that has not ended, but still there")
          end
        end
        if st.phase == "Attached" then
          local v = live[c.metadata.namespace .. "/" .. tostring(st.attachedTo)]
          assert(v, key .. " is Attached to a VMI that is gone: " .. tostring(st.attachedTo))
          local vp = v.status and v.status.phase
          assert(vp ~= "Succeeded" and vp ~= "Failed", key .. " is Attached to a final VMI " .. st.attachedTo)
          assert.are.equal(st.node, v.status.nodeName, key)
        end
      end
      for n, u in pairs(per) do
        local s = node[n]
        local offer = s.present and math.min(s.alloc, s.units) or 0
        if u > offer then
          -- only a capacity that dropped under Attached claims may leave a
          -- node over (§6: Attached claims never move); nothing merely Bound
          assert(not bound[n] or bound[n] == 0,
            ("seed %d: node %s shows %d units booked (%d Bound), it offers %d"):format(SEED, n, u, bound[n] or 0, offer))
        end
      end
      -- and nothing waits that could be placed: a lone Pending claim (no live
      -- VMI names it) waiting for room has no usable node (present, Ready,
      -- not cordoned) with that many free units (no waiting claim forgotten
      -- across the faults)
      local named = {}
      for key, v in pairs(live) do
        local ns = key:match("^([^/]+)/")
        local ann = v.metadata.annotations and v.metadata.annotations["gpu.cozystack.io/claims"] or ""
        for c in ann:gmatch("[^,]+") do named[ns .. "/" .. c] = true end
      end
      -- a Scheduled or Running VMI whose own claims are not all Bound or
      -- Attached on its node uses its GPU entries there as raw-name use
      -- (decision 0026: the binder counts it against the node's offer), e.g.
      -- a VMI the driver set Running just as its claims moved
      local byname = {}
      for _, c in ipairs(cl) do byname[c.metadata.namespace .. "/" .. c.metadata.name] = c end
      local raw, on_node = {}, {}
      for key, v in pairs(live) do
        local ns = key:match("^([^/]+)/")
        local vs = v.status or {}
        if (vs.phase == "Running" or vs.phase == "Scheduled") and vs.nodeName then
          local ann = v.metadata.annotations and v.metadata.annotations["gpu.cozystack.io/claims"]
          local names = {}
          if ann then
            for c in ann:gmatch("[^,]+") do names[#names + 1] = c end
          else
            names[1] = v.metadata.name .. "-l40s" -- its template claim (decision 0027)
          end
          local covered = #names > 0
          for _, n in ipairs(names) do
            local c = byname[ns .. "/" .. n]
            local cs = c and c.status or {}
            if not c or (cs.phase ~= "Bound" and cs.phase ~= "Attached") or cs.node ~= vs.nodeName
              or (cs.attachedTo and cs.attachedTo ~= v.metadata.name) then
              covered = false
            end
          end
          local entries = #((((v.spec or {}).domain or {}).devices or {}).gpus or {})
          if not covered then raw[vs.nodeName] = (raw[vs.nodeName] or 0) + entries end
          on_node[vs.nodeName] = (on_node[vs.nodeName] or "") .. (" %s(%s %s)"):format(key, vs.phase,
            covered and "covered" or "raw")
        end
      end
      for _, c in ipairs(cl) do
        local key = c.metadata.namespace .. "/" .. c.metadata.name
        local st = c.status or {}
        local waiting = st.phase == "Pending" or (st.phase == "Lost" and not st.node)
      if waiting and not named[key] then
          for n, s in pairs(node) do
            local over = st.conditions and st.conditions[1] and st.conditions[1].reason == "OverBudget"
          if s.present and s.ready and not s.cordoned and not over then
              local free = math.min(s.alloc, s.units) - (per[n] or 0) - (raw[n] or 0)
              assert(free < c.spec.count, ("seed %d (%s): %s (%d) waits (%s) while %s has %d free (%d booked, %d raw; VMIs there:%s)")
                :format(SEED, label, key, c.spec.count, json.encode(st.conditions), n, free, per[n] or 0, raw[n] or 0,
                on_node[n] or " none"))
            end
          end
        end
      end
    end
    settle_and_check("after the run")
    -- heal the cluster (every node back, Ready, uncordoned, at full
    -- capacity): what waited through the faults must be placed now
    for i, n in ipairs(NODES) do
      if not node[n].present then
        create_node(i)
      else
        node[n].ready, node[n].cordoned, node[n].alloc = true, false, node[n].units
        put_node_status(n)
        req("PATCH", "/api/v1/nodes/" .. n, { spec = { unschedulable = false } })
      end
    end
    settle_and_check("healed")
    local bound_now = (phases.Bound or 0) + (phases.Attached or 0)
    print(("# binder fault run: healed: %d claims Bound or Attached, %d usage records"):format(bound_now, records))
    local parts = {}
    for k, v in pairs(counts) do parts[#parts + 1] = ("%s %d"):format(k, v) end
    table.sort(parts)
    local ph = {}
    for k, v in pairs(phases) do ph[#ph + 1] = ("%s %d"):format(k, v) end
    table.sort(ph)
    print(("# binder fault run: %d claims at the end (%s); steps: %s"):format(#cl, table.concat(ph, ", "),
      table.concat(parts, ", ")))
    print(("# binder fault run: %d records re-pointed and zeroed by the tenant, each put right; %d VMIs ran where the leader ungated their launcher pod")
      :format(records_edited, ran_pods))
    assert.is_true((counts["leader kill"] or 0) >= 1 or STEPS < 1600)
    for _, c in pairs(replicas) do P.stop(c.pid, 5) end
    d:stop()
    P.stop_all()
  end)
end)
