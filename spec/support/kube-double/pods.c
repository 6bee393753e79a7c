/* pods.c — the Pod rules of kube-apiserver v1.32 that cozygpu's binder
 * relies on: scheduling gates (KEP-3521), the mutable scheduling directives
 * of gated pods (KEP-3838), the PodScheduled=False/SchedulingGated
 * condition set at create, and the general "pod updates may not change
 * fields other than ..." rule around them.
 *
 * Sources (k8s.io/kubernetes v1.32):
 *  - pkg/apis/core/validation/validation.go: ValidatePodCreate (nodeName
 *    with gates), validateSchedulingGates (qualified names, duplicates),
 *    ValidatePodUpdate (container count and images, activeDeadlineSeconds,
 *    validateOnlyAddedTolerations, validateOnlyDeletedSchedulingGates, the
 *    munging of updatable fields, and for a pod whose OLD version has gates
 *    validateNodeSelectorMutation / validateNodeAffinityMutation /
 *    validateNodeSelectorTermHasOnlyAdditions), updatablePodSpecFields;
 *  - pkg/registry/core/pod/strategy.go: PrepareForCreate →
 *    applySchedulingGatedCondition (PodScheduled False, reason
 *    SchedulingGated, lastTransitionTime set since v1.30, PR 122636);
 *  - staging/src/k8s.io/apimachinery/pkg/util/validation/field/errors.go
 *    (v0.32): ErrorBody renders a string bad value with %q, an integer with
 *    %v, a nil pointer as null and anything else with Go's %#v of the
 *    internal type (so a node selector reads map[string]string{...});
 *  - staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go:
 *    IsQualifiedName and its messages.
 *
 * Values are compared like apiequality.Semantic.DeepEqual on the internal
 * types as far as JSON allows: an absent member, null, [] and {} are equal
 * (nil and empty slices and maps are equal there); "" / 0 / false are NOT
 * equated with absent, since the double does not know which fields are
 * pointers. The double applies no defaulting, so two specs that the real
 * server would make equal by defaulting can differ here.
 *
 * Not checked: the rest of pod spec validation (containers, volumes,
 * resources, security contexts...), metadata update rules, the status
 * subresource's rules, ephemeral containers and resize. The text after the
 * first line of the "pod updates may not change fields" message is go-cmp's
 * diff on the real server (deliberately unstable output); the double writes
 * its own short JSON diff there.
 */
#include "double.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a growable string ---------------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->n + n + 1) cap *= 2;
        b->s = realloc(b->s, cap);
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Go's strconv.Quote for the ASCII range (bytes >= 0x80 are copied as they
 * are, which matches Quote for valid, printable UTF-8). */
static void sb_goquote(sbuf *b, const char *s)
{
    sb_str(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        switch (*p) {
        case '"': sb_str(b, "\\\""); break;
        case '\\': sb_str(b, "\\\\"); break;
        case '\a': sb_str(b, "\\a"); break;
        case '\b': sb_str(b, "\\b"); break;
        case '\f': sb_str(b, "\\f"); break;
        case '\n': sb_str(b, "\\n"); break;
        case '\r': sb_str(b, "\\r"); break;
        case '\t': sb_str(b, "\\t"); break;
        case '\v': sb_str(b, "\\v"); break;
        default:
            if (*p < 0x20 || *p == 0x7f) { snprintf(e, sizeof e, "\\x%02x", *p); sb_str(b, e); }
            else sb_add(b, (const char *)p, 1);
        }
    }
    sb_str(b, "\"");
}

static const char *str_of(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* ---- Go %#v of the internal types named in error messages ---------------- */

/* map[string]string: keys sorted, as fmt prints maps. */
static void gov_string_map(sbuf *b, const json_t *m)
{
    if (!json_is_object(m)) { sb_str(b, "map[string]string(nil)"); return; }
    size_t n = json_object_size(m), i = 0;
    const char **keys = calloc(n ? n : 1, sizeof *keys);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v) keys[i++] = k;
    for (size_t a = 1; a < n; a++)   /* insertion sort: a handful of keys */
        for (size_t c = a; c > 0 && strcmp(keys[c - 1], keys[c]) > 0; c--) {
            const char *t = keys[c]; keys[c] = keys[c - 1]; keys[c - 1] = t;
        }
    sb_str(b, "map[string]string{");
    for (i = 0; i < n; i++) {
        if (i) sb_str(b, ", ");
        sb_goquote(b, keys[i]);
        sb_str(b, ":");
        sb_goquote(b, str_of(m, keys[i]));
    }
    sb_str(b, "}");
    free(keys);
}

