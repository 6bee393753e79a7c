--- The node inventory (docs/gpunode.md, THE contract) over fake sysfs trees
--- built by spec/support/sysfs.lua after ../shared/fixtures/sysfs/LAYOUT.md.
---
--- Every expected object below is written out from what the tree states and
--- the contract's rules, never copied from the program's output. Names come
--- from the pci.ids excerpt (fixtures/sysfs/pci-ids/pci.ids.10de-excerpt.txt,
--- passed as --pci-ids); the first test checks that the names spelled here
--- are the excerpt's.
local S = require "sysfs"

local IDS = S.pci_ids()

-- device names as the excerpt has them (checked in the first test)
local NAME = {
  ["2330"] = "GH100 [H100 SXM5 80GB]",
  ["22a3"] = "GH100 [H100 NVSwitch]",
  ["26b9"] = "AD102GL [L40S]",
  ["25b6"] = "GA107GL [A2 / A16]",
  ["2204"] = "GA102 [GeForce RTX 3090]",
  ["1aef"] = "GA102 High Definition Audio Controller",
  ["1e07"] = "TU102 [GeForce RTX 2080 Ti Rev. A]",
  ["10f7"] = "TU102 High Definition Audio Controller",
  ["1ad6"] = "TU102 USB 3.1 Host Controller",
  ["1ad7"] = "TU102 USB Type-C UCSI Controller",
  ["20b5"] = "GA100 [A100 PCIe 80GB]",
  ["20f1"] = "GA100 [A100 PCIe 40GB]",
  ["1eb8"] = "TU104GL [Tesla T4]",
  ["2bb5"] = "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
  ["2335"] = "GH100 [H200 SXM 141GB]",
  ["2296"] = "Tegra PCIe Endpoint Virtual Network",
}

-- The full L40S catalog (fixtures/sysfs/creatable_vgpu_types/l40s-full-catalog.txt,
-- the harvester capture of VF 0000:26:00.4), as `creatable` rows.
local L40S = {
  { id = 1145, name = "NVIDIA L40S-1B" }, { id = 1146, name = "NVIDIA L40S-2B" },
  { id = 1147, name = "NVIDIA L40S-1Q" }, { id = 1148, name = "NVIDIA L40S-2Q" },
  { id = 1149, name = "NVIDIA L40S-3Q" }, { id = 1150, name = "NVIDIA L40S-4Q" },
  { id = 1151, name = "NVIDIA L40S-6Q" }, { id = 1152, name = "NVIDIA L40S-8Q" },
  { id = 1153, name = "NVIDIA L40S-12Q" }, { id = 1154, name = "NVIDIA L40S-16Q" },
  { id = 1155, name = "NVIDIA L40S-24Q" }, { id = 1156, name = "NVIDIA L40S-48Q" },
  { id = 1157, name = "NVIDIA L40S-1A" }, { id = 1158, name = "NVIDIA L40S-2A" },
  { id = 1159, name = "NVIDIA L40S-3A" }, { id = 1160, name = "NVIDIA L40S-4A" },
  { id = 1161, name = "NVIDIA L40S-6A" }, { id = 1162, name = "NVIDIA L40S-8A" },
  { id = 1163, name = "NVIDIA L40S-12A" }, { id = 1164, name = "NVIDIA L40S-16A" },
  { id = 1165, name = "NVIDIA L40S-24A" }, { id = 1166, name = "NVIDIA L40S-48A" },
  { id = 2164, name = "NVIDIA L40S-3B" },
}

-- The 15 mediated types of the harvester capture of A2 VF 0000:08:01.7
-- (type, name, available_instances, description; device_api is vfio-pci).
local A2_TYPES = {
  { "nvidia-742", "NVIDIA A2-1B", 0, "num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16" },
  { "nvidia-743", "NVIDIA A2-2B", 0, "num_heads=4, frl_config=45, framebuffer=2048M, max_resolution=5120x2880, max_instance=8" },
  { "nvidia-744", "NVIDIA A2-1Q", 0, "num_heads=4, frl_config=60, framebuffer=1024M, max_resolution=5120x2880, max_instance=16" },
  { "nvidia-745", "NVIDIA A2-2Q", 0, "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=7680x4320, max_instance=8" },
  { "nvidia-746", "NVIDIA A2-4Q", 1, "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4" },
  { "nvidia-747", "NVIDIA A2-8Q", 0, "num_heads=4, frl_config=60, framebuffer=8192M, max_resolution=7680x4320, max_instance=2" },
  { "nvidia-748", "NVIDIA A2-16Q", 0, "num_heads=4, frl_config=60, framebuffer=16384M, max_resolution=7680x4320, max_instance=1" },
  { "nvidia-749", "NVIDIA A2-1A", 0, "num_heads=1, frl_config=60, framebuffer=1024M, max_resolution=1280x1024, max_instance=16" },
  { "nvidia-750", "NVIDIA A2-2A", 0, "num_heads=1, frl_config=60, framebuffer=2048M, max_resolution=1280x1024, max_instance=8" },
  { "nvidia-751", "NVIDIA A2-4A", 1, "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=1280x1024, max_instance=4" },
  { "nvidia-752", "NVIDIA A2-8A", 0, "num_heads=1, frl_config=60, framebuffer=8192M, max_resolution=1280x1024, max_instance=2" },
  { "nvidia-753", "NVIDIA A2-16A", 0, "num_heads=1, frl_config=60, framebuffer=16384M, max_resolution=1280x1024, max_instance=1" },
  { "nvidia-754", "NVIDIA A2-4C", 1, "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2400, max_instance=4" },
  { "nvidia-755", "NVIDIA A2-8C", 0, "num_heads=1, frl_config=60, framebuffer=8192M, max_resolution=4096x2400, max_instance=2" },
  { "nvidia-756", "NVIDIA A2-16C", 0, "num_heads=1, frl_config=60, framebuffer=16384M, max_resolution=4096x2400, max_instance=1" },
}

-- FUNCTION field order (docs/gpunode.md table) and the nested objects'
-- order as the contract's examples show them.
local ORDER = {
  [""] = { "functions" },
  fn = { "address", "vendorID", "deviceID", "subsystemVendorID", "subsystemDeviceID", "revision", "class",
    "role", "name", "model", "driver", "iommuGroup", "numaNode", "sriov", "virtualFunctions",
    "physicalFunction", "vfIndex", "gpu", "counted", "vgpu", "mdevTypes" },
  sriov = { "totalVFs", "numVFs" },
  vgpu = { "type", "typeName", "profile", "creatable" },
  creatable = { "id", "name" },
  mdev = { "type", "name", "availableInstances", "deviceAPI", "description", "devices" },
}

local function order_for(path)
  if path == "" then return ORDER[""] end
  if path:match("^functions%[%d+%]$") then return ORDER.fn end
  if path:match("%.sriov$") then return ORDER.sriov end
  if path:match("%.vgpu$") then return ORDER.vgpu end
  if path:match("%.creatable%[%d+%]$") then return ORDER.creatable end
  if path:match("%.mdevTypes%[%d+%]$") then return ORDER.mdev end
end

-- Every object of the printed JSON has only known keys, in contract order.
local function check_order(text)
  for _, o in ipairs(S.key_order(text)) do
    local order = order_for(o.path)
    assert(order, "unexpected object at " .. o.path)
    local i = 1
    for _, k in ipairs(o.keys) do
      while order[i] and order[i] ~= k do i = i + 1 end
      assert(order[i], ("%s: key %q unknown or out of order (keys: %s)"):format(
        o.path, k, table.concat(o.keys, ", ")))
      i = i + 1
    end
  end
end

