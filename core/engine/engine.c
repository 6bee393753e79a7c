/* engine.c — Lua policy host: sandbox, budgets, bundle loading (engine.h).
 *
 * Every policy hook runs through host_invoke(): one protected entry that
 * installs the instruction-count hook and the per-call memory ceiling,
 * calls the hook with a message handler, clears both on every exit path and
 * classifies the outcome (ok, error, budget, memory). Models: lua.c's
 * docall, Redis script_lua.c and HAProxy hlua.c for the budget that pcall
 * cannot swallow, HAProxy hlua_alloc and ltests.c for the allocator.
 */
#include "engine/engine.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <lauxlib.h>
#include <lualib.h>

#include "base/b64.h"
#include "base/file.h"
#include "engine/luajson.h"

#ifndef COZYGPU_LIBDIR
#define COZYGPU_LIBDIR "lua"
#endif
#ifndef COZYGPU_POLICYDIR
#define COZYGPU_POLICYDIR "policies"
#endif

/* Instructions between two runs of the count hook. */
#define ENGINE_HOOK_STEP 1000
/* Ceiling on the whole state outside policy calls (library, snapshot). */
#define ENGINE_STATE_CEILING ((size_t)4 << 30)
/* Ceiling on one policy or module source file. */
#define ENGINE_MAX_SOURCE_BYTES (4u * 1024u * 1024u)

#define REG_BASE    "cozygpu.base"
#define REG_LOADED  "cozygpu.loaded"
#define REG_LOADING "cozygpu.loading"

struct engine {
    lua_State *L;
    size_t mem_used;
    size_t mem_limit;
    int in_call;
    int mem_exhausted;
    long fail_after;
    int fail_sticky;
    long long instr_budget;
    long long instr_used;
    int budget_exhausted;
    int has_deadline;         /* engine_set_deadline was given a time */
    struct timespec deadline; /* CLOCK_MONOTONIC */
    int deadline_passed;
    long long memory_cap;
    char *library_dir;
    char *bundle_dir;
    char *override_dir;
    engine_source *sources;   /* hoster sources from memory (own copies) */
    size_t n_sources;
    int admission_ref;
    int bundle_ref;
    int runtime_ref;          /* engine_open_runtime: the module */
    int rule_count;
};

/* ---- allocator ---------------------------------------------------------- */

static void *engine_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
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

static engine *engine_of(lua_State *L)
{
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* ---- budget hook -------------------------------------------------------- */

static void count_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    engine *e = engine_of(L);
    if(!e->budget_exhausted && !e->deadline_passed) {
        e->instr_used += ENGINE_HOOK_STEP;
        if(e->has_deadline) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if(now.tv_sec > e->deadline.tv_sec ||
               (now.tv_sec == e->deadline.tv_sec && now.tv_nsec >= e->deadline.tv_nsec))
                e->deadline_passed = 1;
        }
        if(e->instr_used <= e->instr_budget && !e->deadline_passed)
            return;
        if(!e->deadline_passed)
            e->budget_exhausted = 1;
        /* from now on raise on every instruction, so a pcall in the policy
         * that catches this error is stopped again at once */
        lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
    }
    luaL_error(L, e->deadline_passed ? "review deadline passed" : "instruction budget exhausted");
}

/* Message handler of engine_call: makes sure the message of a policy's
 * error names file and line of the innermost Lua frame (errors raised by C
 * functions carry none). Upvalue 1 is true for trusted runtime code, whose
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
    for(int level = 0; !trusted && lua_getstack(L, level, &ar); level++) {
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
static int outcome_of(const char *name)
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
        lua_sethook(L, count_hook, LUA_MASKCOUNT, ENGINE_HOOK_STEP);
    }
    int st = lua_pcall(L, nargs, nres, base);
    int budget = 0, mem = 0, late = 0;
    if(budgeted) {
        lua_sethook(L, NULL, 0, 0);
        e->in_call = 0;
        e->mem_limit = ENGINE_STATE_CEILING;
        e->fail_after = 0;
        e->fail_sticky = 0;
        budget = e->budget_exhausted, mem = e->mem_exhausted, late = e->deadline_passed;
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
static int host_invoke(lua_State *L)
{
    engine *e = engine_of(L);
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

/* ---- sources and the sandboxed require ---------------------------------- */

