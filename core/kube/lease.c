/* lease.c — leader election with a Lease (lease.h). */
#include "kube/lease.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/metrics.h"
#include "base/clock.h"

struct lease_elector {
    kube_client *client;
    char *ns, *name, *identity;
    long duration_ms, renew_deadline_ms, retry_ms;
    void (*on_change)(void *, int);
    void *ctx;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;

    /* guarded by mu */
    int leading;
    long long last_renew_ms; /* monotonic, last successful write as holder */

    /* elector thread only */
    char *observed_key;      /* holder + renewTime + rv of the record last seen */
    long long observed_at_ms;/* monotonic time it was first seen */
};

/* metav1.MicroTime in RFC 3339 with microseconds, UTC. */
static void micro_time(char *buf, size_t n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, n, "%s.%06dZ", base, (int)(ts.tv_nsec / 1000) % 1000000);
}

static void set_leading(lease_elector *le, int leading)
{
    pthread_mutex_lock(&le->mu);
    int was = le->leading;
    le->leading = leading;
    if(leading)
        le->last_renew_ms = clock_mono_ms();
    pthread_mutex_unlock(&le->mu);
    if(was != leading) {
        metrics_gauge_set("cozygpu_leader", NULL, leading ? 1 : 0);
        log_write(LOG_INFO, "lease", leading ? "started leading" : "stopped leading", "lease", le->name, "identity",
                  le->identity, NULL);
        if(le->on_change)
            le->on_change(le->ctx, leading);
    }
}

int lease_is_leader(lease_elector *le)
{
    if(!le)
        return 0;
    pthread_mutex_lock(&le->mu);
    int yes = le->leading && clock_mono_ms() - le->last_renew_ms < le->renew_deadline_ms;
    pthread_mutex_unlock(&le->mu);
    return yes;
}

static json_t *lease_spec(lease_elector *le, const char *holder, long duration_s, const char *acquire,
                          const char *renew, long long transitions)
{
    return json_pack("{s:s, s:I, s:s, s:s, s:I}", "holderIdentity", holder, "leaseDurationSeconds",
                     (json_int_t)duration_s, "acquireTime", acquire, "renewTime", renew, "leaseTransitions",
                     (json_int_t)transitions);
    (void)le;
}

/* One round of client-go's tryAcquireOrRenew. Returns 1 when this replica
 * holds the Lease after it, 0 when another does, -1 on an API error. */
