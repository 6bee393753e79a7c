-- Least privilege, proven on a real API server (decision 0035): what
-- each of cozygpu's ServiceAccounts may do, as `kubectl auth can-i --list`
-- prints it (the RBAC authorizer's answer for deploy/'s roles), equals the
-- reviewed allow-list deploy/rbac-allowlist.txt; and each runs its real
-- work as itself without one 403: the controller (spec/cluster/*, every
-- replica's log is checked by its spec's teardown, Cluster:forbidden) and
-- the agent here, on a fake sysfs tree.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local S = require "sysfs"
local json = H.json

local SAS = {
  controller = { ns = "cozy-gpu", name = "cozygpu-controller", in_ns = { "cozy-gpu", "tenant-a", "kube-system", "default" } },
  agent = { ns = "cozy-gpu-agent", name = "cozygpu-agent", in_ns = { "cozy-gpu-agent", "kube-system" } },
}

-- `kubectl auth can-i --list` as a table: {"resource [names] verbs", ...},
-- resource rules only (the non-resource URLs are the discovery roles every
-- authenticated user has), the self-review APIs left out the same way.
local function can_list(c, sa, ns)
  local out = c:must { "auth", "can-i", "--list", "-n", ns, ("--as=system:serviceaccount:%s:%s"):format(sa.ns, sa.name) }
  local rows = {}
  for line in out:gmatch("[^\n]+") do
    local res, urls, names, verbs = line:match("^(%S*)%s%s+(%[.-%])%s+(%[.-%])%s+(%[.-%])%s*$")
    if res and res ~= "" and res ~= "Resources" and not res:match("^self%a+reviews%.") then
      assert.are.equal("[]", urls, line)
      local v = {}
      for w in verbs:sub(2, -2):gmatch("%S+") do v[#v + 1] = w end
      table.sort(v)
      rows[#rows + 1] = ("%s %s %s"):format(res, names, table.concat(v, ","))
    end
  end
  table.sort(rows)
  return rows
end

-- deploy/rbac-allowlist.txt: "<sa> <namespace> <resource> [names] verbs"
local function allowlist()
  local want = {}
  for line in H.read("deploy/rbac-allowlist.txt"):gmatch("[^\n]+") do
    if not line:match("^%s*#") and line:match("%S") then
      local sa, ns, rest = line:match("^(%S+)%s+(%S+)%s+(.-)%s*$")
      assert(sa, "deploy/rbac-allowlist.txt: cannot read line: " .. line)
      local key = sa .. " " .. ns
      want[key] = want[key] or {}
      table.insert(want[key], (rest:gsub("%s+", " ")))
    end
  end
  for _, rows in pairs(want) do table.sort(rows) end
  return want
end

describe("least privilege on a real API server", function()
  local c

  -- the one refusal a test below causes on purpose
  local CAUSED = 'cannot list resource \\"deviceclasses\\"'
  local session = K.session { forbidden_except = CAUSED, prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)

  it("each ServiceAccount may do exactly what deploy/rbac-allowlist.txt lists", function()
    local want = allowlist()
    for who, sa in pairs(SAS) do
      for _, ns in ipairs(sa.in_ns) do
        local key = who .. " " .. ns
        assert.are.same(want[key] or {}, can_list(c, sa, ns), key)
      end
    end
  end)

  it("the controller cannot read a Secret outside its namespace", function()
    local as = "--as=system:serviceaccount:cozy-gpu:cozygpu-controller"
    for _, verb in ipairs { "get", "list", "watch" } do
      local out = c:kubectl { "auth", "can-i", verb, "secrets", "-n", "kube-system", as }
      assert.are.equal("no", (out:gsub("%s+$", "")), verb)
    end
    -- and the API server says so to the controller's own token
    c:must { "-n", "kube-system", "create", "secret", "generic", "cloud-credentials", "--from-literal=key=s3cr3t" }
    local kc = c.controller_kubeconfig
    local _, err, code = c:kubectl({ "-n", "kube-system", "get", "secret", "cloud-credentials" }, { kubeconfig = kc })
    assert.are_not.equal(0, code)
    assert.matches('secrets "cloud-credentials" is forbidden: User "system:serviceaccount:cozy-gpu:cozygpu-controller" cannot get resource "secrets"', err, 1, true)
  end)

  it("a grant taken away shows in the controller's log with the API server's reason", function()
    -- a hoster's RBAC edit drops the DeviceClass read (deploy/10-rbac.yaml)
    local role = json.decode(c:must { "get", "clusterrole", "cozygpu-controller", "-o", "json" })
    local kept = {}
    for _, rule in ipairs(role.rules) do
      local dc = false
      for _, res in ipairs(rule.resources or {}) do dc = dc or res == "deviceclasses" end
      if not dc then kept[#kept + 1] = rule end
    end
    assert.are.equal(#role.rules - 1, #kept)
    role.rules = kept
    c:must({ "replace", "-f", "-" }, { stdin = json.encode(role) })
    -- a restart: the list is made again (the replica cannot become ready)
    c:reconfigure(function(text) return text end, { wait = false })
    local r = c.replicas["replica-a"]
    local line = P.wait_until(function()
      for l in (P.read(r.log) or ""):gmatch("[^\n]+") do
        if l:find('"msg":"list failed","resource":"deviceclasses","status":403', 1, true) then return l end
      end
    end, 30, 0.2)
    assert(line, P.read(r.log))
    -- the reason is the API server's own (RBAC's message), not "invalid JSON"
    assert.matches('User \\"system:serviceaccount:cozy-gpu:cozygpu-controller\\" ' .. CAUSED, line, 1, true)
    -- the API server's audit log has the refusal too (what the sessions'
    -- "no 403" check reads besides the replicas' logs)
    assert(P.wait_until(function()
      for _, l in ipairs(c:forbidden()) do
        if l:sub(1, 7) == "audit: " and l:find("system:serviceaccount:cozy-gpu:cozygpu-controller " .. CAUSED, 1, true) then
          return true
        end
      end
    end, 10, 0.2), "no 403 of the DeviceClass list in the audit log:\n" .. table.concat(c:forbidden(), "\n"))
    -- and a replica that cannot read what admission needs is not ready
    local st = P.http { url = ("http://127.0.0.1:%d/readyz"):format(r.probe_port), timeout = 2 }
    assert.are.equal(503, st)
  end)

  it("the agent writes its node's GPUNode as its ServiceAccount, on a fake sysfs tree", function()
    G.add_node(c, "gpu-node-7", 0)
    -- the GPUNode is the agent's to create: none before it runs
    c:must { "delete", "gpunode", "gpu-node-7" }
    local kc = c:sa_kubeconfig("cozy-gpu-agent", "cozygpu-agent")
    local tree = S.build { functions = {
      { address = "0000:41:00.0", device = "26b9", subsystem = "10de:1851", driver = "vfio-pci", iommu = 41, numa = 0 },
    } }
    os.execute("mkdir -p " .. H.q(tree.proc .. "/sys/kernel/random"))
    H.write(tree.proc .. "/sys/kernel/random/boot_id", G.BOOT .. "\n")
    local _, err, code = H.run { "agent", "--once", "--node", "gpu-node-7", "--kubeconfig", kc, "--sysfs", tree.root,
      "--proc", tree.proc, "--pci-ids", S.pci_ids(), "--namespace", "cozy-gpu-agent", "--log-format", "json" }
    tree:remove()
    assert.are.equal(0, code, err)
    assert.is_nil(err:find('"status":403', 1, true), err)
    local gn = c:get("/apis/cozystack.io/v1alpha1/gpunodes/gpu-node-7")
    assert.truthy(gn, err)
    -- the inventory it wrote: the one L40S function of the tree
    local fns = gn.status and gn.status.functions or gn.status and gn.status.inventory
    assert.truthy(gn.status, json.encode(gn))
    assert.matches("0000:41:00.0", json.encode(fns or gn.status), 1, true)
    -- owned by its Node, as the agent sets it (decision 0011)
    assert.are.equal("Node", gn.metadata.ownerReferences[1].kind)
    assert.are.equal("gpu-node-7", gn.metadata.ownerReferences[1].name)
  end)
end)
