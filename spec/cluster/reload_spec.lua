-- Hot reload of the policies on a real control plane (DESIGN.md §9,
-- decisions 0009, 0018): a hoster edits the ConfigMap cozygpu-policies with
-- kubectl; the controller, watching it as its ServiceAccount (RBAC: that
-- one ConfigMap by name), compiles and self-checks the new bundle and serves
-- it, so kube-apiserver's next review gets the new answer; a broken bundle
-- is refused with a Warning Event on the ConfigMap naming the file, and
-- the old bundle keeps answering.
local P = require "proc"
local K = require "kube_cluster"
local json = H.json

local NS = "tenant-a"

local function vmi(name)
  return json.encode { apiVersion = "kubevirt.io/v1", kind = "VirtualMachineInstance",
    metadata = { name = name, namespace = NS },
    spec = { domain = { devices = { hostDevices = { { name = "nic", deviceName = "nvidia.com/cx7_vf" } } },
      resources = { requests = { memory = "1Gi" } } } } }
end

describe("policy reload through the ConfigMap", function()
  local c
  local session = K.session { invariants = true, prepare = function(cl) c = cl end }
  setup(session.setup)
  teardown(session.teardown)
  after_each(session.after_each)

  local function add_key(key, text)
    c:must { "-n", "cozy-gpu", "patch", "configmap", "cozygpu-policies", "--type", "merge", "-p",
      json.encode { data = { [key] = text } } }
  end
  local function events(reason)
    local out = {}
    for _, ev in ipairs(json.decode(c:must { "-n", "cozy-gpu", "get", "events", "-o", "json" }).items) do
      if ev.reason == reason and ev.involvedObject.kind == "ConfigMap"
          and ev.involvedObject.name == "cozygpu-policies" then out[#out + 1] = ev end
    end
    return out
  end

  it("a broken file is refused with an Event naming it, and the old bundle keeps answering", function()
    add_key("site-broken.lua", 'return rule "site/broken" {\n  match = { kind = "VirtualMachineInstance" ,\n')
    local ev = P.wait_until(function() return events("PolicyReloadFailed")[1] end, 30, 0.2)
    assert(ev, c:must { "-n", "cozy-gpu", "get", "events" })
    assert.are.equal("Warning", ev.type)
    assert.matches("ConfigMap cozy-gpu/cozygpu-policies: site-broken.lua:3:", ev.message, 1, true)
    -- the bundle that was serving still admits a plain NIC VMI
    local out, err, code = c:kubectl({ "create", "-f", "-" }, { stdin = vmi("still-served") })
    assert.are.equal(0, code, out .. err)
  end)

  it("a hoster's new rule answers kube-apiserver's next review", function()
    c:must { "-n", "cozy-gpu", "patch", "configmap", "cozygpu-policies", "--type", "json", "-p",
      '[{"op":"remove","path":"/data/site-broken.lua"}]' }
    add_key("site-no-vms.lua", [[
return rule "site/no-vms-today" {
  match = { kind = "VirtualMachineInstance", operations = { "CREATE" } },
  validate = function(req, cluster)
    return deny("no VMs with host devices today")
  end,
}
]])
    assert(P.wait_until(function()
      for _, ev in ipairs(events("PolicyReloaded")) do
        if ev.message:find("added: site-no-vms.lua", 1, true) then return true end
      end
    end, 30, 0.2), c:must { "-n", "cozy-gpu", "get", "events" })
    local out, err, code = c:kubectl({ "create", "-f", "-" }, { stdin = vmi("refused") })
    assert.are_not.equal(0, code, out)
    assert.matches('admission webhook "vmi.validate.gpu.cozystack.io" denied the request: no VMs with host devices today',
      err, 1, true)
  end)

  -- decision 0031: a key with a typo used to be ignored while the Event
  -- said it was added
  it("a key that is no policy file is named in a Warning Event, and the reload says it is ignored", function()
    add_key("site-typo.lau", 'return rule "site/typo" { match = { kind = "Pod" }, validate = function() return deny("x") end }')
    local warn = P.wait_until(function() return events("PolicyKeyIgnored")[1] end, 30, 0.2)
    assert(warn, c:must { "-n", "cozy-gpu", "get", "events" })
    assert.are.equal("Warning", warn.type)
    assert.matches("ConfigMap key(s) site-typo.lau ignored", warn.message, 1, true)
    local reloaded
    for _, ev in ipairs(events("PolicyReloaded")) do
      if ev.message:find("site-typo.lau", 1, true) then reloaded = ev.message end
    end
    assert.is_truthy(reloaded)
    assert.matches("ignored (neither NAME.lua nor NAME.test.yaml): site-typo.lau", reloaded, 1, true)
  end)
end)
