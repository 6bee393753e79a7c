--- The Kubernetes API server double for specs: start it, talk to it, inject
--- faults, read its request log, run kubectl against it.
---
---   local D = require "double"
---   local d = D.start()                      -- plain HTTP on a free loopback port
---   local st, obj = d:request("GET", "/api/v1/namespaces")
---   d:fail { method = "GET", path = "/apis/cozystack.io", status = 429, retryAfter = 1, count = 2 }
---   d:stop()
---
--- The double is build/bin/kube-double (COZYGPU_BUILD picks the build
--- directory; spec/support/kube-double/double.c documents every flag and
--- the control API). Every function raises on a broken double (no answer,
--- a control call refused); API answers are returned, never raised.
local P = require "proc"
local json = require "cozygpu.json"

local D = {}

local build = os.getenv("COZYGPU_BUILD") or "build"
D.bin = os.getenv("KUBE_DOUBLE") or (build .. "/bin/kube-double")   -- KUBE_DOUBLE: another binary (e.g. the ASan build)

local Double = {}
Double.__index = Double

local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p " .. P.q(p)))
  return p
end

--- Starts a double. o (all optional):
---   tls = true            serve HTTPS with a fresh CA and certificate (d.certs = {ca, cert, key, ...})
---   client_ca = true      with tls: also accept client certificates; d.client = {cert, key} is one signed by the CA
---   token = "T"           require `Authorization: Bearer T`
---   token_file = path     same, read from the file on every request
---   history = N           watch events retained (--history)
---   bookmark_interval = s seconds between bookmarks (--bookmark-interval; default 1)
---   min_request_timeout = s   watch length without timeoutSeconds (s..2s)
---   expired_watch = "http"|"event"
---   args = {...}          further flags
---   env = "VAR=x ..."     environment for the process (e.g. ASan options)
--- Returns a double: fields url, port, pid, dir, log_path, certs, client,
--- token; methods below. Waits until the port file exists and /healthz answers.
function D.start(o)
  o = o or {}
  local d = setmetatable({ dir = tmpdir(), token = o.token }, Double)
  local argv = { D.bin, "--port", "0", "--port-file", d.dir .. "/port" }
  local scheme = "http"
  if o.tls then
    d.certs = P.certs(d.dir, { "localhost" }, "server")
    argv[#argv + 1] = "--tls-cert"; argv[#argv + 1] = d.certs.cert
    argv[#argv + 1] = "--tls-key"; argv[#argv + 1] = d.certs.key
    scheme = "https"
    if o.client_ca then
      d.client = P.certs(d.dir, { "client" }, "client")
      argv[#argv + 1] = "--client-ca"; argv[#argv + 1] = d.client.ca
    end
  end
  if o.token then argv[#argv + 1] = "--token"; argv[#argv + 1] = o.token end
  if o.token_file then argv[#argv + 1] = "--token-file"; argv[#argv + 1] = o.token_file end
  if o.history then argv[#argv + 1] = "--history"; argv[#argv + 1] = tostring(o.history) end
  if o.bookmark_interval then argv[#argv + 1] = "--bookmark-interval"; argv[#argv + 1] = tostring(o.bookmark_interval) end
  if o.min_request_timeout then argv[#argv + 1] = "--min-request-timeout"; argv[#argv + 1] = tostring(o.min_request_timeout) end
  if o.expired_watch then argv[#argv + 1] = "--expired-watch"; argv[#argv + 1] = o.expired_watch end
  for _, a in ipairs(o.args or {}) do argv[#argv + 1] = a end
  d.log_path = d.dir .. "/double.log"
  local env = o.env
  if os.getenv("COZYGPU_ASAN") == "1" then
    -- the sanitizer build: leak checking on, reports to files that stop() checks
    env = ("ASAN_OPTIONS=detect_leaks=1:log_path=%s/asan UBSAN_OPTIONS=print_stacktrace=1:log_path=%s/asan %s")
      :format(P.q(d.dir), P.q(d.dir), env or "")
  end
  d.pid = P.spawn(argv, d.log_path, env)
  local port = P.wait_until(function()
    local s = P.read(d.dir .. "/port")
    return s and tonumber(s:match("%d+"))
  end, 10)
  if not port then
    P.stop(d.pid)
    error("kube-double did not start: " .. (P.read(d.log_path) or ""))
  end
  d.port = port
  d.url = ("%s://127.0.0.1:%d"):format(scheme, port)
  assert(P.wait_until(function() return d:http { path = "/_double/state" } == 200 end, 10),
    "kube-double does not answer on " .. d.url)
  return d
end

--- Stops the double (TERM, then KILL) and returns its stderr text. Raises
--- if a sanitizer report was written (COZYGPU_ASAN=1 builds).
function Double:stop()
  P.stop(self.pid, 10)
  local reports = P.sh("cat " .. P.q(self.dir) .. "/asan.* 2>/dev/null")
  if reports ~= "" then error("kube-double sanitizer report:\n" .. reports) end
  return P.read(self.log_path) or ""
end

--- Raw HTTP to the double: o = {method, path (with query), body (string),
--- headers = {...}, token (false: send none; default the double's token),
--- cert, key (client certificate), timeout}. Returns status, body text, headers text.
function Double:http(o)
  local headers = {}
  for _, h in ipairs(o.headers or {}) do headers[#headers + 1] = h end
  local tok = o.token
  if tok == nil then tok = self.token end
  if tok then headers[#headers + 1] = "Authorization: Bearer " .. tok end
  return P.http {
    method = o.method, url = self.url .. o.path, body = o.body, headers = headers,
    cacert = self.certs and self.certs.ca, cert = o.cert, key = o.key, timeout = o.timeout,
  }
end

--- An API request. body: a table (sent as JSON) or a string. content_type
--- defaults to application/json (PATCH: application/merge-patch+json).
--- Returns status, decoded JSON body (or the raw text if not JSON), headers.
function Double:request(method, path, body, content_type, extra_headers)
  if type(body) == "table" then body = assert(json.encode(body)) end
  local ct = content_type or (method == "PATCH" and "application/merge-patch+json" or "application/json")
  local headers = { "Content-Type: " .. ct, "Accept: application/json" }
  for _, h in ipairs(extra_headers or {}) do headers[#headers + 1] = h end
  local st, text, hdrs = self:http { method = method, path = path, body = body, headers = headers }
  local v = text ~= "" and json.decode(text) or nil
  return st, v == nil and text or v, hdrs
end

local function control(self, method, path, body)
  local st, text = self:http {
    method = method, path = "/_double/" .. path, token = false,
    body = body and assert(json.encode(body)) or nil, headers = { "Content-Type: application/json" },
  }
  assert(st == 200, ("control %s %s: %d %s"):format(method, path, st, text))
  return json.decode(text)
end

--- Answers the next `count` (default 1; -1 = until clear) requests matching
--- o.method and o.path (a prefix) with o.status (500, 429, 503, 504...);
--- o.retryAfter sets Retry-After seconds; o.watch = true/false limits the
--- rule to watch / non-watch requests.
function Double:fail(o) return control(self, "POST", "fail", o) end

--- Delays matching requests ({method, path, watch}) by o.ms milliseconds,
--- o.count times (default unlimited).
function Double:latency(o) return control(self, "POST", "latency", o) end

--- Removes every fail and latency rule.
function Double:clear() return control(self, "POST", "clear") end

--- Ends open watch streams: o.resource (plural, default all) and o.mode:
--- "close" (clean end, default), "abrupt" (connection dropped without the
--- final chunk), "expired" (an ERROR event with a 410 Expired Status).
--- Returns {cut = open watches before, resources = n}.
function Double:cut(o) return control(self, "POST", "cut", o or {}) end

--- Compacts the watch history up to resourceVersion rv (a string; default
--- the current revision): watches and continue tokens from older versions
--- get 410 Expired. Returns {compacted = "F", resourceVersion = "C"}.
function Double:compact(rv) return control(self, "POST", "compact", { resourceVersion = rv }) end

--- The request log: a list of {method, path, query, userAgent, status,
--- time, contentType, watch}, oldest first (control calls excluded).
function Double:log() return control(self, "GET", "log") end

--- Empties the request log.
function Double:reset_log() return control(self, "DELETE", "log") end

--- {resourceVersion, compacted, watches, delayed (requests a latency rule
--- holds now), items} where items are the stored
--- objects of `resource` (plural) sorted by namespace/name (omitted without
--- a resource).
function Double:state(resource)
  return control(self, "GET", "state" .. (resource and ("?resource=" .. resource) or ""))
end

--- Writes a kubeconfig for the double (its CA, token, or client
--- certificate when o.client_cert) and returns its path.
function Double:kubeconfig(o)
  o = o or {}
  local path = self.dir .. "/kubeconfig" .. (o.client_cert and "-cert" or "")
  local user = {}
  if self.token and not o.client_cert then user[#user + 1] = "    token: " .. self.token end
  if o.client_cert then
    user[#user + 1] = "    client-certificate: " .. self.client.cert
    user[#user + 1] = "    client-key: " .. self.client.key
  end
  if #user == 0 then user[1] = "    {}" end
  local f = assert(io.open(path, "w"))
  f:write(table.concat({
    "apiVersion: v1", "kind: Config", "current-context: double",
    "clusters:", "- name: double", "  cluster:", "    server: " .. self.url,
    self.certs and ("    certificate-authority: " .. self.certs.ca) or "    insecure-skip-tls-verify: false",
    "users:", "- name: double", "  user:", table.concat(user, "\n"),
    "contexts:", "- name: double", "  context:", "    cluster: double", "    user: double",
  }, "\n") .. "\n")
  f:close()
  return path
end

--- Runs kubectl against the double with a throwaway kubeconfig (o as for
--- kubeconfig). args: a list. Returns stdout, stderr, exit code.
function Double:kubectl(args, o)
  local parts = { "kubectl", "--kubeconfig", P.q(self:kubeconfig(o)) }
  for _, a in ipairs(args) do parts[#parts + 1] = P.q(a) end
  local errf = os.tmpname()
  local out, code = P.sh("HOME=" .. P.q(self.dir) .. " " .. table.concat(parts, " ") .. " 2>" .. P.q(errf))
  local err = P.read(errf) or ""
  os.remove(errf)
  return out, err, code
end

--- Starts `kubectl args` in the background (e.g. get --watch), output to a
--- file. Returns {pid, read = fn() -> output so far, stop = fn()}.
function Double:kubectl_bg(args, o)
  local argv = { "kubectl", "--kubeconfig", self:kubeconfig(o) }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local out = os.tmpname()
  local pid = P.spawn(argv, out, "HOME=" .. P.q(self.dir))
  return {
    pid = pid,
    read = function() return P.read(out) or "" end,
    stop = function() P.stop(pid); local s = P.read(out) or ""; os.remove(out); return s end,
  }
end

--- Opens a watch in the background with curl: path is the collection path
--- with its query (watch=1 is added). Returns {pid, events = fn() -> list
--- of decoded events so far, text = fn(), done = fn() -> true once the
--- stream ended, stop = fn()}.
function Double:watch(path)
  local out = os.tmpname()
  local argv = { "curl", "-sN", "--max-time", "600" }
  if self.certs then argv[#argv + 1] = "--cacert"; argv[#argv + 1] = self.certs.ca end
  if self.token then argv[#argv + 1] = "-H"; argv[#argv + 1] = "Authorization: Bearer " .. self.token end
  argv[#argv + 1] = self.url .. path .. (path:find("?", 1, true) and "&" or "?") .. "watch=1"
  local pid = P.spawn(argv, out)
  local w = { pid = pid }
  function w.text() return P.read(out) or "" end
  function w.events()
    local evs = {}
    for line in w.text():gmatch("[^\n]+") do evs[#evs + 1] = json.decode(line) end
    return evs
  end
  function w.done() return not P.alive(pid) end
  function w.stop() P.stop(pid); os.remove(out) end
  return w
end

return D
