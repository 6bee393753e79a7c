/* kube.c — Kubernetes API requests over libcurl (kube.h).
 *
 * One easy handle per request; a CURLSH shared by every request of a client
 * (DNS cache, TLS sessions, connection pool) with one mutex per share kind.
 * Retry rules: k8s.io/client-go rest/request.go (retry on 429 and 5xx,
 * honouring Retry-After; transport errors retried when nothing reached the
 * server, or for GET), backoff base KUBE_RETRY_BASE_MS doubling to
 * KUBE_RETRY_CAP_MS with jitter; conflicts: util/retry/util.go
 * RetryOnConflict.
 */
#include "kube/kube_internal.h"
#include "base/buf.h"
#include "base/file.h"
#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define KUBE_TOKEN_MAX_BYTES (64u * 1024u)

const kube_resource KUBE_NAMESPACES = {"", "v1", "namespaces", "Namespace", 0};
const kube_resource KUBE_NODES = {"", "v1", "nodes", "Node", 0};
const kube_resource KUBE_PODS = {"", "v1", "pods", "Pod", 1};
const kube_resource KUBE_PVCS = {"", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", 1};
const kube_resource KUBE_PVS = {"", "v1", "persistentvolumes", "PersistentVolume", 0};
const kube_resource KUBE_SECRETS = {"", "v1", "secrets", "Secret", 1};
const kube_resource KUBE_CONFIGMAPS = {"", "v1", "configmaps", "ConfigMap", 1};
const kube_resource KUBE_RESOURCEQUOTAS = {"", "v1", "resourcequotas", "ResourceQuota", 1};
const kube_resource KUBE_EVENTS = {"", "v1", "events", "Event", 1};
const kube_resource KUBE_LEASES = {"coordination.k8s.io", "v1", "leases", "Lease", 1};
const kube_resource KUBE_VMIS = {"kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", 1};
/* DRA, resource.k8s.io: v1 since Kubernetes 1.34, v1beta2 1.33 (removed in
 * 1.39), v1beta1 1.32 (removed in 1.38) (k8s.io/api resource/<version>
 * types.go and zz_generated.prerelease-lifecycle.go); beta versions are off
 * by default, so a current cluster serves v1 only, and a cluster without DRA
 * none. The constants name v1; kube_resource_older gives the others. */
const kube_resource KUBE_RESOURCECLAIMS = {"resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", 1};
const kube_resource KUBE_RESOURCECLAIMTEMPLATES = {"resource.k8s.io", "v1", "resourceclaimtemplates",
                                                   "ResourceClaimTemplate", 1};
const kube_resource KUBE_DEVICECLASSES = {"resource.k8s.io", "v1", "deviceclasses", "DeviceClass", 0};
static const kube_resource RESOURCECLAIMS_V1BETA2 = {"resource.k8s.io", "v1beta2", "resourceclaims", "ResourceClaim", 1};
static const kube_resource RESOURCECLAIMS_V1BETA1 = {"resource.k8s.io", "v1beta1", "resourceclaims", "ResourceClaim", 1};
static const kube_resource RESOURCECLAIMTEMPLATES_V1BETA2 = {"resource.k8s.io", "v1beta2", "resourceclaimtemplates",
                                                             "ResourceClaimTemplate", 1};
static const kube_resource RESOURCECLAIMTEMPLATES_V1BETA1 = {"resource.k8s.io", "v1beta1", "resourceclaimtemplates",
                                                             "ResourceClaimTemplate", 1};
static const kube_resource DEVICECLASSES_V1BETA2 = {"resource.k8s.io", "v1beta2", "deviceclasses", "DeviceClass", 0};
static const kube_resource DEVICECLASSES_V1BETA1 = {"resource.k8s.io", "v1beta1", "deviceclasses", "DeviceClass", 0};
const kube_resource KUBE_VMS = {"kubevirt.io", "v1", "virtualmachines", "VirtualMachine", 1};
const kube_resource KUBE_KUBEVIRTS = {"kubevirt.io", "v1", "kubevirts", "KubeVirt", 1};
const kube_resource KUBE_GPUCLASSES = {"cozystack.io", "v1alpha1", "gpuclasses", "GPUClass", 0};
const kube_resource KUBE_GPUCLAIMS = {"cozystack.io", "v1alpha1", "gpuclaims", "GPUClaim", 1};
const kube_resource KUBE_GPUNODES = {"cozystack.io", "v1alpha1", "gpunodes", "GPUNode", 0};
const kube_resource KUBE_WORKLOADS = {"cozystack.io", "v1alpha1", "workloads", "Workload", 1};
const kube_resource KUBE_WORKLOADMONITORS = {"cozystack.io", "v1alpha1", "workloadmonitors", "WorkloadMonitor", 1};

struct kube_client {
    kube_config cfg;
    char *user_agent;
    long timeout_ms;
    int max_retries;
    CURLSH *share;
    pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];
    pthread_mutex_t token_mu; /* guards the fields below */
    char *file_token;         /* last token read from cfg.token_file */
    struct stat token_st;     /* its identity when read */
};

