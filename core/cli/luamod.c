/* luamod.c — `cozygpu.core`, the C core as a Lua module for specs.
 *
 *   local core = require "cozygpu.core"
 *   core.json                         the cozygpu.json module
 *   core.yaml(text [, name])          -> docs | nil, message (yamlload)
 *   core.manifests(path)              -> {{file=, index=, object=}...} | nil, message
 *   core.config(path)                 -> settings | nil, message
 *   core.config_from(table [, name])  -> settings | nil, message
 *   core.inventory{sysfs=, pci_ids=, pci_method=}
 *                                     -> {functions = {...}} | nil, message (inventory.h)
 *   core.engine{policies=, override=, library=, instructions=, memory=,
 *               sources={[policies ConfigMap key]=text}}  (engine_source_for_key)
 *                                     -> Engine | nil, message
 *   Engine:set_cluster(objects, settings) -> true | nil, message
 *   Engine:review(request [, "validating"|"mutating"|"all"]) -> response, outcome, rule | nil, message
 *     (outcome: engine_outcome_name, "allowed" ... "deadline"; rule: the deciding rule or nil)
 *   Engine:review_document(doc [, {user=, groups=, webhook=}]) -> AdmissionReview, outcome | nil, message
 *   Engine:fail_alloc_after(n)        test switch (engine.h)
 *   Engine:set_deadline(ms | nil)     test switch: the review deadline ms from now (engine_set_deadline), nil: none
 *   Engine:set_slice(us | nil)        test switch: a slice of this thread's CPU time from now (engine_set_slice)
 *   Engine:sliced() -> boolean        engine_sliced
 *   core.pattern                      {find, match, gmatch, gsub}: the engine's bounded matcher
 *                                     (pattern.h) without a meter, for the differential spec
 *   Engine:binder_choose(set, candidates) -> position (1-based) | nil (none), outcome, message
 *                                     (engine_binder_choose; on a policy failure: 1, the failure's word, message)
 *   Engine:binder_budget(ns, class, count [, held]) -> allowed, outcome, message, rule, tenant, key, limit
 *                                     (engine_binder_budget; held: { [ns] = { [class] = units } },
 *                                     the units a binder state would hold)
 *   Engine:memory()                   bytes held by the engine's state
 *   Engine:rules()                    number of rules loaded
 *   Engine:close()                    also __gc / __close
 * Values cross between the spec's state and the engine's state as JSON.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/config.h"
#include "engine/engine.h"
#include "host/inventory.h"
#include "engine/luajson.h"
#include "engine/pattern.h"
#include "format/manifest.h"
#include "admission/review.h"
#include "format/yamlload.h"

#define ENGINE_MT "cozygpu.Engine"

typedef struct engine_box {
    engine *e;
} engine_box;

static int push_fail(lua_State *L, const char *msg)
{
    lua_pushnil(L);
    lua_pushstring(L, msg);
    return 2;
}

static int l_yaml(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *name = luaL_optstring(L, 2, "<string>");
    yamlload_error err;
    memset(&err, 0, sizeof err);
    json_t *docs = yamlload_parse(s, len, name, &err);
    if(!docs) {
        lua_pushnil(L);
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, (lua_Integer)err.line);
        lua_setfield(L, -2, "line");
        lua_pushinteger(L, (lua_Integer)err.column);
        lua_setfield(L, -2, "column");
        lua_pushstring(L, err.message);
        lua_setfield(L, -2, "message");
        return 2;
    }
    luajson_push_owned(L, docs);
    return 1;
}

static int l_manifests(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    json_t *out = json_array();
    cozy_err err = {{0}};
    if(manifest_load_path(path, out, &err) != COZY_OK) {
        json_decref(out);
        return push_fail(L, err.msg);
    }
    luajson_push_owned(L, out);
    return 1;
}

static int l_config(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    json_t *cfg = NULL;
    cozy_err err = {{0}};
    if(config_load_file(path, &cfg, &err) != COZY_OK)
        return push_fail(L, err.msg);
    luajson_push_owned(L, cfg);
    return 1;
}

static int l_config_from(lua_State *L)
{
    cozy_err err = {{0}};
    json_t *in = luajson_to_json(L, 1, &err);
    if(!in)
        return luaL_argerror(L, 1, err.msg);
    json_t *cfg = NULL;
    cozy_result rc = config_from_json(in, luaL_optstring(L, 2, "<settings>"), &cfg, &err);
    json_decref(in);
    if(rc != COZY_OK)
        return push_fail(L, err.msg);
    luajson_push_owned(L, cfg);
    return 1;
}

static engine *check_engine(lua_State *L)
{
    engine_box *b = luaL_checkudata(L, 1, ENGINE_MT);
    luaL_argcheck(L, b->e != NULL, 1, "engine is closed");
    return b->e;
}

static const char *opt_field(lua_State *L, int t, const char *k)
{
    lua_getfield(L, t, k);
    const char *s = lua_tostring(L, -1); /* kept alive by the options table */
    lua_pop(L, 1);
    return s;
}

