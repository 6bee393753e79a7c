/* luajson.c — jansson <-> Lua conversion (luajson.h). */
#include "engine/luajson.h"

#include "base/utf8.h"
#include "base/jsonload.h"

#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>


static void open_proxy(lua_State *L);

void luajson_open_markers(lua_State *L)
{
    open_proxy(L);
    /* the markers are shared by every JSON value of the state: protected
     * (getmetatable answers their name), so no policy can add an __index
     * that every object of every rule would then answer through */
    if(luaL_newmetatable(L, LUAJSON_OBJECT_MT)) {
        lua_pushliteral(L, "object");
        lua_setfield(L, -2, "__jsontype");
        lua_pushliteral(L, LUAJSON_OBJECT_MT);
        lua_setfield(L, -2, "__metatable");
    }
    lua_pop(L, 1);
    if(luaL_newmetatable(L, LUAJSON_ARRAY_MT)) {
        lua_pushliteral(L, "array");
        lua_setfield(L, -2, "__jsontype");
        lua_pushliteral(L, LUAJSON_ARRAY_MT);
        lua_setfield(L, -2, "__metatable");
    }
    lua_pop(L, 1);
}

static void push_value(lua_State *L, const json_t *j, int depth)
{
    if(depth > LUAJSON_MAX_DEPTH)
        luaL_error(L, "JSON nested deeper than %d levels", LUAJSON_MAX_DEPTH);
    luaL_checkstack(L, 4, "JSON too deep");
    switch(json_typeof(j)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *v;
        lua_createtable(L, 0, (int)json_object_size(j));
        json_object_foreach((json_t *)j, key, v) {
            push_value(L, v, depth + 1);
            lua_setfield(L, -2, key);
        }
        luaL_setmetatable(L, LUAJSON_OBJECT_MT);
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *v;
        lua_createtable(L, (int)json_array_size(j), 0);
        json_array_foreach((json_t *)j, i, v) {
            push_value(L, v, depth + 1);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        luaL_setmetatable(L, LUAJSON_ARRAY_MT);
        break;
    }
    case JSON_STRING:
        lua_pushlstring(L, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
        lua_pushinteger(L, (lua_Integer)json_integer_value(j));
        break;
    case JSON_REAL:
        lua_pushnumber(L, json_real_value(j));
        break;
    case JSON_TRUE:
        lua_pushboolean(L, 1);
        break;
    case JSON_FALSE:
        lua_pushboolean(L, 0);
        break;
    case JSON_NULL:
    default:
        lua_pushlightuserdata(L, NULL);
        break;
    }
}

void luajson_push(lua_State *L, const json_t *j)
{
    push_value(L, j, 0);
}

/* ---- Lua -> JSON ---------------------------------------------------- */

/* ---- read-only views ------------------------------------------------ */

/* The view table holds its target under this light-userdata key, which no
 * policy can forge; the view's shared metatable has the methods. */
static const char proxy_key = 0;
#define LUAJSON_PROXY_MT "cozygpu.readonly"
/* The view cache (target -> view, weak keys) and the views' shared
 * metatable, kept in the registry under these light-userdata keys: a
 * rawgetp with no string to intern, on every view made or found. */
static const char cache_key = 0, proxy_mt_key = 0;

/* A view holds its target under proxy_key, which only this file can
   write: a table that has it is a view (plain or frozen). */
static int is_proxy(lua_State *L, int idx)
{
    if(lua_type(L, idx) != LUA_TTABLE)
        return 0;
    int yes = lua_rawgetp(L, idx, &proxy_key) != LUA_TNIL;
    lua_pop(L, 1);
    return yes;
}

/* Replaces a read-only view at the top of the stack by its target. */
static void unwrap_proxy(lua_State *L)
{
    if(is_proxy(L, -1)) {
        lua_rawgetp(L, -1, &proxy_key);
        lua_remove(L, -2);
    }
}

void luajson_unwrap(lua_State *L)
{
    unwrap_proxy(L);
}

static int proxy_index(lua_State *L)
{
    lua_rawgetp(L, 1, &proxy_key);
    lua_pushvalue(L, 2);
    lua_gettable(L, -2);
    luajson_push_readonly(L, -1);
    return 1;
}

static int proxy_newindex(lua_State *L)
{
    return luaL_error(L, "attempt to modify a read-only value (field '%s')",
                      lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?");
}

static int proxy_len(lua_State *L)
{
    lua_rawgetp(L, 1, &proxy_key);
    lua_pushinteger(L, (lua_Integer)luaL_len(L, -1));
    return 1;
}

static int proxy_next(lua_State *L)
{
    lua_settop(L, 2);
    lua_rawgetp(L, 1, &proxy_key);
    lua_pushvalue(L, 2);
    if(!lua_next(L, -2))
        return 0;
    luajson_push_readonly(L, -1);
    lua_remove(L, -2);
    return 2;
}

int luajson_next(lua_State *L)
{
    if(is_proxy(L, 1))
        return proxy_next(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 2);
    if(lua_next(L, 1))
        return 2;
    lua_pushnil(L);
    return 1;
}

static int proxy_pairs(lua_State *L)
{
    lua_pushcfunction(L, proxy_next);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

static void open_proxy(lua_State *L)
{
    if(luaL_newmetatable(L, LUAJSON_PROXY_MT)) {
        static const luaL_Reg mm[] = {
            {"__index", proxy_index}, {"__newindex", proxy_newindex}, {"__len", proxy_len},
            {"__pairs", proxy_pairs}, {NULL, NULL},
        };
        luaL_setfuncs(L, mm, 0);
        lua_pushliteral(L, "read-only");
        lua_setfield(L, -2, "__metatable");
    }
    lua_rawsetp(L, LUA_REGISTRYINDEX, &proxy_mt_key);
    if(lua_rawgetp(L, LUA_REGISTRYINDEX, &cache_key) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_createtable(L, 0, 1);
        lua_pushliteral(L, "k");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_rawsetp(L, LUA_REGISTRYINDEX, &cache_key);
        return;
    }
    lua_pop(L, 1);
}

void luajson_push_readonly(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if(lua_type(L, idx) != LUA_TTABLE || is_proxy(L, idx)) {
        lua_pushvalue(L, idx);
        return;
    }
    luaL_checkstack(L, 4, "read-only view");
    lua_rawgetp(L, LUA_REGISTRYINDEX, &cache_key);
    lua_pushvalue(L, idx);
    if(lua_rawget(L, -2) == LUA_TTABLE) {
        lua_remove(L, -2);
        return;
    }
    lua_pop(L, 1);
    lua_createtable(L, 0, 1);
    lua_pushvalue(L, idx);
    lua_rawsetp(L, -2, &proxy_key);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &proxy_mt_key);
    lua_setmetatable(L, -2);
    lua_pushvalue(L, idx);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4); /* cache[target] = view */
    lua_remove(L, -2);
}

/* The frozen view of the table at idx (not a view): its own metatable
   whose __index is a table of the target's members, nested tables as
   frozen views of theirs, so a read is the VM's table lookup, with no C
   call. Registered in the view cache before its members are made, so a
   cycle finds it. */
static void push_frozen(lua_State *L, int idx, int depth)
{
    if(depth > LUAJSON_MAX_DEPTH)
        luaL_error(L, "read-only view nested deeper than %d levels", LUAJSON_MAX_DEPTH);
    luaL_checkstack(L, 8, "read-only view");
    lua_rawgetp(L, LUA_REGISTRYINDEX, &cache_key);
    int cache = lua_gettop(L);
    lua_pushvalue(L, idx);
    if(lua_rawget(L, cache) == LUA_TTABLE) {
        lua_remove(L, cache);
        return;
    }
    lua_pop(L, 1);
    lua_createtable(L, 0, 1); /* the view */
    int view = lua_gettop(L);
    lua_pushvalue(L, idx);
    lua_rawsetp(L, view, &proxy_key);
    lua_pushvalue(L, idx);
    lua_pushvalue(L, view);
    lua_rawset(L, cache); /* cache[target] = view */
    lua_newtable(L); /* the members, read through __index */
    int members = lua_gettop(L);
    /* the metatable first: a view found in the cache is read-only even if
       a nested push below raises (memory) before its members are all in */
    lua_createtable(L, 0, 6);
    lua_pushvalue(L, members);
    lua_setfield(L, -2, "__index");
    lua_rawgetp(L, LUA_REGISTRYINDEX, &proxy_mt_key);
    static const char *const shared[] = {"__newindex", "__len", "__pairs", "__metatable"};
    for(size_t i = 0; i < sizeof shared / sizeof *shared; i++) {
        lua_getfield(L, -1, shared[i]);
        lua_setfield(L, -3, shared[i]);
    }
    lua_pop(L, 1);
    lua_setmetatable(L, view);
    lua_pushnil(L);
    while(lua_next(L, idx)) {
        if(lua_type(L, -1) == LUA_TTABLE && !is_proxy(L, -1)) {
            push_frozen(L, lua_gettop(L), depth + 1);
            lua_replace(L, -2);
        }
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, members);
    }
    lua_settop(L, view);
    lua_remove(L, cache);
}

