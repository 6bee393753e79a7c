/* fuzz_tmp.h — the scratch folder a harness writes its inputs into.
 * Header-only: each harness is its own program. */
#ifndef COZYGPU_FUZZ_TMP_H
#define COZYGPU_FUZZ_TMP_H

#include <stdio.h>
#include <stdlib.h>

/* Makes a new folder "cozygpu-fuzz-<who>-<random>" under $TMPDIR (or /tmp)
 * into buf (n bytes); exits the harness, naming `who`, when it cannot. The
 * trailing X's are mkdtemp(3)'s template, replaced by random letters. */
static inline void fuzz_tmpdir(char *buf, size_t n, const char *who)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, n, "%s/cozygpu-fuzz-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", who);
    if(!mkdtemp(buf)) {
        fprintf(stderr, "fuzz_%s: ", who);
        perror("mkdtemp");
        exit(1);
    }
}

#endif
