/* pattern.c — Lua 5.4 patterns with a step budget (pattern.h,
 * docs/decisions/0016).
 *
 * Written from the Lua 5.4 reference manual (§6.4 string.find, match,
 * gmatch, gsub; §6.4.1 Patterns); results and error messages are Lua's,
 * which spec/core/pattern_spec.lua checks against the real string library.
 * A backtracking matcher: a pattern is a sequence of items; an item with
 * a quantifier, a capture and a `?` try the rest of the pattern by
 * recursion, everything else advances in a loop. The recursion depth is
 * bounded as Lua bounds it (PATTERN_MAX_DEPTH, "pattern too complex"), so
 * the same patterns fail the same way.
 *
 * Every step is counted in `left`, steps still free before the meter is
 * charged: a pattern item tried, a character a repetition or %b scans, a
 * few bytes of a back-reference or plain search compared, a few entries of
 * a set tried. The meter is charged every PATTERN_CHARGE_STEPS steps and
 * raises to stop the call (pattern.h).
 */
#include "engine/pattern.h"

#include <ctype.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include <lauxlib.h>

#define CAP_OPEN (-1)     /* a capture whose ')' is not reached yet */
#define CAP_POSITION (-2) /* a position capture, () */

#define U(c) ((unsigned char)(c))

typedef struct capture {
    const char *at;
    ptrdiff_t len; /* bytes, or CAP_OPEN, CAP_POSITION */
} capture;

typedef struct matcher {
    lua_State *L;
    const char *subj, *subj_end;
    const char *pat_end;
    int depth_left;
    int ncap;
    capture cap[PATTERN_MAX_CAPTURES];
    const pattern_meter *meter;
    long left; /* steps before the meter is charged */
} matcher;

/* ---- the meter ----------------------------------------------------------- */

static void charge_now(matcher *m)
{
    long used = PATTERN_CHARGE_STEPS - m->left;
    m->left = PATTERN_CHARGE_STEPS;
    if(m->meter)
        m->meter->charge(m->L, m->meter->ud, used);
}

static inline void step(matcher *m, long n)
{
    m->left -= n;
    if(m->left <= 0)
        charge_now(m);
}

/* Charges what the call used since the last charge. */
static void settle(matcher *m)
{
    if(m->left < PATTERN_CHARGE_STEPS)
        charge_now(m);
}

static void matcher_start(matcher *m, lua_State *L, const pattern_meter *meter, const char *s, size_t ls,
                          const char *p, size_t lp)
{
    m->L = L;
    m->subj = s;
    m->subj_end = s + ls;
    m->pat_end = p + lp;
    m->depth_left = PATTERN_MAX_DEPTH;
    m->ncap = 0;
    m->meter = meter;
    m->left = PATTERN_CHARGE_STEPS;
    if(meter)
        meter->charge(L, meter->ud, 0); /* refuses to begin once stopped */
}

/* Before each attempt at a new position. */
static void matcher_reset(matcher *m)
{
    m->depth_left = PATTERN_MAX_DEPTH;
    m->ncap = 0;
}

/* ---- single-character classes -------------------------------------------- */

/* Past the single-character class starting at p: ".", "%x", "[set]" or a
 * plain character. Raises on a malformed one. */
static const char *item_end(matcher *m, const char *p)
{
    char c = *p++;
    if(c == '%') {
        if(p >= m->pat_end)
            luaL_error(m->L, "malformed pattern (ends with '%%')");
        return p + 1;
    }
    if(c == '[') {
        if(p < m->pat_end && *p == '^')
            p++;
        /* the first character of a set is a member even when it is ']' */
        do {
            if(p >= m->pat_end)
                luaL_error(m->L, "malformed pattern (missing ']')");
            c = *p++;
            if(c == '%' && p < m->pat_end)
                p++;
        } while(p >= m->pat_end || *p != ']');
        return p + 1;
    }
    return p;
}

