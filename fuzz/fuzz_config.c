/* fuzz_config — libFuzzer target for the settings file (core/format/config.c
 * through core/format/manifest.c and the YAML loader).
 *
 * Feeds: the input bytes as the contents of a settings file (the settings
 * mapping itself, JSON or YAML, or the `cozygpu-config` ConfigMap carrying
 * it under data["config.yaml"]), written to one temporary file made in
 * LLVMFuzzerInitialize and read with config_load_file (there is no
 * in-memory entry point for the whole path).
 * Checks, besides the sanitizers (ASan, UBSan, LeakSanitizer):
 *   - success gives an object holding every key of config_defaults();
 *   - validating that result again (config_from_json) succeeds and gives an
 *     equal object (defaults are a fixed point);
 *   - failure leaves *out untouched and a non-empty message that names the
 *     file.
 * Seeds: examples/config.yaml, the settings ConfigMap in deploy/, and the
 * YAML of examples/ and the shared fixtures (mostly refused: unknown keys).
 */
#include "format/config.h"
#include "fuzz_tmp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c) do { if(!(c)) { fprintf(stderr, "fuzz_config: check failed: %s\n", #c); abort(); } } while(0)

static char dir[4000], path[4096];
static json_t *defaults;

static void cleanup(void)
{
    if(path[0])
        unlink(path);
    if(dir[0])
        rmdir(dir);
    json_decref(defaults);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tmpdir(dir, sizeof dir, "config");
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    defaults = config_defaults();
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, size, f) == size);
    CHECK(fclose(f) == 0);
    cozy_err err = {{0}};
    json_t *out = (json_t *)&err; /* a sentinel: must stay untouched on failure */
    cozy_result rc = config_load_file(path, &out, &err);
    if(rc != COZY_OK) {
        CHECK(out == (json_t *)&err);
        CHECK(err.msg[0] != 0);
        CHECK(strstr(err.msg, path) != NULL);
        return 0;
    }
    CHECK(json_is_object(out));
    const char *k;
    json_t *v;
    json_object_foreach(defaults, k, v) CHECK(json_object_get(out, k) != NULL);
    json_t *again = NULL;
    rc = config_from_json(out, "again", &again, &err);
    if(rc != COZY_OK)
        fprintf(stderr, "fuzz_config: revalidation: %s\n", err.msg);
    CHECK(rc == COZY_OK);
    CHECK(json_equal(out, again));
    json_decref(again);
    json_decref(out);
    return 0;
}
