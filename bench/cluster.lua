--- `make bench-cluster` (and the end of `make bench`): VMI creates through
--- the real API server (cluster/, docs/decisions/0033) at fixed rates, with
--- cozygpu's webhooks registered and then with them removed, in one run;
--- the figure is the ratio of the two p99s at each rate (the webhooks' overhead).
---
---   lua5.4 bench/cluster.lua [--rates 10,25] [--count 100]
---
--- Each create is a VMI with one host device (a ConnectX VF the example
--- KubeVirt CR permits, not a GPU): the webhooks' matchConditions send it
--- to /mutate/vmi and /validate/vmi, and the policies admit it, so both
--- runs store the same objects. Requests are started at the rate by one
--- shell loop, each a curl process (its %{time_total} excludes the process
--- start); latency is the API server's answer time as a client sees it.
--- Bounded: `count` creates per rate and run, each with a 30 s timeout.
local build = os.getenv("COZYGPU_BUILD") or "build"
package.path = "lua/?.lua;spec/support/?.lua;" .. package.path
package.cpath = build .. "/lua/?.so;" .. package.cpath
require "helper"
local K = require "kube_cluster"
local P = require "proc"
local json = H.json

local rates, count = { 10, 25 }, 100
do
  local i = 1
  while arg[i] do
    if arg[i] == "--rates" and arg[i + 1] then
      rates = {}
      for r in arg[i + 1]:gmatch("[%d%.]+") do rates[#rates + 1] = tonumber(r) end
      i = i + 2
    elseif arg[i] == "--count" and tonumber(arg[i + 1] or "") then
      count = math.min(1000, math.tointeger(tonumber(arg[i + 1])) or 100)
      i = i + 2
    else
      io.stderr:write("usage: lua5.4 bench/cluster.lua [--rates R1,R2] [--count N (at most 1000)]\n")
      os.exit(2)
    end
  end
end

local function percentile(sorted, p)
  if #sorted == 0 then return 0 / 0 end
  local k = math.max(1, math.ceil(p / 100 * #sorted))
  return sorted[k]
end

-- `count` VMI creates at `rate` per second; returns {p50, p99 (ms),
-- achieved rate, errors}
local function run(c, label, rate)
  local dir = ("%s/bench-%s-%s"):format(c.dir, label, tostring(rate))
  assert(os.execute("mkdir -p " .. P.q(dir)))
  local lines = {}
  for i = 1, count do
    local name = ("%s-%d-%d"):format(label, math.floor(rate), i)
    H.write(("%s/%d.json"):format(dir, i), json.encode { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
      metadata = { name = name, namespace = "tenant-a" },
      spec = { domain = { devices = { hostDevices = { { name = "nic", deviceName = "nvidia.com/cx7_vf" } } },
        resources = { requests = { memory = "1Gi" } } } } })
    lines[#lines + 1] = ("curl -s -o /dev/null -w '%%{http_code} %%{time_total}\\n' --max-time 30 --cacert %s --cert %s --key %s "
      .. "-H 'Content-Type: application/json' --data-binary @%s/%d.json %s/apis/kubevirt.io/v1/namespaces/tenant-a/virtualmachineinstances >>%s/times &")
      :format(P.q(c.pki .. "/ca.crt"), P.q(c.pki .. "/admin.crt"), P.q(c.pki .. "/admin.key"), P.q(dir), i, c.url, P.q(dir))
    lines[#lines + 1] = ("sleep %.4f"):format(1 / rate)
  end
  lines[#lines + 1] = "wait"
  H.write(dir .. "/run.sh", table.concat(lines, "\n") .. "\n")
  local t0 = P.sh("date +%s.%N")
  P.sh("bash " .. P.q(dir .. "/run.sh"))
  local t1 = P.sh("date +%s.%N")
  local times, errors = {}, 0
  for line in (P.read(dir .. "/times") or ""):gmatch("[^\n]+") do
    local code, t = line:match("^(%d+) ([%d%.]+)")
    if code == "201" then times[#times + 1] = tonumber(t) * 1000 else errors = errors + 1 end
  end
  table.sort(times)
  return { p50 = percentile(times, 50), p99 = percentile(times, 99),
    rate = #times / (tonumber(t1) - tonumber(t0)), errors = errors + (count - #times - errors) }
end

local c = K.start()
local ok, err = pcall(function()
  c:deploy { replicas = 1 }
  local with = {}
  for _, r in ipairs(rates) do with[r] = run(c, "webhooks", r) end
  c:must { "delete", "mutatingwebhookconfiguration", "cozygpu" }
  c:must { "delete", "validatingwebhookconfiguration", "cozygpu" }
  P.sleep(3) -- the API server's webhook configuration informer
  local without = {}
  for _, r in ipairs(rates) do without[r] = run(c, "bare", r) end
  print(("VMI creates through kube-apiserver %s, %d per rate and run (curl per request; latency as the client sees it):")
    :format(os.getenv("COZYGPU_KUBE_VERSION") or "", count))
  print(("%-10s %-14s %9s %9s %10s %7s"):format("rate/s", "run", "p50 ms", "p99 ms", "achieved/s", "errors"))
  for _, r in ipairs(rates) do
    for _, x in ipairs { { "with cozygpu", with[r] }, { "no webhooks", without[r] } } do
      print(("%-10s %-14s %9.1f %9.1f %10.1f %7d"):format(tostring(r), x[1], x[2].p50, x[2].p99, x[2].rate, x[2].errors))
    end
    print(("%-10s p99 ratio with/without webhooks: %.2f   p50 ratio: %.2f"):format(tostring(r),
      with[r].p99 / without[r].p99, with[r].p50 / without[r].p50))
  end
end)
c:stop()
if not ok then
  io.stderr:write("bench-cluster: ", tostring(err), "\n")
  os.exit(1)
end
