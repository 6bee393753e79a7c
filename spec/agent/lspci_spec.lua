--- Every sample in ../shared/fixtures/lspci/ (lspci -nn / -nnk output with or
--- without the PCI domain, device-plugin logs, nvidia-smi tables) becomes a
--- fake sysfs tree (sysfs.from_lspci, then sysfs.build), and
--- `cozygpu inventory --output json` must report exactly what the sample
--- shows: the same functions (addresses in full DDDD:BB:DD.F form), vendor
--- and device ids, subsystem ids, class, revision and driver where the
--- sample shows them, IOMMU groups where it gives them, and the pci.ids
--- excerpt's name and model.
---
--- The directory is listed at load time, so a new sample gets its tests
--- without being named here; the table KNOWN below also pins what the
--- current samples contain, so a parser that silently drops a line fails.
local S = require "sysfs"

local IDS = S.pci_ids()
local DIR = S.fixtures() .. "/lspci"

-- the pci.ids excerpt: device id -> name (vendor 10de)
local DB = {}
do
  local vendor
  for line in io.lines(IDS) do
    local v = line:match("^(%x%x%x%x)%s")
    if v then vendor = v end
    local d, n = line:match("^\t(%x%x%x%x)%s+(.-)%s*$")
    if d and vendor == "10de" then DB[d] = n end
  end
end

local function model_of(name) return name:match(".*%[(.-)%]") or name end

local ROLE = { ["0300"] = "GPU", ["0302"] = "GPU", ["0403"] = "Audio", ["0c03"] = "USB", ["0c80"] = "SerialBus",
  ["0680"] = "NVSwitch" }

-- What each current sample contains, read off the files by hand:
-- addresses, then device id, subsystem, driver (false: none) and groups.
local KNOWN = {
  ["t4-lspci-nnk-vfio-pci.txt"] = {
    addresses = { "0000:18:00.0", "0000:19:00.0", "0000:35:00.0", "0000:36:00.0", "0000:e7:00.0" },
    device = "1eb8", subsystem = { "10de", "12a2" }, driver = "vfio-pci", name = "TU104GL [Tesla T4]",
  },
  ["a40-lspci-nnk-d-10de-vfio-pci.txt"] = {
    -- lspci printed "NVIDIA Corporation Device [10de:2235]": that host's
    -- pci.ids predated the A40. The excerpt (2025.07.11) knows 2235 as
    -- "GA102GL [A40]", so that is the name the inventory gives.
    addresses = { "0000:01:00.0", "0000:81:00.0" },
    device = "2235", subsystem = { "10de", "145a" }, driver = "vfio-pci", name = "GA102GL [A40]",
  },
  ["a40-kubevirt-gpu-device-plugin-log.txt"] = {
    -- "Nvidia device", "Iommu Group", "Device Id" lines; the log names no
    -- driver and no subsystem
    addresses = { "0000:01:00.0", "0000:81:00.0" }, groups = { 0, 60 },
    device = "2235", driver = false, name = "GA102GL [A40]",
  },
  ["a10-lspci-nnk-d-10de-nvidia-docs.txt"] = {
    -- -nnk output with "Kernel modules" but no "Kernel driver in use": unbound
    addresses = { "0000:65:00.0" },
    device = "2236", subsystem = { "10de", "1482" }, driver = false, name = "GA102GL [A10]",
  },
  ["a10-vgpu-node-allocatable-and-sandbox-plugin-log.txt"] = {
    -- addresses only (PF 3b:00.0 and, per ../SOURCES.md, its VFs; the log
    -- itself states no PF/VF link, no device id, no driver)
    addresses = { "0000:3b:00.0", "0000:3b:00.4", "0000:3b:00.5", "0000:3b:00.6", "0000:3b:00.7",
      "0000:3b:01.0", "0000:3b:01.1", "0000:3b:01.2", "0000:3b:01.3" },
    driver = false,
  },
  ["l40s-lspci-nn-and-nvidia-smi-query.txt"] = {
    -- lspci -nn (no -k: no driver shown) and nvidia-smi's 0x26B910DE
    addresses = { "0000:01:00.0", "0000:91:00.0" },
    device = "26b9", driver = false, name = "AD102GL [L40S]",
  },
  ["rtx-pro-6000-blackwell-lspci-nn-pf.txt"] = {
    addresses = { "0000:42:00.0", "0000:8c:00.0", "0001:04:00.0", "0001:c8:00.0" },
    device = "2bb5", driver = false, name = "GB202GL [RTX PRO 6000 Blackwell Server Edition]",
  },
  ["p100-nvidia-smi-vgpu.txt"] = {
    -- nvidia-smi's "Tesla P100-PCIE-16GB" is the driver's name, not a PCI
    -- id: the sample states no device id
    addresses = { "0000:05:00.0" }, driver = false,
  },
}

