--- On the API server double by design (docs/decisions/0034): a real server
--- cannot cut watches or compact its history on demand.
--- Informers (core/kube/watch.c) against the API double while a background
--- process creates, updates and deletes objects and the double cuts every
--- watch (clean close, abrupt drop, ERROR 410) and compacts its history.
--- At the end the driver's caches must equal the double's objects, object by
--- object (same content, same resourceVersion), and no event may have been
--- applied twice: per object key, ADDED/MODIFIED resourceVersions strictly
--- increase, ADDED only for an absent key, MODIFIED/DELETED only for a present
--- one (the driver checks these on every callback and reports violations).
--- Semantics: client-go tools/cache/reflector.go; the API concepts page
--- ("Efficient detection of changes", "Watch bookmarks", 410 Gone).
local P = require "proc"
local S = dofile("spec/kube/support.lua")

--- Runs the driver's watch in the background until the sentinels appear.
local function start_watch(d, args)
  local out, sum, errf = d.dir .. "/cache.jsonl", d.dir .. "/summary.json", d.dir .. "/watch.err"
  local argv = { S.driver, "watch", "--server", d.url, "--seconds", "120", "--summary", sum }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local q = {}
  for i, a in ipairs(argv) do q[i] = P.q(a) end
  local pidf = os.tmpname()
  os.execute(("(exec %s >%s 2>%s </dev/null & echo $! >%s)"):format(table.concat(q, " "), P.q(out), P.q(errf), P.q(pidf)))
  local pid = tonumber(P.read(pidf):match("%d+"))
  os.remove(pidf)
  return { pid = pid, out = out, sum = sum, err = errf }
end

--- Waits until the double counts at least n open watches.
local function wait_watching(d, n)
  return P.wait_until(function()
    local _, st = S.call(d, "GET", "/_double/state")
    return type(st) == "table" and (st.watches or 0) >= n
  end, 20)
end

local function finish(w)
  assert(P.wait_exit(w.pid, 60), "driver did not finish")
  local sum = H.json.decode(assert(P.read(w.sum), "no summary: " .. (P.read(w.err) or "")))
  local err = P.read(w.err) or ""
  assert(not err:find("Sanitizer") and not err:find("runtime error"), err)
  io.stderr:write(H.json.encode(sum.restarts), " ", H.json.encode(sum.events), "\n")
  return S.lines(P.read(w.out) or ""), sum
end

--- Asserts that the driver's cache lines for `resource` equal `items`.
local function assert_equal_state(lines, resource, items, keep)
  local got = {}
  for _, l in ipairs(lines) do if l.resource == resource then got[l.key] = l end end
  local n = 0
  for _, obj in ipairs(items) do
    if not keep or keep(obj) then
      n = n + 1
      local md = obj.metadata
      local key = md.namespace and (md.namespace .. "/" .. md.name) or md.name
      local l = got[key]
      assert(l, resource .. " " .. key .. " missing from the driver's cache")
      assert.are.equal(md.resourceVersion, l.rv, resource .. " " .. key .. " resourceVersion")
      assert(S.same(obj, l.object), resource .. " " .. key .. " differs from the double's")
      got[key] = nil
    end
  end
  local extra = next(got)
  assert.is_nil(extra, "driver caches an object the double does not have: " .. tostring(extra))
  return n
end

