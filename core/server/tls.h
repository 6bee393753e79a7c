/* tls.h — the webhook server's certificate pair (private to core/server/).
 *
 * A pair is a PEM certificate chain (leaf first) and a PEM private key
 * (PKCS#1, SEC1 or PKCS#8) whose public key is the leaf's, read from two
 * files: in a cluster, the tls.crt and tls.key of a Secret volume, which the
 * kubelet replaces by swapping the volume's ..data symlink (Kubernetes docs,
 * "Secrets": mounted Secrets are updated automatically). The files are
 * stat()ed at most once a second during handshakes and reloaded when their
 * device, inode, size or mtime change; a pair that does not load leaves the
 * serving one in place (warned once per change).
 *
 * Every TLS handshake gets private copies of the current pair through
 * webhook_tls_retrieve (GnuTLS certificate retrieve function 3), so a pair
 * can be replaced without waiting for the sessions that use it.
 */
#ifndef COZYGPU_SERVER_TLS_H
#define COZYGPU_SERVER_TLS_H

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <stddef.h>

/* How many servers one process may run at once (webhook_tls_register). */
#define WEBHOOK_TLS_MAX_SERVERS 16

typedef struct webhook_tls webhook_tls;

/* Loads the pair from `cert_file` and `key_file` (each at most 1 MiB) and
 * remembers both paths for reloads. Returns 0 with a new object in *out
 * (free it with webhook_tls_free), -1 when the pair does not load, with the
 * reason in `why` (e.g. "PATH: No such file or directory", "PATH: larger
 * than 1 MiB", "key file K does not match the certificate in C"), or -2
 * when out of memory. *out is NULL on error. */
int webhook_tls_open(webhook_tls **out, const char *cert_file, const char *key_file, char *why, size_t whylen);

/* Copies the hex serial number of the serving leaf certificate (for logs;
 * "" when it could not be read) into buf of `len` bytes, NUL-terminated. */
void webhook_tls_serial(webhook_tls *t, char *buf, size_t len);

/* Makes `t` known to webhook_tls_retrieve, which GnuTLS calls with a session
 * only: with one server registered, every handshake gets its pair; with
 * several, the one whose port (webhook_tls_set_port) is the session's local
 * port. Returns 0, or -1 when WEBHOOK_TLS_MAX_SERVERS are registered. */
int webhook_tls_register(webhook_tls *t);

/* Records the TCP port the server listens on (after the daemon started:
 * port 0 asks the kernel for one). */
void webhook_tls_set_port(webhook_tls *t, int port);

/* Forgets `t` (no handshake reaches it afterwards). Harmless when `t` was
 * not registered. */
void webhook_tls_unregister(webhook_tls *t);

/* Frees the pair and the object; unregister first. NULL is allowed. */
void webhook_tls_free(webhook_tls *t);

/* gnutls_certificate_retrieve_function3 (for libmicrohttpd's
 * MHD_OPTION_HTTPS_CERT_CALLBACK2): reloads the pair if its files changed,
 * then hands GnuTLS private copies of the chain and key, which GnuTLS frees
 * (GNUTLS_CERT_RETR_DEINIT_ALL). Returns 0, or -1 (the handshake fails)
 * when no registered server matches or out of memory. */
int webhook_tls_retrieve(gnutls_session_t session, const struct gnutls_cert_retr_st *info, gnutls_pcert_st **certs,
                         unsigned int *certs_length, gnutls_ocsp_data_st **ocsp, unsigned int *ocsp_length,
                         gnutls_privkey_t *privkey, unsigned int *flags);

#endif
