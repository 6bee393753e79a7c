/* luawrite.c — a Lua value written straight to compact JSON text, the
 * same bytes as json_dumps(luajson_to_json(v), JSON_COMPACT) (luajson.h,
 * decision 0051). What luajson_to_json would refuse, or what this writer
 * does not take on (a non-string or NUL-carrying key, invalid UTF-8, NaN,
 * depth), is left to that path: the writer answers "not written" and the
 * caller converts as before, so every error message stays the old one.
 *
 * jansson's text, as its dump.c writes it (2.14):
 *   integers "%lld"; reals "%.17g", with ".0" added when there is neither
 *   '.' nor 'e', and the exponent's '+' and leading zeros dropped;
 *   strings escaped: '"' and '\\' with a backslash, \b \f \n \r \t by
 *   name, other code points below U+0020 as \u00XX (upper-case hex), all
 *   else (U+007F and every non-ASCII code point included) as it is;
 *   objects in the order luajson_to_json inserts their keys (the table's
 *   `next` order), arrays 1..n, no spaces.
 */
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/buf.h"
#include "base/utf8.h"
#include "engine/luajson.h"

static int put(cozy_buf *b, const char *s, size_t n) { return cozy_buf_add(b, s, n) == 0 ? 0 : -1; }

static int put_string(cozy_buf *b, const char *s, size_t n)
{
    if(!cozy_utf8_valid(s, n))
        return -1;
    if(put(b, "\"", 1))
        return -1;
    size_t run = 0; /* bytes copied as they are, pending */
    for(size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if(c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        if(run && put(b, s + i - run, run))
            return -1;
        run = 0;
        char esc[8];
        const char *e = esc;
        size_t en = 2;
        switch(c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        default: en = (size_t)snprintf(esc, sizeof esc, "\\u%04X", c);
        }
        if(put(b, e, en))
            return -1;
    }
    if(run && put(b, s + n - run, run))
        return -1;
    return put(b, "\"", 1);
}

/* jansson's jsonp_dtostr with precision 17, in the C locale */
static int put_real(cozy_buf *b, double d)
{
    char buf[64];
    int n = snprintf(buf, sizeof buf, "%.17g", d);
    if(n < 0 || (size_t)n >= sizeof buf - 3)
        return -1;
    size_t len = (size_t)n;
    if(!strchr(buf, '.') && !strchr(buf, 'e')) {
        memcpy(buf + len, ".0", 3);
        len += 2;
    }
    char *start = strchr(buf, 'e');
    if(start) {
        start++;
        char *end = start + 1;
        if(*start == '-')
            start++;
        while(*end == '0')
            end++;
        if(end != start) {
            memmove(start, end, len - (size_t)(end - buf) + 1);
            len -= (size_t)(end - start);
        }
    }
    return put(b, buf, len);
}

static int write_value(lua_State *L, cozy_buf *b, int depth);

/* the table at the top; as table_to_json (luajson.c) decides its shape */
static int write_table(lua_State *L, cozy_buf *b, int depth)
{
    int t = lua_gettop(L);
    int marker;
    lua_Integer n;
    if(luajson_table_shape(L, t, &marker, &n)) {
        if(marker == 2 && luajson_array_extra_key(L, t, n))
            return -1; /* refused: the old path says so */
        if(put(b, "[", 1))
            return -1;
        for(lua_Integer i = 1; i <= n; i++) {
            if(i > 1 && put(b, ",", 1))
                return -1;
            lua_rawgeti(L, t, i);
            int rc = write_value(L, b, depth + 1);
            lua_pop(L, 1);
            if(rc)
                return -1;
        }
        return put(b, "]", 1);
    }
    if(put(b, "{", 1))
        return -1;
    int first = 1;
    lua_pushnil(L);
    while(lua_next(L, t)) {
        size_t klen;
        const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &klen) : NULL;
        if(!key || memchr(key, 0, klen) || (!first && put(b, ",", 1)) || put_string(b, key, klen) ||
           put(b, ":", 1) || write_value(L, b, depth + 1)) {
            lua_pop(L, 2);
            return -1;
        }
        first = 0;
        lua_pop(L, 1);
    }
    return put(b, "}", 1);
}

/* the value at the top (left there) */
static int write_value(lua_State *L, cozy_buf *b, int depth)
{
    if(depth > LUAJSON_MAX_DEPTH || !lua_checkstack(L, 6))
        return -1;
    lua_pushvalue(L, -1);
    luajson_unwrap(L);
    int rc;
    switch(lua_type(L, -1)) {
    case LUA_TBOOLEAN: rc = lua_toboolean(L, -1) ? put(b, "true", 4) : put(b, "false", 5); break;
    case LUA_TNUMBER:
        if(lua_isinteger(L, -1)) {
            char num[32];
            int n = snprintf(num, sizeof num, "%lld", (long long)lua_tointeger(L, -1));
            rc = put(b, num, (size_t)n);
        } else {
            double d = lua_tonumber(L, -1);
            rc = isfinite(d) ? put_real(b, d) : -1;
        }
        break;
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        rc = put_string(b, s, len);
        break;
    }
    case LUA_TLIGHTUSERDATA: rc = lua_touserdata(L, -1) == NULL ? put(b, "null", 4) : -1; break;
    case LUA_TTABLE: rc = write_table(L, b, depth); break;
    default: rc = -1;
    }
    lua_pop(L, 1);
    return rc;
}

int luajson_write(lua_State *L, int idx, cozy_buf *out)
{
    lua_pushvalue(L, idx);
    int rc = write_value(L, out, 0);
    lua_pop(L, 1);
    return rc;
}