static char *read_source(const char *path, size_t *len, cozy_err *err)
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
static int push_chunk_text(lua_State *L, const char *name, const char *text, size_t len)
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

/* Loads the file `path` as push_chunk_text does, named by its path. */
static int push_chunk(lua_State *L, const char *path)
{
    cozy_err err = {{0}};
    size_t len = 0;
    char *src = read_source(path, &len, &err);
    if(!src) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    int n = push_chunk_text(L, path, src, len);
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

static int valid_module_name(const char *s)
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
static int sandbox_require(lua_State *L)
{
    engine *e = engine_of(L);
    const char *name = luaL_checkstring(L, 1);
    if(!valid_module_name(name))
        return luaL_argerror(L, 1, "invalid module name");
    lua_settop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, REG_LOADED); /* 2 */
    if(lua_getfield(L, 2, name) != LUA_TNIL) {
        luajson_push_readonly(L, -1);
        return 1;
    }
    lua_pop(L, 1);
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
        int found = 0;
        for(int i = 0; i < 3 && !found; i++) {
            if(!dirs[i])
                continue;
            snprintf(path, sizeof path, "%s%s/%s.lua", dirs[i], subs[i], rel);
            found = file_exists(path);
        }
        const engine_source *src = found ? NULL : find_source(e, name, 1);
        if(!found && !src)
            return luaL_error(L, "module '%s' not found in the policy library or bundle lib/", name);
        if((src ? push_chunk_text(L, src->name, src->text, src->len) : push_chunk(L, path)) != 1)
            return luaL_error(L, "module '%s': %s", name, lua_tostring(L, -1));
        lua_pushboolean(L, 1);
        lua_setfield(L, 3, name); /* loading[name] = true */
        lua_pushstring(L, name);
        lua_call(L, 1, 1);
        lua_pushnil(L);
        lua_setfield(L, 3, name);
        if(lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_pushboolean(L, 1);
        }
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, 2, name);
    luajson_push_readonly(L, -1);
    return 1;
}

/* host.load(path[, from_memory]) -> chunk | nil, message. With
 * from_memory, `path` is the name of a hoster source given to engine_open. */
static int host_load(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    if(lua_toboolean(L, 2)) {
        const engine_source *src = find_source(engine_of(L), path, 0);
        if(!src) {
            lua_pushnil(L);
            lua_pushfstring(L, "%s: no such source", path);
            return 2;
        }
        return push_chunk_text(L, src->name, src->text, src->len);
    }
    return push_chunk(L, path);
}

/* host.readonly(v) -> read-only view */
static int host_readonly(lua_State *L)
{
    luaL_checkany(L, 1);
    luajson_push_readonly(L, 1);
    return 1;
}

/* ---- bootstrap ------------------------------------------------------------ */

static void open_libs(lua_State *L)
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
static void build_base(lua_State *L)
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
        luajson_push_readonly(L, -1);
        lua_setfield(L, base, libs[i]);
        lua_pop(L, 1);
    }
    lua_getfield(L, -1, "os");
    lua_newtable(L);
    for(int i = 0; os_fns[i]; i++) {
        lua_getfield(L, -2, os_fns[i]);
        lua_setfield(L, -2, os_fns[i]);
    }
    luajson_push_readonly(L, -1);
    lua_setfield(L, base, "os");
    lua_pop(L, 3); /* os copy, os, _G */
    lua_pushcfunction(L, sandbox_require);
    lua_setfield(L, base, "require");
    lua_pushcfunction(L, luajson_next);
    lua_setfield(L, base, "next");
    lua_setfield(L, LUA_REGISTRYINDEX, REG_BASE);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_LOADED);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_LOADING);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* keeps NAME.lua but hidden files */
static int is_policy_file(const char *name, void *ctx)
{
    (void)ctx;
    size_t len = strlen(name);
    return name[0] != '.' && len >= 5 && strcmp(name + len - 4, ".lua") == 0;
}