static void gov_strings(sbuf *b, const json_t *a)
{
    if (!json_is_array(a)) { sb_str(b, "[]string(nil)"); return; }
    sb_str(b, "[]string{");
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (i) sb_str(b, ", ");
        sb_goquote(b, json_string_value(v) ? json_string_value(v) : "");
    }
    sb_str(b, "}");
}

static void gov_requirements(sbuf *b, const json_t *a)
{
    if (!json_is_array(a)) { sb_str(b, "[]core.NodeSelectorRequirement(nil)"); return; }
    sb_str(b, "[]core.NodeSelectorRequirement{");
    size_t i;
    json_t *r;
    json_array_foreach(a, i, r) {
        if (i) sb_str(b, ", ");
        sb_str(b, "core.NodeSelectorRequirement{Key:");
        sb_goquote(b, str_of(r, "key"));
        sb_str(b, ", Operator:");
        sb_goquote(b, str_of(r, "operator"));
        sb_str(b, ", Values:");
        gov_strings(b, json_object_get(r, "values"));
        sb_str(b, "}");
    }
    sb_str(b, "}");
}

static void gov_term(sbuf *b, const json_t *t)
{
    sb_str(b, "core.NodeSelectorTerm{MatchExpressions:");
    gov_requirements(b, json_object_get(t, "matchExpressions"));
    sb_str(b, ", MatchFields:");
    gov_requirements(b, json_object_get(t, "matchFields"));
    sb_str(b, "}");
}

static void gov_terms(sbuf *b, const json_t *a)
{
    if (!json_is_array(a)) { sb_str(b, "[]core.NodeSelectorTerm(nil)"); return; }
    sb_str(b, "[]core.NodeSelectorTerm{");
    size_t i;
    json_t *t;
    json_array_foreach(a, i, t) {
        if (i) sb_str(b, ", ");
        gov_term(b, t);
    }
    sb_str(b, "}");
}

/* ---- field errors (field.ErrorList as StatusCauses) ----------------------- */

/* Appends {"reason": type, "message": body, "field": path} to causes; body
 * is ErrorBody(): "<Type string>[: <value>][: <detail>]". */
static void add_cause(json_t *causes, const char *reason, const char *field, const char *body)
{
    json_array_append_new(causes, json_pack("{s:s,s:s,s:s}", "reason", reason, "message", body, "field", field));
}

static void err_forbidden(json_t *causes, const char *field, const char *detail)
{
    sbuf b = { 0 };
    sb_str(&b, "Forbidden: ");
    sb_str(&b, detail);
    add_cause(causes, "FieldValueForbidden", field, b.s);
    free(b.s);
}

static void err_required(json_t *causes, const char *field, const char *detail)
{
    sbuf b = { 0 };
    sb_str(&b, "Required value");
    if (*detail) { sb_str(&b, ": "); sb_str(&b, detail); }
    add_cause(causes, "FieldValueRequired", field, b.s);
    free(b.s);
}

/* value: the bad value already rendered as ErrorBody renders it */
static void err_invalid(json_t *causes, const char *field, const char *value, const char *detail)
{
    sbuf b = { 0 };
    sb_str(&b, "Invalid value: ");
    sb_str(&b, value);
    if (*detail) { sb_str(&b, ": "); sb_str(&b, detail); }
    add_cause(causes, "FieldValueInvalid", field, b.s);
    free(b.s);
}

static void err_invalid_string(json_t *causes, const char *field, const char *value, const char *detail)
{
    sbuf v = { 0 };
    sb_goquote(&v, value);
    err_invalid(causes, field, v.s, detail);
    free(v.s);
}

static void err_duplicate_string(json_t *causes, const char *field, const char *value)
{
    sbuf b = { 0 };
    sb_str(&b, "Duplicate value: ");
    sb_goquote(&b, value);
    add_cause(causes, "FieldValueDuplicate", field, b.s);
    free(b.s);
}

/* ---- semantic equality ------------------------------------------------------ */

static int is_empty(const json_t *v)
{
    return !v || json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0) ||
           (json_is_object(v) && json_object_size(v) == 0);
}

