--- A real Kubernetes control plane for specs (cluster/cluster.sh: etcd,
--- kube-apiserver, kube-controller-manager, kube-scheduler built from
--- Kubernetes' own modules by `make cluster-bins`), with cozygpu deployed
--- as a hoster deploys it: `kubectl apply -k` of deploy/ (through
--- examples/without-cert-manager, the manifests' documented alternative to
--- cert-manager), the controller binary running as the
--- cozygpu-controller ServiceAccount with a token from the TokenRequest
--- API, and the webhooks called by the API server over TLS.
---
---   local K = require "kube_cluster"
---   local c = K.start()                 -- control plane, CRDs, examples
---   c:deploy { replicas = 2 }           -- cozygpu from deploy/, replicas as the SA
---   local out, err, code = c:kubectl { "get", "gpuclaims", "-A" }
---   c:stop()                            -- every process, whatever failed
---
--- Nothing here listens beyond 127.0.0.1: no kubelet or kube-proxy runs;
--- the webhooks' clientConfig is a URL on 127.0.0.1 (a test-only overlay
--- generated in the cluster's directory).
local P = require "proc"
local json = require "cozygpu.json"

local K = {}

K.bin_dir = os.getenv("COZYGPU_CLUSTER_BIN")
K.kubevirt_crds = os.getenv("COZYGPU_KUBEVIRT_CRDS")
K.kubectl_bin = K.bin_dir and (K.bin_dir .. "/kubectl") or "kubectl"

local build = os.getenv("COZYGPU_BUILD") or "build"
local cozygpu = build .. "/bin/cozygpu"
local repo = (P.sh("pwd"):gsub("%s+$", ""))

--- True when the control plane's binaries are built (`make test` builds
--- them first); else false and the reason, for a spec to fail with.
function K.available()
  if not K.bin_dir or K.bin_dir == "" then
    return false, "COZYGPU_CLUSTER_BIN is not set (run the specs through make test)"
  end
  for _, b in ipairs { "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl" } do
    local f = io.open(K.bin_dir .. "/" .. b, "rb")
    if not f then return false, K.bin_dir .. "/" .. b .. " is missing (make cluster-bins)" end
    f:close()
  end
  return true
end

local Cluster = {}
Cluster.__index = Cluster

-- the specs' helper (spec/support/helper.lua, preloaded by busted and by
-- cluster/up.lua): temporary folders and file writes
local tmpdir, write = H.tmpdir, H.write

local function b64file(path)
  local out = P.sh("base64 -w0 " .. P.q(path))
  return (out:gsub("%s+", ""))
end

