--- The layers of core/ and the include rule between them (README "Layout").
---
--- Every folder of core/ is one layer. A file includes its own folder's
--- headers and those of the layers listed as below it, always by the
--- layer-qualified path (`#include "base/result.h"`), never `../` or a bare
--- name of another folder. `check(root)` lists every include that breaks
--- the rule; spec/core/layers_spec.lua runs it over the tree.
local L = {}

--- The layers, bottom first, each with the layers it may include.
L.order = { "base", "format", "engine", "admission", "kube", "server", "host", "binder", "placement", "controller", "agent", "cli" }
L.below = {
  base = {},
  format = { "base" },
  engine = { "base" },
  admission = { "base", "format", "engine" },
  kube = { "base", "format" },
  server = { "base" },
  host = { "base" },
  binder = { "base" },
  placement = { "base", "format", "engine", "binder" },
  controller = { "base", "format", "engine", "admission", "kube", "server", "binder", "placement" },
  agent = { "base", "format", "engine", "kube", "host" },
  cli = { "base", "format", "engine", "admission", "kube", "server", "host", "binder", "placement", "controller", "agent" },
}

local function lines_of(cmd)
  local p = assert(io.popen(cmd))
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

--- Checks the C files under `root` (a core/ folder). Returns a sorted list
--- of violations, each "path:line: message"; empty when the rule holds.
--- @param root string
--- @return string[]
function L.check(root)
  local allowed = {}
  for layer, list in pairs(L.below) do
    allowed[layer] = { [layer] = true }
    for _, b in ipairs(list) do allowed[layer][b] = true end
  end
  local bad = {}
  for _, path in ipairs(lines_of("find " .. q(root) .. " -name '*.[ch]' | sort")) do
    local rel = path:sub(#root + 2)
    local layer = rel:match("^([^/]+)/[^/]+$")
    if not layer then
      bad[#bad + 1] = ("%s: not inside a layer folder (core/<layer>/<file>)"):format(rel)
    elseif not allowed[layer] then
      bad[#bad + 1] = ("%s: unknown layer %q (add it to spec/support/layers.lua and the README)"):format(rel, layer)
    else
      local n = 0
      for line in io.lines(path) do
        n = n + 1
        local inc = line:match('^%s*#%s*include%s+"([^"]+)"')
        if inc then
          local to = inc:match("^([%w_]+)/[^/]+$")
          if not to then
            bad[#bad + 1] = ('%s:%d: #include "%s" is not layer-qualified (write "<layer>/%s")'):format(rel, n, inc, inc:match("[^/]+$"))
          elseif not allowed[layer][to] then
            bad[#bad + 1] = ('%s:%d: #include "%s": layer %s may not include %s (above it or beside it)'):format(rel, n, inc, layer, to)
          end
        end
      end
    end
  end
  return bad
end

return L
