/* yamlload — YAML manifests to jansson values, read the way kubectl reads them.
 * The rules and their sources are in yamlload.h and
 * docs/decisions/0002-yaml-scalars.md; the comments here name the Go code
 * each piece reproduces. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "format/yamlload.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#define TAG_PREFIX "tag:yaml.org,2002:"
#define TAG_PREFIX_LEN (sizeof(TAG_PREFIX) - 1)
#define SNIPPET_MAX 64 /* how much of a scalar an error message quotes */

/* ---------------------------------------------------------------- errors */

typedef struct loader loader;

static void set_error(yamlload_error *err, unsigned long line, unsigned long column,
                      const char *fmt, va_list ap)
{
    if (!err)
        return;
    err->line = line;
    err->column = column;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
}

static void start_error(yamlload_error *err, const char *filename)
{
    if (!err)
        return;
    memset(err, 0, sizeof *err);
    snprintf(err->file, sizeof err->file, "%s", filename ? filename : "");
}

/* ---------------------------------------------------------------- scalars */

typedef enum { SC_NULL, SC_BOOL, SC_INT, SC_FLOAT, SC_STR } sc_kind;

/* A resolved scalar, before it becomes a json value or a key string: the
   Go type go-yaml v2 would have produced matters for keys (a float key is
   printed as float32, an int key in decimal). */
typedef struct scalar {
    sc_kind kind;
    int b;
    long long i;
    double f;
    int from_uint64; /* SC_FLOAT: go-yaml v2 had a uint64 (kubectl: float64) */
    char *s; /* SC_STR: owned, NUL-terminated, may contain NUL */
    size_t slen;
} scalar;

static void scalar_free(scalar *sc)
{
    free(sc->s);
    sc->s = NULL;
}

static int scalar_copy(scalar *dst, const scalar *src)
{
    *dst = *src;
    dst->s = NULL;
    if (src->kind != SC_STR)
        return 0;
    dst->s = malloc(src->slen + 1);
    if (!dst->s)
        return -1;
    memcpy(dst->s, src->s, src->slen + 1);
    return 0;
}

static int set_str(scalar *sc, const char *s, size_t n)
{
    sc->kind = SC_STR;
    sc->s = malloc(n + 1);
    if (!sc->s)
        return -1;
    memcpy(sc->s, s, n);
    sc->s[n] = '\0';
    sc->slen = n;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Go strconv.ParseUint(s, 0, 64) on text without underscores and sign:
   0x, 0o, 0b (either case) or a leading 0 (octal), else decimal.  Returns 0
   with *out set, 1 when s is not integer syntax, 2 when it is but does not
   fit 64 bits. */
static int go_parse_uint(const char *s, size_t n, uint64_t *out)
{
    size_t i = 0;
    unsigned base = 10;
    uint64_t v = 0;
    int overflow = 0;

    if (n == 0)
        return 1;
    if (s[i] == '0') {
        char p = (char)(s[i + 1 < n ? i + 1 : i] | 0x20);
        if (n - i >= 3 && p == 'b') {
            base = 2;
            i += 2;
        } else if (n - i >= 3 && p == 'o') {
            base = 8;
            i += 2;
        } else if (n - i >= 3 && p == 'x') {
            base = 16;
            i += 2;
        } else {
            base = 8;
            i += 1;
        }
    }
    for (; i < n; i++) {
        char c = s[i];
        unsigned d;
        if (is_digit(c))
            d = (unsigned)(c - '0');
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
            d = (unsigned)((c | 0x20) - 'a' + 10);
        else
            return 1;
        if (d >= base)
            return 1;
        if (!overflow) {
            if (v > (UINT64_MAX - d) / base)
                overflow = 1;
            else
                v = v * base + d;
        }
    }
    if (overflow)
        return 2;
    *out = v;
    return 0;
}

/* Go strconv.ParseInt(s, 0, 64): an optional sign, then go_parse_uint.
   Returns 0 with *out set, 1 when s is not integer syntax, 2 when it is but
   does not fit int64. */
static int go_parse_int(const char *s, size_t n, long long *out)
{
    int neg = 0, rc;
    uint64_t v;

    if (n > 0 && (s[0] == '+' || s[0] == '-')) {
        neg = s[0] == '-';
        s++;
        n--;
    }
    if (n > 0 && (s[0] == '+' || s[0] == '-'))
        return 1;
    rc = go_parse_uint(s, n, &v);
    if (rc)
        return rc;
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return 2;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(long long)v;
    } else {
        if (v > (uint64_t)INT64_MAX)
            return 2;
        *out = (long long)v;
    }
    return 0;
}

/* go-yaml v2 resolve.go yamlStyleFloat:
   ^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$ */
static int yaml_style_float(const char *s, size_t n)
{
    size_t i = 0, st;
    if (i < n && (s[i] == '+' || s[i] == '-'))
        i++;
    if (i < n && s[i] == '.') {
        st = ++i;
        while (i < n && is_digit(s[i]))
            i++;
        if (i == st)
            return 0;
    } else {
        st = i;
        while (i < n && is_digit(s[i]))
            i++;
        if (i == st)
            return 0;
        if (i < n && s[i] == '.') {
            i++;
            while (i < n && is_digit(s[i]))
                i++;
        }
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        st = i;
        while (i < n && is_digit(s[i]))
            i++;
        if (i == st)
            return 0;
    }
    return i == n;
}

/* strconv.ParseFloat on text already checked to be decimal float syntax
   (NUL-terminated).  Fails, as Go does with ErrRange, when the value
   overflows; underflow gives 0 or a subnormal, as in Go. */
static int parse_float_text(const char *s, double *out)
{
    char *end;
    double f = strtod(s, &end);
    if (*end != '\0' || isinf(f))
        return -1;
    *out = f;
    return 0;
}

