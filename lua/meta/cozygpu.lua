---@meta _
-- Editor stubs for the policy environment: the globals every policy file
-- sees, and the shapes shared by the library modules. Not loaded at run
-- time; the reference is docs/policy-api.md. One stub file per library
-- module sits in lua/meta/cozygpu/ (require "cozygpu.<name>").
--
-- Error conventions (STYLE.md "Three error conventions"): misuse by the
-- caller raises; a failure of the world (a patch that does not apply, a
-- quantity that is not a number) returns nil and a message; a verdict is a
-- plain return value. Each function below says which applies.
--
-- An error a rule does not catch refuses the request with code 500,
-- naming the rule and the file and line (docs/decisions/0001).

-- ---- shapes ----------------------------------------------------------------

---A Kubernetes object as JSON decodes it: tables for objects and arrays,
---`json.null` for null, absent fields are nil. Objects a policy receives
---(`req.object`, everything the cluster view returns) are read-only views:
---assigning to them raises "attempt to modify a read-only value".
---@alias cozygpu.Object table

---`kind` and `resource` of an AdmissionRequest (meta/v1 GroupVersionKind,
---GroupVersionResource). The core group is "".
---@class cozygpu.GroupVersionKind
---@field group string e.g. "kubevirt.io", "" for Pods
---@field version string e.g. "v1"
---@field kind string e.g. "VirtualMachineInstance"

---@class cozygpu.GroupVersionResource
---@field group string
---@field version string
---@field resource string e.g. "virtualmachineinstances"

---The requesting user as the API server authenticated it
---(authentication/v1 UserInfo).
---@class cozygpu.UserInfo
---@field username string
---@field uid string?
---@field groups string[]?
---@field extra table<string,string[]>?

---The AdmissionRequest (admission.k8s.io/v1), read-only. `cozygpu review`
---and `cozygpu policy test` wrap a plain object as a CREATE by the user
---`kubernetes-admin` (or --user / `user:`) in the groups
---["system:authenticated"] (or --group / `groups:`), and judge a
---VirtualMachine as the VirtualMachineInstance its template creates
---(docs/decisions/0005). During mutation `object` is the object with the
---patches of the earlier mutating rules applied.
---@class cozygpu.Request
---@field uid string
---@field kind cozygpu.GroupVersionKind
---@field resource cozygpu.GroupVersionResource
---@field subResource string?
---@field operation "CREATE"|"UPDATE"|"DELETE"|"CONNECT"
---@field namespace string? nil for a cluster-scoped object (GPUClass, Node, Namespace)
---@field name string? nil when the object has only metadata.generateName
---@field userInfo cozygpu.UserInfo
---@field object cozygpu.Object? the new object (nil on DELETE)
---@field oldObject cozygpu.Object? the old object (UPDATE, DELETE)
---@field options table? CreateOptions, UpdateOptions or DeleteOptions
---@field dryRun boolean?

---A verdict of a validate hook, made by `deny` or `warn`.
---@class cozygpu.Verdict
---@field verdict "deny"|"warn"
---@field message string
---@field field string? deny only: the field path the refusal is about
---@field code integer? deny only: the HTTP status code, 400..499

---Options of `deny`.
---@class cozygpu.DenyOptions
---@field field string? field path, e.g. "spec.tolerations[2].operator"; the refusal message becomes "<field>: <message>"
---@field code integer? HTTP status code 400..499; default 403 (Forbidden); 422 for an invalid object

---What a rule matches: each field absent means "any". Compared with the
---request's `kind.kind`, `kind.group` and `operation`.
---@class cozygpu.Match
---@field kind (string|string[])?
---@field group (string|string[])? "" is the core group (Pods)
---@field operations (("CREATE"|"UPDATE"|"DELETE"|"CONNECT")|("CREATE"|"UPDATE"|"DELETE"|"CONNECT")[])?

---@alias cozygpu.ValidateResult nil|cozygpu.Verdict|cozygpu.Verdict[]
---@alias cozygpu.MutateResult nil|cozygpu.Patch|cozygpu.PatchOp[]

---The table `rule "name"` takes.
---@class cozygpu.RuleSpec
---@field match (cozygpu.Match|fun(req: cozygpu.Request, cluster: cozygpu.Cluster): boolean)?
---@field validate (fun(req: cozygpu.Request, cluster: cozygpu.Cluster): cozygpu.ValidateResult)?
---@field mutate (fun(req: cozygpu.Request, cluster: cozygpu.Cluster): cozygpu.MutateResult)?
---@field description string?

