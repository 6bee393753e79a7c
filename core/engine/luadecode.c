/* luadecode.c — an AdmissionReview's text read once by yajl into both the
 * Lua request the rules see and a jansson envelope the C checks read
 * (engine.h, engine_decode_review; decision 0049).
 *
 * Where the text could be read differently from cozy_json_loadb (every
 * case jsonload.h lists), or the parse stops for any reason (a yajl error,
 * a duplicate key, the depth, a root that is not an object, memory), the
 * whole text goes to cozy_json_loadb instead, so the envelope, and on a
 * refusal the error, are what they were before this reader existed, and
 * engine_review then converts the request from JSON as it always did.
 *
 * What is built where, by the value's place in the document:
 *   the root object and its members other than "request": JSON only;
 *   "request" and its members: JSON and Lua, except
 *   request.object and request.oldObject when they are objects or arrays:
 *     Lua only, with an empty object or array of the same type in the JSON
 *     (nothing in C reads inside them: admission_check_request only asks
 *     their type).
 * The Lua values have the shapes luajson_push gives (luajson.h): the same
 * markers, json.null, integers and floats, strings as bytes.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "base/jsonload.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/luajson.h"

/* one open container */
typedef struct dframe {
    int lua;          /* its Lua table is being built (see base) */
    int json;         /* it is open in the jansson builder */
    int array;
    int base;         /* (lua) its members are on the Lua stack above this index until it closes:
                         key, value, key, value... for an object, the elements for an array */
    int root;         /* the document's root object */
    int request;      /* the root's "request" */
    int key_kind;     /* an object: the waiting key is 1 "request" (in the root), 2 "object" or
                         "oldObject" (in the request), 0 another; kept until its value is complete */
} dframe;

typedef struct decoder {
    lua_State *L;
    cozy_json_builder jb;
    dframe *st;
    size_t depth, cap;
    int obj_mt, arr_mt; /* stack indices of the markers */
    int request_slot;   /* stack index the request's Lua value goes to */
} decoder;

/* where the next value goes */
typedef struct zone {
    int lua, json, standin, request;
} zone;

static zone zone_here(const decoder *d)
{
    if(d->depth == 0)
        return (zone){.json = 1};
    const dframe *f = &d->st[d->depth - 1];
    if(f->root)
        return f->key_kind == 1 ? (zone){.lua = 1, .json = 1, .request = 1} : (zone){.json = 1};
    if(f->request && f->key_kind == 2)
        return (zone){.lua = 1, .json = 1, .standin = 1};
    return (zone){.lua = f->lua, .json = f->json};
}

/* The Lua value on top of the stack is complete. In an object or array
   it stays on the stack (after its key) until the container closes; the
   request's goes to its slot. */
static void lua_done(decoder *d, zone z)
{
    if(z.request)
        lua_replace(d->L, d->request_slot);
}

/* The parent's waiting key has its value. */
static void key_done(decoder *d)
{
    if(d->depth && !d->st[d->depth - 1].array)
        d->st[d->depth - 1].key_kind = 0;
}

/* A scalar: pushed by `push` (Lua) and/or put as `j` (JSON, stolen). */
static int scalar(decoder *d, json_t *j, void (*push)(lua_State *, const void *), const void *arg)
{
    zone z = zone_here(d);
    if(z.json) {
        if(!cozy_json_builder_put(&d->jb, j))
            return 0;
    } else
        json_decref(j);
    if(z.lua) {
        luaL_checkstack(d->L, 2, "JSON too large");
        push(d->L, arg);
        lua_done(d, z);
    }
    key_done(d);
    return 1;
}

static void push_nil_marker(lua_State *L, const void *a) { (void)a, lua_pushlightuserdata(L, NULL); }
static void push_bool(lua_State *L, const void *a) { lua_pushboolean(L, *(const int *)a); }
static void push_int(lua_State *L, const void *a) { lua_pushinteger(L, (lua_Integer) * (const long long *)a); }
static void push_double(lua_State *L, const void *a) { lua_pushnumber(L, *(const double *)a); }

