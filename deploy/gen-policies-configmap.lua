-- gen-policies-configmap.lua — the policies ConfigMap (cozygpu-policies)
-- from a policy bundle directory (DESIGN.md §9; docs/decisions/0007).
--
--   lua5.4 deploy/gen-policies-configmap.lua [-o FILE] DIR
--
-- Keys: every DIR/*.lua and DIR/*.test.yaml (policy tests the controller
-- runs before it serves the bundle; docs/decisions/0018) under its file
-- name, and every DIR/lib/**.lua
-- module as "lib.<module name>.lua" (lib/site/tier.lua -> lib.site.tier.lua,
-- required as "site.tier"), because ConfigMap keys cannot hold '/'. Values
-- are YAML literal block scalars that decode to the file's bytes exactly
-- (checked by spec/deploy/policies_configmap_spec.lua through the C loader,
-- which reads YAML as kubectl does). Files YAML cannot carry that way
-- (not UTF-8, control characters, CR, the Unicode line breaks NEL, LS, PS,
-- non-characters) are refused with the file, line and byte named, as are
-- keys that are not valid ConfigMap keys and a total over 1 MiB.
--
-- With -o FILE the output is written to FILE.tmp and renamed, so a failed
-- run never leaves a truncated manifest. Exit status 0, or 1 with a message
-- on stderr. Plain Lua 5.4, no modules; `find` lists the directory.
--
-- Loaded with dofile() (as the specs do) it runs nothing and returns its
-- functions.

local M = {}

M.NAME = "cozygpu-policies"
M.NAMESPACE = "cozy-gpu"
-- Kubernetes ValidateConfigMap: keys plus values at most 1 MiB.
M.MAX_TOTAL = 1024 * 1024
-- Content indentation of the data values (data keys sit at 2).
local KEY_INDENT, VALUE_INDENT = 2, 4

--- Why `key` is not a valid ConfigMap key (k8s.io/apimachinery
--- validation.IsConfigMapKey), or nil when it is.
function M.key_error(key)
  if #key == 0 then return "must not be empty" end
  if #key > 253 then return "must be no more than 253 characters" end
  if not key:match("^[-._a-zA-Z0-9]+$") then
    return "must consist of alphanumeric characters, '-', '_' or '.'"
  end
  if key == "." or key == ".." then return "must not be '.' or '..'" end
  if key:sub(1, 2) == ".." then return "must not start with '..'" end
  return nil
end

-- Code points YAML 1.1/1.2 can print (c-printable), less the line breaks a
-- literal block would not keep as they are: CR (x0D) becomes LF, NEL (x85)
-- becomes LF, LS/PS (x2028/x2029) are breaks to libyaml and go-yaml.
-- BOM (xFEFF) is refused too: a reader may drop it.
local function printable(cp)
  if cp == 0x09 or cp == 0x0A then return true end
  if cp >= 0x20 and cp <= 0x7E then return true end
  if cp == 0x85 or cp == 0x2028 or cp == 0x2029 or cp == 0xFEFF then return false end
  if cp >= 0xA0 and cp <= 0xD7FF then return true end
  if cp >= 0xE000 and cp <= 0xFFFD then return true end
  if cp >= 0x10000 and cp <= 0x10FFFF then return true end
  return false
end

local function where(text, pos)
  local line = 1
  for _ in text:sub(1, pos - 1):gmatch("\n") do line = line + 1 end
  return ("line %d, byte %d"):format(line, pos)
end

--- Why `text` cannot be carried byte-exactly by a YAML literal block
--- scalar, or nil when it can.
function M.text_error(text)
  local ok_len, bad = utf8.len(text)
  if not ok_len then return ("%s: not valid UTF-8"):format(where(text, bad)) end
  for pos, cp in utf8.codes(text) do
    if not printable(cp) then
      return ("%s: character U+%04X cannot be carried in a YAML literal block"):format(where(text, pos), cp)
    end
  end
  return nil
end

--- `text` as a YAML block scalar value for a mapping key at indentation
--- KEY_INDENT: returns the header (what follows "key: ") and the body lines
--- joined, each line indented by VALUE_INDENT, ending in "\n". Raises when
--- text_error(text) is not nil.
---
--- Chomping by trailing newlines (YAML 1.2 §8.1.1.2): none "|-" (strip),
--- one "|" (clip), more "|+" (keep), and keep for a text of line breaks
--- only (clip and strip would drop them all). An indentation indicator is given when
--- the first non-empty line starts with a space, since auto-detection would
--- take that space for indentation (§8.1.1.1); its digit is relative to the
--- parent mapping's indentation.
function M.block_scalar(text)
  local err = M.text_error(text)
  if err then error(err, 2) end
  if text == "" then return "\"\"", "" end
  local trailing = #text:match("\n*$")
  local chomp = trailing == 0 and "-" or (trailing == 1 and "" or "+")
  -- only line breaks: clip would drop them all (no content line to end)
  if trailing == #text then chomp = "+" end
  local body = text
  if trailing > 0 then body = text:sub(1, #text - 1) end -- the last break ends the last line
  local lines = {}
  for line in (body .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
  local indicator = ""
  for _, line in ipairs(lines) do
    if #line > 0 then
      local c = line:sub(1, 1)
      if c == " " or c == "\t" then indicator = tostring(VALUE_INDENT - KEY_INDENT) end
      break
    end
  end
  local pad = (" "):rep(VALUE_INDENT)
  local out = {}
  for i, line in ipairs(lines) do
    out[i] = (#line > 0 and pad .. line or "") .. "\n"
  end
  return "|" .. indicator .. chomp, table.concat(out)
end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("a")
  f:close()
  return s
end

--- The files of bundle `dir`: a list of {key=, path=} sorted by key, or
--- nil and a message. Policies are dir/*.lua (not starting with '.', as
--- the engine lists them); modules are dir/lib/**.lua. Other files are
--- returned in `ignored` (the engine does not read them either).
function M.collect(dir)
  dir = dir:gsub("/+$", "")
  local p = io.popen("find -L " .. shell_quote(dir) .. " -mindepth 1 -type f -print0 2>/dev/null && echo ok", "r")
  local listing = p:read("a")
  p:close()
  if not listing:match("ok\n$") then return nil, dir .. ": cannot list the directory" end
  listing = listing:sub(1, #listing - 3)
  local files, seen, ignored = {}, {}, {}
  for path in listing:gmatch("([^%z]+)%z") do
    local rel = path:sub(#dir + 2)
    local key, problem
    local name = rel:match("^([^/]+)$")
    if name then
      if name:sub(1, 1) ~= "." and #name > #".test.yaml" and name:sub(-#".test.yaml") == ".test.yaml" then
        key = name -- the bundle's own policy tests: the controller's reload gate runs them (decision 0018)
      elseif name:sub(1, 1) ~= "." and #name >= 5 and name:sub(-4) == ".lua" then
        key = name
        if name:sub(1, 4) == "lib." then
          problem = "policy file names starting with \"lib.\" are reserved for lib/ modules"
        end
      end
    else
      local mod = rel:match("^lib/(.+)%.lua$")
      if mod then
        local parts = {}
        for part in mod:gmatch("[^/]+") do
          if part:find(".", 1, true) or not part:match("^[A-Za-z0-9_-]+$") then
            problem = ("module path component %q: use letters, digits, '_' and '-' (a '.' would be read as a directory)"):format(part)
          end
          parts[#parts + 1] = part
        end
        key = "lib." .. table.concat(parts, ".") .. ".lua"
      end
    end
    if key then
      problem = problem or M.key_error(key)
      if problem then return nil, ("%s: key %q: %s"):format(path, key, problem) end
      if seen[key] then return nil, ("%s: key %q: also the key of %s"):format(path, key, seen[key]) end
      seen[key] = path
      files[#files + 1] = { key = key, path = path }
    else
      ignored[#ignored + 1] = path
    end
  end
  table.sort(files, function(a, b) return a.key < b.key end)
  table.sort(ignored)
  if #files == 0 then return nil, dir .. ": no policy files (*.lua)" end
  return files, nil, ignored
end

--- The ConfigMap manifest for `files` ({key=, path=, text=}), or nil and
--- a message naming the file at fault. `source` names the bundle in the
--- header comment.
function M.render(files, source)
  local out = {
    "# GENERATED by deploy/gen-policies-configmap.lua from " .. source .. "/ -- do not edit.\n",
    "# The default policy bundle as deployed (docs/decisions/0007). A hoster\n",
    "# edits the ConfigMap in the cluster: a key of the same name replaces a\n",
    "# default, a new key adds a rule, lib.<module>.lua is a lib/ module.\n",
    "apiVersion: v1\n",
    "kind: ConfigMap\n",
    "metadata:\n",
    "  name: " .. M.NAME .. "\n",
    "  namespace: " .. M.NAMESPACE .. "\n",
    "  labels:\n",
    "    app.kubernetes.io/name: cozygpu\n",
    "    app.kubernetes.io/component: policies\n",
    "    app.kubernetes.io/part-of: cozygpu\n",
    "data:\n",
  }
  local total = 0
  for _, f in ipairs(files) do
    local err = M.key_error(f.key)
    if err then return nil, ("%s: key %q: %s"):format(f.path, f.key, err) end
    err = M.text_error(f.text)
    if err then return nil, ("%s: %s"):format(f.path, err) end
    local header, body = M.block_scalar(f.text)
    out[#out + 1] = (" "):rep(KEY_INDENT) .. f.key .. ": " .. header .. "\n"
    out[#out + 1] = body
    total = total + #f.key + #f.text
  end
  if total > M.MAX_TOTAL then
    return nil, ("%s: the ConfigMap would hold %d bytes, over the %d a ConfigMap may hold"):format(source, total, M.MAX_TOTAL)
  end
  return table.concat(out)
end

--- The ConfigMap manifest for bundle directory `dir`, or nil and a message.
function M.generate(dir)
  local files, err, ignored = M.collect(dir)
  if not files then return nil, err end
  for _, f in ipairs(files) do
    local text, rerr = read_file(f.path)
    if not text then return nil, rerr end
    f.text = text
  end
  local manifest, rerr = M.render(files, (dir:gsub("/+$", "")))
  return manifest, rerr, ignored
end

local function main(args)
  local out, dir
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "-o" then
      out = args[i + 1]
      i = i + 2
    elseif a == "-h" or a == "--help" then
      io.stdout:write("usage: lua5.4 deploy/gen-policies-configmap.lua [-o FILE] DIR\n")
      return 0
    elseif dir == nil and a:sub(1, 1) ~= "-" then
      dir = a
      i = i + 1
    else
      io.stderr:write("gen-policies-configmap: unexpected argument ", a, "\n")
      return 1
    end
  end
  if not dir or (out == nil and args[#args] == "-o") then
    io.stderr:write("usage: lua5.4 deploy/gen-policies-configmap.lua [-o FILE] DIR\n")
    return 1
  end
  local manifest, err, ignored = M.generate(dir)
  if not manifest then
    io.stderr:write("gen-policies-configmap: ", err, "\n")
    return 1
  end
  for _, p in ipairs(ignored or {}) do
    io.stderr:write("gen-policies-configmap: note: ", p, " is not a policy, a NAME.test.yaml or a lib/ module; not included\n")
  end
  if out then
    local tmp = out .. ".tmp"
    local f, oerr = io.open(tmp, "wb")
    if not f then
      io.stderr:write("gen-policies-configmap: ", oerr, "\n")
      return 1
    end
    local ok, werr = f:write(manifest)
    local cok, cerr = f:close()
    if not ok or not cok then
      os.remove(tmp)
      io.stderr:write("gen-policies-configmap: ", tmp, ": ", tostring(werr or cerr), "\n")
      return 1
    end
    local rok, rerr = os.rename(tmp, out)
    if not rok then
      os.remove(tmp)
      io.stderr:write("gen-policies-configmap: ", rerr, "\n")
      return 1
    end
  else
    io.stdout:write(manifest)
  end
  return 0
end

M.main = main

if arg and arg[0] and arg[0]:match("gen%-policies%-configmap%.lua$") then
  os.exit(main(arg))
end
return M
