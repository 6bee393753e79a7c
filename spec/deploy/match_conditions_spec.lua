-- The webhooks' matchConditions, evaluated on real and built objects with
-- @bufbuild/cel (spec/deploy/cel-eval.js) when node and that package are
-- present (build/cel/node_modules, or COZYGPU_CEL_MODULES); pending
-- otherwise. It is a conformance-tested CEL implementation, not the API
-- server's cel-go with Kubernetes' libraries and cost limits: what it shows
-- is which objects the expressions send, and that none of them errors
-- (an error rejects the request under failurePolicy Fail). See
-- docs/decisions/0006.
local json = H.json
local core = H.core

local MODULES = os.getenv("COZYGPU_CEL_MODULES") or (H.build .. "/cel/node_modules")

local function available()
  local ok = os.execute("command -v node >/dev/null 2>&1")
  local f = io.open(MODULES .. "/@bufbuild/cel/package.json", "r")
  if f then f:close() end
  return ok and f ~= nil
end

-- Evaluates expression over each object; returns a list of {value=} or {error=}.
local function eval(expression, objects)
  local cases = json.array()
  for i, o in ipairs(objects) do
    cases[i] = { expression = expression, object = o, request = { operation = "CREATE" } }
  end
  local inf, outf = os.tmpname(), os.tmpname()
  H.write(inf, json.encode({ cases = cases }))
  local ok = os.execute(("env -u LD_PRELOAD NODE_PATH=%s node spec/deploy/cel-eval.js <%s >%s"):format(H.q(MODULES), inf, outf))
  local out = H.read(outf)
  os.remove(inf) os.remove(outf)
  assert(ok, "cel-eval.js failed")
  return H.json_lines(out)
end

local function condition(path)
  for _, f in ipairs { "deploy/50-webhooks.yaml" } do
    for _, d in ipairs(assert(core.manifests(f))) do
      for _, w in ipairs(d.object.webhooks or {}) do
        if w.clientConfig.service.path == path then return w.matchConditions[1].expression end
      end
    end
  end
  error("no webhook for " .. path)
end

local function object_of(path)
  local o = assert(core.manifests(path))[1].object
  if o.kind == "AdmissionReview" then return o.request.object end
  return o
end

local function pod(containers, extra)
  local p = { apiVersion = "v1", kind = "Pod", metadata = { name = "p", namespace = "tenant-a" },
    spec = { containers = json.array(containers) } }
  for k, v in pairs(extra or {}) do p.spec[k] = v end
  return p
end

