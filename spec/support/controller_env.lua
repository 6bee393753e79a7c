--- Test environment for the controller specs: the API server double with
--- the examples loaded through kubectl, TLS material, and `cozygpu
--- controller` replicas started against it. Everything on 127.0.0.1.
local P = require "proc"
local json = H.json

local E = {}

local D = require "double"

--- Starts the API server double (spec/support/double.lua). Returns it.
function E.start_double(args)
  return D.start(args and { args = args } or nil)
end

--- Runs kubectl against the double with `args` (a list); returns combined
--- output, exit code.
function E.kubectl(d, args)
  local out, err, code = d:kubectl(args)
  return (out or "") .. (err or ""), code
end

--- Loads the examples (namespaces first, then classes and the KubeVirt CR)
--- and the controller's namespace into the double, with kubectl.
function E.load_examples(d)
  local out, code = E.kubectl(d, { "apply", "-f", "deploy/crds", "-f", "examples/cluster/namespaces.yaml" })
  assert(code == 0, out)
  out, code = E.kubectl(d, { "apply", "-f", "deploy/00-namespace.yaml" })
  assert(code == 0, out)
  out, code = E.kubectl(d, { "apply", "-f", "examples/classes", "-f", "examples/cluster/kubevirt.yaml",
    "-f", "examples/cluster/quotas.yaml" })
  assert(code == 0, out)
end

--- GET a path on the double; returns decoded JSON (or nil), status.
function E.get(d, path)
  local st, v = d:request("GET", path)
  return type(v) == "table" and v or nil, st
end

--- Sends `obj` to the double (method POST/PUT/PATCH/DELETE). Returns the
--- decoded answer, status.
function E.send(d, method, path, obj, content_type)
  local st, v = d:request(method, path, obj, content_type)
  return v, st
end

--- Seconds since the epoch of an RFC 3339 UTC time ("...T..:..:..(.fff)Z").
function E.epoch(s)
  local y, mo, da, h, mi, se = s:match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):([%d%.]+)Z$")
  y, mo, da = tonumber(y), tonumber(mo), tonumber(da)
  -- days from civil (H. Hinnant's algorithm)
  y = mo <= 2 and y - 1 or y
  local era = (y >= 0 and y or y - 399) // 400
  local yoe = y - era * 400
  local doy = (153 * (mo + (mo > 2 and -3 or 9)) + 2) // 5 + da - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  local days = era * 146097 + doe - 719468
  return days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(se)
end

--- Starts one controller replica. o = {double, dir, identity, certs,
--- extra = {args...}, env}. Returns {pid, port, url, log, identity}.
function E.start_controller(o)
  local dir = o.dir
  local id = o.identity or "replica-a"
  local portfile = dir .. "/" .. id .. ".port"
  os.remove(portfile)
  local log = dir .. "/" .. id .. ".log"
  local state = dir .. "/" .. id .. ".state"
  os.execute("mkdir -p " .. P.q(state))
  local args = {
    H.bin, "controller", "--server", o.double.url, "--namespace", "cozy-gpu", "--identity", id,
    "--tls-cert-file", o.certs.cert, "--tls-key-file", o.certs.key, "--address", "127.0.0.1",
    "--port", "0", "--port-file", portfile, "--state-dir", state, "--workers", "2",
    "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "500ms",
    "--status-interval", "1s", "--log-format", "json", "--config", o.config or "examples/config.yaml",
  }
  for _, a in ipairs(o.extra or {}) do args[#args + 1] = a end
  local env = H.asan and "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1" or nil
  local pid = P.spawn(args, log, env)
  local port = P.wait_until(function()
    local s = P.read(portfile)
    return s and tonumber(s:match("%d+"))
  end, 20)
  assert(port, "controller " .. id .. " did not start; log:\n" .. (P.read(log) or ""))
  return { pid = pid, port = port, url = "https://127.0.0.1:" .. port, log = log, identity = id, cacert = o.certs.ca }
end

--- A fresh double with the examples loaded and `n` (default 2) controller
--- replicas "replica-a", "replica-b", ... against it, one of which holds
--- the Lease when this returns. o = {n, certs (reused when given), extra,
--- double_args (the double's flags, e.g. {"--without", "workloads"})}.
--- Returns {d, dir, certs, replicas = {identity = replica}}; stop it with
--- E.stop_cluster.
function E.start_cluster(o)
  o = o or {}
  local c = { dir = H.tmpdir(), replicas = {} }
  c.certs = o.certs or P.certs(c.dir, { "cozygpu-webhook.cozy-gpu.svc" })
  c.d = E.start_double(o.double_args)
  E.load_examples(c.d)
  for i = 1, o.n or 2 do
    local id = "replica-" .. string.char(96 + i)
    c.replicas[id] = E.start_controller { double = c.d, dir = c.dir, certs = c.certs, identity = id, extra = o.extra }
  end
  assert(P.wait_until(function()
    local l = E.get(c.d, "/apis/coordination.k8s.io/v1/namespaces/cozy-gpu/leases/cozygpu-controller")
    return l and l.spec and l.spec.holderIdentity ~= nil
  end, 20), "no replica took the Lease")
  return c
end

--- Stops the replicas and the double of E.start_cluster.
function E.stop_cluster(c)
  for _, r in pairs(c.replicas) do P.stop(r.pid, 5) end
  c.d:stop()
end

--- Waits until the replica answers /readyz with 200.
function E.wait_ready(c, timeout)
  return P.wait_until(function()
    local st = P.http { url = c.url .. "/readyz", cacert = c.cacert, timeout = 2 }
    return st == 200
  end, timeout or 20)
end

--- Posts an AdmissionReview (a table or JSON text) to `path` of replica c.
--- Returns status, decoded body.
function E.review(c, path, review)
  local st, body = P.http {
    method = "POST", url = c.url .. path, cacert = c.cacert, timeout = 15,
    body = type(review) == "string" and review or json.encode(review),
    headers = { "Content-Type: application/json" },
  }
  return st, json.decode(body)
end

--- Reads /metrics of replica c into {["name{labels}"] = number}.
function E.metrics(c)
  local st, body = P.http { url = c.url .. "/metrics", cacert = c.cacert, timeout = 5 }
  if st ~= 200 then return nil end
  return P.parse_metrics(body)
end

--- The JSON log records of a replica (lines that decode).
function E.log_records(c)
  local out = {}
  for line in (P.read(c.log) or ""):gmatch("[^\n]+") do
    local ok, v = pcall(json.decode, line)
    if ok and type(v) == "table" then out[#out + 1] = v end
  end
  return out
end

return E
