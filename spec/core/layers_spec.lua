-- The layer rule of core/ (README "Layout", spec/support/layers.lua): a
-- folder includes only itself and the layers below it.
local layers = require "layers"

local function write(path, text)
  os.execute("mkdir -p '" .. path:match("^(.*)/[^/]+$") .. "'")
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

describe("core/ layers", function()
  it("no file includes a folder above it or beside it", function()
    assert.same({}, layers.check("core"))
  end)

  it("every layer folder exists and holds C, and the README draws the same order", function()
    local readme = assert(io.open("README.md")):read("a")
    readme = readme:sub((assert(readme:find("## Layout", 1, true), "README has no Layout section")))
    local last = 0
    for _, layer in ipairs(layers.order) do
      local p = io.popen("ls core/" .. layer .. "/*.c 2>/dev/null | wc -l")
      assert.is_true(tonumber(p:read("a")) > 0, "core/" .. layer .. " holds no C file")
      p:close()
      local at = readme:find("core/" .. layer .. "/", 1, true)
      assert.is_truthy(at, "README Layout does not name core/" .. layer .. "/")
      assert.is_true(at > last, "README Layout names core/" .. layer .. "/ out of order")
      last = at
    end
  end)

  it("README's 'may include' column says what spec/support/layers.lua allows", function()
    local readme = assert(io.open("README.md")):read("a")
    local col = assert(readme:find("may include", 1, true), "README Layout has no 'may include' column")
    local line_start = readme:sub(1, col):match(".*()\n") or 1
    local at = col - line_start -- column of the header within its line
    local said, current = {}, nil
    local rows = readme:sub((assert(readme:find("\n", col, true))) + 1)
    for line in rows:gmatch("[^\n]+") do
      if not line:match("^  ") then break end
      local name = line:match("^  core/([%w_]+)/")
      if name then current = name; said[name] = {} end
      if current then
        for w in line:sub(at):gmatch("[%w()]+") do said[current][#said[current] + 1] = w end
      end
    end
    for i, layer in ipairs(layers.order) do
      local want = layers.below[layer]
      local got = said[layer]
      assert.is_truthy(got, "README does not list core/" .. layer .. "/")
      local text = table.concat(got, " ")
      if #want == 0 then
        assert.equal("(nothing)", text, layer)
      elseif text == "all of the above" then
        local above = {}
        for k = 1, i - 1 do above[k] = layers.order[k] end
        assert.same(above, want, layer)
      else
        assert.same(want, got, layer)
      end
    end
  end)

  it("reports an upward include, a sideways one, an unqualified one and a stray file", function()
    local root = os.tmpname()
    os.remove(root)
    write(root .. "/base/log.c", '#include "base/log.h"\n#include "kube/kube.h"\n')
    write(root .. "/host/inventory.c", '#include "host/inventory.h"\n#include "base/result.h"\n#include "server/webhook.h"\n')
    write(root .. "/kube/watch.c", '#include "watch.h"\n  # include "format/yamlload.h"\n')
    write(root .. "/stray.c", "int x;\n")
    local got = layers.check(root)
    os.execute("rm -rf '" .. root .. "'")
    assert.same({
      'base/log.c:2: #include "kube/kube.h": layer base may not include kube (above it or beside it)',
      'host/inventory.c:3: #include "server/webhook.h": layer host may not include server (above it or beside it)',
      'kube/watch.c:1: #include "watch.h" is not layer-qualified (write "<layer>/watch.h")',
      "stray.c: not inside a layer folder (core/<layer>/<file>)",
    }, got)
  end)
end)