/* Like apiequality.Semantic.DeepEqual as far as JSON tells: absent, null,
 * [] and {} are equal. */
static int sem_equal(const json_t *a, const json_t *b)
{
    if (is_empty(a) || is_empty(b)) return is_empty(a) && is_empty(b);
    if (json_is_object(a) && json_is_object(b)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v)
            if (!sem_equal(v, json_object_get(b, k))) return 0;
        json_object_foreach((json_t *)b, k, v)
            if (!json_object_get(a, k) && !is_empty(v)) return 0;
        return 1;
    }
    if (json_is_array(a) && json_is_array(b)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!sem_equal(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    return json_equal((json_t *)a, (json_t *)b);
}

/* ---- k8s.io/apimachinery/pkg/util/validation ------------------------------ */

#define QNAME_ERR "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
#define QNAME_FMT "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
#define QNAME_EXAMPLES "(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '" QNAME_FMT "')"
#define DNS1123_SUB_ERR "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
#define DNS1123_SUB_FMT "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"

static int is_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
static int is_lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

/* ^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$ */
static int qname_ok(const char *s, size_t n)
{
    if (n == 0 || !is_alnum(s[0]) || !is_alnum(s[n - 1])) return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_alnum(s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.') return 0;
    return 1;
}

/* ^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ */
static int dns1123_subdomain_ok(const char *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && s[i] != '.') {
            if (!is_lower_alnum(s[i]) && s[i] != '-') return 0;
            continue;
        }
        size_t len = i - start;   /* one label */
        if (len == 0 || !is_lower_alnum(s[start]) || !is_lower_alnum(s[i - 1])) return 0;
        start = i + 1;
    }
    return 1;
}

/* IsQualifiedName: appends one Invalid cause per message to causes. */
static void validate_qualified_name(json_t *causes, const char *field, const char *v)
{
    const char *slash = strchr(v, '/');
    const char *name = v;
    if (slash && strchr(slash + 1, '/')) {
        err_invalid_string(causes, field, v, "a qualified name " QNAME_ERR " " QNAME_EXAMPLES
                           " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')");
        return;
    }
    if (slash) {
        size_t pl = (size_t)(slash - v);
        name = slash + 1;
        if (pl == 0) err_invalid_string(causes, field, v, "prefix part must be non-empty");
        else {
            if (pl > 253) err_invalid_string(causes, field, v, "prefix part must be no more than 253 characters");
            if (!dns1123_subdomain_ok(v, pl))
                err_invalid_string(causes, field, v, "prefix part " DNS1123_SUB_ERR
                                   " (e.g. 'example.com', regex used for validation is '" DNS1123_SUB_FMT "')");
        }
    }
    size_t nl = strlen(name);
    if (nl == 0) err_invalid_string(causes, field, v, "name part must be non-empty");
    else if (nl > 63) err_invalid_string(causes, field, v, "name part must be no more than 63 characters");
    if (!qname_ok(name, nl)) err_invalid_string(causes, field, v, "name part " QNAME_ERR " " QNAME_EXAMPLES);
}

/* validateSchedulingGates: names are qualified names, no duplicates. Part
 * of ValidatePodSpec, so it runs on create and on every update. */
static void validate_scheduling_gates(json_t *causes, const json_t *gates)
{
    size_t i;
    json_t *g;
    json_array_foreach(gates, i, g) {
        char f[64];
        snprintf(f, sizeof f, "spec.schedulingGates[%zu]", i);
        const char *name = str_of(g, "name");
        validate_qualified_name(causes, f, name);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(str_of(json_array_get(gates, j), "name"), name)) {
                err_duplicate_string(causes, f, name);
                break;
            }
    }
}

static const json_t *spec_of(const json_t *pod) { return json_object_get(pod, "spec"); }

static size_t gates_of(const json_t *pod)
{
    const json_t *g = json_object_get(spec_of(pod), "schedulingGates");
    return json_is_array(g) ? json_array_size(g) : 0;
}

/* ---- create --------------------------------------------------------------- */

json_t *dbl_pod_validate_create(const json_t *pod)
{
    json_t *causes = json_array();
    const json_t *spec = spec_of(pod);
    validate_scheduling_gates(causes, json_object_get(spec, "schedulingGates"));
    /* ValidatePodCreate: "A Pod cannot be assigned a Node if there are
     * remaining scheduling gates." */
    if (*str_of(spec, "nodeName") && gates_of(pod))
        err_forbidden(causes, "spec.nodeName", "cannot be set until all schedulingGates have been cleared");
    return causes;
}

