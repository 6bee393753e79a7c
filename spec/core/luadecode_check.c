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
 *   luadecode_check LIBRARY_DIR POLICY_DIR [--cluster PATH]... REVIEW_FILE...
 * Run by spec/core/run-luadecode-check.sh under ASan/UBSan.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/jsonload.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/luajson.h"
#include "format/config.h"
#include "format/manifest.h"

#include "check.h"
#include "luadecode_compare.h"

static unsigned long compared, fast, slow;

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

/* n mutations of text (as jsonload_check.c makes them) */
static void mutate(engine *e, const char *name, const char *text, size_t len, int n)
{
    char *buf = malloc(len + 16);
    for(int k = 0; k < n; k++) {
        size_t m = check_mutate_json(text, len, buf);
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
static void same_answer(engine *e, const char *what, const char *buf, size_t n, engine_phase phase)
{
    json_error_t je;
    cozy_err err;
    json_t *a = engine_decode_review(e, buf, n, &je);
    json_t *b = cozy_json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
    engine_verdict va = {0}, vb = {0};
    int ra = a ? (int)engine_review(e, json_object_get(a, "request"), phase, &va, &err) : -1;
    int rb = b ? (int)engine_review(e, json_object_get(b, "request"), phase, &vb, &err) : -1;
    char *ta = va.response ? json_dumps(va.response, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *tb = vb.response ? json_dumps(vb.response, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    int good = ra == COZY_OK && rb == COZY_OK && ta && tb && strcmp(ta, tb) == 0 && va.outcome == vb.outcome;
    char why[400];
    snprintf(why, sizeof why, "%.180s / %.180s", ta ? ta : "(none)", tb ? tb : "(none)");
    ok(good, what, good ? NULL : why);
    /* engine_review_text: the bytes json_dumps gives engine_review's
       response in its envelope (the key order of a Lua table is the same
       for the same table in one state only, so both are read again and
       compared with sorted keys, and the lengths must match) */
    json_t *c = engine_decode_review(e, buf, n, &je);
    engine_verdict vc = {0};
    char *text = NULL;
    size_t len = 0;
    int rc = c ? (int)engine_review_text(e, json_object_get(c, "request"), phase, &vc, &text, &len, &err)
               : -1;
    json_t *env = vb.response ? json_pack("{s:s, s:s, s:O}", "apiVersion", "admission.k8s.io/v1", "kind",
                                          "AdmissionReview", "response", vb.response)
                              : NULL;
    char *want = env ? json_dumps(env, JSON_COMPACT) : NULL;
    json_t *got = text ? json_loads(text, 0, NULL) : NULL;
    char *gs = got ? json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *ws = env ? json_dumps(env, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    good = rc == COZY_OK && text && want && gs && ws && strcmp(gs, ws) == 0 && len == strlen(text) &&
           strlen(want) == len && strcmp(text, want) == 0 && vc.outcome == vb.outcome &&
           vc.allowed == json_is_true(json_object_get(vb.response, "allowed"));
    snprintf(why, sizeof why, "%.180s / %.180s", text ? text : "(none)", want ? want : "(none)");
    char what2[400];
    snprintf(what2, sizeof what2, "%s: engine_review_text writes what json_dumps writes", what);
    ok(good, what2, good ? NULL : why);
    free(text);
    free(want);
    free(gs);
    free(ws);
    json_decref(got);
    json_decref(env);
    json_decref(c);
    free(ta);
    free(tb);
    json_decref(va.response);
    json_decref(vb.response);
    json_decref(a);
    json_decref(b);
}

/* a random Lua value on the stack: JSON-shaped mostly, with what the
   writer must leave to luajson_to_json now and then */
static void push_random(lua_State *L, int depth)
{
    static const char *const strings[] = {
        "", "a", "plain text", "quote \" and backslash \\", "slash /", "tab\tnew\nline\rcr\bbs\fff",
        "\x01\x1f\x7f", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "bad \xff utf-8", "cut \xe2\x82",
        "nvidia.com/AD102GL_L40S", "\xe2\x80\xa8 line separator",
    };
    static const double reals[] = {0.5, -0.0, 1e-5, 1e20, 1e21, 0.1, 123456789.123, 1e300, 5e-324, -2.5e-310,
                                   1.0, 100.0, 3.0e15, 1.7976931348623157e308};
    unsigned k = (unsigned)(check_rnd() % (depth >= 4 ? 6 : 10));
    switch(k) {
    case 0: lua_pushinteger(L, (lua_Integer)check_rnd()); break;
    case 1: lua_pushinteger(L, (lua_Integer)(check_rnd() % 2001) - 1000); break;
    case 2: {
        unsigned r = (unsigned)(check_rnd() % 40);
        if(r == 0)
            lua_pushnumber(L, 0.0 / 0.0);
        else if(r == 1)
            lua_pushnumber(L, 1.0 / 0.0);
        else if(r < 20)
            lua_pushnumber(L, reals[r % (sizeof reals / sizeof *reals)]);
        else {
            uint64_t bits = check_rnd();
            double d;
            memcpy(&d, &bits, sizeof d);
            lua_pushnumber(L, d == d ? d : 2.5);
        }
        break;
    }
    case 3: {
        const char *s = strings[check_rnd() % (sizeof strings / sizeof *strings)];
        lua_pushstring(L, s);
        break;
    }
    case 4: lua_pushboolean(L, (int)(check_rnd() & 1)); break;
    case 5: lua_pushlightuserdata(L, NULL); break;
    default: {
        /* 6 object-marked, 7 array-marked, 8 unmarked with string keys, 9 unmarked sequence */
        int n = (int)(check_rnd() % 5);
        lua_createtable(L, 0, 0);
        int t = lua_gettop(L);
        for(int i = 1; i <= n; i++) {
            if(k == 7 || k == 9)
                lua_pushinteger(L, (check_rnd() % 30) == 0 ? i + 1 : i); /* now and then a hole */
            else if((check_rnd() % 40) == 0)
                lua_pushinteger(L, i); /* now and then a key that is not a string */
            else {
                char key[32];
                snprintf(key, sizeof key, "%s%d", strings[check_rnd() % (sizeof strings / sizeof *strings)], i);
                lua_pushstring(L, (check_rnd() % 40) == 0 ? "nul\0key" : key);
                if(lua_rawlen(L, -1) == 3) /* the NUL cut it: write it with its NUL */
                    lua_pushlstring(L, "nul\0key", 7), lua_remove(L, -2);
            }
            push_random(L, depth + 1);
            lua_rawset(L, t);
        }
        if(k == 6 || k == 7)
            luaL_setmetatable(L, k == 6 ? LUAJSON_OBJECT_MT : LUAJSON_ARRAY_MT);
        if((check_rnd() % 8) == 0) { /* seen through a read-only view */
            luajson_push_readonly(L, t);
            lua_remove(L, t);
        }
    }
    }
}

/* luajson_write against json_dumps(luajson_to_json(v), JSON_COMPACT) for
   `n` random values: the same bytes whenever the writer writes; when it
   does not, luajson_to_json refuses too, or the value is one the writer
   leaves to it (a key with NUL) */
static void writer_random(engine *e, int n)
{
    lua_State *L = engine_lua(e);
    unsigned long written = 0, left = 0;
    for(int i = 0; i < n; i++) {
        int top = lua_gettop(L);
        push_random(L, 0);
        cozy_buf b = {0};
        int rc = luajson_write(L, -1, &b);
        cozy_err err;
        json_t *j = luajson_to_json(L, -1, &err);
        char *want = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        char what[64], why[600];
        snprintf(what, sizeof what, "random value %d", i);
        if(rc == 0) {
            written++;
            int good = want && b.p && strcmp(b.p, want) == 0;
            snprintf(why, sizeof why, "wrote %.250s, json_dumps %.250s", b.p ? b.p : "", want ? want : "(refused)");
            if(!good)
                ok(0, what, why);
        } else {
            left++;
            if(want && !strstr(want, "nul\\u0000key")) {
                snprintf(why, sizeof why, "not written, but luajson_to_json takes it: %.400s", want);
                ok(0, what, why);
            }
        }
        free(want);
        json_decref(j);
        cozy_buf_free(&b);
        lua_settop(L, top);
    }
    printf("writer: %lu random values written, %lu left to luajson_to_json\n", written, left);
    ok(written > (unsigned long)n / 4 && left > 0, "the writer wrote some random values and left some", NULL);
}

int main(int argc, char **argv)
{
    if(argc < 3) {
        fprintf(stderr, "usage: luadecode_check LIBRARY_DIR POLICY_DIR [--cluster PATH]... REVIEW_FILE...\n");
        return 2;
    }
    check_rng = 49;
    engine_options eo = {.library_dir = argv[1], .bundle_dir = argv[2]};
    engine *e = NULL;
    cozy_err err;
    if(engine_open(&e, &eo, &err) != COZY_OK) {
        fprintf(stderr, "luadecode_check: %s\n", err.msg);
        return 2;
    }
    /* the examples' cluster, so that the reviews are judged as the bench
       judges them (budgets, classes, patches) */
    int first_review = 3;
    json_t *objs = json_array();
    while(first_review + 1 < argc && strcmp(argv[first_review], "--cluster") == 0) {
        json_t *r = json_array();
        if(manifest_load_path(argv[first_review + 1], r, &err) != COZY_OK) {
            fprintf(stderr, "luadecode_check: %s\n", err.msg);
            return 2;
        }
        size_t j;
        json_t *x;
        json_array_foreach(r, j, x) json_array_append(objs, json_object_get(x, "object"));
        json_decref(r);
        first_review += 2;
    }
    json_t *settings = config_defaults();
    if(engine_set_cluster(e, objs, settings, &err) != COZY_OK) {
        fprintf(stderr, "luadecode_check: %s\n", err.msg);
        return 2;
    }
    json_decref(objs);
    json_decref(settings);
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
    /* more members than the Lua stack holds (LUAI_MAXSTACK, 1,000,000):
       the fast way stops and the text goes the slow way, with the same
       answer */
    {
        size_t k = 1100000;
        char *wide = malloc(64 + 2 * k);
        size_t n = (size_t)sprintf(wide, "{\"request\":{\"object\":[");
        for(size_t i = 0; i < k; i++) {
            if(i)
                wide[n++] = ',';
            wide[n++] = '0';
        }
        n += (size_t)sprintf(wide + n, "]}}");
        one(e, "1,100,000 elements in request.object", wide, n, 0);
        free(wide);
    }
    /* lists of empty containers: each closed one stays on the Lua stack as
       a member (a hostile tenant's review overflowed the stack with
       `tolerations: [{}, {}, ...]`) */
    static const size_t empties[] = {1000, 3000, 1040000};
    for(size_t q = 0; q < sizeof empties / sizeof *empties; q++) {
        for(int kind = 0; kind < 2; kind++) {
            size_t k = empties[q];
            char *wide = malloc(64 + 3 * k);
            size_t n = (size_t)sprintf(wide, "{\"request\":{\"object\":{\"a\":[");
            for(size_t i = 0; i < k; i++) {
                if(i)
                    wide[n++] = ',';
                wide[n++] = kind ? '{' : '[';
                wide[n++] = kind ? '}' : ']';
            }
            n += (size_t)sprintf(wide + n, "]}}}");
            char what[80];
            snprintf(what, sizeof what, "%zu empty %s in a list", k, kind ? "objects" : "arrays");
            one(e, what, wide, n, k > 1000000 ? 0 : 1);
            free(wide);
        }
    }
    check_section = "example reviews and their mutations";
    for(int i = first_review; i < argc; i++) {
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
            static const struct {
                engine_phase phase;
                const char *name;
            } phases[] = {{ENGINE_VALIDATE, "validate"}, {ENGINE_MUTATE, "mutate"}, {ENGINE_BOTH, "both"}};
            for(size_t p = 0; p < 3; p++) {
                snprintf(what, sizeof what, "%s (%s): the same answer from engine_review", argv[i], phases[p].name);
                same_answer(e, what, text, strlen(text), phases[p].phase);
            }
            mutate(e, argv[i], text, strlen(text), 200);
            free(text);
        }
        json_decref(recs);
    }
    check_section = "the answer writer";
    writer_random(e, 20000);
    printf("compared %lu inputs with cozy_json_loadb and luajson_push: %lu fast, %lu the slow way\n", compared, fast,
           slow);
    ok(fast > 0 && slow > 0, "both ways were taken", NULL);
    engine_close(e);
    return check_finish();
}
