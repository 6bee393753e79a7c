-- `cozygpu inventory` as a command (core/cli/main.c, core/host/inventory.c,
-- docs/gpunode.md): exit status, messages that name the option or path, the
-- table layout, and a function that vanishes while being scanned. The exact
-- inventories of built trees are asserted by the specs in spec/agent/.
local core, json = H.core, H.json

local IDS = H.fixtures .. "/sysfs/pci-ids/pci.ids.10de-excerpt.txt"

-- A minimal fake sysfs tree (LAYOUT §1, §3): every function is a directory
-- under devices/pci0000:00/ with bus/pci/devices/<BDF> linking to it.
local function sh(cmd) assert(os.execute(cmd), cmd) end

local function tree()
  local root = H.tmpdir()
  sh(("mkdir -p %s/devices/pci0000:00 %s/bus/pci/devices"):format(H.q(root), H.q(root)))
  return root
end

local function add(root, bdf, f)
  local d = root .. "/devices/pci0000:00/" .. bdf
  sh("mkdir -p " .. H.q(d))
  sh(("ln -s ../../../devices/pci0000:00/%s %s"):format(bdf, H.q(root .. "/bus/pci/devices/" .. bdf)))
  local files = {
    vendor = "0x" .. (f.vendor or "10de"), device = "0x" .. f.device, class = "0x" .. (f.class or "030200"),
    revision = "0xa1", subsystem_vendor = "0x10de", subsystem_device = "0x0000", numa_node = tostring(f.numa or 0),
  }
  for k, v in pairs(f.files or {}) do files[k] = v end
  for k, v in pairs(files) do
    sh("mkdir -p " .. H.q((d .. "/" .. k):match("^(.*)/")))
    H.write(d .. "/" .. k, v .. "\n")
  end
  if f.driver then
    sh("mkdir -p " .. H.q(root .. "/bus/pci/drivers/" .. f.driver))
    sh(("ln -s ../../../bus/pci/drivers/%s %s"):format(f.driver, H.q(d .. "/driver")))
  end
  if f.iommu then
    sh("mkdir -p " .. H.q(root .. "/kernel/iommu_groups/" .. f.iommu))
    sh(("ln -s ../../../kernel/iommu_groups/%d %s"):format(f.iommu, H.q(d .. "/iommu_group")))
  end
  if f.physfn then sh(("ln -s ../%s %s"):format(f.physfn, H.q(d .. "/physfn"))) end
  for n, vf in pairs(f.virtfn or {}) do sh(("ln -s ../%s %s/virtfn%d"):format(vf, H.q(d), n)) end
end

local function rm(root) os.execute("rm -rf " .. H.q(root)) end

-- an L40S with two VFs (one with a vGPU), its audio function, and a NIC
local function board()
  local root = tree()
  add(root, "0000:41:00.0", { device = "26b9", driver = "nvidia", iommu = 45, files = {
    sriov_totalvfs = "32", sriov_numvfs = "2" }, virtfn = { [0] = "0000:41:00.4", [1] = "0000:41:00.5" } })
  add(root, "0000:41:00.1", { device = "22ba", class = "040300", driver = "snd_hda_intel", iommu = 45 })
  add(root, "0000:41:00.4", { device = "26b9", driver = "nvidia", iommu = 46, physfn = "0000:41:00.0", files = {
    ["nvidia/current_vgpu_type"] = "1155", ["nvidia/creatable_vgpu_types"] = "ID    : vGPU Name" } })
  add(root, "0000:41:00.5", { device = "26b9", driver = "nvidia", iommu = 47, physfn = "0000:41:00.0", files = {
    ["nvidia/current_vgpu_type"] = "0",
    ["nvidia/creatable_vgpu_types"] = H.read(H.fixtures .. "/sysfs/creatable_vgpu_types/l40s-full-catalog.txt") } })
  add(root, "0000:00:03.0", { vendor = "1af4", device = "1000", class = "020000", driver = "virtio-pci" })
  return root
end

local function has_nvidia(root)
  local out = io.popen("cat " .. root .. "/bus/pci/devices/*/vendor 2>/dev/null"):read("a")
  return out:find("0x10de", 1, true) ~= nil
end

