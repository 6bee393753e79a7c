/* engine.h — the Lua 5.4 policy host (DESIGN.md §9).
 *
 * One engine owns one lua_State (not thread-safe; one engine per thread).
 * It loads the library (`lua/`), the default bundle (`policies/`) and an
 * optional override directory (a file of the same name replaces a default,
 * a new name adds one), runs every policy hook in a sandbox with a
 * per-call instruction budget and memory cap, and turns any policy failure
 * into a refusal naming the policy (fail closed).
 *
 * Sandbox (STYLE.md "Open only what you mean to"): base functions without
 * load/loadfile/dofile/collectgarbage/print, string, table, math, utf8 and
 * os.time/os.clock/os.date/os.difftime; no io, debug, package, coroutine;
 * `require` resolves only modules of the library and of the bundles' lib/
 * folders, loaded as text ("t" mode). Each policy file runs in its own
 * _ENV whose shared library view is read-only.
 */
#ifndef COZYGPU_ENGINE_H
#define COZYGPU_ENGINE_H

#include <jansson.h>
#include <lua.h>
#include <stddef.h>
#include <time.h>

#include "base/result.h"

typedef struct engine engine;

typedef struct engine_options {
    const char *library_dir;  /* the policy library (lua/); NULL: built-in path */
    const char *bundle_dir;   /* default policies; NULL: built-in path */
    const char *override_dir; /* hoster policies; NULL: none */
    long long instructions;   /* per hook call; <= 0: 10,000,000 */
    long long memory_bytes;   /* per hook call, above what the state holds; <= 0: 64 MiB */
} engine_options;

/* Creates an engine and loads the library and policies. On success *out is
 * a new engine (free with engine_close). On failure returns COZY_ERR_IO
 * (unreadable directory) or COZY_ERR_POLICY with err->msg naming the policy
 * file and line, and *out is untouched. */
cozy_result engine_open(engine **out, const engine_options *opt, cozy_err *err);

/* Frees the engine and its Lua state. NULL is allowed. */
void engine_close(engine *e);

/* Replaces the cluster snapshot policies read (`objects`: array of
 * Kubernetes objects, borrowed) and the settings (config.h shape,
 * borrowed). Returns COZY_ERR_INTERNAL if the library's indexer fails. */
cozy_result engine_set_cluster(engine *e, const json_t *objects, const json_t *settings, cozy_err *err);

/* Which webhooks a review runs: validating rules, mutating rules, or both
 * (validating first; mutation only when nothing refused). */
typedef enum engine_phase {
    ENGINE_VALIDATE = 1,
    ENGINE_MUTATE = 2,
    ENGINE_BOTH = 3,
} engine_phase;

/* Answers one AdmissionRequest (`request`, borrowed: the `request` member
 * of an AdmissionReview v1). *response is a new AdmissionResponse object
 * (caller owns): uid echoed, allowed, status {code, reason, message} when
 * refused, patchType "JSONPatch" and base64 patch when mutated, warnings.
 * Policy failures are refusals inside the response, not errors; an error
 * return (COZY_ERR_INTERNAL) means the library itself failed, and the
 * caller must treat it as a refusal too. */
cozy_result engine_review(engine *e, const json_t *request, engine_phase phases, json_t **response, cozy_err *err);

/* Applies JSONPatch `ops` (array) to `doc` (both borrowed) with the
 * library's RFC 6902 implementation. On success *out is the new document
 * (caller owns); on failure COZY_ERR_INPUT with the failing operation. */
cozy_result engine_apply_patch(engine *e, const json_t *doc, const json_t *ops, json_t **out, cozy_err *err);

/* Sets a wall-clock deadline (CLOCK_MONOTONIC) for the policy calls of the
 * following reviews; NULL clears it. A policy still running when it passes
 * is stopped at its next hook check (every 1000 instructions) and the
 * review answers a refusal naming it ("did not finish before the review
 * deadline"), as for the instruction budget. Used by the webhook server so
 * an answer always leaves before the API server's timeoutSeconds. Time
 * spent inside one C function (e.g. a pathological string.find) is not
 * interrupted. */
void engine_set_deadline(engine *e, const struct timespec *deadline);

/* The engine's Lua state, for the Lua module used by specs. Borrowed. */
lua_State *engine_lua(engine *e);

/* Test switch: the Nth allocation from now inside a policy call fails
 * (n >= 1); 0 disables. Lets specs prove out-of-memory becomes a refusal
 * (model: Lua's ltests.c). */
void engine_fail_alloc_after(engine *e, long n);

/* Bytes the Lua state currently holds. */
size_t engine_memory_in_use(const engine *e);

/* Number of policy rules loaded. */
int engine_rule_count(engine *e);

#endif
