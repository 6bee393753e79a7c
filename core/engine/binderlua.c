/* binderlua.c — the binder's decisions that live in Lua (engine.h, "the
 * binder's Lua"): the chooser of policies/binder.lua and the budget check
 * at bind over cozygpu.budget, which reads the held units through the
 * caller's engine_held (DESIGN.md §5, §6; docs/decisions/0020, 0024,
 * 0044). JSON and plain values in and out: no binder types, the engine
 * layer stays below the binder.
 */
#include "engine/internal.h"

#include <stdio.h>
#include <string.h>

#include <lauxlib.h>

/* Checks the shapes engine_binder_choose documents. */
static cozy_result check_choose_input(const json_t *set, const json_t *cands, cozy_err *err)
{
    if(!json_is_object(set) || !json_is_string(json_object_get(set, "namespace")) ||
       !json_is_array(json_object_get(set, "claims")))
        return cozy_fail(err, COZY_ERR_INPUT, "binder set: needs namespace (a string) and claims (a list)");
    const json_t *vm = json_object_get(set, "vm");
    if(vm && !json_is_null(vm) && !json_is_string(vm))
        return cozy_fail(err, COZY_ERR_INPUT, "binder set: vm must be a name or null");
    size_t n = json_is_array(cands) ? json_array_size(cands) : 0;
    if(n == 0 || n > ENGINE_BINDER_MAX_CANDIDATES)
        return cozy_fail(err, COZY_ERR_INPUT, "binder candidates: must be a list of 1 to %d",
                         ENGINE_BINDER_MAX_CANDIDATES);
    size_t i;
    const json_t *c;
    json_array_foreach(cands, i, c) {
        if(!json_is_object(c) || !json_is_string(json_object_get(c, "node")) ||
           !json_is_object(json_object_get(c, "classes")))
            return cozy_fail(err, COZY_ERR_INPUT, "binder candidates[%zu]: needs node (a string) and classes (a mapping)",
                             i);
        const json_t *l = json_object_get(c, "labels");
        if(l && !json_is_object(l))
            return cozy_fail(err, COZY_ERR_INPUT, "binder candidates[%zu]: labels must be a mapping", i);
    }
    return COZY_OK;
}

cozy_result engine_binder_choose(engine *e, const json_t *set, const json_t *candidates, engine_binder_choice *out,
                                 cozy_err *err)
{
    memset(out, 0, sizeof *out);
    out->index = -1;
    cozy_result rc = check_choose_input(set, candidates, err);
    if(rc != COZY_OK)
        return rc;
    out->index = 0;
    out->outcome = ENGINE_POLICY_ERROR;
    lua_State *L = e->L;
    int top = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->bundle_ref);
    if((rc = engine_push_json(e, set, err)) != COZY_OK || (rc = engine_push_json(e, candidates, err)) != COZY_OK ||
       (rc = engine_call_admission(e, "binder_choose", 3, 2, err)) != COZY_OK) {
        snprintf(out->message, sizeof out->message, "the binder policy could not be asked: %.400s", err ? err->msg : "");
        lua_settop(L, top);
        return rc;
    }
    /* admission.binder_choose -> word, position (0: none) | word, message */
    int o = sandbox_outcome_of(lua_tostring(L, -2));
    if(o == ENGINE_ALLOWED && lua_isinteger(L, -1)) {
        lua_Integer pos = lua_tointeger(L, -1);
        out->outcome = ENGINE_ALLOWED;
        out->index = pos >= 1 && pos <= (lua_Integer)json_array_size(candidates) ? (int)(pos - 1) : -1;
    } else {
        out->outcome = o >= 0 && engine_outcome_is_failure((engine_outcome)o) ? (engine_outcome)o : ENGINE_POLICY_ERROR;
        snprintf(out->message, sizeof out->message, "%s",
                 lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "the binder policy failed");
    }
    lua_settop(L, top);
    return COZY_OK;
}

/* A refusal that says the check could not run (fail closed). */
static void budget_failed(engine_binder_verdict *out, engine_outcome o, const char *why)
{
    out->allow = 0;
    out->outcome = o;
    snprintf(out->message, sizeof out->message, "the budget check failed (%s), so the claim waits: %.400s",
             engine_outcome_name(o), why);
}

