-- `cozygpu controller` end to end: the API server double holds the
-- examples (loaded with kubectl), controllers serve the webhooks over TLS.
--
-- What stays here needs no cluster semantics (the webhook server's
-- answers, flags, TLS, probes, SIGTERM, bundle checks: the double only
-- holds state) or a fault a real server does not make on demand (cut
-- watches, expired resource versions, an API server that is down). Two
-- replicas' answers against `cozygpu review`, leader election and the DRA
-- reads run on the real control plane (spec/cluster/replicas_spec.lua,
-- raw_names_spec.lua; docs/decisions/0034).
local P = require "proc"
local E = require "controller_env"
local json = H.json

-- Which webhook path answers a request of this kind, per webhook type
-- (deploy/ webhook configurations; DESIGN.md §4).
local PATHS = {
  VirtualMachineInstance = { validating = "/validate/vmi", mutating = "/mutate/vmi" },
  Pod = { mutating = "/mutate/launcher", validating = "/validate/pod" },
  GPUClass = { validating = "/validate/gpuclass" },
  GPUClaim = { validating = "/validate/gpuclaim" },
}

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

local function lease(d)
  local obj = E.get(d, "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
  return obj and obj.spec or {}
end

describe("cozygpu controller", function()
  local dir, d, certs
  local running = {}

  local function start(o)
    o.double, o.dir, o.certs = d, dir, o.certs or certs
    local c = E.start_controller(o)
    running[#running + 1] = c
    return c
  end

  setup(function()
    dir = H.tmpdir()
    certs = P.certs(dir, { "cozygpu-webhook.cozy-gpu.svc" })
    d = E.start_double()
    E.load_examples(d)
  end)

  after_each(function()
    for _, c in ipairs(running) do P.stop(c.pid, 5) end
    running = {}
    -- a fresh Lease and no policies ConfigMap for the next case
    E.send(d, "DELETE", "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller", "")
    E.send(d, "DELETE", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", "")
    d:reset_log()
  end)

  teardown(function()
    d:stop()
    P.stop_all()
  end)

  it("answers the recorded reviews as `cozygpu review` does, over TLS", function()
    local c = start { identity = "e2e" }
    assert.truthy(E.wait_ready(c), "not ready; log:\n" .. (P.read(c.log) or ""))
    -- JSON logs write numbers as numbers (log.h LOG_NUM), names as strings
    local serving
    for _, rec in ipairs(E.log_records(c)) do
      if rec.msg == "serving admission webhooks" then serving = rec end
    end
    assert.truthy(serving, P.read(c.log))
    assert.equal("number", type(serving.port), "port: " .. tostring(serving.port))
    assert.equal(c.port, serving.port)
    assert.equal("string", type(serving.identity))
    local compared = 0
    for _, r in ipairs(reviews()) do
      local kind = r.review.request.kind.kind
      -- VirtualMachines are judged as their VMI by `review` only; the
      -- webhooks are registered for VMIs (the API server never sends a VM).
      for webhook, path in pairs(PATHS[kind] or {}) do
        local want_out, _, code = H.run { "review", "--cluster", "examples/classes", "--cluster", "examples/cluster",
          "--config", "examples/config.yaml", "--webhook", webhook, r.file }
        assert.equal(0, code)
        local want = H.json_lines(want_out)[1]
        local st, got = E.review(c, path, r.review)
        assert.equal(200, st, r.file .. " " .. path)
        assert.equal("AdmissionReview", got.kind)
        assert.equal("admission.k8s.io/v1", got.apiVersion)
        assert.same(want.response, got.response, r.file .. " " .. path)
        compared = compared + 1
      end
    end
    -- 01-06 VMIs twice, 07 pod twice, 08 class once, 10 claim once
    assert.equal(16, compared)
    local m = E.metrics(c)
    local total = 0
    for k, v in pairs(m) do
      if k:match("^cozygpu_admission_reviews_total{") then total = total + v end
    end
    assert.equal(compared, total)
  end)

  it("ends with watch caches equal to the API server, object by object, after cut watches and expired versions", function()
    local c = start { identity = "churn" }
    assert.truthy(E.wait_ready(c))
    math.randomseed(20261130)
    local modes = { "close", "abrupt", "expired" }
    local live_ns, live_cls = {}, {}
    for i = 1, 160 do
      local r = math.random(6)
      if r == 1 or #live_ns == 0 then
        local name = "churn-" .. i
        local _, st = E.send(d, "POST", "/api/v1/namespaces",
          { apiVersion = "v1", kind = "Namespace", metadata = { name = name, labels = { n = tostring(i) } } })
        assert.equal(201, st)
        live_ns[#live_ns + 1] = name
      elseif r == 2 then
        local name = table.remove(live_ns, math.random(#live_ns))
        local _, st = E.send(d, "DELETE", "/api/v1/namespaces/" .. name, "")
        assert.equal(200, st)
      elseif r == 3 then
        local name = live_ns[math.random(#live_ns)]
        local _, st = E.send(d, "PATCH", "/api/v1/namespaces/" .. name,
          { metadata = { labels = { n = tostring(i), ["gpu.cozystack.io/vgpu"] = (i % 2 == 0) and "true" or "false" } } },
          "application/merge-patch+json")
        assert.equal(200, st)
      elseif r == 4 or #live_cls == 0 then
        local name = "churn-class-" .. i
        local _, st = E.send(d, "POST", "/apis/cozystack.io/v1alpha1/gpuclasses", {
          apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", metadata = { name = name },
          spec = { displayName = name, model = "L40S", mode = "Passthrough", resourceName = "nvidia.com/CHURN_" .. i },
        })
        assert.equal(201, st)
        live_cls[#live_cls + 1] = name
      elseif r == 5 then
        local name = live_cls[math.random(#live_cls)]
        local _, st = E.send(d, "PATCH", "/apis/cozystack.io/v1alpha1/gpuclasses/" .. name,
          { spec = { displayName = "renamed " .. i } }, "application/merge-patch+json")
        assert.equal(200, st)
      else
        local name = table.remove(live_cls, math.random(#live_cls))
        local _, st = E.send(d, "DELETE", "/apis/cozystack.io/v1alpha1/gpuclasses/" .. name, "")
        assert.equal(200, st)
      end
      if i % 20 == 0 then d:cut { mode = modes[(i // 20) % 3 + 1] } end
      if i % 45 == 0 then d:compact() end
    end

    -- the double's state, per resource: "ns/name" -> {rv, uid}
    local function truth()
      local want = {}
      for _, res in ipairs { "namespaces", "nodes", "resourcequotas", "kubevirts", "gpuclasses", "gpuclaims",
        "virtualmachineinstances" } do
        for _, o in ipairs(d:state(res).items) do
          want[res .. " " .. (o.metadata.namespace or "") .. "/" .. o.metadata.name] =
            o.metadata.resourceVersion .. " " .. o.metadata.uid
        end
      end
      return want
    end
    local cache_file = dir .. "/churn.state/cache.json"
    local function view()
      os.remove(cache_file)
      P.kill(c.pid, "USR1")
      local text = P.wait_until(function() return P.read(cache_file) end, 5)
      local got = {}
      for _, o in ipairs(json.decode(text)) do
        if o.resource ~= "configmaps" then
          local ns = type(o.namespace) == "string" and o.namespace or "" -- null when cluster-scoped
          got[o.resource .. " " .. ns .. "/" .. o.name] = o.resourceVersion .. " " .. o.uid
        end
      end
      return got
    end
    local want = truth()
    local got
    assert.truthy(P.wait_until(function()
      got = view()
      for k, v in pairs(want) do if got[k] ~= v then return false end end
      for k in pairs(got) do if not want[k] then return false end end
      return true
    end, 15, 0.3), "the controller's caches differ from the API server")
    local n = 0
    for _ in pairs(want) do n = n + 1 end
    assert.is_true(n > 10)
    local m = E.metrics(c)
    local expired = 0
    for k, v in pairs(m) do
      if k:match("^cozygpu_watch_restarts_total{") and k:match('reason="expired"') then expired = expired + v end
    end
    assert.is_true(expired >= 1, "no relist after 410 was counted")
  end)

  -- Decision 0009, found in hardening: "A bundle that errors on every review is served.
  -- The self-check compiles the bundle but runs no review through it, and
  -- policy errors are neither logged per review nor counted per rule."
  it("does not serve a bundle that fails on a GPU VMI review, and counts and logs policy errors per rule", function()
    local c = start { identity = "gate" }
    assert.truthy(E.wait_ready(c))
    local cm = policies_cm({ ["site-vmi-bug.lua"] = [[
return rule "site/vmi-bug" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) return req.object.spec.domain.devices.gpus[1].deviceName:lower() .. nil end,
}
]] })
    local _, cst = E.send(d, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    assert.truthy(P.wait_until(function()
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] == 1
    end, 10), "the bundle was not refused")
    local events = E.get(d, "/api/v1/namespaces/cozy-gpu/events")
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
    cm = E.get(d, "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cm.data = { ["site-tenant-bug.lua"] = [[
return rule "site/tenant-bug" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req) if req.namespace == "tenant-a" then error("boom") end end,
}
]] }
    local _, pst = E.send(d, "PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cm)
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
    local _, cst = E.send(d, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    assert.truthy(P.wait_until(function()
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] == 1
    end, 10), "no failed reload counted")
    assert.equal(1, E.metrics(c).cozygpu_policy_reload_failing) -- until a reload succeeds
    -- the Event on the ConfigMap names the file
    local events = E.get(d, "/api/v1/namespaces/cozy-gpu/events")
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
    local cur = E.get(d, "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cm.metadata.resourceVersion = cur.metadata.resourceVersion
    _, cst = E.send(d, "PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cm)
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
        for _, ev in ipairs(E.get(d, "/api/v1/namespaces/cozy-gpu/events").items) do
          if ev.reason == "PolicyReloaded" and ev.type == "Normal" and ev.message == text then return ev end
        end
      end, 10)
    end
    local rl = reload_lines()
    assert.equal(1, #rl, P.read(c.log))
    assert.same({ "site-tier.lua", "", "" }, { rl[1].added, rl[1].changed, rl[1].removed })
    assert.truthy(reloaded_event("policy bundle compiled, self-checked and serving; added: site-tier.lua"))
    -- one key changed, two added
    cur = E.get(d, "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cm.metadata.resourceVersion = cur.metadata.resourceVersion
    cm.data["site-tier.lua"] = cm.data["site-tier.lua"] .. "-- reviewed\n"
    cm.data["site-b.lua"] = "return rule \"site/b\" { match = { kind = \"Pod\" }, validate = function() end }\n"
    cm.data["site-a.lua"] = "return rule \"site/a\" { match = { kind = \"Pod\" }, validate = function() end }\n"
    _, cst = E.send(d, "PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cm)
    assert.equal(200, cst)
    assert.truthy(P.wait_until(function() return #reload_lines() == 2 end, 10), P.read(c.log))
    rl = reload_lines()
    assert.same({ "site-a.lua, site-b.lua", "site-tier.lua", "" }, { rl[2].added, rl[2].changed, rl[2].removed })
    assert.truthy(reloaded_event(
      "policy bundle compiled, self-checked and serving; added: site-a.lua, site-b.lua; changed: site-tier.lua"))

    -- deleting the ConfigMap does not drop the hoster's rules: the last
    -- bundle keeps serving, and the deletion is reported
    local _, dst = E.send(d, "DELETE", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", "")
    assert.equal(200, dst)
    assert.truthy(P.wait_until(function()
      for _, ev in ipairs(E.get(d, "/api/v1/namespaces/cozy-gpu/events").items) do
        if ev.reason == "PolicyConfigMapDeleted" and ev.type == "Warning" then return true end
      end
    end, 10), "no PolicyConfigMapDeleted event")
    st, r = E.review(c, "/validate/vmi", review)
    assert.is_false(r.response.allowed)
    assert.truthy(r.response.status.message:find("no GPU VMs today", 1, true))
    -- an empty ConfigMap is how to go back to the defaults
    cm.metadata.resourceVersion = nil
    cm.data = json.object()
    _, cst = E.send(d, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
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
    local _, cst = E.send(d, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    assert.truthy(P.wait_until(function()
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] == 1
    end, 10), "a bundle failing its own tests was served")
    local found
    for _, ev in ipairs(E.get(d, "/api/v1/namespaces/cozy-gpu/events").items) do
      if ev.reason == "PolicyReloadFailed" then found = ev end
    end
    assert.truthy(found)
    assert.truthy(found.message:find("policy tests in site.test.yaml: 0 passed, 1 failed: FAIL site.test.yaml: a VMI in tenant-a; expected allowed, got refused: tenant-a is closed", 1, true), found.message)
    -- the defaults keep serving
    local st, r = E.review(c, "/validate/vmi", review)
    assert.equal(200, st)
    assert.is_true(r.response.allowed)

    -- a test that names a file cannot run from a ConfigMap: refused, saying so
    local cur = E.get(d, "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cur.data = { ["site-closed.lua"] = rule, ["site.test.yaml"] = test_doc(false, "- name: from a file\n  input: vmi.yaml\n  expect: {allowed: false}\n") }
    _, cst = E.send(d, "PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cur)
    assert.equal(200, cst)
    assert.truthy(P.wait_until(function()
      return (E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] == 2
    end, 10), "a test naming a file was accepted")
    st, r = E.review(c, "/validate/vmi", review)
    assert.is_true(r.response.allowed)

    -- tests that agree with the rules: served
    cur = E.get(d, "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cur.data = { ["site-closed.lua"] = rule, ["site.test.yaml"] = test_doc(false) }
    _, cst = E.send(d, "PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cur)
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
    local events = json.encode(E.get(d, "/api/v1/namespaces/cozy-gpu/events"))
    assert.truthy(events:find("input: names a file, and a test in a ConfigMap has none", 1, true), events)
  end)

  it("stays unready and refuses reviews while the ConfigMap it starts with does not load", function()
    local cm = policies_cm({ ["site-broken.lua"] = "return rule \"site/broken\" {\n", ["lib.lua"] = "return {}\n" })
    local _, cst = E.send(d, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
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
    local events = E.get(d, "/api/v1/namespaces/cozy-gpu/events")
    local msg
    for _, ev in ipairs(events.items) do
      if ev.reason == "PolicyReloadFailed" then msg = ev.message end
    end
    assert.truthy(msg and msg:find("not serving", 1, true), tostring(msg))
    -- a good ConfigMap makes it ready
    local cur = E.get(d, "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies")
    cm.metadata.resourceVersion = cur.metadata.resourceVersion
    cm.data = { ["site-ok.lua"] = "return rule \"site/ok\" { match = { kind = \"Pod\" }, validate = function() end }\n" }
    local _, pst = E.send(d, "PUT", "/api/v1/namespaces/cozy-gpu/configmaps/cozygpu-policies", cm)
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

  it("listens at once when the API server is down, and stays unready until it has loaded the policies", function()
    local D = require "double"
    local gone = D.start()
    local port = gone.port
    gone:stop()
    local c = E.start_controller { double = { url = "http://127.0.0.1:" .. port }, dir = dir, certs = certs,
      identity = "late", extra = { "--leader-elect", "false" } }
    running[#running + 1] = c
    assert.equal(200, (P.http { url = c.url .. "/healthz", cacert = c.cacert }))
    local rst, rbody = P.http { url = c.url .. "/readyz", cacert = c.cacert }
    assert.equal(503, rst)
    -- /readyz names the caches that have not listed, then the missing bundle
    assert.truthy(rbody:find("^not ready: watch caches not synced %(.*gpuclaims.*nodes.*%); no policy bundle loaded\n$"), rbody)
    -- whole resource names, every one of them (the last informers added,
    -- the license Secrets' and the policies ConfigMap's, too), none cut
    local list = rbody:match("%((.*)%)")
    for item in (list .. ", "):gmatch("(.-), ") do
      assert.truthy(item:match("^[a-z]+$"), ("%q in %s"):format(item, rbody))
    end
    assert.truthy(list:find("secrets", 1, true) and list:find("configmaps", 1, true), rbody)
    local st, r = E.review(c, "/validate/vmi", reviews()[1].review)
    assert.equal(200, st)
    assert.equal(500, r.response.status.code) -- no answer from empty caches
    assert.truthy(r.response.status.message:find("not serving: the watch caches have not listed", 1, true),
      r.response.status.message)
    -- the API server comes up, holding a ConfigMap that does not load
    local late = D.start { args = { "--port", tostring(port) } }
    finally(function() late:stop() end)
    assert.equal(port, late.port)
    -- the controller's namespace and the ConfigMap first, back to back
    -- (two requests, no kubectl start-up between them): the ConfigMap cache
    -- lists as soon as its namespace exists (the double serves every other
    -- kind the caches read from its start), and a cache that listed before
    -- the ConfigMap was created rightly starts on the defaults: a race of
    -- this spec, not of the controller
    local _, nst = E.send(late, "POST", "/api/v1/namespaces", {
      apiVersion = "v1", kind = "Namespace", metadata = { name = "cozy-gpu" } })
    assert.equal(201, nst, "double alive: " .. tostring(P.alive(late.pid)) .. "\n" .. (P.read(late.log_path) or ""))
    local _, cst = E.send(late, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", {
      apiVersion = "v1", kind = "ConfigMap", metadata = { name = "cozygpu-policies", namespace = "cozy-gpu" },
      data = { ["site-broken.lua"] = "return rule \"x\" {\n" },
    })
    assert.equal(201, cst)
    local out, code = E.kubectl(late, { "apply", "-f", "examples/cluster/namespaces.yaml", "-f", "deploy/00-namespace.yaml" })
    assert.equal(0, code, out)
    out, code = E.kubectl(late, { "apply", "-f", "deploy/crds" })
    assert.equal(0, code, out)
    assert.truthy(P.wait_until(function()
      return ((E.metrics(c) or {})['cozygpu_policy_reloads_total{result="failure"}'] or 0) >= 1
    end, 15), "the broken ConfigMap was never tried")
    -- never the defaults in place of the hoster's broken rules: once every
    -- cache has listed, /readyz hangs on the bundle alone, and says the
    -- hoster's did not load
    local rst, rbody
    assert.truthy(P.wait_until(function()
      rst, rbody = P.http { url = c.url .. "/readyz", cacert = c.cacert }
      return not (rbody or ""):find("watch caches not synced", 1, true)
    end, 15), "the watch caches never listed: " .. tostring(rbody))
    assert.equal(503, rst)
    assert.truthy((rbody or ""):find("policy bundle did not load", 1, true), rbody)
    assert.equal(0, E.metrics(c)['cozygpu_policy_reloads_total{result="success"}'])
  end)

  -- Found in hardening: "The webhook allows an over-maxCount VMI when
  -- request.operation is missing, a number, lower-case or CONNECT, or when
  -- gpus is an object; review refuses a missing operation. A body with
  -- duplicate keys is refused by review and judged on the last key by the
  -- webhook." Both now refuse each, the same way.
  it("refuses malformed requests as `cozygpu review` does: operation, field types, duplicate keys", function()
    local c = start { identity = "malformed" }
    assert.truthy(E.wait_ready(c), "not ready; log:\n" .. (P.read(c.log) or ""))
    local base = H.read("examples/reviews/03-vmi-maxcount-exceeded.yaml")
    local doc = assert(H.core.yaml(base))[1]
    local cases = {
      { "missing", function(r) r.request.operation = nil end, "request.operation is missing" },
      { "a number", function(r) r.request.operation = 1 end, "request.operation must be one of CREATE, UPDATE, DELETE, CONNECT (got a number)" },
      { "lower-case", function(r) r.request.operation = "create" end, 'request.operation must be one of CREATE, UPDATE, DELETE, CONNECT (got "create")' },
      { "CONNECT", function(r) r.request.operation = "CONNECT" end, "serves CREATE requests, not CONNECT" },
    }
    for _, k in ipairs(cases) do
      local r = json.decode(json.encode(doc))
      k[2](r)
      local st, got = E.review(c, "/validate/vmi", r)
      assert.equal(200, st, k[1])
      assert.is_false(got.response.allowed, k[1])
      assert.equal(400, got.response.status.code, k[1])
      assert.truthy(got.response.status.message:find(k[3], 1, true), k[1] .. ": " .. got.response.status.message)
      -- `review` refuses the same input (exit 2, an input error), except
      -- CONNECT, which no webhook path serves but a recorded review may hold
      if k[1] ~= "CONNECT" then
        local f = dir .. "/malformed.json"
        H.write(f, json.encode(r))
        local _, err, code = H.run { "review", "--cluster", "examples/classes", "--cluster", "examples/cluster", f }
        assert.equal(2, code, k[1])
        assert.truthy(err:find(k[3], 1, true), err)
      end
    end
    -- gpus as an object: 422 from the default rule, for both
    local r = json.decode(json.encode(doc))
    r.request.object.spec.domain.devices.gpus = { first = r.request.object.spec.domain.devices.gpus[1] }
    local st, got = E.review(c, "/validate/vmi", r)
    assert.equal(200, st)
    assert.is_false(got.response.allowed)
    assert.equal(422, got.response.status.code)
    assert.equal("spec.domain.devices.gpus: must be a list", got.response.status.message)
    -- duplicate keys: refused as JSON the API server never sends
    local text = json.encode(doc):gsub('"operation":"CREATE"', '"operation":"DELETE","operation":"CREATE"')
    local st2, body = P.http { method = "POST", url = c.url .. "/validate/vmi", cacert = c.cacert, timeout = 15,
      body = text, headers = { "Content-Type: application/json" } }
    assert.equal(400, st2, body)
    assert.truthy(body:find("duplicate", 1, true), body)
  end)

  it("refuses a kind its webhook does not serve, naming both", function()
    local c = start { identity = "kinds" }
    assert.truthy(E.wait_ready(c))
    local vm
    for _, r in ipairs(reviews()) do
      if r.review.request.kind.kind == "VirtualMachine" then vm = r.review end
    end
    local st, r = E.review(c, "/validate/vmi", vm)
    assert.equal(200, st)
    assert.equal(vm.request.uid, r.response.uid)
    assert.is_false(r.response.allowed)
    assert.equal(400, r.response.status.code)
    assert.truthy(r.response.status.message:find(
      'serves VirtualMachineInstance objects (group "kubevirt.io"), not VirtualMachine (group "kubevirt.io")', 1, true),
      r.response.status.message)
    -- the group counts too, and a CREATE must carry its object
    local forged = json.decode(json.encode(reviews()[1].review))
    forged.request.kind.group = "evil.io"
    st, r = E.review(c, "/validate/vmi", forged)
    assert.equal(400, r.response.status.code)
    local empty = json.decode(json.encode(reviews()[1].review))
    empty.request.object = json.null
    st, r = E.review(c, "/validate/vmi", empty)
    assert.equal(200, st)
    assert.is_false(r.response.allowed)
    assert.equal(400, r.response.status.code)
    assert.truthy(r.response.status.message:find("request.object must be an object for CREATE", 1, true))
  end)

  it("refuses bad flags at start with exit 2, naming the flag", function()
    for _, case in ipairs {
      { { "--shutdown-grace", "nan" }, "--shutdown-grace" },
      { { "--resync", "0x10s" }, "--resync" },
      { { "--review-timeout", "-1s" }, "--review-timeout" },
      { { "--port", "" }, "--port" },
      { { "--state-dir", dir .. "/does-not-exist" }, "--state-dir" },
      { { "--leader-elect", "yes" }, "--leader-elect" },
      { { "--identity", "" }, "--identity" },
      { { "--policies-configmap", "Bad Name" }, "--policies-configmap" },
      { { "--lease-duration", "1s", "--renew-deadline", "2s" }, "--renew-deadline" },
      { { "--max-connections", "0" }, "--max-connections" },
      { { "--max-connections", "8", "--max-connections-per-address", "9" }, "--max-connections-per-address" },
      { { "--request-timeout", "50ms" }, "--request-timeout" },
      { { "--request-timeout", "soon" }, "--request-timeout" },
      { { "--max-body-bytes-in-flight", "2048" }, "--max-body-bytes-in-flight" },
      { { "--status-interval", "0" }, "--status-interval" },
      { { "--workers", "4294967297" }, "--workers" }, -- 2^32 + 1: not 1 once narrowed to int
      { { "--io-threads", "0" }, "--io-threads" },
    } do
      local args = { "controller", "--server", d.url, "--tls-cert-file", certs.cert, "--tls-key-file", certs.key }
      for _, a in ipairs(case[1]) do args[#args + 1] = a end
      local _, err, code = H.run(args)
      assert.equal(2, code, table.concat(case[1], " "))
      assert.truthy(err:find(case[2], 1, true), err)
    end
  end)

  it("documents the webhook client bounds in --help, with their defaults", function()
    local out, _, code = H.run { "controller", "--help" }
    assert.equal(0, code)
    for _, want in ipairs {
      "--max-connections N      open connections in all (default 512)",
      "--max-connections-per-address N", "(default 128,",
      "--request-timeout DURATION", "(default 10s)",
      "--max-body-bytes-in-flight N", "(default 67108864; >= --max-body-bytes)",
    } do
      assert.truthy(out:find(want, 1, true), want)
    end
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
    local _, cst = E.send(d, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
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

  it("serves a replaced certificate on the next handshake without a restart", function()
    local c = start { identity = "certs" }
    assert.truthy(E.wait_ready(c))
    local function serial()
      local out = P.sh(("echo | timeout 10 openssl s_client -connect 127.0.0.1:%d -servername localhost 2>/dev/null | openssl x509 -noout -serial"):format(c.port))
      return out:match("serial=(%x+)")
    end
    local before = serial()
    assert.truthy(before)
    local fresh = P.certs(dir, { "cozygpu-webhook.cozy-gpu.svc" }, "rotated")
    -- replace the files in place, as a Secret volume update does
    assert(os.execute(("cp %s %s.new && cp %s %s.new && mv %s.new %s && mv %s.new %s"):format(
      P.q(fresh.key), P.q(certs.key), P.q(fresh.cert), P.q(certs.cert), P.q(certs.key), P.q(certs.key),
      P.q(certs.cert), P.q(certs.cert))))
    local want = P.sh("openssl x509 -noout -serial -in " .. P.q(fresh.cert)):match("serial=(%x+)")
    assert.truthy(P.wait_until(function() return serial() == want end, 5, 0.2), "old certificate still served")
    assert.is_true(P.alive(c.pid))
    -- and reviews still work with the new CA
    c.cacert = fresh.ca
    local st = E.review(c, "/validate/vmi", reviews()[1].review)
    assert.equal(200, st)
    -- restore for the other cases
    P.certs(dir, { "cozygpu-webhook.cozy-gpu.svc" })
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
    local _, cst = E.send(d, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    H.write(dir .. "/slow-config.yaml", "policyBudget: {instructions: 100000000000, memoryBytes: 67108864}\n")
    local c = start { identity = "slow", config = dir .. "/slow-config.yaml" }
    assert.truthy(E.wait_ready(c))
    assert.truthy(P.wait_until(function() return lease(d).holderIdentity == "slow" end, 10))

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
    local sp = lease(d)
    assert.equal("", sp.holderIdentity or "")
    assert.equal(1, sp.leaseDurationSeconds)
    local answered = tonumber(P.read(done))
    local release
    for _, w in ipairs(d:log()) do
      if w.method == "PUT" and w.path:match("/leases/cozygpu%-controller$") then release = w end
    end
    assert.truthy(release)
    assert.is_true(E.epoch(release.time) <= answered + 0.05,
      ("released at %s, answered at %s"):format(release.time, answered))
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
    local _, cst = E.send(d, "POST", "/api/v1/namespaces/cozy-gpu/configmaps", cm)
    assert.equal(201, cst)
    H.write(dir .. "/busy-config.yaml", "policyBudget: {instructions: 100000000000, memoryBytes: 67108864}\n")
    local pf = dir .. "/busy.probe-port"
    os.remove(pf)
    local c = start { identity = "busy", config = dir .. "/busy-config.yaml",
      extra = { "--workers", "1", "--review-timeout", "20s", "--shutdown-grace", "1s", "--probe-port", "0",
        "--probe-port-file", pf } }
    assert.truthy(E.wait_ready(c))
    assert.truthy(P.wait_until(function() return lease(d).holderIdentity == "busy" end, 10))
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
    assert.equal("", lease(d).holderIdentity or "")
    assert.truthy((P.read(c.log) or ""):find("shutdown grace passed with reviews in flight; exiting without them", 1, true))
  end)
end)
