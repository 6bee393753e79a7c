/* luadecode_check.c — engine_decode_review (core/engine/luadecode.c,
 * decision 0049) against what it replaces: cozy_json_loadb, then
 * luajson_push of the request. For every input, both accept or both
 * refuse, with the same error text, line, column and position; accepted,
 * the document equals cozy_json_loadb's with request.object and
 * request.oldObject (objects or arrays) emptied, keys in the same order,
 * and the Lua request it kept equals luajson_push of the whole request:
 * the same types, integer or float subtypes, strings, json.null and
 * markers (metatables). A text that must go the slow way keeps no Lua
 * value and returns the whole document. The example reviews are checked
 * to take the fast way (else the rest would prove nothing) and to get the
 * same answer from engine_review either way. Inputs: hand-made edge
 * cases around the request's places, the example reviews as the API
 * server sends them (JSON), and seeded mutations of those.
 *   luadecode_check LIBRARY_DIR POLICY_DIR REVIEW_FILE...
 * Run by spec/core/run-luadecode-check.sh under ASan/UBSan.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/jsonload.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/luajson.h"
#include "format/manifest.h"

#include "check.h"

static unsigned long compared, fast, slow;

/* 1 when the Lua values at a and b are equal as luajson gives them */
static int lua_same(lua_State *L, int a, int b, int depth)
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
static json_t *emptied(const json_t *doc)
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

/* 1 when engine_decode_review answers as cozy_json_loadb + luajson_push;
   *was_fast: it kept a Lua request */
static int same(engine *e, const char *buf, size_t n, char *why, size_t wn, int *was_fast)
{
    lua_State *L = engine_lua(e);
    json_error_t ea, eb;
    memset(&ea, 0, sizeof ea);
    memset(&eb, 0, sizeof eb);
    json_t *a = engine_decode_review(e, buf, n, &ea);
    json_t *b = cozy_json_loadb(buf, n, JSON_REJECT_DUPLICATES, &eb);
    int good = (a == NULL) == (b == NULL);
    compared++;
    *was_fast = 0;
    if(!good)
        snprintf(why, wn, "decode %s, cozy_json_loadb %s (%s)", a ? "accepts" : "refuses", b ? "accepts" : "refuses",
                 a ? eb.text : ea.text);
    else if(!a) {
        good = strcmp(ea.text, eb.text) == 0 && ea.line == eb.line && ea.column == eb.column &&
               ea.position == eb.position && e->decoded_ref == LUA_NOREF;
        if(!good)
            snprintf(why, wn, "errors differ: %s (%d:%d) / %s (%d:%d)", ea.text, ea.line, ea.column, eb.text, eb.line,
                     eb.column);
    } else if(strcmp(ea.text, eb.text) || ea.line != eb.line || ea.column != eb.column ||
              ea.position != eb.position) {
        good = 0;
        snprintf(why, wn, "after a success the error differs");
    } else {
        *was_fast = e->decoded_ref != LUA_NOREF;
        json_t *want = *was_fast ? emptied(b) : json_incref(b);
        char *da = json_dumps(a, JSON_COMPACT), *dw = json_dumps(want, JSON_COMPACT);
        good = json_equal(a, want) && da && dw && strcmp(da, dw) == 0;
        if(!good)
            snprintf(why, wn, "documents differ: %.100s / %.100s", da ? da : "?", dw ? dw : "?");
        free(da);
        free(dw);
        json_decref(want);
        if(good && *was_fast) {
            const json_t *req = json_object_get(b, "request");
            good = e->decoded_for == json_object_get(a, "request") && req;
            if(good) {
                int top = lua_gettop(L);
                lua_rawgeti(L, LUA_REGISTRYINDEX, e->decoded_ref);
                luajson_push(L, req);
                good = lua_same(L, -2, -1, 0);
                lua_settop(L, top);
            }
            if(!good)
                snprintf(why, wn, "the Lua request differs from luajson_push of the request");
        }
    }
    engine_forget_decoded(e);
    if(*was_fast)
        fast++;
    else
        slow++;
    json_decref(a);
    json_decref(b);
    return good;
}

