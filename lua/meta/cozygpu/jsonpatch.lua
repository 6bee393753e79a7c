---@meta
-- cozygpu.jsonpatch — building and applying JSON Patches (RFC 6902) with
-- JSON Pointers (RFC 6901), the patch format of AdmissionReview v1
-- (`patchType: JSONPatch`) (lua/cozygpu/jsonpatch.lua). Also the global
-- `patch` of every policy.
--
-- Error conventions: a bad argument raises; a patch that does not apply
-- returns nil and a message.

---One RFC 6902 operation.
---@class cozygpu.PatchOp
---@field op "add"|"remove"|"replace"|"move"|"copy"|"test"
---@field path string a JSON Pointer
---@field value any? add, replace, test
---@field from string? move, copy

---A JSON Patch under construction: a list of cozygpu.PatchOp that encodes
---as a JSON array. Each method appends one operation and returns the
---patch, so calls chain. `path` is a pointer string ("/metadata/labels")
---or a list of segments ({"metadata", "labels", "example.com/tier"}),
---which is escaped for you (jsonpatch.pointer); in a segment list an
---integer is a 0-based array index and "-" the end of an array. A path of
---another type raises "patch path must be a string or a list of segments".
---@class cozygpu.Patch
---@field [integer] cozygpu.PatchOp
local Patch = {}

---Appends `add`: creates or replaces a member, inserts into an array
---(path ending in an index or "-"). The parent must exist: to add a key
---to an absent map, add the whole map. Raises "patch:add needs a value
---(use json.null for null)" when `value` is nil.
---@param path string|(string|integer)[]
---@param value any
---@return cozygpu.Patch
function Patch:add(path, value) end

---Appends `replace`: the member or element must exist. Raises "patch:replace
---needs a value" when `value` is nil.
---@param path string|(string|integer)[]
---@param value any
---@return cozygpu.Patch
function Patch:replace(path, value) end

---Appends `remove`: the member or element must exist.
---@param path string|(string|integer)[]
---@return cozygpu.Patch
function Patch:remove(path) end

---Appends `test`: the patch applies only if the value at `path` equals
---`value` (jsonpatch.equal). Unlike add and replace, a nil `value` is
---accepted and makes an operation that always fails.
---@param path string|(string|integer)[]
---@param value any
---@return cozygpu.Patch
function Patch:test(path, value) end

---Number of operations.
---@return integer
function Patch:len() end

---@class cozygpu.jsonpatch
local jsonpatch = {}

---A new, empty patch.
---@return cozygpu.Patch
function jsonpatch.new() end

---Escapes one reference token: "~" becomes "~0", "/" becomes "~1"
---(RFC 6901 §4); an integer becomes its decimal string.
---@param token string|integer
---@return string
function jsonpatch.escape(token) end

---A pointer from segments: `pointer{"metadata", "annotations", "a/b"}` is
---"/metadata/annotations/a~1b"; `pointer{}` is "" (the whole document).
---Raises when `segments` is not a table.
---@param segments (string|integer)[]
---@return string
function jsonpatch.pointer(segments) end

---The unescaped tokens of a pointer (`split("/a~1b/c")` is {"a/b", "c"};
---`split("")` is {}). Raises "invalid JSON pointer ... (must start with
---'/')" for anything else.
---@param ptr string
---@return string[]
function jsonpatch.split(ptr) end

---Deep equality of JSON values: objects and arrays by content, numbers by
---value (1 == 1.0). An array only equals an array: a marked JSON array
---(anything decoded, json.array) does not equal an unmarked Lua list with
---the same items, except that two empty tables are equal. Never raises.
---@param a any
---@param b any
---@return boolean
function jsonpatch.equal(a, b) end

---Applies `ops` (a cozygpu.Patch or a list of cozygpu.PatchOp: add,
---remove, replace, move, copy, test) to a deep copy of `doc`; `doc` is
---never changed and the result shares nothing with it. Returns the new
---document, or nil and a message naming the operation:
---'operation 2 (add /spec/x): member "spec" does not exist'. Raises when
---`ops` is not a table or `doc` holds something JSON cannot (json.copy).
---The admission runtime applies each rule's patch with the same results
---and messages before the next mutating rule runs; a rule may call it to
---preview its own patch.
---@param doc any JSON value (read-only views allowed)
---@param ops cozygpu.Patch|cozygpu.PatchOp[]
---@return any|nil doc
---@return string? err
function jsonpatch.apply(doc, ops) end

return jsonpatch
