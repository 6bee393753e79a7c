-- `cozygpu review` end to end: the binary, real fixtures, exit codes.
local json = H.json
local SNAP = { "--cluster", "examples/classes", "--cluster", "examples/cluster", "--config", "examples/config.yaml" }

local function review(files, extra)
  local args = { "review" }
  for _, a in ipairs(SNAP) do args[#args + 1] = a end
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  for _, f in ipairs(files) do args[#args + 1] = f end
  return H.run(args)
end

describe("cozygpu review", function()
  it("answers every example with the decision its header states", function()
    local out, err, code = review({ "examples/reviews" })
    assert.are.equal(0, code, err)
    local want = {
      ["7f0c2c52-0001-4d6a-9d0a-000000000001"] = true,
      ["7f0c2c52-0002-4d6a-9d0a-000000000002"] = false,
      ["7f0c2c52-0003-4d6a-9d0a-000000000003"] = false,
      ["7f0c2c52-0004-4d6a-9d0a-000000000004"] = false,
      ["7f0c2c52-0005-4d6a-9d0a-000000000005"] = false,
      ["7f0c2c52-0006-4d6a-9d0a-000000000006"] = true,
      ["7f0c2c52-0007-4d6a-9d0a-000000000007"] = true,
      ["7f0c2c52-0008-4d6a-9d0a-000000000008"] = false,
      ["7f0c2c52-0009-4d6a-9d0a-000000000009"] = true,
      ["7f0c2c52-0010-4d6a-9d0a-000000000010"] = false,
    }
    local reviews = H.json_lines(out)
    assert.are.equal(10, #reviews)
    for _, r in ipairs(reviews) do
      assert.are.equal("admission.k8s.io/v1", r.apiVersion)
      assert.are.equal("AdmissionReview", r.kind)
      assert.are.equal(want[r.response.uid], r.response.allowed, r.response.uid)
      if not r.response.allowed then
        assert.is_string(r.response.status.message)
        assert.is_nil(r.response.patch)
      end
    end
    -- the VM is judged as its VMI, and the answer says so
    assert.matches("VirtualMachineInstance from spec.template of VirtualMachine tenant%-a/vgpu%-smoke",
      reviews[9].response.auditAnnotations["gpu.cozystack.io/judged-as"])
  end)

  it("exits 1 with --fail-on-deny when a review was refused", function()
    local _, _, code = review({ "examples/reviews/02-vmi-two-vgpu-classes.yaml" }, { "--fail-on-deny" })
    assert.are.equal(1, code)
    _, _, code = review({ "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml" }, { "--fail-on-deny" })
    assert.are.equal(0, code)
  end)

  it("prints one readable line per review with --output table", function()
    local out, _, code = review({ "examples/reviews/02-vmi-two-vgpu-classes.yaml", "examples/reviews/07-launcher-pod-l40s.json" }, { "--output", "table" })
    assert.are.equal(0, code)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(2, #lines)
    assert.matches("^DENIED  examples/reviews/02%-vmi%-two%-vgpu%-classes.yaml  403 ", lines[1])
    assert.matches("^ALLOWED examples/reviews/07%-launcher%-pod%-l40s.json  patch: add /spec/tolerations/%-", lines[2])
  end)

  it("exits 2 on truncated JSON, a tab-indented YAML and a review without request.uid, naming each file, and answers the rest", function()
    local dir = H.tmpdir()
    H.write(dir .. "/a-truncated.json", '{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "x"')
    H.write(dir .. "/b-tab.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n\tname: p\n")
    H.write(dir .. "/c-no-uid.json", '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE","kind":{"group":"","version":"v1","kind":"Pod"}}}')
    H.write(dir .. "/d-good.yaml", H.read("examples/reviews/01-vmi-l40s-and-connectx-vf.yaml"))
    local out, err, code = review({ dir })
    assert.are.equal(2, code)
    assert.matches(H.pat(dir) .. "/a%-truncated.json:1:%d+: ", err)
    assert.matches(H.pat(dir) .. "/b%-tab.yaml:4:1: found character that cannot start any token", err)
    assert.matches(H.pat(dir) .. "/c%-no%-uid.json: request.uid is missing", err)
    local reviews = H.json_lines(out)
    assert.are.equal(1, #reviews)
    assert.are.equal("7f0c2c52-0001-4d6a-9d0a-000000000001", reviews[1].response.uid)
  end)

  it("exits 2 on an escape kubectl refuses (\\/ in a double-quoted string), naming the file, line and column, and answers the rest", function()
    -- go-yaml v2 (kubectl) knows no "\/" escape and fails with "found unknown
    -- escape character"; libyaml would read the device name unchanged
    local dir = H.tmpdir()
    local good = H.read("examples/reviews/01-vmi-l40s-and-connectx-vf.yaml")
    local bad, n = good:gsub("deviceName: nvidia.com/AD102GL_L40S", 'deviceName: "nvidia.com\\/AD102GL_L40S"')
    assert.are.equal(1, n)
    H.write(dir .. "/a-slash.yaml", bad)
    H.write(dir .. "/b-good.yaml", (good:gsub("deviceName: nvidia.com/AD102GL_L40S", 'deviceName: "nvidia.com/AD102GL_L40S"')))
    local out, err, code = review({ dir })
    assert.are.equal(2, code)
    assert.matches(H.pat(dir) .. "/a%-slash.yaml:51:36: found unknown escape character %(while parsing a quoted scalar at line 51, column 25%)", err)
    local reviews = H.json_lines(out)
    assert.are.equal(1, #reviews)
    assert.are.equal("7f0c2c52-0001-4d6a-9d0a-000000000001", reviews[1].response.uid)
    assert.is_true(reviews[1].response.allowed)
  end)

  it("exits 2 on an unknown settings key, naming the file and the key", function()
    local dir = H.tmpdir()
    H.write(dir .. "/cfg.yaml", "rawResourceNames: Warn\nrawNames: Forbidden\n")
    local out, err, code = H.run { "review", "--config", dir .. "/cfg.yaml", "examples/reviews/01-vmi-l40s-and-connectx-vf.yaml" }
    assert.are.equal(2, code)
    assert.are.equal("", out)
    assert.matches(H.pat(dir) .. '/cfg.yaml: unknown key "rawNames"', err)
  end)

  it("wraps a plain object as a CREATE by the user given", function()
    local out, _, code = review({ "examples/classes/l40s.yaml" }, { "--user", "alice", "--webhook", "validating" })
    assert.are.equal(0, code)
    local r = H.json_lines(out)[1]
    assert.is_true(r.response.allowed)
    assert.matches("^00000000%-0000%-4000%-8000%-", r.response.uid)
  end)
end)

-- Every VMI, VM and Pod manifest and every AdmissionReview among the shared
-- fixtures goes through review without an error. The decision each should
-- get, against examples/classes + examples/cluster, and why:
local F = H.fixtures
local EXPECT = {
  -- KubeVirt's own example: a Tesla P40 by a name Cozystack's KubeVirt CR does not permit
  ["kubevirt/kubevirt-examples/vmi-gpu.yaml"] = { false, "GP102GL_Tesla_P40\" is not permitted by KubeVirt" },
  -- DRA GPU entry (claimName): not a device-plugin name, no class: raw, allowed
  ["kubevirt/kubevirt-examples/vmi-dra-pgpu.yaml"] = { true },
  -- SR-IOV NIC and USB host devices are not GPU entries
  ["kubevirt/kubevirt-examples/vmi-sriov.yaml"] = { true },
  ["kubevirt/kubevirt-examples/vmi-usb.yaml"] = { true },
  ["kubevirt/kubevirt-examples/pgpu-resource-claim-tmpl.yaml"] = { true },
  -- T4 and GRID T4-1Q are not in the permitted table
  ["kubevirt/kubevirt-user-guide/host-devices-vmi-gpus-hostDevices.yaml"] = { false, "TU104GL_Tesla_T4\" is not permitted" },
  ["kubevirt/kubevirt-user-guide/host-devices-vmi-nvme.yaml"] = { true },
  ["kubevirt/nvidia-kubevirt-gpu-device-plugin/vmi-gpu.yaml"] = { false, "is not permitted by KubeVirt" },
  ["kubevirt/nvidia-kubevirt-gpu-device-plugin/vmi-vgpu.yaml"] = { false, "is not permitted by KubeVirt" },
  -- Cozystack's vGPU sample names nvidia.com/L40S-24Q, which no class and no
  -- permitted entry carries: its hostDevice is not a GPU entry at all
  ["kubevirt/cozystack/docs-gpu-vgpu-sample-vm.yaml"] = { true },
  -- no GPUs
  ["kubevirt/harvester/virt-launcher-pod-vm2.json"] = { true },
  ["kubevirt/harvester/vmi-vm2-running-with-status.json"] = { true },
  -- API round-trip data: GPU entries are DRA (claimName), so no class applies
  ["kubevirt/kubevirt-api-testdata/kubevirt.io.v1.VirtualMachineInstance.json"] = { true },
  ["kubevirt/kubevirt-api-testdata/kubevirt.io.v1.VirtualMachineInstance.yaml"] = { true },
  ["kubevirt/kubevirt-api-testdata/kubevirt.io.v1.VirtualMachine.json"] = { true },
  ["kubevirt/kubevirt-api-testdata/kubevirt.io.v1.VirtualMachine.yaml"] = { true },
  -- AdmissionReviews: a pod without GPUs, a VM without GPUs, a dry-run pod,
  -- placeholder data (operation "operationValue" matches no rule)
  ["admission/member-operator/admissionreview-pod-create.json"] = { true },
  ["admission/member-operator/admissionreview-virtualmachine-create.json"] = { true },
  ["admission/recorded/gatekeeper-input-review-pod-create-dryrun.json"] = { true },
  -- Kubernetes' API round-trip data: every field holds a placeholder
  -- ("operationValue"), a request no API server sends; refused as input
  -- like the webhook refuses it (admission/request.h)
  ["admission/k8s-api-testdata/admission.k8s.io.v1.AdmissionReview.json"] = "input error: request.operation must be one of CREATE, UPDATE, DELETE, CONNECT (got \"operationValue\")",
  ["admission/k8s-api-testdata/admission.k8s.io.v1.AdmissionReview.yaml"] = "input error: request.operation must be one of CREATE, UPDATE, DELETE, CONNECT (got \"operationValue\")",
  ["admission/k8s-docs/request-scale-update.v1.commented.yaml"] = { true },
  -- recorded responses: nothing to review (skipped with a note)
  ["admission/k8s-docs/response-allow-minimal.json"] = "skip",
  ["admission/k8s-docs/response-deny-minimal.json"] = "skip",
  ["admission/k8s-docs/response-deny-with-status.json"] = "skip",
  ["admission/k8s-docs/response-allow-jsonpatch.json"] = "skip",
  ["admission/k8s-docs/response-allow-with-warnings.json"] = "skip",
}

describe("cozygpu review over the shared fixtures", function()
  -- the fixture files that hold a VMI, VM or Pod, or an AdmissionReview
  local function in_scope(path)
    if path:match("%.tpl$") or path:match("%.partial%.yaml$") then return false end
    local ok, recs = pcall(H.core.manifests, F .. "/" .. path)
    if not ok or not recs then return false end
    for _, r in ipairs(recs) do
      local k = r.object.kind
      if k == "AdmissionReview" or (type(k) == "table" and r.object.operation) then return true end
      if k == "VirtualMachineInstance" or k == "VirtualMachine" or k == "Pod" then return true end
    end
    return false
  end

  it("covers every such fixture with a stated decision", function()
    local p = io.popen("cd " .. H.q(F) .. " && find kubevirt admission -type f | sort")
    local missing = {}
    for path in p:lines() do
      if in_scope(path) and EXPECT[path] == nil then missing[#missing + 1] = path end
    end
    p:close()
    assert.are.same({}, missing)
  end)

  for path, want in pairs(EXPECT) do
    it(path, function()
      local out, err, code = review({ F .. "/" .. path })
      if type(want) == "string" and want:match("^input error: ") then
        assert.are.equal(2, code, err)
        assert.is_truthy(err:find(path .. ": " .. want:sub(#"input error: " + 1), 1, true), err)
        return
      end
      assert.are.equal(0, code, err)
      if want == "skip" then
        assert.are.equal("", out)
        assert.matches("nothing to review", err)
        return
      end
      local r = H.json_lines(out)
      assert.is_true(#r >= 1)
      assert.are.equal(want[1], r[1].response.allowed, r[1].response.status and r[1].response.status.message)
      if want[2] then assert.is_truthy(r[1].response.status.message:find(want[2], 1, true)) end
    end)
  end
end)

describe("cozygpu policy test", function()
  it("passes the example policy tests", function()
    local out, err, code = H.run { "policy", "test", "examples/policy-tests" }
    assert.are.equal(0, code, out .. err)
    assert.matches("(%d+) passed, 0 failed", out)
  end)

  it("exits 1 and says why when a case fails", function()
    local dir = H.tmpdir()
    H.write(dir .. "/t.yaml", ([[
cluster: [%s/examples/classes, %s/examples/cluster]
cases:
- name: wrongly expects two vGPU classes to pass
  input: %s/examples/reviews/02-vmi-two-vgpu-classes.yaml
  expect: {allowed: true}
- name: refusal with its code and message
  input: %s/examples/reviews/02-vmi-two-vgpu-classes.yaml
  expect: {allowed: false, code: 403, message: "one class only"}
]]):gsub("%%s", (io.popen("pwd"):read("l"))))
    local out, _, code = H.run { "policy", "test", dir }
    assert.are.equal(1, code)
    assert.matches("FAIL .*wrongly expects two vGPU classes to pass\n%s+expected allowed, got refused: spec.domain.devices: vGPU devices of more than one class", out)
    assert.matches("PASS .*refusal with its code and message", out)
    assert.matches("1 passed, 1 failed", out)
  end)

  -- A fresh hoster's report (decision 0012): a case expecting 403 from a rule that
  -- raised said only "expected status code 403, got 500"; which policy
  -- failed, and where, took a second run through `review` to find.
  it("shows the refusal's message when the status code differs", function()
    local pol = H.tmpdir()
    H.write(pol .. "/site-broken.lua", "return rule 'site/broken' {\n  match = { kind = 'VirtualMachineInstance' },\n  validate = function(req)\n    return Deny('no')\n  end,\n}\n")
    local dir = H.tmpdir()
    H.write(dir .. "/t.yaml", ([[
cluster: [%s/examples/classes, %s/examples/cluster]
cases:
- name: expects the site rule's refusal
  input: %s/examples/reviews/01-vmi-l40s-and-connectx-vf.yaml
  expect: {allowed: false, code: 403}
]]):gsub("%%s", (io.popen("pwd"):read("l"))))
    local out, _, code = H.run { "policy", "test", "--override", pol, dir }
    assert.are.equal(1, code)
    assert.truthy(out:find('expected status code 403, got 500: policy "site/broken" failed: ', 1, true), out)
    assert.truthy(out:find("site-broken.lua:4: attempt to call a nil value (global 'Deny')", 1, true), out)
  end)
end)
