-- Every field of the CRDs says what it is: `kubectl
-- explain gpuclass.spec.tolerations.effect` and the like print the
-- schema's description, so each property of each version's
-- openAPIV3Schema, at any depth (object properties, list items, map values),
-- has a non-empty one, as has the root; the root's metadata node is the one
-- exception (the API server allows no description there).
local core = H.core

local function crd_files()
  local p = io.popen("find deploy/crds -maxdepth 1 -type f -name '*.yaml' | sort")
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

-- Paths (like spec.tolerations[].effect) of the schema nodes without a
-- description, below `s` at `path`.
local function undescribed(s, path, out)
  if type(s) ~= "table" then return out end
  if type(s.description) ~= "string" or not s.description:find("%S") then out[#out + 1] = path end
  for name, sub in pairs(s.properties or {}) do
    if path == "" and name == "metadata" then
      -- the API server refuses a CRD whose metadata node carries anything
      -- but type and the name/generateName properties (it publishes
      -- ObjectMeta's own description); those properties are checked
      for n, f in pairs(sub.properties or {}) do undescribed(f, "metadata." .. n, out) end
    else
      undescribed(sub, path == "" and name or (path .. "." .. name), out)
    end
  end
  -- list items and map values describe the element: the list itself has
  -- the description kubectl shows; an element that is an object has fields
  -- of its own, checked above through their properties
  for _, key in ipairs { "items", "additionalProperties" } do
    local sub = s[key]
    if type(sub) == "table" then
      for name, f in pairs(sub.properties or {}) do
        undescribed(f, path .. (key == "items" and "[]." or "{}.") .. name, out)
      end
    end
  end
  return out
end

describe("the CRDs' openAPIV3Schema", function()
  local files = crd_files()
  it("are found", function() assert.is_true(#files >= 3) end)
  for _, f in ipairs(files) do
    local crd = assert(core.manifests(f))[1].object
    for _, v in ipairs(crd.spec.versions) do
      it(("%s %s: every field has a description"):format(crd.metadata.name, v.name), function()
        local missing = undescribed(v.schema.openAPIV3Schema, "", {})
        table.sort(missing)
        for i, m in ipairs(missing) do if m == "" then missing[i] = "(the root)" end end
        assert.are.same({}, missing)
      end)
    end
  end
end)
