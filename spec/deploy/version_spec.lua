-- The version comes from one place, the VERSION file at the repository
-- root: the Makefile compiles it into the binary (with the git revision),
-- `make image` tags and labels the image with it, and the manifests run the
-- image of that tag. A bump that forgets a manifest fails here.
local core = H.core

local function version()
  local v = H.read("VERSION")
  return (assert(v:match("^(%d+%.%d+%.%d+[%w.+-]*)\n?$"), "VERSION is not a version: " .. v))
end

local IMAGE = "ghcr.io/cozystack/cozygpu"

--- The images of every container of the workloads in `path`.
local function images(path)
  local out = {}
  for _, d in ipairs(assert(core.manifests(path))) do
    local o = d.object
    local pod = o.spec and o.spec.template and o.spec.template.spec
    if pod then
      for _, list in ipairs { pod.initContainers or {}, pod.containers or {} } do
        for _, c in ipairs(list) do out[#out + 1] = c.image end
      end
    end
  end
  return out
end

describe("VERSION", function()
  local v = version()

  for _, path in ipairs { "deploy/40-controller.yaml", "deploy/60-agent.yaml" } do
    it(path .. " runs the image tagged with VERSION", function()
      local imgs = images(path)
      assert.is_true(#imgs > 0, path .. " has no container")
      for _, img in ipairs(imgs) do assert.equal(IMAGE .. ":" .. v, img) end
    end)
  end

  it("every reference to the image under deploy/ carries the VERSION tag", function()
    local p = io.popen("grep -rhoE " .. H.q(H.pat(IMAGE):gsub("%%", "\\") .. ":[^\"' ]+") .. " deploy")
    local seen = 0
    for ref in p:lines() do
      seen = seen + 1
      assert.equal(IMAGE .. ":" .. v, ref)
    end
    p:close()
    assert.is_true(seen >= 2, "expected the controller's and the agent's image references")
  end)

  it("is what `cozygpu --version` prints, with the git revision built", function()
    local out, err, code = H.run { "--version" }
    assert.equal(0, code, err)
    local got, rev = out:match("^cozygpu (%S+) %(revision (%S+)%)\n$")
    assert.equal(v, got, "cozygpu --version printed: " .. out)
    local git = io.popen("git rev-parse --short HEAD 2>/dev/null")
    local head = git:read("l")
    git:close()
    if head and head ~= "" then
      assert.equal(head, rev, "the binary was built at another commit: rebuild (make all)")
    else
      assert.equal("unknown", rev)
    end
    -- `version` is the same command
    assert.equal(out, (H.run { "version" }))
  end)
end)
