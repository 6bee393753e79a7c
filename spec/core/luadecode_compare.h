/* luadecode_compare.h — what the review decode is compared with, shared
 * by spec/core/luadecode_check.c and fuzz/fuzz_luadecode.c (header-only:
 * each includes it once). */
#ifndef COZYGPU_SPEC_LUADECODE_COMPARE_H
#define COZYGPU_SPEC_LUADECODE_COMPARE_H

#include <jansson.h>
#include <lua.h>
#include <string.h>

/* 1 when the Lua values at a and b are equal as luajson gives them */
static inline int lua_same(lua_State *L, int a, int b, int depth)
{
    a = lua_absindex(L, a);
    b = lua_absindex(L, b);
    if(lua_type(L, a) != lua_type(L, b) || depth > 2000)
        return 0;
    switch(lua_type(L, a)) {
    case LUA_TNUMBER:
        if(lua_isinteger(L, a) != lua_isinteger(L, b))
            return 0;
        return lua_isinteger(L, a) ? lua_tointeger(L, a) == lua_tointeger(L, b)
                                   : memcmp(&(lua_Number){lua_tonumber(L, a)}, &(lua_Number){lua_tonumber(L, b)},
                                            sizeof(lua_Number)) == 0;
    case LUA_TTABLE: {
        int ma = lua_getmetatable(L, a), mb = lua_getmetatable(L, b);
        int same = ma == mb && (!ma || lua_rawequal(L, -1, -2));
        lua_pop(L, ma + mb);
        if(!same)
            return 0;
        size_t na = 0, nb = 0;
        lua_pushnil(L);
        while(lua_next(L, a)) {
            na++;
            lua_pushvalue(L, -2);
            lua_rawget(L, b);
            if(!lua_same(L, -2, -1, depth + 1)) {
                lua_pop(L, 3);
                return 0;
            }
            lua_pop(L, 2);
        }
        lua_pushnil(L);
        while(lua_next(L, b)) {
            nb++;
            lua_pop(L, 1);
        }
        return na == nb;
    }
    default: return lua_rawequal(L, a, b);
    }
}

/* cozy_json_loadb's document with request.object and request.oldObject,
   when objects or arrays, emptied (what engine_decode_review returns) */
static inline json_t *emptied(const json_t *doc)
{
    json_t *d = json_deep_copy(doc);
    json_t *req = json_object_get(d, "request");
    static const char *const keys[] = {"object", "oldObject"};
    for(int i = 0; json_is_object(req) && i < 2; i++) {
        json_t *v = json_object_get(req, keys[i]);
        if(json_is_object(v))
            json_object_clear(v);
        else if(json_is_array(v))
            json_array_clear(v);
    }
    return d;
}

#endif