/* The string at idx into dst (size bytes, cut), "" when not a string. */
static void copy_string(lua_State *L, int idx, char *dst, size_t size)
{
    snprintf(dst, size, "%s", lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : "");
}

/* One step of host.binder_held's iterator: upvalue 1 the cursor, upvalue
 * 2 the budget call it was made in. */
static int held_step(lua_State *L)
{
    engine *e = sandbox_engine_of(L);
    if(!e->held || (unsigned)lua_tointeger(L, lua_upvalueindex(2)) != e->held_call)
        return luaL_error(L, "the binder's held units are read only during the budget check at bind that began the walk");
    const void *pos = lua_touserdata(L, lua_upvalueindex(1));
    const char *ns = NULL, *cls = NULL;
    long long units = 0;
    if(!e->held->next(e->held->ud, &pos, &ns, &cls, &units))
        return 0;
    lua_pushlightuserdata(L, (void *)pos);
    lua_replace(L, lua_upvalueindex(1));
    lua_pushstring(L, ns);
    lua_pushstring(L, cls);
    lua_pushinteger(L, (lua_Integer)units);
    return 3;
}

int engine_host_binder_held(lua_State *L)
{
    engine *e = sandbox_engine_of(L);
    if(!e->held)
        return luaL_error(L, "the binder's held units are read only during a budget check at bind");
    lua_pushlightuserdata(L, NULL);
    lua_pushinteger(L, (lua_Integer)e->held_call);
    lua_pushcclosure(L, held_step, 2);
    return 1;
}

static int held_none(void *ud, const void **pos, const char **ns, const char **class_name, long long *units)
{
    (void)ud, (void)pos, (void)ns, (void)class_name, (void)units;
    return 0;
}

cozy_result engine_binder_budget(engine *e, const char *ns, const char *class_name, long long count,
                                 const engine_held *held, engine_binder_verdict *out, cozy_err *err)
{
    memset(out, 0, sizeof *out);
    out->limit = -1;
    if(!ns || !*ns || !class_name || !*class_name || count < 1) {
        budget_failed(out, ENGINE_POLICY_ERROR, "bad input");
        return cozy_fail(err, COZY_ERR_INPUT, "budget at bind: needs a namespace, a class and a count of at least 1");
    }
    lua_State *L = e->L;
    int top = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->bundle_ref);
    lua_pushstring(L, ns);
    lua_pushstring(L, class_name);
    lua_pushinteger(L, (lua_Integer)count);
    /* admission.binder_budget -> word, ok, message, tenant, key, limit, rule | word, message */
    cozy_err cerr = {{0}};
    static const engine_held none = {NULL, held_none};
    e->held = held ? held : &none;
    e->held_call++;
    cozy_result rc = engine_call_admission(e, "binder_budget", 4, 7, &cerr);
    e->held = NULL;
    if(rc != COZY_OK) {
        budget_failed(out, ENGINE_POLICY_ERROR, cerr.msg);
        lua_settop(L, top);
        return cozy_fail(err, rc, "%s", cerr.msg);
    }
    int o = sandbox_outcome_of(lua_tostring(L, -7));
    if(o != ENGINE_ALLOWED) {
        budget_failed(out, o >= 0 && engine_outcome_is_failure((engine_outcome)o) ? (engine_outcome)o : ENGINE_POLICY_ERROR,
                      lua_type(L, -6) == LUA_TSTRING ? lua_tostring(L, -6) : "no answer");
        lua_settop(L, top);
        return COZY_OK;
    }
    out->outcome = ENGINE_ALLOWED;
    out->allow = lua_toboolean(L, -6);
    if(!out->allow) {
        copy_string(L, -5, out->message, sizeof out->message);
        copy_string(L, -4, out->tenant, sizeof out->tenant);
        copy_string(L, -3, out->key, sizeof out->key);
        out->limit = lua_isinteger(L, -2) ? (long long)lua_tointeger(L, -2) : -1;
        copy_string(L, -1, out->rule, sizeof out->rule);
        if(!out->message[0])
            snprintf(out->message, sizeof out->message, "over a GPU budget of the tenant tree");
    }
    lua_settop(L, top);
    return COZY_OK;
}
