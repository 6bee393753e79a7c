-- cozygpu.pin (docs/decisions/0025): the shape of the pin on every kind of
-- affinity a pod can bring, the gate, the claims' node, and every field of
-- the wrong JSON type as a problem naming it (the pod is untrusted input).
-- Each patch is applied with the RFC 6902 implementation and the result
-- compared, so a patch that would not apply fails here.
local json = H.json
local pin = require "cozygpu.pin"
local jsonpatch = require "cozygpu.jsonpatch"
local cluster = require "cozygpu.cluster"

local PIN1 = { key = "metadata.name", operator = "In", values = { "n1" } }
local TERMS = pin.TERMS_FIELD

local function expr(key, op, values) return { key = key, operator = op, values = values } end
local function required(terms)
  return { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = terms } } }
end
-- the pod after `pin.narrow` (asserting it returned a patch)
local function narrowed(spec, node)
  local pod = { spec = spec }
  local p, problem = pin.narrow(json.decode(json.encode(pod)), node or "n1")
  assert.is_nil(problem)
  return assert(jsonpatch.apply(json.decode(json.encode(pod)), p)).spec, p
end
local function problem_of(spec, node)
  local p, problem = pin.narrow(json.decode(json.encode({ spec = spec })), node or "n1")
  assert.is_nil(p)
  return problem
end

