-- Budgets at bind (DESIGN.md §5: the leader's serialized bind is the hard
-- guarantee; decision 0020 §3, 0024): orders that all passed admission
-- (the double runs no webhooks, as two replicas' caches could each have
-- seen room) never put more units Bound than a tenant's budget allows.
-- Two replicas against the API server double; the budget is a
-- ResourceQuota key on the tenant, as a hoster sets it.
local P = require "proc"
local E = require "controller_env"
local G = require "gpu_nodes"
local json = H.json

local NS = "tenant-a"

local function must(d, method, path, body)
  local v, st = E.send(d, method, path, body)
  assert(st and st >= 200 and st < 300, ("%s %s -> %s %s"):format(method, path, tostring(st), json.encode(v or {})))
  return v
end

local function add_node(d, name, units) G.add_node(d, name, units) end

local function ready_cond(c)
  for _, x in ipairs(c.status and c.status.conditions or {}) do
    if x.type == "Ready" then return x end
  end
end

describe("budgets at bind (two replicas)", function()
  local d, certs, cluster, dir

  before_each(function()
    cluster = E.start_cluster { certs = certs }
    d, certs, dir = cluster.d, cluster.certs, cluster.dir
  end)

  after_each(function() E.stop_cluster(cluster) end)

  teardown(function() P.stop_all() end)

  it("50 concurrent orders against a budget of 10: never more than 10 Bound, the rest Pending with OverBudget", function()
    -- the tenant's total key (examples/cluster/quotas.yaml has 2) raised to 10
    local out, code = E.kubectl(d, { "patch", "resourcequota", "gpu", "-n", NS, "--type=merge", "-p",
      '{"spec":{"hard":{"gpuclass.cozystack.io/devices":"10"}}}' })
    assert.are.equal(0, code, out)
    for i = 1, 8 do add_node(d, "gpu-" .. i, 8) end -- 64 units: room is never what refuses
    -- 50 orders at once: one curl each, all started before any is answered
    local files = {}
    local cmds = {}
    for i = 1, 50 do
      local f = dir .. "/order-" .. i .. ".json"
      H.write(f, json.encode { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
        metadata = { name = ("o%02d"):format(i), namespace = NS }, spec = { class = "l40s", count = 1 } })
      files[i] = f
      cmds[#cmds + 1] = ("curl -sS -o /dev/null -H 'Content-Type: application/json' %s --data-binary @%s %s/apis/cozystack.io/v1alpha1/namespaces/%s/gpuclaims &")
        :format(d.token and ("-H " .. P.q("Authorization: Bearer " .. d.token)) or "", P.q(f), d.url, NS)
    end
    P.sh(table.concat(cmds, "\n") .. "\nwait")
    local max_bound, last = 0, nil
    local settled = P.wait_until(function()
      local bound, over, other = 0, 0, 0
      for _, c in ipairs(d:state("gpuclaims").items) do
        local ph = c.status and c.status.phase
        if ph == "Bound" or ph == "Attached" then
          bound = bound + 1
        elseif ph == "Pending" and ready_cond(c) and ready_cond(c).reason == "OverBudget" then
          over = over + 1
        else
          other = other + 1
        end
      end
      if bound > max_bound then max_bound = bound end
      last = { bound = bound, over = over, other = other }
      return bound + over == 50
    end, 30, 0.1)
    assert(settled, json.encode(last))
    assert.are.equal(10, max_bound)
    assert.are.equal(10, last.bound)
    assert.are.equal(40, last.over)
    -- the message names the tenant, the key and its limit, nothing else's
    for _, c in ipairs(d:state("gpuclaims").items) do
      local r = ready_cond(c)
      if r.reason == "OverBudget" then
        assert.matches('tenant "tenant-a"', r.message, 1, true)
        assert.matches("gpuclass.cozystack.io/devices is 10", r.message, 1, true)
        assert.are.equal("False", r.status)
      end
    end
    -- room in the budget returns: one Bound claim deleted, one waiting one binds
    local victim
    for _, c in ipairs(d:state("gpuclaims").items) do
      if c.status.phase == "Bound" then victim = c.metadata.name end
    end
    must(d, "DELETE", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/" .. victim)
    assert(P.wait_until(function()
      local bound = 0
      for _, c in ipairs(d:state("gpuclaims").items) do
        if c.status and c.status.phase == "Bound" then bound = bound + 1 end
      end
      return bound == 10
    end, 15))
  end)

  it("a claim Lost with the budget full is rebound without a budget check (DESIGN.md §5)", function()
    add_node(d, "gpu-1", 2)
    for _, n in ipairs { "a1", "a2" } do
      must(d, "POST", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims", { apiVersion = "cozystack.io/v1alpha1",
        kind = "GPUClaim", metadata = { name = n, namespace = NS }, spec = { class = "l40s", count = 1 } })
    end
    local function phase(n)
      local c = E.get(d, "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/" .. n)
      return c and c.status and c.status.phase, c
    end
    assert(P.wait_until(function() return phase("a1") == "Bound" and phase("a2") == "Bound" end, 15),
      json.encode(d:state("gpuclaims").items))
    -- the budget (2) is full; the node goes away: both Lost, then room elsewhere
    must(d, "DELETE", "/api/v1/nodes/gpu-1")
    assert(P.wait_until(function() return phase("a1") == "Lost" and phase("a2") == "Lost" end, 15),
      json.encode(d:state("gpuclaims").items))
    -- a new order meanwhile: it waits (no node has room yet)
    must(d, "POST", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims", { apiVersion = "cozystack.io/v1alpha1",
      kind = "GPUClaim", metadata = { name = "a3", namespace = NS }, spec = { class = "l40s", count = 1 } })
    -- room returns for all three: the Lost claims go back without a budget
    -- check though the budget is full (they keep counting while Lost), and
    -- the new order is refused by the budget, not by room
    add_node(d, "gpu-2", 4)
    assert(P.wait_until(function() return phase("a1") == "Bound" and phase("a2") == "Bound" end, 15),
      json.encode(d:state("gpuclaims").items))
    assert(P.wait_until(function()
      local _, c = phase("a3")
      return c and ready_cond(c) and ready_cond(c).reason == "OverBudget"
    end, 15), json.encode(d:state("gpuclaims").items))
    local _, c3 = phase("a3")
    assert.are.equal("Pending", c3.status.phase)
    assert.are.equal("OverBudget", ready_cond(c3).reason)
  end)
end)
