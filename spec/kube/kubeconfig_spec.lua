--- kubeconfig and in-cluster configuration (core/kube/kubeconfig.c), through the
--- test driver `kube_check config`, which prints the resolved settings.
--- Expected values follow client-go tools/clientcmd (loader.go, client_config.go)
--- and rest/config.go InClusterConfig.
local P = require "proc"
local json = H.json

local DRIVER = H.build .. "/bin/kube_check"

local function b64(s)
  local out = P.sh("printf %s " .. P.q(s) .. " | base64 -w0")
  return out
end

--- Runs `kube_check config` with args and env; returns the decoded JSON (or
--- nil), stderr, exit code.
local function config(args, env)
  local parts = { DRIVER, "config" }
  for _, a in ipairs(args or {}) do parts[#parts + 1] = a end
  local q = {}
  for i, a in ipairs(parts) do q[i] = P.q(a) end
  local errf = os.tmpname()
  local out, code = P.sh(("env -u KUBECONFIG -u KUBERNETES_SERVICE_HOST -u KUBERNETES_SERVICE_PORT HOME=/nonexistent %s %s 2>%s")
    :format(env or "", table.concat(q, " "), P.q(errf)))
  local err = P.read(errf) or ""
  os.remove(errf)
  return out ~= "" and json.decode(out) or nil, err:gsub("\n$", ""), code
end

local CA = "-----BEGIN CERTIFICATE-----\nMIIBfake-ca\n-----END CERTIFICATE-----\n"
local CERT = "-----BEGIN CERTIFICATE-----\nMIIBfake-client\n-----END CERTIFICATE-----\n"
local KEY = "-----BEGIN EC PRIVATE KEY-----\nMHcfake-key\n-----END EC PRIVATE KEY-----\n"

describe("kubeconfig", function()
  local dir
  before_each(function()
    dir = H.tmpdir()
    H.write(dir .. "/ca.crt", CA)
    H.write(dir .. "/client.crt", CERT)
    H.write(dir .. "/client.key", KEY)
  end)
  after_each(function() os.execute("rm -rf " .. P.q(dir)) end)

  local function kc(text)
    local p = dir .. "/config"
    H.write(p, text)
    return p
  end

  local TWO = [[
apiVersion: v1
kind: Config
current-context: prod
contexts:
- name: prod
  context: {cluster: prod, user: admin}
- name: dev
  context: {cluster: dev, user: dev}
clusters:
- name: prod
  cluster:
    server: https://prod.example:6443
    certificate-authority-data: %s
- name: dev
  cluster:
    server: https://dev.example:6443/
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: prod-token
- name: dev
  user:
    tokenFile: tok
]]

  it("uses current-context: server, token and CA from -data", function()
    local p = kc(TWO:format(b64(CA)))
    local c, err, code = config { "--kubeconfig", p }
    assert.are.equal(0, code, err)
    assert.are.equal("https://prod.example:6443", c.server)
    assert.are.equal("prod-token", c.token)
    assert.are.equal(CA, c.ca)
    assert.is_false(c.insecure)
    assert.is_nil(c.tokenFile)
  end)

  it("--context picks another context; tokenFile relative to the file; trailing / dropped", function()
    local p = kc(TWO:format(b64(CA)))
    local c, err, code = config { "--kubeconfig", p, "--context", "dev" }
    assert.are.equal(0, code, err)
    assert.are.equal("https://dev.example:6443", c.server)
    assert.is_true(c.insecure)
    assert.is_nil(c.ca)
    assert.are.equal(dir .. "/tok", c.tokenFile)
  end)

  it("--server overrides the cluster's server (kubectl --server)", function()
    local c = config { "--kubeconfig", kc(TWO:format(b64(CA))), "--server", "http://127.0.0.1:1" }
    assert.are.equal("http://127.0.0.1:1", c.server)
  end)

  it("a server without a scheme means https", function()
    local c = config { "--kubeconfig", kc(TWO:format(b64(CA))), "--server", "10.0.0.1:6443" }
    assert.are.equal("https://10.0.0.1:6443", c.server)
  end)

  it("client certificate and key files, CA file, relative to the kubeconfig's directory", function()
    local p = kc([[
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://k:443", certificate-authority: ca.crt}}]
users: [{name: u, user: {client-certificate: client.crt, client-key: ]] .. dir .. [[/client.key}}]
]])
    local c, err, code = config { "--kubeconfig", p }
    assert.are.equal(0, code, err)
    assert.are.equal(CA, c.ca)
    assert.are.equal(CERT, c.cert)
    assert.are.equal(KEY, c.key)
  end)

  it("-data forms win over file forms", function()
    local p = kc(([[
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://k:443", certificate-authority: missing.crt, certificate-authority-data: %s}}]
users: [{name: u, user: {client-certificate: missing.crt, client-certificate-data: %s, client-key-data: %s}}]
]]):format(b64(CA), b64(CERT), b64(KEY)))
    local c, err, code = config { "--kubeconfig", p }
    assert.are.equal(0, code, err)
    assert.are.equal(CA, c.ca)
    assert.are.equal(CERT, c.cert)
    assert.are.equal(KEY, c.key)
  end)

  it("$KUBECONFIG lists files merged: the first to define a name wins", function()
    local a, b = dir .. "/a", dir .. "/b"
    H.write(a, [[
current-context: x
contexts: [{name: x, context: {cluster: k, user: u}}]
users: [{name: u, user: {token: from-a}}]
]])
    H.write(b, [[
current-context: ignored
clusters: [{name: k, cluster: {server: "https://from-b:443"}}]
users: [{name: u, user: {token: from-b}}]
]])
    local c, err, code = config({}, "KUBECONFIG=" .. P.q(a .. ":" .. dir .. "/absent:" .. b))
    assert.are.equal(0, code, err)
    assert.are.equal("https://from-b:443", c.server)
    assert.are.equal("from-a", c.token)
  end)

  describe("errors name the file and the field", function()
    local cases = {
      { "a missing client key file",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: \"https://k\"}}]\nusers: [{name: other, user: {}}, {name: u, user: {client-certificate: client.crt, client-key: x.key}}]\n",
        "%s: users[1].user.client-key: cannot read x.key: No such file or directory" },
      { "no current-context",
        "contexts: []\n", "%s: current-context is not set (and no context was given)" },
      { "an unknown context",
        "current-context: nope\ncontexts: [{name: c, context: {cluster: k}}]\n", "%s: contexts: no context named \"nope\"" },
      { "an unknown cluster",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n", "%s: clusters: no cluster named \"k\" (context \"c\")" },
      { "a cluster without server",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {insecure-skip-tls-verify: true}}]\n",
        "%s: clusters[0].cluster.server: missing" },
      { "bad base64",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {server: \"https://k\", certificate-authority-data: \"@@@\"}}]\n",
        "%s: clusters[0].cluster.certificate-authority-data: invalid base64" },
      { "CA data that is base64 but not PEM",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {server: \"https://k\", certificate-authority-data: \"aGVsbG8=\"}}]\n",
        "%s: clusters[0].cluster.certificate-authority-data: not PEM (no -----BEGIN line after base64)" },
      { "a certificate without a key",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: \"https://k\"}}]\nusers: [{name: u, user: {client-certificate: client.crt}}]\n",
        "%s: users[0].user: client-certificate given without client-key" },
      { "an exec plugin",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: \"https://k\"}}]\nusers: [{name: u, user: {exec: {command: aws}}}]\n",
        "%s: users[0].user.exec: not supported (use a token, tokenFile or client certificate)" },
      { "a token that is not a string",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: \"https://k\"}}]\nusers: [{name: u, user: {token: [1]}}]\n",
        "%s: users[0].user.token: must be a string" },
      { "insecure with a CA",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {server: \"https://k\", insecure-skip-tls-verify: true, certificate-authority: ca.crt}}]\n",
        "%s: clusters[0].cluster: certificate-authority and insecure-skip-tls-verify are exclusive" },
    }
    for _, case in ipairs(cases) do
      it(case[1], function()
        local p = kc(case[2])
        local c, err, code = config { "--kubeconfig", p }
        assert.is_nil(c)
        assert.are.equal(2, code)
        assert.are.equal(case[3]:format(p), err)
      end)
    end

    it("a YAML syntax error gives file, line and column", function()
      local p = kc("current-context: c\n\tbad: tab\n")
      local _, err, code = config { "--kubeconfig", p }
      assert.are.equal(2, code)
      assert.matches("^" .. p:gsub("%p", "%%%0") .. ":2:%d+: ", err)
    end)

    it("a missing explicit file", function()
      local _, err, code = config { "--kubeconfig", dir .. "/nope" }
      assert.are.equal(2, code)
      assert.are.equal(dir .. "/nope: cannot open: No such file or directory", err)
    end)
  end)

  describe("in-cluster", function()
    it("service host and port (IPv6 in brackets), token file and ca.crt from the root", function()
      H.write(dir .. "/token", "sa-token\n")
      local c, err, code = config({ "--in-cluster-root", dir },
        "KUBERNETES_SERVICE_HOST=fd00::1 KUBERNETES_SERVICE_PORT=443")
      assert.are.equal(0, code, err)
      assert.are.equal("https://[fd00::1]:443", c.server)
      assert.are.equal("in-cluster", c.source)
      assert.are.equal(dir .. "/token", c.tokenFile)
      assert.are.equal(CA, c.ca)
      c = config({ "--in-cluster-root", dir }, "KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443")
      assert.are.equal("https://10.96.0.1:443", c.server)
    end)

    it("a missing token is an error naming it", function()
      local _, err, code = config({ "--in-cluster-root", dir },
        "KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443")
      assert.are.equal(2, code)
      assert.are.equal("in-cluster: cannot read " .. dir .. "/token: No such file or directory", err)
    end)

    it("$KUBECONFIG wins over the in-cluster environment", function()
      H.write(dir .. "/token", "sa-token\n")
      local p = kc(TWO:format(b64(CA)))
      local c = config({ "--in-cluster-root", dir },
        "KUBECONFIG=" .. P.q(p) .. " KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443")
      assert.are.equal("https://prod.example:6443", c.server)
    end)
  end)
end)