/* go-yaml v2 hands text starting with '.' to strconv.ParseFloat unchanged:
   digits after the dot, an optional exponent, and underscores only between
   two digits (Go's underscoreOK).  Returns 0 with *out set, -1 otherwise. */
static int go_float_dot(const char *s, size_t n, double *out)
{
    char *t = malloc(n + 1);
    size_t i, m = 0;
    int rc = -1;
    if (!t)
        return -2;
    for (i = 0; i < n; i++) {
        if (s[i] == '_') {
            if (i == 0 || !is_digit(s[i - 1]) || i + 1 >= n || !is_digit(s[i + 1]))
                goto out;
            continue;
        }
        t[m++] = s[i];
    }
    t[m] = '\0';
    /* ^\.[0-9]+([eE][-+]?[0-9]+)?$ is yaml_style_float minus sign and integer part */
    if (m < 2 || t[0] != '.' || !yaml_style_float(t, m))
        goto out;
    rc = parse_float_text(t, out);
out:
    free(t);
    return rc;
}

/* Go time.Parse for the four layouts go-yaml v2 accepts as !!timestamp
   (resolve.go allowedTimestampFormats):
   "2006-1-2T15:4:5.999999999Z07:00", the same with 't',
   "2006-1-2 15:4:5.999999999" and "2006-1-2". */
static int ts_num(const char **p, const char *e, int *v)
{
    const char *s = *p;
    if (s >= e || !is_digit(*s))
        return -1;
    *v = *s++ - '0';
    if (s < e && is_digit(*s))
        *v = *v * 10 + (*s++ - '0');
    *p = s;
    return 0;
}

static int days_in(int month, int year)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (month == 2 && (year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)))
        return 29;
    return days[month - 1];
}

static int ts_layout(const char *s, size_t n, char sep, int zone, int date_only)
{
    const char *p = s, *e = s + n;
    int year, month, day, hour, min, sec, i;

    if (n < 4)
        return 0;
    for (i = 0; i < 4; i++)
        if (!is_digit(s[i]))
            return 0;
    year = (s[0] - '0') * 1000 + (s[1] - '0') * 100 + (s[2] - '0') * 10 + (s[3] - '0');
    p += 4;
    if (p >= e || *p++ != '-' || ts_num(&p, e, &month) || month < 1 || month > 12)
        return 0;
    if (p >= e || *p++ != '-' || ts_num(&p, e, &day))
        return 0;
    if (!date_only) {
        if (sep == ' ') { /* a layout space matches any run of spaces */
            if (p < e && *p != ' ')
                return 0;
            while (p < e && *p == ' ')
                p++;
        } else if (p >= e || *p++ != sep) {
            return 0;
        }
        if (ts_num(&p, e, &hour) || hour >= 24)
            return 0;
        if (p >= e || *p++ != ':' || ts_num(&p, e, &min) || min >= 60)
            return 0;
        if (p >= e || *p++ != ':' || ts_num(&p, e, &sec) || sec >= 60)
            return 0;
        if (e - p >= 2 && (*p == '.' || *p == ',') && is_digit(p[1])) {
            p++;
            while (p < e && is_digit(*p))
                p++;
        }
        if (zone) {
            if (p < e && *p == 'Z') {
                p++;
            } else {
                int hh, mm;
                if (e - p < 6 || p[3] != ':' || (p[0] != '+' && p[0] != '-'))
                    return 0;
                if (!is_digit(p[1]) || !is_digit(p[2]) || !is_digit(p[4]) || !is_digit(p[5]))
                    return 0;
                hh = (p[1] - '0') * 10 + (p[2] - '0');
                mm = (p[4] - '0') * 10 + (p[5] - '0');
                if (hh > 24 || mm > 60)
                    return 0;
                p += 6;
            }
        }
    }
    if (p != e)
        return 0;
    return day >= 1 && day <= days_in(month, year);
}

static int go_timestamp(const char *s, size_t n)
{
    /* resolve.go parseTimestamp: quick check for YYYY- first */
    size_t i = 0;
    while (i < n && is_digit(s[i]))
        i++;
    if (i != 4 || i == n || s[i] != '-')
        return 0;
    return ts_layout(s, n, 'T', 1, 0) || ts_layout(s, n, 't', 1, 0) ||
           ts_layout(s, n, ' ', 0, 0) || ts_layout(s, n, 0, 0, 1);
}

/* Go base64.StdEncoding.DecodeString: '\r' and '\n' are skipped, padding is
   required, trailing bits need not be zero.  Returns 0 with a malloc'd
   buffer in *out, -1 on bad input, -2 out of memory. */
static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (is_digit(c))
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

static int go_base64(const char *s, size_t n, char **out, size_t *outlen)
{
    char *t = malloc(n + 1), *o = NULL;
    size_t m = 0, i, k = 0, pad = 0;
    int rc = -1;
    if (!t)
        return -2;
    for (i = 0; i < n; i++)
        if (s[i] != '\r' && s[i] != '\n')
            t[m++] = s[i];
    if (m % 4 != 0)
        goto out;
    if (m >= 1 && t[m - 1] == '=')
        pad++;
    if (m >= 2 && t[m - 2] == '=')
        pad++;
    o = malloc(m / 4 * 3 + 1);
    if (!o) {
        rc = -2;
        goto out;
    }
    for (i = 0; i < m; i += 4) {
        int v[4], j, quads = 4;
        if (i + 4 == m)
            quads = 4 - (int)pad;
        for (j = 0; j < 4; j++) {
            v[j] = j < quads ? b64_value(t[i + j]) : 0;
            if (v[j] < 0 || (j >= quads && t[i + j] != '='))
                goto out;
        }
        o[k++] = (char)(v[0] << 2 | v[1] >> 4);
        if (quads > 2)
            o[k++] = (char)((v[1] & 15) << 4 | v[2] >> 2);
        if (quads > 3)
            o[k++] = (char)((v[2] & 3) << 6 | v[3]);
    }
    o[k] = '\0';
    *out = o;
    *outlen = k;
    o = NULL;
    rc = 0;
out:
    free(o);
    free(t);
    return rc;
}

