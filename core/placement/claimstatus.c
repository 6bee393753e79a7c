/* claimstatus.c — GPUClaim status writes (internal.h, pl_): the status
 * of a claim as the state holds it (decision 0020: phase, node,
 * attachedTo, the Ready condition), written conditional on the
 * resourceVersion read, in an order in which the API never shows a node
 * over its offer, and the fair order of the leader's queues (decision
 * 0039).
 */
#include "placement/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "format/kobject.h"

static json_t *status_of(const binder_claim_status *s, json_int_t generation, const json_t *old_status, const char *now)
{
    json_t *st = json_object();
    json_object_set_new(st, "phase", json_string(binder_phase_name(s->phase)));
    if(s->node)
        json_object_set_new(st, "node", json_string(s->node));
    if(s->attached_to)
        json_object_set_new(st, "attachedTo", json_string(s->attached_to));
    json_object_set_new(st, "observedGeneration", json_integer(generation));
    int ready = s->phase == BINDER_BOUND || s->phase == BINDER_ATTACHED;
    kobject_condition k = {"Ready", ready ? "True" : "False",
                           s->reason == BINDER_R_NONE ? "Pending" : binder_reason_name(s->reason),
                           s->message ? s->message : "", generation};
    json_object_set_new(st, "conditions",
                        json_pack("[{s:s, s:s, s:s, s:s, s:I, s:s}]", "type", k.type, "status", k.status, "reason",
                                  k.reason, "message", k.message, "observedGeneration", k.generation,
                                  "lastTransitionTime",
                                  kobject_condition_since(json_object_get(old_status, "conditions"), &k, now)));
    return st;
}

/* Writes claim `key`'s status when the cache holds another one. Returns 1
 * when done (written, already so, or the claim is gone), 0 to retry. */
static int write_claim(placement *L, const char *key)
{
    char buf[600];
    const char *ns, *name;
    keyset_split(key, buf, sizeof buf, &ns, &name);
    binder_claim_status s;
    if(binder_state_claim_get(L->st, ns, name, &s) != BINDER_OK)
        return 1;
    json_t *obj = pl_get(L, PLACEMENT_CLAIM, ns, name);
    if(!obj)
        return 1;
    const char *uid = kobject_meta_str(obj, "uid"), *held = json_string_value(json_object_get(L->uids, key));
    if(uid && held && strcmp(uid, held) != 0) {
        /* the cache already holds a claim re-created under this name, whose
         * event the state has not taken yet: the state's status is the old
         * claim's, never the new one's (decision 0026, identity by uid) */
        json_decref(obj);
        return 0;
    }
    char now[40];
    clock_rfc3339_now(now, sizeof now);
    const json_t *old = json_object_get(obj, "status");
    json_t *st = status_of(&s, json_integer_value(json_object_get(json_object_get(obj, "metadata"), "generation")),
                           old, now);
    int done = 1;
    if(!json_equal(st, old)) {
        if(!pl_leading(L)) {
            done = 0;
        } else {
            json_t *body = json_copy(obj);
            json_object_set(body, "status", st);
            long code = 0;
            json_t *out = NULL;
            cozy_err err;
            if(!(code = L->io.claim_status(L->io.ud, ns, body, &out, &err))) {
                log_write(LOG_WARN, "binder", "cannot write the claim's status", "namespace", ns, "gpuclaim", name,
                          "error", err.msg, NULL);
                metrics_counter_add("cozygpu_binder_status_writes_total", "result=\"error\"", 1);
                done = 0;
            } else if(code == 409) {
                metrics_counter_add("cozygpu_binder_status_writes_total", "result=\"conflict\"", 1);
                done = 0; /* the cache is behind: written again when it moves */
            } else if(code == 404) {
                done = 1;
            } else if(code / 100 != 2) {
                const char *m = json_string_value(json_object_get(out, "message"));
                log_write(LOG_WARN, "binder", "the API server refused the claim's status", "namespace", ns, "gpuclaim",
                          name, "error", m ? m : "", NULL);
                metrics_counter_add("cozygpu_binder_status_writes_total", "result=\"error\"", 1);
                done = 0;
            } else
                metrics_counter_add("cozygpu_binder_status_writes_total", "result=\"ok\"", 1);
            json_decref(out);
            json_decref(body);
        }
    }
    json_decref(st);
    json_decref(obj);
    return done;
}

/* Whether the current flush has used its budget; sets L->more when so. */
int pl_flush_spent(placement *L)
{
    if(clock_mono_ms() < L->flush_until)
        return 0;
    L->more = 1;
    return 1;
}

/* The length of the namespace part of key "ns/name". */
static size_t key_ns_len(const char *key)
{
    const char *slash = strchr(key, '/');
    return slash ? (size_t)(slash - key) : strlen(key);
}


