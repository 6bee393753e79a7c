-- `cozygpu agent` against the API server double, on fake sysfs and /proc
-- trees (spec/support/sysfs.lua): the GPUNode it creates and writes, and
-- the declared layout applied to nvidia/current_vgpu_type (DESIGN.md §7,
-- decision 0011).
--
-- The node: one L40S (10de:26b9) PF 0000:41:00.0 on nvidia with 4 VFs
-- (0000:41:00.4 .. 0000:41:00.7, LAYOUT §3 offset 4), every VF offering the
-- real L40S catalog (fixtures/sysfs/creatable_vgpu_types/l40s-full-catalog.txt:
-- 1155 = NVIDIA L40S-24Q, 1156 = NVIDIA L40S-48Q), and one L40S
-- 0000:81:00.0 on vfio-pci for passthrough.
local S = require "sysfs"
local D = require "double"
local P = require "proc"
local json = H.json

local PF, PT = "0000:41:00.0", "0000:81:00.0"
local VF = { [0] = "0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7" }
local NODE = "gpu-1"
local AGENT_UA = "cozygpu%-agent/"

local function node_desc()
  return { functions = {
    { address = PF, device = "26b9", subsystem = "10de:1851", driver = "nvidia", iommu = 40, numa = 0,
      sriov = { total = 32, vfs = 4, offset = 4, stride = 1, iommu = 41,
        vgpu = { creatable = "l40s-full-catalog.txt" } } },
    { address = PT, device = "26b9", subsystem = "10de:1851", driver = "vfio-pci", iommu = 80, numa = 1 },
  } }
end

local d, tree, kubeconfig

local function api(method, path, body, ctype)
  local st, obj = d:request(method, path, body, ctype)
  return obj, st
end

local GN_PATH = "/apis/cozystack.io/v1alpha1/gpunodes/" .. NODE

local function gpunode() return (api("GET", GN_PATH)) end

local once

