/* tls.c — the webhook server's certificate pair: load, reload on change,
 * hand to TLS handshakes (tls.h).
 */
#include "server/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/x509.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "base/file.h"
#include "base/log.h"

#define TLS_COMPONENT "webhook"
#define TLS_PEM_MAX_BYTES (1024 * 1024) /* a certificate chain or key file */
#define TLS_CHAIN_MAX 16
#define TLS_RECHECK_NS 1000000000L /* stat the certificate files at most once a second */

typedef struct tls_pair {
    gnutls_pcert_st certs[TLS_CHAIN_MAX];
    unsigned n_certs;
    gnutls_x509_privkey_t key;
    char serial[80]; /* hex of the leaf's serial number, for logs */
} tls_pair;

typedef struct tls_sig { /* what stat() says about one file */
    int ok;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} tls_sig;

struct webhook_tls {
    int port; /* guarded by tls_registry_lock */
    pthread_mutex_t lock; /* guards everything below */
    char *cert_file, *key_file;
    tls_pair *pair;              /* serving */
    tls_sig sig[2];              /* of the files the serving pair came from */
    tls_sig failed[2];           /* of files that failed to load (warned once) */
    struct timespec last_check;  /* CLOCK_MONOTONIC */
};

/* Servers that are running, for the certificate callback (GnuTLS gives it
   the session only; we find the server by the session's local port). */
static pthread_mutex_t tls_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static webhook_tls *tls_registry[WEBHOOK_TLS_MAX_SERVERS];

static void tls_pair_free(tls_pair *p)
{
    if(!p)
        return;
    for(unsigned i = 0; i < p->n_certs; i++)
        gnutls_pcert_deinit(&p->certs[i]);
    if(p->key)
        gnutls_x509_privkey_deinit(p->key);
    free(p);
}

static int tls_read_pem(const char *path, gnutls_datum_t *out, char *why, size_t whylen)
{
    FILE *f = fopen(path, "rb");
    if(!f) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        return -1;
    }
    char *buf = NULL;
    size_t n = 0;
    int rc = cozy_read_stream(f, TLS_PEM_MAX_BYTES, &buf, &n);
    fclose(f);
    if(rc || n == 0) {
        snprintf(why, whylen, "%s: %s", path,
                 rc == EFBIG ? "larger than 1 MiB" : rc ? "read error" : "empty file");
        free(buf);
        return -1;
    }
    out->data = (unsigned char *)buf;
    out->size = (unsigned)n;
    return 0;
}

/* Loads and checks a pair: a PEM chain (leaf first) and a PEM private key
   (PKCS#1, SEC1 or PKCS#8) whose public key is the leaf's. */
static int tls_pair_load(const char *cert_file, const char *key_file, tls_pair **out, char *why, size_t whylen)
{
    gnutls_datum_t cpem = { NULL, 0 }, kpem = { NULL, 0 };
    tls_pair *p = calloc(1, sizeof *p);
    int rc = -1, ret;
    if(!p) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    if(tls_read_pem(cert_file, &cpem, why, whylen) < 0 || tls_read_pem(key_file, &kpem, why, whylen) < 0)
        goto out;
    unsigned n = TLS_CHAIN_MAX;
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
    tls_pair_free(p);
    free(cpem.data);
    free(kpem.data);
    return rc;
}

static void tls_stat(const char *path, tls_sig *sig)
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