typedef struct lstr {
    const unsigned char *s;
    size_t len;
} lstr;
static void push_str(lua_State *L, const void *a)
{
    const lstr *x = a;
    lua_pushlstring(L, (const char *)x->s, x->len);
}

static int on_null(void *ud) { return scalar(ud, json_null(), push_nil_marker, NULL); }
static int on_boolean(void *ud, int v) { return scalar(ud, json_boolean(v), push_bool, &v); }
/* (the JSON value is made only where JSON is built: scalar() never puts a
   NULL it was given for a Lua-only place) */
static int on_integer(void *ud, long long v)
{
    decoder *d = ud;
    zone z = zone_here(d);
    return scalar(d, z.json ? json_integer((json_int_t)v) : NULL, push_int, &v);
}
static int on_double(void *ud, double v)
{
    decoder *d = ud;
    zone z = zone_here(d);
    return scalar(d, z.json ? json_real(v) : NULL, push_double, &v);
}
static int on_string(void *ud, const unsigned char *s, size_t len)
{
    decoder *d = ud;
    zone z = zone_here(d);
    lstr x = {s, len};
    return scalar(d, z.json ? json_stringn_nocheck((const char *)s, len) : NULL, push_str, &x);
}

static int open_container(decoder *d, int array)
{
    lua_State *L = d->L;
    if(d->depth >= JSONLOAD_MAX_DEPTH)
        return 0;
    zone z = zone_here(d);
    if(d->depth == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        dframe *st = realloc(d->st, cap * sizeof *st);
        if(!st)
            return 0;
        d->st = st;
        d->cap = cap;
    }
    dframe nf = {.array = array, .root = d->depth == 0 && !array, .request = z.request && !array};
    if(z.json) {
        json_t *c = array ? json_array() : json_object();
        if(z.standin) {
            if(!cozy_json_builder_put(&d->jb, c))
                return 0;
        } else {
            if(!cozy_json_builder_open(&d->jb, c))
                return 0;
            nf.json = 1;
        }
    }
    if(z.lua) {
        nf.lua = 1;
        nf.base = lua_gettop(L);
    }
    d->st[d->depth++] = nf;
    return 1;
}

static int close_container(void *ud)
{
    decoder *d = ud;
    if(d->depth == 0)
        return 0;
    dframe f = d->st[--d->depth];
    if(f.json && !cozy_json_builder_close(&d->jb))
        return 0;
    if(f.lua) {
        /* the table made at once with its size, as luajson_push makes it
           (growing it member by member would rehash it log n times) */
        lua_State *L = d->L;
        /* room for the table, its marker and the duplicate check: the table
           stays on the stack as its parent's member (every push here must
           be checked, or a list of empty containers writes past the stack) */
        luaL_checkstack(L, 4, "JSON too large");
        int n = lua_gettop(L) - f.base;
        lua_createtable(L, f.array ? n : 0, f.array ? 0 : n / 2);
        lua_pushvalue(L, f.array ? d->arr_mt : d->obj_mt);
        lua_setmetatable(L, -2);
        int t = f.base + 1;
        lua_insert(L, t);
        if(f.array)
            for(; n > 0; n--)
                lua_rawseti(L, t, n);
        else
            for(; n > 0; n -= 2) {
                if(!f.json) {
                    /* a duplicate key (the builder checks where it builds) */
                    lua_pushvalue(L, -2);
                    if(lua_rawget(L, t) != LUA_TNIL)
                        return 0;
                    lua_pop(L, 1);
                }
                lua_rawset(L, t);
            }
        lua_done(d, zone_here(d)); /* the zone it was opened in: the parent's key is still waiting */
    }
    key_done(d);
    return 1;
}

static int on_start_map(void *ud) { return open_container(ud, 0); }
static int on_start_array(void *ud) { return open_container(ud, 1); }

