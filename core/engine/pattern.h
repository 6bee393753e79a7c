/* pattern.h — Lua 5.4 patterns with a step budget (docs/decisions/0016).
 *
 * string.find, string.match, string.gmatch and string.gsub with the
 * semantics, results and error messages of Lua 5.4's own (reference manual
 * §6.4, §6.4.1), written for the engine so that every matching step is
 * counted: one C call of the string library can no longer outlive the
 * instruction budget or the review deadline of the policy call it runs in.
 *
 * The matcher counts steps (one per attempt of a pattern item, per
 * character a repetition or %b scans, per few bytes compared or set
 * entries tried) and hands them to a meter every PATTERN_CHARGE_STEPS
 * steps, at the start of every call (with 0 steps, so a call refuses to
 * begin once the meter has said stop) and at its end. The meter raises
 * (luaL_error) to stop the call. Without a meter nothing is counted; the
 * recursion bound ("pattern too complex", PATTERN_MAX_DEPTH) applies
 * always.
 */
#ifndef COZYGPU_ENGINE_PATTERN_H
#define COZYGPU_ENGINE_PATTERN_H

#include <lua.h>

/* Steps between two calls of the meter. */
#define PATTERN_CHARGE_STEPS 1000
/* Captures one match may hold (Lua's LUA_MAXCAPTURES). */
#define PATTERN_MAX_CAPTURES 32
/* Nested matcher calls before "pattern too complex" (Lua's MAXCCALLS). */
#define PATTERN_MAX_DEPTH 200

typedef struct pattern_meter {
    /* Adds `steps` (0 at the start of a call) to the budget it keeps;
     * raises with luaL_error when the call must stop. Never returns
     * otherwise changed state the matcher reads. */
    void (*charge)(lua_State *L, void *ud, long steps);
    void *ud;
} pattern_meter;

/* Sets find, match, gmatch and gsub of the table at `idx` to the bounded
 * functions metered by `m` (NULL: none). `m` must outlive every function
 * (and gmatch iterator) made here. */
void pattern_register(lua_State *L, int idx, const pattern_meter *m);

#endif
