-- deploy/ as a kustomize base and examples/overlay (decision 0032):
-- `kubectl kustomize` renders both; the base is exactly the manifests (no
-- object lost, none changed, deploy/optional/ left out); the overlay's
-- image, replicas and controller namespace reach every place they are
-- written (deploy/follow-namespace), the agent stays in cozy-gpu-agent; and
-- each render applies to the API server double.
local P = require "proc"
local core = H.core

local DOUBLE = H.build .. "/bin/kube-double"
local NS, AGENT_NS = "cozy-gpu", "cozy-gpu-agent"
local OVERLAY = "examples/overlay"
local OVERLAY_NS, OVERLAY_IMAGE, OVERLAY_REPLICAS = "gpu-system", "registry.example.com/gpu/cozygpu:1.2.3", 3

local function have(cmd) return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") end

local CLUSTER_SCOPED = { Namespace = true, ClusterRole = true, ClusterRoleBinding = true,
  CustomResourceDefinition = true, MutatingWebhookConfiguration = true, ValidatingWebhookConfiguration = true,
  ValidatingAdmissionPolicy = true, ValidatingAdmissionPolicyBinding = true }

local function id(o)
  return ("%s/%s/%s"):format(o.kind, o.metadata.namespace or "", o.metadata.name)
end

-- The objects of YAML files, by id.
local function load(files)
  local out, n = {}, 0
  for _, f in ipairs(files) do
    local docs, err = core.manifests(f)
    assert(docs, err)
    for _, d in ipairs(docs) do
      local o = d.object
      assert(not out[id(o)], "twice: " .. id(o))
      out[id(o)] = o
      n = n + 1
    end
  end
  return out, n
end

local function lines(cmd)
  local p = io.popen(cmd)
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

local function deep_equal(a, b, path)
  if type(a) ~= type(b) then return false, path end
  if type(a) ~= "table" then
    if a == b then return true end
    return false, path
  end
  for k, v in pairs(a) do
    local ok, where = deep_equal(v, b[k], path .. "." .. tostring(k))
    if not ok then return false, where end
  end
  for k in pairs(b) do
    if a[k] == nil then return false, path .. "." .. tostring(k) end
  end
  return true
end