/* c in the class %cl (cl a letter), or c == cl for any other cl. */
static int class_has(int c, int cl)
{
    int r;
    switch(tolower(cl)) {
    case 'a': r = isalpha(c); break;
    case 'c': r = iscntrl(c); break;
    case 'd': r = isdigit(c); break;
    case 'g': r = isgraph(c); break;
    case 'l': r = islower(c); break;
    case 'p': r = ispunct(c); break;
    case 's': r = isspace(c); break;
    case 'u': r = isupper(c); break;
    case 'w': r = isalnum(c); break;
    case 'x': r = isxdigit(c); break;
    case 'z': r = c == 0; break; /* deprecated in the manual, still matched by Lua */
    default: return cl == c;
    }
    return isupper(cl) ? !r : r != 0;
}

/* c in the set from '[' at p to its ']' at close. */
static int set_has(int c, const char *p, const char *close)
{
    int member = 1;
    if(p[1] == '^') {
        member = 0;
        p++;
    }
    while(++p < close) {
        if(*p == '%') {
            p++;
            if(class_has(c, U(*p)))
                return member;
        } else if(p[1] == '-' && p + 2 < close) {
            if(U(p[0]) <= c && c <= U(p[2]))
                return member;
            p += 2;
        } else if(U(*p) == c) {
            return member;
        }
    }
    return !member;
}

/* The subject character at s matches the class from p to ep. */
static int single(matcher *m, const char *s, const char *p, const char *ep)
{
    if(s >= m->subj_end)
        return 0;
    int c = U(*s);
    switch(*p) {
    case '.': return 1;
    case '%': return class_has(c, U(p[1]));
    case '[':
        m->left -= (ep - p) >> 4; /* a long set costs more than one step */
        return set_has(c, p, ep - 1);
    default: return U(*p) == c;
    }
}

/* ---- matching ------------------------------------------------------------ */

static const char *match_at(matcher *m, const char *s, const char *p);

static const char *open_capture(matcher *m, const char *s, const char *p, ptrdiff_t kind)
{
    if(m->ncap >= PATTERN_MAX_CAPTURES)
        luaL_error(m->L, "too many captures");
    m->cap[m->ncap].at = s;
    m->cap[m->ncap].len = kind;
    m->ncap++;
    const char *r = match_at(m, s, p);
    if(!r)
        m->ncap--;
    return r;
}

static const char *close_capture(matcher *m, const char *s, const char *p)
{
    int i = m->ncap - 1;
    while(i >= 0 && m->cap[i].len != CAP_OPEN)
        i--;
    if(i < 0)
        luaL_error(m->L, "invalid pattern capture");
    m->cap[i].len = s - m->cap[i].at;
    const char *r = match_at(m, s, p);
    if(!r)
        m->cap[i].len = CAP_OPEN;
    return r;
}

/* %1-%9 (digit d) at s: past the repeated text, or NULL. */
static const char *back_reference(matcher *m, const char *s, int d)
{
    int i = d - '1';
    if(i < 0 || i >= m->ncap || m->cap[i].len == CAP_OPEN)
        luaL_error(m->L, "invalid capture index %%%d", i + 1);
    ptrdiff_t len = m->cap[i].len;
    if(len < 0) /* a position capture repeats nothing that can match */
        return NULL;
    step(m, len >> 4);
    if(m->subj_end - s >= len && memcmp(m->cap[i].at, s, (size_t)len) == 0)
        return s + len;
    return NULL;
}

/* %bxy at s (p points at x): past the balanced text, or NULL. */
static const char *balanced(matcher *m, const char *s, const char *p)
{
    if(p >= m->pat_end - 1)
        luaL_error(m->L, "malformed pattern (missing arguments to '%%b')");
    if(s >= m->subj_end || *s != p[0])
        return NULL;
    char open = p[0], close = p[1];
    long depth = 1;
    while(++s < m->subj_end) {
        step(m, 1);
        if(*s == close) {
            if(--depth == 0)
                return s + 1;
        } else if(*s == open) {
            depth++;
        }
    }
    return NULL;
}

/* Greedy: as many as match, then give back one at a time. */
static const char *longest(matcher *m, const char *s, const char *p, const char *ep)
{
    ptrdiff_t n = 0;
    while(single(m, s + n, p, ep)) {
        n++;
        step(m, 1);
    }
    for(; n >= 0; n--) {
        const char *r = match_at(m, s + n, ep + 1);
        if(r)
            return r;
    }
    return NULL;
}

