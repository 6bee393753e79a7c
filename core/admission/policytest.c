/* policytest.c — `cozygpu policy test` (policytest.h). */
#include "admission/policytest.h"

#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/config.h"
#include "format/manifest.h"
#include "admission/review.h"

static void resolve(const char *testfile, const char *rel, char *out, size_t n)
{
    if(rel[0] == '/') {
        snprintf(out, n, "%s", rel);
        return;
    }
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", testfile);
    snprintf(out, n, "%s/%s", dirname(tmp), rel);
}

/* The first place where `want` is not contained in `have` (see
 * contained), as a JSON Pointer (RFC 6901) in `path` (n bytes); returns 1
 * there, 0 when contained. *want_at and *have_at are the values found
 * there (have_at NULL when absent). */
static int first_difference(const json_t *want, const json_t *have, char *path, size_t n, const json_t **want_at,
                            const json_t **have_at)
{
    size_t len = strlen(path);
    if(json_is_object(want) && json_is_object(have)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)want, k, v) {
            /* RFC 6901: ~ is ~0, / is ~1 */
            size_t o = len;
            if(o + 1 < n)
                path[o++] = '/';
            for(const char *c = k; *c && o + 2 < n; c++) {
                if(*c == '~' || *c == '/') {
                    path[o++] = '~';
                    path[o++] = *c == '~' ? '0' : '1';
                } else
                    path[o++] = *c;
            }
            path[o < n ? o : n - 1] = 0;
            json_t *h = json_object_get(have, k);
            if(!h) {
                *want_at = v;
                *have_at = NULL;
                return 1;
            }
            if(first_difference(v, h, path, n, want_at, have_at))
                return 1;
            path[len] = 0;
        }
        return 0;
    }
    if(json_is_array(want) && json_is_array(have) && json_array_size(want) == json_array_size(have)) {
        for(size_t i = 0; i < json_array_size(want); i++) {
            snprintf(path + len, n - len, "/%zu", i);
            if(first_difference(json_array_get(want, i), json_array_get(have, i), path, n, want_at, have_at))
                return 1;
            path[len] = 0;
        }
        return 0;
    }
    if(json_is_number(want) && json_is_number(have) ? json_number_value(want) == json_number_value(have)
                                                     : json_equal((json_t *)want, (json_t *)have))
        return 0;
    *want_at = want;
    *have_at = have;
    return 1;
}

/* is `want` contained in `have`? */
static int contained(const json_t *want, const json_t *have)
{
    if(json_is_object(want)) {
        if(!json_is_object(have))
            return 0;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)want, k, v) {
            json_t *h = json_object_get(have, k);
            if(!h || !contained(v, h))
                return 0;
        }
        return 1;
    }
    if(json_is_array(want)) {
        if(!json_is_array(have) || json_array_size(want) != json_array_size(have))
            return 0;
        for(size_t i = 0; i < json_array_size(want); i++)
            if(!contained(json_array_get(want, i), json_array_get(have, i)))
                return 0;
        return 1;
    }
    if(json_is_number(want) && json_is_number(have))
        return json_number_value(want) == json_number_value(have);
    return json_equal((json_t *)want, (json_t *)have);
}

/* Appends to `objects` the snapshot `list` names: a path (file or
 * directory, relative to `testfile`), an inline object (a List's items are
 * taken one by one), or a list of those. testfile NULL: a test held in
 * memory (a ConfigMap key), where a path names nothing and is an error. */
