-- cozygpu.capacity (docs/decisions/0022): what one node offers each GPU
-- class. Every GPUNode here is what the agent would write: a fake sysfs
-- tree (spec/support/sysfs.lua) with the device IDs of the shared fixtures,
-- scanned by `cozygpu inventory`, then runtime.layout.status (health,
-- counted, vGPU names). KubeVirt entries come from the fixtures
-- (kubevirt/cozystack/gpu-passthrough-defaults.yaml, the KubeVirt user
-- guide) or follow the naming rules the decision cites. Each expected
-- number is worked out from the rules in a comment beside it.
local json = H.json
local sysfs = require "sysfs"
local layout = require "runtime.layout"
local capacity = require "cozygpu.capacity"

local BOOT = "3b1f5c2e-6d0a-4f8e-9a7b-2c4d6e8f0a1b"
local NOW = "2026-12-01T09:00:00Z"

local T4 = "nvidia.com/TU104GL_TESLA_T4"          -- gpu-passthrough-defaults.yaml, 10DE:1EB8
local L40S = "nvidia.com/AD102GL_L40S"            -- gpu-passthrough-defaults.yaml, 10DE:26B9
local H100 = "nvidia.com/GH100_H100_SXM5_80GB"    -- gpu-passthrough-defaults.yaml, 10DE:2330
local L40S_24Q = "nvidia.com/NVIDIA_L40S-24Q"     -- "NVIDIA L40S-24Q", whitespace -> "_"
local A2_4Q = "nvidia.com/NVIDIA_A2-4Q"           -- mdev type nvidia-746 of the A2 capture

local function fixture(path) return H.fixtures .. "/" .. path end

-- The name NVIDIA's plugin gives a PCI ID database entry (the rule quoted
-- in gpu-passthrough-defaults.yaml): upper-case; "/", "." and whitespace
-- to "_"; drop what is not alphanumeric or "_".
local function slug(name)
  local s = name:upper():gsub("[/.]", "_"):gsub("%s+", "_"):gsub("[^%w_]", "")
  return "nvidia.com/" .. s
end

-- the Cozystack passthrough defaults, read from the fixture
local DEFAULTS = assert(H.core.yaml(H.read(fixture("kubevirt/cozystack/gpu-passthrough-defaults.yaml"))))[1]

