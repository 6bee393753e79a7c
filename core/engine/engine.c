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
    int admission_ref;
    int bundle_ref;
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

/* Message handler: makes sure the message names file and line of the
 * innermost Lua frame (errors raised by C functions carry none). */
static int message_handler(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if(!msg) {
        if(luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    lua_Debug ar;
    for(int level = 0; lua_getstack(L, level, &ar); level++) {
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

/* host.invoke(name, fn, ...) -> "ok", results... | kind, message
 * kind is "error", "budget" or "memory". The only way policy code is run. */
static int host_invoke(lua_State *L)
{
    engine *e = engine_of(L);
    const char *name = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    if(e->in_call)
        return luaL_error(L, "policy %s: nested policy call", name);
    int nargs = lua_gettop(L) - 2;
    lua_pushcfunction(L, message_handler);
    lua_insert(L, 2); /* 1 name, 2 handler, 3 fn, 4.. args */

    e->in_call = 1;
    e->instr_used = 0;
    e->budget_exhausted = 0;
    e->deadline_passed = 0;
    e->mem_exhausted = 0;
    e->mem_limit = e->mem_used + (size_t)e->memory_cap;
    lua_sethook(L, count_hook, LUA_MASKCOUNT, ENGINE_HOOK_STEP);
    int st = lua_pcall(L, nargs, LUA_MULTRET, 2);
    lua_sethook(L, NULL, 0, 0);
    e->in_call = 0;
    e->mem_limit = ENGINE_STATE_CEILING;
    e->fail_after = 0;
    e->fail_sticky = 0;

    int budget = e->budget_exhausted, mem = e->mem_exhausted, late = e->deadline_passed;
    if(budget || mem || late || st != LUA_OK) {
        const char *detail = st != LUA_OK && lua_type(L, 3) == LUA_TSTRING ? lua_tostring(L, 3) : "";
        if(late)
            lua_pushliteral(L, "deadline"), lua_pushliteral(L, "did not finish before the review deadline");
        else if(budget)
            lua_pushliteral(L, "budget"), lua_pushfstring(L, "exceeded its instruction budget of %I instructions",
                                                          (lua_Integer)e->instr_budget);
        else if(mem)
            lua_pushliteral(L, "memory"), lua_pushfstring(L, "exceeded its memory cap of %I bytes",
                                                          (lua_Integer)e->memory_cap);
        else
            lua_pushliteral(L, "error"), lua_pushstring(L, detail);
        if(mem)
            lua_gc(L, LUA_GCCOLLECT);
        return 2;
    }
    int nres = lua_gettop(L) - 2;
    lua_pushliteral(L, "ok");
    lua_insert(L, 3);
    return nres + 1;
}

/* ---- sources and the sandboxed require ---------------------------------- */

static char *read_source(const char *path, size_t *len, cozy_err *err)
{
    FILE *f = fopen(path, "rb");
    if(!f) {
        cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(ENGINE_MAX_SOURCE_BYTES + 1);
    size_t n = buf ? fread(buf, 1, ENGINE_MAX_SOURCE_BYTES + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if(!buf || bad || n > ENGINE_MAX_SOURCE_BYTES) {
        free(buf);
        cozy_fail(err, COZY_ERR_IO, "%s: %s", path, bad ? "read error" : "too large or out of memory");
        return NULL;
    }
    *len = n;
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

/* Loads `path` as text with chunk name "@path" and a fresh _ENV. Pushes the
 * function, or nil and a message. */
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
    lua_pushfstring(L, "@%s", path);
    int st = luaL_loadbufferx(L, src, len, lua_tostring(L, -1), "t");
    free(src);
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
        const char *dirs[3] = {e->library_dir, e->bundle_dir, e->override_dir};
        const char *subs[3] = {"", "/lib", "/lib"};
        char path[PATH_MAX];
        int found = 0;
        for(int i = 0; i < 3 && !found; i++) {
            if(!dirs[i])
                continue;
            snprintf(path, sizeof path, "%s%s/%s.lua", dirs[i], subs[i], rel);
            found = file_exists(path);
        }
        if(!found)
            return luaL_error(L, "module '%s' not found in the policy library or bundle lib/", name);
        if(push_chunk(L, path) != 1)
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

/* host.load(path) -> chunk | nil, message */
static int host_load(lua_State *L)
{
    return push_chunk(L, luaL_checkstring(L, 1));
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

/* Lists *.lua directly inside dir (not lib/), sorted by name. */
static cozy_result list_lua(const char *dir, char ***names, size_t *count, cozy_err *err)
{
    DIR *d = opendir(dir);
    if(!d)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", dir, strerror(errno));
    size_t n = 0, cap = 16;
    char **v = malloc(cap * sizeof *v);
    struct dirent *de;
    while(v && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if(de->d_name[0] == '.' || len < 5 || strcmp(de->d_name + len - 4, ".lua") != 0)
            continue;
        if(n == cap) {
            char **w = realloc(v, (cap *= 2) * sizeof *v);
            if(!w)
                break;
            v = w;
        }
        v[n++] = strdup(de->d_name);
    }
    closedir(d);
    if(!v)
        return cozy_fail(err, COZY_ERR_IO, "%s: out of memory", dir);
    qsort(v, n, sizeof *v, cmp_names);
    *names = v;
    *count = n;
    return COZY_OK;
}

/* Pushes the list of policy files {{name=, path=}, ...} sorted by file
 * name, an override file replacing the bundle file of the same name. */
static cozy_result push_policy_list(lua_State *L, engine *e, cozy_err *err)
{
    cozy_result rc = COZY_OK;
    json_t *byname = json_object(); /* name -> path; override replaces */
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
            json_object_set_new(byname, names[i], json_string(path));
            free(names[i]);
        }
        free(names);
    }
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
        lua_pushstring(L, json_string_value(json_object_get(byname, keys[i])));
        lua_setfield(L, -2, "path");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    free(keys);
    json_decref(byname);
    return COZY_OK;
}

/* Calls admission[fn](args already on the stack: nargs) in plain protected
 * mode (the library is trusted: no budget). Leaves nres results. */
static cozy_result call_admission(engine *e, const char *fn, int nargs, int nres, cozy_err *err)
{
    lua_State *L = e->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->admission_ref);
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    lua_insert(L, -(nargs + 1));
    /* no message handler: the library raises messages that already name
     * the policy file and line */
    int st = lua_pcall(L, nargs, nres, 0);
    if(st != LUA_OK) {
        cozy_fail(err, COZY_ERR_INTERNAL, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "error");
        lua_pop(L, 1);
        return COZY_ERR_INTERNAL;
    }
    return COZY_OK;
}

static int open_protected(lua_State *L)
{
    engine *e = lua_touserdata(L, 1);
    open_libs(L);
    luajson_open_markers(L);
    build_base(L);
    lua_pushcfunction(L, sandbox_require);
    lua_pushliteral(L, "cozygpu.admission");
    lua_call(L, 1, 1);
    e->admission_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

cozy_result engine_open(engine **out, const engine_options *opt, cozy_err *err)
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
    e->admission_ref = e->bundle_ref = LUA_NOREF;
    cozy_result rc = COZY_OK;
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
    lua_pushcfunction(L, open_protected);
    lua_pushlightuserdata(L, e);
    if(lua_pcall(L, 1, 0, 0) != LUA_OK) {
        rc = cozy_fail(err, COZY_ERR_POLICY, "loading the policy library: %s", lua_tostring(L, -1));
        engine_close(e);
        return rc;
    }
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

void engine_close(engine *e)
{
    if(!e)
        return;
    if(e->L)
        lua_close(e->L);
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

/* pushes the JSON value inside a protected call */
static int push_json_protected(lua_State *L)
{
    luajson_push(L, lua_touserdata(L, 1));
    return 1;
}

static cozy_result push_json(engine *e, const json_t *j, cozy_err *err)
{
    lua_State *L = e->L;
    lua_pushcfunction(L, push_json_protected);
    lua_pushlightuserdata(L, (void *)j);
    if(lua_pcall(L, 1, 1, 0) != LUA_OK) {
        cozy_fail(err, COZY_ERR_INTERNAL, "converting to Lua: %s", lua_tostring(L, -1));
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

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *base64_encode(const char *in, size_t len)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1), *o = out;
    if(!out)
        return NULL;
    for(size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)(unsigned char)in[i] << 16;
        if(i + 1 < len)
            v |= (uint32_t)(unsigned char)in[i + 1] << 8;
        if(i + 2 < len)
            v |= (uint32_t)(unsigned char)in[i + 2];
        *o++ = b64chars[(v >> 18) & 63];
        *o++ = b64chars[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64chars[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? b64chars[v & 63] : '=';
    }
    *o = 0;
    return out;
}

cozy_result engine_review(engine *e, const json_t *request, engine_phase phases, json_t **response, cozy_err *err)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    cozy_result rc;
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
    if((rc = call_admission(e, "review", 3, 1, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    json_t *resp = luajson_to_json(L, -1, err);
    lua_settop(L, top);
    if(!resp)
        return COZY_ERR_INTERNAL;
    json_t *ops = json_object_get(resp, "patch");
    if(ops && json_is_array(ops)) {
        char *text = json_dumps(ops, JSON_COMPACT | JSON_SORT_KEYS);
        char *b64 = text ? base64_encode(text, strlen(text)) : NULL;
        free(text);
        if(!b64) {
            json_decref(resp);
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory encoding the patch");
        }
        json_object_set_new(resp, "patch", json_string(b64));
        json_object_set_new(resp, "patchType", json_string("JSONPatch"));
        free(b64);
    }
    *response = resp;
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
