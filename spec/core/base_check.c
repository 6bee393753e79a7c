/* base_check — table-driven checks for the base helpers written once:
 * core/base/b64.c, utf8.c, buf.c, file.c and log.c.
 *
 * Expected values come from the rules, not from the code's output:
 *   - base64: RFC 4648 §10 test vectors, and Go's encoding/base64
 *     StdEncoding.DecodeString (CR and LF skipped anywhere, padding
 *     required, nothing after the padding, trailing bits may be non-zero);
 *   - UTF-8: RFC 3629 §3-4 (no overlong forms, no surrogates, nothing past
 *     U+10FFFF) and Go's json.Marshal, which writes each byte that does not
 *     start a valid sequence as U+FFFD (utf8.DecodeRune's width 1);
 *   - buffers, file reads and listings: the contracts in buf.h and file.h;
 *   - log records (log.c): a LOG_NUM key's value is a JSON number by RFC
 *     8259 §6 grammar in JSON lines, a string when it is not one (never a
 *     line that is not JSON), and text lines are as without the mark.
 *
 * Usage: base_check   Prints "N passed, N failed" and exits 1 on any failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "base/b64.h"
#include "base/buf.h"
#include "base/cpus.h"
#include "base/file.h"
#include "base/log.h"
#include "base/utf8.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

/* A printable form of n bytes, for messages. */
static const char *show(const void *p, size_t n)
{
    static char out[4][256];
    static int k;
    char *o = out[k++ % 4];
    size_t j = 0;
    const unsigned char *s = p;
    for(size_t i = 0; s && i < n && j + 5 < sizeof out[0]; i++)
        j += (size_t)snprintf(o + j, sizeof out[0] - j, s[i] >= 0x20 && s[i] < 0x7f ? "%c" : "\\x%02x", s[i]);
    o[j] = 0;
    return s ? o : "(null)";
}

/* ------------------------------------------------------------ base64 */

struct b64_case {
    const char *text;  /* base64 */
    const char *bytes; /* decoded, NULL: invalid */
    size_t n;          /* length of bytes */
};

/* RFC 4648 §10: both ways */
static const struct b64_case rfc4648[] = {
    {"", "", 0},         {"Zg==", "f", 1},       {"Zm8=", "fo", 2},         {"Zm9v", "foo", 3},
    {"Zm9vYg==", "foob", 4}, {"Zm9vYmE=", "fooba", 5}, {"Zm9vYmFy", "foobar", 6},
    {"AP8=", "\x00\xff", 2}, {"+/8=", "\xfb\xff", 2},
};

/* Go's base64.StdEncoding.DecodeString: decode only */
static const struct b64_case go_std[] = {
    {"Zm9v\r\nYmFy\r\n", "foobar", 6}, /* CR and LF skipped */
    {"\nZ\rg=\n=\n", "f", 1},          /* ... anywhere, padding included */
    {"Zh==", "f", 1},                  /* trailing bits need not be zero (not Strict) */
    {"Zg", NULL, 0},                   /* missing padding */
    {"Zg=", NULL, 0},
    {"Zm8", NULL, 0},
    {"Z", NULL, 0},
    {"Zg==Zg==", NULL, 0}, /* '=' in the middle */
    {"Z=g=", NULL, 0},
    {"Zm=v", NULL, 0},
    {"=", NULL, 0},
    {"====", NULL, 0},
    {"Z===", NULL, 0},
    {"Zm9v YmFy", NULL, 0}, /* a space is not skipped */
    {"Zm9v\tYmFy", NULL, 0},
    {"Zm9v!", NULL, 0},
    {"Zm9v-_8=", NULL, 0}, /* URL alphabet */
};

