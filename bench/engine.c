/* bench/engine.c — the policy engine without HTTP or TLS. First the
 * server's whole engine path per review (the body read into Lua, checked,
 * reviewed in its webhook's phase, the answer written: what --instructions
 * counts), then engine_review alone (the requests parsed once, before
 * timing), for the server's mix (each review in the phase its
 * webhook calls: a Pod's in mutate, as /mutate/launcher; every other
 * kind's in validate, as /validate/vmi, /validate/gpuclass and
 * /validate/gpuclaim) and per phase over every review. Shows how much of a
 * webhook answer is the Lua policies, and what a hoster's own rules cost.
 *
 *   cozygpu-engine-bench [--rounds N] [--cluster PATH]... [--override DIR] REVIEWS
 *   cozygpu-engine-bench --instructions [--rounds N] [--cluster PATH]... REVIEWS
 *
 * REVIEWS: files or a directory of AdmissionReviews (examples/reviews).
 * Prints "engine path (body to answer text, server mix) N reviews, median
 * X us, p99 Y us", then one line per mix: "engine validate   N reviews,
 * median X us, p99 Y us" (each review timed alone, CLOCK_MONOTONIC, after
 * one untimed round).
 *
 * --instructions: the server's engine path per review, for callgrind
 * (bench/engine-instructions.sh): the body bytes read as the server reads
 * them (engine_decode_review: yajl into Lua, duplicate keys refused), the
 * request checked, reviewed in its webhook's phase, the answer written as
 * text (engine_review_text), everything freed; the rounds run with callgrind's
 * collection on (CALLGRIND_TOGGLE_COLLECT) and nothing else does. Prints
 * "reviews N", the answers' total bytes and an FNV-1a hash of one round's
 * answers (the warm-up round's, each written with its keys sorted: a Lua
 * table's key order differs between processes): the same answers give
 * the same hash, so a change in what is answered shows. TLS, HTTP and the hand-off to
 * a review thread are not in it: `make bench` measures those from the
 * server's CPU time.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <valgrind/callgrind.h>

#include "admission/request.h"
#include "admission/response.h"
#include "format/config.h"
#include "base/jsonload.h"
#include "engine/engine.h"
#include "format/manifest.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* The phase the server's webhook runs a request in (deploy/50-webhooks.yaml:
 * Pods are mutated by /mutate/launcher, every other kind validated). */
static engine_phase server_phase(const json_t *req)
{
    const char *kind = json_string_value(json_object_get(json_object_get(req, "kind"), "kind"));
    return kind && strcmp(kind, "Pod") == 0 ? ENGINE_MUTATE : ENGINE_VALIDATE;
}

/* FNV-1a, 64 bits, of the answers of a round: the same answers, byte for
 * byte, give the same value. */
static uint64_t answers_hash = 1469598103934665603ULL;

/* One review as the server's engine path runs it, from the body's bytes to
 * the answer's (ctl_review_on_review and webhook_review.c, without TLS,
 * HTTP and threads). Returns the answer's length, or 0 on a failure; with
 * `hash`, folds the answer into answers_hash. */