/* Lists *.lua directly inside dir (not lib/), sorted by name. */
static cozy_result list_lua(const char *dir, char ***names, size_t *count, cozy_err *err)
{
    int rc = cozy_list_dir(dir, is_policy_file, NULL, names, count);
    if(rc)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", dir, rc == ENOMEM ? "out of memory" : strerror(rc));
    return COZY_OK;
}

/* Pushes the list of policy files {{name=, path=, memory=}, ...} sorted by
 * file name, an override file (or hoster source from memory, whose path is
 * its name) replacing the bundle file of the same name. */
static cozy_result push_policy_list(lua_State *L, engine *e, cozy_err *err)
{
    cozy_result rc = COZY_OK;
    json_t *byname = json_object(); /* name -> {path, memory}; override replaces */
    const char *dirs[2] = {e->bundle_dir, e->override_dir};
    for(int d = 0; d < 2 && rc == COZY_OK; d++) {
        if(!dirs[d])
            continue;
        char **names = NULL;
        size_t n = 0;
        if((rc = list_lua(dirs[d], &names, &n, err)) != COZY_OK)
            break;
        for(size_t i = 0; i < n; i++) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dirs[d], names[i]);
            json_object_set_new(byname, names[i], json_pack("{s:s, s:b}", "path", path, "memory", 0));
        }
        cozy_free_names(names, n);
    }
    for(size_t i = 0; rc == COZY_OK && i < e->n_sources; i++)
        if(!e->sources[i].module)
            json_object_set_new(byname, e->sources[i].name,
                                json_pack("{s:s, s:b}", "path", e->sources[i].name, "memory", 1));
    if(rc != COZY_OK) {
        json_decref(byname);
        return rc;
    }
    /* sorted by file name */
    size_t n = json_object_size(byname), i = 0;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    const char *key;
    json_t *v;
    json_object_foreach(byname, key, v) keys[i++] = key;
    qsort(keys, n, sizeof *keys, cmp_names);
    lua_createtable(L, (int)n, 0);
    for(i = 0; i < n; i++) {
        lua_createtable(L, 0, 2);
        lua_pushstring(L, keys[i]);
        lua_setfield(L, -2, "name");
        const json_t *f = json_object_get(byname, keys[i]);
        lua_pushstring(L, json_string_value(json_object_get(f, "path")));
        lua_setfield(L, -2, "path");
        lua_pushboolean(L, json_is_true(json_object_get(f, "memory")));
        lua_setfield(L, -2, "memory");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    free(keys);
    json_decref(byname);
    return COZY_OK;
}

/* Calls admission[fn](args already on the stack: nargs) in plain protected
 * mode (the library is trusted: no budget). Leaves nres results. */
/* Calls field `fn` of the runtime module `ref` (args already on the
 * stack: nargs) through engine_call, trusted (no budget: the runtime is
 * ours). Leaves nres results. COZY_ERR_INTERNAL with the message when it
 * raised. */
static cozy_result call_runtime(engine *e, int ref, const char *fn, int nargs, int nres, cozy_err *err)
{
    lua_State *L = e->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    lua_insert(L, -(nargs + 1));
    if(engine_call(e, nargs, nres, 0, err) != ENGINE_ALLOWED) {
        lua_pop(L, 1);
        return COZY_ERR_INTERNAL;
    }
    return COZY_OK;
}

static cozy_result call_admission(engine *e, const char *fn, int nargs, int nres, cozy_err *err)
{
    return call_runtime(e, e->admission_ref, fn, nargs, nres, err);
}

/* Opens the allowed libraries, builds the shared read-only base, then loads
 * the runtime module (upvalue 1: its name) from <library>/runtime/ and
 * leaves its value. Runs under engine_call. */