static void check_decode(const struct b64_case *c, const char *set)
{
    char what[128];
    snprintf(what, sizeof what, "%s decode \"%s\"", set, show(c->text, strlen(c->text)));
    unsigned char *out = (unsigned char *)"untouched";
    size_t n = 12345;
    int rc = cozy_base64_decode(c->text, strlen(c->text), &out, &n);
    if(!c->bytes) {
        ok(rc == -1 && n == 12345 && strcmp((char *)out, "untouched") == 0, what, "want -1, outputs untouched");
        if(rc == 0)
            free(out);
        return;
    }
    char detail[300];
    snprintf(detail, sizeof detail, "rc %d, got \"%s\", want \"%s\"", rc, rc == 0 ? show(out, n) : "",
             show(c->bytes, c->n));
    ok(rc == 0 && n == c->n && memcmp(out, c->bytes, n) == 0 && out[n] == 0, what, detail);
    if(rc == 0)
        free(out);
}

static void check_base64(void)
{
    for(size_t i = 0; i < sizeof rfc4648 / sizeof *rfc4648; i++) {
        const struct b64_case *c = &rfc4648[i];
        char what[128];
        snprintf(what, sizeof what, "RFC 4648 encode \"%s\"", show(c->bytes, c->n));
        char *e = cozy_base64_encode(c->bytes, c->n);
        char detail[300];
        snprintf(detail, sizeof detail, "got \"%s\", want \"%s\"", e ? e : "(null)", c->text);
        ok(e && strcmp(e, c->text) == 0, what, detail);
        free(e);
        check_decode(c, "RFC 4648");
    }
    for(size_t i = 0; i < sizeof go_std / sizeof *go_std; i++)
        check_decode(&go_std[i], "Go StdEncoding");
    /* a length that is not NUL-terminated: only n characters count */
    unsigned char *out = NULL;
    size_t n = 0;
    int rc = cozy_base64_decode("Zm9vYmFy", 4, &out, &n);
    ok(rc == 0 && n == 3 && memcmp(out, "foo", 3) == 0, "decode reads n characters only", NULL);
    if(rc == 0)
        free(out);
}

/* ------------------------------------------------------------ UTF-8 */

struct seq_case {
    const char *name;
    const char *s;
    size_t n;
    size_t want; /* cozy_utf8_seq */
};

static const struct seq_case seq_cases[] = {
    {"ASCII", "a", 1, 1},
    {"NUL is one byte", "\0", 1, 1},
    {"U+0080", "\xc2\x80", 2, 2},
    {"U+00A9", "\xc2\xa9", 2, 2},
    {"U+07FF", "\xdf\xbf", 2, 2},
    {"U+0800", "\xe0\xa0\x80", 3, 3},
    {"U+20AC", "\xe2\x82\xac", 3, 3},
    {"U+D7FF", "\xed\x9f\xbf", 3, 3},
    {"U+E000", "\xee\x80\x80", 3, 3},
    {"U+FFFD", "\xef\xbf\xbd", 3, 3},
    {"U+10000", "\xf0\x90\x80\x80", 4, 4},
    {"U+1F600", "\xf0\x9f\x98\x80", 4, 4},
    {"U+10FFFF", "\xf4\x8f\xbf\xbf", 4, 4},
    {"only the first sequence", "\xc3\xa9z", 3, 2},
    {"overlong '/' in 2", "\xc0\xaf", 2, 0},
    {"overlong U+007F in 2", "\xc1\xbf", 2, 0},
    {"overlong '/' in 3", "\xe0\x80\xaf", 3, 0},
    {"overlong U+07FF in 3", "\xe0\x9f\xbf", 3, 0},
    {"overlong '/' in 4", "\xf0\x80\x80\xaf", 4, 0},
    {"overlong U+FFFF in 4", "\xf0\x8f\xbf\xbf", 4, 0},
    {"surrogate U+D800", "\xed\xa0\x80", 3, 0},
    {"surrogate U+DFFF", "\xed\xbf\xbf", 3, 0},
    {"U+110000", "\xf4\x90\x80\x80", 4, 0},
    {"lead F5", "\xf5\x80\x80\x80", 4, 0},
    {"lead FF", "\xff", 1, 0},
    {"stray continuation", "\x80", 1, 0},
    {"truncated 2 of 3", "\xe2\x82", 2, 0},
    {"truncated 3 of 4", "\xf0\x9f\x98", 3, 0},
    {"truncated by n", "\xe2\x82\xac", 2, 0},
    {"continuation missing", "\xe2\x41\xac", 3, 0},
};

