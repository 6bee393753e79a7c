-- The API server double behaves like kube-apiserver where cozygpu relies on
-- it. kubectl (v1.32) is the outside check; curl checks the wire details.
-- Expected values come from Kubernetes semantics (sources cited inline),
-- not from what the double happens to print.
local P = require "proc"
local D = require "double"
local json = H.json

local GPU = "/apis/cozystack.io/v1alpha1/gpuclasses"
local CM = "/api/v1/namespaces/tenant-a/configmaps"

local function class(name, extra)
  local c = { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass", metadata = { name = name },
    spec = { displayName = name, model = "L40S", mode = "Passthrough", resourceName = "nvidia.com/AD102GL_L40S" } }
  for k, v in pairs(extra or {}) do c.metadata[k] = v end
  return c
end

local function cm(name, labels)
  return { apiVersion = "v1", kind = "ConfigMap", metadata = { name = name, labels = labels }, data = { a = "1" } }
end

local function rv(obj) return tonumber(obj.metadata.resourceVersion) end

local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

describe("kube-double", function()
  local d
  setup(function()
    d = D.start { bookmark_interval = 0.3 }
    assert(d:kubectl { "apply", "-f", "deploy/crds" })
    local st = d:request("POST", "/api/v1/namespaces", { apiVersion = "v1", kind = "Namespace", metadata = { name = "tenant-a" } })
    assert.are.equal(201, st)
  end)
  teardown(function() if d then d:stop() end end)

  describe("discovery", function()
    it("serves /version, /api, /apis and group-version resource lists", function()
      local st, v = d:request("GET", "/version")
      assert.are.equal(200, st)
      assert.are.equal("1", v.major)
      st, v = d:request("GET", "/api")
      assert.are.same({ "v1" }, v.versions)
      st, v = d:request("GET", "/apis")
      local names = {}
      for _, g in ipairs(v.groups) do names[g.name] = g.preferredVersion.version end
      assert.are.same({ ["coordination.k8s.io"] = "v1", ["apiextensions.k8s.io"] = "v1", ["kubevirt.io"] = "v1",
        ["cozystack.io"] = "v1alpha1", ["apps"] = "v1", ["policy"] = "v1", ["rbac.authorization.k8s.io"] = "v1",
        ["admissionregistration.k8s.io"] = "v1", ["cert-manager.io"] = "v1", ["networking.k8s.io"] = "v1",
        ["resource.k8s.io"] = "v1" }, names)
      -- a group served at two versions lists both, the newest preferred
      st, v = d:request("GET", "/apis/resource.k8s.io")
      assert.are.same({ "v1", "v1beta1" }, { v.versions[1].version, v.versions[2].version })
      st, v = d:request("GET", "/apis/cozystack.io/v1alpha1")
      assert.are.equal("APIResourceList", v.kind)
      local gc, gcs
      for _, r in ipairs(v.resources) do
        if r.name == "gpuclasses" then gc = r end
        if r.name == "gpuclasses/status" then gcs = r end
      end
      assert.are.same({ "gpuc" }, gc.shortNames)
      assert.are.equal("gpuclass", gc.singularName)
      assert.is_false(gc.namespaced)
      assert.are.equal("GPUClass", gc.kind)
      assert.are.same({ "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch" }, gc.verbs)
      assert.are.same({ "get", "patch", "update" }, gcs.verbs)
    end)
  end)

  describe("kubectl", function()
    it("applies the CRD and the example classes, then finds them unchanged", function()
      local out, err, code = d:kubectl { "apply", "-f", "deploy/crds", "-f", "examples/classes" }
      assert.are.equal(0, code, err)
      assert.are.same({
        "customresourcedefinition.apiextensions.k8s.io/gpuclaims.cozystack.io unchanged",
        "customresourcedefinition.apiextensions.k8s.io/gpuclasses.cozystack.io unchanged",
        "customresourcedefinition.apiextensions.k8s.io/gpunodes.cozystack.io unchanged",
        "gpuclass.cozystack.io/a100-40c created",
        "gpuclass.cozystack.io/l40s-24c created",
        "gpuclass.cozystack.io/l40s created",
      }, lines(out))
      out, err, code = d:kubectl { "apply", "-f", "deploy/crds", "-f", "examples/classes" }
      assert.are.equal(0, code, err)
      for _, l in ipairs(lines(out)) do assert.truthy(l:match(" unchanged$"), l) end
      -- kubectl's default validation went to the server (fieldValidation=Strict)
      local posts = 0
      for _, r in ipairs(d:log()) do
        if r.method == "POST" and r.path == GPU then
          posts = posts + 1
          assert.truthy(r.query:find("fieldValidation=Strict", 1, true))
          assert.truthy(r.userAgent:match("^kubectl/"))
        end
      end
      assert.are.equal(3, posts)
    end)

    it("prints the CRD's printer columns (server-side Table)", function()
      local out, err, code = d:kubectl { "get", "gpuclasses" }
      assert.are.equal(0, code, err)
      local l = lines(out)
      assert.truthy(l[1]:match("^NAME%s+MODE%s+MODEL%s+PROFILE%s+RESOURCE%s+MAX%s+FREE%s+MAX%-FREE%-PER%-NODE%s+ACCEPTED%s+AGE$"), l[1])
      assert.truthy(l[3]:match("^l40s%s+Passthrough%s+L40S%s+nvidia.com/AD102GL_L40S%s+%d+s$"), l[3]) -- no maxCount, no status
    end)

    -- The real server evaluates a column's JSONPath with client-go's
    -- jsonpath, filters included, and prints the first result
    -- (apiextensions-apiserver's tableconvertor); no match is an empty cell.
    it("fills a printer column whose JSONPath filters a list ([?(@.type==\"Accepted\")])", function()
      local st, o = d:request("POST", GPU, class("filter-col"))
      assert.are.equal(201, st)
      local function set(accepted)
        o.status = { conditions = {
          { type = "Other", status = "Unknown", reason = "X", message = "", lastTransitionTime = "2026-01-01T00:00:00Z" },
        } }
        if accepted then
          table.insert(o.status.conditions, { type = "Accepted", status = accepted, reason = "R", message = "",
            lastTransitionTime = "2026-01-01T00:00:00Z" })
        end
        st, o = d:request("PUT", GPU .. "/filter-col/status", o)
        assert.are.equal(200, st)
      end
      local function column()
        local out, err, code = d:kubectl { "get", "gpuclass", "filter-col" }
        assert.are.equal(0, code, err)
        local header, row = out:match("([^\n]+)\n([^\n]+)")
        local from = header:find("ACCEPTED", 1, true)
        local to = header:find("AGE", from, true)
        return (row:sub(from, to - 1):gsub("%s+$", ""))
      end
      set("False")
      -- kubectl's own JSONPath (client side) is the reference
      local out, err, code = d:kubectl { "get", "gpuclass", "filter-col", "-o",
        'custom-columns=A:.status.conditions[?(@.type=="Accepted")].status' }
      assert.are.equal(0, code, err)
      assert.are.equal("False", lines(out)[2])
      assert.are.equal("False", column())
      set("True")
      assert.are.equal("True", column())
      -- no Accepted condition: an empty cell, not another condition's status
      set(nil)
      assert.are.equal("", column())
      assert.are.equal(200, (d:request("DELETE", GPU .. "/filter-col")))
    end)

    -- kubectl explain reads the schema from /openapi/v3 (components.schemas,
    -- found by x-kubernetes-group-version-kind): the stored CRD's, with its
    -- descriptions
    it("explains a custom resource's fields from the stored CRD", function()
      local out, err, code = d:kubectl { "explain", "gpuclass.spec.tolerations.effect" }
      assert.are.equal(0, code, err)
      assert.matches("FIELD: effect <string>", out, 1, true)
      local crd = H.objects("deploy/crds/gpuclasses.cozystack.io.yaml")[1]
      local want = crd.spec.versions[1].schema.openAPIV3Schema.properties.spec.properties.tolerations.items.properties.effect.description
      assert.matches(want:match("^%S+ %S+ %S+"), out, 1, true)
      out, err, code = d:kubectl { "explain", "gpunode.status.layout.pendingChanges" }
      assert.are.equal(0, code, err)
      assert.matches("toProfile", out, 1, true)
      -- with the schemas served, a class changed and applied again still
      -- goes as a JSON merge patch (custom resources take no strategic one)
      local f = H.tmpdir() .. "/c.json"
      local c = class("explained")
      H.write(f, json.encode(c))
      assert.are.equal(0, select(3, d:kubectl { "apply", "-f", f }))
      c.spec.displayName = "changed"
      H.write(f, json.encode(c))
      out, err, code = d:kubectl { "apply", "-f", f }
      assert.are.equal(0, code, err)
      assert.matches("gpuclass.cozystack.io/explained configured", out, 1, true)
      local patches = 0
      for _, r in ipairs(d:log()) do
        if r.method == "PATCH" and r.path == GPU .. "/explained" then
          patches = patches + 1
          assert.are.equal("application/merge-patch+json", r.contentType)
        end
      end
      assert.are.equal(1, patches)
      assert.are.equal(200, (d:request("DELETE", GPU .. "/explained")))
    end)

    it("gets one class as JSON with the server's metadata and the file's spec (defaults applied)", function()
      local out, err, code = d:kubectl { "get", "gpuclass", "l40s", "-o", "json" }
      assert.are.equal(0, code, err)
      local o = json.decode(out)
      local want = H.objects("examples/classes/l40s.yaml")[1]
      assert.are.equal("cozystack.io/v1alpha1", o.apiVersion)
      assert.are.equal("GPUClass", o.kind)
      assert.are.equal(1, o.metadata.generation)
      assert.truthy(o.metadata.uid:match("^%x+%-%x+%-4%x+%-[89ab]%x+%-%x+$"))
      assert.truthy(o.metadata.creationTimestamp:match("^%d+%-%d+%-%d+T%d+:%d+:%d+Z$"))
      assert.truthy(rv(o) > 1000)
      assert.is_nil(o.metadata.namespace)
      assert.are.same(want.spec, o.spec)   -- the example already spells out the CRD defaults
      assert.is_nil(o.status)
    end)

    it("rejects an unknown field (fieldValidation=Strict) and warns without it", function()
      local f = H.tmpdir() .. "/bad.json"
      local c = class("bad")
      c.spec.bogus = 1
      H.write(f, json.encode(c))
      local _, err, code = d:kubectl { "apply", "-f", f }
      assert.are_not.equal(0, code)
      assert.truthy(err:find('strict decoding error: unknown field "spec.bogus"', 1, true), err)
      _, err, code = d:kubectl { "patch", "gpuclass", "l40s", "--type", "merge", "-p", '{"spec":{"bogus":1}}' }
      assert.are.equal(0, code)
      assert.truthy(err:find('Warning: unknown field "spec.bogus"', 1, true), err)
    end)

    it("creates, replaces with a stale resourceVersion (Conflict), patches and deletes", function()
      local dir = H.tmpdir()
      local c = class("k1")
      H.write(dir .. "/k1.json", json.encode(c))
      local out, err, code = d:kubectl { "create", "-f", dir .. "/k1.json" }
      assert.are.equal(0, code, err)
      assert.are.equal("gpuclass.cozystack.io/k1 created\n", out)
      _, err, code = d:kubectl { "create", "-f", dir .. "/k1.json" }
      assert.are_not.equal(0, code)
      assert.truthy(err:find('Error from server (AlreadyExists): error when creating "' .. dir .. '/k1.json": gpuclasses.cozystack.io "k1" already exists', 1, true), err)
      local cur = json.decode((d:kubectl { "get", "gpuclass", "k1", "-o", "json" }))
      out, err, code = d:kubectl { "patch", "gpuclass", "k1", "--type", "merge", "-p", '{"spec":{"maxCount":2}}' }
      assert.are.equal(0, code, err)
      assert.are.equal("gpuclass.cozystack.io/k1 patched\n", out)
      out, err, code = d:kubectl { "patch", "gpuclass", "k1", "--type", "json", "-p",
        '[{"op":"replace","path":"/spec/displayName","value":"renamed"}]' }
      assert.are.equal(0, code, err)
      local now = json.decode((d:kubectl { "get", "gpuclass", "k1", "-o", "json" }))
      assert.are.equal(3, now.metadata.generation)   -- two spec changes
      assert.are.equal("renamed", now.spec.displayName)
      assert.are.equal(2, now.spec.maxCount)
      -- replace with the resourceVersion read before the patches
      cur.spec.displayName = "stale"
      H.write(dir .. "/stale.json", json.encode(cur))
      _, err, code = d:kubectl { "replace", "-f", dir .. "/stale.json" }
      assert.are_not.equal(0, code)
      assert.truthy(err:find('Operation cannot be fulfilled on gpuclasses.cozystack.io "k1": the object has been modified; please apply your changes to the latest version and try again', 1, true), err)
      out, err, code = d:kubectl { "delete", "gpuclass", "k1" }
      assert.are.equal(0, code, err)
      assert.are.equal('gpuclass.cozystack.io "k1" deleted\n', out)
      _, err = d:kubectl { "get", "gpuclass", "k1" }
      assert.truthy(err:find('Error from server (NotFound): gpuclasses.cozystack.io "k1" not found', 1, true), err)
    end)

    it("selects by label with -l", function()
      for i, lab in ipairs { "a", "b", "a" } do
        assert.are.equal(201, (d:request("POST", CM, cm("sel" .. i, { tier = lab }))))
      end
      local out = d:kubectl { "get", "configmaps", "-n", "tenant-a", "-l", "tier=a", "-o", "name" }
      assert.are.equal("configmap/sel1\nconfigmap/sel3\n", out)
      out = d:kubectl { "get", "configmaps", "-n", "tenant-a", "-l", "tier notin (a),tier", "-o", "name" }
      assert.are.equal("configmap/sel2\n", out)
      out = d:kubectl { "get", "configmaps", "-n", "tenant-a", "--field-selector", "metadata.name=sel3", "-o", "name" }
      assert.are.equal("configmap/sel3\n", out)
    end)

    it("shows a create and a delete made meanwhile in get --watch", function()
      local w = d:kubectl_bg { "get", "gpuclasses", "--watch", "-o", "name" }
      assert(P.wait_until(function() return w.read():find("gpuclass.cozystack.io/l40s\n", 1, true) end, 10))
      assert.are.equal(201, (d:request("POST", GPU, class("w1"))))
      assert(P.wait_until(function() return w.read():find("gpuclass.cozystack.io/w1\n", 1, true) end, 10))
      assert.are.equal(200, (d:request("DELETE", GPU .. "/w1")))
      local seen = P.wait_until(function()
        local _, n = w.read():gsub("gpuclass.cozystack.io/w1\n", "")
        return n >= 2
      end, 10)
      local text = w.stop()
      assert.truthy(seen, text)
    end)

    it("reports injected faults: 500 fails kubectl, 429 with Retry-After is retried", function()
      d:reset_log()
      d:fail { method = "GET", path = GPU .. "/l40s", status = 500, count = 1 }
      local _, err, code = d:kubectl { "get", "--raw", GPU .. "/l40s" }
      assert.are_not.equal(0, code)
      assert.truthy(err:find("Internal error occurred: injected by kube-double", 1, true), err)
      d:fail { method = "GET", path = GPU .. "/l40s", status = 429, retryAfter = 1, count = 1 }
      local out
      out, err, code = d:kubectl { "get", "--raw", GPU .. "/l40s" }
      assert.are.equal(0, code, err)
      assert.are.equal("l40s", json.decode(out).metadata.name)
      local statuses = {}
      for _, r in ipairs(d:log()) do
        if r.path == GPU .. "/l40s" then statuses[#statuses + 1] = r.status end
      end
      assert.are.same({ 500, 429, 200 }, statuses)
    end)

    it("keeps an object with finalizers until the last one is removed", function()
      local c = class("fin", { finalizers = json.array { "cozystack.io/hold" } })
      assert.are.equal(201, (d:request("POST", GPU, c)))
      local w = d:watch(GPU .. "?fieldSelector=metadata.name%3Dfin&resourceVersion=0")
      local out, err, code = d:kubectl { "delete", "gpuclass", "fin", "--wait=false" }
      assert.are.equal(0, code, err)
      assert.are.equal('gpuclass.cozystack.io "fin" deleted\n', out)
      local st, o = d:request("GET", GPU .. "/fin")
      assert.are.equal(200, st)
      assert.truthy(o.metadata.deletionTimestamp)
      _, err, code = d:kubectl { "patch", "gpuclass", "fin", "--type", "json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]' }
      assert.are.equal(0, code, err)
      assert.are.equal(404, (d:request("GET", GPU .. "/fin")))
      assert(P.wait_until(function() return #w.events() >= 3 end, 5))
      local evs = w.events()
      w.stop()
      assert.are.same({ "ADDED", "MODIFIED", "DELETED" }, { evs[1].type, evs[2].type, evs[3].type })
      assert.truthy(evs[2].object.metadata.deletionTimestamp)
      assert.truthy(rv(evs[3].object) > rv(evs[2].object))
    end)
  end)

  describe("resourceVersion and watch", function()
    it("is one global counter; lists carry the current one", function()
      local _, a = d:request("POST", CM, cm("rv1"))
      local _, b = d:request("POST", GPU, class("rv2"))
      assert.are.equal(rv(a) + 1, rv(b))
      local _, l = d:request("GET", CM)
      assert.are.equal(rv(b), rv(l))
      assert.is_nil(l.items[1].kind)          -- typed lists drop the items' kind
      local _, g = d:request("GET", GPU)
      assert.are.equal("GPUClass", g.items[1].kind)   -- custom resource lists keep it
    end)

    it("delivers every event after R in order; rv=0 starts with ADDED for what exists", function()
      local _, l = d:request("GET", GPU)
      local from = l.metadata.resourceVersion
      d:request("POST", GPU, class("e1"))
      d:request("PATCH", GPU .. "/e1", { spec = { maxCount = 4 } })
      d:request("DELETE", GPU .. "/e1")
      local st, text = d:http { path = GPU .. "?watch=1&timeoutSeconds=1&resourceVersion=" .. from }
      assert.are.equal(200, st)
      local evs = H.json_lines(text)
      assert.are.same({ "ADDED", "MODIFIED", "DELETED" }, { evs[1].type, evs[2].type, evs[3].type })
      assert.are.equal(tonumber(from) + 1, rv(evs[1].object))
      assert.are.equal(tonumber(from) + 3, rv(evs[3].object))
      assert.are.equal(3, #evs)
      _, text = d:http { path = GPU .. "?watch=1&timeoutSeconds=1&resourceVersion=0" }
      evs = H.json_lines(text)
      assert.are.equal(#l.items, #evs)
      for _, e in ipairs(evs) do assert.are.equal("ADDED", e.type) end
    end)

    it("sends BOOKMARK events with only the resourceVersion, also at timeout", function()
      local _, l = d:request("GET", GPU)
      local _, text = d:http { path = GPU .. "?watch=1&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion=" .. l.metadata.resourceVersion }
      local evs = H.json_lines(text)
      assert.truthy(#evs >= 2)
      for _, e in ipairs(evs) do
        assert.are.equal("BOOKMARK", e.type)
        assert.are.same({ kind = "GPUClass", apiVersion = "cozystack.io/v1alpha1",
          metadata = { resourceVersion = l.metadata.resourceVersion } }, e.object)
      end
    end)

    it("turns an object that leaves the label selector into DELETED", function()
      d:request("POST", CM, cm("lab", { watch = "me" }))
      local _, l = d:request("GET", CM)
      d:request("PATCH", CM .. "/lab", { metadata = { labels = { watch = json.null } } })
      local _, text = d:http { path = CM .. "?watch=1&timeoutSeconds=1&labelSelector=watch%3Dme&resourceVersion=" .. l.metadata.resourceVersion }
      local evs = H.json_lines(text)
      assert.are.equal(1, #evs)
      assert.are.equal("DELETED", evs[1].type)
      assert.are.equal("lab", evs[1].object.metadata.name)
    end)

    it("answers 410 Expired for a compacted resourceVersion, in the stream and for continue tokens", function()
      local _, l = d:request("GET", GPU .. "?limit=1")
      local old = l.metadata.resourceVersion
      d:request("POST", GPU, class("c1"))
      local c = d:compact()
      assert.are.equal(c.resourceVersion, c.compacted)
      local st, text = d:http { path = GPU .. "?watch=1&timeoutSeconds=1&resourceVersion=" .. old }
      assert.are.equal(200, st)
      local evs = H.json_lines(text)
      assert.are.same({ { type = "ERROR", object = { kind = "Status", apiVersion = "v1", metadata = json.object(),
        status = "Failure", message = ("too old resource version: %s (%s)"):format(old, c.compacted),
        reason = "Expired", code = 410 } } }, evs)
      local s2, body = d:request("GET", GPU .. "?limit=1&continue=" .. l.metadata.continue)
      assert.are.equal(410, s2)
      assert.are.equal("Expired", body.reason)
      -- from the compaction point itself a watch is fine
      st, text = d:http { path = GPU .. "?watch=1&timeoutSeconds=1&resourceVersion=" .. c.compacted }
      assert.are.equal("", text)
    end)

    it("pages consistently at the first page's resourceVersion (limit/continue)", function()
      local _, p1 = d:request("GET", CM .. "?limit=2")
      assert.are.equal(2, #p1.items)
      d:request("POST", CM, cm("zz-later"))
      d:request("DELETE", CM .. "/" .. p1.items[2].metadata.name)
      local all = { p1.items[1].metadata.name, p1.items[2].metadata.name }
      local cont = p1.metadata.continue
      while cont do
        local _, p = d:request("GET", CM .. "?limit=2&continue=" .. cont)
        assert.are.equal(p1.metadata.resourceVersion, p.metadata.resourceVersion)
        for _, it in ipairs(p.items) do all[#all + 1] = it.metadata.name end
        cont = p.metadata.continue
      end
      local _, whole = d:request("GET", CM .. "?resourceVersionMatch=Exact&resourceVersion=" .. p1.metadata.resourceVersion)
      local names = {}
      for _, it in ipairs(whole.items) do names[#names + 1] = it.metadata.name end
      assert.are.same(names, all)
    end)

    it("ends open watches on /_double/cut and resumes from the last resourceVersion", function()
      local _, l = d:request("GET", GPU)
      local w = d:watch(GPU .. "?resourceVersion=" .. l.metadata.resourceVersion)
      assert(P.wait_until(function() return d:state().watches >= 1 end, 5))
      d:request("POST", GPU, class("cut1"))
      assert(P.wait_until(function() return #w.events() == 1 end, 5))
      assert.truthy(d:cut { resource = "gpuclasses" }.cut >= 1)
      assert(P.wait_until(w.done, 5))
      local last = w.events()[1].object.metadata.resourceVersion
      w.stop()
      d:request("POST", GPU, class("cut2"))
      local _, text = d:http { path = GPU .. "?watch=1&timeoutSeconds=1&resourceVersion=" .. last }
      local evs = H.json_lines(text)
      assert.are.equal(1, #evs)
      assert.are.equal("cut2", evs[1].object.metadata.name)
    end)
  end)

  describe("writes", function()
    it("answers Status objects shaped like the API server's", function()
      local st, s = d:request("POST", "/api/v1/namespaces/nope/configmaps", cm("x"))
      assert.are.equal(404, st)
      assert.are.same({ kind = "Status", apiVersion = "v1", metadata = json.object(), status = "Failure",
        message = 'namespaces "nope" not found', reason = "NotFound", details = { name = "nope", kind = "namespaces" },
        code = 404 }, s)
      st, s = d:request("POST", CM, { apiVersion = "v1", kind = "ConfigMap", metadata = {} })
      assert.are.equal(422, st)
      assert.are.equal('ConfigMap "" is invalid: metadata.name: Required value: name or generateName is required', s.message)
      assert.are.equal("metadata.name", s.details.causes[1].field)
      st, s = d:request("POST", CM, { apiVersion = "v1", kind = "ConfigMap", metadata = { generateName = "gen-" } })
      assert.are.equal(201, st)
      assert.truthy(s.metadata.name:match("^gen%-[bcdfghjklmnpqrstvwxz2456789]+$") and #s.metadata.name == 9)
      st, s = d:request("DELETE", CM .. "/" .. s.metadata.name)
      assert.are.equal(200, st)
      assert.are.same({ "Status", "Success", "configmaps" }, { s.kind, s.status, s.details.kind })
      st, s = d:request("PUT", GPU .. "/l40s", { apiVersion = "cozystack.io/v1alpha1", kind = "GPUClass",
        metadata = { name = "l40s", resourceVersion = "1" }, spec = {} })
      assert.are.equal(409, st)
      assert.are.same({ name = "l40s", group = "cozystack.io", kind = "gpuclasses" }, s.details)
    end)

    it("splits status from the rest (status subresource) and skips no-op writes", function()
      local _, o = d:request("GET", GPU .. "/l40s")
      o.status = { free = 3 }
      local st, u = d:request("PUT", GPU .. "/l40s", o)
      assert.are.equal(200, st)
      assert.is_nil(u.status)                     -- the main resource ignores status
      assert.are.equal(o.metadata.resourceVersion, u.metadata.resourceVersion)   -- nothing changed: no write
      st, u = d:request("PUT", GPU .. "/l40s/status", o)
      assert.are.equal(200, st)
      assert.are.same({ free = 3 }, u.status)
      assert.are.equal(o.metadata.generation, u.metadata.generation)
      assert.truthy(rv(u) > rv(o))
    end)

    it("writes a Workload's status with the object: Cozystack's CRD has no status subresource", function()
      -- cozystack api/v1alpha1 workload_types.go: no +kubebuilder:subresource:status
      local WL = "/apis/cozystack.io/v1alpha1/namespaces/tenant-a/workloads"
      local st, w = d:request("POST", WL, { apiVersion = "cozystack.io/v1alpha1", kind = "Workload",
        metadata = { name = "gpu-x" }, status = { kind = "gpu-device", resources = { a = "1" }, operational = false } })
      assert.are.equal(201, st)
      assert.are.same({ kind = "gpu-device", resources = { a = "1" }, operational = false }, w.status)
      w.status.operational = true
      st, w = d:request("PUT", WL .. "/gpu-x", w)
      assert.are.equal(200, st)
      assert.is_true(w.status.operational)
      assert.are.equal(404, (d:request("GET", WL .. "/gpu-x/status")))
      local out, err, code = d:kubectl { "get", "workloads", "-n", "tenant-a", "-o", "name" }
      assert.are.equal(0, code, err)
      assert.are.equal("workload.cozystack.io/gpu-x\n", out)
    end)

    it("stores nothing for dryRun=All", function()
      local st = d:request("POST", GPU .. "?dryRun=All", class("dry"))
      assert.are.equal(201, st)
      assert.are.equal(404, (d:request("GET", GPU .. "/dry")))
    end)
  end)
end)

describe("kube-double --without", function()
  it("does not serve the named types, as a cluster without their CRD: 404 and absent from discovery", function()
    local d = D.start { args = { "--without", "workloads,workloadmonitors" } }
    local ok, e = pcall(function()
      local st, s = d:request("GET", "/apis/cozystack.io/v1alpha1/namespaces/tenant-a/workloads")
      assert.are.equal(404, st)
      assert.are.equal("NotFound", s.reason)
      assert.is_nil(s.details and s.details.name) -- no object named: the resource itself is missing
      local _, v = d:request("GET", "/apis/cozystack.io/v1alpha1")
      local names = {}
      for _, r in ipairs(v.resources) do names[r.name] = true end
      assert.is_nil(names.workloads)
      assert.is_nil(names.workloadmonitors)
      assert.is_true(names.gpuclaims)
      local _, err, code = d:kubectl { "get", "workloads", "-n", "tenant-a" }
      assert.are_not.equal(0, code)
      assert.matches("the server doesn't have a resource type \"workloads\"", err, 1, true)
    end)
    d:stop()
    assert(ok, e)
  end)

  it("leaves out one version of a resource named plural.version.group, and the group's discovery follows", function()
    local d = D.start { args = { "--without", "resourceclaims.v1.resource.k8s.io,resourceclaimtemplates.v1.resource.k8s.io,deviceclasses.v1.resource.k8s.io" } }
    local ok, e = pcall(function()
      assert.are.equal(404, (d:request("GET", "/apis/resource.k8s.io/v1/resourceclaims")))
      assert.are.equal(200, (d:request("GET", "/apis/resource.k8s.io/v1beta1/resourceclaims")))
      local _, g = d:request("GET", "/apis/resource.k8s.io")
      assert.are.equal("v1beta1", g.preferredVersion.version)
      assert.are.equal(1, #g.versions)
    end)
    d:stop()
    assert(ok, e)
  end)
end)

describe("kube-double authentication", function()
  it("requires the bearer token, re-read from the token file", function()
    local dir = H.tmpdir()
    H.write(dir .. "/token", "one\n")
    local d = D.start { tls = true, token_file = dir .. "/token" }
    finally(function() d:stop() end)
    d.token = "one"
    assert.are.equal(200, (d:request("GET", "/api")))
    d.token = nil
    local st, s = d:request("GET", "/api")
    assert.are.equal(401, st)
    assert.are.equal("Unauthorized", s.reason)
    H.write(dir .. "/token", "two\n")
    d.token = "two"
    local out, err, code = d:kubectl { "get", "gpuclasses" }
    assert.are.equal(0, code, err)
    assert.are.equal("", out)
    assert.truthy(err:find("No resources found", 1, true))
  end)

  it("accepts a client certificate signed by --client-ca", function()
    local d = D.start { tls = true, client_ca = true, token = "t" }
    finally(function() d:stop() end)
    local _, err, code = d:kubectl({ "get", "ns" }, { client_cert = true })
    assert.are.equal(0, code, err)
    d.token = nil
    assert.are.equal(401, (d:request("GET", "/api/v1/namespaces")))
  end)
end)