void dbl_pod_prepare_create(json_t *pod, const char *now)
{
    json_t *status = json_pack("{s:s}", "phase", "Pending");
    if (gates_of(pod))
        json_object_set_new(status, "conditions", json_pack("[{s:s,s:s,s:n,s:s,s:s,s:s}]",
            "type", "PodScheduled", "status", "False", "lastProbeTime", "lastTransitionTime", now,
            "reason", "SchedulingGated", "message", "Scheduling is blocked due to non-empty scheduling gates"));
    json_object_set_new(pod, "status", status);
}

/* ---- update --------------------------------------------------------------- */

static const char *UPDATABLE =
    "`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
    "`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/* ValidateContainerUpdates: 1 when validation stops (count changed). */
static int container_updates(json_t *causes, const json_t *nc, const json_t *oc, const char *path)
{
    if (json_array_size(nc) != json_array_size(oc)) {
        err_forbidden(causes, path, "pod updates may not add or remove containers");
        return 1;
    }
    size_t i;
    json_t *c;
    json_array_foreach(nc, i, c) {
        const char *img = str_of(c, "image");
        char f[128];
        snprintf(f, sizeof f, "%s[%zu].image", path, i);
        size_t l = strlen(img);
        if (l == 0) err_required(causes, f, "");
        if (l && (strchr(" \t\n\v\f\r", img[0]) || strchr(" \t\n\v\f\r", img[l - 1])))
            err_invalid_string(causes, f, img, "must not have leading or trailing whitespace");
    }
    return 0;
}

static int same_toleration_but_seconds(const json_t *a, const json_t *b)
{
    static const char *k[] = { "key", "operator", "value", "effect" };
    for (size_t i = 0; i < 4; i++)
        if (strcmp(str_of(a, k[i]), str_of(b, k[i]))) return 0;
    return 1;
}

/* validateOnlyDeletedSchedulingGates: one Forbidden per gate name the old
 * list lacks, at the index of its last occurrence (upstream iterates a Go
 * map, so several such errors come in random order; here in index order). */
static void only_deleted_gates(json_t *causes, const json_t *ng, const json_t *og)
{
    size_t i;
    json_t *g;
    json_array_foreach(ng, i, g) {
        const char *name = str_of(g, "name");
        int later = 0, old = 0;
        for (size_t j = i + 1; j < json_array_size(ng); j++)
            if (!strcmp(str_of(json_array_get(ng, j), "name"), name)) later = 1;
        size_t k;
        json_t *o;
        json_array_foreach(og, k, o) if (!strcmp(str_of(o, "name"), name)) old = 1;
        if (later || old) continue;
        char f[64];
        snprintf(f, sizeof f, "spec.schedulingGates[%zu].name", i);
        sbuf d = { 0 };
        sb_str(&d, "only deletion is allowed, but found new scheduling gate '");
        sb_str(&d, name);
        sb_str(&d, "'");
        err_forbidden(causes, f, d.s);
        free(d.s);
    }
}

static const json_t *required_of(const json_t *na)
{
    const json_t *r = json_object_get(na, "requiredDuringSchedulingIgnoredDuringExecution");
    return json_is_null(r) ? NULL : r;
}

/* validateNodeSelectorTermHasOnlyAdditions */
static int term_only_additions(const json_t *nt, const json_t *ot)
{
    static const char *lists[] = { "matchExpressions", "matchFields" };
    const json_t *oe = json_object_get(ot, "matchExpressions"), *of = json_object_get(ot, "matchFields");
    if (json_array_size(oe) == 0 && json_array_size(of) == 0 &&
        (json_array_size(json_object_get(nt, "matchExpressions")) > 0 ||
         json_array_size(json_object_get(nt, "matchFields")) > 0))
        return 0;
    for (size_t k = 0; k < 2; k++) {
        const json_t *o = json_object_get(ot, lists[k]), *n = json_object_get(nt, lists[k]);
        size_t l = json_array_size(o);
        if (l == 0) continue;
        if (json_array_size(n) < l) return 0;
        for (size_t i = 0; i < l; i++)
            if (!sem_equal(json_array_get(n, i), json_array_get(o, i))) return 0;
    }
    return 1;
}

