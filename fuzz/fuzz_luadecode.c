/* fuzz_luadecode — libFuzzer target for the review body read once into Lua
 * (core/engine/luadecode.c, decision 0049) and the answer writer
 * (core/engine/luawrite.c, decision 0051), against the paths they
 * replace.
 *
 * Feeds: the bytes as a review body (not NUL-terminated), on one engine
 * made once with the default bundle.
 * Checks, besides the sanitizers:
 *   - engine_decode_review and cozy_json_loadb(JSON_REJECT_DUPLICATES)
 *     both accept or both refuse, with the same error text, line, column
 *     and position;
 *   - accepted: the document equals cozy_json_loadb's with request.object
 *     and request.oldObject emptied when the engine kept a Lua request
 *     (else it equals it whole), written out the same;
 *   - the kept Lua request equals luajson_push of the whole request
 *     (types, integer or float, json.null, markers);
 *   - luajson_write of that request writes what
 *     json_dumps(luajson_to_json(request), JSON_COMPACT) writes.
 * Seeds: fuzz/seeds/fuzz_luadecode (example AdmissionReviews as JSON
 * bodies) and the .json files of examples/ and the shared fixtures
 * (fuzz/seed.sh).
 */
#include "base/buf.h"
#include "base/jsonload.h"
#include "engine/engine.h"
#include "engine/internal.h"
#include "engine/luajson.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../spec/core/luadecode_compare.h"

#ifndef FUZZ_SRCDIR
#define FUZZ_SRCDIR "."
#endif

#define CHECK(c) do { if(!(c)) { fprintf(stderr, "fuzz_luadecode: check failed: %s\n", #c); abort(); } } while(0)

static engine *E;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    cozy_err err = {{0}};
    engine_options eo = {.library_dir = FUZZ_SRCDIR "/lua", .bundle_dir = FUZZ_SRCDIR "/policies"};
    if(engine_open(&E, &eo, &err) != COZY_OK) {
        fprintf(stderr, "fuzz_luadecode: %s\n", err.msg);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lua_State *L = engine_lua(E);
    int top = lua_gettop(L);
    char *buf = malloc(size ? size : 1);
    if(!buf)
        return 0;
    if(size)
        memcpy(buf, data, size);
    json_error_t ea, eb;
    memset(&ea, 0, sizeof ea);
    memset(&eb, 0, sizeof eb);
    json_t *a = engine_decode_review(E, buf, size, &ea);
    json_t *b = cozy_json_loadb(buf, size, JSON_REJECT_DUPLICATES, &eb);
    CHECK((a == NULL) == (b == NULL));
    CHECK(strcmp(ea.text, eb.text) == 0 && strcmp(ea.source, eb.source) == 0);
    CHECK(ea.line == eb.line && ea.column == eb.column && ea.position == eb.position);
    if(a) {
        int kept = E->decoded_ref != LUA_NOREF;
        json_t *want = kept ? emptied(b) : json_incref(b);
        char *da = json_dumps(a, JSON_COMPACT), *dw = json_dumps(want, JSON_COMPACT);
        CHECK(json_equal(a, want));
        CHECK(da && dw && strcmp(da, dw) == 0);
        free(da);
        free(dw);
        json_decref(want);
        if(kept) {
            const json_t *req = json_object_get(b, "request");
            CHECK(req && E->decoded_for == json_object_get(a, "request"));
            lua_rawgeti(L, LUA_REGISTRYINDEX, E->decoded_ref);
            luajson_push(L, req);
            CHECK(lua_same(L, -2, -1, 0));
            /* the writer on the request as the rules got it */
            cozy_buf out = {0};
            int wrote = luajson_write(L, -2, &out) == 0;
            cozy_err err;
            json_t *j = luajson_to_json(L, -2, &err);
            char *text = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            /* a decoded request has string keys without NUL, valid UTF-8
               and finite numbers: both write it, the same bytes */
            CHECK(wrote && text && out.p && strcmp(out.p, text) == 0);
            free(text);
            json_decref(j);
            cozy_buf_free(&out);
        }
    }
    engine_forget_decoded(E);
    lua_settop(L, top);
    json_decref(a);
    json_decref(b);
    free(buf);
    return 0;
}
