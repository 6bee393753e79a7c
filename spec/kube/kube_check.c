/* kube_check — test driver for core/kube/kube.c, core/kube/kubeconfig.c, core/kube/watch.c,
 * core/kube/watch_stream.c.
 *
 * Build (ASan+UBSan; see spec/kube/run-kube-check.sh):
 *   gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -fsanitize=address,undefined -Icore \
 *     -o build/bin/kube_check spec/kube/kube_check.c core/kube/kube.c core/kube/kubeconfig.c \
 *     core/kube/watch.c core/kube/watch_stream.c core/base/log.c core/format/yamlload.c core/base/result.c \
 *     $(pkg-config --cflags --libs libcurl jansson yaml-0.1) -lpthread
 *
 * Commands (client options everywhere: --kubeconfig P --context C --server URL
 * --in-cluster-root DIR --retries N --timeout-ms N):
 *   selftest                      table checks of the pure helpers; "N passed, M failed"
 *   config                        print the resolved settings as one JSON object,
 *                                 or the error on stderr with exit status 2
 *   request --method M --path P [--body JSON] [--content-type T] [--count K]
 *           [--then-write FILE TEXT]
 *                                 K requests (default 1); after each but the last,
 *                                 write TEXT to FILE if given (token rotation);
 *                                 one JSON line per request:
 *                                 {"status":..,"body":..,"elapsed_ms":..} or {"error":..}
 *   update-retry --resource R [--ns NS] --name N --label K=V [--interfere]
 *                                 kube_update_retry setting label K=V; with
 *                                 --interfere the first mutate call writes the
 *                                 object behind the client's back (annotation
 *                                 interfered=1) so the first PUT conflicts. Prints
 *                                 {"calls":n,"object":..} or {"error":..}
 *   watch --resource R [--resource R2 ...] [--ns NS] [--label SEL] [--field SEL]
 *         [--resync S] [--until-key RESOURCE:KEY ...] [--until-synced] [--optional]
 *         [--seconds N] [--summary FILE]
 *                                 run informers until every KEY is cached (and, with
 *                                 --until-synced, every informer has listed; or N
 *                                 seconds, default 60), then print the caches as JSON
 *                                 lines sorted by resource and key:
 *                                 {"resource":..,"key":..,"rv":..,"object":..}
 *                                 and write a summary (events by type, restarts by
 *                                 resource/reason, violations of the event
 *                                 invariants, "served": {resource: the version read,
 *                                 or null}) to FILE. --optional marks every informer
 *                                 optional (kube_informer_set_optional).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "kube/kube.h"
#include "kube/kube_internal.h"
#include "base/log.h"
#include "kube/watch.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ metrics shim */
/* watch.c calls these through weak references; the driver counts restarts. */
static pthread_mutex_t met_mu = PTHREAD_MUTEX_INITIALIZER;
static json_t *met_counts;

void metrics_declare(const char *family, const char *type, const char *help);
void metrics_counter_add(const char *family, const char *labels, double v);

void metrics_declare(const char *family, const char *type, const char *help)
{
    (void)family;
    (void)type;
    (void)help;
}

void metrics_counter_add(const char *family, const char *labels, double v)
{
    char key[512];
    snprintf(key, sizeof key, "%s{%s}", family, labels ? labels : "");
    pthread_mutex_lock(&met_mu);
    if(!met_counts)
        met_counts = json_object();
    json_t *cur = json_object_get(met_counts, key);
    json_object_set_new(met_counts, key, json_real((cur ? json_real_value(cur) : 0) + v));
    pthread_mutex_unlock(&met_mu);
}

/* ------------------------------------------------------------ options */

typedef struct opts {
    kube_client_options co;
    const char *method, *path, *body, *ctype, *then_file, *then_text;
    int count;
    const char *resources[8];
    int n_res;
    const char *ns, *name, *label, *field, *set_label, *summary;
    const char *until[8];
    int n_until;
    int interfere, until_synced, optional;
    long resync, seconds;
} opts;

