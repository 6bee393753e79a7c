--- cozygpu.jsonpatch — building and applying JSON Patches (RFC 6902) with
--- JSON Pointers (RFC 6901), the patch format of AdmissionReview v1
--- (`patchType: JSONPatch`).
---
--- Error conventions: misuse (a bad argument) raises; a patch that does not
--- apply returns `nil, message`.
local json = require "cozygpu.json"

local M = {}

--- Escapes one reference token: `~` -> `~0`, `/` -> `~1` (RFC 6901 §4).
--- @param token string|integer
--- @return string
function M.escape(token)
  return (tostring(token):gsub("~", "~0"):gsub("/", "~1"))
end

--- Builds a pointer from segments: `pointer{"metadata","annotations","a/b"}`
--- is `/metadata/annotations/a~1b`. Integers are array indexes (0-based, as
--- in JSON Pointer); `"-"` is the end of an array.
--- @param segments (string|integer)[]
--- @return string
function M.pointer(segments)
  local parts = {}
  for i = 1, #segments do parts[i] = "/" .. M.escape(segments[i]) end
  return table.concat(parts)
end

--- Splits a pointer into unescaped tokens. Raises on a pointer that does
--- not start with "/" (and is not "").
--- @param ptr string
--- @return string[]
function M.split(ptr)
  if ptr == "" then return {} end
  if type(ptr) ~= "string" or ptr:sub(1, 1) ~= "/" then
    error(("invalid JSON pointer %q (must start with '/')"):format(tostring(ptr)), 2)
  end
  local tokens = {}
  for raw in (ptr:sub(2) .. "/"):gmatch("(.-)/") do
    tokens[#tokens + 1] = raw:gsub("~1", "/"):gsub("~0", "~")
  end
  return tokens
end

-- protected (getmetatable answers "cozygpu.Patch"): every rule's patches
-- share it, so no policy may change a method under another rule
local Patch = { __jsontype = "array", __metatable = "cozygpu.Patch" }
Patch.__index = Patch

--- A new, empty patch: a list of operations that encodes as a JSON array.
--- Methods add/replace/remove/test append one operation and return the
--- patch, so calls chain. `path` is a pointer string or a segment list.
--- @return table patch
function M.new()
  return setmetatable({}, Patch)
end

local function path_of(p)
  if type(p) == "table" then return M.pointer(p) end
  if type(p) ~= "string" then error("patch path must be a string or a list of segments", 3) end
  return p
end

function Patch:add(path, value)
  if value == nil then error("patch:add needs a value (use json.null for null)", 2) end
  self[#self + 1] = { op = "add", path = path_of(path), value = value }
  return self
end

function Patch:replace(path, value)
  if value == nil then error("patch:replace needs a value", 2) end
  self[#self + 1] = { op = "replace", path = path_of(path), value = value }
  return self
end

function Patch:remove(path)
  self[#self + 1] = { op = "remove", path = path_of(path) }
  return self
end

function Patch:test(path, value)
  self[#self + 1] = { op = "test", path = path_of(path), value = value }
  return self
end

--- Number of operations.
function Patch:len() return #self end

local function empty(t)
  for _ in pairs(t) do return false end
  return true
end

-- deep equality over JSON values (objects/arrays compared by content)
local function equal(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  local ka, kb = json.kind(a), json.kind(b)
  if (ka == "array") ~= (kb == "array") then
    -- an unmarked empty table equals either kind
    if not (empty(a) and empty(b)) then return false end
  end
  for k, v in pairs(a) do if not equal(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end
M.equal = equal

local function is_array(t)
  return json.kind(t) == "array"
end

local function array_index(token, len, allow_end)
  if allow_end and token == "-" then return len + 1 end
  if not token:match("^%d+$") or (token:len() > 1 and token:sub(1, 1) == "0") then return nil end
  local i = tonumber(token) + 1
  if i > len + (allow_end and 1 or 0) then return nil end
  return i
end

-- A one-level copy of container t (a read-only view's children stay views),
-- keeping its JSON kind.
local function shallow(t)
  local kind = json.kind(t)
  local c = kind == "array" and json.array() or kind == "object" and json.object() or {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- walks to the parent of the last token; returns parent, last token.
-- With `fresh` (a set of containers this apply made), every container on
-- the way that is not fresh is replaced by a one-level copy first, so the
-- caller may change the parent without touching shared parts.
local function parent_of(doc, tokens, fresh)
  local node = doc
  for i = 1, #tokens - 1 do
    local t = tokens[i]
    if type(node) ~= "table" then return nil, "path crosses a non-container" end
    local key
    if is_array(node) then
      key = array_index(t, #node, false)
      if not key then return nil, ("array index %q out of range"):format(t) end
    else
      key = t
      if node[key] == nil then return nil, ("member %q does not exist"):format(t) end
    end
    local child = node[key]
    if fresh and type(child) == "table" and not fresh[child] then
      child = shallow(child)
      fresh[child] = true
      node[key] = child
    end
    node = child
  end
  if type(node) ~= "table" then return nil, "parent is not an object or array" end
  return node, tokens[#tokens]
end

local function get(doc, tokens)
  if #tokens == 0 then return doc end
  local parent, last = parent_of(doc, tokens)
  if not parent then return nil, last end
  if is_array(parent) then
    local idx = array_index(last, #parent, false)
    if not idx then return nil, ("array index %q out of range"):format(last) end
    return parent[idx]
  end
  local v = parent[last]
  if v == nil then return nil, ("member %q does not exist"):format(last) end
  return v
end

local function add(doc, tokens, value, fresh)
  if #tokens == 0 then return value end
  local parent, last = parent_of(doc, tokens, fresh)
  if not parent then return nil, last end
  if is_array(parent) then
    local idx = array_index(last, #parent, true)
    if not idx then return nil, ("array index %q out of range"):format(last) end
    table.insert(parent, idx, value)
  else
    parent[last] = value
  end
  return doc
end

local function remove(doc, tokens, fresh)
  if #tokens == 0 then return nil, "cannot remove the whole document" end
  local parent, last = parent_of(doc, tokens, fresh)
  if not parent then return nil, last end
  if is_array(parent) then
    local idx = array_index(last, #parent, false)
    if not idx then return nil, ("array index %q out of range"):format(last) end
    return doc, table.remove(parent, idx)
  end
  local old = parent[last]
  if old == nil then return nil, ("member %q does not exist"):format(last) end
  parent[last] = nil
  return doc, old
end

-- Applies ops to `out`, changing it in place; with `fresh` (copy on
-- write), containers not in `fresh` are copied before they change.
local function apply_ops(out, ops, fresh)
  for i, op in ipairs(ops) do
    if fresh and type(out) == "table" and not fresh[out] then
      out = shallow(out)
      fresh[out] = true
    end
    local function fail(msg)
      return nil, ("operation %d (%s %s): %s"):format(i, tostring(op.op), tostring(op.path), msg)
    end
    if type(op.path) ~= "string" then return fail("missing path") end
    local okp, tokens = pcall(M.split, op.path)
    if not okp then return fail(tokens) end
    local kind, err = op.op, nil
    if kind == "add" then
      if op.value == nil then return fail("missing value") end
      out, err = add(out, tokens, json.copy(op.value), fresh)
    elseif kind == "remove" then
      out, err = remove(out, tokens, fresh)
      if out == nil then return fail(err) end
    elseif kind == "replace" then
      if op.value == nil then return fail("missing value") end
      local _, e = get(out, tokens)
      if e then return fail(e) end
      if #tokens == 0 then out = json.copy(op.value) else
        out, err = remove(out, tokens, fresh)
        if out then out, err = add(out, tokens, json.copy(op.value), fresh) end
      end
    elseif kind == "move" or kind == "copy" then
      local okf, from = pcall(M.split, op.from or "")
      if not okf or op.from == nil then return fail("missing or invalid from") end
      local v, e = get(out, from)
      if e then return fail(e) end
      if kind == "move" then
        if op.path:sub(1, #op.from + 1) == op.from .. "/" then return fail("cannot move a value into itself") end
        out, err = remove(out, from, fresh)
        if out then out, err = add(out, tokens, v, fresh) end
      else
        out, err = add(out, tokens, json.copy(v), fresh)
      end
    elseif kind == "test" then
      local v, e = get(out, tokens)
      if e then return fail(e) end
      if not equal(v, op.value) then return fail("test failed") end
    else
      return fail("unknown operation")
    end
    if out == nil then return fail(err) end
  end
  return out
end

--- Applies `ops` (a list of RFC 6902 operations) to a deep copy of `doc`.
--- Returns the new document, or `nil, message` naming the failing
--- operation ("operation 2 (add /spec/x): member \"spec\" does not exist").
--- `doc` is never modified; the result shares nothing with it.
--- @param doc any JSON value (read-only views allowed)
--- @param ops table[]
--- @return any|nil, string?
function M.apply(doc, ops)
  return apply_ops(json.copy(doc), ops, nil)
end

--- Like apply, but the result shares every part the patch does not touch
--- with `doc` (copy on write along each operation's path), so a patch of a
--- few fields costs a few one-level copies instead of a deep copy. Neither
--- `doc` nor the result may be changed afterwards (admission passes both to
--- rules only as read-only views). Same results and messages as apply.
--- @param doc any JSON value (read-only views allowed)
--- @param ops table[]
--- @return any|nil, string?
function M.apply_shared(doc, ops)
  return apply_ops(doc, ops, {})
end

return M
