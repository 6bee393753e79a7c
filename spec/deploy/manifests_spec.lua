-- deploy/: every manifest parses (the C loader, kubectl's YAML rules), and
-- the objects say what DESIGN.md §2 and §4 ask: least-privilege
-- RBAC, fail-closed webhooks scoped away from kube-system, cozy-gpu and
-- pods without devices, two replicas with probes, settings that load.
-- What cannot be checked here (the CEL of matchConditions is not evaluated;
-- no API server admits these objects): docs/decisions/0006.
local core = H.core

local NS = "cozy-gpu"
-- The controller's webhook endpoints (core/server/webhook.h users).
local ENDPOINTS = { ["/validate/vmi"] = true, ["/mutate/vmi"] = true, ["/mutate/launcher"] = true,
  ["/validate/gpuclass"] = true, ["/validate/gpuclaim"] = true, ["/validate/pod"] = true }
-- The controller's per-review deadline: webhook_options.review_timeout_ms
-- defaults to 8000 (core/server/webhook.h); the Deployment passes no flag for it.
-- If one is added, read it here instead.
local DEFAULT_REVIEW_DEADLINE_MS = 8000

local function yaml_files(dir)
  local p = io.popen("find " .. H.q(dir) .. " -maxdepth 1 -type f \\( -name '*.yaml' -o -name '*.yml' -o -name '*.json' \\) ! -name kustomization.yaml | sort")
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

local objects, by_kind = {}, {}
local function load_all()
  for _, dir in ipairs { "deploy", "deploy/crds", "deploy/optional" } do
    for _, f in ipairs(yaml_files(dir)) do
      local docs, err = core.manifests(f)
      assert(docs, err)
      for _, d in ipairs(docs) do
        local o = d.object
        o.__file = f
        objects[#objects + 1] = o
        by_kind[o.kind] = by_kind[o.kind] or {}
        by_kind[o.kind][o.metadata.name] = o
      end
    end
  end
end
load_all()

local function get(kind, name)
  local o = by_kind[kind] and by_kind[kind][name]
  assert(o, ("no %s %s in deploy/"):format(kind, name))
  return o
end

local CLUSTER_SCOPED = { Namespace = true, ClusterRole = true, ClusterRoleBinding = true,
  CustomResourceDefinition = true, MutatingWebhookConfiguration = true, ValidatingWebhookConfiguration = true,
  ValidatingAdmissionPolicy = true, ValidatingAdmissionPolicyBinding = true }

local function deployment() return get("Deployment", "cozygpu-controller") end
local function container() return deployment().spec.template.spec.containers[1] end

-- --flag=value arguments of the controller container.
local function flags()
  local out = {}
  for _, a in ipairs(container().args) do
    local k, v = a:match("^%-%-([%w-]+)=(.*)$")
    if k then out[k] = v end
  end
  return out
end

local function webhooks()
  local out = {}
  for _, kind in ipairs { "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration" } do
    for _, cfg in pairs(by_kind[kind] or {}) do
      for _, w in ipairs(cfg.webhooks) do out[#out + 1] = { kind = kind, config = cfg, hook = w } end
    end
  end
  return out
end

local function labels_match(selector, labels)
  for k, v in pairs(selector.matchLabels or {}) do
    if labels[k] ~= v then return false end
  end
  return #(selector.matchExpressions or {}) == 0
end

describe("deploy/ manifests", function()
  it("parse, and each object has apiVersion, kind, a name and the right scope", function()
    assert.is_true(#objects >= 15)
    for _, o in ipairs(objects) do
      assert.is_string(o.apiVersion, o.__file)
      assert.is_string(o.kind, o.__file)
      assert.is_string(o.metadata.name, o.__file)
      if CLUSTER_SCOPED[o.kind] then
        assert.is_nil(o.metadata.namespace, o.__file .. ": " .. o.kind)
      else
        -- the node agent runs in its own namespace (deploy/60-agent.yaml)
        -- and the Events of cluster-scoped GPUClasses can only be in
        -- "default" (decision 0029): the controller's grant there
        local want = o.__file:match("60%-agent%.yaml$") and "cozy-gpu-agent"
          or o.metadata.name == "cozygpu-controller-events" and "default" or NS
        assert.are.equal(want, o.metadata.namespace, o.__file .. ": " .. o.kind .. " " .. o.metadata.name)
      end
    end
  end)

  it("are read by kubectl itself, object for object", function()
    if not os.execute("command -v kubectl >/dev/null 2>&1") then pending("kubectl not installed") return end
    for _, dir in ipairs { "deploy", "deploy/crds", "deploy/optional" } do
      for _, f in ipairs(yaml_files(dir)) do
        local p = io.popen("kubectl label --local -o name -f " .. H.q(f) .. " cozygpu-spec=read 2>&1; echo rc=$?")
        local out = p:read("a")
        p:close()
        assert.matches("rc=0\n$", out, 1, false)
        local theirs, ours = {}, {}
        for line in out:gmatch("[^\n]+") do
          if not line:match("^rc=") then theirs[#theirs + 1] = line:match("/(.*)$") end
        end
        for _, o in ipairs(objects) do
          if o.__file == f then ours[#ours + 1] = o.metadata.name end
        end
        assert.are.same(ours, theirs, f)
      end
    end
  end)

  it("hold the objects issue 3 item 8 lists", function()
    get("Namespace", NS)
    get("ServiceAccount", "cozygpu-controller")
    get("ClusterRole", "cozygpu-controller")
    get("ClusterRoleBinding", "cozygpu-controller")
    get("Role", "cozygpu-controller")
    get("RoleBinding", "cozygpu-controller")
    get("ConfigMap", "cozygpu-config")
    get("ConfigMap", "cozygpu-policies")
    get("Deployment", "cozygpu-controller")
    get("PodDisruptionBudget", "cozygpu-controller")
    get("Service", "cozygpu-webhook")
    get("NetworkPolicy", "cozygpu-webhook") -- optional (deploy/optional/)
    get("MutatingWebhookConfiguration", "cozygpu")
    get("ValidatingWebhookConfiguration", "cozygpu")
    get("Certificate", "cozygpu-webhook")
    get("CustomResourceDefinition", "gpuclasses.cozystack.io")
  end)
end)

describe("deploy/ settings ConfigMap", function()
  it("loads as settings (DESIGN.md §10) with the documented values", function()
    local cfg = assert(core.config("deploy/20-config.yaml"))
    assert.are.equal("Allowed", cfg.rawResourceNames)
    assert.are.same({}, cfg.gpuResourceNames)
    assert.are.same({ "gpu.nvidia.com", "vfio.gpu.nvidia.com", "mig.nvidia.com" }, cfg.gpuDeviceClasses)
    assert.are.equal("", cfg.virtControllerUser)
    assert.are.equal("tenant-root", cfg.tenantRoot)
    assert.are.same({ instructions = 10000000, memoryBytes = 67108864 }, cfg.policyBudget)
  end)

  it("is what `cozygpu review --config` reads (an unknown key added to it is an error)", function()
    local ok_out, ok_err, ok_code = H.run { "review", "--config", "deploy/20-config.yaml",
      "--cluster", "examples/classes", "--cluster", "examples/cluster", "examples/reviews/07-launcher-pod-l40s.json" }
    assert.are.equal(0, ok_code, ok_err)
    assert.are.equal(1, #H.json_lines(ok_out))
    local bad = os.tmpname()
    finally(function() os.remove(bad) end)
    H.write(bad, (H.read("deploy/20-config.yaml"):gsub("    tenantRoot:", "    colour: blue\n    tenantRoot:")))
    local _, err, code = H.run { "review", "--config", bad, "examples/reviews/07-launcher-pod-l40s.json" }
    assert.are.equal(2, code)
    assert.matches("unknown key \"colour\"", err, 1, true)
  end)
end)

describe("deploy/ RBAC", function()
  local function rules_of(kind, name) return get(kind, name).rules end

  it("has no wildcard and no non-resource URL", function()
    for _, kind in ipairs { "ClusterRole", "Role" } do
      for _, r in ipairs(rules_of(kind, "cozygpu-controller")) do
        assert.is_nil(r.nonResourceURLs)
        for _, field in ipairs { "apiGroups", "resources", "verbs", "resourceNames" } do
          for _, v in ipairs(r[field] or {}) do
            assert.is_nil(v:find("*", 1, true), ("%s %s: %s %q"):format(kind, "cozygpu-controller", field, v))
          end
        end
      end
    end
  end)

  -- {group/resource[@name] = sorted verbs} of a role
  local function grants(rules)
    local out = {}
    for _, r in ipairs(rules) do
      for _, g in ipairs(r.apiGroups) do
        for _, res in ipairs(r.resources) do
          local names = r.resourceNames or { "" }
          for _, n in ipairs(names) do
            local key = g .. "/" .. res .. (n ~= "" and ("@" .. n) or "")
            out[key] = out[key] or {}
            for _, v in ipairs(r.verbs) do out[key][#out[key] + 1] = v end
            table.sort(out[key])
          end
        end
      end
    end
    return out
  end

  it("grants the controller exactly what it reads and writes, cluster-wide", function()
    local read = { "get", "list", "watch" }
    assert.are.same({
      -- update: the class protection finalizer (decision 0037)
      ["cozystack.io/gpuclasses"] = { "get", "list", "update", "watch" },
      ["cozystack.io/gpuclaims"] = { "create", "delete", "get", "list", "update", "watch" },
      ["cozystack.io/gpunodes"] = read,
      ["cozystack.io/gpuclasses/status"] = { "patch", "update" },
      ["cozystack.io/gpuclaims/status"] = { "patch", "update" },
      ["/pods"] = { "get", "list", "patch", "update", "watch" },
      ["/namespaces"] = read,
      ["/nodes"] = read,
      ["/resourcequotas"] = read,
      -- license copies, written by name, never read (decision 0035)
      ["/secrets"] = { "create", "delete", "update" },
      ["/persistentvolumeclaims"] = read,
      ["/persistentvolumes"] = read,
      ["kubevirt.io/virtualmachineinstances"] = { "delete", "get", "list", "watch" },
      ["kubevirt.io/virtualmachines"] = read,
      ["kubevirt.io/kubevirts"] = read,
      ["resource.k8s.io/deviceclasses"] = read,
      ["resource.k8s.io/resourceclaims"] = read,
      ["resource.k8s.io/resourceclaimtemplates"] = read,
      -- usage records (decision 0028): the leader creates, updates and
      -- deletes them; patch as the issue asked, though nothing patches yet
      ["cozystack.io/workloads"] = { "create", "delete", "get", "list", "update", "watch" },
      ["cozystack.io/workloadmonitors"] = { "create", "delete", "get", "list", "update", "watch" },
    }, grants(rules_of("ClusterRole", "cozygpu-controller")))
  end)

  it("grants in cozy-gpu only the policies ConfigMap, the token Secrets, events and the Lease, by name where RBAC allows", function()
    assert.are.same({
      ["/configmaps@cozygpu-policies"] = { "get", "list", "watch" },
      ["/secrets"] = { "list", "watch" },
      ["/events"] = { "create", "patch" },
      ["coordination.k8s.io/leases"] = { "create" },
      ["coordination.k8s.io/leases@cozygpu-controller"] = { "get", "update" },
    }, grants(rules_of("Role", "cozygpu-controller")))
    assert.are.equal("cozygpu-policies", flags()["policies-configmap"])
  end)

  -- decision 0035: no read of Secrets beyond the
  -- controller's namespace, and no verb that answers with a Secret it
  -- could not read otherwise
  it("reads Secrets only in cozy-gpu: no get, list or watch of them cluster-wide, no patch, no wildcard", function()
    for _, kind in ipairs { "ClusterRole", "Role" } do
      for _, r in ipairs(rules_of(kind, "cozygpu-controller")) do
        local secrets = false
        for _, res in ipairs(r.resources) do secrets = secrets or res == "secrets" or res:find("^secrets/") ~= nil end
        if secrets then
          assert.are.same({ "" }, r.apiGroups)
          for _, v in ipairs(r.verbs) do
            assert.is_true(v ~= "patch" and v ~= "deletecollection" and v ~= "*", kind .. ": " .. v)
            if kind == "ClusterRole" then
              assert.is_true(v ~= "get" and v ~= "list" and v ~= "watch", kind .. ": " .. v)
            end
          end
        end
      end
    end
    -- the Role is bound in the controller's namespace only
    assert.are.equal(NS, get("Role", "cozygpu-controller").metadata.namespace)
    assert.are.equal(NS, get("RoleBinding", "cozygpu-controller").metadata.namespace)
  end)

  it("binds both roles to the controller's ServiceAccount, which the pods run as", function()
    for _, kind in ipairs { "ClusterRoleBinding", "RoleBinding" } do
      local b = get(kind, "cozygpu-controller")
      assert.are.equal(kind == "RoleBinding" and "Role" or "ClusterRole", b.roleRef.kind)
      assert.are.equal("cozygpu-controller", b.roleRef.name)
      assert.are.same({ { kind = "ServiceAccount", name = "cozygpu-controller", namespace = NS } }, b.subjects)
    end
    assert.are.equal("cozygpu-controller", deployment().spec.template.spec.serviceAccountName)
  end)
end)

describe("deploy/ license copies policy (decisions 0029, 0035)", function()
  it("refuses writes of Secrets carrying the copies' label or name, on create, update and delete, failing closed", function()
    local p = get("ValidatingAdmissionPolicy", "cozygpu-license-copies")
    assert.are.equal("Fail", p.spec.failurePolicy)
    assert.are.same({ { apiGroups = { "" }, apiVersions = { "v1" }, resources = { "secrets" },
      operations = { "CREATE", "UPDATE", "DELETE" } } }, p.spec.matchConstraints.resourceRules)
    -- which Secrets: a matchCondition (labels and the reserved name), not
    -- an objectSelector (it cannot select by name)
    assert.is_nil(p.spec.matchConstraints.objectSelector)
    assert.are.equal("a-copy-or-its-name", p.spec.matchConditions[2].name)
    assert.truthy(p.spec.matchConditions[2].expression:find("'gpu-license-'", 1, true))
    assert.are.same({ "false" }, (function()
      local out = {}
      for i, v in ipairs(p.spec.validations) do out[i] = v.expression end
      return out
    end)())
    -- the writer it lets through is the ServiceAccount the controller runs as
    local sa = get("ServiceAccount", deployment().spec.template.spec.serviceAccountName)
    local who = ("'system:serviceaccount:%s:%s'"):format(sa.metadata.namespace, sa.metadata.name)
    assert.truthy(p.spec.matchConditions[1].expression:find(who, 1, true), p.spec.matchConditions[1].expression)
    local b = get("ValidatingAdmissionPolicyBinding", "cozygpu-license-copies")
    assert.are.equal("cozygpu-license-copies", b.spec.policyName)
    assert.are.same({ "Deny" }, b.spec.validationActions)
  end)
end)

describe("deploy/ controller Secrets policy (decision 0035)", function()
  it("narrows the controller's Secret create, update and delete to the license copies, failing closed", function()
    local p = get("ValidatingAdmissionPolicy", "cozygpu-controller-secrets")
    assert.are.equal("Fail", p.spec.failurePolicy)
    -- exactly the verbs the ClusterRole grants on Secrets
    assert.are.same({ { apiGroups = { "" }, apiVersions = { "v1" }, resources = { "secrets" },
      operations = { "CREATE", "UPDATE", "DELETE" } } }, p.spec.matchConstraints.resourceRules)
    assert.is_nil(p.spec.matchConstraints.objectSelector)
    assert.is_nil(p.spec.matchConstraints.namespaceSelector)
    -- for the ServiceAccount the controller runs as, and no one else
    local sa = get("ServiceAccount", deployment().spec.template.spec.serviceAccountName)
    assert.are.same({ { name = "by-the-controller", expression = ("request.userInfo.username == 'system:serviceaccount:%s:%s'")
      :format(sa.metadata.namespace, sa.metadata.name) } }, p.spec.matchConditions)
    local v = {}
    for _, x in ipairs(p.spec.variables) do v[x.name] = x.expression end
    for _, want in ipairs { "'gpu-license-'", "'gpu.cozystack.io/license-class'", "'app.kubernetes.io/managed-by'",
      "'Opaque'", "object.immutable", "'client_configuration_token.tok'" } do
      assert.truthy(v.newIsCopy:find(want, 1, true), want)
    end
    assert.truthy(v.oldIsCopy:find("oldObject.metadata.name == 'gpu-license-'", 1, true), v.oldIsCopy)
    local e = {}
    for i, x in ipairs(p.spec.validations) do
      e[i] = x.expression
      assert.are.equal("Forbidden", x.reason)
    end
    assert.are.same({ "request.operation == 'DELETE' || variables.newIsCopy",
      "request.operation == 'CREATE' || variables.oldIsCopy" }, e)
    local b = get("ValidatingAdmissionPolicyBinding", "cozygpu-controller-secrets")
    assert.are.equal("cozygpu-controller-secrets", b.spec.policyName)
    assert.are.same({ "Deny" }, b.spec.validationActions)
  end)

  it("refuses a GPUClass whose license Secret is outside the controller's namespace", function()
    local p = get("ValidatingAdmissionPolicy", "cozygpu-license-source")
    assert.are.equal("Fail", p.spec.failurePolicy)
    assert.are.same({ { apiGroups = { "cozystack.io" }, apiVersions = { "v1alpha1" }, resources = { "gpuclasses" },
      operations = { "CREATE", "UPDATE" } } }, p.spec.matchConstraints.resourceRules)
    assert.are.same({ { name = "controllerNamespace", expression = "'" .. NS .. "'" } }, p.spec.variables)
    assert.are.equal(NS, get("ServiceAccount", deployment().spec.template.spec.serviceAccountName).metadata.namespace)
    assert.are.equal("Invalid", p.spec.validations[1].reason)
    local b = get("ValidatingAdmissionPolicyBinding", "cozygpu-license-source")
    assert.are.equal("cozygpu-license-source", b.spec.policyName)
    assert.are.same({ "Deny" }, b.spec.validationActions)
  end)
end)

describe("deploy/ controller Deployment", function()
  it("runs two replicas of `cozygpu controller` with the flags of issue 3", function()
    local d = deployment()
    assert.are.equal(2, d.spec.replicas)
    assert.are.equal("controller", container().args[1])
    local f = flags()
    assert.are.equal("$(POD_NAMESPACE)", f.namespace)
    assert.are.equal("$(POD_NAME)", f.identity)
    assert.are.equal("8443", f.port)
    assert.are.equal("json", f["log-format"])
    local env = {}
    for _, e in ipairs(container().env) do env[e.name] = e.valueFrom.fieldRef.fieldPath end
    assert.are.same({ POD_NAMESPACE = "metadata.namespace", POD_NAME = "metadata.name" }, env)
    assert.are.same(d.spec.selector.matchLabels, (function()
      local l = {}
      for k in pairs(d.spec.selector.matchLabels) do l[k] = d.spec.template.metadata.labels[k] end
      return l
    end)())
  end)

  -- the probes have their own listener and thread, so busy
  -- review workers never make a replica look dead
  it("probes /healthz and /readyz over HTTP on the probe port", function()
    local c = container()
    local port_by_name = {}
    for _, p in ipairs(c.ports) do port_by_name[p.name] = p.containerPort end
    assert.is_truthy(flags()["probe-port"])
    for probe, path in pairs { livenessProbe = "/healthz", readinessProbe = "/readyz" } do
      local g = c[probe].httpGet
      assert.are.equal(path, g.path, probe)
      assert.are.equal("HTTP", g.scheme, probe)
      local port = type(g.port) == "string" and port_by_name[g.port] or g.port
      assert.are.equal(tonumber(flags()["probe-port"]), port, probe)
    end
  end)

  it("has requests, a memory limit and a locked-down security context", function()
    local c = container()
    assert.is_not_nil(c.resources.requests.cpu)
    assert.is_not_nil(c.resources.requests.memory)
    assert.is_not_nil(c.resources.limits.memory)
    local pod = deployment().spec.template.spec
    assert.is_true(pod.securityContext.runAsNonRoot)
    assert.are.equal("RuntimeDefault", pod.securityContext.seccompProfile.type)
    assert.is_true(c.securityContext.readOnlyRootFilesystem)
    assert.is_false(c.securityContext.allowPrivilegeEscalation)
    assert.are.same({ "ALL" }, c.securityContext.capabilities.drop)
  end)

  it("mounts every file a flag names, and a writable /tmp", function()
    local pod = deployment().spec.template.spec
    local vols = {}
    for _, v in ipairs(pod.volumes) do vols[v.name] = v end
    local function source_of(path)
      for _, m in ipairs(container().volumeMounts) do
        local prefix = m.mountPath .. "/"
        if path:sub(1, #prefix) == prefix then
          local rel = path:sub(#prefix + 1)
          for _, s in ipairs(vols[m.name].projected.sources) do
            local src = s.configMap or s.secret
            for _, item in ipairs(src.items) do
              if item.path == rel then return s.configMap and "ConfigMap" or "Secret", src.name, item.key end
            end
          end
        end
      end
    end
    local f = flags()
    assert.are.same({ "ConfigMap", "cozygpu-config", "config.yaml" }, { source_of(f.config) })
    local cert = get("Certificate", "cozygpu-webhook")
    assert.are.same({ "Secret", cert.spec.secretName, "tls.crt" }, { source_of(f["tls-cert-file"]) })
    assert.are.same({ "Secret", cert.spec.secretName, "tls.key" }, { source_of(f["tls-key-file"]) })
    local tmp
    for _, m in ipairs(container().volumeMounts) do
      if m.mountPath == "/tmp" then tmp = vols[m.name] end
    end
    assert.is_table(tmp and tmp.emptyDir)
  end)

  it("has a PodDisruptionBudget of minAvailable 1 over its pods", function()
    local pdb = get("PodDisruptionBudget", "cozygpu-controller")
    assert.are.equal(1, pdb.spec.minAvailable)
    assert.is_true(labels_match(pdb.spec.selector, deployment().spec.template.metadata.labels))
  end)

  it("is behind the Service cozygpu-webhook, 443 to the webhook port", function()
    local svc = get("Service", "cozygpu-webhook")
    assert.is_true(labels_match({ matchLabels = svc.spec.selector }, deployment().spec.template.metadata.labels))
    assert.are.equal(1, #svc.spec.ports)
    local p = svc.spec.ports[1]
    assert.are.equal(443, p.port)
    local target
    for _, cp in ipairs(container().ports) do
      if cp.name == p.targetPort or cp.containerPort == p.targetPort then target = cp.containerPort end
    end
    assert.are.equal(tonumber(flags().port), target)
  end)
end)

describe("deploy/ webhooks", function()
  it("are one per controller endpoint, each path once", function()
    local seen = {}
    for _, w in ipairs(webhooks()) do
      local path = w.hook.clientConfig.service.path
      assert.is_true(ENDPOINTS[path] or false, "not a controller endpoint: " .. tostring(path))
      assert.is_nil(seen[path], "path twice: " .. path)
      seen[path] = true
      assert.are.equal(path:match("^/mutate/") and "MutatingWebhookConfiguration" or "ValidatingWebhookConfiguration",
        w.kind, path)
    end
    for path in pairs(ENDPOINTS) do assert.is_true(seen[path] or false, "no webhook for " .. path) end
  end)

  it("fail closed, have no side effects, speak v1 and time out after the controller's deadline", function()
    local deadline = DEFAULT_REVIEW_DEADLINE_MS
    local names = {}
    for _, w in ipairs(webhooks()) do
      local h = w.hook
      assert.are.equal("Fail", h.failurePolicy, h.name)
      assert.are.equal("None", h.sideEffects, h.name)
      assert.are.same({ "v1" }, h.admissionReviewVersions, h.name)
      assert.are.equal("Equivalent", h.matchPolicy, h.name)
      assert.is_true(h.timeoutSeconds <= 10, h.name)
      assert.is_true(h.timeoutSeconds * 1000 > deadline, h.name)
      -- a webhook name is a DNS subdomain of at least three segments
      assert.matches("^[a-z0-9-]+%.[a-z0-9-]+%.[a-z0-9.-]+$", h.name)
      assert.is_nil(names[h.name])
      names[h.name] = true
      if w.kind == "MutatingWebhookConfiguration" then
        assert.are.equal("IfNeeded", h.reinvocationPolicy, h.name)
      end
    end
  end)

  it("call the Service with a CA that cert-manager injects for the Service's DNS name", function()
    local svc = get("Service", "cozygpu-webhook")
    for _, w in ipairs(webhooks()) do
      local s = w.hook.clientConfig.service
      assert.are.same({ svc.metadata.name, NS, 443 }, { s.name, s.namespace, s.port })
      assert.is_nil(w.hook.clientConfig.caBundle, "caBundle is cainjector's: " .. w.hook.name)
      local from = w.config.metadata.annotations["cert-manager.io/inject-ca-from"]
      local ns, name = from:match("^([^/]+)/(.+)$")
      assert.are.equal(NS, ns)
      local cert = get("Certificate", name)
      local dns = {}
      for _, n in ipairs(cert.spec.dnsNames) do dns[n] = true end
      assert.is_true(dns[("%s.%s.svc"):format(svc.metadata.name, NS)] or false)
    end
  end)

  it("never see kube-system or cozy-gpu (namespaceSelector on kubernetes.io/metadata.name)", function()
    for _, w in ipairs(webhooks()) do
      local excluded = {}
      for _, e in ipairs(w.hook.namespaceSelector.matchExpressions) do
        if e.key == "kubernetes.io/metadata.name" and e.operator == "NotIn" then
          for _, v in ipairs(e.values) do excluded[v] = true end
        end
      end
      assert.is_true(excluded["kube-system"] or false, w.hook.name)
      assert.is_true(excluded[NS] or false, w.hook.name)
      assert.is_nil(w.hook.namespaceSelector.matchLabels, w.hook.name)
    end
  end)

  it("match only CREATE (and UPDATE for GPUClass and GPUClaim) of the resources they judge", function()
    local want = {
      ["/validate/vmi"] = { "kubevirt.io", "virtualmachineinstances", { "CREATE" } },
      ["/mutate/vmi"] = { "kubevirt.io", "virtualmachineinstances", { "CREATE" } },
      ["/mutate/launcher"] = { "", "pods", { "CREATE" } },
      ["/validate/gpuclass"] = { "cozystack.io", "gpuclasses", { "CREATE", "UPDATE" } },
      ["/validate/gpuclaim"] = { "cozystack.io", "gpuclaims", { "CREATE", "UPDATE" } },
      ["/validate/pod"] = { "", "pods", { "CREATE" } },
    }
    for _, w in ipairs(webhooks()) do
      local rules = w.hook.rules
      assert.are.equal(1, #rules, w.hook.name)
      local r = rules[1]
      local wt = want[w.hook.clientConfig.service.path]
      assert.are.same({ { wt[1] }, { wt[2] }, wt[3] }, { r.apiGroups, r.resources, r.operations }, w.hook.name)
    end
  end)

  it("select pods by label only for the launcher mutation", function()
    for _, w in ipairs(webhooks()) do
      local path = w.hook.clientConfig.service.path
      if path == "/mutate/launcher" then
        assert.are.same({ matchLabels = { ["kubevirt.io"] = "virt-launcher" } }, w.hook.objectSelector)
      else
        assert.is_nil(w.hook.objectSelector, path)
      end
    end
  end)

  -- The CEL is not evaluated here (no CEL implementation in the build; see
  -- docs/decisions/0006). What is checked: the expressions are strings,
  -- their names unique and valid, brackets balance, and the only free
  -- identifiers are the variables a webhook matchCondition has, less
  -- oldObject (null on CREATE) and authorizer.
  local CEL_WORDS = { has = true, size = true, exists = true, all = true, exists_one = true, map = true,
    filter = true, contains = true, startsWith = true, endsWith = true, ["true"] = true, ["false"] = true,
    null = true, ["in"] = true }
  local function free_identifiers(expr)
    local s = expr:gsub("'[^']*'", "''"):gsub('"[^"]*"', '""')
    local bound = {}
    for v in s:gmatch("exists%(%s*([%a_][%w_]*)%s*,") do bound[v] = true end
    for v in s:gmatch("all%(%s*([%a_][%w_]*)%s*,") do bound[v] = true end
    local free = {}
    -- each match is a whole identifier (greedy, and the scan resumes after
    -- it); one right after '.' is a field, not a variable
    for start, id in s:gmatch("()([%a_][%w_]*)") do
      if s:sub(start - 1, start - 1) ~= "." and not CEL_WORDS[id] and not bound[id] then free[id] = true end
    end
    return free, s
  end

  it("have matchConditions that are well-formed and use only `object` and `request`", function()
    local count = 0
    for _, w in ipairs(webhooks()) do
      local names = {}
      for _, mc in ipairs(w.hook.matchConditions or {}) do
        count = count + 1
        assert.is_string(mc.expression)
        -- a qualified name: alphanumeric at both ends, '-', '_', '.' inside
        assert.matches("^[A-Za-z0-9][-A-Za-z0-9_.]*$", mc.name)
        assert.matches("[A-Za-z0-9]$", mc.name)
        assert.is_true(#mc.name <= 63)
        assert.is_nil(names[mc.name])
        names[mc.name] = true
        local free, stripped = free_identifiers(mc.expression)
        for id in pairs(free) do
          assert.is_true(id == "object" or id == "request", ("%s: %s: free identifier %q"):format(w.hook.name, mc.name, id))
        end
        local depth = 0
        for ch in stripped:gmatch("[%(%)%[%]]") do
          depth = depth + ((ch == "(" or ch == "[") and 1 or -1)
          assert.is_true(depth >= 0, mc.name)
        end
        assert.are.equal(0, depth, mc.name)
      end
    end
    -- VMI validate and mutate, launcher mutate, pod validate
    assert.are.equal(4, count)
  end)

  it("scope the VMI and pod webhooks by matchConditions; GPUClass and GPUClaim need none", function()
    for _, w in ipairs(webhooks()) do
      local path = w.hook.clientConfig.service.path
      local mcs = w.hook.matchConditions or {}
      if path == "/validate/gpuclass" or path == "/validate/gpuclaim" then
        assert.are.equal(0, #mcs)
      else
        assert.are.equal(1, #mcs, path)
      end
    end
    -- the two VMI webhooks must send the same VMIs
    local vmi = {}
    for _, w in ipairs(webhooks()) do
      if w.hook.rules[1].resources[1] == "virtualmachineinstances" then vmi[#vmi + 1] = w.hook.matchConditions[1].expression end
    end
    assert.are.equal(2, #vmi)
    assert.are.equal(vmi[1], vmi[2])
  end)

  it("offer a NetworkPolicy that admits only the API server to the webhook port, refused until edited", function()
    local np = get("NetworkPolicy", "cozygpu-webhook")
    assert.matches("^deploy/optional/", np.__file) -- not applied by `kubectl apply -k deploy/`
    assert.is_true(labels_match(np.spec.podSelector, deployment().spec.template.metadata.labels))
    assert.are.same({ "Ingress" }, np.spec.policyTypes)
    assert.are.equal(1, #np.spec.ingress)
    local rule = np.spec.ingress[1]
    assert.are.same({ { protocol = "TCP", port = tonumber(flags().port) } }, rule.ports)
    assert.are.equal(1, #rule.from)
    -- a placeholder the API server refuses (not a CIDR), so an unedited
    -- copy cannot shut the API server out
    local cidr = rule.from[1].ipBlock.cidr
    assert.is_nil(cidr:match("^[%x:.]+/%d+$"), cidr)
    assert.matches("API%-SERVER", cidr)
    for _, word in ipairs { "konnectivity", "kube-apiserver", "policy-cidr-match-mode", "metrics" } do
      assert.matches(word, H.read(np.__file), 1, true)
    end
  end)
end)
