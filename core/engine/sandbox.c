/* sandbox.c — the policy sandbox (engine.h, internal.h): the allocator
 * with its memory cap, the instruction budget that pcall cannot swallow,
 * the one protected call into Lua (engine_call) and its outcomes, sources
 * and the sandboxed require, and the library allow-list.
 *
 * Every entry into Lua runs through engine_call(): it installs the
 * instruction-count hook and the per-call memory ceiling for policy code,
 * calls with a message handler, clears both on every exit path and
 * classifies the outcome (ok, error, budget, memory, deadline). Models:
 * lua.c's docall, Redis script_lua.c and HAProxy hlua.c for the budget that
 * pcall cannot swallow, HAProxy hlua_alloc and ltests.c for the allocator.
 */
#include "engine/internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <lauxlib.h>
#include <lualib.h>

#include "base/file.h"
#include "engine/luajson.h"

/* ---- allocator ---------------------------------------------------------- */

void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    engine *e = ud;
    if(!ptr)
        osize = 0; /* osize encodes the object type when ptr is NULL */
    if(nsize == 0) {
        free(ptr);
        e->mem_used -= osize;
        return NULL;
    }
    if(nsize > osize) {
        size_t grow = nsize - osize;
        if(e->in_call && e->fail_after > 0 && (e->fail_sticky || --e->fail_after == 0)) {
            e->fail_sticky = 1;
            e->fail_after = 1;
            e->mem_exhausted = 1;
            return NULL;
        }
        if(e->mem_used + grow > e->mem_limit) {
            if(e->in_call)
                e->mem_exhausted = 1;
            return NULL;
        }
    }
    void *p = realloc(ptr, nsize);
    if(!p)
        return nsize <= osize ? ptr : NULL; /* Lua assumes shrinking never fails */
    e->mem_used = e->mem_used - osize + nsize;
    return p;
}

engine *sandbox_engine_of(lua_State *L)
{
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* ---- budget hook -------------------------------------------------------- */

/* Adds `steps` to the call's count and checks the budget and the deadline;
 * raises when either is spent, and from then on on every instruction, so a
 * pcall in the policy that catches the error is stopped again at once. */
static void charge(lua_State *L, engine *e, long long steps);

static void count_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    charge(L, sandbox_engine_of(L), ENGINE_HOOK_STEP);
}

static int time_passed(clockid_t clock, const struct timespec *end)
{
    struct timespec now;
    clock_gettime(clock, &now);
    return now.tv_sec > end->tv_sec || (now.tv_sec == end->tv_sec && now.tv_nsec >= end->tv_nsec);
}

static void charge(lua_State *L, engine *e, long long steps)
{
    if(!e->budget_exhausted && !e->deadline_passed && !e->sliced) {
        e->instr_used += steps;
        if(e->has_deadline && time_passed(CLOCK_MONOTONIC, &e->deadline))
            e->deadline_passed = 1;
        else if(e->has_slice && time_passed(CLOCK_THREAD_CPUTIME_ID, &e->slice_end))
            e->sliced = 1;
        if(e->instr_used <= e->instr_budget && !e->deadline_passed && !e->sliced)
            return;
        if(!e->deadline_passed && !e->sliced)
            e->budget_exhausted = 1;
        lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
    }
    luaL_error(L, e->deadline_passed ? "review deadline passed"
                  : e->sliced        ? "review slice spent (to be run again on a review thread)"
                                     : "instruction budget exhausted");
}

/* The meter of the string library's matcher (pattern.h): a matching step
 * costs what a Lua instruction does, inside a policy call only (trusted
 * runtime code runs without a budget; the matcher's recursion bound holds
 * there too). A call that starts after the budget or the deadline is spent
 * raises at once. */
static void pattern_charge(lua_State *L, void *ud, long steps)
{
    engine *e = ud;
    if(e->in_call)
        charge(L, e, steps);
}

/* 1 when `msg` already starts with a position "CHUNK:LINE: " (what
 * error(msg, level > 0) and the Lua VM put in front of a message). */