/* validateNodeAffinityMutation */
static void node_affinity_mutation(json_t *causes, const json_t *nna, const json_t *ona)
{
    const json_t *oreq = required_of(ona);
    if (!json_is_object(ona) || !oreq) return;   /* old was nil: anything can be set */
    const json_t *ot = json_object_get(oreq, "nodeSelectorTerms");
    const json_t *nreq = json_is_object(nna) ? required_of(nna) : NULL;
    const json_t *nt = nreq ? json_object_get(nreq, "nodeSelectorTerms") : NULL;
    if (json_is_null(nt)) nt = NULL;
    const char *tp = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
    size_t on = json_array_size(ot);
    if (on > 0 && on != json_array_size(nt)) {
        sbuf v = { 0 };
        gov_terms(&v, nt);
        err_invalid(causes, tp, v.s, "no additions/deletions to non-empty NodeSelectorTerms list are allowed");
        free(v.s);
        return;
    }
    for (size_t i = 0; i < on; i++) {
        const json_t *n = json_array_get(nt, i);
        if (term_only_additions(n, json_array_get(ot, i))) continue;
        char f[256];
        snprintf(f, sizeof f, "%s[%zu]", tp, i);
        sbuf v = { 0 };
        gov_term(&v, n);
        err_invalid(causes, f, v.s, "only additions are allowed (no mutations or deletions)");
        free(v.s);
    }
}

