/* select.c — label and field selectors for the kube-double.
 *
 * Label grammar and semantics follow k8s.io/apimachinery/pkg/labels
 * (selector.go, Parse): requirements separated by commas (commas inside
 * parentheses belong to a set), operators =, ==, !=, in, notin, exists
 * (`k`), does-not-exist (`!k`), and the numeric gt/lt. `!=` and `notin`
 * also match objects without the label, as in Kubernetes. Field selectors
 * (k8s.io/apimachinery/pkg/fields) support =, == and != on a fixed set of
 * fields per resource.
 */
#include "double.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op { OP_EQ, OP_NE, OP_IN, OP_NOTIN, OP_EXISTS, OP_NOTEXISTS, OP_GT, OP_LT };

typedef struct req {
    char *key;
    enum op op;
    char **vals;
    size_t nvals;
} req;

struct dbl_selector {
    int fields;   /* 1: keys are field paths, 0: label keys */
    req *r;
    size_t n;
};

void dbl_selector_free(dbl_selector *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->r[i].key);
        for (size_t j = 0; j < s->r[i].nvals; j++) free(s->r[i].vals[j]);
        free(s->r[i].vals);
    }
    free(s->r);
    free(s);
}

static char *trimdup(const char *a, const char *b)
{
    while (a < b && isspace((unsigned char)*a)) a++;
    while (b > a && isspace((unsigned char)b[-1])) b--;
    return strndup(a, (size_t)(b - a));
}

static void push_val(req *r, char *v)
{
    r->vals = realloc(r->vals, (r->nvals + 1) * sizeof *r->vals);
    r->vals[r->nvals++] = v;
}

/* Parses one requirement text [a, b). Returns 0, or -1 with err set. */
static int parse_req(req *r, const char *a, const char *b, int fields, char *err, size_t errlen)
{
    char *t = trimdup(a, b);
    char *p;
    memset(r, 0, sizeof *r);
    if (!*t) { snprintf(err, errlen, "found '', expected: identifier"); free(t); return -1; }
    if (!fields && t[0] == '!') {
        r->key = trimdup(t + 1, t + strlen(t));
        r->op = OP_NOTEXISTS;
        free(t);
        return 0;
    }
    if ((p = strstr(t, "!=")) != NULL) {
        r->key = trimdup(t, p); r->op = OP_NE; push_val(r, trimdup(p + 2, t + strlen(t)));
    } else if ((p = strstr(t, "==")) != NULL) {
        r->key = trimdup(t, p); r->op = OP_EQ; push_val(r, trimdup(p + 2, t + strlen(t)));
    } else if ((p = strchr(t, '=')) != NULL) {
        r->key = trimdup(t, p); r->op = OP_EQ; push_val(r, trimdup(p + 1, t + strlen(t)));
    } else if (!fields && ((p = strchr(t, '>')) != NULL || (p = strchr(t, '<')) != NULL)) {
        r->key = trimdup(t, p); r->op = *p == '>' ? OP_GT : OP_LT; push_val(r, trimdup(p + 1, t + strlen(t)));
    } else if (!fields) {
        /* `k`, `k in (..)`, `k notin (..)` */
        char *sp = t;
        while (*sp && !isspace((unsigned char)*sp) && *sp != '(') sp++;
        r->key = strndup(t, (size_t)(sp - t));
        while (isspace((unsigned char)*sp)) sp++;
        if (!*sp) { r->op = OP_EXISTS; free(t); return 0; }
        if (!strncmp(sp, "notin", 5)) { r->op = OP_NOTIN; sp += 5; }
        else if (!strncmp(sp, "in", 2)) { r->op = OP_IN; sp += 2; }
        else { snprintf(err, errlen, "found '%s', expected: in, notin, =, ==, !=, gt, lt", sp); free(t); return -1; }
        while (isspace((unsigned char)*sp)) sp++;
        char *close = strrchr(sp, ')');
        if (*sp != '(' || !close) { snprintf(err, errlen, "found '%s', expected: '('", sp); free(t); return -1; }
        const char *v = sp + 1;
        for (const char *q = v;; q++) {
            if (q == close || *q == ',') {
                push_val(r, trimdup(v, q));
                if (q == close) break;
                v = q + 1;
            }
        }
    } else {
        snprintf(err, errlen, "invalid selector: '%s'; can't understand '%s'", t, t);
        free(t);
        return -1;
    }
    free(t);
    if (!*r->key) { snprintf(err, errlen, "found '', expected: identifier"); return -1; }
    return 0;
}

