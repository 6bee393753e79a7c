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

/* One hoster source handed to the engine from memory (the policies
 * ConfigMap): either a policy file or a module of the bundle's lib/. */
typedef struct engine_source {
    const char *name;   /* chunk name in messages: the ConfigMap key ("site.lua", "lib.a.b.lua") */
    const char *module; /* NULL: a policy file; else the module name `require` finds it by ("a.b") */
    const char *text;   /* Lua source (not NUL-terminated necessarily) */
    size_t len;         /* bytes of text */
} engine_source;

typedef struct engine_options {
    const char *library_dir;  /* the policy library (lua/); NULL: built-in path */
    const char *bundle_dir;   /* default policies; NULL: built-in path */
    const char *override_dir; /* hoster policies; NULL: none */
    /* hoster policies from memory, instead of override_dir (borrowed for
     * the duration of engine_open: the engine keeps its own copies) */
    const engine_source *override_sources;
    size_t n_override_sources;
    long long instructions;   /* per hook call; <= 0: 10,000,000 */
    long long memory_bytes;   /* per hook call, above what the state holds; <= 0: 64 MiB */
} engine_options;

/* What a review, or one protected call into Lua, came to. The webhook, the
 * CLI and the metrics switch on this code, never on an HTTP status or on a
 * message's text. */
typedef enum engine_outcome {
    ENGINE_ALLOWED = 0,  /* allowed (maybe with a patch or warnings); for a call: it returned */
    ENGINE_REFUSED,      /* a rule denied (403, or the code the rule chose) */
    ENGINE_POLICY_ERROR, /* a rule raised, or returned what is not a verdict or a patch */
    ENGINE_BUDGET,       /* a rule ran out of its instruction budget */
    ENGINE_MEMORY,       /* a rule ran out of its memory cap */
    ENGINE_DEADLINE,     /* a rule was still running at the review deadline */
    ENGINE_OUTCOME_LAST
} engine_outcome;

/* A static name for `o`: "allowed", "refused", "error", "budget",
 * "memory", "deadline" (the words the Lua side uses too). Never NULL. */
const char *engine_outcome_name(engine_outcome o);

/* 1 when `o` is a failure of a policy (error, budget, memory, deadline):
 * a refusal that the policy did not decide (fail closed, DESIGN.md §9). */
int engine_outcome_is_failure(engine_outcome o);

/* The answer to one review. */
typedef struct engine_verdict {
    engine_outcome outcome;
    char rule[160];    /* the rule that refused or failed first; "" when allowed */
    json_t *response;  /* the AdmissionResponse (caller owns; see engine_review) */
    const char *message; /* response.status.message (borrowed from response, or with
                            engine_review_text from the engine until its next review),
                            or NULL when allowed */
    int allowed;         /* engine_review_text: the answer's response.allowed */
} engine_verdict;

/* What one rule said in the last review (engine_last_rules). */
typedef struct engine_rule_result {
    char rule[160];     /* the rule's name (truncated past 159 bytes) */
    const char *result; /* static: "allowed" (ran, refused nothing), "denied", "patched", or a
                           failure's kind: "error", "budget", "memory", "deadline" */
    double seconds;     /* wall time of its calls in this review (match function, hooks) */
} engine_rule_result;

/* The rules the last engine_review ran (a rule whose match said no is not
 * there), in the order they first ran, with what each said and how long
 * it took (lua/runtime/admission.lua, M.review). Borrowed: valid until the
 * engine's next engine_review or engine_close. *n is 0 before any review
 * and after a review that failed. For per-rule metrics and `policy test`'s
 * per-rule results. */
const engine_rule_result *engine_last_rules(const engine *e, size_t *n);

/* 1 when the engine's bundle declares a rule named `name`, else 0
 * (runtime.admission's bundle.byname). For `policy test`'s expect.rules:
 * a name no rule has is a typo, not a rule that did not run. */
int engine_has_rule(engine *e, const char *name);

/* Maps a policies ConfigMap key to the source it carries
 * (docs/decisions/0007): "NAME.lua" is the policy file NAME.lua; "lib.a.b.lua"
 * is the module "a.b" of the bundle's lib/. `module` receives the module name
 * (size bytes) and out->module points to it for a module key. Returns
 * COZY_OK; COZY_ERR_INPUT when the key is not a policy file name (NAME.lua
 * of letters, digits, '-', '_' and '.': callers skip it with a warning);
 * COZY_ERR_POLICY when it is a module key without a name ("lib.lua",
 * "lib..lua"). out->name is `key`, out->text/len are `text`/`len`. */