static const kube_resource *resource_named(const char *n)
{
    static const kube_resource *const all[] = {
        &KUBE_NAMESPACES, &KUBE_NODES, &KUBE_PODS, &KUBE_SECRETS, &KUBE_CONFIGMAPS,
        &KUBE_RESOURCEQUOTAS, &KUBE_EVENTS, &KUBE_LEASES, &KUBE_VMIS, &KUBE_VMS,
        &KUBE_KUBEVIRTS, &KUBE_GPUCLASSES, &KUBE_GPUCLAIMS, &KUBE_GPUNODES, &KUBE_WORKLOADS,
        &KUBE_WORKLOADMONITORS, &KUBE_RESOURCECLAIMS, &KUBE_RESOURCECLAIMTEMPLATES, &KUBE_DEVICECLASSES};
    for(size_t i = 0; i < sizeof all / sizeof *all; i++)
        if(strcmp(all[i]->resource, n) == 0)
            return all[i];
    return NULL;
}

static void usage(void)
{
    fprintf(stderr, "usage: kube_check selftest|config|request|update-retry|watch [options] (see the source header)\n");
    exit(64);
}

static void parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->count = 1;
    o->seconds = 60;
    o->co.user_agent = "cozygpu-kube-check/0.1.0";
    o->co.max_retries = 0;
    for(int i = 2; i < argc; i++) {
        const char *a = argv[i];
#define ARG() (i + 1 < argc ? argv[++i] : (usage(), ""))
        if(!strcmp(a, "--kubeconfig")) o->co.kubeconfig = ARG();
        else if(!strcmp(a, "--context")) o->co.context = ARG();
        else if(!strcmp(a, "--server")) o->co.server = ARG();
        else if(!strcmp(a, "--in-cluster-root")) o->co.in_cluster_root = ARG();
        else if(!strcmp(a, "--retries")) o->co.max_retries = atoi(ARG());
        else if(!strcmp(a, "--timeout-ms")) o->co.timeout_ms = atol(ARG());
        else if(!strcmp(a, "--method")) o->method = ARG();
        else if(!strcmp(a, "--path")) o->path = ARG();
        else if(!strcmp(a, "--body")) o->body = ARG();
        else if(!strcmp(a, "--content-type")) o->ctype = ARG();
        else if(!strcmp(a, "--count")) o->count = atoi(ARG());
        else if(!strcmp(a, "--then-write")) { o->then_file = ARG(); o->then_text = ARG(); }
        else if(!strcmp(a, "--resource")) { if(o->n_res < 8) o->resources[o->n_res++] = ARG(); }
        else if(!strcmp(a, "--ns")) o->ns = ARG();
        else if(!strcmp(a, "--name")) o->name = ARG();
        else if(!strcmp(a, "--label")) { if(!strcmp(argv[1], "update-retry")) o->set_label = ARG(); else o->label = ARG(); }
        else if(!strcmp(a, "--field")) o->field = ARG();
        else if(!strcmp(a, "--interfere")) o->interfere = 1;
        else if(!strcmp(a, "--until-synced")) o->until_synced = 1;
        else if(!strcmp(a, "--optional")) o->optional = 1;
        else if(!strcmp(a, "--resync")) o->resync = atol(ARG());
        else if(!strcmp(a, "--until-key")) { if(o->n_until < 8) o->until[o->n_until++] = ARG(); }
        else if(!strcmp(a, "--seconds")) o->seconds = atol(ARG());
        else if(!strcmp(a, "--summary")) o->summary = ARG();
        else usage();
#undef ARG
    }
}

static void print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    printf("%s\n", s ? s : "null");
    fflush(stdout);
    free(s);
    json_decref(v);
}

