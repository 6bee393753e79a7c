-- The leader's license copier against the API server double, two replicas
-- (DESIGN.md §3 spec.license, §5 vGPU entitlement, §8 licensing;
-- docs/decisions/0004, 0029). The examples' l40s-24c is a licensed vGPU
-- class whose token Secret is cozy-gpu/nvidia-vgpu-license. Which
-- namespaces must hold the copy is computed here from the double's objects
-- by the rule itself (`want`: the namespace and every tenant ancestor carry
-- gpu.cozystack.io/vgpu=true, and a GPUClaim of the class or a VMI of it
-- that is not final is there), never from what the controller reports;
-- everything asserted is read back from the double with kubectl or GET.
-- The double enforces no RBAC and no admission policy: its request log
-- shows instead that the controller reads no Secret but those of its own
-- namespace (list and watch there only) and writes none but the copies
-- (docs/decisions/0035); a copy changed or deleted behind the leader's
-- back (a privileged user; anyone where the copies' policy is missing)
-- comes back at its pair's next write or at the next --resync.
local P = require "proc"
local E = require "controller_env"
local G = require "gpu_nodes"
local json = H.json

local CLASS = "l40s-24c"
local RESOURCE = "nvidia.com/L40S-24C"
local COPY = "gpu-license-" .. CLASS
local KEY = "client_configuration_token.tok"
local VGPU = "gpu.cozystack.io/vgpu"
local TENANT = "tenant.cozystack.io/"
local TOKEN1 = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzZXJ2aWNlX2luc3RhbmNlIjoiMSJ9.c2lnbmF0dXJlLTE=\n"
local TOKEN2 = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzZXJ2aWNlX2luc3RhbmNlIjoiMiJ9.c2lnbmF0dXJlLTI=\n"

local function b64(s)
  local out = P.sh("printf %s " .. P.q(s) .. " | base64 -w0")
  return (out:gsub("%s+$", ""))
end

local c, d, dir

local function kubectl(args, stdin)
  if stdin then
    local f = dir .. "/in-" .. tostring(math.random(1e9)) .. ".json"
    H.write(f, type(stdin) == "string" and stdin or json.encode(stdin))
    args[#args + 1] = "-f"
    args[#args + 1] = f
  end
  return E.kubectl(d, args)
end
local function ok(args, stdin)
  local out, code = kubectl(args, stdin)
  assert.are.equal(0, code, out)
  return out
end
local function get(path) return (E.get(d, path)) end
local function must(method, path, body)
  local v, st = E.send(d, method, path, body)
  assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st), json.encode(v or {})))
  return v
end

local function namespace(name, parents, vgpu)
  local labels = { [TENANT .. "tenant-root"] = "", [TENANT .. name] = "" }
  for _, p in ipairs(parents) do labels[TENANT .. p] = "" end
  if vgpu then labels[VGPU] = "true" end
  ok({ "apply" }, { apiVersion = "v1", kind = "Namespace", metadata = { name = name, labels = labels } })
end
local function claim(ns, name, class)
  ok({ "apply" }, { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
    metadata = { name = name, namespace = ns }, spec = { class = class or CLASS, count = 1 } })
end
local function vmi_path(ns, name)
  return "/apis/kubevirt.io/v1/namespaces/" .. ns .. "/virtualmachineinstances/" .. name
end
local function vmi(ns, name, phase)
  local v = must("POST", "/apis/kubevirt.io/v1/namespaces/" .. ns .. "/virtualmachineinstances", {
    apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", metadata = { name = name, namespace = ns },
    spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = RESOURCE } } } } } })
  v.status = { phase = phase }
  return must("PUT", vmi_path(ns, name) .. "/status", v)
end
local function vmi_phase(ns, name, phase)
  local v = assert(get(vmi_path(ns, name)))
  v.status = v.status or {}
  v.status.phase = phase
  must("PUT", vmi_path(ns, name) .. "/status", v)
end
local function source(data, extra_annotations)
  local enc = {}
  for k, v in pairs(data) do enc[k] = b64(v) end
  ok({ "apply" }, { apiVersion = "v1", kind = "Secret", type = "Opaque",
    metadata = { name = "nvidia-vgpu-license", namespace = "cozy-gpu", annotations = extra_annotations },
    data = next(enc) and enc or json.object() })
end

