/* patch.c — JSON merge patch (RFC 7386) and JSON patch (RFC 6902) for the
 * kube-double, applied to copies: stored objects are never mutated.
 * Error wording follows github.com/evanphx/json-patch, which the API server
 * uses (k8s.io/apiserver/pkg/endpoints/handlers/patch.go).
 */
#include "double.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *merge(const json_t *target, const json_t *patch, int strategic)
{
    if (!json_is_object(patch)) return json_deep_copy(patch);
    json_t *out = json_is_object(target) ? json_deep_copy(target) : json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)patch, k, v) {
        if (strategic && k[0] == '$') continue;   /* $patch, $setElementOrder/…, $retainKeys */
        if (json_is_null(v)) {
            json_object_del(out, k);
        } else {
            json_t *m = merge(json_object_get(out, k), v, strategic);
            json_object_set_new(out, k, m);
        }
    }
    return out;
}

json_t *dbl_merge_patch(const json_t *target, const json_t *patch, int strategic)
{
    return merge(target, patch, strategic);
}

/* Decodes one RFC 6901 reference token in place (~1 → /, ~0 → ~). */
static void unescape(char *t)
{
    char *w = t;
    for (char *r = t; *r; r++) {
        if (r[0] == '~' && r[1] == '1') { *w++ = '/'; r++; }
        else if (r[0] == '~' && r[1] == '0') { *w++ = '~'; r++; }
        else *w++ = *r;
    }
    *w = '\0';
}

/* Array index token: digits only, no leading zero (RFC 6901 §4). */
static int index_of(const char *t, size_t *out)
{
    if (!*t || (t[0] == '0' && t[1])) return -1;
    size_t v = 0;
    for (const char *p = t; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (size_t)(*p - '0');
    }
    *out = v;
    return 0;
}

/* Resolves the parent container of pointer `path` in doc; *last gets the
 * malloc'd, decoded last token. Returns the parent (borrowed) or NULL. */
static json_t *parent_of(json_t *doc, const char *path, char **last)
{
    *last = NULL;
    if (path[0] != '/') return NULL;
    char *copy = strdup(path + 1);
    json_t *cur = doc;
    char *tok = copy;
    for (;;) {
        char *slash = strchr(tok, '/');
        if (!slash) break;
        *slash = '\0';
        unescape(tok);
        size_t i;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur) && index_of(tok, &i) == 0) cur = json_array_get(cur, i);
        else cur = NULL;
        if (!cur) { free(copy); return NULL; }
        tok = slash + 1;
    }
    unescape(tok);
    *last = strdup(tok);
    free(copy);
    return cur;
}

static json_t *get_ptr(json_t *doc, const char *path)
{
    if (!*path) return doc;
    char *last;
    json_t *p = parent_of(doc, path, &last);
    json_t *v = NULL;
    size_t i;
    if (p && json_is_object(p)) v = json_object_get(p, last);
    else if (p && json_is_array(p) && index_of(last, &i) == 0) v = json_array_get(p, i);
    free(last);
    return v;
}

/* add: value stolen. Returns 0 or -1. */
static int op_add(json_t *doc, const char *path, json_t *value, char *err, size_t errlen)
{
    char *last;
    json_t *p = parent_of(doc, path, &last);
    int rc = -1;
    size_t i;
    if (!p) snprintf(err, errlen, "add operation does not apply: doc is missing path: \"%s\": missing value", path);
    else if (json_is_object(p)) rc = json_object_set_new(p, last, json_incref(value));
    else if (json_is_array(p) && !strcmp(last, "-")) rc = json_array_append(p, value);
    else if (json_is_array(p) && index_of(last, &i) == 0 && i <= json_array_size(p)) rc = json_array_insert(p, i, value);
    else snprintf(err, errlen, "add operation does not apply: doc is missing path: \"%s\": missing value", path);
    json_decref(value);
    free(last);
    return rc;
}

static int op_remove(json_t *doc, const char *path, const char *opname, char *err, size_t errlen)
{
    char *last;
    json_t *p = parent_of(doc, path, &last);
    int rc = -1;
    size_t i;
    if (p && json_is_object(p) && json_object_get(p, last)) rc = json_object_del(p, last);
    else if (p && json_is_array(p) && index_of(last, &i) == 0 && i < json_array_size(p)) rc = json_array_remove(p, i);
    if (rc < 0) snprintf(err, errlen, "%s operation does not apply: doc is missing key: %s: missing value", opname, path);
    free(last);
    return rc;
}

json_t *dbl_json_patch(const json_t *doc0, const json_t *ops, char *err, size_t errlen)
{
    if (!json_is_array(ops)) { snprintf(err, errlen, "json patch must be an array of operations"); return NULL; }
    json_t *doc = json_deep_copy(doc0);
    size_t n;
    json_t *o;
    json_array_foreach(ops, n, o) {
        const char *op = json_string_value(json_object_get(o, "op"));
        const char *path = json_string_value(json_object_get(o, "path"));
        const char *from = json_string_value(json_object_get(o, "from"));
        json_t *value = json_object_get(o, "value");
        int rc = 0;
        if (!op || !path) { snprintf(err, errlen, "operation missing op or path"); rc = -1; }
        else if (!strcmp(op, "add")) {
            if (!value) { snprintf(err, errlen, "add operation missing value"); rc = -1; }
            else rc = op_add(doc, path, json_deep_copy(value), err, errlen);
        } else if (!strcmp(op, "remove")) {
            rc = op_remove(doc, path, "remove", err, errlen);
        } else if (!strcmp(op, "replace")) {
            if (!value) { snprintf(err, errlen, "replace operation missing value"); rc = -1; }
            else if (!get_ptr(doc, path)) { snprintf(err, errlen, "replace operation does not apply: doc is missing key: %s: missing value", path); rc = -1; }
            else { op_remove(doc, path, "replace", err, errlen); rc = op_add(doc, path, json_deep_copy(value), err, errlen); }
        } else if (!strcmp(op, "move") || !strcmp(op, "copy")) {
            json_t *v = from ? get_ptr(doc, from) : NULL;
            if (!v) { snprintf(err, errlen, "%s operation does not apply: doc is missing from path: %s: missing value", op, from ? from : ""); rc = -1; }
            else {
                json_t *c = json_deep_copy(v);
                if (op[0] == 'm') op_remove(doc, from, "move", err, errlen);
                rc = op_add(doc, path, c, err, errlen);
            }
        } else if (!strcmp(op, "test")) {
            json_t *v = get_ptr(doc, path);
            if (!v || !value || !json_equal(v, value)) { snprintf(err, errlen, "testing value %s failed: test failed", path); rc = -1; }
        } else {
            snprintf(err, errlen, "Unexpected kind: %s", op);
            rc = -1;
        }
        if (rc < 0) { json_decref(doc); return NULL; }
    }
    return doc;
}
