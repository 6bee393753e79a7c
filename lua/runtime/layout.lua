--- runtime.layout — the node agent's decisions: which vGPU type each VF
--- gets from the declared layout, what waits, what is refused, and the
--- GPUNode status (DESIGN.md §3 GPUNode, §7; docs/decisions/0011).
---
--- Pure functions over plain tables: the C agent (`core/agent/agent.c`) reads the
--- inventory (docs/gpunode.md), finds which functions a process holds
--- open, calls `plan`, performs the writes, reads again, and finally calls
--- `status`. Nothing here touches files.
---
--- Shapes:
---   inventory  { functions = { FUNCTION... } }       (docs/gpunode.md)
---   spec       GPUNode.spec: { gpus = { {address, mode, profile?, count?,
---              vfs? = { {index, profile} } } } }     (CRD, decision 0011)
---   in_use     { [address] = "why it is held" }     (e.g. "pid 812 holds
---              /dev/vfio/46"); functions not held are absent
local json = require "cozygpu.json"

local M = {}

--- Most rounds of writes in one pass (decision 0011): one round of clears,
--- then at most one set per GPU per round (each set changes what the card
--- can still create, so the next one is planned on lists read again), for
--- up to 256 VFs per GPU, and one spare.
M.MAX_ROUNDS = 258

--- Longest LayoutApplied message (characters); metav1.Condition allows 32768.
M.MAX_MESSAGE = 4096

local function arr(t) return json.array(t or {}) end
local function is_table(v) return type(v) == "table" end

local function last_word(s) return type(s) == "string" and s:match("(%S+)%s*$") or nil end

--- True when the driver's type name `full` ("NVIDIA L40S-24Q") is the
--- profile `wanted`, given in full or as its last word ("L40S-24Q"), which
--- is how NVIDIA's documentation and device-plugin names shorten it
--- (fixtures/sysfs/LAYOUT.md §5).
--- @param full string|nil
--- @param wanted string|nil
--- @return boolean
function M.profile_matches(full, wanted)
  if type(full) ~= "string" or type(wanted) ~= "string" or wanted == "" then return false end
  return full == wanted or last_word(full) == wanted
end

--- Index of an inventory: address -> function.
--- @param inventory table { functions = { FUNCTION... } } (docs/gpunode.md); nil is empty
--- @return table<string, table> the inventory's own function tables (not copies)
function M.index(inventory)
  local idx = {}
  for _, fn in ipairs(is_table(inventory) and is_table(inventory.functions) and inventory.functions or {}) do
    if is_table(fn) and type(fn.address) == "string" then idx[fn.address] = fn end
  end
  return idx
end

-- The type id of profile `wanted` on VF `vf`: from its own creatable list
-- (what it can take now).
local function creatable_id(vf, wanted)
  for _, row in ipairs(vf.vgpu and vf.vgpu.creatable or {}) do
    if M.profile_matches(row.name, wanted) then return row.id end
  end
  return nil
end

local function creatable_names(vf)
  local out = {}
  for _, row in ipairs(vf.vgpu and vf.vgpu.creatable or {}) do out[#out + 1] = last_word(row.name) or row.name end
  return out
end

--- What the card of each PF calls its vGPU types: { [pf address] = { [id]
--- = name } }. Type ids are unique per physical card only, and once a card
--- is configured its lists shrink, down to the header on a full card
--- (fixtures/sysfs/LAYOUT.md §5: a name for an id in use is resolved from
--- sibling functions of the same PF). So the names come from the creatable
--- lists and type names of the PF and its VFs now, then from `previous`:
--- its `layout.knownTypes` and the type names of its functions. The caller
--- passes `previous` only from the same boot (a reboot may bring another
--- driver, with other ids).
--- @param inventory table docs/gpunode.md
--- @param previous table|nil a GPUNode status this function's output went into
--- @return table
function M.card_names(inventory, previous)
  local names = {}
  local function put(pf, id, name, overwrite)
    if type(pf) ~= "string" or math.type(id) ~= "integer" or id == 0 or type(name) ~= "string" then return end
    local t = names[pf] or {}
    names[pf] = t
    if overwrite or t[id] == nil then t[id] = name end
  end
  local function add(fn, overwrite)
    if not is_table(fn) or not is_table(fn.vgpu) then return end
    local pf = fn.physicalFunction or fn.address
    for _, row in ipairs(is_table(fn.vgpu.creatable) and fn.vgpu.creatable or {}) do
      if is_table(row) then put(pf, row.id, row.name, overwrite) end
    end
    put(pf, fn.vgpu.type, fn.vgpu.typeName, overwrite)
  end
  for _, fn in ipairs(is_table(inventory) and is_table(inventory.functions) and inventory.functions or {}) do
    add(fn, true)
  end
  if is_table(previous) then
    local known = is_table(previous.layout) and previous.layout.knownTypes
    for _, k in ipairs(is_table(known) and known or {}) do
      for _, row in ipairs(is_table(k) and is_table(k.types) and k.types or {}) do
        if is_table(row) then put(k.physicalFunction, row.id, row.name, false) end
      end
    end
    for _, fn in ipairs(is_table(previous.functions) and previous.functions or {}) do add(fn, false) end
  end
  return names
end

-- id of profile `wanted` on a card (names from M.card_names), or nil
local function card_id(names, wanted)
  local best
  for id, name in pairs(names or {}) do
    if M.profile_matches(name, wanted) and (best == nil or id < best) then best = id end
  end
  return best
end

local function trim(s) return type(s) == "string" and s:match("^%s*(.-)%s*$") or s end

--- What the layout wants, per VF of each listed GPU, and what it cannot
--- act on (decision 0011: VGPU puts `profile` on VFs 0..count-1 and
--- `vfs[]` per virtfn index, every other VF of the GPU carries no vGPU;
--- Passthrough carries none on any VF; a GPU not listed is not touched).
--- A GPU whose driver does not fit its mode (vfio-pci for Passthrough,
--- nvidia for VGPU, fixtures/sysfs/LAYOUT.md §7) is reported and left
--- alone. Malformed entries (which the CRD's schema keeps out of a real API
--- server) are reported, never raised.
--- @param inventory table docs/gpunode.md
--- @param spec table|nil GPUNode.spec
--- @return table wants     { [vf address] = {pf, index, profile|nil, field} }
--- @return table errors    { {field, address, reason, message} }
--- @return table short     { [pf address] = {want = n, have = m} } (VFs missing)
function M.desired(inventory, spec)
  local idx = M.index(inventory)
  local wants, errors, short = {}, {}, {}
  local function bad(field, address, reason, message)
    errors[#errors + 1] = { field = field, address = address, reason = reason, message = message }
  end
  local gpus = is_table(spec) and spec.gpus or nil
  if not is_table(gpus) then gpus = {} end
  for i, g in ipairs(gpus) do
    local field = ("spec.gpus[%d]"):format(i - 1)
    local fn = is_table(g) and type(g.address) == "string" and idx[g.address] or nil
    if not is_table(g) or type(g.address) ~= "string" or (g.mode ~= "VGPU" and g.mode ~= "Passthrough") then
      bad(field, is_table(g) and type(g.address) == "string" and g.address or nil, "InvalidSpec",
        ("%s: needs an address and mode VGPU or Passthrough"):format(field))
    elseif not fn then
      bad(field .. ".address", g.address, "NoSuchGPU", ("%s: no NVIDIA PCI function %s on this node"):format(field, g.address))
    elseif fn.physicalFunction or fn.role ~= "GPU" then
      bad(field .. ".address", g.address, "NotAGPU", ("%s: %s is %s, not a GPU's physical function"):format(field,
        g.address, fn.physicalFunction and ("a VF of " .. fn.physicalFunction) or ("a " .. tostring(fn.role) .. " function")))
    else
      local need = g.mode == "Passthrough" and "vfio-pci" or "nvidia"
      local mismatch = fn.driver ~= need
      if mismatch then
        bad(field .. ".mode", g.address, "DriverMismatch",
          ("%s: %s is bound to %s; mode %s needs %s (the agent does not rebind drivers, and leaves this GPU as it is)"):format(
            field, g.address, fn.driver or "no driver", g.mode, need))
      end
      local per = {}
      local top = -1
      if g.mode == "VGPU" then
        local profile, count = trim(g.profile), g.count
        if profile ~= nil or count ~= nil then
          if type(profile) ~= "string" or profile == "" or math.type(count) ~= "integer" or count < 1 or count > 256 then
            bad(field .. ".profile", g.address, "InvalidSpec",
              ("%s: profile (a name) and count (1 to 256) go together"):format(field))
          else
            for k = 0, count - 1 do per[k] = { profile = profile, field = field .. ".profile" } end
          end
        end
        local vfs = g.vfs
        if vfs ~= nil and not is_table(vfs) then
          bad(field .. ".vfs", g.address, "InvalidSpec", ("%s.vfs: not a list"):format(field))
          vfs = {}
        end
        for j, v in ipairs(vfs or {}) do
          local vf_field = ("%s.vfs[%d]"):format(field, j - 1)
          local pr = is_table(v) and trim(v.profile) or nil
          if not is_table(v) or math.type(v.index) ~= "integer" or v.index < 0 or v.index > 255 or type(pr) ~= "string" then
            bad(vf_field, g.address, "InvalidSpec", ("%s: needs an index (0 to 255) and a profile (\"\" for none)"):format(vf_field))
          else
            per[v.index] = { profile = pr ~= "" and pr or nil, field = vf_field }
          end
        end
        for k, p in pairs(per) do if p.profile and k > top then top = k end end
      end
      -- VFs by their virtfn index (vfIndex), as the spec names them
      local by_index = {}
      for k, a in ipairs(fn.virtualFunctions or {}) do
        local vf = idx[a]
        local n = vf and math.type(vf.vfIndex) == "integer" and vf.vfIndex or (k - 1)
        if vf then by_index[n] = a end
      end
      local have = #(fn.virtualFunctions or {})
      if top >= 0 then
        local total = is_table(fn.sriov) and fn.sriov.totalVFs or nil
        if not is_table(fn.sriov) then
          bad(field, g.address, "NotSRIOV", ("%s: %s has no SR-IOV; its vGPUs would be VFs (LAYOUT §4)"):format(field, g.address))
        elseif math.type(total) == "integer" and top >= total then
          bad(field, g.address, "TooManyVFs", ("%s: the layout names VF %d; %s supports %d VFs"):format(field, top, g.address, total))
        elseif by_index[top] == nil or top >= have then
          short[fn.address] = { want = top + 1, have = have }
          bad(field, g.address, "MissingVFs", ("%s: the layout names VF %d; %d VFs are enabled on %s"):format(field, top,
            have, g.address))
        end
      end
      if not mismatch then
        for n, a in pairs(by_index) do
          local p = per[n]
          wants[a] = { pf = fn.address, index = n, profile = p and p.profile, field = p and p.field or field }
        end
      end
    end
  end
  return wants, errors, short
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

--- One round of the plan: what to write now, what waits, what is refused
--- (DESIGN §7, decision 0011; the sysfs rules are fixtures/sysfs/LAYOUT.md
--- §5: writing an id creates the vGPU, 0 removes it, and a VF's creatable
--- list is what it can take now).
--- - Clears come first; while any clear is written this round, sets wait
---   for the next round (the creatable lists change once a type is gone).
--- - At most one set per GPU per round: each set changes what the card can
---   still create, so the next is planned on lists read again.
--- - A VF a process holds is never written: its change is pending
---   (`InUse`). While a GPU has such a VF, its other VFs are not cleared
---   either (`WaitsForVF`): on a card whose vGPUs must all be of one type
---   the new profile cannot come before the VM ends, and the old vGPUs stay
---   usable meanwhile.
--- - A VF whose current type cannot be named (no list of its card, now or
---   in `previous`, names it) or read is left alone and reported.
--- - A VF is cleared only for a profile its card is known to offer, so a
---   misspelt profile is refused without deleting anything.
--- - A profile the VF cannot take is refused, naming the creatable ones,
---   unless the GPU has a pending change (then it waits: the held VF's
---   capacity may be what is missing).
--- @param inventory table docs/gpunode.md
--- @param spec table|nil GPUNode.spec
--- @param in_use table|nil { [address] = why } (module header)
--- @param previous table|nil the GPUNode status of the last pass of the
---   same boot (names of types the card no longer lists: M.card_names)
--- @return table { writes = { {address, pf, index, from, to, profile?} },
---   pending = { {address, physicalFunction, vfIndex, fromType, toType,
---   fromProfile, toProfile, reason, message} }, refused = { {address,
---   physicalFunction, vfIndex, profile, creatable, message} },
---   errors = { {field?, address?, reason, message} },
---   short = { [pf address] = {want, have} } } (see M.desired)
--- Raises only on a bug; malformed input is reported in `errors`.
function M.plan(inventory, spec, in_use, previous)
  in_use = is_table(in_use) and in_use or {}
  local idx = M.index(inventory)
  local names = M.card_names(inventory, previous)
  local wants, errors, short = M.desired(inventory, spec)
  local clears, sets, pending, refused, unset = {}, {}, {}, {}, {}
  local pending_pf = {}

  local function short_name(card, id, fallback)
    local n = card[id]
    return n and last_word(n) or fallback
  end

  local function wait(vf, w, to, to_profile, reason, message)
    pending[#pending + 1] = { address = vf.address, physicalFunction = w.pf, vfIndex = w.index,
      fromType = vf.vgpu.type, toType = to, fromProfile = vf.vgpu.profile or short_name(names[w.pf] or {}, vf.vgpu.type),
      toProfile = to_profile, reason = reason, message = message }
    pending_pf[w.pf] = true
  end

  local function refuse(vf, w, why)
    local creatable = creatable_names(vf)
    refused[#refused + 1] = { address = vf.address, physicalFunction = w.pf, vfIndex = w.index,
      profile = w.profile, creatable = arr(creatable),
      message = ("VF %s (vf %d of %s) cannot take profile %s%s; creatable: %s"):format(vf.address, w.index, w.pf,
        w.profile, why or "", #creatable > 0 and table.concat(creatable, ", ") or "none") }
  end

  for _, a in ipairs(sorted_keys(wants)) do
    local w, vf = wants[a], idx[a]
    local card = names[w.pf] or {}
    if not vf then goto next end
    if not is_table(vf.vgpu) then
      if w.profile then
        errors[#errors + 1] = { field = w.field, address = a, reason = "NoVGPUSupport",
          message = ("%s: VF %s has no nvidia/ directory (is the NVIDIA vGPU host driver bound?)"):format(w.field, a) }
      end
      goto next
    end
    do
      local cur = vf.vgpu.type
      if math.type(cur) ~= "integer" then
        errors[#errors + 1] = { field = w.field, address = a, reason = "UnknownType",
          message = ("VF %s: nvidia/current_vgpu_type cannot be read; the VF is left as it is"):format(a) }
        goto next
      end
      local want_id = w.profile and card_id(card, w.profile)
      if w.profile == nil then
        if cur ~= 0 then
          if in_use[a] then
            wait(vf, w, 0, nil, "InUse", ("VF %s (vf %d of %s) keeps %s: %s"):format(a, w.index, w.pf,
              short_name(card, cur, tostring(cur)), in_use[a]))
          else
            clears[#clears + 1] = { vf = vf, w = w, address = a, pf = w.pf, index = w.index, from = cur, to = 0 }
          end
        end
      elseif cur ~= 0 then
        local cur_name = vf.vgpu.typeName or card[cur]
        if cur_name == nil then
          if want_id ~= cur then
            errors[#errors + 1] = { field = w.field, address = a, reason = "UnknownType",
              message = ("VF %s carries type %d, which no creatable list of its card names; it is left as it is"):format(a, cur) }
          end
        elseif not M.profile_matches(cur_name, w.profile) then
          if want_id == nil then
            refuse(vf, w, (" (no function of %s offers it)"):format(w.pf))
          elseif in_use[a] then
            wait(vf, w, want_id, last_word(card[want_id]), "InUse",
              ("VF %s (vf %d of %s) keeps %s: %s"):format(a, w.index, w.pf, last_word(cur_name), in_use[a]))
          else
            -- the current type goes first (to 0); the new one is set next round
            clears[#clears + 1] = { vf = vf, w = w, address = a, pf = w.pf, index = w.index, from = cur, to = 0,
              to_id = want_id, cur_name = cur_name }
          end
        end
      else
        unset[#unset + 1] = { vf = vf, w = w, want_id = want_id }
      end
    end
    ::next::
  end

  -- a held VF of a GPU holds back the GPU's clears
  for _, u in ipairs(unset) do
    if in_use[u.vf.address] then pending_pf[u.w.pf] = true end
  end
  local kept = {}
  for _, c in ipairs(clears) do
    if pending_pf[c.pf] then
      local card = names[c.pf] or {}
      wait(c.vf, c.w, c.to_id or 0, c.w.profile and last_word(card[c.to_id] or c.w.profile), "WaitsForVF",
        ("VF %s (vf %d of %s) keeps %s until the held VF of the same GPU is free"):format(c.address, c.index, c.pf,
          last_word(c.cur_name or card[c.from]) or tostring(c.from)))
    else
      kept[#kept + 1] = { address = c.address, pf = c.pf, index = c.index, from = c.from, to = 0 }
    end
  end
  clears = kept

  local set_pf = {}
  for _, u in ipairs(unset) do
    local vf, w = u.vf, u.w
    local card = names[w.pf] or {}
    local id = creatable_id(vf, w.profile)
    if in_use[vf.address] then
      wait(vf, w, id or u.want_id or 0, w.profile, "InUse",
        ("VF %s (vf %d of %s) gets %s once free: %s"):format(vf.address, w.index, w.pf, w.profile, in_use[vf.address]))
    elseif id then
      if #clears == 0 and not set_pf[w.pf] then
        set_pf[w.pf] = true
        sets[#sets + 1] = { address = vf.address, pf = w.pf, index = w.index, from = 0, to = id,
          profile = short_name(card, id, w.profile) }
      end
    elseif #clears > 0 then
      -- decided after the clears of this round, on fresh creatable lists
    elseif pending_pf[w.pf] then
      wait(vf, w, u.want_id or 0, w.profile, "WaitsForVF",
        ("VF %s (vf %d of %s) cannot take %s until a held VF of the same GPU changes"):format(
          vf.address, w.index, w.pf, w.profile))
    else
      refuse(vf, w)
    end
  end

  local writes = {}
  for _, c in ipairs(clears) do writes[#writes + 1] = c end
  for _, st in ipairs(sets) do writes[#writes + 1] = st end
  return { writes = writes, pending = pending, refused = refused, errors = errors, short = short }
end

local function condition(prev_conds, ctype, status, reason, message, generation, now)
  local lt = now
  for _, c in ipairs(prev_conds or {}) do
    if c.type == ctype and c.status == status then lt = c.lastTransitionTime or now end
  end
  return { type = ctype, status = status, reason = reason, message = message,
    observedGeneration = generation, lastTransitionTime = lt }
end

local function copy(v)
  if type(v) ~= "table" then return v end
  return json.copy(v)
end

--- The GPUNode status after a pass.
--- @param a table {
---   inventory,             -- after the last round (docs/gpunode.md)
---   spec, generation,      -- GPUNode.spec and metadata.generation
---   plan,                  -- the last round's plan (M.plan)
---   writes,                -- { {address, from, to, profile, time} } done this pass
---   failures,              -- { {address, reason, message} } writes that failed
---   in_use,                -- as for plan
---   previous,              -- the GPUNode status read back (may be nil)
---   now, boot_id,          -- RFC 3339 time; /proc/sys/kernel/random/boot_id
---   unconverged }          -- true when MAX_ROUNDS rounds still had writes
--- @return table status: observedGeneration, bootID, functions (inventory
---   with `inUse` and, on GPU functions, `health`), layout {pending,
---   pendingChanges, refused, errors, lastWrites}, conditions (Healthy,
---   LayoutApplied; lastTransitionTime kept while the status is the same)
function M.status(a)
  local prev = is_table(a.previous) and a.previous or {}
  local in_use = a.in_use or {}
  local plan = a.plan or { pending = {}, refused = {}, errors = {}, short = {} }
  local now = a.now
  local functions = arr()
  local present = {}
  local unhealthy = {}
  -- names of the cards' types, kept from the last pass of this boot
  local same_boot = prev.bootID == nil or prev.bootID == a.boot_id
  local names = M.card_names(a.inventory, same_boot and prev or nil)

  for _, fn in ipairs(a.inventory and a.inventory.functions or {}) do
    present[fn.address] = true
    local f = copy(fn)
    -- a type the VF's own list no longer names: the card's name for it
    if is_table(f.vgpu) and math.type(f.vgpu.type) == "integer" and f.vgpu.type ~= 0 and f.vgpu.typeName == nil then
      local n = (names[fn.physicalFunction or fn.address] or {})[f.vgpu.type]
      if n then f.vgpu.typeName, f.vgpu.profile = n, last_word(n) end
    end
    -- a message beginning "cannot tell" is the agent failing closed (it
    -- could not read every process's fds): not known to be held
    local held = in_use[fn.address]
    if held and not tostring(held):match("^cannot tell") then f.inUse = true end
    if fn.role == "GPU" then
      local s = plan.short[fn.address]
      if not fn.driver then
        f.health = { status = "Unhealthy", reason = "DriverUnbound", message = "no driver is bound" }
      elseif s then
        f.health = { status = "Unhealthy", reason = "VFCountBelowLayout",
          message = ("the layout names %d VFs; %d are enabled"):format(s.want, s.have) }
      else
        f.health = { status = "Healthy" }
      end
      if f.health.status ~= "Healthy" then unhealthy[#unhealthy + 1] = fn.address .. ": " .. f.health.reason end
    end
    functions[#functions + 1] = f
  end
  -- functions the node had and lost (not VFs: their count is the layout's
  -- business) stay, Unhealthy, until the GPUNode is deleted (decision 0011)
  for _, old in ipairs(prev.functions or {}) do
    if not present[old.address] and not old.physicalFunction then
      local f = copy(old)
      f.inUse = nil
      if old.role == "GPU" or old.health then
        f.health = { status = "Unhealthy", reason = "Vanished", message = "the function is no longer on the PCI bus" }
        unhealthy[#unhealthy + 1] = old.address .. ": Vanished"
      end
      functions[#functions + 1] = f
    end
  end
  table.sort(functions, function(x, y) return x.address < y.address end)
  table.sort(unhealthy)

  local errors = arr()
  for _, e in ipairs(plan.errors or {}) do errors[#errors + 1] = e end
  for _, e in ipairs(a.failures or {}) do
    errors[#errors + 1] = { address = e.address, reason = e.reason or "WriteFailed", message = e.message }
  end
  if a.unconverged then
    errors[#errors + 1] = { reason = "NotConverged",
      message = ("the layout still needed writes after %d rounds"):format(M.MAX_ROUNDS) }
  end
  local pending = arr()
  for _, p in ipairs(plan.pending or {}) do pending[#pending + 1] = p end
  local refused = arr()
  for _, r in ipairs(plan.refused or {}) do refused[#refused + 1] = r end

  local last = arr()
  if a.writes and #a.writes > 0 then
    for _, w in ipairs(a.writes) do
      last[#last + 1] = { address = w.address, fromType = w.from, toType = w.to, profile = w.profile, time = w.time }
    end
  elseif prev.layout and prev.layout.lastWrites then
    for _, w in ipairs(prev.layout.lastWrites) do last[#last + 1] = copy(w) end
  end

  -- every type each present card was seen to offer this boot, so that a
  -- full card's types can still be named (M.card_names)
  local known = arr()
  for _, pf in ipairs(sorted_keys(names)) do
    local f = M.index(a.inventory)[pf]
    if f and not f.physicalFunction then
      local types = arr()
      for _, id in ipairs(sorted_keys(names[pf])) do types[#types + 1] = { id = id, name = names[pf][id] } end
      if #types > 0 then known[#known + 1] = { physicalFunction = pf, types = types } end
    end
  end

  local gen = a.generation
  local conds = arr()
  if #unhealthy == 0 then
    conds[1] = condition(prev.conditions, "Healthy", "True", "AllHealthy", "every GPU function is present and has a driver", gen, now)
  else
    conds[1] = condition(prev.conditions, "Healthy", "False", "Unhealthy", table.concat(unhealthy, "; "), gen, now)
  end
  local gpus = is_table(a.spec) and is_table(a.spec.gpus) and a.spec.gpus or {}
  if #gpus == 0 then
    conds[2] = condition(prev.conditions, "LayoutApplied", "True", "NoLayout", "no layout is declared in spec.gpus", gen, now)
  else
    local msgs = {}
    for _, e in ipairs(errors) do msgs[#msgs + 1] = e.message end
    for _, r in ipairs(refused) do msgs[#msgs + 1] = r.message end
    for _, p in ipairs(pending) do msgs[#msgs + 1] = p.message end
    local reason = #errors > 0 and "Failed" or #refused > 0 and "Refused" or #pending > 0 and "Pending" or "Applied"
    -- metav1.Condition caps message at 32768 characters; the lists above
    -- hold every detail, the condition a summary
    local msg = table.concat(msgs, "; ")
    if #msg > M.MAX_MESSAGE then
      local n, used, cut = 0, 0, {}
      for _, m in ipairs(msgs) do
        if used + #m + 2 > M.MAX_MESSAGE - 64 then break end
        cut[#cut + 1] = m
        used, n = used + #m + 2, n + 1
      end
      msg = ("%s; and %d more (status.layout)"):format(table.concat(cut, "; "), #msgs - n)
    end
    conds[2] = condition(prev.conditions, "LayoutApplied", reason == "Applied" and "True" or "False", reason,
      reason == "Applied" and "the declared layout is in place" or msg, gen, now)
  end

  return {
    observedGeneration = gen,
    bootID = a.boot_id,
    functions = functions,
    layout = { pending = #pending > 0, pendingChanges = pending, refused = refused, errors = errors, lastWrites = last,
      knownTypes = known },
    conditions = conds,
  }
end

return M
