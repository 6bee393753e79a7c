-- lua/runtime/layout.lua: the agent's plan and GPUNode status, on
-- inventories written out by hand in the shape of docs/gpunode.md. The
-- type ids and names are the real L40S catalog's
-- (fixtures/sysfs/creatable_vgpu_types/l40s-full-catalog.txt): 1155 is
-- "NVIDIA L40S-24Q", 1156 "NVIDIA L40S-48Q", 1147 "NVIDIA L40S-1Q".
-- The C side (writes, rescans, the API) is in agent_spec.lua.
local layout = require "runtime.layout"
local json = H.json

local PF = "0000:41:00.0"
local function vf_addr(i) return ("0000:41:00.%d"):format(4 + i) end

local CATALOG = {
  { id = 1147, name = "NVIDIA L40S-1Q" },
  { id = 1155, name = "NVIDIA L40S-24Q" },
  { id = 1156, name = "NVIDIA L40S-48Q" },
}

-- An L40S PF with n VFs; types[i] is VF i's current type (0 or nil: none),
-- creatable[i] overrides VF i's creatable list.
local function l40s(n, types, creatable, extra)
  types, creatable = types or {}, creatable or {}
  local vfs = {}
  for i = 0, n - 1 do vfs[#vfs + 1] = vf_addr(i) end
  local fns = { { address = PF, vendorID = "10de", deviceID = "26b9", class = "0302", role = "GPU",
    name = "AD102GL [L40S]", model = "L40S", driver = "nvidia", iommuGroup = 40, counted = true,
    sriov = { totalVFs = 32, numVFs = n }, virtualFunctions = vfs } }
  for i = 0, n - 1 do
    local t = types[i] or 0
    local v = { type = t, creatable = creatable[i] or CATALOG }
    for _, row in ipairs(CATALOG) do
      if row.id == t then v.typeName = row.name; v.profile = row.name:match("(%S+)$") end
    end
    fns[#fns + 1] = { address = vf_addr(i), vendorID = "10de", deviceID = "26b9", class = "0302", role = "GPU",
      driver = "nvidia", iommuGroup = 41 + i, counted = true, physicalFunction = PF, vfIndex = i, vgpu = v }
  end
  for _, f in ipairs(extra or {}) do fns[#fns + 1] = f end
  return { functions = fns }
end

local function vgpu_spec(profile, count, vfs)
  return { gpus = { { address = PF, mode = "VGPU", profile = profile, count = count, vfs = vfs } } }
end

local function addresses(list)
  local out = {}
  for _, w in ipairs(list) do out[#out + 1] = w.address end
  return out
end

describe("layout.profile_matches", function()
  it("takes the driver's full name or its last word, nothing looser", function()
    assert.is_true(layout.profile_matches("NVIDIA L40S-24Q", "L40S-24Q"))
    assert.is_true(layout.profile_matches("NVIDIA L40S-24Q", "NVIDIA L40S-24Q"))
    assert.is_true(layout.profile_matches("NVIDIA RTX Pro 6000 Blackwell DC-1-24Q", "DC-1-24Q"))
    assert.is_false(layout.profile_matches("NVIDIA L40S-24Q", "24Q"))
    assert.is_false(layout.profile_matches("NVIDIA L40S-24Q", "L40S-2"))
    assert.is_false(layout.profile_matches("NVIDIA L40S-24Q", ""))
    assert.is_false(layout.profile_matches(nil, "L40S-24Q"))
  end)
end)

describe("layout.plan", function()
  it("sets the declared VFs from their creatable lists, by id, one per GPU per round, and leaves the rest empty", function()
    local inv = l40s(4)
    local p = layout.plan(inv, vgpu_spec("L40S-24Q", 2), {})
    -- each set changes what the card can still create: one now, the next
    -- on lists read again
    assert.same({ { address = vf_addr(0), pf = PF, index = 0, from = 0, to = 1155, profile = "L40S-24Q" } }, p.writes)
    inv.functions[2].vgpu.type = 1155
    p = layout.plan(inv, vgpu_spec("NVIDIA L40S-24Q", 2), {})
    assert.same({ { address = vf_addr(1), pf = PF, index = 1, from = 0, to = 1155, profile = "L40S-24Q" } }, p.writes)
    assert.same({}, p.pending)
    assert.same({}, p.refused)
    assert.same({}, p.errors)
  end)

  it("writes nothing when the node already matches (idempotent), by name or by the card's id", function()
    local p = layout.plan(l40s(4, { [0] = 1155, [1] = 1155 }), vgpu_spec("L40S-24Q", 2), {})
    assert.same({}, p.writes)
    -- a configured VF's own list may no longer name its type (LAYOUT §5):
    -- the id is found on the card's other functions
    local inv = l40s(2, { [0] = 1155 }, { [0] = {} })
    inv.functions[2].vgpu.typeName, inv.functions[2].vgpu.profile = nil, nil
    assert.same({}, layout.plan(inv, vgpu_spec("L40S-24Q", 1), {}).writes)
  end)

  it("clears a VF whose type must change before setting anything, then sets it on the next round", function()
    local inv = l40s(2, { [0] = 1147 })
    local p = layout.plan(inv, vgpu_spec("L40S-24Q", 2), {})
    -- round 1: only the clear; VF 1's set waits for fresh creatable lists
    assert.same({ { address = vf_addr(0), pf = PF, index = 0, from = 1147, to = 0 } }, p.writes)
    assert.same({}, p.refused)
    -- round 2, after the clear: the first of the two sets
    inv.functions[2].vgpu = { type = 0, creatable = CATALOG }
    p = layout.plan(inv, vgpu_spec("L40S-24Q", 2), {})
    assert.same({ vf_addr(0) }, addresses(p.writes))
  end)

  it("removes the vGPU of a VF the layout no longer names, and of every VF in Passthrough mode", function()
    local p = layout.plan(l40s(3, { [2] = 1155 }), vgpu_spec("L40S-24Q", 2), {})
    assert.same({ { address = vf_addr(2), pf = PF, index = 2, from = 1155, to = 0 } }, p.writes)
    local inv = l40s(2, { [0] = 1155 })
    inv.functions[1].driver = "vfio-pci"
    p = layout.plan(inv, { gpus = { { address = PF, mode = "Passthrough" } } }, {})
    assert.same({ { address = vf_addr(0), pf = PF, index = 0, from = 1155, to = 0 } }, p.writes)
    assert.same({}, p.errors)
  end)

  it("leaves a GPU whose driver does not fit its mode as it is, and says so", function()
    local p = layout.plan(l40s(2, { [0] = 1155 }), { gpus = { { address = PF, mode = "Passthrough" } } }, {})
    assert.same({}, p.writes)
    assert.equal(1, #p.errors)
    assert.equal("DriverMismatch", p.errors[1].reason)
    assert.equal("spec.gpus[0].mode", p.errors[1].field)
    assert.matches("bound to nvidia; mode Passthrough needs vfio%-pci", p.errors[1].message)
  end)

  it("never writes a VF a process holds: the change is pending, with who holds it", function()
    local held = { [vf_addr(0)] = "pid 812 (qemu-kvm) holds /dev/vfio/41" }
    local p = layout.plan(l40s(2, { [0] = 1147 }), vgpu_spec("L40S-24Q", 2), held)
    -- VF 1 is free and empty: it is set now; VF 0 waits
    assert.same({ vf_addr(1) }, addresses(p.writes))
    assert.equal(1, #p.pending)
    -- (the pending change is checked below)
    local c = p.pending[1]
    assert.same({ vf_addr(0), PF, 0, 1147, 1155, "L40S-1Q", "L40S-24Q", "InUse" },
      { c.address, c.physicalFunction, c.vfIndex, c.fromType, c.toType, c.fromProfile, c.toProfile, c.reason })
    assert.matches("pid 812 %(qemu%-kvm%) holds /dev/vfio/41", c.message)
    -- a held VF that already matches is no change at all
    p = layout.plan(l40s(1, { [0] = 1155 }), vgpu_spec("L40S-24Q", 1), { [vf_addr(0)] = "pid 1 holds /dev/vfio/41" })
    assert.same({}, p.writes)
    assert.same({}, p.pending)
  end)

  it("while a VM holds a VF of a GPU, clears none of the GPU's other VFs: they wait, still usable", function()
    -- a card in equal-size mode: VF 0 and VF 1 on 24Q, VF 0 held; the new
    -- layout is 12Q on all four, which the card can offer only once VF 0 is free
    local inv = l40s(4, { [0] = 1155, [1] = 1155 }, { [0] = { CATALOG[2] }, [1] = { CATALOG[2] }, [2] = {}, [3] = {} })
    local p = layout.plan(inv, vgpu_spec("L40S-12Q", 4), { [vf_addr(0)] = "pid 9 holds /dev/vfio/41" },
      { layout = { knownTypes = { { physicalFunction = PF, types = { { id = 1153, name = "NVIDIA L40S-12Q" } } } } } })
    assert.same({}, p.writes)
    assert.same({}, p.refused)
    local r = {}
    for _, c in ipairs(p.pending) do r[#r + 1] = c.address .. " " .. c.reason end
    assert.same({ vf_addr(0) .. " InUse", vf_addr(1) .. " WaitsForVF", vf_addr(2) .. " WaitsForVF",
      vf_addr(3) .. " WaitsForVF" }, r)
    assert.equal("VF 0000:41:00.5 (vf 1 of 0000:41:00.0) keeps L40S-24Q until the held VF of the same GPU is free",
      p.pending[2].message)
    assert.same({ 1155, 1153 }, { p.pending[2].fromType, p.pending[2].toType })
  end)

  it("refuses a profile the VF cannot take, naming it and the creatable ones", function()
    local p = layout.plan(l40s(2), vgpu_spec("L40S-48Q", 1, { { index = 1, profile = "L40S-8Q" } }), {})
    assert.same({ vf_addr(0) }, addresses(p.writes))
    assert.equal(1, #p.refused)
    local r = p.refused[1]
    assert.same({ vf_addr(1), PF, 1, "L40S-8Q" }, { r.address, r.physicalFunction, r.vfIndex, r.profile })
    assert.same({ "L40S-1Q", "L40S-24Q", "L40S-48Q" }, r.creatable)
    assert.equal("VF 0000:41:00.5 (vf 1 of 0000:41:00.0) cannot take profile L40S-8Q; creatable: L40S-1Q, L40S-24Q, L40S-48Q",
      r.message)
    -- a full card: the list is header-only
    p = layout.plan(l40s(2, { [0] = 1156 }, { [1] = {} }), vgpu_spec("L40S-48Q", 2), {})
    assert.equal("VF 0000:41:00.5 (vf 1 of 0000:41:00.0) cannot take profile L40S-48Q; creatable: none",
      p.refused[1].message)
  end)

  it("lets a set wait, not fail, while a held VF of the same GPU still has to change", function()
    -- VF 0 holds 48Q (the whole card) and is in use; VF 1 wants 24Q, which
    -- the card can offer only once VF 0 lets go
    local inv = l40s(2, { [0] = 1156 }, { [1] = {} })
    local p = layout.plan(inv, vgpu_spec("L40S-24Q", 2), { [vf_addr(0)] = "pid 9 holds /dev/vfio/41" })
    assert.same({}, p.writes)
    assert.same({}, p.refused)
    assert.same({ "InUse", "WaitsForVF" }, { p.pending[1].reason, p.pending[2].reason })
  end)

  it("keeps a full card as it is: the names of its types come from the previous status", function()
    -- every list is header-only once the card is full (LAYOUT §5), so the
    -- current types cannot be named from sysfs alone
    local inv = l40s(2, { [0] = 1155, [1] = 1155 }, { [0] = {}, [1] = {} })
    for i = 2, 3 do inv.functions[i].vgpu.typeName, inv.functions[i].vgpu.profile = nil, nil end
    local before = { functions = l40s(2).functions } -- the last pass saw the full catalog
    local p = layout.plan(inv, vgpu_spec("L40S-24Q", 2), {}, before)
    assert.same({}, p.writes)
    assert.same({}, p.refused)
    assert.same({}, p.errors)
    -- with a VM on VF 0 nothing is pending either
    p = layout.plan(inv, vgpu_spec("L40S-24Q", 2), { [vf_addr(0)] = "pid 3 holds /dev/vfio/41" }, before)
    assert.same({}, p.pending)
    -- and without any name for 1155 the VFs are left alone, and said so
    p = layout.plan(inv, vgpu_spec("L40S-24Q", 2), {})
    assert.same({}, p.writes)
    assert.same({ "UnknownType", "UnknownType" }, { p.errors[1].reason, p.errors[2].reason })
    assert.equal("VF 0000:41:00.4 carries type 1155, which no creatable list of its card names; it is left as it is",
      p.errors[1].message)
  end)

  it("refuses a profile its card does not offer without deleting the VF's vGPU first", function()
    local p = layout.plan(l40s(1, { [0] = 1155 }), vgpu_spec("L40S-24G", 1), {})
    assert.same({}, p.writes)
    assert.equal(1, #p.refused)
    assert.matches("^VF 0000:41:00.4 %(vf 0 of 0000:41:00.0%) cannot take profile L40S%-24G %(no function of 0000:41:00.0 offers it%); creatable: L40S%-1Q",
      p.refused[1].message)
    -- held: refused too, not pending (nothing would ever apply it)
    p = layout.plan(l40s(1, { [0] = 1155 }), vgpu_spec("L40S-24G", 1), { [vf_addr(0)] = "pid 3 holds /dev/vfio/41" })
    assert.same({}, p.pending)
    assert.equal(1, #p.refused)
  end)

  it("names VFs by their virtfn index, trims profile names, and reports malformed entries instead of failing", function()
    -- VF 1 is missing (a gap in the virtfn links): index 2 is still 0000:41:00.6
    local inv = l40s(3)
    table.remove(inv.functions[1].virtualFunctions, 2)
    table.remove(inv.functions, 3)
    local p = layout.plan(inv, vgpu_spec(nil, nil, { { index = 2, profile = " L40S-24Q " } }), {})
    assert.same({ { address = vf_addr(2), pf = PF, index = 2, from = 0, to = 1155, profile = "L40S-24Q" } }, p.writes)
    p = layout.plan(l40s(1), { gpus = { { address = PF, mode = "VGPU", vfs = json.null },
      { address = PF, mode = "VGPU", vfs = { { index = "1", profile = "x" } } }, { mode = "VGPU" } } }, {})
    local reasons = {}
    for _, e in ipairs(p.errors) do reasons[#reasons + 1] = e.field .. " " .. e.reason end
    assert.same({ "spec.gpus[0].vfs InvalidSpec", "spec.gpus[1].vfs[0] InvalidSpec", "spec.gpus[2] InvalidSpec" }, reasons)
  end)

  it("says when the layout names VFs that are not enabled, or a GPU without SR-IOV", function()
    local p = layout.plan(l40s(2), vgpu_spec(nil, nil, { { index = 9, profile = "L40S-4Q" } }), {})
    assert.same({ [PF] = { want = 10, have = 2 } }, p.short)
    assert.same({ "spec.gpus[0]", "MissingVFs", "spec.gpus[0]: the layout names VF 9; 2 VFs are enabled on 0000:41:00.0" },
      { p.errors[1].field, p.errors[1].reason, p.errors[1].message })
    p = layout.plan(l40s(2), vgpu_spec("L40S-1Q", 40), {})
    assert.same({ "TooManyVFs" }, { p.errors[1].reason })
    assert.same({}, p.short)
    local inv = l40s(0)
    inv.functions[1].sriov, inv.functions[1].virtualFunctions = nil, nil
    p = layout.plan(inv, vgpu_spec("L40S-1Q", 1), {})
    assert.same({ "NotSRIOV" }, { p.errors[1].reason })
    assert.same({}, p.short)
  end)

  it("reports layout entries it cannot act on, with the field", function()
    local inv = l40s(1)
    local p = layout.plan(inv, { gpus = {
      { address = "0000:99:00.0", mode = "VGPU", profile = "L40S-24Q", count = 1 },
      { address = vf_addr(0), mode = "VGPU", profile = "L40S-24Q", count = 1 },
    } }, {})
    assert.same({ "spec.gpus[0].address", "spec.gpus[1].address" }, { p.errors[1].field, p.errors[2].field })
    assert.same({ "NoSuchGPU", "NotAGPU" }, { p.errors[1].reason, p.errors[2].reason })
    assert.matches("is a VF of 0000:41:00.0", p.errors[2].message)
  end)

  it("counts the VFs the layout names against those enabled", function()
    local p = layout.plan(l40s(2), vgpu_spec("L40S-1Q", 4), {})
    assert.same({ [PF] = { want = 4, have = 2 } }, p.short)
    -- a per-VF entry beyond the enabled ones counts too; an empty profile does not
    p = layout.plan(l40s(2), vgpu_spec(nil, nil, { { index = 5, profile = "" }, { index = 2, profile = "L40S-1Q" } }), {})
    assert.same({ [PF] = { want = 3, have = 2 } }, p.short)
  end)
end)

describe("layout.status", function()
  local NOW, LATER = "2026-11-30T08:00:00Z", "2026-11-30T08:05:00Z"

  local function status(inv, spec, in_use, previous, now, writes)
    local plan = layout.plan(inv, spec, in_use, previous) -- same boot ("b1"), as the agent does
    local s = layout.status { inventory = inv, spec = spec, generation = 3, plan = plan, writes = writes,
      in_use = in_use, previous = previous, now = now or NOW, boot_id = "b1" }
    -- what the API server stores and gives back
    return json.decode(json.encode(s))
  end

  local function cond(s, t)
    for _, c in ipairs(s.conditions) do if c.type == t then return c end end
  end

  it("is the inventory with health, the layout state and two conditions", function()
    local inv = l40s(2, { [0] = 1155, [1] = 1155 })
    local s = status(inv, vgpu_spec("L40S-24Q", 2), { [vf_addr(0)] = "pid 1 holds /dev/vfio/41" })
    assert.equal(3, s.observedGeneration)
    assert.equal("b1", s.bootID)
    assert.equal(3, #s.functions)
    assert.same({ status = "Healthy" }, s.functions[1].health)
    assert.is_true(s.functions[2].inUse)
    assert.is_nil(s.functions[3].inUse)
    assert.same({ pending = false, pendingChanges = {}, refused = {}, errors = {}, lastWrites = {},
      knownTypes = { { physicalFunction = PF, types = CATALOG } } }, s.layout)
    assert.same({ type = "Healthy", status = "True", reason = "AllHealthy",
      message = "every GPU function is present and has a driver", observedGeneration = 3, lastTransitionTime = NOW },
      cond(s, "Healthy"))
    assert.same({ "True", "Applied" }, { cond(s, "LayoutApplied").status, cond(s, "LayoutApplied").reason })
  end)

  it("says NoLayout without spec.gpus, and Pending (pending = true) while a held VF must change", function()
    local s = status(l40s(1), nil, {})
    assert.same({ "True", "NoLayout" }, { cond(s, "LayoutApplied").status, cond(s, "LayoutApplied").reason })
    s = status(l40s(1, { [0] = 1147 }), vgpu_spec("L40S-24Q", 1), { [vf_addr(0)] = "pid 7 holds /dev/vfio/41" })
    assert.is_true(s.layout.pending)
    assert.same({ "False", "Pending" }, { cond(s, "LayoutApplied").status, cond(s, "LayoutApplied").reason })
    assert.matches("keeps L40S%-1Q: pid 7 holds /dev/vfio/41", cond(s, "LayoutApplied").message)
  end)

  it("marks a GPU without a driver and a PF short of VFs unhealthy", function()
    local inv = l40s(1)
    inv.functions[1].driver = nil
    local s = status(inv, vgpu_spec("L40S-24Q", 3), {})
    assert.same({ status = "Unhealthy", reason = "DriverUnbound", message = "no driver is bound" }, s.functions[1].health)
    inv = l40s(1)
    s = status(inv, vgpu_spec("L40S-24Q", 3), {})
    assert.same({ status = "Unhealthy", reason = "VFCountBelowLayout", message = "the layout names 3 VFs; 1 are enabled" },
      s.functions[1].health)
    assert.same({ "False", "Unhealthy", "0000:41:00.0: VFCountBelowLayout" },
      { cond(s, "Healthy").status, cond(s, "Healthy").reason, cond(s, "Healthy").message })
  end)

  it("keeps a vanished GPU as Unhealthy/Vanished from the previous status, but not a vanished VF", function()
    local other = { address = "0000:81:00.0", vendorID = "10de", deviceID = "26b9", class = "0302", role = "GPU",
      driver = "vfio-pci", iommuGroup = 80, counted = true }
    local before = status(l40s(2, {}, {}, { other }), nil, {})
    local after = status(l40s(1), nil, {}, before, LATER)
    local by = {}
    for _, f in ipairs(after.functions) do by[f.address] = f end
    assert.same({ status = "Unhealthy", reason = "Vanished", message = "the function is no longer on the PCI bus" },
      by["0000:81:00.0"].health)
    assert.is_nil(by[vf_addr(1)])
    assert.same({ "False", LATER }, { cond(after, "Healthy").status, cond(after, "Healthy").lastTransitionTime })
    -- and across another pass (an agent restart reads it back)
    local again = status(l40s(1), nil, {}, after, "2026-11-30T09:00:00Z")
    assert.same(after, again)
  end)

  it("keeps the names of a full card's types across passes of one boot, and forgets them on a reboot", function()
    local full = l40s(2, { [0] = 1156 }, { [0] = {}, [1] = {} })
    for i = 2, 3 do full.functions[i].vgpu.typeName, full.functions[i].vgpu.profile = nil, nil end
    local s = status(l40s(2), vgpu_spec("L40S-48Q", 1), {}) -- the card before: every list full
    for pass = 1, 3 do
      s = status(full, vgpu_spec("L40S-48Q", 1), {}, s, LATER)
      local vf0 = s.functions[2]
      assert.same({ 1156, "NVIDIA L40S-48Q", "L40S-48Q" }, { vf0.vgpu.type, vf0.vgpu.typeName, vf0.vgpu.profile },
        "pass " .. pass)
      assert.same({ { physicalFunction = PF, types = CATALOG } }, s.layout.knownTypes)
      assert.same({ "True", "Applied" }, { cond(s, "LayoutApplied").status, cond(s, "LayoutApplied").reason })
    end
    -- another boot: the ids may be another driver's; nothing is carried
    local plan = layout.plan(full, vgpu_spec("L40S-48Q", 1), {})
    local r = json.decode(json.encode(layout.status { inventory = full, spec = vgpu_spec("L40S-48Q", 1), generation = 3,
      plan = plan, in_use = {}, previous = s, now = LATER, boot_id = "b2" }))
    assert.same({}, r.layout.knownTypes)
    assert.is_nil(r.functions[2].vgpu.typeName)
  end)

  it("caps the LayoutApplied message, the lists keeping every detail", function()
    local inv = l40s(64)
    local vfs = {}
    for i = 0, 63 do vfs[#vfs + 1] = { index = i, profile = "L40S-" .. i .. "X" } end
    local s = status(inv, vgpu_spec(nil, nil, vfs), {})
    assert.equal(64, #s.layout.refused)
    local m = cond(s, "LayoutApplied").message
    assert.is_true(#m <= layout.MAX_MESSAGE, #m)
    assert.matches("; and %d+ more %(status%.layout%)$", m)
  end)

  it("does not change while nothing changes: same conditions' times, last writes carried", function()
    local inv = l40s(1, { [0] = 1155 })
    local writes = { { address = vf_addr(0), from = 0, to = 1155, profile = "L40S-24Q", time = NOW } }
    local s1 = status(inv, vgpu_spec("L40S-24Q", 1), {}, nil, NOW, writes)
    assert.same({ { address = vf_addr(0), fromType = 0, toType = 1155, profile = "L40S-24Q", time = NOW } },
      s1.layout.lastWrites)
    local s2 = status(inv, vgpu_spec("L40S-24Q", 1), {}, s1, LATER, {})
    assert.same(s1, s2)
  end)
end)