static dbl_selector *parse(const char *text, int fields, const char *extra, char *err, size_t errlen)
{
    dbl_selector *s = calloc(1, sizeof *s);
    s->fields = fields;
    if (!text) return s;
    const char *a = text;
    int depth = 0;
    for (const char *q = text;; q++) {
        if (*q == '(') depth++;
        if (*q == ')') depth--;
        if (*q == '\0' || (*q == ',' && depth == 0)) {
            const char *b = q;
            int blank = 1;
            for (const char *c = a; c < b; c++) if (!isspace((unsigned char)*c)) blank = 0;
            if (!(blank && *q == '\0' && s->n == 0)) {
                req r;
                if (parse_req(&r, a, b, fields, err, errlen) < 0) {
                    free(r.key);
                    for (size_t j = 0; j < r.nvals; j++) free(r.vals[j]);
                    free(r.vals);
                    dbl_selector_free(s);
                    return NULL;
                }
                s->r = realloc(s->r, (s->n + 1) * sizeof *s->r);
                s->r[s->n++] = r;
                if (fields) {
                    int ok = !strcmp(r.key, "metadata.name") || !strcmp(r.key, "metadata.namespace");
                    if (!ok && extra) {
                        size_t kl = strlen(r.key);
                        for (const char *e = extra; *e;) {
                            const char *sp = strchr(e, ' ');
                            size_t el = sp ? (size_t)(sp - e) : strlen(e);
                            if (el == kl && !strncmp(e, r.key, kl)) ok = 1;
                            e += el;
                            while (*e == ' ') e++;
                        }
                    }
                    if (!ok) {
                        snprintf(err, errlen, "field label not supported: %s", r.key);
                        dbl_selector_free(s);
                        return NULL;
                    }
                }
            }
            if (*q == '\0') break;
            a = q + 1;
        }
    }
    return s;
}

dbl_selector *dbl_labels_parse(const char *text, char *err, size_t errlen)
{
    return parse(text, 0, NULL, err, errlen);
}

dbl_selector *dbl_fields_parse(const char *text, const char *extra, char *err, size_t errlen)
{
    return parse(text, 1, extra, err, errlen);
}

/* The string at dotted path `path` in obj ("" when absent, as the API
 * server's field sets hold empty strings for unset fields). */
static const char *field_value(const json_t *obj, const char *path)
{
    const json_t *cur = obj;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL; /* strtok_r: selectors are matched on many threads */
    for (char *tok = strtok_r(buf, ".", &save); tok && cur; tok = strtok_r(NULL, ".", &save))
        cur = json_object_get(cur, tok);
    return json_is_string(cur) ? json_string_value(cur) : "";
}

int dbl_selector_match(const dbl_selector *s, const json_t *obj)
{
    if (!s) return 1;
    const json_t *labels = json_object_get(json_object_get(obj, "metadata"), "labels");
    for (size_t i = 0; i < s->n; i++) {
        const req *r = &s->r[i];
        const char *v;
        int has;
        if (s->fields) {
            v = field_value(obj, r->key);
            has = 1;
        } else {
            const json_t *j = json_object_get(labels, r->key);
            has = json_is_string(j);
            v = has ? json_string_value(j) : NULL;
        }
        int in = 0;
        for (size_t j = 0; has && j < r->nvals; j++) if (!strcmp(v, r->vals[j])) in = 1;
        switch (r->op) {
        case OP_EQ: case OP_IN: if (!has || !in) return 0; break;
        case OP_NE: case OP_NOTIN: if (has && in) return 0; break;
        case OP_EXISTS: if (!has) return 0; break;
        case OP_NOTEXISTS: if (has) return 0; break;
        case OP_GT: case OP_LT: {
            char *end;
            if (!has) return 0;
            long long a = strtoll(v, &end, 10);
            if (*end || !*v) return 0;
            long long b = strtoll(r->vals[0], NULL, 10);
            if (r->op == OP_GT ? !(a > b) : !(a < b)) return 0;
            break;
        }
        }
    }
    return 1;
}
