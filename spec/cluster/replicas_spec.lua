-- Two controller replicas on a real control plane (decision 0033):
-- each answers reviews as `cozygpu review` does on the same state (read
-- back from the API server), and leader election (DESIGN.md "Controller";
-- client-go's leaderelection semantics, which the Lease fields follow:
-- holderIdentity, leaseDurationSeconds, renewTime, leaseTransitions)
-- hands over on a kill. Two replicas run as the cozygpu-controller
-- ServiceAccount against kube-apiserver; the webhooks reach both through
-- the Service stand-in (Cluster:service). Who wrote what is read from the
-- API server's own audit log, not from the controller.
--
-- The Lease timings are shortened (3 s / 2 s / 500 ms instead of the
-- manifests' 15 s / 10 s / 2 s) so a takeover is seconds, not a minute.
local P = require "proc"
local K = require "kube_cluster"
local E = require "controller_env" -- E.review: one AdmissionReview to one replica over TLS
local json = H.json
local deepcompare = require("luassert.util").deepcompare

local LEASE = "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller"
local SA = "system:serviceaccount:cozy-gpu:cozygpu-controller"

local now, epoch = K.now, K.epoch

-- the cozygpu_leader gauge of a replica (1 leading, 0 not), nil if unreadable
local function leading(r)
  local st, m = P.http { url = ("http://127.0.0.1:%d/metrics"):format(r.probe_port), timeout = 2 }
  if st ~= 200 then return nil end
  return tonumber((m or ""):match("\ncozygpu_leader (%S+)"))
end

describe("two controller replicas on kube-apiserver", function()
  local c

  local session = K.session {
    deploy = { replicas = 2, extra = { "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms" } },
    prepare = function(cl) c = cl end,
  }
  setup(session.setup)
  teardown(session.teardown)

  -- The state `cozygpu review --cluster` reads, as the API server returns
  -- it: the kinds the policies read, as one List file.
  local function snapshot(name)
    local out = c:must { "get", "namespaces,resourcequotas,kubevirts,gpuclasses,gpuclaims,virtualmachineinstances",
      "-A", "-o", "json" }
    local path = c.dir .. "/" .. name
    H.write(path, out)
    return path
  end

  -- Each replica's answer to each case equals `cozygpu review`'s on the
  -- snapshot (cases: {path, review, allowed}); a replica's watch cache
  -- trails the API server by a moment, so each may take up to 10 s to agree.
  local function same_as_cli(cases, snap, cfg, tag)
    for i, k in ipairs(cases) do
      local file = ("%s/%s-%d.json"):format(c.dir, tag, i)
      H.write(file, json.encode(k[2]))
      local want_out, werr, code = H.run { "review", "--cluster", snap, "--config", cfg, "--webhook",
        k[1]:match("^/validate") and "validating" or "mutating", file }
      assert.are.equal(0, code, werr)
      local want = H.json_lines(want_out)[1]
      assert.are.equal(k[3], want.response.allowed, tag .. " " .. i .. ": " .. json.encode(want.response))
      for id, r in pairs(c.replicas) do
        local got
        P.wait_until(function()
          local st
          st, got = E.review(r, k[1], k[2])
          return st == 200 and got and deepcompare(want.response, got.response, true)
        end, 10, 0.2)
        assert.are.same(want.response, got and got.response, ("%s case %d on %s"):format(tag, i, id))
      end
    end
  end

  local function review(obj, uid, kind, resource, group)
    return { apiVersion = "admission.k8s.io/v1", kind = "AdmissionReview", request = {
      uid = uid, kind = { group = group, version = group == "cozystack.io" and "v1alpha1" or "v1", kind = kind },
      resource = { group = group, version = group == "cozystack.io" and "v1alpha1" or "v1", resource = resource },
      operation = "CREATE", namespace = obj.metadata.namespace, name = obj.metadata.name,
      userInfo = { username = "alice" }, object = obj } }
  end

  it("each replica answers budget, claim and raw-name reviews as `cozygpu review` does on the same state", function()
    -- tenant-a holds 1 of its 2 GPUs (examples/cluster/quotas.yaml); tenant-b
    -- runs a VM ordering by raw name under a raw-name quota key of 1
    c:must({ "create", "-f", "-" }, { stdin = json.encode { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = "held", namespace = "tenant-a" }, spec = { class = "l40s", count = 1 } } })
    c:must({ "create", "-f", "-" }, { stdin = json.encode { apiVersion = "v1", kind = "ResourceQuota",
      metadata = { name = "raw", namespace = "tenant-b" },
      spec = { hard = { ["requests.nvidia.com/AD102GL_L40S"] = "1", ["l40s.gpuclass.cozystack.io/devices"] = "4" } } } })
    c:must({ "create", "-f", "-" }, { stdin = json.encode(H.vmi { namespace = "tenant-b", name = "raw-vm",
      hostDevices = { "nvidia.com/AD102GL_L40S" } }) })
    -- no virt-controller here: the test says the VMI runs (KubeVirt's VMI
    -- has no status subresource; virt-controller writes status in place)
    local vmi = json.decode(c:must { "get", "vmi", "raw-vm", "-n", "tenant-b", "-o", "json" })
    vmi.status = { phase = "Running" }
    c:must({ "replace", "-f", "-" }, { stdin = json.encode(vmi) })
    finally(function()
      c:kubectl { "delete", "gpuclaim", "held", "-n", "tenant-a", "--wait=false" }
      c:kubectl { "delete", "resourcequota", "raw", "-n", "tenant-b" }
      c:kubectl { "delete", "vmi", "raw-vm", "-n", "tenant-b", "--wait=false" }
    end)
    local function claim(ns, count)
      return { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "new", namespace = ns },
        spec = { class = "l40s", count = count } }
    end
    same_as_cli({
      { "/validate/gpuclaim", review(claim("tenant-a", 1), "5a3e0000-0000-4000-8000-000000000001", "GPUClaim", "gpuclaims", "cozystack.io"), true },  -- 1 + 1 <= 2
      { "/validate/gpuclaim", review(claim("tenant-a", 2), "5a3e0000-0000-4000-8000-000000000002", "GPUClaim", "gpuclaims", "cozystack.io"), false }, -- 1 + 2 > 2
      { "/validate/gpuclaim", review(claim("tenant-b", 1), "5a3e0000-0000-4000-8000-000000000003", "GPUClaim", "gpuclaims", "cozystack.io"), false }, -- the running raw VM holds tenant-b's raw key
    }, snapshot("same-state.json"), c.config, "budget")
  end)

  it("each replica under rawResourceNames: Forbidden answers pod and VMI reviews as `cozygpu review` does", function()
    c:reconfigure(function(text)
      local out, n = text:gsub("rawResourceNames: %a+", "rawResourceNames: Forbidden")
      assert(n == 1, "config.yaml has no rawResourceNames line")
      return out
    end)
    local examples = {}
    for _, r in ipairs(assert(H.core.manifests("examples/reviews"))) do examples[#examples + 1] = r.object end
    local tenant_pod = { apiVersion = "v1", kind = "Pod", metadata = { name = "miner", namespace = "tenant-a",
      labels = { ["kubevirt.io"] = "virt-launcher" },
      ownerReferences = json.array { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "x", uid = "u" } } },
      spec = { containers = json.array { { name = "c", image = "busybox",
        resources = { limits = { ["nvidia.com/AD102GL_L40S"] = "1" } } } } } }
    same_as_cli({
      -- a tenant's pod with a forged owner reference and label: refused
      { "/validate/pod", review(tenant_pod, "7a000000-0000-4000-8000-000000000001", "Pod", "pods", ""), false },
      -- the launcher pod of example 07 from virt-controller: allowed
      { "/validate/pod", examples[7], true },
      -- a VMI ordering by raw name without a class: refused; example 01 names its class: allowed
      { "/validate/vmi", review(H.vmi { namespace = "tenant-a", name = "raw", gpus = { "nvidia.com/AD102GL_L40S" } },
        "7a000000-0000-4000-8000-000000000003", "VirtualMachineInstance", "virtualmachineinstances", "kubevirt.io"), false },
      { "/validate/vmi", examples[1], true },
    }, snapshot("raw-state.json"), c.config, "raw")
  end)

  it("has exactly one leader; when it is killed the other leads within the lease duration, and only the leader writes", function()
    local lease = c:get(LEASE)
    local holder = lease.spec.holderIdentity
    assert.is_truthy(c.replicas[holder], "the Lease names no replica: " .. json.encode(lease.spec))
    assert.are.equal(3, lease.spec.leaseDurationSeconds)
    local first = c.replicas[holder]
    local second = c.replicas[holder == "replica-a" and "replica-b" or "replica-a"]
    assert(P.wait_until(function() return leading(first) == 1 and leading(second) == 0 end, 10, 0.2),
      ("cozygpu_leader: %s %s, %s %s"):format(first.identity, tostring(leading(first)),
        second.identity, tostring(leading(second))))

    -- the leader writes the classes' Accepted condition for their generation
    local cls
    assert(P.wait_until(function()
      cls = c:get "/apis/cozystack.io/v1alpha1/gpuclasses/l40s"
      local a = K.condition(cls, "Accepted")
      return a and a.status == "True" and a.observedGeneration == cls.metadata.generation
    end, 20, 0.2), "GPUClass l40s has no Accepted=True for its generation: " .. json.encode(cls and cls.status))

    local killed = now()
    P.kill(first.pid, "KILL")
    P.wait_exit(first.pid, 5)
    c.replicas[first.identity] = nil
    -- client-go's rule: a candidate takes a Lease whose renewTime is older
    -- than leaseDurationSeconds by its own clock; it looks once per retry
    -- period and may have seen the last renewal up to one retry late:
    -- lease duration + two retry periods (4 s), plus 1 s for a busy machine
    local took
    assert(P.wait_until(function()
      local l = c:get(LEASE)
      if l.spec.holderIdentity == second.identity then took = now() return true end
    end, 15, 0.1), "the survivor did not take the Lease within 15 s")
    print(("# leader takeover: %.2f s after the kill"):format(took - killed))
    assert.is_true(took - killed <= 3 + 2 * 0.5 + 1, ("took %.2f s"):format(took - killed))
    lease = c:get(LEASE)
    assert.is_true(lease.spec.leaseTransitions >= 1, json.encode(lease.spec))
    assert(P.wait_until(function() return leading(second) == 1 end, 5, 0.2), "the survivor does not say it leads")

    -- the webhooks still answer: the Service stand-in sends only to the
    -- ready survivor (failurePolicy Fail would refuse the order otherwise)
    local out, err, code = c:kubectl({ "create", "-f", "-" }, { stdin = json.encode {
      apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
      metadata = { name = "after-takeover", namespace = "tenant-a" }, spec = { class = "l40s", count = 1 } } })
    assert.are.equal(0, code, (out or "") .. (err or ""))

    -- a spec change bumps generation; the new leader records it
    c:must { "patch", "gpuclass", "l40s", "--type=merge", "-p", '{"spec":{"displayName":"NVIDIA L40S (renamed)"}}' }
    assert(P.wait_until(function()
      cls = c:get "/apis/cozystack.io/v1alpha1/gpuclasses/l40s"
      local a = K.condition(cls, "Accepted")
      return a and a.observedGeneration == cls.metadata.generation
    end, 20, 0.2), "the new leader did not record generation " .. tostring(cls.metadata.generation))

    -- only the leader writes: by the API server's own record (its audit
    -- log), every GPUClass status write of a replica comes while that
    -- replica holds the Lease, that is within leaseDurationSeconds of its
    -- last successful write of the Lease (client-go's leaderelection: no
    -- other candidate may take it sooner). A leader change before the kill
    -- (a renewal missed on a loaded machine) is allowed and printed; two
    -- replicas writing under one Lease term is not.
    local renewals = {}
    for _, ev in ipairs(c:audit(function(ev)
      local o = ev.objectRef
      return o and o.resource == "leases" and o.namespace == "cozy-gpu" and o.name == "cozygpu-controller"
        and (ev.verb == "update" or ev.verb == "create" or ev.verb == "patch")
        and ev.stage == "ResponseComplete" and ev.responseStatus and ev.responseStatus.code < 300
    end)) do
      local who = (ev.userAgent or ""):match("%((replica%-%a)%)")
      if who then
        renewals[#renewals + 1] = { who = who, at = epoch(ev.requestReceivedTimestamp) }
      end
    end
    table.sort(renewals, function(a, b) return a.at < b.at end)
    local holders = {}
    for _, r in ipairs(renewals) do
      if holders[#holders] ~= r.who then holders[#holders + 1] = r.who end
    end
    print("# Lease holders in order: " .. table.concat(holders, " -> "))
    local function held(who, at)
      local last
      for _, r in ipairs(renewals) do
        if r.at > at then break end
        -- another replica's successful write of the Lease is its taking it
        if r.who == who then last = r.at else last = nil end
      end
      return last and at - last <= lease.spec.leaseDurationSeconds
    end
    local writes, by, before_kill, after_kill = 0, {}, 0, 0
    for _, ev in ipairs(c:audit(function(ev)
      return ev.objectRef and ev.objectRef.resource == "gpuclasses" and ev.objectRef.subresource == "status"
        and ev.stage == "ResponseComplete"
    end)) do
      writes = writes + 1
      assert.are.equal(SA, ev.user.username)
      local who = (ev.userAgent or ""):match("%((replica%-%a)%)")
      assert.is_truthy(who == first.identity or who == second.identity, tostring(ev.userAgent))
      local at = epoch(ev.requestReceivedTimestamp)
      assert.is_true(held(who, at), ("%s wrote a class status at %s without holding the Lease (holders: %s)")
        :format(who, ev.requestReceivedTimestamp, table.concat(holders, " -> ")))
      if who == first.identity then
        assert.is_true(at <= killed + 0.5, ("%s wrote after it was killed"):format(who))
      end
      if at <= killed then before_kill = before_kill + 1 end
      if who == second.identity and at > killed then after_kill = after_kill + 1 end
      by[who] = (by[who] or 0) + 1
    end
    -- some leader wrote the classes' status before the kill (the first
    -- one, or whoever held the Lease before a change printed above), and
    -- the survivor wrote the renamed class's after it
    assert.is_true(before_kill >= 1, "no class status was written before the kill: " .. json.encode(by))
    assert.is_true(after_kill >= 1, "the new leader wrote no class status after the kill: " .. json.encode(by))
    assert.is_true(writes >= 2)
  end)
end)