void luajson_push_frozen(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if(lua_type(L, idx) != LUA_TTABLE || is_proxy(L, idx)) {
        lua_pushvalue(L, idx);
        return;
    }
    push_frozen(L, idx, 0);
}

/* 1 object, 2 array, 0 unmarked */
static int table_marker(lua_State *L, int idx)
{
    int kind = 0;
    if(lua_getmetatable(L, idx)) {
        /* raw: a metatable a policy made may itself have a metatable, whose
         * __index must not run here (outside any budget) */
        lua_pushliteral(L, "__jsontype");
        if(lua_rawget(L, -2) == LUA_TSTRING)
            kind = strcmp(lua_tostring(L, -1), "array") == 0 ? 2 : 1;
        lua_pop(L, 2);
    }
    return kind;
}

typedef struct path_buf {
    char s[512];
} path_buf;

static json_t *to_json(lua_State *L, int depth, path_buf *path, cozy_err *err);

static void path_push_key(path_buf *p, size_t *saved, const char *key)
{
    size_t n = strlen(p->s);
    *saved = n;
    if(n < sizeof p->s - 1)
        snprintf(p->s + n, sizeof p->s - n, n ? ".%s" : "%s", key);
}

static void path_push_index(path_buf *p, size_t *saved, lua_Integer i)
{
    size_t n = strlen(p->s);
    *saved = n;
    if(n < sizeof p->s - 1)
        snprintf(p->s + n, sizeof p->s - n, "[%lld]", (long long)i);
}

