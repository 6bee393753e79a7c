/* check.h — the tally the table-driven C checks in spec/core share
 * (base_check.c, binder_check.c, binder_rules_check.c; run by
 * run-san-check.sh under ASan/UBSan). Header-only: each check program is
 * one translation unit.
 *
 *   ok(cond, what, detail)   counts a check; on failure prints
 *                            "FAIL [section] what: detail" (the section and
 *                            the detail only when set)
 *   check_section            the current group's name, or NULL
 *   check_finish()           prints "N passed, N failed"; returns the exit
 *                            status (1 when any failed), which the specs
 *                            (H.sanitized_check) read
 *   check_rnd(), check_rng   a seeded xorshift64 for bounded random inputs
 *   check_mutate_json()      one random mutation of a JSON text
 */
#ifndef COZYGPU_SPEC_CHECK_H
#define COZYGPU_SPEC_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;
static const char *check_section;

static void ok(int cond, const char *what, const char *detail)
{
    if(cond) {
        check_passed++;
        return;
    }
    check_failed++;
    printf("FAIL %s%s%s%s%s%s\n", check_section ? "[" : "", check_section ? check_section : "",
           check_section ? "] " : "", what, detail ? ": " : "", detail ? detail : "");
}

/* xorshift64, seeded per check (check_rng = seed), for bounded random
   inputs that are the same on every run */
static uint64_t check_rng = 46;
static inline uint64_t check_rnd(void)
{
    check_rng ^= check_rng << 13;
    check_rng ^= check_rng >> 7;
    check_rng ^= check_rng << 17;
    return check_rng;
}

/* One mutation of `text` (len bytes) into `buf` (room for len + 16): one
   to three bytes replaced, inserted or deleted, picked among JSON's own
   characters and bytes that trip parsers. Returns the new length. */
static inline size_t check_mutate_json(const char *text, size_t len, char *buf)
{
    static const char pick[] = "{}[]\",:\\u0123456789.eE-+ntfalsrx\x00\x01\x7f\x80\xbf\xc0\xed\xf4\xff";
    memcpy(buf, text, len);
    size_t m = len;
    int edits = 1 + (int)(check_rnd() % 3);
    for(int e = 0; e < edits; e++) {
        size_t at = m ? check_rnd() % m : 0;
        char c = pick[check_rnd() % (sizeof pick - 1)];
        switch(check_rnd() % 3) {
        case 0:
            if(m)
                buf[at] = c;
            break;
        case 1:
            if(m < len + 15) {
                memmove(buf + at + 1, buf + at, m - at);
                buf[at] = c;
                m++;
            }
            break;
        default:
            if(m) {
                memmove(buf + at, buf + at + 1, m - at - 1);
                m--;
            }
        }
    }
    return m;
}

static int check_finish(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
