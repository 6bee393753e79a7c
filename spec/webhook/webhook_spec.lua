-- The admission webhook server (core/server/webhook.c) through its test driver
-- spec/webhook/webhook_check.c: TLS versions, routing and request checks as the
-- API server's webhook client expects them (k8s.io/apiserver
-- pkg/admission/plugin/webhook: POST application/json AdmissionReview v1,
-- 3 MiB request limit, response.uid = request.uid, HTTP 200 with a decision),
-- metrics in the Prometheus text format, certificate rotation without a
-- restart (in place and by a Secret volume's ..data symlink swap), and a
-- graceful stop during a slow review.
local P = require "proc"
local json = H.json
local W = require "webhook_env"

local MiB = 1024 * 1024

local review = W.review

local function post(srv, path, body, headers)
  return P.http({ method = "POST", url = srv.url .. path, body = body, cacert = srv.certs.ca,
    headers = headers or { "Content-Type: application/json" } })
end

local function get(srv, path)
  return P.http({ url = srv.url .. path, cacert = srv.certs.ca })
end

--- The served certificate's serial (hex, upper case) as a new handshake sees it.
local function served_serial(srv)
  local out = P.sh(("timeout 10 openssl s_client -connect 127.0.0.1:%d -servername localhost </dev/null 2>/dev/null | openssl x509 -noout -serial 2>/dev/null"):format(srv.port))
  return out:match("serial=(%x+)")
end

local function file_serial(path)
  return (P.sh("openssl x509 -noout -serial -in " .. P.q(path)):match("serial=(%x+)"))
end

--- Parses the text exposition format into {["name{labels}"] = number}, plus
--- the TYPE lines as types[name].
local function scrape(srv)
  local status, body, headers = get(srv, "/metrics")
  assert.equals(200, status)
  local v, types = {}, {}
  for line in body:gmatch("[^\n]+") do
    local fam, ty = line:match("^# TYPE (%S+) (%S+)$")
    if fam then types[fam] = ty
    elseif not line:match("^#") then
      local key, val = line:match("^(%S+) (%S+)$")
      assert(key, "malformed sample line: " .. line)
      v[key] = tonumber(val) or (val == "+Inf" and math.huge) or assert(nil, "bad value " .. val)
    end
  end
  return v, types, headers
end

--- Runs openssl s_client with the given protocol flag, with openssl's
--- configuration and security level out of the way (OpenSSL 3 refuses TLS
--- 1.0/1.1 at its default level 1). Returns the negotiated protocol (nil when
--- no session was established), the output and the exit code.
local function openssl_proto(port, flag)
  local out, code = P.sh(("(OPENSSL_CONF=/dev/null timeout 10 openssl s_client -connect 127.0.0.1:%d %s -cipher DEFAULT@SECLEVEL=0 </dev/null 2>&1)"):format(port, flag))
  local cipher = out:match("New, [^,]+, Cipher is ([%w_-]+)")
  -- TLS 1.3 has no SSL-Session block before the session ticket arrives
  local proto = out:match("Protocol%s*:%s*(TLSv[%d.]+)") or out:match("New, (TLSv1%.3), Cipher is")
  return cipher and proto or nil, out, code
end

describe("webhook server", function()
  local srv
  setup(function() srv = W.start({ args = { "--timeout-ms", "3000" } }) end)
  teardown(function() W.stop(srv) end)

  describe("TLS", function()
    it("negotiates TLS 1.2 and TLS 1.3", function()
      assert.equals("TLSv1.2", (openssl_proto(srv.port, "-tls1_2")))
      assert.equals("TLSv1.3", (openssl_proto(srv.port, "-tls1_3")))
    end)

    it("refuses TLS 1.1 (a client that does speak TLS 1.1 gets no session)", function()
      -- control: the same client settings complete a TLS 1.1 handshake with
      -- openssl's own server, so the refusal below is the webhook's
      local port = P.free_port()
      local log = srv.dir .. "/s_server.log"
      local pid = P.spawn({ "openssl", "s_server", "-accept", tostring(port), "-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0",
        "-cert", srv.certs.cert, "-key", srv.certs.key, "-www" }, log, "OPENSSL_CONF=/dev/null")
      finally(function() P.stop(pid) end)
      local control = P.wait_until(function() return openssl_proto(port, "-tls1_1") end, 10)
      assert.equals("TLSv1.1", control, "the control TLS 1.1 handshake failed: is TLS 1.1 compiled into openssl?")

      local proto, out, code = openssl_proto(srv.port, "-tls1_1")
      assert.is_nil(proto, out)
      assert.matches("Cipher is %(NONE%)", out)
      assert.is_not.equals(0, code)
      -- curl too
      local _, ccode = P.sh(("curl -sS -o /dev/null --tls-max 1.1 --cacert %s %s/healthz 2>/dev/null"):format(P.q(srv.certs.ca), srv.url))
      assert.equals(35, ccode) -- CURLE_SSL_CONNECT_ERROR
    end)
  end)

  describe("routing", function()
    it("answers 404 for unknown paths", function()
      assert.equals(404, (get(srv, "/nope")))
      assert.equals(404, (post(srv, "/validate/extra", review("x"))))
    end)

    it("answers 405 with Allow for a wrong method", function()
      local status, _, headers = get(srv, "/validate")
      assert.equals(405, status)
      assert.matches("\nAllow: POST\r", headers)
      status, _, headers = post(srv, "/healthz", "{}")
      assert.equals(405, status)
      assert.matches("\nAllow: GET, HEAD\r", headers)
    end)

    it("answers 415 for a body that is not application/json", function()
      local status, body = post(srv, "/validate", review("x"), { "Content-Type: text/plain" })
      assert.equals(415, status)
      assert.matches("want application/json", body)
      -- parameters are fine
      status = post(srv, "/validate", review("x"), { "Content-Type: application/json; charset=utf-8" })
      assert.equals(200, status)
    end)
  end)

  describe("request body limit (3 MiB, the API server's)", function()
    -- a valid review padded with an annotation to exactly `size` bytes
    local function padded(size)
      local base = review("big", "uid-big", { pad = "" })
      return (base:gsub('"pad":""', '"pad":"' .. ("x"):rep(size - #base) .. '"'))
    end

    it("accepts a body of exactly 3 MiB", function()
      local body = padded(3 * MiB)
      assert.equals(3 * MiB, #body)
      local status, out = post(srv, "/validate", body)
      assert.equals(200, status)
      assert.is_true(json.decode(out).response.allowed)
    end)

    it("answers 413 above it, with Content-Length or chunked", function()
      local body = padded(3 * MiB + 1)
      local status, out = post(srv, "/validate", body)
      assert.equals(413, status)
      assert.matches("above the limit of 3145728", out)
      status = post(srv, "/validate", body, { "Content-Type: application/json", "Transfer-Encoding: chunked" })
      assert.equals(413, status)
    end)
  end)

  describe("AdmissionReview checks", function()
    local cases = {
      { "not JSON", "{nope", "the body is not JSON" },
      { "a JSON array", "[]", "is not an admission.k8s.io/v1 AdmissionReview: the body is not a JSON object" },
      { "another kind", '{"apiVersion":"v1","kind":"Pod"}', 'kind is "Pod", want "AdmissionReview"' },
      { "v1beta1", '{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}',
        'apiVersion is "admission.k8s.io/v1beta1", want "admission.k8s.io/v1"' },
      { "no request", '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}', "request is missing" },
      { "no uid", '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}', "request.uid is missing" },
    }
    for _, c in ipairs(cases) do
      it("answers 400 for " .. c[1], function()
        local status, body = post(srv, "/validate", c[2])
        assert.equals(400, status)
        assert.matches("cozygpu webhook test-validate: " , body, 1, true)
        assert.matches(c[3], body, 1, true)
      end)
    end
  end)

  describe("reviews", function()
    local function answer(path, name, uid)
      local status, body = post(srv, path, review(name, uid))
      assert.equals(200, status) -- a decision, even a refusal, is HTTP 200
      local r = json.decode(body)
      assert.equals("admission.k8s.io/v1", r.apiVersion)
      assert.equals("AdmissionReview", r.kind)
      assert.equals(uid, r.response.uid)
      return r.response
    end

    it("allows and denies as the callback says, echoing request.uid", function()
      local a = answer("/validate", "vm-1", "0b1c-allow")
      assert.is_true(a.allowed)
      local d = answer("/validate", "deny-me", "0b1c-deny")
      assert.is_false(d.allowed)
      assert.equals(403, d.status.code)
      assert.equals("mutate", answer("/mutate", "vm-2", "0b1c-mut").auditAnnotations["webhook-check/phase"])
    end)

    it("refuses (fail closed) with status 500 naming the webhook when the callback fails", function()
      local e = answer("/validate", "error-x", "0b1c-err")
      assert.is_false(e.allowed)
      assert.equals(500, e.status.code)
      assert.equals("cozygpu webhook test-validate: internal error", e.status.message)
      e = answer("/mutate", "error-y", "0b1c-err2")
      assert.equals("cozygpu webhook test-mutate: internal error", e.status.message)
    end)

    it("passes a deadline of --timeout-ms from the request's arrival", function()
      local a = answer("/validate", "vm-3", "0b1c-deadline")
      local rem = tonumber(a.auditAnnotations["webhook-check/deadline-remaining-ms"])
      assert.is_true(rem <= 3000 and rem > 2000, "remaining " .. tostring(rem))
    end)
  end)

  describe("health and metrics", function()
    it("serves /healthz and /readyz", function()
      local status, body = get(srv, "/healthz")
      assert.equals(200, status)
      assert.equals("ok", body)
      status, body = get(srv, "/readyz")
      assert.equals(200, status)
      assert.equals("ok", body)
    end)

    it("counts each review once by webhook and decision, and times each", function()
      local before, types, headers = scrape(srv)
      assert.matches("Content%-Type: text/plain; version=0%.0%.4", headers)
      assert.equals("counter", types.cozygpu_admission_reviews_total)
      assert.equals("histogram", types.cozygpu_admission_review_duration_seconds)
      local sent = { allowed = 0, denied = 0, error = 0 }
      local plan = { { "/validate", "vm", "allowed", 5 }, { "/validate", "deny", "denied", 3 },
        { "/validate", "error", "error", 2 }, { "/validate", "status500", "error", 1 },
        { "/mutate", "vm", "allowed", 4 } }
      local per_hook = { ["test-validate"] = 0, ["test-mutate"] = 0 }
      for _, p in ipairs(plan) do
        for i = 1, p[4] do
          assert.equals(200, (post(srv, p[1], review(p[2] .. "-" .. i))))
        end
        local hook = p[1] == "/validate" and "test-validate" or "test-mutate"
        per_hook[hook] = per_hook[hook] + p[4]
        sent[p[3]] = sent[p[3]] + p[4]
      end
      -- requests that are not reviews are not counted
      assert.equals(400, (post(srv, "/validate", "{")))
      assert.equals(415, (post(srv, "/validate", review("x"), { "Content-Type: text/plain" })))

      local after = scrape(srv)
      local function delta(key) return (after[key] or 0) - (before[key] or 0) end
      local c = 'cozygpu_admission_reviews_total{webhook="%s",decision="%s"}'
      assert.equals(5, delta(c:format("test-validate", "allowed")))
      assert.equals(3, delta(c:format("test-validate", "denied")))
      assert.equals(3, delta(c:format("test-validate", "error")))
      assert.equals(4, delta(c:format("test-mutate", "allowed")))
      assert.equals(0, delta(c:format("test-mutate", "denied")))
      for hook, n in pairs(per_hook) do
        local h = 'cozygpu_admission_review_duration_seconds_%s{webhook="%s"%s}'
        assert.equals(n, delta(h:format("count", hook, "")))
        assert.equals(after[h:format("count", hook, "")], after[h:format("bucket", hook, ',le="+Inf"')])
        assert.is_true(delta(h:format("sum", hook, "")) > 0)
        -- cumulative buckets never decrease
        local last = 0
        for _, le in ipairs({ "0.0005", "0.001", "0.002", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf" }) do
          local v = after[h:format("bucket", hook, (',le="%s"'):format(le))]
          assert.is_not_nil(v, le)
          assert.is_true(v >= last)
          last = v
        end
      end
    end)
  end)
end)

describe("webhook readiness", function()
  it("is ready only while the ready callback says so", function()
    local dir = H.tmpdir()
    local flag = dir .. "/ready"
    local srv = W.start({ dir = dir, args = { "--ready-file", flag } })
    finally(function() W.stop(srv) end)
    local status, body = get(srv, "/readyz")
    assert.equals(503, status)
    assert.equals("not ready: no file " .. flag .. "\n", body) -- the callback's reason, its first line
    assert.equals(200, (get(srv, "/healthz")))
    H.write(flag, "")
    assert.equals(200, (get(srv, "/readyz")))
  end)
end)

describe("webhook certificate rotation", function()
  local function copy(src, dst)
    assert(os.execute(("cat %s > %s"):format(P.q(src), P.q(dst))))
  end

  it("serves new files written in place to new handshakes, without a restart", function()
    local dir = H.tmpdir()
    local a = P.certs(dir, { "localhost" }, "a")
    local b = P.certs(dir, { "localhost" }, "b")
    local crt, key = dir .. "/tls.crt", dir .. "/tls.key"
    copy(a.cert, crt) copy(a.key, key)
    local srv = W.start({ dir = dir, certs = a, cert = crt, key = key })
    finally(function() W.stop(srv) end)
    assert.equals(file_serial(a.cert), served_serial(srv))
    -- in place: the certificate first, the key a moment later (a mismatched
    -- pair in between must not be served): handshakes until the server has
    -- tried the mismatched pair (it re-reads changed files at most once a
    -- second) and said it keeps the old one, each still served a's
    copy(b.cert, crt)
    local old = file_serial(a.cert)
    local served
    assert.truthy(P.wait_until(function()
      served = served_serial(srv)
      assert.equals(old, served, "a mismatched pair was served")
      return (P.read(srv.log) or ""):find("new certificate pair does not load; keeping the old one", 1, true)
    end, 10, 0.2), "the server never tried the new certificate with the old key:\n" .. (P.read(srv.log) or ""))
    copy(b.key, key)
    local want = file_serial(b.cert)
    assert.is_not.equals(file_serial(a.cert), want)
    assert.truthy(P.wait_until(function() return served_serial(srv) == want end, 10))
    assert.is_true(P.alive(srv.pid))
    -- requests work under the new certificate (verified against its CA)
    srv.certs = b
    assert.equals(200, (get(srv, "/healthz")))
    assert.matches("serving a new certificate", P.read(srv.log))
  end)

  it("follows a Secret volume's ..data symlink swap", function()
    local dir = H.tmpdir()
    local a = P.certs(dir, { "localhost" }, "a")
    local c = P.certs(dir, { "localhost" }, "c")
    local vol = dir .. "/secret"
    assert(os.execute(("mkdir -p %s/..2024_01_01_a && cp %s %s/..2024_01_01_a/tls.crt && cp %s %s/..2024_01_01_a/tls.key"):format(
      P.q(vol), P.q(a.cert), P.q(vol), P.q(a.key), P.q(vol))))
    assert(os.execute(("cd %s && ln -s ..2024_01_01_a ..data && ln -s ..data/tls.crt tls.crt && ln -s ..data/tls.key tls.key"):format(P.q(vol))))
    local srv = W.start({ dir = dir, certs = a, cert = vol .. "/tls.crt", key = vol .. "/tls.key" })
    finally(function() W.stop(srv) end)
    local pid = srv.pid
    assert.equals(file_serial(a.cert), served_serial(srv))
    -- what the kubelet's atomic writer does: a new timestamped dir, a new
    -- ..data_tmp link to it, renamed over ..data
    assert(os.execute(("cd %s && mkdir ..2024_02_01_c && cp %s ..2024_02_01_c/tls.crt && cp %s ..2024_02_01_c/tls.key && ln -s ..2024_02_01_c ..data_tmp && mv -T ..data_tmp ..data && rm -rf ..2024_01_01_a"):format(
      P.q(vol), P.q(c.cert), P.q(c.key))))
    local want = file_serial(c.cert)
    assert.truthy(P.wait_until(function() return served_serial(srv) == want end, 10))
    assert.equals(pid, srv.pid)
    assert.is_true(P.alive(pid))
  end)

  it("keeps the old pair when a new one does not load, and says so", function()
    local dir = H.tmpdir()
    local a = P.certs(dir, { "localhost" }, "a")
    local d = P.certs(dir, { "localhost" }, "d")
    local crt, key = dir .. "/tls.crt", dir .. "/tls.key"
    copy(a.cert, crt) copy(a.key, key)
    local srv = W.start({ dir = dir, certs = a, cert = crt, key = key })
    finally(function() W.stop(srv) end)
    local old = file_serial(a.cert)
    local function warned(n)
      return P.wait_until(function()
        served_serial(srv) -- a handshake triggers the check
        local _, count = (P.read(srv.log) or ""):gsub("does not load; keeping the old one", "")
        return count >= n
      end, 10)
    end
    -- a key that is not a key
    H.write(key, "-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    assert.truthy(warned(1))
    assert.equals(old, served_serial(srv))
    -- a valid key that belongs to another certificate
    copy(d.key, key)
    assert.truthy(warned(2))
    assert.matches("does not match the certificate", P.read(srv.log))
    assert.equals(old, served_serial(srv))
    assert.equals(200, (get(srv, "/healthz")))
    -- and a good pair is picked up after that
    copy(d.cert, crt)
    local want = file_serial(d.cert)
    assert.truthy(P.wait_until(function() return served_serial(srv) == want end, 10))
  end)
end)

describe("webhook graceful stop", function()
  it("answers a review in flight, refuses new connections, then exits", function()
    local srv = W.start({ args = { "--grace-ms", "10000" } })
    finally(function() W.stop(srv) end)
    local out, rc = srv.dir .. "/slow.out", srv.dir .. "/slow.rc"
    local body = srv.dir .. "/slow.json"
    H.write(body, review("slow-3000", "uid-slow"))
    os.execute(("(curl -sS --max-time 20 --cacert %s -H 'Content-Type: application/json' --data-binary @%s -o %s -w '%%{http_code}' %s/validate > %s.code 2>/dev/null; echo $? > %s) >/dev/null 2>&1 &"):format(
      P.q(srv.certs.ca), P.q(body), P.q(out), srv.url, P.q(out), P.q(rc)))
    assert.truthy(P.wait_until(function() return (P.read(srv.log) or ""):match("slow review sleeping") end, 10))
    P.kill(srv.pid, "TERM")
    -- the listening socket is closed: a new connection is refused at once
    assert.truthy(P.wait_until(function()
      local _, code = P.sh(("curl -sS -o /dev/null --max-time 2 --cacert %s %s/healthz 2>/dev/null"):format(P.q(srv.certs.ca), srv.url))
      return code == 7 -- CURLE_COULDNT_CONNECT
    end, 5))
    assert.is_true(P.alive(srv.pid), "the server exited with a review in flight")
    assert.is_nil(P.read(rc))
    -- the slow review is answered, then the process ends
    assert.truthy(P.wait_until(function() return P.read(rc) end, 15))
    assert.equals("0", P.read(rc):match("%d+"))
    assert.equals("200", P.read(out .. ".code"))
    local r = json.decode(P.read(out))
    assert.equals("uid-slow", r.response.uid)
    assert.is_true(r.response.allowed)
    assert.truthy(P.wait_exit(srv.pid, 10))
    assert.matches("drained; stopping in_flight=0", P.read(srv.log))
  end)
end)