struct san_case {
    const char *name;
    const char *in;
    size_t n;
    int keep_nul;
    const char *want;
    size_t wn;
};

#define FFFD "\xef\xbf\xbd"
static const struct san_case san_cases[] = {
    {"valid text unchanged", "h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 12, 0, "h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 12},
    {"invalid byte", "a\xff" "b", 3, 1, "a" FFFD "b", 5},
    {"truncated: one U+FFFD per byte", "\xe2\x82", 2, 1, FFFD FFFD, 6},
    {"surrogate: one U+FFFD per byte", "\xed\xa0\x80", 3, 1, FFFD FFFD FFFD, 9},
    {"overlong: one U+FFFD per byte", "\xc0\xaf", 2, 1, FFFD FFFD, 6},
    {"past U+10FFFF", "\xf4\x90\x80\x80", 4, 1, FFFD FFFD FFFD FFFD, 12},
    {"NUL kept", "a\0b", 3, 1, "a\0b", 3},
    {"NUL replaced", "a\0b", 3, 0, "a" FFFD "b", 5},
    {"empty", "", 0, 0, "", 0},
};

static void check_utf8(void)
{
    for(size_t i = 0; i < sizeof seq_cases / sizeof *seq_cases; i++) {
        const struct seq_case *c = &seq_cases[i];
        char what[128], detail[64];
        size_t got = cozy_utf8_seq((const unsigned char *)c->s, c->n);
        snprintf(what, sizeof what, "utf8_seq %s", c->name);
        snprintf(detail, sizeof detail, "got %zu, want %zu", got, c->want);
        ok(got == c->want, what, detail);
        /* a buffer that is one whole sequence is valid exactly when it is one */
        if(c->want == c->n) {
            snprintf(what, sizeof what, "utf8_valid %s", c->name);
            ok(cozy_utf8_valid(c->s, c->n) == 1, what, NULL);
        } else if(c->want == 0) {
            snprintf(what, sizeof what, "utf8_valid refuses %s", c->name);
            ok(cozy_utf8_valid(c->s, c->n) == 0, what, NULL);
        }
    }
    ok(cozy_utf8_valid("", 0) == 1, "utf8_valid empty", NULL);
    ok(cozy_utf8_valid("a\0b", 3) == 1, "utf8_valid NUL inside", NULL);
    ok(cozy_utf8_valid("ok \xc3", 4) == 0, "utf8_valid truncated at the end", NULL);
    for(size_t i = 0; i < sizeof san_cases / sizeof *san_cases; i++) {
        const struct san_case *c = &san_cases[i];
        char what[128], detail[300];
        size_t n = 99;
        char *got = cozy_utf8_sanitize(c->in, c->n, c->keep_nul, &n);
        snprintf(what, sizeof what, "utf8_sanitize %s", c->name);
        snprintf(detail, sizeof detail, "got \"%s\", want \"%s\"", got ? show(got, n) : "(null)", show(c->want, c->wn));
        ok(got && n == c->wn && memcmp(got, c->want, n) == 0 && got[n] == 0, what, detail);
        free(got);
    }
}

/* ------------------------------------------------------------ buffers */

