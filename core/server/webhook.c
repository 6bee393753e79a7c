/* webhook.c — admission webhook HTTPS server (webhook.h).
 *
 * Request life: MHD calls wh_uri_logged() once the request line is read
 * (the request is then "in flight"), wh_access() once the headers are in
 * (route, method, Content-Type, Content-Length checks), again per body chunk
 * (kept up to the ceiling) and once more at the end (parse, check, review,
 * answer), and wh_completed() when the response has been sent or the
 * connection dropped (no longer in flight). Certificates: MHD hands every
 * TLS handshake to wh_cert_retrieve() (GnuTLS retrieve function 3), which
 * gives GnuTLS private copies of the current pair, so a pair can be
 * replaced at any time without waiting for the sessions that use it.
 */
#include "server/webhook.h"

#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/metrics.h"

#define WH_COMPONENT "webhook"
#define WH_TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"
#define WH_DEFAULT_MAX_BODY (3u * 1024u * 1024u) /* k8s.io/apiserver: maxRequestBodyBytes 3 MiB */
#define WH_DEFAULT_TIMEOUT_MS 8000L
#define WH_DEFAULT_WORKERS 4u
#define WH_DEFAULT_CONN_TIMEOUT_S 120u
#define WH_PEM_MAX_BYTES (1024 * 1024) /* a certificate chain or key file */
#define WH_CHAIN_MAX 16
#define WH_RECHECK_NS 1000000000L /* stat the certificate files at most once a second */
#define WH_MAX_SERVERS 16

#define WH_REVIEWS "cozygpu_admission_reviews_total"
#define WH_DURATION "cozygpu_admission_review_duration_seconds"

/* --- certificate pairs ---------------------------------------------------- */

typedef struct wh_pair {
    gnutls_pcert_st certs[WH_CHAIN_MAX];
    unsigned n_certs;
    gnutls_x509_privkey_t key;
    char serial[80]; /* hex of the leaf's serial number, for logs */
} wh_pair;

typedef struct wh_sig { /* what stat() says about one file */
    int ok;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} wh_sig;

typedef struct wh_endpoint_labels {
    char *webhook;                  /* webhook="name" */
    char *allowed, *denied, *error; /* webhook="name",decision="..." */
} wh_endpoint_labels;

struct webhook_server {
    struct MHD_Daemon *daemon;
    int port;
    const webhook_endpoint *endpoints;
    size_t n_endpoints;
    wh_endpoint_labels *labels;
    size_t max_body;
    long timeout_ms;
    webhook_review_fn review;
    void *ctx;
    int (*ready)(void *ctx);
    atomic_int in_flight;
    atomic_int quiescing;
    atomic_int started; /* MHD log messages after start are debug noise (bad handshakes) */

    pthread_mutex_t cert_lock; /* guards everything below */
    char *cert_file, *key_file;
    wh_pair *pair;                      /* serving */
    wh_sig sig[2];                      /* of the files the serving pair came from */
    wh_sig failed[2];                   /* of files that failed to load (warned once) */
    struct timespec last_check;         /* CLOCK_MONOTONIC */
};

/* Servers that are running, for the certificate callback (GnuTLS gives it
   the session only; we find the server by the session's local port). */
static pthread_mutex_t wh_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static webhook_server *wh_registry[WH_MAX_SERVERS];

static long wh_elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (b->tv_sec - a->tv_sec) * 1000000000L + (b->tv_nsec - a->tv_nsec);
}

static void wh_pair_free(wh_pair *p)
{
    if(!p)
        return;
    for(unsigned i = 0; i < p->n_certs; i++)
        gnutls_pcert_deinit(&p->certs[i]);
    if(p->key)
        gnutls_x509_privkey_deinit(p->key);
    free(p);
}

