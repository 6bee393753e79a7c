/* kube_internal.h — shared between kube.c, kubeconfig.c and watch.c only.
 *
 * Not a public interface: the resolved connection settings, and the call
 * that prepares a curl easy handle for one request to the API server
 * (URL, TLS material, bearer token, User-Agent).
 */
#ifndef COZYGPU_KUBE_INTERNAL_H
#define COZYGPU_KUBE_INTERNAL_H

#include "kube/kube.h"

#include <curl/curl.h>
#include <stddef.h>

/* Resolved settings of one client. Every string and buffer is malloc'd and
   owned by the struct; NULL / 0 when absent. */
typedef struct kube_config {
    char *source;          /* kubeconfig path(s) or "in-cluster" */
    char *server;          /* base URL without a trailing '/' */
    int insecure;          /* insecure-skip-tls-verify */
    unsigned char *ca;     /* PEM bundle (certificate-authority[-data], ca.crt) */
    size_t ca_len;
    unsigned char *cert;   /* client certificate PEM */
    size_t cert_len;
    unsigned char *key;    /* client key PEM */
    size_t key_len;
    char *token;           /* static bearer token */
    char *token_file;      /* re-read when it changes; wins over token */
    char *token_field;     /* "users[0].user.tokenFile" or the in-cluster path, for messages */
} kube_config;

/* Fills cfg from the options (kubeconfig.c). On failure cfg is cleared and err
   names the file and the field. */
cozy_result kube_config_load(kube_config *cfg, const kube_client_options *o, cozy_err *err);

/* Frees what cfg holds and zeroes it. */
void kube_config_clear(kube_config *cfg);

/* Decodes a kubeconfig "-data" field (the NUL-terminated string s) as
   client-go does, with Go's base64.StdEncoding (cozy_base64_decode: RFC 4648
   §4 alphabet, '=' padding required, CR/LF skipped) into a malloc'd buffer
   (NUL-terminated, *len excludes the NUL; caller frees). NULL when invalid
   or out of memory. */
unsigned char *kube_base64_decode(const char *s, size_t *len);

/* Prepares h (a fresh or reset easy handle) for a request to path on c's
   server: URL, TLS settings, share handle, User-Agent, Accept and the bearer
   token (the token file re-read if it changed). *headers receives the header
   list the caller frees with curl_slist_free_all after the transfer;
   extra_header (e.g. "Content-Type: ...") is appended when not NULL.
   Errors: COZY_ERR_IO when the token file cannot be read. */
cozy_result kube_handle_setup(kube_client *c, CURL *h, const char *path,
                              const char *extra_header, struct curl_slist **headers,
                              cozy_err *err);

/* Seconds of a Retry-After header value (delta-seconds form only,
   RFC 9110 §10.2.3), or -1. */
long kube_parse_retry_after(const char *value);

/* One response header line from curl's header callback (not NUL-
 * terminated, `n` bytes). When it is `Retry-After:`, stores its parsed
 * value (kube_parse_retry_after) in *out and returns 1; else returns 0. */
int kube_header_retry_after(const char *line, size_t n, long *out);

/* The client's per-request timeout in ms. */
long kube_client_timeout_ms(const kube_client *c);

/* Monotonic clock in seconds. */
double kube_now(void);

/* A uniformly distributed double in [0, 1), thread-safe. */
double kube_rand01(void);

#endif