/* Lazy: the rest first, then one more. */
static const char *shortest(matcher *m, const char *s, const char *p, const char *ep)
{
    for(;;) {
        const char *r = match_at(m, s, ep + 1);
        if(r)
            return r;
        if(!single(m, s, p, ep))
            return NULL;
        s++;
    }
}

/* The rest of the pattern from p against the subject from s: the end of
 * the match, or NULL. */
static const char *match_at(matcher *m, const char *s, const char *p)
{
    if(m->depth_left-- == 0)
        luaL_error(m->L, "pattern too complex");
    for(;;) {
        step(m, 1);
        if(p == m->pat_end)
            break;
        if(*p == '(') {
            if(p + 1 < m->pat_end && p[1] == ')')
                s = open_capture(m, s, p + 2, CAP_POSITION);
            else
                s = open_capture(m, s, p + 1, CAP_OPEN);
            break;
        }
        if(*p == ')') {
            s = close_capture(m, s, p + 1);
            break;
        }
        if(*p == '$' && p + 1 == m->pat_end) {
            if(s != m->subj_end)
                s = NULL;
            break;
        }
        if(*p == '%' && p + 1 < m->pat_end) {
            char k = p[1];
            if(k == 'b') {
                s = balanced(m, s, p + 2);
                if(!s)
                    break;
                p += 4;
                continue;
            }
            if(k == 'f') {
                p += 2;
                if(p >= m->pat_end || *p != '[')
                    luaL_error(m->L, "missing '[' after '%%f' in pattern");
                const char *ep = item_end(m, p);
                int before = s == m->subj ? 0 : U(s[-1]);
                int here = s < m->subj_end ? U(*s) : 0;
                if(!set_has(before, p, ep - 1) && set_has(here, p, ep - 1)) {
                    p = ep;
                    continue;
                }
                s = NULL;
                break;
            }
            if(k >= '0' && k <= '9') {
                s = back_reference(m, s, k);
                if(!s)
                    break;
                p += 2;
                continue;
            }
        }
        /* a single-character class, maybe with a quantifier */
        const char *ep = item_end(m, p);
        char q = ep < m->pat_end ? *ep : 0;
        if(!single(m, s, p, ep)) {
            if(q == '*' || q == '?' || q == '-') { /* zero of them */
                p = ep + 1;
                continue;
            }
            s = NULL;
            break;
        }
        if(q == '?') {
            const char *r = match_at(m, s + 1, ep + 1);
            if(r) {
                s = r;
                break;
            }
            p = ep + 1;
            continue;
        }
        if(q == '+') {
            s = longest(m, s + 1, p, ep);
            break;
        }
        if(q == '*') {
            s = longest(m, s, p, ep);
            break;
        }
        if(q == '-') {
            s = shortest(m, s, p, ep);
            break;
        }
        s++;
        p = ep;
    }
    m->depth_left++;
    return s;
}

/* ---- captures ------------------------------------------------------------ */

/* Pushes capture i; with no captures, i == 0 is the whole match s..e. */
static void push_capture(matcher *m, int i, const char *s, const char *e)
{
    if(i >= m->ncap) {
        if(i != 0)
            luaL_error(m->L, "invalid capture index %%%d", i + 1);
        lua_pushlstring(m->L, s, (size_t)(e - s));
        return;
    }
    ptrdiff_t len = m->cap[i].len;
    if(len == CAP_OPEN)
        luaL_error(m->L, "unfinished capture");
    if(len == CAP_POSITION)
        lua_pushinteger(m->L, (lua_Integer)(m->cap[i].at - m->subj) + 1);
    else
        lua_pushlstring(m->L, m->cap[i].at, (size_t)len);
}

/* Pushes every capture, or the whole match when there are none and s is
 * not NULL; returns how many. */
static int push_captures(matcher *m, const char *s, const char *e)
{
    int n = m->ncap == 0 && s ? 1 : m->ncap;
    luaL_checkstack(m->L, n, "too many captures");
    for(int i = 0; i < n; i++)
        push_capture(m, i, s, e);
    return n;
}

/* ---- string.find, string.match ------------------------------------------- */

