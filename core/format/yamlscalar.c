/* yamlscalar.c — YAML scalars resolved as kubectl reads them: go-yaml v2's
 * implicit table (null, bool, int, float), explicit tags (!!str !!int
 * !!float !!bool !!null !!timestamp !!binary), Go's number syntax and
 * printing, and the JSON values and key strings sigs.k8s.io/yaml makes of
 * them (yaml_internal.h). The comments name the Go code each piece
 * reproduces; docs/decisions/0002-yaml-scalars.md lists the rules. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "format/yaml_internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/b64.h"
#include "base/utf8.h"

void yl_scalar_free(scalar *sc)
{
    free(sc->s);
    sc->s = NULL;
}

int yl_scalar_copy(scalar *dst, const scalar *src)
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
   *out (with *got the tag it resolved to); returns -1 after yl_fail(). */
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
                yl_fail_oom(l);
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
                return set_str(out, v, n) ? (yl_fail_oom(l), -1) : 0;
            }
            plain = malloc(n + 1);
            if (!plain) {
                yl_fail_oom(l);
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
        yl_fail_oom(l);
        return -1;
    }
    return 0;
}

/* Resolve one scalar event, honouring its tag as go-yaml v2's
   decoder.scalar() does.  Returns -1 after yl_fail(). */
int yl_resolve_event(loader *l, const yaml_event_t *ev, scalar *out)
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
            return set_str(out, v, n) ? (yl_fail_oom(l), -1) : 0;
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
            /* go-yaml v2 decodes with base64.StdEncoding; json.Marshal then
               writes each byte of invalid UTF-8 as U+FFFD (libyaml rejects
               invalid input, so only !!binary can produce such bytes) */
            unsigned char *raw = NULL;
            size_t rawlen = 0;
            int rc = cozy_base64_decode(v, n, &raw, &rawlen);
            if (rc == -2) {
                yl_fail_oom(l);
                return -1;
            }
            if (rc) {
                yl_mark_of(&ev->start_mark, &line, &column);
                yl_fail(l, line, column, "!!binary value contains invalid base64 data");
                return -1;
            }
            out->kind = SC_STR;
            out->s = cozy_utf8_sanitize(raw, rawlen, 1, &out->slen);
            free(raw);
            if (!out->s) {
                yl_fail_oom(l);
                return -1;
            }
            return 0;
        } else {
            return set_str(out, v, n) ? (yl_fail_oom(l), -1) : 0; /* !!merge, !!seq, ... */
        }
    } else {
        return set_str(out, v, n) ? (yl_fail_oom(l), -1) : 0; /* "!", "!local", other URIs */
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
    yl_scalar_free(out);
    yl_mark_of(&ev->start_mark, &line, &column);
    yl_fail(l, line, column, "cannot decode %s `%.*s` as a %s", rtag_name(got),
         (int)(n < SNIPPET_MAX ? n : SNIPPET_MAX), v, rtag_name(t));
    return -1;
}

static const char *go_float_text(double f)
{
    return isnan(f) ? "NaN" : f > 0 ? "+Inf" : "-Inf";
}

/* A resolved scalar as the value kubectl's unstructured object holds. */
json_t *yl_scalar_to_json(loader *l, const scalar *sc, const yaml_mark_t *m)
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
            yl_mark_of(m, &line, &column);
            yl_fail(l, line, column,
                 "%s has no JSON form (kubectl fails: json: unsupported value: %s)",
                 isnan(sc->f) ? ".nan" : sc->f > 0 ? ".inf" : "-.inf", go_float_text(sc->f));
            return NULL;
        }
        v = float_as_int64(sc->f, &i) ? json_integer((json_int_t)i) : json_real(sc->f);
        break;
    case SC_STR: v = json_stringn(sc->s, sc->slen); break;
    }
    if (!v)
        yl_fail_oom(l);
    return v;
}

/* A resolved scalar as a mapping key, as sigs.k8s.io/yaml
   convertToJSONableObject makes it.  Sets *key (malloc'd). */
int yl_scalar_to_key(loader *l, const scalar *sc, const char *text, size_t textlen,
                         const yaml_mark_t *m, char **key, size_t *keylen)
{
    char buf[64];
    const char *s = buf;
    size_t n;
    unsigned long line, column;

    switch (sc->kind) {
    case SC_NULL:
        yl_mark_of(m, &line, &column);
        yl_fail(l, line, column, "unsupported map key: `%.*s` is null",
             (int)(textlen < SNIPPET_MAX ? textlen : SNIPPET_MAX), text);
        return -1;
    case SC_BOOL: s = sc->b ? "true" : "false"; break;
    case SC_INT: snprintf(buf, sizeof buf, "%lld", sc->i); break;
    case SC_FLOAT:
        if (sc->from_uint64) {
            yl_mark_of(m, &line, &column);
            yl_fail(l, line, column, "unsupported map key: `%.*s` is a uint64",
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
        yl_fail_oom(l);
        return -1;
    }
    memcpy(*key, s, n);
    (*key)[n] = '\0';
    *keylen = n;
    return 0;
}
