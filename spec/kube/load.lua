--- Background load for the watch specs: random creates, updates and deletes
--- of configmaps (namespaces t1, t2) and gpuclasses on the API double, with
--- watch cuts (modes close, abrupt, expired in turn) and history compaction
--- every few operations. Talks plain HTTP with curl, independently of the
--- code under test.
---   lua5.4 spec/kube/load.lua BASE_URL OPS SEED CUT_EVERY COMPACT_EVERY LOGFILE
package.path = "spec/support/?.lua;" .. package.path
local P = require "proc"

local base, ops, seed = arg[1], tonumber(arg[2]), tonumber(arg[3])
local cut_every, compact_every = tonumber(arg[4]), tonumber(arg[5])
local logf = assert(io.open(arg[6], "w"))
math.randomseed(seed)

local function call(method, path, body, ctype)
  local st = P.http { method = method, url = base .. path, body = body,
    headers = { "Content-Type: " .. (ctype or "application/json") } }
  logf:write(("%s %s %d\n"):format(method, path, st))
  logf:flush()
  return st
end

local kinds = {
  { coll = function(ns) return "/api/v1/namespaces/" .. ns .. "/configmaps" end, names = 15, nss = { "t1", "t2" },
    body = function(name, i, app)
      return ('{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s","labels":{"app":"%s"}},"data":{"i":"%d"}}'):format(name, app, i)
    end,
    patch = function(i, app) return ('{"metadata":{"labels":{"app":"%s"}},"data":{"i":"%d"}}'):format(app, i) end },
  { coll = function() return "/apis/cozystack.io/v1alpha1/gpuclasses" end, names = 10, nss = { "" },
    body = function(name, i, app)
      return ('{"apiVersion":"cozystack.io/v1alpha1","kind":"GPUClass","metadata":{"name":"%s","labels":{"app":"%s","i":"%d"}},"spec":{"displayName":"class %d"}}'):format(name, app, i, i)
    end,
    patch = function(i, app) return ('{"metadata":{"labels":{"app":"%s","i":"%d"}}}'):format(app, i) end },
}

local live = {}
local modes = { "close", "abrupt", "expired" }
local cuts = 0
for i = 1, ops do
  local k = kinds[math.random(#kinds)]
  local ns = k.nss[math.random(#k.nss)]
  local name = (k == kinds[1] and "cm" or "gc") .. math.random(0, k.names - 1)
  local key = k.coll(ns) .. "/" .. name
  local app = math.random() < 0.5 and "x" or "y"
  if not live[key] then
    if call("POST", k.coll(ns), k.body(name, i, app)) == 201 then live[key] = true end
  elseif math.random() < 0.7 then
    call("PATCH", key, k.patch(i, app), "application/merge-patch+json")
  else
    call("DELETE", key)
    live[key] = nil
  end
  if i % cut_every == 0 then
    cuts = cuts + 1
    call("POST", "/_double/cut", ('{"mode":"%s"}'):format(modes[(cuts - 1) % #modes + 1]))
  end
  if i % compact_every == 0 then call("POST", "/_double/compact", "{}") end
end
logf:write("done\n")
logf:close()
