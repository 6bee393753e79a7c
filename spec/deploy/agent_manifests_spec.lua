-- deploy/60-agent.yaml and the GPUNode CRD: the DaemonSet runs `cozygpu
-- agent` with flags it knows, the host paths it needs and nothing more, and
-- its RBAC is what the agent does (spec/agent/agent_spec.lua checks every
-- request the agent sends against these rules).
local core = H.core

local function load(path)
  local docs = assert(core.manifests(path))
  local by = {}
  for _, d in ipairs(docs) do by[d.object.kind .. "/" .. d.object.metadata.name] = d.object end
  return by
end

describe("deploy/60-agent.yaml", function()
  local objs = load("deploy/60-agent.yaml")
  local ds = objs["DaemonSet/cozygpu-agent"]
  local pod = ds.spec.template.spec
  local c = pod.containers[1]

  it("runs `cozygpu agent` on the host's /sys and /proc, named after its node", function()
    assert.equal("agent", c.args[1])
    local f = {}
    for i = 2, #c.args do
      local k, v = c.args[i]:match("^%-%-([%w-]+)=(.*)$")
      assert(k, "not a --flag=value: " .. c.args[i])
      f[k] = v
    end
    assert.same({ node = "$(NODE_NAME)", sysfs = "/host/sys", proc = "/host/proc", interval = "30s",
      ["log-format"] = "json" }, f)
    assert.same({ { name = "NODE_NAME", valueFrom = { fieldRef = { fieldPath = "spec.nodeName" } } },
      { name = "POD_NAME", valueFrom = { fieldRef = { fieldPath = "metadata.name" } } },
      { name = "POD_NAMESPACE", valueFrom = { fieldRef = { fieldPath = "metadata.namespace" } } } }, c.env)
    -- every flag is one the binary documents
    local help = H.run { "agent", "--help" }
    for k in pairs(f) do assert.truthy(help:find("--" .. k .. " ", 1, true), "--" .. k .. " not in agent --help") end
  end)

  it("mounts /sys and /proc read-only, and only /sys/devices (where current_vgpu_type is) writable", function()
    local vols = {}
    for _, v in ipairs(pod.volumes) do vols[v.name] = v.hostPath and v.hostPath.path end
    assert.same({ sys = "/sys", ["sys-devices"] = "/sys/devices", proc = "/proc" }, vols)
    local mounts = {}
    for _, m in ipairs(c.volumeMounts) do mounts[m.name] = { m.mountPath, m.readOnly == true } end
    assert.same({ sys = { "/host/sys", true }, ["sys-devices"] = { "/host/sys/devices", false },
      proc = { "/host/proc", true } }, mounts)
    assert.is_nil(pod.hostPID)
    assert.is_nil(pod.hostNetwork)
  end)

  it("is not privileged: root with DAC_READ_SEARCH and SYS_PTRACE only (to read QEMU's fds)", function()
    local sc = c.securityContext
    assert.is_not_true(sc.privileged)
    assert.equal(0, sc.runAsUser)
    assert.is_false(sc.allowPrivilegeEscalation)
    assert.same({ "ALL" }, sc.capabilities.drop)
    assert.same({ "DAC_READ_SEARCH", "SYS_PTRACE" }, sc.capabilities.add)
    assert.same({ type = "Unconfined" }, sc.appArmorProfile)
  end)

  it("lives in its own namespace, whose Pod Security level admits it (privileged)", function()
    local ns = objs["Namespace/cozy-gpu-agent"]
    assert.equal("privileged", ns.metadata.labels["pod-security.kubernetes.io/enforce"])
    for key, o in pairs(objs) do
      if o.kind ~= "Namespace" and o.kind ~= "ClusterRole" and o.kind ~= "ClusterRoleBinding" then
        assert.equal("cozy-gpu-agent", o.metadata.namespace, key)
      end
    end
    -- the restricted level of cozy-gpu would refuse this pod: host paths and
    -- added capabilities are not even baseline
    local ctl_ns = load("deploy/00-namespace.yaml")["Namespace/cozy-gpu"]
    assert.equal("restricted", ctl_ns.metadata.labels["pod-security.kubernetes.io/enforce"])
  end)

  it("runs on GPU nodes whatever their taints, as the agent's ServiceAccount", function()
    assert.same({ { operator = "Exists" } }, pod.tolerations)
    assert.equal("cozygpu-agent", pod.serviceAccountName)
    local terms = pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
    assert.equal(3, #terms)
    local b = objs["ClusterRoleBinding/cozygpu-agent"]
    assert.same({ kind = "ClusterRole", name = "cozygpu-agent", apiGroup = "rbac.authorization.k8s.io" }, b.roleRef)
    assert.same({ { kind = "ServiceAccount", name = "cozygpu-agent", namespace = "cozy-gpu-agent" } }, b.subjects)
  end)

  it("grants GPUNode read/create/patch, its status update and Node get, without wildcards", function()
    local got = {}
    for _, r in ipairs(objs["ClusterRole/cozygpu-agent"].rules) do
      for _, g in ipairs(r.apiGroups) do
        for _, res in ipairs(r.resources) do
          local v = {}
          for _, x in ipairs(r.verbs) do v[#v + 1] = x end
          table.sort(v)
          got[g .. "/" .. res] = v
          assert.is_nil(res:find("*", 1, true))
        end
      end
    end
    assert.same({
      ["cozystack.io/gpunodes"] = { "create", "get", "list", "patch", "watch" },
      ["cozystack.io/gpunodes/status"] = { "update" },
      ["/nodes"] = { "get" },
    }, got)
    -- and in its namespace, the nodes' Leases
    local role = objs["Role/cozygpu-agent"]
    assert.same({ { apiGroups = { "coordination.k8s.io" }, resources = { "leases" }, verbs = { "get", "create", "update" } } },
      role.rules)
    assert.same({ kind = "Role", name = "cozygpu-agent", apiGroup = "rbac.authorization.k8s.io" },
      objs["RoleBinding/cozygpu-agent"].roleRef)
  end)
end)

describe("deploy/crds/gpunodes.cozystack.io.yaml", function()
  local crd = load("deploy/crds/gpunodes.cozystack.io.yaml")["CustomResourceDefinition/gpunodes.cozystack.io"]
  local v = crd.spec.versions[1]
  local fn = v.schema.openAPIV3Schema.properties.status.properties.functions.items.properties

  it("is cluster-scoped, with a status subresource", function()
    assert.equal("Cluster", crd.spec.scope)
    assert.same({ status = {} }, v.subresources)
  end)

  it("declares every inventory field of docs/gpunode.md, so none is pruned", function()
    -- the inventory section's table (the GPUNode section below it lists status fields)
    local doc = H.read("docs/gpunode.md"):match("^(.-)\n## GPUNode")
    local n = 0
    for field in doc:gmatch("\n| `([%a]+)`") do
      n = n + 1
      assert.is_not_nil(fn[field], ("status.functions[].%s is not in the CRD schema"):format(field))
    end
    assert.is_true(n >= 18, "read " .. n .. " fields from docs/gpunode.md")
    for _, f in ipairs { "type", "typeName", "profile", "creatable" } do assert.is_not_nil(fn.vgpu.properties[f]) end
    for _, f in ipairs { "type", "name", "availableInstances", "deviceAPI", "description", "devices" } do
      assert.is_not_nil(fn.mdevTypes.items.properties[f])
    end
  end)
end)
