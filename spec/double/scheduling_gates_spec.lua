-- The API server double keeps the Pod scheduling-gate rules that cozygpu's
-- binder relies on, as kube-apiserver v1.32 has them; kubectl v1.32 drives
-- it (patch of each type, apply, replace, create) and curl reads the exact
-- Status. Expected values come from the Kubernetes sources, cited per case
-- (k8s.io/kubernetes v1.32 unless said):
--   V  = pkg/apis/core/validation/validation.go (ValidatePodCreate,
--        validateSchedulingGates, ValidatePodUpdate and its helpers
--        validateOnlyDeletedSchedulingGates, validateOnlyAddedTolerations,
--        validateNodeSelectorMutation, validateNodeAffinityMutation,
--        validateNodeSelectorTermHasOnlyAdditions, updatablePodSpecFields);
--   S  = pkg/registry/core/pod/strategy.go (PrepareForCreate,
--        applySchedulingGatedCondition);
--   FE = staging/src/k8s.io/apimachinery/pkg/util/validation/field/errors.go
--        (ErrorBody: %q for strings, Go's %#v of the internal type for maps
--        and structs), and NewInvalid in .../pkg/api/errors/errors.go
--        (`Kind "name" is invalid: E` or `[E1, E2]`, one cause per error);
--   KEP-3521 (pod scheduling readiness), KEP-3838 (mutable scheduling
--        directives for gated pods, "only additions" to nodeSelector and to
--        the terms of required node affinity while the pod is gated).
-- Every refusal here is accepted by a double without these rules.
local D = require "double"
local json = H.json

local NS = "gates"
local PODS = "/api/v1/namespaces/" .. NS .. "/pods"
local GATE = "gpu.cozystack.io/claims"
local OTHER = "example.com/quota"
local UPDATABLE = "pod updates may not change fields other than `spec.containers[*].image`,"
  .. "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
  .. "`spec.tolerations` (only additions to existing tolerations),"
  .. "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
local TERMS = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"

local function pod(name, spec)
  spec.containers = spec.containers or { { name = "c", image = "busybox" } }
  return { apiVersion = "v1", kind = "Pod", metadata = { name = name, namespace = NS }, spec = spec }
end

local function gates(...)
  local g = json.array()
  for _, n in ipairs { ... } do g[#g + 1] = { name = n } end
  return g
end

local function required(terms)
  return { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = terms } } }
end

local function expr(key, op, values)
  return { key = key, operator = op, values = values }
end

-- The Status NewInvalid builds from causes {field, reason, message}.
local function invalid(name, causes)
  local texts = {}
  for i, c in ipairs(causes) do texts[i] = c[1] .. ": " .. c[3] end
  local msg = #texts == 1 and texts[1] or ("[" .. table.concat(texts, ", ") .. "]")
  local out = json.array()
  for i, c in ipairs(causes) do out[i] = { field = c[1], reason = c[2], message = c[3] } end
  return { code = 422, reason = "Invalid", message = ('Pod "%s" is invalid: %s'):format(name, msg),
    kind = "Pod", name = name, causes = out }
end

local function status_of(st, body)
  return { code = st, reason = body.reason, message = body.message, kind = body.details and body.details.kind,
    name = body.details and body.details.name, causes = body.details and body.details.causes }
end