static int has_position(const char *msg)
{
    const char *colon = strchr(msg, ':');
    if(!colon || colon == msg || memchr(msg, '\n', (size_t)(colon - msg)))
        return 0;
    const char *p = colon + 1;
    if(*p < '0' || *p > '9')
        return 0;
    while(*p >= '0' && *p <= '9')
        p++;
    return p[0] == ':' && p[1] == ' ';
}

/* Message handler of engine_call: makes sure the message of a policy's
 * error names file and line of the innermost Lua frame (errors raised by C
 * functions carry none); a message that already has a position keeps it
 * (a library function that raises at its caller's line, such as a rule
 * declaration, names the policy's line, not its own). Upvalue 1 is true
 * for trusted runtime code, whose
 * messages already name the policy file and line they are about: a string
 * passes unchanged. A non-string error object is described. */
static int message_handler(lua_State *L)
{
    int trusted = lua_toboolean(L, lua_upvalueindex(1));
    const char *msg = lua_tostring(L, 1);
    if(!msg) {
        if(luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    } else if(trusted) {
        lua_settop(L, 1);
        return 1;
    }
    lua_Debug ar;
    for(int level = 0; !trusted && !has_position(msg) && lua_getstack(L, level, &ar); level++) {
        if(!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0)
            continue;
        size_t n = strlen(ar.short_src);
        if(strncmp(msg, ar.short_src, n) != 0)
            msg = lua_pushfstring(L, "%s:%d: %s", ar.short_src, ar.currentline, msg);
        break;
    }
    lua_pushstring(L, msg);
    return 1;
}

static const char *const outcome_names[ENGINE_OUTCOME_LAST] = {
    [ENGINE_ALLOWED] = "allowed", [ENGINE_REFUSED] = "refused", [ENGINE_POLICY_ERROR] = "error",
    [ENGINE_BUDGET] = "budget",   [ENGINE_MEMORY] = "memory",   [ENGINE_DEADLINE] = "deadline",
};

const char *engine_outcome_name(engine_outcome o)
{
    return (int)o >= 0 && o < ENGINE_OUTCOME_LAST ? outcome_names[o] : "unknown";
}

int engine_outcome_is_failure(engine_outcome o)
{
    return o == ENGINE_POLICY_ERROR || o == ENGINE_BUDGET || o == ENGINE_MEMORY || o == ENGINE_DEADLINE;
}

/* The outcome named `name` (engine_outcome_name's words), or -1. */
int sandbox_outcome_of(const char *name)
{
    for(int i = 0; name && i < ENGINE_OUTCOME_LAST; i++)
        if(strcmp(outcome_names[i], name) == 0)
            return i;
    return -1;
}

engine_outcome engine_call(engine *e, int nargs, int nres, int budgeted, cozy_err *err)
{
    lua_State *L = e->L;
    int base = lua_gettop(L) - nargs; /* the function */
    lua_pushboolean(L, !budgeted);
    lua_pushcclosure(L, message_handler, 1);
    lua_insert(L, base); /* handler at base, function at base + 1 */
    if(budgeted) {
        e->in_call = 1;
        e->instr_used = 0;
        e->budget_exhausted = 0;
        e->deadline_passed = 0;
        e->mem_exhausted = 0;
        e->mem_limit = e->mem_used + (size_t)e->memory_cap;
        /* a call after the slice ran out stops at its first instruction */
        lua_sethook(L, count_hook, LUA_MASKCOUNT, e->sliced ? 1 : ENGINE_HOOK_STEP);
    }
    int st = lua_pcall(L, nargs, nres, base);
    int budget = 0, mem = 0, late = 0;
    if(budgeted) {
        lua_sethook(L, NULL, 0, 0);
        e->in_call = 0;
        e->mem_limit = ENGINE_STATE_CEILING;
        e->fail_after = 0;
        e->fail_sticky = 0;
        /* sliced: the answer is thrown away and the review run again
           (engine_set_slice); reported as late meanwhile */
        budget = e->budget_exhausted, mem = e->mem_exhausted, late = e->deadline_passed || e->sliced;
    }
    if(!budget && !mem && !late && st == LUA_OK) {
        lua_remove(L, base);
        return ENGINE_ALLOWED;
    }
    /* leave exactly one value: the message */
    if(st != LUA_OK && lua_type(L, -1) == LUA_TSTRING) {
        lua_replace(L, base);
        lua_settop(L, base);
    } else {
        lua_settop(L, base - 1);
        lua_pushliteral(L, "");
    }
    engine_outcome o = ENGINE_POLICY_ERROR;
    if(late || budget || mem) {
        lua_pop(L, 1);
        if(late)
            o = ENGINE_DEADLINE, lua_pushliteral(L, "did not finish before the review deadline");
        else if(budget)
            o = ENGINE_BUDGET, lua_pushfstring(L, "exceeded its instruction budget of %I instructions",
                                               (lua_Integer)e->instr_budget);
        else
            o = ENGINE_MEMORY, lua_pushfstring(L, "exceeded its memory cap of %I bytes", (lua_Integer)e->memory_cap);
    }
    if(err)
        cozy_fail(err, COZY_ERR_POLICY, "%s", lua_tostring(L, -1));
    if(mem)
        lua_gc(L, LUA_GCCOLLECT);
    return o;
}

/* host.invoke(name, fn, ...) -> "ok", results... | kind, message
 * kind is "error", "budget", "memory" or "deadline". The only way the
 * runtime runs policy code: engine_call with the budget. */
int sandbox_host_invoke(lua_State *L)
{
    engine *e = sandbox_engine_of(L);
    const char *name = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    if(e->in_call)
        return luaL_error(L, "policy %s: nested policy call", name);
    int nargs = lua_gettop(L) - 2;
    engine_outcome o = engine_call(e, nargs, LUA_MULTRET, 1, NULL);
    if(o != ENGINE_ALLOWED) {
        lua_pushstring(L, engine_outcome_name(o));
        lua_insert(L, -2);
        return 2;
    }
    int nres = lua_gettop(L) - 1; /* the name stays at 1 */
    lua_pushliteral(L, "ok");
    lua_insert(L, 2);
    return nres + 1;
}

int sandbox_host_now(lua_State *L)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    lua_pushnumber(L, (lua_Number)t.tv_sec + (lua_Number)t.tv_nsec / 1e9);
    return 1;
}