static cozy_result load_cluster(const char *testfile, const json_t *list, json_t *objects, cozy_err *err)
{
    if(!list)
        return COZY_OK;
    if(json_is_string(list)) {
        if(!testfile)
            return cozy_fail(err, COZY_ERR_INPUT,
                             "cluster: \"%s\" is a path, and a test in a ConfigMap has no files: give the objects "
                             "inline",
                             json_string_value(list));
        char p[PATH_MAX];
        resolve(testfile, json_string_value(list), p, sizeof p);
        json_t *recs = json_array();
        cozy_result rc = manifest_load_path(p, recs, err);
        size_t i;
        json_t *r;
        json_array_foreach(recs, i, r) json_array_append(objects, json_object_get(r, "object"));
        json_decref(recs);
        return rc;
    }
    if(json_is_object(list)) { /* inline */
        const json_t *items = json_object_get(list, "items");
        const char *kind = json_string_value(json_object_get(list, "kind"));
        size_t kl = kind ? strlen(kind) : 0;
        if(kl >= 4 && strcmp(kind + kl - 4, "List") == 0) {
            /* as kubectl reads a List: items a list of objects, each with
               apiVersion and kind, none of them a List itself */
            if(!json_is_array(items))
                return cozy_fail(err, COZY_ERR_INPUT, "%s%scluster: %s: items must be a list of objects",
                                 testfile ? testfile : "", testfile ? ": " : "", kind);
            size_t i;
            json_t *o;
            json_array_foreach(items, i, o) {
                const char *ik = json_string_value(json_object_get(o, "kind"));
                size_t ikl = ik ? strlen(ik) : 0;
                if(!json_is_object(o) || !ik || !json_is_string(json_object_get(o, "apiVersion")))
                    return cozy_fail(err, COZY_ERR_INPUT,
                                     "%s%scluster: %s: items[%zu] is not an object with apiVersion and kind",
                                     testfile ? testfile : "", testfile ? ": " : "", kind, i);
                if(ikl >= 4 && strcmp(ik + ikl - 4, "List") == 0)
                    return cozy_fail(err, COZY_ERR_INPUT, "%s%scluster: %s: items[%zu] is a %s (a List in a List)",
                                     testfile ? testfile : "", testfile ? ": " : "", kind, i, ik);
                json_array_append(objects, o);
            }
        } else if(kind && json_is_string(json_object_get(list, "apiVersion"))) {
            json_array_append(objects, (json_t *)list);
        } else {
            return cozy_fail(err, COZY_ERR_INPUT, "%s%scluster: an inline object needs apiVersion and kind",
                             testfile ? testfile : "", testfile ? ": " : "");
        }
        return COZY_OK;
    }
    if(!json_is_array(list))
        return cozy_fail(err, COZY_ERR_INPUT, "%s%scluster: must be a path, an object or a list of them",
                         testfile ? testfile : "", testfile ? ": " : "");
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) {
        cozy_result rc = load_cluster(testfile, item, objects, err);
        if(rc != COZY_OK)
            return rc;
    }
    return COZY_OK;
}

/* Checks one answer against `expect`. Returns NULL when it matches, else a
 * static-buffer reason. */