static int open_protected(lua_State *L)
{
    engine *e = engine_of(L);
    open_libs(L);
    luajson_open_markers(L);
    build_base(L);
    const char *module = lua_tostring(L, lua_upvalueindex(1));
    char path[PATH_MAX];
    if(snprintf(path, sizeof path, "%s/runtime/%s.lua", e->library_dir, module) >= (int)sizeof path)
        return luaL_error(L, "%s/runtime/%s.lua: path too long", e->library_dir, module);
    if(push_chunk(L, path) != 1)
        return lua_error(L);
    lua_pushstring(L, module);
    lua_call(L, 1, 1);
    return 1;
}

/* A new engine with its state, the libraries and the runtime module
 * `module` loaded (its reference in *ref). */
static cozy_result engine_new(engine **out, const engine_options *opt, const char *module, int *ref,
                              cozy_err *err)
{
    engine *e = calloc(1, sizeof *e);
    if(!e)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    e->mem_limit = ENGINE_STATE_CEILING;
    e->instr_budget = opt && opt->instructions > 0 ? opt->instructions : 10000000;
    e->memory_cap = opt && opt->memory_bytes > 0 ? opt->memory_bytes : 64LL * 1024 * 1024;
    e->library_dir = strdup(opt && opt->library_dir ? opt->library_dir : COZYGPU_LIBDIR);
    e->bundle_dir = strdup(opt && opt->bundle_dir ? opt->bundle_dir : COZYGPU_POLICYDIR);
    e->override_dir = opt && opt->override_dir ? strdup(opt->override_dir) : NULL;
    e->admission_ref = e->bundle_ref = e->runtime_ref = LUA_NOREF;
    if(!e->library_dir || !e->bundle_dir || (opt && opt->override_dir && !e->override_dir)) {
        engine_close(e);
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    }
    size_t n = opt && !opt->override_dir ? opt->n_override_sources : 0;
    if(n) {
        e->sources = calloc(n, sizeof *e->sources);
        if(!e->sources) {
            engine_close(e);
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        }
        for(size_t i = 0; i < n; i++) {
            const engine_source *in = &opt->override_sources[i];
            engine_source *c = &e->sources[e->n_sources++];
            c->name = strdup(in->name);
            c->module = in->module ? strdup(in->module) : NULL;
            char *text = malloc(in->len + 1);
            if(text) {
                memcpy(text, in->text, in->len);
                text[in->len] = 0;
            }
            c->text = text;
            c->len = in->len;
            if(!c->name || (in->module && !c->module) || !text) {
                engine_close(e);
                return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
            }
        }
    }
    e->L = lua_newstate(engine_alloc, e);
    if(!e->L) {
        engine_close(e);
        return cozy_fail(err, COZY_ERR_INTERNAL, "cannot create a Lua state");
    }
    lua_State *L = e->L;
    /* Generational collection: a review makes many short-lived tables
     * (the request, views, verdicts) over a long-lived library and cluster
     * view, which is the case it is built for (Lua 5.4 manual §2.5.2). */
    lua_gc(L, LUA_GCGEN, 0, 0);
    lua_pushstring(L, module);
    lua_pushcclosure(L, open_protected, 1);
    cozy_err cerr;
    if(engine_call(e, 0, 1, 0, &cerr) != ENGINE_ALLOWED) {
        cozy_result rc = cozy_fail(err, COZY_ERR_POLICY, "loading the policy library: %s", cerr.msg);
        engine_close(e);
        return rc;
    }
    int r = luaL_ref(L, LUA_REGISTRYINDEX);
    if(ref)
        *ref = r;
    else
        e->admission_ref = r;
    *out = e;
    return COZY_OK;
}