static int tls_sig_eq(const tls_sig *a, const tls_sig *b)
{
    return a->ok == b->ok && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* Re-reads the pair when the files changed since it was loaded; at most
   once a second. Caller holds t->lock. */
static void tls_maybe_reload(webhook_tls *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long since = (now.tv_sec - t->last_check.tv_sec) * 1000000000L + (now.tv_nsec - t->last_check.tv_nsec);
    if(since < TLS_RECHECK_NS)
        return;
    t->last_check = now;
    tls_sig sig[2];
    tls_stat(t->cert_file, &sig[0]);
    tls_stat(t->key_file, &sig[1]);
    if(tls_sig_eq(&sig[0], &t->sig[0]) && tls_sig_eq(&sig[1], &t->sig[1]))
        return;
    if(tls_sig_eq(&sig[0], &t->failed[0]) && tls_sig_eq(&sig[1], &t->failed[1]))
        return; /* already tried these files and warned */
    char why[512];
    tls_pair *p = NULL;
    if(!sig[0].ok || !sig[1].ok) {
        snprintf(why, sizeof why, "%s: %s", sig[0].ok ? t->key_file : t->cert_file, "cannot stat");
    } else if(tls_pair_load(t->cert_file, t->key_file, &p, why, sizeof why) == 0) {
        tls_pair_free(t->pair);
        t->pair = p;
        t->sig[0] = sig[0];
        t->sig[1] = sig[1];
        memset(t->failed, 0, sizeof t->failed);
        log_write(LOG_INFO, TLS_COMPONENT, "serving a new certificate", "cert", t->cert_file, "serial", p->serial, NULL);
        return;
    }
    t->failed[0] = sig[0];
    t->failed[1] = sig[1];
    log_write(LOG_WARN, TLS_COMPONENT, "new certificate pair does not load; keeping the old one", "cert", t->cert_file,
              "key", t->key_file, "serving_serial", t->pair->serial, "error", why, NULL);
}

int webhook_tls_open(webhook_tls **out, const char *cert_file, const char *key_file, char *why, size_t whylen)
{
    *out = NULL;
    webhook_tls *t = calloc(1, sizeof *t);
    if(!t)
        return -2;
    pthread_mutex_init(&t->lock, NULL);
    t->cert_file = strdup(cert_file);
    t->key_file = strdup(key_file);
    if(!t->cert_file || !t->key_file) {
        webhook_tls_free(t);
        return -2;
    }
    tls_stat(t->cert_file, &t->sig[0]);
    tls_stat(t->key_file, &t->sig[1]);
    if(tls_pair_load(t->cert_file, t->key_file, &t->pair, why, whylen) != 0) {
        webhook_tls_free(t);
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t->last_check);
    *out = t;
    return 0;
}

void webhook_tls_serial(webhook_tls *t, char *buf, size_t len)
{
    pthread_mutex_lock(&t->lock);
    snprintf(buf, len, "%s", t->pair->serial);
    pthread_mutex_unlock(&t->lock);
}

void webhook_tls_free(webhook_tls *t)
{
    if(!t)
        return;
    tls_pair_free(t->pair);
    free(t->cert_file);
    free(t->key_file);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int webhook_tls_register(webhook_tls *t)
{
    int slot = -1;
    pthread_mutex_lock(&tls_registry_lock);
    for(int i = 0; i < WEBHOOK_TLS_MAX_SERVERS && slot < 0; i++)
        if(!tls_registry[i]) {
            slot = i;
            tls_registry[i] = t;
        }
    pthread_mutex_unlock(&tls_registry_lock);
    return slot < 0 ? -1 : 0;
}

void webhook_tls_set_port(webhook_tls *t, int port)
{
    pthread_mutex_lock(&tls_registry_lock);
    t->port = port;
    pthread_mutex_unlock(&tls_registry_lock);
}

void webhook_tls_unregister(webhook_tls *t)
{
    pthread_mutex_lock(&tls_registry_lock);
    for(int i = 0; i < WEBHOOK_TLS_MAX_SERVERS; i++)
        if(tls_registry[i] == t)
            tls_registry[i] = NULL;
    pthread_mutex_unlock(&tls_registry_lock);
}

static webhook_tls *tls_for_session(gnutls_session_t session)
{
    webhook_tls *found = NULL;
    int n = 0;
    pthread_mutex_lock(&tls_registry_lock);
    for(int i = 0; i < WEBHOOK_TLS_MAX_SERVERS; i++)
        if(tls_registry[i]) {
            n++;
            found = tls_registry[i];
        }
    if(n > 1) {
        found = NULL;
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = gnutls_transport_get_int(session);
        if(getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
            int port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                                : ntohs(((struct sockaddr_in *)&ss)->sin_port);
            for(int i = 0; i < WEBHOOK_TLS_MAX_SERVERS && !found; i++)
                if(tls_registry[i] && tls_registry[i]->port == port)
                    found = tls_registry[i];
        }
    }
    pthread_mutex_unlock(&tls_registry_lock);
    return found;
}

int webhook_tls_retrieve(gnutls_session_t session, const struct gnutls_cert_retr_st *info, gnutls_pcert_st **certs,
                         unsigned int *certs_length, gnutls_ocsp_data_st **ocsp, unsigned int *ocsp_length,
                         gnutls_privkey_t *privkey, unsigned int *flags)
{
    (void)info;
    webhook_tls *t = tls_for_session(session);
    if(!t)
        return -1;
    gnutls_pcert_st *copy = NULL;
    gnutls_privkey_t key = NULL;
    unsigned n = 0;
    int rc = -1;
    pthread_mutex_lock(&t->lock);
    tls_maybe_reload(t);
    const tls_pair *p = t->pair;
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
    pthread_mutex_unlock(&t->lock);
    if(rc < 0) {
        for(unsigned i = 0; i < n; i++)
            gnutls_pcert_deinit(&copy[i]);
        gnutls_free(copy);
        if(key)
            gnutls_privkey_deinit(key);
        log_write(LOG_ERROR, TLS_COMPONENT, "cannot hand the certificate to a TLS handshake", NULL);
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