describe("cozygpu.pin", function()
  describe("narrow", function()
    it("adds one required term holding the pin to a pod without affinity", function()
      local spec = narrowed({ containers = {} })
      assert.are.same(required { { matchFields = { PIN1 } } }, spec.affinity)
    end)

    it("adds the required selector beside preferred terms and pod anti-affinity, which stay as they were", function()
      local pref = { { weight = 10, preference = { matchExpressions = { expr("a", "Exists") } } } }
      local anti = { requiredDuringSchedulingIgnoredDuringExecution = { { topologyKey = "kubernetes.io/hostname",
        labelSelector = { matchLabels = { app = "x" } } } } }
      local spec = narrowed({ affinity = { nodeAffinity = { preferredDuringSchedulingIgnoredDuringExecution = pref }, podAntiAffinity = anti } })
      assert.are.same({ nodeAffinity = { preferredDuringSchedulingIgnoredDuringExecution = pref,
        requiredDuringSchedulingIgnoredDuringExecution = { nodeSelectorTerms = { { matchFields = { PIN1 } } } } },
        podAntiAffinity = anti }, spec.affinity)
      -- affinity present but only pod affinity: nodeAffinity is created
      spec = narrowed({ affinity = { podAntiAffinity = anti } })
      assert.are.same({ podAntiAffinity = anti, nodeAffinity = required({ { matchFields = { PIN1 } } }).nodeAffinity }, spec.affinity)
    end)

    it("ANDs the pin into every term that has a requirement, after the ones it has; an empty term stays empty", function()
      local spec = narrowed({ affinity = required {
        { matchExpressions = { expr("zone", "In", { "a" }) } },
        { matchFields = { expr("metadata.name", "NotIn", { "n9" }) } },
        json.object(),
        { matchExpressions = json.array(), matchFields = json.array() }, -- empty too
        { matchExpressions = { expr("zone", "In", { "b" }) }, matchFields = json.array() },
      } })
      assert.are.same(required {
        { matchExpressions = { expr("zone", "In", { "a" }) }, matchFields = { PIN1 } },
        { matchFields = { expr("metadata.name", "NotIn", { "n9" }), PIN1 } },
        {},
        { matchExpressions = {}, matchFields = {} },
        { matchExpressions = { expr("zone", "In", { "b" }) }, matchFields = { PIN1 } },
      }, spec.affinity)
    end)

    it("is idempotent: a term that carries the pin gets nothing, a new term beside it does", function()
      local _, p = narrowed({ affinity = required { { matchFields = { PIN1 } } } })
      assert.are.equal(0, #p)
      local spec = narrowed({ affinity = required { { matchFields = { PIN1 } }, { matchExpressions = { expr("zone", "In", { "a" }) } } } })
      assert.are.same(required { { matchFields = { PIN1 } }, { matchExpressions = { expr("zone", "In", { "a" }) }, matchFields = { PIN1 } } }, spec.affinity)
      -- a pin to another node is another requirement: ANDed, never replaced
      spec = narrowed({ affinity = required { { matchFields = { PIN1 } } } }, "n2")
      assert.are.same({ PIN1, { key = "metadata.name", operator = "In", values = { "n2" } } },
        spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[1].matchFields)
    end)

    it("treats null like absent on the way down", function()
      for _, spec in ipairs {
        { affinity = json.null },
        { affinity = { nodeAffinity = json.null } },
        { affinity = { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = json.null } } },
      } do
        assert.are.same(required { { matchFields = { PIN1 } } }, narrowed(spec).affinity)
      end
    end)

    it("names the field of every wrong shape and writes nothing", function()
      local cases = {
        { "x", "spec", "must be an object" },
        { { affinity = "x" }, "spec.affinity", "must be an object" },
        { { affinity = { 1, 2 } }, "spec.affinity", "must be an object" },
        { { affinity = { nodeAffinity = true } }, "spec.affinity.nodeAffinity", "must be an object" },
        { { affinity = { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = 3 } } },
          "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", "must be an object" },
        { { affinity = { nodeAffinity = { requiredDuringSchedulingIgnoredDuringExecution = json.object() } } }, TERMS,
          "must have at least one node selector term (the API server refuses a required node selector without terms)" },
        { { affinity = required(json.array()) }, TERMS,
          "must have at least one node selector term (the API server refuses a required node selector without terms)" },
        { { affinity = required { a = 1 } }, TERMS, "must be a list" },
        { { affinity = required { "term" } }, TERMS .. "[0]", "must be an object" },
        { { affinity = required { { matchFields = { PIN1 } }, json.null } }, TERMS .. "[1]", "must be an object" },
        { { affinity = required { { matchExpressions = "zone" } } }, TERMS .. "[0].matchExpressions", "must be a list" },
        { { affinity = required { { matchExpressions = { expr("a", "Exists") }, matchFields = { x = 1 } } } }, TERMS .. "[0].matchFields", "must be a list" },
      }
      for _, c in ipairs(cases) do
        assert.are.same({ field = c[2], message = c[3] }, problem_of(c[1]))
      end
      assert.are.same({ field = "node", message = '"N1" is not a node name: must consist of lower case alphanumeric characters, '
        .. "'-' or '.', and must start and end with an alphanumeric character" }, problem_of({}, "N1"))
      assert.are.same({ field = "node", message = "must be a string, not null" }, problem_of({}, json.null))
    end)
  end)

  describe("gate", function()
    local function gated(spec)
      local pod = json.decode(json.encode { spec = spec })
      local p = assert(pin.gate(pod))
      return assert(jsonpatch.apply(pod, p)).spec.schedulingGates, #p
    end

    it("adds the list, appends after other gates, and never twice", function()
      assert.are.same({ { name = pin.GATE } }, (gated {}))
      assert.are.same({ { name = pin.GATE } }, (gated { schedulingGates = json.array() }))
      assert.are.same({ { name = pin.GATE } }, (gated { schedulingGates = json.null }))
      assert.are.same({ { name = "example.com/q" }, { name = pin.GATE } }, (gated { schedulingGates = { { name = "example.com/q" } } }))
      local g, n = gated { schedulingGates = { { name = pin.GATE }, { name = "example.com/q" } } }
      assert.are.equal(0, n)
      assert.are.same({ { name = pin.GATE }, { name = "example.com/q" } }, g)
    end)

    it("names a list of the wrong type", function()
      assert.are.same({ nil, { field = "spec.schedulingGates", message = "must be a list" } },
        { pin.gate(json.decode('{"spec":{"schedulingGates":{"name":"x"}}}')) })
      assert.are.same({ nil, { field = "spec", message = "must be an object" } }, { pin.gate({ spec = 1 }) })
      assert.is_false(pin.gated({ spec = { schedulingGates = "gpu.cozystack.io/claims" } }))
      assert.is_false(pin.gated({ spec = { schedulingGates = { "gpu.cozystack.io/claims" } } }))
    end)
  end)

  describe("node_of", function()
    local function claim(name, status, deleting)
      return { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClaim",
        metadata = { name = name, namespace = "t", deletionTimestamp = deleting and "2026-12-01T00:00:00Z" or nil },
        spec = { class = "l40s", count = 1 }, status = status }
    end
    local view = cluster.new(json.decode(json.encode {
      claim("b1", { phase = "Bound", node = "n1" }),
      claim("a1", { phase = "Attached", node = "n1", attachedTo = "vm" }),
      claim("b2", { phase = "Bound", node = "n2" }),
      claim("p", { phase = "Pending" }),
      claim("l", { phase = "Lost", node = "n1" }),
      claim("d", { phase = "Bound", node = "n1" }, true),
      claim("other", { phase = "Attached", node = "n1", attachedTo = "vm2" }),
      claim("badnode", { phase = "Bound", node = "N 1" }),
      claim("nostatus", nil),
    }), {})

    it("is the node when every claim is Bound or Attached to this VMI on it", function()
      assert.are.equal("n1", pin.node_of(view, "t", { "b1", "a1" }, "vm"))
      assert.are.equal("n2", pin.node_of(view, "t", { "b2" }, "vm"))
    end)

    it("is nil, naming the claim, for anything else", function()
      for _, c in ipairs {
        { { "b1", "b2" }, 'GPUClaims "b1" and "b2" are on two nodes' },
        { { "b1", "p" }, 'GPUClaim "p" is Pending' },
        { { "l" }, 'GPUClaim "l" is Lost' },
        { { "nostatus" }, 'GPUClaim "nostatus" is without a phase' },
        { { "d" }, 'GPUClaim "d" is being deleted' },
        { { "other" }, 'GPUClaim "other" is attached to another VMI' },
        { { "badnode" }, 'GPUClaim "badnode" has no valid status.node' },
        { { "b1", "new" }, 'GPUClaim "new" is not in the cluster view' },
        { {}, "no claims" },
      } do
        assert.are.same({ nil, c[2] }, { pin.node_of(view, "t", c[1], "vm") })
      end
      -- another namespace's claim of the same name is never read
      assert.are.same({ nil, 'GPUClaim "b1" is not in the cluster view' }, { pin.node_of(view, "u", { "b1" }, "vm") })
      assert.are.same({ nil, "the pod has no namespace" }, { pin.node_of(view, nil, { "b1" }, "vm") })
    end)

    it("with attached_only, is the node only when every claim is Attached to this VMI (issue 20 defect 5)", function()
      assert.are.equal("n1", pin.node_of(view, "t", { "a1" }, "vm", true))
      -- Bound: two VMIs may name it; the leader decides which gets it
      local why = 'GPUClaim "b1" is not attached to this VMI yet: the leader decides which VMI gets it'
      assert.are.same({ nil, why }, { pin.node_of(view, "t", { "a1", "b1" }, "vm", true) })
      assert.are.same({ nil, why }, { pin.node_of(view, "t", { "b1" }, "vm", true) })
      -- no VMI named: nothing is attached to it
      assert.are.same({ nil, 'GPUClaim "a1" is attached to another VMI' }, { pin.node_of(view, "t", { "a1" }, nil, true) })
      assert.are.same({ nil, 'GPUClaim "other" is attached to another VMI' }, { pin.node_of(view, "t", { "other" }, "vm", true) })
    end)
  end)
end)
