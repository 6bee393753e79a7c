/* fuzz_yaml — libFuzzer target for the YAML loader (core/format/yamlload.c).
 *
 * Feeds: the input bytes as one YAML stream to yamlload_parse (not
 * NUL-terminated: the loader must respect `len`).
 * Checks, besides the sanitizers (ASan, UBSan, LeakSanitizer):
 *   - success returns an array whose elements are never null (null and
 *     empty documents are skipped), and nothing is left in *err's message;
 *   - every value it returns can be dumped by jansson (valid UTF-8, no
 *     NaN/inf) and the dump loads back as an equal value;
 *   - failure returns NULL with a NUL-terminated, non-empty message;
 *   - the same bytes parse the same way twice (no hidden state).
 * Seeds: every .yaml/.yml/.json of examples/ and the shared fixtures.
 */
#include "format/yamlload.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) do { if(!(c)) { fprintf(stderr, "fuzz_yaml: check failed: %s\n", #c); abort(); } } while(0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private copy of exactly `size` bytes, so ASan sees any read past it */
    char *buf = malloc(size ? size : 1);
    if(!buf)
        return 0;
    if(size)
        memcpy(buf, data, size);
    yamlload_error err;
    memset(&err, 0x5a, sizeof err);
    json_t *docs = yamlload_parse(size ? buf : NULL, size, "fuzz.yaml", &err);
    if(!docs) {
        CHECK(memchr(err.message, 0, sizeof err.message) != NULL);
        CHECK(memchr(err.file, 0, sizeof err.file) != NULL);
        CHECK(err.message[0] != 0);
        CHECK(strcmp(err.file, "fuzz.yaml") == 0);
        free(buf);
        return 0;
    }
    CHECK(json_is_array(docs));
    size_t i;
    json_t *d;
    json_array_foreach(docs, i, d) CHECK(d != NULL && !json_is_null(d));
    char *text = json_dumps(docs, JSON_COMPACT | JSON_ENCODE_ANY);
    CHECK(text != NULL);
    json_error_t jerr;
    json_t *back = json_loads(text, JSON_DECODE_ANY, &jerr);
    CHECK(back != NULL);
    CHECK(json_equal(docs, back));
    json_decref(back);
    free(text);
    /* determinism: a second parse gives the same value */
    json_t *again = yamlload_parse(size ? buf : NULL, size, "fuzz.yaml", NULL);
    CHECK(again != NULL && json_equal(docs, again));
    json_decref(again);
    json_decref(docs);
    free(buf);
    return 0;
}
