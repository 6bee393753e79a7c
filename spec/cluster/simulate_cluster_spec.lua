-- One placement model (decision 0041): every scenario of
-- examples/scenarios is replayed twice, by `cozygpu simulate` and against
-- a real control plane (kube-apiserver with cozygpu's webhooks, the
-- garbage collector, kube-scheduler, one controller replica as its
-- ServiceAccount), step by step, and every claim's phase, node and reason
-- and every VM's VMI phase and node must be the same after each step. A
-- divergence fails here.
--
-- The spec plays what no process here runs, exactly as simulate models it
-- (core/cli/sim_kubevirt.c; cross-checked by this spec): KubeVirt's VM
-- controller (runStrategy), virt-controller's launcher pod (carrying the
-- gate the launcher webhook gives and the classes' tolerations), and
-- virt-handler (a VMI runs on the node kube-scheduler placed its pod on).
-- The scenario's classes and nodes become the objects simulate makes of
-- them (core/cli/sim_scenario.c): GPUClass, a KubeVirt CR permitting a
-- made-up PCI device per class, Node and GPUNode whose GPUs
-- cozygpu.capacity counts.
--
-- A step is settled when the leader has applied every object the API
-- server holds (cozygpu_binder_applied_resource_version, decision 0040)
-- and a round of the spec's KubeVirt changes nothing. Step 0 and each
-- leaderChange are a new leader building its state from what the API
-- server holds: the spec holds the Lease while it loads the scenario, then
-- lets the replica take it (as simulate builds its model after loading).
local P = require "proc"
local K = require "kube_cluster"
local json = H.json
local core = require "cozygpu.core"

local BOOT = "3b1f5c2e-6d0a-4f8e-9a7b-2c4d6e8f0a1b"
local LEASE = "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller"
local GATE = "gpu.cozystack.io/claims"
local CLASS_REF = "gpu.cozystack.io/class-reference"
local PAUSED = "paused-by-spec"

local API = {
  GPUClass = "/apis/cozystack.io/v1alpha1/gpuclasses",
  GPUNode = "/apis/cozystack.io/v1alpha1/gpunodes",
  Node = "/api/v1/nodes",
  PersistentVolume = "/api/v1/persistentvolumes",
  Namespace = "/api/v1/namespaces",
}
local NSD = { -- namespaced collections: API path with %s for the namespace
  GPUClaim = "/apis/cozystack.io/v1alpha1/namespaces/%s/gpuclaims",
  VirtualMachine = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachines",
  VirtualMachineInstance = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances",
  Pod = "/api/v1/namespaces/%s/pods",
  PersistentVolumeClaim = "/api/v1/namespaces/%s/persistentvolumeclaims",
  ResourceQuota = "/api/v1/namespaces/%s/resourcequotas",
  KubeVirt = "/apis/kubevirt.io/v1/namespaces/%s/kubevirts",
}
local function coll(kind, ns) return NSD[kind] and NSD[kind]:format(ns) or API[kind] end
local function path(kind, ns, name) return coll(kind, ns) .. "/" .. name end

