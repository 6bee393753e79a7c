--- runtime.binder — what the leader's binder (core/controller/bind.c) asks
--- of Lua about a node: the units it offers each class and whether it can
--- take new claim sets. Pure functions over the objects the watches hold;
--- the rules are cozygpu.capacity's (docs/decisions/0022, DESIGN.md §3
--- "capacity", §6), this module only puts them into the one shape the C
--- side reads.
local capacity = require "cozygpu.capacity"
local json = require "cozygpu.json"

local M = {}

--- The binder's view of one node.
--- @param node table the core/v1 Node
--- @param gpunode table|nil its GPUNode (nil: none)
--- @param kubevirt table|nil the KubeVirt CR (nil: none)
--- @param classes table a JSON array of GPUClass objects
--- @param raw_used table|nil {[resource name] = units} used on the node by
---   running VMIs no claim covers (raw-name VMs)
--- @return table {offers = {[class] = units}, ready, schedulable,
---   layout_pending, taints = [{key, value, effect}], problems = [string]}
---   Errors (a malformed argument) are raised; the caller logs them and
---   treats the node as offering nothing.
function M.node(node, gpunode, kubevirt, classes, raw_used)
  local list = {}
  for i = 1, #classes do list[i] = classes[i] end
  local used
  if raw_used ~= nil then
    used = {}
    for k, v in pairs(raw_used) do used[k] = v end
  end
  local offers, problems = capacity.of(node, gpunode, kubevirt, list, used)
  local st = capacity.state(node, gpunode)
  local msgs = {}
  for _, p in ipairs(problems) do msgs[#msgs + 1] = p.message end
  for _, r in ipairs(st.reasons) do msgs[#msgs + 1] = r.message end
  local taints = {}
  for i, t in ipairs(st.taints) do taints[i] = t end
  return {
    offers = json.object(offers),
    ready = st.ready,
    schedulable = st.schedulable,
    layout_pending = st.layout_pending,
    taints = json.array(taints),
    problems = json.array(msgs),
  }
end

return M
