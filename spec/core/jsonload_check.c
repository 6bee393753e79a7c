/* jsonload_check.c — core/base/jsonload.c against jansson's json_loadb
 * (decision 0046): for every input, both accept or both refuse; accepted,
 * equal values written out the same (keys in the same order); refused,
 * the same error text, line, column and position. Inputs: hand-made edge
 * cases (each where yajl and jansson read JSON differently, or where the
 * fast path must hand the text over), every file given on the command
 * line, and seeded random mutations of those (bounded in count). Run by
 * spec/core/run-jsonload-check.sh under ASan/UBSan.
 *   jsonload_check [FILE...]
 */
#include "base/jsonload.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static unsigned long compared, accepted;

/* 1 when cozy_json_loadb answers as json_loadb for buf with flags */
static int same(const char *buf, size_t n, size_t flags, char *why, size_t wn)
{
    json_error_t ea, eb;
    memset(&ea, 0, sizeof ea);
    memset(&eb, 0, sizeof eb);
    json_t *a = cozy_json_loadb(buf, n, flags, &ea);
    json_t *b = json_loadb(buf, n, flags, &eb);
    int good = (a == NULL) == (b == NULL);
    compared++;
    if(!good)
        snprintf(why, wn, "jsonload %s, json_loadb %s (%s)", a ? "accepts" : "refuses", b ? "accepts" : "refuses",
                 a ? eb.text : ea.text);
    else if(a) {
        accepted++;
        if(strcmp(ea.text, eb.text) || strcmp(ea.source, eb.source) || ea.line != eb.line ||
           ea.column != eb.column || ea.position != eb.position) {
            snprintf(why, wn, "after a success the error differs: \"%s\" %s %d:%d @%d / \"%s\" %s %d:%d @%d", ea.text,
                     ea.source, ea.line, ea.column, ea.position, eb.text, eb.source, eb.line, eb.column, eb.position);
            json_decref(a);
            json_decref(b);
            return 0;
        }
        char *da = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY), *db = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
        good = json_equal(a, b) && da && db && strcmp(da, db) == 0;
        if(!good)
            snprintf(why, wn, "values differ: %.80s / %.80s", da ? da : "?", db ? db : "?");
        free(da);
        free(db);
    } else {
        good = strcmp(ea.text, eb.text) == 0 && ea.line == eb.line && ea.column == eb.column &&
               ea.position == eb.position;
        if(!good)
            snprintf(why, wn, "errors differ: %s (%d:%d) / %s (%d:%d)", ea.text, ea.line, ea.column, eb.text, eb.line,
                     eb.column);
    }
    json_decref(a);
    json_decref(b);
    return good;
}

static void both_flags(const char *what, const char *buf, size_t n)
{
    static const size_t flags[] = {JSON_REJECT_DUPLICATES, 0, JSON_DECODE_ANY,
                                   JSON_DECODE_ANY | JSON_REJECT_DUPLICATES};
    for(size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        char why[300] = "", name[200];
        snprintf(name, sizeof name, "%s (flags %zu)", what, flags[i]);
        if(!same(buf, n, flags[i], why, sizeof why))
            ok(0, name, why);
        else
            ok(1, name, NULL);
    }
}

/* n mutations of text: bytes replaced, inserted or deleted, picked among
 * JSON's own characters and bytes that trip parsers */
static void mutate(const char *name, const char *text, size_t len, int n)
{
    char *buf = malloc(len + 16);
    for(int k = 0; k < n; k++) {
        size_t m = check_mutate_json(text, len, buf);
        char why[300] = "";
        if(!same(buf, m, JSON_REJECT_DUPLICATES, why, sizeof why)) {
            char what[200];
            snprintf(what, sizeof what, "%s, mutation %d", name, k);
            ok(0, what, why);
        }
    }
    free(buf);
}

int main(int argc, char **argv)
{
    check_section = "edge cases";
    static const char *const cases[] = {
        "{\"a\":1,\"a\":2}", "{\"a\":{\"b\":[1,{\"b\":2,\"b\":3}]}}", "{\"s\":\"\\u0000\"}", "{\"\\u0000\":1}",
        "{\"s\":\"\\ud800x\"}", "{\"s\":\"\\udc00\"}", "{\"s\":\"\\ud83d\\ude00\"}", "{\"s\":\"\\u00e9\\u003c\"}",
        "[9223372036854775807,-9223372036854775808]", "[9223372036854775808]", "[-9223372036854775809]",
        "[1e400]", "[-1e400]", "[1e-400]", "[1E2,1e+2,1.0,-0,-0.0,0.5e-3]", "[01]", "[1.]", "[.5]", "[+1]",
        "{\"k\":\"\xed\xa0\x80\"}", "{\"k\":\"\xc0\xaf\"}", "{\"k\":\"\xf4\x90\x80\x80\"}", "{\"k\":\"\xe2\x82\"}",
        "{\"k\":\"a\tb\"}", "{\"k\":\"a\x01\"}", "{\"a\":1} x", "{\"a\":1}{}", "", " ", "1", "\"x\"", "null",
        "true", "[]", "{}", "[[[[]]]]", "{\"a\":}", "{\"a\" 1}", "{,}", "[1,]", "{\"a\":1,}", "/* c */{}",
        "{\"z\":1,\"a\":2,\"m\":{\"y\":[],\"b\":null}}", "{\"\":\"\"}", "[\"\\/\",\"\\b\\f\\n\\r\\t\"]",
        "[\"\\x\"]", "[\"\\u12\"]", "[\"\\uZZZZ\"]", "[\"\\\\u0000\"]", "\xef\xbb\xbf{}", "[1e999999999999]",
        "[123456789012345678901234567890]", "[-]", "[tru]", "[nul]", "{\"a\":[1,2,3],\"b\":{\"c\":\"d\"}}",
        /* a string cut by the end after a complete value (fuzz_jsonload found it) */
        "{}\"x", " 0\".0e-400", "{}\"x}", "{}\"x\\\"", "{\"a\":\"b\\\\\"}", "[1]\"",
        /* whitespace JSON does not have (fuzz_jsonload found it) */
        "{\"a\":1,\v\"b\":2}", "[\f1]", "\v{}",
    };
    for(size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        both_flags(cases[i][0] ? cases[i] : "(empty)", cases[i], strlen(cases[i]));
    /* raw NUL bytes inside and outside a string */
    both_flags("a NUL byte in a string", "{\"a\":\"x\0y\"}", 11);
    both_flags("a NUL byte after the value", "{}\0", 3);
    /* nesting around jansson's limit and the fast path's */
    static const size_t depths[] = {1023, 1024, 1025, 2047, 2048, 2049, 3000};
    for(size_t d = 0; d < sizeof depths / sizeof *depths; d++) {
        size_t n = depths[d];
        char *deep = malloc(2 * n + 1);
        memset(deep, '[', n);
        memset(deep + n, ']', n);
        deep[2 * n] = 0;
        char what[64];
        snprintf(what, sizeof what, "%zu nested arrays", n);
        both_flags(what, deep, 2 * n);
        free(deep);
    }
    check_section = "files and their mutations";
    for(int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if(!f) {
            ok(0, argv[i], "cannot read");
            continue;
        }
        char *text = malloc(1 << 20);
        size_t len = fread(text, 1, 1 << 20, f);
        fclose(f);
        both_flags(argv[i], text, len);
        mutate(argv[i], text, len, 300);
        free(text);
    }
    printf("compared %lu inputs with json_loadb, %lu accepted by both\n", compared, accepted);
    return check_finish();
}
