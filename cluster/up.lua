--- `make cluster`: the local control plane with cozygpu deployed, for a
--- newcomer to try (README "Against a real Kubernetes").
---
---   lua5.4 cluster/up.lua DIR      (make sets the environment: the
---                                   control plane's binaries, the build)
---
--- Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler
--- on 127.0.0.1 (cluster/cluster.sh), deploys cozygpu from deploy/ as the
--- cluster specs do (spec/support/kube_cluster.lua: the manifests through
--- examples/without-cert-manager, one controller replica running here as
--- the cozygpu-controller ServiceAccount, the webhooks called by the API
--- server), loads the examples (classes, tenants, budgets, the KubeVirt
--- CR), two GPU nodes with their GPUNodes, and a tenant user alice of
--- tenant-a; then prints what to try. Everything keeps running after this
--- script exits; `make cluster-down` stops it.
local build = os.getenv("COZYGPU_BUILD") or "build"
package.path = "lua/?.lua;spec/support/?.lua;" .. package.path
package.cpath = build .. "/lua/?.so;" .. package.cpath
require "helper" -- H: the C core, JSON (spec/support/helper.lua)
local K = require "kube_cluster"
local G = require "gpu_nodes"
local P = require "proc"

local dir = assert(arg[1], "usage: lua5.4 cluster/up.lua DIR")
local ok, err = pcall(function()
  local c = K.start { dir = dir, keep = true }
  -- a stop of this script before the end leaves nothing running
  local done = false
  local ok2, err2 = pcall(function()
    c:deploy { replicas = 1 }
    -- the default chooser takes the node with the fewest free units
    -- (policies/binder.lua): a first claim lands on gpu-1, which the third
    -- thing to try drains
    G.add_node(c, "gpu-1", 2)
    G.add_node(c, "gpu-2", 4)
    c:must { "apply", "-f", "cluster/tenant-users.yaml" }
    local out, code = P.sh(("cluster/cluster.sh user %s alice 2>&1"):format(P.q(c.dir)))
    assert(code == 0, out)
    done = true
  end)
  if not done then
    c:stop()
    error(err2, 0)
  end
  local f = assert(io.open(c.dir .. "/env", "a"))
  f:write(("COZYGPU_CONTROLLER_LOG=%s\n"):format(c.replicas["replica-a"].log))
  f:close()
  print(([[

cozygpu runs on a local Kubernetes %s control plane (everything on 127.0.0.1).
  admin:  export KUBECONFIG=%s/admin.kubeconfig PATH=%s:$PATH   (kubectl of the same version)
  tenant: alice of tenant-a, --kubeconfig %s/alice.kubeconfig
  logs:   %s/logs/ and the controller's %s
Three things to try (README "Against a real Kubernetes" explains each):
  1. order a GPU as alice (tenant-a's budget is 2), then one too many:
       kubectl --kubeconfig %s/alice.kubeconfig -n tenant-a create -f examples/cluster-demo/claim.yaml
       kubectl --kubeconfig %s/alice.kubeconfig -n tenant-a get gpuclaims -o wide
       kubectl --kubeconfig %s/alice.kubeconfig -n tenant-a create -f examples/cluster-demo/claim-too-many.yaml
  2. drain gpu-1, with a preview first:
       kubectl get nodes,gpunodes,gpuclasses,gpuclaims,vms,vmis,kubevirts,namespaces,resourcequotas,pvc,pv -A -o yaml >/tmp/snapshot.yaml
       %s/bin/cozygpu simulate examples/cluster-demo/drain-gpu-1.yaml --snapshot /tmp/snapshot.yaml
       kubectl cordon gpu-1 && kubectl get gpuclaims -A -o wide && kubectl describe gpuclaim -n tenant-a train
  3. start a VM naming the claim:
       kubectl --kubeconfig %s/alice.kubeconfig -n tenant-a create -f examples/cluster-demo/vmi.yaml
Stop it all with: make cluster-down]]):format(os.getenv("COZYGPU_KUBE_VERSION") or "", c.dir, K.bin_dir, c.dir, c.dir,
    c.replicas["replica-a"].log, c.dir, c.dir, c.dir, build, c.dir))
end)
if not ok then
  io.stderr:write("make cluster: ", tostring(err), "\n")
  if tostring(err):find("fixtures", 1, true) then
    io.stderr:write("make cluster: the GPU nodes are built from the shared fixtures (README); point at them with\n"
      .. "  make cluster COZYGPU_FIXTURES=/path/to/shared/fixtures\n")
  end
  os.exit(1)
end
os.exit(0)