/* ---- sources and the sandboxed require ---------------------------------- */

static char *sandbox_read_source(const char *path, size_t *len, cozy_err *err)
{
    char *buf = NULL;
    int rc = cozy_read_file(path, ENGINE_MAX_SOURCE_BYTES, &buf, len);
    if(rc) {
        cozy_fail(err, COZY_ERR_IO, "%s: %s", path,
                  rc == EFBIG || rc == ENOMEM ? "too large or out of memory" : strerror(rc));
        return NULL;
    }
    return buf;
}

/* Pushes a new _ENV: an empty table reading through to the shared base. */
static void push_env(lua_State *L)
{
    lua_newtable(L);
    lua_createtable(L, 0, 2);
    lua_getfield(L, LUA_REGISTRYINDEX, REG_BASE);
    lua_setfield(L, -2, "__index");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
}

/* Loads `len` bytes of `text` as text (mode "t") with chunk name
 * "@<name>" (so messages read "<name>:<line>:") and a fresh _ENV. Pushes
 * the function, or nil and a message. */
static int sandbox_push_chunk_text(lua_State *L, const char *name, const char *text, size_t len)
{
    lua_pushfstring(L, "@%s", name);
    int st = luaL_loadbufferx(L, text, len, lua_tostring(L, -1), "t");
    lua_remove(L, -2);
    if(st != LUA_OK) {
        lua_pushnil(L);
        lua_insert(L, -2);
        return 2;
    }
    push_env(L);
    if(!lua_setupvalue(L, -2, 1))
        lua_pop(L, 1);
    return 1;
}

/* Loads the file `path` as sandbox_push_chunk_text does, named by its path. */
int sandbox_push_chunk(lua_State *L, const char *path)
{
    cozy_err err = {{0}};
    size_t len = 0;
    char *src = sandbox_read_source(path, &len, &err);
    if(!src) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    int n = sandbox_push_chunk_text(L, path, src, len);
    free(src);
    return n;
}

