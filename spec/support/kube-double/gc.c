/* gc.c — owner references and deletion options for kube-double: the
 * API server's side of garbage collection, as pure functions over JSON.
 *
 * Sources (Kubernetes v1.32):
 *  - k8s.io/apimachinery/pkg/api/validation/objectmeta.go:
 *    ValidateOwnerReferences, validateOwnerReference, BannedOwners,
 *    ValidateFinalizers (the orphan/foregroundDeletion conflict);
 *  - k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go:
 *    ValidateDeleteOptions;
 *  - k8s.io/apiserver/pkg/registry/generic/registry/store.go:
 *    deletionFinalizersForGarbageCollection, shouldOrphanDependents,
 *    shouldDeleteDependents (default policy: DeleteDependents, i.e.
 *    Background, for every kind the double serves);
 *  - k8s.io/apimachinery/pkg/util/validation/field/errors.go: ErrorBody
 *    (%q for strings, Go's %#v for other values).
 * The collector's side (who goes when) is in double.c, which owns the store.
 */
#include "double.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cause(json_t *causes, const char *reason, const char *field, const char *msg)
{
    json_array_append_new(causes, json_pack("{s:s,s:s,s:s}", "reason", reason, "message", msg, "field", field));
}

/* Go's %q / %#v of a string: quoted, with \" \\ and control characters escaped. */
static void go_quote(char *out, size_t n, const char *s)
{
    size_t o = 0;
    if (o + 1 < n) out[o++] = '"';
    for (; s && *s && o + 6 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { out[o++] = '\\'; out[o++] = (char)c; }
        else if (c == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else if (c == '\t') { out[o++] = '\\'; out[o++] = 't'; }
        else if (c < 0x20) o += (size_t)snprintf(out + o, n - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    if (o + 1 < n) out[o++] = '"';
    out[o < n ? o : n - 1] = '\0';
}

/* %#v of a *bool field: (*bool)(nil), or a pointer. The real server prints
 * a Go heap address there, which no client can predict; the double prints
 * a fixed one. */
static const char *go_boolptr(const json_t *v)
{
    return json_is_boolean(v) ? "(*bool)(0xc000000000)" : "(*bool)(nil)";
}

/* %#v of a metav1.OwnerReference value, appended to buf. */
static void go_owner_ref(char *buf, size_t n, const json_t *ref)
{
    char av[600], k[600], nm[600], uid[600];
    go_quote(av, sizeof av, json_string_value(json_object_get(ref, "apiVersion")));
    go_quote(k, sizeof k, json_string_value(json_object_get(ref, "kind")));
    go_quote(nm, sizeof nm, json_string_value(json_object_get(ref, "name")));
    go_quote(uid, sizeof uid, json_string_value(json_object_get(ref, "uid")));
    size_t l = strlen(buf);
    snprintf(buf + l, n - l, "v1.OwnerReference{APIVersion:%s, Kind:%s, Name:%s, UID:%s, Controller:%s, BlockOwnerDeletion:%s}",
             av, k, nm, uid, go_boolptr(json_object_get(ref, "controller")),
             go_boolptr(json_object_get(ref, "blockOwnerDeletion")));
}

json_t *dbl_meta_validate(const json_t *obj)
{
    json_t *causes = json_array();
    const json_t *meta = json_object_get(obj, "metadata");
    const json_t *refs = json_object_get(meta, "ownerReferences");
    const char *F = "metadata.ownerReferences";
    char first[1200] = "";
    size_t i;
    json_t *ref;
    json_array_foreach(refs, i, ref) {
        const char *av = json_string_value(json_object_get(ref, "apiVersion")) ?: "";
        const char *kind = json_string_value(json_object_get(ref, "kind")) ?: "";
        const char *name = json_string_value(json_object_get(ref, "name")) ?: "";
        const char *uid = json_string_value(json_object_get(ref, "uid")) ?: "";
        /* schema.FromAPIVersionAndKind: "g/v" or "v"; a version is what
         * follows the last-but-only slash, empty for "" and "g/" */
        const char *slash = strchr(av, '/');
        const char *version = slash ? slash + 1 : av;
        char group[300] = "";
        if (slash) snprintf(group, sizeof group, "%.*s", (int)(slash - av), av);
        if (slash && strchr(version, '/')) version = "";   /* ParseGroupVersion fails: empty GroupVersion */
        char q[700], m[900];
        if (!*version) {
            go_quote(q, sizeof q, av);
            snprintf(m, sizeof m, "Invalid value: %s: version must not be empty", q);
            cause(causes, "FieldValueInvalid", "metadata.ownerReferences.apiVersion", m);
        }
        if (!*kind) {
            go_quote(q, sizeof q, kind);
            snprintf(m, sizeof m, "Invalid value: %s: kind must not be empty", q);
            cause(causes, "FieldValueInvalid", "metadata.ownerReferences.kind", m);
        }
        if (!*name) {
            go_quote(q, sizeof q, name);
            snprintf(m, sizeof m, "Invalid value: %s: name must not be empty", q);
            cause(causes, "FieldValueInvalid", "metadata.ownerReferences.name", m);
        }
        if (!*uid) {
            go_quote(q, sizeof q, uid);
            snprintf(m, sizeof m, "Invalid value: %s: uid must not be empty", q);
            cause(causes, "FieldValueInvalid", "metadata.ownerReferences.uid", m);
        }
        if (!*group && !strcmp(version, "v1") && !strcmp(kind, "Event")) {
            /* BannedOwners: core/v1 Event; the value is the reference itself */
            char v[3000] = "", mm[3200];
            go_owner_ref(v, sizeof v, ref);
            snprintf(mm, sizeof mm, "Invalid value: %s: /v1, Kind=Event is disallowed from being an owner", v);
            cause(causes, "FieldValueInvalid", F, mm);
        }
        if (json_is_true(json_object_get(ref, "controller"))) {
            char cur[1200];
            snprintf(cur, sizeof cur, "%s/%s", kind, name);
            if (*first) {
                /* the value is the whole list, printed with %#v */
                size_t cap = 64 + json_array_size(refs) * 3000;
                char *v = malloc(cap), *mm = malloc(cap + 3000);
                snprintf(v, cap, "[]v1.OwnerReference{");
                size_t j;
                json_t *r2;
                json_array_foreach(refs, j, r2) {
                    if (j) strncat(v, ", ", cap - strlen(v) - 1);
                    go_owner_ref(v, cap, r2);
                }
                strncat(v, "}", cap - strlen(v) - 1);
                snprintf(mm, cap + 3000, "Invalid value: %s: Only one reference can have Controller set to true. "
                         "Found \"true\" in references for %s and %s", v, first, cur);
                cause(causes, "FieldValueInvalid", F, mm);
                free(v);
                free(mm);
            } else {
                snprintf(first, sizeof first, "%s", cur);
            }
        }
    }
    /* ValidateFinalizers: orphan and foregroundDeletion exclude each other */
    const json_t *fin = json_object_get(meta, "finalizers");
    int orphan = 0, fg = 0;
    json_t *f;
    json_array_foreach(fin, i, f) {
        const char *s = json_string_value(f) ?: "";
        if (!strcmp(s, DBL_FINALIZER_ORPHAN)) orphan = 1;
        if (!strcmp(s, DBL_FINALIZER_FOREGROUND)) fg = 1;
    }
    if (orphan && fg) {
        char v[4096] = "[]string{", q[600];
        json_array_foreach(fin, i, f) {
            go_quote(q, sizeof q, json_string_value(f) ?: "");
            size_t l = strlen(v);
            snprintf(v + l, sizeof v - l, "%s%s", i ? ", " : "", q);
        }
        strncat(v, "}", sizeof v - strlen(v) - 1);
        char m[4300];
        snprintf(m, sizeof m, "Invalid value: %s: finalizer orphan and foregroundDeletion cannot be both set", v);
        cause(causes, "FieldValueInvalid", "metadata.finalizers", m);
    }
    return causes;
}

json_t *dbl_delete_options_validate(const json_t *opts)
{
    json_t *causes = json_array();
    const json_t *pp = json_object_get(opts, "propagationPolicy");
    const json_t *od = json_object_get(opts, "orphanDependents");
    if (json_is_null(pp)) pp = NULL;
    if (json_is_null(od)) od = NULL;
    char q[600], m[900];
    if (pp && od) {
        go_quote(q, sizeof q, json_string_value(pp) ?: "");
        snprintf(m, sizeof m, "Invalid value: %s: orphanDependents and deletionPropagation cannot be both set", q);
        cause(causes, "FieldValueInvalid", "propagationPolicy", m);
    }
    const char *p = json_string_value(pp);
    if (pp && (!p || (strcmp(p, "Foreground") && strcmp(p, "Background") && strcmp(p, "Orphan")))) {
        go_quote(q, sizeof q, p ?: "");
        snprintf(m, sizeof m, "Unsupported value: %s: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\"", q);
        cause(causes, "FieldValueNotSupported", "propagationPolicy", m);
    }
    return causes;
}

json_t *dbl_gc_finalizers(const json_t *finalizers, const json_t *opts)
{
    const json_t *od = json_object_get(opts, "orphanDependents");
    const char *pp = json_string_value(json_object_get(opts, "propagationPolicy"));
    int first = 0;   /* which of the two comes first: 1 orphan, 2 foregroundDeletion */
    size_t i;
    json_t *f;
    json_array_foreach(finalizers, i, f) {
        const char *s = json_string_value(f) ?: "";
        if (!first && !strcmp(s, DBL_FINALIZER_ORPHAN)) first = 1;
        if (!first && !strcmp(s, DBL_FINALIZER_FOREGROUND)) first = 2;
    }
    int orphan, fg;
    if (json_is_boolean(od)) {                       /* the legacy field wins over everything */
        orphan = json_is_true(od);
        fg = 0;
    } else if (pp && (!strcmp(pp, "Orphan") || !strcmp(pp, "Background") || !strcmp(pp, "Foreground"))) {
        orphan = !strcmp(pp, "Orphan");
        fg = !strcmp(pp, "Foreground");
    } else {                                          /* an existing finalizer decides; default Background */
        orphan = first == 1;
        fg = first == 2;
    }
    json_t *out = json_array();
    json_array_foreach(finalizers, i, f) {
        const char *s = json_string_value(f) ?: "";
        if (!strcmp(s, DBL_FINALIZER_ORPHAN) || !strcmp(s, DBL_FINALIZER_FOREGROUND)) continue;
        json_array_append(out, f);
    }
    if (orphan) json_array_append_new(out, json_string(DBL_FINALIZER_ORPHAN));
    if (fg) json_array_append_new(out, json_string(DBL_FINALIZER_FOREGROUND));
    return out;
}
