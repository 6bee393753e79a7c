-- What one client can hold of the webhook server (core/server/webhook_http.c,
-- decision 0015), through the test driver
-- spec/webhook/webhook_check.c and the misbehaving clients of
-- spec/webhook/clients.py: connections per address and in all, the time
-- from accept to a complete request (which a trickle of bytes does not
-- extend), and the bytes of review bodies in flight. Loopback only; every
-- client is bounded in connections and seconds. Clients from other
-- addresses bind 127.0.0.2 and up (all of 127/8 is local on Linux).
local P = require "proc"
local json = H.json
local W = require "webhook_env"

local CLIENTS = "spec/webhook/clients.py"
local MiB = 1024 * 1024

--- Starts clients.py in the background; returns {pid, out} once it has
--- written its report (decoded in .report).
local n_clients = 0
local function clients(srv, mode, args)
  n_clients = n_clients + 1
  local out = ("%s/clients-%d.json"):format(srv.dir, n_clients)
  local argv = { "python3", CLIENTS, mode, "--port", tostring(srv.port), "--out", out }
  for _, a in ipairs(args or {}) do argv[#argv + 1] = a end
  local pid = P.spawn(argv, out .. ".log")
  local report = P.wait_until(function() return P.read(out) end, 30)
  assert(report, "clients.py " .. mode .. " reported nothing: " .. (P.read(out .. ".log") or ""))
  return { pid = pid, report = json.decode(report) }
end

--- curl from source address `src`; returns status, body, seconds taken.
local function from(srv, src, path, body)
  local t0 = P.sh("date +%s.%N")
  local cmd = ("curl -sS --max-time 10 --interface %s --cacert %s -o %s/from.out -w '%%{http_code}'"):format(src,
    P.q(srv.certs.ca), P.q(srv.dir))
  if body then
    H.write(srv.dir .. "/from.json", body)
    cmd = cmd .. (" -H 'Content-Type: application/json' --data-binary @%s/from.json"):format(P.q(srv.dir))
  end
  local status = P.sh(cmd .. " " .. srv.url .. path .. " 2>/dev/null")
  local t1 = P.sh("date +%s.%N")
  return tonumber(status) or 0, P.read(srv.dir .. "/from.out") or "", tonumber(t1) - tonumber(t0)
end

local review = W.review

local function metrics(srv, src)
  local status, body = from(srv, src or "127.0.0.1", "/metrics")
  assert.equals(200, status)
  local v = {}
  for key, val in body:gmatch("\n(cozygpu_webhook_[^ ]+) (%S+)") do v[key] = tonumber(val) end
  return v
end

local function rss_kib(pid)
  return tonumber((P.read("/proc/" .. pid .. "/status") or ""):match("VmRSS:%s*(%d+)"))
end

local have_python = select(2, P.sh("python3 -c 'import ssl' 2>/dev/null")) == 0

describe("webhook client bounds", function()
  if not have_python then
    pending("needs python3 with ssl for spec/webhook/clients.py")
    return
  end
  local held = {}
  after_each(function()
    for _, c in ipairs(held) do P.stop(c.pid, 9) end
    held = {}
  end)
  local function keep(c) held[#held + 1] = c return c end

  it("idle connections above the per-address limit are closed at once; other clients are answered", function()
    -- a long request timeout: only the limits are at work here
    local srv = W.start({ args = { "--max-connections", "32", "--max-connections-per-address", "8", "--request-timeout-ms",
      "30000" } })
    finally(function() W.stop(srv) end)
    local c = keep(clients(srv, "idle", { "--n", "20", "--hold", "20" }))
    assert.equals(20, c.report.opened)
    assert.equals(12, c.report.closed_at_once)
    local status, body, took = from(srv, "127.0.0.2", "/healthz")
    assert.equals(200, status)
    assert.equals("ok", body)
    assert.is_true(took < 2, "took " .. took)
    status, body, took = from(srv, "127.0.0.2", "/validate", review("vm-limits"))
    assert.equals(200, status)
    assert.is_true(json.decode(body).response.allowed)
    assert.is_true(took < 2, "took " .. took)
    assert.equals(9, metrics(srv, "127.0.0.2").cozygpu_webhook_connections) -- 8 idle and the scrape
  end)

  it("with every connection taken by idle clients, a new client is answered once the request timeout frees them",
    function()
      local srv = W.start({ args = { "--max-connections", "16", "--max-connections-per-address", "8", "--request-timeout-ms",
        "2000" } })
      finally(function() W.stop(srv) end)
      -- four addresses, 8 each: 32 wanted, 16 allowed in all
      for i = 3, 6 do keep(clients(srv, "idle", { "--n", "8", "--src", "127.0.0." .. i, "--hold", "20" })) end
      local status, _, took = from(srv, "127.0.0.9", "/healthz")
      assert.equals(200, status)
      assert.is_true(took < 4, "took " .. took)
      -- and the idle ones are gone within the timeout (plus the reaper's 100 ms)
      local w = keep(clients(srv, "watch", { "--n", "4", "--src", "127.0.0.10", "--within", "6", "--hold", "0" }))
      assert.equals(4, w.report.closed)
      assert.is_true(w.report.seconds < 3.5, "took " .. w.report.seconds)
      assert.is_true(metrics(srv)['cozygpu_webhook_refusals_total{reason="request_timeout"}'] >= 16)
    end)

  it("closes a client that trickles its request, one byte at a time, after the request timeout", function()
    local srv = W.start({ args = { "--request-timeout-ms", "2000" } })
    finally(function() W.stop(srv) end)
    for _, stage in ipairs({ "headers", "body" }) do
      local c = keep(clients(srv, "dribble",
        { "--stage", stage, "--interval", "0.5", "--within", "15", "--hold", "0" }))
      assert.is_true(c.report.closed, stage)
      assert.is_true(c.report.seconds >= 1.5 and c.report.seconds < 3.5, stage .. ": " .. c.report.seconds)
      assert.is_true(c.report.sent >= 3, stage) -- it did send, and still was closed
    end
    -- the server still answers
    assert.equals(200, (from(srv, "127.0.0.1", "/validate", review("vm-after"))))
    assert.is_true(metrics(srv)['cozygpu_webhook_refusals_total{reason="request_timeout"}'] >= 2)
  end)

  it("lets a kept-alive connection sit idle between requests for longer than the request timeout", function()
    -- the API server reuses its connections: only the idle timeout (120s
    -- by default) ends one that waits between complete requests
    local srv = W.start({ args = { "--request-timeout-ms", "1000" } })
    finally(function() W.stop(srv) end)
    local c = keep(clients(srv, "keepalive", { "--requests", "3", "--interval", "1.5", "--hold", "0" }))
    assert.equals(3, c.report.answered, tostring(c.report.error))
  end)

  it("keeps review bodies in flight within the budget: 503 with Retry-After above it, memory bounded", function()
    local srv = W.start({ args = { "--max-body-in-flight", tostring(8 * MiB), "--request-timeout-ms", "4000" } })
    finally(function() W.stop(srv) end)
    assert.equals(200, (from(srv, "127.0.0.1", "/validate", review("vm-warm"))))
    local before = rss_kib(srv.pid)
    -- 12 bodies of 3 MiB, all but the last byte sent: 36 MiB without a budget
    local c = keep(clients(srv, "bodies", { "--n", "12", "--size", tostring(3 * MiB), "--hold", "20" }))
    assert.same({ ["503"] = 10 }, c.report.refused)
    assert.equals(2, c.report.holding)
    local m = metrics(srv)
    assert.equals(6 * MiB, m.cozygpu_webhook_body_bytes_in_flight)
    assert.equals(10, m['cozygpu_webhook_refusals_total{reason="body_budget"}'])
    local grew = rss_kib(srv.pid) - before
    -- (under AddressSanitizer RSS says little: its quarantine keeps freed memory)
    if not H.asan then assert.is_true(grew < 16 * 1024, "RSS grew by " .. grew .. " KiB") end
    -- the refusal says when to come back
    local status, body, headers = P.http({ method = "POST", url = srv.url .. "/validate", body = review("x") ..
      (" "):rep(3 * MiB - #review("x")), cacert = srv.certs.ca, headers = { "Content-Type: application/json" } })
    assert.equals(503, status)
    assert.matches("\nRetry%-After: 1\r", headers)
    assert.matches("too many review bodies in flight", body)
    -- once the holders are past the request timeout their bytes are back
    assert.truthy(P.wait_until(function() return metrics(srv).cozygpu_webhook_body_bytes_in_flight == 0 end, 8))
    assert.equals(200, (from(srv, "127.0.0.1", "/validate", review("vm-after"))))
  end)
end)