static void check_buf(void)
{
    cozy_buf b = {.max = 8};
    ok(cozy_buf_add(&b, "", 0) == 0 && b.p && b.p[0] == 0 && b.len == 0, "buf: adding nothing gives \"\"", NULL);
    ok(cozy_buf_add(&b, "1234567", 7) == 0 && b.len == 7, "buf: below the ceiling", NULL);
    ok(cozy_buf_add(&b, "89", 2) == EFBIG, "buf: one byte past the ceiling is EFBIG", NULL);
    ok(b.len == 7 && strcmp(b.p, "1234567") == 0, "buf: nothing appended on EFBIG", show(b.p, b.len));
    ok(cozy_buf_add(&b, "8", 1) == 0 && b.len == 8 && strcmp(b.p, "12345678") == 0, "buf: exactly the ceiling",
       show(b.p, b.len));
    ok(cozy_buf_add(&b, "9", 1) == EFBIG && b.len == 8 && b.p[8] == 0, "buf: full, one more byte is EFBIG", NULL);
    ok(cozy_buf_add(&b, "", 0) == 0 && b.len == 8, "buf: full, nothing more is fine", NULL);
    ok(cozy_buf_add(&b, "x", SIZE_MAX) == EFBIG && b.len == 8, "buf: a huge add is EFBIG, not an overflow", NULL);
    cozy_buf_free(&b);
    ok(!b.p && b.len == 0 && b.cap == 0 && b.max == 8, "buf: free keeps max", NULL);

    b = (cozy_buf){.max = 4};
    ok(cozy_buf_printf(&b, "%d", 12345) == EFBIG && b.len == 0, "buf: printf past the ceiling is EFBIG", NULL);
    ok(cozy_buf_printf(&b, "%s-%d", "a", 7) == 0 && b.len == 3 && strcmp(b.p, "a-7") == 0, "buf: printf",
       show(b.p, b.len));
    ok(cozy_buf_printf(&b, "%s", "xy") == EFBIG && b.len == 3 && strcmp(b.p, "a-7") == 0,
       "buf: printf nothing appended on EFBIG", show(b.p, b.len));
    ok(cozy_buf_printf(&b, "%c", 'z') == 0 && strcmp(b.p, "a-7z") == 0, "buf: printf exactly the ceiling", NULL);
    cozy_buf_free(&b);

    b = (cozy_buf){0}; /* no ceiling */
    char block[1000];
    memset(block, 'q', sizeof block);
    int rc = 0;
    for(int i = 0; i < 300 && rc == 0; i++)
        rc = cozy_buf_add(&b, block, sizeof block);
    ok(rc == 0 && b.len == 300000 && b.p[299999] == 'q' && b.p[300000] == 0 && b.cap > b.len,
       "buf: max 0 is no ceiling", NULL);
    cozy_buf_free(&b);

    /* cozy_grow */
    size_t cap = 0;
    int *a = cozy_grow(NULL, &cap, 1, sizeof *a);
    ok(a && cap == 16, "grow: from 16", NULL);
    for(int i = 0; a && i < 16; i++)
        a[i] = i;
    int *a2 = cozy_grow(a, &cap, 16, sizeof *a);
    ok(a2 == a && cap == 16, "grow: no move when it fits", NULL);
    a2 = cozy_grow(a, &cap, 17, sizeof *a);
    ok(a2 && cap == 32 && a2[15] == 15, "grow: doubles and keeps the elements", NULL);
    a = a2 ? a2 : a;
    a2 = cozy_grow(a, &cap, 100, sizeof *a);
    ok(a2 && cap == 128, "grow: doubles until it holds need", NULL);
    a = a2 ? a2 : a;
    size_t before = cap;
    a2 = cozy_grow(a, &cap, SIZE_MAX / 2 + 2, 1);
    ok(!a2 && cap == before, "grow: count overflow is NULL, cap untouched", NULL);
    a2 = cozy_grow(a, &cap, SIZE_MAX / 8 + 1, 16);
    ok(!a2 && cap == before && a[15] == 15, "grow: need * elem overflow is NULL, array kept", NULL);
    free(a);
    cap = 0;
    void *z = cozy_grow(NULL, &cap, 0, 8);
    ok(z != NULL && cap == 16, "grow: a NULL array is allocated even for 0 (NULL means failure)", NULL);
    free(z);
}

