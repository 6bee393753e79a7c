/* yamlload — YAML manifests to jansson values, read the way kubectl reads them.
 * This file is the libyaml event loader: documents, mappings and sequences,
 * anchors and aliases, merge keys, errors, file reading; scalars are
 * resolved in yamlscalar.c (yaml_internal.h). The rules and their sources
 * are in yamlload.h and docs/decisions/0002-yaml-scalars.md; the comments
 * here name the Go code each piece reproduces. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "format/yamlload.h"
#include "format/yaml_internal.h"

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

#include "base/buf.h"
#include "base/file.h"

/* ---------------------------------------------------------------- errors */

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
    yl_input input;        /* to re-read the raw text of double-quoted scalars */
};

void yl_fail(loader *l, unsigned long line, unsigned long column, const char *fmt, ...)
{
    va_list ap;
    if (l->failed)
        return;
    l->failed = 1;
    va_start(ap, fmt);
    set_error(l->err, line, column, fmt, ap);
    va_end(ap);
}

void yl_fail_oom(loader *l) { yl_fail(l, 0, 0, "out of memory"); }

void yl_mark_of(const yaml_mark_t *m, unsigned long *line, unsigned long *column)
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
        yl_scalar_free(&l->anchors[i].sc);
    }
    l->nanchors = 0;
    json_object_clear(l->anchor_index);
}

/* Register an anchor at the start of its node, as go-yaml v2's parser does,
   so an alias inside the node finds it pending.  Returns its index or -1. */
static long anchor_new(loader *l, const char *name)
{
    anchor *a, *n = cozy_grow(l->anchors, &l->anchors_cap, l->nanchors + 1, sizeof *n);
    if (!n) {
        yl_fail_oom(l);
        return -1;
    }
    l->anchors = n;
    a = &l->anchors[l->nanchors];
    memset(a, 0, sizeof *a);
    a->kind = ANCHOR_PENDING;
    if (json_object_set_new(l->anchor_index, name, json_integer((json_int_t)l->nanchors))) {
        yl_fail_oom(l);
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
        yl_mark_of(m, &line, &column);
        yl_fail(l, line, column, "document contains excessive aliasing");
        return -1;
    }
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
            return yl_fail_oom(l), -1;
        return 0;
    }
    if (json_is_array(v) && !from_alias) {
        for (i = 0; i < json_array_size(v); i++)
            if (!json_is_object(json_array_get(v, i)))
                goto bad;
        for (i = json_array_size(v); i-- > 0;)
            if (json_object_update(f->value, json_array_get(v, i)))
                return yl_fail_oom(l), -1;
        return 0;
    }
bad:
    yl_fail(l, f->key_line, f->key_column, "map merge requires map or sequence of maps as the value");
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
            return yl_fail_oom(l), -1;
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
            yl_fail(l, f->key_line, f->key_column, "duplicate key \"%.*s\" (first at line %lld)",
                 (int)(f->key_len < SNIPPET_MAX ? f->key_len : SNIPPET_MAX), f->key,
                 (long long)json_integer_value(first));
            json_decref(v);
            rc = -1;
        } else if (json_object_setn_new(f->seen, f->key, f->key_len,
                                        json_integer((json_int_t)f->key_line)) ||
                   json_object_setn_new(f->value, f->key, f->key_len, v)) {
            yl_fail_oom(l);
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
    yl_mark_of(m, &f->key_line, &f->key_column);
    f->key_is_merge = is_merge;
    f->have_key = 1;
}