static void one(engine *e, const char *what, const char *buf, size_t n, int want_fast)
{
    char why[300] = "";
    int was_fast;
    int good = same(e, buf, n, why, sizeof why, &was_fast);
    if(good && want_fast >= 0 && was_fast != want_fast) {
        good = 0;
        snprintf(why, sizeof why, "took the %s way, want the %s", was_fast ? "fast" : "slow",
                 want_fast ? "fast" : "slow");
    }
    ok(good, what, good ? NULL : why);
}

static uint64_t rng = 49;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* n mutations of text (as jsonload_check.c makes them) */
static void mutate(engine *e, const char *name, const char *text, size_t len, int n)
{
    static const char pick[] = "{}[]\",:\\u0123456789.eE-+ntfalsrx\x00\x01\x7f\x80\xbf\xc0\xed\xf4\xff";
    char *buf = malloc(len + 16);
    for(int k = 0; k < n; k++) {
        memcpy(buf, text, len);
        size_t m = len;
        int edits = 1 + (int)(rnd() % 3);
        for(int ed = 0; ed < edits; ed++) {
            size_t at = m ? rnd() % m : 0;
            char c = pick[rnd() % (sizeof pick - 1)];
            switch(rnd() % 3) {
            case 0:
                if(m)
                    buf[at] = c;
                break;
            case 1:
                if(m < len + 15) {
                    memmove(buf + at + 1, buf + at, m - at);
                    buf[at] = c;
                    m++;
                }
                break;
            default:
                if(m) {
                    memmove(buf + at, buf + at + 1, m - at - 1);
                    m--;
                }
            }
        }
        char why[300] = "";
        int was_fast;
        if(!same(e, buf, m, why, sizeof why, &was_fast)) {
            char what[300];
            snprintf(what, sizeof what, "%s, mutation %d", name, k);
            ok(0, what, why);
        }
    }
    free(buf);
}

