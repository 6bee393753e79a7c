/* fuzz_review — libFuzzer target for the AdmissionReview path through the
 * default policy bundle (core/admission/review.c, core/engine/, lua/,
 * policies/).
 *
 * Feeds: the input bytes as a manifest buffer (JSON when it starts with
 * `{`, else a YAML stream: an AdmissionReview, a bare AdmissionRequest or a
 * plain object, as `cozygpu review` reads a file); each of the first four
 * documents goes through review_document (review_build_request, then
 * engine_review with both webhooks) on one engine made once in
 * LLVMFuzzerInitialize with the default bundle, the snapshot of
 * examples/classes and examples/cluster and the settings of
 * examples/config.yaml. The engine's per-call budget is lowered to 2,000,000
 * instructions and 32 MiB so a slow path ends as a refusal, not a timeout.
 * Checks, besides the sanitizers (ASan, UBSan, LeakSanitizer):
 *   - success gives an AdmissionReview object whose response has a boolean
 *     `allowed` that is true exactly when the outcome is ENGINE_ALLOWED, and
 *     an integer status.code when refused;
 *   - a patch, when present, is base64 of a JSON array (review_decode_patch)
 *     with patchType "JSONPatch";
 *   - an input error leaves a non-empty message and no answer.
 * Not checked: that no rule raises (a malformed object may make a rule
 * fail, which is a refusal by design, fail closed).
 * Seeds: examples/reviews and ../shared/fixtures/admission (JSON and YAML).
 */
#include "admission/review.h"
#include "engine/engine.h"
#include "format/config.h"
#include "format/manifest.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FUZZ_SRCDIR
#define FUZZ_SRCDIR "."
#endif

#define CHECK(c) do { if(!(c)) { fprintf(stderr, "fuzz_review: check failed: %s\n", #c); abort(); } } while(0)

static engine *E;

static void die(const char *what, const cozy_err *err)
{
    fprintf(stderr, "fuzz_review: %s: %s\n", what, err->msg);
    exit(1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    cozy_err err = {{0}};
    json_t *settings = NULL;
    if(config_load_file(FUZZ_SRCDIR "/examples/config.yaml", &settings, &err) != COZY_OK)
        die("settings", &err);
    json_t *recs = json_array(), *objects = json_array();
    if(manifest_load_path(FUZZ_SRCDIR "/examples/classes", recs, &err) != COZY_OK ||
       manifest_load_path(FUZZ_SRCDIR "/examples/cluster", recs, &err) != COZY_OK)
        die("cluster snapshot", &err);
    size_t i;
    json_t *r;
    json_array_foreach(recs, i, r) json_array_append(objects, json_object_get(r, "object"));
    json_decref(recs);
    engine_options eo = {0};
    eo.instructions = 2000000;
    eo.memory_bytes = 32ll * 1024 * 1024;
    if(engine_open(&E, &eo, &err) != COZY_OK || engine_set_cluster(E, objects, settings, &err) != COZY_OK)
        die("engine", &err);
    json_decref(objects);
    json_decref(settings);
    return 0;
}

static void check_answer(const json_t *out, engine_outcome outcome)
{
    CHECK(json_is_object(out));
    const json_t *resp = json_object_get(out, "response");
    CHECK(json_is_object(resp));
    const json_t *allowed = json_object_get(resp, "allowed");
    CHECK(json_is_boolean(allowed));
    CHECK(json_is_true(allowed) == (outcome == ENGINE_ALLOWED));
    if(!json_is_true(allowed))
        CHECK(json_is_integer(json_object_get(json_object_get(resp, "status"), "code")));
    if(json_object_get(resp, "patch")) {
        CHECK(json_is_string(json_object_get(resp, "patchType")));
        CHECK(strcmp(json_string_value(json_object_get(resp, "patchType")), "JSONPatch") == 0);
        json_t *ops = review_decode_patch(resp);
        CHECK(json_is_array(ops));
        json_decref(ops);
    }
    char *s = json_dumps(out, JSON_COMPACT);
    CHECK(s != NULL);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cozy_err err = {{0}};
    json_t *recs = json_array();
    if(manifest_load_buffer((const char *)data, size, "fuzz-input", recs, &err) != COZY_OK) {
        CHECK(err.msg[0] != 0);
        json_decref(recs);
        return 0;
    }
    size_t i;
    json_t *r;
    json_array_foreach(recs, i, r) {
        if(i >= 4)
            break;
        const json_t *doc = json_object_get(r, "object");
        if(review_is_response_only(doc))
            continue;
        review_options ro = {.username = "fuzz-user", .phases = ENGINE_BOTH, .notes = json_array()};
        json_t *out = NULL;
        engine_outcome outcome = ENGINE_OUTCOME_LAST;
        memset(&err, 0, sizeof err);
        cozy_result rc = review_document(E, doc, "fuzz-input", 1, &ro, &out, &outcome, &err);
        if(rc == COZY_OK) {
            CHECK(outcome < ENGINE_OUTCOME_LAST);
            check_answer(out, outcome);
        } else {
            CHECK(out == NULL);
            CHECK(err.msg[0] != 0);
        }
        json_decref(out);
        json_decref(ro.notes);
    }
    json_decref(recs);
    return 0;
}
