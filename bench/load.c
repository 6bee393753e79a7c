/* load.c — HTTPS load generator for admission webhooks (cozygpu-load).
 *
 * Posts recorded reviews over HTTP/1.1 keep-alive (libcurl multi, one easy
 * handle per concurrent request, connections reused from the multi's pool)
 * and prints latency percentiles and throughput.
 *
 * Two modes:
 *   closed loop  --concurrency N: N requests always outstanding; a request is
 *                sent as soon as the previous one on its handle is answered.
 *                Measures saturation throughput.
 *   open loop    --rate R: requests are scheduled at fixed times t0 + i/R,
 *                independent of the answers (up to --connections in flight;
 *                beyond that they queue). Latency is measured from the
 *                scheduled time, not the actual send, so a stall is charged
 *                to every request it delays (no coordinated omission:
 *                Gil Tene, "How NOT to measure latency"; wrk2).
 *
 * Inputs: files or directories of YAML/JSON documents (read as kubectl reads
 * them, core/format/yamlload.c). An AdmissionReview is sent as it is (a recorded
 * `response` is dropped); any other object is wrapped as a CREATE
 * AdmissionReview v1. --route Kind=/path sends a kind to its own path.
 *
 * --hostile FILE: one more handle sends FILE's review(s) back to back
 * (closed loop) from the start to the end, over the same connection pool as
 * the others (as the API server sends every review over its pool); they
 * are not counted, only their number is printed (hostile=N). With a review
 * that holds a review thread until its deadline, one thread of the target
 * is stuck the whole time.
 *
 * Output: a human summary on stderr and one line on stdout:
 *   RESULT label=L mode=closed|open n=.. errors=.. rps=.. p50_ms=.. p90_ms=.. p99_ms=.. max_ms=..
 *          queued_at_end=.. hostile=.. client_cores=..
 * client_cores is this process's own CPU time (user + system, getrusage)
 * over the measured window's wall time: how many cores the client itself
 * used, so a reader can tell a saturated client from a saturated server.
 * Requests sent after --warmup and before the end count, whenever they are
 * answered (a request stalled past the end is not left out of the
 * latencies); reviews/s counts those answered before the end.
 * Exit status 1 when any request failed (transport error or HTTP status
 * other than 200).
 */
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <time.h>

#include "format/yamlload.h"

#define LOAD_MAX_BODIES 4096
#define LOAD_MAX_ROUTES 32

typedef struct load_body {
    char *json;
    size_t len;
    char *url;
} load_body;

typedef struct load_slot {
    CURL *h;
    double sched; /* scheduled (open) or actual (closed) send time, seconds */
    int busy;
    int hostile; /* the --hostile handle */
    long bytes;
} load_slot;

