-- The webhook server's review slots and threads (core/server/webhook_review.c;
-- docs/decisions/0017, 0052): a review runs first on the I/O thread that
-- read it, in a free review slot, and moves to a review thread when the
-- callback gives up there (the controller's engine does after a slice of
-- CPU time); one that must wait, waits for a review thread with a free
-- slot. So a review stuck until its deadline holds one review thread and
-- its slot, and no connection or I/O thread (decision 0017: one hostile
-- review must not delay the others). A review that waited past its
-- deadline is refused as a failure (the API server has given up on it by
-- then: it must never be allowed late), and a stop with reviews still
-- queued answers them instead of leaving their connections suspended.
local P = require "proc"
local json = H.json
local W = require "webhook_env"

local review = W.review

--- Starts one review in the background with curl; returns the file its
--- "<http code> <seconds>" lands in.
local function background(srv, name, uid)
  local body, out = srv.dir .. "/" .. uid .. ".json", srv.dir .. "/" .. uid .. ".out"
  H.write(body, review(name, uid))
  os.execute(("(curl -sS --max-time 30 --cacert %s -H 'Content-Type: application/json' --data-binary @%s -o %s.body -w '%%{http_code} %%{time_total}' %s/validate > %s.tmp 2>/dev/null; mv %s.tmp %s) >/dev/null 2>&1 &"):format(
    P.q(srv.certs.ca), P.q(body), P.q(out), srv.url, P.q(out), P.q(out), P.q(out)))
  return out
end

local function metric(srv, name)
  local _, text = P.http { url = srv.url .. "/metrics", cacert = srv.certs.ca }
  return tonumber((text or ""):match("\n" .. name .. " (%S+)"))
end

describe("webhook review threads", function()
  it("keeps answering reviews on every open connection while one review thread is stuck", function()
    local srv = W.start { args = { "--workers", "2", "--timeout-ms", "20000" } }
    finally(function() W.stop(srv) end)
    -- eight keep-alive connections, always a review outstanding on each,
    -- for 4 s; a review that holds its thread for 2 s arrives after 1 s.
    -- libmicrohttpd spreads the connections over its threads, so a server
    -- that reviews on the thread that read the request stalls every
    -- connection of that thread for those 2 s.
    local body = srv.dir .. "/load.json"
    H.write(body, review("fast", "uid-fast"))
    local load = H.build .. "/bin/cozygpu-load"
    local res = srv.dir .. "/load.out"
    os.execute(("(%s --url %s/validate --cacert %s --concurrency 8 --duration 4 --warmup 0 --label pool %s > %s.tmp 2>%s.err; mv %s.tmp %s) >/dev/null 2>&1 &"):format(
      P.q(load), srv.url, P.q(srv.certs.ca), P.q(body), P.q(res), P.q(res), P.q(res), P.q(res)))
    -- the load is under way on its connections before the stuck review
    -- arrives: the server counts its connections and has answered reviews
    -- on them (a fixed wait raced a slow start of the load client)
    local conns, fast
    assert.truthy(P.wait_until(function()
      local _, text = P.http { url = srv.url .. "/metrics", cacert = srv.certs.ca }
      conns = tonumber((text or ""):match("\ncozygpu_webhook_connections (%S+)")) or 0
      fast = 0
      for v in (text or ""):gmatch('\ncozygpu_admission_reviews_total{webhook="test%-validate",decision="allowed"} (%S+)') do
        fast = fast + tonumber(v)
      end
      return conns >= 8 and fast >= 16
    end, 10), ("the load client did not start: %s connections, %s reviews answered; %s"):format(
      tostring(conns), tostring(fast), P.read(res .. ".err") or ""))
    local stuck = background(srv, "slow-2000", "uid-stuck")
    assert.truthy(P.wait_until(function() return (P.read(srv.log) or ""):match("slow review sleeping") end, 10))
    assert.truthy(P.wait_until(function() return metric(srv, "cozygpu_webhook_review_threads_busy") == 1 end, 2))
    assert.truthy(P.wait_until(function() return P.read(res) end, 15), P.read(res .. ".err"))
    local out = P.read(res)
    local n, errors, max_ms = out:match("n=(%d+) errors=(%d+) .* max_ms=([%d.]+)")
    assert.truthy(n, out)
    assert.equals("0", errors, out)
    assert.is_true(tonumber(n) > 100, out)
    -- no review waited for the stuck one (it holds its thread 2 s)
    assert.is_true(tonumber(max_ms) < 1000, out)
    assert.truthy(P.wait_until(function() return P.read(stuck) end, 10))
    assert.equals("200", P.read(stuck):match("^(%d+)"))
  end)

  it("refuses, as a failure, a review whose deadline passed while every review thread was busy", function()
    local srv = W.start { args = { "--workers", "1", "--timeout-ms", "1000" } }
    finally(function() W.stop(srv) end)
    -- the toy callback sleeps past the deadline (a policy cannot: the
    -- engine stops it at the deadline; this stands in for a slow one)
    local stuck = background(srv, "slow-2500", "uid-stuck")
    assert.truthy(P.wait_until(function() return (P.read(srv.log) or ""):match("slow review sleeping") end, 10))
    local waiting = background(srv, "allowed-name", "uid-waiting")
    assert.truthy(P.wait_until(function() return metric(srv, "cozygpu_webhook_reviews_queued") == 1 end, 5))
    assert.truthy(P.wait_until(function() return P.read(waiting) end, 10))
    local code = P.read(waiting):match("^(%d+)")
    assert.equals("200", code)
    local r = json.decode(P.read(waiting .. ".body"))
    assert.equals("uid-waiting", r.response.uid)
    assert.is_false(r.response.allowed)
    assert.equals(500, r.response.status.code)
    assert.truthy(P.wait_until(function() return P.read(stuck) end, 10))
    local _, text = P.http { url = srv.url .. "/metrics", cacert = srv.certs.ca }
    assert.equals("1", text:match('cozygpu_admission_reviews_total{webhook="test%-validate",decision="error"} (%d+)'))
    assert.truthy(P.read(srv.log):find("deadline passed while it waited for a review thread", 1, true))
  end)

  it("answers reviews still queued when it stops, and exits cleanly", function()
    local srv = W.start { args = { "--workers", "1", "--timeout-ms", "20000", "--grace-ms", "300" } }
    local stuck = background(srv, "slow-2000", "uid-stuck")
    assert.truthy(P.wait_until(function() return (P.read(srv.log) or ""):match("slow review sleeping") end, 10))
    local queued = background(srv, "allowed-name", "uid-queued")
    assert.truthy(P.wait_until(function() return metric(srv, "cozygpu_webhook_reviews_queued") == 1 end, 5))
    P.kill(srv.pid, "TERM")
    -- the grace (300 ms) ends with both in flight; the stop answers the
    -- queued one 503 and waits for the running one
    assert.truthy(P.wait_until(function() return P.read(queued) and P.read(stuck) end, 10))
    assert.equals("503", P.read(queued):match("^(%d+)"))
    assert.equals("200", P.read(stuck):match("^(%d+)"))
    assert.truthy(P.wait_exit(srv.pid, 10))
    W.stop(srv)
  end)
end)

