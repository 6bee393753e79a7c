/* engine.c — the Lua policy host (engine.h): opening an engine with its
 * runtime module and policy bundle, reviews, the cluster view, patches.
 * The sandbox, budgets and the one protected call are sandbox.c.
 */
#include "engine/internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "base/b64.h"
#include "base/buf.h"
#include "base/file.h"
#include "engine/luajson.h"

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

cozy_result engine_call_admission(engine *e, const char *fn, int nargs, int nres, cozy_err *err)
{
    return call_runtime(e, e->admission_ref, fn, nargs, nres, err);
}

/* Opens the allowed libraries, builds the shared read-only base, then loads
 * the runtime module (upvalue 1: its name) from <library>/runtime/ and
 * leaves its value. Runs under engine_call. */
static int open_protected(lua_State *L)
{
    engine *e = sandbox_engine_of(L);
    sandbox_open_libs(L);
    luajson_open_markers(L);
    sandbox_build_base(L);
    const char *module = lua_tostring(L, lua_upvalueindex(1));
    char path[PATH_MAX];
    if(snprintf(path, sizeof path, "%s/runtime/%s.lua", e->library_dir, module) >= (int)sizeof path)
        return luaL_error(L, "%s/runtime/%s.lua: path too long", e->library_dir, module);
    if(sandbox_push_chunk(L, path) != 1)
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
    e->admission_ref = e->bundle_ref = e->runtime_ref = e->decoded_ref = LUA_NOREF;
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
    e->L = lua_newstate(sandbox_alloc, e);
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
    lua_pushcfunction(L, sandbox_host_invoke);
    lua_setfield(L, -2, "invoke");
    lua_pushcfunction(L, sandbox_host_load);
    lua_setfield(L, -2, "load");
    lua_pushcfunction(L, sandbox_host_readonly);
    lua_setfield(L, -2, "readonly");
    lua_pushcfunction(L, sandbox_host_freeze);
    lua_setfield(L, -2, "freeze");
    lua_pushcfunction(L, sandbox_host_restore);
    lua_setfield(L, -2, "restore");
    lua_pushcfunction(L, sandbox_host_now);
    lua_setfield(L, -2, "now");
    lua_pushcfunction(L, engine_host_binder_held);
    lua_setfield(L, -2, "binder_held");
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
    if((rc = engine_call_admission(e, "load", 1, 1, err)) != COZY_OK) {
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
    if(!sandbox_valid_module_name(module) || strchr(module, '.'))
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
    json_decref(e->decoded_for); /* a decoded request never reviewed */
    if(e->L)
        lua_close(e->L);
    for(size_t i = 0; i < e->n_sources; i++) {
        free((char *)e->sources[i].name);
        free((char *)e->sources[i].module);
        free((char *)e->sources[i].text);
    }
    free(e->sources);
    free(e->last_rules);
    free(e->last_message);
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
cozy_result engine_push_json(engine *e, const json_t *j, cozy_err *err)
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

/* luajson_to_json of argument 1 into the context of argument 2, for
 * engine_to_json */
typedef struct to_json_ctx {
    json_t *out;
    cozy_err *err;
} to_json_ctx;

static int to_json_protected(lua_State *L)
{
    to_json_ctx *c = lua_touserdata(L, 2);
    c->out = luajson_to_json(L, 1, c->err);
    return 0;
}

cozy_result engine_to_json(engine *e, int idx, json_t **out, cozy_err *err)
{
    lua_State *L = e->L;
    idx = lua_absindex(L, idx);
    cozy_err cerr = {{0}};
    to_json_ctx c = {.out = NULL, .err = &cerr};
    lua_pushcfunction(L, to_json_protected);
    lua_pushvalue(L, idx);
    lua_pushlightuserdata(L, &c);
    if(engine_call(e, 2, 0, 0, &cerr) != ENGINE_ALLOWED) {
        lua_pop(L, 1);
        json_decref(c.out);
        return cozy_fail(err, COZY_ERR_INTERNAL, "converting to JSON: %s", cerr.msg);
    }
    if(!c.out)
        return cozy_fail(err, COZY_ERR_INTERNAL, "%s", cerr.msg);
    *out = c.out;
    return COZY_OK;
}

cozy_result engine_set_cluster(engine *e, const json_t *objects, const json_t *settings, cozy_err *err)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    cozy_result rc;
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->bundle_ref);
    if((rc = engine_push_json(e, objects, err)) != COZY_OK || (rc = engine_push_json(e, settings, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    rc = engine_call_admission(e, "set_cluster", 3, 0, err);
    lua_settop(L, top);
    return rc;
}

int engine_has_rule(engine *e, const char *name)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->bundle_ref);
    int has = 0;
    if(lua_istable(L, -1)) {
        lua_pushliteral(L, "byname");
        lua_rawget(L, -2);
        if(lua_istable(L, -1)) {
            lua_pushstring(L, name);
            lua_rawget(L, -2);
            has = !lua_isnil(L, -1);
        }
    }
    lua_settop(L, top);
    return has;
}

const engine_rule_result *engine_last_rules(const engine *e, size_t *n)
{
    *n = e->n_last_rules;
    return e->last_rules;
}

/* The static word for a rule's result as the runtime wrote it; NULL for
   any other value. */
static const char *rule_result_word(const char *w)
{
    static const char *const words[] = {"allowed", "denied", "patched", "error", "budget", "memory", "deadline"};
    for(size_t i = 0; w && i < sizeof words / sizeof *words; i++)
        if(strcmp(w, words[i]) == 0)
            return words[i];
    return NULL;
}

/* Copies M.review's per-rule list (at `idx`) into e->last_rules. Trusted
   runtime output: raw reads, entries of another shape are skipped. */
static void keep_rule_results(engine *e, int idx)
{
    lua_State *L = e->L;
    idx = lua_absindex(L, idx);
    if(!lua_istable(L, idx))
        return;
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    for(lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        if(lua_istable(L, -1)) {
            lua_getfield(L, -1, "rule");
            lua_getfield(L, -2, "result");
            lua_getfield(L, -3, "seconds");
            const char *word = rule_result_word(lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL);
            if(lua_type(L, -3) == LUA_TSTRING && word) {
                engine_rule_result *a = e->last_rules;
                if(e->n_last_rules == e->cap_last_rules)
                    a = cozy_grow(e->last_rules, &e->cap_last_rules, e->n_last_rules + 1, sizeof *a);
                if(a) {
                    e->last_rules = a;
                    engine_rule_result *r = &a[e->n_last_rules++];
                    snprintf(r->rule, sizeof r->rule, "%s", lua_tostring(L, -3));
                    r->result = word;
                    r->seconds = lua_type(L, -1) == LUA_TNUMBER ? (double)lua_tonumber(L, -1) : 0;
                }
            }
            lua_pop(L, 3);
        }
        lua_pop(L, 1);
    }
}

/* Runs admission.review on `request`: on success the stack holds, above
   its old top, the response, the outcome word, the rule and the per-rule
   list; out->outcome and out->rule are set and the rule list kept. On
   failure the stack is as it was. */
static cozy_result review_run(engine *e, const json_t *request, engine_phase phases, engine_verdict *out,
                              cozy_err *err)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    cozy_result rc;
    memset(out, 0, sizeof *out);
    e->n_last_rules = 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, e->bundle_ref);
    if(e->decoded_ref != LUA_NOREF && e->decoded_for == request) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, e->decoded_ref); /* engine_decode_review built it */
        engine_forget_decoded(e);
    } else {
        engine_forget_decoded(e);
        if((rc = engine_push_json(e, request, err)) != COZY_OK) {
            lua_settop(L, top);
            return rc;
        }
    }
    lua_createtable(L, 0, 2);
    lua_pushboolean(L, (phases & ENGINE_VALIDATE) != 0);
    lua_setfield(L, -2, "validate");
    lua_pushboolean(L, (phases & ENGINE_MUTATE) != 0);
    lua_setfield(L, -2, "mutate");
    /* admission.review -> response, outcome word, rule name, per-rule list */
    if((rc = engine_call_admission(e, "review", 3, 4, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    int outcome = sandbox_outcome_of(lua_tostring(L, -3));
    if(outcome < 0) {
        lua_settop(L, top);
        return cozy_fail(err, COZY_ERR_INTERNAL, "admission.review returned no outcome");
    }
    snprintf(out->rule, sizeof out->rule, "%s", lua_isstring(L, -2) ? lua_tostring(L, -2) : "");
    keep_rule_results(e, -1);
    out->outcome = (engine_outcome)outcome;
    return COZY_OK;
}

/* A response's patch as the API server reads it: the base64 of the
   operations' compact text with sorted keys (malloc'd; NULL when out of
   memory or `ops` is not an array). */
static char *patch_b64(const json_t *ops)
{
    char *text = json_is_array(ops) ? json_dumps(ops, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *b64 = text ? cozy_base64_encode(text, strlen(text)) : NULL;
    free(text);
    return b64;
}

/* The response at idx as JSON, its patch (a list of operations) replaced
   by patch_b64 of it and patchType "JSONPatch" added. */
static cozy_result response_json(engine *e, int idx, json_t **out, cozy_err *err)
{
    json_t *resp = NULL;
    cozy_result rc = engine_to_json(e, idx, &resp, err);
    if(rc != COZY_OK)
        return rc;
    json_t *ops = json_object_get(resp, "patch");
    if(ops && json_is_array(ops)) {
        char *b64 = patch_b64(ops);
        if(!b64) {
            json_decref(resp);
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory encoding the patch");
        }
        json_object_set_new(resp, "patch", json_string(b64));
        json_object_set_new(resp, "patchType", json_string("JSONPatch"));
        free(b64);
    }
    *out = resp;
    return COZY_OK;
}

cozy_result engine_review(engine *e, const json_t *request, engine_phase phases, engine_verdict *out, cozy_err *err)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    cozy_result rc = review_run(e, request, phases, out, err);
    if(rc != COZY_OK)
        return rc;
    json_t *resp = NULL;
    rc = response_json(e, -4, &resp, err);
    lua_settop(L, top);
    if(rc != COZY_OK) {
        memset(out, 0, sizeof *out);
        e->n_last_rules = 0;
        return rc;
    }
    out->response = resp;
    out->message = json_string_value(json_object_get(json_object_get(resp, "status"), "message"));
    return COZY_OK;
}

/* appends a string literal, without its NUL */
#define ADD_LITERAL(b, lit) cozy_buf_add((b), lit, sizeof lit - 1)

/* Writes the response table at `r` (absolute) as the object
   response_json would make, dumped compact: members in the table's order,
   the patch as base64 in its place and patchType last. -1 when it is not
   written (the caller takes the JSON path). */
static int write_response(engine *e, int r, cozy_buf *b)
{
    lua_State *L = e->L;
    if(lua_type(L, r) != LUA_TTABLE || lua_getmetatable(L, r)) {
        if(lua_type(L, r) == LUA_TTABLE)
            lua_pop(L, 1);
        return -1; /* the runtime's response is a plain table */
    }
    lua_pushliteral(L, "patchType");
    int has_type = lua_rawget(L, r) != LUA_TNIL;
    lua_pop(L, 1);
    if(has_type)
        return -1;
    int first = 1, patched = 0;
    if(cozy_buf_add(b, "{", 1))
        return -1;
    lua_pushnil(L);
    while(lua_next(L, r)) {
        size_t klen;
        const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &klen) : NULL;
        int bad = !key || (!first && cozy_buf_add(b, ",", 1));
        if(!bad && klen == 5 && memcmp(key, "patch", 5) == 0 && lua_type(L, -1) == LUA_TTABLE) {
            cozy_err err;
            json_t *ops = luajson_to_json(L, -1, &err);
            char *b64 = patch_b64(ops);
            bad = !b64 || cozy_buf_printf(b, "\"patch\":\"%s\"", b64);
            patched = 1;
            free(b64);
            json_decref(ops);
        } else if(!bad) {
            lua_pushvalue(L, -2);
            bad = luajson_write(L, -1, b) || cozy_buf_add(b, ":", 1) || luajson_write(L, -2, b);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
        if(bad) {
            lua_pop(L, 1);
            return -1;
        }
        first = 0;
    }
    if(patched && ADD_LITERAL(b, ",\"patchType\":\"JSONPatch\""))
        return -1;
    return cozy_buf_add(b, "}", 1) ? -1 : 0;
}

cozy_result engine_review_text(engine *e, const json_t *request, engine_phase phases, engine_verdict *out,
                               char **text, size_t *len, cozy_err *err)
{
    lua_State *L = e->L;
    int top = lua_gettop(L);
    *text = NULL;
    *len = 0;
    cozy_result rc = review_run(e, request, phases, out, err);
    if(rc != COZY_OK)
        return rc;
    int r = lua_absindex(L, -4);
    /* what the server vouches for (webhook.h): uid echoed, allowed a boolean */
    const char *uid = json_string_value(json_object_get(request, "uid"));
    int shaped = lua_type(L, r) == LUA_TTABLE;
    lua_pushliteral(L, "uid");
    if(shaped)
        lua_rawget(L, r);
    lua_pushliteral(L, "allowed");
    if(shaped)
        lua_rawget(L, r);
    shaped = shaped && lua_type(L, -2) == LUA_TSTRING && uid &&
                 strcmp(lua_tostring(L, -2), uid) == 0 && lua_type(L, -1) == LUA_TBOOLEAN;
    out->allowed = shaped && lua_toboolean(L, -1);
    lua_pop(L, 2);
    if(!shaped) {
        lua_settop(L, top);
        memset(out, 0, sizeof *out);
        e->n_last_rules = 0;
        return cozy_fail(err, COZY_ERR_INTERNAL, "admission.review answered no uid and boolean allowed");
    }
    free(e->last_message);
    e->last_message = NULL;
    lua_pushliteral(L, "status");
    if(lua_rawget(L, r) == LUA_TTABLE) {
        lua_pushliteral(L, "message");
        lua_rawget(L, -2);
        if(lua_type(L, -1) == LUA_TSTRING)
            e->last_message = strdup(lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    out->message = e->last_message;
    cozy_buf b = {0};
    int bad = ADD_LITERAL(&b, "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"response\":");
    if(!bad && write_response(e, r, &b) == 0 && cozy_buf_add(&b, "}", 1) == 0) {
        lua_settop(L, top);
        *text = b.p;
        *len = b.len;
        return COZY_OK;
    }
    /* the JSON path: the same text, or its error */
    cozy_buf_free(&b);
    json_t *resp = NULL;
    rc = response_json(e, r, &resp, err);
    lua_settop(L, top);
    if(rc != COZY_OK) {
        memset(out, 0, sizeof *out);
        e->n_last_rules = 0;
        return rc;
    }
    json_t *env = json_pack("{s:s, s:s, s:o}", "apiVersion", "admission.k8s.io/v1", "kind", "AdmissionReview",
                            "response", resp);
    char *t = env ? json_dumps(env, JSON_COMPACT) : NULL;
    json_decref(env);
    if(!t)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory writing the answer");
    *text = t;
    *len = strlen(t);
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
    if((rc = engine_push_json(e, doc, err)) != COZY_OK || (rc = engine_push_json(e, ops, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    if((rc = engine_call_admission(e, "apply_patch", 2, 2, err)) != COZY_OK) {
        lua_settop(L, top);
        return rc;
    }
    if(lua_isnil(L, -2)) {
        rc = cozy_fail(err, COZY_ERR_INPUT, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "patch does not apply");
        lua_settop(L, top);
        return rc;
    }
    json_t *j = NULL;
    rc = engine_to_json(e, -2, &j, err);
    lua_settop(L, top);
    if(rc != COZY_OK)
        return rc;
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

void engine_set_slice(engine *e, long cpu_us)
{
    e->sliced = 0;
    e->has_slice = cpu_us > 0;
    if(!e->has_slice)
        return;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &e->slice_end);
    e->slice_end.tv_sec += cpu_us / 1000000;
    e->slice_end.tv_nsec += (cpu_us % 1000000) * 1000L;
    if(e->slice_end.tv_nsec >= 1000000000L) {
        e->slice_end.tv_sec++;
        e->slice_end.tv_nsec -= 1000000000L;
    }
}

int engine_sliced(const engine *e)
{
    return e->sliced;
}
