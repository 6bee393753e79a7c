-- cluster/cluster.sh when a component fails (decision 0033): `up`
-- names the component and its log, stops what it started, and leaves no
-- process running; every wait has a deadline. The real binaries come from
-- `make cluster-bins`; a failing component is a stand-in script in a copy
-- of the binaries' folder.
local P = require "proc"
local K = require "kube_cluster"

-- this spec process: a control plane started here stops when it ends
local SELF = (P.read("/proc/self/stat") or ""):match("^(%d+)")

describe("cluster/cluster.sh", function()
  local bins, dir

  before_each(function()
    assert(K.available())
    bins = H.tmpdir()
    dir = H.tmpdir() .. "/cp"
    for _, b in ipairs { "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl" } do
      assert(os.execute(("ln -s %s %s"):format(P.q(K.bin_dir .. "/" .. b), P.q(bins .. "/" .. b))))
    end
  end)

  after_each(function()
    P.sh("cluster/cluster.sh down " .. P.q(dir))
  end)

  local function pids_alive(text)
    local alive = {}
    for name, pid in (text or ""):gmatch("(%S+) (%d+)") do
      if P.alive(tonumber(pid)) then alive[#alive + 1] = name end
    end
    return alive
  end

  it("names an API server that exits, shows its log, and stops etcd", function()
    os.remove(bins .. "/kube-apiserver")
    H.write(bins .. "/kube-apiserver", "#!/bin/sh\necho 'E1201 failed to listen on 127.0.0.1: address already in use' >&2\nexit 1\n")
    assert(os.execute("chmod +x " .. P.q(bins .. "/kube-apiserver")))
    local out, code = P.sh(("COZYGPU_CLUSTER_OWNER=%s COZYGPU_CLUSTER_BIN=%s cluster/cluster.sh up %s 2>&1"):format(SELF, P.q(bins), P.q(dir)))
    assert.are_not.equal(0, code)
    assert.matches("cluster: kube-apiserver exited while starting; its log is " .. dir .. "/logs/kube-apiserver.log", out, 1, true)
    assert.matches("address already in use", out, 1, true)
    -- etcd, started first, is stopped; nothing is recorded as running
    assert.is_nil(P.read(dir .. "/pids"))
    -- "[e]tcd": the pattern must not match the shell that runs pgrep
    local etcd_pid = P.sh("pgrep -f -- " .. P.q("[e]tcd --name default --data-dir " .. dir .. "/etcd-data") .. " 2>&1"):match("%d+")
    assert.is_nil(etcd_pid)
  end)

  it("refuses a missing binary before starting anything", function()
    os.remove(bins .. "/kube-scheduler")
    local out, code = P.sh(("COZYGPU_CLUSTER_OWNER=%s COZYGPU_CLUSTER_BIN=%s cluster/cluster.sh up %s 2>&1"):format(SELF, P.q(bins), P.q(dir)))
    assert.are_not.equal(0, code)
    assert.matches(bins .. "/kube-scheduler: missing (run make cluster-bins)", out, 1, true)
    assert.is_nil(P.read(dir .. "/pids"))
  end)

  it("stops everything once the process it belongs to is gone (a spec run killed before its teardown)", function()
    local owner = P.spawn({ "sleep", "600" }, "/dev/null")
    local out, code = P.sh(("COZYGPU_CLUSTER_OWNER=%d COZYGPU_CLUSTER_BIN=%s cluster/cluster.sh up %s 2>&1")
      :format(owner, P.q(bins), P.q(dir)))
    assert.are.equal(0, code, out)
    local recorded = P.read(dir .. "/pids")
    assert.are.equal(5, #pids_alive(recorded)) -- four components and the watcher
    P.stop(owner)
    assert(P.wait_until(function() return #pids_alive(recorded) == 0 end, 20, 0.2),
      "still running: " .. table.concat(pids_alive(recorded), ", "))
  end)

  it("starts, answers status, and down leaves no process", function()
    local out, code = P.sh(("COZYGPU_CLUSTER_OWNER=%s COZYGPU_CLUSTER_BIN=%s cluster/cluster.sh up %s 2>&1"):format(SELF, P.q(bins), P.q(dir)))
    assert.are.equal(0, code, out)
    local recorded = P.read(dir .. "/pids")
    assert.are.same({ "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "owner-watch" },
      pids_alive(recorded))
    local _, st = P.sh("cluster/cluster.sh status " .. P.q(dir))
    assert.are.equal(0, st)
    -- a second `up` in the same folder is refused, the first keeps running
    local out2, code2 = P.sh(("COZYGPU_CLUSTER_OWNER=%s COZYGPU_CLUSTER_BIN=%s cluster/cluster.sh up %s 2>&1"):format(SELF, P.q(bins), P.q(dir)))
    assert.are_not.equal(0, code2)
    assert.matches("a control plane is recorded there already", out2, 1, true)
    assert.are.equal(5, #pids_alive(recorded))
    P.sh("cluster/cluster.sh down " .. P.q(dir))
    assert.are.same({}, pids_alive(recorded))
    _, st = P.sh("cluster/cluster.sh status " .. P.q(dir))
    assert.are_not.equal(0, st)
  end)
end)