static size_t engine_path(engine *e, const char *body, size_t len, int hash)
{
    json_error_t jerr;
    json_t *doc = engine_decode_review(e, body, len, &jerr);
    if(!doc)
        return 0;
    const json_t *req = json_object_get(doc, "request");
    cozy_err err;
    char *text = NULL;
    size_t n = 0;
    if(admission_check_request(req, "bench", &err) != COZY_OK) {
        engine_forget_decoded(e);
        json_t *refusal = admission_envelope(NULL, admission_refusal(req, 400, err.msg));
        text = refusal ? json_dumps(refusal, JSON_COMPACT) : NULL;
        n = text ? strlen(text) : 0;
        json_decref(refusal);
    } else {
        engine_verdict v;
        if(engine_review_text(e, req, server_phase(req), &v, &text, &n, &err) != COZY_OK) {
            json_decref(doc);
            return 0;
        }
    }
    json_t *out = hash && text ? json_loads(text, 0, NULL) : NULL;
    if(hash) {
        /* keys sorted: the order of an object's keys comes from a Lua
         * table's, which differs between processes */
        char *sorted = out ? json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        for(const char *q = sorted; q && *q; q++)
            answers_hash = (answers_hash ^ (unsigned char)*q) * 1099511628211ULL;
        free(sorted);
    }
    free(text);
    json_decref(out);
    json_decref(doc);
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int rounds = 2000;
    const char *clusters[16];
    int nclusters = 0;
    const char *override = NULL, *reviews = NULL;
    int instructions = 0;
    for(int i = 1; i < argc; i++) {
        if(strcmp(argv[i], "--instructions") == 0)
            instructions = 1;
        else if(strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if(strcmp(argv[i], "--cluster") == 0 && i + 1 < argc && nclusters < 16)
            clusters[nclusters++] = argv[++i];
        else if(strcmp(argv[i], "--override") == 0 && i + 1 < argc)
            override = argv[++i];
        else if(argv[i][0] != '-')
            reviews = argv[i];
        else {
            fprintf(stderr, "usage: cozygpu-engine-bench [--instructions] [--rounds N] [--cluster PATH]... "
                            "[--override DIR] REVIEWS\n");
            return 2;
        }
    }
    if(!reviews || rounds < 1) {
        fprintf(stderr, "cozygpu-engine-bench: give a reviews file or directory\n");
        return 2;
    }
    cozy_err err;
    engine_options eo = {.override_dir = override};
    engine *e = NULL;
    if(engine_open(&e, &eo, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu-engine-bench: %s\n", err.msg);
        return 2;
    }
    json_t *objs = json_array(), *recs = json_array();
    for(int i = 0; i < nclusters; i++) {
        json_t *r = json_array();
        if(manifest_load_path(clusters[i], r, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu-engine-bench: %s\n", err.msg);
            return 2;
        }
        size_t j;
        json_t *x;
        json_array_foreach(r, j, x) json_array_append(objs, json_object_get(x, "object"));
        json_decref(r);
    }
    json_t *settings = config_defaults();
    if(engine_set_cluster(e, objs, settings, &err) != COZY_OK ||
       manifest_load_path(reviews, recs, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu-engine-bench: %s\n", err.msg);
        return 2;
    }
    json_t *reqs = json_array();
    size_t j;
    json_t *x;
    json_array_foreach(recs, j, x)
    {
        json_t *req = json_object_get(json_object_get(x, "object"), "request");
        if(json_is_object(req))
            json_array_append(reqs, req);
    }
    /* the bodies as a client sends them, written before anything is timed or counted */
    size_t nb = 0;
    char **bodies = calloc(json_array_size(recs) + 1, sizeof *bodies);
    json_array_foreach(recs, j, x)
    {
        if(json_is_object(json_object_get(json_object_get(x, "object"), "request")))
            bodies[nb++] = json_dumps(json_object_get(x, "object"), JSON_COMPACT);
    }
    if(instructions) {
        /* one round untimed and uncounted: the engine's first calls (its
         * caches, the views) are not what a review in steady state costs */
        for(size_t b = 0; b < nb; b++)
            engine_path(e, bodies[b], strlen(bodies[b]), 1);
        size_t bytes = 0, failed = 0;
        CALLGRIND_TOGGLE_COLLECT;
        for(int r = 0; r < rounds; r++)
            for(size_t b = 0; b < nb; b++) {
                size_t got = engine_path(e, bodies[b], strlen(bodies[b]), 0);
                bytes += got;
                failed += got == 0;
            }
        CALLGRIND_TOGGLE_COLLECT;
        printf("reviews %zu\nanswer-bytes %zu\nanswers-fnv1a %016llx\nfailed %zu\n", nb * (size_t)rounds, bytes,
               (unsigned long long)answers_hash, failed);
        for(size_t b = 0; b < nb; b++)
            free(bodies[b]);
        free(bodies);
        json_decref(reqs);
        json_decref(recs);
        json_decref(objs);
        json_decref(settings);
        engine_close(e);
        return failed ? 1 : 0;
    }
    size_t n = json_array_size(reqs) * (size_t)rounds;
    if(n == 0) {
        fprintf(stderr, "cozygpu-engine-bench: no AdmissionReviews in %s\n", reviews);
        return 2;
    }
    double *t = malloc((n > nb * (size_t)rounds ? n : nb * (size_t)rounds) * sizeof *t);
    /* the server's engine path, body to answer text (what the instruction
       count measures), then engine_review alone per phase */
    for(size_t b = 0; b < nb; b++) /* one untimed round: the engine's first calls are not steady state */
        engine_path(e, bodies[b], strlen(bodies[b]), 0);
    size_t k = 0;
    for(int r = 0; r < rounds; r++)
        for(size_t b = 0; b < nb; b++) {
            double t0 = now_us();
            if(!engine_path(e, bodies[b], strlen(bodies[b]), 0)) {
                fprintf(stderr, "cozygpu-engine-bench: a review failed on the engine path\n");
                return 1;
            }
            t[k++] = now_us() - t0;
        }
    if(k) {
        qsort(t, k, sizeof *t, cmp_double);
        printf("engine path (body to answer text, server mix) %zu reviews, median %.1f us, p99 %.1f us\n", k,
               t[k / 2], t[(size_t)(k * 0.99)]);
    }
    for(size_t b = 0; b < nb; b++)
        free(bodies[b]);
    free(bodies);
    /* -1: the server's mix (each review in its webhook's phase) */
    static const struct {
        const char *name;
        int phase;
    } phases[] = {{"server mix", -1}, {"validate", ENGINE_VALIDATE}, {"mutate", ENGINE_MUTATE}};
    for(size_t p = 0; p < 3; p++) {
        size_t k = 0;
        for(int r = 0; r < rounds; r++)
            json_array_foreach(reqs, j, x)
            {
                engine_verdict v;
                engine_phase ph = phases[p].phase < 0 ? server_phase(x) : (engine_phase)phases[p].phase;
                double t0 = now_us();
                if(engine_review(e, x, ph, &v, &err) != COZY_OK) {
                    fprintf(stderr, "cozygpu-engine-bench: %s\n", err.msg);
                    return 1;
                }
                t[k++] = now_us() - t0;
                json_decref(v.response);
            }
        qsort(t, n, sizeof *t, cmp_double);
        printf("engine %-10s %zu reviews, median %.1f us, p99 %.1f us\n", phases[p].name, n, t[n / 2],
               t[(size_t)(n * 0.99)]);
    }
    free(t);
    json_decref(reqs);
    json_decref(recs);
    json_decref(objs);
    json_decref(settings);
    engine_close(e);
    return 0;
}
