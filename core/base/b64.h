/* b64.h — base64 as Kubernetes writes and reads it.
 *
 * The standard alphabet with '=' padding (RFC 4648 §4), as Go's
 * encoding/base64.StdEncoding: the AdmissionResponse `patch` field,
 * kubeconfig `*-data` fields and YAML `!!binary` values all use it.
 */
#ifndef COZYGPU_B64_H
#define COZYGPU_B64_H

#include <stddef.h>

/* Encodes `len` bytes. Returns a malloc'd NUL-terminated string (caller
 * frees; its length is 4 * ceil(len / 3)), or NULL when out of memory. */
char *cozy_base64_encode(const void *in, size_t len);

/* Decodes `n` characters as Go's base64.StdEncoding.DecodeString does:
 * '\r' and '\n' are skipped, padding is required (the length without
 * them is a multiple of 4), '=' only at the end, the trailing bits of the
 * last symbol need not be zero. Returns 0 with a malloc'd buffer in *out
 * (NUL-terminated; *outlen excludes the NUL; caller frees), -1 on invalid
 * input, -2 when out of memory (*out untouched on error). */
int cozy_base64_decode(const char *s, size_t n, unsigned char **out, size_t *outlen);

#endif