describe("kube-double: pod scheduling gates", function()
  local d, dir

  local function create(p)
    local st, body = d:request("POST", PODS, p)
    assert.are.equal(201, st, json.encode(body))
    return body
  end
  local function get(name)
    local st, body = d:request("GET", PODS .. "/" .. name)
    assert.are.equal(200, st)
    return body
  end
  local function patch(name, ptype, p)
    return d:kubectl { "patch", "pod", name, "-n", NS, "--type", ptype, "-p", type(p) == "string" and p or json.encode(p) }
  end
  local function file(name, obj)
    local f = dir .. "/" .. name .. ".json"
    H.write(f, json.encode(obj))
    return f
  end
  -- kubectl refused the write and printed each cause as `field: message`
  local function refused(res, causes)
    local out, err, code = res[1], res[2], res[3]
    assert.are_not.equal(0, code, "kubectl succeeded: " .. out)
    assert.truthy(err:find("is invalid", 1, true), err)
    for _, c in ipairs(causes) do assert.truthy(err:find(c[1] .. ": " .. c[3], 1, true), err) end
  end

  setup(function()
    dir = H.tmpdir()
    d = D.start()
    local st = d:request("POST", "/api/v1/namespaces", { apiVersion = "v1", kind = "Namespace", metadata = { name = NS } })
    assert.are.equal(201, st)
  end)
  teardown(function() if d then d:stop() end end)

  describe("create", function()
    it("gives a gated pod PodScheduled=False, reason SchedulingGated, and no node (S)", function()
      local out, err, code = d:kubectl { "apply", "-f", file("c1", pod("c1", { schedulingGates = gates(GATE) })) }
      assert.are.equal(0, code, err)
      assert.are.equal("pod/c1 created\n", out)
      local p = get("c1")
      assert.is_nil(p.spec.nodeName)
      assert.are.equal("Pending", p.status.phase)
      assert.are.equal(1, #p.status.conditions)
      local c = p.status.conditions[1]
      assert.are.same({ "PodScheduled", "False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates" },
        { c.type, c.status, c.reason, c.message })
      assert.are.equal(json.null, c.lastProbeTime)
      -- set through podutil.UpdatePodCondition since v1.30 (PR 122636)
      assert.truthy(c.lastTransitionTime:match("^%d+%-%d+%-%d+T%d+:%d+:%d+Z$"), c.lastTransitionTime)
      out = d:kubectl { "get", "pod", "c1", "-n", NS, "-o", "jsonpath={.status.conditions[0].reason}" }
      assert.are.equal("SchedulingGated", out)
    end)

    it("gives a pod without gates no condition (S: applySchedulingGatedCondition returns early)", function()
      local p = create(pod("c2", {}))
      assert.are.same({ phase = "Pending" }, p.status)
    end)

    it("refuses a gated pod that names a node (V: ValidatePodCreate)", function()
      local p = pod("c3", { schedulingGates = gates(GATE), nodeName = "n1" })
      local causes = { { "spec.nodeName", "FieldValueForbidden", "Forbidden: cannot be set until all schedulingGates have been cleared" } }
      refused({ d:kubectl { "create", "-f", file("c3", p) } }, causes)
      local st, body = d:request("POST", PODS, p)
      assert.are.same(invalid("c3", causes), status_of(st, body))
      assert.are.equal(404, (d:request("GET", PODS .. "/c3")))
    end)

    it("refuses duplicate gates and gate names that are not qualified names (V: validateSchedulingGates)", function()
      local p = pod("c4", { schedulingGates = gates(GATE, "bad gate", GATE) })
      local causes = {
        { "spec.schedulingGates[1]", "FieldValueInvalid", 'Invalid value: "bad gate": name part must consist of alphanumeric '
          .. "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or "
          .. "'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')" },
        { "spec.schedulingGates[2]", "FieldValueDuplicate", 'Duplicate value: "gpu.cozystack.io/claims"' },
      }
      refused({ d:kubectl { "apply", "-f", file("c4", p) } }, causes)
      local st, body = d:request("POST", PODS, p)
      assert.are.same(invalid("c4", causes), status_of(st, body))
    end)
  end)

  describe("gates on update (V: validateOnlyDeletedSchedulingGates)", function()
    local function added(i, name)
      return { ("spec.schedulingGates[%d].name"):format(i), "FieldValueForbidden",
        ("Forbidden: only deletion is allowed, but found new scheduling gate '%s'"):format(name) }
    end

    it("refuses a gate added by a merge patch", function()
      create(pod("u1", { schedulingGates = gates(GATE) }))
      local p = { spec = { schedulingGates = gates(GATE, OTHER) } }
      refused({ patch("u1", "merge", p) }, { added(1, OTHER) })
      local st, body = d:request("PATCH", PODS .. "/u1", p)
      assert.are.same(invalid("u1", { added(1, OTHER) }), status_of(st, body))
      assert.are.same(gates(GATE), get("u1").spec.schedulingGates)
    end)

    it("refuses a gate renamed by a JSON patch", function()
      create(pod("u2", { schedulingGates = gates(GATE, OTHER) }))
      local p = { { op = "replace", path = "/spec/schedulingGates/0/name", value = "example.com/renamed" } }
      refused({ patch("u2", "json", p) }, { added(0, "example.com/renamed") })
      local st, body = d:request("PATCH", PODS .. "/u2", p, "application/json-patch+json")
      assert.are.same(invalid("u2", { added(0, "example.com/renamed") }), status_of(st, body))
    end)

    it("merges a strategic patch's gates by name, so a new name is an addition (kubectl patch's default type)", function()
      create(pod("u3", { schedulingGates = gates(GATE) }))
      -- schedulingGates: patchStrategy merge, patchMergeKey name (k8s.io/api/core/v1/types.go)
      refused({ patch("u3", "strategic", { spec = { schedulingGates = gates(OTHER) } }) }, { added(1, OTHER) })
      local out, err, code = patch("u3", "strategic", { spec = { schedulingGates = gates(GATE) } })
      assert.are.equal(0, code, err)
      assert.are.equal("pod/u3 patched (no change)\n", out)
    end)

    it("refuses a gate added by kubectl replace (PUT)", function()
      local p = create(pod("u4", { schedulingGates = gates(GATE) }))
      p.spec.schedulingGates = gates(OTHER, GATE)
      refused({ d:kubectl { "replace", "-f", file("u4", p) } }, { added(0, OTHER) })
    end)

    it("lets kubectl apply remove a gate, keeps the others, and drops the list with the last one", function()
      local p = pod("u5", { schedulingGates = gates(GATE, OTHER) })
      local out, err, code = d:kubectl { "apply", "-f", file("u5", p) }
      assert.are.equal(0, code, err)
      p.spec.schedulingGates = gates(GATE)
      -- the client sends $setElementOrder/schedulingGates and {"$patch":"delete","name":OTHER}
      out, err, code = d:kubectl { "apply", "-f", file("u5", p) }
      assert.are.equal(0, code, err)
      assert.are.equal("pod/u5 configured\n", out)
      assert.are.same(gates(GATE), get("u5").spec.schedulingGates)
      out, err, code = patch("u5", "json", { { op = "remove", path = "/spec/schedulingGates/0" } })
      assert.are.equal(0, code, err)
      local g = get("u5")
      assert.is_nil(g.spec.schedulingGates)   -- omitempty: an empty list is not stored
      assert.is_nil(g.spec.nodeName)          -- no scheduler runs in the double
      assert.are.equal("SchedulingGated", g.status.conditions[1].reason)
    end)

    it("allows reordering the gates", function()
      create(pod("u6", { schedulingGates = gates(GATE, OTHER) }))
      local out, err, code = patch("u6", "merge", { spec = { schedulingGates = gates(OTHER, GATE) } })
      assert.are.equal(0, code, err)
      assert.are.same(gates(OTHER, GATE), get("u6").spec.schedulingGates)
    end)

    it("refuses a gate on a pod whose gates are gone", function()
      create(pod("u7", {}))
      refused({ patch("u7", "merge", { spec = { schedulingGates = gates(GATE) } }) }, { added(0, GATE) })
    end)
  end)

  describe("scheduling directives of a gated pod (KEP-3838; V: ValidatePodUpdate)", function()
    it("may gain nodeSelector entries, not change or lose one (validateNodeSelectorMutation, FE: %#v of the new map)", function()
      create(pod("g1", { schedulingGates = gates(GATE), nodeSelector = { a = "b" } }))
      local out, err, code = patch("g1", "merge", { spec = { nodeSelector = { c = "d" } } })
      assert.are.equal(0, code, err)
      assert.are.same({ a = "b", c = "d" }, get("g1").spec.nodeSelector)
      local changed = { { "spec.nodeSelector", "FieldValueInvalid", 'Invalid value: map[string]string{"a":"z", "c":"d"}: '
        .. "only additions to spec.nodeSelector are allowed (no mutations or deletions)" } }
      refused({ patch("g1", "merge", { spec = { nodeSelector = { a = "z" } } }) }, changed)
      local st, body = d:request("PATCH", PODS .. "/g1", { spec = { nodeSelector = { a = "z" } } })
      assert.are.same(invalid("g1", changed), status_of(st, body))
      refused({ patch("g1", "json", { { op = "remove", path = "/spec/nodeSelector/a" } }) }, { { "spec.nodeSelector",
        "FieldValueInvalid", 'Invalid value: map[string]string{"c":"d"}: only additions to spec.nodeSelector are allowed (no mutations or deletions)' } })
    end)

    it("may get a required node affinity when it has none (validateNodeAffinityMutation: old nil)", function()
      create(pod("g2", { schedulingGates = gates(GATE) }))
      local out, err, code = patch("g2", "strategic", { spec = { affinity = required { { matchExpressions = { expr("gpu", "In", { "n1" }) } } } } })
      assert.are.equal(0, code, err)
      assert.are.same(required { { matchExpressions = { expr("gpu", "In", { "n1" }) } } }, get("g2").spec.affinity)
    end)

    it("may add requirements to an existing term, not add a term (the term count is fixed)", function()
      create(pod("g3", { schedulingGates = gates(GATE), affinity = required { { matchExpressions = { expr("zone", "In", { "a" }) } } } }))
      local out, err, code = patch("g3", "json", { { op = "add",
        path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions/-",
        value = expr("gpu", "Exists") } })
      assert.are.equal(0, code, err)
      local causes = { { TERMS, "FieldValueInvalid", "Invalid value: []core.NodeSelectorTerm{core.NodeSelectorTerm{"
        .. 'MatchExpressions:[]core.NodeSelectorRequirement{core.NodeSelectorRequirement{Key:"zone", Operator:"In", Values:[]string{"a"}}, '
        .. 'core.NodeSelectorRequirement{Key:"gpu", Operator:"Exists", Values:[]string(nil)}}, MatchFields:[]core.NodeSelectorRequirement(nil)}, '
        .. "core.NodeSelectorTerm{MatchExpressions:[]core.NodeSelectorRequirement(nil), MatchFields:[]core.NodeSelectorRequirement{"
        .. 'core.NodeSelectorRequirement{Key:"metadata.name", Operator:"In", Values:[]string{"n1"}}}}}: '
        .. "no additions/deletions to non-empty NodeSelectorTerms list are allowed" } }
      local p = { { op = "add", path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/-",
        value = { matchFields = { expr("metadata.name", "In", { "n1" }) } } } }
      refused({ patch("g3", "json", p) }, causes)
      local st, body = d:request("PATCH", PODS .. "/g3", p, "application/json-patch+json")
      assert.are.same(invalid("g3", causes), status_of(st, body))
    end)

    it("may not lose or change a requirement of a term (validateNodeSelectorTermHasOnlyAdditions)", function()
      create(pod("g4", { schedulingGates = gates(GATE),
        affinity = required { { matchExpressions = { expr("zone", "In", { "a" }), expr("gpu", "Exists") } } } }))
      local causes = { { TERMS .. "[0]", "FieldValueInvalid", "Invalid value: core.NodeSelectorTerm{MatchExpressions:"
        .. '[]core.NodeSelectorRequirement{core.NodeSelectorRequirement{Key:"gpu", Operator:"Exists", Values:[]string(nil)}}, '
        .. "MatchFields:[]core.NodeSelectorRequirement(nil)}: only additions are allowed (no mutations or deletions)" } }
      refused({ patch("g4", "json", { { op = "remove",
        path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions/0" } }) }, causes)
      refused({ patch("g4", "merge", { spec = { affinity = required { { matchExpressions = { expr("zone", "In", { "b" }), expr("gpu", "Exists") } } } } }) },
        { { TERMS .. "[0]", "FieldValueInvalid", "Invalid value: core.NodeSelectorTerm{MatchExpressions:[]core.NodeSelectorRequirement{"
          .. 'core.NodeSelectorRequirement{Key:"zone", Operator:"In", Values:[]string{"b"}}, core.NodeSelectorRequirement{Key:"gpu", '
          .. 'Operator:"Exists", Values:[]string(nil)}}, MatchFields:[]core.NodeSelectorRequirement(nil)}: only additions are allowed (no mutations or deletions)' } })
      -- nor may the whole required affinity go (new terms nil: the count changes)
      refused({ patch("g4", "merge", { spec = { affinity = { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = json.null } } } }) },
        { { TERMS, "FieldValueInvalid", "Invalid value: []core.NodeSelectorTerm(nil): no additions/deletions to non-empty NodeSelectorTerms list are allowed" } })
    end)

    it("may change its preferred node affinity (only the required terms are checked)", function()
      create(pod("g5", { schedulingGates = gates(GATE) }))
      local pref = { nodeAffinity = { preferredDuringSchedulingIgnoredDuringExecution = { { weight = 10, preference = { matchExpressions = { expr("a", "Exists") } } } } } }
      local out, err, code = patch("g5", "merge", { spec = { affinity = pref } })
      assert.are.equal(0, code, err)
      pref.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[1].weight = 20
      out, err, code = patch("g5", "merge", { spec = { affinity = pref } })
      assert.are.equal(0, code, err)
      assert.are.equal(20, get("g5").spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[1].weight)
    end)

    it("takes the node affinity and the gate's removal in one patch (gated is judged on the stored pod)", function()
      create(pod("g6", { schedulingGates = gates(GATE) }))
      local out, err, code = patch("g6", "merge", { spec = { schedulingGates = json.null, nodeSelector = { ["gpu.cozystack.io/node"] = "n1" },
        affinity = required { { matchFields = { expr("metadata.name", "In", { "n1" }) } } } } })
      assert.are.equal(0, code, err)
      local p = get("g6")
      assert.is_nil(p.spec.schedulingGates)
      assert.are.same({ ["gpu.cozystack.io/node"] = "n1" }, p.spec.nodeSelector)
    end)

    it("takes the binder's pin: matchFields metadata.name In [node] added to every term, then the gate removed", function()
      -- DESIGN §4, decision 0020 item 5: two pod patches on a gated launcher pod
      local terms = { { matchExpressions = { expr("zone", "In", { "a" }) } },
        { matchExpressions = { expr("zone", "In", { "b" }) }, matchFields = { expr("metadata.name", "NotIn", { "n9" }) } } }
      create(pod("g9", { schedulingGates = gates(GATE), affinity = required(terms) }))
      local pin = expr("metadata.name", "In", { "n1" })
      terms[1].matchFields = { pin }
      terms[2].matchFields[2] = pin
      local out, err, code = patch("g9", "merge", { spec = { affinity = required(terms) } })
      assert.are.equal(0, code, err)
      out, err, code = patch("g9", "json", { { op = "remove", path = "/spec/schedulingGates" } })
      assert.are.equal(0, code, err)
      local p = get("g9")
      assert.is_nil(p.spec.schedulingGates)
      assert.are.same(required(terms), p.spec.affinity)
    end)

    it("may not add a requirement to an empty term (validateNodeSelectorTermHasOnlyAdditions: an empty old term stays empty)", function()
      create(pod("g10", { schedulingGates = gates(GATE), affinity = required { json.object() } }))
      local causes = { { TERMS .. "[0]", "FieldValueInvalid", "Invalid value: core.NodeSelectorTerm{MatchExpressions:"
        .. "[]core.NodeSelectorRequirement(nil), MatchFields:[]core.NodeSelectorRequirement{core.NodeSelectorRequirement{"
        .. 'Key:"metadata.name", Operator:"In", Values:[]string{"n1"}}}}: only additions are allowed (no mutations or deletions)' } }
      local p = { { op = "add", path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields",
        value = { expr("metadata.name", "In", { "n1" }) } } }
      refused({ patch("g10", "json", p) }, causes)
      local st, body = d:request("PATCH", PODS .. "/g10", p, "application/json-patch+json")
      assert.are.same(invalid("g10", causes), status_of(st, body))
    end)

    it("lets kubectl apply pin a gated pod to a node and lift its gate in one go, not narrow it afterwards", function()
      -- the binder's step (DESIGN §4): required node affinity to the claims' node, gate removed
      local p = pod("g8", { schedulingGates = gates(GATE) })
      local out, err, code = d:kubectl { "apply", "-f", file("g8", p) }
      assert.are.equal(0, code, err)
      p.spec.schedulingGates = nil
      p.spec.affinity = required { { matchFields = { expr("metadata.name", "In", { "n1" }) } } }
      out, err, code = d:kubectl { "apply", "-f", file("g8", p) }
      assert.are.equal(0, code, err)
      assert.are.equal("pod/g8 configured\n", out)
      local g = get("g8")
      assert.is_nil(g.spec.schedulingGates)
      assert.are.same(p.spec.affinity, g.spec.affinity)
      p.spec.nodeSelector = { zone = "a" }
      out, err, code = d:kubectl { "apply", "-f", file("g8", p) }
      assert.are_not.equal(0, code, out)
      assert.truthy(err:find("spec: Forbidden: " .. UPDATABLE .. "\n", 1, true), err)
    end)

    it("may not change pod affinity, nor set spec.nodeName (general rule: the first line of the message)", function()
      create(pod("g7", { schedulingGates = gates(GATE) }))
      for _, p in ipairs {
        { spec = { affinity = { podAffinity = { requiredDuringSchedulingIgnoredDuringExecution = { { topologyKey = "zone",
          labelSelector = { matchLabels = { app = "x" } } } } } } } },
        { spec = { nodeName = "n1" } },
      } do
        local _, err, code = patch("g7", "merge", p)
        assert.are_not.equal(0, code)
        assert.truthy(err:find('The Pod "g7" is invalid: spec: Forbidden: ' .. UPDATABLE .. "\n", 1, true), err)
        local st, body = d:request("PATCH", PODS .. "/g7", p)
        assert.are.equal(422, st)
        assert.are.equal("spec", body.details.causes[1].field)
        assert.are.equal("Forbidden: " .. UPDATABLE, body.details.causes[1].message:match("^[^\n]*"))
      end
      assert.is_nil(get("g7").spec.nodeName)
    end)
  end)

  describe("a pod without gates", function()
    it("may not gain nodeSelector entries or a required node affinity (no exception without gates)", function()
      create(pod("n1", { nodeSelector = { a = "b" } }))
      for _, p in ipairs {
        { spec = { nodeSelector = { c = "d" } } },
        { spec = { affinity = required { { matchExpressions = { expr("gpu", "Exists") } } } } },
      } do
        local _, err, code = patch("n1", "merge", p)
        assert.are_not.equal(0, code)
        assert.truthy(err:find('The Pod "n1" is invalid: spec: Forbidden: ' .. UPDATABLE .. "\n", 1, true), err)
      end
      assert.are.same({ a = "b" }, get("n1").spec.nodeSelector)
    end)

    it("may gain tolerations and labels, not lose a toleration (V: validateOnlyAddedTolerations)", function()
      local t1 = { key = "gpu", operator = "Exists", effect = "NoSchedule" }
      local t2 = { key = "x", operator = "Equal", value = "y", effect = "NoSchedule" }
      create(pod("n2", { tolerations = { t1 } }))
      local out, err, code = patch("n2", "merge", { metadata = { labels = { a = "b" } }, spec = { tolerations = { t1, t2 } } })
      assert.are.equal(0, code, err)
      refused({ patch("n2", "merge", { spec = { tolerations = { t2 } } }) },
        { { "spec.tolerations", "FieldValueForbidden", "Forbidden: existing toleration can not be modified except its tolerationSeconds" } })
    end)

    it("may not gain or lose a container (V: ValidateContainerUpdates)", function()
      local p = create(pod("n3", {}))
      p.spec.containers[2] = { name = "d", image = "busybox" }
      refused({ d:kubectl { "replace", "-f", file("n3", p) } },
        { { "spec.containers", "FieldValueForbidden", "Forbidden: pod updates may not add or remove containers" } })
    end)
  end)

  describe("strategic merge patch of pods (k8s.io/apimachinery/pkg/util/strategicpatch)", function()
    it("merges a strategic status patch's conditions by type (status.conditions: patchMergeKey type)", function()
      create(pod("u8", { schedulingGates = gates(GATE) }))
      local out, err, code = d:kubectl { "patch", "pod", "u8", "-n", NS, "--subresource", "status", "-p",
        json.encode { status = { conditions = { { type = "Ready", status = "False" } } } } }
      assert.are.equal(0, code, err)
      local c = get("u8").status.conditions
      assert.are.same({ "PodScheduled", "Ready" }, { c[1].type, c[2].type })
      assert.are.equal("SchedulingGated", c[1].reason)
    end)
  end)
end)