for _, expired in ipairs { "event", "http" } do
describe("watch (410 as " .. expired .. ")", function()
  local d
  before_each(function()
    d = S.start { "--history", "150", "--bookmark-interval", "1", "--expired-watch", expired }
    S.namespace(d, "t1")
    S.namespace(d, "t2")
  end)
  after_each(function() S.stop(d) end)

  it("ends equal to the double across cuts and compactions, each change applied once", function()
    local w = start_watch(d, { "--resource", "configmaps", "--resource", "gpuclasses",
      "--until-key", "configmaps:t1/sentinel", "--until-key", "gpuclasses:sentinel" })
    finally(function() P.stop(w.pid) end)
    assert(wait_watching(d, 2), "driver never watched: " .. (P.read(w.err) or ""))
    local loadlog = d.dir .. "/load.log"
    local lp = P.spawn({ "lua5.4", "spec/kube/load.lua", d.url, "500", "42", "37", "61", loadlog }, d.dir .. "/load.err")
    finally(function() P.stop(lp) end)
    assert(P.wait_exit(lp, 180), "load did not finish")
    assert.matches("done\n$", P.read(loadlog))
    -- the last writes: once the driver has them, it has everything before
    S.call(d, "POST", "/api/v1/namespaces/t1/configmaps", '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"sentinel"}}')
    S.call(d, "POST", "/apis/cozystack.io/v1alpha1/gpuclasses", '{"apiVersion":"cozystack.io/v1alpha1","kind":"GPUClass","metadata":{"name":"sentinel"},"spec":{}}')
    local lines, sum = finish(w)

    assert.is_true(sum.reached)
    assert.is_true(sum.synced)
    assert.are.same({}, sum.violations)
    local ncm = assert_equal_state(lines, "configmaps", S.state(d, "configmaps").items)
    local ngc = assert_equal_state(lines, "gpuclasses", S.state(d, "gpuclasses").items)
    assert(ncm > 1 and ngc > 1, "too few objects survived to compare")
    -- the run exercised every path: cuts of each kind and expiries
    local r = sum.restarts
    local function restarts(res, reason)
      return r[('cozygpu_watch_restarts_total{resource="%s",reason="%s"}'):format(res, reason)] or 0
    end
    for _, res in ipairs { "configmaps", "gpuclasses" } do
      assert(restarts(res, "closed") >= 1, res .. ": no clean close seen")
      assert(restarts(res, "cut") >= 1, res .. ": no abrupt cut seen")
      assert(restarts(res, "expired") >= 1, res .. ": no 410 seen")
    end
    assert((sum.events.ADDED or 0) > 0 and (sum.events.MODIFIED or 0) > 0 and (sum.events.DELETED or 0) > 0)
  end)

  it("label and field selectors: the cache holds exactly the matching objects; periodic resync relists", function()
    local w = start_watch(d, { "--resource", "configmaps", "--label", "app=x", "--field", "metadata.namespace=t1",
      "--resync", "2", "--until-key", "configmaps:t1/sentinel" })
    finally(function() P.stop(w.pid) end)
    assert(wait_watching(d, 1), "driver never watched: " .. (P.read(w.err) or ""))
    local loadlog = d.dir .. "/load.log"
    local lp = P.spawn({ "lua5.4", "spec/kube/load.lua", d.url, "250", "7", "53", "89", loadlog }, d.dir .. "/load.err")
    finally(function() P.stop(lp) end)
    assert(P.wait_exit(lp, 120), "load did not finish")
    -- at least one resync after the load: the driver lists configmaps again
    -- (the double's request log, emptied now, shows its LISTs, watches apart)
    assert(S.call(d, "DELETE", "/_double/log") == 200)
    assert(P.wait_until(function()
      for _, e in ipairs(S.log(d)) do
        if e.method == "GET" and not e.watch and e.path:match("/configmaps$") then return true end
      end
    end, 10, 0.2), "no relist of configmaps within 10 s after the load (--resync 2)")
    S.call(d, "POST", "/api/v1/namespaces/t1/configmaps", '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"sentinel","labels":{"app":"x"}}}')
    local lines, sum = finish(w)
    assert.is_true(sum.reached)
    assert.are.same({}, sum.violations)
    local n = assert_equal_state(lines, "configmaps", S.state(d, "configmaps").items, function(o)
      return o.metadata.namespace == "t1" and o.metadata.labels and o.metadata.labels.app == "x"
    end)
    assert(n > 1, "too few objects matched")
    assert((sum.restarts['cozygpu_watch_restarts_total{resource="configmaps",reason="resync"}'] or 0) >= 1, "no resync")
  end)
end)
end

--- DRA kinds are read at the newest version served (core/kube/watch.h
--- VERSIONS, kube.c kube_resource_older): resource.k8s.io/v1 (Kubernetes
--- 1.34+), else v1beta2 (1.33), else v1beta1 (1.32). The double serves v1
--- and v1beta1, each a store of its own; --without and fail rules take a
--- version away.
describe("watch of a resource with older versions (DRA)", function()
  local d
  after_each(function() S.stop(d) end)

  local function claim(d_, version, name)
    local st = S.call(d_, "POST", ("/apis/resource.k8s.io/%s/namespaces/t1/resourceclaims"):format(version), {
      apiVersion = "resource.k8s.io/" .. version, kind = "ResourceClaim", metadata = { name = name },
      spec = { devices = { requests = { { name = "gpu", exactly = { deviceClassName = "gpu.nvidia.com" } } } } } })
    assert.are.equal(201, st, "create " .. version .. " " .. name)
  end

  -- the driver's LISTs of resourceclaims (not watches), as "version status"
  local function lists(d_)
    local out = {}
    for _, e in ipairs(S.log(d_)) do
      local v = e.path:match("^/apis/resource%.k8s%.io/([^/]+)/resourceclaims$")
      if v and not e.watch then out[#out + 1] = v .. " " .. e.status end
    end
    return out
  end

  it("reads v1 when the cluster serves it, without asking for older versions", function()
    d = S.start {}
    S.namespace(d, "t1")
    claim(d, "v1", "c1")
    claim(d, "v1beta1", "old")
    local w = start_watch(d, { "--resource", "resourceclaims", "--until-key", "resourceclaims:t1/c1" })
    finally(function() P.stop(w.pid) end)
    local lines, sum = finish(w)
    assert.is_true(sum.reached)
    assert.are.same({}, sum.violations)
    assert.are.equal("resource.k8s.io/v1", sum.served.resourceclaims)
    assert.are.equal(1, #lines)
    assert.are.equal("t1/c1", lines[1].key)
    assert.are.same({ "v1 200" }, lists(d))
  end)

  it("falls back to v1beta1 when v1 and v1beta2 answer 404, and reads its objects", function()
    d = S.start { "--without", "resourceclaims.v1.resource.k8s.io" }
    S.namespace(d, "t1")
    claim(d, "v1beta1", "old")
    local w = start_watch(d, { "--resource", "resourceclaims", "--until-key", "resourceclaims:t1/old" })
    finally(function() P.stop(w.pid) end)
    local lines, sum = finish(w)
    assert.is_true(sum.reached)
    assert.are.equal("resource.k8s.io/v1beta1", sum.served.resourceclaims)
    assert.are.equal("t1/old", lines[1].key)
    assert.are.same({ "v1 404", "v1beta2 404", "v1beta1 200" }, lists(d))
    -- the watch that follows is at the version listed
    local watched
    for _, e in ipairs(S.log(d)) do
      if e.watch and e.path:find("/resourceclaims", 1, true) then watched = e.path end
    end
    assert.are.equal("/apis/resource.k8s.io/v1beta1/resourceclaims", watched)
  end)

  it("counts no version served as empty when optional (a cluster without DRA), and keeps it unsynced otherwise", function()
    d = S.start { "--without", "resourceclaims" }
    local w = start_watch(d, { "--resource", "resourceclaims", "--optional", "--until-synced", "--seconds", "20" })
    finally(function() P.stop(w.pid) end)
    local lines, sum = finish(w)
    assert.is_true(sum.synced)
    assert.are.same({}, lines)
    assert.are.equal(H.json.null, sum.served.resourceclaims)
    assert.are.same({ "v1 404", "v1beta2 404", "v1beta1 404" }, lists(d))
    local w2 = start_watch(d, { "--resource", "resourceclaims", "--until-synced", "--seconds", "2" })
    finally(function() P.stop(w2.pid) end)
    local _, sum2 = finish(w2)
    assert.is_false(sum2.synced)
  end)

  it("returns to v1 at the next list once it is served, replacing the older version's objects", function()
    d = S.start {}
    S.namespace(d, "t1")
    claim(d, "v1", "new")
    claim(d, "v1beta1", "old")
    -- v1 is not served at first (a rule answering 404 to every v1 request)
    S.call(d, "POST", "/_double/fail", { path = "/apis/resource.k8s.io/v1/", status = 404, count = -1 })
    local w = start_watch(d, { "--resource", "resourceclaims", "--until-key", "resourceclaims:t1/new" })
    finally(function() P.stop(w.pid) end)
    assert(wait_watching(d, 1), "driver never watched: " .. (P.read(w.err) or ""))
    -- the upgrade: v1 is served, and the watch ends with 410 (a relist)
    S.call(d, "POST", "/_double/clear", {})
    S.call(d, "POST", "/_double/cut", { resource = "resourceclaims", mode = "expired" })
    local lines, sum = finish(w)
    assert.is_true(sum.reached)
    assert.are.same({}, sum.violations)
    assert.are.equal("resource.k8s.io/v1", sum.served.resourceclaims)
    assert.are.equal(1, #lines)
    assert.are.equal("t1/new", lines[1].key)
    assert.are.same({ ADDED = 2, DELETED = 1 }, sum.events)
  end)
end)
