/* result.h — numbered result codes shared by every core module.
 *
 * Each fallible function returns a `cozy_result`; COZY_OK is zero, so callers
 * write `if((rc = step()) != COZY_OK) goto out;`. The detailed message goes
 * into a caller-provided buffer (see `cozy_err`), the code says what kind of
 * failure it was and how the CLI maps it to an exit status.
 * Model: curl's CURLcode and lib/strerror.c (STYLE.md, "C").
 */
#ifndef COZYGPU_RESULT_H
#define COZYGPU_RESULT_H

#include <stddef.h>

typedef enum cozy_result {
    COZY_OK = 0,
    COZY_ERR_IO,          /* a file or directory could not be read */
    COZY_ERR_PARSE,       /* JSON or YAML syntax error */
    COZY_ERR_INPUT,       /* well-formed, but not a valid input object */
    COZY_ERR_CONFIG,      /* settings file invalid (unknown key, bad value) */
    COZY_ERR_POLICY,      /* a policy failed to load or errored */
    COZY_ERR_BUDGET,      /* a policy call ran out of its instruction budget */
    COZY_ERR_MEMORY,      /* a policy call ran out of its memory cap */
    COZY_ERR_INTERNAL,    /* a bug in cozygpu itself */
    COZY_ERR_USAGE,       /* bad command-line usage */
    COZY_RESULT_LAST
} cozy_result;

/* Returns a static, human-readable name for `rc` ("io error", ...). Never NULL. */
const char *cozy_strerror(cozy_result rc);

/* A message buffer a failing function fills. `msg` is always NUL-terminated. */
typedef struct cozy_err {
    char msg[1024];
} cozy_err;

/* printf-style: writes into err->msg (truncating) and returns `rc`, so
 * `return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));`.
 * `err` may be NULL (the message is dropped). */
cozy_result cozy_fail(cozy_err *err, cozy_result rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The message half of cozy_fail, for modules with their own result codes
 * (core/binder: `return cozy_say(err, ...), BINDER_ERR_INPUT;`). `err` may
 * be NULL. */
void cozy_say(cozy_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
