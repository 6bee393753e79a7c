-- The API server double validates owner references and collects garbage as a
-- cluster with kube-controller-manager's garbage collector does; kubectl
-- v1.32 drives it (apply, get, patch, delete --cascade=...) and curl checks
-- what kubectl cannot say (exact Status, DeleteOptions bodies). Expected
-- values come from the Kubernetes v1.32 sources, cited per case:
--   OM = k8s.io/apimachinery/pkg/api/validation/objectmeta.go
--        (ValidateOwnerReferences, validateOwnerReference, BannedOwners,
--        ValidateFinalizers), called by ValidateObjectMeta(Update) in every
--        strategy, custom resources included;
--   DO = k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go
--        (ValidateDeleteOptions), answered by
--        k8s.io/apiserver/pkg/endpoints/handlers/delete.go as NewInvalid of
--        DeleteOptions.meta.k8s.io;
--   ST = k8s.io/apiserver/pkg/registry/generic/registry/store.go (Delete,
--        deletionFinalizersForGarbageCollection, shouldOrphanDependents,
--        shouldDeleteDependents, updateForGracefulDeletionAndFinalizers);
--   GC = pkg/controller/garbagecollector/garbagecollector.go
--        (attemptToDeleteItem, isDangling, classifyReferences,
--        processDeletingDependentsItem, attemptToOrphanWorker);
--   docs = "Garbage Collection" and "Owners and Dependents" (kubernetes.io):
--        a namespaced owner must be in the dependent's namespace, else the
--        reference is treated as absent; a cluster-scoped dependent naming a
--        namespaced kind is never collected.
-- The double runs the collector synchronously after each write (see
-- double.c), so each check reads the state a client of a real cluster sees
-- once its collector ran. Every refusal and every collection here fails on
-- a double without owner references (main before this branch); the cases
-- marked "(kept)" pass on both, they pin down what must NOT be collected.
local D = require "double"
local P = require "proc"
local json = H.json

local NS, OTHER = "gc", "gc-other"

