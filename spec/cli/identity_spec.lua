-- The Lease identity of `cozygpu controller` and `cozygpu agent` when no
-- --identity is given (decision 0032): the same rule for both
-- (lease_default_identity, core/kube/lease.h): $POD_NAME when set, else the
-- host name and 12 random hex digits, new at each start. Read from the
-- first log record that names it; no API server is needed for that (the
-- server given refuses connections).
local P = require "proc"
local json = H.json

local NOWHERE = "http://127.0.0.1:9"

local function hostname()
  local p = io.popen("hostname")
  local h = p:read("l")
  p:close()
  return h
end

describe("the default identity", function()
  local dir, certs, sysfs
  setup(function()
    dir = H.tmpdir()
    certs = P.certs(dir, { "cozygpu-webhook.cozy-gpu.svc" })
    sysfs = dir .. "/sys"
    os.execute("mkdir -p " .. H.q(sysfs .. "/bus/pci/devices") .. " " .. H.q(dir .. "/proc") .. " " .. H.q(dir .. "/state"))
  end)
  teardown(function() if dir then os.execute("rm -rf " .. H.q(dir)) end end)

  local ARGS = {
    controller = function()
      return { H.bin, "controller", "--server", NOWHERE, "--namespace", "cozy-gpu", "--tls-cert-file", certs.cert,
        "--tls-key-file", certs.key, "--address", "127.0.0.1", "--port", "0", "--state-dir", dir .. "/state",
        "--log-format", "json", "--config", "examples/config.yaml" }
    end,
    agent = function()
      return { H.bin, "agent", "--node", "gpu-1", "--server", NOWHERE, "--sysfs", sysfs, "--proc", dir .. "/proc",
        "--log-format", "json" }
    end,
  }
  local FIRST = { controller = "serving admission webhooks", agent = "starting" }

  -- The identity a `cmd` started with environment prefix `env` reports.
  local n = 0
  local function identity(cmd, env)
    n = n + 1
    local log = ("%s/%s-%d.log"):format(dir, cmd, n)
    local prefix = "unset POD_NAME;" .. (env and (" " .. env) or "")
    if H.asan then prefix = prefix .. " ASAN_OPTIONS=detect_leaks=0" end
    local pid = P.spawn(ARGS[cmd](), log, prefix)
    local id = P.wait_until(function()
      for line in (P.read(log) or ""):gmatch("[^\n]+") do
        local ok, r = pcall(json.decode, line)
        if ok and type(r) == "table" and r.msg == FIRST[cmd] then return r.identity end
      end
    end, 15)
    P.stop(pid, 5)
    assert(id, cmd .. " logged no identity:\n" .. (P.read(log) or ""))
    return id
  end

  for _, cmd in ipairs { "controller", "agent" } do
    it(cmd .. ": $POD_NAME", function()
      assert.are.equal("pod-7", identity(cmd, "POD_NAME=pod-7"))
    end)

    it(cmd .. ": without $POD_NAME, the host name and 12 random hex digits, new at each start", function()
      local a, b = identity(cmd), identity(cmd)
      assert.matches("^" .. H.pat(hostname()) .. "_%x%x%x%x%x%x%x%x%x%x%x%x$", a)
      assert.matches("^" .. H.pat(hostname()) .. "_%x%x%x%x%x%x%x%x%x%x%x%x$", b)
      assert.are_not.equal(a, b)
    end)

    it(cmd .. ": an empty $POD_NAME is not an identity", function()
      assert.matches("^" .. H.pat(hostname()) .. "_%x+$", identity(cmd, "POD_NAME="))
    end)

    it(cmd .. " --help: documents the same default", function()
      local out, _, code = H.run { cmd, "--help" }
      assert.are.equal(0, code)
      assert.matches("%$POD_NAME, else%s+HOSTNAME_RANDOM, a new suffix per start", out)
    end)
  end
end)