static load_body bodies[LOAD_MAX_BODIES];
static size_t n_bodies;
static const char *route_kind[LOAD_MAX_ROUTES], *route_path[LOAD_MAX_ROUTES];
static int n_routes;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* this process's CPU seconds, user + system */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void die(const char *fmt, const char *a)
{
    fprintf(stderr, "cozygpu-load: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    exit(2);
}

/* base URL without its path: "https://h:p/validate" -> "https://h:p" */
static char *url_with_path(const char *url, const char *path)
{
    const char *p = strstr(url, "://");
    p = p ? strchr(p + 3, '/') : NULL;
    size_t n = p ? (size_t)(p - url) : strlen(url);
    char *out = malloc(n + strlen(path) + 1);
    memcpy(out, url, n);
    strcpy(out + n, path);
    return out;
}

static void add_document(json_t *doc, const char *url, unsigned long *seq)
{
    if(n_bodies == LOAD_MAX_BODIES || !json_is_object(doc))
        return;
    json_t *review;
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    if(kind && strcmp(kind, "AdmissionReview") == 0) {
        if(!json_is_object(json_object_get(doc, "request")))
            return; /* a recorded answer only */
        review = json_deep_copy(doc);
        json_object_del(review, "response");
    } else {
        char uid[64];
        snprintf(uid, sizeof uid, "00000000-0000-4000-8000-%012lu", ++*seq);
        const char *av = json_string_value(json_object_get(doc, "apiVersion"));
        const char *slash = av ? strchr(av, '/') : NULL;
        json_t *gvk = json_pack("{s:s%,s:s,s:s}", "group", av ? av : "", slash ? (size_t)(slash - av) : 0, "version",
                                slash ? slash + 1 : (av ? av : "v1"), "kind", kind ? kind : "");
        const json_t *md = json_object_get(doc, "metadata");
        review = json_pack("{s:s,s:s,s:{s:s,s:o,s:s,s:s?,s:s?,s:O,s:{s:s}}}", "apiVersion", "admission.k8s.io/v1",
                           "kind", "AdmissionReview", "request", "uid", uid, "kind", gvk, "operation", "CREATE",
                           "name", json_string_value(json_object_get(md, "name")), "namespace",
                           json_string_value(json_object_get(md, "namespace")), "object", doc, "userInfo",
                           "username", "cozygpu-load");
    }
    const char *rkind = json_string_value(json_object_get(json_object_get(json_object_get(review, "request"), "kind"), "kind"));
    const char *path = NULL;
    for(int i = 0; i < n_routes && rkind; i++)
        if(strcmp(route_kind[i], rkind) == 0)
            path = route_path[i];
    load_body *b = &bodies[n_bodies++];
    b->json = json_dumps(review, JSON_COMPACT);
    b->len = strlen(b->json);
    b->url = path ? url_with_path(url, path) : strdup(url);
    json_decref(review);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_path(const char *path, const char *url, unsigned long *seq)
{
    struct stat st;
    if(stat(path, &st) != 0)
        die("%s: cannot stat", path);
    if(S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        char *names[1024];
        int n = 0;
        while(d && (e = readdir(d)) && n < 1024) {
            const char *dot = strrchr(e->d_name, '.');
            if(e->d_name[0] != '.' && dot &&
               (strcmp(dot, ".yaml") == 0 || strcmp(dot, ".yml") == 0 || strcmp(dot, ".json") == 0)) {
                if(asprintf(&names[n], "%s/%s", path, e->d_name) >= 0)
                    n++;
            }
        }
        if(d)
            closedir(d);
        qsort(names, (size_t)n, sizeof names[0], cmp_str);
        for(int i = 0; i < n; i++) {
            add_path(names[i], url, seq);
            free(names[i]);
        }
        return;
    }
    yamlload_error err;
    json_t *docs = yamlload_file(path, &err);
    if(!docs)
        die("%s: cannot parse", path);
    size_t i;
    json_t *doc;
    json_array_foreach(docs, i, doc) add_document(doc, url, seq);
    json_decref(docs);
}

static size_t discard(char *p, size_t sz, size_t n, void *ud)
{
    (void)p;
    ((load_slot *)ud)->bytes += (long)(sz * n);
    return sz * n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double p)
{
    if(n == 0)
        return NAN;
    size_t i = (size_t)ceil(p / 100.0 * (double)n);
    return v[i == 0 ? 0 : i - 1];
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cozygpu-load --url URL [--cacert F | --insecure] [--concurrency N | --rate R]\n"
            "       [--connections N] [--duration S] [--warmup S] [--label L] [--route Kind=/path]...\n"
            "       [--hostile FILE] [FILE|DIR]...\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *url = NULL, *cacert = NULL, *label = "target", *hostile = NULL;
    int concurrency = 8, connections = 64, insecure = 0;
    double rate = 0, duration = 5, warmup = 1;
    const char *inputs[256];
    int n_inputs = 0;
    for(int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(n) (strcmp(a, n) == 0 && v && (i++, 1))
        if(OPT("--url"))
            url = v;
        else if(OPT("--cacert"))
            cacert = v;
        else if(OPT("--concurrency"))
            concurrency = atoi(v);
        else if(OPT("--rate"))
            rate = atof(v);
        else if(OPT("--connections"))
            connections = atoi(v);
        else if(OPT("--duration"))
            duration = atof(v);
        else if(OPT("--warmup"))
            warmup = atof(v);
        else if(OPT("--label"))
            label = v;
        else if(OPT("--hostile"))
            hostile = v;
        else if(OPT("--route")) {
            const char *eq = strchr(v, '=');
            if(!eq || n_routes == LOAD_MAX_ROUTES)
                usage();
            route_kind[n_routes] = strndup(v, (size_t)(eq - v));
            route_path[n_routes++] = eq + 1;
        } else if(strcmp(a, "--insecure") == 0)
            insecure = 1;
        else if(a[0] == '-')
            usage();
        else if(n_inputs < 256)
            inputs[n_inputs++] = a;
#undef OPT
    }
    if(!url || (!cacert && !insecure) || concurrency < 1 || connections < 1 || duration <= 0)
        usage();
    unsigned long seq = 0;
    for(int i = 0; i < n_inputs; i++)
        add_path(inputs[i], url, &seq);
    if(n_bodies == 0) { /* no inputs: a minimal review */
        json_t *pod = json_pack("{s:s,s:s,s:{s:s,s:s}}", "apiVersion", "v1", "kind", "Pod", "metadata", "name", "bench",
                                "namespace", "default");
        add_document(pod, url, &seq);
        json_decref(pod);
    }
    size_t n_normal = n_bodies; /* bodies[n_normal..] are the hostile ones */
    if(hostile) {
        add_path(hostile, url, &seq);
        if(n_bodies == n_normal)
            die("%s: no review in it", hostile);
    }
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake up on time, not up to 50 us late */

    int open_loop = rate > 0;
    int n_slots = open_loop ? connections : concurrency;
    int n_handles = n_slots + (hostile ? 1 : 0); /* the hostile handle is the last */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)n_handles);
    CURLSH *share = curl_share_init();
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    hdrs = curl_slist_append(hdrs, "Expect:");
    load_slot *slots = calloc((size_t)n_handles, sizeof *slots);
    for(int i = 0; i < n_handles; i++) {
        CURL *h = curl_easy_init();
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &slots[i]);
        curl_easy_setopt(h, CURLOPT_PRIVATE, &slots[i]);
        curl_easy_setopt(h, CURLOPT_SHARE, share);
        curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
        if(cacert)
            curl_easy_setopt(h, CURLOPT_CAINFO, cacert);
        if(insecure) {
            curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
            curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
        }
        slots[i].h = h;
        slots[i].hostile = i >= n_slots;
    }

    size_t cap = 1 << 16, n_lat = 0;
    double *lat = malloc(cap * sizeof *lat);
    long errors = 0, answered = 0, in_time = 0, dropped = 0, hostile_sent = 0;
    size_t next_body = 0, next_hostile = 0;
    double t0 = now_s(), t_warm = t0 + warmup, t_end = t_warm + duration;
    double interval = open_loop ? 1.0 / rate : 0;
    unsigned long long scheduled = 0; /* open loop: requests whose time has come */
    unsigned long long started = 0;
    unsigned long long dispatched = 0; /* open loop: of those, handed to a handle */
    int running = 0; /* counted handles busy (not the hostile one) */