---A declared rule; a policy file returns one or a list of them.
---@class cozygpu.Rule
---@field name string
---@field description string?
---@field match (cozygpu.Match|function)?
---@field validate function?
---@field mutate function?

-- ---- globals ---------------------------------------------------------------

---Declares a rule: `rule "site/name" { match = ..., validate = fn, mutate = fn }`.
---Raises when `name` is not a string of letters, digits, '-', '.', '_' or
---'/' starting with a letter or digit; the function it returns raises on a
---spec that is not a table, an unknown field, a hook that is not a
---function, neither hook, an unknown `match` field or operation. A name
---declared twice in the bundle fails the bundle's load.
---Source: lua/cozygpu/policy.lua; DESIGN.md §9.
---@param name string
---@return fun(spec: cozygpu.RuleSpec): cozygpu.Rule
function rule(name) end

---What `binder { choose = ... }` takes (policies/binder.lua only).
---@class cozygpu.BinderSpec
---@field choose fun(set: cozygpu.BinderSet, candidates: cozygpu.BinderCandidate[], cluster: cozygpu.Cluster): integer?
---@field description string?

---One claim of a set handed to the binder's chooser.
---@class cozygpu.BinderClaim
---@field name string
---@field class string
---@field count integer
---@field phase "Pending"|"Bound"|"Attached"|"Lost"
---@field node string? status.node before this bind

---A claim set: every claim one VM names (they go to one node), or a lone claim.
---@class cozygpu.BinderSet
---@field namespace string
---@field vm string? nil for a lone claim
---@field claims cozygpu.BinderClaim[]

---Units of one class on a candidate node, before the set is placed.
---@class cozygpu.BinderUnits
---@field offered integer
---@field bound integer
---@field free integer

---A candidate node: Ready, schedulable, no pending layout, its GPU taints
---tolerated, room for every class of the set (checked in C).
---@class cozygpu.BinderCandidate
---@field node string
---@field classes table<string, cozygpu.BinderUnits> the set's classes only
---@field labels table<string, string> the Node's metadata.labels (empty when unknown)

---A declared binder policy.
---@class cozygpu.Binder
---@field choose function
---@field description string?

---Declares the binder policy: `return binder { choose = function(set,
---candidates, cluster) ... end }`, the one value `binder.lua` returns.
---`choose` returns the position (1..#candidates) of the node the set goes
---to, or nil for none this pass (the set waits, reason NoNodeWithRoom).
---Candidates come in the index's packing order (most-allocated first).
---A chooser that raises, returns anything else, or runs out of its
---budget falls back to that order (docs/decisions/0024). Raises on a spec
---that is not a table, an unknown field, or choose not a function.
---Source: lua/cozygpu/policy.lua; DESIGN.md §6, §9.
---@param spec cozygpu.BinderSpec
---@return cozygpu.Binder
function binder(spec) end

---A refusal. Several refusals (of one rule or several) join into one
---message "field: message; ..." in rule order; the response's code is the
---first refusal's. Raises when `message` is not a string or `opts.code` is
---not an integer from 400 to 499 (500 is what a failed policy answers).
---Source: lua/cozygpu/policy.lua; docs/decisions/0001; metav1.Status
---reasons (403 Forbidden, 422 Invalid).
---@param message string
---@param opts cozygpu.DenyOptions?
---@return cozygpu.Verdict
function deny(message, opts) end

---An admission warning: the request stays allowed and the client shows the
---message (AdmissionResponse.warnings; kubectl prints "Warning: ...").
---Raises when `message` is not a string.
---Source: lua/cozygpu/policy.lua.
---@param message string
---@return cozygpu.Verdict
function warn(message) end

---The JSON helpers, `require "cozygpu.json"` (lua/meta/cozygpu/json.lua).
json = require "cozygpu.json"

---The GPU helpers, `require "cozygpu.gpu"` (lua/meta/cozygpu/gpu.lua).
gpu = require "cozygpu.gpu"

---JSON Patch building and applying, `require "cozygpu.jsonpatch"`
---(lua/meta/cozygpu/jsonpatch.lua).
patch = require "cozygpu.jsonpatch"