static int cmp_ranked(const void *a, const void *b)
{
    const pl_ranked *x = a, *y = b;
    if(x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return strcmp(x->d->key, y->d->key);
}

pl_ranked *pl_fair_order(keyset *set, size_t *n)
{
    *n = HASH_COUNT(set);
    pl_ranked *r = *n ? calloc(*n, sizeof *r) : NULL;
    json_t *seen = json_object();
    if(!r || !seen) {
        free(r);
        json_decref(seen);
        *n = 0;
        return NULL;
    }
    size_t i = 0;
    keyset *d, *t;
    HASH_ITER(hh, set, d, t)
    {
        char ns[300];
        size_t l = key_ns_len(d->key);
        snprintf(ns, sizeof ns, "%.*s", (int)(l < sizeof ns ? l : sizeof ns - 1), d->key);
        json_int_t k = json_integer_value(json_object_get(seen, ns));
        json_object_set_new(seen, ns, json_integer(k + 1));
        r[i++] = (pl_ranked){d, (unsigned)k};
    }
    json_decref(seen);
    qsort(r, *n, sizeof *r, cmp_ranked);
    return r;
}

/* One status write to send: what it does to the API's bookings. */
typedef struct pending_write {
    keyset *d;
    const char *class_name;
    uint32_t count;
    char rel[256];  /* the node the API shows it on and the state moved it from ("" none) */
    char book[256]; /* the node the state holds it on and the API does not show ("" none) */
} pending_write;

/* Units per "node/class" that the API shows booked beyond the state:
 * + a release not written yet, - a booking not written yet. */
typedef struct api_delta {
    char *key;
    long units;
    UT_hash_handle hh;
} api_delta;

static void delta_add(api_delta **m, const char *node, const char *cls, long units)
{
    char key[600];
    snprintf(key, sizeof key, "%s/%s", node, cls);
    api_delta *x;
    HASH_FIND_STR(*m, key, x);
    if(!x) {
        x = calloc(1, sizeof *x);
        if(!x || !(x->key = strdup(key))) {
            free(x);
            return;
        }
        HASH_ADD_KEYPTR(hh, *m, x->key, strlen(x->key), x);
    }
    x->units += units;
}

static long delta_get(api_delta *m, const char *node, const char *cls)
{
    char key[600];
    snprintf(key, sizeof key, "%s/%s", node, cls);
    api_delta *x;
    HASH_FIND_STR(m, key, x);
    return x ? x->units : 0;
}

/* Sends the status writes in an order in which the API never shows a node
 * holding more units of a class than it offers (decision 0020), even
 * when some writes fail: what the API shows booked on a node is what the
 * state holds plus the releases not written yet minus the bookings not
 * written yet; a write that books is sent only when that, plus its units,
 * fits the node's offer. Releases always fit, so a failed release holds
 * back exactly the bookings that need its units, and a swap between two
 * nodes goes through (the state bound the first move before releasing
 * anything). Rounds repeat while one makes progress. */
void pl_flush_status(placement *L)
{
    size_t n, k = 0;
    pl_ranked *order = pl_fair_order(L->writes, &n); /* round robin across namespaces */
    pending_write *w = n ? calloc(n, sizeof *w) : NULL;
    if(!w) {
        free(order);
        return;
    }
    api_delta *delta = NULL;
    for(size_t j = 0; j < n; j++) {
        keyset *d = order[j].d;
        char buf[600];
        const char *ns, *name;
        keyset_split(d->key, buf, sizeof buf, &ns, &name);
        binder_claim_status s;
        json_t *obj = pl_get(L, PLACEMENT_CLAIM, ns, name);
        if(binder_state_claim_get(L->st, ns, name, &s) != BINDER_OK || !obj) {
            json_decref(obj);
            keyset_drop(&L->writes, d); /* gone: nothing to write */
            continue;
        }
        const char *api = json_string_value(json_object_get(json_object_get(obj, "status"), "node"));
        pending_write *p = &w[k++];
        p->d = d;
        p->class_name = s.class_name;
        p->count = s.count;
        if(api && (!s.node || strcmp(api, s.node) != 0)) {
            snprintf(p->rel, sizeof p->rel, "%s", api);
            delta_add(&delta, p->rel, s.class_name, (long)s.count);
        }
        if(s.node && (!api || strcmp(api, s.node) != 0)) {
            snprintf(p->book, sizeof p->book, "%s", s.node);
            delta_add(&delta, p->book, s.class_name, -(long)s.count);
        }
        json_decref(obj);
    }
    const binder_index *ix = binder_state_index(L->st);
    for(int progress = 1; progress && pl_leading(L) && !pl_flush_spent(L);) {
        progress = 0;
        for(size_t i = 0; i < k; i++) {
            pending_write *p = &w[i];
            if(!p->d)
                continue;
            if(pl_flush_spent(L))
                break;
            if(*p->book) {
                binder_slot_view v;
                if(binder_node_slot(ix, p->book, p->class_name, &v) != BINDER_OK)
                    continue;
                long shown = (long)v.bound + delta_get(delta, p->book, p->class_name);
                if(shown + (long)p->count > (long)v.offered)
                    continue; /* its units are still shown taken: after the release */
            }
            if(!pl_leading(L))
                break;
            if(!write_claim(L, p->d->key))
                continue;
            L->progressed = 1;
            if(*p->rel)
                delta_add(&delta, p->rel, p->class_name, -(long)p->count);
            if(*p->book)
                delta_add(&delta, p->book, p->class_name, (long)p->count);
            keyset_drop(&L->writes, p->d);
            p->d = NULL;
            progress = 1;
        }
    }
    api_delta *x, *xt;
    HASH_ITER(hh, delta, x, xt)
    {
        HASH_DEL(delta, x);
        free(x->key);
        free(x);
    }
    free(w);
    free(order);
}
