/* fuzz_json_lua — libFuzzer target for JSON<->Lua (core/engine/luajson.c).
 *
 * Feeds: the input bytes as JSON text. When jansson accepts them (any
 * value, NUL in strings allowed, duplicate keys refused as json.decode
 * does), the value is pushed into a fresh Lua 5.4 state with luajson_push
 * inside a protected call and converted back with luajson_to_json; then the
 * same through a read-only view (luajson_push_readonly); then the bytes go
 * through the Lua module itself: json.decode(s), json.copy(v),
 * json.encode(v).
 * Checks, besides the sanitizers (ASan, UBSan, LeakSanitizer):
 *   - each conversion back succeeds and is json_equal to the input value
 *     (objects stay objects, arrays arrays, {} and [] keep their kind,
 *     null stays null, integers stay exact);
 *   - json.decode accepts what jansson accepted with the same flags, and
 *     json.encode(json.copy(json.decode(s))) loads back equal;
 *   - inputs jansson refuses are refused by json.decode too (nil, message).
 * Seeds: every .json of examples/ and the shared fixtures.
 */
#include "engine/luajson.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) do { if(!(c)) { fprintf(stderr, "fuzz_json_lua: check failed: %s\n", #c); abort(); } } while(0)

typedef struct job {
    const char *text;
    size_t len;
    json_t *value; /* NULL when jansson refused the text */
} job;

static void check_back(lua_State *L, int idx, const json_t *want)
{
    cozy_err err = {{0}};
    json_t *back = luajson_to_json(L, idx, &err);
    if(!back)
        fprintf(stderr, "fuzz_json_lua: luajson_to_json: %s\n", err.msg);
    CHECK(back != NULL);
    CHECK(json_equal(want, back));
    json_decref(back);
}

/* runs inside lua_pcall: raises only on memory errors */
static int run(lua_State *L)
{
    job *j = lua_touserdata(L, 1);
    lua_settop(L, 0);
    luajson_open_markers(L);
    luaL_requiref(L, "cozygpu.json", luaopen_cozygpu_json, 0); /* 1: the module */
    if(j->value) {
        luajson_push(L, j->value); /* 2 */
        check_back(L, 2, j->value);
        luajson_push_readonly(L, 2); /* 3 */
        check_back(L, 3, j->value);
        lua_settop(L, 1);
    }
    lua_getfield(L, 1, "decode");
    lua_pushlstring(L, j->text, j->len);
    lua_call(L, 1, 2); /* 2: value or nil, 3: message */
    if(!j->value) {
        CHECK(lua_isnil(L, 2) && lua_type(L, 3) == LUA_TSTRING);
        return 0;
    }
    CHECK(!lua_isnil(L, 2) || json_is_null(j->value));
    if(json_is_null(j->value))
        return 0; /* decode returns json.null, a light userdata */
    lua_getfield(L, 1, "copy");
    lua_pushvalue(L, 2);
    lua_call(L, 1, 1); /* 4: the copy */
    check_back(L, 4, j->value);
    lua_getfield(L, 1, "encode");
    lua_pushvalue(L, 4);
    lua_call(L, 1, 2); /* 5: text, 6: message */
    CHECK(lua_type(L, 5) == LUA_TSTRING);
    size_t n;
    const char *s = lua_tolstring(L, 5, &n);
    json_error_t jerr;
    json_t *again = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    CHECK(again != NULL);
    CHECK(json_equal(again, j->value));
    json_decref(again);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    job j = {(const char *)data, size, NULL};
    json_error_t jerr;
    j.value = json_loadb(j.text, size, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    lua_State *L = luaL_newstate();
    CHECK(L != NULL);
    lua_pushcfunction(L, run);
    lua_pushlightuserdata(L, &j);
    if(lua_pcall(L, 1, 0, 0) != LUA_OK) {
        /* only an out-of-memory error may escape (luaL_newstate has no cap) */
        const char *m = lua_tostring(L, -1);
        fprintf(stderr, "fuzz_json_lua: Lua error: %s\n", m ? m : "(not a string)");
        abort();
    }
    lua_close(L);
    json_decref(j.value);
    return 0;
}
