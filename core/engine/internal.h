/* internal.h — shared by the engine's files only (engine.c, sandbox.c).
 *
 * Not a public interface: the engine's state and the sandbox's entry
 * points. The public API is engine.h.
 */
#ifndef COZYGPU_ENGINE_INTERNAL_H
#define COZYGPU_ENGINE_INTERNAL_H

#include <lua.h>
#include <stddef.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/pattern.h"

#ifndef COZYGPU_LIBDIR
#define COZYGPU_LIBDIR "lua"
#endif
#ifndef COZYGPU_POLICYDIR
#define COZYGPU_POLICYDIR "policies"
#endif

/* Instructions between two runs of the count hook. */
#define ENGINE_HOOK_STEP 1000
/* Ceiling on the whole state outside policy calls (library, snapshot). */
#define ENGINE_STATE_CEILING ((size_t)4 << 30)
/* Ceiling on one policy or module source file. */
#define ENGINE_MAX_SOURCE_BYTES (4u * 1024u * 1024u)

#define REG_BASE    "cozygpu.base"
#define REG_LOADED  "cozygpu.loaded"
#define REG_LOADING "cozygpu.loading"
#define REG_FROZEN  "cozygpu.frozen"  /* [i] = chunk, [chunk ptr] = its _ENV, [_ENV] = its globals as loaded */

struct engine {
    lua_State *L;
    size_t mem_used;
    size_t mem_limit;
    int in_call;
    int mem_exhausted;
    long fail_after;
    int fail_sticky;
    long long instr_budget;
    long long instr_used;
    int budget_exhausted;
    int has_deadline;         /* engine_set_deadline was given a time */
    struct timespec deadline; /* CLOCK_MONOTONIC */
    int deadline_passed;
    int has_slice;            /* engine_set_slice was given a slice */
    struct timespec slice_end; /* CLOCK_THREAD_CPUTIME_ID */
    int sliced;               /* the slice ran out: sticky until the next engine_set_slice */
    pattern_meter meter;      /* the string library's matcher charges here (pattern.h) */
    long long memory_cap;
    char *library_dir;
    char *bundle_dir;
    char *override_dir;
    engine_source *sources;   /* hoster sources from memory (own copies) */
    size_t n_sources;
    int admission_ref;
    int bundle_ref;
    int decoded_ref;          /* engine_decode_review: the request's Lua value, LUA_NOREF: none */
    json_t *decoded_for;      /* ... for this "request" member of the document it returned (a reference held) */
    int runtime_ref;          /* engine_open_runtime: the module */
    int rule_count;
    engine_rule_result *last_rules; /* engine_last_rules */
    char *last_message;       /* engine_review_text: the last answer's status.message (owned) */
    size_t n_last_rules, cap_last_rules;
    const engine_held *held;  /* during engine_binder_budget only: host.binder_held reads it */
    unsigned held_call;       /* which budget call (a walk begun in another is refused) */
};

/* The lua_Alloc of every engine state (`ud` is the engine): accounts bytes
 * in mem_used and returns NULL past mem_limit (the per-call cap inside a
 * budgeted call, ENGINE_STATE_CEILING outside), or at the Nth allocation of
 * the test switch. Model: HAProxy hlua_alloc, Lua's ltests.c. */
void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize);

/* host.binder_held (binderlua.c): an iterator over the binder's held
 * units, (namespace, class, units) per step, during a budget check at
 * bind; raises outside one. */
int engine_host_binder_held(lua_State *L);

/* The engine that owns L (its allocator's userdata). */
engine *sandbox_engine_of(lua_State *L);

/* Opens the allowed standard libraries (base, table, string, math, utf8,
 * os) and hides the string metatable. STYLE.md "Open only what you mean to".
 * string.find, match, gmatch and gsub are the bounded ones of pattern.h,
 * charged to the policy call's instruction budget and deadline (decision
 * 0016); the string metatable's __index is that same table. */
void sandbox_open_libs(lua_State *L);

/* Builds the shared read-only library view every policy _ENV reads through
 * to (REG_BASE) and the require caches; `require` is sandbox_require. */
void sandbox_build_base(lua_State *L);

/* require(name) inside the sandbox: cozygpu.* from the library, then the
 * bundle's and the override's lib/ (files or sources from memory); a
 * read-only view of the module, cached per state. Raises on a bad name, a
 * missing module, a circular require. */
int sandbox_require(lua_State *L);

/* Loads the file `path` as text (mode "t") with chunk name "@path" and a
 * fresh _ENV. Pushes the function, or nil and a message; returns the
 * number of values pushed (1 or 2). */
int sandbox_push_chunk(lua_State *L, const char *path);

/* 1 when `s` is a module name require accepts: letters, digits, '_', '-'
 * and '.', not starting with '.', no "..". */
int sandbox_valid_module_name(const char *s);

/* Records the globals of the loaded main chunk at `fn` (decision 0014: a rule's
 * globals must not survive a review): tables it left in its globals become
 * read-only views, and the globals as loaded are kept, so that
 * sandbox_restore_envs puts them back. A chunk without an _ENV table is
 * left alone. */
void sandbox_freeze_env(lua_State *L, int fn);

/* Before each review: every recorded chunk gets its _ENV back in its
 * upvalue (undoing `_ENV = ...` in a hook) holding exactly the globals it
 * had once loaded (undoing assignments to globals). */
void sandbox_restore_envs(lua_State *L);

/* The host functions handed to the runtime's admission driver:
 * host.invoke(name, fn, ...) -> "ok", results... | kind, message (the one
 * way policy code runs: engine_call budgeted); host.load(path[, memory]) ->
 * chunk | nil, message; host.readonly(v) -> read-only view. */
int sandbox_host_invoke(lua_State *L);
int sandbox_host_load(lua_State *L);
int sandbox_host_readonly(lua_State *L);
/* host.freeze(chunk): sandbox_freeze_env; host.restore(): sandbox_restore_envs */
int sandbox_host_freeze(lua_State *L);
int sandbox_host_restore(lua_State *L);
/* host.now() -> seconds (CLOCK_MONOTONIC, a float): the runtime times
 * each rule's calls with it (engine_last_rules). */
int sandbox_host_now(lua_State *L);

/* Pushes `j` as Lua through engine_call (conversion can run out of
 * memory). COZY_ERR_INTERNAL when it fails, nothing pushed. (engine.c) */
cozy_result engine_push_json(engine *e, const json_t *j, cozy_err *err);

/* Calls field `fn` of the admission runtime (lua/runtime/admission.lua)
 * with the `nargs` arguments on the stack, trusted (no budget: the
 * runtime runs policy code through host.invoke itself). Leaves nres
 * results; COZY_ERR_INTERNAL with the message when it raised. (engine.c) */
cozy_result engine_call_admission(engine *e, const char *fn, int nargs, int nres, cozy_err *err);

/* The engine_outcome named `name` (engine_outcome_name's words), or -1. */
int sandbox_outcome_of(const char *name);

#endif
