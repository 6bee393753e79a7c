--- Test support shared by every spec: the C core, fixtures, builders and a
--- runner for the `cozygpu` binary. Preloaded by .busted.
local core = require "cozygpu.core"
package.preload["cozygpu.json"] = function() return core.json end
local json = core.json

local H = {}
H.core = core
H.json = json
H.build = os.getenv("COZYGPU_BUILD") or "build"
H.bin = H.build .. "/bin/cozygpu"
H.fixtures = os.getenv("COZYGPU_FIXTURES") or "../shared/fixtures"
H.asan = os.getenv("COZYGPU_ASAN") == "1"

-- Temporary files and directories of the specs go under COZYGPU_SCRATCH
-- when it is set (`make test` sets it to a folder under the build directory
-- and removes it afterwards), so a run leaves nothing in /tmp. os.tmpname
-- keeps its contract: a new, empty file whose name is returned.
do
  local scratch = os.getenv("COZYGPU_SCRATCH")
  if scratch and scratch ~= "" then
    local n, tmpname = 0, os.tmpname
    os.tmpname = function()
      while true do
        n = n + 1
        local p = ("%s/t%d"):format(scratch, n)
        local f = io.open(p, "r")
        if f then f:close() else
          f = io.open(p, "w")
          if not f then return tmpname() end
          f:close()
          return p
        end
      end
    end
  end
end

-- Under `make test-asan` this process runs with LD_PRELOAD=libasan (the
-- sanitized core.so needs the runtime loaded first). Programs the specs
-- start do not need it, and curl, openssl or node with ASan preloaded can
-- hang or fail; so every shell command from the specs drops it. Binaries
-- built with -fsanitize carry their own runtime.
if os.getenv("LD_PRELOAD") then
  local execute, popen = os.execute, io.popen
  os.execute = function(cmd)
    if cmd == nil then return execute() end
    return execute("unset LD_PRELOAD; " .. cmd)
  end
  io.popen = function(cmd, mode) return popen("unset LD_PRELOAD; " .. cmd, mode) end
end

--- Reads a whole file.
function H.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

--- Writes a file, creating nothing else.
function H.write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

--- A fresh temporary directory (removed at process exit is not promised).
function H.tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p '" .. p .. "'"))
  return p
end

--- A policy bundle directory holding `files` ({name = text}), for
--- core.engine { policies = ... }.
function H.bundle(files)
  local dir = H.tmpdir()
  for name, text in pairs(files) do H.write(dir .. "/" .. name, text) end
  return dir
end

--- An AdmissionReview request for a Pod `p` in tenant-a with no
--- containers, and a rule named `name` on Pods whose validate body is the
--- Lua text `body` (req and cluster in scope): the smallest review and
--- hoster rule for engine specs.
function H.pod_request()
  return H.request({ apiVersion = "v1", kind = "Pod", metadata = { name = "p", namespace = "tenant-a" },
    spec = { containers = H.json.array {} } })
end

function H.pod_rule(name, body)
  return ("return rule %q { match = { kind = 'Pod' }, validate = function(req, cluster) %s end }"):format(name, body)
end

--- `s` with Lua pattern characters escaped, to match it literally inside a
--- pattern (paths carry '-' and '.').
function H.pat(s) return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0")) end

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
H.q = shell_quote

--- Runs the cozygpu binary with `args` (a list). Returns stdout, stderr,
--- exit status. Under ASan, leak checking is on for the child.
function H.run(args, env)
  local out, err = os.tmpname(), os.tmpname()
  local parts = {}
  for i, a in ipairs(args) do parts[i] = shell_quote(a) end
  local prefix = H.asan and "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 " or ""
  local cmd = ("%s%s%s %s >%s 2>%s"):format(env or "", prefix, H.bin, table.concat(parts, " "), out, err)
  local _, _, code = os.execute(cmd)
  local o, e = H.read(out), H.read(err)
  os.remove(out) os.remove(err)
  return o, e, code
end

