-- The budget race on a real control plane (decision 0033, DESIGN.md §5,
-- decisions 0010, 0020 §3): 50 orders sent at once through kube-apiserver,
-- so cozygpu's webhooks judge each against a watch cache that may not yet
-- show the others, with two controller replicas, one of which holds the
-- Lease and binds. Admission may let more than the budget through (a
-- cache is a moment behind); the leader's serialized bind is the hard
-- guarantee: never more than the budget Bound, at any moment.
--
-- The webhooks call both replicas, as a Service would: no kube-proxy runs
-- here, so the test overlay's URL names haproxy, which passes each
-- connection to a ready replica in turn (Cluster:service); the Lease may be
-- held by either. Each replica must have judged some of the orders.
local P = require "proc"
local K = require "kube_cluster"
local G = require "gpu_nodes"
local E = require "controller_env" -- E.review: one AdmissionReview to one replica over TLS
local json = H.json

local NS = "tenant-a"
local LIMIT = 10

local function ready_cond(obj) return K.condition(obj, "Ready") end

describe("budget race through kube-apiserver (two replicas)", function()
  local c

  local session = K.session { invariants = true, deploy = { replicas = 2 }, prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

  it("50 concurrent orders against a budget of 10: never more than 10 Bound", function()
    -- tenant-a's total key (examples/cluster/quotas.yaml: 2) raised to 10
    c:must { "patch", "resourcequota", "gpu", "-n", NS, "--type=merge", "-p",
      ('{"spec":{"hard":{"gpuclass.cozystack.io/devices":"%d"}}}'):format(LIMIT) }
    for i = 1, 8 do G.add_node(c, "gpu-" .. i, 8) end -- 64 units: room never refuses
    -- the replicas' caches show the new limit before the orders start:
    -- each replica's webhook, asked directly, admits an order of 3 (over
    -- the old limit of 2, within the new one)
    for id, r in pairs(c.replicas) do
      local last
      assert(P.wait_until(function()
        local ok, st, body = pcall(E.review, r, "/validate/gpuclaim", { apiVersion = "admission.k8s.io/v1", kind = "AdmissionReview",
          request = { uid = "b0d9e700-0000-4000-8000-000000000001",
            kind = { group = "cozystack.io", version = "v1alpha1", kind = "GPUClaim" },
            resource = { group = "cozystack.io", version = "v1alpha1", resource = "gpuclaims" },
            operation = "CREATE", namespace = NS, name = "probe", userInfo = { username = "alice" },
            object = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
              metadata = { name = "probe", namespace = NS }, spec = { class = "l40s", count = 3 } } } })
        last = ok and json.encode(body) or tostring(st)
        return ok and st == 200 and body.response and body.response.allowed
      end, 30, 0.2), ("replica %s does not admit an order of 3 under the limit of %d: %s"):format(id, LIMIT, tostring(last)))
    end
    local dir = c.dir .. "/orders"
    assert(os.execute("mkdir -p " .. P.q(dir)))
    local cmds = {}
    for i = 1, 50 do
      local f = ("%s/o%02d.json"):format(dir, i)
      H.write(f, json.encode { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
        metadata = { name = ("o%02d"):format(i), namespace = NS }, spec = { class = "l40s", count = 1 } })
      cmds[#cmds + 1] = ("curl -sS --max-time 30 -o %s.out -w '%%{http_code}' --cacert %s --cert %s --key %s "
        .. "-H 'Content-Type: application/json' --data-binary @%s %s/apis/cozystack.io/v1alpha1/namespaces/%s/gpuclaims >%s.code &")
        :format(P.q(f), P.q(c.pki .. "/ca.crt"), P.q(c.pki .. "/admin.crt"), P.q(c.pki .. "/admin.key"),
          P.q(f), c.url, NS, P.q(f))
    end
    P.sh(table.concat(cmds, "\n") .. "\nwait")
    local created, refused = 0, 0
    for i = 1, 50 do
      local f = ("%s/o%02d.json"):format(dir, i)
      local code = tonumber(P.read(f .. ".code"))
      if code == 201 then
        created = created + 1
      else
        -- refused by cozygpu's webhook with its budget message (403)
        assert.are.equal(403, code, P.read(f .. ".out"))
        local status = json.decode(P.read(f .. ".out"))
        assert.matches('admission webhook "gpuclaim.validate.gpu.cozystack.io" denied the request', status.message, 1, true)
        assert.matches("gpuclass.cozystack.io/devices is 10", status.message, 1, true)
        refused = refused + 1
      end
    end
    assert.are.equal(50, created + refused)
    -- both replicas judged orders (cozygpu_admission_reviews_total{webhook="gpuclaim-validate"} of the
    -- GPUClaim validating webhook, from each one's /metrics)
    for id, r in pairs(c.replicas) do
      local _, m = P.http { url = ("http://127.0.0.1:%d/metrics"):format(r.probe_port), timeout = 5 }
      local n = 0
      for line in (m or ""):gmatch("[^\n]+") do
        if line:match('^cozygpu_admission_reviews_total{[^}]*webhook="gpuclaim%-validate"') then
          n = n + tonumber(line:match("%s(%S+)$"))
        end
      end
      print(("# budget race: %s judged %d orders"):format(id, n))
      assert.is_true(n > 0, id .. " judged no order: the Service stand-in sent it nothing")
    end
    -- a TAP comment: how many the webhook let through on its cache
    print(("# budget race: %d of 50 admitted, %d refused by the webhook"):format(created, refused))
    assert.is_true(created >= LIMIT, ("only %d orders admitted"):format(created))
    local max_bound, last = 0, nil
    local settled = P.wait_until(function()
      local bound, over, other = 0, 0, 0
      for _, cl in ipairs(c:state("gpuclaims").items) do
        local ph = cl.status and cl.status.phase
        if ph == "Bound" or ph == "Attached" then
          bound = bound + 1
        elseif ph == "Pending" and ready_cond(cl) and ready_cond(cl).reason == "OverBudget" then
          over = over + 1
        else
          other = other + 1
        end
      end
      if bound > max_bound then max_bound = bound end
      last = { bound = bound, over = over, other = other, created = created }
      return bound + over == created and bound == LIMIT
    end, 60, 0.1)
    assert(settled, json.encode(last))
    assert.are.equal(LIMIT, max_bound)
    assert.are.equal(created - LIMIT, last.over)
  end)
end)