local trees = {}
local function build(desc)
  local t = S.build(desc)
  trees[#trees + 1] = t
  return t
end

-- the inventory through the binary (field order checked too)
local function inventory_bin(t)
  local obj, out, err, code = S.inventory(t, { pci_ids = IDS })
  assert(obj, ("cozygpu inventory exited %s: %s"):format(tostring(err), tostring(out)))
  check_order(out)
  return obj
end

-- the inventory through the Lua binding
local function inventory_lua(t)
  local obj, err = S.inventory(t, { via = "lua", pci_ids = IDS })
  assert(obj, "core.inventory failed: " .. tostring(err))
  return obj
end

-- a copy of `base` with the fields of `extra`
local function with(base, extra)
  local o = {}
  for k, v in pairs(base) do o[k] = v end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

local function rows(list)
  local out = {}
  for i, r in ipairs(list) do out[i] = { id = r.id, name = r.name } end
  return out
end

-- the expected mdevTypes entries of an A2 VF: the capture, with
-- `available` overriding every availableInstances when given and `devices`
-- per type
local function a2_types(available, devices)
  local out = {}
  for i, t in ipairs(A2_TYPES) do
    out[i] = { type = t[1], name = t[2], availableInstances = available or t[3], deviceAPI = "vfio-pci",
      description = t[4], devices = devices and devices[t[1]] or nil }
  end
  return out
end

-- identity fields shared by every function of one card model
local function ident(device, class, role, subsystem, extra)
  local o = {
    vendorID = "10de", deviceID = device, subsystemVendorID = subsystem[1], subsystemDeviceID = subsystem[2],
    revision = "a1", class = class, role = role, name = NAME[device],
  }
  o.model = NAME[device]:match(".*%[(.-)%]") or NAME[device]
  return with(o, extra)
end

describe("inventory", function()
  after_each(function()
    for _, t in ipairs(trees) do t:remove() end
    trees = {}
  end)

  it("the device names spelled in this spec are those of the pci.ids excerpt", function()
    local db, vendor = {}, nil
    for line in io.lines(IDS) do
      local v = line:match("^(%x%x%x%x)%s")
      if v then vendor = v end
      local d, n = line:match("^\t(%x%x%x%x)%s+(.-)%s*$")
      if d and vendor == "10de" then db[d] = n end
    end
    for id, name in pairs(NAME) do assert.are.equal(name, db[id], "device " .. id) end
  end)

  describe("(1) an 8-GPU passthrough node", function()
    -- 8 x H100 SXM5 bound to vfio-pci, one IOMMU group each, NUMA 0 and 1;
    -- four behind a root port (one directory level deeper: LAYOUT §3 "depth
    -- varies"), four directly on their root bus; four NVSwitches (class
    -- 0x068000, LAYOUT §2); AMD root ports and a Mellanox NIC (not NVIDIA).
    local GPUS = {
      { "0000:18:00.0", 30, 0, "0000:17:01.0" }, { "0000:2a:00.0", 44, 0, "0000:29:01.0" },
      { "0000:3a:00.0", 58, 0, "0000:39:01.0" }, { "0000:5d:00.0", 72, 0, "0000:5c:01.0" },
      { "0000:9a:00.0", 110, 1 }, { "0000:ab:00.0", 124, 1 }, { "0000:ba:00.0", 138, 1 }, { "0000:db:00.0", 152, 1 },
    }
    local SWITCHES = { { "0000:05:00.0", 20 }, { "0000:06:00.0", 21 }, { "0000:07:00.0", 22 }, { "0000:08:00.0", 23 } }

    local function tree()
      local fns = {}
      -- reverse order: the output order must not come from the build order
      for i = #GPUS, 1, -1 do
        local g = GPUS[i]
        fns[#fns + 1] = { address = g[1], device = "2330", subsystem = "10de:16c1", driver = "vfio-pci",
          iommu = g[2], numa = g[3], port = g[4] }
      end
      for _, s in ipairs(SWITCHES) do
        fns[#fns + 1] = { address = s[1], device = "22a3", class = "068000", subsystem = "10de:1796",
          driver = "nvidia-nvswitch", iommu = s[2], numa = 0 }
      end
      fns[#fns + 1] = { address = "0000:19:00.0", vendor = "15b3", device = "101d", class = "020000",
        subsystem = "15b3:0016", driver = "mlx5_core", iommu = 31, numa = 0 }
      return build { functions = fns }
    end

    local function expected()
      local out = {}
      for _, s in ipairs(SWITCHES) do
        out[#out + 1] = ident("22a3", "0680", "NVSwitch", { "10de", "1796" },
          { address = s[1], driver = "nvidia-nvswitch", iommuGroup = s[2], numaNode = 0 })
      end
      for _, g in ipairs(GPUS) do
        out[#out + 1] = ident("2330", "0302", "GPU", { "10de", "16c1" },
          { address = g[1], driver = "vfio-pci", iommuGroup = g[2], numaNode = g[3], counted = true })
      end
      return { functions = out }
    end

    it("is reported exactly, in address order, NVIDIA functions only (binary)", function()
      assert.are.same(expected(), inventory_bin(tree()))
    end)

    it("the Lua binding reports the same", function()
      assert.are.same(expected(), inventory_lua(tree()))
    end)
  end)

  describe("(2) an L40S with 4 VFs, two carrying a vGPU", function()
    -- PF 0000:26:00.0 (nvidia), VFs 0000:26:00.4-7 (offset 4, LAYOUT §3),
    -- each VF in its own group. VF0 and VF1 run L40S-24Q (1155) — the two
    -- fill the 48 GB card —; VF0 still lists the whole catalog (the
    -- harvester capture of this very VF), VF1's own list is reduced to the
    -- header and VF2/VF3 print only the header (card consumed, LAYOUT §5).
    local function tree()
      return build { functions = {
        { address = "0000:26:00.0", device = "26b9", subsystem = "10de:1851", driver = "nvidia", iommu = 31, numa = 0,
          sriov = { total = 32, vfs = 4, offset = 4, stride = 1, iommu = 32,
            vgpu = { creatable = "header-only-fully-consumed.txt", creatable_for = { [0] = "harvester-l40s" },
              current = { [0] = 1155, [1] = 1155 } } } },
      } }
    end

    local function expected()
      local L = function(extra) return ident("26b9", "0302", "GPU", { "10de", "0000" }, extra) end
      local vfs = { "0000:26:00.4", "0000:26:00.5", "0000:26:00.6", "0000:26:00.7" }
      local vgpus = {
        { type = 1155, typeName = "NVIDIA L40S-24Q", profile = "L40S-24Q", creatable = rows(L40S) },
        -- own list header-only: the name comes from VF0's list (same PF)
        { type = 1155, typeName = "NVIDIA L40S-24Q", profile = "L40S-24Q", creatable = {} },
        { type = 0, creatable = {} },
        { type = 0, creatable = {} },
      }
      local out = {
        ident("26b9", "0302", "GPU", { "10de", "1851" }, {
          address = "0000:26:00.0", driver = "nvidia", iommuGroup = 31, numaNode = 0,
          sriov = { totalVFs = 32, numVFs = 4 }, virtualFunctions = vfs, counted = true }),
      }
      for i, a in ipairs(vfs) do
        out[#out + 1] = L { address = a, driver = "nvidia", iommuGroup = 31 + i, numaNode = 0,
          physicalFunction = "0000:26:00.0", vfIndex = i - 1, counted = true, vgpu = vgpus[i] }
      end
      return { functions = out }
    end

    it("reports PF, VFs, types, names and catalogs exactly (Lua binding)", function()
      assert.are.same(expected(), inventory_lua(tree()))
    end)

    it("the binary prints the same, fields in contract order", function()
      assert.are.same(expected(), inventory_bin(tree()))
    end)

    it("the catalog spelled in this spec is the fixture's", function()
      assert.are.same(L40S, S.catalog_rows(S.catalog("l40s-full-catalog.txt")))
      assert.are.same(L40S, S.catalog_rows(S.catalog("harvester-l40s")))
    end)

    it("follows current_vgpu_type as it changes, and a reboot (all types back to 0)", function()
      local t = tree()
      t:set_vgpu("0000:26:00.6", 1153)
      t:set_creatable("0000:26:00.6", "l40s-full-catalog.txt")
      local fns = inventory_lua(t).functions
      assert.are.same({ type = 1153, typeName = "NVIDIA L40S-12Q", profile = "L40S-12Q", creatable = rows(L40S) },
        fns[4].vgpu)
      t:reboot()
      for i = 2, 5 do assert.are.equal(0, inventory_lua(t).functions[i].vgpu.type) end
      for i = 2, 5 do assert.is_nil(inventory_lua(t).functions[i].vgpu.typeName) end
    end)
  end)

  describe("vGPU type names (LAYOUT §5: ids are unique per physical card)", function()
    it("a VF whose own list is header-only gets its typeName from a sibling VF", function()
      -- no nvidia/ on the PF; only VF2 lists the catalog
      local t = build { functions = {
        { address = "0000:41:00.0", device = "26b9", subsystem = "10de:1851", driver = "nvidia", iommu = 45, numa = 1,
          sriov = { total = 32, vfs = 3, iommu = 46,
            vgpu = { creatable = "header-only-fully-consumed.txt", creatable_for = { [2] = "l40s-full-catalog.txt" },
              current = { [0] = 1163 } } } },
      } }
      local fns = inventory_lua(t).functions
      assert.are.equal("0000:41:00.4", fns[2].address)
      assert.are.same({ type = 1163, typeName = "NVIDIA L40S-12A", profile = "L40S-12A", creatable = {} }, fns[2].vgpu)
      assert.are.same({ type = 0, creatable = {} }, fns[3].vgpu)
      assert.are.same({ type = 0, creatable = rows(L40S) }, fns[4].vgpu)
    end)

    it("a VF whose own list is header-only gets its typeName from the PF's nvidia/ list", function()
      local t = build { functions = {
        { address = "0000:41:00.0", device = "26b9", subsystem = "10de:1851", driver = "nvidia", iommu = 45, numa = 1,
          vgpu = { creatable = "l40s-full-catalog.txt", current = 0 },
          sriov = { total = 32, vfs = 2, iommu = 46,
            vgpu = { creatable = "header-only-fully-consumed.txt", current = { [0] = 1155, [1] = 1155 } } } },
      } }
      local L = function(extra) return ident("26b9", "0302", "GPU", { "10de", "0000" }, extra) end
      assert.are.same({ functions = {
        ident("26b9", "0302", "GPU", { "10de", "1851" }, {
          address = "0000:41:00.0", driver = "nvidia", iommuGroup = 45, numaNode = 1,
          sriov = { totalVFs = 32, numVFs = 2 }, virtualFunctions = { "0000:41:00.4", "0000:41:00.5" },
          counted = true, vgpu = { type = 0, creatable = rows(L40S) } }),
        L { address = "0000:41:00.4", driver = "nvidia", iommuGroup = 46, numaNode = 1,
          physicalFunction = "0000:41:00.0", vfIndex = 0, counted = true,
          vgpu = { type = 1155, typeName = "NVIDIA L40S-24Q", profile = "L40S-24Q", creatable = {} } },
        L { address = "0000:41:00.5", driver = "nvidia", iommuGroup = 47, numaNode = 1,
          physicalFunction = "0000:41:00.0", vfIndex = 1, counted = true,
          vgpu = { type = 1155, typeName = "NVIDIA L40S-24Q", profile = "L40S-24Q", creatable = {} } },
      } }, inventory_lua(t))
    end)

    it("a name is never borrowed from another card, and an unknown id has no name", function()
      -- card A lists the catalog; card B's lists are header-only. B's VF
      -- runs 1155: A's "1155" says nothing about B. A's VF runs 4242,
      -- which no list names.
      local t = build { functions = {
        { address = "0000:41:00.0", device = "26b9", driver = "nvidia", iommu = 45,
          sriov = { total = 32, vfs = 1, iommu = 46, vgpu = { creatable = "l40s-full-catalog.txt", current = 4242 } } },
        { address = "0000:c1:00.0", device = "26b9", driver = "nvidia", iommu = 90,
          sriov = { total = 32, vfs = 1, iommu = 91, vgpu = { creatable = "header-only-fully-consumed.txt", current = 1155 } } },
      } }
      local fns = inventory_lua(t).functions
      assert.are.equal("0000:41:00.4", fns[2].address)
      assert.are.same({ type = 4242, creatable = rows(L40S) }, fns[2].vgpu)
      assert.are.equal("0000:c1:00.4", fns[4].address)
      assert.are.same({ type = 1155, creatable = {} }, fns[4].vgpu)
    end)

    it("reads catalogs without a header line (the H200 README and test-string forms) in file order", function()
      -- LAYOUT §5: a real file starts with the header `ID    : vGPU Name`;
      -- the two H200 fixtures (a README's cat output and a test constant)
      -- show none. Every line that starts with an id is a row, so neither
      -- form loses its first type.
      local t = build { functions = {
        { address = "0000:41:00.0", device = "2335", driver = "nvidia", iommu = 4,
          sriov = { total = 16, vfs = 2, iommu = 5, vgpu = { creatable = "h200-test-string-no-header.txt",
            creatable_for = { [1] = "h200-readme-cat-output.txt" }, current = { [0] = 1428 } } } },
      } }
      local fns = inventory_lua(t).functions
      assert.are.same({ type = 1428, typeName = "NVIDIA H200X-141C", profile = "H200X-141C", creatable = {
        { id = 1414, name = "NVIDIA H200X-1-18C" }, { id = 1428, name = "NVIDIA H200X-141C" } } }, fns[2].vgpu)
      assert.are.same({ type = 0, creatable = {
        { id = 1428, name = "NVIDIA H200X-141C" }, { id = 1414, name = "NVIDIA H200X-1-18C" } } }, fns[3].vgpu)
    end)

    it("profile is the last word of a multi-word name (RTX PRO 6000 Blackwell)", function()
      -- 1561 is the id the RTX PRO 6000 capture writes; the multi-word name
      -- is a form LAYOUT §5 lists; pairing them is this test's choice
      local t = build { functions = {
        { address = "0001:04:00.0", device = "2bb5", driver = "nvidia", iommu = 300,
          sriov = { total = 48, vfs = 1, offset = 2, iommu = 301, vgpu = { current = 1561, creatable = {
            { 1561, "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q" }, { 1562, "NVIDIA RTX Pro 6000 Blackwell DC-1-48Q" } } } } },
      } }
      local vf = inventory_lua(t).functions[2]
      assert.are.equal("0001:04:00.2", vf.address)
      assert.are.same({ type = 1561, typeName = "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q", profile = "DC-1-24Q",
        creatable = { { id = 1561, name = "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q" },
          { id = 1562, name = "NVIDIA RTX Pro 6000 Blackwell DC-1-48Q" } } }, vf.vgpu)
    end)
  end)

  describe("(3) an A2 with mediated types on its 16 VFs", function()
    -- PF 0000:08:00.0, 16 VFs 0000:08:00.4 … 0000:08:02.3 (offset 4), all
    -- bound to nvidia; every VF a mediated-device parent with the 15 types of
    -- the harvester capture, read from the fixture (VF 11 is 0000:08:01.7,
    -- the captured VF itself). On VF 3 two A2-4Q mdevs exist and nothing is
    -- left available.
    local VFS = {
      "0000:08:00.4", "0000:08:00.5", "0000:08:00.6", "0000:08:00.7", "0000:08:01.0", "0000:08:01.1",
      "0000:08:01.2", "0000:08:01.3", "0000:08:01.4", "0000:08:01.5", "0000:08:01.6", "0000:08:01.7",
      "0000:08:02.0", "0000:08:02.1", "0000:08:02.2", "0000:08:02.3",
    }
    local U1, U2 = "f6c58d0e-3d1c-4a39-9a5e-0b4b2a3c9e01", "2b7f9e44-8d0a-4c55-b1b3-6a1c0d2e7f10"

    local function tree()
      return build { functions = {
        { address = "0000:08:00.0", device = "25b6", subsystem = "10de:157e", driver = "nvidia", iommu = 16, numa = 0,
          sriov = { total = 16, vfs = 16, offset = 4, stride = 1, iommu = 17, mdev = { types = "a2" },
            vf = { [3] = { mdev = { types = "a2", available = 0, devices = { ["nvidia-746"] = { U1, U2 } } } } } } },
      } }
    end

    local function expected()
      local out = {
        ident("25b6", "0302", "GPU", { "10de", "157e" }, {
          address = "0000:08:00.0", driver = "nvidia", iommuGroup = 16, numaNode = 0,
          sriov = { totalVFs = 16, numVFs = 16 }, virtualFunctions = VFS, counted = true }),
      }
      for i, a in ipairs(VFS) do
        local types = i == 4 and a2_types(0, { ["nvidia-746"] = { U2, U1 } }) or a2_types()
        out[#out + 1] = ident("25b6", "0302", "GPU", { "10de", "0000" }, {
          address = a, driver = "nvidia", iommuGroup = 16 + i, numaNode = 0, physicalFunction = "0000:08:00.0",
          vfIndex = i - 1, counted = true, mdevTypes = types })
      end
      return { functions = out }
    end

    it("reports every VF's types exactly, virtfn10 after virtfn9 (Lua binding)", function()
      assert.are.same(expected(), inventory_lua(tree()))
    end)

    it("the binary prints the same, fields in contract order", function()
      assert.are.same(expected(), inventory_bin(tree()))
    end)

    it("orders mdev types by the numeric suffix of their name", function()
      local t = build { functions = {
        { address = "0000:3b:00.0", device = "1eb8", subsystem = "10de:12a2", driver = "nvidia", iommu = 5,
          mdev = { types = {
            { type = "nvidia-1000", name = "GRID T4-16Q", description = "d3", available = 1 },
            { type = "nvidia-63", name = "GRID T4-1B", description = "d1", available = 16 },
            { type = "nvidia-999", name = "GRID T4-8Q", description = "d2", available = 2 },
          } } },
      } }
      local f = inventory_lua(t).functions[1]
      assert.are.same({
        { type = "nvidia-63", name = "GRID T4-1B", availableInstances = 16, deviceAPI = "vfio-pci", description = "d1" },
        { type = "nvidia-999", name = "GRID T4-8Q", availableInstances = 2, deviceAPI = "vfio-pci", description = "d2" },
        { type = "nvidia-1000", name = "GRID T4-16Q", availableInstances = 1, deviceAPI = "vfio-pci", description = "d3" },
      }, f.mdevTypes)
    end)
  end)

  describe("(3b) an A100 with mediated types on its VFs", function()
    -- The case the issue names. No A100 capture is in the fixtures, so the
    -- types follow LAYOUT §6 with the A100's time-sliced profile names
    -- (`NVIDIA A100-<fb>C`, compute profiles); the `nvidia-<N>` numbers are
    -- per SKU and driver (LAYOUT §6) and here only illustrate the form.
    -- A100 PCIe 40GB (10de:20f1) PF 0000:3b:00.0, 2 of 16 VFs enabled
    -- (offset 4, LAYOUT §3): each VF offers the types, with one instance
    -- available, except on VF 1 which holds a 20C mdev.
    local U = "9d7c3b0a-5e1f-4f6a-8a2b-3c4d5e6f7a80"
    local TYPES = {
      { type = "nvidia-474", name = "NVIDIA A100-4C", description = "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2160, max_instance=10" },
      { type = "nvidia-475", name = "NVIDIA A100-5C", description = "num_heads=1, frl_config=60, framebuffer=5120M, max_resolution=4096x2160, max_instance=8" },
      { type = "nvidia-478", name = "NVIDIA A100-20C", description = "num_heads=1, frl_config=60, framebuffer=20480M, max_resolution=4096x2160, max_instance=2" },
      { type = "nvidia-479", name = "NVIDIA A100-40C", description = "num_heads=1, frl_config=60, framebuffer=40960M, max_resolution=4096x2160, max_instance=1" },
    }
    local function types(available, devices)
      local out = {}
      for i, t in ipairs(TYPES) do
        out[i] = { type = t.type, name = t.name, availableInstances = available, deviceAPI = "vfio-pci",
          description = t.description, devices = devices and devices[t.type] or nil }
      end
      return out
    end

    it("reports the PF with its VFs, each VF a mediated-device parent, exactly", function()
      local t = build { functions = {
        { address = "0000:3b:00.0", device = "20f1", subsystem = "10de:145f", driver = "nvidia", iommu = 30, numa = 0,
          sriov = { total = 16, vfs = 2, offset = 4, stride = 1, iommu = 31,
            mdev = { types = TYPES, available = 1 },
            vf = { [1] = { mdev = { types = TYPES, available = 0, devices = { ["nvidia-478"] = { U } } } } } } },
      } }
      local pf = ident("20f1", "0302", "GPU", { "10de", "145f" }, {
        address = "0000:3b:00.0", driver = "nvidia", iommuGroup = 30, numaNode = 0,
        sriov = { totalVFs = 16, numVFs = 2 }, virtualFunctions = { "0000:3b:00.4", "0000:3b:00.5" }, counted = true })
      local function vf(addr, i, mdev)
        return ident("20f1", "0302", "GPU", { "10de", "0000" }, {
          address = addr, driver = "nvidia", iommuGroup = 31 + i, numaNode = 0, physicalFunction = "0000:3b:00.0",
          vfIndex = i, counted = true, mdevTypes = mdev })
      end
      local want = { functions = { pf, vf("0000:3b:00.4", 0, types(1)),
        vf("0000:3b:00.5", 1, types(0, { ["nvidia-478"] = { U } })) } }
      assert.are.same(want, inventory_bin(t))
      assert.are.same(want, inventory_lua(t))
    end)
  end)

  describe("(4) several functions in one IOMMU group", function()
    it("a GA102 board: GPU and its HD-audio function", function()
      local t = build { functions = {
        { address = "0000:0b:00.1", device = "1aef", class = "040300", subsystem = "10de:147d",
          driver = "snd_hda_intel", iommu = 14 },
        { address = "0000:0b:00.0", device = "2204", class = "030000", subsystem = "10de:147d",
          driver = "vfio-pci", iommu = 14 },
      } }
      assert.are.same({ functions = {
        ident("2204", "0300", "GPU", { "10de", "147d" }, { address = "0000:0b:00.0", driver = "vfio-pci",
          iommuGroup = 14, counted = true }),
        ident("1aef", "0403", "Audio", { "10de", "147d" }, { address = "0000:0b:00.1", driver = "snd_hda_intel",
          iommuGroup = 14, gpu = "0000:0b:00.0" }),
      } }, inventory_bin(t))
    end)

    it("a TU102 board: GPU, audio, USB and UCSI functions", function()
      local sub = { "10de", "12fa" }
      local t = build { functions = {
        { address = "0000:65:00.0", device = "1e07", class = "030000", subsystem = "10de:12fa", driver = "vfio-pci", iommu = 27, numa = 0 },
        { address = "0000:65:00.1", device = "10f7", class = "040300", subsystem = "10de:12fa", driver = "vfio-pci", iommu = 27, numa = 0 },
        { address = "0000:65:00.2", device = "1ad6", class = "0c0330", subsystem = "10de:12fa", driver = "xhci_hcd", iommu = 27, numa = 0 },
        { address = "0000:65:00.3", device = "1ad7", class = "0c8000", subsystem = "10de:12fa", driver = "nvidia-gpu", iommu = 27, numa = 0 },
      } }
      assert.are.same({ functions = {
        ident("1e07", "0300", "GPU", sub, { address = "0000:65:00.0", driver = "vfio-pci", iommuGroup = 27, numaNode = 0, counted = true }),
        ident("10f7", "0403", "Audio", sub, { address = "0000:65:00.1", driver = "vfio-pci", iommuGroup = 27, numaNode = 0, gpu = "0000:65:00.0" }),
        ident("1ad6", "0c03", "USB", sub, { address = "0000:65:00.2", driver = "xhci_hcd", iommuGroup = 27, numaNode = 0, gpu = "0000:65:00.0" }),
        ident("1ad7", "0c80", "SerialBus", sub, { address = "0000:65:00.3", driver = "nvidia-gpu", iommuGroup = 27, numaNode = 0, gpu = "0000:65:00.0" }),
      } }, inventory_lua(t))
    end)

    it("two GPUs in one group count once, on the lowest address", function()
      -- two A100 behind a switch without ACS; the higher one is built first
      local t = build { functions = {
        { address = "0000:82:00.0", device = "20b5", subsystem = "10de:1533", driver = "vfio-pci", iommu = 40, numa = 1 },
        { address = "0000:81:00.0", device = "20b5", subsystem = "10de:1533", driver = "vfio-pci", iommu = 40, numa = 1 },
        { address = "0000:c1:00.0", device = "20b5", subsystem = "10de:1533", driver = "vfio-pci", iommu = 41, numa = 1 },
      } }
      local A = function(extra) return ident("20b5", "0302", "GPU", { "10de", "1533" }, extra) end
      assert.are.same({ functions = {
        A { address = "0000:81:00.0", driver = "vfio-pci", iommuGroup = 40, numaNode = 1, counted = true },
        A { address = "0000:82:00.0", driver = "vfio-pci", iommuGroup = 40, numaNode = 1, counted = false },
        A { address = "0000:c1:00.0", driver = "vfio-pci", iommuGroup = 41, numaNode = 1, counted = true },
      } }, inventory_lua(t))
    end)
  end)

  describe("(5) a GPU whose driver is unbound", function()
    local T4 = function(extra) return ident("1eb8", "0302", "GPU", { "10de", "12a2" }, extra) end

    it("has no driver field", function()
      -- the T4 of the harvester ghw snapshot (0000:08:00.0), left unbound
      local t = build { functions = {
        { address = "0000:08:00.0", device = "1eb8", subsystem = "10de:12a2", iommu = 12, numa = 0 },
      } }
      assert.are.same({ functions = {
        T4 { address = "0000:08:00.0", iommuGroup = 12, numaNode = 0, counted = true },
      } }, inventory_bin(t))
    end)

    it("loses its driver field when unbound after the build; a VF may be unbound while its PF is bound", function()
      local t = build { functions = {
        { address = "0000:08:00.0", device = "1eb8", subsystem = "10de:12a2", driver = "nvidia", iommu = 12, numa = 0 },
        { address = "0000:41:00.0", device = "26b9", driver = "nvidia", iommu = 45,
          sriov = { total = 32, vfs = 2, iommu = 46, vf = { [1] = { driver = false } } } },
      } }
      assert.are.equal("nvidia", inventory_lua(t).functions[1].driver)
      t:unbind("0000:08:00.0")
      local fns = inventory_lua(t).functions
      assert.are.same(T4 { address = "0000:08:00.0", iommuGroup = 12, numaNode = 0, counted = true }, fns[1])
      assert.are.equal("nvidia", fns[3].driver)
      assert.are.equal("0000:41:00.5", fns[4].address)
      assert.is_nil(fns[4].driver)
    end)
  end)

  describe("SR-IOV", function()
    -- The RTX PRO 6000 Blackwell capture: PF 0001:04:00.0, first VF at .2
    -- (LAYOUT §3), virtfn0 … virtfn20 listed lexically by ls.
    local CAPTURE = S.fixtures() .. "/sysfs/real-host-captures/rtx-pro-6000-blackwell-pf-virtfn-links.txt"

    local function tree(vfs)
      return build { functions = {
        { address = "0001:04:00.0", device = "2bb5", subsystem = "10de:204e", driver = "nvidia", iommu = 300, numa = 0,
          port = "0001:00:01.1", sriov = { total = 48, vfs = vfs, offset = 2, stride = 1, iommu = 311 } },
        { address = "0000:42:00.0", device = "2bb5", subsystem = "10de:204e", driver = "nvidia", iommu = 80, numa = 0,
          sriov = { total = 48, vfs = 0, offset = 2, stride = 1 } },
        { address = "0001:05:00.0", vendor = "15b3", device = "1021", class = "020000", driver = "mlx5_core", iommu = 400 },
      } }
    end

    it("the tree's VF addresses are the capture's virtfn links", function()
      local t = tree(21)
      local vfs = t:vfs("0001:04:00.0")
      local n = 0
      for line in io.lines(CAPTURE) do
        local i, a = line:match("virtfn(%d+) %-> %.%./(%S+)")
        if i then
          n = n + 1
          assert.are.equal(a, vfs[tonumber(i) + 1], "virtfn" .. i)
        end
      end
      assert.are.equal(14, n) -- the excerpt's lines
    end)

    it("lists VFs by virtfn number, not name; domain 0001 sorts after 0000; the NIC is not reported", function()
      local t = tree(21)
      local fns = inventory_lua(t).functions
      local vfs = {}
      for i = 0, 20 do
        local devfn = 2 + i
        vfs[i + 1] = ("0001:04:%02x.%d"):format(devfn // 8, devfn % 8)
      end
      assert.are.equal("0001:04:01.4", vfs[11]) -- virtfn10, as in the capture
      assert.are.equal("0001:04:02.6", vfs[21]) -- virtfn20
      local P = function(extra) return ident("2bb5", "0302", "GPU", { "10de", "204e" }, extra) end
      local expected = {
        -- a PF without enabled VFs: no virtfn links, so no virtualFunctions
        P { address = "0000:42:00.0", driver = "nvidia", iommuGroup = 80, numaNode = 0,
          sriov = { totalVFs = 48, numVFs = 0 }, counted = true },
        P { address = "0001:04:00.0", driver = "nvidia", iommuGroup = 300, numaNode = 0,
          sriov = { totalVFs = 48, numVFs = 21 }, virtualFunctions = vfs, counted = true },
      }
      for i, a in ipairs(vfs) do
        expected[#expected + 1] = ident("2bb5", "0302", "GPU", { "10de", "0000" }, {
          address = a, driver = "nvidia", iommuGroup = 310 + i, numaNode = 0, physicalFunction = "0001:04:00.0",
          vfIndex = i - 1, counted = true })
      end
      assert.are.same({ functions = expected }, { functions = fns })
    end)

    it("follows sriov_numvfs going down (VFs and their links gone)", function()
      local t = tree(12)
      t:set_numvfs("0001:04:00.0", 3)
      local fns = inventory_lua(t).functions
      assert.are.equal(5, #fns)
      assert.are.same({ totalVFs = 48, numVFs = 3 }, fns[2].sriov)
      assert.are.same({ "0001:04:00.2", "0001:04:00.3", "0001:04:00.4" }, fns[2].virtualFunctions)
      assert.are.same({ 0, 1, 2 }, { fns[3].vfIndex, fns[4].vfIndex, fns[5].vfIndex })
    end)
  end)

  describe("omissions and errors", function()
    it("omits numaNode when numa_node is -1 or absent", function()
      local t = build { functions = {
        { address = "0000:08:00.0", device = "1eb8", subsystem = "10de:12a2", numa = -1 },
        { address = "0000:09:00.0", device = "1eb8", subsystem = "10de:12a2", numa = false },
      } }
      local T4 = function(extra) return ident("1eb8", "0302", "GPU", { "10de", "12a2" }, extra) end
      assert.are.same({ functions = {
        T4 { address = "0000:08:00.0", counted = true },
        T4 { address = "0000:09:00.0", counted = true },
      } }, inventory_lua(t))
    end)

    it("omits name and model when the database does not know the device", function()
      local t = build { functions = { { address = "0000:08:00.0", device = "0000", subsystem = "10de:0000" } } }
      assert.are.same({ functions = { {
        address = "0000:08:00.0", vendorID = "10de", deviceID = "0000", subsystemVendorID = "10de",
        subsystemDeviceID = "0000", revision = "a1", class = "0302", role = "GPU", counted = true,
      } } }, inventory_lua(t))
    end)

    it("gives role Other to an NVIDIA function of another class, without counted or gpu", function()
      -- 10de:2296 "Tegra PCIe Endpoint Virtual Network", class 0x020000
      local t = build { functions = {
        { address = "0000:0b:00.0", device = "2204", class = "030000", subsystem = "10de:147d", iommu = 14 },
        { address = "0000:0b:00.1", device = "2296", class = "020000", subsystem = "10de:0000", iommu = 14 },
      } }
      assert.are.same({
        address = "0000:0b:00.1", vendorID = "10de", deviceID = "2296", subsystemVendorID = "10de",
        subsystemDeviceID = "0000", revision = "a1", class = "0200", role = "Other",
        name = "Tegra PCIe Endpoint Virtual Network", model = "Tegra PCIe Endpoint Virtual Network", iommuGroup = 14,
      }, inventory_lua(t).functions[2])
    end)

    it("reads revision from config space when the revision file is absent", function()
      local t = build { functions = { { address = "0000:08:00.0", device = "1eb8", subsystem = "10de:12a2", revision = false } } }
      assert.is_nil(t:read("0000:08:00.0", "revision"))
      assert.are.equal("a1", inventory_lua(t).functions[1].revision)
    end)

    it("omits numVFs without sriov_numvfs, and vfIndex for a VF no virtfn link points at", function()
      local t = build { functions = {
        { address = "0000:41:00.0", device = "26b9", driver = "nvidia", iommu = 45,
          sriov = { total = 32, vfs = 2, iommu = 46 } },
      } }
      os.remove(t:path("0000:41:00.0", "sriov_numvfs"))
      os.remove(t:path("0000:41:00.0", "virtfn1"))
      local fns = inventory_lua(t).functions
      assert.are.same({ totalVFs = 32 }, fns[1].sriov)
      assert.are.same({ "0000:41:00.4" }, fns[1].virtualFunctions)
      assert.are.equal(0, fns[2].vfIndex)
      assert.are.equal("0000:41:00.0", fns[3].physicalFunction)
      assert.is_nil(fns[3].vfIndex)
    end)

    it("vgpu: type omitted when current_vgpu_type is absent or not decimal, creatable when its file is absent", function()
      local t = build { functions = {
        { address = "0000:41:00.0", device = "26b9", driver = "nvidia", iommu = 45,
          sriov = { total = 32, vfs = 3, iommu = 46, vgpu = { creatable = "l40s-full-catalog.txt" } } },
      } }
      os.remove(t:path("0000:41:00.4", "nvidia/current_vgpu_type"))
      t:write("0000:41:00.5", "nvidia/current_vgpu_type", "none\n")
      os.remove(t:path("0000:41:00.6", "nvidia/creatable_vgpu_types"))
      local fns = inventory_lua(t).functions
      assert.are.same({ creatable = rows(L40S) }, fns[2].vgpu)
      assert.are.same({ creatable = rows(L40S) }, fns[3].vgpu)
      assert.are.same({ type = 0 }, fns[4].vgpu)
    end)

    it("mdevTypes: [] for an empty mdev_supported_types/, types without a numeric suffix last by name, absent files omitted", function()
      local t = build { functions = {
        { address = "0000:3b:00.0", device = "1eb8", subsystem = "10de:12a2", driver = "nvidia", iommu = 5,
          mdev = { types = {
            { type = "nvidia-222", name = "GRID T4-1B", description = "d", available = 16 },
            { type = "custom-b", name = "B", description = "b", available = 1 },
            { type = "custom-a", name = "A", description = "a", available = 1 },
          } } },
        { address = "0000:5e:00.0", device = "1eb8", subsystem = "10de:12a2", driver = "nvidia", iommu = 6,
          mdev = { types = {} } },
      } }
      os.remove(t:path("0000:3b:00.0", "mdev_supported_types/custom-a/description"))
      os.remove(t:path("0000:3b:00.0", "mdev_supported_types/custom-a/available_instances"))
      local fns = inventory_lua(t).functions
      assert.are.same({
        { type = "nvidia-222", name = "GRID T4-1B", availableInstances = 16, deviceAPI = "vfio-pci", description = "d" },
        { type = "custom-a", name = "A", deviceAPI = "vfio-pci" },
        { type = "custom-b", name = "B", availableInstances = 1, deviceAPI = "vfio-pci", description = "b" },
      }, fns[1].mdevTypes)
      assert.are.same({}, fns[2].mdevTypes)
      assert.are.equal("array", H.json.kind(fns[2].mdevTypes))
    end)

    it("an audio function names the lowest-addressed GPU function of its board", function()
      local t = build { functions = {
        { address = "0000:0b:00.2", device = "2204", class = "030000", subsystem = "10de:147d", iommu = 14 },
        { address = "0000:0b:00.1", device = "1aef", class = "040300", subsystem = "10de:147d", iommu = 14 },
        { address = "0000:0b:00.0", device = "2204", class = "030000", subsystem = "10de:147d", iommu = 14 },
      } }
      local fns = inventory_lua(t).functions
      assert.are.equal("0000:0b:00.0", fns[2].gpu)
      assert.are.same({ true, false }, { fns[1].counted, fns[3].counted })
    end)

    it("refuses an entry of bus/pci/devices that is not a PCI address (exit 2, naming it)", function()
      local t = build { functions = { { address = "0000:08:00.0", device = "1eb8" } } }
      assert(require("lfs").mkdir(t.root .. "/bus/pci/devices/not-a-bdf"))
      local out, err, code = H.run { "inventory", "--sysfs", t.root, "--output", "json", "--pci-ids", IDS }
      assert.are.equal(2, code)
      assert.are.equal("", out)
      assert.truthy(err:find("not-a-bdf", 1, true), err)
    end)

    it("refuses an unreadable --pci-ids and an unknown --pci-method (exit 2)", function()
      local t = build { functions = { { address = "0000:08:00.0", device = "1eb8" } } }
      local missing = t.base .. "/no-such-pci.ids"
      local out, err, code = H.run { "inventory", "--sysfs", t.root, "--output", "json", "--pci-ids", missing }
      assert.are.equal(2, code)
      assert.are.equal("", out)
      assert.truthy(err:find(missing, 1, true), err)
      out, err, code = H.run { "inventory", "--sysfs", t.root, "--output", "json", "--pci-ids", IDS,
        "--pci-method", "no-such-method" }
      assert.are.equal(2, code)
      assert.truthy(err:find("no-such-method", 1, true), err)
    end)

    it("fails the scan, naming the path, when a function lacks its vendor file", function()
      local t = build { functions = {
        { address = "0000:08:00.0", device = "1eb8", subsystem = "10de:12a2" },
        { address = "0000:09:00.0", device = "1eb8", subsystem = "10de:12a2" },
      } }
      os.remove(t:path("0000:09:00.0", "vendor"))
      local out, err, code = H.run { "inventory", "--sysfs", t.root, "--output", "json", "--pci-ids", IDS }
      assert.are_not.equal(0, code)
      assert.are.equal("", out)
      assert.truthy(err:find("0000:09:00.0", 1, true), err)
    end)

    it("an empty node prints {\"functions\": []}", function()
      local t = build { functions = {
        { address = "0000:00:01.0", vendor = "1022", device = "1483", class = "060400", driver = "pcieport" },
      } }
      local out, err, code = H.run { "inventory", "--sysfs", t.root, "--output", "json", "--pci-ids", IDS }
      assert.are.equal(0, code, err)
      assert.are.equal('{"functions": []}', (out:gsub("%s+$", "")))
      assert.are.same({ functions = {} }, inventory_lua(t))
    end)

    it("refuses a root without bus/pci/devices, naming the path (exit 2; binding nil, msg)", function()
      local t = build { functions = {} }
      local out, err, code = H.run { "inventory", "--sysfs", t.base, "--output", "json", "--pci-ids", IDS }
      assert.are.equal(2, code)
      assert.are.equal("", out)
      assert.truthy(err:find(t.base .. "/bus/pci/devices", 1, true), err)
      local r, msg = H.core.inventory { sysfs = t.base, pci_ids = IDS }
      assert.is_nil(r)
      assert.truthy(tostring(msg):find(t.base .. "/bus/pci/devices", 1, true), msg)
    end)

    it("fails the scan, naming the function, when a listed function vanished", function()
      local t = build { functions = {
        { address = "0000:08:00.0", device = "1eb8", driver = "vfio-pci", iommu = 12 },
        { address = "0000:09:00.0", device = "1eb8", driver = "vfio-pci", iommu = 13 },
      } }
      t:vanish("0000:09:00.0", { keep_link = true }) -- listed, directory gone
      local out, err, code = H.run { "inventory", "--sysfs", t.root, "--output", "json", "--pci-ids", IDS }
      assert.are_not.equal(0, code)
      assert.are.equal("", out)
      assert.truthy(err:find("0000:09:00.0", 1, true), err)
      local r, msg = H.core.inventory { sysfs = t.root, pci_ids = IDS }
      assert.is_nil(r)
      assert.truthy(tostring(msg):find("0000:09:00.0", 1, true), msg)
    end)

    it("does not report a function that vanished with its link (hot-unplug before the scan)", function()
      local t = build { functions = {
        { address = "0000:08:00.0", device = "1eb8", subsystem = "10de:12a2", driver = "vfio-pci", iommu = 12 },
        { address = "0000:09:00.0", device = "1eb8", subsystem = "10de:12a2", driver = "vfio-pci", iommu = 13 },
      } }
      t:vanish("0000:09:00.0")
      local fns = inventory_lua(t).functions
      assert.are.equal(1, #fns)
      assert.are.equal("0000:08:00.0", fns[1].address)
    end)
  end)

  describe("hostile trees", function()
    -- Trees no kernel writes, as a broken driver, a bug or an attacker with
    -- write access to a fake root could leave them. The scan never blocks
    -- and never invents a value: docs/gpunode.md, "Errors" and "Hostile
    -- trees".
    local lfs = require "lfs"

    -- the binary under a time limit (a scan that blocks exits 124), with
    -- the exit status, stdout and stderr
    local function run_bounded(t)
      local out, err = os.tmpname(), os.tmpname()
      local env = H.asan and "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 " or ""
      local _, _, code = os.execute(("timeout 20 env %s%s inventory --sysfs %s --output json --pci-ids %s >%s 2>%s")
        :format(env, H.q(H.bin), H.q(t.root), H.q(IDS), H.q(out), H.q(err)))
      local o, e = H.read(out), H.read(err)
      os.remove(out) os.remove(err)
      return code, o, e
    end

    local function mkfifo(path)
      os.remove(path)
      assert(os.execute("mkfifo " .. H.q(path)), "mkfifo " .. path)
      assert.are.equal("named pipe", lfs.symlinkattributes(path, "mode"))
    end

    local function symlink(target, path)
      os.remove(path)
      assert(os.execute(("ln -s %s %s"):format(H.q(target), H.q(path))))
    end

    -- how the scan names a file: through bus/pci/devices/<BDF>, as libpci does
    local function named(t, bdf, file) return ("%s/bus/pci/devices/%s/%s"):format(t.root, bdf, file) end

    -- functions by address: the T4 0000:3b:00.0 first, then the L40S PF
    -- 0000:41:00.0 and its VFs 0000:41:00.4, .5, ... (the NIC is not NVIDIA)
    local function l40s(vfs)
      return build { functions = {
        { address = "0000:41:00.0", device = "26b9", subsystem = "10de:1851", driver = "nvidia", iommu = 45, numa = 0,
          sriov = { total = 32, vfs = vfs or 2, iommu = 46, vgpu = { creatable = "l40s-full-catalog.txt" } } },
        { address = "0000:3b:00.0", device = "1eb8", subsystem = "10de:12a2", driver = "nvidia", iommu = 5,
          mdev = { types = { { type = "nvidia-222", name = "GRID T4-1B", description = "d", available = 16 } } } },
        { address = "0000:19:00.0", vendor = "15b3", device = "101d", class = "020000", driver = "mlx5_core", iommu = 31 },
      } }
    end

    -- a FIFO (or a directory) where an attribute should be: an optional
    -- file that exists but cannot be read, so the scan fails naming it —
    -- at once, for the files read directly and for those libpci opens
    -- (checked before libpci blocks on them), NVIDIA or not
    local CASES = {
      { "0000:41:00.4", "nvidia/current_vgpu_type" },
      { "0000:41:00.5", "nvidia/creatable_vgpu_types" },
      { "0000:3b:00.0", "mdev_supported_types/nvidia-222/name" },
      { "0000:3b:00.0", "mdev_supported_types/nvidia-222/available_instances" },
      { "0000:41:00.0", "sriov_numvfs" },
      { "0000:41:00.0", "numa_node" },
      { "0000:41:00.0", "vendor" },
      { "0000:41:00.4", "revision" },
      { "0000:41:00.4", "config" },
      { "0000:41:00.4", "subsystem_vendor" },
      { "0000:41:00.4", "subsystem_device" },
      { "0000:19:00.0", "class" }, -- not NVIDIA: libpci still reads its identity
    }
    for _, c in ipairs(CASES) do
      it(("fails, without blocking, naming a FIFO in place of %s"):format(c[2]), function()
        local t = l40s()
        mkfifo(t:path(c[1], c[2]))
        local path = named(t, c[1], c[2])
        local code, out, err = run_bounded(t)
        assert.are_not.equal(124, code, "the scan blocked on " .. path)
        assert.are.equal(2, code, err)
        assert.are.equal("", out)
        assert.truthy(err:find(path .. ": not a regular file", 1, true), err)
        local r, msg = H.core.inventory { sysfs = t.root, pci_ids = IDS }
        assert.is_nil(r)
        assert.truthy(tostring(msg):find(path .. ": not a regular file", 1, true), msg)
      end)
    end

    it("fails naming a directory in place of current_vgpu_type", function()
      local t = l40s()
      os.remove(t:path("0000:41:00.4", "nvidia/current_vgpu_type"))
      assert(lfs.mkdir(t:path("0000:41:00.4", "nvidia/current_vgpu_type")))
      local path = named(t, "0000:41:00.4", "nvidia/current_vgpu_type")
      local code, out, err = run_bounded(t)
      assert.are.equal(2, code, err)
      assert.are.equal("", out)
      assert.truthy(err:find(path .. ": not a regular file", 1, true), err)
    end)

    it("replaces bytes that are not UTF-8 with U+FFFD, keeping every row, its id and its name", function()
      local t = l40s()
      -- 0xff never occurs in UTF-8; "\xc3(" is a lead byte without its
      -- continuation; "\xe2\x82" a sequence cut short (two bytes, two
      -- U+FFFD); "\xc0\xaf" an overlong '/'; a NUL byte counts as invalid
      t:set_creatable("0000:41:00.4", "ID    : vGPU Name\n1155  : NVIDIA L40S-\xff24Q\n1156  : NVIDIA L40S-48Q\n")
      t:set_vgpu("0000:41:00.4", 1155)
      t:write("0000:3b:00.0", "mdev_supported_types/nvidia-222/name", "GRID \xc3(T4-1B\n")
      t:write("0000:3b:00.0", "mdev_supported_types/nvidia-222/description", "num_heads=4\0x, \xe2\x82\n")
      t:write("0000:3b:00.0", "mdev_supported_types/nvidia-222/device_api", "vfio\xc0\xafpci\n")
      -- valid UTF-8 is kept as it is
      t:set_creatable("0000:41:00.5", "ID    : vGPU Name\n7  : caf\xc3\xa9 \xe2\x82\xac\n")
      local fail = "\u{FFFD}"
      for _, inv in ipairs { inventory_bin(t), inventory_lua(t) } do
        local fns = inv.functions
        assert.are.equal("0000:41:00.4", fns[3].address)
        assert.are.same({ type = 1155, typeName = "NVIDIA L40S-" .. fail .. "24Q", profile = "L40S-" .. fail .. "24Q",
          creatable = { { id = 1155, name = "NVIDIA L40S-" .. fail .. "24Q" }, { id = 1156, name = "NVIDIA L40S-48Q" } } },
          fns[3].vgpu)
        assert.are.same({ type = 0, creatable = { { id = 7, name = "caf\u{e9} \u{20ac}" } } }, fns[4].vgpu)
        assert.are.same({ { type = "nvidia-222", name = "GRID " .. fail .. "(T4-1B", availableInstances = 16,
          deviceAPI = "vfio" .. fail .. fail .. "pci", description = "num_heads=4" .. fail .. "x, " .. fail .. fail } },
          fns[1].mdevTypes)
      end
    end)

    it("keeps an mdev type whose directory name is not UTF-8, and its devices", function()
      local t = build { functions = {
        { address = "0000:3b:00.0", device = "1eb8", subsystem = "10de:12a2", driver = "nvidia", iommu = 5,
          mdev = { types = {
            { type = "nvidia-222", name = "GRID T4-1B", description = "d", available = 16 },
            { type = "odd-\xff", name = "X", description = "x", available = 1 },
          } } },
      } }
      assert(lfs.mkdir(t:path("0000:3b:00.0", "mdev_supported_types/nvidia-222/devices/uuid-\xfe")))
      assert.are.same({
        { type = "nvidia-222", name = "GRID T4-1B", availableInstances = 16, deviceAPI = "vfio-pci", description = "d",
          devices = { "uuid-\u{FFFD}" } },
        { type = "odd-\u{FFFD}", name = "X", availableInstances = 1, deviceAPI = "vfio-pci", description = "x" },
      }, inventory_bin(t).functions[1].mdevTypes)
    end)

    it("omits numaNode when numa_node is not a signed decimal (libpci would say node 0)", function()
      local t = build { functions = {
        { address = "0000:08:00.0", device = "1eb8", subsystem = "10de:12a2", numa = 0 },
        { address = "0000:09:00.0", device = "1eb8", subsystem = "10de:12a2", numa = 0 },
        { address = "0000:0a:00.0", device = "1eb8", subsystem = "10de:12a2", numa = 0 },
        { address = "0000:0b:00.0", device = "1eb8", subsystem = "10de:12a2", numa = 0 },
        { address = "0000:0c:00.0", device = "1eb8", subsystem = "10de:12a2", numa = 0 },
        { address = "0000:0d:00.0", device = "1eb8", subsystem = "10de:12a2", numa = 0 },
      } }
      t:write("0000:08:00.0", "numa_node", "abc\n")
      t:write("0000:09:00.0", "numa_node", "1x\n")
      t:write("0000:0a:00.0", "numa_node", "")
      t:write("0000:0b:00.0", "numa_node", "+1\n")
      t:write("0000:0c:00.0", "numa_node", "-5\n")
      t:write("0000:0d:00.0", "numa_node", "3\n")
      local T4 = function(extra) return ident("1eb8", "0302", "GPU", { "10de", "12a2" }, extra) end
      local want = { functions = {
        T4 { address = "0000:08:00.0", counted = true }, T4 { address = "0000:09:00.0", counted = true },
        T4 { address = "0000:0a:00.0", counted = true }, T4 { address = "0000:0b:00.0", counted = true },
        T4 { address = "0000:0c:00.0", counted = true }, T4 { address = "0000:0d:00.0", numaNode = 3, counted = true },
      } }
      assert.are.same(want, inventory_bin(t))
      assert.are.same(want, inventory_lua(t))
    end)

    it("omits vgpu.type when current_vgpu_type is negative or not a plain decimal", function()
      local t = l40s(4)
      t:write("0000:41:00.4", "nvidia/current_vgpu_type", "-5\n")
      t:write("0000:41:00.5", "nvidia/current_vgpu_type", "+1155\n")
      t:write("0000:41:00.6", "nvidia/current_vgpu_type", "0x483\n")
      t:write("0000:41:00.7", "nvidia/current_vgpu_type", "1155\n")
      local fns = inventory_lua(t).functions
      assert.are.same({ "0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7" },
        { fns[3].address, fns[4].address, fns[5].address, fns[6].address })
      for i = 3, 5 do assert.are.same({ creatable = rows(L40S) }, fns[i].vgpu, fns[i].address) end
      assert.are.same({ type = 1155, typeName = "NVIDIA L40S-24Q", profile = "L40S-24Q", creatable = rows(L40S) },
        fns[6].vgpu)
    end)

    it("omits sriov counts and availableInstances that are negative or not decimal", function()
      local t = l40s()
      t:write("0000:41:00.0", "sriov_numvfs", "-2\n")
      t:write("0000:3b:00.0", "mdev_supported_types/nvidia-222/available_instances", "-1\n")
      local fns = inventory_lua(t).functions
      assert.are.same({ totalVFs = 32 }, fns[2].sriov)
      assert.is_nil(fns[1].mdevTypes[1].availableInstances)
      t:write("0000:41:00.0", "sriov_totalvfs", "many\n")
      assert.is_nil(inventory_lua(t).functions[2].sriov)
    end)

    it("lists only virtfn<N> links the kernel could have made", function()
      -- three real VFs; then: a dangling virtfn3 (its VF gone), virtfn03
      -- (the kernel writes virtfn%u: never a leading zero) pointing at VF 1,
      -- virtfn4 to an existing directory whose name is no PCI address,
      -- virtfn5 to a regular file named like a VF, virtfn6 looping on itself,
      -- virtfn7 to a name longer than any PCI address
      local t = l40s(3)
      local pf = t:path("0000:41:00.0")
      symlink("../0000:41:00.7", pf .. "/virtfn3")
      symlink("../0000:41:00.5", pf .. "/virtfn03")
      assert(lfs.mkdir(t.base .. "/not-a-vf"))
      symlink("../../../../not-a-vf", pf .. "/virtfn4")
      assert.are.equal("directory", lfs.attributes(pf .. "/virtfn4", "mode"))
      S.write(t.base .. "/0000:41:01.0", "")
      symlink(t.base .. "/0000:41:01.0", pf .. "/virtfn5")
      symlink("virtfn6", pf .. "/virtfn6")
      symlink("../" .. ("a"):rep(300), pf .. "/virtfn7")
      local fns = inventory_bin(t).functions
      assert.are.equal("0000:41:00.0", fns[2].address)
      assert.are.same({ "0000:41:00.4", "0000:41:00.5", "0000:41:00.6" }, fns[2].virtualFunctions)
      assert.are.same({ 0, 1, 2 }, { fns[3].vfIndex, fns[4].vfIndex, fns[5].vfIndex })
      assert.are.equal(5, #fns)
    end)

    it("ignores a virtfn link to the PF itself and a second link to a listed VF", function()
      local t = l40s(3)
      local pf = t:path("0000:41:00.0")
      symlink("../0000:41:00.0", pf .. "/virtfn3")   -- the PF itself
      symlink("../0000:41:00.5", pf .. "/virtfn4")   -- VF 1 again
      local fns = inventory_bin(t).functions
      assert.are.same({ "0000:41:00.4", "0000:41:00.5", "0000:41:00.6" }, fns[2].virtualFunctions)
      assert.are.same({ 0, 1, 2 }, { fns[3].vfIndex, fns[4].vfIndex, fns[5].vfIndex })
      assert.is_nil(fns[2].vfIndex)
    end)

    it("a physfn link that names no PCI address gives no physicalFunction (not a VF)", function()
      local t = l40s(3)
      symlink("physfn", t:path("0000:41:00.4", "physfn"))           -- a loop: basename "physfn"
      symlink("../../../../elsewhere", t:path("0000:41:00.5", "physfn"))
      symlink("../" .. ("0"):rep(300), t:path("0000:41:00.6", "physfn"))
      local fns = inventory_bin(t).functions
      assert.are.same({ "0000:41:00.4", "0000:41:00.5", "0000:41:00.6" }, { fns[3].address, fns[4].address, fns[5].address })
      for i = 3, 5 do
        assert.is_nil(fns[i].physicalFunction, fns[i].address)
        assert.is_nil(fns[i].vfIndex, fns[i].address)
        assert.is_true(fns[i].counted) -- each in its own group
      end
      -- the PF still lists what its virtfn links point at
      assert.are.same({ "0000:41:00.4", "0000:41:00.5", "0000:41:00.6" }, fns[2].virtualFunctions)
    end)

    it("does not list a function whose vendor file is garbage (libpci reads it as vendor 0000)", function()
      local t = l40s(2)
      t:write("0000:3b:00.0", "vendor", "zzz\n")
      local code, out, err = run_bounded(t)
      assert.are.equal(0, code, err)
      local inv = assert(H.json.decode(out))
      local addrs = {}
      for _, f in ipairs(inv.functions) do addrs[#addrs + 1] = f.address end
      assert.are.same({ "0000:41:00.0", "0000:41:00.4", "0000:41:00.5" }, addrs)
    end)

    it("reports both subsystem ids or neither, never half of them", function()
      local t = build { functions = {
        { address = "0000:08:00.0", device = "1eb8", subsystem = "10de:12a2" },
        { address = "0000:09:00.0", device = "1eb8", subsystem = "10de:12a2" },
        { address = "0000:0a:00.0", device = "1eb8", subsystem = "10de:12a2" },
        { address = "0000:0b:00.0", device = "1eb8", subsystem = "10de:12a2" },
        { address = "0000:0c:00.0", device = "1eb8", subsystem = "10de:12a2" },
        { address = "0000:0d:00.0", device = "1eb8", subsystem = "10de:12a2" },
      } }
      -- 08: subsystem_device and config missing
      os.remove(t:path("0000:08:00.0", "subsystem_device"))
      os.remove(t:path("0000:08:00.0", "config"))
      -- 09: subsystem_device missing, config there (libpci does not read it then)
      os.remove(t:path("0000:09:00.0", "subsystem_device"))
      -- 0a: garbage in a subsystem file
      t:write("0000:0a:00.0", "subsystem_vendor", "zzz\n")
      t:write("0000:0b:00.0", "subsystem_device", "0x12a2x\n")
      -- 0c: no subsystem files: both from config space (the builder wrote
      -- 10de:12a2 at 0x2c)
      os.remove(t:path("0000:0c:00.0", "subsystem_vendor"))
      os.remove(t:path("0000:0c:00.0", "subsystem_device"))
      -- 0d: no subsystem files and no config space
      os.remove(t:path("0000:0d:00.0", "subsystem_vendor"))
      os.remove(t:path("0000:0d:00.0", "subsystem_device"))
      os.remove(t:path("0000:0d:00.0", "config"))
      local T4 = function(extra)
        local o = ident("1eb8", "0302", "GPU", { "10de", "12a2" }, extra)
        if extra.subsystemVendorID == false then o.subsystemVendorID, o.subsystemDeviceID = nil, nil end
        return o
      end
      local want = { functions = {
        T4 { address = "0000:08:00.0", subsystemVendorID = false, counted = true },
        T4 { address = "0000:09:00.0", subsystemVendorID = false, counted = true },
        T4 { address = "0000:0a:00.0", subsystemVendorID = false, counted = true },
        T4 { address = "0000:0b:00.0", subsystemVendorID = false, counted = true },
        T4 { address = "0000:0c:00.0", counted = true },
        T4 { address = "0000:0d:00.0", subsystemVendorID = false, counted = true },
      } }
      assert.are.same(want, inventory_bin(t))
      assert.are.same(want, inventory_lua(t))
    end)
  end)
end)
