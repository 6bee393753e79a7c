/* bench/engine.c — the policy engine alone: reviews per second and the
 * median time of one review, per webhook phase, without HTTP, TLS or JSON
 * parsing (the requests are parsed once, before timing). Shows how much of
 * a webhook answer is the Lua policies, and what a hoster's own rules cost.
 *
 *   cozygpu-engine-bench [--rounds N] [--cluster PATH]... [--override DIR] REVIEWS
 *
 * REVIEWS: files or a directory of AdmissionReviews (examples/reviews).
 * Prints one line per phase: "engine validate: N reviews, median X us,
 * p99 Y us" (each review timed alone, CLOCK_MONOTONIC).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/config.h"
#include "engine/engine.h"
#include "format/manifest.h"

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
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
    for(int i = 1; i < argc; i++) {
        if(strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if(strcmp(argv[i], "--cluster") == 0 && i + 1 < argc && nclusters < 16)
            clusters[nclusters++] = argv[++i];
        else if(strcmp(argv[i], "--override") == 0 && i + 1 < argc)
            override = argv[++i];
        else if(argv[i][0] != '-')
            reviews = argv[i];
        else {
            fprintf(stderr, "usage: cozygpu-engine-bench [--rounds N] [--cluster PATH]... [--override DIR] REVIEWS\n");
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
    size_t n = json_array_size(reqs) * (size_t)rounds;
    if(n == 0) {
        fprintf(stderr, "cozygpu-engine-bench: no AdmissionReviews in %s\n", reviews);
        return 2;
    }
    double *t = malloc(n * sizeof *t);
    static const struct {
        const char *name;
        engine_phase phase;
    } phases[] = {{"validate", ENGINE_VALIDATE}, {"mutate", ENGINE_MUTATE}};
    for(size_t p = 0; p < 2; p++) {
        size_t k = 0;
        for(int r = 0; r < rounds; r++)
            json_array_foreach(reqs, j, x)
            {
                engine_verdict v;
                double t0 = now_us();
                if(engine_review(e, x, phases[p].phase, &v, &err) != COZY_OK) {
                    fprintf(stderr, "cozygpu-engine-bench: %s\n", err.msg);
                    return 1;
                }
                t[k++] = now_us() - t0;
                json_decref(v.response);
            }
        qsort(t, n, sizeof *t, cmp_double);
        printf("engine %-8s %zu reviews, median %.1f us, p99 %.1f us\n", phases[p].name, n, t[n / 2],
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
