/* jsonload.c — yajl's callbacks building a jansson tree, and json_loadb
 * whenever the two could read the text differently (jsonload.h; decision
 * 0046). Model: yajl's own yajl_tree.c (a stack of open containers, the
 * key waiting for its value).
 */
#include "base/jsonload.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "base/utf8.h"

typedef cozy_json_builder builder;
typedef cozy_json_frame frame;

int cozy_json_builder_put(cozy_json_builder *b, json_t *v)
{
    if(!v)
        return 0;
    if(b->depth == 0) {
        if(b->root) {
            json_decref(v);
            return 0;
        }
        b->root = v;
        return 1;
    }
    frame *f = &b->st[b->depth - 1];
    if(json_is_array(f->c))
        return json_array_append_new(f->c, v) == 0;
    if(!f->key) {
        json_decref(v);
        return 0;
    }
    if(b->dups && json_object_getn(f->c, f->key, f->keylen)) {
        json_decref(v);
        return 0;
    }
    int ok = json_object_setn_new_nocheck(f->c, f->key, f->keylen, v) == 0;
    free(f->key);
    f->key = NULL;
    return ok;
}

int cozy_json_builder_open(cozy_json_builder *b, json_t *c)
{
    if(!c)
        return 0;
    if(b->depth >= JSONLOAD_MAX_DEPTH) {
        json_decref(c);
        return 0;
    }
    if(b->depth == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 16;
        frame *st = realloc(b->st, cap * sizeof *st);
        if(!st) {
            json_decref(c);
            return 0;
        }
        b->st = st;
        b->cap = cap;
    }
    if(!cozy_json_builder_put(b, json_incref(c))) {
        json_decref(c);
        return 0;
    }
    b->st[b->depth++] = (frame){c, NULL, 0};
    json_decref(c); /* its parent (or root) holds it now */
    return 1;
}

int cozy_json_builder_close(cozy_json_builder *b)
{
    if(b->depth == 0)
        return 0;
    frame *f = &b->st[--b->depth];
    free(f->key);
    f->key = NULL;
    return 1;
}

int cozy_json_builder_key(cozy_json_builder *b, const char *s, size_t len)
{
    frame *f = &b->st[b->depth - 1];
    free(f->key);
    f->key = malloc(len + 1);
    if(!f->key)
        return 0;
    memcpy(f->key, s, len);
    f->key[len] = 0;
    f->keylen = len;
    return 1;
}

static int on_null(void *ud) { return cozy_json_builder_put(ud, json_null()); }
static int on_boolean(void *ud, int v) { return cozy_json_builder_put(ud, json_boolean(v)); }
static int on_integer(void *ud, long long v) { return cozy_json_builder_put(ud, json_integer((json_int_t)v)); }
static int on_double(void *ud, double v) { return cozy_json_builder_put(ud, json_real(v)); }

static int on_string(void *ud, const unsigned char *s, size_t len)
{
    return cozy_json_builder_put(ud, json_stringn_nocheck((const char *)s, len));
}

static int on_start_map(void *ud) { return cozy_json_builder_open(ud, json_object()); }
static int on_start_array(void *ud) { return cozy_json_builder_open(ud, json_array()); }
static int on_end(void *ud) { return cozy_json_builder_close(ud); }

static int on_map_key(void *ud, const unsigned char *s, size_t len)
{
    return cozy_json_builder_key(ud, (const char *)s, len);
}

static const yajl_callbacks callbacks = {
    on_null, on_boolean, on_integer, on_double, NULL, on_string,
    on_start_map, on_map_key, on_end, on_start_array, on_end,
};

/* 1 when the text has a "\u" escape of U+0000 or of a surrogate (or what
 * looks like one: an escaped backslash before "u" counts too, which only
 * costs the slower parse). */
static int risky_escape(const char *buf, size_t len)
{
    const char *p = buf, *end = buf + len;
    while((p = memchr(p, '\\', (size_t)(end - p))) && end - p >= 6) {
        if(p[1] == 'u') {
            char h[5] = {p[2], p[3], p[4], p[5], 0};
            char *stop;
            unsigned long cp = strtoul(h, &stop, 16);
            if(*stop == 0 && (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF)))
                return 1;
        }
        p += 2;
    }
    return 0;
}

/* 1 when the text ends inside a string: once its first value is complete,
 * yajl accepts a string cut by the end of the text (`{}"x`), which jansson
 * refuses. Quotes are found with memchr; one preceded by an odd number of
 * backslashes is escaped. */
static int ends_in_string(const char *buf, size_t len)
{
    const char *p = buf, *end = buf + len;
    int in = 0;
    while((p = memchr(p, '"', (size_t)(end - p)))) {
        size_t bs = 0;
        for(const char *q = p; in && q > buf && q[-1] == '\\'; q--)
            bs++;
        if(bs % 2 == 0)
            in = !in;
        p++;
    }
    return in;
}

void cozy_json_builder_free(cozy_json_builder *b)
{
    for(size_t i = 0; i < b->depth; i++)
        free(b->st[i].key);
    free(b->st);
    json_decref(b->root);
    b->st = NULL;
    b->root = NULL;
    b->depth = b->cap = 0;
}


int cozy_json_yajl_reads_as_jansson(const char *buf, size_t len, size_t flags)
{
    return !(flags & ~(size_t)(JSON_REJECT_DUPLICATES | JSON_DECODE_ANY)) && buf && !risky_escape(buf, len) &&
           !ends_in_string(buf, len) && !memchr(buf, '\v', len) && !memchr(buf, '\f', len) &&
           cozy_utf8_valid(buf, len);
}

void cozy_json_loaded(json_error_t *error, size_t len)
{
    if(error) {
        /* as json_loadb leaves it after a success: no text, no line or
         * column, the position at the end of what it read */
        memset(error, 0, sizeof *error);
        snprintf(error->source, sizeof error->source, "<buffer>");
        error->line = error->column = -1;
        error->position = (int)(len > INT_MAX ? INT_MAX : len);
    }
}

json_t *cozy_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *error)
{
    if(!cozy_json_yajl_reads_as_jansson(buf, len, flags))
        return json_loadb(buf, len, flags, error);
    builder b = {.dups = (flags & JSON_REJECT_DUPLICATES) != 0};
    yajl_handle h = yajl_alloc(&callbacks, NULL, &b);
    if(!h)
        return json_loadb(buf, len, flags, error);
    int ok = yajl_parse(h, (const unsigned char *)buf, len) == yajl_status_ok &&
             yajl_complete_parse(h) == yajl_status_ok && b.root && b.depth == 0 &&
             ((flags & JSON_DECODE_ANY) || json_is_object(b.root) || json_is_array(b.root));
    yajl_free(h);
    if(!ok) {
        cozy_json_builder_free(&b);
        return json_loadb(buf, len, flags, error);
    }
    json_t *root = b.root;
    b.root = NULL;
    cozy_json_builder_free(&b);
    cozy_json_loaded(error, len);
    return root;
}