static const char *check(engine *e, const json_t *expect, const json_t *review, const json_t *object, char *why,
                         size_t n)
{
    const json_t *resp = json_object_get(review, "response");
    const json_t *allowed = json_object_get(expect, "allowed");
    const char *msg = json_string_value(json_object_get(json_object_get(resp, "status"), "message"));
    if(!json_is_boolean(allowed)) {
        snprintf(why, n, "expect.allowed is required (true or false)");
        return why;
    }
    if(json_is_true(allowed) != json_is_true(json_object_get(resp, "allowed"))) {
        snprintf(why, n, "expected %s, got %s%s%s", json_is_true(allowed) ? "allowed" : "refused",
                 json_is_true(json_object_get(resp, "allowed")) ? "allowed" : "refused", msg ? ": " : "",
                 msg ? msg : "");
        return why;
    }
    const json_t *code = json_object_get(expect, "code");
    if(code && json_integer_value(code) != json_integer_value(json_object_get(json_object_get(resp, "status"), "code"))) {
        /* the message says why (for a 500, which policy failed, at which file and line) */
        snprintf(why, n, "expected status code %lld, got %lld%s%s", (long long)json_integer_value(code),
                 (long long)json_integer_value(json_object_get(json_object_get(resp, "status"), "code")),
                 msg ? ": " : "", msg ? msg : "");
        return why;
    }
    const char *frag = json_string_value(json_object_get(expect, "message"));
    if(frag && (!msg || !strstr(msg, frag))) {
        snprintf(why, n, "message %s%s%s does not contain \"%s\"", msg ? "\"" : "", msg ? msg : "(none)",
                 msg ? "\"" : "", frag);
        return why;
    }
    const json_t *warns = json_object_get(expect, "warnings");
    if(warns) {
        const json_t *got = json_object_get(resp, "warnings");
        if(json_array_size(warns) == 0 && json_array_size(got) != 0) {
            snprintf(why, n, "expected no warnings, got \"%s\"", json_string_value(json_array_get(got, 0)));
            return why;
        }
        size_t i, j;
        json_t *w, *g;
        json_array_foreach(warns, i, w) {
            int found = 0;
            json_array_foreach(got, j, g) if(json_string_value(w) && strstr(json_string_value(g), json_string_value(w)))
                found = 1;
            if(!found) {
                /* and what the warnings were, so the mismatch can be seen */
                char *list = got ? json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
                snprintf(why, n, "no warning contains \"%s\"; the warnings: %.1200s",
                         json_string_value(w) ? json_string_value(w) : "?", list ? list : "[]");
                free(list);
                return why;
            }
        }
    }
    json_t *ops = review_decode_patch(resp);
    const json_t *want_patch = json_object_get(expect, "patch");
    if(want_patch) {
        int ok = json_is_null(want_patch) ? ops == NULL : (ops && contained(want_patch, ops) && contained(ops, want_patch));
        if(!ok) {
            char *s = ops ? json_dumps(ops, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
            char *w = json_is_null(want_patch) ? NULL : json_dumps(want_patch, JSON_COMPACT | JSON_SORT_KEYS);
            snprintf(why, n, "patch differs:\n       expected %s\n       got      %s", w ? w : "no patch",
                     s ? s : "no patch");
            free(s);
            free(w);
            json_decref(ops);
            return why;
        }
    }
    const json_t *patched = json_object_get(expect, "patched");
    if(patched) {
        json_t *after = NULL;
        cozy_err err = {{0}};
        if(!object) {
            snprintf(why, n, "expect.patched needs an object in the request");
            json_decref(ops);
            return why;
        }
        if(ops && engine_apply_patch(e, object, ops, &after, &err) != COZY_OK) {
            snprintf(why, n, "patch does not apply: %s", err.msg);
            json_decref(ops);
            return why;
        }
        char at[512] = "";
        const json_t *want_at = NULL, *have_at = NULL;
        int differs = first_difference(patched, after ? after : object, at, sizeof at, &want_at, &have_at);
        if(differs) {
            char *w = json_dumps(want_at, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
            char *h = have_at ? json_dumps(have_at, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
            snprintf(why, n, "patched object differs from expect.patched at %s:\n       expected %.600s\n       got      %.600s",
                     at[0] ? at : "(the root)", w ? w : "?", h ? h : "(absent)");
            free(w);
            free(h);
            json_decref(after);
            json_decref(ops);
            return why;
        }
        json_decref(after);
    }
    json_decref(ops);
    return NULL;
}

static const char *const CASE_KEYS[] = {"name", "input", "object", "expect", "cluster", "user", "groups", "webhook", NULL};
static const char *const EXPECT_KEYS[] = {"allowed", "code", "message", "warnings", "patch", "patched", "rules", NULL};

/* The words expect.rules takes: engine_rule_result's results, and
   "skipped" for a rule that did not run (its match said no, or an earlier
   rule's failure or denial stopped the phase). */
static const char *const RULE_RESULTS[] = {"allowed", "denied",   "patched", "error",
                                           "budget",  "memory",   "deadline", "skipped", NULL};

/* What the last review said per rule, as "a allowed (0.12 ms), b denied
   (0.05 ms)" in `buf`; "(no rule ran)" when none did. */
static const char *rules_said(const engine *e, char *buf, size_t n)
{
    size_t k = 0, o = 0;
    const engine_rule_result *rr = engine_last_rules(e, &k);
    buf[0] = 0;
    for(size_t i = 0; i < k && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s %s (%.2f ms)", i ? ", " : "", rr[i].rule, rr[i].result,
                              rr[i].seconds * 1e3);
    if(k == 0)
        snprintf(buf, n, "(no rule ran)");
    return buf;
}

/* NULL when every rule named in `want` ({rule: word}) said that word in
   the last review, else a reason (a name no rule of the bundle has is one:
   a typo must not pass as "skipped"). */
static const char *check_rules(engine *e, const json_t *want, char *why, size_t n)
{
    size_t k = 0;
    const engine_rule_result *rr = engine_last_rules(e, &k);
    const char *rule;
    json_t *w;
    json_object_foreach((json_t *)want, rule, w) {
        if(!engine_has_rule(e, rule))
            return snprintf(why, n, "expect.rules: the bundle has no rule \"%s\"", rule), why;
        const char *got = "skipped";
        for(size_t i = 0; i < k; i++)
            if(strcmp(rr[i].rule, rule) == 0)
                got = rr[i].result;
        if(strcmp(got, json_string_value(w)) != 0)
            return snprintf(why, n, "rule \"%s\": expected %s, got %s", rule, json_string_value(w), got), why;
    }
    return NULL;
}

/* NULL when every key of `obj` is in `known`, else a reason in `why`
 * naming the first unknown key (in key order) and the known ones. */
static const char *unknown_key(const json_t *obj, const char *const *known, const char *where, char *why, size_t n)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        int ok = 0;
        for(const char *const *q = known; *q && !ok; q++)
            ok = strcmp(*q, k) == 0;
        if(!ok) {
            size_t o = (size_t)snprintf(why, n, "%sunknown key \"%s\" (known:", where, k);
            for(const char *const *q = known; *q && o < n; q++)
                o += (size_t)snprintf(why + o, n - o, "%s %s", q == known ? "" : ",", *q);
            if(o < n)
                snprintf(why + o, n - o, ")");
            return why;
        }
    }
    return NULL;
}

/* NULL when the values of `expect` have the types the format says, else
 * a reason. */
static const char *expect_types(const json_t *expect, char *why, size_t n)
{
    const json_t *v;
    if((v = json_object_get(expect, "code")) && !json_is_integer(v))
        return snprintf(why, n, "expect.code must be an integer (an HTTP status code)"), why;
    if((v = json_object_get(expect, "message")) && !json_is_string(v))
        return snprintf(why, n, "expect.message must be a string"), why;
    if((v = json_object_get(expect, "warnings"))) {
        size_t i;
        const json_t *w;
        if(!json_is_array(v))
            return snprintf(why, n, "expect.warnings must be a list of strings"), why;
        json_array_foreach(v, i, w) if(!json_is_string(w)) return snprintf(why, n, "expect.warnings must be a list of strings"), why;
    }
    if((v = json_object_get(expect, "patch")) && !json_is_array(v) && !json_is_null(v))
        return snprintf(why, n, "expect.patch must be a list of operations, or null for no patch"), why;
    if((v = json_object_get(expect, "patched")) && !json_is_object(v))
        return snprintf(why, n, "expect.patched must be an object"), why;
    if((v = json_object_get(expect, "rules"))) {
        if(!json_is_object(v))
            return snprintf(why, n, "expect.rules must be a map of rule name to result"), why;
        const char *rule;
        json_t *w;
        json_object_foreach((json_t *)v, rule, w) {
            int ok = 0;
            for(const char *const *q = RULE_RESULTS; *q && !ok; q++)
                ok = json_is_string(w) && strcmp(*q, json_string_value(w)) == 0;
            if(!ok)
                return snprintf(why, n,
                                "expect.rules.%s must be one of allowed, denied, patched, error, budget, memory, "
                                "deadline, skipped",
                                rule),
                       why;
        }
    }
    return NULL;
}

/* Runs the test document `doc`. file: its path (relative paths in it
 * resolve from there), or NULL for a document held in memory, named
 * `label` in the output, where no key may name a file (config, policies,
 * override, a cluster path, a case's input) and the settings are
 * `mem_settings`. timeout_ms > 0: each review runs under that deadline. */
static void run_doc(const char *file, const char *label_of_file, const json_t *doc, const json_t *mem_settings,
                    long timeout_ms, const engine_options *base_opt, FILE *out, policytest_counts *c)
{
    cozy_err err = {{0}};
    json_t *settings = NULL, *file_objects = json_array();
    engine *e = NULL;
    const char *label_file = file ? file : label_of_file;
    if(!json_is_object(doc)) {
        fprintf(out, "ERROR %s: a test file is a mapping (config, cluster, policies, override, cases)\n", label_file);
        c->errors++;
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)doc, k, v) {
        if(strcmp(k, "config") && strcmp(k, "cluster") && strcmp(k, "cases") && strcmp(k, "policies") &&
           strcmp(k, "override")) {
            fprintf(out, "ERROR %s: unknown key \"%s\" (known: config, cluster, policies, override, cases)\n",
                    label_file, k);
            c->errors++;
            goto out;
        }
        if(!file && strcmp(k, "cluster") && strcmp(k, "cases")) {
            fprintf(out,
                    "ERROR %s: %s: names files, and a test in a ConfigMap has none (it runs on the bundle and "
                    "settings being loaded)\n",
                    label_file, k);
            c->errors++;
            goto out;
        }
    }
    const char *cfg = json_string_value(json_object_get(doc, "config"));
    if(!file || (!cfg && mem_settings)) {
        settings = json_deep_copy(mem_settings); /* a ConfigMap test, or --config */
    } else if(cfg) {
        char p[PATH_MAX];
        resolve(file, cfg, p, sizeof p);
        if(config_load_file(p, &settings, &err) != COZY_OK) {
            fprintf(out, "ERROR %s: config: %s\n", file, err.msg);
            c->errors++;
            goto out;
        }
    } else {
        settings = config_defaults();
    }
    if(load_cluster(file, json_object_get(doc, "cluster"), file_objects, &err) != COZY_OK) {
        fprintf(out, "ERROR %s: %s\n", label_file, err.msg);
        c->errors++;
        goto out;
    }
    engine_options opt = *base_opt;
    /* the bundle and overrides a file names (relative to it) win over the
     * command line's, so a test file says what it tests */
    char policies_dir[PATH_MAX], override_dir[PATH_MAX];
    static const char *const dir_keys[] = {"policies", "override"};
    for(int d = 0; d < 2; d++) {
        const json_t *dv = json_object_get(doc, dir_keys[d]);
        if(!dv)
            continue;
        if(!json_is_string(dv)) {
            fprintf(out, "ERROR %s: %s: must be a folder path (relative to the test file)\n", label_file, dir_keys[d]);
            c->errors++;
            goto out;
        }
        resolve(file, json_string_value(dv), d == 0 ? policies_dir : override_dir, PATH_MAX);
        if(d == 0)
            opt.bundle_dir = policies_dir;
        else
            opt.override_dir = override_dir;
    }
    json_t *budget = json_object_get(settings, "policyBudget");
    opt.instructions = json_integer_value(json_object_get(budget, "instructions"));
    opt.memory_bytes = json_integer_value(json_object_get(budget, "memoryBytes"));
    if(engine_open(&e, &opt, &err) != COZY_OK) {
        fprintf(out, "ERROR %s: %s\n", label_file, err.msg);
        c->errors++;
        goto out;
    }
    json_t *cases = json_object_get(doc, "cases");
    if(!json_is_array(cases) || json_array_size(cases) == 0) {
        fprintf(out, "ERROR %s: cases: needs a non-empty list\n", label_file);
        c->errors++;
        goto out;
    }
    size_t i;
    json_t *tc;
    json_array_foreach(cases, i, tc) {
        char label[512], why[2048];
        const json_t *name_v = json_object_get(tc, "name");
        const char *name = json_string_value(name_v);
        int bad_name = (name_v && !name) || (name && strpbrk(name, "\r\n"));
        snprintf(label, sizeof label, "%s: %s", label_file,
                 bad_name ? "(case with a bad name)" : name ? name : "(unnamed case)");
        const char *reason = NULL;
        if(bad_name) /* one line per case in the output, and in the gate's Event */
            reason = "name must be a single-line string";
        int ran = 0; /* the case was reviewed: engine_last_rules is its */
        json_t *objects = NULL, *input = NULL, *r1 = NULL, *r2 = NULL, *req = NULL;
        json_t *inrecs = json_array();
        /* input */
        const char *inpath = json_string_value(json_object_get(tc, "input"));
        if(reason) {
            /* the name is already wrong: nothing else of the case is read */
        } else if(inpath && !file) {
            reason = "input: names a file, and a test in a ConfigMap has none: give the object inline (object:)";
        } else if(inpath) {
            char p[PATH_MAX];
            resolve(file, inpath, p, sizeof p);
            if(manifest_load_file(p, inrecs, &err) != COZY_OK)
                reason = err.msg;
            else if(json_array_size(inrecs) != 1)
                reason = "input must hold exactly one document";
            else
                input = json_incref(json_object_get(json_array_get(inrecs, 0), "object"));
        } else if(json_is_object(json_object_get(tc, "object"))) {
            input = json_incref(json_object_get(tc, "object"));
        } else {
            reason = "a case needs input: PATH or object: {...}";
        }
        if(!reason && !json_is_object(json_object_get(tc, "expect")))
            reason = "a case needs expect: {...}";
        /* strict keys: a misspelt key would otherwise check nothing */
        if(!reason)
            reason = unknown_key(tc, CASE_KEYS, "", why, sizeof why);
        if(!reason)
            reason = unknown_key(json_object_get(tc, "expect"), EXPECT_KEYS, "expect: ", why, sizeof why);
        if(!reason)
            reason = expect_types(json_object_get(tc, "expect"), why, sizeof why);
        /* snapshot */
        if(!reason) {
            if(json_object_get(tc, "cluster")) {
                objects = json_array();
                if(load_cluster(file, json_object_get(tc, "cluster"), objects, &err) != COZY_OK)
                    reason = err.msg;
            } else {
                objects = json_incref(file_objects);
            }
        }
        if(!reason && engine_set_cluster(e, objects, settings, &err) != COZY_OK)
            reason = err.msg;
        review_options ro = {.username = json_string_value(json_object_get(tc, "user")),
                             .groups = json_object_get(tc, "groups"),
                             .phases = ENGINE_BOTH};
        const char *wh = json_string_value(json_object_get(tc, "webhook"));
        if(wh && strcmp(wh, "validating") == 0)
            ro.phases = ENGINE_VALIDATE;
        else if(wh && strcmp(wh, "mutating") == 0)
            ro.phases = ENGINE_MUTATE;
        else if(wh && strcmp(wh, "all") != 0 && !reason)
            reason = "webhook must be validating, mutating or all";
        for(int run = 0; run < 2 && !reason; run++) {
            struct timespec deadline;
            if(timeout_ms > 0) { /* the gate: the deadline a webhook review has */
                clock_gettime(CLOCK_MONOTONIC, &deadline);
                deadline.tv_sec += timeout_ms / 1000;
                deadline.tv_nsec += (timeout_ms % 1000) * 1000000L;
                if(deadline.tv_nsec >= 1000000000L)
                    deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
                engine_set_deadline(e, &deadline);
            }
            if(review_document(e, input, label, i + 1, &ro, run == 0 ? &r1 : &r2, NULL, &err) != COZY_OK)
                reason = err.msg;
            engine_set_deadline(e, NULL);
        }
        if(!reason && !json_equal(r1, r2))
            reason = "the second run of the case answered differently (does a policy keep state in globals?)";
        if(!reason) {
            const char *av;
            int judged;
            review_build_request(input, label, i + 1, &ro, &req, &av, &judged, &err);
            reason = check(e, json_object_get(tc, "expect"), r1, json_object_get(req, "object"), why, sizeof why);
            if(!reason && json_object_get(json_object_get(tc, "expect"), "rules"))
                reason = check_rules(e, json_object_get(json_object_get(tc, "expect"), "rules"), why, sizeof why);
            ran = 1;
        }
        if(reason) {
            char said[1024];
            fprintf(out, "FAIL %s\n     %s\n", label, reason);
            if(ran) /* what each rule said: where a wrong answer came from */
                fprintf(out, "     rules: %s\n", rules_said(e, said, sizeof said));
            c->failed++;
        } else {
            fprintf(out, "PASS %s\n", label);
            c->passed++;
        }
        json_decref(req);
        json_decref(r1);
        json_decref(r2);
        json_decref(input);
        json_decref(objects);
        json_decref(inrecs);
    }
out:
    engine_close(e);
    json_decref(settings);
    json_decref(file_objects);
}