--- Runs one of the build's other tools (H.build .. "/bin/" .. name: the
--- benches) with `args`, a shell-quoted argument string. Returns its
--- stdout and stderr together, and its exit status.
function H.run_tool(name, args)
  local log = os.tmpname()
  local _, _, code = os.execute(shell_quote(H.build .. "/bin/" .. name) .. " " .. args .. " >" .. shell_quote(log) .. " 2>&1")
  local out = H.read(log) or ""
  os.remove(log)
  return out, code
end

--- Runs a C check script (spec/core/run-*-check.sh: it compiles a
--- table-driven check program under ASan/UBSan and runs it) and asserts
--- that it ended well and its last line says "N passed, 0 failed". The
--- script builds its own sanitized binary, so LD_PRELOAD (make test-asan's
--- runtime preload) is dropped for it.
function H.sanitized_check(script)
  local luassert = require "luassert"
  local log = os.tmpname()
  local ran = os.execute("env -u LD_PRELOAD sh " .. shell_quote(script) .. " >" .. shell_quote(log) .. " 2>&1")
  local out = H.read(log) or ""
  os.remove(log)
  luassert.is_true(ran == true, out)
  luassert.matches("%d+ passed, 0 failed\n$", out)
end

--- Decodes JSON Lines output into a list of values.
function H.json_lines(text)
  local out = {}
  for line in text:gmatch("[^\n]+") do out[#out + 1] = assert(json.decode(line)) end
  return out
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
--- base64 decoding (for AdmissionResponse.patch).
function H.unbase64(s)
  s = s:gsub("[^%w%+/=]", "")
  return (s:gsub(".", function(x)
    if x == "=" then return "" end
    local r, f = "", (B64:find(x, 1, true) - 1)
    for i = 6, 1, -1 do r = r .. (f % 2 ^ i - f % 2 ^ (i - 1) > 0 and "1" or "0") end
    return r
  end):gsub("%d%d%d?%d?%d?%d?%d?%d?", function(x)
    if #x ~= 8 then return "" end
    local c = 0
    for i = 1, 8 do c = c + (x:sub(i, i) == "1" and 2 ^ (8 - i) or 0) end
    return string.char(c)
  end))
end

--- The decoded JSONPatch of a response, or nil.
function H.patch_of(resp)
  if not resp.patch then return nil end
  if resp.patchType ~= "JSONPatch" then error("patchType is " .. tostring(resp.patchType), 2) end
  return assert(json.decode(H.unbase64(resp.patch)))
end

--- Objects from manifest files or directories.
function H.objects(...)
  local out = {}
  for _, p in ipairs { ... } do
    for _, r in ipairs(assert(core.manifests(p))) do out[#out + 1] = r.object end
  end
  return out
end

--- An engine with the default policies and `objects` as the snapshot.
function H.engine(objects, settings, opts)
  local e = assert(core.engine(opts or {}))
  assert(e:set_cluster(json.array(objects or {}), settings and assert(core.config_from(settings)) or nil))
  return e
end

-- ---- builders --------------------------------------------------------

--- A GPUClass. spec fields as given.
function H.class(name, spec)
  return { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", metadata = { name = name }, spec = spec }
end

--- A Namespace with labels.
function H.namespace(name, labels)
  return { apiVersion = "v1", kind = "Namespace", metadata = { name = name, labels = labels or json.object() } }
end

--- A tenant namespace in Cozystack's tree: `chain` lists the tenant
--- namespaces from the root down, the last being this one.
function H.tenant(chain, extra)
  local labels = {}
  for _, a in ipairs(chain) do labels["tenant.cozystack.io/" .. a] = "" end
  for k, v in pairs(extra or {}) do labels[k] = v end
  return H.namespace(chain[#chain], labels)
end

--- The KubeVirt CR with permittedHostDevices: pci = {{selector, name}},
--- mdev = {{selector, name}}.
function H.kubevirt(pci, mdev)
  local p, m = json.array(), json.array()
  for _, d in ipairs(pci or {}) do p[#p + 1] = { pciVendorSelector = d[1], resourceName = d[2], externalResourceProvider = true } end
  for _, d in ipairs(mdev or {}) do m[#m + 1] = { mdevNameSelector = d[1], resourceName = d[2], externalResourceProvider = true } end
  return {
    apiVersion = "kubevirt.io/v1", kind = "KubeVirt", metadata = { name = "kubevirt", namespace = "cozy-kubevirt" },
    spec = { configuration = { permittedHostDevices = { pciHostDevices = p, mediatedDevices = m } } },
  }
end

--- A VMI. o = {namespace, name, labels, gpus = {deviceName...},
--- hostDevices = {deviceName...}, resources = {name = qty}}.
function H.vmi(o)
  o = o or {}
  local gpus, hds = json.array(), json.array()
  for i, d in ipairs(o.gpus or {}) do gpus[i] = { name = "gpu" .. i, deviceName = d } end
  for i, d in ipairs(o.hostDevices or {}) do hds[i] = { name = "hostdev" .. i, deviceName = d } end
  local devices = { disks = json.array { { name = "root", disk = { bus = "virtio" } } } }
  if #gpus > 0 then devices.gpus = gpus end
  if #hds > 0 then devices.hostDevices = hds end
  local domain = { devices = devices }
  if o.resources then domain.resources = { limits = o.resources, requests = o.resources } end
  return {
    apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
    metadata = { name = o.name or "vm1", namespace = o.namespace or "tenant-a", labels = o.labels },
    spec = { domain = domain, volumes = json.array { { name = "root", containerDisk = { image = "quay.io/containerdisks/fedora:40" } } } },
  }
end

--- An AdmissionRequest for `object` (CREATE unless op given).
--- A Pod CREATE request in namespace tenant-a with no containers: the
--- engine specs' plain input (rules under test match kind Pod).
function H.pod_request()
  return H.request({ apiVersion = "v1", kind = "Pod", metadata = { name = "p", namespace = "tenant-a" },
    spec = { containers = json.array {} } })
end

--- A new folder holding `files` ({[relative path] = text}; folders are
--- made), for a policy bundle or override. Returns its path.
function H.policy_dir(files)
  local dir = H.tmpdir()
  for name, text in pairs(files) do
    local sub = name:match("^(.*)/[^/]+$")
    if sub then os.execute("mkdir -p " .. H.q(dir .. "/" .. sub)) end
    H.write(dir .. "/" .. name, text)
  end
  return dir
end

function H.request(object, op, old)
  local group, version = object.apiVersion:match("^(.-)/(.*)$")
  if not group then group, version = "", object.apiVersion end
  return {
    uid = "0b5c2c3a-1c4b-4b1a-9a52-6d1c0c6f0001",
    kind = { group = group, version = version, kind = object.kind },
    resource = { group = group, version = version, resource = object.kind:lower() .. "s" },
    operation = op or "CREATE",
    namespace = object.metadata.namespace,
    name = object.metadata.name,
    userInfo = { username = "system:serviceaccount:cozy-kubevirt:kubevirt-controller" },
    object = object,
    oldObject = old,
  }
end

--- A virt-launcher pod for VMI `vmi_name` requesting `resources`
--- ({name = qty}) in its compute container, with `tolerations`.
function H.launcher(vmi_name, resources, tolerations, ns)
  local pod = {
    apiVersion = "v1", kind = "Pod",
    metadata = {
      generateName = "virt-launcher-" .. vmi_name .. "-", namespace = ns or "tenant-a",
      labels = { ["kubevirt.io"] = "virt-launcher", ["vm.kubevirt.io/name"] = vmi_name },
      ownerReferences = json.array { {
        apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = vmi_name,
        uid = "6e7b3e0c-0000-4000-8000-000000000001", controller = true, blockOwnerDeletion = true,
      } },
    },
    spec = { containers = json.array { {
      name = "compute", image = "quay.io/kubevirt/virt-launcher:v1.4.0",
      resources = { limits = resources, requests = resources },
    } } },
  }
  if tolerations then pod.spec.tolerations = json.array(tolerations) end
  return pod
end

_G.H = H
return H
