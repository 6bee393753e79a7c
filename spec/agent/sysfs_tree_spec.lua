--- The fake sysfs builder (spec/support/sysfs.lua) against
--- ../shared/fixtures/sysfs/LAYOUT.md: the inventory specs trust these
--- trees, so their layout is checked here file by file.
local S = require "sysfs"
local lfs = require "lfs"

-- every symlink under `dir`, as {path, target}
local function links(dir)
  local out = {}
  local function walk(d)
    for _, e in ipairs(S.listdir(d)) do
      local p = d .. "/" .. e
      if lfs.symlinkattributes(p, "mode") == "link" then
        out[#out + 1] = { p, S.readlink(p) }
      elseif lfs.attributes(p, "mode") == "directory" then
        walk(p)
      end
    end
  end
  walk(dir)
  return out
end

local function dangling(dir)
  local bad = {}
  for _, l in ipairs(links(dir)) do
    if not lfs.attributes(l[1], "mode") then bad[#bad + 1] = l[1] .. " -> " .. l[2] end
  end
  return bad
end

describe("sysfs builder", function()
  local t
  after_each(function()
    if t then t:remove() end
    t = nil
  end)

  local function l40s(extra)
    local fn = { address = "0000:41:00.0", device = "26b9", subsystem = "10de:1851", driver = "nvidia", iommu = 45,
      numa = 0, port = "0000:40:01.1",
      sriov = { total = 32, vfs = 12, offset = 4, stride = 1, iommu = 46,
        vgpu = { creatable = "l40s-full-catalog.txt", current = { [0] = 1155 } } } }
    for k, v in pairs(extra or {}) do fn[k] = v end
    return fn
  end

  it("writes the identity files in the kernel's formats (LAYOUT §2)", function()
    t = S.build { functions = { l40s() } }
    local pf, vf = "0000:41:00.0", "0000:41:00.4"
    assert.are.equal("0x10de\n", t:read(pf, "vendor"))
    assert.are.equal("0x26b9\n", t:read(pf, "device"))
    assert.are.equal("0x030200\n", t:read(pf, "class"))
    assert.are.equal("0x10de\n", t:read(pf, "subsystem_vendor"))
    assert.are.equal("0x1851\n", t:read(pf, "subsystem_device"))
    assert.are.equal("0x0000\n", t:read(vf, "subsystem_device"))
    assert.are.equal("0xa1\n", t:read(pf, "revision"))
    assert.are.equal("0\n", t:read(pf, "numa_node"))
    assert.are.equal(table.concat({
      "DRIVER=nvidia", "PCI_CLASS=30200", "PCI_ID=10DE:26B9", "PCI_SUBSYS_ID=10DE:0000", "PCI_SLOT_NAME=0000:41:00.4",
      "MODALIAS=pci:v000010DEd000026B9sv000010DEsd00000000bc03sc02i00", "" }, "\n"), t:read(vf, "uevent"))
    local cfg = t:read(pf, "config")
    assert.is_true(#cfg >= 64)
    assert.are.same({ 0xde, 0x10, 0xb9, 0x26 }, { cfg:byte(1, 4) })
    assert.are.same({ 0xa1, 0x00, 0x02, 0x03 }, { cfg:byte(9, 12) })
    assert.are.same({ 0xde, 0x10, 0x51, 0x18 }, { cfg:byte(0x2d, 0x30) })
    -- a VF's ID registers read ffff, as in the A2 VF capture
    assert.are.same({ 0xff, 0xff, 0xff, 0xff }, { t:read(vf, "config"):byte(1, 4) })
  end)

  it("matches the A2 VF capture's identity files byte for byte", function()
    local cap = S.fixtures() .. "/sysfs/harvester-pcidevices-testdata/sys/class/mdev_bus/0000:08:01.7/"
    t = S.build { functions = {
      { address = "0000:08:00.0", device = "25b6", subsystem = "10de:157e", driver = "nvidia", numa = 0,
        sriov = { total = 16, vfs = 12, mdev = { types = "a2" } } } } }
    local vf = "0000:08:01.7"
    for _, f in ipairs { "vendor", "device", "class", "subsystem_vendor", "subsystem_device", "revision", "numa_node" } do
      assert.are.equal(S.read(cap .. f), t:read(vf, f), f)
    end
    -- uevent: the capture's lines (MODALIAS is written too)
    assert.are.equal(S.read(cap .. "uevent"), t:read(vf, "uevent"))
    assert.are.equal(S.read(cap .. "modalias"), t:read(vf, "modalias"))
    for _, ty in ipairs(S.listdir(cap .. "mdev_supported_types")) do
      for _, f in ipairs { "name", "description", "available_instances", "device_api" } do
        assert.are.equal(S.read(cap .. "mdev_supported_types/" .. ty .. "/" .. f),
          t:read(vf, "mdev_supported_types/" .. ty .. "/" .. f), ty .. "/" .. f)
      end
      assert.is_not_nil(t:read(vf, "mdev_supported_types/" .. ty .. "/create"))
    end
    assert.are.equal("../../devices/pci0000:08/0000:08:01.7", S.readlink(t.root .. "/class/mdev_bus/" .. vf))
  end)

  it("links resolve inside the tree, with the real relative forms (LAYOUT §1, §3)", function()
    t = S.build { functions = {
      l40s(),
      { address = "0000:41:00.1", device = "22ba", class = "040300", driver = "snd_hda_intel", iommu = 45,
        numa = 0, port = "0000:40:01.1" },
      { address = "0001:04:00.0", device = "2bb5", driver = "nvidia", iommu = 300,
        sriov = { total = 48, vfs = 3, offset = 2, iommu = 311 } },
    } }
    assert.are.same({}, dangling(t.root))
    local R = t.root
    assert.are.equal("../../../devices/pci0000:40/0000:40:01.1/0000:41:00.0", S.readlink(R .. "/bus/pci/devices/0000:41:00.0"))
    assert.are.equal("../../../devices/pci0001:04/0001:04:00.2", S.readlink(R .. "/bus/pci/devices/0001:04:00.2"))
    assert.are.equal("../../../../bus/pci/drivers/nvidia", S.readlink(t:path("0000:41:00.0", "driver")))
    assert.are.equal("../../../bus/pci/drivers/nvidia", S.readlink(t:path("0001:04:00.0", "driver")))
    assert.are.equal("../../../../kernel/iommu_groups/45", S.readlink(t:path("0000:41:00.0", "iommu_group")))
    assert.are.equal("../0000:41:00.0", S.readlink(t:path("0000:41:00.4", "physfn")))
    assert.are.equal("../0000:41:01.7", S.readlink(t:path("0000:41:00.0", "virtfn11")))
    assert.are.equal("../0001:04:00.2", S.readlink(t:path("0001:04:00.0", "virtfn0")))
    assert.are.same({ "0000:41:00.0", "0000:41:00.1" }, S.listdir(R .. "/kernel/iommu_groups/45/devices"))
    local real = io.popen("readlink -f " .. H.q(R .. "/kernel/iommu_groups/45/devices/0000:41:00.1")):read("l")
    assert.are.equal(t:path("0000:41:00.1"), real)
    assert.are.equal(45, t:group("0000:41:00.1"))
    assert.are.equal("snd_hda_intel", t:driver("0000:41:00.1"))
    -- the root port is a function of the tree too (not NVIDIA)
    assert.are.equal("0x1022\n", t:read("0000:40:01.1", "vendor"))
    assert.are.equal("0x060400\n", t:read("0000:40:01.1", "class"))
  end)

  it("writes SR-IOV files and VF addresses per LAYOUT §3-§4", function()
    t = S.build { functions = { l40s() } }
    local pf = "0000:41:00.0"
    assert.are.equal("32\n", t:read(pf, "sriov_totalvfs"))
    assert.are.equal("12\n", t:read(pf, "sriov_numvfs"))
    assert.are.equal("4\n", t:read(pf, "sriov_offset"))
    assert.are.equal("1\n", t:read(pf, "sriov_stride"))
    assert.are.same({ "0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7", "0000:41:01.0", "0000:41:01.1",
      "0000:41:01.2", "0000:41:01.3", "0000:41:01.4", "0000:41:01.5", "0000:41:01.6", "0000:41:01.7" }, t:vfs(pf))
    assert.is_nil(t:read(pf, "physfn"))
    assert.is_nil(t:read("0000:41:00.4", "sriov_totalvfs"))
    assert.are.equal("0000:3b:01.3", S.vf_address("0000:3b:00.0", 4, 1, 7))
    assert.are.equal("0000:42:00.0", S.vf_address("0000:41:1f.0", 8, 1, 0)) -- carries into the next bus
  end)

  it("writes the six nvidia/ files (LAYOUT §5) and changes them", function()
    t = S.build { functions = { l40s() } }
    local vf = "0000:41:00.4"
    assert.are.same({ "creatable_vgpu_types", "current_vgpu_type", "gpu_instance_id", "placement_id", "vgpu_params",
      "warm_update" }, S.listdir(t:path(vf, "nvidia")))
    assert.are.equal(S.read(S.fixtures() .. "/sysfs/creatable_vgpu_types/l40s-full-catalog.txt"),
      t:read(vf, "nvidia/creatable_vgpu_types"))
    assert.are.equal("1155\n", t:read(vf, "nvidia/current_vgpu_type"))
    assert.are.equal("0\n", t:read("0000:41:00.5", "nvidia/current_vgpu_type"))
    t:set_vgpu("0000:41:00.5", 1155)
    assert.are.equal(1155, t:vgpu("0000:41:00.5"))
    t:set_creatable(vf, {})
    assert.are.equal("ID    : vGPU Name\n", t:read(vf, "nvidia/creatable_vgpu_types"))
    t:reboot()
    for _, v in ipairs(t:vfs("0000:41:00.0")) do assert.are.equal("0\n", t:read(v, "nvidia/current_vgpu_type")) end
    assert.are.equal("ID    : vGPU Name\n", t:read(vf, "nvidia/creatable_vgpu_types"))
    t:reboot { creatable = "l40s-full-catalog.txt", disable_vfs = true }
    assert.are.equal("0\n", t:read("0000:41:00.0", "sriov_numvfs"))
    assert.are.same({}, t:vfs("0000:41:00.0"))
    assert.are.same({}, dangling(t.root))
  end)

  it("unbinds, lowers sriov_numvfs and makes functions vanish without leaving dangling links", function()
    t = S.build { functions = {
      l40s(),
      { address = "0000:08:00.0", device = "25b6", driver = "nvidia", iommu = 16,
        sriov = { total = 16, vfs = 2, iommu = 17, mdev = { types = "a2",
          devices = { ["nvidia-746"] = { "f6c58d0e-3d1c-4a39-9a5e-0b4b2a3c9e01" } } } } },
    } }
    t:unbind("0000:41:00.4")
    assert.is_nil(t:driver("0000:41:00.4"))
    assert.is_nil(t:read("0000:41:00.4", "uevent"):find("DRIVER=", 1, true))
    assert.is_nil(S.readlink(t.root .. "/bus/pci/drivers/nvidia/0000:41:00.4"))
    t:bind("0000:41:00.4", "vfio-pci")
    assert.are.equal("vfio-pci", t:driver("0000:41:00.4"))
    t:set_numvfs("0000:41:00.0", 2)
    assert.are.same({ "0000:41:00.4", "0000:41:00.5" }, t:vfs("0000:41:00.0"))
    assert.is_nil(lfs.attributes(t.root .. "/bus/pci/devices/0000:41:00.6"))
    assert.is_nil(lfs.attributes(t.root .. "/kernel/iommu_groups/48"))
    t:set_numvfs("0000:41:00.0", 4) -- and back up, from the PF's description
    assert.are.equal(48, t:group("0000:41:00.6"))
    t:vanish("0000:08:00.0")
    assert.is_nil(lfs.attributes(t.root .. "/bus/pci/devices/0000:08:00.4"))
    assert.are.same({}, S.listdir(t.root .. "/class/mdev_bus"))
    assert.are.same({}, dangling(t.root))
    t:vanish("0000:41:00.5", { keep_link = true })
    assert.are.same({ t.root .. "/bus/pci/devices/0000:41:00.5 -> ../../../devices/pci0000:40/0000:40:01.1/0000:41:00.5" },
      dangling(t.root))
    assert.is_nil(S.readlink(t:path("0000:41:00.0", "virtfn1")))
  end)

  it("fakes /proc: a process holding a VF's /dev/vfio/<group> (or its cdev)", function()
    t = S.build { functions = { l40s { cdev = 3 } } }
    local pid = t:hold({ "0000:41:00.4", "0000:41:00.5" })
    local fd = t.proc .. "/" .. pid .. "/fd/"
    assert.are.equal("qemu-kvm\n", S.read(t.proc .. "/" .. pid .. "/comm"))
    assert.are.equal("/dev/vfio/vfio", S.readlink(fd .. "19"))
    assert.are.equal("/dev/vfio/46", S.readlink(fd .. "20"))
    assert.are.equal("/dev/vfio/47", S.readlink(fd .. "21"))
    local pid2 = t:hold("0000:41:00.0", { cdev = true, pid = 999 })
    assert.are.equal(999, pid2)
    assert.are.equal("/dev/vfio/devices/vfio3", S.readlink(t.proc .. "/999/fd/20"))
    assert.is_not_nil(lfs.attributes(t:path("0000:41:00.0", "vfio-dev/vfio3")))
    t:release(pid)
    assert.is_nil(lfs.attributes(t.proc .. "/" .. pid))
  end)

  it("refuses a duplicate address and a VF landing on an existing function", function()
    assert.has_error(function()
      S.build { functions = { { address = "0000:08:00.0", device = "1eb8" }, { address = "08:00.0", device = "1eb8" } } }
    end)
    assert.has_error(function()
      S.build { functions = { { address = "0000:08:00.4", device = "1eb8" },
        { address = "0000:08:00.0", device = "25b6", sriov = { total = 16, vfs = 1 } } } }
    end)
  end)

  it("removes everything it made", function()
    t = S.build { functions = { l40s() } }
    t:hold("0000:41:00.4")
    local base = t.base
    t:remove()
    assert.is_nil(lfs.attributes(base))
    t = nil
  end)
end)
