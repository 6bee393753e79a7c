/* buf.h — growable arrays and byte buffers with a ceiling.
 *
 * Model: curl's lib/curlx/dynbuf.h (STYLE.md "C": every buffer has a
 * ceiling named after its purpose). One growth policy for the whole
 * runtime: capacity doubles from a small start.
 */
#ifndef COZYGPU_BUF_H
#define COZYGPU_BUF_H

#include <stdarg.h>
#include <stddef.h>

/* Makes room for `need` elements of `elem` (> 0) bytes in the array `p`
 * whose capacity (in elements) is *cap: doubles *cap (from 16) until it
 * holds `need`. Returns the array (possibly moved; *cap updated), or NULL
 * on overflow (need * elem past SIZE_MAX) or out of memory, in which case
 * `p` and *cap are untouched and still owned by the caller. `p` may be NULL
 * with *cap 0; it is then allocated even when `need` is 0, so that NULL
 * always means failure. */
void *cozy_grow(void *p, size_t *cap, size_t need, size_t elem);

/* A byte buffer that grows up to `max` bytes. Zero it, set `max`, then
 * add; `p` is always NUL-terminated once something was added (the NUL is
 * not counted in `len` nor against `max`). The caller owns `p` (free it
 * with cozy_buf_free, or take it and free() it). */
typedef struct cozy_buf {
    char *p;
    size_t len;
    size_t cap;
    size_t max; /* ceiling on len; 0: no ceiling */
} cozy_buf;

/* Appends n bytes. Returns 0, ENOMEM, or EFBIG when len would pass max
 * (nothing is appended then). */
int cozy_buf_add(cozy_buf *b, const void *data, size_t n);

/* Appends formatted text (printf). Same returns as cozy_buf_add. */
int cozy_buf_printf(cozy_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cozy_buf_vprintf(cozy_buf *b, const char *fmt, va_list ap);

/* Frees the bytes and zeroes the buffer, keeping its max. */
void cozy_buf_free(cozy_buf *b);

#endif