/* Go's json.Marshal writes each byte of invalid UTF-8 as U+FFFD; only
   !!binary can produce such bytes, libyaml rejects invalid input. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return n >= 3 && s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return n >= 4 && s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 &&
                       (s[3] & 0xC0) == 0x80
                   ? 4
                   : 0;
    }
    return 0;
}

static int coerce_utf8(scalar *sc)
{
    const unsigned char *s = (const unsigned char *)sc->s;
    size_t i, k = 0, n = sc->slen;
    char *o = malloc(n * 3 + 1);
    if (!o)
        return -1;
    for (i = 0; i < n;) {
        size_t l = utf8_len(s + i, n - i);
        if (l == 0) {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        } else {
            memcpy(o + k, s + i, l);
            k += l;
            i += l;
        }
    }
    o[k] = '\0';
    free(sc->s);
    sc->s = o;
    sc->slen = k;
    return 0;
}

/* ---------------------------------------------------------------- numbers */

/* Shortest decimal digits that read back as x (x finite, > 0), as Go's
   strconv does.  digits gets them without dot or sign; *dp is the decimal
   point position: x = 0.DIGITS * 10^dp.  Returns the number of digits. */
static int shortest_digits(double x, int as_float32, char *digits, int *dp)
{
    char buf[48];
    int prec, nd = 0, maxprec = as_float32 ? 9 : 17;
    char *e;
    for (prec = 1; prec <= maxprec; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (as_float32 ? strtof(buf, NULL) == (float)x : strtod(buf, NULL) == x)
            break;
    }
    for (e = buf; *e && *e != 'e'; e++)
        if (is_digit(*e))
            digits[nd++] = *e;
    digits[nd] = '\0';
    *dp = atoi(e + 1) + 1;
    return nd;
}

/* Go float32(f): round to nearest, overflow to infinity. */
static float to_float32(double f)
{
    const double lim = 0x1.ffffffp127; /* FLT_MAX plus half an ulp */
    if (f >= lim)
        return INFINITY;
    if (f <= -lim)
        return -INFINITY;
    return (float)f;
}

/* sigs.k8s.io/yaml convertToJSONableObject prints a float key with
   strconv.FormatFloat(f, 'g', -1, 32), then maps +Inf, -Inf, NaN to .inf,
   -.inf, .nan.  With the shortest precision Go's 'g' switches to an exponent
   when it is below -4 or at least 6 (ftoa.go: eprec = 6). */
static void format_float_key(double f, char *out, size_t cap)
{
    float g = to_float32(f);
    char digits[24];
    int nd, dp, exp, i;
    size_t k = 0;

    if (isnan(g)) {
        snprintf(out, cap, ".nan");
        return;
    }
    if (isinf(g)) {
        snprintf(out, cap, g > 0 ? ".inf" : "-.inf");
        return;
    }
    if (g == 0) {
        snprintf(out, cap, signbit(g) ? "-0" : "0");
        return;
    }
    nd = shortest_digits(fabs((double)g), 1, digits, &dp);
    if (signbit(g))
        out[k++] = '-';
    exp = dp - 1;
    if (exp < -4 || exp >= 6) {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (i = 1; i < nd; i++)
                out[k++] = digits[i];
        }
        snprintf(out + k, cap - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        return;
    }
    if (dp <= 0) {
        out[k++] = '0';
    } else {
        for (i = 0; i < dp; i++)
            out[k++] = i < nd ? digits[i] : '0';
    }
    if (nd > dp) {
        out[k++] = '.';
        for (i = dp; i < nd; i++)
            out[k++] = i < 0 ? '0' : digits[i];
    }
    out[k] = '\0';
}

/* The float64 -> JSON -> unstructured path: Go's json.Marshal writes a
   float64 below 1e21 in its shortest digits without exponent (so an
   integral value is digits plus zeros, no dot), and sigs.k8s.io/json makes
   an int64 of any text without '.' that ParseInt accepts.  Returns 1 with
   *out when kubectl would hold an int64, 0 when it would hold a float64. */