static int l_engine(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    engine_options o = {0};
    o.bundle_dir = opt_field(L, 1, "policies");
    o.override_dir = opt_field(L, 1, "override");
    o.library_dir = opt_field(L, 1, "library");
    lua_getfield(L, 1, "instructions");
    o.instructions = (long long)lua_tointeger(L, -1);
    lua_getfield(L, 1, "memory");
    o.memory_bytes = (long long)lua_tointeger(L, -1);
    lua_pop(L, 2);
    /* sources = {[key] = text, ...}: hoster sources from memory, keyed as
     * the policies ConfigMap is (engine_source_for_key) */
    engine_source src[64];
    char modules[64][256];
    size_t n = 0;
    cozy_err err = {{0}};
    if(lua_getfield(L, 1, "sources") == LUA_TTABLE) {
        lua_pushnil(L);
        while(lua_next(L, -2)) {
            if(n == 64)
                return luaL_error(L, "sources: at most 64");
            size_t len = 0;
            const char *k = lua_tostring(L, -2), *text = luaL_checklstring(L, -1, &len);
            if(!k || lua_type(L, -2) != LUA_TSTRING)
                return luaL_error(L, "sources: keys must be strings");
            cozy_result rc = engine_source_for_key(k, text, len, &src[n], modules[n], sizeof modules[n], &err);
            lua_pop(L, 1);
            if(rc != COZY_OK) {
                lua_pushnil(L);
                lua_pushstring(L, err.msg);
                lua_pushstring(L, cozy_strerror(rc));
                return 3;
            }
            n++;
        }
        o.override_sources = src;
        o.n_override_sources = n;
    }
    engine_box *b = lua_newuserdatauv(L, sizeof *b, 0); /* empty before it acquires */
    b->e = NULL;
    luaL_setmetatable(L, ENGINE_MT);
    if(engine_open(&b->e, &o, &err) != COZY_OK)
        return push_fail(L, err.msg);
    return 1;
}

static int l_engine_close(lua_State *L)
{
    engine_box *b = luaL_checkudata(L, 1, ENGINE_MT);
    engine_close(b->e);
    b->e = NULL;
    return 0;
}

static int l_set_cluster(lua_State *L)
{
    engine *e = check_engine(L);
    cozy_err err = {{0}};
    json_t *objects = luajson_to_json(L, 2, &err);
    if(!objects)
        return luaL_argerror(L, 2, err.msg);
    json_t *settings = NULL;
    if(lua_isnoneornil(L, 3))
        settings = config_defaults();
    else if(!(settings = luajson_to_json(L, 3, &err))) {
        json_decref(objects);
        return luaL_argerror(L, 3, err.msg);
    }
    cozy_result rc = engine_set_cluster(e, objects, settings, &err);
    json_decref(objects);
    json_decref(settings);
    if(rc != COZY_OK)
        return push_fail(L, err.msg);
    lua_pushboolean(L, 1);
    return 1;
}

static engine_phase phase_arg(lua_State *L, int idx)
{
    static const char *const names[] = {"all", "validating", "mutating", NULL};
    static const engine_phase phases[] = {ENGINE_BOTH, ENGINE_VALIDATE, ENGINE_MUTATE};
    return phases[luaL_checkoption(L, idx, "all", names)];
}

static int l_review(lua_State *L)
{
    engine *e = check_engine(L);
    engine_phase ph = phase_arg(L, 3);
    cozy_err err = {{0}};
    json_t *req = luajson_to_json(L, 2, &err);
    if(!req)
        return luaL_argerror(L, 2, err.msg);
    engine_verdict v;
    cozy_result rc = engine_review(e, req, ph, &v, &err);
    json_decref(req);
    if(rc != COZY_OK)
        return push_fail(L, err.msg);
    luajson_push_owned(L, v.response);
    lua_pushstring(L, engine_outcome_name(v.outcome));
    if(v.rule[0])
        lua_pushstring(L, v.rule);
    else
        lua_pushnil(L);
    return 3;
}

