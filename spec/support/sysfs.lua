--- Fake sysfs trees for the inventory, layout and agent specs.
---
--- `sysfs.build(description)` writes a tree that follows
--- ../shared/fixtures/sysfs/LAYOUT.md (cited below as "LAYOUT §n") under a
--- fresh temporary directory and returns a Tree object; `tree:remove()`
--- deletes it. `sysfs.from_lspci(path)` turns an lspci / nvidia-smi /
--- device-plugin sample from ../shared/fixtures/lspci/ into a description.
---
--- Layout written for a function with address BDF (DDDD:BB:DD.F):
---
---   <base>/sys                                   tree.root (the --sysfs root)
---     devices/pci<DDDD>:<BB>/<BDF>/               the function's directory
---     devices/pci<DDDD>:<RB>/<PORT>/<BDF>/        ... when `port` names a root port
---     bus/pci/devices/<BDF> -> ../../../devices/pci<DDDD>:<BB>/<BDF>
---     bus/pci/drivers/<name>/<BDF> -> ../../../../devices/.../<BDF>
---     kernel/iommu_groups/<N>/devices/<BDF> -> ../../../../devices/.../<BDF>
---     class/mdev_bus/<BDF> -> ../../devices/.../<BDF>        (mdev parents only)
---     bus/mdev/devices/<uuid> -> ../../../devices/.../<BDF>/<uuid>
---   <base>/proc/<pid>/fd/<n> -> /dev/vfio/<group>   (tree:hold, a fake /proc)
---
--- Every relative link resolves inside the tree (the depth of `../` follows
--- the directory's depth, as on a real host: LAYOUT §3 "depth varies").
--- SR-IOV VFs are siblings of their PF (same parent directory), as on a
--- host, so `physfn -> ../<PF>` and `virtfn<N> -> ../<VF>` resolve.
---
--- Example (an L40S PF with 4 VFs, two running L40S-24Q, and an unbound T4):
---
---     local sysfs = require "sysfs"
---     local tree = sysfs.build { functions = {
---       { address = "0000:41:00.0", device = "26b9", subsystem = "10de:1851",
---         driver = "nvidia", iommu = 45, numa = 0,
---         sriov = { total = 32, vfs = 4, offset = 4, stride = 1, iommu = 46,
---           vgpu = { creatable = "l40s-full-catalog.txt",
---                    current = { [0] = 1155, [1] = 1155 } } } },
---       { address = "0000:c1:00.0", device = "1eb8", iommu = 90 },
---     } }
---     tree:set_vgpu("0000:41:00.6", 1153)       -- nvidia/current_vgpu_type
---     local pid = tree:hold("0000:41:00.4")     -- a QEMU holding /dev/vfio/46
---     local inv = sysfs.inventory(tree)          -- cozygpu inventory --output json
---     tree:remove()
---
--- Directories and links are made with LuaFileSystem (lfs, a dependency of
--- busted itself, so present wherever the specs run), files with io.open,
--- and trees are removed with `rm -rf` through os.execute.
local lfs = require "lfs"

local M = {}

-- ---- small file-system helpers ------------------------------------------

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function helper() return rawget(_G, "H") end

--- The fixtures directory (H.fixtures, else $COZYGPU_FIXTURES, else
--- ../shared/fixtures relative to the repository).
function M.fixtures()
  local H = helper()
  return (H and H.fixtures) or os.getenv("COZYGPU_FIXTURES") or "../shared/fixtures"
end

--- The PCI ID database excerpt the specs pass as --pci-ids
--- (fixtures/sysfs/pci-ids/pci.ids.10de-excerpt.txt).
function M.pci_ids()
  return M.fixtures() .. "/sysfs/pci-ids/pci.ids.10de-excerpt.txt"
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local function exists(path) return lfs.symlinkattributes(path, "mode") ~= nil end

local function isdir(path) return lfs.attributes(path, "mode") == "directory" end

local function mkdirp(path)
  if isdir(path) then return end
  local acc = path:sub(1, 1) == "/" and "" or "."
  for part in path:gmatch("[^/]+") do
    acc = acc .. "/" .. part
    if not isdir(acc) then
      local ok, err = lfs.mkdir(acc)
      if not ok and not isdir(acc) then error("mkdir " .. acc .. ": " .. tostring(err), 3) end
    end
  end
end

local function symlink(target, path)
  if exists(path) then os.remove(path) end
  local ok, err = lfs.link(target, path, true)
  if not ok then error("symlink " .. path .. " -> " .. target .. ": " .. tostring(err), 3) end
end

local function readlink(path) return lfs.symlinkattributes(path, "target") end

local function rm_rf(path)
  if path and path ~= "" and path ~= "/" then os.execute("rm -rf " .. q(path)) end
end

local function listdir(path)
  local out = {}
  if not isdir(path) then return out end
  for e in lfs.dir(path) do
    if e ~= "." and e ~= ".." then out[#out + 1] = e end
  end
  table.sort(out)
  return out
end

local function basename(p) return (p:match("([^/]+)/*$")) end

local function up(n) return ("../"):rep(n) end

-- A fresh directory: os.tmpname (redirected into COZYGPU_SCRATCH by the
-- spec helper), then remove the file and make a directory of that name.
local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  mkdirp(p)
  return p
end

--- File helpers for specs: sysfs.read(path) (contents or nil),
--- sysfs.write(path, text), sysfs.readlink(path) (target text or nil),
--- sysfs.listdir(path) (sorted names without . and .., {} when absent).
M.read, M.write, M.readlink, M.listdir = read, write, readlink, listdir

-- ---- addresses and ids ----------------------------------------------------

--- Parses a PCI address: `DDDD:BB:DD.F`, `BB:DD.F` (domain 0000), or the
--- nvidia-smi form `DDDDDDDD:BB:DD.F`. Returns {domain, bus, dev, fn}
--- (integers) or nil.
function M.parse_address(s)
  if type(s) ~= "string" then return nil end
  local d, b, v, f = s:match("^(%x+):(%x%x):(%x%x)%.(%x)$")
  if not d then
    b, v, f = s:match("^(%x%x):(%x%x)%.(%x)$")
    d = "0"
  end
  if not b then return nil end
  return { domain = tonumber(d, 16), bus = tonumber(b, 16), dev = tonumber(v, 16), fn = tonumber(f, 16) }
end

--- The full lowercase `DDDD:BB:DD.F` form of an address (string or parsed).
function M.address(a)
  if type(a) == "string" then a = assert(M.parse_address(a), "not a PCI address: " .. a) end
  return ("%04x:%02x:%02x.%x"):format(a.domain, a.bus, a.dev, a.fn)
end

--- The address of VF `index` (0-based) of PF `pf`: PF devfn + offset +
--- stride * index, carried into the next device number and bus
--- (LAYOUT §3: `0000:3b:00.0` offset 4 → `0000:3b:00.4 … 0000:3b:01.3`).
function M.vf_address(pf, offset, stride, index)
  local p = assert(M.parse_address(pf), "not a PCI address: " .. tostring(pf))
  local devfn = p.dev * 8 + p.fn + offset + stride * index
  local bus = p.bus + devfn // 256
  devfn = devfn % 256
  assert(bus <= 0xff, "VF address beyond bus ff")
  return M.address { domain = p.domain, bus = bus, dev = devfn // 8, fn = devfn % 8 }
end

local function hex4(s, what)
  if s == nil then return nil end
  if type(s) == "number" then return ("%04x"):format(s) end
  local h = tostring(s):lower():gsub("^0x", "")
  assert(h:match("^%x+$") and #h <= 4, (what or "id") .. " is not a 16-bit hex id: " .. tostring(s))
  return ("%04x"):format(tonumber(h, 16))
end

local function class6(s)
  local h = tostring(s or "0302"):lower():gsub("^0x", "")
  if #h == 4 then h = h .. "00" end
  assert(h:match("^%x%x%x%x%x%x$"), "class must be 4 or 6 hex digits: " .. tostring(s))
  return h
end

local function subsystem_of(v, vendor)
  if v == false then return false end
  if v == nil then return { vendor, "0000" } end
  if type(v) == "string" then
    local a, b = v:match("^(%x+):(%x+)$")
    assert(a, "subsystem must be 'vvvv:dddd' or {vendor, device}: " .. v)
    return { hex4(a), hex4(b) }
  end
  return { hex4(v[1] or v.vendor), hex4(v[2] or v.device) }
end

-- ---- vGPU catalogs (LAYOUT §5) -----------------------------------------------

local HARVESTER = "/sysfs/harvester-pcidevices-testdata/sys"
local A2_TYPES = HARVESTER .. "/class/mdev_bus/0000:08:01.7/mdev_supported_types"

--- Text of a `creatable_vgpu_types` file (LAYOUT §5) from CATALOG:
---   * a file name in fixtures/sysfs/creatable_vgpu_types/
---     (`"l40s-full-catalog.txt"`, `"header-only-fully-consumed.txt"`, ...),
---     read at build time, byte for byte;
---   * `"harvester-l40s"`: the harvester capture of L40S VF 0000:26:00.4;
---   * a path containing "/": that file;
---   * text containing a newline: used as is;
---   * a list of rows `{id, name}` (or `{id=, name=}`): the header
---     `ID    : vGPU Name` then `%-6s: %s` rows, the kernel's format;
---   * `{}`: the header only (a fully consumed card).
function M.catalog(c)
  if type(c) == "table" then
    local lines = { "ID    : vGPU Name" }
    for _, r in ipairs(c) do
      lines[#lines + 1] = ("%-6s: %s"):format(tostring(r.id or r[1]), r.name or r[2])
    end
    return table.concat(lines, "\n") .. "\n"
  end
  assert(type(c) == "string", "a catalog is a fixture name, a path, text or a list of {id, name}")
  if c:find("\n", 1, true) then return c end
  local path
  if c == "harvester-l40s" then
    path = M.fixtures() .. HARVESTER .. "/bus/pci/devices/0000:26:00.4/nvidia/creatable_vgpu_types"
  elseif c:find("/", 1, true) then
    path = c
  else
    path = M.fixtures() .. "/sysfs/creatable_vgpu_types/" .. c
  end
  return assert(read(path), "cannot read vGPU catalog " .. path)
end

--- Rows of a `creatable_vgpu_types` text: a list of {id = number, name =
--- string} after the header (a header is a first line not starting with a
--- number), in file order. The specs' own reading of LAYOUT §5.
function M.catalog_rows(text)
  local rows = {}
  for line in text:gmatch("[^\n]+") do
    local id, name = line:match("^%s*(%d+)%s*:%s*(.-)%s*$")
    if id then rows[#rows + 1] = { id = tonumber(id), name = name } end
  end
  return rows
end

--- Mediated-device types (LAYOUT §6) from TYPES:
---   * `"a2"`: the 15 types of the harvester capture of A2 VF 0000:08:01.7
---     (`nvidia-742` … `nvidia-756`), files read at build time;
---   * a path to an `mdev_supported_types` directory: its types;
---   * a list of {type = "nvidia-742", name =, description =, available =,
---     device_api = "vfio-pci"}.
--- Returns the list in the form above (file contents byte for byte in
--- `raw` when read from a directory).
function M.mdev_types(types)
  if type(types) == "table" then return types end
  local dir = types == "a2" and (M.fixtures() .. A2_TYPES) or types
  assert(isdir(dir), "no mdev_supported_types directory " .. tostring(dir))
  local out = {}
  for _, t in ipairs(listdir(dir)) do
    local d = dir .. "/" .. t
    out[#out + 1] = {
      type = t,
      raw = {
        name = read(d .. "/name"), description = read(d .. "/description"),
        available_instances = read(d .. "/available_instances"), device_api = read(d .. "/device_api"),
      },
    }
  end
  table.sort(out, function(a, b)
    return tonumber(a.type:match("(%d+)$") or 0) < tonumber(b.type:match("(%d+)$") or 0)
  end)
  return out
end

-- ---- description ----------------------------------------------------------

--- A tree description:
---
---     { functions = { FN, ... }, dir = optional empty base directory }
---
--- FN (one PCI function; the PF of an SR-IOV device brings its VFs):
---
---   address    "0000:41:00.0" (or "41:00.0": domain 0000)      required
---   vendor     "10de" (default)         -> `vendor` 0x10de   (LAYOUT §2)
---   device     "26b9"                   -> `device`                 required
---   class      "0302" or "030200" (default "0302") -> `class` 0x030200
---   subsystem  {"10de", "1851"} or "10de:1851"; default {vendor, "0000"};
---              false: no subsystem_* files (libpci then falls back to
---              config space, where the builder leaves zeros at 0x2c)
---   revision   "a1" (default)           -> `revision` 0xa1 (and config 0x08);
---              false: no `revision` file, config 0x08 still a1
---   numa       0; default -1 (unknown); false: no numa_node file
---   driver     "nvidia", "vfio-pci", "snd_hda_intel", ...; nil: unbound
---   iommu      45 (the group number); nil: no IOMMU
---   port       "0000:40:01.1": put the function below this root port
---              (devices/pci0000:40/0000:40:01.1/<BDF>) and add the port
---              itself (AMD 1022:1483, class 0604, driver pcieport)
---   cdev       7: an iommufd VFIO cdev, `<BDF>/vfio-dev/vfio7/`
---   vgpu       VGPU: an `nvidia/` directory on this function (LAYOUT §5)
---   mdev       MDEV: make the function a mediated-device parent (LAYOUT §6)
---   sriov      SRIOV: make it a PF (LAYOUT §3, §4)
---
--- VGPU on a function: { creatable = CATALOG (see sysfs.catalog; default the
--- header only), current = type id (default 0) }.
---
--- SRIOV: { total = 32, vfs = 4 (sriov_numvfs), offset = 4, stride = 1,
---   vf_device = device id of the VFs (default the PF's: LAYOUT §2),
---   vf_driver = driver of the VFs (default the PF's; false: unbound),
---   vf_subsystem = (default {vendor, "0000"}, as the A2 VF capture),
---   iommu = group of VF 0, VF i gets iommu + i; or a list {[1] = VF 0, ...};
---           default: when the PF has a group, the next free numbers above
---           every group the description names; false: VFs without a group,
---   vgpu = { creatable = CATALOG for every VF (default the header only),
---            creatable_for = {[i] = CATALOG} per VF index (0-based),
---            current = {[i] = type id} or one id for every VF (default 0) },
---   mdev = MDEV on every VF,
---   vf = {[i] = {driver =, iommu =, numa =, subsystem =, cdev =, mdev =}}
---        per-VF overrides (driver = false: unbound) }
---
--- MDEV: { types = "a2" | directory | list (see sysfs.mdev_types),
---   available = n for every type, or {["nvidia-746"] = n},
---   devices = {["nvidia-746"] = {"<uuid>", ...}} created mediated devices }.
---
--- Unknown keys are ignored (from_lspci keeps its notes in `sample`).

local BRIDGE = { vendor = "1022", device = "1483", class = "060400", driver = "pcieport" }

-- ---- the tree ---------------------------------------------------------------

local Tree = {}
Tree.__index = Tree

local function config_bytes(r)
  local b = {}
  for i = 1, 256 do b[i] = 0 end
  local function w8(off, v) b[off + 1] = v & 0xff end
  local function w16(off, v) w8(off, v) w8(off + 1, v >> 8) end
  if r.vf then
    -- a VF's Vendor/Device ID registers read 0xffff (PCIe SR-IOV spec; the
    -- A2 VF capture's config starts `ffff ffff`); the kernel's `vendor` and
    -- `device` files carry the real ids.
    w16(0, 0xffff) w16(2, 0xffff)
  else
    w16(0, tonumber(r.vendor, 16)) w16(2, tonumber(r.device, 16))
  end
  w16(4, 0x0000)                                  -- command
  w16(6, 0x0000)                                  -- status: no capability list
  w8(0x08, tonumber(r.revision or "a1", 16))
  w8(0x09, tonumber(r.class:sub(5, 6), 16))       -- prog-if
  w8(0x0a, tonumber(r.class:sub(3, 4), 16))       -- subclass
  w8(0x0b, tonumber(r.class:sub(1, 2), 16))       -- base class
  if r.bridge then
    w8(0x0e, 0x01)                                -- header type 1
    w8(0x18, r.a.bus) w8(0x19, r.secondary or 0) w8(0x1a, r.secondary or 0)
  else
    w8(0x0e, 0x00)
    if r.subsystem then
      w16(0x2c, tonumber(r.subsystem[1], 16)) w16(0x2e, tonumber(r.subsystem[2], 16))
    end
  end
  return string.char(table.unpack(b))
end

local function uevent(r)
  local lines = {}
  if r.driver then lines[#lines + 1] = "DRIVER=" .. r.driver end
  local ss = r.subsystem or { "0000", "0000" }
  local c = tonumber(r.class, 16)
  lines[#lines + 1] = ("PCI_CLASS=%X"):format(c)
  lines[#lines + 1] = ("PCI_ID=%s:%s"):format(r.vendor:upper(), r.device:upper())
  lines[#lines + 1] = ("PCI_SUBSYS_ID=%s:%s"):format(ss[1]:upper(), ss[2]:upper())
  lines[#lines + 1] = "PCI_SLOT_NAME=" .. r.bdf
  lines[#lines + 1] = "MODALIAS=" .. r.modalias
  return table.concat(lines, "\n") .. "\n"
end

local function modalias(r)
  local ss = r.subsystem or { "0000", "0000" }
  return ("pci:v%08Xd%08Xsv%08Xsd%08Xbc%ssc%si%s"):format(tonumber(r.vendor, 16), tonumber(r.device, 16),
    tonumber(ss[1], 16), tonumber(ss[2], 16), r.class:sub(1, 2):upper(), r.class:sub(3, 4):upper(),
    r.class:sub(5, 6):upper())
end

--- Builds the tree. `desc` is a description (see above). Returns a Tree:
---   tree.base   the temporary directory holding everything
---   tree.root   `<base>/sys`, the sysfs root to pass as --sysfs
---   tree.proc   `<base>/proc`, the fake /proc (made on the first hold)
--- Errors (raised) on a malformed description or a duplicate address.
function M.build(desc)
  desc = desc or {}
  local base = desc.dir or tmpdir()
  mkdirp(base)
  local t = setmetatable({
    base = base, root = base .. "/sys", proc = base .. "/proc",
    fns = {}, next_group = 0, next_pid = 4242,
  }, Tree)
  for _, d in ipairs { "devices", "bus/pci/devices", "bus/pci/drivers", "kernel/iommu_groups" } do
    mkdirp(t.root .. "/" .. d)
  end
  -- groups the description names, so automatic VF groups avoid them
  local function see(n) if type(n) == "number" and n >= t.next_group then t.next_group = n + 1 end end
  for _, fn in ipairs(desc.functions or {}) do
    see(fn.iommu)
    local s = fn.sriov
    if s then
      if type(s.iommu) == "number" then see(s.iommu + (s.vfs or 0) - 1) end
      if type(s.iommu) == "table" then for _, g in ipairs(s.iommu) do see(g) end end
      for _, o in pairs(s.vf or {}) do see(o.iommu) end
    end
  end
  local ok, err = pcall(function()
    for _, fn in ipairs(desc.functions or {}) do t:add(fn) end
  end)
  if not ok then
    rm_rf(base)
    error(err, 2)
  end
  return t
end

--- Adds one function (FN as in the description; a PF brings its VFs) to a
--- built tree. Returns its address.
function Tree:add(fn)
  local a = assert(M.parse_address(fn.address), "function without a valid address: " .. tostring(fn.address))
  local bdf = M.address(a)
  assert(not self:_present(bdf), "duplicate function " .. bdf)
  local vendor = hex4(fn.vendor or "10de", "vendor")
  local r = {
    bdf = bdf, a = a, vendor = vendor, device = assert(hex4(fn.device, "device"), bdf .. ": device is required"),
    class = class6(fn.class), subsystem = subsystem_of(fn.subsystem, vendor),
    revision = fn.revision ~= false and ("%02x"):format(tonumber(tostring(fn.revision or "a1"):gsub("^0x", ""), 16)),
    numa = fn.numa == nil and -1 or fn.numa, driver = fn.driver or nil, iommu = fn.iommu, cdev = fn.cdev,
    vgpu = fn.vgpu, mdev = fn.mdev, bridge = fn.bridge, secondary = fn.secondary,
  }
  if fn.sriov then
    r.sriov = {}
    for k, v in pairs(fn.sriov) do r.sriov[k] = v end
  end
  -- parent directory
  if fn.parent_rel then
    r.parent_rel = fn.parent_rel
  elseif fn.port then
    local port = M.address(fn.port)
    local p = M.parse_address(port)
    if not self:_present(port) then
      self:add { address = port, vendor = BRIDGE.vendor, device = BRIDGE.device, class = BRIDGE.class,
        driver = BRIDGE.driver, subsystem = { BRIDGE.vendor, BRIDGE.device }, revision = "00",
        numa = fn.numa, bridge = true, secondary = a.bus }
    end
    r.parent_rel = ("devices/pci%04x:%02x/%s"):format(p.domain, p.bus, port)
    assert(self.fns[port].rel == r.parent_rel, "root port " .. port .. " must sit directly on its root bus")
  else
    r.parent_rel = ("devices/pci%04x:%02x"):format(a.domain, a.bus)
  end
  self:_write_function(r)
  if r.sriov then self:_sriov(r) end
  return bdf
end

function Tree:_write_function(r)
  local root = self.root
  r.rel = r.parent_rel .. "/" .. r.bdf
  r.depth = select(2, r.rel:gsub("/", "")) + 1
  r.dir = root .. "/" .. r.rel
  assert(not exists(r.dir), "function directory exists already: " .. r.dir)
  mkdirp(r.dir)
  r.modalias = modalias(r)
  local d = r.dir .. "/"
  -- identity (LAYOUT §2)
  write(d .. "vendor", "0x" .. r.vendor .. "\n")
  write(d .. "device", "0x" .. r.device .. "\n")
  write(d .. "class", "0x" .. r.class .. "\n")
  if r.subsystem then
    write(d .. "subsystem_vendor", "0x" .. r.subsystem[1] .. "\n")
    write(d .. "subsystem_device", "0x" .. r.subsystem[2] .. "\n")
  end
  if r.revision then write(d .. "revision", "0x" .. r.revision .. "\n") end
  if r.numa ~= false then write(d .. "numa_node", ("%d\n"):format(r.numa)) end
  write(d .. "uevent", uevent(r))
  write(d .. "modalias", r.modalias .. "\n")
  write(d .. "config", config_bytes(r))
  -- what libpci's sysfs method or lspci may read besides (LAYOUT §2)
  write(d .. "irq", "0\n")
  write(d .. "resource", ("0x0000000000000000 0x0000000000000000 0x0000000000000000\n"):rep(13))
  write(d .. "enable", "1\n")
  write(d .. "power_state", "D0\n")
  write(d .. "reset_method", r.bridge and "" or "flr\n")
  write(d .. "driver_override", "(null)\n")
  write(d .. "local_cpulist", "0-15\n")
  write(d .. "remove", "")
  write(d .. "rescan", "")
  symlink(up(r.depth) .. "bus/pci", d .. "subsystem")
  -- bus/pci/devices/<BDF> (LAYOUT §1)
  symlink("../../../" .. r.rel, root .. "/bus/pci/devices/" .. r.bdf)
  self.fns[r.bdf] = r
  if r.driver then self:_bind(r, r.driver) end
  if r.iommu then self:_group(r, r.iommu) end
  if r.cdev then
    mkdirp(d .. "vfio-dev/vfio" .. r.cdev)
    write(d .. "vfio-dev/vfio" .. r.cdev .. "/dev", ("511:%d\n"):format(r.cdev))
  end
  if r.vgpu then self:_vgpu(r, r.vgpu) end
  if r.mdev then self:_mdev(r, r.mdev) end
end

-- driver link and the driver's link back (LAYOUT §3)
function Tree:_bind(r, name)
  local drv = self.root .. "/bus/pci/drivers/" .. name
  if not isdir(drv) then
    mkdirp(drv)
    write(drv .. "/bind", "") write(drv .. "/unbind", "") write(drv .. "/new_id", "") write(drv .. "/remove_id", "")
  end
  symlink(up(r.depth) .. "bus/pci/drivers/" .. name, r.dir .. "/driver")
  symlink("../../../../" .. r.rel, drv .. "/" .. r.bdf)
  r.driver = name
  write(r.dir .. "/uevent", uevent(r))
end

-- iommu_group link and the group's member link (LAYOUT §3)
function Tree:_group(r, n)
  local g = self.root .. "/kernel/iommu_groups/" .. n
  mkdirp(g .. "/devices")
  if not exists(g .. "/type") then write(g .. "/type", "DMA\n") write(g .. "/reserved_regions", "") end
  symlink(up(r.depth) .. "kernel/iommu_groups/" .. n, r.dir .. "/iommu_group")
  symlink("../../../../" .. r.rel, g .. "/devices/" .. r.bdf)
  r.iommu = n
end

-- nvidia/ (LAYOUT §5; the six files of the RTX PRO 6000 capture)
function Tree:_vgpu(r, v)
  local n = r.dir .. "/nvidia/"
  mkdirp(n)
  write(n .. "creatable_vgpu_types", M.catalog(v.creatable or {}))
  write(n .. "current_vgpu_type", ("%d\n"):format(v.current or 0))
  write(n .. "gpu_instance_id", "")
  write(n .. "placement_id", "0\n")
  write(n .. "vgpu_params", "\n")
  write(n .. "warm_update", "0\n")
end

-- mdev_supported_types/ and class/mdev_bus/<BDF> (LAYOUT §6)
function Tree:_mdev(r, m)
  local types = M.mdev_types(m.types or "a2")
  local base = r.dir .. "/mdev_supported_types/"
  mkdirp(base)
  for _, ty in ipairs(types) do
    local d = base .. ty.type .. "/"
    mkdirp(d .. "devices")
    local raw = ty.raw or {}
    local avail = type(m.available) == "table" and m.available[ty.type] or m.available
    write(d .. "name", raw.name or (ty.name .. "\n"))
    write(d .. "description", raw.description or ((ty.description or "") .. "\n"))
    write(d .. "device_api", raw.device_api or ((ty.device_api or "vfio-pci") .. "\n"))
    if avail ~= nil or not raw.available_instances then
      write(d .. "available_instances", ("%d\n"):format(avail or ty.available or 0))
    else
      write(d .. "available_instances", raw.available_instances)
    end
    write(d .. "create", "")
  end
  mkdirp(self.root .. "/class/mdev_bus")
  symlink("../../" .. r.rel, self.root .. "/class/mdev_bus/" .. r.bdf)
  for ty, uuids in pairs(m.devices or {}) do
    for _, u in ipairs(uuids) do self:create_mdev(r.bdf, ty, u) end
  end
end

--- Creates mediated device `uuid` of type `ty` ("nvidia-746") on parent
--- `bdf` (LAYOUT §6): `<BDF>/<uuid>/` with `mdev_type ->
--- ../mdev_supported_types/<ty>` and `remove`, the type's
--- `devices/<uuid> -> ../../../<uuid>`, and `bus/mdev/devices/<uuid>`.
--- available_instances is left as it is (set it with tree:write).
function Tree:create_mdev(bdf, ty, uuid)
  local r = self:_fn(bdf)
  local td = r.dir .. "/mdev_supported_types/" .. ty
  assert(isdir(td), bdf .. " has no mdev type " .. ty)
  local md = r.dir .. "/" .. uuid
  mkdirp(md)
  symlink("../mdev_supported_types/" .. ty, md .. "/mdev_type")
  write(md .. "/remove", "")
  symlink("../../../" .. uuid, td .. "/devices/" .. uuid)
  mkdirp(self.root .. "/bus/mdev/devices")
  symlink("../../../" .. r.rel .. "/" .. uuid, self.root .. "/bus/mdev/devices/" .. uuid)
  r.mdevs = r.mdevs or {}
  r.mdevs[#r.mdevs + 1] = uuid
end

-- SR-IOV files (LAYOUT §4) and the VFs (LAYOUT §3)
function Tree:_sriov(r)
  local s = r.sriov
  local d = r.dir .. "/"
  s.total = s.total or s.vfs or 0
  s.offset, s.stride = s.offset or 4, s.stride or 1
  write(d .. "sriov_totalvfs", ("%d\n"):format(s.total))
  write(d .. "sriov_offset", ("%d\n"):format(s.offset))
  write(d .. "sriov_stride", ("%d\n"):format(s.stride))
  write(d .. "sriov_vf_device", ("%x\n"):format(tonumber(hex4(s.vf_device) or r.device, 16)))
  write(d .. "sriov_drivers_autoprobe", "1\n")
  write(d .. "sriov_vf_total_msix", "0\n")
  write(d .. "sriov_numvfs", "0\n")
  r.vfs = {}
  -- automatic VF groups are chosen once, so they survive set_numvfs
  if s.iommu == nil and r.iommu then
    s.iommu = self.next_group
    self.next_group = self.next_group + s.total
  end
  self:set_numvfs(r.bdf, s.vfs or 0)
end

function Tree:_make_vf(pf, i)
  local s = pf.sriov
  local o = (s.vf or {})[i] or {}
  local function pick(k, default)
    if o[k] ~= nil then return o[k] end
    return default
  end
  local bdf = M.vf_address(pf.bdf, s.offset, s.stride, i)
  assert(not self:_present(bdf), "VF " .. i .. " of " .. pf.bdf .. " collides with " .. bdf)
  local group
  if type(s.iommu) == "number" then group = s.iommu + i
  elseif type(s.iommu) == "table" then group = s.iommu[i + 1] end
  group = pick("iommu", group)
  local driver = s.vf_driver
  if driver == nil then driver = pf.driver end
  driver = pick("driver", driver)
  local vgpu
  if s.vgpu then
    local cur = s.vgpu.current
    if type(cur) == "table" then cur = cur[i] end
    vgpu = { creatable = (s.vgpu.creatable_for or {})[i] or s.vgpu.creatable or {}, current = cur or 0 }
  end
  local r = {
    bdf = bdf, a = M.parse_address(bdf), vendor = pf.vendor, device = hex4(s.vf_device) or pf.device,
    class = pf.class, subsystem = subsystem_of(pick("subsystem", s.vf_subsystem), pf.vendor),
    revision = pf.revision, numa = pick("numa", pf.numa), driver = driver or nil, iommu = group or nil,
    cdev = pick("cdev", nil), vgpu = vgpu, mdev = pick("mdev", s.mdev),
    vf = true, pf = pf.bdf, index = i, parent_rel = pf.parent_rel,
  }
  self:_write_function(r)
  symlink("../" .. pf.bdf, r.dir .. "/physfn")
  symlink("../" .. bdf, pf.dir .. "/virtfn" .. i)
  write(r.dir .. "/sriov_vf_msix_count", "")
  pf.vfs[i] = bdf
  return bdf
end

function Tree:_present(bdf)
  local r = self.fns[bdf]
  return r ~= nil and not r.gone
end

function Tree:_fn(bdf)
  local r = self.fns[M.address(bdf)]
  if not r then error("no function " .. tostring(bdf) .. " in the tree", 3) end
  return r
end

-- ---- reading ------------------------------------------------------------------

--- The directory of function `bdf` (its real path under devices/), or the
--- path of `file` in it. Works for a function that vanished (the path is
--- then gone).
function Tree:path(bdf, file)
  local r = self:_fn(bdf)
  return file and (r.dir .. "/" .. file) or r.dir
end

--- Contents of `file` of function `bdf`, or nil when absent.
function Tree:read(bdf, file) return read(self:path(bdf, file)) end

--- Writes `text` into `file` of function `bdf` (the file must be allowed to
--- exist: this is how a test changes any attribute by hand).
function Tree:write(bdf, file, text) write(self:path(bdf, file), text) end

--- Addresses of the functions present, sorted.
function Tree:functions()
  local out = {}
  for bdf, r in pairs(self.fns) do if not r.gone then out[#out + 1] = bdf end end
  table.sort(out)
  return out
end

--- The VF addresses of PF `pf`, by virtfn index (read from the virtfn<N>
--- links, so it reflects the tree as it is now). List index 1 is virtfn0.
function Tree:vfs(pf)
  local r = self:_fn(pf)
  local byn, n = {}, -1
  for _, e in ipairs(listdir(r.dir)) do
    local i = e:match("^virtfn(%d+)$")
    if i then
      i = tonumber(i)
      byn[i] = basename(readlink(r.dir .. "/" .. e))
      if i > n then n = i end
    end
  end
  local out = {}
  for i = 0, n do out[#out + 1] = byn[i] end
  return out
end

--- The IOMMU group number of `bdf` (from its iommu_group link), or nil.
function Tree:group(bdf)
  local l = readlink(self:path(bdf, "iommu_group"))
  return l and tonumber(basename(l)) or nil
end

--- The driver name of `bdf` (the driver link's basename), or nil.
function Tree:driver(bdf)
  local l = readlink(self:path(bdf, "driver"))
  return l and basename(l) or nil
end

-- ---- vGPU state (LAYOUT §5) ---------------------------------------------------

--- `nvidia/current_vgpu_type` of `bdf` as a number (nil when absent).
function Tree:vgpu(bdf)
  local s = self:read(bdf, "nvidia/current_vgpu_type")
  return s and tonumber(s:match("%d+")) or nil
end

--- Writes type `id` into `nvidia/current_vgpu_type` of `bdf` ("%d\n"), as
--- `echo <id> > current_vgpu_type` does; 0 deletes the vGPU. Creatable
--- lists are not recomputed (set them with tree:set_creatable).
function Tree:set_vgpu(bdf, id)
  local p = self:path(bdf, "nvidia/current_vgpu_type")
  assert(exists(p), bdf .. " has no nvidia/ directory")
  write(p, ("%d\n"):format(id))
end

--- Replaces `nvidia/creatable_vgpu_types` of `bdf` with CATALOG (see
--- sysfs.catalog).
function Tree:set_creatable(bdf, catalog)
  write(self:path(bdf, "nvidia/creatable_vgpu_types"), M.catalog(catalog))
end

--- A reboot as LAYOUT §4 describes it: every `nvidia/current_vgpu_type`
--- comes back as `0\n`. opts.creatable = CATALOG also rewrites every
--- `creatable_vgpu_types` (an empty card offers its whole catalog again);
--- opts.disable_vfs = true also sets every PF's sriov_numvfs to 0 (VFs do
--- not survive a reboot until sriov-manage enables them again).
function Tree:reboot(opts)
  opts = opts or {}
  for _, bdf in ipairs(self:functions()) do
    local r = self.fns[bdf]
    if exists(r.dir .. "/nvidia/current_vgpu_type") then
      write(r.dir .. "/nvidia/current_vgpu_type", "0\n")
      if opts.creatable then write(r.dir .. "/nvidia/creatable_vgpu_types", M.catalog(opts.creatable)) end
    end
  end
  if opts.disable_vfs then
    for _, bdf in ipairs(self:functions()) do
      local r = self.fns[bdf]
      if r and not r.gone and r.sriov then self:set_numvfs(bdf, 0) end
    end
  end
end

-- ---- changes of the PCI topology --------------------------------------------

--- Removes the driver binding of `bdf`: its `driver` link, the driver's
--- link back, and DRIVER= from uevent (what `echo <BDF> > unbind` does).
function Tree:unbind(bdf)
  local r = self:_fn(bdf)
  if not r.driver then return end
  os.remove(r.dir .. "/driver")
  os.remove(self.root .. "/bus/pci/drivers/" .. r.driver .. "/" .. r.bdf)
  r.driver = nil
  write(r.dir .. "/uevent", uevent(r))
end

--- Binds `bdf` to driver `name` (unbinding it first if bound).
function Tree:bind(bdf, name)
  local r = self:_fn(bdf)
  self:unbind(bdf)
  self:_bind(r, name)
end

--- Makes `bdf` vanish as on a hot-unplug or VF removal: its directory, its
--- bus/pci/devices link, its driver, IOMMU-group (and the group when it is
--- left empty), mdev_bus and mdev links, and the PF's virtfn link for a VF;
--- a PF takes its VFs with it. opts.keep_link = true leaves the
--- bus/pci/devices/<BDF> link dangling: the window where a scan has listed
--- the function and then cannot read it.
function Tree:vanish(bdf, opts)
  opts = opts or {}
  local r = self:_fn(bdf)
  if r.gone then return end
  for _, v in pairs(r.vfs or {}) do self:vanish(v, opts) end -- each VF drops its virtfn link
  if r.driver then os.remove(self.root .. "/bus/pci/drivers/" .. r.driver .. "/" .. r.bdf) end
  if r.iommu then
    local g = self.root .. "/kernel/iommu_groups/" .. r.iommu
    os.remove(g .. "/devices/" .. r.bdf)
    if #listdir(g .. "/devices") == 0 then rm_rf(g) end
  end
  os.remove(self.root .. "/class/mdev_bus/" .. r.bdf)
  for _, u in ipairs(r.mdevs or {}) do os.remove(self.root .. "/bus/mdev/devices/" .. u) end
  if r.pf then
    local pf = self.fns[r.pf]
    if pf and not pf.gone then
      os.remove(pf.dir .. "/virtfn" .. r.index)
      pf.vfs[r.index] = nil
    end
  end
  if not opts.keep_link then os.remove(self.root .. "/bus/pci/devices/" .. r.bdf) end
  rm_rf(r.dir)
  r.gone = true
end

--- Sets `sriov_numvfs` of PF `pf` to `n`, removing VFs n … numvfs-1 (their
--- directories and virtfn links) or creating VFs numvfs … n-1 from the PF's
--- description. The kernel only accepts a change from or to 0; the helper
--- allows any n ≤ sriov_totalvfs to keep tests short.
function Tree:set_numvfs(pf, n)
  local r = self:_fn(pf)
  local s = assert(r.sriov, pf .. " is not a PF")
  assert(n >= 0 and n <= s.total, ("numvfs %d outside 0..%d"):format(n, s.total))
  local cur = tonumber(read(r.dir .. "/sriov_numvfs"):match("%d+"))
  for i = cur - 1, n, -1 do
    if r.vfs[i] then self:vanish(r.vfs[i]) end
    os.remove(r.dir .. "/virtfn" .. i)
  end
  for i = cur, n - 1 do self:_make_vf(r, i) end
  write(r.dir .. "/sriov_numvfs", ("%d\n"):format(n))
end

-- ---- a fake /proc (who holds a VFIO device) ---------------------------------

--- Marks functions as held by a process, as QEMU holds `/dev/vfio/<group>`
--- (and the container `/dev/vfio/vfio`) open while a VM runs: writes
--- `<proc>/<pid>/comm` (`qemu-kvm`), `cmdline`, and `fd/<n>` links:
--- 0-2 -> /dev/null, 19 -> /dev/vfio/vfio, 20… -> /dev/vfio/<group> of each
--- function (or, with opts.cdev = true, `/dev/vfio/devices/vfio<N>` for a
--- function built with `cdev = N`). `bdfs` is an address or a list.
--- opts.pid picks the pid (default 4242, 4243, …), opts.comm the name.
--- Returns the pid. The links need not resolve: only their text matters.
function Tree:hold(bdfs, opts)
  opts = opts or {}
  if type(bdfs) == "string" then bdfs = { bdfs } end
  local targets = {}
  for _, b in ipairs(bdfs) do
    local r = self:_fn(b)
    if opts.cdev then
      assert(r.cdev, b .. " has no VFIO cdev (build it with cdev = N)")
      targets[#targets + 1] = "/dev/vfio/devices/vfio" .. r.cdev
    else
      local g = self:group(b)
      assert(g, b .. " has no IOMMU group")
      targets[#targets + 1] = "/dev/vfio/" .. g
    end
  end
  local pid = opts.pid
  if not pid then
    pid = self.next_pid
    self.next_pid = pid + 1
  end
  return M.hold(self.proc, pid, targets, opts.comm)
end

--- The tree-less form of tree:hold: under `proc`, process `pid` holds
--- `targets` (a list of device paths such as "/dev/vfio/45"). Returns pid.
function M.hold(proc, pid, targets, comm)
  local d = ("%s/%d"):format(proc, pid)
  mkdirp(d .. "/fd")
  write(d .. "/comm", (comm or "qemu-kvm") .. "\n")
  write(d .. "/cmdline", table.concat({ "/usr/libexec/qemu-kvm", "-name", "guest=vm" .. pid }, "\0") .. "\0")
  for i = 0, 2 do symlink("/dev/null", d .. "/fd/" .. i) end
  symlink("/dev/vfio/vfio", d .. "/fd/19")
  local n = 20
  while exists(d .. "/fd/" .. n) do n = n + 1 end
  for _, t in ipairs(targets) do
    symlink(t, d .. "/fd/" .. n)
    n = n + 1
  end
  return pid
end

--- Ends process `pid` of the fake /proc (removes `<proc>/<pid>`).
function Tree:release(pid)
  rm_rf(("%s/%d"):format(self.proc, pid))
end

--- Deletes the whole tree (sysfs and fake /proc). Safe to call twice.
function Tree:remove()
  rm_rf(self.base)
  self.removed = true
end

-- ---- running the inventory ----------------------------------------------------

--- Runs the inventory over `root` (a Tree or a sysfs root path).
--- opts.via = "bin" (default): `cozygpu inventory --sysfs ROOT --output json
--- --pci-ids IDS` through H.run; returns the decoded object, the raw
--- stdout, stderr and the exit status; on a non-zero exit returns nil,
--- stderr, code. opts.via = "lua": `require("cozygpu.core").inventory{sysfs=,
--- pci_ids=}`; returns its results. opts.pci_ids defaults to sysfs.pci_ids().
function M.inventory(root, opts)
  opts = opts or {}
  if type(root) == "table" then root = root.root end
  local ids = opts.pci_ids or M.pci_ids()
  local H = assert(helper(), "the spec helper H is not loaded")
  if opts.via == "lua" then
    return H.core.inventory { sysfs = root, pci_ids = ids }
  end
  local out, err, code = H.run { "inventory", "--sysfs", root, "--output", "json", "--pci-ids", ids }
  if code ~= 0 then return nil, err, code end
  local obj, jerr = H.json.decode(out)
  if obj == nil then error("inventory printed no JSON: " .. tostring(jerr) .. "\n" .. out) end
  return obj, out, err, code
end

--- Keys of every object in a JSON text, in the order they appear, for
--- checking field order: returns a list with one entry per object, in
--- document order of their opening brace, each {path = "functions[1]", keys
--- = {...}}. Strings are skipped correctly; the text must be valid JSON.
function M.key_order(text)
  local objs, pos = {}, 1
  local function ws() pos = text:find("[^ \t\r\n]", pos) or #text + 1 end
  local function str()
    local i = pos + 1
    while true do
      local c = text:sub(i, i)
      if c == "\\" then i = i + 2
      elseif c == '"' then break
      elseif c == "" then error("unterminated string")
      else i = i + 1 end
    end
    local s = text:sub(pos + 1, i - 1)
    pos = i + 1
    return s
  end
  local value
  function value(path)
    ws()
    local c = text:sub(pos, pos)
    if c == "{" then
      local o = { path = path, keys = {} }
      objs[#objs + 1] = o
      pos = pos + 1
      ws()
      if text:sub(pos, pos) == "}" then pos = pos + 1 return end
      while true do
        ws()
        local k = str()
        o.keys[#o.keys + 1] = k
        ws()
        pos = pos + 1 -- ':'
        value(path == "" and k or (path .. "." .. k))
        ws()
        local d = text:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return end
      end
    elseif c == "[" then
      pos = pos + 1
      ws()
      if text:sub(pos, pos) == "]" then pos = pos + 1 return end
      local i = 0
      while true do
        i = i + 1
        value(("%s[%d]"):format(path, i))
        ws()
        local d = text:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return end
      end
    elseif c == '"' then
      str()
    else
      pos = text:find("[,%]}%s]", pos) or #text + 1
    end
  end
  value("")
  return objs
end

-- ---- lspci samples ------------------------------------------------------------

local function strip_vendor(name)
  return (name:gsub("^NVIDIA Corporation%s+", ""))
end

--- Turns a sample from fixtures/lspci/ into a tree description
--- ({functions = {...}, notes = {...}, source = path}). Recognised lines:
---
---   * `lspci -nn` / `-nnk` device lines, with or without the domain:
---     `01:00.0 3D controller [0302]: NVIDIA Corporation AD102GL [L40S]
---     [10de:26b9] (rev a1)` → address, class, vendor, device, revision;
---     the printed device name (after "NVIDIA Corporation") goes to
---     `sample.name` ("Device" when lspci's database did not know it);
---   * `Subsystem: ... [10de:1482]` → subsystem ids (`sample.subsystem_name`);
---   * `Kernel driver in use: vfio-pci` → driver; `Kernel modules:` lines
---     only tell that the sample is `-k` output (a -k record without
---     "Kernel driver in use" is an unbound function);
---   * `IOMMU Group N: <lspci line> (driver: nvidia)` (the RTX PRO 6000
---     capture form) → group and driver as well;
---   * device-plugin logs: `Nvidia device  0000:3b:00.0`, then optional
---     `Iommu Group N` and `Device Id 2235` lines for that device;
---   * `nvidia-smi --query-gpu=...,pci.bus_id,pci.device_id --format=csv`
---     tables (bus id `00000000:01:00.0`, device id `0x26B910DE` = device
---     26b9, vendor 10de);
---   * `nvidia-smi vgpu` tables (`|   0  Tesla P100-PCIE-16GB  |
---     00000000:05:00.0  |`).
--- Functions named by several sources (lspci and nvidia-smi) are merged by
--- address. Other lines (prompts, lsmod, Allocatable, map dumps) are
--- ignored. A sample with no function is an error.
---
--- What the tree assumes where the sample is silent (also listed in
--- `notes`, and recorded per function in `sample.stated`):
---   * vendor 10de for plugin-log and nvidia-smi entries (both list NVIDIA
---     devices only);
---   * device id opts.device or "0000" when no line gives it (a placeholder
---     no pci.ids knows, so the inventory has no name for it);
---   * class 0302 (3D controller, every datacenter part here) when not
---     printed; revision a1 when not printed;
---   * subsystem = {vendor, "0000"} when no Subsystem line (builder default);
---   * no driver unless "Kernel driver in use" / "(driver: x)" says one;
---   * no IOMMU group unless the sample gives one; NUMA node unknown (-1);
---   * no SR-IOV: a plugin log lists addresses, not PF/VF links, so every
---     listed function is a plain function of the tree.
function M.from_lspci(path, opts)
  opts = opts or {}
  local text = assert(read(path), "cannot read " .. path)
  local list, by = {}, {}
  local notes = {}
  local function fn(addr)
    local a = M.address(addr)
    local f = by[a]
    if not f then
      f = { address = a, sample = { stated = {} } }
      by[a] = f
      list[#list + 1] = f
    end
    return f
  end
  local cur, smi_cols
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local body = line:gsub("^%d%d%d%d/%d%d/%d%d %d%d:%d%d:%d%d%s+", "")
    local grp, rest = body:match("^IOMMU Group (%d+): (.*)$")
    if grp then body = rest end
    local addr, cname, cls, desc, v, d, tail =
      body:match("^(%x*:?%x%x:%x%x%.%x) (.-) %[(%x%x%x%x)%]: (.-) %[(%x%x%x%x):(%x%x%x%x)%](.*)$")
    if addr and M.parse_address(addr) then
      cur = fn(addr)
      cur.vendor, cur.device, cur.class = v, d, cls
      cur.sample.class_name = cname
      cur.sample.name = strip_vendor(desc)
      cur.sample.stated.vendor, cur.sample.stated.device, cur.sample.stated.class = true, true, true
      local rev = tail:match("%(rev (%x%x)%)")
      if rev then cur.revision = rev cur.sample.stated.revision = true end
      if grp then cur.iommu = tonumber(grp) cur.sample.stated.iommu = true end
      local drv = tail:match("%(driver: ([%w_%-]+)%)")
      if drv then cur.driver = drv cur.sample.stated.driver = true end
      smi_cols = nil
    elseif cur and body:match("^%s+Subsystem:") then
      local sname, sv, sd = body:match("Subsystem: (.-) %[(%x%x%x%x):(%x%x%x%x)%]%s*$")
      if sv then
        cur.subsystem = { sv, sd }
        cur.sample.subsystem_name = strip_vendor(sname)
        cur.sample.stated.subsystem = true
      end
    elseif cur and body:match("^%s+Kernel driver in use:") then
      cur.driver = body:match("Kernel driver in use:%s*(%S+)")
      cur.sample.stated.driver = true
    elseif cur and body:match("^%s+Kernel modules:") then
      cur.sample.stated.driver = true -- -k output: no "in use" line means unbound
    elseif body:match("^Nvidia device%s+%x+:%x%x:%x%x%.%x%s*$") then
      cur = fn(body:match("(%x+:%x%x:%x%x%.%x)"))
      cur.vendor = "10de"
      cur.sample.stated.vendor = true
      smi_cols = nil
    elseif cur and body:match("^Iommu Group %d+%s*$") then
      cur.iommu = tonumber(body:match("%d+"))
      cur.sample.stated.iommu = true
    elseif cur and body:match("^Device Id %x%x%x%x%s*$") then
      cur.device = body:match("(%x%x%x%x)%s*$"):lower()
      cur.sample.stated.device = true
    elseif body:match("pci%.bus_id") and body:find(",", 1, true) then
      smi_cols = {}
      local i = 0
      for col in body:gmatch("[^,]+") do
        i = i + 1
        smi_cols[col:match("^%s*(.-)%s*$")] = i
      end
    elseif smi_cols and body:find(",", 1, true) then
      local cells = {}
      for c in body:gmatch("[^,]+") do cells[#cells + 1] = c:match("^%s*(.-)%s*$") end
      local bus = cells[smi_cols["pci.bus_id"]]
      if bus and M.parse_address(bus) then
        cur = fn(bus)
        cur.vendor = cur.vendor or "10de"
        cur.sample.stated.vendor = true
        local id = smi_cols["pci.device_id"] and cells[smi_cols["pci.device_id"]]
        local dd, vv = (id or ""):match("^0x(%x%x%x%x)(%x%x%x%x)$")
        if dd then
          cur.device, cur.vendor = dd:lower(), vv:lower()
          cur.sample.stated.device = true
        end
        if smi_cols.name then cur.sample.smi_name = cells[smi_cols.name] end
      end
    elseif body:match("^|%s+%d+%s+.-|%s*%x+:%x%x:%x%x%.%x%s") then
      local name, bus = body:match("^|%s+%d+%s+(.-)%s*|%s*(%x+:%x%x:%x%x%.%x)%s")
      cur = fn(bus)
      cur.vendor = cur.vendor or "10de"
      cur.sample.stated.vendor = true
      cur.sample.smi_name = name
      smi_cols = nil
    elseif body:match("^%s*$") then
      smi_cols = nil
    end
  end
  assert(#list > 0, path .. ": no PCI function recognised in the sample")
  local function note(s) for _, n in ipairs(notes) do if n == s then return end end notes[#notes + 1] = s end
  for _, f in ipairs(list) do
    f.vendor = f.vendor or "10de"
    if not f.device then
      f.device = opts.device or "0000"
      note("device id not stated: " .. f.device .. " assumed")
    end
    if not f.class then f.class = "0302" note("class not stated: 0302 (3D controller) assumed") end
    if not f.revision then note("revision not stated: a1 assumed") end
    if not f.subsystem then note("subsystem not stated: {vendor, 0000} assumed") end
    if not f.iommu then note("IOMMU group not stated: none") end
    if not f.sample.stated.driver then note("driver not shown: unbound") end
  end
  table.sort(list, function(a, b) return a.address < b.address end)
  return { functions = list, notes = notes, source = path }
end

return M