describe("kube-double: owner references and garbage collection", function()
  local d, dir

  local function file(name, obj)
    local f = dir .. "/" .. name .. ".json"
    H.write(f, json.encode(obj))
    return f
  end
  local function cm(name, refs, extra)
    local m = { name = name, namespace = NS }
    if refs then m.ownerReferences = json.array(refs) end
    for k, v in pairs(extra or {}) do m[k] = v end
    return { apiVersion = "v1", kind = "ConfigMap", metadata = m, data = { a = "1" } }
  end
  local function apply(obj)
    local out, err, code = d:kubectl { "apply", "-f", file(obj.metadata.name, obj) }
    assert.are.equal(0, code, err)
    return out
  end
  -- the object as kubectl get -o json prints it, or nil when NotFound
  local function get(kind, name, ns)
    local args = { "get", kind, name, "-o", "json" }
    if ns ~= false then args[#args + 1] = "-n"; args[#args + 1] = ns or NS end
    local out, err, code = d:kubectl(args)
    if code ~= 0 then
      assert.truthy(err:find("NotFound", 1, true), err)
      return nil
    end
    return json.decode(out)
  end
  local function owner(name, kind_, ns)
    local o = assert(get(kind_ or "configmap", name, ns))
    return o.metadata.uid
  end
  local function ref(name, uid, extra)
    local r = { apiVersion = "v1", kind = "ConfigMap", name = name, uid = uid }
    for k, v in pairs(extra or {}) do r[k] = v end
    return r
  end
  local function refused(res, lines)
    local out, err, code = res[1], res[2], res[3]
    assert.are_not.equal(0, code, "kubectl succeeded: " .. out)
    for _, l in ipairs(lines) do assert.truthy(err:find(l, 1, true), err) end
  end
  local function delete(kind, name, cascade, ns)
    local out, err, code = d:kubectl { "delete", kind, name, "-n", ns or NS, "--cascade=" .. cascade, "--wait=false" }
    assert.are.equal(0, code, err)
    return out
  end

  setup(function()
    dir = H.tmpdir()
    d = D.start()
    assert(d:kubectl { "apply", "-f", "deploy/crds" })
    for _, n in ipairs { NS, OTHER } do
      local st = d:request("POST", "/api/v1/namespaces", { apiVersion = "v1", kind = "Namespace", metadata = { name = n } })
      assert.are.equal(201, st)
    end
  end)
  teardown(function() if d then d:stop() end end)

  describe("ownerReferences validation on create and update (OM)", function()
    it("refuses a reference without a uid, naming metadata.ownerReferences.uid (validateOwnerReference)", function()
      apply(cm("v-owner"))
      refused({ d:kubectl { "apply", "-f", file("v1", cm("v1", { ref("v-owner", "") })) } },
        { 'The ConfigMap "v1" is invalid: metadata.ownerReferences.uid: Invalid value: "": uid must not be empty' })
      assert.is_nil(get("configmap", "v1"))
    end)

    it("refuses empty apiVersion, kind and name, each at its own (unindexed) field, in that order", function()
      local st, body = d:request("POST", "/api/v1/namespaces/" .. NS .. "/configmaps",
        cm("v2", { { apiVersion = "", kind = "", name = "", uid = "u-1" } }))
      assert.are.equal(422, st)
      assert.are.equal("Invalid", body.reason)
      assert.are.same({
        { field = "metadata.ownerReferences.apiVersion", reason = "FieldValueInvalid", message = 'Invalid value: "": version must not be empty' },
        { field = "metadata.ownerReferences.kind", reason = "FieldValueInvalid", message = 'Invalid value: "": kind must not be empty' },
        { field = "metadata.ownerReferences.name", reason = "FieldValueInvalid", message = 'Invalid value: "": name must not be empty' },
      }, body.details.causes)
      assert.are.equal('ConfigMap "v2" is invalid: [metadata.ownerReferences.apiVersion: Invalid value: "": version must not be empty, '
        .. 'metadata.ownerReferences.kind: Invalid value: "": kind must not be empty, '
        .. 'metadata.ownerReferences.name: Invalid value: "": name must not be empty]', body.message)
      -- "apps/" has a group and no version (schema.FromAPIVersionAndKind)
      st, body = d:request("POST", "/api/v1/namespaces/" .. NS .. "/configmaps",
        cm("v2", { { apiVersion = "apps/", kind = "Deployment", name = "x", uid = "u-1" } }))
      assert.are.equal(422, st)
      assert.are.equal('Invalid value: "apps/": version must not be empty', body.details.causes[1].message)
    end)

    it("refuses two references with controller: true on a custom resource, naming both as Kind/name", function()
      local claim = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "two", namespace = NS,
        ownerReferences = json.array {
          { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "a", uid = "u-a", controller = true },
          { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "b", uid = "u-b", controller = true },
        } }, spec = { class = "l40s", count = 1 } }
      refused({ d:kubectl { "apply", "-f", file("two", claim) } },
        { 'The GPUClaim "two" is invalid: metadata.ownerReferences: Invalid value: ',
          'Only one reference can have Controller set to true. Found "true" in references for VirtualMachineInstance/a and VirtualMachineInstance/b' })
      local st, body = d:request("POST", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims", claim)
      assert.are.equal(422, st)
      assert.are.same({ "GPUClaim", "cozystack.io", "two" }, { body.details.kind, body.details.group, body.details.name })
      assert.are.equal(1, #body.details.causes)
      local c = body.details.causes[1]
      assert.are.same({ "metadata.ownerReferences", "FieldValueInvalid" }, { c.field, c.reason })
      -- the value is the whole list in Go's %#v (pointer addresses differ in a real server)
      assert.truthy(c.message:find('^Invalid value: %[%]v1%.OwnerReference{v1%.OwnerReference{APIVersion:"kubevirt%.io/v1", '
        .. 'Kind:"VirtualMachineInstance", Name:"a", UID:"u%-a", Controller:%(%*bool%)%(0x%x+%), BlockOwnerDeletion:%(%*bool%)%(nil%)}'), c.message)
      -- one controller is fine
      claim.metadata.ownerReferences[2].controller = false
      st = d:request("POST", "/apis/cozystack.io/v1alpha1/namespaces/" .. NS .. "/gpuclaims", claim)
      assert.are.equal(201, st)
    end)

    it("refuses a core/v1 Event as an owner (BannedOwners)", function()
      local st, body = d:request("POST", "/api/v1/namespaces/" .. NS .. "/configmaps",
        cm("v3", { { apiVersion = "v1", kind = "Event", name = "e", uid = "u-e" } }))
      assert.are.equal(422, st)
      assert.are.equal("metadata.ownerReferences", body.details.causes[1].field)
      assert.are.equal('Invalid value: v1.OwnerReference{APIVersion:"v1", Kind:"Event", Name:"e", UID:"u-e", '
        .. 'Controller:(*bool)(nil), BlockOwnerDeletion:(*bool)(nil)}: /v1, Kind=Event is disallowed from being an owner',
        body.details.causes[1].message)
      -- events.k8s.io/v1 Event is another group-version-kind: allowed
      st = d:request("POST", "/api/v1/namespaces/" .. NS .. "/configmaps",
        cm("v3", { { apiVersion = "events.k8s.io/v1", kind = "Event", name = "e", uid = "u-e" } }))
      assert.are.equal(201, st)
    end)

    it("refuses the same on update: kubectl patch adding a reference without a uid (ValidateObjectMetaUpdate)", function()
      apply(cm("v4"))
      refused({ d:kubectl { "patch", "configmap", "v4", "-n", NS, "--type", "merge", "-p",
        json.encode { metadata = { ownerReferences = json.array { { apiVersion = "v1", kind = "ConfigMap", name = "v-owner", uid = "" } } } } } },
        { 'The ConfigMap "v4" is invalid: metadata.ownerReferences.uid: Invalid value: "": uid must not be empty' })
      assert.is_nil(get("configmap", "v4").metadata.ownerReferences)
    end)

    it("refuses orphan and foregroundDeletion together in metadata.finalizers (ValidateFinalizers)", function()
      refused({ d:kubectl { "apply", "-f", file("v5", cm("v5", nil, { finalizers = json.array { "orphan", "foregroundDeletion" } })) } },
        { 'metadata.finalizers: Invalid value: []string{"orphan", "foregroundDeletion"}: finalizer orphan and foregroundDeletion cannot be both set' })
    end)

    it("accepts an owner in another namespace: the API server does not check it, the collector does (docs) (kept at create)", function()
      apply(cm("x-owner"))
      local st = d:request("POST", "/api/v1/namespaces/" .. OTHER .. "/configmaps",
        { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "x-dep",
          ownerReferences = json.array { ref("x-owner", owner("x-owner")) } } })
      assert.are.equal(201, st)
    end)
  end)

  describe("DeleteOptions (DO)", function()
    it("refuses an unknown propagationPolicy, from the query and from the body, before looking the object up", function()
      local st, body = d:request("DELETE", "/api/v1/namespaces/" .. NS .. "/configmaps/nothing?propagationPolicy=Sideways")
      assert.are.equal(422, st)
      assert.are.equal('DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: "Sideways": '
        .. 'supported values: "Foreground", "Background", "Orphan", "nil"', body.message)
      assert.are.same({ "DeleteOptions", "meta.k8s.io", "" }, { body.details.kind, body.details.group, body.details.name })
      assert.are.equal("FieldValueNotSupported", body.details.causes[1].reason)
      st, body = d:request("DELETE", "/api/v1/namespaces/" .. NS .. "/configmaps/nothing",
        { kind = "DeleteOptions", apiVersion = "v1", propagationPolicy = "Orphan", orphanDependents = false })
      assert.are.equal(422, st)
      assert.are.same({ { field = "propagationPolicy", reason = "FieldValueInvalid",
        message = 'Invalid value: "Orphan": orphanDependents and deletionPropagation cannot be both set' } }, body.details.causes)
    end)
  end)

  describe("background deletion (the default; ST, GC)", function()
    it("deletes the dependents once the owner is gone", function()
      apply(cm("bg-owner"))
      local u = owner("bg-owner")
      apply(cm("bg-dep", { ref("bg-owner", u) }))
      local out = delete("configmap", "bg-owner", "background")
      assert.are.equal('configmap "bg-owner" deleted\n', out)
      assert.is_nil(get("configmap", "bg-owner"))
      assert.is_nil(get("configmap", "bg-dep"))
    end)

    it("is the default: a plain kubectl delete collects a chain owner -> child -> grandchild", function()
      apply(cm("ch-a"))
      apply(cm("ch-b", { ref("ch-a", owner("ch-a")) }))
      apply(cm("ch-c", { ref("ch-b", owner("ch-b")) }))
      local _, err, code = d:kubectl { "delete", "configmap", "ch-a", "-n", NS, "--timeout=10s" }
      assert.are.equal(0, code, err)
      assert.is_nil(get("configmap", "ch-b"))
      assert.is_nil(get("configmap", "ch-c"))
    end)

    it("honours a dependent's own finalizers: it gets a deletionTimestamp and goes when they are removed", function()
      apply(cm("fz-owner"))
      apply(cm("fz-dep", { ref("fz-owner", owner("fz-owner")) }, { finalizers = json.array { "example.com/hold" } }))
      delete("configmap", "fz-owner", "background")
      assert.is_nil(get("configmap", "fz-owner"))
      local dep = assert(get("configmap", "fz-dep"))
      assert.truthy(dep.metadata.deletionTimestamp)
      assert.are.same({ "example.com/hold" }, dep.metadata.finalizers)
      local _, err, code = d:kubectl { "patch", "configmap", "fz-dep", "-n", NS, "--type", "json", "-p",
        '[{"op":"remove","path":"/metadata/finalizers"}]' }
      assert.are.equal(0, code, err)
      assert.is_nil(get("configmap", "fz-dep"))
    end)

    it("keeps a dependent that has another live owner, and drops the dead owner's reference (classifyReferences: solid + dangling)", function()
      apply(cm("mo-a"))
      apply(cm("mo-b"))
      local ua, ub = owner("mo-a"), owner("mo-b")
      apply(cm("mo-dep", { ref("mo-a", ua), ref("mo-b", ub) }))
      delete("configmap", "mo-a", "background")
      local dep = assert(get("configmap", "mo-dep"))
      assert.are.same({ ref("mo-b", ub) }, dep.metadata.ownerReferences)
      delete("configmap", "mo-b", "background")
      assert.is_nil(get("configmap", "mo-dep"))
    end)

    it("collects the dependents of a cluster-scoped owner (a GPUClass owning a namespaced GPUClaim)", function()
      local class = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", metadata = { name = "gc-class" },
        spec = { displayName = "x", model = "L40S", mode = "Passthrough", resourceName = "nvidia.com/AD102GL_L40S" } }
      apply(class)
      local cu = owner("gc-class", "gpuclass", false)
      apply { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "gc-claim", namespace = NS,
        ownerReferences = json.array { { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", name = "gc-class", uid = cu } } },
        spec = { class = "gc-class", count = 1 } }
      assert.truthy(get("gpuclaim", "gc-claim"))
      local _, err, code = d:kubectl { "delete", "gpuclass", "gc-class", "--timeout=10s" }
      assert.are.equal(0, code, err)
      assert.is_nil(get("gpuclaim", "gc-claim"))
    end)

    it("collects template-style claims owned by a VMI when the VMI is deleted (issue 12)", function()
      apply { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", metadata = { name = "vm1", namespace = NS }, spec = {} }
      local vu = get("vmi", "vm1").metadata.uid
      for i = 1, 2 do
        apply { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim", metadata = { name = "vm1-gpu-" .. i, namespace = NS,
          ownerReferences = json.array { { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance", name = "vm1",
            uid = vu, controller = true, blockOwnerDeletion = true } } }, spec = { class = "l40s", count = 1 } }
      end
      local _, err, code = d:kubectl { "delete", "vmi", "vm1", "-n", NS, "--timeout=10s" }
      assert.are.equal(0, code, err)
      local out = d:kubectl { "get", "gpuclaims", "-n", NS, "-o", "name" }
      assert.is_nil(out:find("vm1-gpu", 1, true), out)
    end)
  end)

  describe("foreground deletion (ST, GC processDeletingDependentsItem)", function()
    it("keeps the owner with foregroundDeletion until its blocking dependents are gone", function()
      apply(cm("fg-owner"))
      local u = owner("fg-owner")
      apply(cm("fg-block", { ref("fg-owner", u, { blockOwnerDeletion = true }) }, { finalizers = json.array { "example.com/hold" } }))
      apply(cm("fg-free", { ref("fg-owner", u) }))
      delete("configmap", "fg-owner", "foreground")
      local o = assert(get("configmap", "fg-owner"))
      assert.truthy(o.metadata.deletionTimestamp)
      assert.are.same({ "foregroundDeletion" }, o.metadata.finalizers)
      -- every dependent is deleted; the blocking one is held by its own finalizer
      assert.is_nil(get("configmap", "fg-free"))
      local b = assert(get("configmap", "fg-block"))
      assert.truthy(b.metadata.deletionTimestamp)
      local _, err, code = d:kubectl { "patch", "configmap", "fg-block", "-n", NS, "--type", "merge", "-p",
        '{"metadata":{"finalizers":null}}' }
      assert.are.equal(0, code, err)
      assert.is_nil(get("configmap", "fg-block"))
      assert.is_nil(get("configmap", "fg-owner"))
    end)

    it("answers the DELETE with the owner carrying deletionTimestamp and foregroundDeletion, 202 for orphanDependents=false", function()
      apply(cm("fg2-owner"))
      apply(cm("fg2-dep", { ref("fg2-owner", owner("fg2-owner"), { blockOwnerDeletion = true }) },
        { finalizers = json.array { "example.com/hold" } }))
      local st, body = d:request("DELETE", "/api/v1/namespaces/" .. NS .. "/configmaps/fg2-owner",
        { kind = "DeleteOptions", apiVersion = "v1", orphanDependents = false })
      -- orphanDependents=false is the legacy spelling of a non-orphan delete: Background, so the owner
      -- goes at once (no finalizer to add) and the answer is the usual 200 Status
      assert.are.equal(200, st, json.encode(body))
      assert.is_nil(get("configmap", "fg2-owner"))
      assert.truthy(get("configmap", "fg2-dep").metadata.deletionTimestamp)
      -- with a finalizer of its own the owner stays, and orphanDependents=false makes it 202 (handlers/delete.go)
      apply(cm("fg3-owner", nil, { finalizers = json.array { "example.com/hold" } }))
      st, body = d:request("DELETE", "/api/v1/namespaces/" .. NS .. "/configmaps/fg3-owner",
        { kind = "DeleteOptions", apiVersion = "v1", orphanDependents = false })
      assert.are.equal(202, st, json.encode(body))
      assert.truthy(body.metadata.deletionTimestamp)
      -- Foreground through the body
      apply(cm("fg4-owner"))
      apply(cm("fg4-dep", { ref("fg4-owner", owner("fg4-owner"), { blockOwnerDeletion = true }) },
        { finalizers = json.array { "example.com/hold" } }))
      st, body = d:request("DELETE", "/api/v1/namespaces/" .. NS .. "/configmaps/fg4-owner",
        { kind = "DeleteOptions", apiVersion = "v1", propagationPolicy = "Foreground" })
      assert.are.equal(200, st)
      assert.are.same({ "foregroundDeletion" }, body.metadata.finalizers)
      assert.truthy(body.metadata.deletionTimestamp)
    end)

    it("deletes a chain child-first: the middle object goes Foreground too, since it has dependents", function()
      apply(cm("fc-a"))
      apply(cm("fc-b", { ref("fc-a", owner("fc-a"), { blockOwnerDeletion = true }) }))
      apply(cm("fc-c", { ref("fc-b", owner("fc-b"), { blockOwnerDeletion = true }) },
        { finalizers = json.array { "example.com/hold" } }))
      delete("configmap", "fc-a", "foreground")
      local a, b = assert(get("configmap", "fc-a")), assert(get("configmap", "fc-b"))
      assert.are.same({ "foregroundDeletion" }, a.metadata.finalizers)
      assert.are.same({ "foregroundDeletion" }, b.metadata.finalizers)
      assert.truthy(get("configmap", "fc-c").metadata.deletionTimestamp)
      local _, err, code = d:kubectl { "patch", "configmap", "fc-c", "-n", NS, "--type", "merge", "-p",
        '{"metadata":{"finalizers":null}}' }
      assert.are.equal(0, code, err)
      assert.is_nil(get("configmap", "fc-c"))
      assert.is_nil(get("configmap", "fc-b"))
      assert.is_nil(get("configmap", "fc-a"))
    end)

    it("ends a cycle of blocking references: the dependent's references are unblocked, then both go (GC cycle guard)", function()
      apply(cm("cy-a"))
      local ua = owner("cy-a")
      apply(cm("cy-b", { ref("cy-a", ua, { blockOwnerDeletion = true }) }))
      local ub = owner("cy-b")
      local _, err, code = d:kubectl { "patch", "configmap", "cy-a", "-n", NS, "--type", "merge", "-p",
        json.encode { metadata = { ownerReferences = json.array { ref("cy-b", ub, { blockOwnerDeletion = true }) } } } }
      assert.are.equal(0, code, err)
      local out
      out, err, code = d:kubectl { "delete", "configmap", "cy-a", "-n", NS, "--cascade=foreground", "--timeout=10s" }
      assert.are.equal(0, code, err)
      assert.are.equal('configmap "cy-a" deleted\n', out)
      assert.is_nil(get("configmap", "cy-a"))
      assert.is_nil(get("configmap", "cy-b"))
    end)

    it("a second DELETE with another policy switches the finalizer: foreground to orphan (ST updateForGracefulDeletionAndFinalizers)", function()
      apply(cm("sw-owner"))
      local u = owner("sw-owner")
      apply(cm("sw-dep", { ref("sw-owner", u, { blockOwnerDeletion = true }) }, { finalizers = json.array { "example.com/hold" } }))
      delete("configmap", "sw-owner", "foreground")
      assert.are.same({ "foregroundDeletion" }, get("configmap", "sw-owner").metadata.finalizers)
      delete("configmap", "sw-owner", "orphan")
      assert.is_nil(get("configmap", "sw-owner"))
    end)
  end)

  describe("orphan deletion (ST, GC attemptToOrphanWorker)", function()
    it("deletes the owner and leaves its dependents without that reference, other references kept", function()
      apply(cm("or-owner"))
      apply(cm("or-keep"))
      local u, k = owner("or-owner"), owner("or-keep")
      apply(cm("or-dep", { ref("or-owner", u), ref("or-keep", k) }))
      apply(cm("or-only", { ref("or-owner", u) }))
      local out = delete("configmap", "or-owner", "orphan")
      assert.are.equal('configmap "or-owner" deleted\n', out)
      assert.is_nil(get("configmap", "or-owner"))
      assert.are.same({ ref("or-keep", k) }, get("configmap", "or-dep").metadata.ownerReferences)
      local only = assert(get("configmap", "or-only"))
      assert.is_nil(only.metadata.ownerReferences)
      assert.is_nil(only.metadata.deletionTimestamp)
    end)

    it("honours an orphan finalizer put on the object beforehand, when the DELETE names no policy", function()
      apply(cm("of-owner", nil, { finalizers = json.array { "orphan" } }))
      apply(cm("of-dep", { ref("of-owner", owner("of-owner")) }))
      local _, err, code = d:kubectl { "delete", "configmap", "of-owner", "-n", NS, "--timeout=10s" }
      assert.are.equal(0, code, err)
      -- kubectl sends propagationPolicy=Background: that overrides the finalizer (shouldOrphanDependents)
      assert.is_nil(get("configmap", "of-owner"))
      assert.is_nil(get("configmap", "of-dep"))
      apply(cm("of2-owner", nil, { finalizers = json.array { "orphan" } }))
      apply(cm("of2-dep", { ref("of2-owner", owner("of2-owner")) }))
      local st = d:request("DELETE", "/api/v1/namespaces/" .. NS .. "/configmaps/of2-owner")
      assert.are.equal(200, st)
      assert.is_nil(get("configmap", "of2-owner"))
      assert.is_nil(get("configmap", "of2-dep").metadata.ownerReferences)
    end)
  end)

  describe("what watchers and kubectl --wait see", function()
    -- the ADDED/MODIFIED/DELETED events of objects named prefix*, in order, until `last` is DELETED
    local function watch_until(prefix, last, action)
      local st, list = d:request("GET", "/api/v1/namespaces/" .. NS .. "/configmaps")
      assert.are.equal(200, st)
      local w = d:watch("/api/v1/namespaces/" .. NS .. "/configmaps?resourceVersion=" .. list.metadata.resourceVersion)
      action()
      local seen
      P.wait_until(function()
        seen = {}
        local done = false
        for _, ev in ipairs(w.events()) do
          local n = ev.object.metadata.name
          if n:sub(1, #prefix) == prefix then
            seen[#seen + 1] = { ev.type, n, ev.object.metadata.finalizers and table.concat(ev.object.metadata.finalizers, ",") or "" }
            if ev.type == "DELETED" and n == last then done = true end
          end
        end
        return done
      end, 10)
      w.stop()
      return seen
    end

    it("Foreground: owner MODIFIED (foregroundDeletion), dependent DELETED, owner DELETED; kubectl delete --wait returns", function()
      apply(cm("wf-owner"))
      apply(cm("wf-dep", { ref("wf-owner", owner("wf-owner"), { blockOwnerDeletion = true }) }))
      local seen = watch_until("wf-", "wf-owner", function()
        local out, err, code = d:kubectl { "delete", "configmap", "wf-owner", "-n", NS, "--cascade=foreground", "--timeout=10s" }
        assert.are.equal(0, code, err)
        assert.are.equal('configmap "wf-owner" deleted\n', out)
      end)
      -- store.go: the update that removes the last finalizer of an object being deleted is its deletion (one DELETED event)
      assert.are.same({ { "MODIFIED", "wf-owner", "foregroundDeletion" }, { "DELETED", "wf-dep", "" },
        { "DELETED", "wf-owner", "foregroundDeletion" } }, seen)
    end)

    it("Background: owner DELETED, then the dependent", function()
      apply(cm("wb-owner"))
      apply(cm("wb-dep", { ref("wb-owner", owner("wb-owner")) }))
      local seen = watch_until("wb-", "wb-dep", function() delete("configmap", "wb-owner", "background") end)
      assert.are.same({ { "DELETED", "wb-owner", "" }, { "DELETED", "wb-dep", "" } }, seen)
    end)

    it("deletecollection takes the propagation policy too: Orphan leaves the dependents of every deleted owner", function()
      apply(cm("dc-1", nil, { labels = { set = "dc" } }))
      apply(cm("dc-2", nil, { labels = { set = "dc" } }))
      apply(cm("dc-dep", { ref("dc-1", owner("dc-1")), ref("dc-2", owner("dc-2")) }))
      local st, body = d:request("DELETE", "/api/v1/namespaces/" .. NS .. "/configmaps?labelSelector=set%3Ddc&propagationPolicy=Orphan")
      assert.are.equal(200, st, json.encode(body))
      assert.is_nil(get("configmap", "dc-1"))
      assert.is_nil(get("configmap", "dc-2"))
      local dep = assert(get("configmap", "dc-dep"))
      assert.is_nil(dep.metadata.ownerReferences)
    end)
  end)

  describe("dangling references (GC isDangling)", function()
    it("collects a dependent created after its owner is gone (the uid no longer exists)", function()
      apply(cm("late-owner"))
      local u = owner("late-owner")
      delete("configmap", "late-owner", "background")
      local out = apply(cm("late-dep", { ref("late-owner", u) }))
      assert.are.equal("configmap/late-dep created\n", out)
      assert.is_nil(get("configmap", "late-dep"))
    end)

    it("treats an owner of the same name but another uid as absent (a recreated owner)", function()
      apply(cm("re-owner"))
      local old = owner("re-owner")
      delete("configmap", "re-owner", "orphan")
      apply(cm("re-owner"))
      assert.are_not.equal(old, owner("re-owner"))
      apply(cm("re-dep", { ref("re-owner", old) }))
      assert.is_nil(get("configmap", "re-dep"))
    end)

    it("treats a namespaced owner in another namespace as absent and collects the dependent (docs)", function()
      apply(cm("xn-owner"))
      local st = d:request("POST", "/api/v1/namespaces/" .. OTHER .. "/configmaps",
        { apiVersion = "v1", kind = "ConfigMap", metadata = { name = "xn-dep",
          ownerReferences = json.array { ref("xn-owner", owner("xn-owner")) } } })
      assert.are.equal(201, st)
      assert.is_nil(get("configmap", "xn-dep", OTHER))
      assert.truthy(get("configmap", "xn-owner"))
      -- graph_builder.go reportInvalidNamespaceOwnerRef: a Warning Event about the dependent, in its
      -- namespace; objectReference.String() names the dependent's namespace, not the owner's
      local out, err, code = d:kubectl { "get", "events", "-A", "--field-selector=reason=OwnerRefInvalidNamespace,involvedObject.name=xn-dep", "-o", "json" }
      assert.are.equal(0, code, err)
      local evs = json.decode(out).items
      assert.are.equal(1, #evs, out)
      local ev = evs[1]
      assert.are.same({ OTHER, "Warning", "garbage-collector-controller", "ConfigMap", "xn-dep", OTHER },
        { ev.metadata.namespace, ev.type, ev.source.component, ev.involvedObject.kind, ev.involvedObject.name,
          ev.involvedObject.namespace })
      assert.are.equal(('ownerRef [v1/ConfigMap, namespace: %s, name: xn-owner, uid: %s] does not exist in namespace "%s"')
        :format(OTHER, owner("xn-owner"), OTHER), ev.message)
    end)

    it("never collects a cluster-scoped dependent naming a namespaced kind (namespacedOwnerOfClusterScopedObjectErr) (kept)", function()
      apply { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", metadata = { name = "cs-dep",
        ownerReferences = json.array { ref("gone", "no-such-uid") } },
        spec = { displayName = "x", model = "L40S", mode = "Passthrough", resourceName = "nvidia.com/AD102GL_L40S" } }
      assert.truthy(get("gpuclass", "cs-dep", false))
    end)

    it("reports a cluster-scoped dependent naming an existing namespaced owner, in namespace default, and keeps it", function()
      apply(cm("cs-owner"))
      local u = owner("cs-owner")
      apply { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", metadata = { name = "cs-dep2",
        ownerReferences = json.array { ref("cs-owner", u) } },
        spec = { displayName = "x", model = "L40S", mode = "Passthrough", resourceName = "nvidia.com/AD102GL_L40S" } }
      assert.truthy(get("gpuclass", "cs-dep2", false))
      local out, err, code = d:kubectl { "get", "events", "-n", "default", "--field-selector=reason=OwnerRefInvalidNamespace,involvedObject.name=cs-dep2", "-o", "json" }
      assert.are.equal(0, code, err)
      local evs = json.decode(out).items
      assert.are.equal(1, #evs, out)
      assert.are.same({ "GPUClass", "cs-dep2", nil }, { evs[1].involvedObject.kind, evs[1].involvedObject.name, evs[1].involvedObject.namespace })
      assert.are.equal(('ownerRef [v1/ConfigMap, namespace: , name: cs-owner, uid: %s] does not exist in namespace ""'):format(u),
        evs[1].message)
    end)

    it("never collects a dependent whose owner kind the server does not serve (restMappingError, retried) (kept)", function()
      apply(cm("um-dep", { { apiVersion = "example.com/v1", kind = "Widget", name = "w", uid = "no-such-uid" } }))
      assert.truthy(get("configmap", "um-dep"))
    end)
  end)
end)