static int wh_read_file(const char *path, gnutls_datum_t *out, char *why, size_t whylen)
{
    FILE *f = fopen(path, "rb");
    if(!f) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char *buf = malloc(WH_PEM_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, WH_PEM_MAX_BYTES + 1, f) : 0;
    int bad = !buf || ferror(f);
    fclose(f);
    if(bad || n > WH_PEM_MAX_BYTES || n == 0) {
        snprintf(why, whylen, "%s: %s", path, bad ? "read error" : n ? "larger than 1 MiB" : "empty file");
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    out->data = buf;
    out->size = (unsigned)n;
    return 0;
}

/* Loads and checks a pair: a PEM chain (leaf first) and a PEM private key
   (PKCS#1, SEC1 or PKCS#8) whose public key is the leaf's. */
static int wh_pair_load(const char *cert_file, const char *key_file, wh_pair **out, char *why, size_t whylen)
{
    gnutls_datum_t cpem = { NULL, 0 }, kpem = { NULL, 0 };
    wh_pair *p = calloc(1, sizeof *p);
    int rc = -1, ret;
    if(!p) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    if(wh_read_file(cert_file, &cpem, why, whylen) < 0 || wh_read_file(key_file, &kpem, why, whylen) < 0)
        goto out;
    unsigned n = WH_CHAIN_MAX;
    ret = gnutls_pcert_list_import_x509_raw(p->certs, &n, &cpem, GNUTLS_X509_FMT_PEM, 0);
    if(ret < 0 || n == 0) {
        snprintf(why, whylen, "certificate file %s: not a PEM certificate (%s)", cert_file,
                 ret < 0 ? gnutls_strerror(ret) : "no certificate");
        goto out;
    }
    p->n_certs = n;
    if((ret = gnutls_x509_privkey_init(&p->key)) < 0 ||
       (ret = gnutls_x509_privkey_import2(p->key, &kpem, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0) {
        snprintf(why, whylen, "key file %s: not a PEM private key (%s)", key_file, gnutls_strerror(ret));
        goto out;
    }
    unsigned char kid[64], cid[64];
    size_t klen = sizeof kid, clen = sizeof cid;
    if(gnutls_x509_privkey_get_key_id(p->key, GNUTLS_KEYID_USE_SHA256, kid, &klen) < 0 ||
       gnutls_pubkey_get_key_id(p->certs[0].pubkey, GNUTLS_KEYID_USE_SHA256, cid, &clen) < 0 || klen != clen ||
       memcmp(kid, cid, klen) != 0) {
        snprintf(why, whylen, "key file %s does not match the certificate in %s", key_file, cert_file);
        goto out;
    }
    gnutls_x509_crt_t crt;
    if(gnutls_x509_crt_init(&crt) >= 0) {
        unsigned char ser[40];
        size_t slen = sizeof ser;
        if(gnutls_x509_crt_import(crt, &p->certs[0].cert, GNUTLS_X509_FMT_DER) >= 0 &&
           gnutls_x509_crt_get_serial(crt, ser, &slen) >= 0)
            for(size_t i = 0; i < slen && 2 * i + 2 < sizeof p->serial; i++)
                snprintf(p->serial + 2 * i, 3, "%02x", ser[i]);
        gnutls_x509_crt_deinit(crt);
    }
    *out = p;
    p = NULL;
    rc = 0;
out:
    wh_pair_free(p);
    free(cpem.data);
    free(kpem.data);
    return rc;
}

static void wh_stat(const char *path, wh_sig *sig)
{
    struct stat st;
    memset(sig, 0, sizeof *sig);
    if(stat(path, &st) != 0) /* stat follows symlinks: a Secret volume's ..data swap changes the inode */
        return;
    sig->ok = 1;
    sig->dev = st.st_dev;
    sig->ino = st.st_ino;
    sig->size = st.st_size;
    sig->mtime = st.st_mtim;
}

static int wh_sig_eq(const wh_sig *a, const wh_sig *b)
{
    return a->ok == b->ok && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* Re-reads the pair when the files changed since it was loaded; at most
   once a second. Caller holds cert_lock. */
static void wh_maybe_reload(webhook_server *s)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if(wh_elapsed_ns(&s->last_check, &now) < WH_RECHECK_NS)
        return;
    s->last_check = now;
    wh_sig sig[2];
    wh_stat(s->cert_file, &sig[0]);
    wh_stat(s->key_file, &sig[1]);
    if(wh_sig_eq(&sig[0], &s->sig[0]) && wh_sig_eq(&sig[1], &s->sig[1]))
        return;
    if(wh_sig_eq(&sig[0], &s->failed[0]) && wh_sig_eq(&sig[1], &s->failed[1]))
        return; /* already tried these files and warned */
    char why[512];
    wh_pair *p = NULL;
    if(!sig[0].ok || !sig[1].ok) {
        snprintf(why, sizeof why, "%s: %s", sig[0].ok ? s->key_file : s->cert_file, "cannot stat");
    } else if(wh_pair_load(s->cert_file, s->key_file, &p, why, sizeof why) == 0) {
        wh_pair_free(s->pair);
        s->pair = p;
        s->sig[0] = sig[0];
        s->sig[1] = sig[1];
        memset(s->failed, 0, sizeof s->failed);
        log_write(LOG_INFO, WH_COMPONENT, "serving a new certificate", "cert", s->cert_file, "serial", p->serial, NULL);
        return;
    }
    s->failed[0] = sig[0];
    s->failed[1] = sig[1];
    log_write(LOG_WARN, WH_COMPONENT, "new certificate pair does not load; keeping the old one", "cert", s->cert_file,
              "key", s->key_file, "serving_serial", s->pair->serial, "error", why, NULL);
}

static webhook_server *wh_server_for(gnutls_session_t session)
{
    webhook_server *found = NULL;
    int n = 0;
    pthread_mutex_lock(&wh_registry_lock);
    for(int i = 0; i < WH_MAX_SERVERS; i++)
        if(wh_registry[i]) {
            n++;
            found = wh_registry[i];
        }
    if(n > 1) {
        found = NULL;
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = gnutls_transport_get_int(session);
        if(getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
            int port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                                : ntohs(((struct sockaddr_in *)&ss)->sin_port);
            for(int i = 0; i < WH_MAX_SERVERS && !found; i++)
                if(wh_registry[i] && wh_registry[i]->port == port)
                    found = wh_registry[i];
        }
    }
    pthread_mutex_unlock(&wh_registry_lock);
    return found;
}

/* gnutls_certificate_retrieve_function3: private copies of the serving pair,
   freed by GnuTLS (GNUTLS_CERT_RETR_DEINIT_ALL). */
static int wh_cert_retrieve(gnutls_session_t session, const struct gnutls_cert_retr_st *info, gnutls_pcert_st **certs,
                            unsigned int *certs_length, gnutls_ocsp_data_st **ocsp, unsigned int *ocsp_length,
                            gnutls_privkey_t *privkey, unsigned int *flags)
{
    (void)info;
    webhook_server *s = wh_server_for(session);
    if(!s)
        return -1;
    gnutls_pcert_st *copy = NULL;
    gnutls_privkey_t key = NULL;
    unsigned n = 0;
    int rc = -1;
    pthread_mutex_lock(&s->cert_lock);
    wh_maybe_reload(s);
    const wh_pair *p = s->pair;
    copy = gnutls_malloc(p->n_certs * sizeof *copy);
    if(!copy)
        goto out;
    for(; n < p->n_certs; n++)
        if(gnutls_pcert_import_x509_raw(&copy[n], &p->certs[n].cert, GNUTLS_X509_FMT_DER, 0) < 0)
            goto out;
    if(gnutls_privkey_init(&key) < 0) {
        key = NULL;
        goto out;
    }
    if(gnutls_privkey_import_x509(key, p->key, GNUTLS_PRIVKEY_IMPORT_COPY) < 0)
        goto out;
    rc = 0;
out:
    pthread_mutex_unlock(&s->cert_lock);
    if(rc < 0) {
        for(unsigned i = 0; i < n; i++)
            gnutls_pcert_deinit(&copy[i]);
        gnutls_free(copy);
        if(key)
            gnutls_privkey_deinit(key);
        log_write(LOG_ERROR, WH_COMPONENT, "cannot hand the certificate to a TLS handshake", NULL);
        return -1;
    }
    *certs = copy;
    *certs_length = n;
    *ocsp = NULL;
    *ocsp_length = 0;
    *privkey = key;
    *flags = GNUTLS_CERT_RETR_DEINIT_ALL;
    return 0;
}

/* --- requests ----------------------------------------------------------- */

typedef struct wh_req {
    struct timespec start; /* CLOCK_MONOTONIC, request line read */
    int counted;           /* in s->in_flight */
    int routed;
    const webhook_endpoint *ep;
    size_t ep_index;
    char *body;
    size_t len, cap;
    int too_large;
} wh_req;

static void *wh_uri_logged(void *cls, const char *uri, struct MHD_Connection *con)
{
    (void)uri;
    (void)con;
    webhook_server *s = cls;
    wh_req *r = calloc(1, sizeof *r);
    if(!r)
        return NULL;
    clock_gettime(CLOCK_MONOTONIC, &r->start);
    r->counted = 1;
    atomic_fetch_add(&s->in_flight, 1);
    return r;
}

static void wh_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)con;
    (void)toe;
    webhook_server *s = cls;
    wh_req *r = *con_cls;
    if(!r)
        return;
    if(r->counted)
        atomic_fetch_sub(&s->in_flight, 1);
    free(r->body);
    free(r);
    *con_cls = NULL;
}

static enum MHD_Result wh_send(webhook_server *s, struct MHD_Connection *con, unsigned status, const char *ctype,
                               char *body, size_t len, enum MHD_ResponseMemoryMode mode, const char *allow)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, mode);
    if(!resp) {
        if(mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if(allow)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    if(atomic_load(&s->quiescing))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(con, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result wh_text(webhook_server *s, struct MHD_Connection *con, unsigned status, const char *allow,
                               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result wh_text(webhook_server *s, struct MHD_Connection *con, unsigned status, const char *allow,
                               const char *fmt, ...)
{
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    if(n < 0)
        return MHD_NO;
    return wh_send(s, con, status, "text/plain; charset=utf-8", msg, (size_t)n, MHD_RESPMEM_MUST_FREE, allow);
}

static int wh_content_type_json(const char *ct)
{
    if(!ct)
        return 0;
    while(*ct == ' ' || *ct == '\t')
        ct++;
    size_t n = strcspn(ct, ";");
    while(n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
        n--;
    return n == strlen("application/json") && strncasecmp(ct, "application/json", n) == 0;
}

static enum MHD_Result wh_builtin(webhook_server *s, struct MHD_Connection *con, const char *url, const char *method)
{
    int get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if(strcmp(url, "/healthz") != 0 && strcmp(url, "/readyz") != 0 && strcmp(url, "/metrics") != 0)
        return wh_text(s, con, MHD_HTTP_NOT_FOUND, NULL, "404 page not found: %s\n", url);
    if(!get)
        return wh_text(s, con, MHD_HTTP_METHOD_NOT_ALLOWED, "GET, HEAD", "%s: method %s not allowed\n", url, method);
    if(strcmp(url, "/healthz") == 0)
        return wh_send(s, con, MHD_HTTP_OK, "text/plain; charset=utf-8", "ok", 2, MHD_RESPMEM_PERSISTENT, NULL);
    if(strcmp(url, "/readyz") == 0) {
        if(atomic_load(&s->quiescing))
            return wh_text(s, con, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "shutting down\n");
        if(s->ready && !s->ready(s->ctx))
            return wh_text(s, con, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "not ready\n");
        return wh_send(s, con, MHD_HTTP_OK, "text/plain; charset=utf-8", "ok", 2, MHD_RESPMEM_PERSISTENT, NULL);
    }
    char *text = metrics_render();
    if(!text)
        return wh_text(s, con, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "out of memory\n");
    return wh_send(s, con, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text),
                   MHD_RESPMEM_MUST_FREE, NULL);
}

/* NULL when `doc` is an admission.k8s.io/v1 AdmissionReview with a request
   and a request.uid; else what is wrong with it. */
static const char *wh_review_problem(const json_t *doc, char *buf, size_t len)
{
    if(!json_is_object(doc))
        return "the body is not a JSON object";
    const char *av = json_string_value(json_object_get(doc, "apiVersion"));
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    if(!kind || strcmp(kind, "AdmissionReview") != 0) {
        snprintf(buf, len, "kind is %s%s%s, want \"AdmissionReview\"", kind ? "\"" : "", kind ? kind : "missing",
                 kind ? "\"" : "");
        return buf;
    }
    if(!av || strcmp(av, "admission.k8s.io/v1") != 0) {
        snprintf(buf, len, "apiVersion is %s%s%s, want \"admission.k8s.io/v1\" (admissionReviewVersions: [v1])",
                 av ? "\"" : "", av ? av : "missing", av ? "\"" : "");
        return buf;
    }
    const json_t *req = json_object_get(doc, "request");
    if(!json_is_object(req))
        return "request is missing or not an object";
    const char *uid = json_string_value(json_object_get(req, "uid"));
    if(!uid || !*uid)
        return "request.uid is missing or empty";
    return NULL;
}

/* NULL when the callback's answer is usable; else why not. */
static const char *wh_response_problem(const json_t *out, const char *uid)
{
    if(!json_is_object(out))
        return "no AdmissionReview";
    const json_t *resp = json_object_get(out, "response");
    if(!json_is_object(resp))
        return "response missing";
    const char *ruid = json_string_value(json_object_get(resp, "uid"));
    if(!ruid || strcmp(ruid, uid) != 0)
        return "response.uid differs from request.uid";
    if(!json_is_boolean(json_object_get(resp, "allowed")))
        return "response.allowed missing";
    return NULL;
}

static enum MHD_Result wh_review(webhook_server *s, struct MHD_Connection *con, wh_req *r)
{
    const webhook_endpoint *ep = r->ep;
    const wh_endpoint_labels *lab = &s->labels[r->ep_index];
    json_error_t jerr;
    json_t *doc = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
    if(!doc)
        return wh_text(s, con, MHD_HTTP_BAD_REQUEST, NULL,
                       "cozygpu webhook %s: the body is not JSON: %s (line %d, column %d)\n", ep->name, jerr.text,
                       jerr.line, jerr.column);
    char why[256];
    const char *problem = wh_review_problem(doc, why, sizeof why);
    if(problem) {
        json_decref(doc);
        return wh_text(s, con, MHD_HTTP_BAD_REQUEST, NULL,
                       "cozygpu webhook %s: the body is not an admission.k8s.io/v1 AdmissionReview: %s\n", ep->name,
                       problem);
    }
    const char *uid = json_string_value(json_object_get(json_object_get(doc, "request"), "uid"));
    struct timespec deadline = r->start;
    deadline.tv_sec += s->timeout_ms / 1000;
    deadline.tv_nsec += (s->timeout_ms % 1000) * 1000000L;
    if(deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    json_t *out = NULL;
    int rc = s->review(s->ctx, ep, doc, &deadline, &out);
    const char *bad = rc != 0 ? "the review callback failed" : wh_response_problem(out, uid);
    const char *decision;
    if(bad) {
        log_write(LOG_ERROR, WH_COMPONENT, "review failed; refusing (fail closed)", "webhook", ep->name, "uid", uid,
                  "error", bad, NULL);
        json_decref(out);
        char msg[300];
        snprintf(msg, sizeof msg, "cozygpu webhook %s: internal error", ep->name);
        out = json_pack("{s:O?,s:s,s:{s:s,s:b,s:{s:i,s:s}}}", "apiVersion", json_object_get(doc, "apiVersion"), "kind",
                        "AdmissionReview", "response", "uid", uid, "allowed", 0, "status", "code", 500, "message", msg);
        decision = lab->error;
    } else {
        const json_t *resp = json_object_get(out, "response");
        json_int_t code = json_integer_value(json_object_get(json_object_get(resp, "status"), "code"));
        decision = code == 500 ? lab->error : json_is_true(json_object_get(resp, "allowed")) ? lab->allowed : lab->denied;
    }
    json_decref(doc);
    char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    if(!text) /* out of memory: the API server's failurePolicy Fail refuses for us */
        return wh_text(s, con, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, "cozygpu webhook %s: internal error\n", ep->name);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double took = wh_elapsed_ns(&r->start, &now) / 1e9;
    metrics_counter_add(WH_REVIEWS, decision, 1);
    metrics_histogram_observe(WH_DURATION, lab->webhook, took);
    if(wh_elapsed_ns(&deadline, &now) > 0)
        log_write(LOG_WARN, WH_COMPONENT, "review answered after its deadline", "webhook", ep->name, NULL);
    return wh_send(s, con, MHD_HTTP_OK, "application/json", text, strlen(text), MHD_RESPMEM_MUST_FREE, NULL);
}

static enum MHD_Result wh_access(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    (void)version;
    webhook_server *s = cls;
    wh_req *r = *con_cls;
    if(!r) { /* the URI callback could not allocate */
        if(!(r = calloc(1, sizeof *r)))
            return MHD_NO;
        clock_gettime(CLOCK_MONOTONIC, &r->start);
        *con_cls = r;
    }
    if(!r->routed) {
        r->routed = 1;
        for(size_t i = 0; i < s->n_endpoints && !r->ep; i++)
            if(strcmp(url, s->endpoints[i].path) == 0) {
                r->ep = &s->endpoints[i];
                r->ep_index = i;
            }
        if(!r->ep)
            return wh_builtin(s, con, url, method);
        if(strcmp(method, MHD_HTTP_METHOD_POST) != 0)
            return wh_text(s, con, MHD_HTTP_METHOD_NOT_ALLOWED, "POST", "cozygpu webhook %s: method %s not allowed\n",
                           r->ep->name, method);
        const char *ct = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        if(!wh_content_type_json(ct))
            return wh_text(s, con, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, NULL,
                           "cozygpu webhook %s: Content-Type is %s, want application/json\n", r->ep->name,
                           ct ? ct : "missing");
        const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if(cl) {
            unsigned long long n = strtoull(cl, NULL, 10);
            if(n > s->max_body)
                return wh_text(s, con, MHD_HTTP_CONTENT_TOO_LARGE, NULL,
                               "cozygpu webhook %s: body of %llu bytes is above the limit of %zu\n", r->ep->name, n,
                               s->max_body);
            if(n > 0 && (r->body = malloc(n + 1)) != NULL)
                r->cap = n + 1;
        }
        return MHD_YES;
    }
    if(*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if(r->too_large || n > s->max_body - r->len) {
            r->too_large = 1; /* chunked body: drain it, answer 413 at the end */
            return MHD_YES;
        }
        if(r->len + n + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while(cap < r->len + n + 1)
                cap *= 2;
            char *nb = realloc(r->body, cap);
            if(!nb)
                return MHD_NO;
            r->body = nb;
            r->cap = cap;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        return MHD_YES;
    }
    if(r->too_large)
        return wh_text(s, con, MHD_HTTP_CONTENT_TOO_LARGE, NULL,
                       "cozygpu webhook %s: body is above the limit of %zu bytes\n", r->ep->name, s->max_body);
    return wh_review(s, con, r);
}

static void wh_mhd_log(void *cls, const char *fmt, va_list ap)
{
    webhook_server *s = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while(n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    /* after start, MHD mostly reports clients that went away or failed the
       TLS handshake (an old TLS version, a scanner): not worth a warning */
    log_write(atomic_load(&s->started) ? LOG_DEBUG : LOG_WARN, WH_COMPONENT, "libmicrohttpd", "detail", msg, NULL);
}

/* --- lifecycle ---------------------------------------------------------- */

void webhook_declare_metrics(void)
{
    metrics_declare(WH_REVIEWS, "counter",
                    "Admission reviews answered, by webhook and decision (allowed, denied, error: the review failed "
                    "and was refused, or answered status code 500).");
    metrics_declare(WH_DURATION, "histogram",
                    "Time from a review's request line to its response being queued, by webhook.");
}

static char *wh_label(const char *name, const char *decision)
{
    char *esc = metrics_escape(name), *out = NULL;
    if(!esc)
        return NULL;
    if(decision) {
        if(asprintf(&out, "webhook=\"%s\",decision=\"%s\"", esc, decision) < 0)
            out = NULL;
    } else if(asprintf(&out, "webhook=\"%s\"", esc) < 0) {
        out = NULL;
    }
    free(esc);
    return out;
}

static void wh_free(webhook_server *s)
{
    if(!s)
        return;
    for(size_t i = 0; s->labels && i < s->n_endpoints; i++) {
        free(s->labels[i].webhook);
        free(s->labels[i].allowed);
        free(s->labels[i].denied);
        free(s->labels[i].error);
    }
    free(s->labels);
    wh_pair_free(s->pair);
    free(s->cert_file);
    free(s->key_file);
    pthread_mutex_destroy(&s->cert_lock);
    free(s);
}

cozy_result webhook_start(webhook_server **out, const webhook_options *o, cozy_err *err)
{
    *out = NULL;
    if(!o->endpoints || o->n_endpoints == 0 || !o->review)
        return cozy_fail(err, COZY_ERR_USAGE, "webhook: no endpoints or no review callback");
    if(!o->cert_file || !o->key_file)
        return cozy_fail(err, COZY_ERR_USAGE, "webhook: a certificate and a key file are required");
    if(o->port < 0 || o->port > 65535)
        return cozy_fail(err, COZY_ERR_USAGE, "webhook: port %d out of range", o->port);
    const char *addr = o->address ? o->address : "0.0.0.0";
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_TLS | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if(inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)o->port);
    } else if(inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)o->port);
        flags |= MHD_USE_IPv6;
    } else {
        return cozy_fail(err, COZY_ERR_USAGE, "webhook: address %s is not an IPv4 or IPv6 literal", addr);
    }

    webhook_server *s = calloc(1, sizeof *s);
    if(!s)
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory");
    pthread_mutex_init(&s->cert_lock, NULL);
    s->endpoints = o->endpoints;
    s->n_endpoints = o->n_endpoints;
    s->max_body = o->max_body_bytes ? o->max_body_bytes : WH_DEFAULT_MAX_BODY;
    s->timeout_ms = o->review_timeout_ms > 0 ? o->review_timeout_ms : WH_DEFAULT_TIMEOUT_MS;
    s->review = o->review;
    s->ctx = o->ctx;
    s->ready = o->ready;
    s->cert_file = strdup(o->cert_file);
    s->key_file = strdup(o->key_file);
    s->labels = calloc(o->n_endpoints, sizeof *s->labels);
    if(!s->cert_file || !s->key_file || !s->labels) {
        wh_free(s);
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory");
    }
    for(size_t i = 0; i < o->n_endpoints; i++) {
        wh_endpoint_labels *l = &s->labels[i];
        const char *name = o->endpoints[i].name ? o->endpoints[i].name : o->endpoints[i].path;
        l->webhook = wh_label(name, NULL);
        l->allowed = wh_label(name, "allowed");
        l->denied = wh_label(name, "denied");
        l->error = wh_label(name, "error");
        if(!l->webhook || !l->allowed || !l->denied || !l->error || !o->endpoints[i].path) {
            wh_free(s);
            return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: out of memory or endpoint without a path");
        }
    }
    char why[512];
    wh_stat(s->cert_file, &s->sig[0]);
    wh_stat(s->key_file, &s->sig[1]);
    if(wh_pair_load(s->cert_file, s->key_file, &s->pair, why, sizeof why) != 0) {
        wh_free(s);
        return cozy_fail(err, COZY_ERR_IO, "webhook: TLS: %s", why);
    }
    clock_gettime(CLOCK_MONOTONIC, &s->last_check);
    webhook_declare_metrics();

    int slot = -1;
    pthread_mutex_lock(&wh_registry_lock);
    for(int i = 0; i < WH_MAX_SERVERS && slot < 0; i++)
        if(!wh_registry[i]) {
            slot = i;
            wh_registry[i] = s;
        }
    pthread_mutex_unlock(&wh_registry_lock);
    if(slot < 0) {
        wh_free(s);
        return cozy_fail(err, COZY_ERR_INTERNAL, "webhook: more than %d servers in one process", WH_MAX_SERVERS);
    }

    unsigned workers = o->workers ? o->workers : WH_DEFAULT_WORKERS;
    unsigned conn_timeout = o->connection_timeout_s ? o->connection_timeout_s : WH_DEFAULT_CONN_TIMEOUT_S;
    errno = 0;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, wh_access, s, MHD_OPTION_EXTERNAL_LOGGER, wh_mhd_log, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_THREAD_POOL_SIZE, workers, MHD_OPTION_HTTPS_PRIORITIES, WH_TLS_PRIORITIES,
        MHD_OPTION_HTTPS_CERT_CALLBACK2, wh_cert_retrieve, MHD_OPTION_URI_LOG_CALLBACK, wh_uri_logged, s,
        MHD_OPTION_NOTIFY_COMPLETED, wh_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, conn_timeout,
        MHD_OPTION_END);
    if(!s->daemon) {
        int e = errno;
        pthread_mutex_lock(&wh_registry_lock);
        wh_registry[slot] = NULL;
        pthread_mutex_unlock(&wh_registry_lock);
        wh_free(s);
        return cozy_fail(err, COZY_ERR_IO, "webhook: cannot listen on %s port %d%s%s", addr, o->port, e ? ": " : "",
                         e ? strerror(e) : "");
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    pthread_mutex_lock(&wh_registry_lock);
    s->port = info ? info->port : o->port;
    pthread_mutex_unlock(&wh_registry_lock);
    atomic_store(&s->started, 1);
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    log_write(LOG_INFO, WH_COMPONENT, "serving admission reviews", "address", addr, "port", port, "serial",
              s->pair->serial, NULL);
    *out = s;
    return COZY_OK;
}

int webhook_port(const webhook_server *s)
{
    return s->port;
}

void webhook_quiesce(webhook_server *s)
{
    if(atomic_exchange(&s->quiescing, 1))
        return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if(fd != MHD_INVALID_SOCKET)
        close(fd); /* refuse new connections now rather than leave them in the backlog */
    log_write(LOG_INFO, WH_COMPONENT, "stopped accepting connections", NULL);
}

int webhook_in_flight(const webhook_server *s)
{
    return atomic_load(&((webhook_server *)s)->in_flight);
}

int webhook_drain(webhook_server *s, long grace_ms)
{
    webhook_quiesce(s);
    struct timespec start, now, step = { 0, 10 * 1000000L };
    clock_gettime(CLOCK_MONOTONIC, &start);
    for(;;) {
        int n = webhook_in_flight(s);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if(n == 0 || wh_elapsed_ns(&start, &now) >= grace_ms * 1000000L)
            return n;
        nanosleep(&step, NULL);
    }
}

void webhook_stop(webhook_server *s)
{
    if(!s)
        return;
    MHD_stop_daemon(s->daemon);
    pthread_mutex_lock(&wh_registry_lock);
    for(int i = 0; i < WH_MAX_SERVERS; i++)
        if(wh_registry[i] == s)
            wh_registry[i] = NULL;
    pthread_mutex_unlock(&wh_registry_lock);
    wh_free(s);
}
