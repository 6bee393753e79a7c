--- runtime.binder — what the leader's binder (core/placement/) asks of
--- Lua: the units a node offers each class and whether it can take new
--- claim sets, a class's status, and the pin of a gated launcher pod.
--- Pure functions over the objects the watches hold; the rules are
--- cozygpu.capacity's and cozygpu.pin's (docs/decisions/0022, 0025,
--- DESIGN.md §3 "capacity", §4, §6), this module only puts them into the
--- one shape the C side reads.
local capacity = require "cozygpu.capacity"
local claims = require "cozygpu.claims"
local cluster = require "cozygpu.cluster"
local gpu = require "cozygpu.gpu"
local json = require "cozygpu.json"
local jsonpatch = require "cozygpu.jsonpatch"
local object = require "cozygpu.object"
local pin = require "cozygpu.pin"

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

--- What a GPUClass's status shows of the binder's state (DESIGN.md §3:
--- `status.free`, `status.maxFreePerNode`, nothing else, since every
--- authenticated user reads the class; docs/decisions/0030).
--- `free` is the units on the nodes a new order of the class could go to
--- now (Ready, schedulable, no layout change pending, the class's
--- tolerations covering the node's GPU taints), as the binder's index adds
--- them up; `maxFreePerNode` the largest set of the class one node can take
--- now: the most free units on one such node, cut to the class's maxCount
--- (cozygpu.gpu.max_count), since one VM takes no more of the class than
--- that. A class being deleted takes no new order: both 0.
--- @param class table the GPUClass
--- @param units table {free = integer, max_free = integer} from the index
--- @return table {free = integer, maxFreePerNode = integer}
function M.class_status(class, units)
  local free, max = units.free or 0, units.max_free or 0
  local cap = gpu.max_count(class)
  if cap and max > cap then max = cap end
  if max > free then max = free end
  return { free = free, maxFreePerNode = max }
end

--- The template claims of VMI `vmi` (DESIGN.md §3, decision 0027), as
--- cozygpu.claims.template_names gives them to the admission rules, so
--- that their names, classes and counts are computed in one place.
--- @param vmi table a VirtualMachineInstance
--- @param classes table a JSON array of GPUClass objects (kind may be absent)
--- @param kubevirt table|nil the KubeVirt CR
--- @param settings table|nil the settings (config.h shape)
--- @return table {claims = [{name, class, count}]} (empty: none), or
---   {problems = [{field, message, reason}]} when the set cannot be formed
---   (admission refuses such a VMI; the leader then gives it none)
function M.template_claims(vmi, classes, kubevirt, settings)
  local objects = {}
  for _, c in ipairs(classes or {}) do
    objects[#objects + 1] = { kind = "GPUClass", metadata = object.get(c, "metadata"), spec = object.get(c, "spec") }
  end
  if kubevirt then
    objects[#objects + 1] = { kind = "KubeVirt", metadata = object.get(kubevirt, "metadata"), spec = object.get(kubevirt, "spec") }
  end
  local set, problems = claims.template_names(vmi, cluster.new(objects, settings or json.object()))
  if not set then return { problems = problems } end
  return { claims = json.array(set) }
end

--- The required node affinity of gated launcher pod `pod` once pinned to
--- `node`: cozygpu.pin.narrow's patch applied, the same shape the webhook
--- writes at creation (decision 0025), so the pin is computed in one place.
--- @param pod table the Pod as the API server holds it
--- @param node string the node its claims are Bound on
--- @return table {affinity = the new spec.affinity}, or {problem =
---   {field, message}} when the pod cannot be narrowed safely (a shape the
---   API server would not have stored; the caller leaves it gated)
function M.pin(pod, node)
  local patch, problem = pin.narrow(pod, node)
  if not patch then return { problem = problem } end
  local pinned, err = jsonpatch.apply(pod, patch)
  if not pinned then return { problem = { field = "spec.affinity", message = err } } end
  return { affinity = object.get(pinned, "spec", "affinity") }
end

return M