/* ------------------------------------------------------------ utilities */

double kube_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double kube_rand01(void)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static unsigned short seed[3];
    static int seeded;
    double r;
    pthread_mutex_lock(&mu);
    if(!seeded) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed[0] = (unsigned short)ts.tv_nsec;
        seed[1] = (unsigned short)(ts.tv_nsec >> 16);
        seed[2] = (unsigned short)ts.tv_sec;
        seeded = 1;
    }
    r = erand48(seed);
    pthread_mutex_unlock(&mu);
    return r;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while(nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

long kube_parse_retry_after(const char *v)
{
    long n = 0;
    while(*v == ' ' || *v == '\t')
        v++;
    if(*v < '0' || *v > '9')
        return -1; /* HTTP-date form: not honoured, the backoff applies */
    for(; *v >= '0' && *v <= '9'; v++) {
        n = n * 10 + (*v - '0');
        if(n > 86400)
            return 86400;
    }
    while(*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n')
        v++;
    return *v ? -1 : n;
}

/* backoff before retry number `attempt` (0-based), in ms: jitter in [d/2, d] */
static long backoff_ms(int attempt)
{
    double d = KUBE_RETRY_BASE_MS;
    for(int i = 0; i < attempt && d < KUBE_RETRY_CAP_MS; i++)
        d *= 2;
    if(d > KUBE_RETRY_CAP_MS)
        d = KUBE_RETRY_CAP_MS;
    return (long)(d / 2 + kube_rand01() * d / 2);
}

char *kube_escape(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = malloc(n * 3 + 1), *o = out;
    if(!out)
        return NULL;
    for(const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
           *p == '-' || *p == '.' || *p == '_' || *p == '~') {
            *o++ = (char)*p;
        } else {
            *o++ = '%';
            *o++ = hex[*p >> 4];
            *o++ = hex[*p & 15];
        }
    }
    *o = 0;
    return out;
}

/* Versions newest first (see the DRA constants above): each entry's next
 * older one. */
const kube_resource *kube_resource_older(const kube_resource *r)
{
    static const kube_resource *const chains[][3] = {
        {&KUBE_RESOURCECLAIMS, &RESOURCECLAIMS_V1BETA2, &RESOURCECLAIMS_V1BETA1},
        {&KUBE_RESOURCECLAIMTEMPLATES, &RESOURCECLAIMTEMPLATES_V1BETA2, &RESOURCECLAIMTEMPLATES_V1BETA1},
        {&KUBE_DEVICECLASSES, &DEVICECLASSES_V1BETA2, &DEVICECLASSES_V1BETA1},
    };
    for(size_t i = 0; i < sizeof chains / sizeof *chains; i++)
        for(size_t j = 0; j + 1 < sizeof chains[i] / sizeof *chains[i]; j++)
            if(chains[i][j] == r)
                return chains[i][j + 1];
    return NULL;
}

char *kube_path(const kube_resource *r, const char *ns, const char *name, const char *sub)
{
    char *ens = ns && *ns ? kube_escape(ns) : NULL;
    char *ename = name ? kube_escape(name) : NULL;
    char *esub = sub ? kube_escape(sub) : NULL;
    char *out = NULL;
    if((ns && *ns && !ens) || (name && !ename) || (sub && !esub))
        goto out;
    if(asprintf(&out, "%s%s%s/%s%s%s/%s%s%s%s%s",
                r->group[0] ? "/apis/" : "/api", r->group, r->group[0] ? "" : "", r->version,
                ens && r->namespaced ? "/namespaces/" : "", ens && r->namespaced ? ens : "",
                r->resource, ename ? "/" : "", ename ? ename : "", esub ? "/" : "",
                esub ? esub : "") < 0)
        out = NULL;
out:
    free(ens);
    free(ename);
    free(esub);
    return out;
}

/* ------------------------------------------------------------ client */

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *userp)
{
    (void)h;
    (void)access;
    kube_client *c = userp;
    pthread_mutex_lock(&c->share_mu[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *userp)
{
    (void)h;
    kube_client *c = userp;
    pthread_mutex_unlock(&c->share_mu[data]);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

cozy_result kube_client_new(kube_client **out, const kube_client_options *o, cozy_err *err)
{
    kube_client_options dflt = {0};
    kube_client *c;
    cozy_result rc;
    if(!o)
        o = &dflt;
    pthread_once(&curl_once, curl_init_once);
    c = calloc(1, sizeof *c);
    if(!c)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    if((rc = kube_config_load(&c->cfg, o, err)) != COZY_OK) {
        free(c);
        return rc;
    }
    c->user_agent = strdup(o->user_agent ? o->user_agent : "cozygpu/0.1.0");
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    c->max_retries = o->max_retries > 0 ? o->max_retries : 0;
    for(int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&c->share_mu[i], NULL);
    pthread_mutex_init(&c->token_mu, NULL);
    c->share = curl_share_init();
    if(!c->user_agent || !c->share) {
        kube_client_free(c);
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    }
    curl_share_setopt(c->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(c->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(c->share, CURLSHOPT_USERDATA, c);
    curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    *out = c;
    return COZY_OK;
}

void kube_client_free(kube_client *c)
{
    if(!c)
        return;
    if(c->share)
        curl_share_cleanup(c->share);
    for(int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&c->share_mu[i]);
    pthread_mutex_destroy(&c->token_mu);
    free(c->file_token);
    free(c->user_agent);
    kube_config_clear(&c->cfg);
    free(c);
}

const char *kube_client_server(const kube_client *c) { return c->cfg.server; }
const char *kube_client_source(const kube_client *c) { return c->cfg.source; }
long kube_client_timeout_ms(const kube_client *c) { return c->timeout_ms; }

/* The bearer token to send now (malloc'd, or NULL for none). The token file
   is re-read when its inode, size or mtime differ from the last read; when a
   re-read fails the last good token is kept (client-go
   transport/token_source.go cachingTokenSource does the same). */
static cozy_result current_token(kube_client *c, char **tok, cozy_err *err)
{
    cozy_result rc = COZY_OK;
    *tok = NULL;
    if(!c->cfg.token_file) {
        if(c->cfg.token && !(*tok = strdup(c->cfg.token)))
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        return COZY_OK;
    }
    pthread_mutex_lock(&c->token_mu);
    struct stat st;
    int have = stat(c->cfg.token_file, &st) == 0;
    int changed = have && (!c->file_token || st.st_ino != c->token_st.st_ino ||
                           st.st_size != c->token_st.st_size ||
                           st.st_mtim.tv_sec != c->token_st.st_mtim.tv_sec ||
                           st.st_mtim.tv_nsec != c->token_st.st_mtim.tv_nsec);
    if(changed || !c->file_token) {
        char *buf = NULL;
        size_t n = 0;
        int e = cozy_read_file(c->cfg.token_file, KUBE_TOKEN_MAX_BYTES, &buf, &n);
        if(e == 0 && n > 0) {
            while(n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
                n--;
            buf[n] = 0;
            free(c->file_token);
            c->file_token = buf;
            if(have)
                c->token_st = st;
            log_write(LOG_DEBUG, "kube", "bearer token read", "file", c->cfg.token_file, NULL);
        } else {
            free(buf);
            if(!c->file_token) {
                rc = cozy_fail(err, COZY_ERR_IO, "%s: cannot read %s: %s", c->cfg.token_field,
                               c->cfg.token_file, e ? strerror(e) : "empty file");
            } else {
                log_write(LOG_WARN, "kube", "cannot re-read the token file, keeping the last token",
                          "file", c->cfg.token_file, NULL);
            }
        }
    }
    if(rc == COZY_OK && !(*tok = strdup(c->file_token)))
        rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    pthread_mutex_unlock(&c->token_mu);
    return rc;
}

cozy_result kube_handle_setup(kube_client *c, CURL *h, const char *path,
                              const char *extra_header, struct curl_slist **headers,
                              cozy_err *err)
{
    char *url = NULL, *tok = NULL, *auth = NULL;
    struct curl_slist *hl = NULL, *t;
    cozy_result rc;
    *headers = NULL;
    if((rc = current_token(c, &tok, err)) != COZY_OK)
        return rc;
    if(asprintf(&url, "%s%s", c->cfg.server, path) < 0) {
        url = NULL;
        goto oom;
    }
    if(!(t = curl_slist_append(hl, "Accept: application/json")))
        goto oom;
    hl = t;
    if(tok) {
        if(asprintf(&auth, "Authorization: Bearer %s", tok) < 0) {
            auth = NULL;
            goto oom;
        }
        if(!(t = curl_slist_append(hl, auth)))
            goto oom;
        hl = t;
    }
    if(extra_header) {
        if(!(t = curl_slist_append(hl, extra_header)))
            goto oom;
        hl = t;
    }
    curl_easy_setopt(h, CURLOPT_URL, url); /* libcurl copies strings */
    curl_easy_setopt(h, CURLOPT_SHARE, c->share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, c->user_agent);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if(c->cfg.insecure) {
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    } else if(c->cfg.ca) {
        /* only the configured CA, not the system store (client-go sets
           tls.Config.RootCAs to it) */
        struct curl_blob b = {c->cfg.ca, c->cfg.ca_len, CURL_BLOB_NOCOPY};
        curl_easy_setopt(h, CURLOPT_CAINFO, NULL);
        curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
        curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &b);
    }
    if(c->cfg.cert) {
        struct curl_blob cb = {c->cfg.cert, c->cfg.cert_len, CURL_BLOB_NOCOPY};
        struct curl_blob kb = {c->cfg.key, c->cfg.key_len, CURL_BLOB_NOCOPY};
        curl_easy_setopt(h, CURLOPT_SSLCERT_BLOB, &cb);
        curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
        curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, &kb);
        curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
    }
    *headers = hl;
    free(url);
    free(tok);
    free(auth);
    return COZY_OK;
oom:
    curl_slist_free_all(hl);
    free(url);
    free(tok);
    free(auth);
    return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
}

/* ------------------------------------------------------------ requests */

typedef struct body_buf {
    cozy_buf b; /* up to KUBE_RESPONSE_MAX_BYTES */
    int too_big;
} body_buf;

static size_t body_write(char *ptr, size_t size, size_t nmemb, void *userp)
{
    body_buf *bb = userp;
    size_t n = size * nmemb;
    int rc = cozy_buf_add(&bb->b, ptr, n);
    if(rc == EFBIG)
        bb->too_big = 1;
    return rc == 0 ? n : 0;
}

int kube_header_retry_after(const char *line, size_t n, long *out)
{
    static const char name[] = "retry-after:";
    if(n <= sizeof name - 1 || strncasecmp(line, name, sizeof name - 1) != 0)
        return 0;
    char v[64];
    size_t l = n - (sizeof name - 1);
    if(l >= sizeof v)
        l = sizeof v - 1;
    memcpy(v, line + sizeof name - 1, l);
    v[l] = 0;
    *out = kube_parse_retry_after(v);
    return 1;
}

static size_t header_write(char *ptr, size_t size, size_t nmemb, void *userp)
{
    long *retry_after = userp;
    size_t n = size * nmemb;
    if(!kube_header_retry_after(ptr, n, retry_after) && n > 5 && strncmp(ptr, "HTTP/", 5) == 0)
        *retry_after = -1; /* a new response (after 100 Continue, a redirect) */
    return n;
}

/* transport errors that mean the request never reached the server */
static int not_sent(CURLcode cc)
{
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
           cc == CURLE_COULDNT_RESOLVE_PROXY || cc == CURLE_SSL_CONNECT_ERROR;
}

cozy_result kube_request(kube_client *c, const char *method, const char *path,
                         const char *content_type, const json_t *body,
                         long *status, json_t **out, cozy_err *err)
{
    char *text = NULL, ctype[128];
    cozy_result rc = COZY_OK;
    int is_get = strcmp(method, "GET") == 0;
    if(out)
        *out = NULL;
    *status = 0;
    if(body && !(text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY)))
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    snprintf(ctype, sizeof ctype, "Content-Type: %s", content_type ? content_type : "application/json");

    for(int attempt = 0;; attempt++) {
        CURL *h = curl_easy_init();
        struct curl_slist *hl = NULL;
        body_buf bb = {.b = {.max = KUBE_RESPONSE_MAX_BYTES}};
        long retry_after = -1, st = 0;
        char cerr[CURL_ERROR_SIZE] = "";
        if(!h) {
            rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
            break;
        }
        if((rc = kube_handle_setup(c, h, path, text ? ctype : NULL, &hl, err)) != COZY_OK) {
            curl_easy_cleanup(h);
            break;
        }
        if(is_get) {
            curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        } else {
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
            if(text) {
                curl_easy_setopt(h, CURLOPT_POSTFIELDS, text);
                curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(text));
            } else if(strcmp(method, "DELETE") != 0) {
                curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
                curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
            }
        }
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &bb);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_write);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &retry_after);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
        CURLcode cc = curl_easy_perform(h);
        if(cc == CURLE_OK)
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
        curl_easy_cleanup(h);
        curl_slist_free_all(hl);

        if(cc == CURLE_OK && !((st == 429 || st >= 500) && attempt < c->max_retries)) {
            *status = st;
            if(out && bb.b.len > 0)
                *out = json_loadb(bb.b.p, bb.b.len, 0, NULL);
            cozy_buf_free(&bb.b);
            rc = COZY_OK;
            break;
        }
        cozy_buf_free(&bb.b);
        if(cc != CURLE_OK) {
            int retry = attempt < c->max_retries && !bb.too_big && (is_get || not_sent(cc));
            if(!retry) {
                rc = cozy_fail(err, COZY_ERR_IO, "%s %s%s: %s", method, c->cfg.server, path,
                               bb.too_big ? "response larger than KUBE_RESPONSE_MAX_BYTES"
                                          : (cerr[0] ? cerr : curl_easy_strerror(cc)));
                break;
            }
        }
        long wait = retry_after >= 0 ? (retry_after > KUBE_RETRY_AFTER_MAX_S ? KUBE_RETRY_AFTER_MAX_S : retry_after) * 1000
                                     : backoff_ms(attempt);
        char sbuf[32], wbuf[32];
        snprintf(sbuf, sizeof sbuf, "%ld", st);
        snprintf(wbuf, sizeof wbuf, "%ld", wait);
        /* status is a number (JSON logs): a transport failure goes under error */
        if(cc == CURLE_OK)
            log_write(LOG_INFO, "kube", "retrying request", "method", method, "path", path, LOG_NUM "status", sbuf,
                      LOG_NUM "wait_ms", wbuf, NULL);
        else
            log_write(LOG_INFO, "kube", "retrying request", "method", method, "path", path, "error",
                      curl_easy_strerror(cc), LOG_NUM "wait_ms", wbuf, NULL);
        sleep_ms(wait);
    }
    free(text);
    return rc;
}