local files = {}
for _, f in ipairs(S.listdir(DIR)) do
  if not f:match("^%.") then files[#files + 1] = f end
end

-- The inventory object a tree built from `desc` must give: derived from the
-- description (what the sample states plus the documented assumptions of
-- sysfs.from_lspci) and the contract's rules.
local function expected_from(desc)
  local out = {}
  local groups = {}
  for _, f in ipairs(desc.functions) do
    if f.iommu then groups[f.iommu] = (groups[f.iommu] or 0) + 1 end
  end
  for _, f in ipairs(desc.functions) do
    if f.vendor == "10de" then
      local class = f.class:sub(1, 4)
      local sub = f.subsystem or { f.vendor, "0000" }
      local o = {
        address = f.address, vendorID = "10de", deviceID = f.device,
        subsystemVendorID = sub[1], subsystemDeviceID = sub[2], revision = f.revision or "a1",
        class = class, role = ROLE[class] or "Other", name = DB[f.device],
        model = DB[f.device] and model_of(DB[f.device]) or nil,
        driver = f.driver, iommuGroup = f.iommu,
      }
      -- every sample function is a GPU alone in its group (or without one)
      assert(o.role == "GPU" and (not f.iommu or groups[f.iommu] == 1), "spec assumption broken by " .. f.address)
      o.counted = true
      out[#out + 1] = o
    end
  end
  table.sort(out, function(a, b) return a.address < b.address end)
  return { functions = out }
end

describe("lspci samples as sysfs trees", function()
  local tree
  after_each(function()
    if tree then tree:remove() end
    tree = nil
  end)

  it("there are samples, and every sample is known to this spec", function()
    assert.is_true(#files >= 8, "found " .. #files .. " samples in " .. DIR)
    for _, f in ipairs(files) do
      assert.is_not_nil(KNOWN[f], f .. " is new: add what it contains to KNOWN in " .. debug.getinfo(1, "S").short_src)
    end
  end)

  it("also reads the `IOMMU Group N: <lspci line> (driver: x)` listing of the RTX PRO 6000 capture", function()
    local desc = S.from_lspci(S.fixtures() .. "/sysfs/real-host-captures/rtx-pro-6000-blackwell-iommu-groups-vfs-excerpt.txt")
    local addrs = { "0001:c8:04.5", "0001:c8:04.6", "0001:c8:04.7", "0001:c8:05.0", "0001:c8:05.1", "0001:c8:05.2",
      "0001:c8:05.3", "0001:c8:05.4" }
    assert.are.equal(#addrs, #desc.functions)
    for i, f in ipairs(desc.functions) do
      assert.are.equal(addrs[i], f.address)
      assert.are.equal(345 + i, f.iommu)
      assert.are.equal("nvidia", f.driver)
      assert.are.equal("2bb5", f.device)
    end
    tree = S.build(desc)
    local inv, out, err = S.inventory(tree, { pci_ids = IDS })
    assert(inv, tostring(err) .. tostring(out))
    assert.are.same(expected_from(desc), inv)
  end)

  for _, file in ipairs(files) do
    describe(file, function()
      local path = DIR .. "/" .. file

      it("parses to the functions the sample shows", function()
        local desc = S.from_lspci(path)
        local k = KNOWN[file]
        if not k then return end -- reported by the test above
        local addrs = {}
        for i, f in ipairs(desc.functions) do addrs[i] = f.address end
        assert.are.same(k.addresses, addrs)
        for i, f in ipairs(desc.functions) do
          assert.are.equal("10de", f.vendor)
          if k.device then
            assert.is_true(f.sample.stated.device, f.address)
            assert.are.equal(k.device, f.device)
          else
            assert.is_nil(f.sample.stated.device, f.address)
          end
          assert.are.same(k.subsystem, f.sample.stated.subsystem and f.subsystem or nil)
          assert.are.equal(k.driver or nil, f.driver)
          assert.are.equal(k.groups and k.groups[i] or nil, f.iommu)
        end
      end)

      it("is reported exactly by cozygpu inventory", function()
        local desc = S.from_lspci(path)
        tree = S.build(desc)
        local inv, out, err, code = S.inventory(tree, { pci_ids = IDS })
        assert(inv, ("cozygpu inventory exited %s: %s"):format(tostring(err), tostring(out)))

        -- the whole object, from the description and the contract
        assert.are.same(expected_from(desc), inv)

        -- and field by field against what the sample prints
        local byaddr = {}
        for _, f in ipairs(inv.functions) do byaddr[f.address] = f end
        assert.are.equal(#desc.functions, #inv.functions)
        for _, f in ipairs(desc.functions) do
          local got = byaddr[f.address]
          assert.is_not_nil(got, f.address .. " missing")
          assert.are.equal(f.address, got.address)
          assert.truthy(got.address:match("^%x%x%x%x:%x%x:%x%x%.%x$"))
          assert.are.equal("10de", got.vendorID)
          local st = f.sample.stated
          if st.device then assert.are.equal(f.device, got.deviceID) end
          if st.subsystem then
            assert.are.same(f.subsystem, { got.subsystemVendorID, got.subsystemDeviceID })
          end
          if st.class then assert.are.equal(f.class, got.class) end
          if st.revision then assert.are.equal(f.revision, got.revision) end
          -- a driver where the sample shows one, none where it shows none
          assert.are.equal(f.driver, got.driver)
          if st.iommu then assert.are.equal(f.iommu, got.iommuGroup) end
          if st.device and DB[f.device] then
            assert.are.equal(DB[f.device], got.name)
            assert.are.equal(model_of(DB[f.device]), got.model)
            local printed = f.sample.name
            if printed and printed ~= "Device" then
              -- lspci's own bracketed name is the excerpt's
              assert.are.equal(DB[f.device], printed)
              assert.are.equal(printed:match(".*%[(.-)%]"), got.model)
            end
          end
          if KNOWN[file] and KNOWN[file].name then assert.are.equal(KNOWN[file].name, got.name) end
        end
      end)
    end)
  end
end)