static json_t *fail_at(path_buf *path, cozy_err *err, const char *what)
{
    cozy_fail(err, COZY_ERR_INPUT, "%s%s%s", path->s[0] ? path->s : "", path->s[0] ? ": " : "", what);
    return NULL;
}

int luajson_table_shape(lua_State *L, int t, int *marker, lua_Integer *n)
{
    t = lua_absindex(L, t);
    *marker = table_marker(L, t);
    *n = (lua_Integer)lua_rawlen(L, t);
    if(*marker != 0)
        return *marker == 2;
    /* unmarked: array iff every key is an integer 1..n with n > 0 */
    lua_Integer count = 0;
    int only_seq = 1;
    lua_pushnil(L);
    while(lua_next(L, t)) {
        count++;
        if(!lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1 || lua_tointeger(L, -2) > *n)
            only_seq = 0;
        lua_pop(L, 1);
    }
    return count > 0 && only_seq && count == *n;
}

int luajson_array_extra_key(lua_State *L, int t, lua_Integer n)
{
    t = lua_absindex(L, t);
    lua_pushnil(L);
    while(lua_next(L, t)) {
        int ok = lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1 && lua_tointeger(L, -2) <= n;
        lua_pop(L, 1);
        if(!ok) {
            lua_pop(L, 1);
            return 1;
        }
    }
    return 0;
}

