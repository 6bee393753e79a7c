/* fuzz_jsonload — libFuzzer target for core/base/jsonload.c against
 * jansson's own json_loadb (decision 0046: the fast parse must give
 * json_loadb's answer for every input).
 *
 * Feeds: a first byte 0 to 3 picks the flags (bit 0
 * JSON_REJECT_DUPLICATES, bit 1 JSON_DECODE_ANY) and the rest is the text;
 * any other first byte starts the text, read with JSON_REJECT_DUPLICATES
 * as the webhooks read a body (so the seeds are plain JSON files). The
 * text is not NUL-terminated.
 * Checks, besides the sanitizers:
 *   - both accept or both refuse;
 *   - accepted: the values are equal (json_equal) and write out the same,
 *     keys in the same order (json_dumps without sorting);
 *   - the same error text, source, line, column and position (after a
 *     success too: json_loadb fills it then).
 * Seeds: the .json files of examples/ and the shared fixtures, and the
 * example AdmissionReviews as JSON (fuzz/seed.sh).
 */
#include "base/jsonload.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) do { if(!(c)) { fprintf(stderr, "fuzz_jsonload: check failed: %s\n", #c); abort(); } } while(0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if(size == 0)
        return 0;
    size_t flags = JSON_REJECT_DUPLICATES, skip = 0;
    if(data[0] <= 3) {
        flags = ((data[0] & 1) ? JSON_REJECT_DUPLICATES : 0) | ((data[0] & 2) ? JSON_DECODE_ANY : 0);
        skip = 1;
    }
    size_t n = size - skip;
    char *buf = malloc(n ? n : 1);
    if(!buf)
        return 0;
    if(n)
        memcpy(buf, data + skip, n);
    json_error_t ea, eb;
    memset(&ea, 0, sizeof ea);
    memset(&eb, 0, sizeof eb);
    json_t *a = cozy_json_loadb(buf, n, flags, &ea);
    json_t *b = json_loadb(buf, n, flags, &eb);
    CHECK((a == NULL) == (b == NULL));
    if(a) {
        CHECK(json_equal(a, b));
        char *da = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY), *db = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
        CHECK((da == NULL) == (db == NULL));
        CHECK(!da || strcmp(da, db) == 0);
        free(da);
        free(db);
    }
    /* refused: the same error; accepted: *error as json_loadb leaves it */
    CHECK(strcmp(ea.text, eb.text) == 0 && strcmp(ea.source, eb.source) == 0);
    CHECK(ea.line == eb.line && ea.column == eb.column && ea.position == eb.position);
    json_decref(a);
    json_decref(b);
    free(buf);
    return 0;
}