static int try_acquire_or_renew(lease_elector *le)
{
    char now[48];
    micro_time(now, sizeof now);
    long duration_s = (le->duration_ms + 999) / 1000;
    char *path = kube_path(&KUBE_LEASES, le->ns, le->name, NULL);
    long status = 0;
    json_t *cur = NULL;
    cozy_err err;
    int rc = -1;
    if(!path)
        return -1;
    if(kube_request(le->client, "GET", path, NULL, NULL, &status, &cur, &err) != COZY_OK) {
        log_write(LOG_WARN, "lease", "cannot read the lease", "error", err.msg, NULL);
        goto out;
    }
    if(status == 404) {
        json_t *obj = json_pack("{s:s, s:s, s:{s:s, s:s}, s:o}", "apiVersion", "coordination.k8s.io/v1", "kind",
                                "Lease", "metadata", "name", le->name, "namespace", le->ns, "spec",
                                lease_spec(le, le->identity, duration_s, now, now, 0));
        char *coll = kube_path(&KUBE_LEASES, le->ns, NULL, NULL);
        json_t *res = NULL;
        long st = 0;
        if(coll && kube_request(le->client, "POST", coll, NULL, obj, &st, &res, &err) == COZY_OK)
            rc = st == 201 || st == 200 ? 1 : (st == 409 ? 0 : -1);
        else
            log_write(LOG_WARN, "lease", "cannot create the lease", "error", err.msg, NULL);
        free(coll);
        json_decref(obj);
        json_decref(res);
        goto out;
    }
    if(status != 200 || !json_is_object(cur)) {
        char code[16];
        snprintf(code, sizeof code, "%ld", status);
        log_write(LOG_WARN, "lease", "unexpected answer reading the lease", LOG_NUM "status", code, NULL);
        goto out;
    }

    json_t *spec = json_object_get(cur, "spec");
    const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
    const char *renew = json_string_value(json_object_get(spec, "renewTime"));
    const char *acquire = json_string_value(json_object_get(spec, "acquireTime"));
    const char *rv = json_string_value(json_object_get(json_object_get(cur, "metadata"), "resourceVersion"));
    json_int_t held_s = json_integer_value(json_object_get(spec, "leaseDurationSeconds"));
    long long transitions = json_integer_value(json_object_get(spec, "leaseTransitions"));
    int mine = holder && strcmp(holder, le->identity) == 0;

    /* observedTime: when we first saw this exact record (client-go keeps
     * observedRawRecord and observedTime). */
    char key[512];
    snprintf(key, sizeof key, "%s|%s|%s", holder ? holder : "", renew ? renew : "", rv ? rv : "");
    if(!le->observed_key || strcmp(le->observed_key, key) != 0) {
        free(le->observed_key);
        le->observed_key = strdup(key);
        le->observed_at_ms = clock_mono_ms();
    }
    if(!mine && holder && *holder) {
        long long valid_ms = (held_s > 0 ? (long long)held_s * 1000 : le->duration_ms);
        if(clock_mono_ms() - le->observed_at_ms < valid_ms) {
            rc = 0; /* held by another, not expired */
            goto out;
        }
    }

    json_t *next = json_deep_copy(cur);
    json_object_set_new(next, "spec",
                        lease_spec(le, le->identity, duration_s, mine && acquire ? acquire : now, now,
                                   mine ? transitions : transitions + 1));
    json_t *res = NULL;
    long st = 0;
    if(kube_request(le->client, "PUT", path, NULL, next, &st, &res, &err) != COZY_OK) {
        log_write(LOG_WARN, "lease", "cannot update the lease", "error", err.msg, NULL);
    } else if(st == 200) {
        rc = 1;
    } else if(st == 409) {
        rc = 0; /* someone else wrote first: re-read next round */
    } else {
        char code[16];
        snprintf(code, sizeof code, "%ld", st);
        log_write(LOG_WARN, "lease", "lease update refused", LOG_NUM "status", code, NULL);
    }
    json_decref(next);
    json_decref(res);
out:
    json_decref(cur);
    free(path);
    return rc;
}

static void release(lease_elector *le)
{
    char now[48];
    micro_time(now, sizeof now);
    char *path = kube_path(&KUBE_LEASES, le->ns, le->name, NULL);
    long status = 0;
    json_t *cur = NULL, *res = NULL;
    cozy_err err;
    if(path && kube_request(le->client, "GET", path, NULL, NULL, &status, &cur, &err) == COZY_OK && status == 200) {
        json_t *spec = json_object_get(cur, "spec");
        const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
        if(holder && strcmp(holder, le->identity) == 0) {
            json_t *next = json_deep_copy(cur);
            json_object_set_new(next, "spec",
                                lease_spec(le, "", 1, now, now,
                                           json_integer_value(json_object_get(spec, "leaseTransitions"))));
            long st = 0;
            if(kube_request(le->client, "PUT", path, NULL, next, &st, &res, &err) == COZY_OK && st == 200)
                log_write(LOG_INFO, "lease", "released the lease", "lease", le->name, NULL);
            else
                log_write(LOG_WARN, "lease", "could not release the lease", "lease", le->name, NULL);
            json_decref(next);
        }
    }
    json_decref(cur);
    json_decref(res);
    free(path);
}