/* ------------------------------------------------------------ conveniences */

static cozy_result on_path(kube_client *c, const char *method, const kube_resource *r,
                           const char *ns, const char *name, const char *sub, const char *query,
                           const char *ctype, const json_t *body, long *status, json_t **out,
                           cozy_err *err)
{
    char *p = kube_path(r, ns, name, sub), *full = NULL;
    cozy_result rc;
    if(!p)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    if(query && *query) {
        if(asprintf(&full, "%s?%s", p, query) < 0) {
            free(p);
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        }
        free(p);
        p = full;
    }
    rc = kube_request(c, method, p, ctype, body, status, out, err);
    free(p);
    return rc;
}

static const char *meta_str(const json_t *obj, const char *key)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), key));
}

cozy_result kube_get(kube_client *c, const kube_resource *r, const char *ns, const char *name,
                     long *status, json_t **out, cozy_err *err)
{
    return on_path(c, "GET", r, ns, name, NULL, NULL, NULL, NULL, status, out, err);
}

cozy_result kube_list(kube_client *c, const kube_resource *r, const char *ns, const char *query,
                      long *status, json_t **out, cozy_err *err)
{
    return on_path(c, "GET", r, ns, NULL, NULL, query, NULL, NULL, status, out, err);
}

cozy_result kube_create(kube_client *c, const kube_resource *r, const char *ns, const json_t *obj,
                        long *status, json_t **out, cozy_err *err)
{
    return on_path(c, "POST", r, ns, NULL, NULL, NULL, NULL, obj, status, out, err);
}