/* A start position as Lua reads it: negative counts from the end, 0 and
 * below the start are 1. */
static size_t start_index(lua_Integer pos, size_t len)
{
    if(pos > 0)
        return (size_t)pos;
    if(pos == 0 || pos < -(lua_Integer)len)
        return 1;
    return (size_t)((lua_Integer)len + pos + 1);
}

static int has_specials(const char *p, size_t lp)
{
    for(size_t i = 0; i < lp; i++)
        if(strchr("^$*+?.([%-", p[i]) && p[i])
            return 1;
    return 0;
}

/* The first place of the l2 bytes of p in the l1 bytes of s, or NULL. */
static const char *find_plain(matcher *m, const char *s, size_t l1, const char *p, size_t l2)
{
    if(l2 == 0)
        return s;
    if(l2 > l1)
        return NULL;
    const char *last = s + (l1 - l2);
    while(s <= last) {
        const char *hit = memchr(s, p[0], (size_t)(last - s) + 1);
        if(!hit)
            return NULL;
        step(m, 1 + ((hit - s) >> 6) + (long)(l2 >> 4));
        if(memcmp(hit + 1, p + 1, l2 - 1) == 0)
            return hit;
        s = hit + 1;
    }
    return NULL;
}

static int find_or_match(lua_State *L, int find)
{
    const pattern_meter *meter = lua_touserdata(L, lua_upvalueindex(1));
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_index(luaL_optinteger(L, 3, 1), ls) - 1;
    matcher m;
    matcher_start(&m, L, meter, s, ls, p, lp);
    if(init > ls) {
        luaL_pushfail(L);
        return 1;
    }
    if(find && (lua_toboolean(L, 4) || !has_specials(p, lp))) {
        const char *hit = find_plain(&m, s + init, ls - init, p, lp);
        settle(&m);
        if(hit) {
            lua_pushinteger(L, (lua_Integer)(hit - s) + 1);
            lua_pushinteger(L, (lua_Integer)(hit - s) + (lua_Integer)lp);
            return 2;
        }
    } else {
        const char *from = s + init;
        int anchored = lp > 0 && *p == '^';
        if(anchored)
            p++;
        do {
            matcher_reset(&m);
            const char *e = match_at(&m, from, p);
            if(e) {
                int n;
                if(find) {
                    lua_pushinteger(L, (lua_Integer)(from - s) + 1);
                    lua_pushinteger(L, (lua_Integer)(e - s));
                    n = push_captures(&m, NULL, NULL) + 2;
                } else {
                    n = push_captures(&m, from, e);
                }
                settle(&m);
                return n;
            }
        } while(from++ < m.subj_end && !anchored);
        settle(&m);
    }
    luaL_pushfail(L);
    return 1;
}

static int l_find(lua_State *L) { return find_or_match(L, 1); }

static int l_match(lua_State *L) { return find_or_match(L, 0); }

/* ---- string.gmatch ------------------------------------------------------- */

typedef struct gmatch_state {
    matcher m;
    const char *p;
    const char *next;       /* where the next search starts */
    const char *last_end;   /* end of the last match: an empty match there is skipped */
} gmatch_state;

static int gmatch_next(lua_State *L)
{
    gmatch_state *g = lua_touserdata(L, lua_upvalueindex(3));
    g->m.L = L;
    if(g->m.meter)
        g->m.meter->charge(L, g->m.meter->ud, 0);
    for(const char *from = g->next; from <= g->m.subj_end; from++) {
        matcher_reset(&g->m);
        const char *e = match_at(&g->m, from, g->p);
        if(e && e != g->last_end) {
            g->next = g->last_end = e;
            int n = push_captures(&g->m, from, e);
            settle(&g->m);
            return n;
        }
    }
    settle(&g->m);
    return 0;
}

static int l_gmatch(lua_State *L)
{
    const pattern_meter *meter = lua_touserdata(L, lua_upvalueindex(1));
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_index(luaL_optinteger(L, 3, 1), ls) - 1;
    lua_settop(L, 2); /* the closure keeps both strings alive */
    gmatch_state *g = lua_newuserdatauv(L, sizeof *g, 0);
    if(init > ls)
        init = ls + 1;
    matcher_start(&g->m, L, meter, s, ls, p, lp);
    g->p = p;
    g->next = s + init;
    g->last_end = NULL;
    lua_pushcclosure(L, gmatch_next, 3);
    return 1;
}

