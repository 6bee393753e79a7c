--- Process and network helpers for the integration specs: start a program
--- in the background, stop it, wait for a condition, and talk HTTP(S) with
--- the curl command line tool. Everything binds to loopback.
local P = {}

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
P.q = q

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end
P.read = read

--- Sleeps `seconds` (fractions allowed).
function P.sleep(seconds)
  os.execute(("sleep %.3f"):format(seconds))
end

--- Runs a shell command; returns stdout, exit code.
function P.sh(cmd)
  local out = os.tmpname()
  -- stdout of the shell itself goes to the file first, so a `2>&1` inside
  -- cmd goes there too (grouping with { } misplaced redirections in dash)
  local _, _, code = os.execute("exec >" .. q(out) .. "; " .. cmd)
  local s = read(out) or ""
  os.remove(out)
  return s, code
end

local started = {}

--- Starts `argv` (a list) in the background with stdout and stderr going to
--- `log` (a path). `env` is an optional string of VAR=value assignments.
--- Returns the pid (a number). Every process started here is killed when
--- the spec process exits (see P.stop_all).
function P.spawn(argv, log, env)
  local parts = {}
  for i, a in ipairs(argv) do parts[i] = q(a) end
  local pidfile = os.tmpname()
  local cmd = ("%s exec %s </dev/null >>%s 2>&1 & echo $! >%s"):format(
    env or "", table.concat(parts, " "), q(log), q(pidfile))
  assert(os.execute("(" .. cmd .. ")"))
  local pid = tonumber((read(pidfile) or ""):match("%d+"))
  os.remove(pidfile)
  assert(pid, "could not start " .. argv[1])
  started[pid] = true
  return pid
end

--- True while process `pid` exists (and is not a zombie we reaped).
function P.alive(pid)
  local s = read("/proc/" .. pid .. "/stat")
  if not s then return false end
  local state = s:match("^%d+ %b() (%a)")
  return state ~= "Z" and state ~= "X"
end

--- Sends `sig` (default TERM) to `pid`.
function P.kill(pid, sig)
  os.execute(("kill -%s %d 2>/dev/null"):format(sig or "TERM", pid))
end

--- Waits until `pid` is gone, up to `timeout` seconds. Returns true if it
--- exited.
function P.wait_exit(pid, timeout)
  return P.wait_until(function() return not P.alive(pid) end, timeout or 10)
end

--- Stops `pid`: TERM, then KILL after `grace` seconds.
function P.stop(pid, grace)
  if not pid then return end
  P.kill(pid, "TERM")
  if not P.wait_exit(pid, grace or 5) then
    P.kill(pid, "KILL")
    P.wait_exit(pid, 2)
  end
  started[pid] = nil
end

--- Kills every process this spec process started and has not stopped.
function P.stop_all()
  for pid in pairs(started) do P.kill(pid, "KILL") end
  started = {}
end

--- Polls `fn` every `step` seconds (default 0.05) until it returns a truthy
--- value or `timeout` seconds pass. Returns fn's value, or nil.
function P.wait_until(fn, timeout, step)
  local deadline = os.time() + (timeout or 10) + 1
  local t0 = os.clock()
  local n = 0
  repeat
    local v = fn()
    if v then return v end
    P.sleep(step or 0.05)
    n = n + 1
  until os.time() > deadline or (n * (step or 0.05)) > (timeout or 10)
  return nil, t0
end

--- A free loopback TCP port (asks the kernel for one; a small race is
--- possible, which the programs' bind error would show).
function P.free_port()
  local out = P.sh([[python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])' 2>/dev/null]])
  local port = tonumber(out:match("%d+"))
  if port then return port end
  -- no python: pick from a pseudo-random range and hope
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
  return math.random(20000, 60000)
end

--- Prometheus text exposition (a /metrics body) as {["name{labels}"] =
--- number}; comment lines are left out.
function P.parse_metrics(body)
  local m = {}
  for line in body:gmatch("[^\n]+") do
    if not line:match("^#") then
      local key, val = line:match("^(%S+%b{})%s+(%S+)$")
      if not key then key, val = line:match("^(%S+)%s+(%S+)$") end
      if key then m[key] = tonumber(val) end
    end
  end
  return m
end

--- HTTP(S) with curl. o = {method, url, body (string), headers = {..},
--- cacert, cert, key, insecure, timeout}. Returns status (number), body
--- (string), headers text.
function P.http(o)
  local hdr, out = os.tmpname(), os.tmpname()
  local args = { "curl", "-sS", "-o", out, "-D", hdr, "-w", "%{http_code}", "--max-time", tostring(o.timeout or 10) }
  if o.method then args[#args + 1] = "-X"; args[#args + 1] = o.method end
  for _, h in ipairs(o.headers or {}) do args[#args + 1] = "-H"; args[#args + 1] = h end
  local bodyfile
  if o.body then
    bodyfile = os.tmpname()
    local f = assert(io.open(bodyfile, "wb")); f:write(o.body); f:close()
    args[#args + 1] = "--data-binary"; args[#args + 1] = "@" .. bodyfile
  end
  if o.cacert then args[#args + 1] = "--cacert"; args[#args + 1] = o.cacert end
  if o.cert then args[#args + 1] = "--cert"; args[#args + 1] = o.cert end
  if o.key then args[#args + 1] = "--key"; args[#args + 1] = o.key end
  if o.insecure then args[#args + 1] = "-k" end
  args[#args + 1] = o.url
  local parts = {}
  for i, a in ipairs(args) do parts[i] = q(a) end
  local status = P.sh(table.concat(parts, " ") .. " 2>/dev/null")
  local body, headers = read(out) or "", read(hdr) or ""
  os.remove(out) os.remove(hdr)
  if bodyfile then os.remove(bodyfile) end
  return tonumber(status) or 0, body, headers
end

--- Makes a self-signed CA and a server certificate for `names` (DNS names;
--- 127.0.0.1 is always an IP SAN) in `dir`, with openssl. Returns paths
--- {ca, ca_key, cert, key}. `tag` distinguishes several sets in one dir.
function P.certs(dir, names, tag)
  tag = tag or "server"
  local ca, cakey = dir .. "/" .. tag .. "-ca.crt", dir .. "/" .. tag .. "-ca.key"
  local crt, key = dir .. "/" .. tag .. ".crt", dir .. "/" .. tag .. ".key"
  local san = { "IP:127.0.0.1" }
  for _, n in ipairs(names or { "localhost" }) do san[#san + 1] = "DNS:" .. n end
  local ext = dir .. "/" .. tag .. ".ext"
  local f = assert(io.open(ext, "w"))
  f:write("subjectAltName=" .. table.concat(san, ",") .. "\nextendedKeyUsage=serverAuth,clientAuth\n")
  f:close()
  local cmd = table.concat({
    ("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=%s-ca -keyout %s -out %s"):format(tag, q(cakey), q(ca)),
    ("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=%s -keyout %s -out %s.csr"):format(tag, q(key), q(crt)),
    ("openssl x509 -req -in %s.csr -CA %s -CAkey %s -CAcreateserial -days 2 -extfile %s -out %s"):format(q(crt), q(ca), q(cakey), q(ext), q(crt)),
  }, " && ")
  local _, code = P.sh("(" .. cmd .. ") 2>/dev/null")
  assert(code == 0, "openssl failed making certificates in " .. dir)
  return { ca = ca, ca_key = cakey, cert = crt, key = key }
end

return P