static json_t *table_to_json(lua_State *L, int depth, path_buf *path, cozy_err *err)
{
    int t = lua_gettop(L);
    int marker;
    lua_Integer n;
    int as_array = luajson_table_shape(L, t, &marker, &n);
    if(as_array) {
        json_t *arr = json_array();
        for(lua_Integer i = 1; i <= n; i++) {
            size_t saved;
            lua_rawgeti(L, t, i);
            path_push_index(path, &saved, i - 1);
            json_t *v = to_json(L, depth + 1, path, err);
            path->s[saved] = 0;
            lua_pop(L, 1);
            if(!v || json_array_append_new(arr, v)) {
                json_decref(arr);
                return v ? fail_at(path, err, "out of memory") : NULL;
            }
        }
        /* a marked array must not carry other keys */
        if(marker == 2 && luajson_array_extra_key(L, t, n)) {
            json_decref(arr);
            return fail_at(path, err, "array has a non-sequence key (holes are not allowed)");
        }
        return arr;
    }
    json_t *obj = json_object();
    lua_pushnil(L);
    while(lua_next(L, t)) {
        if(lua_type(L, -2) != LUA_TSTRING) {
            lua_pop(L, 2);
            json_decref(obj);
            return fail_at(path, err, "object has a non-string key");
        }
        size_t klen;
        const char *key = lua_tolstring(L, -2, &klen);
        size_t saved;
        path_push_key(path, &saved, key);
        json_t *v = to_json(L, depth + 1, path, err);
        path->s[saved] = 0;
        lua_pop(L, 1);
        if(!v) {
            lua_pop(L, 1);
            json_decref(obj);
            return NULL;
        }
        if(json_object_setn_new(obj, key, klen, v)) {
            lua_pop(L, 1);
            json_decref(obj);
            return fail_at(path, err, "invalid object key (not UTF-8?)");
        }
    }
    return obj;
}

static json_t *to_json(lua_State *L, int depth, path_buf *path, cozy_err *err)
{
    if(depth > LUAJSON_MAX_DEPTH)
        return fail_at(path, err, "nested too deep (a cycle?)");
    if(!lua_checkstack(L, 6))
        return fail_at(path, err, "Lua stack exhausted");
    lua_pushvalue(L, -1);
    unwrap_proxy(L);
    json_t *out = NULL;
    switch(lua_type(L, -1)) {
    case LUA_TNIL:
        out = fail_at(path, err, "cannot encode nil (use json.null)");
        break;
    case LUA_TBOOLEAN:
        out = json_boolean(lua_toboolean(L, -1));
        break;
    case LUA_TNUMBER:
        if(lua_isinteger(L, -1))
            out = json_integer((json_int_t)lua_tointeger(L, -1));
        else {
            double d = lua_tonumber(L, -1);
            out = isfinite(d) ? json_real(d) : fail_at(path, err, "cannot encode NaN or infinity");
        }
        break;
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        out = json_stringn(s, len);
        if(!out)
            fail_at(path, err, "string is not valid UTF-8");
        break;
    }
    case LUA_TLIGHTUSERDATA:
        if(lua_touserdata(L, -1) == NULL)
            out = json_null();
        else
            out = fail_at(path, err, "cannot encode a light userdata");
        break;
    case LUA_TTABLE:
        out = table_to_json(L, depth, path, err);
        break;
    default: {
        char what[64];
        snprintf(what, sizeof what, "cannot encode a %s", luaL_typename(L, -1));
        out = fail_at(path, err, what);
    }
    }
    lua_pop(L, 1);
    return out;
}

json_t *luajson_to_json(lua_State *L, int idx, cozy_err *err)
{
    path_buf path = {{0}};
    lua_pushvalue(L, idx);
    json_t *j = to_json(L, 0, &path, err);
    lua_pop(L, 1);
    return j;
}

/* ---- the cozygpu.json module ----------------------------------------- */

/* Pushes the Lua value of `j` and releases j, also when the push raises
 * (memory cap): j is parked in a userdata whose __gc releases it. */
#define LUAJSON_BOX_MT "cozygpu.json.box"
typedef struct json_box {
    json_t *j;
} json_box;

static int box_gc(lua_State *L)
{
    json_box *b = luaL_checkudata(L, 1, LUAJSON_BOX_MT);
    json_decref(b->j);
    b->j = NULL;
    return 0;
}