cozy_result engine_open(engine **out, const engine_options *opt, cozy_err *err)
{
    engine *e = NULL;
    cozy_result rc = engine_new(&e, opt, "admission", NULL, err);
    if(rc != COZY_OK)
        return rc;
    lua_State *L = e->L;
    /* host table handed to the trusted admission module */
    lua_createtable(L, 0, 8);
    lua_pushcfunction(L, host_invoke);
    lua_setfield(L, -2, "invoke");
    lua_pushcfunction(L, host_load);
    lua_setfield(L, -2, "load");
    lua_pushcfunction(L, host_readonly);
    lua_setfield(L, -2, "readonly");
    lua_getfield(L, LUA_REGISTRYINDEX, REG_BASE);
    lua_setfield(L, -2, "base");
    if((rc = push_policy_list(L, e, err)) != COZY_OK) {
        engine_close(e);
        return rc;
    }
    lua_setfield(L, -2, "policy_files");
    lua_pushinteger(L, (lua_Integer)e->instr_budget);
    lua_setfield(L, -2, "instructions");
    lua_pushinteger(L, (lua_Integer)e->memory_cap);
    lua_setfield(L, -2, "memory_bytes");
    if((rc = call_admission(e, "load", 1, 1, err)) != COZY_OK) {
        engine_close(e);
        return COZY_ERR_POLICY;
    }
    lua_getfield(L, -1, "count");
    e->rule_count = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    e->bundle_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    *out = e;
    return COZY_OK;
}

cozy_result engine_open_runtime(engine **out, const engine_options *opt, const char *module, cozy_err *err)
{
    if(!valid_module_name(module) || strchr(module, '.'))
        return cozy_fail(err, COZY_ERR_USAGE, "runtime module %s: not a module name", module);
    engine *e = NULL;
    int ref = LUA_NOREF;
    cozy_result rc = engine_new(&e, opt, module, &ref, err);
    if(rc != COZY_OK)
        return rc;
    e->runtime_ref = ref;
    *out = e;
    return COZY_OK;
}

void engine_push_runtime_fn(engine *e, const char *fn)
{
    lua_rawgeti(e->L, LUA_REGISTRYINDEX, e->runtime_ref);
    if(lua_type(e->L, -1) == LUA_TTABLE || lua_type(e->L, -1) == LUA_TUSERDATA)
        lua_getfield(e->L, -1, fn);
    else
        lua_pushnil(e->L);
    lua_remove(e->L, -2);
}

void engine_close(engine *e)
{
    if(!e)
        return;
    if(e->L)
        lua_close(e->L);
    for(size_t i = 0; i < e->n_sources; i++) {
        free((char *)e->sources[i].name);
        free((char *)e->sources[i].module);
        free((char *)e->sources[i].text);
    }
    free(e->sources);
    free(e->library_dir);
    free(e->bundle_dir);
    free(e->override_dir);
    free(e);
}

lua_State *engine_lua(engine *e)
{
    return e->L;
}

void engine_fail_alloc_after(engine *e, long n)
{
    e->fail_after = n > 0 ? n : 0;
    e->fail_sticky = 0;
}

size_t engine_memory_in_use(const engine *e)
{
    return e->mem_used;
}

int engine_rule_count(engine *e)
{
    return e->rule_count;
}

/* pushes the JSON value (light userdata upvalue-free argument 1) */
static int push_json_protected(lua_State *L)
{
    luajson_push(L, lua_touserdata(L, 1));
    return 1;
}

/* Pushes `j` as Lua through engine_call (conversion can run out of
 * memory). COZY_ERR_INTERNAL when it fails, nothing pushed. */
static cozy_result push_json(engine *e, const json_t *j, cozy_err *err)
{
    lua_State *L = e->L;
    lua_pushcfunction(L, push_json_protected);
    lua_pushlightuserdata(L, (void *)j);
    cozy_err cerr;
    if(engine_call(e, 1, 1, 0, &cerr) != ENGINE_ALLOWED) {
        cozy_fail(err, COZY_ERR_INTERNAL, "converting to Lua: %s", cerr.msg);
        lua_pop(L, 1);
        return COZY_ERR_INTERNAL;
    }
    return COZY_OK;
}