static int float_as_int64(double f, long long *out)
{
    char digits[24];
    int nd, dp, i;
    uint64_t v = 0;
    double a = fabs(f);

    if (f == 0) {
        *out = 0; /* "0" or "-0", both int64 0 */
        return 1;
    }
    if (a >= 1e21 || a < 1e-6 || (a < 0x1p52 && a != (double)(long long)a))
        return 0;
    nd = shortest_digits(a, 0, digits, &dp);
    if (dp < nd || dp > 19)
        return 0;
    for (i = 0; i < dp; i++) {
        unsigned d = i < nd ? (unsigned)(digits[i] - '0') : 0;
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    if (f < 0) {
        if (v > (uint64_t)INT64_MAX + 1)
            return 0;
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(long long)v;
    } else {
        if (v > (uint64_t)INT64_MAX)
            return 0;
        *out = (long long)v;
    }
    return 1;
}

/* ---------------------------------------------------------------- loader */

enum { FRAME_SEQ, FRAME_MAP };
enum { ANCHOR_PENDING, ANCHOR_SCALAR, ANCHOR_NODE };

typedef struct frame {
    int kind;
    json_t *value;     /* the array or object being built */
    json_t *seen;      /* FRAME_MAP: explicit key -> line it was first set */
    long anchor;       /* index into loader.anchors, -1 when none */
    unsigned long long weight;
    int have_key;      /* FRAME_MAP: key read, value pending */
    int key_is_merge;
    char *key;         /* owned */
    size_t key_len;
    unsigned long key_line, key_column;
} frame;

typedef struct anchor {
    int kind;
    json_t *value;     /* ANCHOR_NODE */
    scalar sc;         /* ANCHOR_SCALAR */
    unsigned long long weight;
} anchor;

struct loader {
    yamlload_error *err;
    int failed;
    json_t *docs;
    json_t *root;
    frame *stack;
    size_t depth, stack_cap;
    anchor *anchors;
    size_t nanchors, anchors_cap;
    json_t *anchor_index; /* name -> index of its latest definition */
    unsigned long long decode_count, alias_count;
};

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void fail(loader *l, unsigned long line, unsigned long column, const char *fmt, ...)
{
    va_list ap;
    if (l->failed)
        return;
    l->failed = 1;
    va_start(ap, fmt);
    set_error(l->err, line, column, fmt, ap);
    va_end(ap);
}

static void fail_oom(loader *l) { fail(l, 0, 0, "out of memory"); }

static void mark_of(const yaml_mark_t *m, unsigned long *line, unsigned long *column)
{
    *line = (unsigned long)m->line + 1;
    *column = (unsigned long)m->column + 1;
}

static void frame_free(frame *f)
{
    json_decref(f->value);
    json_decref(f->seen);
    free(f->key);
    memset(f, 0, sizeof *f);
}

static void anchors_reset(loader *l)
{
    size_t i;
    for (i = 0; i < l->nanchors; i++) {
        json_decref(l->anchors[i].value);
        scalar_free(&l->anchors[i].sc);
    }
    l->nanchors = 0;
    json_object_clear(l->anchor_index);
}

/* Register an anchor at the start of its node, as go-yaml v2's parser does,
   so an alias inside the node finds it pending.  Returns its index or -1. */
static long anchor_new(loader *l, const char *name)
{
    anchor *a;
    if (l->nanchors == l->anchors_cap) {
        size_t cap = l->anchors_cap ? l->anchors_cap * 2 : 16;
        anchor *n = realloc(l->anchors, cap * sizeof *n);
        if (!n) {
            fail_oom(l);
            return -1;
        }
        l->anchors = n;
        l->anchors_cap = cap;
    }
    a = &l->anchors[l->nanchors];
    memset(a, 0, sizeof *a);
    a->kind = ANCHOR_PENDING;
    if (json_object_set_new(l->anchor_index, name, json_integer((json_int_t)l->nanchors))) {
        fail_oom(l);
        return -1;
    }
    return (long)l->nanchors++;
}

/* go-yaml v2 decode.go: the billion-laughs guard. */
static double allowed_alias_ratio(unsigned long long decodes)
{
    if (decodes <= 400000)
        return 0.99;
    if (decodes >= 4000000)
        return 0.10;
    return 0.99 - 0.89 * ((double)(decodes - 400000) / 3600000.0);
}

static int count_nodes(loader *l, unsigned long long decodes, unsigned long long aliased,
                       const yaml_mark_t *m)
{
    unsigned long line, column;
    l->decode_count += decodes;
    l->alias_count += aliased;
    if (l->alias_count > 100 && l->decode_count > 1000 &&
        (double)l->alias_count / (double)l->decode_count >
            allowed_alias_ratio(l->decode_count)) {
        mark_of(m, &line, &column);
        fail(l, line, column, "document contains excessive aliasing");
        return -1;
    }
    return 0;
}

typedef enum { T_NONE, T_STR, T_BOOL, T_INT, T_FLOAT, T_NULL, T_TIMESTAMP } rtag;

static const char *rtag_name(rtag t)
{
    switch (t) {
    case T_STR: return "!!str";
    case T_BOOL: return "!!bool";
    case T_INT: return "!!int";
    case T_FLOAT: return "!!float";
    case T_NULL: return "!!null";
    case T_TIMESTAMP: return "!!timestamp";
    default: return "";
    }
}

/* go-yaml v2 resolve.go resolve(): the implicit resolution of a plain
   scalar, or the checked resolution of one with an explicit tag t.  Sets
   *out (with *got the tag it resolved to); returns -1 after fail(). */
static int resolve(loader *l, rtag t, const char *v, size_t n, scalar *out, rtag *got)
{
    static const struct {
        const char *text;
        sc_kind kind;
        int b;
        double f;
    } table[] = {
        {"y", SC_BOOL, 1, 0},      {"Y", SC_BOOL, 1, 0},      {"yes", SC_BOOL, 1, 0},
        {"Yes", SC_BOOL, 1, 0},    {"YES", SC_BOOL, 1, 0},    {"true", SC_BOOL, 1, 0},
        {"True", SC_BOOL, 1, 0},   {"TRUE", SC_BOOL, 1, 0},   {"on", SC_BOOL, 1, 0},
        {"On", SC_BOOL, 1, 0},     {"ON", SC_BOOL, 1, 0},     {"n", SC_BOOL, 0, 0},
        {"N", SC_BOOL, 0, 0},      {"no", SC_BOOL, 0, 0},     {"No", SC_BOOL, 0, 0},
        {"NO", SC_BOOL, 0, 0},     {"false", SC_BOOL, 0, 0},  {"False", SC_BOOL, 0, 0},
        {"FALSE", SC_BOOL, 0, 0},  {"off", SC_BOOL, 0, 0},    {"Off", SC_BOOL, 0, 0},
        {"OFF", SC_BOOL, 0, 0},    {"", SC_NULL, 0, 0},       {"~", SC_NULL, 0, 0},
        {"null", SC_NULL, 0, 0},   {"Null", SC_NULL, 0, 0},   {"NULL", SC_NULL, 0, 0},
        {".nan", SC_FLOAT, 0, NAN}, {".NaN", SC_FLOAT, 0, NAN}, {".NAN", SC_FLOAT, 0, NAN},
        {".inf", SC_FLOAT, 0, INFINITY},   {".Inf", SC_FLOAT, 0, INFINITY},
        {".INF", SC_FLOAT, 0, INFINITY},   {"+.inf", SC_FLOAT, 0, INFINITY},
        {"+.Inf", SC_FLOAT, 0, INFINITY},  {"+.INF", SC_FLOAT, 0, INFINITY},
        {"-.inf", SC_FLOAT, 0, -INFINITY}, {"-.Inf", SC_FLOAT, 0, -INFINITY},
        {"-.INF", SC_FLOAT, 0, -INFINITY},
    };
    char hint = 0;
    size_t i;

    memset(out, 0, sizeof *out);
    *got = T_STR;
    if (n == 0) {
        hint = 'N';
    } else {
        char c = v[0];
        if (c == '+' || c == '-')
            hint = 'S';
        else if (is_digit(c))
            hint = 'D';
        else if (c != '\0' && strchr("yYnNtTfFoO~", c))
            hint = 'M';
        else if (c == '.')
            hint = '.';
    }
    if (hint && t != T_STR) {
        for (i = 0; i < sizeof table / sizeof table[0]; i++) {
            if (strlen(table[i].text) == n && memcmp(table[i].text, v, n) == 0) {
                out->kind = table[i].kind;
                out->b = table[i].b;
                out->f = table[i].f;
                *got = out->kind == SC_BOOL ? T_BOOL : out->kind == SC_NULL ? T_NULL : T_FLOAT;
                return 0;
            }
        }
        if (hint == '.') {
            int rc = go_float_dot(v, n, &out->f);
            if (rc == -2) {
                fail_oom(l);
                return -1;
            }
            if (rc == 0) {
                out->kind = SC_FLOAT;
                *got = T_FLOAT;
                return 0;
            }
        } else if (hint == 'D' || hint == 'S') {
            char *plain;
            size_t k = 0;
            int rc;
            /* Only an explicit !!timestamp can tell a timestamp from a
               string here: into interface{} v2 keeps a timestamp as its text
               (decode.go "for backward compatibility"), and a timestamp is
               never int or float syntax. */
            if (t == T_TIMESTAMP && go_timestamp(v, n)) {
                *got = T_TIMESTAMP;
                return set_str(out, v, n) ? (fail_oom(l), -1) : 0;
            }
            plain = malloc(n + 1);
            if (!plain) {
                fail_oom(l);
                return -1;
            }
            for (i = 0; i < n; i++)
                if (v[i] != '_')
                    plain[k++] = v[i];
            plain[k] = '\0';
            rc = go_parse_int(plain, k, &out->i);
            if (rc == 0) {
                free(plain);
                out->kind = SC_INT;
                *got = T_INT;
                return 0;
            }
            if (rc == 2) {
                /* Beyond int64, as kubectl v1.32 reads it.  Unsigned text
                   that fits 64 bits is a uint64 in go-yaml v2, which
                   json.Marshal writes as digits and Kubernetes' JSON
                   decoding reads back as the nearest float64 (core/format/manifest.c
                   widens big JSON integers the same way).  Decimal text
                   beyond that falls to the float rule below, where a leading
                   0 reads as decimal.  Any other spelling (signed, or hex,
                   octal, binary beyond 64 bits) stays a string. */
                uint64_t u;
                if (go_parse_uint(plain, k, &u) == 0) {
                    free(plain);
                    out->kind = SC_FLOAT;
                    out->f = (double)u;
                    out->from_uint64 = 1;
                    *got = T_INT; /* v2's tag is !!int, and !!float refuses it */
                    return 0;
                }
            }
            if (yaml_style_float(plain, k) && parse_float_text(plain, &out->f) == 0) {
                free(plain);
                out->kind = SC_FLOAT;
                *got = T_FLOAT;
                return 0;
            }
            free(plain);
        }
    }
    if (set_str(out, v, n)) {
        fail_oom(l);
        return -1;
    }
    return 0;
}

/* Resolve one scalar event, honouring its tag as go-yaml v2's
   decoder.scalar() does.  Returns -1 after fail(). */
static int resolve_event(loader *l, const yaml_event_t *ev, scalar *out)
{
    const char *v = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    const char *tag = (const char *)ev->data.scalar.tag;
    unsigned long line, column;
    rtag t = T_NONE, got;

    memset(out, 0, sizeof *out);
    if (!tag) {
        /* quoted and block scalars are strings; only plain ones resolve */
        if (!ev->data.scalar.plain_implicit)
            return set_str(out, v, n) ? (fail_oom(l), -1) : 0;
    } else if (strncmp(tag, TAG_PREFIX, TAG_PREFIX_LEN) == 0) {
        const char *name = tag + TAG_PREFIX_LEN;
        if (strcmp(name, "str") == 0)
            t = T_STR;
        else if (strcmp(name, "bool") == 0)
            t = T_BOOL;
        else if (strcmp(name, "int") == 0)
            t = T_INT;
        else if (strcmp(name, "float") == 0)
            t = T_FLOAT;
        else if (strcmp(name, "null") == 0)
            t = T_NULL;
        else if (strcmp(name, "timestamp") == 0)
            t = T_TIMESTAMP;
        else if (strcmp(name, "binary") == 0) {
            int rc = go_base64(v, n, &out->s, &out->slen);
            if (rc == -2) {
                fail_oom(l);
                return -1;
            }
            if (rc) {
                mark_of(&ev->start_mark, &line, &column);
                fail(l, line, column, "!!binary value contains invalid base64 data");
                return -1;
            }
            out->kind = SC_STR;
            if (coerce_utf8(out)) {
                fail_oom(l);
                return -1;
            }
            return 0;
        } else {
            return set_str(out, v, n) ? (fail_oom(l), -1) : 0; /* !!merge, !!seq, ... */
        }
    } else {
        return set_str(out, v, n) ? (fail_oom(l), -1) : 0; /* "!", "!local", other URIs */
    }

    if (resolve(l, t, v, n, out, &got))
        return -1;
    if (t == T_NONE || t == T_STR || t == got)
        return 0;
    if (t == T_FLOAT && got == T_INT && !out->from_uint64) {
        out->kind = SC_FLOAT;
        out->f = (double)out->i;
        return 0;
    }
    scalar_free(out);
    mark_of(&ev->start_mark, &line, &column);
    fail(l, line, column, "cannot decode %s `%.*s` as a %s", rtag_name(got),
         (int)(n < SNIPPET_MAX ? n : SNIPPET_MAX), v, rtag_name(t));
    return -1;
}

static const char *go_float_text(double f)
{
    return isnan(f) ? "NaN" : f > 0 ? "+Inf" : "-Inf";
}

/* A resolved scalar as the value kubectl's unstructured object holds. */
static json_t *scalar_to_json(loader *l, const scalar *sc, const yaml_mark_t *m)
{
    unsigned long line, column;
    long long i;
    json_t *v = NULL;

    switch (sc->kind) {
    case SC_NULL: v = json_null(); break;
    case SC_BOOL: v = json_boolean(sc->b); break;
    case SC_INT: v = json_integer((json_int_t)sc->i); break;
    case SC_FLOAT:
        if (!isfinite(sc->f)) {
            mark_of(m, &line, &column);
            fail(l, line, column,
                 "%s has no JSON form (kubectl fails: json: unsupported value: %s)",
                 isnan(sc->f) ? ".nan" : sc->f > 0 ? ".inf" : "-.inf", go_float_text(sc->f));
            return NULL;
        }
        v = float_as_int64(sc->f, &i) ? json_integer((json_int_t)i) : json_real(sc->f);
        break;
    case SC_STR: v = json_stringn(sc->s, sc->slen); break;
    }
    if (!v)
        fail_oom(l);
    return v;
}

/* A resolved scalar as a mapping key, as sigs.k8s.io/yaml
   convertToJSONableObject makes it.  Sets *key (malloc'd). */
static int scalar_to_key(loader *l, const scalar *sc, const char *text, size_t textlen,
                         const yaml_mark_t *m, char **key, size_t *keylen)
{
    char buf[64];
    const char *s = buf;
    size_t n;
    unsigned long line, column;

    switch (sc->kind) {
    case SC_NULL:
        mark_of(m, &line, &column);
        fail(l, line, column, "unsupported map key: `%.*s` is null",
             (int)(textlen < SNIPPET_MAX ? textlen : SNIPPET_MAX), text);
        return -1;
    case SC_BOOL: s = sc->b ? "true" : "false"; break;
    case SC_INT: snprintf(buf, sizeof buf, "%lld", sc->i); break;
    case SC_FLOAT:
        if (sc->from_uint64) {
            mark_of(m, &line, &column);
            fail(l, line, column, "unsupported map key: `%.*s` is a uint64",
                 (int)(textlen < SNIPPET_MAX ? textlen : SNIPPET_MAX), text);
            return -1;
        }
        format_float_key(sc->f, buf, sizeof buf);
        break;
    case SC_STR: break;
    }
    if (sc->kind == SC_STR) {
        s = sc->s;
        n = sc->slen;
    } else {
        n = strlen(s);
    }
    *key = malloc(n + 1);
    if (!*key) {
        fail_oom(l);
        return -1;
    }
    memcpy(*key, s, n);
    (*key)[n] = '\0';
    *keylen = n;
    return 0;
}

static frame *top(loader *l) { return l->depth ? &l->stack[l->depth - 1] : NULL; }

static int expecting_key(loader *l)
{
    frame *f = top(l);
    return f && f->kind == FRAME_MAP && !f->have_key;
}

/* go-yaml v2 decoder.merge(): a mapping, an alias of a mapping, or a
   sequence node of those; later sources first so earlier ones win; each
   overwrites keys already in the mapping. */
static int merge_into(loader *l, frame *f, json_t *v, int from_alias)
{
    size_t i;
    if (json_is_object(v)) {
        if (json_object_update(f->value, v))
            return fail_oom(l), -1;
        return 0;
    }
    if (json_is_array(v) && !from_alias) {
        for (i = 0; i < json_array_size(v); i++)
            if (!json_is_object(json_array_get(v, i)))
                goto bad;
        for (i = json_array_size(v); i-- > 0;)
            if (json_object_update(f->value, json_array_get(v, i)))
                return fail_oom(l), -1;
        return 0;
    }
bad:
    fail(l, f->key_line, f->key_column, "map merge requires map or sequence of maps as the value");
    return -1;
}

/* Place a finished value (reference stolen) in its parent. */
static int attach(loader *l, json_t *v, unsigned long long weight, int from_alias)
{
    frame *f = top(l);
    int rc = 0;

    if (!f) {
        l->root = v;
        return 0;
    }
    f->weight += weight;
    if (f->kind == FRAME_SEQ) {
        if (json_array_append_new(f->value, v))
            return fail_oom(l), -1;
        return 0;
    }
    if (f->key_is_merge) {
        rc = merge_into(l, f, v, from_alias);
        json_decref(v);
    } else {
        json_t *first = json_object_getn(f->seen, f->key, f->key_len);
        if (first) {
            /* the YAML spec forbids it and kubectl keeps one of the two at
               random (a Go map); a reviewer must not read another value
               than the cluster gets */
            fail(l, f->key_line, f->key_column, "duplicate key \"%.*s\" (first at line %lld)",
                 (int)(f->key_len < SNIPPET_MAX ? f->key_len : SNIPPET_MAX), f->key,
                 (long long)json_integer_value(first));
            json_decref(v);
            rc = -1;
        } else if (json_object_setn_new(f->seen, f->key, f->key_len,
                                        json_integer((json_int_t)f->key_line)) ||
                   json_object_setn_new(f->value, f->key, f->key_len, v)) {
            fail_oom(l);
            rc = -1;
        }
    }
    free(f->key);
    f->key = NULL;
    f->have_key = 0;
    f->key_is_merge = 0;
    return rc;
}

static void set_key(frame *f, char *key, size_t len, const yaml_mark_t *m, int is_merge)
{
    f->key = key;
    f->key_len = len;
    mark_of(m, &f->key_line, &f->key_column);
    f->key_is_merge = is_merge;
    f->have_key = 1;
}

static void on_scalar(loader *l, const yaml_event_t *ev)
{
    const char *text = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    const char *tag = (const char *)ev->data.scalar.tag;
    scalar sc;
    json_t *v;

    if (count_nodes(l, 1, 0, &ev->start_mark) || resolve_event(l, ev, &sc))
        return;
    if (ev->data.scalar.anchor) {
        long a = anchor_new(l, (const char *)ev->data.scalar.anchor);
        if (a < 0 || scalar_copy(&l->anchors[a].sc, &sc)) {
            if (a >= 0)
                fail_oom(l);
            goto out;
        }
        l->anchors[a].kind = ANCHOR_SCALAR;
        l->anchors[a].weight = 1;
    }
    if (expecting_key(l)) {
        frame *f = top(l);
        /* decode.go isMerge: a plain "<<", or "<<" tagged !!merge */
        int merge = n == 2 && memcmp(text, "<<", 2) == 0 &&
                    (ev->data.scalar.plain_implicit ||
                     (tag && strcmp(tag, TAG_PREFIX "merge") == 0));
        char *key = NULL;
        size_t keylen = 0;
        if (!merge && scalar_to_key(l, &sc, text, n, &ev->start_mark, &key, &keylen))
            goto out;
        set_key(f, key, keylen, &ev->start_mark, merge);
        f->weight += 1;
        goto out;
    }
    v = scalar_to_json(l, &sc, &ev->start_mark);
    if (v)
        attach(l, v, 1, 0);
out:
    scalar_free(&sc);
}

static void on_alias(loader *l, const yaml_event_t *ev)
{
    const char *name = (const char *)ev->data.alias.anchor;
    json_t *idx = json_object_get(l->anchor_index, name);
    unsigned long line, column;
    anchor *a;
    json_t *v;

    mark_of(&ev->start_mark, &line, &column);
    if (!idx) {
        fail(l, line, column, "unknown anchor '%s' referenced", name);
        return;
    }
    a = &l->anchors[json_integer_value(idx)];
    if (a->kind == ANCHOR_PENDING) {
        fail(l, line, column, "anchor '%s' value contains itself", name);
        return;
    }
    if (count_nodes(l, 1 + a->weight, a->weight, &ev->start_mark))
        return;
    if (expecting_key(l)) {
        char *key = NULL;
        size_t keylen = 0;
        if (a->kind != ANCHOR_SCALAR) {
            fail(l, line, column, "invalid map key: *%s is a %s", name,
                 json_is_array(a->value) ? "sequence" : "mapping");
            return;
        }
        char text[SNIPPET_MAX];
        snprintf(text, sizeof text, "*%s", name);
        if (scalar_to_key(l, &a->sc, text, strlen(text), &ev->start_mark, &key, &keylen))
            return;
        set_key(top(l), key, keylen, &ev->start_mark, 0);
        top(l)->weight += 1 + a->weight;
        return;
    }
    if (a->kind == ANCHOR_SCALAR) {
        v = scalar_to_json(l, &a->sc, &ev->start_mark);
        if (!v)
            return;
    } else {
        v = json_deep_copy(a->value);
        if (!v) {
            fail_oom(l);
            return;
        }
    }
    attach(l, v, 1 + a->weight, 1);
}

static void on_start(loader *l, const yaml_event_t *ev, int kind)
{
    const char *anchor_name = (const char *)(kind == FRAME_MAP ? ev->data.mapping_start.anchor
                                                               : ev->data.sequence_start.anchor);
    unsigned long line, column;
    frame *f;

    mark_of(&ev->start_mark, &line, &column);
    if (count_nodes(l, 1, 0, &ev->start_mark))
        return;
    if (expecting_key(l)) {
        fail(l, line, column, "invalid map key: a %s cannot be a key",
             kind == FRAME_MAP ? "mapping" : "sequence");
        return;
    }
    if (l->depth >= YAMLLOAD_MAX_DEPTH) {
        fail(l, line, column, "exceeded max depth of %d", YAMLLOAD_MAX_DEPTH);
        return;
    }
    if (l->depth == l->stack_cap) {
        size_t cap = l->stack_cap ? l->stack_cap * 2 : 16;
        frame *n = realloc(l->stack, cap * sizeof *n);
        if (!n) {
            fail_oom(l);
            return;
        }
        l->stack = n;
        l->stack_cap = cap;
    }
    f = &l->stack[l->depth];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->anchor = -1;
    f->weight = 1;
    f->value = kind == FRAME_MAP ? json_object() : json_array();
    f->seen = kind == FRAME_MAP ? json_object() : NULL;
    l->depth++;
    if (!f->value || (kind == FRAME_MAP && !f->seen)) {
        fail_oom(l);
        return;
    }
    if (anchor_name)
        f->anchor = anchor_new(l, anchor_name);
}

static void on_end(loader *l)
{
    frame *f = top(l);
    json_t *v = f->value;
    unsigned long long weight = f->weight;

    if (f->anchor >= 0) {
        anchor *a = &l->anchors[f->anchor];
        a->kind = ANCHOR_NODE;
        a->value = json_incref(v);
        a->weight = weight;
    }
    f->value = NULL;
    frame_free(f);
    l->depth--;
    attach(l, v, weight, 0);
}

/* libyaml's own error, with its problem text and 1-based position. */
static void fail_libyaml(loader *l, const yaml_parser_t *p, const char *buf, size_t len)
{
    unsigned long line, column, cline, ccolumn;
    const char *problem = p->problem ? p->problem : "unknown problem parsing YAML";

    switch (p->error) {
    case YAML_MEMORY_ERROR:
        fail_oom(l);
        return;
    case YAML_READER_ERROR: {
        /* the reader reports a byte offset, not a mark */
        size_t i, off = p->problem_offset < len ? p->problem_offset : len;
        line = 1;
        column = 1;
        for (i = 0; i < off; i++) {
            if (buf[i] == '\n') {
                line++;
                column = 1;
            } else if (((unsigned char)buf[i] & 0xC0) != 0x80) {
                column++;
            }
        }
        fail(l, line, column, "%s", problem);
        return;
    }
    default:
        mark_of(&p->problem_mark, &line, &column);
        if (!p->context) {
            fail(l, line, column, "%s", problem);
            return;
        }
        mark_of(&p->context_mark, &cline, &ccolumn);
        if (cline == line && ccolumn == column)
            fail(l, line, column, "%s (%s)", problem, p->context);
        else
            fail(l, line, column, "%s (%s at line %lu, column %lu)", problem, p->context, cline,
                 ccolumn);
        return;
    }
}

/* k8s.io/apimachinery pkg/util/yaml decoder.go YAMLReader.Read: a line
   that starts with "---" separates documents and may be followed only by
   spaces and a comment. */
static int check_separators(loader *l, const char *buf, size_t len)
{
    size_t i = 0;
    unsigned long line = 1;
    while (i < len) {
        size_t end = i;
        while (end < len && buf[end] != '\n')
            end++;
        if (end - i >= 3 && memcmp(buf + i, "---", 3) == 0) {
            size_t a = i + 3, b = end;
            while (a < b && strchr(" \t\r\v\f", buf[a]))
                a++;
            while (b > a && strchr(" \t\r\v\f", buf[b - 1]))
                b--;
            if (a < b && buf[a] != '#') {
                fail(l, line, 1, "invalid Yaml document separator: %.*s",
                     (int)(b - a < SNIPPET_MAX ? b - a : SNIPPET_MAX), buf + a);
                return -1;
            }
        }
        i = end + 1;
        line++;
    }
    return 0;
}

static void run(loader *l, const char *buf, size_t len)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int done = 0;

    if (check_separators(l, buf, len))
        return;
    if (!yaml_parser_initialize(&parser)) {
        fail_oom(l);
        return;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
    while (!done && !l->failed) {
        if (!yaml_parser_parse(&parser, &ev)) {
            fail_libyaml(l, &parser, buf, len);
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        case YAML_DOCUMENT_START_EVENT:
            anchors_reset(l); /* anchors are per document (decode.go) */
            l->decode_count = 1;
            l->alias_count = 0;
            break;
        case YAML_DOCUMENT_END_EVENT:
            if (l->root && !json_is_null(l->root)) {
                if (json_array_append_new(l->docs, l->root))
                    fail_oom(l);
            } else {
                json_decref(l->root);
            }
            l->root = NULL;
            break;
        case YAML_SCALAR_EVENT:
            on_scalar(l, &ev);
            break;
        case YAML_ALIAS_EVENT:
            on_alias(l, &ev);
            break;
        case YAML_SEQUENCE_START_EVENT:
            on_start(l, &ev, FRAME_SEQ);
            break;
        case YAML_MAPPING_START_EVENT:
            on_start(l, &ev, FRAME_MAP);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            on_end(l);
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
}

json_t *yamlload_parse(const char *buf, size_t len, const char *filename, yamlload_error *err)
{
    loader l;
    locale_t c_locale, old_locale = (locale_t)0;
    json_t *result = NULL;

    start_error(err, filename);
    memset(&l, 0, sizeof l);
    l.err = err;
    if (!buf && len) {
        fail(&l, 0, 0, "invalid argument: no buffer");
        return NULL;
    }
    if (!buf)
        buf = "";
    /* strtod and snprintf must use '.' whatever the process locale is */
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!c_locale) {
        fail_oom(&l);
        return NULL;
    }
    old_locale = uselocale(c_locale);
    l.docs = json_array();
    l.anchor_index = json_object();
    if (!l.docs || !l.anchor_index)
        fail_oom(&l);
    else
        run(&l, buf, len);

    while (l.depth)
        frame_free(&l.stack[--l.depth]);
    free(l.stack);
    if (l.anchor_index)
        anchors_reset(&l);
    free(l.anchors);
    json_decref(l.anchor_index);
    json_decref(l.root);
    if (l.failed)
        json_decref(l.docs);
    else
        result = l.docs;
    uselocale(old_locale);
    freelocale(c_locale);
    return result;
}

json_t *yamlload_file(const char *path, yamlload_error *err)
{
    FILE *f;
    char *data = NULL;
    size_t len = 0, cap = 0;
    json_t *result = NULL;
    int saved;

    start_error(err, path);
    f = fopen(path, "rb");
    if (!f) {
        if (err)
            snprintf(err->message, sizeof err->message, "cannot open: %s", strerror(errno));
        return NULL;
    }
    for (;;) {
        size_t got;
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *n;
            if (ncap > (size_t)YAMLLOAD_FILE_MAX_BYTES + 1)
                ncap = (size_t)YAMLLOAD_FILE_MAX_BYTES + 1;
            if (ncap <= cap) {
                if (err)
                    snprintf(err->message, sizeof err->message,
                             "file is larger than %u bytes", YAMLLOAD_FILE_MAX_BYTES);
                goto out;
            }
            n = realloc(data, ncap);
            if (!n) {
                if (err)
                    snprintf(err->message, sizeof err->message, "out of memory");
                goto out;
            }
            data = n;
            cap = ncap;
        }
        got = fread(data + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                saved = errno;
                if (err)
                    snprintf(err->message, sizeof err->message, "cannot read: %s",
                             strerror(saved));
                goto out;
            }
            break;
        }
    }
    result = yamlload_parse(data, len, path, err);
out:
    free(data);
    fclose(f);
    return result;
}