describe("cozygpu inventory", function()
  describe("on this machine's /sys", function()
    -- /sys here has virtio PCI functions and no NVIDIA one
    local empty = not has_nvidia("/sys")

    it("prints an empty inventory as JSON and exits 0", function()
      local out, err, code = H.run { "inventory", "--output", "json" }
      assert.are.equal(0, code, err)
      assert.are.equal("", err)
      local inv = assert(json.decode(out))
      assert.are.equal("array", json.kind(inv.functions))
      if empty then assert.are.equal('{"functions": []}\n', out) end
    end)

    it("prints the empty table as one line and exits 0 (table is the default)", function()
      local out, err, code = H.run { "inventory" }
      assert.are.equal(0, code, err)
      if empty then assert.are.equal("No NVIDIA PCI function was found.\n", out) end
      local out2, _, code2 = H.run { "inventory", "--sysfs", "/sys", "--output", "table" }
      assert.are.equal(0, code2)
      assert.are.equal(out, out2)
    end)

    it("core.inventory() gives the same as the command", function()
      local inv = assert(core.inventory())
      local out = H.run { "inventory", "--output", "json" }
      assert.are.same(assert(json.decode(out)).functions, inv.functions)
    end)
  end)

  describe("usage", function()
    it("exits 2 naming a root without bus/pci/devices", function()
      local _, err, code = H.run { "inventory", "--sysfs", "/nonexistent/sysroot" }
      assert.are.equal(2, code)
      assert.matches("/nonexistent/sysroot/bus/pci/devices", err, 1, true)

      local root = H.tmpdir() -- exists, but is no sysfs root
      _, err, code = H.run { "inventory", "--sysfs", root, "--output", "json" }
      assert.are.equal(2, code)
      assert.matches(root .. "/bus/pci/devices: No such file or directory", err, 1, true)
      rm(root)
    end)

    it("exits 2 naming a bad --output", function()
      local out, err, code = H.run { "inventory", "--output", "yaml" }
      assert.are.equal(2, code)
      assert.are.equal("", out)
      assert.matches("--output", err, 1, true)
      assert.matches('"yaml"', err, 1, true)
    end)

    it("exits 2 naming an unknown --pci-method, listing the known ones", function()
      local out, err, code = H.run { "inventory", "--pci-method", "no-such-method" }
      assert.are.equal(2, code)
      assert.are.equal("", out)
      assert.matches("--pci-method", err, 1, true)
      assert.matches('"no-such-method"', err, 1, true)
      assert.matches("linux-sysfs", err, 1, true)
    end)

    it("exits 2 naming an unreadable --pci-ids file", function()
      local _, err, code = H.run { "inventory", "--pci-ids", "/nonexistent/pci.ids" }
      assert.are.equal(2, code)
      assert.matches("/nonexistent/pci.ids", err, 1, true)
    end)

    it("exits 2 on an unknown option or a stray argument, 0 on --help", function()
      local _, err, code = H.run { "inventory", "--bogus" }
      assert.are.equal(2, code)
      assert.matches("usage: cozygpu inventory", err, 1, true)
      _, err, code = H.run { "inventory", "stray" }
      assert.are.equal(2, code)
      assert.matches('"stray"', err, 1, true)
      local out
      out, _, code = H.run { "inventory", "--help" }
      assert.are.equal(0, code)
      assert.matches("--pci-method NAME", out, 1, true)
    end)

    it("is listed by cozygpu --help", function()
      local out, _, code = H.run { "--help" }
      assert.are.equal(0, code)
      assert.matches("\n  inventory ", out, 1, true)
    end)

    it("exits 2 when stdout cannot be written", function()
      local e = os.tmpname()
      for _, output in ipairs { "json", "table" } do
        local _, _, c = os.execute(("%s inventory --output %s >/dev/full 2>%s"):format(H.q(H.bin), output, H.q(e)))
        assert.are.equal(2, c)
        assert.matches("writing the output failed", H.read(e), 1, true)
      end
      os.remove(e)
    end)
  end)

  describe("a function that vanishes while being scanned", function()
    it("is an error naming the file, not a crash (dangling bus/pci/devices link)", function()
      local root = board()
      -- listed, but its directory is gone: libpci's mandatory `vendor` read fails
      sh(("ln -s ../../../devices/pci0000:00/0000:42:00.0 %s"):format(H.q(root .. "/bus/pci/devices/0000:42:00.0")))
      local out, err, code = H.run { "inventory", "--sysfs", root, "--output", "json", "--pci-ids", IDS }
      assert.are.equal(2, code)
      assert.are.equal("", out)
      assert.matches(root .. "/bus/pci/devices/0000:42:00.0/vendor", err, 1, true)
      -- in process too, and repeatedly: an error result each time, the
      -- process goes on
      for _ = 1, 3 do
        local inv, msg = core.inventory { sysfs = root, pci_ids = IDS }
        assert.is_nil(inv)
        assert.matches("0000:42:00.0/vendor", msg, 1, true)
      end
      -- once the link is gone too, the scan succeeds again
      os.remove(root .. "/bus/pci/devices/0000:42:00.0")
      local inv = assert(core.inventory { sysfs = root, pci_ids = IDS })
      assert.are.equal(4, #inv.functions)
      rm(root)
    end)

    it("is an error when a mandatory file of an NVIDIA function is missing", function()
      local root = board()
      os.remove(root .. "/devices/pci0000:00/0000:41:00.4/class")
      local _, err, code = H.run { "inventory", "--sysfs", root }
      assert.are.equal(2, code)
      assert.matches("0000:41:00.4/class", err, 1, true)
      rm(root)
    end)

    it("is an error naming the file, in bounded time, when an attribute is a FIFO (not a hang)", function()
      local root = board()
      local fifo = root .. "/devices/pci0000:00/0000:41:00.4/nvidia/current_vgpu_type"
      os.remove(fifo)
      sh("mkfifo " .. H.q(fifo))
      local e = os.tmpname()
      local env = H.asan and "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 " or ""
      local _, _, code = os.execute(("timeout 20 env %s%s inventory --sysfs %s --pci-ids %s >/dev/null 2>%s")
        :format(env, H.q(H.bin), H.q(root), H.q(IDS), H.q(e)))
      local err = H.read(e)
      os.remove(e)
      assert.are_not.equal(124, code, "the scan blocked on the FIFO")
      assert.are.equal(2, code, err)
      assert.matches(root .. "/bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type: not a regular file", err, 1, true)
      rm(root)
    end)

    it("refuses an entry of bus/pci/devices that is not a PCI address", function()
      local root = board()
      H.write(root .. "/bus/pci/devices/stray", "")
      local _, err, code = H.run { "inventory", "--sysfs", root }
      assert.are.equal(2, code)
      assert.matches(root .. "/bus/pci/devices/stray: not a PCI address", err, 1, true)
      rm(root)
    end)
  end)

  describe("--output table", function()
    it("puts the PF at the left, its VFs and its audio function indented under it", function()
      local root = board()
      local out, err, code = H.run { "inventory", "--sysfs", root, "--pci-ids", IDS }
      assert.are.equal(0, code, err)
      local lines = {}
      for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
      assert.are.equal(5, #lines, out)
      assert.matches("^ADDRESS%s+ROLE%s+ID%s+MODEL%s+DRIVER%s+IOMMU%s+NUMA%s+SR%-IOV%s+VGPU$", lines[1])
      assert.matches("^0000:41:00%.0%s+GPU%s+10de:26b9%s+L40S%s+nvidia%s+45%s+0%s+2/32 VFs%s+%-$", lines[2])
      assert.matches("^  0000:41:00%.4%s+GPU%s+10de:26b9%s+L40S%s+nvidia%s+46%s+0%s+vf 0%s+L40S%-24Q$", lines[3])
      assert.matches("^  0000:41:00%.5%s+GPU%s+10de:26b9%s+L40S%s+nvidia%s+47%s+0%s+vf 1%s+%-$", lines[4])
      assert.matches("^  0000:41:00%.1%s+Audio%s+10de:22ba%s+AD102 High Definition Audio Controller%s+snd_hda_intel",
        lines[5])
      -- columns line up: every row starts its ID column at the same place
      local col = lines[1]:find("ID", 1, true)
      for i = 2, #lines do assert.are.equal("10de:", lines[i]:sub(col, col + 4), lines[i]) end
      -- the same twice (stable)
      assert.are.equal(out, (H.run { "inventory", "--sysfs", root, "--pci-ids", IDS }))
      rm(root)
    end)

    it("agrees with --output json on which functions there are", function()
      local root = board()
      local out = H.run { "inventory", "--sysfs", root, "--pci-ids", IDS, "--output", "json" }
      local inv = assert(json.decode(out))
      local addrs = {}
      for _, f in ipairs(inv.functions) do addrs[#addrs + 1] = f.address end
      assert.are.same({ "0000:41:00.0", "0000:41:00.1", "0000:41:00.4", "0000:41:00.5" }, addrs)
      assert.are.equal("0000:41:00.0", inv.functions[2].gpu)
      assert.are.equal("L40S-24Q", inv.functions[3].vgpu.profile)
      rm(root)
    end)
  end)
end)
