--- The webhook test driver (spec/webhook/webhook_check.c: core/server/ with
--- a toy review callback) started and stopped for the webhook specs.
local P = require "proc"
local assert = require "luassert"

local W = {}
W.bin = os.getenv("WEBHOOK_CHECK") or (H.build .. "/tests/webhook_check")

--- Starts the driver on a free loopback port with 2 workers: o.args are
--- extra driver options, o.dir / o.certs / o.cert / o.key reuse a folder
--- or certificates. Returns {pid, port, log, dir, certs, url}.
function W.start(o)
  o = o or {}
  local f = io.open(W.bin, "rb")
  _G.assert(f, W.bin .. " is missing: build it with `make -f bench/bench.mk " .. W.bin .. "`")
  f:close()
  local dir = o.dir or H.tmpdir()
  local certs = o.certs or P.certs(dir, { "localhost" })
  local log, pf = dir .. "/server.log", dir .. "/port"
  os.remove(pf)
  local argv = { W.bin, "--cert", o.cert or certs.cert, "--key", o.key or certs.key, "--port", "0", "--port-file", pf,
    "--workers", "2", "--log-level", "debug" }
  for _, a in ipairs(o.args or {}) do argv[#argv + 1] = a end
  local pid = P.spawn(argv, log, H.asan and "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 " or nil)
  local port = P.wait_until(function()
    local s = P.read(pf)
    return s and tonumber(s:match("%d+"))
  end, 10)
  _G.assert(port, "server did not start: " .. (P.read(log) or ""))
  return { pid = pid, port = port, log = log, dir = dir, certs = certs, url = "https://127.0.0.1:" .. port }
end

--- An AdmissionReview v1 (JSON text) of a VMI CREATE in tenant-a named
--- `name`, the driver's toy callback decides by (deny..., error..., slow-MS...,
--- see webhook_check.c); uid defaults to "uid-<name>", `annotations` go on
--- the object.
function W.review(name, uid, annotations)
  return H.json.encode {
    apiVersion = "admission.k8s.io/v1",
    kind = "AdmissionReview",
    request = {
      uid = uid or ("uid-" .. name),
      kind = { group = "kubevirt.io", version = "v1", kind = "VirtualMachineInstance" },
      resource = { group = "kubevirt.io", version = "v1", resource = "virtualmachineinstances" },
      operation = "CREATE",
      namespace = "tenant-a",
      name = name,
      object = { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
        metadata = { name = name, namespace = "tenant-a", annotations = annotations } },
      userInfo = { username = "alice" },
    },
  }
end

--- Stops the driver (TERM: drain, stop) and checks the sanitizers said
--- nothing in its log.
function W.stop(srv)
  if not srv then return end
  P.stop(srv.pid, 15)
  local log = P.read(srv.log) or ""
  assert.is_nil(log:match("AddressSanitizer") or log:match("LeakSanitizer") or log:match("runtime error"), log)
end

return W
