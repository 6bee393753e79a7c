-- Holds, budgets and billing against a hostile tenant on a real control
-- plane (docs/decisions/0036). The tenant is a user of tenant-a
-- with Cozystack's broadest tenant role (cozy:tenant:super-admin, which
-- aggregates cozygpu's deploy/15-tenant-roles.yaml); KubeVirt's part
-- (VMIs, launcher pods, VMI status) is played as KubeVirt's own
-- ServiceAccount, impersonated, so cozygpu's webhooks see the user they
-- trust. After each case the invariant checker (spec/support/invariants.lua)
-- runs over everything the API server holds.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local I = require "invariants"
local json = H.json

local NS = "tenant-a"
local VC = "system:serviceaccount:cozy-kubevirt:kubevirt-controller" -- examples/cluster/kubevirt.yaml's namespace
local CLAIMS_ANN = "gpu.cozystack.io/claims"
local RESOURCES_ANN = "workload.cozystack.io/resources"

describe("billing against a hostile tenant (Cozystack's tenant roles)", function()
  local c, mallory

  local session = K.session { invariants = true, deploy = { replicas = 1 }, prepare = function(cl)
    c = cl
    G.add_node(c, "gpu-1", 2)
    G.add_node(c, "gpu-2", 2)
    mallory = c:tenant_user("mallory", NS, "super-admin")
    -- what KubeVirt's virt-controller may do (its install's ClusterRole, the
    -- part these cases use), for the impersonated ServiceAccount
    c:must({ "apply", "-f", "-" }, { stdin = json.encode { apiVersion = "v1", kind = "List", items = {
      { apiVersion = "rbac.authorization.k8s.io/v1", kind = "ClusterRole", metadata = { name = "play-kubevirt-controller" },
        rules = { { apiGroups = { "" }, resources = { "pods" }, verbs = { "get", "list", "create", "delete" } },
          { apiGroups = { "kubevirt.io" }, resources = { "virtualmachineinstances" },
            verbs = { "get", "list", "create", "update", "patch", "delete" } } } },
      { apiVersion = "rbac.authorization.k8s.io/v1", kind = "ClusterRoleBinding", metadata = { name = "play-kubevirt-controller" },
        roleRef = { apiGroup = "rbac.authorization.k8s.io", kind = "ClusterRole", name = "play-kubevirt-controller" },
        subjects = { { kind = "ServiceAccount", name = "kubevirt-controller", namespace = "cozy-kubevirt" } } },
    } } })
  end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

  -- the invariants hold once the leader has caught up (a deadline, then
  -- the violations with the objects involved)
  local function invariants_hold() I.hold(c) end

  local function as_kubevirt(args, stdin)
    local a = { "--as", VC }
    for _, x in ipairs(args) do a[#a + 1] = x end
    return c:kubectl(a, { stdin = stdin })
  end
  local function must_kubevirt(args, stdin)
    local out, err, code = as_kubevirt(args, stdin)
    assert(code == 0, ("kubectl (as KubeVirt) %s: %s%s"):format(table.concat(args, " "), out, err))
    return out
  end
  local function claim(name) return c:get(("/apis/cozystack.io/v1alpha1/namespaces/%s/gpuclaims/%s"):format(NS, name)) end
  local function wait_phase(name, phase)
    local last
    assert(P.wait_until(function()
      last = claim(name)
      return last and last.status and last.status.phase == phase
    end, 20, 0.2), ("claim %s: wanted %s, have %s"):format(name, phase, json.encode(last and last.status or {})))
    return last
  end
  local function order(name, count)
    local out, err, code = mallory.kubectl({ "create", "-f", "-" }, { stdin = json.encode {
      apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = name, namespace = NS },
      spec = { class = "l40s", count = count or 1 } } })
    return code == 0, out .. err
  end

  -- A VM started as KubeVirt starts it: the VMI (from the VM's template,
  -- o.annotations), the virt-launcher pod with the VMI's annotations and
  -- one L40S per GPU entry, placed by kube-scheduler once cozygpu's gate
  -- is off, then the VMI Running on the pod's node. Returns the VMI.
  local function run_vm(name, ns, o)
    local gpus = {}
    for i = 1, o.gpus do gpus[i] = { name = "gpu" .. i, deviceName = G.L40S } end
    local vmi = json.decode(must_kubevirt({ "create", "-o", "json", "-f", "-" }, json.encode {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = ns, annotations = o.annotations },
      spec = { domain = { devices = { gpus = gpus }, resources = { requests = { memory = "1Gi" } } } } }))
    local ann = {}
    for k, v in pairs(vmi.metadata.annotations or {}) do ann[k] = v end
    local pod = json.decode(must_kubevirt({ "create", "-o", "json", "-f", "-" }, json.encode {
      apiVersion = "v1", kind = "Pod",
      metadata = { name = "virt-launcher-" .. name .. "-x1y2z", namespace = ns, annotations = ann,
        labels = { ["kubevirt.io"] = "virt-launcher", ["vm.kubevirt.io/name"] = name },
        ownerReferences = { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = name,
          uid = vmi.metadata.uid, controller = true, blockOwnerDeletion = true } } },
      spec = { containers = { { name = "compute", image = "quay.io/kubevirt/virt-launcher:v1.9.0",
        resources = { limits = { [G.L40S] = tostring(o.gpus) }, requests = { [G.L40S] = tostring(o.gpus) } } } } } }))
    local node
    assert(P.wait_until(function()
      local p = c:get(("/api/v1/namespaces/%s/pods/%s"):format(ns, pod.metadata.name))
      node = p and p.spec.nodeName
      return node
    end, 30, 0.2), "kube-scheduler placed no launcher pod for " .. name)
    vmi = json.decode(c:must { "get", "vmi", name, "-n", ns, "-o", "json" })
    vmi.status = { phase = "Running", nodeName = node }
    -- KubeVirt's VMI has no status subresource: virt-controller writes it in place
    vmi = json.decode(must_kubevirt({ "replace", "-o", "json", "-f", "-" }, json.encode(vmi)))
    return vmi, c:get(("/api/v1/namespaces/%s/pods/%s"):format(ns, pod.metadata.name))
  end

  local function stop_vm(vmi)
    local v = json.decode(c:must { "get", "vmi", vmi.metadata.name, "-n", vmi.metadata.namespace, "-o", "json" })
    v.status.phase = "Succeeded"
    must_kubevirt({ "replace", "-f", "-" }, json.encode(v))
    must_kubevirt { "delete", "pod", "-n", vmi.metadata.namespace, "-l", "vm.kubevirt.io/name=" .. vmi.metadata.name, "--wait=false" }
  end

  it("a tenant orders and releases claims and reads its records, and may change nothing that bills or holds", function()
    assert(order("r1"))
    wait_phase("r1", "Bound")
    local out, err, code = mallory.kubectl { "get", "gpuclasses" }
    assert.are.equal(0, code, err)
    assert.matches("l40s", out)
    -- no update of claims (the finalizer), records or VMIs in Cozystack's roles
    local function forbidden(args, what, stdin)
      local o, e, rc = mallory.kubectl(args, { stdin = stdin })
      assert.are_not.equal(0, rc, what .. " was allowed: " .. o)
      assert.matches('User "mallory" cannot ' .. what, e, 1, true)
    end
    forbidden({ "patch", "gpuclaim", "r1", "-n", NS, "--type=json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]' },
      'patch resource "gpuclaims" in API group "cozystack.io"')
    assert(P.wait_until(function()
      return #c:state("workloads").items > 0
    end, 20, 0.2), "no usage record for r1")
    forbidden({ "patch", "workload", "gpu-r1", "-n", NS, "--type=merge", "-p", '{"status":{"resources":{}}}' },
      'patch resource "workloads" in API group "cozystack.io"')
    forbidden({ "create", "-f", "-", "--dry-run=server" }, 'create resource "virtualmachineinstances"', json.encode {
      apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", metadata = { name = "mine", namespace = NS },
      spec = { domain = { devices = {}, resources = { requests = { memory = "1Gi" } } } } })
    invariants_hold()
    local _, derr, dcode = mallory.kubectl { "delete", "gpuclaim", "r1", "-n", NS }
    assert.are.equal(0, dcode, derr)
    invariants_hold()
  end)

  it("releasing the claim of a running VM waits for the VM; neither the finalizer nor the VMI's claims can be edited away", function()
    -- a hoster grants broader rights than Cozystack does: the policies hold
    c:must({ "apply", "-f", "-" }, { stdin = json.encode { apiVersion = "v1", kind = "List", items = {
      { apiVersion = "rbac.authorization.k8s.io/v1", kind = "Role", metadata = { name = "broad", namespace = NS },
        rules = { { apiGroups = { "cozystack.io" }, resources = { "gpuclaims" }, verbs = { "update", "patch" } },
          { apiGroups = { "kubevirt.io" }, resources = { "virtualmachineinstances" }, verbs = { "get", "update", "patch" } } } },
      { apiVersion = "rbac.authorization.k8s.io/v1", kind = "RoleBinding", metadata = { name = "broad", namespace = NS },
        roleRef = { apiGroup = "rbac.authorization.k8s.io", kind = "Role", name = "broad" },
        subjects = { { apiGroup = "rbac.authorization.k8s.io", kind = "User", name = "mallory" } } },
    } } })
    assert(order("w1"))
    wait_phase("w1", "Bound")
    local vmi = run_vm("vm1", NS, { gpus = 1, annotations = { [CLAIMS_ANN] = "w1" } })
    wait_phase("w1", "Attached")
    invariants_hold()

    -- the tenant releases the claim: it stays, Attached and billed, while the VM runs
    local _, err, code = mallory.kubectl { "delete", "gpuclaim", "w1", "-n", NS, "--wait=false" }
    assert.are.equal(0, code, err)
    local cl = wait_phase("w1", "Attached")
    assert.is_truthy(cl.metadata.deletionTimestamp)
    -- and cannot take the finalizer off, nor free the claim from the VMI
    local o, e, rc = mallory.kubectl { "patch", "gpuclaim", "w1", "-n", NS, "--type=json", "-p",
      '[{"op":"remove","path":"/metadata/finalizers"}]' }
    assert.are_not.equal(0, rc, o)
    assert.matches('ValidatingAdmissionPolicy \'cozygpu-claim-protection\'', e, 1, true)
    assert.matches("the finalizer gpu.cozystack.io/claim-protection is removed by the cozygpu controller", e, 1, true)
    o, e, rc = mallory.kubectl { "annotate", "vmi", "vm1", "-n", NS, "--overwrite", CLAIMS_ANN .. "=" }
    assert.are_not.equal(0, rc, o)
    assert.matches("ValidatingAdmissionPolicy 'cozygpu-vmi-claims-fixed'", e, 1, true)
    o, e, rc = mallory.kubectl { "annotate", "vmi", "vm1", "-n", NS, CLAIMS_ANN .. "-" }
    assert.are_not.equal(0, rc, o)
    invariants_hold()

    -- two more orders: the budget (2) counts the released claim while the VM runs
    local ok2, msg2 = order("w2")
    local ok3, msg3 = order("w3")
    local bound
    assert(P.wait_until(function()
      bound = 0
      local settled = true
      for _, n in ipairs { "w2", "w3" } do
        local x = claim(n)
        local ph = x and x.status and x.status.phase
        if ph == "Bound" then bound = bound + 1 elseif x and ph ~= "Pending" then settled = false end
        if x and not ph then settled = false end
      end
      return settled
    end, 20, 0.2))
    assert.are.equal(1, bound, ("one of the two new orders fits the budget of 2 beside the running VM's: %s %s / %s %s; %s / %s")
      :format(tostring(ok2), msg2, tostring(ok3), msg3, json.encode(claim("w2") or {}), json.encode(claim("w3") or {})))
    invariants_hold()

    -- the VM stops: the released claim goes, with its record
    stop_vm(vmi)
    assert(P.wait_until(function() return claim("w1") == nil end, 30, 0.2), "the released claim stayed after its VM stopped")
    invariants_hold()
  end)

  it("a raw-name VM's GPU stays billed by its launcher pod whatever the VM's annotation says", function()
    -- tenant-b has no GPU budget; raw names are Allowed (the default)
    local _, pod = run_vm("raw1", "tenant-b", { gpus = 1, annotations = {
      [RESOURCES_ANN] = json.encode { [G.L40S] = "0", memory = "2Gi" } } })
    -- what Cozystack bills for the pod (decision 0028): the request, 1
    assert.are.same({ memory = "2Gi" }, json.decode(pod.metadata.annotations[RESOURCES_ANN]))
    assert.are.equal(1, I.pod_billed(pod)[G.L40S])
    invariants_hold()
  end)
end)