local function run_table(path, cases)
  local expr = condition(path)
  local objs, names = {}, {}
  for i, c in ipairs(cases) do objs[i] = c[2] names[i] = c[1] end
  local res = eval(expr, objs)
  assert.are.equal(#cases, #res)
  for i, c in ipairs(cases) do
    assert.is_nil(res[i].error, names[i] .. ": " .. tostring(res[i].error))
    assert.are.equal(c[3], res[i].value, names[i])
  end
end

describe("matchConditions (evaluated with @bufbuild/cel)", function()
  if not available() then
    pending("node or @bufbuild/cel missing (npm install --prefix " .. H.build .. "/cel @bufbuild/cel@0.6.1)")
    return
  end
  local F = H.fixtures

  it("pods: sent when they request a device other than KubeVirt's own, never an error", function()
    local gpu = { ["nvidia.com/AD102GL_L40S"] = "1" }
    run_table("/mutate/launcher", {
      { "recorded virt-launcher pod without GPU (kvm, tun, vhost-net)", object_of(F .. "/kubevirt/harvester/virt-launcher-pod-vm2.json"), false },
      { "recorded launcher pod with an L40S", object_of("examples/reviews/07-launcher-pod-l40s.json"), true },
      { "built launcher with a GPU", H.launcher("vm1", gpu), true },
      { "recorded pod create (member-operator)", object_of(F .. "/admission/member-operator/admissionreview-pod-create.json"), false },
      { "recorded pod create (gatekeeper, server defaults)", (function()
        local r = json.decode(H.read(F .. "/admission/recorded/gatekeeper-input-review-pod-create-dryrun.json"))
        return r.object or r.request.object
      end)(), false },
      { "cpu and memory only", pod { { name = "c", resources = { limits = { cpu = "1", memory = "1Gi" } } } }, false },
      { "no resources field", pod { { name = "c" } }, false },
      { "empty resources", pod { { name = "c", resources = json.object() } }, false },
      { "hugepages", pod { { name = "c", resources = { limits = { ["hugepages-2Mi"] = "1Gi" } } } }, false },
      { "GPU in requests only", pod { { name = "c", resources = { requests = { ["nvidia.com/gpu"] = "1" } } } }, true },
      { "GPU in the second container", pod { { name = "a" }, { name = "b", resources = { limits = gpu } } }, true },
      { "GPU in an init container", pod({ { name = "c" } }, { initContainers = json.array { { name = "i", resources = { limits = gpu } } } }), true },
      { "a NIC VF under nvidia.com/ (sent, then allowed)", pod { { name = "c", resources = { limits = { ["nvidia.com/cx7_vf"] = "1" } } } }, true },
      { "a DRA claim", pod({ { name = "c" } }, { resourceClaims = json.array { { name = "gpu", resourceClaimName = "x" } } }), true },
      { "an empty resourceClaims list", pod({ { name = "c" } }, { resourceClaims = json.array() }), false },
      { "resources.claims only", pod { { name = "c", resources = { claims = json.array { { name = "gpu" } } } } }, false },
    })
  end)

  it("VMIs: sent when they have gpus, hostDevices, an extended resource or the claims annotation, never an error", function()
    run_table("/validate/vmi", {
      { "examples 01 (L40S and a NIC VF)", object_of("examples/reviews/01-vmi-l40s-and-connectx-vf.yaml"), true },
      { "examples 02", object_of("examples/reviews/02-vmi-two-vgpu-classes.yaml"), true },
      { "examples 06 (licensed vGPU)", object_of("examples/reviews/06-vmi-vgpu-licensed.yaml"), true },
      { "KubeVirt vmi-gpu", object_of(F .. "/kubevirt/kubevirt-examples/vmi-gpu.yaml"), true },
      { "KubeVirt DRA vmi", object_of(F .. "/kubevirt/kubevirt-examples/vmi-dra-pgpu.yaml"), true },
      { "KubeVirt USB host device (sent: any host device may be a GPU)", object_of(F .. "/kubevirt/kubevirt-examples/vmi-usb.yaml"), true },
      { "KubeVirt SR-IOV NIC VMI (no GPU)", object_of(F .. "/kubevirt/kubevirt-examples/vmi-sriov.yaml"), false },
      { "recorded running VMI without GPU", object_of(F .. "/kubevirt/harvester/vmi-vm2-running-with-status.json"), false },
      { "built VMI without devices", H.vmi {}, false },
      { "GPU as a domain resource", H.vmi { resources = { ["nvidia.com/GA102GL_A10"] = "1" } }, true },
      { "cpu and memory resources", H.vmi { resources = { cpu = "2", memory = "4Gi" } }, false },
      { "hostDevices", H.vmi { hostDevices = { "nvidia.com/L40S-24Q" } }, true },
      { "no spec", { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", metadata = { name = "x" } }, false },
      { "empty gpus list", (function()
        local v = H.vmi {}
        v.spec.domain.devices.gpus = json.array()
        return v
      end)(), false },
      -- a VMI naming GPUClaims is GPU business even without GPU entries
      -- (refused then: decision 0019), whatever the annotation's value
      { "claims annotation, no devices", (function()
        local v = H.vmi {}
        v.metadata.annotations = { ["gpu.cozystack.io/claims"] = "train" }
        return v
      end)(), true },
      { "empty claims annotation, no spec", { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
        metadata = { name = "x", annotations = { ["gpu.cozystack.io/claims"] = "" } } }, true },
      { "other annotations only", (function()
        local v = H.vmi {}
        v.metadata.annotations = { ["gpu.cozystack.io/classes"] = "l40s=1" }
        return v
      end)(), false },
      { "empty annotations map", (function()
        local v = H.vmi {}
        v.metadata.annotations = json.object()
        return v
      end)(), false },
      -- a DRA claim no device names still reaches the launcher pod
      -- (KubeVirt adds every spec.resourceClaims entry to it)
      { "DRA claims only, no devices", (function()
        local v = H.vmi {}
        v.spec.resourceClaims = { { name = "gpu", resourceClaimName = "a-gpu" } }
        return v
      end)(), true },
      { "empty resourceClaims list", (function()
        local v = H.vmi {}
        v.spec.resourceClaims = json.array()
        return v
      end)(), false },
    })
    assert.are.equal(condition("/validate/vmi"), condition("/mutate/vmi"))
  end)
end)

-- The license copies' ValidatingAdmissionPolicy (deploy/55-license-copies-
-- policy.yaml, decision 0029): its matchCondition decides who is refused,
-- from request.userInfo alone.
describe("the license copies' ValidatingAdmissionPolicy (evaluated with @bufbuild/cel)", function()
  if not available() then
    pending("node or @bufbuild/cel missing (npm install --prefix " .. H.build .. "/cel @bufbuild/cel@0.6.1)")
    return
  end

  local function policy_condition()
    for _, d in ipairs(assert(core.manifests("deploy/55-license-copies-policy.yaml"))) do
      if d.object.kind == "ValidatingAdmissionPolicy" then return d.object.spec.matchConditions[1].expression end
    end
    error("no ValidatingAdmissionPolicy")
  end

  it("refuses tenants, and lets the controller, the collector, the namespace controller and system:masters through", function()
    local expr = policy_condition()
    local cases = {
      { "a tenant admin", { username = "alice", groups = json.array { "system:authenticated", "tenant-a-admins" } }, true },
      { "a tenant's ServiceAccount", { username = "system:serviceaccount:tenant-a:default" }, true },
      { "another cozy-gpu ServiceAccount", { username = "system:serviceaccount:cozy-gpu:default" }, true },
      { "the controller", { username = "system:serviceaccount:cozy-gpu:cozygpu-controller" }, false },
      { "the garbage collector", { username = "system:serviceaccount:kube-system:generic-garbage-collector" }, false },
      { "the namespace controller", { username = "system:serviceaccount:kube-system:namespace-controller" }, false },
      { "kube-controller-manager's own identity", { username = "system:kube-controller-manager" }, false },
      { "a cluster admin", { username = "kubernetes-admin", groups = json.array { "system:masters" } }, false },
    }
    local input = json.array()
    for i, c in ipairs(cases) do
      input[i] = { expression = expr, object = json.object(), request = { operation = "UPDATE", userInfo = c[2] } }
    end
    local inf, outf = os.tmpname(), os.tmpname()
    H.write(inf, json.encode({ cases = input }))
    local ok = os.execute(("env -u LD_PRELOAD NODE_PATH=%s node spec/deploy/cel-eval.js <%s >%s"):format(H.q(MODULES), inf, outf))
    local res = H.json_lines(H.read(outf))
    os.remove(inf) os.remove(outf)
    assert(ok, "cel-eval.js failed")
    for i, c in ipairs(cases) do
      assert.is_nil(res[i].error, c[1] .. ": " .. tostring(res[i].error))
      assert.are.equal(c[3], res[i].value, c[1])
    end
  end)
end)

-- The license policies of decision 0035, evaluated as the API server runs a
-- ValidatingAdmissionPolicy: its matchConditions (all true, or the policy
-- is skipped), then its variables, then each validation (false refuses).
-- An error anywhere would refuse the request (failurePolicy Fail), so every
-- case also asserts that nothing errs.
describe("the license policies of decision 0035 (evaluated with @bufbuild/cel)", function()
  if not available() then
    pending("node or @bufbuild/cel missing (npm install --prefix " .. H.build .. "/cel @bufbuild/cel@0.6.1)")
    return
  end

  local function policy(file)
    for _, d in ipairs(assert(core.manifests(file))) do
      if d.object.kind == "ValidatingAdmissionPolicy" then return d.object.spec end
    end
    error("no ValidatingAdmissionPolicy in " .. file)
  end

  local function run_cases(cases)
    local inf, outf = os.tmpname(), os.tmpname()
    H.write(inf, json.encode({ cases = cases }))
    local ok = os.execute(("env -u LD_PRELOAD NODE_PATH=%s node spec/deploy/cel-eval.js <%s >%s"):format(H.q(MODULES), inf, outf))
    local res = H.json_lines(H.read(outf))
    os.remove(inf) os.remove(outf)
    assert(ok, "cel-eval.js failed")
    return res
  end

  -- "skipped", "allowed", or "refused: <message>"; raises on a CEL error
  local function admit(spec, req, what)
    local base = { object = req.object or json.null, oldObject = req.oldObject or json.null,
      request = { operation = req.operation, userInfo = req.userInfo or { username = "alice" } } }
    local function one(expression, variables)
      local c = { expression = expression, object = base.object, oldObject = base.oldObject, request = base.request,
        variables = variables }
      local r = run_cases(json.array { c })[1]
      assert.is_nil(r.error, what .. ": " .. expression .. ": " .. tostring(r.error))
      return r.value
    end
    for _, m in ipairs(spec.matchConditions or {}) do
      if not one(m.expression) then return "skipped" end
    end
    local vars = json.object()
    for _, v in ipairs(spec.variables or {}) do vars[v.name] = one(v.expression, vars) end
    for _, v in ipairs(spec.validations) do
      if not one(v.expression, vars) then
        return "refused: " .. (v.messageExpression and one(v.messageExpression, vars) or v.message)
      end
    end
    return "allowed"
  end

  local CONTROLLER = { username = "system:serviceaccount:cozy-gpu:cozygpu-controller" }
  local function copy(o)
    o = o or {}
    local s = { apiVersion = "v1", kind = "Secret", type = o.type or "Opaque", immutable = o.immutable,
      metadata = { name = o.name or "gpu-license-l40s-24c", namespace = o.namespace or "tenant-a",
        labels = o.labels or { ["app.kubernetes.io/managed-by"] = "cozygpu", ["gpu.cozystack.io/license-class"] = "l40s-24c" },
        ownerReferences = json.array { { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", name = "a1", uid = "u1" } } },
      data = o.data or { ["client_configuration_token.tok"] = "dG9rZW4=" } }
    if o.immutable == nil then s.immutable = true end
    if o.immutable == false then s.immutable = nil end
    return s
  end
  local OTHER = { apiVersion = "v1", kind = "Secret", type = "Opaque",
    metadata = { name = "cloud-credentials", namespace = "kube-system" }, data = { key = "czNjcjN0" } }

  it("lets the controller create, update and delete its copies and no other Secret", function()
    local spec = policy("deploy/56-controller-secrets-policy.yaml")
    local cases = {
      { "a copy created", { operation = "CREATE", object = copy() }, "allowed" },
      { "a copy's owners updated", { operation = "UPDATE", object = copy(), oldObject = copy() }, "allowed" },
      { "a copy deleted", { operation = "DELETE", oldObject = copy() }, "allowed" },
      { "a copy whose managed-by label was taken off, put back", { operation = "UPDATE", object = copy(),
        oldObject = copy { labels = { ["gpu.cozystack.io/license-class"] = "l40s-24c" } } }, "allowed" },
      { "another Secret created", { operation = "CREATE", object = OTHER }, "refused" },
      { "another Secret updated into a copy's shape", { operation = "UPDATE", object = copy { namespace = "kube-system" },
        oldObject = OTHER }, "refused" },
      { "another Secret deleted", { operation = "DELETE", oldObject = OTHER }, "refused" },
      { "a tenant's Secret of a copy's name, unlabelled, updated", { operation = "UPDATE", object = copy(),
        oldObject = copy { labels = json.object() } }, "refused" },
      { "a tenant's Secret of a copy's name, without labels, deleted", { operation = "DELETE",
        oldObject = (function() local s = copy(); s.metadata.labels = nil; return s end)() }, "refused" },
      { "a copy that is not immutable", { operation = "CREATE", object = copy { immutable = false } }, "refused" },
      { "a copy of another type", { operation = "CREATE", object = copy { type = "kubernetes.io/service-account-token" } }, "refused" },
      { "a copy with a second key", { operation = "CREATE", object = copy { data = { ["client_configuration_token.tok"] = "dA==",
        other = "dA==" } } }, "refused" },
      { "a copy named for another class than its label", { operation = "CREATE", object = copy { name = "gpu-license-a100" } }, "refused" },
      { "a copy without managed-by", { operation = "CREATE",
        object = copy { labels = { ["gpu.cozystack.io/license-class"] = "l40s-24c" } } }, "refused" },
    }
    for _, c in ipairs(cases) do
      local req = c[2]
      req.userInfo = CONTROLLER
      local got = admit(spec, req, c[1])
      assert.are.equal(c[3], got:match("^%a+"), c[1] .. ": " .. got)
    end
    -- anyone else is not this policy's business (55 and RBAC are)
    for _, u in ipairs { { username = "alice" }, { username = "system:serviceaccount:cozy-gpu:default" } } do
      assert.are.equal("skipped", admit(spec, { operation = "CREATE", object = OTHER, userInfo = u }, u.username))
    end
  end)

  it("reserves the copies' label and name to the trusted writers", function()
    local spec = policy("deploy/55-license-copies-policy.yaml")
    local tenant = { username = "alice", groups = json.array { "system:authenticated" } }
    local cases = {
      { "a tenant creates a Secret of a copy's name", { operation = "CREATE", object = copy { labels = json.object() } }, "refused" },
      { "a tenant labels its Secret as a copy", { operation = "UPDATE", object = copy { name = "mine" },
        oldObject = copy { name = "mine", labels = json.object() } }, "refused" },
      { "a tenant takes a copy's label off", { operation = "UPDATE",
        object = copy { labels = { ["app.kubernetes.io/managed-by"] = "cozygpu" } }, oldObject = copy() }, "refused" },
      { "a tenant deletes a copy", { operation = "DELETE", oldObject = copy() }, "refused" },
      { "a tenant deletes its own Secret of a copy's name, made before", { operation = "DELETE",
        oldObject = copy { labels = json.object() } }, "skipped" },
      { "a tenant writes another Secret", { operation = "CREATE", object = OTHER }, "skipped" },
      { "a tenant deletes another Secret", { operation = "DELETE", oldObject = OTHER }, "skipped" },
      { "a Secret without a name or labels", { operation = "CREATE", object = { apiVersion = "v1", kind = "Secret",
        metadata = { namespace = "tenant-a" } } }, "skipped" },
    }
    for _, c in ipairs(cases) do
      local req = c[2]
      req.userInfo = tenant
      local got = admit(spec, req, c[1])
      assert.are.equal(c[3], got:match("^%a+"), c[1] .. ": " .. got)
    end
    assert.are.equal("skipped", admit(spec, { operation = "CREATE", object = copy(), userInfo = CONTROLLER }, "controller"))
  end)

  it("refuses a licensed GPUClass whose token Secret is outside the controller's namespace, naming it", function()
    local spec = policy("deploy/57-license-source-policy.yaml")
    local class = assert(core.manifests("examples/classes/l40s-24c.yaml"))[1].object
    assert.are.equal("allowed", admit(spec, { operation = "CREATE", object = class }, "examples' l40s-24c"))
    local passthrough = assert(core.manifests("examples/classes/l40s.yaml"))[1].object
    assert.are.equal("allowed", admit(spec, { operation = "UPDATE", object = passthrough, oldObject = passthrough }, "l40s"))
    class.spec.license.secretRef.namespace = "hoster-tokens"
    local got = admit(spec, { operation = "UPDATE", object = class, oldObject = class }, "elsewhere")
    assert.are.equal('refused: spec.license.secretRef.namespace: Invalid value: "hoster-tokens": the license token ' ..
      "Secret must be in cozy-gpu, the cozygpu controller namespace, the only one whose Secrets it reads " ..
      "(docs/decisions/0035)", got)
  end)
end)