void luajson_push_owned(lua_State *L, json_t *j)
{
    json_box *b = lua_newuserdatauv(L, sizeof *b, 0);
    b->j = j;
    if(luaL_newmetatable(L, LUAJSON_BOX_MT)) {
        lua_pushcfunction(L, box_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    luajson_push(L, j);
    json_decref(b->j);
    b->j = NULL;
    lua_remove(L, -2);
}

/* json.encode(v [, {pretty=bool}]) -> string | nil, message */
static int l_encode(lua_State *L)
{
    luaL_checkany(L, 1);
    int pretty = 0;
    if(lua_istable(L, 2)) {
        lua_getfield(L, 2, "pretty");
        pretty = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    cozy_err err = {{0}};
    json_t *j = luajson_to_json(L, 1, &err);
    if(!j) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    size_t flags = JSON_SORT_KEYS | JSON_ENCODE_ANY | (pretty ? JSON_INDENT(2) : JSON_COMPACT);
    char *s = json_dumps(j, flags);
    json_decref(j);
    if(!s)
        return luaL_error(L, "json.encode: out of memory");
    lua_pushstring(L, s);
    free(s);
    return 1;
}

/* json.decode(s) -> value | nil, message */
static int l_decode(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    json_error_t jerr;
    json_t *j = cozy_json_loadb(s, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if(!j) {
        lua_pushnil(L);
        lua_pushfstring(L, "line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        return 2;
    }
    luajson_push_owned(L, j);
    return 1;
}

/* Marks table 1 (a new one when absent) with metatable `mt`. A read-only
 * view is refused: its metatable is protected from setmetatable, and
 * replacing it here would expose, and empty for every later reader, the
 * request or cluster view it stands for. Misuse raises (argument error). */
static int set_marker(lua_State *L, const char *mt)
{
    if(lua_isnoneornil(L, 1))
        lua_newtable(L);
    else
        luaL_checktype(L, 1, LUA_TTABLE);
    if(is_proxy(L, 1))
        return luaL_argerror(L, 1, "a read-only view cannot be marked; mark a copy (json.copy)");
    lua_settop(L, 1);
    luaL_setmetatable(L, mt);
    return 1;
}

/* json.object([t]) -> t marked as a JSON object ({} encodes as {}) */
static int l_object(lua_State *L)
{
    return set_marker(L, LUAJSON_OBJECT_MT);
}

/* json.array([t]) -> t marked as a JSON array ({} encodes as []) */
static int l_array(lua_State *L)
{
    return set_marker(L, LUAJSON_ARRAY_MT);
}

/* json.kind(v) -> "object"|"array"|"null"|"string"|"number"|"boolean"|"nil"|"table" */
static int l_kind(lua_State *L)
{
    lua_settop(L, 1);
    unwrap_proxy(L);
    switch(lua_type(L, -1)) {
    case LUA_TLIGHTUSERDATA:
        lua_pushstring(L, lua_touserdata(L, -1) ? "userdata" : "null");
        return 1;
    case LUA_TTABLE: {
        int m = table_marker(L, lua_gettop(L));
        lua_pushstring(L, m == 2 ? "array" : m == 1 ? "object" : "table");
        return 1;
    }
    default:
        lua_pushstring(L, luaL_typename(L, -1));
        return 1;
    }
}

/* json.readonly(v) -> a read-only view of v (v itself when not a table) */
static int l_readonly(lua_State *L)
{
    luaL_checkany(L, 1);
    luajson_push_readonly(L, 1);
    return 1;
}

/* json.copy(v) -> a deep, writable copy of v (proxies unwrapped, markers kept) */
/* json.copy without the jansson round trip, for values that the round trip
 * would reproduce exactly: pushes the copy and returns 1, or pushes nothing
 * and returns 0 when anything could make luajson_to_json refuse or decide
 * differently (then the caller takes the round trip, which reports it).
 * Same decisions as table_to_json: a marked table keeps its kind, an
 * unmarked one is an array iff its keys are exactly 1..n with n > 0. */
static int fast_copy(lua_State *L, int idx, int depth)
{
    idx = lua_absindex(L, idx);
    if(depth > LUAJSON_MAX_DEPTH || !lua_checkstack(L, 6))
        return 0;
    switch(lua_type(L, idx)) {
    case LUA_TBOOLEAN:
        lua_pushvalue(L, idx);
        return 1;
    case LUA_TNUMBER:
        if(!lua_isinteger(L, idx) && !isfinite(lua_tonumber(L, idx)))
            return 0;
        lua_pushvalue(L, idx);
        return 1;
    case LUA_TSTRING: {
        size_t len;
        const char *str = lua_tolstring(L, idx, &len);
        if(!cozy_utf8_valid(str, len))
            return 0;
        lua_pushvalue(L, idx); /* strings are immutable */
        return 1;
    }
    case LUA_TLIGHTUSERDATA:
        if(lua_touserdata(L, idx) != NULL)
            return 0;
        lua_pushvalue(L, idx);
        return 1;
    case LUA_TTABLE: break;
    default: return 0;
    }
    lua_pushvalue(L, idx);
    unwrap_proxy(L);
    int t = lua_gettop(L);
    int marker = table_marker(L, t);
    lua_Integer n = (lua_Integer)lua_rawlen(L, t);
    lua_Integer count = 0;
    int only_seq = 1, string_keys = 1;
    lua_pushnil(L);
    while(lua_next(L, t)) {
        count++;
        if(!lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1 || lua_tointeger(L, -2) > n)
            only_seq = 0;
        if(lua_type(L, -2) != LUA_TSTRING)
            string_keys = 0;
        lua_pop(L, 1);
    }
    int as_array = marker == 2 || (marker == 0 && count > 0 && only_seq && count == n);
    if(as_array ? !(only_seq && count == n) : !string_keys) {
        lua_settop(L, t - 1);
        return 0;
    }
    if(as_array) {
        lua_createtable(L, (int)n, 0);
        for(lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, t, i);
            if(!fast_copy(L, -1, depth + 1)) {
                lua_settop(L, t - 1);
                return 0;
            }
            lua_remove(L, -2);
            lua_rawseti(L, -2, i);
        }
        luaL_setmetatable(L, LUAJSON_ARRAY_MT);
    } else {
        lua_createtable(L, 0, (int)count);
        lua_pushnil(L);
        while(lua_next(L, t)) {
            size_t klen;
            const char *key = lua_tolstring(L, -2, &klen);
            if(!cozy_utf8_valid(key, klen) || !fast_copy(L, -1, depth + 1)) {
                lua_settop(L, t - 1);
                return 0;
            }
            lua_remove(L, -2);     /* the original value */
            lua_pushvalue(L, -2);  /* key */
            lua_insert(L, -2);     /* ..., copy, key, key, vcopy */
            lua_rawset(L, -4);
        }
        luaL_setmetatable(L, LUAJSON_OBJECT_MT);
    }
    lua_remove(L, t); /* the unwrapped source */
    return 1;
}

/* json.get(v, k1, k2, ...) -> the value at that path; nil as soon as a step
 * is absent, JSON null or not a table (v itself with no keys). A table
 * reached through a read-only view comes back as a view, as indexing the
 * view step by step gives it; other tables are indexed as `t[k]` is
 * (metamethods included). One C call for the walk: cozygpu.object.get is
 * this function (the rules' most frequent call). */
static int l_get(lua_State *L)
{
    int n = lua_gettop(L);
    if(n == 0)
        return 0;
    luaL_checkstack(L, 3, "json.get");
    lua_pushvalue(L, 1);
    int viewed = 0;
    for(int i = 2; i <= n; i++) {
        if(lua_type(L, -1) != LUA_TTABLE) {
            lua_pushnil(L);
            return 1;
        }
        if(is_proxy(L, -1)) {
            lua_rawgetp(L, -1, &proxy_key);
            lua_remove(L, -2);
            viewed = 1;
        }
        lua_pushvalue(L, i);
        lua_gettable(L, -2);
        lua_remove(L, -2);
        if(lua_type(L, -1) == LUA_TLIGHTUSERDATA && lua_touserdata(L, -1) == NULL) {
            lua_pushnil(L);
            return 1;
        }
    }
    if(viewed)
        luajson_push_readonly(L, -1);
    return 1;
}

static int l_copy(lua_State *L)
{
    luaL_checkany(L, 1);
    if(fast_copy(L, 1, 0))
        return 1;
    cozy_err err = {{0}};
    json_t *j = luajson_to_json(L, 1, &err);
    if(!j)
        return luaL_error(L, "json.copy: %s", err.msg);
    luajson_push_owned(L, j);
    return 1;
}

int luaopen_cozygpu_json(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"encode", l_encode}, {"decode", l_decode}, {"object", l_object},
        {"array", l_array},   {"kind", l_kind},     {"copy", l_copy}, {"readonly", l_readonly},
        {"get", l_get},
        {NULL, NULL},
    };
    luajson_open_markers(L);
    luaL_newlib(L, fns);
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "null");
    return 1;
}