cozy_result engine_source_for_key(const char *key, const char *text, size_t len, engine_source *out, char *module,
                                  size_t size, cozy_err *err);

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
 * of an AdmissionReview v1). out->response is a new AdmissionResponse
 * object (caller owns): uid echoed, allowed, status {code, reason, message}
 * when refused, patchType "JSONPatch" and base64 patch when mutated,
 * warnings. out->outcome says what happened and out->rule which rule
 * decided it: a policy failure (error, budget, memory, deadline) takes
 * precedence over a denial, and the first rule in bundle order is named.
 * Policy failures are refusals inside the response (code 500), not errors;
 * an error return (COZY_ERR_INTERNAL, *out zeroed) means the library itself
 * failed, and the caller must treat it as a refusal too. */
cozy_result engine_review(engine *e, const json_t *request, engine_phase phases, engine_verdict *out, cozy_err *err);

/* As engine_review, but the answer comes as the text of the whole
 * AdmissionReview, {"apiVersion":"admission.k8s.io/v1",
 * "kind":"AdmissionReview","response":{...}} (the only version the
 * webhooks accept, webhook.h), written compact straight
 * from the Lua response (luajson_write; decision 0051): the bytes
 * json_dumps(envelope, JSON_COMPACT) gives for engine_review's response
 * in the same envelope. *text is malloc'd, NUL-terminated (caller frees),
 * *len its length. out->response is NULL; out->allowed says what the text
 * says; out->message is the engine's copy, valid until its next review.
 * A response the writer leaves alone takes engine_review's path and is
 * dumped. COZY_ERR_INTERNAL also when the runtime's answer does not echo
 * request.uid or has no boolean allowed (the webhook relies on both). */
cozy_result engine_review_text(engine *e, const json_t *request, engine_phase phases, engine_verdict *out,
                               char **text, size_t *len, cozy_err *err);

/* Reads an AdmissionReview's text (`buf`, `len` bytes) as
 * cozy_json_loadb(buf, len, JSON_REJECT_DUPLICATES, error) does, returning
 * a new reference or NULL with *error filled (jansson's error: the same
 * text, line and column as before), but in one pass that also builds the
 * Lua value of its `request` in the engine (decision 0049). The document
 * returned then holds request.object and request.oldObject, when they are
 * objects or arrays, as empty ones of the same type: what C reads of a
 * request is its envelope (uid, kind, resource, operation, userInfo, the
 * types of object and oldObject; admission/request.h); the rules get the
 * whole request from the Lua value. engine_review(e, r) with r the
 * returned document's "request" member uses that Lua value instead of
 * converting r; it is dropped by that review, by the next decode, or by
 * engine_forget_decoded. A text that yajl could read differently from
 * jansson, or that does not parse, goes to cozy_json_loadb whole (then the
 * document is complete and engine_review converts it as usual). Never
 * raises; runs the decode inside the engine's memory limit. */
json_t *engine_decode_review(engine *e, const char *buf, size_t len, json_error_t *error);

/* Drops the Lua request engine_decode_review kept, if any, and the
 * reference it holds on that document's "request" (so no later request
 * can have its address while the value is kept). Call it when the review
 * will not run (a refusal before the rules) to free that memory at once;
 * otherwise the next decode or engine_close drops it. */
void engine_forget_decoded(engine *e);

/* Applies JSONPatch `ops` (array) to `doc` (both borrowed) with the
 * library's RFC 6902 implementation. On success *out is the new document
 * (caller owns); on failure COZY_ERR_INPUT with the failing operation. */
cozy_result engine_apply_patch(engine *e, const json_t *doc, const json_t *ops, json_t **out, cozy_err *err);

/* Sets a wall-clock deadline (CLOCK_MONOTONIC) for the policy calls of the
 * following reviews; NULL clears it. A policy still running when it passes
 * is stopped at its next hook check (every 1000 instructions) and the
 * review answers a refusal naming it ("did not finish before the review
 * deadline"), as for the instruction budget. Used by the webhook server so
 * an answer always leaves before the API server's timeoutSeconds. The
 * string library's pattern functions (find, match, gmatch, gsub) count
 * their steps against the same budget and deadline (pattern.h, decision
 * 0016). */
void engine_set_deadline(engine *e, const struct timespec *deadline);

