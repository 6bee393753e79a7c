-- The controller's policy bundle and Lease against a real control plane
-- (issue 19; DESIGN.md §9, decisions 0009, 0018, 0026): the ConfigMap
-- cozygpu-policies, its Events and the Lease live in kube-apiserver, the
-- replica runs as the cozygpu-controller ServiceAccount (RBAC: that one
-- ConfigMap by name, its Lease, Events), and the API server's audit log is
-- the record of when the Lease was released. These cases ran on the API
-- server double before (spec/controller/controller_spec.lua keeps what
-- needs no cluster, or a fault a real server does not make on demand).
--
-- The deployed replica is stopped once deployed: each case starts its own,
-- under its own identity, and talks to it directly (the webhooks' answers
-- through kube-apiserver are covered by reload_spec and admission_spec).
local P = require "proc"
local K = require "kube_cluster"
local E = require "controller_env"
local json = H.json

local LEASE = "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller"
local POLICIES = "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies"

local function reviews()
  local out = {}
  for _, r in ipairs(assert(H.core.manifests("examples/reviews"))) do
    out[#out + 1] = { file = r.file, review = r.object }
  end
  return out
end

-- The policies ConfigMap holding `data` (key -> Lua source), as a table.
local function policies_cm(data)
  return { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cozygpu-policies", namespace = "cozy-gpu" },
    data = data }
end

describe("cozygpu controller on kube-apiserver: policy bundle and Lease", function()
  local cl, dir
  local running = {}
  local session = K.session { prepare = function(c)
    cl = c
    dir = c.dir
    -- the deployed replica leaves the Lease and the ConfigMap to the cases;
    -- it stays in cl.replicas, so its log is still checked for 403s
    P.stop(c.replicas["replica-a"].pid, 5)
  end }

  -- API requests as the admin (the double's E.send and E.get, here)
  local function send(method, path, obj)
    local st, v = cl:request(method, path, obj)
    return v, st
  end
  local function get(path)
    return (cl:get(path))
  end
  local function lease()
    local obj = get(LEASE)
    return obj and obj.spec or {}
  end
  -- the last successful write of the Lease by replica `id`, as the audit
  -- log has it (its user agent ends with the identity in parentheses)
  local function last_lease_write(id)
    local last
    for _, ev in ipairs(cl:audit(function(ev)
      local o = ev.objectRef
      return o and o.resource == "leases" and o.namespace == "cozy-gpu" and o.name == "cozygpu-controller"
        and (ev.verb == "update" or ev.verb == "create" or ev.verb == "patch") and ev.stage == "ResponseComplete"
        and ev.responseStatus and ev.responseStatus.code < 300
        and (ev.userAgent or ""):sub(-(#id + 2)) == "(" .. id .. ")"
    end)) do last = ev end
    return last
  end

  -- a replica as the ServiceAccount, on its own ports; o = {identity,
  -- config (a settings file; default the deployed config.yaml), extra}
  local function start(o)
    local extra = { "--workers", "2", "--lease-duration", "3s", "--renew-deadline", "2s",
      "--retry-period", "500ms", "--status-interval", "1s" }
    for _, a in ipairs(o.extra or {}) do extra[#extra + 1] = a end
    local r = cl:start_controller { identity = o.identity, port = P.free_port(), config = o.config, extra = extra }
    running[#running + 1] = r
    return r
  end

  setup(function()
    session.setup()
    send("DELETE", LEASE)
    send("DELETE", POLICIES)
  end)

  after_each(function()
    for _, r in ipairs(running) do P.stop(r.pid, 5) end
    running = {}
    -- a fresh Lease, no policies ConfigMap and no Events for the next case
    send("DELETE", LEASE)
    send("DELETE", POLICIES)
    cl:must { "-n", "cozy-gpu", "delete", "events", "--all" }
  end)

  teardown(session.teardown)

  it("reviews on the I/O thread once its engine is fed, and moves a review whose engine must first be fed the moved caches (decision 0052)", function()
    local c = start { identity = "inline" }
    assert.truthy(E.wait_ready(c))
    local review = reviews()[1].review
    local function moved()
      return (E.metrics(c) or {})['cozygpu_webhook_reviews_moved_total{webhook="vmi-validate"}'] or 0
    end
    local function answered()
      local st, r = E.review(c, "/validate/vmi", review)
      assert.equal(200, st)
      assert.equal(review.request.uid, r.response.uid)
      return r
    end
    -- the first reviews build the engines (on a review thread, never on
    -- the I/O thread); then one runs where it was read: nothing moves
    local first = answered()
    for _ = 1, 3 do answered() end
    local before = moved()
    assert.is_true(before >= 1, "the first review was not moved: its engine had no cluster view yet")
    assert.same(first.response, answered().response)
    assert.equal(before, moved())
    -- the caches move (a Namespace is created): the next review moves, and
    -- the one after it runs where it was read again, with the same answer
    local _, st = send("POST", "/api/v1/namespaces", { apiVersion = "v1", kind = "Namespace", metadata = { name = "inline-moves" } })
    assert.equal(201, st)
    finally(function() send("DELETE", "/api/v1/namespaces/inline-moves") end)
    assert.truthy(P.wait_until(function()
      answered()
      return moved() > before
    end, 10), "no review moved after the caches moved")
    local after = moved()
    assert.same(first.response, answered().response)
    assert.equal(after, moved())
  end)

  it("does not serve a bundle that fails on a GPU VMI review, and counts and logs policy errors per rule", function()
    local c = start { identity = "gate" }
    assert.truthy(E.wait_ready(c))
    local cm = policies_cm({ ["site-vmi-bug.lua"] = [[
return rule "site/vmi-bug" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) return req.object.spec.domain.devices.gpus[1].deviceName:lower() .. nil end,
}
]] })
    local _, cst = send("POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    assert.truthy(P.wait_until(function()
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] == 1
    end, 10), "the bundle was not refused")
    local events = get("/api/v1/namespaces/cozy-gpu/events")
    local found
    for _, ev in ipairs(events.items) do
      if ev.reason == "PolicyReloadFailed" then found = ev end
    end
    assert.truthy(found, json.encode(events))
    assert.truthy(found.message:find('self-check review (a GPU VirtualMachineInstance CREATE) failed: policy "site/vmi-bug" failed: site-vmi-bug.lua:3:', 1, true), found.message)
    -- the defaults keep serving: review 01 is allowed as before
    local st, r = E.review(c, "/validate/vmi", reviews()[1].review)
    assert.equal(200, st)
    assert.is_true(r.response.allowed)
    -- per rule: what it said and how long it took (the gate's own
    -- reviews are not counted); review 02 is refused by gpu/vmi-entries
    st, r = E.review(c, "/validate/vmi", reviews()[2].review)
    assert.equal(200, st)
    assert.is_false(r.response.allowed)
    local m = E.metrics(c)
    assert.equal(1, m['cozygpu_policy_rule_decisions_total{rule="gpu/vmi-entries",decision="allowed"}'])
    assert.equal(1, m['cozygpu_policy_rule_decisions_total{rule="gpu/vmi-entries",decision="denied"}'])
    assert.equal(2, m['cozygpu_policy_rule_duration_seconds_count{rule="gpu/vmi-entries"}'])
    assert.is_true(m['cozygpu_policy_rule_duration_seconds_sum{rule="gpu/vmi-entries"}'] > 0)
    -- the validating webhook runs no mutate hook
    assert.is_nil(m['cozygpu_policy_rule_decisions_total{rule="gpu/vmi-record",decision="patched"}'])
    st, r = E.review(c, "/mutate/vmi", reviews()[1].review)
    assert.equal(200, st)
    assert.equal(1, E.metrics(c)['cozygpu_policy_rule_decisions_total{rule="gpu/vmi-record",decision="patched"}'])

    -- a rule that fails only on some requests gets through the gate; its
    -- failures are counted per rule and logged
    cm = get("/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cm.data = { ["site-tenant-bug.lua"] = [[
return rule "site/tenant-bug" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) if req.namespace == "tenant-a" then error("boom") end end,
}
]] }
    local _, pst = send("PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cm)
    assert.equal(200, pst)
    assert.truthy(P.wait_until(function()
      -- the defaults at start count as the first
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="success"}'] == 2
    end, 10), "the second bundle was not served: " .. json.encode(E.metrics(c) or {}))
    local n = 0
    for _, rv in ipairs(reviews()) do
      if rv.review.request.kind.kind == "VirtualMachineInstance" and rv.review.request.namespace == "tenant-a" then
        st, r = E.review(c, "/validate/vmi", rv.review)
        assert.equal(200, st)
        assert.equal(500, r.response.status.code)
        n = n + 1
      end
    end
    assert.is_true(n >= 1)
    assert.equal(n, E.metrics(c)['cozygpu_policy_rule_errors_total{rule="site/tenant-bug",kind="error"}'])
    assert.equal(n, E.metrics(c)['cozygpu_policy_rule_decisions_total{rule="site/tenant-bug",decision="error"}'])
    local log = P.read(c.log) or ""
    assert.truthy(log:find("a policy failed; the review was refused", 1, true), log)
    assert.truthy(log:find("site/tenant-bug", 1, true), log)
  end)

  it("keeps serving the old bundle when a reload fails, and reports it; a good one is live in seconds", function()
    local c = start { identity = "reload" }
    assert.truthy(E.wait_ready(c))
    local review = reviews()[1].review -- 01: allowed VMI
    local st, r = E.review(c, "/validate/vmi", review)
    assert.equal(200, st)
    assert.is_true(r.response.allowed)

    local cm = policies_cm({ ["site-broken.lua"] = "return rule \"site/broken\" {\n  match = { kind = \"VirtualMachineInstance\" ,\n" })
    local _, cst = send("POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    assert.truthy(P.wait_until(function()
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] == 1
    end, 10), "no failed reload counted")
    assert.equal(1, E.metrics(c).cozygpu_policy_reload_failing) -- until a reload succeeds
    -- the Event on the ConfigMap names the file
    local events = get("/api/v1/namespaces/cozy-gpu/events")
    local found
    for _, ev in ipairs(events.items) do
      if ev.reason == "PolicyReloadFailed" and ev.involvedObject.name == "cozygpu-policies"
        and ev.involvedObject.kind == "ConfigMap" and ev.type == "Warning" then found = ev end
    end
    assert.truthy(found, "no PolicyReloadFailed event in " .. json.encode(events))
    assert.equal("string", type(found.message), json.encode(found))
    assert.truthy(found.message:find("ConfigMap cozy-gpu/cozygpu-policies: site-broken.lua:3:", 1, true), found.message)
    -- the old bundle still answers, and the replica stays ready
    st, r = E.review(c, "/validate/vmi", review)
    assert.equal(200, st)
    assert.is_true(r.response.allowed)
    assert.equal(200, (P.http { url = c.url .. "/readyz", cacert = c.cacert }))

    -- a good bundle with a site rule that refuses this VMI
    cm.data = { ["site-tier.lua"] = [[
return rule "site/no-vms-today" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req, cluster)
    return deny("no GPU VMs today")
  end,
}
]] }
    local cur = get("/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cm.metadata.resourceVersion = cur.metadata.resourceVersion
    _, cst = send("PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cm)
    assert.equal(200, cst)
    local t0 = os.time()
    local denied = P.wait_until(function()
      local s, a = E.review(c, "/validate/vmi", review)
      return s == 200 and a.response.allowed == false and a.response
    end, 10, 0.1)
    assert.truthy(denied, "the new bundle did not go live")
    assert.is_true(os.time() - t0 <= 5)
    assert.truthy(denied.status.message:find("no GPU VMs today", 1, true))
    -- the start-up load and this one
    assert.equal(2, E.metrics(c)['cozygpu_policy_reloads_total{result="success"}'])
    assert.equal(1, E.metrics(c)['cozygpu_policy_reloads_total{result="failure"}'])
    assert.equal(0, E.metrics(c).cozygpu_policy_reload_failing)
    -- the log line and the Event name the keys since the bundle replaced
    -- (the defaults: no keys; the failed one replaced nothing)
    local function reload_lines()
      local out = {}
      for _, rec in ipairs(E.log_records(c)) do
        if rec.msg == "policies reloaded from the ConfigMap" then out[#out + 1] = rec end
      end
      return out
    end
    local function reloaded_event(text)
      return P.wait_until(function()
        for _, ev in ipairs(get("/api/v1/namespaces/cozy-gpu/events").items) do
          if ev.reason == "PolicyReloaded" and ev.type == "Normal" and ev.message == text then return ev end
        end
      end, 10)
    end
    local rl = reload_lines()
    assert.equal(1, #rl, P.read(c.log))
    assert.same({ "site-tier.lua", "", "" }, { rl[1].added, rl[1].changed, rl[1].removed })
    assert.truthy(reloaded_event("policy bundle compiled, self-checked and serving; added: site-tier.lua"))
    -- one key changed, two added
    cur = get("/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cm.metadata.resourceVersion = cur.metadata.resourceVersion
    cm.data["site-tier.lua"] = cm.data["site-tier.lua"] .. "-- reviewed\n"
    cm.data["site-b.lua"] = "return rule \"site/b\" { match = { kind = \"Pod\" }, validate = function() end }\n"
    cm.data["site-a.lua"] = "return rule \"site/a\" { match = { kind = \"Pod\" }, validate = function() end }\n"
    _, cst = send("PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cm)
    assert.equal(200, cst)
    assert.truthy(P.wait_until(function() return #reload_lines() == 2 end, 10), P.read(c.log))
    rl = reload_lines()
    assert.same({ "site-a.lua, site-b.lua", "site-tier.lua", "" }, { rl[2].added, rl[2].changed, rl[2].removed })
    assert.truthy(reloaded_event(
      "policy bundle compiled, self-checked and serving; added: site-a.lua, site-b.lua; changed: site-tier.lua"))

    -- deleting the ConfigMap does not drop the hoster's rules: the last
    -- bundle keeps serving, and the deletion is reported
    local _, dst = send("DELETE", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    assert.equal(200, dst)
    assert.truthy(P.wait_until(function()
      for _, ev in ipairs(get("/api/v1/namespaces/cozy-gpu/events").items) do
        if ev.reason == "PolicyConfigMapDeleted" and ev.type == "Warning" then return true end
      end
    end, 10), "no PolicyConfigMapDeleted event")
    st, r = E.review(c, "/validate/vmi", review)
    assert.is_false(r.response.allowed)
    assert.truthy(r.response.status.message:find("no GPU VMs today", 1, true))
    -- an empty ConfigMap is how to go back to the defaults
    cm.metadata.resourceVersion = nil
    cm.data = json.object()
    _, cst = send("POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    assert.truthy(P.wait_until(function()
      local s2, a = E.review(c, "/validate/vmi", review)
      return s2 == 200 and a.response.allowed == true
    end, 10, 0.1), "the empty ConfigMap did not bring the defaults back")
    -- replacing the bundle the deleted ConfigMap left: every key removed
    rl = reload_lines()
    assert.equal(3, #rl, P.read(c.log))
    assert.same({ "", "", "site-a.lua, site-b.lua, site-tier.lua" }, { rl[3].added, rl[3].changed, rl[3].removed })
    assert.truthy(reloaded_event(
      "policy bundle compiled, self-checked and serving; removed: site-a.lua, site-b.lua, site-tier.lua"))
  end)

  it("serves a bundle only when its own policy tests (NAME.test.yaml keys) pass", function()
    local c = start { identity = "own-tests" }
    assert.truthy(E.wait_ready(c))
    local review = reviews()[1].review -- 01: allowed by the defaults
    -- a site rule that refuses VMIs in tenant-a, and a test that says it
    -- should only warn: the bundle contradicts its own tests
    local rule = [[
return rule "site/tenant-a-closed" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) if req.namespace == "tenant-a" then return deny("tenant-a is closed") end end,
}
]]
    local function test_doc(allowed, extra)
      return ([[
cluster:
- {apiVersion: v1, kind: Namespace, metadata: {name: tenant-a}}
cases:
- name: a VMI in tenant-a
  object:
    apiVersion: kubevirt.io/v1
    kind: VirtualMachineInstance
    metadata: {name: vm-1, namespace: tenant-a}
    spec: {domain: {devices: {}}}
  expect:
    allowed: %s
    rules: {site/tenant-a-closed: %s}
%s]]):format(allowed and "true" or "false", allowed and "allowed" or "denied", extra or "")
    end
    local cm = policies_cm({ ["site-closed.lua"] = rule, ["site.test.yaml"] = test_doc(true) })
    local _, cst = send("POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    assert.truthy(P.wait_until(function()
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] == 1
    end, 10), "a bundle failing its own tests was served")
    local found
    for _, ev in ipairs(get("/api/v1/namespaces/cozy-gpu/events").items) do
      if ev.reason == "PolicyReloadFailed" then found = ev end
    end
    assert.truthy(found)
    assert.truthy(found.message:find("policy tests in site.test.yaml: 0 passed, 1 failed: FAIL site.test.yaml: a VMI in tenant-a; expected allowed, got refused: tenant-a is closed", 1, true), found.message)
    -- the defaults keep serving
    local st, r = E.review(c, "/validate/vmi", review)
    assert.equal(200, st)
    assert.is_true(r.response.allowed)

    -- a test that names a file cannot run from a ConfigMap: refused, saying so
    local cur = get("/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cur.data = { ["site-closed.lua"] = rule, ["site.test.yaml"] = test_doc(false, "- name: from a file\n  input: vmi.yaml\n  expect: {allowed: false}\n") }
    _, cst = send("PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cur)
    assert.equal(200, cst)
    assert.truthy(P.wait_until(function()
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] == 2
    end, 10), "a test naming a file was accepted")
    st, r = E.review(c, "/validate/vmi", review)
    assert.is_true(r.response.allowed)

    -- tests that agree with the rules: served
    cur = get("/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cur.data = { ["site-closed.lua"] = rule, ["site.test.yaml"] = test_doc(false) }
    _, cst = send("PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cur)
    assert.equal(200, cst)
    local denied = P.wait_until(function()
      local s2, a = E.review(c, "/validate/vmi", review)
      return s2 == 200 and a.response.allowed == false and a.response
    end, 10, 0.1)
    assert.truthy(denied, "the bundle whose tests pass did not go live")
    assert.truthy(denied.status.message:find("tenant-a is closed", 1, true))
    assert.equal(2, E.metrics(c)['cozygpu_policy_reloads_total{result="failure"}'])
    local log = P.read(c.log) or ""
    assert.truthy(log:find("the bundle passed its own policy tests", 1, true), log)
    assert.truthy(log:find('"cases":%d+[,}]'), log) -- a JSON number
    local events = json.encode(get("/api/v1/namespaces/cozy-gpu/events"))
    assert.truthy(events:find("input: names a file, and a test in a ConfigMap has none", 1, true), events)
  end)

  it("stays unready and refuses reviews while the ConfigMap it starts with does not load", function()
    local cm = policies_cm({ ["site-broken.lua"] = "return rule \"site/broken\" {\n", ["lib.lua"] = "return {}\n" })
    local _, cst = send("POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    local c = start { identity = "broken-start" }
    -- listening at once; the failed load is counted, and never replaced by the defaults
    assert.truthy(P.wait_until(function()
      return ((E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] or 0) >= 1
    end, 10))
    -- the caches have listed (/readyz names them while they have not):
    -- readiness now hangs on the bundle alone
    local rst, rbody
    assert.truthy(P.wait_until(function()
      rst, rbody = P.http { url = c.url .. "/readyz", cacert = c.cacert }
      return not (rbody or ""):find("watch caches not synced", 1, true)
    end, 15), "the watch caches never listed: " .. tostring(rbody))
    assert.equal(503, rst)
    -- /readyz says why: the ConfigMap's error, on one line
    assert.truthy(rbody:find("^not ready: policy bundle did not load: ConfigMap cozy%-gpu/cozygpu%-policies: data%[lib%.lua%]: a module key needs a name\n$"), rbody)
    local st, r = E.review(c, "/validate/vmi", reviews()[1].review)
    assert.equal(200, st)
    assert.is_false(r.response.allowed)
    assert.equal(500, r.response.status.code)
    -- the leader's binder waits for a bundle with the state it built once
    -- (decision 0026: it used to rebuild it from the caches on every wake,
    -- about 20 times a second); the wait is logged once
    local function count(msg)
      local n = 0
      for line in (P.read(c.log) or ""):gmatch("[^\n]+") do
        if line:find(msg, 1, true) then n = n + 1 end
      end
      return n
    end
    assert.truthy(P.wait_until(function() return count("no policy bundle serves") >= 1 end, 15),
      "the binder never said it waits for a bundle:\n" .. (P.read(c.log) or ""))
    -- three more wakes of the binder's loop (cozygpu_writer_wakes_total,
    -- counted as each begins: two whole wakes), each of which the old loop
    -- spent rebuilding
    local key = 'cozygpu_writer_wakes_total{writer="binder",leading="true"}'
    local from = (E.metrics(c) or {})[key] or 0
    assert.truthy(P.wait_until(function() return ((E.metrics(c) or {})[key] or 0) >= from + 3 end, 15),
      "the binder's loop did not wake three times")
    assert.equal(1, count("rebuilt the binder's state from the caches"))
    assert.equal(1, count("no policy bundle serves"))
    local events = get("/api/v1/namespaces/cozy-gpu/events")
    local msg
    for _, ev in ipairs(events.items) do
      if ev.reason == "PolicyReloadFailed" then msg = ev.message end
    end
    assert.truthy(msg and msg:find("not serving", 1, true), tostring(msg))
    -- a good ConfigMap makes it ready
    local cur = get("/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cm.metadata.resourceVersion = cur.metadata.resourceVersion
    cm.data = { ["site-ok.lua"] = "return rule \"site/ok\" { match = { kind = \"Pod\" }, validate = function() end }\n" }
    local _, pst = send("PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cm)
    assert.equal(200, pst)
    assert.truthy(E.wait_ready(c, 10))
    st, r = E.review(c, "/validate/vmi", reviews()[1].review)
    assert.is_true(r.response.allowed)
    -- the state built while waiting gets its full pass, not a rebuild
    assert.truthy(P.wait_until(function()
      return ((E.metrics(c) or {})['cozygpu_binder_passes_total{kind="full"}'] or 0) >= 1
    end, 10), "no full binder pass once the bundle served")
    assert.equal(1, count("rebuilt the binder's state from the caches"))
  end)

  it("refuses, naming the policy, when a review passes its deadline", function()
    local cm = policies_cm({ ["site-forever.lua"] = [[
return rule "site/forever" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req, cluster)
    -- tenant-a only: a rule that ran past the deadline on every review
    -- would fail the reload gate's own reviews and never be served
    if req.namespace == "tenant-a" then while true do end end
  end,
}
]] })
    local _, cst = send("POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    -- an instruction budget far beyond what a second can run: only the
    -- deadline can stop this policy
    H.write(dir .. "/forever-config.yaml", "policyBudget: {instructions: 1000000000000, memoryBytes: 67108864}\n")
    local c = start { identity = "deadline", config = dir .. "/forever-config.yaml", extra = { "--review-timeout", "1s" } }
    assert.truthy(E.wait_ready(c))
    local t0 = os.time()
    local st, r = E.review(c, "/validate/vmi", reviews()[1].review)
    assert.equal(200, st)
    assert.is_true(os.time() - t0 <= 3)
    assert.is_false(r.response.allowed)
    assert.equal(500, r.response.status.code)
    assert.truthy(r.response.status.message:find('policy "site/forever"', 1, true), r.response.status.message)
    assert.truthy(r.response.status.message:find("deadline", 1, true), r.response.status.message)
    -- only the policy that was running is named: the rules after it were skipped
    assert.is_nil(r.response.status.message:find("gpu/vmi-entries", 1, true), r.response.status.message)
    -- the thread is free again: the next review is answered the same way
    st, r = E.review(c, "/validate/vmi", reviews()[1].review)
    assert.equal(200, st)
    assert.equal(500, r.response.status.code)
    assert.equal(2, E.metrics(c).cozygpu_policy_errors_total)
    -- the deadline outcome is counted as an error review, from the engine's
    -- code (decision 0012), not from the status code
    local m = E.metrics(c)
    assert.equal(2, m['cozygpu_admission_reviews_total{webhook="vmi-validate",decision="error"}'])
    assert.is_nil(m['cozygpu_admission_reviews_total{webhook="vmi-validate",decision="denied"}'])
  end)

  it("answers a slow review in flight on SIGTERM, then releases the Lease", function()
    local cm = policies_cm({ ["site-slow.lua"] = [[
return rule "site/slow" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req, cluster)
    local t = os.clock() + 1.5
    while os.clock() < t do end
  end,
}
]] })
    local _, cst = send("POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    H.write(dir .. "/slow-config.yaml", "policyBudget: {instructions: 100000000000, memoryBytes: 67108864}\n")
    local c = start { identity = "slow", config = dir .. "/slow-config.yaml" }
    assert.truthy(E.wait_ready(c))
    assert.truthy(P.wait_until(function() return lease().holderIdentity == "slow" end, 10))

    local body = dir .. "/slow-review.json"
    H.write(body, json.encode(reviews()[1].review))
    local out, done = dir .. "/slow-answer.json", dir .. "/slow-done"
    os.remove(done)
    os.execute(("(curl -sS --max-time 20 --cacert %s -H 'Content-Type: application/json' --data-binary @%s -o %s -w '%%{http_code}' %s/validate/vmi > %s.code; date +%%s.%%N > %s) &"):format(
      P.q(c.cacert), P.q(body), P.q(out), c.url, P.q(out), P.q(done)))
    -- the review is in flight: a review thread runs it (its rule spins 1.5 s)
    assert.truthy(P.wait_until(function()
      return ((E.metrics(c) or {})["cozygpu_webhook_review_threads_busy"] or 0) >= 1
    end, 5, 0.02), "the slow review never reached a review thread")
    P.kill(c.pid, "TERM")
    assert.truthy(P.wait_exit(c.pid, 15), "controller did not exit")
    running = {}
    assert.truthy(P.wait_until(function() return P.read(done) end, 5))
    assert.equal("200", P.read(out .. ".code"))
    local answer = json.decode(P.read(out))
    assert.equal("AdmissionReview", answer.kind)
    assert.equal(reviews()[1].review.request.uid, answer.response.uid)
    -- the Lease was released at SIGTERM, before the review in flight was
    -- answered (a hardening fix: another replica leads at once): empty holder,
    -- 1 s duration
    local sp = lease()
    assert.equal("", sp.holderIdentity or "")
    assert.equal(1, sp.leaseDurationSeconds)
    local answered = tonumber(P.read(done))
    -- when: by the API server's own record (its audit log), the replica's
    -- last write of the Lease was received before the answer came back
    local release = last_lease_write("slow")
    assert.truthy(release, "no Lease write of replica slow in the audit log")
    assert.is_true(K.epoch(release.requestReceivedTimestamp) <= answered + 0.05,
      ("released at %s, answered at %s"):format(release.requestReceivedTimestamp, answered))
  end)

  -- Found in hardening (the controller's part): with its workers busy, the
  -- replica's probes timed out; on SIGTERM it logged that the grace had
  -- passed but kept running and kept renewing its Lease.
  it("answers probes while every worker is busy, and on SIGTERM releases the Lease at once and exits after the grace", function()
    local cm = policies_cm({ ["site-busy.lua"] = [[
return rule "site/busy" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req, cluster)
    if req.namespace ~= "tenant-a" then return end -- not the reload gate's reviews
    local t = os.clock() + 12
    while os.clock() < t do end
  end,
}
]] })
    local _, cst = send("POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    H.write(dir .. "/busy-config.yaml", "policyBudget: {instructions: 100000000000, memoryBytes: 67108864}\n")
    local pf = dir .. "/busy.probe-port"
    os.remove(pf)
    local c = start { identity = "busy", config = dir .. "/busy-config.yaml",
      extra = { "--workers", "1", "--review-timeout", "20s", "--shutdown-grace", "1s", "--probe-port", "0",
        "--probe-port-file", pf } }
    assert.truthy(E.wait_ready(c))
    assert.truthy(P.wait_until(function() return lease().holderIdentity == "busy" end, 10))
    local probe = "http://127.0.0.1:" .. assert(P.wait_until(function() return tonumber((P.read(pf) or ""):match("%d+")) end, 5))
    local body = dir .. "/busy-review.json"
    H.write(body, json.encode(reviews()[1].review))
    os.execute(("(curl -sS --max-time 30 --cacert %s -H 'Content-Type: application/json' --data-binary @%s -o /dev/null %s/validate/vmi) >/dev/null 2>&1 &"):format(
      P.q(c.cacert), P.q(body), c.url))
    -- the only worker is busy with it (the probe listener's /metrics)
    assert.truthy(P.wait_until(function()
      local _, text = P.http { url = probe .. "/metrics", timeout = 2 }
      return tonumber((text or ""):match("\ncozygpu_webhook_review_threads_busy (%S+)")) == 1
    end, 10, 0.1), "the busy review never reached the review thread")
    -- the only worker is busy: the probe listener answers anyway, at once
    for _, path in ipairs { "/healthz", "/readyz" } do
      local st, text = P.http { url = probe .. path, timeout = 2 }
      assert.equal(200, st, path)
      assert.equal("ok", text, path)
    end
    local st, metrics = P.http { url = probe .. "/metrics", timeout = 2 }
    assert.equal(200, st)
    assert.truthy(metrics:find("cozygpu_admission_reviews_total", 1, true))
    local t0 = os.time()
    P.kill(c.pid, "TERM")
    -- during the grace, /readyz says why it is 503
    local rst, rbody = P.http { url = probe .. "/readyz", timeout = 1 }
    assert.equal(503, rst)
    assert.truthy(rbody:find("shutting down\n$"), rbody)
    assert.truthy(P.wait_exit(c.pid, 8), "the controller did not exit after the grace with a review stuck")
    running = {}
    assert.is_true(os.time() - t0 <= 6)
    assert.equal("", lease().holderIdentity or "")
    assert.truthy((P.read(c.log) or ""):find("shutdown grace passed with reviews in flight; exiting without them", 1, true))
  end)
end)