/* ---- string.gsub --------------------------------------------------------- */

/* The replacement string (argument 3) for the match s..e: %0 the match,
 * %1-%9 captures, %% a '%'. */
static void add_template(matcher *m, luaL_Buffer *b, const char *s, const char *e)
{
    lua_State *L = m->L;
    size_t l;
    const char *t = lua_tolstring(L, 3, &l);
    const char *q;
    while((q = memchr(t, '%', l)) != NULL) {
        luaL_addlstring(b, t, (size_t)(q - t));
        q++; /* the string ends in a NUL: a trailing '%' sees it */
        if(*q == '%') {
            luaL_addchar(b, '%');
        } else if(*q == '0') {
            luaL_addlstring(b, s, (size_t)(e - s));
        } else if(isdigit(U(*q))) {
            push_capture(m, *q - '1', s, e);
            luaL_addvalue(b);
        } else {
            luaL_error(L, "invalid use of '%c' in replacement string", '%');
        }
        l -= (size_t)(q + 1 - t);
        t = q + 1;
    }
    luaL_addlstring(b, t, l);
}

/* Adds the replacement of s..e; 1 when it changed the text. */
static int add_replacement(matcher *m, luaL_Buffer *b, const char *s, const char *e, int kind)
{
    lua_State *L = m->L;
    if(kind == LUA_TFUNCTION) {
        lua_pushvalue(L, 3);
        int n = push_captures(m, s, e);
        lua_call(L, n, 1);
    } else if(kind == LUA_TTABLE) {
        push_capture(m, 0, s, e);
        lua_gettable(L, 3);
    } else {
        add_template(m, b, s, e);
        return 1;
    }
    if(!lua_toboolean(L, -1)) { /* nil or false: the match stays */
        lua_pop(L, 1);
        luaL_addlstring(b, s, (size_t)(e - s));
        return 0;
    }
    if(!lua_isstring(L, -1))
        return luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    luaL_addvalue(b);
    return 1;
}

static int l_gsub(lua_State *L)
{
    const pattern_meter *meter = lua_touserdata(L, lua_upvalueindex(1));
    size_t ls, lp;
    const char *src = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    int kind = lua_type(L, 3);
    lua_Integer max = luaL_optinteger(L, 4, (lua_Integer)ls + 1);
    luaL_argexpected(L, kind == LUA_TNUMBER || kind == LUA_TSTRING || kind == LUA_TFUNCTION || kind == LUA_TTABLE,
                     3, "string/function/table");
    const char *last_end = NULL;
    lua_Integer n = 0;
    int changed = 0;
    int anchored = lp > 0 && *p == '^';
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    matcher m;
    matcher_start(&m, L, meter, src, ls, p, lp);
    if(anchored)
        p++;
    while(n < max) {
        matcher_reset(&m);
        const char *e = match_at(&m, src, p);
        if(e && e != last_end) {
            n++;
            changed |= add_replacement(&m, &b, src, e, kind);
            src = last_end = e;
        } else if(src < m.subj_end) {
            luaL_addchar(&b, *src++);
        } else {
            break;
        }
        if(anchored)
            break;
    }
    settle(&m);
    if(!changed) {
        lua_pushvalue(L, 1);
    } else {
        luaL_addlstring(&b, src, (size_t)(m.subj_end - src));
        luaL_pushresult(&b);
    }
    lua_pushinteger(L, n);
    return 2;
}

void pattern_register(lua_State *L, int idx, const pattern_meter *meter)
{
    static const luaL_Reg fns[] = {
        {"find", l_find}, {"match", l_match}, {"gmatch", l_gmatch}, {"gsub", l_gsub}, {NULL, NULL},
    };
    idx = lua_absindex(L, idx);
    for(const luaL_Reg *f = fns; f->name; f++) {
        lua_pushlightuserdata(L, (void *)meter);
        lua_pushcclosure(L, f->func, 1);
        lua_setfield(L, idx, f->name);
    }
}