-- Every string of an object, with where it is.
local function strings(v, path, out)
  if type(v) == "string" then
    out[#out + 1] = { path = path, value = v }
  elseif type(v) == "table" then
    for k, x in pairs(v) do strings(x, path .. "." .. tostring(k), out) end
  end
  return out
end

describe("kubectl kustomize", function()
  if not have("kubectl") then
    pending("kubectl not installed")
    return
  end

  local dir
  setup(function() dir = H.tmpdir() end)
  teardown(function() if dir then os.execute("rm -rf " .. H.q(dir)) end end)

  local function render(what)
    local f = ("%s/%s.yaml"):format(dir, what:gsub("[^%w]", "_"))
    local out, code = P.sh(("kubectl kustomize %s > %s 2>&1"):format(H.q(what), H.q(f)))
    assert.are.equal(0, code, out .. H.read(f))
    return load { f }
  end

  local function manifests()
    local files = lines("find deploy deploy/crds -maxdepth 1 -type f -name '*.yaml' ! -name kustomization.yaml | sort")
    return load(files)
  end

  describe("deploy/ (the base)", function()
    it("renders exactly the objects of the manifests, unchanged", function()
      local base, n = render("deploy/")
      local want, m = manifests()
      assert.are.equal(m, n)
      for k, o in pairs(want) do
        assert.is_truthy(base[k], "not rendered: " .. k)
        local ok, where = deep_equal(o, base[k], k)
        assert.is_true(ok, "changed by kustomize: " .. tostring(where))
      end
      for k in pairs(base) do assert.is_truthy(want[k], "rendered but in no manifest: " .. k) end
    end)

    it("lists every manifest of deploy/ and deploy/crds, and nothing of deploy/optional", function()
      local k = core.manifests("deploy/kustomization.yaml")[1].object
      local listed = {}
      for _, r in ipairs(k.resources) do listed["deploy/" .. r] = true end
      for _, f in ipairs(lines("find deploy deploy/crds -maxdepth 1 -type f -name '*.yaml' ! -name kustomization.yaml")) do
        assert.is_true(listed[f], f .. " is not in deploy/kustomization.yaml")
      end
      for r in pairs(listed) do assert.is_nil(r:match("^deploy/optional/"), r) end
    end)

    it("sets the image through images: under the name the manifests use", function()
      local k = core.manifests("deploy/kustomization.yaml")[1].object
      assert.are.equal("ghcr.io/cozystack/cozygpu", k.images[1].name)
      local base = render("deploy/")
      for _, key in ipairs { "Deployment/" .. NS .. "/cozygpu-controller", "DaemonSet/" .. AGENT_NS .. "/cozygpu-agent" } do
        local image = base[key].spec.template.spec.containers[1].image
        assert.matches("^ghcr%.io/cozystack/cozygpu:", image)
      end
    end)
  end)

  describe(OVERLAY, function()
    local base, over
    setup(function()
      base = render("deploy/")
      over = render(OVERLAY)
    end)

    local function get(kind, ns, name)
      local o = over[("%s/%s/%s"):format(kind, ns, name)]
      assert(o, ("no %s %s/%s in the overlay"):format(kind, ns, name))
      return o
    end

    it("keeps every object of the base, the controller's in the new namespace", function()
      local n = 0
      for k, o in pairs(base) do
        n = n + 1
        local ns = o.metadata.namespace
        if ns == NS then ns = OVERLAY_NS end
        local name = o.metadata.name
        if o.kind == "Namespace" and name == NS then name = OVERLAY_NS end
        assert.is_truthy(over[("%s/%s/%s"):format(o.kind, ns or "", name)], "lost: " .. k)
      end
      local m = 0
      for _ in pairs(over) do m = m + 1 end
      assert.are.equal(n, m)
    end)

    it("runs both containers from the overlay's image", function()
      assert.are.equal(OVERLAY_IMAGE,
        get("Deployment", OVERLAY_NS, "cozygpu-controller").spec.template.spec.containers[1].image)
      assert.are.equal(OVERLAY_IMAGE,
        get("DaemonSet", AGENT_NS, "cozygpu-agent").spec.template.spec.containers[1].image)
    end)

    it("sets the controller's replicas", function()
      assert.are.equal(OVERLAY_REPLICAS, get("Deployment", OVERLAY_NS, "cozygpu-controller").spec.replicas)
    end)

    it("puts every namespaced object in the new namespace, the agent's in cozy-gpu-agent", function()
      local agent, default = 0, 0
      for k, o in pairs(over) do
        if CLUSTER_SCOPED[o.kind] then
          assert.is_nil(o.metadata.namespace, k)
        elseif o.metadata.name == "cozygpu-controller-events" then
          -- the Events of cluster-scoped GPUClasses can only be in
          -- "default" (decision 0029): the grant stays there, for the
          -- controller's ServiceAccount in the new namespace
          default = default + 1
          assert.are.equal("default", o.metadata.namespace, k)
          if o.kind == "RoleBinding" then assert.are.equal(OVERLAY_NS, o.subjects[1].namespace, k) end
        elseif (o.metadata.labels or {})["app.kubernetes.io/component"] == "agent" then
          agent = agent + 1
          assert.are.equal(AGENT_NS, o.metadata.namespace, k)
        else
          assert.are.equal(OVERLAY_NS, o.metadata.namespace, k)
        end
      end
      assert.are.equal(4, agent) -- ServiceAccount, Role, RoleBinding, DaemonSet
      assert.are.equal(2, default) -- Role, RoleBinding
      assert.are.equal("restricted", get("Namespace", "", OVERLAY_NS).metadata.labels["pod-security.kubernetes.io/enforce"])
      assert.are.equal("privileged", get("Namespace", "", AGENT_NS).metadata.labels["pod-security.kubernetes.io/enforce"])
    end)

    it("leaves the old namespace written nowhere", function()
      for k, o in pairs(over) do
        for _, s in ipairs(strings(o, k, {})) do
          local rest = s.value:gsub(H.pat(AGENT_NS), "")
          assert.is_nil(rest:find(NS, 1, true), s.path .. ": " .. s.value)
        end
      end
    end)

    it("calls the webhooks in the new namespace and exempts it", function()
      local n = 0
      for _, kind in ipairs { "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration" } do
        local cfg = get(kind, "", "cozygpu")
        assert.are.equal(OVERLAY_NS .. "/cozygpu-webhook", cfg.metadata.annotations["cert-manager.io/inject-ca-from"])
        for _, w in ipairs(cfg.webhooks) do
          n = n + 1
          assert.are.equal(OVERLAY_NS, w.clientConfig.service.namespace, w.name)
          assert.are.equal("cozygpu-webhook", w.clientConfig.service.name, w.name)
          local exempt = w.namespaceSelector.matchExpressions[1]
          assert.are.equal("kubernetes.io/metadata.name", exempt.key)
          assert.are.equal("NotIn", exempt.operator)
          assert.are.same({ "kube-system", OVERLAY_NS }, exempt.values)
        end
      end
      assert.is_true(n >= 4)
    end)

    it("certifies the Service's names in the new namespace, from the Issuer there", function()
      local cert = get("Certificate", OVERLAY_NS, "cozygpu-webhook")
      assert.are.same({ "cozygpu-webhook." .. OVERLAY_NS .. ".svc", "cozygpu-webhook." .. OVERLAY_NS .. ".svc.cluster.local" },
        cert.spec.dnsNames)
      -- an Issuer is namespaced: the one named is looked up beside the Certificate
      assert.are.equal("Issuer", cert.spec.issuerRef.kind)
      get("Issuer", OVERLAY_NS, cert.spec.issuerRef.name)
      get("Issuer", OVERLAY_NS, get("Certificate", OVERLAY_NS, "cozygpu-ca").spec.issuerRef.name)
      get("Service", OVERLAY_NS, "cozygpu-webhook")
    end)

    it("binds the controller's ServiceAccount in the new namespace, the agent's in its own", function()
      for _, b in ipairs { get("ClusterRoleBinding", "", "cozygpu-controller"), get("RoleBinding", OVERLAY_NS, "cozygpu-controller") } do
        assert.are.same({ { kind = "ServiceAccount", name = "cozygpu-controller", namespace = OVERLAY_NS } }, b.subjects)
      end
      for _, b in ipairs { get("ClusterRoleBinding", "", "cozygpu-agent"), get("RoleBinding", AGENT_NS, "cozygpu-agent") } do
        assert.are.same({ { kind = "ServiceAccount", name = "cozygpu-agent", namespace = AGENT_NS } }, b.subjects)
      end
    end)

    it("lets the controller's ServiceAccount in the new namespace write the license copies", function()
      local vap = get("ValidatingAdmissionPolicy", "", "cozygpu-license-copies")
      local expr = vap.spec.matchConditions[1].expression
      assert.truthy(expr:find("'system:serviceaccount:" .. OVERLAY_NS .. ":cozygpu-controller'", 1, true), expr)
      -- the rest of the expression is the base's
      local was = base["ValidatingAdmissionPolicy//cozygpu-license-copies"].spec.matchConditions[1].expression
      assert.are.equal(was:gsub(":" .. H.pat(NS) .. ":", ":" .. OVERLAY_NS .. ":"), expr)
    end)

    it("narrows the Secret writes of the controller's ServiceAccount in the new namespace (decision 0035)", function()
      local vap = get("ValidatingAdmissionPolicy", "", "cozygpu-controller-secrets")
      local expr = vap.spec.matchConditions[1].expression
      assert.are.equal("request.userInfo.username == 'system:serviceaccount:" .. OVERLAY_NS .. ":cozygpu-controller'", expr)
      -- the rest of the policy is the base's
      local was = base["ValidatingAdmissionPolicy//cozygpu-controller-secrets"]
      assert.are.same(was.spec.validations, vap.spec.validations)
      assert.are.same(was.spec.variables, vap.spec.variables)
    end)

    it("requires licensed classes' token Secrets in the new namespace (decision 0035)", function()
      local vap = get("ValidatingAdmissionPolicy", "", "cozygpu-license-source")
      assert.are.same({ { name = "controllerNamespace", expression = "'" .. OVERLAY_NS .. "'" } }, vap.spec.variables)
      local was = base["ValidatingAdmissionPolicy//cozygpu-license-source"]
      assert.are.same(was.spec.validations, vap.spec.validations)
    end)

    it("tells the controller its namespace through the downward API", function()
      local c = get("Deployment", OVERLAY_NS, "cozygpu-controller").spec.template.spec.containers[1]
      local ns_arg
      for _, a in ipairs(c.args) do ns_arg = ns_arg or a:match("^%-%-namespace=(.*)$") end
      assert.are.equal("$(POD_NAMESPACE)", ns_arg)
      for _, e in ipairs(c.env) do
        if e.name == "POD_NAMESPACE" then
          assert.are.equal("metadata.namespace", e.valueFrom.fieldRef.fieldPath)
          return
        end
      end
      error("no POD_NAMESPACE")
    end)
  end)

  describe("an overlay adding deploy/monitoring and deploy/optional", function()
    it("renders the alerts, the dashboard ConfigMap and the NetworkPolicy in the renamed namespace", function()
      -- a hoster's overlay beside the repository, as the README says
      local ov = dir .. "/hoster"
      os.execute("mkdir -p " .. H.q(ov))
      local root = P.sh("pwd"):gsub("%s+$", "")
      local rel = ("../"):rep(select(2, ov:gsub("/", "")) ) .. root:sub(2)
      H.write(ov .. "/kustomization.yaml", table.concat({
        "apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization",
        "resources: [" .. rel .. "/deploy, " .. rel .. "/deploy/monitoring, " .. rel .. "/deploy/optional]",
        "patches:", "  - target: {kind: Namespace, name: cozy-gpu}", "    patch: |-", "      - op: replace",
        "        path: /metadata/name", "        value: hoster-gpu",
        "transformers: [" .. rel .. "/deploy/follow-namespace]", "" }, "\n"))
      local objs = render(ov)
      local seen = {}
      for _, o in pairs(objs) do
        local ns = o.metadata.namespace
        if ns then
          -- the Events grant stays in "default" (decision 0029)
          local events_grant = ns == "default" and o.metadata.name == "cozygpu-controller-events"
          assert.is_true(ns == "hoster-gpu" or ns == AGENT_NS or events_grant, id(o) .. " in " .. ns)
        end
        seen[o.kind] = seen[o.kind] or o
      end
      assert.are.equal("hoster-gpu", seen.PrometheusRule.metadata.namespace)
      assert.are.equal("hoster-gpu", seen.NetworkPolicy.metadata.namespace)
      local cm
      for _, o in pairs(objs) do
        if o.kind == "ConfigMap" and o.metadata.name == "cozygpu-dashboard" then cm = o end
      end
      assert(cm, "no dashboard ConfigMap")
      assert.are.equal("hoster-gpu", cm.metadata.namespace)
      assert.are.equal("1", cm.metadata.labels.grafana_dashboard)
      -- the dashboard itself, unchanged
      assert.are.equal(H.read("deploy/monitoring/cozygpu-dashboard.json"), cm.data["cozygpu-dashboard.json"])
    end)
  end)

  describe("kubectl apply -k against the API server double", function()
    if not io.open(DOUBLE, "rb") then
      pending(DOUBLE .. " not built (make kube-double)")
      return
    end

    -- A double of its own for each render: both have the same cluster-wide
    -- objects (CRDs, ClusterRoles, webhooks).
    local function apply(what)
      local d = H.tmpdir()
      local port_file = d .. "/port"
      local pid = P.spawn({ DOUBLE, "--address", "127.0.0.1", "--port", "0", "--port-file", port_file }, d .. "/double.log")
      local ok, out, code = pcall(function()
        local port = P.wait_until(function()
          local f = io.open(port_file, "r")
          if not f then return nil end
          local s = f:read("a")
          f:close()
          return tonumber(s:match("%d+"))
        end, 10)
        assert(port, "kube-double did not write its port")
        local kubectl = ("KUBECONFIG=/dev/null kubectl --cache-dir %s --server http://127.0.0.1:%d "):format(
          H.q(d .. "/kube-cache"), port)
        -- kube-apiserver makes the namespace "default" itself; the double starts empty
        H.write(d .. "/default-ns.json", '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"default"}}')
        local no, nc = P.sh(kubectl .. "create -f " .. H.q(d .. "/default-ns.json") .. " 2>&1")
        if nc ~= 0 then return no, nc end
        local o, c = P.sh(kubectl .. "apply -k " .. H.q(what) .. " 2>&1")
        if c ~= 0 then return o, c end
        local o2, c2 = P.sh(kubectl .. "get -n " .. (what == "deploy/" and NS or OVERLAY_NS) ..
          " deployment cozygpu-controller -o json 2>&1")
        return o .. "\n" .. o2, c2
      end)
      P.stop(pid, 2)
      os.execute("rm -rf " .. H.q(d))
      assert(ok, out)
      return out, code
    end

    it("applies the base", function()
      local out, code = apply("deploy/")
      assert.are.equal(0, code, out)
      assert.matches("namespace/" .. NS .. " created", out, 1, true)
      assert.matches("daemonset.apps/cozygpu-agent created", out, 1, true)
      assert.matches("certificate.cert-manager.io/cozygpu-webhook created", out, 1, true)
    end)

    it("applies the overlay", function()
      local out, code = apply(OVERLAY)
      assert.are.equal(0, code, out)
      assert.matches("namespace/" .. OVERLAY_NS .. " created", out, 1, true)
      assert.matches("validatingadmissionpolicy.admissionregistration.k8s.io/cozygpu-license-copies created", out, 1, true)
      assert.matches("validatingadmissionpolicy.admissionregistration.k8s.io/cozygpu-controller-secrets created", out, 1, true)
      assert.matches("validatingadmissionpolicy.admissionregistration.k8s.io/cozygpu-license-source created", out, 1, true)
      assert.matches('"image": "' .. H.pat(OVERLAY_IMAGE) .. '"', out)
    end)
  end)
end)