-- the copies in the double: ns -> Secret
local function copies()
  local out = {}
  for _, s in ipairs(d:state("secrets").items) do
    if s.metadata.name == COPY then out[s.metadata.namespace] = s end
  end
  return out
end

-- decision 0035, from the double's request log: the controller's only
-- reads of Secrets are the list and watch of its own namespace's; it
-- never reads one by name, never lists or watches elsewhere, never
-- patches; it creates, updates and deletes only the copies. Returns the
-- controller's Secret requests seen, and empties the log.
local function check_secret_requests()
  local seen = {}
  for _, r in ipairs(d:log()) do
    if (r.userAgent or ""):find("^cozygpu/") and r.path:find("/secrets", 1, true) then
      seen[#seen + 1] = r
      local what = r.method .. " " .. r.path .. (r.query and r.query ~= "" and ("?" .. r.query) or "")
      if r.method == "GET" then
        assert.are.equal("/api/v1/namespaces/cozy-gpu/secrets", r.path, what)
      elseif r.method == "POST" then
        assert.truthy(r.path:match("^/api/v1/namespaces/[^/]+/secrets$"), what)
      else
        assert.truthy(r.method == "PUT" or r.method == "DELETE", what)
        assert.truthy(r.path:match("^/api/v1/namespaces/[^/]+/secrets/" .. COPY:gsub("%-", "%%-") .. "$"), what)
      end
    end
  end
  d:reset_log()
  return seen
end

-- the rule, from the double's objects: DESIGN.md §5 (the label on the
-- namespace and on every tenant ancestor), and a user of the class
local function entitled(nss, name)
  local ns = nss[name]
  local labels = ns and ns.metadata.labels or {}
  if labels[VGPU] ~= "true" then return false end
  for k in pairs(labels) do
    local a = k:sub(1, #TENANT) == TENANT and k:sub(#TENANT + 1)
    if a then
      local an = nss[a]
      if not an or (an.metadata.labels or {})[VGPU] ~= "true" then return false end
    end
  end
  return true
end
local function users(ns)
  local out = {}
  for _, x in ipairs(d:state("gpuclaims").items) do
    if x.metadata.namespace == ns and x.spec.class == CLASS then
      out[#out + 1] = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", name = x.metadata.name,
        uid = x.metadata.uid }
    end
  end
  for _, x in ipairs(d:state("virtualmachineinstances").items) do
    local ph = x.status and x.status.phase
    local gpus = x.spec and x.spec.domain and x.spec.domain.devices and x.spec.domain.devices.gpus or {}
    if x.metadata.namespace == ns and ph ~= "Succeeded" and ph ~= "Failed" and gpus[1]
      and gpus[1].deviceName == RESOURCE then
      out[#out + 1] = { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = x.metadata.name,
        uid = x.metadata.uid }
    end
  end
  table.sort(out, function(a, b) return a.kind .. "/" .. a.name < b.kind .. "/" .. b.name end)
  return out
end
local function want()
  local nss, out = {}, {}
  for _, n in ipairs(d:state("namespaces").items) do nss[n.metadata.name] = n end
  for name in pairs(nss) do
    if entitled(nss, name) and #users(name) > 0 then out[name] = true end
  end
  return out
end
local function set_of(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return table.concat(out, ",")
end
-- waits until the copies are exactly in `names` (a list) and returns them
local function wait_copies(names, timeout)
  local w = {}
  for _, n in ipairs(names) do w[n] = true end
  local last
  assert(P.wait_until(function()
    last = copies()
    return set_of(last) == set_of(w)
  end, timeout or 20), ("copies in %s, wanted %s"):format(set_of(last or {}), set_of(w)))
  return last
end
local function cond(name)
  local cls = get("/apis/cozystack.io/v1alpha1/gpuclasses/" .. (name or CLASS))
  for _, x in ipairs(cls and cls.status and cls.status.conditions or {}) do
    if x.type == "LicenseReady" then return x end
  end
  return nil
end
local function wait_cond(status, reason)
  local last
  assert(P.wait_until(function()
    last = cond()
    if status == nil then return last == nil end
    return last and last.status == status and last.reason == reason
  end, 20), ("LicenseReady: wanted %s/%s, got %s"):format(tostring(status), tostring(reason), json.encode(last or {})))
  return last
end
local function events(reason)
  local out = {}
  local list = get("/api/v1/events?fieldSelector=involvedObject.kind%3DGPUClass,involvedObject.name%3D" .. CLASS)
  for _, e in ipairs(list and list.items or {}) do
    if e.reason == reason then out[#out + 1] = e end
  end
  return out
end
local function lease_holder()
  local l = get("/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
  return l and l.spec and l.spec.holderIdentity
end
-- a copy holds the token and nothing else, and is owned by the users
local function check_copy(s, token)
  assert.are.equal("Opaque", s.type)
  assert.is_true(s.immutable)
  assert.are.same({ [KEY] = b64(token) }, s.data)
  assert.is_nil(s.stringData)
  assert.are.same({ ["app.kubernetes.io/managed-by"] = "cozygpu", ["gpu.cozystack.io/license-class"] = CLASS },
    s.metadata.labels)
  assert.is_nil(s.metadata.annotations)
  local u = users(s.metadata.namespace)
  for i = #u, 33, -1 do u[i] = nil end -- the first 32 (decision 0029)
  assert.are.same(u, s.metadata.ownerReferences)
end

describe("the leader's license copier (two replicas against the double)", function()
  setup(function()
    c = E.start_cluster { n = 2 }
    d, dir = c.d, c.dir
    -- tenant-root and tenant-a are entitled, tenant-b is not (examples)
    namespace("tenant-a-x", { "tenant-a" }, true)
    namespace("tenant-b-y", { "tenant-b" }, true) -- labelled, but its parent is not
    namespace("tenant-c", {}, true)
    namespace("tenant-d", {}, true)
    namespace("tenant-e", {}, true)
    namespace("tenant-e-f", { "tenant-e" }, true)
    for _, p in ipairs { { "tenant-a", "a1" }, { "tenant-a-x", "x1" }, { "tenant-b", "b1" }, { "tenant-b-y", "y1" },
      { "tenant-c", "c1" }, { "tenant-d", "d1" }, { "tenant-e-f", "f1" } } do
      claim(p[1], p[2])
    end
    vmi("tenant-c", "vc", "Running")
  end)
  teardown(function() if c then E.stop_cluster(c) end end)
  after_each(function() check_secret_requests() end)

  it("with the token Secret missing: LicenseReady False SecretNotFound naming the class and its secretRef, a Warning Event, no copy", function()
    local x = wait_cond("False", "SecretNotFound")
    assert.truthy(x.message:find(CLASS, 1, true), x.message)
    assert.truthy(x.message:find("cozy-gpu/nvidia-vgpu-license", 1, true), x.message)
    assert.falsy(x.message:find("tenant-", 1, true), x.message)
    assert(P.wait_until(function() return #events("SecretNotFound") > 0 end, 10), "no SecretNotFound Event")
    local ev = events("SecretNotFound")[1]
    assert.are.equal("Warning", ev.type)
    assert.falsy(ev.message:find("tenant-", 1, true), ev.message)
    -- the Accepted condition of status.c is still there beside it
    local cls = get("/apis/cozystack.io/v1alpha1/gpuclasses/" .. CLASS)
    local types = {}
    for _, y in ipairs(cls.status.conditions) do types[#types + 1] = y.type end
    table.sort(types)
    assert.are.same({ "Accepted", "LicenseReady" }, types)
    assert.are.same({}, copies())
    -- the token Secrets are watched in cozy-gpu, and nowhere else
    local watched = false
    for _, r in ipairs(check_secret_requests()) do
      watched = watched or (r.method == "GET" and r.watch and r.path == "/api/v1/namespaces/cozy-gpu/secrets")
    end
    assert.is_true(watched, "no watch of cozy-gpu's Secrets")
  end)

  it("copies the token only into the entitled namespaces that use the class, and nothing of the source beyond it", function()
    source({ [KEY] = TOKEN1, notes = "hoster notes" }, { ["hoster.example.com/comment"] = "do not copy" })
    local x = wait_cond("True", "TokenFound")
    assert.falsy(x.message:find("tenant-", 1, true), x.message)
    local w = want()
    assert.are.equal("tenant-a,tenant-a-x,tenant-c,tenant-d,tenant-e-f", set_of(w))
    local got = wait_copies { "tenant-a", "tenant-a-x", "tenant-c", "tenant-d", "tenant-e-f" }
    for _, s in pairs(got) do check_copy(s, TOKEN1) end
    -- a while later the unentitled namespaces (tenant-b; tenant-b-y, whose
    -- parent lacks the label) still have none, though each has a claim
    -- and, once settled, nothing is written again: no Secret and no class
    -- status write while nothing changes
    check_secret_requests()
    P.sleep(3)
    assert.are.equal(set_of(w), set_of(copies()))
    for _, r in ipairs(d:log()) do
      local write = r.method ~= "GET" and not r.watch
      assert.is_false(write and (r.path:find("/secrets", 1, true) ~= nil or r.path:find("/gpuclasses/", 1, true) ~= nil),
        r.method .. " " .. r.path)
    end
  end)

  it("follows the source when the token is rotated", function()
    source({ [KEY] = TOKEN2 })
    assert(P.wait_until(function()
      for _, s in pairs(copies()) do
        if s.data[KEY] ~= b64(TOKEN2) then return false end
      end
      return set_of(copies()) == set_of(want())
    end, 20), "the copies did not follow the rotation")
    for _, s in pairs(copies()) do check_copy(s, TOKEN2) end
  end)

  it("nobody changes the token in place; a copy edited or deleted behind the leader's back is put back at its pair's next write", function()
    local ns = "tenant-a-x"
    -- the data of an immutable Secret: refused by the API server
    local out, code = kubectl { "patch", "secret", COPY, "-n", ns, "--type=merge", "-p",
      '{"data":{"' .. KEY .. '":"' .. b64("forged") .. '"}}' }
    assert.are_not.equal(0, code)
    assert.truthy(out:find("field is immutable when `immutable` is set", 1, true), out)
    -- labels and annotations (on a real cluster the copies' policy refuses
    -- this to tenants): the leader does not watch the copies, so they stay
    -- as edited until the pair needs a write
    ok { "label", "secret", COPY, "-n", ns, "--overwrite", "gpu.cozystack.io/license-class=other", "extra=1" }
    ok { "annotate", "secret", COPY, "-n", ns, "tenant.example.com/note=x" }
    P.sleep(2)
    assert.are.equal("1", copies()[ns].metadata.labels.extra)
    -- a new user of the class there: the copy is written whole, as wanted
    claim(ns, "x2")
    assert(P.wait_until(function()
      local s = copies()[ns]
      return s and #s.metadata.ownerReferences == 2
    end, 20), "the copy did not get its new owner")
    check_copy(copies()[ns], TOKEN2)
    -- the managed-by label taken off: put back at the next write
    ok { "label", "secret", COPY, "-n", ns, "app.kubernetes.io/managed-by-" }
    claim(ns, "x3")
    assert(P.wait_until(function()
      local s = copies()[ns]
      return s and #s.metadata.ownerReferences == 3
    end, 20), "the copy was not taken back")
    check_copy(copies()[ns], TOKEN2)
    -- deleted: created again at the next write (a PUT answers 404)
    local uid = copies()[ns].metadata.uid
    ok { "delete", "secret", COPY, "-n", ns }
    vmi(ns, "vx", "Running")
    assert(P.wait_until(function()
      local s = copies()[ns]
      return s and s.metadata.uid ~= uid
    end, 20), "the deleted copy did not come back")
    check_copy(copies()[ns], TOKEN2)
  end)

  it("is owned by the namespace's users of the class, at most 32, and goes with the last one", function()
    local ns = "tenant-a"
    vmi(ns, "va", "Running")
    assert(P.wait_until(function()
      local s = copies()[ns]
      return s and #s.metadata.ownerReferences == 2
    end, 20))
    check_copy(copies()[ns], TOKEN2)
    ok { "delete", "gpuclaim", "a1", "-n", ns, "--wait=false" }
    -- the claim waits for the binder's finalizer to go; then the VMI alone owns the copy
    assert(P.wait_until(function()
      local s = copies()[ns]
      return s and #s.metadata.ownerReferences == 1 and s.metadata.ownerReferences[1].name == "va"
    end, 20), "the copy does not list the VMI alone")
    -- the VMI ends: no user is left, the copy goes (before any collector)
    vmi_phase(ns, "va", "Succeeded")
    assert(P.wait_until(function() return copies()[ns] == nil end, 20), "the copy outlived its last user")
    must("DELETE", vmi_path(ns, "va"))
    -- many users: the first 32 by kind and name are the owners
    for i = 1, 34 do
      must("POST", "/apis/cozystack.io/v1alpha1/namespaces/tenant-root/gpuclaims", { apiVersion = "cozystack.io/v1alpha1",
        kind = "GPUClaim", metadata = { name = ("m%02d"):format(i), namespace = "tenant-root" },
        spec = { class = CLASS, count = 1 } })
    end
    assert(P.wait_until(function()
      local s = copies()["tenant-root"]
      return s and #s.metadata.ownerReferences == 32
    end, 20), "the copy in tenant-root does not list 32 owners")
    local refs = copies()["tenant-root"].metadata.ownerReferences
    local all = users("tenant-root")
    assert.are.equal(34, #all)
    for i = 1, 32 do assert.are.same(all[i], refs[i]) end
  end)

  it("goes when the entitlement goes, except while a VMI of the class still runs there (DESIGN.md §8: next VM start)", function()
    -- tenant-d: claims only; tenant-c: a claim and a running VMI;
    -- tenant-e-f: its parent tenant-e loses the label
    ok { "label", "namespace", "tenant-d", VGPU .. "-" }
    ok { "label", "namespace", "tenant-c", VGPU .. "-" }
    ok { "label", "namespace", "tenant-e", VGPU .. "-" }
    assert(P.wait_until(function()
      local s = copies()
      return s["tenant-d"] == nil and s["tenant-e-f"] == nil
    end, 20), "tenant-d or tenant-e-f kept the copy")
    -- the running VM keeps the token it started with: the copy stays,
    -- owned by that VMI only, with its data as it was
    P.sleep(2)
    local s = copies()["tenant-c"]
    assert.truthy(s, "tenant-c lost the copy while its VMI runs")
    assert.are.same({ { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "vc",
      uid = get(vmi_path("tenant-c", "vc")).metadata.uid } }, s.metadata.ownerReferences)
    assert.are.same({ [KEY] = b64(TOKEN2) }, s.data)
    vmi_phase("tenant-c", "vc", "Succeeded")
    assert(P.wait_until(function() return copies()["tenant-c"] == nil end, 20), "tenant-c kept the copy after its VMI ended")
    assert.are.equal(set_of(want()), set_of(copies()))
  end)

  it("with a bad token Secret: the condition and an Event say why, copies stay as they are, binding goes on", function()
    local before = copies()
    -- other claims keep binding meanwhile (a passthrough class on a node)
    G.add_node(d, "gpu-1", 1)
    claim("tenant-b", "p1", "l40s")
    local cases = {
      { data = { ["token.txt"] = TOKEN1 }, reason = "KeyNotFound" },
      { data = { [KEY] = "\1\2\3binary" }, reason = "NotAToken", why = "not printable" },
      { data = { [KEY] = "" }, reason = "NotAToken", why = "empty" },
      { data = { [KEY] = "   \n\t " }, reason = "NotAToken", why = "only blanks" }, -- spaces are blanks too
      { data = { [KEY] = string.rep("A", 70000) }, reason = "NotAToken", why = "more than 65536" }, -- the 64 KiB bound
    }
    for _, k in ipairs(cases) do
      source(k.data)
      local x
      assert(P.wait_until(function()
        x = cond()
        return x and x.status == "False" and x.reason == k.reason and x.message:find(k.why or "", 1, true)
      end, 20), k.reason .. ": " .. json.encode(x or {}))
      assert.truthy(x.message:find(CLASS, 1, true), x.message)
      assert.truthy(x.message:find("cozy-gpu/nvidia-vgpu-license", 1, true), x.message)
      assert.falsy(x.message:find("tenant-", 1, true), x.message)
      assert(P.wait_until(function() return #events(k.reason) > 0 end, 10), "no " .. k.reason .. " Event")
    end
    assert(P.wait_until(function()
      local p = get("/apis/cozystack.io/v1alpha1/namespaces/tenant-b/gpuclaims/p1")
      return p and p.status and p.status.phase == "Bound"
    end, 20), "a claim of another class did not bind while the license Secret was bad")
    local now = copies()
    assert.are.equal(set_of(before), set_of(now))
    for ns, s in pairs(now) do
      assert.are.equal(before[ns].metadata.uid, s.metadata.uid)
      assert.are.same({ [KEY] = b64(TOKEN2) }, s.data)
    end
    -- both replicas are alive: nothing crashed
    for _, r in pairs(c.replicas) do assert.is_true(P.alive(r.pid)) end
    source({ [KEY] = TOKEN1 })
    wait_cond("True", "TokenFound")
    assert(P.wait_until(function()
      for _, s in pairs(copies()) do
        if s.data[KEY] ~= b64(TOKEN1) then return false end
      end
      return true
    end, 20))
  end)

  it("after the leader is killed the other replica takes over without a duplicate or a rewrite", function()
    local before = wait_copies((function()
      local l = {}
      for k in pairs(want()) do l[#l + 1] = k end
      return l
    end)())
    check_secret_requests()
    local holder = lease_holder()
    assert.truthy(c.replicas[holder], tostring(holder))
    P.kill(c.replicas[holder].pid, 9)
    c.replicas[holder] = nil
    local other = holder == "replica-a" and "replica-b" or "replica-a"
    assert(P.wait_until(function() return lease_holder() == other end, 20), "the Lease did not move")
    namespace("tenant-g", {}, true)
    claim("tenant-g", "g1")
    assert(P.wait_until(function() return copies()["tenant-g"] ~= nil end, 20), "the new leader copies nothing")
    local now = copies()
    assert.are.equal(set_of(want()), set_of(now))
    for ns, s in pairs(before) do
      assert.are.equal(s.metadata.uid, now[ns].metadata.uid)
      assert.are.equal(s.metadata.resourceVersion, now[ns].metadata.resourceVersion)
    end
    -- it knew none of them: each pair with a user was asserted, a wanted
    -- copy by a PUT that changed nothing, one not wanted by a delete by
    -- name that found none; the new pair's copy was created
    local put, w = {}, want()
    for _, r in ipairs(check_secret_requests()) do
      local ns = r.path:match("^/api/v1/namespaces/([^/]+)/")
      if r.method == "PUT" then put[ns] = true end
      if r.method == "POST" then assert.are.equal("tenant-g", ns) end
      if r.method == "DELETE" then assert.is_nil(w[ns], "deleted a wanted copy in " .. ns) end
    end
    for ns in pairs(before) do assert.is_true(put[ns], "not asserted: " .. ns) end
    -- one copy per namespace: the labelled Secrets are exactly the copies
    local n = 0
    for _, s in ipairs(d:state("secrets").items) do
      if (s.metadata.labels or {})["gpu.cozystack.io/license-class"] then n = n + 1 end
    end
    assert.are.equal(#(function()
      local l = {}
      for k in pairs(now) do l[#l + 1] = k end
      return l
    end)(), n)
  end)

  it("removes every copy and the condition when the class drops its license; never reads a source outside cozy-gpu", function()
    ok { "patch", "gpuclass", CLASS, "--type=json", "-p", '[{"op":"remove","path":"/spec/license"}]' }
    wait_copies({})
    wait_cond(nil)
    -- a source in another namespace than the controller's (the deploy/
    -- policy refuses such a class; the double has no admission)
    ok({ "apply" }, { apiVersion = "v1", kind = "Namespace", metadata = { name = "hoster-tokens" } })
    ok({ "apply" }, { apiVersion = "v1", kind = "Secret", type = "Opaque",
      metadata = { name = "tok", namespace = "hoster-tokens" }, data = { [KEY] = b64(TOKEN2) } })
    ok { "patch", "gpuclass", CLASS, "--type=merge", "-p",
      '{"spec":{"license":{"secretRef":{"name":"tok","namespace":"hoster-tokens"},"featureType":1}}}' }
    local x = wait_cond("False", "SecretNamespaceNotAllowed")
    assert.truthy(x.message:find(CLASS, 1, true), x.message)
    assert.truthy(x.message:find("hoster-tokens/tok", 1, true), x.message)
    assert.truthy(x.message:find("cozy-gpu", 1, true), x.message)
    assert(P.wait_until(function() return #events("SecretNamespaceNotAllowed") > 0 end, 10),
      "no SecretNamespaceNotAllowed Event")
    P.sleep(2)
    assert.are.same({}, copies())
    for _, r in ipairs(d:log()) do
      if (r.userAgent or ""):find("^cozygpu/") then
        assert.is_nil(r.path:find("/namespaces/hoster-tokens/", 1, true), r.method .. " " .. r.path)
      end
    end
    -- back in cozy-gpu: copied again
    source({ [KEY] = TOKEN2 })
    ok { "patch", "gpuclass", CLASS, "--type=merge", "-p",
      '{"spec":{"license":{"secretRef":{"name":"nvidia-vgpu-license","namespace":"cozy-gpu"}}}}' }
    wait_cond("True", "TokenFound")
    local l = {}
    for k in pairs(want()) do l[#l + 1] = k end
    local got = wait_copies(l)
    for _, s in pairs(got) do check_copy(s, TOKEN2) end
  end)
end)

-- One replica with --resync 2s: what the leader does without a watch of
-- its copies (decision 0035) — every --resync it PUTs what it remembers,
-- so a copy deleted or changed behind its back comes back without an
-- event; a replica that takes the lead knows nothing and asserts every
-- pair: it deletes by name the copies of a class whose license went while
-- none led (the class's LicenseReady condition says it may have some).
describe("the license copier without a watch of its copies (one replica, --resync 2s)", function()
  setup(function()
    c = E.start_cluster { n = 1, extra = { "--resync", "2s" } }
    d, dir = c.d, c.dir
    namespace("tenant-c", {}, true)
    claim("tenant-a", "a1")
    claim("tenant-c", "c1")
    source({ [KEY] = TOKEN1 })
  end)
  teardown(function() if c then E.stop_cluster(c) end end)
  after_each(function() check_secret_requests() end)

  it("re-asserts every --resync: a deleted or edited copy comes back, an untouched one is not rewritten", function()
    wait_copies { "tenant-a", "tenant-c" }
    local untouched = copies()["tenant-a"]
    local uid = copies()["tenant-c"].metadata.uid
    ok { "delete", "secret", COPY, "-n", "tenant-c" }
    assert(P.wait_until(function()
      local s = copies()["tenant-c"]
      return s and s.metadata.uid ~= uid
    end, 15), "the deleted copy did not come back")
    check_copy(copies()["tenant-c"], TOKEN1)
    ok { "annotate", "secret", COPY, "-n", "tenant-c", "tenant.example.com/note=x" }
    ok { "label", "secret", COPY, "-n", "tenant-c", "app.kubernetes.io/managed-by-" }
    assert(P.wait_until(function()
      local s = copies()["tenant-c"]
      return s and s.metadata.annotations == nil and s.metadata.labels["app.kubernetes.io/managed-by"] == "cozygpu"
    end, 15), "the edited copy was not put back")
    check_copy(copies()["tenant-c"], TOKEN1)
    -- several resyncs went by: the untouched copy was PUT as it is, which
    -- changes nothing
    local now = copies()["tenant-a"]
    assert.are.equal(untouched.metadata.uid, now.metadata.uid)
    assert.are.equal(untouched.metadata.resourceVersion, now.metadata.resourceVersion)
    local puts = 0
    for _, r in ipairs(check_secret_requests()) do
      if r.method == "PUT" and r.path:find("/namespaces/tenant-a/", 1, true) then puts = puts + 1 end
    end
    assert.is_true(puts >= 1, "tenant-a's copy was never re-asserted")
  end)

  local function restart(id)
    for old, r in pairs(c.replicas) do
      P.kill(r.pid, 9)
      c.replicas[old] = nil
    end
    return function()
      c.replicas[id] = E.start_controller { double = d, dir = dir, certs = c.certs, identity = id,
        extra = { "--resync", "2s" } }
    end
  end

  it("a new leader puts the rotated token into copies it never saw, and one deleted while none led back", function()
    wait_copies { "tenant-a", "tenant-c" }
    local start = restart("replica-y")
    source({ [KEY] = TOKEN2 })
    ok { "delete", "secret", COPY, "-n", "tenant-a" }
    start()
    -- tenant-c: a PUT of the new token answers 422 (immutable data), so
    -- delete and create; tenant-a: the PUT answers 404, so create
    assert(P.wait_until(function()
      local s = copies()
      return s["tenant-a"] and s["tenant-c"] and s["tenant-a"].data[KEY] == b64(TOKEN2)
        and s["tenant-c"].data[KEY] == b64(TOKEN2)
    end, 30), "the new leader did not assert the copies")
    for _, s in pairs(copies()) do check_copy(s, TOKEN2) end
  end)

  it("a new leader deletes the copies of a class whose license went while none led, then its condition", function()
    wait_copies { "tenant-a", "tenant-c" }
    wait_cond("True", "TokenFound")
    local start = restart("replica-z")
    ok { "patch", "gpuclass", CLASS, "--type=json", "-p", '[{"op":"remove","path":"/spec/license"}]' }
    P.sleep(1)
    assert.are.equal("tenant-a,tenant-c", set_of(copies()))
    start()
    wait_copies({}, 30)
    wait_cond(nil)
  end)
end)