#define START(slot, when)                                                                 \
    do {                                                                                  \
        load_body *b_ = (slot)->hostile ? &bodies[n_normal + next_hostile++ % (n_bodies - n_normal)] \
                                        : &bodies[next_body++ % n_normal];                \
        curl_easy_setopt((slot)->h, CURLOPT_URL, b_->url);                                \
        curl_easy_setopt((slot)->h, CURLOPT_POSTFIELDS, b_->json);                        \
        curl_easy_setopt((slot)->h, CURLOPT_POSTFIELDSIZE, (long)b_->len);                \
        (slot)->sched = (when);                                                           \
        (slot)->busy = 1;                                                                 \
        (slot)->bytes = 0;                                                                \
        curl_multi_add_handle(m, (slot)->h);                                              \
        if((slot)->hostile)                                                               \
            hostile_sent++;                                                               \
        else {                                                                            \
            running++;                                                                    \
            started++;                                                                    \
        }                                                                                 \
    } while(0)

    if(!open_loop)
        for(int i = 0; i < n_slots; i++)
            START(&slots[i], now_s());
    if(hostile)
        START(&slots[n_slots], now_s());

    double cpu_warm = -1, wall_warm = 0; /* this process's CPU seconds when the warm-up ended */
    for(;;) {
        double now = now_s();
        if(cpu_warm < 0 && now >= t_warm) {
            cpu_warm = cpu_s();
            wall_warm = now;
        }
        if(open_loop && now < t_end)
            while(t0 + (double)scheduled * interval <= now)
                scheduled++; /* its time has come; sent when a handle is free */
        if(open_loop) /* hand due sends to free handles, oldest first */
            for(int i = 0; i < n_slots && dispatched < scheduled; i++)
                if(!slots[i].busy) {
                    START(&slots[i], t0 + (double)dispatched * interval);
                    dispatched++;
                }
        if(running == 0 && now >= t_end)
            break;

        int still;
        curl_multi_perform(m, &still);
        CURLMsg *msg;
        int left;
        while((msg = curl_multi_info_read(m, &left))) {
            if(msg->msg != CURLMSG_DONE)
                continue;
            load_slot *s;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            double done = now_s();
            long code = 0;
            curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &code);
            int failed = msg->data.result != CURLE_OK || code != 200;
            if(failed && errors < 5)
                fprintf(stderr, "cozygpu-load: request failed: %s, HTTP %ld\n", curl_easy_strerror(msg->data.result), code);
            curl_multi_remove_handle(m, s->h);
            s->busy = 0;
            if(s->hostile) { /* not counted; sent again until the end */
                if(done < t_end)
                    START(s, done);
                continue;
            }
            running--;
            if(s->sched >= t_warm && s->sched < t_end) {
                if(failed)
                    errors++;
                else {
                    if(n_lat == cap) {
                        cap *= 2;
                        lat = realloc(lat, cap * sizeof *lat);
                    }
                    lat[n_lat++] = done - s->sched;
                    answered++;
                    if(done <= t_end)
                        in_time++;
                }
            }
            if(!open_loop && done < t_end)
                START(s, done);
        }
        if(running == 0 && now_s() >= t_end)
            break;

        /* wait for sockets or the next scheduled send, with sub-ms precision */
        double wait = 0.1;
        long ct = -1;
        curl_multi_timeout(m, &ct);
        if(ct >= 0 && ct / 1000.0 < wait)
            wait = ct / 1000.0;
        if(open_loop && now_s() < t_end) {
            double next = t0 + (double)scheduled * interval - now_s();
            if(next < wait)
                wait = next > 0 ? next : 0;
        }
        fd_set r, w, e;
        int maxfd = -1;
        FD_ZERO(&r);
        FD_ZERO(&w);
        FD_ZERO(&e);
        curl_multi_fdset(m, &r, &w, &e, &maxfd);
        struct timespec ts = { (time_t)wait, (long)((wait - floor(wait)) * 1e9) };
        if(wait > 0) {
            if(maxfd >= 0)
                pselect(maxfd + 1, &r, &w, &e, &ts, NULL);
            else
                nanosleep(&ts, NULL);
        }
    }
    dropped = (long)(scheduled - dispatched);
    double wall = now_s() - wall_warm;
    double client_cores = cpu_warm >= 0 && wall > 0 ? (cpu_s() - cpu_warm) / wall : NAN;

    qsort(lat, n_lat, sizeof *lat, cmp_double);
    double rps = (double)in_time / duration;
    double p50 = pct(lat, n_lat, 50) * 1e3, p90 = pct(lat, n_lat, 90) * 1e3, p99 = pct(lat, n_lat, 99) * 1e3,
           mx = n_lat ? lat[n_lat - 1] * 1e3 : NAN;
    fprintf(stderr,
            "%s: %s, %zu reviews, %zu bodies, %.1f s: %ld answered, %ld errors, %.0f reviews/s, p50 %.3f ms, "
            "p90 %.3f ms, p99 %.3f ms, max %.3f ms, %ld hostile sent%s\n",
            label, open_loop ? "open loop" : "closed loop", (size_t)started, n_bodies, duration, answered, errors, rps,
            p50, p90, p99, mx, hostile_sent,
            dropped ? " (requests still queued at the end: the target did not keep up)" : "");
    printf("RESULT label=%s mode=%s n=%ld errors=%ld rps=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f "
           "queued_at_end=%ld hostile=%ld client_cores=%.2f\n",
           label, open_loop ? "open" : "closed", answered, errors, rps, p50, p90, p99, mx, dropped, hostile_sent,
           client_cores);

    for(int i = 0; i < n_handles; i++) {
        if(slots[i].busy)
            curl_multi_remove_handle(m, slots[i].h);
        curl_easy_cleanup(slots[i].h);
    }
    curl_multi_cleanup(m);
    curl_share_cleanup(share);
    curl_slist_free_all(hdrs);
    curl_global_cleanup();
    for(size_t i = 0; i < n_bodies; i++) {
        free(bodies[i].json);
        free(bodies[i].url);
    }
    for(int i = 0; i < n_routes; i++)
        free((char *)route_kind[i]);
    free(lat);
    free(slots);
    return errors ? 1 : 0;
}
