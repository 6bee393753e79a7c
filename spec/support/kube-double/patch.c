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

/* ---- strategic merge patch for Pods ---------------------------------------
 *
 * k8s.io/apimachinery/pkg/util/strategicpatch (patch.go, mergeMap and
 * mergeSlice) with the patch metadata of core/v1 Pod (the patchStrategy
 * and patchMergeKey struct tags in k8s.io/api/core/v1/types.go): lists
 * tagged `merge` are merged by their key, other lists are replaced, maps
 * are merged; the directives `$patch: replace|delete|merge` (in a map or
 * as a list element), `$retainKeys`, `$setElementOrder/F` and
 * `$deleteFromPrimitiveList/F` are honoured. Order: merged elements stay
 * where they were, new ones are appended, and `$setElementOrder` puts the
 * listed elements first in its order (upstream interleaves server-only
 * elements by their old positions instead). `$` keys left over are
 * dropped, as decoding into the typed Pod drops them. */

typedef struct { const char *path, *key; } merge_key;

static const merge_key POD_LISTS[] = {
    { "metadata.finalizers", "" },          /* primitive list, merge strategy */
    { "metadata.ownerReferences", "uid" },
    { "spec.volumes", "name" },
    { "spec.initContainers", "name" },
    { "spec.containers", "name" },
    { "spec.ephemeralContainers", "name" },
    { "spec.initContainers.ports", "containerPort" },
    { "spec.containers.ports", "containerPort" },
    { "spec.initContainers.env", "name" },
    { "spec.containers.env", "name" },
    { "spec.ephemeralContainers.env", "name" },
    { "spec.initContainers.volumeMounts", "mountPath" },
    { "spec.containers.volumeMounts", "mountPath" },
    { "spec.ephemeralContainers.volumeMounts", "mountPath" },
    { "spec.initContainers.volumeDevices", "devicePath" },
    { "spec.containers.volumeDevices", "devicePath" },
    { "spec.ephemeralContainers.volumeDevices", "devicePath" },
    { "spec.imagePullSecrets", "name" },
    { "spec.hostAliases", "ip" },
    { "spec.topologySpreadConstraints", "topologyKey" },
    { "spec.schedulingGates", "name" },
    { "spec.resourceClaims", "name" },
    { "status.conditions", "type" },
    { "status.podIPs", "ip" },
    { "status.hostIPs", "ip" },
    { "status.resourceClaimStatuses", "name" },
};

/* The merge key of the list at path, "" for a merged primitive list, NULL
 * for a list that is replaced. */
static const char *pod_list_key(const char *path)
{
    for (size_t i = 0; i < sizeof POD_LISTS / sizeof *POD_LISTS; i++)
        if (!strcmp(POD_LISTS[i].path, path)) return POD_LISTS[i].key;
    return NULL;
}