--- Runs kubectl (the version built beside the control plane) with `args`
--- (a list). o = {kubeconfig (default: the admin's), stdin (text)}.
--- Returns stdout, stderr, exit code.
function Cluster:kubectl(args, o)
  o = o or {}
  local parts = { P.q(K.kubectl_bin), "--kubeconfig", P.q(o.kubeconfig or self.kubeconfig) }
  for _, a in ipairs(args) do parts[#parts + 1] = P.q(a) end
  local errf = os.tmpname()
  local cmd = table.concat(parts, " ") .. " 2>" .. P.q(errf)
  if o.stdin then
    local inf = os.tmpname()
    write(inf, o.stdin)
    cmd = cmd .. " <" .. P.q(inf)
  else
    cmd = cmd .. " </dev/null"
  end
  local out, code = P.sh("timeout 120 " .. cmd)
  local err = P.read(errf) or ""
  os.remove(errf)
  return out, err, code
end

--- kubectl that must succeed: returns stdout, raises with stderr.
function Cluster:must(args, o)
  local out, err, code = self:kubectl(args, o)
  if code ~= 0 then error(("kubectl %s: exit %s\n%s%s"):format(table.concat(args, " "), tostring(code), out, err), 2) end
  return out
end

--- An API request as the admin (system:masters). method, path, body (table
--- or string), content type. Returns status, decoded body (or the text).
function Cluster:request(method, path, body, content_type, o)
  o = o or {}
  local headers = { "Accept: application/json" }
  if body ~= nil then headers[#headers + 1] = "Content-Type: " .. (content_type or "application/json") end
  if o.token then headers[#headers + 1] = "Authorization: Bearer " .. o.token end
  local st, text = P.http {
    method = method, url = self.url .. path, cacert = self.pki .. "/ca.crt",
    cert = (not o.token) and (self.pki .. "/admin.crt") or nil,
    key = (not o.token) and (self.pki .. "/admin.key") or nil,
    body = body ~= nil and (type(body) == "string" and body or json.encode(body)) or nil,
    headers = headers, timeout = o.timeout or 30,
  }
  local ok, v = pcall(json.decode, text or "")
  return st, ok and v or text
end

-- list paths of the resources specs read whole (Double:state's names)
local LISTS = {
  gpuclaims = "/apis/cozystack.io/v1alpha1/gpuclaims",
  gpuclasses = "/apis/cozystack.io/v1alpha1/gpuclasses",
  gpunodes = "/apis/cozystack.io/v1alpha1/gpunodes",
  workloads = "/apis/cozystack.io/v1alpha1/workloads",
  workloadmonitors = "/apis/cozystack.io/v1alpha1/workloadmonitors",
  pods = "/api/v1/pods",
  nodes = "/api/v1/nodes",
  events = "/api/v1/events",
  secrets = "/api/v1/secrets",
  virtualmachineinstances = "/apis/kubevirt.io/v1/virtualmachineinstances",
  virtualmachines = "/apis/kubevirt.io/v1/virtualmachines",
  resourcequotas = "/api/v1/resourcequotas",
  namespaces = "/api/v1/namespaces",
}

--- Every object of `resource` (a plural name above) in every namespace, as
--- the API server lists it: {items = {...}}. Raises on a failed list.
function Cluster:state(resource)
  local path = assert(LISTS[resource], "state: unknown resource " .. tostring(resource))
  local st, v = self:request("GET", path)
  assert(st == 200, ("GET %s -> %s %s"):format(path, tostring(st), type(v) == "table" and json.encode(v) or tostring(v)))
  return v
end

--- GET one object; returns it (or nil) and the status.
function Cluster:get(path)
  local st, v = self:request("GET", path)
  return st == 200 and v or nil, st
end

--- Starts a control plane in a new directory (o.dir: that one; it stops
--- when this process ends unless o.keep), installs the CRDs cozygpu
--- reads (KubeVirt's generated ones, Cozystack's substitutes, cozygpu's)
--- and, unless o.examples == false, the examples (namespaces, classes, the
--- KubeVirt CR, quotas). o.cozystack_workloads == false leaves out
--- Cozystack's Workload and WorkloadMonitor CRDs
--- (cluster/crds/cozystack-workloads.yaml): a cluster without Cozystack's
--- usage-record types, as a plain KubeVirt cluster is. Raises with the
--- failing component's log.
function K.start(o)
  o = o or {}
  local ok, why = K.available()
  assert(ok, why)
  local c = setmetatable({ dir = o.dir or tmpdir(), replicas = {} }, Cluster)
  c.pki = c.dir .. "/pki"
  c.kubeconfig = c.dir .. "/admin.kubeconfig"
  local crd_list = { (assert(K.kubevirt_crds, "COZYGPU_KUBEVIRT_CRDS is not set")) }
  if o.cozystack_workloads == false then
    -- cluster/crds/ file by file, but for Cozystack's usage-record kinds
    for f in P.sh("ls cluster/crds"):gmatch("%S+") do
      if f ~= "cozystack-workloads.yaml" then crd_list[#crd_list + 1] = "cluster/crds/" .. f end
    end
  else
    crd_list[#crd_list + 1] = "cluster/crds/"
  end
  crd_list[#crd_list + 1] = "deploy/crds/"
  local crds = table.concat(crd_list, " ")
  -- tied to this process unless it is to outlive it (`make cluster`)
  local owner = o.keep and "" or ((P.read("/proc/self/stat") or ""):match("^(%d+)") or "")
  local out, code = P.sh(("COZYGPU_CLUSTER_BIN=%s COZYGPU_CLUSTER_CRDS=%s COZYGPU_CLUSTER_OWNER=%s cluster/cluster.sh up %s 2>&1")
    :format(P.q(K.bin_dir), P.q(crds), owner, P.q(c.dir)))
  if code ~= 0 then
    P.sh("cluster/cluster.sh down " .. P.q(c.dir))
    error("the control plane did not start:\n" .. out, 2)
  end
  c.url = "https://127.0.0.1:" .. (P.read(c.dir .. "/ports/apiserver") or ""):match("%d+")
  local ok2, err = pcall(function()
    if o.examples ~= false then
      c:must { "apply", "-f", "examples/cluster/namespaces.yaml", "-f", "deploy/00-namespace.yaml" }
      c:must { "apply", "-f", "examples/classes", "-f", "examples/cluster/kubevirt.yaml", "-f", "examples/cluster/quotas.yaml" }
    end
  end)
  if not ok2 then
    c:stop()
    error(err, 2)
  end
  return c
end

--- A kubeconfig (path) that authenticates as ServiceAccount ns/name with a
--- token from the TokenRequest API (valid 6 h, re-read from its file).
function Cluster:sa_kubeconfig(ns, name)
  local token = self:must { "create", "token", name, "-n", ns, "--duration", "6h" }
  local base = ("%s/sa-%s-%s"):format(self.dir, ns, name)
  write(base .. ".token", (token:gsub("%s+$", "")))
  write(base .. ".kubeconfig", ([[
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "%s", certificate-authority: "%s"}
users:
- name: %s
  user: {tokenFile: "%s"}
contexts:
- name: local
  context: {cluster: local, user: %s}
current-context: local
]]):format(self.url, self.pki .. "/ca.crt", name, base .. ".token", name))
  return base .. ".kubeconfig", base .. ".token"
end

-- the webhooks of deploy/50-webhooks.yaml: {kind = {name, ...}} in order
local function webhook_paths()
  local core = require "cozygpu.core"
  local docs = assert(core.yaml(P.read("deploy/50-webhooks.yaml")))
  local out = {}
  for _, d in ipairs(docs) do
    if type(d) == "table" and d.webhooks then
      out[d.kind] = {}
      for i, w in ipairs(d.webhooks) do out[d.kind][i] = w.clientConfig.service.path end
    end
  end
  return out
end

--- Deploys cozygpu from deploy/ and starts `o.replicas` (default 1)
--- controller replicas as the cozygpu-controller ServiceAccount.
--- o = {replicas, extra = {flags...}, config_edit = function(config.yaml
--- text) -> text (a hoster's edit of the settings ConfigMap)}. The webhooks'
--- clientConfig becomes https://127.0.0.1:<port><path> with the test CA as
--- caBundle (a generated overlay over examples/without-cert-manager): with
--- one replica, its port; with more, the port of the webhook Service's
--- stand-in (see `service`). The Deployment is scaled to 0 (no kubelet runs
--- its pods: the same binary runs here). Waits until every replica is ready,
--- the Service sends to each, and one holds the Lease.
function Cluster:deploy(o)
  o = o or {}
  local n = o.replicas or 1
  self.certs = P.certs(self.dir, { "cozygpu-webhook.cozy-gpu.svc" }, "webhook")
  local ports = {}
  for i = 1, n do ports[i] = P.free_port() end
  local target = n > 1 and P.free_port() or ports[1]
  local ca = b64file(self.certs.ca)
  local ov = self.dir .. "/overlay"
  assert(os.execute("mkdir -p " .. P.q(ov)))
  local lines = {
    "apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization",
    -- kustomize takes a base only by a relative path
    "resources:", "  - " .. P.sh(("realpath --relative-to=%s %s"):format(P.q(ov), P.q(repo .. "/examples/without-cert-manager"))):gsub("%s+$", ""),
    "replicas:", "  - name: cozygpu-controller", "    count: 0",
    "patches:",
  }
  for kind, paths in pairs(webhook_paths()) do
    lines[#lines + 1] = ("  - target: {kind: %s, name: cozygpu}"):format(kind)
    lines[#lines + 1] = "    patch: |-"
    for i, path in ipairs(paths) do
      lines[#lines + 1] = "      - op: replace"
      lines[#lines + 1] = ("        path: /webhooks/%d/clientConfig"):format(i - 1)
      lines[#lines + 1] = ('        value: {url: "https://127.0.0.1:%d%s", caBundle: "%s"}'):format(target, path, ca)
    end
  end
  write(ov .. "/kustomization.yaml", table.concat(lines, "\n") .. "\n")
  self:must { "-n", "cozy-gpu", "create", "secret", "tls", "cozygpu-webhook-tls",
    "--cert=" .. self.certs.cert, "--key=" .. self.certs.key }
  self:must { "apply", "-k", ov }
  -- a hoster's edit of the settings ConfigMap (o.config_edit: text -> text),
  -- made through the API server before the replicas start
  if o.config_edit then
    local cm = json.decode(self:must { "-n", "cozy-gpu", "get", "configmap", "cozygpu-config", "-o", "json" })
    cm.data["config.yaml"] = o.config_edit(cm.data["config.yaml"])
    self:must({ "replace", "-f", "-" }, { stdin = json.encode(cm) })
  end
  -- the settings the kubelet would mount: the ConfigMap's config.yaml
  self.config = self.dir .. "/config.yaml"
  write(self.config, self:must { "-n", "cozy-gpu", "get", "configmap", "cozygpu-config",
    "-o", "jsonpath={.data.config\\.yaml}" })
  self.controller_kubeconfig = self:sa_kubeconfig("cozy-gpu", "cozygpu-controller")
  for i = 1, n do
    self:start_controller { identity = "replica-" .. string.char(96 + i), port = ports[i], extra = o.extra }
  end
  for _, r in pairs(self.replicas) do
    assert(P.wait_until(function()
      return P.http { url = ("http://127.0.0.1:%d/readyz"):format(r.probe_port), timeout = 2 } == 200
    end, 60, 0.2), ("controller %s is not ready after 60 s; its log:\n%s"):format(r.identity, P.read(r.log) or ""))
  end
  if n > 1 then self:service(target) end
  assert(P.wait_until(function()
    local l = self:get("/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
    return l and l.spec and l.spec.holderIdentity
  end, 30, 0.2), "no replica took the Lease within 30 s")
end

--- A hoster's change of settings: edits config.yaml of the ConfigMap
--- cozygpu-config through the API server (edit: text -> text), then restarts
--- every replica on its port with the new file (as a rollout would), and
--- waits until each is ready (unless o.wait == false).
function Cluster:reconfigure(edit, o)
  local cm = json.decode(self:must { "-n", "cozy-gpu", "get", "configmap", "cozygpu-config", "-o", "json" })
  cm.data["config.yaml"] = edit(cm.data["config.yaml"])
  self:must({ "replace", "-f", "-" }, { stdin = json.encode(cm) })
  write(self.config, cm.data["config.yaml"])
  local old = self.replicas
  self.replicas = {}
  for id, r in pairs(old) do
    P.stop(r.pid, 10)
    local n = self:start_controller { identity = id, port = r.port, probe_port = r.probe_port, extra = r.extra }
    assert(o and o.wait == false or P.wait_until(function()
      return P.http { url = ("http://127.0.0.1:%d/readyz"):format(n.probe_port), timeout = 2 } == 200
    end, 60, 0.2), ("controller %s is not ready after 60 s; its log:\n%s"):format(id, P.read(n.log) or ""))
  end
end

--- The webhook Service's stand-in when more than one replica runs: no
--- kube-proxy runs here, so haproxy (Debian's) listens on 127.0.0.1:`port`
--- and passes each TCP connection (TLS untouched, as kube-proxy does) to
--- the replicas in turn, only to those whose /readyz answers 200 (a
--- Service's ready endpoints; checked every 500 ms). Waits until haproxy
--- counts every replica up (its stats page, CSV). Sets self.service_port.
function Cluster:service(port)
  local cfg = { "global", "  maxconn 4096", "defaults", "  mode tcp", "  timeout connect 2s",
    "  timeout client 60s", "  timeout server 60s", "frontend webhook", ("  bind 127.0.0.1:%d"):format(port),
    "  default_backend replicas", "backend replicas", "  balance roundrobin",
    "  option httpchk GET /readyz", "  http-check expect status 200" }
  local ids = {}
  for id in pairs(self.replicas) do ids[#ids + 1] = id end
  table.sort(ids)
  for _, id in ipairs(ids) do
    local r = self.replicas[id]
    cfg[#cfg + 1] = ("  server %s 127.0.0.1:%d check port %d inter 500ms fall 1 rise 1"):format(id, r.port, r.probe_port)
  end
  local stats = P.free_port()
  for _, l in ipairs { "listen stats", "  mode http", ("  bind 127.0.0.1:%d"):format(stats), "  stats enable",
    "  stats uri /stats" } do cfg[#cfg + 1] = l end
  write(self.dir .. "/haproxy.cfg", table.concat(cfg, "\n") .. "\n")
  local pid = P.spawn({ "haproxy", "-db", "-f", self.dir .. "/haproxy.cfg" }, self.dir .. "/haproxy.log")
  local f = assert(io.open(self.dir .. "/pids", "a"))
  f:write(("haproxy %d\n"):format(pid))
  f:close()
  self.service_pid, self.service_port = pid, port
  local up
  assert(P.wait_until(function()
    local _, out = P.http { url = ("http://127.0.0.1:%d/stats;csv"):format(stats), timeout = 2 }
    out = out or ""
    up = 0
    for line in out:gmatch("[^\n]+") do
      if line:match("^replicas,replica%-") and line:match(",UP,") then up = up + 1 end
    end
    return up == #ids
  end, 30, 0.2), ("haproxy counts %d of %d replicas up after 30 s; its log:\n%s"):format(up or 0, #ids,
    P.read(self.dir .. "/haproxy.log") or ""))
end

--- Starts one controller replica as the cozygpu-controller ServiceAccount,
--- flags as deploy/40-controller.yaml gives them (paths local). o =
--- {identity, port, probe_port (default: a free one), config (a settings
--- file; default the deployed config.yaml, self.config), extra (flags added
--- last: a repeated flag's last value wins)}. Returns the replica {pid,
--- port, probe_port, url, log, identity, cacert}.
function Cluster:start_controller(o)
  local id = o.identity
  local probe = o.probe_port or P.free_port()
  local log = ("%s/%s.log"):format(self.dir, id)
  local args = {
    cozygpu, "controller", "--kubeconfig", self.controller_kubeconfig,
    "--namespace", "cozy-gpu", "--identity", id, "--config", o.config or self.config,
    "--policies-configmap", "cozygpu-policies",
    "--tls-cert-file", self.certs.cert, "--tls-key-file", self.certs.key,
    "--address", "127.0.0.1", "--port", tostring(o.port), "--probe-port", tostring(probe),
    "--log-format", "json",
  }
  for _, a in ipairs(o.extra or {}) do args[#args + 1] = a end
  local env = os.getenv("COZYGPU_ASAN") == "1" and "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1" or nil
  local r = { identity = id, port = o.port, probe_port = probe, log = log, cacert = self.certs.ca,
    url = "https://127.0.0.1:" .. o.port, extra = o.extra, config = o.config }
  r.pid = P.spawn(args, log, env)
  self.replicas[id] = r
  -- cluster/cluster.sh down stops it too (a spec that fails before its
  -- teardown, `make cluster-down`)
  local f = assert(io.open(self.dir .. "/pids", "a"))
  f:write(("cozygpu-%s %d\n"):format(id, r.pid))
  f:close()
  return r
end

--- Points every cozygpu webhook's clientConfig URL at replica `identity`
--- (a JSON patch of both webhook configurations), as a Service sends the
--- API server's calls to the replicas still ready when one stops (no
--- kube-proxy runs here: a URL names one endpoint). The API server takes
--- the change from its watch a moment later, so a call made at once may
--- still go to the old endpoint.
function Cluster:target_webhooks(identity)
  local r = assert(self.replicas[identity], "target_webhooks: no replica " .. tostring(identity))
  for _, kind in ipairs { "mutatingwebhookconfiguration", "validatingwebhookconfiguration" } do
    local urls = self:must { "get", kind, "cozygpu", "-o", "jsonpath={range .webhooks[*]}{.clientConfig.url}{\"\\n\"}{end}" }
    local ops, i = {}, 0
    for url in urls:gmatch("[^\n]+") do
      ops[#ops + 1] = { op = "replace", path = ("/webhooks/%d/clientConfig/url"):format(i),
        value = (url:gsub("^https://127%.0%.0%.1:%d+", "https://127.0.0.1:" .. r.port)) }
      i = i + 1
    end
    assert(#ops > 0, "target_webhooks: " .. kind .. " cozygpu has no webhook URL")
    self:must { "patch", kind, "cozygpu", "--type=json", "-p", json.encode(ops) }
  end
end

--- Adds a Node named `name` that kube-scheduler can place pods on (no
--- kubelet: status set through the status subresource), with `labels`,
--- `taints` and `allocatable` (name -> quantity; cpu, memory and pods are
--- added), and condition Ready=True.
function Cluster:add_node(name, o)
  o = o or {}
  local labels = { ["kubernetes.io/hostname"] = name, ["kubernetes.io/os"] = "linux" }
  for k, v in pairs(o.labels or {}) do labels[k] = v end
  local st, v = self:request("POST", "/api/v1/nodes", { apiVersion = "v1", kind = "Node",
    metadata = { name = name, labels = labels }, spec = { taints = o.taints } })
  assert(st == 201, ("POST node %s -> %s %s"):format(name, tostring(st), json.encode(v)))
  local alloc = { cpu = "64", memory = "512Gi", pods = "110" }
  for k, q in pairs(o.allocatable or {}) do alloc[k] = q end
  local now = os.date("!%Y-%m-%dT%H:%M:%SZ")
  v.status = { capacity = alloc, allocatable = alloc, conditions = { { type = "Ready", status = "True",
    reason = "KubeletReady", message = "no kubelet: a test node", lastHeartbeatTime = now, lastTransitionTime = now } } }
  st, v = self:request("PUT", "/api/v1/nodes/" .. name .. "/status", v)
  assert(st == 200, ("PUT node %s status -> %s %s"):format(name, tostring(st), json.encode(v)))
  return v
end

--- Stops the controller replicas and the control plane, removing nothing of
--- the directory (its logs stay for a failed spec to show).
function Cluster:stop()
  for _, r in pairs(self.replicas) do P.stop(r.pid, 5) end
  self.replicas = {}
  P.sh("cluster/cluster.sh down " .. P.q(self.dir) .. " 2>&1")
end

--- The requests the API server refused as forbidden (403) to the product:
--- a list of lines (empty when none), from two sources, leaving out lines
--- that contain `except` (a plain string):
---  - the replicas' JSON logs (what the controller saw);
---  - the API server's audit log (cluster/cluster.sh logs every request of
---    the cozy-gpu ServiceAccounts), events with code 403 whose user agent
---    is cozygpu's (a spec probing with kubectl as a ServiceAccount is not
---    the product), each written as `audit: USER cannot VERB resource
---    \"RESOURCE\" ...` (quotes escaped as the JSON log has them) and
---    ending with the objectRef as JSON, so one `except` ("cannot list
---    resource \"x\"", "\"namespace\":\"ns\"") matches both sources.
--- The cluster specs run the controller and the agent as their
--- ServiceAccounts, so a missing RBAC verb shows here (decision 0035).
function Cluster:forbidden(except)
  local out = {}
  local function add(line)
    if not (except and line:find(except, 1, true)) then out[#out + 1] = line end
  end
  for _, r in pairs(self.replicas) do
    for line in (P.read(r.log) or ""):gmatch("[^\n]+") do
      if line:find('"status":403', 1, true) or line:find('"status":"403"', 1, true) then
        add(r.identity .. ": " .. line)
      end
    end
  end
  for _, ev in ipairs(self:audit(function(ev)
    return ev.responseStatus and ev.responseStatus.code == 403 and (ev.userAgent or ""):match("^cozygpu/")
      and ev.stage ~= "ResponseStarted"
  end)) do
    local o = ev.objectRef or {}
    add(('audit: %s cannot %s resource \\"%s%s\\" in %s name %s (%s) %s'):format(ev.user.username, ev.verb,
      o.resource or "?", o.subresource and ("/" .. o.subresource) or "", o.namespace or "(cluster)",
      o.name or "", ev.userAgent, json.encode(o)))
  end
  return out
end

function Cluster:log_tail(name, n)
  return P.sh(("tail -n %d %s 2>/dev/null"):format(n or 30, P.q(self.dir .. "/logs/" .. name .. ".log")))
end

--- A user of tenant namespace `ns` with Cozystack's tenant role at `level`
--- (view, use, admin or super-admin; default super-admin, the broadest a
--- tenant gets): cluster/cozystack-tenant-roles.yaml (Cozystack's
--- ClusterRoles, which aggregate cozygpu's deploy/15-tenant-roles.yaml)
--- and the RoleBindings Cozystack's tenant chart makes in `ns` (each level
--- bound to the groups <tenant>-<level or above> of `ns` and its
--- ancestors). The user is in group <ns>-<level>. Returns {name,
--- kubeconfig, kubectl = function(args, o) -> out, err, code}.
function Cluster:tenant_user(name, ns, level)
  level = level or "super-admin"
  self:must { "apply", "-f", "cluster/cozystack-tenant-roles.yaml" }
  local nsobj = json.decode(self:must { "get", "namespace", ns, "-o", "json" })
  local tenants = {}
  for l in pairs(nsobj.metadata.labels or {}) do
    local t = l:match("^tenant%.cozystack%.io/(.+)$")
    if t then tenants[#tenants + 1] = t end
  end
  table.sort(tenants)
  local levels = { "view", "use", "admin", "super-admin" }
  local docs = {}
  for i, l in ipairs(levels) do
    local subjects = {}
    for _, t in ipairs(tenants) do
      for j = i, #levels do
        subjects[#subjects + 1] = { kind = "Group", apiGroup = "rbac.authorization.k8s.io", name = t .. "-" .. levels[j] }
      end
    end
    docs[#docs + 1] = { apiVersion = "rbac.authorization.k8s.io/v1", kind = "RoleBinding",
      metadata = { name = "cozy:tenant:" .. l, namespace = ns }, subjects = subjects,
      roleRef = { apiGroup = "rbac.authorization.k8s.io", kind = "ClusterRole", name = "cozy:tenant:" .. l } }
  end
  self:must({ "apply", "-f", "-" }, { stdin = json.encode { apiVersion = "v1", kind = "List", items = docs } })
  local out = P.sh(("cluster/cluster.sh user %s %s %s 2>&1"):format(P.q(self.dir), P.q(name), P.q(ns .. "-" .. level)))
  local kc = out:match("(%S+%.kubeconfig)%s*$")
  assert(kc, "cluster.sh user: " .. out)
  local c = self
  local u = { name = name, kubeconfig = kc }
  function u.kubectl(args, o)
    o = o or {}
    o.kubeconfig = kc
    return c:kubectl(args, o)
  end
  -- the aggregated roles are filled in by the controller manager: wait
  -- until the user may order a claim
  assert(P.wait_until(function()
    local _, _, code = u.kubectl { "auth", "can-i", "get", "gpuclaims", "-n", ns }
    return code == 0
  end, 30, 0.2), ("user %s of %s: Cozystack's %s role did not aggregate cozygpu's within 30 s"):format(name, ns, level))
  return u
end

--- The API server's audit events (cluster/cluster.sh's audit policy: every
--- request of the cozy-gpu ServiceAccounts, and every write, at Metadata
--- level), oldest first,
--- for which `keep(event)` is true (all when nil). Each is the event as
--- kube-apiserver wrote it (audit.k8s.io/v1 Event: user.username,
--- userAgent, verb, objectRef{resource, subresource, namespace, name},
--- responseStatus.code, requestReceivedTimestamp).
function Cluster:audit(keep)
  local out = {}
  local f = io.open(self.dir .. "/logs/audit.log", "r")
  if not f then return out end
  for line in f:lines() do
    local ok, ev = pcall(json.decode, line)
    if ok and type(ev) == "table" and (not keep or keep(ev)) then out[#out + 1] = ev end
  end
  f:close()
  return out
end

--- The /metrics of controller replica `r` (a replica of self.replicas, or
--- its identity), parsed into {["name{labels}"] = number}; nil when the
--- replica does not answer 200.
function Cluster:metrics(r)
  if type(r) == "string" then r = self.replicas[r] end
  if not r then return nil end
  local st, body = P.http { url = r.url .. "/metrics", cacert = r.cacert, timeout = 5 }
  if st ~= 200 then return nil end
  return P.parse_metrics(body)
end

--- The identity of the controller replica holding the Lease (nil: none),
--- and that replica (nil when it is not one of self.replicas).
function Cluster:leader()
  local l = self:get("/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
  local id = l and l.spec and l.spec.holderIdentity
  return id, id and self.replicas[id]
end

--- Waits until the leader has applied every watch event of `resource`
--- (its plural: "nodes", "gpuclaims", ...) up to resourceVersion `rv` (a
--- write's metadata.resourceVersion, string or number): taken into the
--- binder's state, reconciled, and its writes sent
--- (cozygpu_binder_applied_resource_version, decision 0040). The
--- observable end of "the leader has seen this and done what it does",
--- instead of a fixed sleep. Returns true, or false after `timeout`
--- seconds (default 30).
function Cluster:wait_applied(resource, rv, timeout)
  rv = assert(tonumber(rv), "wait_applied: resourceVersion " .. tostring(rv))
  local key = ('cozygpu_binder_applied_resource_version{resource="%s"}'):format(resource)
  return P.wait_until(function()
    local _, r = self:leader()
    local m = r and self:metrics(r)
    return m and (m[key] or 0) >= rv
  end, timeout or 30) and true or false
end

--- kubectl `args` (a list, as for must: a write that prints the object,
--- such as apply, create, patch, label; `cordon` prints none: patch
--- spec.unschedulable instead) with `-o json` added, then wait_applied for
--- the object it returns; the object. `o` as for must. Raises when kubectl
--- fails or the leader does not apply it in `timeout` seconds.
function Cluster:write_applied(args, resource, o, timeout)
  local a = {}
  for i, v in ipairs(args) do a[i] = v end
  a[#a + 1] = "-o"; a[#a + 1] = "json"
  local out = self:must(a, o)
  local obj = json.decode(out)
  local rv = obj and obj.metadata and obj.metadata.resourceVersion
  assert(rv, "write_applied: no resourceVersion in " .. tostring(out))
  assert(self:wait_applied(resource, rv, timeout),
    ("the leader did not apply %s at resourceVersion %s"):format(resource, rv))
  return obj
end

--- The requests kube-apiserver has served, as its own metrics count them
--- (apiserver_request_total, read as the admin from /metrics): the sum
--- over the series whose labels equal every key of `labels` (e.g.
--- {group = "cozystack.io", resource = "gpuclasses"}); `verbs`, when given,
--- is a set of verbs to count ({PATCH = true, UPDATE = true}: kube-apiserver
--- names a PUT UPDATE, a server-side apply APPLY). The real server's
--- counterpart of the double's request log, no-op writes included.
function Cluster:apiserver_requests(labels, verbs)
  local st, text = self:request("GET", "/metrics", nil, nil, { timeout = 30 })
  assert(st == 200, ("GET /metrics -> %s"):format(tostring(st)))
  if type(text) ~= "string" then text = json.encode(text) end
  local n = 0
  for lb, val in text:gmatch("\napiserver_request_total(%b{})%s+(%S+)") do
    local l = {}
    for k, v in lb:gmatch('([%w_]+)="([^"]*)"') do l[k] = v end
    local ok = not verbs or verbs[l.verb]
    for k, v in pairs(labels or {}) do
      if l[k] ~= v then ok = false end
    end
    if ok then n = n + (tonumber(val) or 0) end
  end
  return n
end

--- Seconds since the epoch, with fractions, by the host's clock (the one
--- the API server's audit timestamps use).
function K.now() return tonumber((P.sh("date +%s.%N"))) end

--- Seconds since the epoch of an RFC 3339 time (an audit event's
--- requestReceivedTimestamp, a metadata timestamp); raises on anything else.
function K.epoch(t)
  local out = P.sh("date -d " .. P.q(t) .. " +%s.%N 2>/dev/null")
  return assert(tonumber(out), "not a time: " .. tostring(t))
end

--- The condition of `type` in obj.status.conditions (an object as the API
--- server returns it), or nil.
function K.condition(obj, type)
  for _, x in ipairs(obj and obj.status and obj.status.conditions or {}) do
    if x.type == type then return x end
  end
end

--- For a describe block of a spec: a control plane with cozygpu deployed,
--- started by the block's setup and stopped by its teardown, which then
--- fails when a controller replica's log shows a request refused as
--- forbidden (the controller runs as its ServiceAccount: a missing RBAC
--- verb shows there). Use: `local s = K.session {...}; setup(s.setup);
--- teardown(s.teardown)` (busted's setup and teardown exist only in the
--- spec file). o = {deploy = options of Cluster:deploy (default one
--- replica), forbidden_except = a string of a 403 a spec causes on
--- purpose, prepare = function(c), run after the deploy, start = options
--- of K.start}. Returns {setup, teardown, c (the cluster, once setup has
--- run)}.
function K.session(o)
  o = o or {}
  local s = {}
  function s.setup()
    s.c = K.start(o.start)
    s.c:deploy(o.deploy or { replicas = 1 })
    if o.prepare then o.prepare(s.c) end
  end
  --- After each case (`after_each(session.after_each)`): with
  --- o.invariants, the billing, budget, one-user and no-leak invariants
  --- (spec/support/invariants.lua) hold over everything the API server
  --- holds once the leader has caught up (20 s), else the case fails with
  --- the violations and the objects involved (decision 0036).
  function s.after_each()
    if not (o.invariants and s.c) then return end
    require("invariants").hold(s.c)
  end
  function s.teardown()
    local c = s.c
    local forbidden = c and c:forbidden(o.forbidden_except) or {}
    if c then c:stop() end
    P.stop_all()
    if #forbidden > 0 then
      error(("the API server refused %d request(s) of the controller as forbidden:\n%s")
        :format(#forbidden, table.concat(forbidden, "\n")), 0)
    end
  end
  return s
end

return K