local function scenarios()
  local list = {}
  for f in P.sh("ls examples/scenarios/*.yaml"):gmatch("%S+") do list[#list + 1] = f end
  return list
end

local function split(ref)
  local ns, name = ref:match("^([^/]+)/(.+)$")
  if ns then return ns, name end
  return "default", ref
end

-- the binder's name of a VMI's phase (placement_read_vmi_phase)
local function vmi_phase(v)
  if not v then return "None" end
  local p = v.status and v.status.phase
  if p == nil or p == "" or p == "Pending" or p == "Scheduling" then return "Pending" end
  if p == "Scheduled" or p == "Succeeded" or p == "Failed" then return p end
  return "Running"
end

describe("simulate and the cluster agree on every example scenario (decision 0041)", function()
  local c, replica
  setup(function()
    c = K.start { examples = false }
    c:must { "apply", "-f", "deploy/00-namespace.yaml" }
    c:deploy { replicas = 1, extra = { "--lease-duration", "6s", "--renew-deadline", "4s", "--retry-period", "1s" } }
    for _, r in pairs(c.replicas) do replica = r end
  end)
  teardown(function()
    local forbidden = c and c:forbidden() or {}
    if c then c:stop() end
    P.stop_all()
    assert(#forbidden == 0, "the API server refused the controller: " .. table.concat(forbidden, "\n"))
  end)

  local function enc(v) return type(v) == "table" and json.encode(v) or tostring(v) end
  local function must(method, p, body, ctype)
    local st, v = c:request(method, p, body, ctype)
    assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, p, tostring(st), enc(v)))
    return v
  end
  local function get(p)
    local st, v = c:request("GET", p)
    if st == 200 then return v end
  end
  local function merge(p, body) return must("PATCH", p, body, "application/merge-patch+json") end
  local function metric(name)
    local m = c:metrics(replica) or {}
    return m[name]
  end

  -- ---- the Lease: a new leader when the spec says so -----------------

  local function micro_now() return (P.sh("date -u +%Y-%m-%dT%H:%M:%S.000000Z"):gsub("%s+$", "")) end
  local function hold_lease(holder, seconds)
    for _ = 1, 20 do
      local l = get(LEASE)
      if not l then
        l = { apiVersion = "coordination.k8s.io/v1", kind = "Lease",
          metadata = { name = "cozygpu-controller", namespace = "cozy-gpu" }, spec = {} }
        l.spec = { holderIdentity = holder, leaseDurationSeconds = seconds, acquireTime = micro_now(),
          renewTime = micro_now(), leaseTransitions = 0 }
        if c:request("POST", "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases", l) == 201 then return end
      else
        l.spec.holderIdentity = holder
        l.spec.leaseDurationSeconds = seconds
        l.spec.renewTime = micro_now()
        if c:request("PUT", LEASE, l) == 200 then return end
      end
      P.sleep(0.1)
    end
    error("cannot write the Lease")
  end
  -- the replica stops leading (its state dropped)
  local function pause()
    hold_lease(PAUSED, 3600)
    assert(P.wait_until(function() return metric("cozygpu_leader") == 0 end, 30, 0.2),
      "the replica still leads after the Lease was taken")
  end
  -- the replica takes the Lease and builds its state from the API server
  local function resume()
    local full = metric('cozygpu_binder_passes_total{kind="full"}') or 0
    hold_lease("", 1)
    assert(P.wait_until(function()
      return metric("cozygpu_leader") == 1 and (metric('cozygpu_binder_passes_total{kind="full"}') or 0) > full
    end, 30, 0.2), "the replica did not take the Lease and build its state:\n" .. (c:log_tail(replica.identity, 30) or ""))
  end

  -- ---- what the API server holds -------------------------------------

  local WATCHED = { -- resource -> list path (what the leader watches and the spec writes)
    gpuclaims = "/apis/cozystack.io/v1alpha1/gpuclaims",
    virtualmachineinstances = "/apis/kubevirt.io/v1/virtualmachineinstances",
    virtualmachines = "/apis/kubevirt.io/v1/virtualmachines",
    pods = "/api/v1/pods?labelSelector=kubevirt.io%3Dvirt-launcher",
    nodes = "/api/v1/nodes",
    gpunodes = "/apis/cozystack.io/v1alpha1/gpunodes",
    gpuclasses = "/apis/cozystack.io/v1alpha1/gpuclasses",
  }
  local function list(p) return (must("GET", p).items) or {} end

  -- the highest resourceVersion of each watched resource's objects
  local function max_rvs()
    local out = {}
    for res, p in pairs(WATCHED) do
      local max = 0
      for _, o in ipairs(list(p)) do
        local rv = tonumber(o.metadata.resourceVersion) or 0
        if rv > max then max = rv end
      end
      out[res] = max
    end
    return out
  end
  -- whether two flat tables hold the same keys and values
  local function same(a, b)
    for k, v in pairs(a) do
      if b[k] ~= v then return false end
    end
    for k in pairs(b) do
      if a[k] == nil then return false end
    end
    return true
  end
  -- whether the leader has applied each resource up to target[resource]
  -- (one read of its metrics)
  local function applied(target)
    local m = c:metrics(replica) or {}
    for res, rv in pairs(target) do
      if rv > 0 and (m[('cozygpu_binder_applied_resource_version{resource="%s"}'):format(res)] or 0) < rv then
        return false
      end
    end
    return true
  end
  -- waits until the leader has applied every object the API server holds
  -- of each watched resource (decision 0040), its own writes meanwhile
  -- included: what simulate's sim_leader_catch_up does between actions
  local function caught_up()
    local target = max_rvs()
    for _ = 1, 50 do
      assert(P.wait_until(function() return applied(target) end, 30, 0.05),
        "the leader did not apply what the API server holds: " .. enc(target))
      local now = max_rvs()
      if same(now, target) then return end
      target = now
    end
    error("the leader kept writing")
  end

  -- {claims = {ref = "Phase node reason"}, vms = {ref = "Phase node"}}
  local function observed()
    local out = { claims = {}, vms = {} }
    for _, cl in ipairs(list(WATCHED.gpuclaims)) do
      local st = cl.status or {}
      local reason = ""
      for _, x in ipairs(st.conditions or {}) do
        if x.type == "Ready" and x.reason ~= "Pending" then reason = x.reason or "" end
      end
      out.claims[cl.metadata.namespace .. "/" .. cl.metadata.name] =
        ("%s %s %s"):format(st.phase or "Pending", st.node or "-", reason)
    end
    local vmis = {}
    for _, v in ipairs(list(WATCHED.virtualmachineinstances)) do
      vmis[v.metadata.namespace .. "/" .. v.metadata.name] = v
    end
    for _, vm in ipairs(list(WATCHED.virtualmachines)) do
      local ref = vm.metadata.namespace .. "/" .. vm.metadata.name
      local v = vmis[ref]
      out.vms[ref] = ("%s %s"):format(vmi_phase(v), v and v.status and v.status.nodeName or "-")
    end
    return out
  end

  -- the same from one step of simulate's JSON
  local function predicted(step)
    local out = { claims = {}, vms = {} }
    for _, cl in ipairs(step.claims) do
      out.claims[cl.claim] = ("%s %s %s"):format(cl.phase, cl.node ~= json.null and cl.node or "-", cl.reason or "")
    end
    for _, vm in ipairs(step.vms) do
      out.vms[vm.vm] = ("%s %s"):format(vm.vmi, vm.node ~= json.null and vm.node or "-")
    end
    return out
  end

  local function differences(want, got)
    local diffs = {}
    for _, what in ipairs { "claims", "vms" } do
      local keys = {}
      for k in pairs(want[what]) do keys[k] = true end
      for k in pairs(got[what]) do keys[k] = true end
      local sorted = {}
      for k in pairs(keys) do sorted[#sorted + 1] = k end
      table.sort(sorted)
      for _, k in ipairs(sorted) do
        if want[what][k] ~= got[what][k] then
          diffs[#diffs + 1] = ("  %s %s: simulate %s, cluster %s"):format(what == "claims" and "claim" or "vm", k,
            tostring(want[what][k] or "absent"), tostring(got[what][k] or "absent"))
        end
      end
    end
    return diffs
  end

  -- ---- the scenario's world as objects (core/cli/sim_scenario.c) -----

  local w -- the scenario being replayed: classes, caps, runs, namespaces

  local function ensure_namespace(ns, labels)
    local have = get(path("Namespace", nil, ns))
    if not have then
      must("POST", API.Namespace, { apiVersion = "v1", kind = "Namespace", metadata = { name = ns, labels = labels } })
    elseif labels then
      have.metadata.labels = labels
      have.metadata.labels["kubernetes.io/metadata.name"] = ns
      must("PUT", path("Namespace", nil, ns), have)
    end
    w.namespaces[ns] = true
  end

  local function kubevirt_entry(selector, rn)
    local kv = get(path("KubeVirt", "cozy-kubevirt", "kubevirt"))
    if not kv then
      ensure_namespace("cozy-kubevirt")
      kv = must("POST", coll("KubeVirt", "cozy-kubevirt"), { apiVersion = "kubevirt.io/v1", kind = "KubeVirt",
        metadata = { name = "kubevirt", namespace = "cozy-kubevirt" },
        spec = { configuration = { developerConfiguration = { featureGates = { "GPU", "HostDevices" } },
          permittedHostDevices = { pciHostDevices = json.array() } } } })
    end
    local phd = kv.spec.configuration.permittedHostDevices
    phd.pciHostDevices = phd.pciHostDevices or {}
    phd.pciHostDevices[#phd.pciHostDevices + 1] = { pciVendorSelector = selector, resourceName = rn }
    must("PUT", path("KubeVirt", "cozy-kubevirt", "kubevirt"), kv)
  end

  local function class_known(name, rn)
    if rn == nil or rn == "" then rn = "simulate.cozygpu.io/" .. name end
    w.next_device = w.next_device + 1
    w.classes[name] = { rn = rn, device = ("f%03x"):format(w.next_device) }
    kubevirt_entry(("10DE:F%03X"):format(w.next_device), rn)
  end

  local function def_class(cl)
    class_known(cl.name, cl.resourceName)
    local tols = json.array(cl.tolerations or {})
    local md = { name = cl.name }
    if cl.deleting then md.finalizers = { "gpu.cozystack.io/class-protection" } end
    must("POST", API.GPUClass, { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", metadata = md,
      spec = { mode = "Passthrough", resourceName = w.classes[cl.name].rn, onCordon = cl.onCordon or "Move",
        tolerations = tols } })
    if cl.deleting then must("DELETE", path("GPUClass", nil, cl.name)) end
  end

  local function gpunode_status(name, pending)
    local fns, bus = {}, 0x10
    for _, cls in ipairs(w.cap_order[name]) do
      for _ = 1, w.caps[name][cls] do
        w.group = w.group + 1
        fns[#fns + 1] = { address = ("0000:%02x:%02x.0"):format((bus >> 5) & 0xff, bus & 0x1f), vendorID = "10de",
          deviceID = w.classes[cls].device, role = "GPU", driver = "vfio-pci", counted = true,
          iommuGroup = w.group, health = { status = "Healthy" } }
        bus = bus + 1
      end
    end
    return { bootID = BOOT, functions = json.array(fns), layout = { pending = pending and true or false },
      observedGeneration = 1 }
  end

  local function allocatable(name)
    local a = { cpu = "64", memory = "512Gi", pods = "110" }
    for cls, u in pairs(w.caps[name]) do a[w.classes[cls].rn] = tostring(u) end
    return a
  end

  -- a read-modify-write of `p` (retried on a conflict)
  local function update(p, fn, sub)
    for _ = 1, 20 do
      local o = must("GET", p)
      fn(o)
      local st, v = c:request("PUT", p .. (sub or ""), o)
      if st == 200 then return v end
      assert(st == 409, ("PUT %s -> %s %s"):format(p, tostring(st), enc(v)))
    end
    error("PUT " .. p .. ": 409 twenty times")
  end

  local function node_status(name, ready)
    update(path("Node", nil, name), function(n)
      local a = allocatable(name)
      n.status = { allocatable = a, capacity = a,
        conditions = { { type = "Ready", status = ready and "True" or "Unknown",
          reason = ready and "KubeletReady" or "NodeStatusUnknown" } }, nodeInfo = { bootID = BOOT } }
    end, "/status")
  end

  local function def_node(n)
    w.caps[n.name], w.cap_order[n.name] = {}, {}
    local names = {}
    for cls in pairs(n.capacity or {}) do names[#names + 1] = cls end
    table.sort(names) -- the order sim_scenario.c walks a JSON object in is the document's; units are what count
    for _, cls in ipairs(names) do
      w.caps[n.name][cls] = n.capacity[cls]
      w.cap_order[n.name][#w.cap_order[n.name] + 1] = cls
    end
    local labels = { ["kubernetes.io/hostname"] = n.name }
    for k, v in pairs(n.labels or {}) do labels[k] = v end
    local node = must("POST", API.Node, { apiVersion = "v1", kind = "Node", metadata = { name = n.name, labels = labels },
      spec = { unschedulable = n.unschedulable or nil, taints = n.taints and json.array(n.taints) or nil } })
    node_status(n.name, n.ready ~= false)
    local g = must("POST", API.GPUNode, { apiVersion = "cozystack.io/v1alpha1", kind = "GPUNode",
      metadata = { name = n.name, ownerReferences = { { apiVersion = "v1", kind = "Node", name = n.name,
        uid = node.metadata.uid } } }, spec = json.object() })
    g.status = gpunode_status(n.name, n.layoutPending)
    must("PUT", path("GPUNode", nil, n.name) .. "/status", g)
  end

  -- claims one second apart: metadata.creationTimestamp has whole seconds,
  -- and a new leader takes waiting orders by it (ties by name), as
  -- simulate's store stamps its objects a second apart
  local last_second
  local function next_second()
    local now = P.sh("date +%s"):gsub("%s+$", "")
    while last_second == now do
      P.sleep(0.05)
      now = P.sh("date +%s"):gsub("%s+$", "")
    end
    last_second = now
  end

  local function def_claim(cl)
    local ns = cl.namespace or "default"
    ensure_namespace(ns)
    next_second()
    local st, v = c:request("POST", coll("GPUClaim", ns), { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = cl.name, namespace = ns }, spec = { class = cl.class, count = cl.count } })
    -- a step's order may be refused at admission, as simulate says it is
    assert(st == 201 or (st == 403 and w.in_step), ("POST claim %s/%s -> %s %s"):format(ns, cl.name, tostring(st), enc(v)))
  end

  local function gpu_entries(list, rn, n)
    for _ = 1, n do list[#list + 1] = { name = "gpu" .. #list, deviceName = rn } end
  end

  local function def_vm(vm)
    local ns = vm.namespace or "default"
    ensure_namespace(ns)
    local devices, tmd = {}, {}
    if vm.gpus then
      for _, g in ipairs(vm.gpus) do gpu_entries(devices, w.classes[g.class].rn, g.count) end
      tmd.labels = { [CLASS_REF] = "true" }
    else
      for _, cn in ipairs(vm.claims) do
        local cl = must("GET", path("GPUClaim", ns, cn))
        gpu_entries(devices, w.classes[cl.spec.class].rn, cl.spec.count)
      end
      tmd.annotations = { [GATE] = table.concat(vm.claims, ",") }
    end
    local tspec = { domain = { devices = { gpus = devices }, resources = { requests = { memory = "1Gi" } } } }
    if vm.volumeNodes then
      local pvc, pv = vm.name .. "-data", ns .. "-" .. vm.name .. "-data"
      must("POST", API.PersistentVolume, { apiVersion = "v1", kind = "PersistentVolume", metadata = { name = pv },
        spec = { capacity = { storage = "1Gi" }, accessModes = { "ReadWriteOnce" }, storageClassName = "local",
          ["local"] = { path = "/mnt/" .. pv }, persistentVolumeReclaimPolicy = "Retain",
          claimRef = { namespace = ns, name = pvc },
          nodeAffinity = { required = { nodeSelectorTerms = { { matchExpressions = { {
            key = "kubernetes.io/hostname", operator = "In", values = vm.volumeNodes } } } } } } } })
      must("POST", coll("PersistentVolumeClaim", ns), { apiVersion = "v1", kind = "PersistentVolumeClaim",
        metadata = { name = pvc, namespace = ns }, spec = { accessModes = { "ReadWriteOnce" },
          storageClassName = "local", volumeName = pv, resources = { requests = { storage = "1Gi" } } } })
      tspec.volumes = { { name = "data", persistentVolumeClaim = { claimName = pvc } } }
    end
    local st, v = c:request("POST", coll("VirtualMachine", ns), { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine",
      metadata = { name = vm.name, namespace = ns },
      spec = { runStrategy = vm.runStrategy or "Halted", template = { metadata = tmd, spec = tspec } } })
    assert(st == 201 or (st == 403 and w.in_step), ("POST VM %s/%s -> %s %s"):format(ns, vm.name, tostring(st), enc(v)))
  end

  -- a snapshot's objects (core/cli/sim_snapshot.c stores them as they are):
  -- uids are the API server's here, so the owner references a snapshot
  -- object carries are pointed at the objects created from the snapshot
  local function load_snapshot(file)
    local docs = assert(core.yaml(P.read(file)))
    local items = {}
    for _, d in ipairs(docs) do
      if d.kind == "List" then
        for _, o in ipairs(d.items) do items[#items + 1] = o end
      elseif type(d) == "table" and d.kind then
        items[#items + 1] = d
      end
    end
    local uid, by_name = {}, {} -- snapshot uid -> new uid; "Kind/ns/name" -> new uid
    local order = { "Namespace", "KubeVirt", "GPUClass", "Node", "GPUNode", "PersistentVolume",
      "PersistentVolumeClaim", "GPUClaim", "VirtualMachine", "VirtualMachineInstance", "ResourceQuota" }
    -- claims in the order of their creationTimestamp, a second apart (def_claim)
    local claims = {}
    for _, o in ipairs(items) do
      if o.kind == "GPUClaim" then claims[#claims + 1] = o end
    end
    local function ckey(o)
      return ("%s\0%s\0%s"):format(o.metadata.creationTimestamp or "", o.metadata.namespace, o.metadata.name)
    end
    table.sort(claims, function(a, b) return ckey(a) < ckey(b) end)
    for _, kind in ipairs(order) do
      for _, o in ipairs(kind == "GPUClaim" and claims or items) do
        if o.kind == kind then
          if kind == "GPUClaim" then next_second() end
          local md = o.metadata
          local old = md.uid
          for _, f in ipairs { "uid", "resourceVersion", "creationTimestamp", "generation", "managedFields" } do md[f] = nil end
          for _, r in ipairs(md.ownerReferences or {}) do
            -- by its uid, or (a hand-written snapshot gives none) by kind and name
            r.uid = uid[r.uid or ""] or by_name[r.kind .. "/" .. (md.namespace or "") .. "/" .. r.name]
              or by_name[r.kind .. "//" .. r.name] or r.uid
          end
          local status = o.status
          if kind == "Namespace" then
            ensure_namespace(md.name, md.labels)
          else
            if md.namespace then ensure_namespace(md.namespace) end
            if kind == "KubeVirt" and get(path("KubeVirt", md.namespace, md.name)) then
              -- made by a scenario class already: the snapshot's is the one
              must("DELETE", path("KubeVirt", md.namespace, md.name))
            end
            local made = must("POST", coll(kind, md.namespace), o)
            if old then uid[old] = made.metadata.uid end
            by_name[kind .. "/" .. (md.namespace or "") .. "/" .. md.name] = made.metadata.uid
            if status and (kind == "Node" or kind == "GPUNode" or kind == "GPUClaim") then
              -- the node lifecycle controller writes a new Node too: read-modify-write
              update(path(kind, md.namespace, md.name), function(x) x.status = status end, "/status")
            end
            if kind == "GPUClass" then w.snapshot_classes[#w.snapshot_classes + 1] = o end
          end
        end
      end
    end
    for _, cl in ipairs(w.snapshot_classes) do class_known(cl.metadata.name, cl.spec and cl.spec.resourceName) end
  end

  -- ---- KubeVirt's part (core/cli/sim_kubevirt.c) ---------------------

  local function class_tolerations(vmi)
    local out, seen = {}, {}
    local classes = list(WATCHED.gpuclasses)
    local dev = vmi.spec and vmi.spec.domain and vmi.spec.domain.devices or {}
    for _, l in ipairs { dev.gpus or {}, dev.hostDevices or {} } do
      for _, d in ipairs(l) do
        for _, cl in ipairs(classes) do
          if cl.spec.resourceName == d.deviceName then
            for _, t in ipairs(cl.spec.tolerations or {}) do
              local k = enc(t)
              if not seen[k] then seen[k] = true; out[#out + 1] = t end
            end
          end
        end
      end
    end
    return out
  end

  local function create_vmi(vm)
    local ns, name = vm.metadata.namespace, vm.metadata.name
    local t = vm.spec.template or {}
    local md = { name = name, namespace = ns, labels = t.metadata and t.metadata.labels,
      annotations = t.metadata and t.metadata.annotations,
      ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachine", name = name,
        uid = vm.metadata.uid, controller = true, blockOwnerDeletion = true } } }
    must("POST", coll("VirtualMachineInstance", ns), { apiVersion = "kubevirt.io/v1",
      kind = "VirtualMachineInstance", metadata = md, spec = t.spec, status = { phase = "Pending" } })
  end

  local function final(v)
    local p = vmi_phase(v)
    return p == "Succeeded" or p == "Failed"
  end

  local function delete_vmi(ns, name)
    local st = c:request("DELETE", path("VirtualMachineInstance", ns, name))
    assert(st == 200 or st == 404, "DELETE VMI -> " .. tostring(st))
    assert(P.wait_until(function() return not get(path("VirtualMachineInstance", ns, name)) end, 20, 0.1))
  end

  -- one round; returns how many objects it changed
  local function kubevirt_round()
    local n = 0
    for _, vm in ipairs(list(WATCHED.virtualmachines)) do
      local ns, name = vm.metadata.namespace, vm.metadata.name
      local key = ns .. "/" .. name
      local run = w.runs[key] or { stopped = false, started = false }
      w.runs[key] = run
      local rs = vm.spec.runStrategy or "Halted"
      local vmi = get(path("VirtualMachineInstance", ns, name))
      local create = false
      if vmi and final(vmi) then
        if rs == "Always" or (rs == "RerunOnFailure" and vmi_phase(vmi) == "Failed" and not run.stopped) then
          delete_vmi(ns, name)
          create = true
        end
      elseif not vmi then
        create = rs == "Always" or (rs == "RerunOnFailure" and not run.stopped) or (rs == "Once" and not run.started)
      end
      if create then
        create_vmi(must("GET", path("VirtualMachine", ns, name)))
        run.started = true
        n = n + 1
      end
    end
    for _, v in ipairs(list(WATCHED.virtualmachineinstances)) do
      local ns, name = v.metadata.namespace, v.metadata.name
      if vmi_phase(v) == "Pending" and not v.metadata.deletionTimestamp then
        local pname = "virt-launcher-" .. name
        local pod = get(path("Pod", ns, pname))
        local owner = pod and pod.metadata.ownerReferences and pod.metadata.ownerReferences[1].uid
        if pod and owner ~= v.metadata.uid then
          c:request("DELETE", path("Pod", ns, pname) .. "?gracePeriodSeconds=0") -- an earlier VMI's
          n = n + 1
        elseif not pod then
          local labels = { ["kubevirt.io"] = "virt-launcher", ["vm.kubevirt.io/name"] = name }
          for k, x in pairs(v.metadata.labels or {}) do labels[k] = x end
          local ann = v.metadata.annotations and v.metadata.annotations[GATE]
          local st = c:request("POST", coll("Pod", ns), { apiVersion = "v1", kind = "Pod",
            metadata = { name = pname, namespace = ns, labels = labels,
              annotations = ann and { [GATE] = ann } or nil,
              ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = name,
                uid = v.metadata.uid, controller = true, blockOwnerDeletion = true } } },
            spec = { schedulingGates = { { name = GATE } }, tolerations = json.array(class_tolerations(v)),
              containers = { { name = "compute", image = "quay.io/kubevirt/virt-launcher:v1.9.0" } } } })
          -- a namespace just made may not have its default ServiceAccount yet: next round
          if st == 201 then n = n + 1 end
        elseif pod.spec.nodeName then
          -- kube-scheduler placed it: virt-handler runs the VMI there
          v.status = { phase = "Running", nodeName = pod.spec.nodeName }
          local st = c:request("PUT", path("VirtualMachineInstance", ns, name), v)
          assert(st == 200 or st == 409, "PUT VMI -> " .. tostring(st))
          n = n + 1
        end
      end
    end
    return n
  end

  local function same_state(a, b) return same(a.claims, b.claims) and same(a.vms, b.vms) end

  -- the leader and the spec's KubeVirt act until a round changes nothing
  -- (the leader caught up, KubeVirt had nothing to do, and what the API
  -- server shows stayed the same a moment later with no batch taken by the
  -- leader meanwhile: an object it deleted itself is in no list, but its
  -- deletion is a batch)
  local function passes() return metric('cozygpu_binder_passes_total{kind="incremental"}') or 0 end
  local function settle()
    for _ = 1, 120 do
      caught_up()
      if kubevirt_round() == 0 then
        local before, p0 = observed(), passes()
        P.sleep(0.5)
        caught_up()
        if passes() == p0 and same_state(observed(), before) and kubevirt_round() == 0 then return end
      end
    end
    error("the cluster did not settle")
  end

  -- ---- steps (core/cli/sim_scenario.c sim_scenario_step) --------------

  local function names(v) return type(v) == "table" and v or { v } end

  local function node_action(act, name)
    if act == "deleteNode" then
      must("DELETE", path("Node", nil, name))
      w.caps[name] = nil
    elseif act == "layoutPending" or act == "layoutApplied" then
      update(path("GPUNode", nil, name), function(g)
        g.status.layout = g.status.layout or {}
        g.status.layout.pending = act == "layoutPending"
      end, "/status")
    elseif act == "cordon" then
      merge(path("Node", nil, name), { spec = { unschedulable = true } })
    elseif act == "uncordon" then
      merge(path("Node", nil, name), { spec = { unschedulable = json.null } })
    else -- notReady, ready
      node_status(name, act == "ready")
    end
  end

  local function capacity(o)
    w.caps[o.node][o.class] = o.units
    local found = false
    for _, cls in ipairs(w.cap_order[o.node]) do found = found or cls == o.class end
    if not found then w.cap_order[o.node][#w.cap_order[o.node] + 1] = o.class end
    node_status(o.node, (function()
      local n = must("GET", path("Node", nil, o.node))
      for _, x in ipairs(n.status.conditions or {}) do
        if x.type == "Ready" then return x.status == "True" end
      end
      return false
    end)())
    update(path("GPUNode", nil, o.node), function(g)
      g.status = gpunode_status(o.node, g.status and g.status.layout and g.status.layout.pending)
    end, "/status")
  end

  local function vm_start(ref)
    local ns, name = split(ref)
    local key = ns .. "/" .. name
    w.runs[key] = w.runs[key] or { stopped = false, started = false }
    w.runs[key].stopped = false
    local vm = must("GET", path("VirtualMachine", ns, name))
    if (vm.spec.runStrategy or "Halted") == "Halted" then
      vm = merge(path("VirtualMachine", ns, name), { spec = { runStrategy = "Always" } })
    end
    local vmi = get(path("VirtualMachineInstance", ns, name))
    if vmi and final(vmi) then delete_vmi(ns, name) end
    if not vmi or final(vmi) then
      create_vmi(vm)
      w.runs[key].started = true
    end
  end

  local function vm_stop(ref)
    local ns, name = split(ref)
    local key = ns .. "/" .. name
    w.runs[key] = w.runs[key] or { stopped = false, started = false }
    w.runs[key].stopped = true
    local vm = must("GET", path("VirtualMachine", ns, name))
    if vm.spec.runStrategy == "Always" then merge(path("VirtualMachine", ns, name), { spec = { runStrategy = "Halted" } }) end
    if get(path("VirtualMachineInstance", ns, name)) then delete_vmi(ns, name) end
  end

  local function vmi_final(o)
    local ns, name = split(o.vm)
    update(path("VirtualMachineInstance", ns, name), function(v)
      v.status = v.status or {}
      v.status.phase = o.phase
    end)
    -- the leader sees the final VMI before its VM controller acts (as in simulate)
    caught_up()
  end

  -- the actions of a step in simulate's order, each taken by the leader
  -- before the next (sim_scenario_step)
  local function apply_step(step)
    local function each(v, fn)
      if v == nil then return end
      for _, x in ipairs(names(v)) do fn(x) end
      caught_up()
    end
    if step.addNodes then each(step.addNodes, def_node) end
    if step.addClaims then each(step.addClaims, def_claim) end
    if step.addVMs then each(step.addVMs, def_vm) end
    for _, act in ipairs { "cordon", "uncordon", "notReady", "ready", "deleteNode", "layoutPending", "layoutApplied" } do
      each(step[act], function(n) node_action(act, n) end)
    end
    if step.capacity then each(step.capacity[1] and step.capacity or { step.capacity }, capacity) end
    each(step.classDeleting, function(cl) must("DELETE", path("GPUClass", nil, cl)) end)
    each(step.start, vm_start)
    each(step.stop, vm_stop)
    if step.vmiFinal then each(step.vmiFinal[1] and step.vmiFinal or { step.vmiFinal }, vmi_final) end
    each(step.deleteClaim, function(ref)
      local ns, name = split(ref)
      must("DELETE", path("GPUClaim", ns, name))
    end)
    if step.leaderChange then
      pause()
      resume()
    end
  end

  -- ---- a scenario's hoster policies (`override`): the policies ConfigMap

  local override_keys = {}
  local function bundle_generation() return metric("cozygpu_policy_bundle_generation") or 0 end
  local function patch_policies(data)
    local before = bundle_generation()
    c:must { "-n", "cozy-gpu", "patch", "configmap", "cozygpu-policies", "--type", "merge", "-p",
      json.encode { data = data } }
    assert(P.wait_until(function() return bundle_generation() > before end, 30, 0.2),
      "the controller did not reload the policies ConfigMap:\n" .. (c:log_tail(replica.identity, 30) or ""))
  end
  local function set_override(dir)
    local data = {}
    for f in P.sh("ls " .. P.q(dir)):gmatch("%S+") do
      data[f] = P.read(dir .. "/" .. f)
      override_keys[#override_keys + 1] = f
    end
    patch_policies(data)
  end
  local function clear_override()
    if #override_keys == 0 then return end
    local data = {}
    for _, k in ipairs(override_keys) do data[k] = json.null end
    override_keys = {}
    patch_policies(data)
  end

  -- ---- an empty cluster between scenarios -----------------------------

  local function strip_and_delete(kind, objs)
    for _, o in ipairs(objs) do
      local ns = o.metadata.namespace
      if o.metadata.finalizers and #o.metadata.finalizers > 0 then
        c:request("PATCH", path(kind, ns, o.metadata.name), { metadata = { finalizers = json.null } },
          "application/merge-patch+json")
      end
      c:request("DELETE", path(kind, ns, o.metadata.name) .. "?gracePeriodSeconds=0")
    end
  end

  local function reset()
    for _, kind in ipairs { "VirtualMachine", "VirtualMachineInstance", "Pod", "GPUClaim", "PersistentVolumeClaim",
      "ResourceQuota" } do
      for ns in pairs(w and w.namespaces or {}) do
        strip_and_delete(kind, list(coll(kind, ns)))
      end
    end
    strip_and_delete("GPUClaim", list(WATCHED.gpuclaims))
    strip_and_delete("Pod", list(WATCHED.pods))
    strip_and_delete("VirtualMachineInstance", list(WATCHED.virtualmachineinstances))
    strip_and_delete("VirtualMachine", list(WATCHED.virtualmachines))
    for _, kind in ipairs { "PersistentVolume", "GPUNode", "Node", "GPUClass" } do
      strip_and_delete(kind, list(API[kind]))
    end
    c:request("DELETE", path("KubeVirt", "cozy-kubevirt", "kubevirt"))
    -- the namespaces stay, with no label of the last scenario (the budgets read them)
    for ns in pairs(w and w.namespaces or {}) do
      local n = get(path("Namespace", nil, ns))
      if n then
        n.metadata.labels = { ["kubernetes.io/metadata.name"] = ns }
        c:request("PUT", path("Namespace", nil, ns), n)
      end
    end
    assert(P.wait_until(function()
      for _, p in pairs(WATCHED) do
        if #list(p) > 0 then return false end
      end
      return #list(API.PersistentVolume) == 0
    end, 60, 0.2), "the cluster did not empty")
  end

  for _, file in ipairs(scenarios()) do
    it("replays " .. file .. " step by step as simulate predicts", function()
      local out, err, code = H.run { "simulate", "--output", "json", file }
      assert(code == 0, file .. ": simulate failed\n" .. out .. err)
      local sim = json.decode(out)
      local doc = assert(core.yaml(P.read(file)))[1]
      pause()
      reset()
      w = { classes = {}, caps = {}, cap_order = {}, runs = {}, namespaces = {}, next_device = 0, group = 0,
        snapshot_classes = {} }
      clear_override()
      if doc.override then set_override(file:match("^(.*)/[^/]+$") .. "/" .. doc.override) end
      if doc.snapshot then load_snapshot(file:match("^(.*)/[^/]+$") .. "/" .. doc.snapshot) end
      for _, n in ipairs(doc.namespaces or {}) do ensure_namespace(n.metadata.name, n.metadata.labels or {}) end
      for _, cl in ipairs(doc.classes or {}) do def_class(cl) end
      for _, n in ipairs(doc.nodes or {}) do def_node(n) end
      for _, cl in ipairs(doc.claims or {}) do def_claim(cl) end
      for _, vm in ipairs(doc.vms or {}) do def_vm(vm) end
      -- quotas last: the budget is the binder's to check at bind here
      -- (simulate has no admission; an order over budget is refused at
      -- admission only when the quota exists already)
      for _, q in ipairs(doc.resourceQuotas or {}) do
        local o = json.decode(json.encode(q))
        o.apiVersion, o.kind = "v1", "ResourceQuota"
        must("POST", coll("ResourceQuota", o.metadata.namespace), o)
      end
      resume()
      settle()
      local diffs = {}
      local function compare(i, name)
        local d = differences(predicted(sim.steps[i]), observed())
        if #d > 0 then
          diffs[#diffs + 1] = ("step %d (%s):\n%s"):format(i - 1, name, table.concat(d, "\n"))
        end
      end
      compare(1, "initial")
      for i, step in ipairs(doc.steps or {}) do
        w.in_step = true
        apply_step(step)
        w.in_step = false
        settle()
        compare(i + 1, step.name or ("step " .. i))
      end
      assert(#diffs == 0, file .. ": simulate and the cluster disagree\n" .. table.concat(diffs, "\n"))
    end)
  end
end)
