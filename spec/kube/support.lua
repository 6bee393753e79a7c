--- Shared by the spec/kube specs: start and stop the API double
--- (build/bin/kube-double, helper A's), talk to its control API, and run the
--- test driver build/bin/kube_check (spec/kube/kube_check.c).
--- KUBE_CHECK=path overrides the driver (e.g. the ASan build).
local P = require "proc"
local json = H.json

local S = {}
S.driver = os.getenv("KUBE_CHECK") or (H.build .. "/bin/kube_check")
S.double_bin = H.build .. "/bin/kube-double"

--- Starts the double with extra flags (a list). Returns {pid, port, url, dir, log}.
function S.start(flags, scheme)
  local dir = H.tmpdir()
  local pf, log = dir .. "/port", dir .. "/double.log"
  local argv = { S.double_bin, "--port", "0", "--port-file", pf }
  for _, f in ipairs(flags or {}) do argv[#argv + 1] = f end
  local pid = P.spawn(argv, log)
  local port = P.wait_until(function()
    local s = P.read(pf)
    return s and tonumber(s:match("%d+"))
  end, 10)
  assert(port, "kube-double did not start: " .. (P.read(log) or ""))
  local d = { pid = pid, port = port, dir = dir, log = log,
    url = (scheme or "http") .. "://127.0.0.1:" .. port }
  return d
end

function S.stop(d)
  if d then
    P.stop(d.pid)
    os.execute("rm -rf " .. P.q(d.dir))
  end
end

--- Control or API call on a plain-HTTP double; returns status, decoded body.
function S.call(d, method, path, body, ctype)
  local st, b = P.http { method = method, url = d.url .. path, body = body and (type(body) == "string" and body or json.encode(body)),
    headers = { "Content-Type: " .. (ctype or "application/json") } }
  local ok, v = pcall(json.decode, b)
  return st, ok and v or b
end

function S.namespace(d, name)
  local st = S.call(d, "POST", "/api/v1/namespaces", ('{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"%s"}}'):format(name))
  assert(st == 201 or st == 409, "namespace " .. name .. ": " .. st)
end

--- The double's current objects of `resource`, sorted by namespace/name.
function S.state(d, resource)
  local st, v = S.call(d, "GET", "/_double/state?resource=" .. resource)
  assert(st == 200, "state " .. resource .. ": " .. tostring(st))
  return v
end

--- The double's request log (list of {method, path, query, userAgent, status, ...}).
function S.log(d)
  local st, v = S.call(d, "GET", "/_double/log")
  assert(st == 200)
  return v
end

--- Runs the driver synchronously: args is a list, env a VAR=value string.
--- Returns stdout, stderr, exit code.
function S.run(args, env)
  local q = { P.q(S.driver) }
  for i, a in ipairs(args) do q[i + 1] = P.q(a) end
  local errf = os.tmpname()
  local out, code = P.sh(("env -u KUBECONFIG -u KUBERNETES_SERVICE_HOST -u KUBERNETES_SERVICE_PORT HOME=/nonexistent %s %s 2>%s")
    :format(env or "", table.concat(q, " "), P.q(errf)))
  local err = P.read(errf) or ""
  os.remove(errf)
  return out, err, code
end

--- Decodes the driver's JSON lines.
function S.lines(text)
  local out = {}
  for l in text:gmatch("[^\n]+") do out[#out + 1] = json.decode(l) end
  return out
end

--- Deep equality of decoded JSON values (objects as maps, arrays in order).
function S.same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do
    if not S.same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

return S