static void *elector_main(void *arg)
{
    lease_elector *le = arg;
    for(;;) {
        pthread_mutex_lock(&le->mu);
        int stop = le->stopping;
        pthread_mutex_unlock(&le->mu);
        if(stop)
            break;
        long long t0 = clock_mono_ms();
        int got = try_acquire_or_renew(le);
        if(got == 1)
            set_leading(le, 1);
        else if(got == 0)
            set_leading(le, 0);
        else {
            /* API error: keep leading only until the renew deadline */
            pthread_mutex_lock(&le->mu);
            int lapsed = le->leading && clock_mono_ms() - le->last_renew_ms >= le->renew_deadline_ms;
            pthread_mutex_unlock(&le->mu);
            if(lapsed)
                set_leading(le, 0);
        }
        /* wait retry period (interruptible by stop) */
        long long wake = t0 + le->retry_ms;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long long left = wake - clock_mono_ms();
        if(left < 0)
            left = 0;
        ts.tv_sec += left / 1000;
        ts.tv_nsec += (left % 1000) * 1000000;
        if(ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_mutex_lock(&le->mu);
        while(!le->stopping && pthread_cond_timedwait(&le->cv, &le->mu, &ts) == 0)
            ;
        pthread_mutex_unlock(&le->mu);
    }
    return NULL;
}

cozy_result lease_start(lease_elector **out, kube_client *client, const lease_options *o, cozy_err *err)
{
    if(!o->namespace_ || !*o->namespace_ || !o->name || !*o->name || !o->identity || !*o->identity)
        return cozy_fail(err, COZY_ERR_USAGE, "leader election needs a namespace, a lease name and an identity");
    if(!(o->retry_period_ms > 0 && o->retry_period_ms < o->renew_deadline_ms &&
         o->renew_deadline_ms < o->lease_duration_ms))
        return cozy_fail(err, COZY_ERR_USAGE,
                         "leader election: need retry period (%ld ms) < renew deadline (%ld ms) < lease duration (%ld ms)",
                         o->retry_period_ms, o->renew_deadline_ms, o->lease_duration_ms);
    lease_elector *le = calloc(1, sizeof *le);
    if(!le)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    le->client = client;
    le->ns = strdup(o->namespace_);
    le->name = strdup(o->name);
    le->identity = strdup(o->identity);
    le->duration_ms = o->lease_duration_ms;
    le->renew_deadline_ms = o->renew_deadline_ms;
    le->retry_ms = o->retry_period_ms;
    le->on_change = o->on_change;
    le->ctx = o->ctx;
    pthread_mutex_init(&le->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&le->cv, &ca);
    pthread_condattr_destroy(&ca);
    metrics_gauge_set("cozygpu_leader", NULL, 0);
    if(pthread_create(&le->thread, NULL, elector_main, le) != 0) {
        lease_stop(le, 0);
        return cozy_fail(err, COZY_ERR_INTERNAL, "cannot start the leader election thread");
    }
    *out = le;
    return COZY_OK;
}

void lease_stop(lease_elector *le, int do_release)
{
    if(!le)
        return;
    pthread_mutex_lock(&le->mu);
    le->stopping = 1;
    pthread_cond_broadcast(&le->cv);
    pthread_mutex_unlock(&le->mu);
    if(le->thread)
        pthread_join(le->thread, NULL);
    int was = le->leading;
    if(was) {
        set_leading(le, 0); /* writers stop before the release is visible */
        if(do_release)
            release(le);
    }
    pthread_mutex_destroy(&le->mu);
    pthread_cond_destroy(&le->cv);
    free(le->observed_key);
    free(le->ns);
    free(le->name);
    free(le->identity);
    free(le);
}

char *lease_default_identity(char *buf, size_t n)
{
    const char *pod = getenv("POD_NAME");
    if(pod && *pod) {
        snprintf(buf, n, "%s", pod);
        return buf;
    }
    char h[256];
    if(gethostname(h, sizeof h - 1) != 0)
        snprintf(h, sizeof h, "cozygpu");
    h[sizeof h - 1] = 0;
    unsigned char rnd[6] = {0};
    FILE *ur = fopen("/dev/urandom", "rb");
    if(ur) {
        if(fread(rnd, 1, sizeof rnd, ur) != sizeof rnd)
            memset(rnd, 0, sizeof rnd);
        fclose(ur);
    }
    snprintf(buf, n, "%s_%02x%02x%02x%02x%02x%02x", h, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
    return buf;
}
