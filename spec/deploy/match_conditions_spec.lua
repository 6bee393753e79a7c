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
