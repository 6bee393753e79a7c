/* fuzz_pattern — libFuzzer target for the engine's pattern matcher
 * (core/engine/pattern.c, decision 0016), differential against the real
 * Lua 5.4 string library linked into the same state.
 *
 * Feeds: byte 0 picks the function (find, find plain, match, gmatch, gsub
 * with a string, a table or a function replacement) and an init; byte 1
 * the pattern's length; then the pattern and the subject (at most 64 bytes
 * each). The bounded function runs first, metered with a limit of
 * STEP_LIMIT steps; only when it finishes within it does Lua's own run
 * (same algorithm, same work), so a backtracking pattern cannot hang the
 * fuzzer.
 * Checks, besides the sanitizers: results (values and integer/float kind)
 * and error messages are equal.
 * Seeds: fuzz/seeds/fuzz_pattern/.
 */
#include "engine/pattern.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEP_LIMIT 2000000L
#define MAX_PART 64

static long steps;

static void fuzz_charge(lua_State *L, void *ud, long n)
{
    (void)ud;
    steps += n;
    if(steps > STEP_LIMIT)
        luaL_error(L, "fuzz: step limit");
}

static const pattern_meter meter = {fuzz_charge, NULL};

static const char *const driver =
    "local bounded = ...\n"
    "local function show(v)\n"
    "  if type(v) == 'table' then\n"
    "    local parts = {}\n"
    "    for i = 1, (v.n or #v) do parts[#parts + 1] = show(v[i]) end\n"
    "    return '{' .. table.concat(parts, ', ') .. '}'\n"
    "  elseif math.type(v) == 'float' then return ('%.17g(float)'):format(v)\n"
    "  elseif type(v) == 'string' then return ('%q'):format(v) end\n"
    "  return tostring(v)\n"
    "end\n"
    "local function call(fn, ...) local r = table.pack(fn(...)) return r end\n"
    "local function all(fn, ...)\n"
    "  local it, out = fn(...), {}\n"
    "  while #out < 100 do local r = table.pack(it()) if r[1] == nil then break end out[#out + 1] = r end\n"
    "  return out\n"
    "end\n"
    "local repl = { '<%0|%1>', { a = 'A', [''] = 'E', b = false, ['1'] = 1 }, function(...) return select('#', ...) .. (...) end }\n"
    "return function(op, s, p, init)\n"
    "  local name, how, extra = 'find', call, {}\n"
    "  if op == 1 then extra = { true }\n"
    "  elseif op == 2 then name = 'match'\n"
    "  elseif op == 3 then name, how = 'gmatch', all\n"
    "  elseif op >= 4 then name, extra = 'gsub', { repl[op - 3], init > 2 and init or nil } init = nil end\n"
    "  local args = table.pack(s, p, init, table.unpack(extra))\n"
    "  if name == 'gsub' then args = table.pack(s, p, extra[1], extra[2]) end\n"
    "  local ok2, r2 = pcall(how, bounded[name], table.unpack(args, 1, args.n))\n"
    "  if not ok2 and tostring(r2):find('fuzz: step limit', 1, true) then return true end\n"
    "  local ok1, r1 = pcall(how, string[name], table.unpack(args, 1, args.n))\n"
    "  local a, b = show(ok1) .. ' ' .. show(r1), show(ok2) .. ' ' .. show(r2)\n"
    "  if a == b then return true end\n"
    "  return false, name .. show(args) .. '\\n  lua:     ' .. a .. '\\n  bounded: ' .. b\n"
    "end\n";

static lua_State *state(void)
{
    static lua_State *L;
    if(L)
        return L;
    L = luaL_newstate();
    luaL_openlibs(L);
    if(luaL_loadstring(L, driver) != LUA_OK) {
        fprintf(stderr, "fuzz_pattern: %s\n", lua_tostring(L, -1));
        abort();
    }
    lua_newtable(L);
    pattern_register(L, -1, &meter);
    lua_call(L, 1, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, "fuzz_pattern");
    return L;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if(size < 2)
        return 0;
    lua_State *L = state();
    int op = data[0] % 7;
    lua_Integer inits[] = {1, 2, 0, -1, -3, 5, 70};
    lua_Integer init = inits[(data[0] / 7) % 7];
    size_t rest = size - 2;
    size_t lp = data[1] % (rest + 1);
    if(lp > MAX_PART)
        lp = MAX_PART;
    size_t ls = rest - lp > MAX_PART ? MAX_PART : rest - lp;
    steps = 0;
    lua_getfield(L, LUA_REGISTRYINDEX, "fuzz_pattern");
    lua_pushinteger(L, op);
    lua_pushlstring(L, (const char *)data + 2 + lp, ls);
    lua_pushlstring(L, (const char *)data + 2, lp);
    lua_pushinteger(L, init);
    if(lua_pcall(L, 4, 2, 0) != LUA_OK) {
        fprintf(stderr, "fuzz_pattern: driver: %s\n", lua_tostring(L, -1));
        abort();
    }
    if(!lua_toboolean(L, -2)) {
        fprintf(stderr, "fuzz_pattern: differs: %s\n", lua_tostring(L, -1));
        abort();
    }
    lua_settop(L, 0);
    return 0;
}