/* The hoster source from memory that is module `module` (want_module) or
 * the policy file named `name`, or NULL. */
static const engine_source *find_source(const engine *e, const char *name, int want_module)
{
    for(size_t i = 0; i < e->n_sources; i++) {
        const engine_source *src = &e->sources[i];
        const char *key = want_module ? src->module : src->name;
        if(!want_module == !src->module && key && strcmp(key, name) == 0)
            return src;
    }
    return NULL;
}

int sandbox_valid_module_name(const char *s)
{
    if(!*s || *s == '.')
        return 0;
    for(const char *p = s; *p; p++) {
        if(!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
             *p == '-' || *p == '.'))
            return 0;
        if(p[0] == '.' && p[1] == '.')
            return 0;
    }
    return 1;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* require(name): library modules (lua/), then <bundle>/lib, <override>/lib.
 * Returns a read-only view of the module's value, cached per state. */
void sandbox_freeze_env(lua_State *L, int fn)
{
    fn = lua_absindex(L, fn);
    if(!lua_getupvalue(L, fn, 1)) /* a main chunk's first upvalue is its _ENV */
        return;
    if(lua_type(L, -1) != LUA_TTABLE) {
        lua_pop(L, 1);
        return;
    }
    int env = lua_gettop(L);
    /* tables the file left in its globals become read-only views, and the
     * globals as loaded are kept, to be put back before each review */
    lua_newtable(L);
    int snap = env + 1;
    lua_pushnil(L);
    while(lua_next(L, env)) {
        if(lua_type(L, -1) == LUA_TTABLE) {
            luajson_push_readonly(L, -1);
            lua_replace(L, -2);
            lua_pushvalue(L, -2);
            lua_pushvalue(L, -2);
            lua_rawset(L, env);
        }
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, snap);
    }
    lua_getfield(L, LUA_REGISTRYINDEX, REG_FROZEN);
    int reg = lua_gettop(L);
    lua_pushvalue(L, fn);
    lua_rawseti(L, reg, (lua_Integer)lua_rawlen(L, reg) + 1); /* [i] = chunk */
    lua_pushvalue(L, env);
    lua_rawsetp(L, reg, lua_topointer(L, fn)); /* [chunk] = _ENV */
    lua_pushvalue(L, env);
    lua_pushvalue(L, snap);
    lua_rawset(L, reg); /* [_ENV] = its globals as loaded */
    lua_settop(L, env - 1);
}

void sandbox_restore_envs(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, REG_FROZEN);
    int reg = lua_gettop(L);
    lua_Integer n = (lua_Integer)lua_rawlen(L, reg);
    for(lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, reg, i); /* the chunk */
        int fn = lua_gettop(L);
        lua_rawgetp(L, reg, lua_topointer(L, fn)); /* its _ENV */
        int env = fn + 1;
        lua_pushvalue(L, env);
        if(!lua_setupvalue(L, fn, 1)) /* undo `_ENV = ...` in a hook */
            lua_pop(L, 1);
        /* clear what a review added or changed, then the loaded globals */
        lua_pushnil(L);
        while(lua_next(L, env)) {
            lua_pop(L, 1);
            lua_pushvalue(L, -1);
            lua_pushnil(L);
            lua_rawset(L, env);
        }
        lua_pushvalue(L, env);
        lua_rawget(L, reg); /* the snapshot */
        lua_pushnil(L);
        while(lua_next(L, -2)) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, env);
        }
        lua_settop(L, fn - 1);
    }
    lua_pop(L, 1);
}

/* setmetatable(t, mt) for policies: as Lua's, but a metatable with a __gc
 * field is refused. A finalizer runs when the collector decides, outside
 * the rule's call and so outside its budget and deadline (docs/decisions/
 * 0014); a __gc field added after setmetatable never runs (Lua 5.4 manual
 * §2.5.3), so checking here is enough. */
