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
 */
#ifndef COZYGPU_SPEC_CHECK_H
#define COZYGPU_SPEC_CHECK_H

#include <stdio.h>

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

static int check_finish(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
