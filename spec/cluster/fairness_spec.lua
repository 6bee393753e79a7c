-- One tenant's burst does not hold back another's bind, on a real control
-- plane (decision 0039). The leader's writes (claim statuses,
-- protection finalizers, pins) go round robin across namespaces, in
-- flushes of at most FLUSH_BUDGET_MS (core/controller/bind.c), between
-- which it takes the events that came: a tenant's new order is bound while
-- the writes of another tenant's thousand claims are still under way.
-- Before, every write of the backlog went first, in series (decision
-- 0039 measured 29-36 s behind a burst of 2,000).
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local json = H.json

local FLOOD_NS, NS = "tenant-b", "tenant-a"
local N = 1000       -- the burst: claims of a vGPU class no node offers (they stay Pending)
local CREATORS = 4   -- kubectl processes creating them at once (the tenant's own pace)

describe("one tenant's burst of claims and another tenant's order", function()
  local c
  local session = K.session { deploy = { replicas = 1 }, prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)

  local function claim_obj(ns, name, class)
    return { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = name, namespace = ns }, spec = { class = class, count = 1 } }
  end

  it("binds the other tenant's order while a change to the burst's thousand statuses is still being written", function()
    G.add_node(c, "gpu-1", 1)
    -- the hoster entitles the burst's tenant to vGPU (gpu.cozystack.io/vgpu)
    c:must { "label", "namespace", FLOOD_NS, "gpu.cozystack.io/vgpu=true" }
    -- the burst, in CREATORS lists created at once
    local cmds, files = {}, {}
    for k = 1, CREATORS do
      local items = {}
      for i = k, N, CREATORS do items[#items + 1] = claim_obj(FLOOD_NS, ("burst-%04d"):format(i), "a100-40c") end
      local f = os.tmpname()
      local h = assert(io.open(f, "w"))
      h:write(json.encode { apiVersion = "v1", kind = "List", items = items })
      h:close()
      files[k] = f
      cmds[#cmds + 1] = ("(timeout 300 %s --kubeconfig %s create -f %s -o name >/dev/null 2>%s.err; echo $? >%s.rc) &")
        :format(P.q(K.kubectl_bin), P.q(c.kubeconfig), P.q(f), P.q(f), P.q(f))
    end
    P.sh(table.concat(cmds, " ") .. " wait")
    for _, f in ipairs(files) do
      assert.are.equal("0", (P.read(f .. ".rc") or ""):match("%d+"), P.read(f .. ".err"))
      os.remove(f); os.remove(f .. ".rc"); os.remove(f .. ".err")
    end
    -- every claim of the burst gets its status (Pending: no node offers
    -- the class)
    local flood_path = "/apis/cozystack.io/v1alpha1/namespaces/" .. FLOOD_NS .. "/gpuclaims"
    local function reasons()
      local out, l = {}, c:get(flood_path)
      for _, cl in ipairs(l and l.items or {}) do
        local r = "none"
        for _, x in ipairs(cl.status and cl.status.conditions or {}) do
          if x.type == "Ready" then r = x.reason end
        end
        out[r] = (out[r] or 0) + 1
      end
      return out
    end
    local seen
    assert(P.wait_until(function()
      seen = reasons()
      return seen.NoNodeWithRoom == N
    end, 300, 1), "the burst's claims did not all get their Pending status: " .. json.encode(seen))
    -- the burst's tenant deletes their class (the class protection keeps it
    -- while claims of it exist): each of the thousand claims' status
    -- changes to ClassBeingDeleted, a backlog of writes all at once; the
    -- other tenant orders at the same moment
    c:must { "delete", "gpuclass", "a100-40c", "--wait=false" }
    local t0 = K.now()
    c:must({ "create", "-f", "-" }, { stdin = json.encode(claim_obj(NS, "mine", "l40s")) })
    local bound_at
    local path = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/mine"
    assert(P.wait_until(function()
      local cl = c:get(path)
      if cl and cl.status and cl.status.phase == "Bound" then bound_at = K.now() return true end
    end, 120, 0.05), "the order was not bound: " .. json.encode(c:get(path)))
    seen = reasons()
    local behind = N - (seen.ClassBeingDeleted or 0)
    print(("# the order was Bound %.2f s after its create; %d of the burst's %d statuses were not yet written")
      :format(bound_at - t0, behind, N))
    assert.is_true(behind > 0, "every status of the burst was written before the other tenant's order was bound: "
      .. json.encode(seen))
    -- and the burst is served in the end
    assert(P.wait_until(function()
      seen = reasons()
      return seen.ClassBeingDeleted == N
    end, 300, 1), "the burst's claims did not all say their class is being deleted: " .. json.encode(seen))
  end)
end)