static int sandbox_setmetatable(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    int t = lua_type(L, 2);
    luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
    if(t == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if(lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "setmetatable: a metatable with __gc is not allowed in a policy (a finalizer would "
                                 "run outside the rule's budget)");
        lua_pop(L, 1);
    }
    if(luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
        return luaL_error(L, "cannot change a protected metatable");
    lua_settop(L, 2);
    lua_setmetatable(L, 1);
    return 1;
}

int sandbox_require(lua_State *L)
{
    engine *e = sandbox_engine_of(L);
    const char *name = luaL_checkstring(L, 1);
    if(!sandbox_valid_module_name(name))
        return luaL_argerror(L, 1, "invalid module name");
    lua_settop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, REG_LOADED); /* 2 */
    if(lua_getfield(L, 2, name) != LUA_TNIL) {
        luajson_push_readonly(L, -1);
        return 1;
    }
    lua_pop(L, 1);
    int frozen = 1; /* the library's modules (and json) never change once loaded: frozen views */
    if(strcmp(name, "cozygpu.json") == 0) {
        luaopen_cozygpu_json(L);
    } else {
        lua_getfield(L, LUA_REGISTRYINDEX, REG_LOADING);
        if(lua_getfield(L, -1, name) != LUA_TNIL)
            return luaL_error(L, "module '%s': circular require", name);
        lua_pop(L, 1);
        char rel[512];
        snprintf(rel, sizeof rel, "%s", name);
        for(char *p = rel; *p; p++)
            if(*p == '.')
                *p = '/';
        /* the library serves only its public namespace (cozygpu.*): the
         * runtime's own modules (lua/runtime/) are out of a policy's reach */
        int public_name = strncmp(name, "cozygpu.", 8) == 0;
        const char *dirs[3] = {public_name ? e->library_dir : NULL, e->bundle_dir, e->override_dir};
        const char *subs[3] = {"", "/lib", "/lib"};
        char path[PATH_MAX];
        int found = 0, library = 0;
        for(int i = 0; i < 3 && !found; i++) {
            if(!dirs[i])
                continue;
            snprintf(path, sizeof path, "%s%s/%s.lua", dirs[i], subs[i], rel);
            found = file_exists(path);
            library = found && i == 0;
        }
        const engine_source *src = found ? NULL : find_source(e, name, 1);
        if(!found && !src)
            return luaL_error(L, "module '%s' not found in the policy library or bundle lib/", name);
        if((src ? sandbox_push_chunk_text(L, src->name, src->text, src->len) : sandbox_push_chunk(L, path)) != 1)
            return luaL_error(L, "module '%s': %s", name, lua_tostring(L, -1));
        lua_pushboolean(L, 1);
        lua_setfield(L, 3, name); /* loading[name] = true */
        lua_pushvalue(L, -1);
        lua_insert(L, -2); /* the chunk, kept below its call for freezing */
        lua_pushstring(L, name);
        lua_call(L, 1, 1);
        /* a bundle's module is the hoster's: its globals are put back
         * before each review. The library's own modules are ours and keep
         * no state in globals: restoring them would only cost every review. */
        if(!library)
            sandbox_freeze_env(L, -2);
        frozen = library;
        lua_remove(L, -2);
        lua_pushnil(L);
        lua_setfield(L, 3, name);
        if(lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_pushboolean(L, 1);
        }
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, 2, name);
    if(frozen)
        luajson_push_frozen(L, -1);
    else
        luajson_push_readonly(L, -1);
    return 1;
}

/* host.load(path[, from_memory]) -> chunk | nil, message. With
 * from_memory, `path` is the name of a hoster source given to engine_open. */
int sandbox_host_load(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    if(lua_toboolean(L, 2)) {
        const engine_source *src = find_source(sandbox_engine_of(L), path, 0);
        if(!src) {
            lua_pushnil(L);
            lua_pushfstring(L, "%s: no such source", path);
            return 2;
        }
        return sandbox_push_chunk_text(L, src->name, src->text, src->len);
    }
    return sandbox_push_chunk(L, path);
}

/* host.readonly(v) -> read-only view */
int sandbox_host_freeze(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TFUNCTION);
    sandbox_freeze_env(L, 1);
    return 0;
}