static void scalar_event(loader *l, const yaml_event_t *ev)
{
    const char *text = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    const char *tag = (const char *)ev->data.scalar.tag;
    scalar sc;
    json_t *v;

    if (memchr(text, 0, n)) {
        /* a "\0", "\x00", "\u0000" escape: Kubernetes JSON could carry
           U+0000, but no name, label or value cozygpu reads can, and C
           strings would end there (what a policy sees and what the C side
           reads would differ): refused, as the webhooks' JSON parser
           refuses \u0000 */
        unsigned long line, column;
        yl_mark_of(&ev->start_mark, &line, &column);
        yl_fail(l, line, column, "a string holds a NUL character (U+0000, from an escape such as \\0): not accepted");
        return;
    }
    if (count_nodes(l, 1, 0, &ev->start_mark) || yl_resolve_event(l, ev, &sc))
        return;
    if (ev->data.scalar.anchor) {
        long a = anchor_new(l, (const char *)ev->data.scalar.anchor);
        if (a < 0 || yl_scalar_copy(&l->anchors[a].sc, &sc)) {
            if (a >= 0)
                yl_fail_oom(l);
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
        if (!merge && yl_scalar_to_key(l, &sc, text, n, &ev->start_mark, &key, &keylen))
            goto out;
        set_key(f, key, keylen, &ev->start_mark, merge);
        f->weight += 1;
        goto out;
    }
    v = yl_scalar_to_json(l, &sc, &ev->start_mark);
    if (v)
        attach(l, v, 1, 0);
out:
    yl_scalar_free(&sc);
}

static void on_scalar(loader *l, const yaml_event_t *ev)
{
    unsigned char *fixed = NULL;
    yaml_event_t copy;

    if (ev->data.scalar.style != YAML_DOUBLE_QUOTED_SCALAR_STYLE) {
        scalar_event(l, ev);
        return;
    }
    if (yl_check_escapes(l, &l->input, ev, &fixed))
        return;
    if (!fixed) {
        scalar_event(l, ev);
        return;
    }
    copy = *ev;
    copy.data.scalar.value = fixed;
    scalar_event(l, &copy);
    free(fixed);
}

static void on_alias(loader *l, const yaml_event_t *ev)
{
    const char *name = (const char *)ev->data.alias.anchor;
    json_t *idx = json_object_get(l->anchor_index, name);
    unsigned long line, column;
    anchor *a;
    json_t *v;

    yl_mark_of(&ev->start_mark, &line, &column);
    if (!idx) {
        yl_fail(l, line, column, "unknown anchor '%s' referenced", name);
        return;
    }
    a = &l->anchors[json_integer_value(idx)];
    if (a->kind == ANCHOR_PENDING) {
        yl_fail(l, line, column, "anchor '%s' value contains itself", name);
        return;
    }
    if (count_nodes(l, 1 + a->weight, a->weight, &ev->start_mark))
        return;
    if (expecting_key(l)) {
        char *key = NULL;
        size_t keylen = 0;
        if (a->kind != ANCHOR_SCALAR) {
            yl_fail(l, line, column, "invalid map key: *%s is a %s", name,
                 json_is_array(a->value) ? "sequence" : "mapping");
            return;
        }
        char text[SNIPPET_MAX];
        snprintf(text, sizeof text, "*%s", name);
        if (yl_scalar_to_key(l, &a->sc, text, strlen(text), &ev->start_mark, &key, &keylen))
            return;
        set_key(top(l), key, keylen, &ev->start_mark, 0);
        top(l)->weight += 1 + a->weight;
        return;
    }
    if (a->kind == ANCHOR_SCALAR) {
        v = yl_scalar_to_json(l, &a->sc, &ev->start_mark);
        if (!v)
            return;
    } else {
        v = json_deep_copy(a->value);
        if (!v) {
            yl_fail_oom(l);
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

    yl_mark_of(&ev->start_mark, &line, &column);
    if (count_nodes(l, 1, 0, &ev->start_mark))
        return;
    if (expecting_key(l)) {
        yl_fail(l, line, column, "invalid map key: a %s cannot be a key",
             kind == FRAME_MAP ? "mapping" : "sequence");
        return;
    }
    if (l->depth >= YAMLLOAD_MAX_DEPTH) {
        yl_fail(l, line, column, "exceeded max depth of %d", YAMLLOAD_MAX_DEPTH);
        return;
    }
    f = cozy_grow(l->stack, &l->stack_cap, l->depth + 1, sizeof *f);
    if (!f) {
        yl_fail_oom(l);
        return;
    }
    l->stack = f;
    f = &l->stack[l->depth];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->anchor = -1;
    f->weight = 1;
    f->value = kind == FRAME_MAP ? json_object() : json_array();
    f->seen = kind == FRAME_MAP ? json_object() : NULL;
    l->depth++;
    if (!f->value || (kind == FRAME_MAP && !f->seen)) {
        yl_fail_oom(l);
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
        yl_fail_oom(l);
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
        yl_fail(l, line, column, "%s", problem);
        return;
    }
    default:
        yl_mark_of(&p->problem_mark, &line, &column);
        if (!p->context) {
            yl_fail(l, line, column, "%s", problem);
            return;
        }
        yl_mark_of(&p->context_mark, &cline, &ccolumn);
        if (cline == line && ccolumn == column)
            yl_fail(l, line, column, "%s (%s)", problem, p->context);
        else
            yl_fail(l, line, column, "%s (%s at line %lu, column %lu)", problem, p->context, cline,
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
                yl_fail(l, line, 1, "invalid Yaml document separator: %.*s",
                     (int)(b - a < SNIPPET_MAX ? b - a : SNIPPET_MAX), buf + a);
                return -1;
            }
        }
        i = end + 1;
        line++;
    }
    return 0;
}

/* When libyaml stopped at an escape it does not know and that escape is
   "\'" (which go-yaml reads as "'"), 1 with the backslash's byte offset in
   *off; else 0. */
static int apostrophe_escape_at(loader *l, const yaml_parser_t *p, size_t *off)
{
    size_t pos = l->input.start, i;
    if (p->error != YAML_SCANNER_ERROR || !p->problem ||
        strcmp(p->problem, "found unknown escape character") != 0)
        return 0;
    for (i = 0; i < p->problem_mark.index; i++)
        if (yl_next_char(&l->input, &pos) < 0)
            return 0;
    *off = pos;
    return yl_next_char(&l->input, &pos) == '\\' && yl_next_char(&l->input, &pos) == '\'';
}

/* In `text` (a copy of the input), every "\'" of the double-quoted scalar
   whose escape starts at byte offset `off` becomes "\"": same length, so
   libyaml's marks still fit the input, and check_escapes puts the "'" back. */
static void patch_apostrophes(loader *l, char *text, size_t off)
{
    size_t pos = off, at;
    long c;
    for (;;) {
        c = yl_next_char(&l->input, &pos);
        if (c < 0 || c == '"')
            return;
        if (c != '\\')
            continue;
        at = pos;
        if (yl_next_char(&l->input, &pos) == '\'')
            text[l->input.enc == YAML_UTF16BE_ENCODING ? at + 1 : at] = '"';
    }
}

/* Back to an empty result, to read the stream again. */
static void loader_reset(loader *l)
{
    while (l->depth)
        frame_free(&l->stack[--l->depth]);
    anchors_reset(l);
    json_decref(l->root);
    l->root = NULL;
    json_array_clear(l->docs);
    l->decode_count = l->alias_count = 0;
}

/* One pass of libyaml over `text` (the input, or a patched copy). Returns
   0, or 1 with *off set when libyaml stopped at a "\'" escape and
   `may_retry`: the caller patches that scalar and reads again. */
static int parse_pass(loader *l, const char *text, size_t len, int may_retry, size_t *off)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int done = 0, retry = 0;

    if (!yaml_parser_initialize(&parser)) {
        yl_fail_oom(l);
        return 0;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    l->input.cur_index = 0;
    l->input.cur_pos = l->input.start;
    while (!done && !l->failed) {
        if (!yaml_parser_parse(&parser, &ev)) {
            if (apostrophe_escape_at(l, &parser, off)) {
                unsigned long line, column, cline, ccolumn;
                if (may_retry) {
                    retry = 1;
                    break;
                }
                yl_mark_of(&parser.problem_mark, &line, &column);
                yl_mark_of(&parser.context_mark, &cline, &ccolumn);
                yl_fail(l, line, column,
                        "too many double-quoted scalars with \\' escapes to read them as kubectl "
                        "does (\\' is ') (while parsing a quoted scalar at line %lu, column %lu)",
                        cline, ccolumn);
                break;
            }
            fail_libyaml(l, &parser, (const char *)l->input.b, len);
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
                    yl_fail_oom(l);
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
    return retry;
}

/* libyaml 0.2.5 refuses "\'" in double quotes, which go-yaml v2 reads as
   "'". libyaml cannot resume after an error, so each double-quoted scalar
   that holds one costs a new pass over a patched copy; the passes are
   bounded (APOSTROPHE_PASSES, or more for a small input). */
#define APOSTROPHE_PASSES 64
#define APOSTROPHE_BYTES (64u * 1024u * 1024u)

static void run(loader *l, const char *buf, size_t len)
{
    char *patched = NULL;
    size_t off = 0, passes = 0;
    size_t max_passes = len && APOSTROPHE_BYTES / len > APOSTROPHE_PASSES ? APOSTROPHE_BYTES / len
                                                                          : APOSTROPHE_PASSES;

    if (check_separators(l, buf, len))
        return;
    yl_input_start(&l->input, buf, len);
    while (parse_pass(l, patched ? patched : buf, len, passes < max_passes, &off)) {
        passes++;
        if (!patched) {
            patched = malloc(len);
            if (!patched) {
                yl_fail_oom(l);
                break;
            }
            memcpy(patched, buf, len);
        }
        patch_apostrophes(l, patched, off);
        loader_reset(l);
    }
    free(patched);
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
        yl_fail(&l, 0, 0, "invalid argument: no buffer");
        return NULL;
    }
    if (!buf)
        buf = "";
    /* strtod and snprintf must use '.' whatever the process locale is */
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!c_locale) {
        yl_fail_oom(&l);
        return NULL;
    }
    old_locale = uselocale(c_locale);
    l.docs = json_array();
    l.anchor_index = json_object();
    if (!l.docs || !l.anchor_index)
        yl_fail_oom(&l);
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
    size_t len = 0;
    json_t *result = NULL;
    int rc;

    start_error(err, path);
    f = fopen(path, "rb");
    if (!f) {
        if (err)
            snprintf(err->message, sizeof err->message, "cannot open: %s", strerror(errno));
        return NULL;
    }
    rc = cozy_read_stream(f, YAMLLOAD_FILE_MAX_BYTES, &data, &len);
    fclose(f);
    if (rc) {
        if (!err)
            return NULL;
        if (rc == EFBIG)
            snprintf(err->message, sizeof err->message, "file is larger than %u bytes",
                     YAMLLOAD_FILE_MAX_BYTES);
        else if (rc == ENOMEM)
            snprintf(err->message, sizeof err->message, "out of memory");
        else
            snprintf(err->message, sizeof err->message, "cannot read: %s", strerror(rc));
        return NULL;
    }
    result = yamlload_parse(data, len, path, err);
    free(data);
    return result;
}
