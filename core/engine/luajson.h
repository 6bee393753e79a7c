/* luajson.h — lossless conversion between jansson values and Lua values.
 *
 * Shapes (what a policy sees):
 *   JSON object  -> Lua table whose metatable is the shared object marker
 *   JSON array   -> Lua table 1..n whose metatable is the array marker
 *   JSON null    -> json.null (a light userdata, NULL); absent stays nil
 *   JSON integer -> Lua integer (64-bit, exact);  JSON real -> Lua float
 *   string/bool  -> string/boolean
 * so `emptyDir: {}` and `ports: []` survive a round trip, and null is kept
 * apart from absent (Kubernetes merge semantics depend on both).
 *
 * Going back, a table with the object marker (or no marker and string keys,
 * or no marker and no keys) becomes an object; a table with the array marker
 * (or no marker and keys 1..n) becomes an array. Read-only proxies made by
 * cozygpu.readonly are unwrapped. Object keys are emitted sorted, so output
 * is stable whatever the Lua table order.
 */
#ifndef COZYGPU_LUAJSON_H
#define COZYGPU_LUAJSON_H

#include <jansson.h>
#include <lua.h>

#include "base/result.h"

/* Maximum nesting depth in either direction; deeper input is refused
 * (protects the C stack from hostile documents and cyclic tables). */
#define LUAJSON_MAX_DEPTH 10000 /* the YAML loader's limit, go-yaml's */

/* Registry names of the object and array markers (metatables). */
#define LUAJSON_OBJECT_MT "cozygpu.json.object"
#define LUAJSON_ARRAY_MT  "cozygpu.json.array"

/* Pushes the Lua value for `j` (borrowed; not modified). Raises a Lua error
 * (memory) on failure, so call it inside a protected call or accept the
 * panic handler. Requires the markers (luajson_open_markers). */
void luajson_push(lua_State *L, const json_t *j);

/* Converts the Lua value at `idx` to a new jansson value (caller owns it,
 * json_decref). On failure returns NULL and writes a message naming the
 * offending path (e.g. "spec.tolerations[2]: cannot encode a function") to
 * err. Never raises. */
json_t *luajson_to_json(lua_State *L, int idx, cozy_err *err);

/* Creates the object/array markers and the null value in the registry of L.
 * Idempotent. Call once per state before any other luajson function. */
void luajson_open_markers(lua_State *L);

/* Pushes a read-only view of the table at `idx` (other values are pushed as
 * they are). The view reads through to the table, wrapping nested tables
 * lazily; assignment raises "attempt to modify a read-only value";
 * `#`, `pairs` and `ipairs` work; getmetatable() returns "read-only".
 * One view per table (cached weakly), so views compare equal when their
 * tables are the same. luajson_to_json and json.* see through views.
 * Needs luajson_open_markers. May raise (memory). */
void luajson_push_readonly(lua_State *L, int idx);

/* Pushes a frozen read-only view of the table at `idx`: as
 * luajson_push_readonly, but its members are copied once, now, into the
 * view's own metatable (__index a table, nested tables as frozen views),
 * so that reading a field costs a table lookup instead of a C call. For
 * tables that never change after this call: the standard libraries and
 * the policy library's modules (decision 0050). A later change to the
 * table is not seen through the view. Same identity rules as
 * luajson_push_readonly (one view per table, from the same cache). May
 * raise (memory, or nesting past LUAJSON_MAX_DEPTH). */
void luajson_push_frozen(lua_State *L, int idx);

/* `next` for the sandbox: like the base library's next, but a read-only
 * view iterates its target's keys (with values wrapped) instead of exposing
 * the target. A lua_CFunction. */
int luajson_next(lua_State *L);

/* Writes the Lua value at `idx` to `out` as compact JSON text: the bytes
 * json_dumps(luajson_to_json(v), JSON_COMPACT) would write, objects in
 * the order luajson_to_json inserts their keys (core/engine/luawrite.c,
 * decision 0051). Returns 0, or -1 when it did not write the value: a
 * value luajson_to_json refuses or that the writer leaves to it (a key
 * that is not a string or holds NUL, invalid UTF-8, NaN, depth, memory,
 * out->max); `out` may then hold part of it (truncate to the length it
 * had). Never raises; reads through read-only views; runs no metamethod
 * but the raw ones luajson_to_json also reads. */
struct cozy_buf;
int luajson_write(lua_State *L, int idx, struct cozy_buf *out);

/* How luajson_to_json writes the table at `t` (not a view): returns 1 for
 * a JSON array (the array marker, or no marker and keys exactly 1..n with
 * n > 0), 0 for an object; *marker is 2 array marker, 1 object marker, 0
 * none; *n the table's raw length. Reads raw, runs no metamethod. */
int luajson_table_shape(lua_State *L, int t, int *marker, lua_Integer *n);

/* 1 when the table at `t` has a key other than the integers 1..n (what a
 * table with the array marker must not have; luajson_to_json refuses it).
 * Reads raw. */
int luajson_array_extra_key(lua_State *L, int t, lua_Integer n);

/* Replaces a read-only view at the top of the stack by its target (other
 * values stay). */
void luajson_unwrap(lua_State *L);

/* Pushes the Lua value of `j` and releases j (ownership moves in), also
 * when the push raises. */
void luajson_push_owned(lua_State *L, json_t *j);

/* Lua module `cozygpu.json`: null, object(t), array(t), kind(v), encode(v[,opts]),
 * decode(s), copy(v). Documented in lua/cozygpu/json.meta.lua. */
int luaopen_cozygpu_json(lua_State *L);

#endif