/* Gives the policy calls that follow a slice of the calling thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID), `cpu_us` microseconds from now; 0 clears
 * it. A policy still running when the slice is spent is stopped at its
 * next hook check (every 1000 instructions, or the pattern matcher's), and
 * from then on every policy call stops at once, until the slice is set or
 * cleared again: engine_sliced() says 1, and what the review answered
 * means nothing (it is a refusal naming the rule as late). The webhook
 * server runs a review first on the I/O thread that read it with a slice,
 * and again on a review thread, without one, when it was sliced, so a
 * review that runs long holds a review thread and not an I/O thread
 * (docs/decisions/0052). The slice is CPU time, so a thread the kernel
 * takes off its CPU is not sliced for that. */
void engine_set_slice(engine *e, long cpu_us);

/* 1 when the slice set by engine_set_slice ran out since it was set. */
int engine_sliced(const engine *e);

/* The engine's Lua state, for callers that push arguments and read
 * results around engine_call (the agent, the specs' module). Borrowed. */
lua_State *engine_lua(engine *e);

/* Opens an engine for a trusted runtime module instead of a policy bundle:
 * the same allow-list of libraries and the same sandboxed `require` as
 * policies (lua/ only; no bundle), then `module` loaded from the runtime
 * folder (lua/runtime/, which a policy's `require` cannot reach: it finds
 * only cozygpu.* in the library and the bundle's lib/). Used by the agent
 * for runtime.layout. On failure COZY_ERR_POLICY with the module's file and
 * line, or COZY_ERR_IO. Free with engine_close. */
cozy_result engine_open_runtime(engine **out, const engine_options *opt, const char *module, cozy_err *err);

/* Pushes field `fn` of the runtime module of an engine_open_runtime engine
 * (nil when absent). */
void engine_push_runtime_fn(engine *e, const char *fn);

/* Converts the Lua value at `idx` of engine_lua(e)'s stack to JSON
 * (luajson_to_json) inside engine_call, so that running out of memory or a
 * value that cannot be converted is an error, never a panic outside a
 * protected call. *out is a new reference (caller owns). COZY_ERR_INTERNAL
 * with the reason (the field path) when it cannot be converted. */
cozy_result engine_to_json(engine *e, int idx, json_t **out, cozy_err *err);

/* The one protected call into Lua: calls the function below `nargs`
 * arguments on engine_lua(e)'s stack, with a traceback message handler
 * that names the file and line. With `budgeted` the call runs under the
 * per-call instruction budget, memory cap and deadline (policy code);
 * without, it is trusted runtime code and runs under the state's ceiling
 * only. Returns ENGINE_ALLOWED with nres results pushed; else the failure
 * kind (ENGINE_POLICY_ERROR, _BUDGET, _MEMORY, _DEADLINE) with err->msg set
 * and nothing pushed. Model: lua.c's docall (STYLE.md "One protected way
 * into Lua"). */
engine_outcome engine_call(engine *e, int nargs, int nres, int budgeted, cozy_err *err);

/* Test switch: the Nth allocation from now inside a policy call fails
 * (n >= 1); 0 disables. Lets specs prove out-of-memory becomes a refusal
 * (model: Lua's ltests.c). */
void engine_fail_alloc_after(engine *e, long n);

/* Bytes the Lua state currently holds. */
size_t engine_memory_in_use(const engine *e);

/* Number of policy rules loaded. */
int engine_rule_count(engine *e);

/* ---- the binder's Lua (DESIGN.md §5, §6; docs/decisions/0020, 0024) ----
 *
 * The leader's binder (binder/binder.h, a layer above) asks these from its
 * hooks; they take and give JSON and plain values only, so the engine
 * stays below the binder. Not thread-safe, like every engine call: the
 * binder's loop owns its engine. The engine's deadline (engine_set_deadline)
 * applies to these calls as to reviews; set one per call or per pass.
 */

/* Candidates the chooser is given at most (the binder's
 * BINDER_MAX_CANDIDATES, decision 0020 §4). */
#define ENGINE_BINDER_MAX_CANDIDATES 32

/* What the binder policy chose for one set. */
typedef struct engine_binder_choice {
    int index;              /* 0-based candidate; -1: none this pass (the set waits, NoNodeWithRoom) */
    engine_outcome outcome; /* ENGINE_ALLOWED: the policy answered; else how it failed (error, budget,
                               memory, deadline): index is 0, the packing order (decision 0024) */
    char message[512];      /* the failure, naming the policy file (and line for an error); "" when answered */
} engine_binder_choice;