static cozy_result put_obj(kube_client *c, const kube_resource *r, const char *ns, const json_t *obj,
                           const char *sub, long *status, json_t **out, cozy_err *err)
{
    const char *name = meta_str(obj, "name");
    if(!name)
        return cozy_fail(err, COZY_ERR_INPUT, "PUT %s: the object has no metadata.name", r->resource);
    return on_path(c, "PUT", r, ns, name, sub, NULL, NULL, obj, status, out, err);
}

cozy_result kube_update(kube_client *c, const kube_resource *r, const char *ns, const json_t *obj,
                        long *status, json_t **out, cozy_err *err)
{
    return put_obj(c, r, ns, obj, NULL, status, out, err);
}

cozy_result kube_update_status(kube_client *c, const kube_resource *r, const char *ns,
                               const json_t *obj, long *status, json_t **out, cozy_err *err)
{
    return put_obj(c, r, ns, obj, "status", status, out, err);
}

cozy_result kube_patch(kube_client *c, const kube_resource *r, const char *ns, const char *name,
                       const char *content_type, const json_t *patch,
                       long *status, json_t **out, cozy_err *err)
{
    return on_path(c, "PATCH", r, ns, name, NULL, NULL,
                   content_type ? content_type : "application/merge-patch+json", patch, status,
                   out, err);
}