static int on_map_key(void *ud, const unsigned char *s, size_t len)
{
    decoder *d = ud;
    dframe *f = &d->st[d->depth - 1];
    f->key_kind = 0;
    if(f->root && len == 7 && memcmp(s, "request", 7) == 0)
        f->key_kind = 1;
    else if(f->request && ((len == 6 && memcmp(s, "object", 6) == 0) || (len == 9 && memcmp(s, "oldObject", 9) == 0)))
        f->key_kind = 2;
    if(f->json && !cozy_json_builder_key(&d->jb, (const char *)s, len))
        return 0;
    if(f->lua) {
        luaL_checkstack(d->L, 2, "JSON too large");
        lua_pushlstring(d->L, (const char *)s, len);
    }
    return 1;
}

static const yajl_callbacks callbacks = {
    on_null, on_boolean, on_integer, on_double, NULL, on_string,
    on_start_map, on_map_key, close_container, on_start_array, close_container,
};

typedef struct decode_call {
    decoder *d;
    yajl_handle h;
    const char *buf;
    size_t len;
    int ok;
} decode_call;

/* argument 1: the decode_call (light userdata); returns the request's Lua
   value (nil when the document has none) with call->ok set on a complete
   parse. Raises on memory. */
static int decode_protected(lua_State *L)
{
    decode_call *c = lua_touserdata(L, 1);
    decoder *d = c->d;
    d->L = L;
    lua_pushnil(L);
    d->request_slot = lua_gettop(L);
    luaL_getmetatable(L, LUAJSON_OBJECT_MT);
    d->obj_mt = lua_gettop(L);
    luaL_getmetatable(L, LUAJSON_ARRAY_MT);
    d->arr_mt = lua_gettop(L);
    c->ok = yajl_parse(c->h, (const unsigned char *)c->buf, c->len) == yajl_status_ok &&
            yajl_complete_parse(c->h) == yajl_status_ok && d->jb.root && d->depth == 0 && json_is_object(d->jb.root);
    lua_settop(L, d->request_slot);
    return 1;
}

void engine_forget_decoded(engine *e)
{
    if(e->decoded_ref != LUA_NOREF)
        luaL_unref(e->L, LUA_REGISTRYINDEX, e->decoded_ref);
    e->decoded_ref = LUA_NOREF;
    json_decref(e->decoded_for);
    e->decoded_for = NULL;
}

json_t *engine_decode_review(engine *e, const char *buf, size_t len, json_error_t *error)
{
    engine_forget_decoded(e);
    if(!cozy_json_yajl_reads_as_jansson(buf, len, JSON_REJECT_DUPLICATES))
        return cozy_json_loadb(buf, len, JSON_REJECT_DUPLICATES, error);
    decoder d = {.jb = {.dups = 1}};
    decode_call c = {.d = &d, .buf = buf, .len = len};
    c.h = yajl_alloc(&callbacks, NULL, &d);
    if(!c.h)
        return cozy_json_loadb(buf, len, JSON_REJECT_DUPLICATES, error);
    lua_State *L = e->L;
    int top = lua_gettop(L);
    lua_pushcfunction(L, decode_protected);
    lua_pushlightuserdata(L, &c);
    cozy_err cerr;
    int called = engine_call(e, 1, 1, 0, &cerr) == ENGINE_ALLOWED;
    yajl_free(c.h);
    free(d.st);
    if(!called || !c.ok) {
        lua_settop(L, top);
        cozy_json_builder_free(&d.jb);
        return cozy_json_loadb(buf, len, JSON_REJECT_DUPLICATES, error);
    }
    json_t *doc = d.jb.root;
    d.jb.root = NULL;
    cozy_json_builder_free(&d.jb);
    json_t *request = json_object_get(doc, "request");
    if(request && !lua_isnil(L, -1)) {
        e->decoded_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        /* held, so that its address cannot come back as another request's
           while the Lua value is kept (a review refused before the engine
           ran leaves it until the next decode) */
        e->decoded_for = json_incref(request);
    }
    lua_settop(L, top);
    cozy_json_loaded(error, len);
    return doc;
}