static const json_t *get_nonnull(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

json_t *dbl_pod_validate_update(const json_t *newp, const json_t *oldp)
{
    json_t *causes = json_array();
    const json_t *ns = spec_of(newp), *os = spec_of(oldp);
    /* validatePodMetadataAndSpec → ValidatePodSpec (the part done here) */
    validate_scheduling_gates(causes, json_object_get(ns, "schedulingGates"));

    if (container_updates(causes, json_object_get(ns, "containers"), json_object_get(os, "containers"),
                          "spec.containers") ||
        container_updates(causes, json_object_get(ns, "initContainers"), json_object_get(os, "initContainers"),
                          "spec.initContainers"))
        return causes;

    const json_t *nad = get_nonnull(ns, "activeDeadlineSeconds"), *oad = get_nonnull(os, "activeDeadlineSeconds");
    if (nad) {
        json_int_t v = json_integer_value(nad);
        char val[32];
        snprintf(val, sizeof val, "%lld", (long long)v);
        if (v < 0 || v > 2147483647) {
            err_invalid(causes, "spec.activeDeadlineSeconds", val, "must be between 0 and 2147483647, inclusive");
            return causes;
        }
        if (oad && json_integer_value(oad) < v) {
            err_invalid(causes, "spec.activeDeadlineSeconds", val, "must be less than or equal to previous value");
            return causes;
        }
    } else if (oad) {
        err_invalid(causes, "spec.activeDeadlineSeconds", "null", "must not update from a positive integer to nil value");
    }

    /* validateOnlyAddedTolerations (the toleration rules of ValidateTolerations are not repeated) */
    size_t i;
    json_t *ot;
    json_array_foreach(json_object_get(os, "tolerations"), i, ot) {
        int found = 0;
        size_t j;
        json_t *nt;
        json_array_foreach(json_object_get(ns, "tolerations"), j, nt) if (same_toleration_but_seconds(ot, nt)) found = 1;
        if (!found) {
            err_forbidden(causes, "spec.tolerations", "existing toleration can not be modified except its tolerationSeconds");
            break;
        }
    }

    only_deleted_gates(causes, json_object_get(ns, "schedulingGates"), json_object_get(os, "schedulingGates"));

    if (sem_equal(ns, os)) return causes;

    /* munge the updatable fields to their old values */
    json_t *m = json_is_object(ns) ? json_deep_copy(ns) : json_object();
    static const char *lists[] = { "containers", "initContainers" };
    for (size_t k = 0; k < 2; k++) {
        json_t *c;
        json_array_foreach(json_object_get(m, lists[k]), i, c) {
            json_t *img = json_object_get(json_array_get(json_object_get(os, lists[k]), i), "image");
            if (img) json_object_set(c, "image", img);
            else json_object_del(c, "image");
        }
    }
    static const char *same[] = { "activeDeadlineSeconds", "schedulingGates", "tolerations" };
    for (size_t k = 0; k < 3; k++) {
        json_t *v = json_object_get(os, same[k]);
        if (v) json_object_set(m, same[k], v);
        else json_object_del(m, same[k]);
    }
    const json_t *ogp = get_nonnull(os, "terminationGracePeriodSeconds"), *mgp = get_nonnull(m, "terminationGracePeriodSeconds");
    if (ogp && json_integer_value(ogp) < 0 && mgp && json_integer_value(mgp) == 1)
        json_object_set(m, "terminationGracePeriodSeconds", (json_t *)ogp);

    /* KEP-3838: while the OLD pod has gates, its node selector may gain
     * entries and its required node affinity may be narrowed */
    if (gates_of(oldp)) {
        const json_t *osel = json_object_get(os, "nodeSelector"), *msel = json_object_get(m, "nodeSelector");
        if (!sem_equal(msel, osel)) {
            const char *k;
            json_t *v;
            json_object_foreach((json_t *)osel, k, v) {
                const json_t *nv = json_object_get(msel, k);
                if (!json_is_string(nv) || strcmp(json_string_value(nv), str_of(osel, k))) {
                    sbuf b = { 0 };
                    gov_string_map(&b, msel);
                    err_invalid(causes, "spec.nodeSelector", b.s,
                                "only additions to spec.nodeSelector are allowed (no mutations or deletions)");
                    free(b.s);
                    break;
                }
            }
            if (osel) json_object_set(m, "nodeSelector", (json_t *)osel);
            else json_object_del(m, "nodeSelector");
        }
        const json_t *oaff = get_nonnull(os, "affinity");
        json_t *maff = (json_t *)get_nonnull(m, "affinity");
        const json_t *ona = oaff ? get_nonnull(oaff, "nodeAffinity") : NULL;
        const json_t *mna = maff ? get_nonnull(maff, "nodeAffinity") : NULL;
        if (!sem_equal(ona, mna)) {
            node_affinity_mutation(causes, mna, ona);
            if (!maff && !ona) {
                /* already effectively nil */
            } else if (!maff) {
                json_object_set_new(m, "affinity", json_pack("{s:O}", "nodeAffinity", (json_t *)ona));
            } else if (!oaff && !get_nonnull(maff, "podAffinity") && !get_nonnull(maff, "podAntiAffinity")) {
                json_object_del(m, "affinity");
            } else if (ona) {
                json_object_set(maff, "nodeAffinity", (json_t *)ona);
            } else {
                json_object_del(maff, "nodeAffinity");
            }
        }
    }

    if (!sem_equal(m, os)) {
        sbuf d = { 0 };
        sb_str(&d, "pod updates may not change fields other than ");
        sb_str(&d, UPDATABLE);
        sb_str(&d, "\n");
        /* the real server prints go-cmp's diff here; the double a JSON one */
        const char *k;
        json_t *v;
        json_t *keys = json_object();
        json_object_foreach((json_t *)os, k, v) json_object_set_new(keys, k, json_true());
        json_object_foreach(m, k, v) json_object_set_new(keys, k, json_true());
        json_object_foreach(keys, k, v) {
            const json_t *a = json_object_get(os, k), *b = json_object_get(m, k);
            if (sem_equal(a, b)) continue;
            char *sa = a ? json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS) : NULL;
            char *sbv = b ? json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS) : NULL;
            sb_str(&d, "  - ");
            sb_str(&d, k);
            sb_str(&d, ": ");
            sb_str(&d, sa ? sa : "(absent)");
            sb_str(&d, "\n  + ");
            sb_str(&d, k);
            sb_str(&d, ": ");
            sb_str(&d, sbv ? sbv : "(absent)");
            sb_str(&d, "\n");
            free(sa);
            free(sbv);
        }
        json_decref(keys);
        err_forbidden(causes, "spec", d.s);
        free(d.s);
    }
    json_decref(m);
    return causes;
}

void dbl_pod_normalize(json_t *pod)
{
    json_t *spec = json_object_get(pod, "spec");
    static const char *omitempty[] = { "schedulingGates", "nodeSelector", "tolerations" };
    for (size_t i = 0; i < sizeof omitempty / sizeof *omitempty; i++)
        if (json_object_get(spec, omitempty[i]) && is_empty(json_object_get(spec, omitempty[i])))
            json_object_del(spec, omitempty[i]);
}