describe("reviews begun on the I/O thread that read them (decision 0052)", function()
  local function moved(srv)
    local _, text = P.http { url = srv.url .. "/metrics", cacert = srv.certs.ca }
    return tonumber((text or ""):match('\ncozygpu_webhook_reviews_moved_total{webhook="test%-validate"} (%S+)')) or 0
  end

  --- Sends one review and waits for its answer: the AdmissionReview.
  local function answered(srv, name, uid)
    local out = background(srv, name, uid)
    assert.truthy(P.wait_until(function() return P.read(out) end, 15))
    assert.equals("200", P.read(out):match("^(%d+)"))
    local r = json.decode(P.read(out .. ".body"))
    assert.equals(uid, r.response.uid)
    assert.is_true(r.response.allowed)
    return r.response.auditAnnotations["webhook-check/ran-on"]
  end

  it("answers a review where it was read, and moves one the callback gives up on to a review thread", function()
    local srv = W.start { args = { "--workers", "2", "--timeout-ms", "20000" } }
    finally(function() W.stop(srv) end)
    assert.equals("io-thread", answered(srv, "allowed-name", "uid-1"))
    assert.equals(0, moved(srv))
    -- the toy callback gives up on the I/O thread, as the controller's
    -- engine does once its slice is spent; the review runs again, whole,
    -- on a review thread, and its answer is that run's
    assert.equals("review-thread", answered(srv, "slow-300", "uid-2"))
    assert.equals(1, moved(srv))
    local log = P.read(srv.log)
    local at_move, at_sleep = log:find("slow review moved to a review thread", 1, true), log:find("slow review sleeping", 1, true)
    assert.truthy(at_move and at_sleep and at_move < at_sleep, log)
    assert.equals("io-thread", answered(srv, "allowed-name", "uid-3"))
    assert.equals(1, moved(srv))
  end)

  it("sends every review to a review thread with --inline-max-body 0, and a body above it", function()
    local srv = W.start { args = { "--workers", "2", "--inline-max-body", "0" } }
    finally(function() W.stop(srv) end)
    assert.equals("review-thread", answered(srv, "allowed-name", "uid-1"))
    assert.equals("review-thread", answered(srv, "slow-100", "uid-2"))
    assert.equals(0, moved(srv))
    W.stop(srv)
    srv = W.start { args = { "--workers", "2", "--inline-max-body", "64" } } -- every review body is longer
    assert.equals("review-thread", answered(srv, "allowed-name", "uid-3"))
  end)
end)