/* Removes every `$` key, at any depth (decoding into the typed object). */
static void strip_directives(json_t *v)
{
    if (json_is_object(v)) {
        const char *k;
        json_t *c;
        void *tmp;
        json_object_foreach_safe(v, tmp, k, c) {
            if (k[0] == '$') json_object_del(v, k);
            else strip_directives(c);
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *c;
        json_array_foreach(v, i, c) strip_directives(c);
    }
}

static int same_key(const json_t *a, const json_t *b, const char *key)
{
    json_t *x = json_object_get(a, key), *y = json_object_get(b, key);
    return x && y && json_equal(x, y);
}

static json_t *smp_map(const json_t *orig, const json_t *patch, const char *path);

/* mergeSlice: orig and patch are arrays; returns a new array. */
static json_t *smp_list(const json_t *orig, const json_t *patch, const char *path, const char *key)
{
    json_t *out = json_deep_copy(orig);
    size_t i;
    json_t *p;
    if (!*key) {   /* primitives: union, no duplicates */
        json_array_foreach(patch, i, p) {
            int have = 0;
            size_t j;
            json_t *o;
            json_array_foreach(out, j, o) if (json_equal(o, p)) have = 1;
            if (!have) json_array_append(out, p);
        }
        return out;
    }
    /* mergeSliceWithSpecialElements: `$patch: replace` replaces the list
     * with the other patch elements; `$patch: delete` removes by key */
    json_array_foreach(patch, i, p) {
        const char *d = json_string_value(json_object_get(p, "$patch"));
        if (d && !strcmp(d, "replace")) {
            json_decref(out);
            out = json_array();
            size_t j;
            json_t *q;
            json_array_foreach(patch, j, q) {
                if (json_object_get(q, "$patch")) continue;
                json_t *c = json_deep_copy(q);
                strip_directives(c);
                json_array_append_new(out, c);
            }
            return out;
        }
    }
    json_array_foreach(patch, i, p) {
        const char *d = json_string_value(json_object_get(p, "$patch"));
        if (d && !strcmp(d, "delete")) {
            for (size_t j = json_array_size(out); j-- > 0;)
                if (same_key(json_array_get(out, j), p, key)) json_array_remove(out, j);
            continue;
        }
        int found = 0;
        for (size_t j = 0; j < json_array_size(out); j++) {
            json_t *o = json_array_get(out, j);
            if (!same_key(o, p, key)) continue;
            json_array_set_new(out, j, smp_map(o, p, path));
            found = 1;
            break;
        }
        if (!found) {
            json_t *c = json_deep_copy(p);
            strip_directives(c);
            json_array_append_new(out, c);
        }
    }
    return out;
}

/* $setElementOrder/F: the listed elements first, in that order. */
static json_t *reorder(json_t *list, const json_t *order, const char *key)
{
    json_t *out = json_array(), *taken = json_array();
    size_t i, j;
    json_t *want, *o;
    for (j = 0; j < json_array_size(list); j++) json_array_append_new(taken, json_false());
    json_array_foreach(order, i, want) {
        json_array_foreach(list, j, o) {
            if (json_is_true(json_array_get(taken, j))) continue;
            if (*key ? same_key(o, want, key) : json_equal(o, want)) {
                json_array_append(out, o);
                json_array_set_new(taken, j, json_true());
                break;
            }
        }
    }
    json_array_foreach(list, j, o) if (!json_is_true(json_array_get(taken, j))) json_array_append(out, o);
    json_decref(taken);
    json_decref(list);
    return out;
}

static json_t *smp_map(const json_t *orig, const json_t *patch, const char *path)
{
    const char *d = json_string_value(json_object_get(patch, "$patch"));
    if (d && !strcmp(d, "replace")) {
        json_t *c = json_deep_copy(patch);
        strip_directives(c);
        return c;
    }
    if (d && !strcmp(d, "delete")) return json_object();
    json_t *out = json_is_object(orig) ? json_deep_copy(orig) : json_object();
    const json_t *retain = json_object_get(patch, "$retainKeys");
    if (json_is_array(retain)) {
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(out, tmp, k, v) {
            int keep = 0;
            size_t i;
            json_t *r;
            json_array_foreach(retain, i, r) if (json_is_string(r) && !strcmp(json_string_value(r), k)) keep = 1;
            if (!keep) json_object_del(out, k);
        }
    }
    const char *k;
    json_t *pv;
    json_object_foreach((json_t *)patch, k, pv) {
        if (!strncmp(k, "$deleteFromPrimitiveList/", 25)) {
            json_t *l = json_object_get(out, k + 25);
            if (json_is_array(l))
                for (size_t j = json_array_size(l); j-- > 0;) {
                    size_t i;
                    json_t *x;
                    json_array_foreach(pv, i, x) if (json_equal(x, json_array_get(l, j))) { json_array_remove(l, j); break; }
                }
            continue;
        }
        if (k[0] == '$') continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
        json_t *ov = json_object_get(out, k);
        if (json_is_null(pv)) { json_object_del(out, k); continue; }
        const char *key = pod_list_key(sub);
        if (json_is_object(pv) && json_is_object(ov)) {
            json_object_set_new(out, k, smp_map(ov, pv, sub));
        } else if (json_is_array(pv) && json_is_array(ov) && key) {
            json_object_set_new(out, k, smp_list(ov, pv, sub, key));
        } else {
            json_t *c = json_deep_copy(pv);
            if (json_is_array(c) && key && *key)   /* new list: `$patch: delete` elements have nothing to delete */
                for (size_t j = json_array_size(c); j-- > 0;)
                    if (json_object_get(json_array_get(c, j), "$patch")) json_array_remove(c, j);
            strip_directives(c);
            json_object_set_new(out, k, c);
        }
    }
    json_object_foreach((json_t *)patch, k, pv) {
        if (strncmp(k, "$setElementOrder/", 17)) continue;
        json_t *l = json_object_get(out, k + 17);
        char sub[512];
        snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k + 17);
        const char *key = pod_list_key(sub);
        if (json_is_array(l) && json_is_array(pv) && key)
            json_object_set_new(out, k + 17, reorder(json_incref(l), pv, key));
    }
    return out;
}

json_t *dbl_strategic_patch_pod(const json_t *target, const json_t *patch)
{
    if (!json_is_object(patch)) return json_deep_copy(patch);
    return smp_map(target, patch, "");
}
