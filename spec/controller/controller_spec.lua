-- `cozygpu controller` end to end: the API server double holds the
-- examples (loaded with kubectl), controllers serve the webhooks over TLS.
--
-- What stays here needs no cluster semantics (the webhook server's
-- answers, malformed bodies, flags, TLS and certificate rotation: the
-- double only holds the cluster view) or a fault a real server does not
-- make on demand (cut watches, expired resource versions, an API server
-- that is down). The policy bundle through the ConfigMap, its Events, the
-- review deadline and the Lease at SIGTERM run on the real control plane
-- (spec/cluster/controller_spec.lua), as do two replicas' answers against
-- `cozygpu review`, leader election and the DRA reads
-- (spec/cluster/replicas_spec.lua, raw_names_spec.lua; docs/decisions/0034).
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

end)