-- Sets GPUNode.spec (a hoster's merge patch); a first pass creates the
-- GPUNode when it is not there yet.
local function set_spec(spec)
  if select(2, api("GET", GN_PATH)) == 404 then assert.equal(0, select(2, once())) end
  local _, st = api("PATCH", GN_PATH, { spec = spec }, "application/merge-patch+json")
  assert.equal(200, st)
end

local function write_boot_id(id)
  os.execute("mkdir -p " .. H.q(tree.proc .. "/sys/kernel/random"))
  H.write(tree.proc .. "/sys/kernel/random/boot_id", id .. "\n")
end

-- One pass: `cozygpu agent --once`. Returns stderr (the logs), exit code.
function once(extra)
  local args = { "agent", "--once", "--node", NODE, "--kubeconfig", kubeconfig, "--sysfs", tree.root,
    "--proc", tree.proc, "--pci-ids", S.pci_ids() }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  local _, err, code = H.run(args)
  return err, code
end

-- requests of the agent in the double's log since the last reset
local function agent_requests()
  local out = {}
  for _, r in ipairs(d:log()) do
    if r.userAgent and r.userAgent:match("^" .. AGENT_UA) then out[#out + 1] = r end
  end
  return out
end

local function count(reqs, method, path_pat)
  local n = 0
  for _, r in ipairs(reqs) do
    if r.method == method and r.path:match(path_pat) then n = n + 1 end
  end
  return n
end

local function types()
  local out = {}
  for i = 0, 3 do out[i + 1] = tree:vgpu(VF[i]) end
  return out
end

local function cond(gn, t)
  for _, c in ipairs(gn.status.conditions or {}) do if c.type == t then return c end end
end

local function fn_of(gn, addr)
  for _, f in ipairs(gn.status.functions) do if f.address == addr then return f end end
end

-- Starts `cozygpu agent` as a loop; waits for its first status. Returns
-- pid, log path.
local function start_loop(interval, extra)
  local log = os.tmpname()
  local argv = { H.bin, "agent", "--node", NODE, "--kubeconfig", kubeconfig, "--sysfs", tree.root,
    "--proc", tree.proc, "--pci-ids", S.pci_ids(), "--interval", interval }
  for _, a in ipairs(extra or {}) do argv[#argv + 1] = a end
  local pid = P.spawn(argv, log, H.asan and "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1" or nil)
  assert.truthy(P.wait_until(function()
    local gn = gpunode()
    return gn and gn.status and gn.status.bootID
  end, 15), P.read(log))
  return pid, log
end

before_each(function()
  d = D.start()
  kubeconfig = d:kubeconfig()
  local crd = assert(H.core.manifests("deploy/crds/gpunodes.cozystack.io.yaml"))[1].object
  local _, st = api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
  assert.equal(201, st)
  -- the agent's namespace, where each node's Lease lives (deploy/60-agent.yaml)
  _, st = api("POST", "/api/v1/namespaces", { apiVersion = "v1", kind = "Namespace",
    metadata = { name = "cozy-gpu-agent" } })
  assert.equal(201, st)
  local node
  node, st = api("POST", "/api/v1/nodes", { apiVersion = "v1", kind = "Node", metadata = { name = NODE } })
  assert.equal(201, st)
  assert.truthy(node.metadata.uid)
  tree = S.build(node_desc())
  os.execute("mkdir -p " .. H.q(tree.proc))
  write_boot_id("boot-1")
end)

after_each(function()
  if tree then tree:remove() end
  if d then d:stop() end
end)

describe("cozygpu agent", function()
  it("creates the GPUNode owned by its Node and writes the inventory with health, once", function()
    local logs, code = once()
    assert.equal(0, code, logs)
    local gn = gpunode()
    local node = api("GET", "/api/v1/nodes/" .. NODE)
    assert.same({ { apiVersion = "v1", kind = "Node", name = NODE, uid = node.metadata.uid } },
      gn.metadata.ownerReferences)
    -- status.functions is the inventory (the same scan `cozygpu inventory`
    -- prints), each GPU function with its health
    local inv = assert(S.inventory(tree))
    assert.equal(#inv.functions, #gn.status.functions)
    for i, f in ipairs(inv.functions) do
      local got = json.copy(gn.status.functions[i])
      assert.same({ status = "Healthy" }, got.health)
      got.health = nil
      assert.same(f, got)
    end
    assert.equal(6, #gn.status.functions) -- two PFs, four VFs
    assert.equal("boot-1", gn.status.bootID)
    assert.equal(gn.metadata.generation, gn.status.observedGeneration)
    assert.same({ "True", "AllHealthy" }, { cond(gn, "Healthy").status, cond(gn, "Healthy").reason })
    assert.same({ "True", "NoLayout" }, { cond(gn, "LayoutApplied").status, cond(gn, "LayoutApplied").reason })
    assert.is_false(gn.status.layout.pending)

    -- a second pass with nothing changed writes nothing: no status PUT
    d:reset_log()
    logs, code = once()
    assert.equal(0, code, logs)
    local reqs = agent_requests()
    assert.equal(0, count(reqs, "PUT", "/status$"), logs)
    assert.equal(0, count(reqs, "POST", "gpunodes"))
    assert.equal(gn.metadata.resourceVersion, gpunode().metadata.resourceVersion)
  end)

  it("adds the owner reference to a GPUNode a hoster created first, keeping the spec", function()
    local _, st = api("POST", "/apis/cozystack.io/v1alpha1/gpunodes", { apiVersion = "cozystack.io/v1alpha1",
      kind = "GPUNode", metadata = { name = NODE },
      spec = { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 1 } } } })
    assert.equal(201, st)
    local logs, code = once()
    assert.equal(0, code, logs)
    local gn = gpunode()
    assert.equal(1, #gn.metadata.ownerReferences)
    assert.equal("Node", gn.metadata.ownerReferences[1].kind)
    assert.equal(PF, gn.spec.gpus[1].address)
    assert.same({ 1155, 0, 0, 0 }, types())
  end)

  it("applies the layout, and a second pass writes nothing", function()
    assert.equal(0, select(2, once()))
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 2 },
      { address = PT, mode = "Passthrough" } } }
    local logs, code = once()
    assert.equal(0, code, logs)
    assert.same({ 1155, 1155, 0, 0 }, types())
    assert.equal("1155\n", tree:read(VF[0], "nvidia/current_vgpu_type"))
    local gn = gpunode()
    assert.equal(gn.metadata.generation, gn.status.observedGeneration)
    assert.same({ "True", "Applied" }, { cond(gn, "LayoutApplied").status, cond(gn, "LayoutApplied").reason })
    assert.equal(2, #gn.status.layout.lastWrites)
    for i, w in ipairs(gn.status.layout.lastWrites) do
      assert.same({ VF[i - 1], 0, 1155, "L40S-24Q" }, { w.address, w.fromType, w.toType, w.profile })
      assert.matches("^%d+%-%d+%-%d+T%d+:%d+:%d+Z$", w.time)
    end
    assert.same({ 1155, "NVIDIA L40S-24Q", "L40S-24Q" },
      { fn_of(gn, VF[0]).vgpu.type, fn_of(gn, VF[0]).vgpu.typeName, fn_of(gn, VF[0]).vgpu.profile })
    -- the card's catalog is kept (the API server did not prune it): the 23
    -- types of fixtures/sysfs/creatable_vgpu_types/l40s-full-catalog.txt
    local k = gn.status.layout.knownTypes
    assert.same({ 1, PF, 23 }, { #k, k[1].physicalFunction, #k[1].types })
    assert.same({ id = 1155, name = "NVIDIA L40S-24Q" }, k[1].types[11])
    assert.equal(2, select(2, logs:gsub("set the vGPU type of a VF", "")))

    -- re-apply: nothing to write, nothing logged, status untouched
    local before = {}
    for i = 0, 1 do before[i] = P.sh("stat -c %Y.%y " .. H.q(tree:path(VF[i], "nvidia/current_vgpu_type"))) end
    d:reset_log()
    logs, code = once()
    assert.equal(0, code, logs)
    assert.is_nil(logs:find("vGPU type of a VF", 1, true))
    assert.equal(0, count(agent_requests(), "PUT", "/status$"))
    for i = 0, 1 do
      assert.equal(before[i], P.sh("stat -c %Y.%y " .. H.q(tree:path(VF[i], "nvidia/current_vgpu_type"))))
    end
  end)

  it("restores the profiles after a reboot", function()
    set_spec { gpus = { { address = PF, mode = "VGPU", vfs = { { index = 1, profile = "L40S-48Q" },
      { index = 3, profile = "NVIDIA L40S-24Q" } } } } }
    assert.equal(0, select(2, once()))
    assert.same({ 0, 1156, 0, 1155 }, types())
    -- LAYOUT §4: vGPU types do not survive a reboot; the files read 0
    tree:reboot()
    write_boot_id("boot-2")
    assert.same({ 0, 0, 0, 0 }, types())
    local logs, code = once()
    assert.equal(0, code, logs)
    assert.same({ 0, 1156, 0, 1155 }, types())
    assert.matches("rebooted", logs)
    local gn = gpunode()
    assert.equal("boot-2", gn.status.bootID)
    assert.same({ "True", "Applied" }, { cond(gn, "LayoutApplied").status, cond(gn, "LayoutApplied").reason })
  end)

  it("leaves a VF a running VM holds, reports the pending change, and applies it once free", function()
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 2 } } }
    assert.equal(0, select(2, once()))
    assert.same({ 1155, 1155, 0, 0 }, types())
    -- QEMU of a VM holds VF 0's IOMMU group open
    local pid = tree:hold(VF[0])
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-48Q", count = 1 } } }
    local logs, code = once()
    assert.equal(0, code, logs)
    -- VF 0 untouched (held); VF 1 keeps its vGPU too while the GPU has a
    -- held VF (decision 0011: the old vGPUs stay usable until the change can
    -- be made whole)
    assert.same({ 1155, 1155, 0, 0 }, types())
    local gn = gpunode()
    assert.is_true(gn.status.layout.pending)
    local p = gn.status.layout.pendingChanges
    assert.equal(2, #p)
    assert.same({ VF[0], PF, 0, 1155, 1156, "L40S-24Q", "L40S-48Q", "InUse" },
      { p[1].address, p[1].physicalFunction, p[1].vfIndex, p[1].fromType, p[1].toType, p[1].fromProfile,
        p[1].toProfile, p[1].reason })
    assert.matches(("pid %d %%(qemu%%-kvm%%) holds /dev/vfio/41"):format(pid), p[1].message)
    assert.same({ VF[1], 1155, 0, "WaitsForVF" }, { p[2].address, p[2].fromType, p[2].toType, p[2].reason })
    assert.is_true(fn_of(gn, VF[0]).inUse)
    assert.is_nil(fn_of(gn, VF[1]).inUse)
    assert.same({ "False", "Pending" }, { cond(gn, "LayoutApplied").status, cond(gn, "LayoutApplied").reason })
    assert.matches("layout change pending", logs)

    -- the VM stops: the change goes through (clears, then the set)
    tree:release(pid)
    logs, code = once()
    assert.equal(0, code, logs)
    assert.same({ 1156, 0, 0, 0 }, types())
    gn = gpunode()
    assert.is_false(gn.status.layout.pending)
    assert.same({}, gn.status.layout.pendingChanges)
    local w = {}
    for _, x in ipairs(gn.status.layout.lastWrites) do w[#w + 1] = { x.address, x.fromType, x.toType } end
    assert.same({ { VF[0], 1155, 0 }, { VF[1], 1155, 0 }, { VF[0], 0, 1156 } }, w)
  end)

  it("sees a VF held through its VFIO cdev too", function()
    tree:remove()
    local desc = node_desc()
    desc.functions[1].sriov.vf = { [0] = { cdev = 3 } }
    tree = S.build(desc)
    os.execute("mkdir -p " .. H.q(tree.proc))
    tree:set_vgpu(VF[0], 1155)
    local pid = tree:hold(VF[0], { cdev = true })
    assert.equal(0, select(2, once()))
    set_spec { gpus = { { address = PF, mode = "VGPU" } } }
    assert.equal(0, select(2, once()))
    assert.same({ 1155, 0, 0, 0 }, types())
    local p = gpunode().status.layout.pendingChanges
    assert.equal(1, #p)
    assert.matches(("pid %d %%(qemu%%-kvm%%) holds /dev/vfio/devices/vfio3"):format(pid), p[1].message)
  end)

  it("fails closed when it cannot read a process's fds: nothing changes, every change pending", function()
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 1 } } }
    assert.equal(0, select(2, once()))
    assert.same({ 1155, 0, 0, 0 }, types())
    -- a VM's QEMU runs as another user: its /proc/<pid>/fd is 0500 and owned
    -- by it. Here: a directory of mode 000, read by an agent without the
    -- capabilities that bypass permissions (as without CAP_DAC_READ_SEARCH).
    local pid = tree:hold(VF[0])
    os.execute("chmod 000 " .. H.q(("%s/%d/fd"):format(tree.proc, pid)))
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-48Q", count = 1 } } }
    local _, err, code = H.run({ "agent", "--once", "--node", NODE, "--kubeconfig", kubeconfig, "--sysfs", tree.root,
      "--proc", tree.proc, "--pci-ids", S.pci_ids() },
      "setpriv --inh-caps=-all --bounding-set=-dac_override,-dac_read_search env ")
    os.execute("chmod 700 " .. H.q(("%s/%d/fd"):format(tree.proc, pid)))
    assert.equal(0, code, err)
    assert.same({ 1155, 0, 0, 0 }, types())
    local gn = gpunode()
    assert.is_true(gn.status.layout.pending)
    local p = gn.status.layout.pendingChanges[1]
    assert.same({ VF[0], "InUse" }, { p.address, p.reason })
    assert.matches("cannot tell whether a VM holds it %(.*/fd: Permission denied%)", p.message)
    -- not known to be held, so not marked in use
    assert.is_nil(fn_of(gn, VF[0]).inUse)
  end)

  it("refuses a profile the VF cannot take, naming it and the creatable ones, and writes nothing for it", function()
    tree:set_creatable(VF[2], { { 1147, "NVIDIA L40S-1Q" }, { 1148, "NVIDIA L40S-2Q" } })
    set_spec { gpus = { { address = PF, mode = "VGPU", vfs = { { index = 2, profile = "L40S-24Q" } } } } }
    local logs, code = once()
    assert.equal(0, code, logs)
    assert.same({ 0, 0, 0, 0 }, types())
    local gn = gpunode()
    local r = gn.status.layout.refused
    assert.equal(1, #r)
    assert.same({ VF[2], PF, 2, "L40S-24Q", { "L40S-1Q", "L40S-2Q" } },
      { r[1].address, r[1].physicalFunction, r[1].vfIndex, r[1].profile, r[1].creatable })
    assert.equal("VF 0000:41:00.6 (vf 2 of 0000:41:00.0) cannot take profile L40S-24Q; creatable: L40S-1Q, L40S-2Q",
      r[1].message)
    assert.same({ "False", "Refused" }, { cond(gn, "LayoutApplied").status, cond(gn, "LayoutApplied").reason })
    assert.matches("layout refused", logs)
    assert.matches("cannot take profile L40S%-24Q", logs)
  end)

  it("reports a driver that does not fit the mode, and a GPU the node lacks", function()
    set_spec { gpus = { { address = PT, mode = "VGPU" }, { address = "0000:c1:00.0", mode = "Passthrough" } } }
    assert.equal(0, select(2, once()))
    local e = gpunode().status.layout.errors
    assert.same({ "spec.gpus[0].mode", "DriverMismatch" }, { e[1].field, e[1].reason })
    assert.same({ "spec.gpus[1].address", "NoSuchGPU" }, { e[2].field, e[2].reason })
  end)

  it("marks an unbound GPU, a vanished GPU and a PF short of VFs unhealthy", function()
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-1Q", count = 4 } } }
    assert.equal(0, select(2, once()))
    tree:set_numvfs(PF, 2)
    tree:unbind(VF[0])
    tree:vanish(PT)
    local logs, code = once()
    assert.equal(0, code, logs)
    local gn = gpunode()
    assert.same({ "Unhealthy", "VFCountBelowLayout" }, { fn_of(gn, PF).health.status, fn_of(gn, PF).health.reason })
    assert.equal("the layout names 4 VFs; 2 are enabled", fn_of(gn, PF).health.message)
    assert.same({ "Unhealthy", "DriverUnbound" }, { fn_of(gn, VF[0]).health.status, fn_of(gn, VF[0]).health.reason })
    assert.same({ "Unhealthy", "Vanished" }, { fn_of(gn, PT).health.status, fn_of(gn, PT).health.reason })
    assert.is_nil(fn_of(gn, VF[2])) -- a disabled VF is not carried forward
    local h = cond(gn, "Healthy")
    assert.same({ "False", "Unhealthy" }, { h.status, h.reason })
    assert.equal("0000:41:00.0: VFCountBelowLayout; 0000:41:00.4: DriverUnbound; 0000:81:00.0: Vanished", h.message)
  end)

  it("runs as a loop: applies a spec change from the watch at once, and stops on SIGTERM", function()
    local pid, log = start_loop("1h", { "--log-format", "json" })
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 1 } } }
    -- with an interval of an hour, only the watch can bring the change
    local applied = P.wait_until(function() return tree:vgpu(VF[0]) == 1155 end, 10)
    assert.truthy(applied, P.read(log))
    local gen = gpunode().metadata.generation
    assert.truthy(P.wait_until(function() return gpunode().status.observedGeneration == gen end, 10))
    P.kill(pid, "TERM")
    assert.truthy(P.wait_exit(pid, 10))
    local msgs = {}
    for _, l in ipairs(H.json_lines(P.read(log))) do msgs[l.msg] = true end
    assert.is_true(msgs["shutting down"])
    assert.is_true(msgs["released the lease"])
    os.remove(log)
  end)

  it("puts writes whose status write failed into the next status it writes", function()
    local pid, log = start_loop("300ms")
    -- the next three status writes fail (one pass: a try and two retries)
    d:fail { method = "PUT", path = GN_PATH .. "/status", status = 500, count = 3 }
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 1 } } }
    assert.truthy(P.wait_until(function()
      local w = gpunode().status.layout.lastWrites
      return w and #w == 1 and w[1].address == VF[0] and w[1].toType == 1155
    end, 15), P.read(log))
    assert.same({ 1155, 0, 0, 0 }, types())
    P.stop(pid)
    os.remove(log)
  end)

  it("stops within seconds on SIGTERM even while the API server makes it wait", function()
    local pid, log = start_loop("300ms")
    -- every status write is told to come back in 30 s
    d:fail { method = "PUT", path = GN_PATH .. "/status", status = 429, retryAfter = 30, count = -1 }
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 1 } } }
    assert.truthy(P.wait_until(function() return tree:vgpu(VF[0]) == 1155 end, 10))
    -- the status PUT has been told to wait (the double logs the 429 it
    -- answered): the agent is now waiting out its Retry-After
    assert.truthy(P.wait_until(function()
      for _, r in ipairs(d:log()) do
        if r.method == "PUT" and r.path == GN_PATH .. "/status" and r.status == 429 then return true end
      end
    end, 10), "the agent sent no status PUT the double answered 429:\n" .. (P.read(log) or ""))
    local t0 = os.time()
    P.kill(pid, "TERM")
    assert.truthy(P.wait_exit(pid, 10), "the agent did not stop")
    assert.is_true(os.time() - t0 <= 7)
    assert.matches("shutting down", P.read(log))
    d:clear()
    os.remove(log)
  end)

  it("sends only requests its ClusterRole and Role (deploy/60-agent.yaml) allow", function()
    assert.equal(0, select(2, once()))
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 1 } } }
    assert.equal(0, select(2, once()))
    local cluster, ns_rules, ns_of_role
    for _, doc in ipairs(assert(H.core.manifests("deploy/60-agent.yaml"))) do
      if doc.object.kind == "ClusterRole" then cluster = doc.object.rules end
      if doc.object.kind == "Role" then ns_rules, ns_of_role = doc.object.rules, doc.object.metadata.namespace end
    end
    local function allows(rules, group, resource, verb)
      for _, rule in ipairs(rules or {}) do
        local g, rs, vs = {}, {}, {}
        for _, x in ipairs(rule.apiGroups) do g[x] = true end
        for _, x in ipairs(rule.resources) do rs[x] = true end
        for _, x in ipairs(rule.verbs) do vs[x] = true end
        if g[group] and rs[resource] and vs[verb] then return true end
      end
      return false
    end
    local VERB = { GET = "get", POST = "create", PUT = "update", PATCH = "patch", DELETE = "delete" }
    local reqs = agent_requests()
    assert.is_true(#reqs >= 4)
    local leases = 0
    for _, r in ipairs(reqs) do
      local group, rest = r.path:match("^/apis/([^/]+)/[^/]+/(.*)$")
      if not group then group, rest = "", r.path:match("^/api/v1/(.*)$") end
      local ns
      ns, rest = rest:match("^namespaces/([^/]+)/(.+)$"), rest:match("^namespaces/[^/]+/(.+)$") or rest
      local res, name, sub = rest:match("^([^/]+)/?([^/]*)/?([^/]*)$")
      local verb = VERB[r.method]
      if r.method == "GET" and name == "" then verb = r.watch and "watch" or "list" end
      local resource = sub ~= "" and (res .. "/" .. sub) or res
      local ok = allows(cluster, group, resource, verb) or (ns == ns_of_role and allows(ns_rules, group, resource, verb))
      if resource == "leases" then leases = leases + 1 end
      assert.is_true(ok, ("%s %s (%s %s/%s) is not granted"):format(r.method, r.path, verb, group, resource))
    end
    assert.is_true(leases >= 2) -- the node's Lease was taken and released
  end)

  it("is the node's only writer: a second agent waits while the first holds the node's Lease", function()
    local pid, log = start_loop("200ms", { "--identity", "agent-a" })
    local lease = api("GET", "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu-agent/leases/cozygpu-agent-" .. NODE)
    assert.equal("agent-a", lease.spec.holderIdentity)
    set_spec { gpus = { { address = PF, mode = "VGPU", profile = "L40S-24Q", count = 1 } } }
    assert.truthy(P.wait_until(function() return tree:vgpu(VF[0]) == 1155 end, 10))
    -- a second agent for the same node (a debugging run, a wrong NODE_NAME)
    local logs, code = once { "--identity", "agent-b" }
    assert.equal(1, code)
    assert.matches("another agent holds the node's Lease", logs)
    assert.is_nil(logs:find("wrote the GPUNode status", 1, true))
    -- the first stops and releases the Lease: the second takes it at once
    P.kill(pid, "TERM")
    assert.truthy(P.wait_exit(pid, 10))
    lease = api("GET", "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu-agent/leases/cozygpu-agent-" .. NODE)
    assert.equal("", lease.spec.holderIdentity or "")
    logs, code = once { "--identity", "agent-b" }
    assert.equal(0, code, logs)
    os.remove(log)
  end)

  it("refuses bad flags and an unusable sysfs root with exit 2, naming them", function()
    local _, err, code = H.run { "agent", "--once", "--kubeconfig", kubeconfig }
    assert.equal(2, code)
    assert.matches("%-%-node is required", err)
    _, err, code = H.run { "agent", "--node", NODE, "--interval", "soon" }
    assert.equal(2, code)
    assert.matches("%-%-interval", err)
    _, err, code = H.run { "agent", "--once", "--node", NODE, "--kubeconfig", kubeconfig, "--sysfs", "/nonexistent" }
    assert.equal(2, code)
    assert.matches("/nonexistent", err)
    _, err, code = H.run { "agent", "--once", "--node", NODE, "--kubeconfig", kubeconfig, "--sysfs", tree.root,
      "--proc", "/nonexistent-proc" }
    assert.equal(2, code)
    assert.matches("%-%-proc /nonexistent%-proc", err)
  end)

  it("fails the pass (exit 1) when its Node does not exist, and creates nothing", function()
    local _, err, code = H.run { "agent", "--once", "--node", "no-such-node", "--kubeconfig", kubeconfig,
      "--sysfs", tree.root, "--proc", tree.proc, "--pci-ids", S.pci_ids() }
    assert.equal(1, code)
    assert.matches("nodes/no%-such%-node: HTTP 404", err)
    local _, st = api("GET", "/apis/cozystack.io/v1alpha1/gpunodes/no-such-node")
    assert.equal(404, st)
  end)
end)