cozy_result engine_set_cluster(engine *e, const json_t *objects, const json_t *settings, cozy_err *err)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    cozy_result rc;
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->bundle_ref);
    if((rc = push_json(e, objects, err)) != COZY_OK || (rc = push_json(e, settings, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    rc = call_admission(e, "set_cluster", 3, 0, err);
    lua_settop(L, top);
    return rc;
}

cozy_result engine_review(engine *e, const json_t *request, engine_phase phases, engine_verdict *out, cozy_err *err)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    cozy_result rc;
    memset(out, 0, sizeof *out);
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->bundle_ref);
    if((rc = push_json(e, request, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    lua_createtable(L, 0, 2);
    lua_pushboolean(L, (phases & ENGINE_VALIDATE) != 0);
    lua_setfield(L, -2, "validate");
    lua_pushboolean(L, (phases & ENGINE_MUTATE) != 0);
    lua_setfield(L, -2, "mutate");
    /* admission.review -> response, outcome word, rule name */
    if((rc = call_admission(e, "review", 3, 3, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    int outcome = outcome_of(lua_tostring(L, -2));
    if(outcome < 0) {
        lua_settop(L, top);
        return cozy_fail(err, COZY_ERR_INTERNAL, "admission.review returned no outcome");
    }
    snprintf(out->rule, sizeof out->rule, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "");
    json_t *resp = luajson_to_json(L, -3, err);
    lua_settop(L, top);
    if(!resp)
        return COZY_ERR_INTERNAL;
    json_t *ops = json_object_get(resp, "patch");
    if(ops && json_is_array(ops)) {
        char *text = json_dumps(ops, JSON_COMPACT | JSON_SORT_KEYS);
        char *b64 = text ? cozy_base64_encode(text, strlen(text)) : NULL;
        free(text);
        if(!b64) {
            json_decref(resp);
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory encoding the patch");
        }
        json_object_set_new(resp, "patch", json_string(b64));
        json_object_set_new(resp, "patchType", json_string("JSONPatch"));
        free(b64);
    }
    out->outcome = (engine_outcome)outcome;
    out->response = resp;
    out->message = json_string_value(json_object_get(json_object_get(resp, "status"), "message"));
    return COZY_OK;
}

cozy_result engine_source_for_key(const char *key, const char *text, size_t len, engine_source *out, char *module,
                                  size_t size, cozy_err *err)
{
    size_t n = strlen(key);
    int ok = n >= 5 && strcmp(key + n - 4, ".lua") == 0 && key[0] != '.';
    for(const char *p = key; ok && *p; p++)
        ok = *p == '-' || *p == '_' || *p == '.' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
             (*p >= '0' && *p <= '9');
    if(!ok)
        return cozy_fail(err, COZY_ERR_INPUT, "%s: not a policy file name (NAME.lua of letters, digits, - _ .)", key);
    *out = (engine_source){.name = key, .module = NULL, .text = text, .len = len};
    if(strncmp(key, "lib.", 4) != 0)
        return COZY_OK;
    /* docs/decisions/0007: key lib.a.b.lua is the module "a.b" */
    size_t m = n >= 8 ? n - 8 : 0; /* without "lib." and ".lua" ("lib.lua" leaves nothing) */
    if(m == 0 || key[4] == '.' || key[4 + m - 1] == '.')
        return cozy_fail(err, COZY_ERR_POLICY, "data[%s]: a module key needs a name", key);
    if(m >= size)
        return cozy_fail(err, COZY_ERR_POLICY, "data[%s]: module name too long", key);
    memcpy(module, key + 4, m);
    module[m] = 0;
    out->module = module;
    return COZY_OK;
}

cozy_result engine_apply_patch(engine *e, const json_t *doc, const json_t *ops, json_t **out, cozy_err *err)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    cozy_result rc;
    if((rc = push_json(e, doc, err)) != COZY_OK || (rc = push_json(e, ops, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    if((rc = call_admission(e, "apply_patch", 2, 2, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    if(lua_isnil(L, -2)) {
        rc = cozy_fail(err, COZY_ERR_INPUT, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "patch does not apply");
        lua_settop(L, top);
        return rc;
    }
    json_t *j = luajson_to_json(L, -2, err);
    lua_settop(L, top);
    if(!j)
        return COZY_ERR_INTERNAL;
    *out = j;
    return COZY_OK;
}

void engine_set_deadline(engine *e, const struct timespec *deadline)
{
    if(deadline) {
        e->deadline = *deadline;
        e->has_deadline = 1;
    } else
        e->has_deadline = 0;
}