static void run_file(const char *file, const engine_options *base_opt, const json_t *settings, long timeout_ms,
                     FILE *out, policytest_counts *c)
{
    cozy_err err = {{0}};
    json_t *recs = json_array();
    if(manifest_load_file(file, recs, &err) != COZY_OK || json_array_size(recs) != 1) {
        fprintf(out, "ERROR %s: %s\n", file, err.msg[0] ? err.msg : "expected one test document");
        c->errors++;
    } else {
        run_doc(file, NULL, json_object_get(json_array_get(recs, 0), "object"), settings, timeout_ms, base_opt, out,
                c);
    }
    json_decref(recs);
}

policytest_counts policytest_run_memory(const char *name, const char *text, size_t len, const json_t *settings,
                                        long timeout_ms, const engine_options *opt, FILE *out)
{
    policytest_counts c = {0, 0, 0};
    cozy_err err = {{0}};
    json_t *recs = json_array();
    if(manifest_load_buffer(text, len, name, recs, &err) != COZY_OK || json_array_size(recs) != 1) {
        fprintf(out, "ERROR %s: %s\n", name, err.msg[0] ? err.msg : "expected one test document");
        c.errors++;
    } else {
        run_doc(NULL, name, json_object_get(json_array_get(recs, 0), "object"), settings, timeout_ms, opt, out, &c);
    }
    json_decref(recs);
    return c;
}

policytest_counts policytest_run(const char *const *paths, int npaths, const engine_options *opt,
                                 const json_t *settings, long timeout_ms, FILE *out)
{
    policytest_counts c = {0, 0, 0};
    for(int i = 0; i < npaths; i++) {
        json_t *files = NULL;
        cozy_err err = {{0}};
        if(manifest_list_files(paths[i], &files, &err) != COZY_OK) {
            fprintf(out, "ERROR %s\n", err.msg);
            c.errors++;
            continue;
        }
        size_t k;
        json_t *f;
        json_array_foreach(files, k, f) run_file(json_string_value(f), opt, settings, timeout_ms, out, &c);
        json_decref(files);
    }
    return c;
}