static int new_client(opts *o, kube_client **c)
{
    cozy_err err;
    if(kube_client_new(c, &o->co, &err) != COZY_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------ selftest */

static int passed, failed;
static void check(int ok, const char *what)
{
    if(ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL %s\n", what);
    }
}

static int selftest(void)
{
    struct { const char *in, *out; } b64[] = {
        {"", ""}, {"Zg==", "f"}, {"Zm8=", "fo"}, {"Zm9v", "foo"}, {"Zm9vYmFy", "foobar"},
        {"Zm9v\nYmFy\r\n", "foobar"}, {"Zg=", NULL}, {"Z", NULL}, {"Zm9v!", NULL}, {"Zg==Zg==", NULL},
    };
    for(size_t i = 0; i < sizeof b64 / sizeof *b64; i++) {
        size_t n = 0;
        unsigned char *d = kube_base64_decode(b64[i].in, &n);
        char what[128];
        snprintf(what, sizeof what, "base64 \"%s\"", b64[i].in);
        check(b64[i].out ? (d && n == strlen(b64[i].out) && memcmp(d, b64[i].out, n) == 0) : !d, what);
        free(d);
    }
    struct { const kube_resource *r; const char *ns, *name, *sub, *want; } paths[] = {
        {&KUBE_PODS, "default", "p1", NULL, "/api/v1/namespaces/default/pods/p1"},
        {&KUBE_PODS, NULL, NULL, NULL, "/api/v1/pods"},
        {&KUBE_NODES, "ignored", "n1", NULL, "/api/v1/nodes/n1"},
        {&KUBE_GPUCLASSES, NULL, "a100", NULL, "/apis/cozystack.io/v1alpha1/gpuclasses/a100"},
        {&KUBE_GPUCLAIMS, "t-a", "c 1", "status", "/apis/cozystack.io/v1alpha1/namespaces/t-a/gpuclaims/c%201/status"},
        {&KUBE_LEASES, "kube-system", NULL, NULL, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"},
    };
    for(size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        char *p = kube_path(paths[i].r, paths[i].ns, paths[i].name, paths[i].sub);
        check(p && strcmp(p, paths[i].want) == 0, paths[i].want);
        if(p && strcmp(p, paths[i].want))
            printf("  got %s\n", p);
        free(p);
    }
    /* DRA versions, newest first (k8s.io/api resource/{v1,v1beta2,v1beta1}) */
    const kube_resource *dra[] = {&KUBE_RESOURCECLAIMS, &KUBE_RESOURCECLAIMTEMPLATES, &KUBE_DEVICECLASSES};
    for(size_t i = 0; i < sizeof dra / sizeof *dra; i++) {
        const kube_resource *b2 = kube_resource_older(dra[i]), *b1 = b2 ? kube_resource_older(b2) : NULL;
        char what[128];
        snprintf(what, sizeof what, "%s: v1, then v1beta2, then v1beta1, then none", dra[i]->resource);
        check(!strcmp(dra[i]->group, "resource.k8s.io") && !strcmp(dra[i]->version, "v1") && b2 && b1 &&
                  !strcmp(b2->version, "v1beta2") && !strcmp(b1->version, "v1beta1") && !kube_resource_older(b1) &&
                  !strcmp(b2->resource, dra[i]->resource) && !strcmp(b1->resource, dra[i]->resource) &&
                  !strcmp(b1->kind, dra[i]->kind) && b1->namespaced == dra[i]->namespaced,
              what);
    }
    check(!kube_resource_older(&KUBE_PODS) && !kube_resource_older(&KUBE_GPUCLASSES), "no older version of others");
    {
        char *p = kube_path(kube_resource_older(&KUBE_RESOURCECLAIMTEMPLATES), "t-a", NULL, NULL);
        check(p && !strcmp(p, "/apis/resource.k8s.io/v1beta2/namespaces/t-a/resourceclaimtemplates"),
              "path of an older version");
        free(p);
        p = kube_path(&KUBE_DEVICECLASSES, "ignored", "gpu.nvidia.com", NULL);
        check(p && !strcmp(p, "/apis/resource.k8s.io/v1/deviceclasses/gpu.nvidia.com"), "deviceclasses: cluster-scoped");
        free(p);
    }
    check(kube_parse_retry_after("3") == 3, "retry-after 3");
    check(kube_parse_retry_after(" 12\r\n") == 12, "retry-after 12 with CRLF");
    check(kube_parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == -1, "retry-after date");
    check(kube_parse_retry_after("1x") == -1, "retry-after junk");
    char *e = kube_escape("a=b,c in (x y)/é");
    check(e && strcmp(e, "a%3Db%2Cc%20in%20%28x%20y%29%2F%C3%A9") == 0, "escape");
    free(e);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* ------------------------------------------------------------ config */

static int cmd_config(opts *o)
{
    kube_config cfg;
    cozy_err err;
    if(kube_config_load(&cfg, &o->co, &err) != COZY_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    json_t *j = json_pack("{s:s, s:s, s:b}", "source", cfg.source, "server", cfg.server, "insecure", cfg.insecure);
    /* absent settings are left out */
    if(cfg.ca) json_object_set_new(j, "ca", json_stringn((char *)cfg.ca, cfg.ca_len));
    if(cfg.cert) json_object_set_new(j, "cert", json_stringn((char *)cfg.cert, cfg.cert_len));
    if(cfg.key) json_object_set_new(j, "key", json_stringn((char *)cfg.key, cfg.key_len));
    if(cfg.token) json_object_set_new(j, "token", json_string(cfg.token));
    if(cfg.token_file) json_object_set_new(j, "tokenFile", json_string(cfg.token_file));
    print_json(j);
    kube_config_clear(&cfg);
    return 0;
}

/* ------------------------------------------------------------ request */

static int cmd_request(opts *o)
{
    kube_client *c;
    int rc = new_client(o, &c);
    json_t *body = NULL;
    if(rc)
        return rc;
    if(o->body && !(body = json_loads(o->body, 0, NULL))) {
        fprintf(stderr, "--body: invalid JSON\n");
        kube_client_free(c);
        return 64;
    }
    for(int i = 0; i < o->count; i++) {
        long st;
        json_t *out = NULL;
        cozy_err err;
        double t0 = kube_now();
        cozy_result r = kube_request(c, o->method ? o->method : "GET", o->path ? o->path : "/version",
                                     o->ctype, body, &st, &out, &err);
        double ms = (kube_now() - t0) * 1000;
        if(r != COZY_OK)
            print_json(json_pack("{s:s, s:s, s:f}", "error", err.msg, "result", cozy_strerror(r), "elapsed_ms", ms));
        else
            print_json(json_pack("{s:i, s:o, s:f}", "status", (json_int_t)st, "body", out ? out : json_null(), "elapsed_ms", ms));
        if(o->then_file && i + 1 < o->count) {
            /* rotate like kubelet: write aside, rename over */
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s.tmp", o->then_file);
            FILE *f = fopen(tmp, "w");
            if(f) {
                fputs(o->then_text, f);
                fclose(f);
                rename(tmp, o->then_file);
            }
        }
    }
    json_decref(body);
    kube_client_free(c);
    return 0;
}

/* ------------------------------------------------------------ update-retry */

typedef struct ur_ctx {
    opts *o;
    kube_client *c;
    const kube_resource *r;
    int calls;
} ur_ctx;

static int ur_mutate(json_t *obj, void *vctx)
{
    ur_ctx *u = vctx;
    u->calls++;
    if(u->o->interfere && u->calls == 1) {
        /* another writer updates the object between our GET and PUT */
        json_t *copy = json_deep_copy(obj), *md = json_object_get(copy, "metadata");
        json_t *ann = json_object_get(md, "annotations");
        long st;
        json_t *out = NULL;
        cozy_err err;
        if(!json_is_object(ann)) {
            ann = json_object();
            json_object_set_new(md, "annotations", ann);
        }
        json_object_set_new(ann, "interfered", json_string("1"));
        if(kube_update(u->c, u->r, u->o->ns, copy, &st, &out, &err) != COZY_OK || st != 200)
            fprintf(stderr, "interfering update failed: %ld\n", st);
        json_decref(out);
        json_decref(copy);
    }
    char k[256], *eq;
    snprintf(k, sizeof k, "%s", u->o->set_label ? u->o->set_label : "touched=yes");
    eq = strchr(k, '=');
    if(!eq)
        return -1;
    *eq = 0;
    json_t *md = json_object_get(obj, "metadata");
    json_t *labels = json_object_get(md, "labels");
    if(json_is_string(json_object_get(labels, k)) && !strcmp(json_string_value(json_object_get(labels, k)), eq + 1))
        return 1;
    if(!json_is_object(labels)) {
        labels = json_object();
        json_object_set_new(md, "labels", labels);
    }
    json_object_set_new(labels, k, json_string(eq + 1));
    return 0;
}

static int cmd_update_retry(opts *o)
{
    ur_ctx u = {o, NULL, NULL, 0};
    json_t *out = NULL;
    cozy_err err;
    int rc;
    if(o->n_res != 1 || !(u.r = resource_named(o->resources[0])) || !o->name)
        usage();
    if((rc = new_client(o, &u.c)))
        return rc;
    cozy_result r = kube_update_retry(u.c, u.r, o->ns, o->name, 0, ur_mutate, &u, &out, &err);
    if(r != COZY_OK)
        print_json(json_pack("{s:s, s:i}", "error", err.msg, "calls", u.calls));
    else
        print_json(json_pack("{s:i, s:o}", "calls", u.calls, "object", out));
    kube_client_free(u.c);
    return 0;
}

/* ------------------------------------------------------------ watch */

/* Per-key history for the invariants. */
typedef struct watch_state {
    pthread_mutex_t mu;
    json_t *hist;       /* "resource|key" -> {"alive":bool, "rv":int} */
    json_t *mirror;     /* "resource|key" -> object (events applied in order) */
    json_t *violations; /* array of strings */
    json_t *counts;     /* type -> n */
    char until_res[8][64], until_key[8][256];
    int n_until, until_seen[8];
} watch_state;

static watch_state WS;

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if(json_array_size(WS.violations) < 50)
        json_array_append_new(WS.violations, json_string(buf));
}

static const char *mstr(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(json_object_get(o, "metadata"), k));
}

static void on_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    (void)ctx;
    const kube_resource *r = kube_informer_resource(inf);
    const char *ns = mstr(obj, "namespace"), *name = mstr(obj, "name"), *rvs = mstr(obj, "resourceVersion");
    char key[512], hk[600];
    char *end = NULL;
    long long rv = rvs ? strtoll(rvs, &end, 10) : -1;
    int numeric = rvs && end && !*end;
    snprintf(key, sizeof key, "%s%s%s", ns && *ns ? ns : "", ns && *ns ? "/" : "", name ? name : "?");
    snprintf(hk, sizeof hk, "%s|%s", r->resource, key);

    /* the cache holds the change before the callback runs */
    json_t *cached = kube_informer_get(inf, ns, name ? name : "");
    if(!strcmp(type, "DELETED") ? cached != NULL : cached != obj)
        violation("%s %s %s rv %s: cache does not hold the change during the callback", r->resource, type, key, rvs);
    json_decref(cached);

    pthread_mutex_lock(&WS.mu);
    json_t *h = json_object_get(WS.hist, hk);
    int alive = h && json_is_true(json_object_get(h, "alive"));
    long long last = h ? json_integer_value(json_object_get(h, "rv")) : -1;
    if(!strcmp(type, "ADDED")) {
        if(alive)
            violation("%s ADDED %s rv %s while alive (last rv %lld)", r->resource, key, rvs, last);
        if(numeric && rv <= last)
            violation("%s ADDED %s rv %s not newer than %lld", r->resource, key, rvs, last);
    } else if(!strcmp(type, "MODIFIED")) {
        if(!alive)
            violation("%s MODIFIED %s rv %s while not alive", r->resource, key, rvs);
        if(numeric && rv <= last)
            violation("%s MODIFIED %s rv %s not newer than %lld (duplicate or stale)", r->resource, key, rvs, last);
    } else if(!strcmp(type, "DELETED")) {
        if(!alive)
            violation("%s DELETED %s rv %s while not alive", r->resource, key, rvs);
        if(numeric && rv < last)
            violation("%s DELETED %s rv %s older than %lld", r->resource, key, rvs, last);
    }
    if(numeric && rv > last)
        last = rv;
    json_object_set_new(WS.hist, hk, json_pack("{s:b, s:I}", "alive", strcmp(type, "DELETED") != 0, "rv", (json_int_t)last));
    if(!strcmp(type, "DELETED"))
        json_object_del(WS.mirror, hk);
    else
        json_object_set(WS.mirror, hk, (json_t *)obj);
    json_t *n = json_object_get(WS.counts, type);
    json_object_set_new(WS.counts, type, json_integer((n ? json_integer_value(n) : 0) + 1));
    for(int i = 0; i < WS.n_until; i++)
        if(strcmp(type, "DELETED") != 0 && !strcmp(r->resource, WS.until_res[i]) && !strcmp(key, WS.until_key[i]))
            WS.until_seen[i] = 1;
    pthread_mutex_unlock(&WS.mu);
}

static int cmp_lines(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmd_watch(opts *o)
{
    kube_client *c;
    kube_informer *infs[8];
    cozy_err err;
    int rc;
    if(o->n_res == 0)
        usage();
    if((rc = new_client(o, &c)))
        return rc;
    pthread_mutex_init(&WS.mu, NULL);
    WS.hist = json_object();
    WS.mirror = json_object();
    WS.violations = json_array();
    WS.counts = json_object();
    for(int i = 0; i < o->n_until; i++) {
        const char *colon = strchr(o->until[i], ':');
        if(!colon)
            usage();
        snprintf(WS.until_res[i], sizeof WS.until_res[i], "%.*s", (int)(colon - o->until[i]), o->until[i]);
        snprintf(WS.until_key[i], sizeof WS.until_key[i], "%s", colon + 1);
    }
    WS.n_until = o->n_until;
    kube_watcher *w = kube_watcher_new(c, o->resync);
    for(int i = 0; i < o->n_res; i++) {
        const kube_resource *r = resource_named(o->resources[i]);
        if(!r) {
            fprintf(stderr, "unknown resource %s\n", o->resources[i]);
            return 64;
        }
        infs[i] = kube_watcher_add(w, r, o->ns, o->label, o->field, on_event, NULL);
        if(o->optional)
            kube_informer_set_optional(infs[i]);
    }
    if(kube_watcher_start(w, &err) != COZY_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    double deadline = kube_now() + (double)o->seconds;
    int reached = 0;
    while(kube_now() < deadline) {
        pthread_mutex_lock(&WS.mu);
        reached = WS.n_until > 0 || o->until_synced;
        for(int i = 0; i < WS.n_until; i++)
            reached = reached && WS.until_seen[i];
        pthread_mutex_unlock(&WS.mu);
        if(o->until_synced)
            reached = reached && kube_watcher_synced(w);
        if(reached)
            break;
        usleep(20000);
    }
    int synced = kube_watcher_synced(w);
    kube_watcher_stop(w);
    json_t *served = json_object();
    for(int i = 0; i < o->n_res; i++) {
        const kube_resource *r = kube_informer_served(infs[i]);
        char gv[160];
        snprintf(gv, sizeof gv, "%s%s%s", r ? r->group : "", r && *r->group ? "/" : "", r ? r->version : "");
        json_object_set_new(served, o->resources[i], r ? json_string(gv) : json_null());
    }

    /* the caches, sorted; and the mirror compared with them */
    size_t n = 0, cap = 64;
    char **lines = malloc(cap * sizeof *lines);
    json_t *seen = json_object();
    for(int i = 0; i < o->n_res; i++) {
        json_t *arr = kube_informer_list(infs[i]), *v;
        size_t j;
        json_array_foreach(arr, j, v) {
            const char *ns = mstr(v, "namespace"), *name = mstr(v, "name");
            char key[512], hk[600];
            snprintf(key, sizeof key, "%s%s%s", ns && *ns ? ns : "", ns && *ns ? "/" : "", name);
            snprintf(hk, sizeof hk, "%s|%s", o->resources[i], key);
            json_t *m = json_object_get(WS.mirror, hk);
            if(m != v)
                violation("%s %s: cache and delivered events disagree", o->resources[i], key);
            json_object_set_new(seen, hk, json_true());
            json_t *line = json_pack("{s:s, s:s, s:s?, s:O}", "resource", o->resources[i], "key", key,
                                     "rv", mstr(v, "resourceVersion"), "object", v);
            if(n == cap)
                lines = realloc(lines, (cap *= 2) * sizeof *lines);
            lines[n++] = json_dumps(line, JSON_COMPACT | JSON_SORT_KEYS);
            json_decref(line);
        }
        json_decref(arr);
    }
    {
        const char *k;
        json_t *v;
        json_object_foreach(WS.mirror, k, v) if(!json_object_get(seen, k))
            violation("%s: delivered as alive but not cached", k);
    }
    json_decref(seen);
    qsort(lines, n, sizeof *lines, cmp_lines);
    for(size_t i = 0; i < n; i++) {
        printf("%s\n", lines[i]);
        free(lines[i]);
    }
    free(lines);
    fflush(stdout);

    pthread_mutex_lock(&met_mu);
    json_t *restarts = met_counts ? json_incref(met_counts) : json_object();
    pthread_mutex_unlock(&met_mu);
    json_t *sum = json_pack("{s:o, s:o, s:o, s:b, s:b, s:o, s:I}", "events", WS.counts, "violations", WS.violations,
                            "restarts", restarts, "synced", synced, "reached", reached, "served", served,
                            "generation", (json_int_t)kube_watcher_generation(w));
    if(o->summary)
        json_dump_file(sum, o->summary, JSON_COMPACT | JSON_SORT_KEYS);
    else {
        char *s = json_dumps(sum, JSON_COMPACT | JSON_SORT_KEYS);
        fprintf(stderr, "%s\n", s);
        free(s);
    }
    json_decref(sum);
    json_decref(WS.hist);
    json_decref(WS.mirror);
    kube_watcher_free(w);
    kube_client_free(c);
    pthread_mutex_lock(&met_mu);
    json_decref(met_counts);
    met_counts = NULL;
    pthread_mutex_unlock(&met_mu);
    return reached || (!o->n_until && !o->until_synced) ? 0 : 3;
}

int main(int argc, char **argv)
{
    opts o;
    const char *lvl = getenv("KUBE_CHECK_LOG");
    log_level min = LOG_WARN;
    if(argc < 2)
        usage();
    if(lvl)
        log_level_parse(lvl, &min);
    log_setup(0, min);
    parse(argc, argv, &o);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc;
    if(!strcmp(argv[1], "selftest")) rc = selftest();
    else if(!strcmp(argv[1], "config")) rc = cmd_config(&o);
    else if(!strcmp(argv[1], "request")) rc = cmd_request(&o);
    else if(!strcmp(argv[1], "update-retry")) rc = cmd_update_retry(&o);
    else if(!strcmp(argv[1], "watch")) rc = cmd_watch(&o);
    else usage();
    curl_global_cleanup();
    return rc;
}
