/* policytest.h — `cozygpu policy test`: a hoster's policy test cases.
 *
 * A test file (YAML or JSON) is a mapping:
 *   config: PATH                 settings file (optional; relative paths are
 *                                relative to the test file)
 *   cluster: [PATH, ...]         snapshot files or directories (optional)
 *   cases:
 *   - name: TEXT
 *     input: PATH                one review input (AdmissionReview, bare
 *                                request or plain object); or
 *     object: {...}              the input inline
 *     user: NAME                 userInfo.username for a plain object
 *     groups: [NAME, ...]        userInfo.groups for a plain object
 *     webhook: validating | mutating | all     (default all)
 *     cluster: [PATH, ...]       replaces the file's snapshot for this case
 *     expect:
 *       allowed: true|false      required
 *       code: INT                status.code of a refusal
 *       message: TEXT            must occur in status.message
 *       warnings: [TEXT, ...]    each must occur in some warning; [] = none
 *       patch: [op, ...] | null  the exact JSONPatch (null: no patch)
 *       patched: {...}           must be contained in the object after the
 *                                patch (objects: listed keys; arrays: equal
 *                                length, element-wise)
 * Each case runs twice on the same engine; different answers are a failure
 * (a policy that keeps state in globals).
 */
#ifndef COZYGPU_POLICYTEST_H
#define COZYGPU_POLICYTEST_H

#include <stdio.h>

#include "engine/engine.h"

typedef struct policytest_counts {
    int passed;
    int failed;
    int errors; /* unreadable test files */
} policytest_counts;

/* Runs every test file under `paths` (files or directories) with policies
 * from `opt` (bundle and override; budgets come from each file's config).
 * Prints "PASS|FAIL file: case" lines and reasons to `out`; returns counts. */
policytest_counts policytest_run(const char *const *paths, int npaths, const engine_options *opt, FILE *out);

#endif