local function kubevirt(pci, mdev)
  local p, m = json.array(), json.array()
  for _, e in ipairs(pci or {}) do p[#p + 1] = e end
  for _, e in ipairs(mdev or {}) do m[#m + 1] = e end
  return { apiVersion = "kubevirt.io/v1", kind = "KubeVirt", metadata = { name = "kubevirt", namespace = "cozy-kubevirt" },
    spec = { configuration = { permittedHostDevices = { pciHostDevices = p, mediatedDevices = m } } } }
end

local function defaults_plus(extra_pci, mdev)
  local p = {}
  for _, e in ipairs(DEFAULTS.pciHostDevices) do p[#p + 1] = e end
  for _, e in ipairs(extra_pci or {}) do p[#p + 1] = e end
  return kubevirt(p, mdev)
end

local function class(name, mode, rn, profile)
  return H.class(name, { mode = mode, resourceName = rn, profile = profile })
end

local function node(name, allocatable, o)
  o = o or {}
  return {
    apiVersion = "v1", kind = "Node",
    metadata = { name = name, uid = "uid-" .. name },
    spec = { unschedulable = o.unschedulable, taints = o.taints },
    status = {
      allocatable = allocatable or json.object(),
      conditions = { { type = "Ready", status = o.ready or "True" } },
      nodeInfo = { bootID = o.boot or BOOT },
    },
  }
end

-- The GPUNode the agent writes for a tree built from `desc`; `opts.change`
-- edits the tree before the scan; `opts.previous` is the last status (for
-- a function that vanished).
local function gpunode(name, desc, opts)
  opts = opts or {}
  local tree = sysfs.build(desc)
  local ok, err = pcall(function() if opts.change then opts.change(tree) end end)
  local inv, ierr = sysfs.inventory(tree)
  tree:remove()
  assert(ok, err)
  assert(inv, ierr)
  local st = layout.status { inventory = inv, now = NOW, boot_id = BOOT, generation = 1, previous = opts.previous }
  return {
    apiVersion = "cozystack.io/v1alpha1", kind = "GPUNode",
    metadata = { name = name, generation = 1,
      ownerReferences = { { apiVersion = "v1", kind = "Node", name = name, uid = "uid-" .. name } } },
    status = json.decode(json.encode(st)),
  }
end

local function reasons(problems)
  local out = {}
  for _, p in ipairs(problems) do out[#out + 1] = (p.class and (p.class .. ":") or "") .. p.reason end
  return out
end

local function find(problems, reason)
  for _, p in ipairs(problems) do if p.reason == reason then return p end end
  return nil
end

-- ---------------------------------------------------------------------------

describe("cozygpu.capacity.of: passthrough", function()
  -- Five Tesla T4 (10de:1eb8) on vfio-pci at the addresses of the T4 sample
  -- (fixtures/lspci/t4-lspci-nnk-vfio-pci.txt); 18:00.0 and 19:00.0 sit in
  -- one IOMMU group (no ACS between them), the others alone.
  local function t4(over)
    over = over or {}
    local fns = {}
    for i, a in ipairs { "0000:18:00.0", "0000:19:00.0", "0000:35:00.0", "0000:36:00.0", "0000:e7:00.0" } do
      local g = ({ 30, 30, 31, 32, 33 })[i]
      local f = { address = a, device = "1eb8", subsystem = "10de:12a2", driver = "vfio-pci", iommu = g, numa = 0 }
      for k, v in pairs(over[a] or {}) do f[k] = v end
      if over[a] and over[a].driver == false then f.driver = nil end
      if not (over[a] and over[a].absent) then fns[#fns + 1] = f end
    end
    return { functions = fns }
  end
  local CLASSES = { class("t4", "Passthrough", T4) }
  local KV = kubevirt(DEFAULTS.pciHostDevices)

  it("counts an IOMMU group of several GPUs once", function()
    -- groups 30 (two GPUs), 31, 32, 33: 4 units; NVIDIA's plugin advertises
    -- one device per group, so allocatable is 4 too
    local g = gpunode("gpu-1", t4())
    local offers, problems = capacity.of(node("gpu-1", { [T4] = "4" }), g, KV, CLASSES)
    assert.are.same({ t4 = 4 }, offers)
    assert.are.same({}, problems)
    -- the inventory marked the second GPU of group 30 as not counted
    assert.is_false(g.status.functions[2].counted)
  end)

  it("caps at status.allocatable when the kubelet has fewer", function()
    -- min(4, 3) = 3
    local offers, problems = capacity.of(node("gpu-1", { [T4] = "3" }), gpunode("gpu-1", t4()), KV, CLASSES)
    assert.are.equal(3, offers.t4)
    assert.are.same({ "t4:AllocatableBelowInventory" }, reasons(problems))
    assert.matches("the GPUNode shows 4 of " .. H.pat(T4) .. ", status.allocatable 3", problems[1].message)
  end)

  it("offers nothing where the kubelet does not advertise the name, or advertises a fraction", function()
    local g = gpunode("gpu-1", t4())
    local offers, problems = capacity.of(node("gpu-1", {}), g, KV, CLASSES)
    assert.are.same({ t4 = 0 }, offers)
    assert.are.same({ "t4:AllocatableBelowInventory" }, reasons(problems))
    offers, problems = capacity.of(node("gpu-1", { [T4] = "500m" }), g, KV, CLASSES)
    assert.are.same({ t4 = 0 }, offers)
    assert.are.same({ "t4:InvalidAllocatable" }, reasons(problems))
  end)

  it("keeps the inventory when the kubelet advertises more, and says so", function()
    -- min(4, 5) = 4 (a plugin that counts functions, not groups, says 5)
    local offers, problems = capacity.of(node("gpu-1", { [T4] = "5" }), gpunode("gpu-1", t4()), KV, CLASSES)
    assert.are.equal(4, offers.t4)
    assert.are.same({ "t4:InventoryBelowAllocatable" }, reasons(problems))
  end)

  it("subtracts what raw-name pods use, not below zero", function()
    local g = gpunode("gpu-1", t4())
    local n = node("gpu-1", { [T4] = "4" })
    assert.are.same({ t4 = 3 }, (capacity.of(n, g, KV, CLASSES, { [T4] = 1 })))          -- 4 - 1
    assert.are.same({ t4 = 4 }, (capacity.of(n, g, KV, CLASSES, { [L40S] = 2 })))        -- another name
    local offers, problems = capacity.of(n, g, KV, CLASSES, { [T4] = 5 })               -- max(0, 4 - 5)
    assert.are.same({ t4 = 0 }, offers)
    assert.are.same({ "t4:RawUseExceedsCapacity" }, reasons(problems))
  end)

  it("drops a group whose other GPU is not on vfio-pci", function()
    -- 19:00.0 on nvidia: group 30 cannot be assigned; 31, 32, 33 remain: 3
    local g = gpunode("gpu-1", t4 { ["0000:19:00.0"] = { driver = "nvidia" } })
    local offers, problems = capacity.of(node("gpu-1", { [T4] = "3" }), g, KV, CLASSES)
    assert.are.equal(3, offers.t4)
    assert.are.same({ "t4:Excluded" }, reasons(problems))
    assert.matches("0000:18:00.0 does not count .*GPU 0000:19:00.0 of its IOMMU group is on nvidia", problems[1].message)
  end)

  it("leaves out an unbound GPU and one that vanished", function()
    -- 35:00.0 unbound (DriverUnbound): 30, 32, 33 remain: 3
    local g = gpunode("gpu-1", t4 { ["0000:35:00.0"] = { driver = false } })
    assert.are.equal("DriverUnbound", g.status.functions[3].health.reason)
    local offers, problems = capacity.of(node("gpu-1", { [T4] = "3" }), g, KV, CLASSES)
    assert.are.equal(3, offers.t4)
    assert.matches("0000:35:00.0 does not count .*no driver is bound", find(problems, "Excluded").message)
    -- e7:00.0 gone from the bus: kept Unhealthy (Vanished) by the agent: 3
    local before = gpunode("gpu-1", t4())
    g = gpunode("gpu-1", t4 { ["0000:e7:00.0"] = { absent = true } }, { previous = before.status })
    assert.are.equal("Vanished", g.status.functions[5].health.reason)
    offers, problems = capacity.of(node("gpu-1", { [T4] = "3" }), g, KV, CLASSES)
    assert.are.equal(3, offers.t4)
    assert.matches("0000:e7:00.0 does not count .*not Healthy %(Vanished%)", find(problems, "Excluded").message)
  end)

  describe("a card with an audio function", function()
    -- RTX 6000 Ada (10de:26b1) and its HD audio (10de:22ba, class 0403) in
    -- one IOMMU group; NVIDIA's plugin names it from the PCI ID database
    local RTX = slug("AD102GL [RTX 6000 Ada Generation]")
    local KVR = defaults_plus { { pciVendorSelector = "10DE:26B1", resourceName = RTX, externalResourceProvider = true } }
    local C = { class("rtx6000", "Passthrough", RTX) }
    local function card(audio_driver)
      return { functions = {
        { address = "0000:c1:00.0", device = "26b1", driver = "vfio-pci", iommu = 40 },
        { address = "0000:c1:00.1", device = "22ba", class = "0403", driver = audio_driver, iommu = 40 },
      } }
    end

    it("counts the GPU once when the audio function is on vfio-pci or unbound", function()
      assert.are.equal("nvidia.com/AD102GL_RTX_6000_ADA_GENERATION", RTX)
      for _, d in ipairs { "vfio-pci", false } do
        local offers, problems = capacity.of(node("ws-1", { [RTX] = "1" }), gpunode("ws-1", card(d or nil)), KVR, C)
        assert.are.same({ rtx6000 = 1 }, offers)
        assert.are.same({}, problems)
      end
    end)

    it("offers nothing when the audio function stays on snd_hda_intel (the group is not usable)", function()
      local offers, problems = capacity.of(node("ws-1", { [RTX] = "1" }), gpunode("ws-1", card("snd_hda_intel")), KVR, C)
      assert.are.same({ rtx6000 = 0 }, offers)
      -- 0 units against an allocatable of 1 (the plugin does not check the group)
      assert.are.same({ "rtx6000:Excluded", "rtx6000:InventoryBelowAllocatable" }, reasons(problems))
      assert.matches("Audio function 0000:c1:00.1 of its IOMMU group is on snd_hda_intel", problems[1].message)
    end)
  end)

  it("counts the GPUs of an HGX board, never its NVSwitch functions", function()
    -- eight H100 SXM5 (10de:2330) on vfio-pci, each in its own group, and
    -- four NVSwitch (10de:22a3, class 0680) on nvidia-nvswitch: 8
    local fns = {}
    for i, bus in ipairs { "18", "2a", "3a", "5d", "9a", "ab", "ba", "db" } do
      fns[#fns + 1] = { address = "0000:" .. bus .. ":00.0", device = "2330", driver = "vfio-pci", iommu = 60 + i }
    end
    for i = 0, 3 do
      fns[#fns + 1] = { address = ("0000:%02x:00.0"):format(5 + i), device = "22a3", class = "0680", driver = "nvidia-nvswitch", iommu = 50 + i }
    end
    local g = gpunode("hgx-1", { functions = fns })
    local roles = {}
    for _, f in ipairs(g.status.functions) do roles[f.role] = (roles[f.role] or 0) + 1 end
    assert.are.same({ GPU = 8, NVSwitch = 4 }, roles)
    local offers, problems = capacity.of(node("hgx-1", { [H100] = "8" }), g, kubevirt(DEFAULTS.pciHostDevices),
      { class("h100", "Passthrough", H100) })
    assert.are.same({ h100 = 8 }, offers)
    assert.are.same({}, problems)
  end)
end)

describe("cozygpu.capacity.of: vGPU on SR-IOV VFs (vendor-specific VFIO)", function()
  -- An L40S (10de:26b9) PF on nvidia with 4 VFs (0000:41:00.4-.7), the
  -- card's catalog fixtures/sysfs/creatable_vgpu_types/l40s-full-catalog.txt:
  -- VF 0 and 1 carry 1155 "NVIDIA L40S-24Q", VF 2 and 3 no vGPU (0).
  local function l40s(current, creatable)
    return { functions = { {
      address = "0000:41:00.0", device = "26b9", subsystem = "10de:1851", driver = "nvidia", iommu = 45, numa = 0,
      sriov = { total = 32, vfs = 4, offset = 4, stride = 1, iommu = 46,
        vgpu = { creatable = creatable or "l40s-full-catalog.txt", current = current or { [0] = 1155, [1] = 1155 } } },
    } } }
  end
  local C24 = class("l40s-24q", "VGPU", L40S_24Q, "L40S-24Q")

  it("counts VFs with the class's profile under the name KubeVirt permits for it (mediatedDevices form)", function()
    -- VF 0, 1: 2 units; VF 2, 3 (type 0) carry nothing. The passthrough
    -- class of the same card gets 0: its PF is on nvidia, and the external
    -- AD102GL_L40S entry never carries VFs.
    local g = gpunode("l40s-1", l40s())
    assert.are.equal("NVIDIA L40S-24Q", g.status.functions[2].vgpu.typeName)
    local kv = defaults_plus(nil, { { mdevNameSelector = "NVIDIA L40S-24Q", resourceName = L40S_24Q, externalResourceProvider = true } })
    local offers, problems = capacity.of(node("l40s-1", { [L40S_24Q] = "2" }), g, kv,
      { C24, class("l40s", "Passthrough", L40S) })
    assert.are.same({ ["l40s-24q"] = 2, l40s = 0 }, offers)
    assert.are.same({}, problems)
  end)

  it("counts them under NVIDIA's per-profile name listed as a pciHostDevices entry", function()
    local kv = kubevirt { { pciVendorSelector = "10DE:26B9", resourceName = L40S_24Q, externalResourceProvider = true } }
    local offers = capacity.of(node("l40s-1", { [L40S_24Q] = "2" }), gpunode("l40s-1", l40s()), kv, { C24 })
    assert.are.same({ ["l40s-24q"] = 2 }, offers)
  end)

  describe("under KubeVirt's own PCI plugin (one name for the PF's device ID)", function()
    local KVOWN = kubevirt { { pciVendorSelector = "10DE:26B9", resourceName = L40S } }
    local VG = class("l40s-24q-own", "VGPU", L40S, "L40S-24Q")

    it("counts the VFs when every one under the name has the class's profile", function()
      local offers, problems = capacity.of(node("l40s-1", { [L40S] = "2" }), gpunode("l40s-1", l40s()), KVOWN, { VG })
      assert.are.same({ ["l40s-24q-own"] = 2 }, offers)
      assert.are.same({}, problems)
    end)

    it("offers nothing to either class when the name mixes profiles", function()
      -- VF 2 carries 1153 "NVIDIA L40S-12Q": KubeVirt could hand it to a
      -- 24Q order, and any VF to a passthrough order
      local g = gpunode("l40s-1", l40s { [0] = 1155, [1] = 1155, [2] = 1153 })
      local offers, problems = capacity.of(node("l40s-1", { [L40S] = "3" }), g, KVOWN,
        { VG, class("l40s", "Passthrough", L40S .. "-x") })
      assert.are.equal(0, offers["l40s-24q-own"])
      assert.are.same({ "l40s-24q-own:MixedResourceName", "l40s:NotPermitted" }, reasons(problems))
      assert.matches("0000:41:00.6 %(vGPU NVIDIA L40S%-12Q%)", problems[1].message)
      offers, problems = capacity.of(node("l40s-1", { [L40S] = "3" }), g, KVOWN, { class("l40s", "Passthrough", L40S) })
      assert.are.same({ l40s = 0 }, offers)
      assert.are.same({ "l40s:MixedResourceName" }, reasons(problems))
    end)
  end)

  it("counts MIG-backed H200 profiles by their name (fixtures/sysfs/creatable_vgpu_types/h200-readme-cat-output.txt)", function()
    -- H200 SXM (10de:2335) PF 0000:41:00.0 on nvidia, the catalog of
    -- NVIDIA's plugin README (1428 NVIDIA H200X-141C, 1414 NVIDIA
    -- H200X-1-18C); VF 0-2 carry 1414, VF 3 none: 3 under NVIDIA's name
    -- nvidia.com/NVIDIA_H200X-1-18C; the passthrough class of the card
    -- (gpu-passthrough-defaults.yaml: GH100_H200_SXM_141GB) gets 0, its PF
    -- being on nvidia
    local H200, H200_18C = "nvidia.com/GH100_H200_SXM_141GB", "nvidia.com/NVIDIA_H200X-1-18C"
    local g = gpunode("h200-1", { functions = { {
      address = "0000:41:00.0", device = "2335", driver = "nvidia", iommu = 45,
      sriov = { total = 16, vfs = 4, offset = 4, stride = 1, iommu = 46,
        vgpu = { creatable = "h200-readme-cat-output.txt", current = { [0] = 1414, [1] = 1414, [2] = 1414 } } },
    } } })
    local kv = defaults_plus { { pciVendorSelector = "10DE:2335", resourceName = H200_18C, externalResourceProvider = true } }
    local offers, problems = capacity.of(node("h200-1", { [H200_18C] = "3" }), g, kv,
      { class("h200-1-18c", "VGPU", H200_18C, "H200X-1-18C"), class("h200", "Passthrough", H200) })
    assert.are.same({ ["h200-1-18c"] = 3, h200 = 0 }, offers)
    assert.are.same({}, problems)
  end)

  it("cannot count a VF whose type no list names (a full card, names not kept)", function()
    -- every function lists only the header: typeName unknown on VF 0 and 1
    local g = gpunode("l40s-1", l40s(nil, {}))
    assert.is_nil(g.status.functions[2].vgpu.typeName)
    local kv = kubevirt({}, { { mdevNameSelector = "NVIDIA L40S-24Q", resourceName = L40S_24Q } })
    local offers, problems = capacity.of(node("l40s-1", { [L40S_24Q] = "2" }), g, kv, { C24 })
    assert.are.same({ ["l40s-24q"] = 0 }, offers)
    assert.are.same({ "UnknownVGPUType", "UnknownVGPUType", "l40s-24q:InventoryBelowAllocatable" }, reasons(problems))
    assert.matches("VF 0000:41:00.4 carries vGPU type 1155", problems[1].message)
  end)

  it("leaves out a VF that is not on nvidia", function()
    -- VF 1 unbound: only VF 0 carries L40S-24Q: 1
    local d = l40s()
    d.functions[1].sriov.vf = { [1] = { driver = false } }
    local kv = kubevirt({}, { { mdevNameSelector = "NVIDIA L40S-24Q", resourceName = L40S_24Q } })
    local offers = capacity.of(node("l40s-1", { [L40S_24Q] = "2" }), gpunode("l40s-1", d), kv, { C24 })
    assert.are.same({ ["l40s-24q"] = 1 }, offers)
  end)
end)

describe("cozygpu.capacity.of: mediated devices (Ampere)", function()
  -- An A2 (10de:25b6) PF with 12 VFs; VF 11 is 0000:08:01.7, the address of
  -- the harvester capture, whose 15 mdev types it takes (nvidia-746 is
  -- "NVIDIA A2-4Q"). VF 10 and 11 each hold one created A2-4Q mdev; VF 9 is
  -- a parent with no mdev created.
  local U1, U2 = "2b6d2f3e-8a4c-4e1b-9f7d-1a2b3c4d5e6f", "7c1e9a0b-3d5f-4a6c-8b2e-0f1d2c3b4a59"
  local function a2(vf10_driver)
    return { functions = { {
      address = "0000:08:00.0", device = "25b6", driver = "nvidia", iommu = 20,
      sriov = { total = 16, vfs = 12, offset = 4, stride = 1, iommu = 21, vf = {
        [9] = { mdev = { types = "a2" } },
        [10] = { mdev = { types = "a2", devices = { ["nvidia-746"] = { U2 } } }, driver = vf10_driver },
        [11] = { mdev = { types = "a2", devices = { ["nvidia-746"] = { U1 } } } },
      } },
    } } }
  end
  local KV = kubevirt({}, { { mdevNameSelector = "NVIDIA A2-4Q", resourceName = A2_4Q } })
  local C = { class("a2-4q", "VGPU", A2_4Q, "A2-4Q"), class("a2-8q", "VGPU", "nvidia.com/NVIDIA_A2-8Q", "A2-8Q") }

  it("counts created mdevs of the selected type, not types that could be created", function()
    -- VF 10, 11: one A2-4Q each: 2. A2-8Q is not permitted by KubeVirt: 0.
    local g = gpunode("a2-1", a2())
    local vf = g.status.functions[13]
    assert.are.equal("0000:08:01.7", vf.address)
    assert.are.equal("NVIDIA A2-4Q", vf.mdevTypes[5].name)
    local offers, problems = capacity.of(node("a2-1", { [A2_4Q] = "2" }), g, KV, C)
    assert.are.same({ ["a2-4q"] = 2, ["a2-8q"] = 0 }, offers)
    assert.are.same({ "a2-8q:NotPermitted" }, reasons(problems))
  end)

  it("leaves out an mdev whose parent VF is not Healthy", function()
    -- VF 10 unbound (DriverUnbound): its mdev does not count: 1
    local offers, problems = capacity.of(node("a2-1", { [A2_4Q] = "2" }), gpunode("a2-1", a2(false)), KV, { C[1] })
    assert.are.same({ ["a2-4q"] = 1 }, offers)
    assert.are.same({ "a2-4q:Excluded", "a2-4q:InventoryBelowAllocatable" }, reasons(problems))
    assert.matches("0000:08:01.6/" .. H.pat(U2) .. " does not count .*parent 0000:08:01.6 not Healthy %(DriverUnbound%)", problems[1].message)
  end)
end)

describe("cozygpu.capacity.of: the A10 node of fixtures/lspci/a10-vgpu-node-allocatable-and-sandbox-plugin-log.txt", function()
  -- An A10 (10de:2236) PF 0000:3b:00.0 on nvidia with the 8 VFs the plugin
  -- log lists (0000:3b:00.4 ... 0000:3b:01.3); 6 of them hold one created
  -- "NVIDIA A10-8Q" mdev. The kubelet there reports
  -- nvidia.com/NVIDIA_A10-8Q: 6 and nvidia.com/A10-12Q: 0. The type's
  -- directory name is not in the fixtures and plays no part (KubeVirt and
  -- NVIDIA's plugin match the `name` file).
  local TYPES = { { type = "nvidia-a10-8q", name = "NVIDIA A10-8Q", available = 0 } }
  local vf = {}
  for i = 0, 7 do
    vf[i] = { mdev = { types = TYPES, devices = i < 6 and { ["nvidia-a10-8q"] = { ("00000000-0000-4000-8000-%012d"):format(i) } } or nil } }
  end
  local DESC = { functions = { { address = "0000:3b:00.0", device = "2236", subsystem = "10de:1482", driver = "nvidia", iommu = 70,
    sriov = { total = 16, vfs = 8, offset = 4, stride = 1, iommu = 71, vf = vf } } } }
  local ALLOC = { ["nvidia.com/NVIDIA_A10-8Q"] = "6", ["nvidia.com/A10-12Q"] = "0", ["nvidia.com/GA102GL_A10"] = "0" }

  it("offers the 6 mdevs under the name NVIDIA's plugin advertises", function()
    local kv = kubevirt({}, { { mdevNameSelector = "NVIDIA A10-8Q", resourceName = "nvidia.com/NVIDIA_A10-8Q", externalResourceProvider = true } })
    local offers, problems = capacity.of(node("node-1", ALLOC), gpunode("node-1", DESC), kv,
      { class("a10-8q", "VGPU", "nvidia.com/NVIDIA_A10-8Q", "A10-8Q") })
    assert.are.same({ ["a10-8q"] = 6 }, offers)
    assert.are.same({}, problems)
  end)

  it("offers nothing under a Cozystack-style name the plugin does not advertise", function()
    -- gpu-vgpu-defaults.yaml maps "NVIDIA A10-24Q" to nvidia.com/A10-24Q; the
    -- same style for 8Q names nvidia.com/A10-8Q, which no kubelet reports:
    -- min(6, 0) = 0
    local kv = kubevirt({}, { { mdevNameSelector = "NVIDIA A10-8Q", resourceName = "nvidia.com/A10-8Q", externalResourceProvider = true } })
    local offers, problems = capacity.of(node("node-1", ALLOC), gpunode("node-1", DESC), kv,
      { class("a10-8q", "VGPU", "nvidia.com/A10-8Q", "A10-8Q") })
    assert.are.same({ ["a10-8q"] = 0 }, offers)
    assert.are.same({ "a10-8q:AllocatableBelowInventory" }, reasons(problems))
    assert.matches("the GPUNode shows 6 of nvidia.com/A10%-8Q, status.allocatable 0", problems[1].message)
  end)
end)

describe("cozygpu.capacity.of: a GPUNode that cannot be trusted, and misconfiguration", function()
  local g
  local KV = kubevirt(DEFAULTS.pciHostDevices)
  local C = { class("t4", "Passthrough", T4), class("l40s", "Passthrough", L40S) }
  local ALLOC = { [T4] = "1", [L40S] = "1" }
  setup(function()
    g = gpunode("gpu-1", { functions = { { address = "0000:18:00.0", device = "1eb8", driver = "vfio-pci", iommu = 30 } } })
  end)

  it("offers nothing without a GPUNode", function()
    local offers, problems = capacity.of(node("gpu-1", ALLOC), nil, KV, C)
    assert.are.same({ t4 = 0, l40s = 0 }, offers)
    assert.are.same({ "NoGPUNode" }, reasons(problems))
  end)

  it("offers nothing from a GPUNode of another boot, of a deleted Node, or when the Node has no bootID", function()
    local offers, problems = capacity.of(node("gpu-1", ALLOC, { boot = "a-new-boot" }), g, KV, C)
    assert.are.same({ t4 = 0, l40s = 0 }, offers)
    assert.are.same({ "StaleGPUNode" }, reasons(problems))
    assert.matches("its agent has not written since the reboot", problems[1].message)

    local n = node("gpu-1", ALLOC)
    n.metadata.uid = "uid-of-the-new-node"
    offers, problems = capacity.of(n, g, KV, C)
    assert.are.same({ t4 = 0, l40s = 0 }, offers)
    assert.matches("a deleted Node of the same name", problems[1].message)

    n = node("gpu-1", ALLOC)
    n.status.nodeInfo = nil
    assert.are.same({ "StaleGPUNode" }, reasons(select(2, capacity.of(n, g, KV, C))))
    assert.are.same({ "StaleGPUNode" }, reasons(select(2, capacity.of(node("gpu-2", ALLOC), g, KV, C))))
  end)

  it("offers what a current one shows", function()
    -- T4: 1 unit, allocatable 1; L40S: none here, allocatable 1
    local offers, problems = capacity.of(node("gpu-1", ALLOC), g, KV, C)
    assert.are.same({ t4 = 1, l40s = 0 }, offers)
    assert.are.same({ "l40s:InventoryBelowAllocatable" }, reasons(problems))
  end)

  it("offers nothing without a KubeVirt CR, and nothing for a name it does not permit", function()
    assert.are.same({ "NoKubeVirt" }, reasons(select(2, capacity.of(node("gpu-1", ALLOC), g, nil, C))))
    local offers, problems = capacity.of(node("gpu-1", ALLOC), g, kubevirt {}, C)
    assert.are.same({ t4 = 0, l40s = 0 }, offers)
    assert.are.same({ "t4:NotPermitted", "l40s:NotPermitted" }, reasons(problems))
  end)

  it("offers nothing to two classes of one name, or to a class without a usable spec", function()
    local offers, problems = capacity.of(node("gpu-1", ALLOC), g, KV, {
      class("t4", "Passthrough", T4), class("t4-too", "Passthrough", T4),
      class("novgpu", "VGPU", L40S), class("odd", "Shared", L40S), H.class("empty", {}),
    })
    assert.are.same({ t4 = 0, ["t4-too"] = 0, novgpu = 0, odd = 0, empty = 0 }, offers)
    assert.are.same({ "t4:SharedResourceName", "t4-too:SharedResourceName", "novgpu:InvalidClass", "odd:InvalidClass",
      "empty:InvalidClass" }, reasons(problems))
  end)

  it("raises on misuse by the caller", function()
    local ok, err = pcall(capacity.of, nil, g, KV, C)
    assert.is_false(ok)
    assert.matches("capacity: node must be a Node object", err)
    assert.has_error(function() capacity.of(node("gpu-1"), g, KV, { x = 1 }) end)
    assert.has_error(function() capacity.of(node("gpu-1"), g, KV, C, { [T4] = -1 }) end)
    assert.has_error(function() capacity.of(node("gpu-1"), g, KV, C, { [T4] = 1.5 }) end)
    assert.has_error(function() capacity.of(node("gpu-1"), g, KV, { H.class(nil, {}) }) end)
  end)
end)

describe("cozygpu.capacity.state", function()
  local g
  setup(function()
    g = gpunode("gpu-1", { functions = { { address = "0000:18:00.0", device = "1eb8", driver = "vfio-pci", iommu = 30 } } })
  end)

  it("a Ready, schedulable node with a current GPUNode is a candidate; GPU taints are listed", function()
    local taints = {
      { key = "gpu.cozystack.io/dedicated", value = "tenant-a", effect = "NoSchedule" },
      { key = "gpu.cozystack.io/maintenance", effect = "NoExecute" },
      { key = "gpu.cozystack.io/soft", effect = "PreferNoSchedule" },   -- not the binder's: PreferNoSchedule
      { key = "node.kubernetes.io/disk-pressure", effect = "NoSchedule" }, -- the scheduler's business
    }
    local s = capacity.state(node("gpu-1", nil, { taints = taints }), g)
    assert.is_true(s.candidate and s.ready and s.schedulable)
    assert.is_false(s.layout_pending)
    assert.are.same({}, s.reasons)
    assert.are.same({
      { key = "gpu.cozystack.io/dedicated", value = "tenant-a", effect = "NoSchedule" },
      { key = "gpu.cozystack.io/maintenance", effect = "NoExecute" },
    }, s.taints)
  end)

  it("is not a candidate when NotReady, cordoned, or its layout is in flux", function()
    local s = capacity.state(node("gpu-1", nil, { ready = "Unknown", unschedulable = true }), g)
    assert.is_false(s.candidate or s.ready or s.schedulable)
    assert.are.same({ "NotReady", "Unschedulable" }, reasons(s.reasons))

    local p = json.decode(json.encode(g))
    p.status.layout.pending = true
    s = capacity.state(node("gpu-1"), p)
    assert.is_true(s.layout_pending)
    assert.is_false(s.candidate)

    p = json.decode(json.encode(g))
    p.metadata.generation = 2 -- spec changed, the agent has not acted on it
    s = capacity.state(node("gpu-1"), p)
    assert.are.same({ "LayoutPending" }, reasons(s.reasons))
    assert.matches("has not acted on generation 2 %(observedGeneration 1%)", s.reasons[1].message)
  end)

  it("a missing or stale GPUNode keeps new sets off, as a pending layout does", function()
    local s = capacity.state(node("gpu-1"), nil)
    assert.is_true(s.layout_pending)
    assert.are.same({ "NoGPUNode" }, reasons(s.reasons))
    s = capacity.state(node("gpu-1", nil, { boot = "other" }), g)
    assert.are.same({ "StaleGPUNode" }, reasons(s.reasons))
    assert.is_false(s.candidate)
  end)

  it("a pending layout does not change what the node offers", function()
    local p = json.decode(json.encode(g))
    p.status.layout.pending = true
    assert.are.same({ t4 = 1 }, (capacity.of(node("gpu-1", { [T4] = "1" }), p, kubevirt(DEFAULTS.pciHostDevices),
      { class("t4", "Passthrough", T4) })))
  end)
end)

describe("cozygpu.capacity in the policy sandbox", function()
  it("loads with require and reads the cluster view's read-only objects", function()
    -- examples/cluster's KubeVirt CR permits nvidia.com/AD102GL_L40S; the
    -- Node below has no GPUNode (nil), so every class of examples/classes
    -- is offered 0, and the state says why
    local dir = H.policy_dir { ["zz-capacity.lua"] = [[
local capacity = require "cozygpu.capacity"
return rule "site/capacity" {
  validate = function(req, cluster)
    local node = { metadata = { name = "gpu-1", uid = "u" }, status = { nodeInfo = { bootID = "b" },
      allocatable = { ["nvidia.com/AD102GL_L40S"] = "2" }, conditions = { { type = "Ready", status = "True" } } } }
    local offers, problems = capacity.of(node, nil, cluster:kubevirt(), cluster:gpuclasses(), {})
    local names = {}
    for name, n in pairs(offers) do names[#names + 1] = name .. "=" .. n end
    table.sort(names)
    local s = capacity.state(node, nil)
    return warn(("offers %s; %s; candidate %s"):format(table.concat(names, ","), problems[1].reason, tostring(s.candidate)))
  end,
}
]] }
    local out, err, code = H.run({ "review", "--override", dir, "--cluster", "examples/classes", "--cluster", "examples/cluster",
      "--config", "examples/config.yaml", "--webhook", "validating", "--output", "json",
      "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml" })
    assert.equal(0, code, err)
    assert.matches("offers [%w%-,=]*=0; NoGPUNode; candidate false", out)
    assert.is_nil(out:find("=[1-9]"), out)
  end)
end)
