/* buf.c — growable arrays and byte buffers (buf.h). */
#include "base/buf.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *cozy_grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if(need <= *cap && p)
        return p; /* a NULL array is always allocated, so NULL means failure */
    size_t n = *cap ? *cap : 16;
    while(n < need) {
        if(n > SIZE_MAX / 2)
            return NULL;
        n *= 2;
    }
    if(elem && n > SIZE_MAX / elem)
        return NULL;
    void *np = realloc(p, n * elem);
    if(!np)
        return NULL;
    *cap = n;
    return np;
}

int cozy_buf_add(cozy_buf *b, const void *data, size_t n)
{
    if(b->max && (n > b->max || b->len > b->max - n))
        return EFBIG;
    if(n > SIZE_MAX - b->len - 1)
        return ENOMEM;
    char *np = cozy_grow(b->p, &b->cap, b->len + n + 1, 1);
    if(!np)
        return ENOMEM;
    b->p = np;
    if(n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int cozy_buf_vprintf(cozy_buf *b, const char *fmt, va_list ap)
{
    va_list cp;
    va_copy(cp, ap);
    int n = vsnprintf(NULL, 0, fmt, cp);
    va_end(cp);
    if(n < 0)
        return EINVAL;
    if(b->max && ((size_t)n > b->max || b->len > b->max - (size_t)n))
        return EFBIG;
    char *np = cozy_grow(b->p, &b->cap, b->len + (size_t)n + 1, 1);
    if(!np)
        return ENOMEM;
    b->p = np;
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int cozy_buf_printf(cozy_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = cozy_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void cozy_buf_free(cozy_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
