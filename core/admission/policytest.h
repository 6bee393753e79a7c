/* policytest.h — `cozygpu policy test`: a hoster's policy test cases.
 *
 * A test file (YAML or JSON) is a mapping:
 *   config: PATH                 settings file (optional; relative paths are
 *                                relative to the test file)
 *   cluster: [PATH|OBJECT, ...]  snapshot files or directories, or objects
 *                                inline (a List's items one by one); optional
 *   cases:
 *   - name: TEXT
 *     input: PATH                one review input (AdmissionReview, bare
 *                                request or plain object); or
 *     object: {...}              the input inline
 *     user: NAME                 userInfo.username for a plain object
 *     groups: [NAME, ...]        userInfo.groups for a plain object
 *     webhook: validating | mutating | all     (default all)
 *     cluster: [PATH|OBJECT, ...] replaces the file's snapshot for this case
 *     expect:
 *       allowed: true|false      required
 *       code: INT                status.code of a refusal
 *       message: TEXT            must occur in status.message
 *       warnings: [TEXT, ...]    each must occur in some warning; [] = none
 *       patch: [op, ...] | null  the exact JSONPatch (null: no patch)
 *       patched: {...}           must be contained in the object after the
 *                                patch (objects: listed keys; arrays: equal
 *                                length, element-wise)
 *       rules: {RULE: WORD}      what each named rule said: allowed, denied,
 *                                patched, error, budget, memory, deadline,
 *                                or skipped (it did not run)
 * Each case runs twice on the same engine; different answers are a failure
 * (a policy that keeps state in globals).
 */
#ifndef COZYGPU_POLICYTEST_H
#define COZYGPU_POLICYTEST_H

#include <stdio.h>

#include <jansson.h>

#include "engine/engine.h"

typedef struct policytest_counts {
    int passed;
    int failed;
    int errors; /* unreadable test files */
} policytest_counts;

/* Runs every test file under `paths` (files or directories) with policies
 * from `opt` (bundle and override). Settings (and so budgets): each file's
 * `config:`, else `settings` (config.h shape; `policy test --config`),
 * else the defaults. timeout_ms > 0: each review runs under that
 * wall-clock deadline (`--review-timeout`, as the controller's reviews and
 * its reload gate do); 0: none. Prints "PASS|FAIL file: case" lines and
 * reasons to `out`; returns counts. */
policytest_counts policytest_run(const char *const *paths, int npaths, const engine_options *opt,
                                 const json_t *settings, long timeout_ms, FILE *out);

/* Runs one test document held in memory (`len` bytes of YAML or JSON:
 * a `*.test.yaml` key of the policies ConfigMap, docs/decisions/0018),
 * named `name` in the output, with the bundle of `opt` and `settings`
 * (config.h shape; its policyBudget sets the budgets). Nothing in it may
 * name a file: config, policies, override, cluster paths and case inputs
 * are errors (a cluster is inline objects, a case's input `object:`).
 * timeout_ms > 0: each review runs under that deadline, as a webhook
 * review does. Prints as policytest_run does; returns the counts (an
 * unreadable document is an error). The reload gate of the controller
 * (core/controller/bundle.c). */
policytest_counts policytest_run_memory(const char *name, const char *text, size_t len, const json_t *settings,
                                        long timeout_ms, const engine_options *opt, FILE *out);

#endif
