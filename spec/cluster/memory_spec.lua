-- The leader's memory under a tenant's large objects, on a real control
-- plane (decision 0038).
-- A tenant can make every object it owns as large as the API server takes
-- (annotations up to 256 KiB in all, apimachinery
-- ValidateAnnotationsSize). The watch caches keep only what cozygpu reads
-- (ctl_cluster_strip: managedFields, long foreign annotations, cloud-init
-- payloads, container env go), and lists come in pages of 100 objects, so
-- neither the replica that watches the flood arrive nor the one that lists
-- it afterwards (the next leader) comes near the Deployment's memory limit.
-- Peak RSS is the kernel's own figure (VmHWM in /proc/PID/status).
local P = require "proc"
local K = require "kube_cluster"
local json = H.json

local NS = "tenant-b"
local N = 300                -- VMIs, none with a GPU (no budget applies)
local BLOB = 250 * 1024      -- bytes of one annotation's value

-- the controller's memory limit in deploy/40-controller.yaml, in KiB
local function limit_kib()
  local y = assert(P.read("deploy/40-controller.yaml"))
  local mi = assert(y:match("limits:.-memory:%s*(%d+)Mi"),
    "deploy/40-controller.yaml: no limits.memory in Mi")
  return tonumber(mi) * 1024
end

local function status_kib(pid, field)
  local s = P.read("/proc/" .. pid .. "/status") or ""
  return tonumber(s:match(field .. ":%s+(%d+) kB"))
end

describe("the leader's memory under a tenant's large objects", function()
  local c
  local session = K.session { deploy = { replicas = 1 }, prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)

  local function cached(r, resource)
    local m = c:metrics(r)
    return m and m[('cozygpu_watch_cache_objects{resource="%s"}'):format(resource)]
  end

  it("stays under half its memory limit while 300 VMIs with 250 KiB annotations arrive, and when a new replica lists them", function()
    local half = limit_kib() / 2
    local _, r = c:leader()
    assert(r, "no replica holds the Lease")
    local before
    assert(P.wait_until(function()
      before = cached(r, "virtualmachineinstances")
      return before ~= nil
    end, 30, 0.2), "the replica shows no cozygpu_watch_cache_objects for VMIs")
    local base = status_kib(r.pid, "VmHWM")
    -- the flood, as one List (kubectl sends one create per item)
    local items = {}
    local blob = ("x"):rep(BLOB)
    for i = 1, N do
      items[i] = { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
        metadata = { name = ("big-%03d"):format(i), namespace = NS, annotations = { ["example.com/blob"] = blob } },
        spec = { domain = { devices = json.object(), resources = { requests = { memory = "64Mi" } } } } }
    end
    local f = os.tmpname()
    local h = assert(io.open(f, "w"))
    h:write(json.encode { apiVersion = "v1", kind = "List", items = items })
    h:close()
    items, blob = nil, nil
    collectgarbage()
    local out, err, code = c:kubectl({ "create", "-f", f, "-o", "name" })
    os.remove(f)
    assert.are.equal(0, code, (out or "") .. (err or ""):sub(1, 2000))
    assert(P.wait_until(function() return cached(r, "virtualmachineinstances") == before + N end, 120, 0.5),
      ("the replica caches %s VMIs, not %d"):format(tostring(cached(r, "virtualmachineinstances")), before + N))
    local peak = status_kib(r.pid, "VmHWM")
    print(("# leader: peak RSS %.1f MiB before the flood, %.1f MiB after (%d VMIs, %d MiB of annotations; limit %d MiB)")
      :format(base / 1024, peak / 1024, N, N * BLOB // (1024 * 1024), limit_kib() // 1024))
    assert.is_true(peak < half, ("peak RSS %.1f MiB, over half the limit"):format(peak / 1024))
    -- less than a tenth of what the flood weighs stays: the annotations are
    -- not cached
    assert.is_true(peak - base < N * BLOB / 1024 / 10,
      ("peak RSS grew %.1f MiB for %d MiB of annotations"):format((peak - base) / 1024, N * BLOB // (1024 * 1024)))

    -- a new replica lists them all (the next leader's start)
    local r2 = c:start_controller { identity = "replica-z", port = P.free_port() }
    assert(P.wait_until(function() return cached(r2, "virtualmachineinstances") == before + N end, 120, 0.5),
      "the new replica did not list the VMIs:\n" .. (P.read(r2.log) or ""):sub(-3000))
    local peak2 = status_kib(r2.pid, "VmHWM")
    print(("# new replica: peak RSS %.1f MiB after listing them"):format(peak2 / 1024))
    assert.is_true(peak2 < half, ("the new replica's peak RSS %.1f MiB, over half the limit"):format(peak2 / 1024))
  end)
end)
