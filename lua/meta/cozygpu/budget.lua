---@meta
-- cozygpu.budget — GPU budgets of the tenant tree (lua/cozygpu/budget.lua).
--
-- Source: DESIGN.md §5 and docs/decisions/0010 (rules R1–R6 in the
-- module's header): budgets are ResourceQuota (core/v1) spec.hard keys on
-- tenant namespaces, read as Kubernetes quantities; a key on a tenant caps
-- its whole subtree; a child's key only adds a limit; no key on the tenant
-- or an ancestor means capacity only; a raw key blocks class orders until
-- the class or total key is granted there, and caps the classes behind its
-- resource name with the raw-name VMs; every existing GPUClaim counts, and
-- Running VMIs without the class-reference label count by their entries.
-- With several ResourceQuotas on one namespace the smallest value wins.
--
-- The check reads the cluster view (in the controller: the watch caches),
-- so it is best-effort (DESIGN.md §5); the leader's bind is the hard
-- guarantee.

---Why an order does not fit, for one tenant and key. For a ResourceQuota
---value that is not a whole, non-negative quantity the rule is "quantity"
---and only tenant, rule, short and message are set.
---@class cozygpu.Shortfall
---@field tenant string the tenant namespace whose key is short
---@field key string? the spec.hard key
---@field rule "R1"|"R4"|"R5"|"quantity" R1 class or total key, R4 raw key blocks class orders, R5 raw key cap
---@field limit integer? the key's value
---@field used integer? GPUs in use under the key
---@field short integer GPUs missing
---@field message string e.g. 'tenant "tenant-a": gpuclass.cozystack.io/devices is 2, none in use; 3 more is short by 1'

---One part of an order: `count` GPUs of GPUClass `class`, or of a raw
---resource name `rn` that no class carries.
---@class cozygpu.BudgetOrder
---@field class cozygpu.GPUClass? a GPUClass object (not a name)
---@field rn string? a resource name, for a raw order without a class
---@field count integer

---@class cozygpu.BudgetOptions
---@field raw boolean? the order comes from a VMI without the class-reference label: R4 does not block it
---@field claims (fun(tenant: string, want: fun(class: string): boolean): integer, table[])? the GPUs held by claims in the tenant's subtree whose class satisfies want, and their users (may be empty); replaces the walk of every GPUClaim of the view (the binder's own count, docs/decisions/0024)

---@class cozygpu.budget
---".gpuclass.cozystack.io/devices"
---@field CLASS_SUFFIX string
---The total key "gpuclass.cozystack.io/devices".
---@field TOTAL_KEY string
---"gpu.cozystack.io/class-reference" (docs/decisions/0003).
---@field CLASS_REFERENCE string
local budget = {}

---The class key of GPUClass `name`: name .. ".gpuclass.cozystack.io/devices".
---Raises when `name` is not a string.
---@param name string
---@return string
function budget.class_key(name) end

---The raw key of resource name `rn`: "requests." .. rn. Raises when `rn`
---is not a string.
---@param rn string
---@return string
function budget.raw_key(rn) end

---Checks an order — the classes one VM asks for, together — in namespace
---`ns_name` against every budget from the root down: class keys per
---class, the total key with the whole set, a raw key with every class of
---the set behind that resource name. Returns true when it fits (also when
---the set is empty, the namespace is outside the tenant tree, or not in
---the cluster view at all); else false and the shortfalls from the root
---down. A bad ResourceQuota value is a shortfall (fail closed). Raises when
---`set` is not a list or a part has no integer count.
---@param cluster cozygpu.Cluster
---@param ns_name string namespace name
---@param set cozygpu.BudgetOrder[]
---@param opts cozygpu.BudgetOptions?
---@return boolean ok
---@return cozygpu.Shortfall[]? shortfalls
function budget.check_set(cluster, ns_name, set, opts) end

---`check_set` with one part: `count` GPUs of GPUClass `class` (an object:
---cluster:gpuclass(name)).
---@param cluster cozygpu.Cluster
---@param ns_name string namespace name
---@param class cozygpu.GPUClass
---@param count integer
---@return boolean ok
---@return cozygpu.Shortfall[]? shortfalls
function budget.check(cluster, ns_name, class, count) end

return budget
