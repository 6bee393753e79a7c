--- GPU nodes in the API server double as a cluster shows them to the
--- binder (docs/decisions/0022): a Node with what the kubelet writes
--- (Ready, allocatable and capacity of the L40S resource name, a boot ID)
--- and the taint examples/classes/l40s.yaml tolerates, and its GPUNode with
--- the status the agent writes for a fake sysfs tree of `units` L40S GPUs
--- (10DE:26B9) on vfio-pci, each in its own IOMMU group
--- (spec/support/sysfs.lua, runtime.layout.status). So what a node offers is
--- computed by cozygpu.capacity exactly as in a cluster.
local sysfs = require "sysfs"
local layout = require "runtime.layout"
local json = H.json

local G = {}

--- The L40S resource name (examples/classes/l40s.yaml, Cozystack's
--- passthrough defaults for 10DE:26B9).
G.L40S = "nvidia.com/AD102GL_L40S"
G.BOOT = "3b1f5c2e-6d0a-4f8e-9a7b-2c4d6e8f0a1b"

local cache = {}

--- The GPUNode status the agent writes for `units` L40S on vfio-pci (a
--- decoded JSON table; built once per count).
function G.gpunode_status(units)
  if cache[units] then return json.decode(cache[units]) end
  local fns = {}
  for i = 1, units do
    fns[i] = { address = ("0000:%02x:00.0"):format(0x40 + i), device = "26b9", subsystem = "10de:1851",
      driver = "vfio-pci", iommu = 40 + i, numa = 0 }
  end
  local tree = sysfs.build { functions = fns }
  local inv, err = sysfs.inventory(tree)
  tree:remove()
  assert(inv, err)
  cache[units] = json.encode(layout.status { inventory = inv, now = "2026-12-01T09:00:00Z", boot_id = G.BOOT,
    generation = 1 })
  return json.decode(cache[units])
end

local function must(d, method, path, body)
  local st, v = d:request(method, path, body)
  assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st),
    type(v) == "table" and json.encode(v) or tostring(v)))
  return v
end

--- Writes Node `name`'s status: o.alloc units allocatable (default
--- o.units), o.units capacity, Ready o.ready ("True" default, or "False",
--- "Unknown").
function G.node_status(d, name, o)
  -- a read-modify-write: on a real control plane the node-lifecycle
  -- controller writes a new Node too (its taints), so a 409 is retried
  for _ = 1, 20 do
    local node = must(d, "GET", "/api/v1/nodes/" .. name)
    local st, v = G.put_node_status(d, node, o)
    if st ~= 409 then
      assert(st and st >= 200 and st < 300, ("PUT /api/v1/nodes/%s/status -> %s %s"):format(name, tostring(st),
        type(v) == "table" and json.encode(v) or tostring(v)))
      return v
    end
  end
  error("PUT /api/v1/nodes/" .. name .. "/status: 409 twenty times")
end

--- Writes the status of `node` (as read) from o (as G.node_status). Returns
--- the API answer: status, body.
function G.put_node_status(d, node, o)
  -- pods and memory as a kubelet reports them: kube-scheduler places no pod
  -- on a node without allocatable pods (spec/cluster)
  node.status = { allocatable = { [G.L40S] = tostring(o.alloc or o.units), cpu = "64", memory = "512Gi", pods = "110" },
    capacity = { [G.L40S] = tostring(o.units), cpu = "64", memory = "512Gi", pods = "110" },
    conditions = { { type = "Ready", status = o.ready or "True", reason = (o.ready or "True") == "True" and "KubeletReady" or "NodeStatusUnknown" } },
    nodeInfo = { bootID = G.BOOT } }
  return d:request("PUT", "/api/v1/nodes/" .. node.metadata.name .. "/status", node)
end

--- Creates Node `name` with `units` L40S and its GPUNode (replacing a
--- GPUNode left from an earlier Node of that name). o (optional):
--- alloc, ready as in G.node_status. Returns the Node.
function G.add_node(d, name, units, o)
  o = o or {}
  must(d, "POST", "/api/v1/nodes", { apiVersion = "v1", kind = "Node",
    metadata = { name = name, labels = { ["kubernetes.io/hostname"] = name } },
    spec = { taints = { { key = "gpu.cozystack.io/mode", value = "passthrough", effect = "NoSchedule" } } } })
  local node = G.node_status(d, name, { units = units, alloc = o.alloc, ready = o.ready })
  local st = d:request("GET", "/apis/cozystack.io/v1alpha1/gpunodes/" .. name)
  if st == 200 then must(d, "DELETE", "/apis/cozystack.io/v1alpha1/gpunodes/" .. name) end
  local g = must(d, "POST", "/apis/cozystack.io/v1alpha1/gpunodes", { apiVersion = "cozystack.io/v1alpha1",
    kind = "GPUNode", metadata = { name = name, ownerReferences = { { apiVersion = "v1", kind = "Node", name = name,
      uid = node.metadata.uid } } }, spec = json.object() })
  g.status = G.gpunode_status(units)
  must(d, "PUT", "/apis/cozystack.io/v1alpha1/gpunodes/" .. name .. "/status", g)
  return node
end

return G