/* ------------------------------------------------------------ files */

static char dir[4096];

static void write_file(const char *name, size_t n, char fill)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    for(size_t i = 0; f && i < n; i++)
        fputc(fill, f);
    if(f)
        fclose(f);
}

static void check_read(const char *name, size_t max, int want_rc, size_t want_len)
{
    char path[4200], what[256], detail[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *out = (char *)"untouched";
    size_t len = 777;
    int rc = cozy_read_file(path, max, &out, &len);
    snprintf(what, sizeof what, "read_file %s max %zu", name, max);
    snprintf(detail, sizeof detail, "rc %d (%s), len %zu; want rc %d, len %zu", rc, strerror(rc), len, want_rc,
             want_len);
    if(want_rc == 0) {
        int same = rc == 0 && len == want_len && out[len] == 0;
        for(size_t i = 0; same && i < len; i++)
            same = out[i] == name[0];
        ok(same, what, detail);
        if(rc == 0)
            free(out);
    } else {
        ok(rc == want_rc && len == 777 && strcmp(out, "untouched") == 0, what, detail);
        if(rc == 0)
            free(out);
    }
}

static int keep_manifest(const char *name, void *ctx)
{
    ++*(int *)ctx;
    size_t n = strlen(name);
    return (n > 5 && strcmp(name + n - 5, ".yaml") == 0) || (n > 5 && strcmp(name + n - 5, ".json") == 0);
}

static void check_list(const char *path, int (*keep)(const char *, void *), void *ctx, const char *const *want,
                       size_t wn, const char *what)
{
    char **names = NULL;
    size_t n = 0;
    int rc = cozy_list_dir(path, keep, ctx, &names, &n);
    char detail[512] = "";
    size_t k = 0;
    for(size_t i = 0; rc == 0 && i < n && k + 40 < sizeof detail; i++)
        k += (size_t)snprintf(detail + k, sizeof detail - k, "%s\"%s\"", i ? ", " : "", show(names[i], strlen(names[i])));
    int same = rc == 0 && n == wn;
    for(size_t i = 0; same && i < n; i++)
        same = strcmp(names[i], want[i]) == 0;
    ok(same, what, detail);
    if(rc == 0)
        cozy_free_names(names, n);
}

static void check_files(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/base_check.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if(!mkdtemp(dir)) {
        ok(0, "mkdtemp", strerror(errno));
        return;
    }
    write_file("e", 0, 'e');
    write_file("t", 10, 't');
    write_file("c", 65536, 'c');     /* exactly one read chunk */
    write_file("d", 65537, 'd');     /* one byte more */
    write_file("b", 200000, 'b');    /* several chunks */
    check_read("t", 10, 0, 10);      /* exactly max */
    check_read("t", 11, 0, 10);
    check_read("t", 9, EFBIG, 0);    /* max + 1 */
    check_read("e", 0, 0, 0);        /* empty, max 0 */
    check_read("e", 10, 0, 0);
    check_read("t", 0, EFBIG, 0);    /* max 0: only an empty file */
    check_read("c", 65536, 0, 65536);
    check_read("c", 65535, EFBIG, 0);
    check_read("d", 65536, EFBIG, 0);
    check_read("d", 65537, 0, 65537);
    check_read("b", 200000, 0, 200000);
    check_read("b", 199999, EFBIG, 0);
    check_read("b", SIZE_MAX, 0, 200000);
    check_read("missing", 10, ENOENT, 0);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    mkdir(sub, 0700);
    check_read("sub", 10, EISDIR, 0);

    /* a stream */
    FILE *f = fmemopen((void *)"abc", 3, "rb");
    char *out = NULL;
    size_t len = 0;
    int rc = cozy_read_stream(f, 3, &out, &len);
    ok(rc == 0 && len == 3 && strcmp(out, "abc") == 0, "read_stream exactly max", NULL);
    if(rc == 0)
        free(out);
    fclose(f);
    f = fmemopen((void *)"abc", 3, "rb");
    out = (char *)"untouched";
    rc = cozy_read_stream(f, 2, &out, &len);
    ok(rc == EFBIG && strcmp(out, "untouched") == 0, "read_stream max + 1", NULL);
    fclose(f);

    /* listings: byte order (strcmp), "." and ".." never, hidden names kept
       unless the filter drops them */
    snprintf(sub, sizeof sub, "%s/list", dir);
    mkdir(sub, 0700);
    const char *names[] = {"b.yaml", "a.json", "C", ".hidden", "a", "ab", "\xc3\xa9.yaml", "Z.json", "a.yml"};
    char path[4300];
    for(size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s", sub, names[i]);
        FILE *w = fopen(path, "w");
        if(w)
            fclose(w);
    }
    snprintf(path, sizeof path, "%s/a.d", sub);
    mkdir(path, 0700);
    static const char *const all[] = {".hidden", "C", "Z.json", "a", "a.d", "a.json", "a.yml", "ab", "b.yaml",
                                      "\xc3\xa9.yaml"};
    check_list(sub, NULL, NULL, all, sizeof all / sizeof *all, "list_dir: all, in byte order");
    int calls = 0;
    static const char *const manifests[] = {"Z.json", "a.json", "b.yaml", "\xc3\xa9.yaml"};
    check_list(sub, keep_manifest, &calls, manifests, sizeof manifests / sizeof *manifests,
               "list_dir: filtered, in byte order");
    ok(calls == 10, "list_dir: the filter sees every entry but . and .. once, with its ctx", NULL);
    snprintf(path, sizeof path, "%s/a.d", sub);
    check_list(path, NULL, NULL, NULL, 0, "list_dir: an empty directory");
    char **none = (char **)"untouched";
    size_t nn = 5;
    snprintf(path, sizeof path, "%s/missing", dir);
    ok(cozy_list_dir(path, NULL, NULL, &none, &nn) == ENOENT && nn == 5, "list_dir: ENOENT", NULL);
    snprintf(path, sizeof path, "%s/t", dir);
    ok(cozy_list_dir(path, NULL, NULL, &none, &nn) == ENOTDIR && nn == 5, "list_dir: ENOTDIR", NULL);

    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if(system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
}

/* Runs fn with stderr sent to a scratch file; returns what it wrote (static). */
static const char *stderr_of(void (*fn)(void))
{
    static char out[8192];
    out[0] = '\0';
    char path[] = "/tmp/cozygpu-log-check.XXXXXX";
    int fd = mkstemp(path);
    if(fd < 0)
        return out;
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, out, sizeof out - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return out;
}

static void log_numbers(void)
{
    log_write(LOG_INFO, "check", "numbers", LOG_NUM "port", "8443", LOG_NUM "neg", "-12", LOG_NUM "frac", "0.25",
              LOG_NUM "exp", "1e-3", LOG_NUM "zero", "0", "name", "42", NULL);
}

static void log_not_numbers(void)
{
    /* marked, but not numbers by RFC 8259: written as strings */
    log_write(LOG_INFO, "check", "not numbers", LOG_NUM "lead", "007", LOG_NUM "plus", "+1", LOG_NUM "dot", "1.",
              LOG_NUM "hex", "0x10", LOG_NUM "inf", "inf", LOG_NUM "empty", "", LOG_NUM "space", " 1",
              LOG_NUM "none", NULL, NULL);
}

static void check_log(void)
{
    check_section = "log";
    log_setup(1, LOG_INFO);
    const char *got = stderr_of(log_numbers);
    const char *want = ",\"component\":\"check\",\"msg\":\"numbers\",\"port\":8443,\"neg\":-12,\"frac\":0.25,"
                       "\"exp\":1e-3,\"zero\":0,\"name\":\"42\"}\n";
    ok(strlen(got) > strlen(want) && strcmp(got + strlen(got) - strlen(want), want) == 0,
       "JSON: LOG_NUM values are bare numbers, an unmarked one a string", got);
    got = stderr_of(log_not_numbers);
    want = "\"lead\":\"007\",\"plus\":\"+1\",\"dot\":\"1.\",\"hex\":\"0x10\",\"inf\":\"inf\",\"empty\":\"\","
           "\"space\":\" 1\",\"none\":null}\n";
    ok(strstr(got, want) != NULL, "JSON: a marked value that is not a number stays a string", got);
    ok(strchr(got, 0x1f) == NULL, "JSON: the mark is not written", got);
    log_setup(0, LOG_INFO);
    got = stderr_of(log_numbers);
    want = " INFO  check: numbers port=8443 neg=-12 frac=0.25 exp=1e-3 zero=0 name=42\n";
    ok(strlen(got) > strlen(want) && strcmp(got + strlen(got) - strlen(want), want) == 0,
       "text: as without the mark", got);
    got = stderr_of(log_not_numbers);
    ok(strstr(got, "lead=007 plus=+1 dot=1. hex=0x10 inf=inf empty=\"\" space=\" 1\" none=-\n") != NULL,
       "text: marked non-numbers as any value", got);
    ok(strchr(got, 0x1f) == NULL, "text: the mark is not written", got);
    check_section = NULL;
}

/* base/cpus.h: cgroup v2 cpu.max ("QUOTA PERIOD" or "max PERIOD", Linux
 * cgroup-v2.rst) rounded up to whole CPUs, and the count it lowers */
static void write_cpu_max(const char *dir, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    FILE *f = fopen(path, "w");
    if(f) {
        fputs(text, f);
        fclose(f);
    }
}

static void check_cpus(void)
{
    check_section = "cpus";
    ok(cozy_cpus_of_quota("150000 100000\n") == 2, "1.5 CPUs of quota (a 1500m limit) round up to 2", NULL);
    ok(cozy_cpus_of_quota("100000 100000") == 1, "a 1000m limit is 1", NULL);
    ok(cozy_cpus_of_quota("50000 100000") == 1, "half a CPU is 1", NULL);
    ok(cozy_cpus_of_quota("400000 100000") == 4, "a 4000m limit is 4", NULL);
    ok(cozy_cpus_of_quota("max 100000\n") == 0, "max: no quota", NULL);
    ok(cozy_cpus_of_quota("") == 0 && cozy_cpus_of_quota("x y") == 0 && cozy_cpus_of_quota("100000") == 0 &&
           cozy_cpus_of_quota("-5 100000") == 0 && cozy_cpus_of_quota("5 0") == 0,
       "text that is not a quota: none", NULL);
    char dir[] = "/tmp/cozygpu-cpus-XXXXXX";
    if(!mkdtemp(dir)) {
        ok(0, "mkdtemp", strerror(errno));
        return;
    }
    int none = cozy_cpus_available(dir); /* no cpu.max: the affinity mask */
    ok(none >= 1, "with no cpu.max, the affinity mask's count, at least 1", NULL);
    write_cpu_max(dir, "100000 100000\n");
    ok(cozy_cpus_available(dir) == 1, "a 1000m limit lowers it to 1", NULL);
    write_cpu_max(dir, "max 100000\n");
    ok(cozy_cpus_available(dir) == none, "max leaves it", NULL);
    write_cpu_max(dir, "100000000 100000\n");
    ok(cozy_cpus_available(dir) == none, "a quota above the mask does not raise it", NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    unlink(path);
    rmdir(dir);
    check_section = NULL;
}

int main(void)
{
    check_cpus();
    check_base64();
    check_utf8();
    check_buf();
    check_files();
    check_log();
    return check_finish();
}
