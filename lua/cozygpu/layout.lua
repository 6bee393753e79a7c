--- cozygpu.layout — the node agent's decisions: which vGPU type each VF
--- gets from the declared layout, what waits, what is refused, and the
--- GPUNode status (DESIGN.md §3 GPUNode, §7; docs/decisions/0011).
---
--- Pure functions over plain tables: the C agent (`core/agent.c`) reads the
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

--- Most rounds of writes in one pass (decision 0011): clear, then set, and
--- room for a set that waited on a sibling's clear.
M.MAX_ROUNDS = 4

local function arr(t) return json.array(t or {}) end

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
--- @return table<string, table>
function M.index(inventory)
  local idx = {}
  for _, fn in ipairs(inventory and inventory.functions or {}) do idx[fn.address] = fn end
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

-- The id of `wanted` on the card of PF `pf`: ids are unique per physical
-- card only (LAYOUT §5), so look at the PF and all its VFs.
local function card_id(idx, pf, wanted)
  local fns = { pf }
  for _, a in ipairs(pf.virtualFunctions or {}) do fns[#fns + 1] = idx[a] end
  for _, fn in ipairs(fns) do
    local id = fn and creatable_id(fn, wanted)
    if id then return id end
  end
  return nil
end

local function creatable_names(vf)
  local out = {}
  for _, row in ipairs(vf.vgpu and vf.vgpu.creatable or {}) do out[#out + 1] = last_word(row.name) or row.name end
  return out
end

--- What the layout wants, per VF of each listed GPU, and what it cannot
--- act on.
--- @return table wants     { [vf address] = {pf, index, profile|nil, field} }
--- @return table errors    { {field, address, reason, message} }
--- @return table short     { [pf address] = {want = n, have = m} } (VFs missing)
function M.desired(inventory, spec)
  local idx = M.index(inventory)
  local wants, errors, short = {}, {}, {}
  for i, g in ipairs(spec and spec.gpus or {}) do
    local field = ("spec.gpus[%d]"):format(i - 1)
    local fn = idx[g.address]
    if not fn then
      errors[#errors + 1] = { field = field .. ".address", address = g.address, reason = "NoSuchGPU",
        message = ("%s: no NVIDIA PCI function %s on this node"):format(field, tostring(g.address)) }
    elseif fn.physicalFunction or fn.role ~= "GPU" then
      errors[#errors + 1] = { field = field .. ".address", address = g.address, reason = "NotAGPU",
        message = ("%s: %s is %s, not a GPU's physical function"):format(field, g.address,
          fn.physicalFunction and ("a VF of " .. fn.physicalFunction) or ("a " .. tostring(fn.role) .. " function")) }
    else
      local need = g.mode == "Passthrough" and "vfio-pci" or "nvidia"
      if fn.driver ~= need then
        errors[#errors + 1] = { field = field .. ".mode", address = g.address, reason = "DriverMismatch",
          message = ("%s: %s is bound to %s; mode %s needs %s (the agent does not rebind drivers)"):format(
            field, g.address, fn.driver or "no driver", tostring(g.mode), need) }
      end
      local per = {}
      local top = -1
      if g.mode == "VGPU" then
        if g.profile and g.count then
          for k = 0, g.count - 1 do per[k] = { profile = g.profile, field = field .. ".profile" } end
        end
        for j, v in ipairs(g.vfs or {}) do
          per[v.index] = { profile = (v.profile ~= "" and v.profile) or nil, field = ("%s.vfs[%d]"):format(field, j - 1) }
        end
        for k, p in pairs(per) do if p.profile and k > top then top = k end end
      end
      local vfs = fn.virtualFunctions or {}
      if top >= #vfs then short[fn.address] = { want = top + 1, have = #vfs } end
      for k, a in ipairs(vfs) do
        local p = per[k - 1]
        wants[a] = { pf = fn.address, index = k - 1, profile = p and p.profile, field = p and p.field or field }
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

--- One round of the plan: what to write now, what waits, what is refused.
--- Clears come first; while any clear is written this round, sets wait for
--- the next round (the creatable lists change once a type is removed).
--- A VF a process holds is never written (DESIGN §7): its change is
--- pending. A profile the VF cannot take is refused, naming the creatable
--- ones, unless a sibling VF of the same GPU has a pending change (then it
--- waits for that VF: its capacity may be what is missing).
--- @return table { writes = { {address, pf, index, from, to, profile} },
---   pending = { {address, physicalFunction, vfIndex, fromType, toType,
---   fromProfile, toProfile, reason, message} }, refused = { {address,
---   physicalFunction, vfIndex, profile, creatable, message} },
---   errors = {...}, short = {...} }
function M.plan(inventory, spec, in_use)
  in_use = in_use or {}
  local idx = M.index(inventory)
  local wants, errors, short = M.desired(inventory, spec)
  local clears, sets, pending, refused, unset = {}, {}, {}, {}, {}
  local pending_pf = {}

  local function wait(vf, w, to, to_profile, reason, message)
    pending[#pending + 1] = { address = vf.address, physicalFunction = w.pf, vfIndex = w.index,
      fromType = vf.vgpu.type or 0, toType = to, fromProfile = vf.vgpu.profile, toProfile = to_profile,
      reason = reason, message = message }
    pending_pf[w.pf] = true
  end

  for _, a in ipairs(sorted_keys(wants)) do
    local w, vf = wants[a], idx[a]
    if not vf then goto next end
    if not vf.vgpu then
      if w.profile then
        errors[#errors + 1] = { field = w.field, address = a, reason = "NoVGPUSupport",
          message = ("%s: VF %s has no nvidia/ directory (is the NVIDIA vGPU host driver bound?)"):format(w.field, a) }
      end
      goto next
    end
    do
      local cur = vf.vgpu.type or 0
      local ok = false
      if w.profile == nil then
        ok = cur == 0
      elseif cur ~= 0 then
        ok = M.profile_matches(vf.vgpu.typeName, w.profile) or card_id(idx, idx[w.pf], w.profile) == cur
      end
      if not ok then
        if cur ~= 0 then
          -- the current type must go first (to 0), then the new one is set
          if in_use[a] then
            wait(vf, w, w.profile and (card_id(idx, idx[w.pf], w.profile) or 0) or 0, w.profile, "InUse",
              ("VF %s (vf %d of %s) keeps %s: %s"):format(a, w.index, w.pf, vf.vgpu.profile or tostring(cur), in_use[a]))
          else
            clears[#clears + 1] = { address = a, pf = w.pf, index = w.index, from = cur, to = 0, profile = w.profile }
          end
        else
          unset[#unset + 1] = { vf = vf, w = w }
        end
      end
    end
    ::next::
  end

  for _, u in ipairs(unset) do
    local vf, w = u.vf, u.w
    local id = creatable_id(vf, w.profile)
    if in_use[vf.address] then
      wait(vf, w, id or card_id(idx, idx[w.pf], w.profile) or 0, w.profile, "InUse",
        ("VF %s (vf %d of %s) gets %s once free: %s"):format(vf.address, w.index, w.pf, w.profile, in_use[vf.address]))
    elseif id then
      if #clears == 0 then
        sets[#sets + 1] = { address = vf.address, pf = w.pf, index = w.index, from = 0, to = id, profile = w.profile }
      end
    elseif #clears > 0 then
      -- decided after the clears of this round, on fresh creatable lists
    elseif pending_pf[w.pf] then
      wait(vf, w, card_id(idx, idx[w.pf], w.profile) or 0, w.profile, "WaitsForVF",
        ("VF %s (vf %d of %s) cannot take %s until a held VF of the same GPU changes"):format(
          vf.address, w.index, w.pf, w.profile))
    else
      local names = creatable_names(vf)
      refused[#refused + 1] = { address = vf.address, physicalFunction = w.pf, vfIndex = w.index,
        profile = w.profile, creatable = arr(names),
        message = ("VF %s (vf %d of %s) cannot take profile %s; creatable: %s"):format(vf.address, w.index, w.pf,
          w.profile, #names > 0 and table.concat(names, ", ") or "none") }
    end
  end

  local writes = {}
  for _, c in ipairs(clears) do writes[#writes + 1] = c end
  for _, s in ipairs(sets) do writes[#writes + 1] = s end
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
  local prev = a.previous or {}
  local in_use = a.in_use or {}
  local plan = a.plan or { pending = {}, refused = {}, errors = {}, short = {} }
  local now = a.now
  local functions = arr()
  local present = {}
  local unhealthy = {}

  for _, fn in ipairs(a.inventory and a.inventory.functions or {}) do
    present[fn.address] = true
    local f = copy(fn)
    if in_use[fn.address] then f.inUse = true end
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

  local gen = a.generation
  local conds = arr()
  if #unhealthy == 0 then
    conds[1] = condition(prev.conditions, "Healthy", "True", "AllHealthy", "every GPU function is present and has a driver", gen, now)
  else
    conds[1] = condition(prev.conditions, "Healthy", "False", "Unhealthy", table.concat(unhealthy, "; "), gen, now)
  end
  local gpus = a.spec and a.spec.gpus or {}
  if #gpus == 0 then
    conds[2] = condition(prev.conditions, "LayoutApplied", "True", "NoLayout", "no layout is declared in spec.gpus", gen, now)
  else
    local msgs = {}
    for _, e in ipairs(errors) do msgs[#msgs + 1] = e.message end
    for _, r in ipairs(refused) do msgs[#msgs + 1] = r.message end
    for _, p in ipairs(pending) do msgs[#msgs + 1] = p.message end
    local reason = #errors > 0 and "Failed" or #refused > 0 and "Refused" or #pending > 0 and "Pending" or "Applied"
    conds[2] = condition(prev.conditions, "LayoutApplied", reason == "Applied" and "True" or "False", reason,
      reason == "Applied" and "the declared layout is in place" or table.concat(msgs, "; "), gen, now)
  end

  return {
    observedGeneration = gen,
    bootID = a.boot_id,
    functions = functions,
    layout = { pending = #pending > 0, pendingChanges = pending, refused = refused, errors = errors, lastWrites = last },
    conditions = conds,
  }
end

return M