/* engine_review of the decoded request and of the whole one answer alike */
static void same_answer(engine *e, const char *what, const char *buf, size_t n)
{
    json_error_t je;
    cozy_err err;
    json_t *a = engine_decode_review(e, buf, n, &je);
    json_t *b = cozy_json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
    engine_verdict va = {0}, vb = {0};
    int ra = a ? (int)engine_review(e, json_object_get(a, "request"), ENGINE_BOTH, &va, &err) : -1;
    int rb = b ? (int)engine_review(e, json_object_get(b, "request"), ENGINE_BOTH, &vb, &err) : -1;
    char *ta = va.response ? json_dumps(va.response, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *tb = vb.response ? json_dumps(vb.response, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    int good = ra == COZY_OK && rb == COZY_OK && ta && tb && strcmp(ta, tb) == 0 && va.outcome == vb.outcome;
    char why[400];
    snprintf(why, sizeof why, "%.180s / %.180s", ta ? ta : "(none)", tb ? tb : "(none)");
    ok(good, what, good ? NULL : why);
    free(ta);
    free(tb);
    json_decref(va.response);
    json_decref(vb.response);
    json_decref(a);
    json_decref(b);
}

int main(int argc, char **argv)
{
    if(argc < 3) {
        fprintf(stderr, "usage: luadecode_check LIBRARY_DIR POLICY_DIR REVIEW_FILE...\n");
        return 2;
    }
    engine_options eo = {.library_dir = argv[1], .bundle_dir = argv[2]};
    engine *e = NULL;
    cozy_err err;
    if(engine_open(&e, &eo, &err) != COZY_OK) {
        fprintf(stderr, "luadecode_check: %s\n", err.msg);
        return 2;
    }
    check_section = "edge cases";
    /* -1: either way; 1 fast; 0 slow */
    static const struct {
        const char *text;
        int fast;
    } cases[] = {
        {"{\"request\":{\"uid\":\"u\",\"object\":{\"a\":1,\"b\":[1,2.5,-0,\"x\",null,true,false,{},[]]}}}", 1},
        {"{\"request\":{\"object\":{\"a\":1,\"a\":2}}}", 0},
        {"{\"request\":{\"object\":{\"a\":{\"b\":1,\"b\":1}}}}", 0},
        {"{\"request\":{\"uid\":\"u\",\"uid\":\"v\"}}", 0},
        {"{\"request\":{},\"request\":{}}", 0},
        {"{\"request\":{\"object\":[{\"x\":[]},{\"x\":{}}],\"oldObject\":{\"k\":\"\\u00e9\\n\\\"\"}}}", 1},
        {"{\"request\":{\"object\":null,\"oldObject\":\"s\"}}", 1},
        {"{\"request\":{\"object\":1.5e3,\"oldObject\":9223372036854775807}}", 1},
        {"{\"request\":{\"object\":{\"n\":-9223372036854775808,\"m\":1e400}}}", 0},
        {"{\"request\":{\"object\":{\"s\":\"\\u0000\"}}}", 0},
        {"{\"request\":{\"object\":{\"s\":\"\\ud83d\\ude00\"}}}", 0},
        {"{\"request\":{\"object\":{\"\":\"\"}}}", 1},
        {"{\"request\":{\"object\":{\"1\":1,\"2\":2}}}", 1},
        {"{\"request\":\"x\"}", -1},
        {"{\"request\":[{\"object\":{}}]}", -1},
        {"{\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\"}", -1}, /* no request: nothing kept */
        {"{\"other\":{\"object\":{\"a\":1}},\"request\":{\"kind\":{\"object\":{}}}}", 1},
        {"[{\"request\":{}}]", 0},
        {"{\"request\":{\"object\":{}}} x", 0},
        {"{\"request\":{\"object\":{\"a\":\"\xc0\xaf\"}}}", 0},
        {"{\"request\":{\"object\":{\"a\":\"x\"}}}\"", 0},
        {"", 0},
        {"{\"request\":{\"object\":{\"a\":[1,]}}}", 0},
    };
    for(size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        one(e, cases[i].text[0] ? cases[i].text : "(empty)", cases[i].text, strlen(cases[i].text), cases[i].fast);
    /* nesting under request.object around the fast path's limit */
    static const size_t depths[] = {1000, 1021, 1022, 1023, 1024, 2048, 2049};
    for(size_t d = 0; d < sizeof depths / sizeof *depths; d++) {
        size_t k = depths[d];
        const char *pre = "{\"request\":{\"object\":", *post = "}}";
        size_t n = strlen(pre) + 2 * k + strlen(post);
        char *deep = malloc(n + 1);
        strcpy(deep, pre);
        memset(deep + strlen(pre), '[', k);
        memset(deep + strlen(pre) + k, ']', k);
        strcpy(deep + strlen(pre) + 2 * k, post);
        char what[64];
        snprintf(what, sizeof what, "%zu nested arrays in request.object", k);
        one(e, what, deep, n, -1);
        free(deep);
    }
    /* a wide array and object */
    {
        size_t k = 20000;
        char *wide = malloc(40 + 12 * k);
        size_t n = (size_t)sprintf(wide, "{\"request\":{\"object\":{\"a\":[");
        for(size_t i = 0; i < k; i++)
            n += (size_t)sprintf(wide + n, "%s%zu", i ? "," : "", i);
        n += (size_t)sprintf(wide + n, "],\"o\":{");
        for(size_t i = 0; i < 2000; i++)
            n += (size_t)sprintf(wide + n, "%s\"k%zu\":%zu", i ? "," : "", i, i);
        n += (size_t)sprintf(wide + n, "}}}}");
        one(e, "20000 elements and 2000 keys", wide, n, 1);
        free(wide);
    }
    check_section = "example reviews and their mutations";
    for(int i = 3; i < argc; i++) {
        json_t *recs = json_array();
        if(manifest_load_path(argv[i], recs, &err) != COZY_OK) {
            ok(0, argv[i], err.msg);
            json_decref(recs);
            continue;
        }
        size_t j;
        json_t *x;
        json_array_foreach(recs, j, x)
        {
            json_t *obj = json_object_get(x, "object");
            if(!json_is_object(json_object_get(obj, "request")))
                continue;
            char *text = json_dumps(obj, JSON_COMPACT);
            char what[300];
            snprintf(what, sizeof what, "%s", argv[i]);
            one(e, what, text, strlen(text), 1);
            snprintf(what, sizeof what, "%s: the same answer from engine_review", argv[i]);
            same_answer(e, what, text, strlen(text));
            mutate(e, argv[i], text, strlen(text), 200);
            free(text);
        }
        json_decref(recs);
    }
    printf("compared %lu inputs with cozy_json_loadb and luajson_push: %lu fast, %lu the slow way\n", compared, fast,
           slow);
    ok(fast > 0 && slow > 0, "both ways were taken", NULL);
    engine_close(e);
    return check_finish();
}