static int l_review_document(lua_State *L)
{
    engine *e = check_engine(L);
    cozy_err err = {{0}};
    json_t *doc = luajson_to_json(L, 2, &err);
    if(!doc)
        return luaL_argerror(L, 2, err.msg);
    review_options ro = {.phases = ENGINE_BOTH};
    json_t *groups = NULL;
    if(lua_istable(L, 3)) {
        ro.username = opt_field(L, 3, "user");
        if(lua_getfield(L, 3, "groups") == LUA_TTABLE)
            groups = luajson_to_json(L, -1, &err);
        lua_pop(L, 1);
        ro.groups = groups;
        if(lua_getfield(L, 3, "webhook") == LUA_TSTRING)
            ro.phases = phase_arg(L, -1);
        lua_pop(L, 1);
    }
    json_t *out = NULL;
    engine_outcome outcome = ENGINE_ALLOWED;
    cozy_result rc = review_document(e, doc, "<spec>", 1, &ro, &out, &outcome, &err);
    json_decref(doc);
    json_decref(groups);
    if(rc != COZY_OK)
        return push_fail(L, err.msg);
    luajson_push_owned(L, out);
    lua_pushstring(L, engine_outcome_name(outcome));
    return 2;
}

/* core.inventory([{sysfs=ROOT, pci_ids=FILE, pci_method=NAME}]): the
 * inventory of docs/gpunode.md as a table, or nil and the message (bad
 * root, unknown method, a function that vanished). A non-table argument
 * raises. */
static int l_inventory(lua_State *L)
{
    inventory_options io = {0};
    if(!lua_isnoneornil(L, 1)) {
        luaL_checktype(L, 1, LUA_TTABLE);
        io.sysfs_root = opt_field(L, 1, "sysfs");
        io.pci_ids = opt_field(L, 1, "pci_ids");
        io.pci_method = opt_field(L, 1, "pci_method");
    }
    json_t *inv = NULL;
    cozy_err err = {{0}};
    if(inventory_scan(&io, &inv, &err) != COZY_OK)
        return push_fail(L, err.msg);
    luajson_push_owned(L, inv);
    return 1;
}

static int l_fail_alloc_after(lua_State *L)
{
    engine_fail_alloc_after(check_engine(L), (long)luaL_checkinteger(L, 2));
    return 0;
}

static int l_set_slice(lua_State *L)
{
    engine_set_slice(check_engine(L), lua_isnoneornil(L, 2) ? 0 : (long)luaL_checkinteger(L, 2));
    return 0;
}

static int l_sliced(lua_State *L)
{
    lua_pushboolean(L, engine_sliced(check_engine(L)));
    return 1;
}

static int l_set_deadline(lua_State *L)
{
    engine *e = check_engine(L);
    if(lua_isnoneornil(L, 2)) {
        engine_set_deadline(e, NULL);
        return 0;
    }
    lua_Integer ms = luaL_checkinteger(L, 2);
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if(t.tv_nsec >= 1000000000L)
        t.tv_sec++, t.tv_nsec -= 1000000000L;
    engine_set_deadline(e, &t);
    return 0;
}

static int l_binder_choose(lua_State *L)
{
    engine *e = check_engine(L);
    cozy_err err = {{0}};
    json_t *set = luajson_to_json(L, 2, &err);
    if(!set)
        return luaL_argerror(L, 2, err.msg);
    json_t *cands = luajson_to_json(L, 3, &err);
    if(!cands) {
        json_decref(set);
        return luaL_argerror(L, 3, err.msg);
    }
    engine_binder_choice ch;
    cozy_result rc = engine_binder_choose(e, set, cands, &ch, &err);
    json_decref(set);
    json_decref(cands);
    if(rc != COZY_OK)
        return push_fail(L, err.msg);
    if(ch.index >= 0)
        lua_pushinteger(L, ch.index + 1);
    else
        lua_pushnil(L);
    lua_pushstring(L, engine_outcome_name(ch.outcome));
    lua_pushstring(L, ch.message);
    return 3;
}

/* The held units a spec gives Engine:binder_budget, { [ns] = { [class] =
 * units } }, as the engine_held a binder state would be. */
