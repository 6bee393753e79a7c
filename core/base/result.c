/* result.c — names of result codes and the message helper (result.h). */
#include "base/result.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const cozy_result_names[COZY_RESULT_LAST] = {
    [COZY_OK] = "ok",
    [COZY_ERR_IO] = "io error",
    [COZY_ERR_PARSE] = "parse error",
    [COZY_ERR_INPUT] = "invalid input",
    [COZY_ERR_CONFIG] = "invalid settings",
    [COZY_ERR_POLICY] = "policy error",
    [COZY_ERR_BUDGET] = "instruction budget exhausted",
    [COZY_ERR_MEMORY] = "memory cap exceeded",
    [COZY_ERR_INTERNAL] = "internal error",
    [COZY_ERR_USAGE] = "usage error",
};

const char *cozy_strerror(cozy_result rc)
{
    if((int)rc < 0 || rc >= COZY_RESULT_LAST || !cozy_result_names[rc])
        return "unknown error";
    return cozy_result_names[rc];
}

static void cozy_vsay(cozy_err *err, const char *fmt, va_list ap)
{
    if(err)
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
}

cozy_result cozy_fail(cozy_err *err, cozy_result rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cozy_vsay(err, fmt, ap);
    va_end(ap);
    return rc;
}

void cozy_say(cozy_err *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cozy_vsay(err, fmt, ap);
    va_end(ap);
}
