--- On the API server double by design (docs/decisions/0034): a real server
--- cannot answer 5xx or 429 on demand.
--- The API client (core/kube/kube.c): retries with backoff on 5xx and 429
--- (Retry-After honoured), 409 returned to the caller, read-modify-write
--- with conflict retry, and TLS / bearer-token / client-certificate
--- authentication from kubeconfig and in-cluster settings, against the API
--- double. Rules: client-go rest/request.go (retry, Retry-After),
--- util/retry RetryOnConflict, rest.Config BearerTokenFile.
local P = require "proc"
local S = dofile("spec/kube/support.lua")
local json = H.json

local function request(args, env)
  local out, err, code = S.run(args, env)
  assert(code == 0, "driver failed: " .. err)
  return S.lines(out), err
end

--- The log entries of the double for `path` (exact path, no query).
local function log_for(d, method, path)
  local out = {}
  for _, e in ipairs(S.log(d)) do
    if e.method == method and e.path == path then out[#out + 1] = e end
  end
  return out
end

describe("kube client", function()
  local d
  before_each(function() d = S.start {} end)
  after_each(function() S.stop(d) end)

  it("retries 500 twice, then returns the 200", function()
    S.call(d, "POST", "/_double/fail", { path = "/api/v1/namespaces", count = 2, status = 500 })
    local r = request { "request", "--server", d.url, "--retries", "4", "--path", "/api/v1/namespaces" }
    assert.are.equal(1, #r)
    assert.are.equal(200, r[1].status)
    assert.are.equal("NamespaceList", r[1].body.kind)
    local seen = log_for(d, "GET", "/api/v1/namespaces")
    assert.are.same({ 500, 500, 200 }, { seen[1].status, seen[2].status, seen[3].status })
    assert.are.equal(3, #seen)
    assert.are.equal("cozygpu-kube-check/0.1.0", seen[1].userAgent)
  end)

  it("gives the last 5xx to the caller when retries run out", function()
    S.call(d, "POST", "/_double/fail", { path = "/api/v1/namespaces", count = 5, status = 503 })
    local r = request { "request", "--server", d.url, "--retries", "1", "--path", "/api/v1/namespaces" }
    assert.are.equal(503, r[1].status)
    assert.are.equal("Status", r[1].body.kind)
    assert.are.equal(2, #log_for(d, "GET", "/api/v1/namespaces"))
  end)

  it("waits the Retry-After of a 429 before retrying", function()
    S.call(d, "POST", "/_double/fail", { path = "/api/v1/nodes", count = 1, status = 429, retryAfter = 1 })
    local r = request { "request", "--server", d.url, "--retries", "3", "--path", "/api/v1/nodes" }
    assert.are.equal(200, r[1].status)
    assert(r[1].elapsed_ms >= 1000, "retried after " .. r[1].elapsed_ms .. " ms, Retry-After was 1 s")
    local seen = log_for(d, "GET", "/api/v1/nodes")
    assert.are.same({ 429, 200 }, { seen[1].status, seen[2].status })
  end)

  it("returns 409 AlreadyExists without retrying", function()
    local body = '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"dup"}}'
    local r = request { "request", "--server", d.url, "--retries", "4", "--method", "POST",
      "--path", "/api/v1/namespaces", "--body", body, "--count", "2" }
    assert.are.equal(201, r[1].status)
    assert.are.equal(409, r[2].status)
    assert.are.equal("AlreadyExists", r[2].body.reason)
    assert.are.equal(2, #log_for(d, "POST", "/api/v1/namespaces"))
  end)

  it("merge and JSON patches", function()
    S.namespace(d, "t1")
    S.call(d, "POST", "/api/v1/namespaces/t1/configmaps", '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"1"}}')
    local r = request { "request", "--server", d.url, "--method", "PATCH", "--path", "/api/v1/namespaces/t1/configmaps/c",
      "--content-type", "application/merge-patch+json", "--body", '{"data":{"b":"2"}}' }
    assert.are.equal(200, r[1].status)
    assert.are.same({ a = "1", b = "2" }, r[1].body.data)
    r = request { "request", "--server", d.url, "--method", "PATCH", "--path", "/api/v1/namespaces/t1/configmaps/c",
      "--content-type", "application/json-patch+json", "--body", '[{"op":"remove","path":"/data/a"}]' }
    assert.are.equal(200, r[1].status)
    assert.are.same({ b = "2" }, r[1].body.data)
  end)

  it("kube_update_retry re-reads and writes again after a 409 Conflict", function()
    S.namespace(d, "t1")
    S.call(d, "POST", "/api/v1/namespaces/t1/configmaps", '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}')
    local r = request { "update-retry", "--server", d.url, "--resource", "configmaps", "--ns", "t1", "--name", "c",
      "--label", "owner=cozygpu", "--interfere" }
    assert.is_nil(r[1].error)
    assert.are.equal(2, r[1].calls)
    assert.are.equal("cozygpu", r[1].object.metadata.labels.owner)
    assert.are.equal("1", r[1].object.metadata.annotations.interfered) -- the other writer's change kept
    local puts = log_for(d, "PUT", "/api/v1/namespaces/t1/configmaps/c")
    assert.are.same({ 200, 409, 200 }, { puts[1].status, puts[2].status, puts[3].status })
  end)

  it("kube_update_retry reports NotFound", function()
    local r = request { "update-retry", "--server", d.url, "--resource", "configmaps", "--ns", "t1", "--name", "nope", "--label", "a=b" }
    assert.matches("^GET configmaps t1/nope: 404: ", r[1].error)
    assert.are.equal(0, r[1].calls)
  end)

  it("a transport failure names the method and URL, after retrying", function()
    local port = P.free_port()
    local r = request { "request", "--server", "http://127.0.0.1:" .. port, "--retries", "2", "--path", "/version" }
    assert.matches("^GET http://127%.0%.0%.1:" .. port .. "/version: ", r[1].error)
    assert.are.equal("io error", r[1].result)
    -- two backoffs: 50..100 ms, then 100..200 ms
    assert(r[1].elapsed_ms >= 150, "no backoff: " .. r[1].elapsed_ms)
  end)
end)

describe("kube client over TLS", function()
  local dir, certs, other, client, d
  setup(function()
    dir = H.tmpdir()
    certs = P.certs(dir, { "localhost" }, "server")
    other = P.certs(dir, { "localhost" }, "other")
    client = P.certs(dir, { "client" }, "client")
  end)
  teardown(function() os.execute("rm -rf " .. P.q(dir)) end)
  after_each(function() S.stop(d); d = nil end)

  local function kubeconfig(cluster, user)
    local p = dir .. "/kubeconfig"
    H.write(p, ("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {%s}}]\nusers: [{name: u, user: {%s}}]\n")
      :format(cluster, user))
    return p
  end
  local function b64file(p) return (P.sh("base64 -w0 " .. P.q(p))) end

  it("tokenFile is re-read when it is rotated between requests", function()
    d = S.start({ "--tls-cert", certs.cert, "--tls-key", certs.key, "--token", "new-token" }, "https")
    H.write(dir .. "/token", "old-token\n")
    local kc = kubeconfig(("server: %q, certificate-authority: %s"):format(d.url, certs.ca), "tokenFile: token")
    local r = request { "request", "--kubeconfig", kc, "--path", "/api/v1/namespaces", "--count", "2",
      "--then-write", dir .. "/token", "new-token\n" }
    assert.are.equal(401, r[1].status)
    assert.are.equal(200, r[2].status)
  end)

  it("certificate-authority-data and a static token; a wrong CA fails the handshake; insecure-skip-tls-verify", function()
    d = S.start({ "--tls-cert", certs.cert, "--tls-key", certs.key, "--token", "t0k" }, "https")
    local r = request { "request", "--kubeconfig",
      kubeconfig(("server: %q, certificate-authority-data: %s"):format(d.url, b64file(certs.ca)), "token: t0k"),
      "--path", "/api/v1/namespaces" }
    assert.are.equal(200, r[1].status)
    r = request { "request", "--kubeconfig",
      kubeconfig(("server: %q, certificate-authority: %s"):format(d.url, other.ca), "token: t0k"),
      "--path", "/api/v1/namespaces" }
    assert.matches("^GET " .. d.url:gsub("%p", "%%%0") .. "/api/v1/namespaces: .*certificate", r[1].error)
    r = request { "request", "--kubeconfig",
      kubeconfig(("server: %q, insecure-skip-tls-verify: true"):format(d.url), "token: t0k"),
      "--path", "/api/v1/namespaces" }
    assert.are.equal(200, r[1].status)
  end)

  it("client certificate and key, as files and as -data", function()
    d = S.start({ "--tls-cert", certs.cert, "--tls-key", certs.key, "--client-ca", client.ca, "--token", "unused-token" }, "https")
    local cluster = ("server: %q, certificate-authority: %s"):format(d.url, certs.ca)
    local r = request { "request", "--kubeconfig", kubeconfig(cluster, ("client-certificate: %s, client-key: %s"):format(client.cert, client.key)),
      "--path", "/api/v1/namespaces" }
    assert.are.equal(200, r[1].status)
    r = request { "request", "--kubeconfig", kubeconfig(cluster, ("client-certificate-data: %s, client-key-data: %s"):format(b64file(client.cert), b64file(client.key))),
      "--path", "/api/v1/namespaces" }
    assert.are.equal(200, r[1].status)
    r = request { "request", "--kubeconfig", kubeconfig(cluster, ""), "--path", "/api/v1/namespaces" }
    assert.are.equal(401, r[1].status)
  end)

  it("in-cluster: service host/port, ca.crt, and the token re-read when kubelet rotates it", function()
    d = S.start({ "--tls-cert", certs.cert, "--tls-key", certs.key, "--token", "sa-2" }, "https")
    local root = dir .. "/sa"
    os.execute("mkdir -p " .. P.q(root) .. " && cp " .. P.q(certs.ca) .. " " .. P.q(root .. "/ca.crt"))
    H.write(root .. "/token", "sa-1")
    local r = request({ "request", "--in-cluster-root", root, "--path", "/api/v1/namespaces", "--count", "2",
      "--then-write", root .. "/token", "sa-2" }, "KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=" .. d.port)
    assert.are.equal(401, r[1].status)
    assert.are.equal(200, r[2].status)
  end)
end)