int sandbox_host_restore(lua_State *L)
{
    sandbox_restore_envs(L);
    return 0;
}

int sandbox_host_readonly(lua_State *L)
{
    luaL_checkany(L, 1);
    luajson_push_readonly(L, 1);
    return 1;
}

/* ---- bootstrap ------------------------------------------------------------ */

/* pairs(t) as Lua's, but for a table without __pairs it returns the
 * sandbox's `next` (luajson_next), never the real one: the real `next`
 * reads through a read-only view's wrapper and hands out the table behind
 * it (the library's modules, the request, the cluster view). */
static int sandbox_pairs(lua_State *L)
{
    luaL_checkany(L, 1);
    if(luaL_getmetafield(L, 1, "__pairs") != LUA_TNIL) {
        lua_pushvalue(L, 1);
        lua_call(L, 1, 3);
        return 3;
    }
    lua_pushcfunction(L, luajson_next);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

void sandbox_open_libs(lua_State *L)
{
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base},         {LUA_TABLIBNAME, luaopen_table}, {LUA_STRLIBNAME, luaopen_string},
        {LUA_MATHLIBNAME, luaopen_math},   {LUA_UTF8LIBNAME, luaopen_utf8}, {LUA_OSLIBNAME, luaopen_os},
        {NULL, NULL},
    };
    for(const luaL_Reg *lib = libs; lib->func; lib++) {
        luaL_requiref(L, lib->name, lib->func, 1);
        lua_pop(L, 1);
    }
    /* the bounded matcher replaces the string library's own, in the table
     * that is also the string metatable's __index ("x"):find(...) */
    engine *e = sandbox_engine_of(L);
    e->meter.charge = pattern_charge;
    e->meter.ud = e;
    lua_getglobal(L, LUA_STRLIBNAME);
    pattern_register(L, -1, &e->meter);
    lua_pop(L, 1);
    /* hide the string metatable: getmetatable("") must not hand out the
     * real string library */
    lua_pushliteral(L, "");
    if(lua_getmetatable(L, -1)) {
        lua_pushliteral(L, "string");
        lua_setfield(L, -2, "__metatable");
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* The shared, read-only library view every _ENV reads through to. */
void sandbox_build_base(lua_State *L)
{
    static const char *const globals[] = {
        "assert", "error",   "getmetatable", "ipairs",   "next",     "pairs",    "pcall",  "rawequal",
        "rawget", "rawlen",  "select",       "setmetatable", "tonumber", "tostring", "type", "xpcall",
        "_VERSION", NULL,
    };
    static const char *const libs[] = {"string", "table", "math", "utf8", NULL};
    static const char *const os_fns[] = {"time", "clock", "date", "difftime", NULL};
    lua_newtable(L);
    int base = lua_gettop(L);
    lua_pushglobaltable(L);
    for(int i = 0; globals[i]; i++) {
        lua_getfield(L, -1, globals[i]);
        lua_setfield(L, base, globals[i]);
    }
    for(int i = 0; libs[i]; i++) {
        lua_getfield(L, -1, libs[i]);
        luajson_push_frozen(L, -1);
        lua_setfield(L, base, libs[i]);
        lua_pop(L, 1);
    }
    lua_getfield(L, -1, "os");
    lua_newtable(L);
    for(int i = 0; os_fns[i]; i++) {
        lua_getfield(L, -2, os_fns[i]);
        lua_setfield(L, -2, os_fns[i]);
    }
    luajson_push_frozen(L, -1);
    lua_setfield(L, base, "os");
    lua_pop(L, 3); /* os copy, os, _G */
    lua_pushcfunction(L, sandbox_require);
    lua_setfield(L, base, "require");
    lua_pushcfunction(L, luajson_next);
    lua_setfield(L, base, "next");
    lua_pushcfunction(L, sandbox_pairs);
    lua_setfield(L, base, "pairs");
    lua_pushcfunction(L, sandbox_setmetatable);
    lua_setfield(L, base, "setmetatable");
    lua_setfield(L, LUA_REGISTRYINDEX, REG_BASE);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_LOADED);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_LOADING);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_FROZEN);
}
