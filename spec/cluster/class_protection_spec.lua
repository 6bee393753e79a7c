-- GPUClass protection on a real control plane (decision 0037; DESIGN.md
-- §6 "a class being deleted keeps serving its Bound, Attached and Lost
-- claims"; docs/decisions/0037): the leader puts the finalizer
-- gpu.cozystack.io/class-protection on every class and takes it off a
-- class being deleted once no claim of it exists. A plain `kubectl delete
-- gpuclass` of a class in use leaves the class (being deleted), its Bound
-- claim and the claim's usage record; new orders of it are refused; the
-- class goes with its last claim. The invariant checker
-- (spec/support/invariants.lua) runs after each step.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local I = require "invariants"
local json = H.json

local NS = "tenant-a"
local FIN = "gpu.cozystack.io/class-protection"
local CLASSES = "/apis/cozystack.io/v1alpha1/gpuclasses/"
local CLAIMS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims/"
local WORKLOADS = "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/workloads/"

describe("GPUClass protection through kube-apiserver", function()
  local c
  local session = K.session { deploy = { replicas = 1 }, prepare = function(cl)
    c = cl
    G.add_node(c, "gpu-1", 2)
  end }
  setup(session.setup)
  teardown(session.teardown)

  local function invariants_hold() I.hold(c) end
  local function has_fin(obj)
    for _, f in ipairs(obj and obj.metadata.finalizers or {}) do
      if f == FIN then return true end
    end
    return false
  end
  -- waits until class `name` carries the finalizer; returns it
  local function protected(name)
    local last
    local cl = P.wait_until(function()
      last = c:get(CLASSES .. name)
      return has_fin(last) and last
    end, 20, 0.2)
    assert(cl, ("class %s: no %s, have %s"):format(name, FIN, json.encode(last and last.metadata or {})))
    return cl
  end
  local function gone(name)
    local last, st
    assert(P.wait_until(function()
      last, st = c:get(CLASSES .. name)
      return st == 404
    end, 20, 0.2), ("class %s still there: %s"):format(name, json.encode(last and last.metadata or {})))
  end
  local function order(name, class)
    return c:kubectl({ "create", "-f", "-" }, { stdin = json.encode {
      apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = name, namespace = NS },
      spec = { class = class, count = 1 } } })
  end
  local function wait_phase(name, phase)
    local last
    assert(P.wait_until(function()
      last = c:get(CLAIMS .. name)
      return last and last.status and last.status.phase == phase
    end, 20, 0.2), ("claim %s: wanted %s, have %s"):format(name, phase, json.encode(last and last.status or {})))
    return last
  end

  it("puts the finalizer on every class and lets a class no claim names go at once", function()
    protected("l40s")
    protected("a100-40c")
    local t0 = os.time()
    c:must { "delete", "gpuclass", "a100-40c", "--wait=false" }
    gone("a100-40c")
    assert.is_true(os.time() - t0 <= 10, "the unused class took more than 10 s to go")
    invariants_hold()
  end)

  it("keeps a deleted class serving its Bound claim and record, refuses new orders of it, and lets it go with its last claim", function()
    local _, err, code = order("r1", "l40s")
    assert.are.equal(0, code, err)
    local bound = wait_phase("r1", "Bound")
    assert(P.wait_until(function() return c:get(WORKLOADS .. "gpu-r1") end, 20, 0.2), "no usage record gpu-r1")
    protected("l40s")
    invariants_hold()

    -- returns at once: the class waits for its claims
    c:must { "delete", "gpuclass", "l40s", "--wait=false" }
    local cl = c:get(CLASSES .. "l40s")
    assert(cl, "class l40s went while claim r1 holds a unit of it")
    assert.is_string(cl.metadata.deletionTimestamp)
    assert.is_true(has_fin(cl))

    -- a new order of it is refused (DESIGN.md §4): the webhook reads the
    -- cache the leader reads, so the leader has the deletion too from here
    local out
    assert(P.wait_until(function()
      local o, e, rc = order("r2", "l40s")
      out = o .. e
      return rc ~= 0
    end, 20, 0.2), "an order of a class being deleted was admitted: " .. tostring(out))
    assert.matches('GPUClass "l40s" is being deleted', out, 1, true)

    -- for a while (the leader flushes its writes at least every second):
    -- the class, its finalizer, the claim's hold and its record all stay
    local broke = P.wait_until(function()
      local k = c:get(CLASSES .. "l40s")
      local r = c:get(CLAIMS .. "r1")
      local w = c:get(WORKLOADS .. "gpu-r1")
      if not (k and has_fin(k)) then return "class lost its finalizer or went: " .. json.encode(k and k.metadata or {}) end
      if not (r and r.status and r.status.phase == "Bound" and r.status.node == bound.status.node) then
        return "claim r1 lost its hold: " .. json.encode(r and r.status or {})
      end
      if not w then return "usage record gpu-r1 went" end
      return nil
    end, 4, 0.5)
    assert.is_nil(broke)
    invariants_hold()

    -- the last claim goes: so does the class
    c:must { "delete", "gpuclaim", "r1", "-n", NS, "--wait=false" }
    gone("l40s")
    assert(P.wait_until(function() return c:get(CLAIMS .. "r1") == nil end, 20, 0.2), "claim r1 stays")
    invariants_hold()
  end)
end)
