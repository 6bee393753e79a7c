-- The leader's license copier on a real control plane (DESIGN.md §3
-- spec.license, §5 vGPU entitlement, §8 licensing; decisions 0004, 0029,
-- 0035): the examples' l40s-24c is a licensed vGPU class whose token
-- Secret is cozy-gpu/nvidia-vgpu-license. The leader, as its
-- ServiceAccount, copies the token into every entitled namespace that uses
-- the class, through RBAC that lets it list and watch Secrets in cozy-gpu
-- only and create, update and delete them elsewhere, narrowed to copies by
-- the ValidatingAdmissionPolicy deploy/56; deploy/55 keeps everyone but
-- the controller, the collector and system:masters from writing a copy,
-- deploy/57 keeps a class's token source in cozy-gpu. Every session fails
-- on any request of a replica refused as forbidden (K.session): the
-- controller reads no Secret but cozy-gpu's and writes none but copies,
-- or the API server says so.
--
-- Which namespaces must hold a copy is computed here from the API server's
-- objects by the rule itself (`want`: the namespace and every tenant
-- ancestor carry gpu.cozystack.io/vgpu=true, and a GPUClaim of the class
-- or a VMI of it that is not final is there), never from what the
-- controller reports. A copy changed or deleted behind the leader's back
-- is changed by whoever really can (system:masters: the harness's admin);
-- a tenant with every Secret right in its namespace and a hoster bound to
-- cluster-admin outside system:masters are refused, which is the real
-- protection.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local json = H.json

local CLASS = "l40s-24c"
local RESOURCE = "nvidia.com/L40S-24C"
local COPY = "gpu-license-" .. CLASS
local KEY = "client_configuration_token.tok"
local VGPU = "gpu.cozystack.io/vgpu"
local TENANT = "tenant.cozystack.io/"
local CONTROLLER = "--as=system:serviceaccount:cozy-gpu:cozygpu-controller"
local TOKEN1 = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzZXJ2aWNlX2luc3RhbmNlIjoiMSJ9.c2lnbmF0dXJlLTE=\n"
local TOKEN2 = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzZXJ2aWNlX2luc3RhbmNlIjoiMiJ9.c2lnbmF0dXJlLTI=\n"
-- deadlines: generous, the machine is shared with other control planes
local T = 60
-- leader election quicker than the 15 s default, so a killed leader's
-- Lease expires within a test, not so quick that a busy machine flaps it
local LEASE = { "--lease-duration", "10s", "--renew-deadline", "7s", "--retry-period", "1s" }

local function b64(s)
  local out = P.sh("printf %s " .. P.q(s) .. " | base64 -w0")
  return (out:gsub("%s+$", ""))
end
local function flags(...)
  local out = {}
  for _, l in ipairs { LEASE, ... } do
    for _, a in ipairs(l) do out[#out + 1] = a end
  end
  return out
end

local c -- the cluster of the running describe block

local function ok(args, o) return c:must(args, o) end
local function apply(obj) return ok({ "apply", "-f", "-" }, { stdin = json.encode(obj) }) end
local function get(path) return (c:get(path)) end
-- kubectl that must fail: returns its stderr
local function refused(args, o)
  local out, err, code = c:kubectl(args, o)
  assert.are_not.equal(0, code, ("kubectl %s succeeded: %s"):format(table.concat(args, " "), out))
  return err
end

local function namespace(name, parents, vgpu)
  local labels = { [TENANT .. "tenant-root"] = "", [TENANT .. name] = "" }
  for _, p in ipairs(parents) do labels[TENANT .. p] = "" end
  if vgpu then labels[VGPU] = "true" end
  apply { apiVersion = "v1", kind = "Namespace", metadata = { name = name, labels = labels } }
end
local function claim_obj(ns, name, class)
  return { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = name, namespace = ns },
    spec = { class = class or CLASS, count = 1 } }
end
local function claim(ns, name, class) ok({ "create", "-f", "-" }, { stdin = json.encode(claim_obj(ns, name, class)) }) end
local function vmi_path(ns, name)
  return "/apis/kubevirt.io/v1/namespaces/" .. ns .. "/virtualmachineinstances/" .. name
end
-- a VMI asking for one vGPU of the class by its resource name, in `phase`
-- (virt-handler's part: KubeVirt's VMI CRD has no status subresource, the
-- status is written with the object)
local function vmi(ns, name, phase)
  local v = json.decode(ok({ "create", "-f", "-", "-o", "json" }, { stdin = json.encode {
    apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", metadata = { name = name, namespace = ns },
    spec = { domain = { devices = { gpus = { { name = "gpu0", deviceName = RESOURCE } } },
      resources = { requests = { memory = "1Gi" } } } } } }))
  v.status = { phase = phase }
  ok({ "replace", "-f", "-" }, { stdin = json.encode(v) })
end
local function vmi_phase(ns, name, phase)
  for _ = 1, 10 do
    local v = assert(get(vmi_path(ns, name)))
    v.status = v.status or {}
    v.status.phase = phase
    local st = c:request("PUT", vmi_path(ns, name), v)
    if st == 200 then return end
    assert.are.equal(409, st)
  end
  error("VMI " .. ns .. "/" .. name .. ": phase not written")
end
-- the hoster's token Secret, where the class's secretRef points
local function source(data, annotations)
  local enc = {}
  for k, v in pairs(data) do enc[k] = b64(v) end
  apply { apiVersion = "v1", kind = "Secret", type = "Opaque",
    metadata = { name = "nvidia-vgpu-license", namespace = "cozy-gpu", annotations = annotations },
    data = next(enc) and enc or json.object() }
end

-- the copies: ns -> Secret (listed by the admin; the controller cannot)
local function copies()
  local out = {}
  for _, s in ipairs(c:state("secrets").items) do
    if s.metadata.name == COPY then out[s.metadata.namespace] = s end
  end
  return out
end

-- the rule, from the API server's objects: DESIGN.md §5 (the label on the
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
  for _, x in ipairs(c:state("gpuclaims").items) do
    if x.metadata.namespace == ns and x.spec.class == CLASS then
      out[#out + 1] = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", name = x.metadata.name,
        uid = x.metadata.uid }
    end
  end
  for _, x in ipairs(c:state("virtualmachineinstances").items) do
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
  for _, n in ipairs(assert(get("/api/v1/namespaces")).items) do nss[n.metadata.name] = n end
  for name in pairs(nss) do
    if entitled(nss, name) and #users(name) > 0 then out[name] = true end
  end
  return out
end
-- Waits until replica r's license copier has woken `n` more times, as
-- leader (leading "true") or not ("false"): cozygpu_writer_wakes_total
-- is counted as each wake begins, so n more means n - 1 whole wakes
-- since the call.
local function wait_wakes(r, leading, n)
  local key = ('cozygpu_writer_wakes_total{writer="license",leading="%s"}'):format(leading)
  local function wakes() return (c:metrics(r) or {})[key] end
  local from
  assert(P.wait_until(function() from = wakes() return from ~= nil end, 30, 0.2), "no " .. key .. " in the metrics")
  assert(P.wait_until(function() return (wakes() or 0) >= from + n end, 30, 0.2),
    ("the copier did not wake %d times (%s from %s)"):format(n, key, from))
end

local function set_of(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return table.concat(out, ",")
end
local function keys(t)
  local l = {}
  for k in pairs(t) do l[#l + 1] = k end
  return l
end
-- waits until the copies are exactly in `names` (a list) and returns them
local function wait_copies(names, timeout)
  local w = {}
  for _, n in ipairs(names) do w[n] = true end
  local last
  assert(P.wait_until(function()
    last = copies()
    return set_of(last) == set_of(w)
  end, timeout or T, 0.2), ("copies in %s, wanted %s"):format(set_of(last or {}), set_of(w)))
  return last
end
-- waits until fn(copy in ns or nil) is true; returns the copy
local function wait_copy(ns, fn, what)
  local last
  assert(P.wait_until(function()
    last = copies()[ns]
    return fn(last)
  end, T, 0.2), ("%s: copy in %s is %s"):format(what, ns, json.encode(last or {})))
  return last
end
-- Returns once the leader's copier has written out every pair it had due
-- at the call. The copier (its own thread, license.c) publishes no
-- "applied up to" (the binder's gauge, decision 0040, is not its), but it
-- takes its queue whole and writes every due pair in the pass that follows:
-- a new claim in tenant-d (entitled, a user already) makes it write that
-- copy with one owner more, twice. The second claim's pass was taken after
-- the pass that wrote the first was done.
local pokes = 0
local function copier_done()
  for _ = 1, 2 do
    pokes = pokes + 1
    local owners = math.min(#users("tenant-d") + 1, 32)
    claim("tenant-d", "poke" .. pokes)
    wait_copy("tenant-d", function(x) return x and #x.metadata.ownerReferences == owners end, "the copier's poke")
  end
end
local function cond()
  return K.condition(get("/apis/cozystack.io/v1alpha1/gpuclasses/" .. CLASS), "LicenseReady")
end
local function wait_cond(status, reason)
  local last
  assert(P.wait_until(function()
    last = cond()
    if status == nil then return last == nil end
    return last and last.status == status and last.reason == reason
  end, T, 0.2), ("LicenseReady: wanted %s/%s, got %s"):format(tostring(status), tostring(reason), json.encode(last or {})))
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
local function wait_ready(r)
  assert(P.wait_until(function()
    return P.http { url = ("http://127.0.0.1:%d/readyz"):format(r.probe_port), timeout = 2 } == 200
  end, T, 0.2), ("controller %s is not ready; its log:\n%s"):format(r.identity, P.read(r.log) or ""))
end
-- the lines of a replica's log that show a request refused as forbidden,
-- but those containing `except` (for a replica no longer in c.replicas,
-- which the session checks)
local function forbidden_in(r, except)
  local out = {}
  for line in (P.read(r.log) or ""):gmatch("[^\n]+") do
    if (line:find('"status":403', 1, true) or line:find('"status":"403"', 1, true))
        and not (except and line:find(except, 1, true)) then
      out[#out + 1] = line
    end
  end
  return out
end
-- a copy holds the token and nothing else, and is owned by the users
local function check_copy(s, token)
  assert.are.equal("Opaque", s.type)
  assert.is_true(s.immutable)
  assert.are.same({ [KEY] = b64(token) }, s.data)
  assert.are.same({ ["app.kubernetes.io/managed-by"] = "cozygpu", ["gpu.cozystack.io/license-class"] = CLASS },
    s.metadata.labels)
  assert.is_nil(s.metadata.annotations)
  local u = users(s.metadata.namespace)
  for i = #u, 33, -1 do u[i] = nil end -- the first 32 (decision 0029)
  assert.are.same(u, s.metadata.ownerReferences)
end

describe("the leader's license copier through kube-apiserver (two replicas)", function()
  local alice, hoster
  -- the one refusal a test below causes on purpose: the leader's write of
  -- a copy that system:masters relabelled to another class (tenant-h)
  local CAUSED = '"namespace":"tenant-h"'
  local session = K.session { deploy = { replicas = 2, extra = flags() },
    forbidden_except = CAUSED, prepare = function(cl)
    c = cl
    -- alice, a tenant of tenant-a (cluster/tenant-users.yaml); a hoster's
    -- admin bound to cluster-admin, not in system:masters
    ok({ "apply", "-f", "-" }, { stdin = H.read("cluster/tenant-users.yaml") })
    for _, u in ipairs { "alice", "hoster" } do
      local out, code = P.sh(("cluster/cluster.sh user %s %s 2>&1"):format(P.q(c.dir), u))
      assert(code == 0, out)
      if u == "alice" then alice = (out:gsub("%s+$", "")) else hoster = (out:gsub("%s+$", "")) end
    end
    ok { "create", "clusterrolebinding", "hoster-admin", "--clusterrole=cluster-admin", "--user=hoster" }
    -- the hoster raises tenant-a's GPU budget (examples: 2) so that the
    -- claims and VMIs below and in tenant-a-x fit
    ok { "-n", "tenant-a", "patch", "resourcequota", "gpu", "--type=merge", "-p",
      '{"spec":{"hard":{"gpuclass.cozystack.io/devices":"100"}}}' }
    -- tenant-root and tenant-a are entitled, tenant-b is not (examples)
    namespace("tenant-a-x", { "tenant-a" }, true)
    namespace("tenant-b-y", { "tenant-b" }, true) -- labelled, but its parent is not
    namespace("tenant-c", {}, true)
    namespace("tenant-d", {}, true)
    namespace("tenant-e", {}, true)
    namespace("tenant-e-f", { "tenant-e" }, true)
    namespace("tenant-h", {}, true)
    for _, p in ipairs { { "tenant-a-x", "x1" }, { "tenant-c", "c1" }, { "tenant-d", "d1" },
      { "tenant-e-f", "f1" }, { "tenant-h", "h1" } } do
      claim(p[1], p[2])
    end
    vmi("tenant-c", "vc", "Running")
  end }
  setup(session.setup)
  teardown(session.teardown)

  it("with the token Secret missing: LicenseReady False SecretNotFound naming the class and its secretRef, no copy", function()
    local x = wait_cond("False", "SecretNotFound")
    assert.truthy(x.message:find(CLASS, 1, true), x.message)
    assert.truthy(x.message:find("cozy-gpu/nvidia-vgpu-license", 1, true), x.message)
    assert.falsy(x.message:find("tenant-", 1, true), x.message)
    -- the Accepted condition of status.c is still there beside it
    local cls = get("/apis/cozystack.io/v1alpha1/gpuclasses/" .. CLASS)
    local types = {}
    for _, y in ipairs(cls.status.conditions) do types[#types + 1] = y.type end
    table.sort(types)
    assert.are.same({ "Accepted", "LicenseReady" }, types)
    assert.are.same({}, copies())
    -- the token Secrets are read in cozy-gpu and nowhere else: RBAC grants
    -- no read elsewhere (a refused one would fail the session)
    assert.are.equal("yes", ((c:kubectl { "auth", "can-i", "watch", "secrets", "-n", "cozy-gpu", CONTROLLER }):gsub("%s+$", "")))
    assert.are.equal("no", ((c:kubectl { "auth", "can-i", "get", "secrets", "-n", "cozy-gpu", CONTROLLER }):gsub("%s+$", "")))
    assert.are.equal("no", ((c:kubectl { "auth", "can-i", "list", "secrets", "-A", CONTROLLER }):gsub("%s+$", "")))
  end)

  it("refuses a vGPU order where the namespace or an ancestor lacks the entitlement (kube-apiserver calls the webhook)", function()
    -- the double stored these; on a real cluster no such user exists, so a
    -- namespace without the entitlement gets a user only by losing it
    -- (below: the entitlement goes)
    for _, p in ipairs { { "tenant-b", "b1" }, { "tenant-b-y", "y1" } } do
      local err = refused({ "create", "-f", "-" }, { stdin = json.encode(claim_obj(p[1], p[2])) })
      assert.matches('admission webhook "gpuclaim.validate.gpu.cozystack.io" denied the request', err, 1, true)
      assert.matches('vGPU class "' .. CLASS .. '"', err, 1, true)
    end
  end)

  it("copies the token only into the entitled namespaces that use the class, and nothing of the source beyond it", function()
    -- alice orders in tenant-a as a tenant does
    local out, err, code = c:kubectl({ "create", "-f", "-" }, { kubeconfig = alice,
      stdin = json.encode(claim_obj("tenant-a", "a1")) })
    assert.are.equal(0, code, out .. err)
    source({ [KEY] = TOKEN1, notes = "hoster notes" }, { ["hoster.example.com/comment"] = "do not copy" })
    local x = wait_cond("True", "TokenFound")
    assert.falsy(x.message:find("tenant-", 1, true), x.message)
    local w = want()
    assert.are.equal("tenant-a,tenant-a-x,tenant-c,tenant-d,tenant-e-f,tenant-h", set_of(w))
    local got = wait_copies(keys(w))
    for _, s in pairs(got) do check_copy(s, TOKEN1) end
    -- owned by its users: alice's claim in tenant-a
    assert.are.equal("a1", got["tenant-a"].metadata.ownerReferences[1].name)
    -- once settled nothing is written again while nothing changes: no
    -- copy and no class changes resourceVersion while the leader's copier
    -- wakes three more times (cozygpu_writer_wakes_total: each wake is one
    -- in which a copier that rewrote would have written). The copies
    -- already hold what check_copy wants: a write now is one it should not
    -- make
    local cls = get("/apis/cozystack.io/v1alpha1/gpuclasses/" .. CLASS)
    local _, leader = c:leader()
    wait_wakes(leader, "true", 3)
    local now = copies()
    assert.are.equal(set_of(w), set_of(now))
    for ns, s in pairs(got) do assert.are.equal(s.metadata.resourceVersion, now[ns].metadata.resourceVersion, ns) end
    assert.are.equal(cls.metadata.resourceVersion,
      get("/apis/cozystack.io/v1alpha1/gpuclasses/" .. CLASS).metadata.resourceVersion)
  end)

  it("follows the source when the token is rotated", function()
    source({ [KEY] = TOKEN2 })
    assert(P.wait_until(function()
      local now = copies()
      for _, s in pairs(now) do
        if s.data[KEY] ~= b64(TOKEN2) then return false end
      end
      return set_of(now) == set_of(want())
    end, T, 0.2), "the copies did not follow the rotation")
    for _, s in pairs(copies()) do check_copy(s, TOKEN2) end
  end)

  it("refuses a tenant's delete of the copy and a Secret squatting a copy's name; the controller cannot read the copy", function()
    -- alice may not touch Secrets at all under her role; a tenant admin
    -- may, so grant her Secrets in tenant-a to see the policy's answer
    ok { "-n", "tenant-a", "create", "role", "secrets-admin", "--verb=*", "--resource=secrets" }
    ok { "-n", "tenant-a", "create", "rolebinding", "alice-secrets", "--role=secrets-admin", "--user=alice" }
    local err = refused({ "-n", "tenant-a", "delete", "secret", COPY }, { kubeconfig = alice })
    assert.matches("cozygpu-license-copies", err, 1, true)
    assert.truthy(copies()["tenant-a"])
    err = refused({ "-n", "tenant-a", "create", "secret", "generic", "gpu-license-a100-40c",
      "--from-literal=" .. KEY .. "=forged" }, { kubeconfig = alice })
    assert.matches("ValidatingAdmissionPolicy", err, 1, true)
    local out = c:kubectl { "auth", "can-i", "get", "secret/" .. COPY, "-n", "tenant-a", CONTROLLER }
    assert.are.equal("no", (out:gsub("%s+$", "")))
  end)

  it("nobody changes the token in place; only system:masters edits a copy, and what it edits or deletes behind the leader's back is put back at its pair's next write", function()
    local ns = "tenant-a-x"
    -- the data of an immutable Secret: refused by the API server, even to
    -- system:masters
    local err = refused { "patch", "secret", COPY, "-n", ns, "--type=merge", "-p",
      '{"data":{"' .. KEY .. '":"' .. b64("forged") .. '"}}' }
    assert.matches("field is immutable when `immutable` is set", err, 1, true)
    -- its labels: refused to a tenant with every Secret right there, and to
    -- a hoster bound to cluster-admin outside system:masters (deploy/55)
    ok { "-n", ns, "create", "rolebinding", "alice-secrets", "--clusterrole=admin", "--user=alice" }
    for _, who in ipairs { alice, hoster } do
      err = refused({ "label", "secret", COPY, "-n", ns, "extra=1" }, { kubeconfig = who })
      assert.matches("cozygpu-license-copies", err, 1, true)
      err = refused({ "delete", "secret", COPY, "-n", ns }, { kubeconfig = who })
      assert.matches("cozygpu-license-copies", err, 1, true)
    end
    -- system:masters may: the leader does not watch the copies (decision
    -- 0035), so they stay as edited until the pair needs a write: once the
    -- copier has written out all it had due (a write of the pair still
    -- queued would have put the copy back), the edit is still there
    local before = copies()[ns]
    ok { "label", "secret", COPY, "-n", ns, "extra=1" }
    ok { "annotate", "secret", COPY, "-n", ns, "tenant.example.com/note=x" }
    copier_done()
    local s = copies()[ns]
    assert.are.equal("1", s.metadata.labels.extra)
    assert.are.equal(before.metadata.uid, s.metadata.uid)
    -- a new user of the class there: the copy is written whole, as wanted
    claim(ns, "x2")
    wait_copy(ns, function(x) return x and #x.metadata.ownerReferences == 2 end, "the new owner")
    check_copy(copies()[ns], TOKEN2)
    -- the managed-by label taken off: put back at the next write
    ok { "label", "secret", COPY, "-n", ns, "app.kubernetes.io/managed-by-" }
    claim(ns, "x3")
    wait_copy(ns, function(x) return x and #x.metadata.ownerReferences == 3 end, "taken back")
    check_copy(copies()[ns], TOKEN2)
    -- deleted: created again at the next write (its PUT answers 404)
    local uid = copies()[ns].metadata.uid
    ok { "delete", "secret", COPY, "-n", ns }
    vmi(ns, "vx", "Running")
    wait_copy(ns, function(x) return x and x.metadata.uid ~= uid end, "the deleted copy back")
    check_copy(copies()[ns], TOKEN2)
  end)

  it("leaves a copy that system:masters relabelled to another class: deploy/56 refuses the leader's update and delete (403, logged); deleted by the admin, it is created again", function()
    local ns = "tenant-h"
    ok { "label", "secret", COPY, "-n", ns, "--overwrite", "gpu.cozystack.io/license-class=other" }
    -- the double let the leader overwrite it; the real API server refuses
    -- a write of a Secret that is not a copy by its name and label
    claim(ns, "h2")
    local refusal
    assert(P.wait_until(function()
      for _, r in pairs(c.replicas) do
        for _, line in ipairs(forbidden_in(r)) do
          if line:find('"namespace":"' .. ns .. '"', 1, true) then refusal = line end
        end
      end
      return refusal
    end, T, 0.2), "no refused write of tenant-h's copy in a replica's log")
    assert.matches("cozygpu-controller-secrets", refusal, 1, true)
    local s = copies()[ns]
    assert.are.equal("other", s.metadata.labels["gpu.cozystack.io/license-class"])
    assert.are.equal(1, #s.metadata.ownerReferences)
    -- an admin's repair: the Secret gone, the pair's next write creates it
    ok { "delete", "secret", COPY, "-n", ns }
    claim(ns, "h3")
    s = wait_copy(ns, function(x) return x and #x.metadata.ownerReferences == 3 end, "created again")
    check_copy(s, TOKEN2)
  end)

  it("is owned by the namespace's users of the class, at most 32, and goes with the last one", function()
    local ns = "tenant-a"
    vmi(ns, "va", "Running")
    wait_copy(ns, function(x) return x and #x.metadata.ownerReferences == 2 end, "two owners")
    check_copy(copies()[ns], TOKEN2)
    -- alice releases her claim; it waits for the binder's finalizer, then
    -- the VMI alone owns the copy
    ok({ "delete", "gpuclaim", "a1", "-n", ns, "--wait=false" }, { kubeconfig = alice })
    wait_copy(ns, function(x)
      return x and #x.metadata.ownerReferences == 1 and x.metadata.ownerReferences[1].name == "va"
    end, "the VMI alone")
    -- the VMI ends: no user is left, the copy goes (its owner still exists:
    -- the leader deleted it, not the garbage collector)
    vmi_phase(ns, "va", "Succeeded")
    wait_copy(ns, function(x) return x == nil end, "gone with its last user")
    ok { "delete", "vmi", "va", "-n", ns }
    -- many users: the first 32 by kind and name are the owners
    for i = 1, 34 do
      local st, v = c:request("POST", "/apis/cozystack.io/v1alpha1/namespaces/tenant-root/gpuclaims",
        claim_obj("tenant-root", ("m%02d"):format(i)))
      assert(st == 201, ("claim m%02d: %s %s"):format(i, tostring(st), json.encode(v)))
    end
    wait_copy("tenant-root", function(x) return x and #x.metadata.ownerReferences == 32 end, "32 owners")
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
    end, T, 0.2), "tenant-d or tenant-e-f kept the copy")
    -- the running VM keeps the token it started with: the copy stays,
    -- owned by that VMI only, with its data as it was
    local s = wait_copy("tenant-c", function(x) return x and #x.metadata.ownerReferences == 1 end, "the VMI alone")
    assert.are.same({ { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "vc",
      uid = get(vmi_path("tenant-c", "vc")).metadata.uid } }, s.metadata.ownerReferences)
    assert.are.same({ [KEY] = b64(TOKEN2) }, s.data)
    vmi_phase("tenant-c", "vc", "Succeeded")
    wait_copy("tenant-c", function(x) return x == nil end, "gone after its VMI ended")
    assert.are.equal(set_of(want()), set_of(copies()))
  end)

  it("with a bad token Secret: the condition says why, copies stay as they are, binding goes on", function()
    local before = copies()
    -- other claims keep binding meanwhile (a passthrough class on a node)
    G.add_node(c, "gpu-1", 1)
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
      end, T, 0.2), k.reason .. ": " .. json.encode(x or {}))
      assert.truthy(x.message:find(CLASS, 1, true), x.message)
      assert.truthy(x.message:find("cozy-gpu/nvidia-vgpu-license", 1, true), x.message)
      assert.falsy(x.message:find("tenant-", 1, true), x.message)
    end
    assert(P.wait_until(function()
      local p = get("/apis/cozystack.io/v1alpha1/namespaces/tenant-b/gpuclaims/p1")
      return p and p.status and p.status.phase == "Bound"
    end, T, 0.2), "a claim of another class did not bind while the license Secret was bad")
    local now = copies()
    assert.are.equal(set_of(before), set_of(now))
    for ns, s in pairs(now) do
      assert.are.equal(before[ns].metadata.uid, s.metadata.uid)
      assert.are.same({ [KEY] = b64(TOKEN2) }, s.data)
    end
    -- both replicas are alive: nothing crashed
    for _, r in pairs(c.replicas) do assert.is_true(P.alive(r.pid), r.identity) end
    source({ [KEY] = TOKEN1 })
    wait_cond("True", "TokenFound")
    assert(P.wait_until(function()
      for _, s in pairs(copies()) do
        if s.data[KEY] ~= b64(TOKEN1) then return false end
      end
      return true
    end, T, 0.2), "the copies did not take the good token back")
  end)

  it("after the leader is killed the other replica takes over without a duplicate or a rewrite, and asserts every pair", function()
    local before = wait_copies(keys(want()))
    -- edited behind the leader's back (system:masters): only the new
    -- leader's assertion of every pair puts it back (--resync is 10m)
    ok { "annotate", "secret", COPY, "-n", "tenant-root", "tenant.example.com/note=x" }
    local edited = copies()["tenant-root"]
    local holder = lease_holder()
    local dead = assert(c.replicas[holder], tostring(holder))
    P.kill(dead.pid, 9)
    assert(P.wait_exit(dead.pid, 10), "the killed leader is still there")
    c.replicas[holder] = nil
    local other = holder == "replica-a" and "replica-b" or "replica-a"
    assert(P.wait_until(function() return lease_holder() == other end, T, 0.2), "the Lease did not move")
    -- as its Deployment would, the killed replica comes back (a new pod,
    -- a new identity) on its port, where the webhooks may call
    local back = c:start_controller { identity = holder .. "-2", port = dead.port, extra = dead.extra }
    wait_ready(back)
    wait_copy("tenant-root", function(x) return x and x.metadata.annotations == nil end, "the edit put back")
    check_copy(copies()["tenant-root"], TOKEN1)
    assert.are.equal(edited.metadata.uid, copies()["tenant-root"].metadata.uid)
    namespace("tenant-g", {}, true)
    claim("tenant-g", "g1")
    wait_copy("tenant-g", function(x) return x ~= nil end, "the new leader's copy")
    -- every other copy asserted by a PUT that changed nothing: the same
    -- object, the same resourceVersion
    local now = copies()
    assert.are.equal(set_of(want()), set_of(now))
    for ns, s in pairs(before) do
      assert.are.equal(s.metadata.uid, now[ns].metadata.uid, ns)
      if ns ~= "tenant-root" then
        assert.are.equal(s.metadata.resourceVersion, now[ns].metadata.resourceVersion, ns)
      end
    end
    -- one copy per namespace: the labelled Secrets are exactly the copies
    local list = assert(get("/api/v1/secrets?labelSelector=gpu.cozystack.io%2Flicense-class"))
    assert.are.equal(#keys(now), #list.items)
    assert.are.same({}, forbidden_in(dead, CAUSED))
  end)

  it("removes every copy and the condition when the class drops its license; a source outside cozy-gpu is refused, and never read", function()
    ok { "patch", "gpuclass", CLASS, "--type=json", "-p", '[{"op":"remove","path":"/spec/license"}]' }
    wait_copies({})
    wait_cond(nil)
    apply { apiVersion = "v1", kind = "Namespace", metadata = { name = "hoster-tokens" } }
    apply { apiVersion = "v1", kind = "Secret", type = "Opaque",
      metadata = { name = "tok", namespace = "hoster-tokens" }, data = { [KEY] = b64(TOKEN2) } }
    local elsewhere = '{"spec":{"license":{"secretRef":{"name":"tok","namespace":"hoster-tokens"},"featureType":1}}}'
    -- deploy/57: the API server refuses such a class (the double had no
    -- admission policy)
    local err = refused { "patch", "gpuclass", CLASS, "--type=merge", "-p", elsewhere }
    assert.matches('spec.license.secretRef.namespace: Invalid value: "hoster-tokens": the license token Secret must be in cozy-gpu',
      err, 1, true)
    -- a class written before that policy was installed: taken off for the
    -- write, put back after
    local binding = json.decode(ok { "get", "validatingadmissionpolicybinding", "cozygpu-license-source", "-o", "json" })
    ok { "delete", "validatingadmissionpolicybinding", "cozygpu-license-source" }
    local out, perr, code = c:kubectl { "patch", "gpuclass", CLASS, "--type=merge", "-p", elsewhere }
    -- the policy's removal reaches admission after a moment
    if code ~= 0 then
      assert(P.wait_until(function()
        out, perr, code = c:kubectl { "patch", "gpuclass", CLASS, "--type=merge", "-p", elsewhere }
        return code == 0
      end, T, 0.5), out .. perr)
    end
    binding.metadata = { name = binding.metadata.name, labels = binding.metadata.labels }
    ok({ "create", "-f", "-" }, { stdin = json.encode(binding) })
    local x = wait_cond("False", "SecretNamespaceNotAllowed")
    assert.truthy(x.message:find(CLASS, 1, true), x.message)
    assert.truthy(x.message:find("hoster-tokens/tok", 1, true), x.message)
    assert.truthy(x.message:find("cozy-gpu", 1, true), x.message)
    -- never read: RBAC grants nothing there (a refused read fails the
    -- session), and no copy appears
    assert.are.equal("no", ((c:kubectl { "auth", "can-i", "list", "secrets", "-n", "hoster-tokens", CONTROLLER }):gsub("%s+$", "")))
    -- no wait needed: the copier writes a pass's copies before its
    -- conditions (license.c flush), so the pass that wrote
    -- SecretNamespaceNotAllowed above had written any copy of the class
    assert.are.same({}, copies())
    -- back in cozy-gpu: copied again
    source({ [KEY] = TOKEN2 })
    ok { "patch", "gpuclass", CLASS, "--type=merge", "-p",
      '{"spec":{"license":{"secretRef":{"name":"nvidia-vgpu-license","namespace":"cozy-gpu"}}}}' }
    wait_cond("True", "TokenFound")
    local got = wait_copies(keys(want()))
    for _, s in pairs(got) do check_copy(s, TOKEN2) end
  end)

  it("records each failure reason above as a Warning Event on the class, where kubectl describe finds it", function()
    -- The leader posts each class Event in its own namespace (cozy-gpu)
    -- with an involvedObject without namespace (GPUClass is cluster-
    -- scoped); kube-apiserver refuses that (422: "involvedObject.namespace:
    -- does not match event.namespace"; an Event about a cluster-scoped
    -- object goes to "default", as client-go's recorder puts it), and the
    -- controller has no grant to create Events there (deploy/10-rbac.yaml:
    -- a Role in cozy-gpu). The double stored them. The replicas' logs
    -- show each refusal ("event refused", status 422).
    for _, reason in ipairs { "SecretNotFound", "KeyNotFound", "NotAToken", "SecretNamespaceNotAllowed" } do
      local ev = events(reason)[1]
      assert.truthy(ev, "no " .. reason .. " Event")
      assert.are.equal("Warning", ev.type)
      assert.falsy(ev.message:find("tenant-", 1, true), ev.message)
    end
    local out = ok { "describe", "gpuclass", CLASS }
    assert.matches("Warning%s+SecretNamespaceNotAllowed", out)
  end)
end)

-- One leader with --resync 2s: what it does without a watch of its copies
-- (decision 0035): every --resync it PUTs what it remembers, so a copy
-- deleted or changed behind its back comes back without an event; a
-- replica that takes the lead knows nothing and asserts every pair: it
-- deletes by name the copies of a class whose license went while none led
-- (the class's LicenseReady condition says it may have some). While no
-- leader runs, a replica with --leader-elect false answers the webhooks on
-- their port (their failurePolicy is Fail: a class change needs them).
describe("the license copier without a watch of its copies (one leader, --resync 2s)", function()
  local RESYNC = { "--resync", "2s" }
  local session = K.session { deploy = { replicas = 1, extra = flags(RESYNC) }, prepare = function(cl)
    c = cl
    namespace("tenant-c", {}, true)
    claim("tenant-a", "a1")
    claim("tenant-c", "c1")
    source({ [KEY] = TOKEN1 })
  end }
  setup(session.setup)
  teardown(session.teardown)

  it("re-asserts every --resync: a deleted or edited copy comes back, an untouched one is not rewritten", function()
    wait_copies { "tenant-a", "tenant-c" }
    local t0 = K.now()
    local untouched = copies()["tenant-a"]
    local uid = copies()["tenant-c"].metadata.uid
    ok { "delete", "secret", COPY, "-n", "tenant-c" }
    wait_copy("tenant-c", function(x) return x and x.metadata.uid ~= uid end, "the deleted copy back")
    check_copy(copies()["tenant-c"], TOKEN1)
    ok { "annotate", "secret", COPY, "-n", "tenant-c", "tenant.example.com/note=x" }
    ok { "label", "secret", COPY, "-n", "tenant-c", "app.kubernetes.io/managed-by-" }
    wait_copy("tenant-c", function(x)
      return x and x.metadata.annotations == nil and x.metadata.labels["app.kubernetes.io/managed-by"] == "cozygpu"
    end, "the edited copy put back")
    check_copy(copies()["tenant-c"], TOKEN1)
    -- several resyncs went by: the untouched copy was PUT as it is (three
    -- times since t0, by the API server's audit log), which the API server
    -- stores as no change
    local puts
    assert(P.wait_until(function()
      puts = 0
      for _, ev in ipairs(c:audit(function(ev)
        local o = ev.objectRef or {}
        return ev.verb == "update" and o.resource == "secrets" and o.namespace == "tenant-a" and o.name == COPY
          and ev.user and ev.user.username == "system:serviceaccount:cozy-gpu:cozygpu-controller"
          and ev.responseStatus and ev.responseStatus.code == 200
      end)) do
        if K.epoch(ev.requestReceivedTimestamp) >= t0 then puts = puts + 1 end
      end
      return puts >= 3
    end, T, 0.5), ("the leader PUT tenant-a's copy %d times since the test began, not 3 (--resync 2s)"):format(puts or 0))
    local now = copies()["tenant-a"]
    assert.are.equal(untouched.metadata.uid, now.metadata.uid)
    assert.are.equal(untouched.metadata.resourceVersion, now.metadata.resourceVersion)
  end)

  -- kills the leader; a replica that never leads answers the webhooks on
  -- the deployed port meanwhile. Returns a function starting the next
  -- leader `id` (on a port of its own) and waiting until it holds the Lease.
  local function restart(id)
    local target
    for old, r in pairs(c.replicas) do
      if old ~= "webhooks" then
        P.kill(r.pid, 9)
        assert(P.wait_exit(r.pid, 10), "the killed leader is still there")
        assert.are.same({}, forbidden_in(r))
        c.replicas[old] = nil
        if old == "replica-a" then target = r.port end
      end
    end
    if target then
      wait_ready(c:start_controller { identity = "webhooks", port = target, extra = { "--leader-elect", "false" } })
    end
    return function()
      local r = c:start_controller { identity = id, port = P.free_port(), extra = flags(RESYNC) }
      wait_ready(r)
      assert(P.wait_until(function() return lease_holder() == id end, T, 0.2), id .. " did not take the Lease")
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
    end, T, 0.2), "the new leader did not assert the copies")
    for _, s in pairs(copies()) do check_copy(s, TOKEN2) end
  end)

  it("a new leader deletes the copies of a class whose license went while none led, then its condition", function()
    wait_copies { "tenant-a", "tenant-c" }
    wait_cond("True", "TokenFound")
    local start = restart("replica-z")
    ok { "patch", "gpuclass", CLASS, "--type=json", "-p", '[{"op":"remove","path":"/spec/license"}]' }
    -- a replica that does not lead writes nothing: the webhooks replica's
    -- copier wakes three times, not leading, and the copies stay
    wait_wakes(c.replicas.webhooks, "false", 3)
    assert.are.equal("tenant-a,tenant-c", set_of(copies()))
    start()
    wait_copies({}, T)
    wait_cond(nil)
  end)
end)