cozy_result kube_patch_status(kube_client *c, const kube_resource *r, const char *ns, const char *name,
                              const json_t *patch, long *status, json_t **out, cozy_err *err)
{
    return on_path(c, "PATCH", r, ns, name, "status", NULL, "application/merge-patch+json", patch, status, out, err);
}

cozy_result kube_delete(kube_client *c, const kube_resource *r, const char *ns, const char *name,
                        long *status, json_t **out, cozy_err *err)
{
    return on_path(c, "DELETE", r, ns, name, NULL, NULL, NULL, NULL, status, out, err);
}

static const char *status_message(const json_t *body)
{
    const char *m = json_string_value(json_object_get(body, "message"));
    return m ? m : "(no message)";
}

cozy_result kube_update_retry(kube_client *c, const kube_resource *r, const char *ns,
                              const char *name, int status_only,
                              int (*mutate)(json_t *obj, void *ctx), void *ctx,
                              json_t **out, cozy_err *err)
{
    cozy_result rc;
    if(out)
        *out = NULL;
    for(int attempt = 0; attempt < KUBE_CONFLICT_ATTEMPTS; attempt++) {
        long st;
        json_t *obj = NULL, *written = NULL;
        if((rc = kube_get(c, r, ns, name, &st, &obj, err)) != COZY_OK)
            return rc;
        if(st != 200 || !json_is_object(obj)) {
            rc = cozy_fail(err, COZY_ERR_INPUT, "GET %s %s%s%s: %ld: %s", r->resource, ns ? ns : "",
                           ns ? "/" : "", name, st, status_message(obj));
            json_decref(obj);
            return rc;
        }
        int m = mutate(obj, ctx);
        if(m < 0) {
            json_decref(obj);
            return cozy_fail(err, COZY_ERR_INPUT, "update of %s %s%s%s aborted by the caller",
                             r->resource, ns ? ns : "", ns ? "/" : "", name);
        }
        if(m == 1) {
            if(out)
                *out = obj;
            else
                json_decref(obj);
            return COZY_OK;
        }
        rc = put_obj(c, r, ns, obj, status_only ? "status" : NULL, &st, &written, err);
        json_decref(obj);
        if(rc != COZY_OK)
            return rc;
        if(st == 409) {
            log_write(LOG_DEBUG, "kube", "update conflict, re-reading", "resource", r->resource,
                      "name", name, NULL);
            json_decref(written);
            continue;
        }
        if(st < 200 || st > 299) {
            rc = cozy_fail(err, COZY_ERR_INPUT, "PUT %s %s%s%s: %ld: %s", r->resource, ns ? ns : "",
                           ns ? "/" : "", name, st, status_message(written));
            json_decref(written);
            return rc;
        }
        if(out)
            *out = written;
        else
            json_decref(written);
        return COZY_OK;
    }
    return cozy_fail(err, COZY_ERR_IO, "update of %s %s%s%s: still conflicting after %d attempts",
                     r->resource, ns ? ns : "", ns ? "/" : "", name, KUBE_CONFLICT_ATTEMPTS);
}
