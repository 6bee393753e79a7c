/* utf8.h — UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates
 * (U+D800..U+DFFF), nothing above U+10FFFF. It is what jansson accepts in
 * strings and keys, and what Go's encoding/json keeps (it writes every
 * other byte as U+FFFD).
 */
#ifndef COZYGPU_UTF8_H
#define COZYGPU_UTF8_H

#include <stddef.h>

/* The length (1..4) of the well-formed UTF-8 sequence at s, with n > 0
 * bytes left, or 0 when none starts there (a stray continuation byte, a
 * truncated sequence, an overlong form, a surrogate, a code point past
 * U+10FFFF). NUL is a well-formed one-byte sequence. */
size_t cozy_utf8_seq(const unsigned char *s, size_t n);

/* 1 when the n bytes at s are all well-formed UTF-8, else 0. */
int cozy_utf8_valid(const void *s, size_t n);

/* A copy of the n bytes at s in which every byte that does not belong to a
 * well-formed sequence (and NUL, unless keep_nul) becomes U+FFFD, as Go's
 * json.Marshal writes invalid bytes. Returns a malloc'd NUL-terminated
 * string (caller frees) and its length in *outlen, or NULL when out of
 * memory. */
char *cozy_utf8_sanitize(const void *s, size_t n, int keep_nul, size_t *outlen);

#endif