/* Asks the bundle's binder policy (policies/binder.lua, or the hoster's
 * file of that name: override directory or policies ConfigMap) which of
 * `candidates` the claim set `set` goes to. Both borrowed:
 *   set:        {"namespace": NS, "vm": NAME or null (a lone claim),
 *                "claims": [{"name", "class", "count", "phase", "node" or null}]}
 *   candidates: 1..ENGINE_BINDER_MAX_CANDIDATES of {"node": NAME,
 *                "classes": {CLASS: {"offered", "bound", "free"}} (the set's
 *                classes, before the set is placed), "labels": {..} (the
 *                Node's metadata.labels; optional)}, in the index's packing
 *                order (most-allocated first).
 * The policy runs as a policy hook does (instruction budget, memory cap,
 * deadline), on read-only views, with the cluster view of
 * engine_set_cluster as third argument. A bundle without binder.lua
 * answers index 0. A policy failure, or an answer that is neither nil nor
 * a position 1..n, is out->outcome (a failure kind) with index 0: the
 * caller binds in packing order, counts the failure (a metric by
 * outcome) and logs out->message (decision 0024). Returns COZY_OK with
 * *out filled; COZY_ERR_INPUT when set or candidates do not have the
 * shapes above (out->index -1); COZY_ERR_INTERNAL when the runtime itself
 * failed (out of memory converting; out->index 0, outcome
 * ENGINE_POLICY_ERROR). */
cozy_result engine_binder_choose(engine *e, const json_t *set, const json_t *candidates, engine_binder_choice *out,
                                 cozy_err *err);

/* The budget check at bind: allowed or refused, and why. */
typedef struct engine_binder_verdict {
    int allow;              /* 1: the claim may go Pending -> Bound */
    engine_outcome outcome; /* ENGINE_ALLOWED: the check ran (allow says what it found); else how it
                               failed: allow is 0 (fail closed) */
    char message[512];      /* a refusal: the tenant, the key and its limit (never other tenants'
                               objects); a failure: "the budget check failed: ..."; "" when allowed */
    char tenant[64];        /* the tenant whose key refused; "" otherwise */
    char key[320];          /* that spec.hard key; "" when none (a bad quantity) */
    long long limit;        /* its value; -1 when none */
    char rule[16];          /* "R1" (class or total key), "R4", "R5", "quantity"; "" when allowed */
} engine_binder_verdict;

/* The units held per namespace and class that the budget check at bind
 * counts (DESIGN.md §5; decision 0044): the binder's state owns them
 * (binder_state_held_next) and the check reads them through this during
 * one engine_binder_budget call. next() moves *pos (NULL: start) to the
 * next pair holding units and sets *ns, *class_name (borrowed for the
 * call) and *units (> 0), returning 1; 0 at the end. It must not change
 * what it walks. */
typedef struct engine_held {
    void *ud;
    int (*next)(void *ud, const void **pos, const char **ns, const char **class_name, long long *units);
} engine_held;

/* DESIGN.md §5 at bind (decision 0020 §3): may claim `count` units of class
 * `class_name` in namespace `ns` go Pending -> Bound? The rules R1–R5 are
 * lua/cozygpu/budget.lua's check_set (the same as admission), over the
 * cluster view of engine_set_cluster (Namespaces with their tenant labels,
 * ResourceQuotas, GPUClasses, VMIs: Running raw-name VMIs count) with the
 * claims counted from `held` (NULL: none held), never by walking claims:
 * O(tenant depth x (pairs holding units + VMIs)). The claim itself is the
 * order; the caller counts what it allowed at once (so the next claim of
 * the set, and later sets, count it: binder_state_held_promise) and takes
 * it back if the set does not bind. Never ask it for a Lost claim's rebind
 * or a move (DESIGN.md §5: they keep counting). Runs under the policy
 * budget, memory cap and deadline. *out is always filled; any failure
 * refuses (fail closed: the claim stays Pending, reason OverBudget,
 * out->message saying the check failed). Returns COZY_OK (the check ran or
 * failed inside Lua: see out->outcome), COZY_ERR_INPUT (empty names, count
 * < 1), COZY_ERR_INTERNAL (the runtime failed). */
cozy_result engine_binder_budget(engine *e, const char *ns, const char *class_name, long long count,
                                 const engine_held *held, engine_binder_verdict *out, cozy_err *err);

#endif
