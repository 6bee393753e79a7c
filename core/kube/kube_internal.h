/* kube_internal.h — shared between kube.c, kubeconfig.c, watch.c and
 * watch_stream.c only.
 *
 * Not a public interface: the resolved connection settings, the call
 * that prepares a curl easy handle for one request to the API server
 * (URL, TLS material, bearer token, User-Agent), and the informers' state
 * with the calls the watch streams (watch_stream.c) make into the caches
 * (watch.c).
 */
#ifndef COZYGPU_KUBE_INTERNAL_H
#define COZYGPU_KUBE_INTERNAL_H

#include "kube/kube.h"
#include "kube/watch.h"
#include "base/buf.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
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

/* --- informers (watch.c, watch_stream.c) -------------------------------- */

typedef enum inf_state { INF_IDLE, INF_LISTING, INF_WATCHING, INF_BACKOFF } inf_state;

/* why the watch transfer was aborted from the write callback */
typedef enum abort_why { AB_NONE, AB_GONE, AB_ERROR, AB_THROTTLED } abort_why;

struct kube_informer {
    kube_watcher *w;
    const kube_resource *res;
    char *ns, *label, *field;
    kube_event_fn fn;
    void *ctx;
    kube_transform_fn transform; /* NULL: objects are cached as they come */
    struct kube_informer *next;

    /* loop state (watcher thread only) */
    inf_state state;
    const kube_resource *cur; /* the version listed and watched: res, or an older one
                                 (kube_resource_older) the cluster serves instead */
    int relist;          /* after BACKOFF: list (1) or watch (0) */
    double wake_at;      /* end of BACKOFF */
    int failures;        /* consecutive, for the backoff */
    CURL *h;
    struct curl_slist *hdrs;
    long retry_after;
    char cerr[CURL_ERROR_SIZE];
    cozy_buf buf;        /* list body, or the incomplete watch line (ceiling set per use) */
    int overflow;
    json_t *pending;     /* list pages accumulated: key -> object */
    char *cont;          /* continue token of the next page */
    double watch_start;
    unsigned long watch_events;
    abort_why why;
    char *rv;            /* last resourceVersion seen */
    double resync_at;

    /* shared, under w->mu */
    json_t *cache;       /* key -> object */
    int synced;
    int optional;        /* 404 on LIST: not served, empty (watcher thread only after start) */
    const kube_resource *served; /* the version the cache was listed at; NULL before a list or
                                    when no version is served */
    char rv_copy[64];
};

struct kube_watcher {
    kube_client *c;
    long resync;
    pthread_mutex_t mu;
    unsigned long generation;
    kube_informer *infs, **tail;
    CURLM *multi;
    pthread_t th;
    int started;
    atomic_int stop;
};

/* metadata.<k> of obj as a string, or NULL. */
const char *kube_watch_meta(const json_t *obj, const char *k);

/* The cache key of obj (client-go MetaNamespaceKeyFunc: "ns/name", or
   "name" for a cluster-scoped object), malloc'd; NULL without a
   metadata.name or when out of memory. */
char *kube_watch_obj_key(const json_t *obj);

/* Replaces *dst by a copy of v (NULL: none). */
void kube_watch_set_str(char **dst, const char *v);

/* Counts a restart of inf's watch in cozygpu_watch_restarts_total{resource,
   reason} (when the metrics module is linked). */
void kube_watch_count_restart(kube_informer *inf, const char *reason);

/* Records rv (NULL: nothing) as the last resourceVersion inf has seen, and
   its copy kube_informer_rv reads under w->mu. */
void kube_watch_set_rv(kube_informer *inf, const char *rv);

/* Applies one watch event (ADDED, MODIFIED, DELETED) to inf's cache and
   delivers it (as ADDED or MODIFIED by what the cache held). */
void kube_watch_apply_event(kube_informer *inf, const char *type, json_t *obj);

/* The last page has arrived: replaces inf's cache by inf->pending and
   delivers the difference; served: the version listed (NULL: none is
   served). Marks the informer synced and records list_rv. */
void kube_watch_commit_list(kube_informer *inf, const char *list_rv, const kube_resource *served);

#endif