typedef struct held_pair {
    const char *ns, *cls; /* borrowed from the spec's table, on the stack for the call */
    long long units;
} held_pair;

typedef struct held_list {
    held_pair *p;
    size_t n;
} held_list;

static int held_list_next(void *ud, const void **pos, const char **ns, const char **class_name, long long *units)
{
    const held_list *h = ud;
    const held_pair *at = *pos ? (const held_pair *)*pos + 1 : h->p;
    if(at >= h->p + h->n)
        return 0;
    *pos = at;
    *ns = at->ns;
    *class_name = at->cls;
    *units = at->units;
    return 1;
}

static int l_binder_budget(lua_State *L)
{
    engine *e = check_engine(L);
    const char *ns_arg = luaL_checkstring(L, 2), *cls_arg = luaL_checkstring(L, 3);
    long long count = (long long)luaL_checkinteger(L, 4);
    held_list h = {NULL, 0};
    size_t cap = 0;
    if(!lua_isnoneornil(L, 5)) {
        luaL_checktype(L, 5, LUA_TTABLE);
        lua_pushnil(L);
        while(lua_next(L, 5)) {
            const char *ns = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
            if(!ns || !lua_istable(L, -1)) {
                free(h.p);
                return luaL_error(L, "held units: { [namespace] = { [class] = units } }");
            }
            lua_pushnil(L);
            while(lua_next(L, -2)) {
                if(lua_type(L, -2) != LUA_TSTRING || !lua_isinteger(L, -1)) {
                    free(h.p);
                    return luaL_error(L, "held units of %s: { [class] = units }", ns);
                }
                if(h.n == cap) {
                    cap = cap ? cap * 2 : 8;
                    held_pair *np = realloc(h.p, cap * sizeof *np);
                    if(!np) {
                        free(h.p);
                        return luaL_error(L, "out of memory");
                    }
                    h.p = np;
                }
                if(lua_tointeger(L, -1) > 0)
                    h.p[h.n++] = (held_pair){ns, lua_tostring(L, -2), (long long)lua_tointeger(L, -1)};
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
        }
    }
    engine_held held = {&h, held_list_next};
    engine_binder_verdict v;
    cozy_err err = {{0}};
    cozy_result rc = engine_binder_budget(e, ns_arg, cls_arg, count, &held, &v, &err);
    free(h.p);
    if(rc != COZY_OK)
        return push_fail(L, err.msg);
    lua_pushboolean(L, v.allow);
    lua_pushstring(L, engine_outcome_name(v.outcome));
    lua_pushstring(L, v.message);
    lua_pushstring(L, v.rule);
    lua_pushstring(L, v.tenant);
    lua_pushstring(L, v.key);
    lua_pushinteger(L, (lua_Integer)v.limit);
    return 7;
}

static int l_memory(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)engine_memory_in_use(check_engine(L)));
    return 1;
}

static int l_rules(lua_State *L)
{
    lua_pushinteger(L, engine_rule_count(check_engine(L)));
    return 1;
}

int luaopen_cozygpu_core(lua_State *L)
{
    static const luaL_Reg methods[] = {
        {"set_cluster", l_set_cluster},
        {"review", l_review},
        {"review_document", l_review_document},
        {"fail_alloc_after", l_fail_alloc_after},
        {"set_deadline", l_set_deadline},
        {"set_slice", l_set_slice},
        {"sliced", l_sliced},
        {"binder_choose", l_binder_choose},
        {"binder_budget", l_binder_budget},
        {"memory", l_memory},
        {"rules", l_rules},
        {"close", l_engine_close},
        {NULL, NULL},
    };
    static const luaL_Reg fns[] = {
        {"yaml", l_yaml},     {"manifests", l_manifests}, {"config", l_config},
        {"config_from", l_config_from}, {"engine", l_engine}, {"inventory", l_inventory}, {NULL, NULL},
    };
    luajson_open_markers(L);
    if(luaL_newmetatable(L, ENGINE_MT)) {
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, l_engine_close);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, l_engine_close);
        lua_setfield(L, -2, "__close");
    }
    lua_pop(L, 1);
    luaL_newlib(L, fns);
    luaopen_cozygpu_json(L);
    lua_setfield(L, -2, "json");
    lua_newtable(L);
    pattern_register(L, -1, NULL);
    lua_setfield(L, -2, "pattern");
    return 1;
}
