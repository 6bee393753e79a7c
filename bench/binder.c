/* binder.c — the binder's index under load (core/binder/index.c;
 * the required figures: placement of 1k claims on 100 nodes, 10k on 1k, 100k on 10k,
 * time, placements per second, peak memory, and the cost of one event on
 * the full state; targets: 100k on 10k in under 2 s, one event under 1 ms,
 * memory under 200 MB).
 *
 * The cluster (per 100 nodes): 30 nodes of 8 passthrough L40S, 30 of 8
 * H100, 25 of 40 vGPU L40S (5 per GPU), 15 with 4 L40S and 4 H100 (two
 * models, so multi-class sets fit there only); 5 in 100 carry a
 * gpu.cozystack.io/dedicated NoSchedule taint, 1 in 100 each cordoned,
 * NotReady, layout-pending. The claims come in sets (one VM's claims): a
 * vGPU set of 1-4 claims of one vGPU each (75 in 100), a passthrough set
 * of one claim of 1, 2, 4 or 8 GPUs (22 in 100), or a two-model set of 1-2
 * L40S and 1-2 H100 (3 in 100); 1 set in 10 tolerates the dedicated taint.
 * Demand is about three quarters of the capacity, so the last sets meet a
 * nearly full cluster. Sets are placed in order: claims recorded,
 * candidates (at most CANDIDATES = 32 in packing order; decision 0020: at
 * most 32 per set go to Lua), the first taken (the stand-in for the Lua
 * scoring to come), the set bound; a set with no candidate waits (counted).
 * Placement is timed as the median of --runs runs (5 times as many below
 * 10k nodes, where one run takes milliseconds and the machine's noise
 * would dominate); events are timed one by one (--events of each). Everything from a seeded PRNG; the
 * seed is printed, `--seed N` replays it.
 *
 * Then the state machine over the same clusters (binder.h; sizes up to
 * --state-max-nodes, default 10000): built through the binder, placed by
 * binder_reconcile, and the cost of one event with its reconcile on the
 * full state (--state-events of each kind, 5 times as many below 10k).
 *
 * Usage: cozygpu-binder-bench [--seed N] [--runs N] [--events N] [--max-nodes N]
 *                             [--state-max-nodes N] [--state-events N]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "binder/binder.h"
#include "binder/index.h"

#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <valgrind/callgrind.h>

static uint64_t rng;

static uint64_t rnd64(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ULL;
}

static uint32_t rnd(uint32_t n)
{
    return (uint32_t)(rnd64() % n);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double pct(double *v, size_t n, double p) /* v sorted */
{
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static size_t heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* candidates asked per set (decision 0020: the bounded list Lua scores) */
#define CANDIDATES 32

#define L40S "pt-l40s"
#define H100 "pt-h100"
#define VG "vg-l40s-8q"

static const binder_taint dedicated = {"gpu.cozystack.io/dedicated", "tenant-x", "NoSchedule"};
static const binder_toleration tol_dedicated = {"gpu.cozystack.io/dedicated", "Equal", "tenant-x", "NoSchedule"};

typedef struct nodedef {
    char name[32];
    binder_offer offers[2];
    size_t n_offers;
    uint32_t flags;
    int tainted;
} nodedef;

typedef struct setdef {
    binder_claim_ref refs[4];
    binder_need needs[4];
    size_t n;
    int tolerant;
} setdef;

typedef struct cluster {
    size_t nnodes, nsets, nclaims;
    nodedef *nodes;
    setdef *sets;
    char (*ns)[16];
    char (*names)[32];
    uint64_t capacity;
    uint64_t demand;
} cluster;

static binder_rc node_put(binder_index *ix, const nodedef *d)
{
    binder_node_spec spec = {d->flags, d->offers, d->n_offers, d->tainted ? &dedicated : NULL, d->tainted ? 1u : 0u};
    return binder_node_upsert(ix, d->name, &spec, NULL, NULL);
}

static void make_node(nodedef *d, size_t i)
{
    snprintf(d->name, sizeof d->name, "node-%05zu", i);
    uint32_t kind = rnd(100);
    if(kind < 30)
        d->offers[0] = (binder_offer){L40S, 8}, d->n_offers = 1;
    else if(kind < 60)
        d->offers[0] = (binder_offer){H100, 8}, d->n_offers = 1;
    else if(kind < 85)
        d->offers[0] = (binder_offer){VG, 40}, d->n_offers = 1;
    else
        d->offers[0] = (binder_offer){L40S, 4}, d->offers[1] = (binder_offer){H100, 4}, d->n_offers = 2;
    uint32_t state = rnd(100);
    d->flags = BINDER_NODE_READY | BINDER_NODE_SCHEDULABLE;
    if(state == 0)
        d->flags &= ~BINDER_NODE_SCHEDULABLE;
    else if(state == 1)
        d->flags &= ~BINDER_NODE_READY;
    else if(state == 2)
        d->flags |= BINDER_NODE_LAYOUT_PENDING;
    d->tainted = rnd(100) < 5;
}

/* One set of claims into s (names from the cluster's pools). */
static void make_set(cluster *c, setdef *s)
{
    uint32_t kind = rnd(100);
    s->n = 0;
    s->tolerant = rnd(10) == 0;
    static const uint32_t pt_units[] = {1, 1, 1, 1, 2, 2, 4, 8};
    if(kind < 75) { /* vGPU: 1-4 claims of one each */
        uint32_t k = 1 + (rnd(4) == 0 ? rnd(4) : 0);
        for(uint32_t j = 0; j < k; j++)
            s->needs[s->n++] = (binder_need){VG, 1};
    } else if(kind < 97) {
        s->needs[s->n++] = (binder_need){rnd(2) ? L40S : H100, pt_units[rnd(8)]};
    } else {
        s->needs[s->n++] = (binder_need){L40S, 1 + rnd(2)};
        s->needs[s->n++] = (binder_need){H100, 1 + rnd(2)};
    }
    for(size_t j = 0; j < s->n; j++) {
        size_t k = c->nclaims++;
        snprintf(c->ns[k], sizeof c->ns[k], "tenant-%03u", rnd(200));
        snprintf(c->names[k], sizeof c->names[k], "claim-%07zu", k);
        s->refs[j] = (binder_claim_ref){c->ns[k], c->names[k]};
        c->demand += s->needs[j].units;
    }
}

/* A cluster of n nodes and sets adding up to `claims` claims. */
static cluster *make_cluster(size_t n, size_t claims)
{
    cluster *c = calloc(1, sizeof *c);
    c->nnodes = n;
    c->nodes = calloc(n, sizeof *c->nodes);
    c->sets = calloc(claims, sizeof *c->sets);
    c->ns = calloc(claims + 4, sizeof *c->ns);
    c->names = calloc(claims + 4, sizeof *c->names);
    if(!c->nodes || !c->sets || !c->ns || !c->names) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for(size_t i = 0; i < n; i++) {
        make_node(&c->nodes[i], i);
        for(size_t j = 0; j < c->nodes[i].n_offers; j++)
            c->capacity += c->nodes[i].offers[j].units;
    }
    while(c->nclaims < claims) {
        setdef *s = &c->sets[c->nsets++];
        make_set(c, s);
        if(c->nclaims > claims) { /* trim the last set to the exact count */
            size_t extra = c->nclaims - claims;
            for(size_t j = 0; j < extra; j++)
                c->demand -= s->needs[s->n - 1 - j].units;
            s->n -= extra;
            c->nclaims = claims;
        }
    }
    return c;
}

static void free_cluster(cluster *c)
{
    free(c->nodes);
    free(c->sets);
    free(c->ns);
    free(c->names);
    free(c);
}

static void die(binder_rc rc, const char *what)
{
    fprintf(stderr, "binder bench: %s: %s\n", what, binder_strerror(rc));
    exit(2);
}

/* Records and places one set; returns 1 when placed. */
static int place(binder_index *ix, const setdef *s)
{
    binder_rc rc;
    for(size_t j = 0; j < s->n; j++)
        if((rc = binder_claim_upsert(ix, s->refs[j].ns, s->refs[j].name, s->needs[j].class_name, s->needs[j].units,
                                     NULL)))
            die(rc, "claim");
    binder_query q = {s->needs, s->n, s->tolerant ? &tol_dedicated : NULL, s->tolerant ? 1u : 0u, 0};
    binder_candidate cand[CANDIDATES];
    size_t n = 0;
    if((rc = binder_candidates_set(ix, &q, cand, CANDIDATES, &n)))
        die(rc, "candidates");
    if(!n)
        return 0;
    if((rc = binder_bind_set(ix, s->refs, s->n, cand[0].node, 0, NULL)))
        die(rc, "bind");
    return 1;
}

typedef struct result {
    size_t nodes, claims;
    double place_s; /* median */
    double node_build_s;
    size_t placed_sets, waiting_sets, bound_claims;
    double add_med_us, add_p99_us, lost_med_us, lost_p99_us, replace_med_us, replace_p99_us;
    double lost_claims_avg;
    size_t index_bytes;
    long rss_kib;
} result;

struct collect {
    binder_claim_ref refs[256];
    char ns[256][16], names[256][32];
    size_t n;
};

static void on_unbound(void *ud, const binder_claim_view *v)
{
    struct collect *c = ud;
    if(c->n == 256)
        return;
    snprintf(c->ns[c->n], sizeof c->ns[0], "%s", v->ns);
    snprintf(c->names[c->n], sizeof c->names[0], "%s", v->name);
    c->refs[c->n] = (binder_claim_ref){c->ns[c->n], c->names[c->n]};
    c->n++;
}

static void run_size(size_t nnodes, size_t nclaims, int runs, int events, result *r)
{
    memset(r, 0, sizeof *r);
    r->nodes = nnodes;
    r->claims = nclaims;
    cluster *c = make_cluster(nnodes, nclaims);
    double *t = calloc((size_t)runs, sizeof *t), *tb = calloc((size_t)runs, sizeof *tb);
    binder_index *ix = NULL;
    for(int run = 0; run < runs; run++) {
        binder_free(ix);
        size_t heap0 = heap_bytes();
        double t0 = now();
        ix = binder_new();
        for(size_t i = 0; i < c->nnodes; i++) {
            binder_rc rc = node_put(ix, &c->nodes[i]);
            if(rc)
                die(rc, "node");
        }
        double t1 = now();
        size_t placed = 0;
        for(size_t i = 0; i < c->nsets; i++)
            placed += (size_t)place(ix, &c->sets[i]);
        double t2 = now();
        tb[run] = t1 - t0;
        t[run] = t2 - t1;
        r->placed_sets = placed;
        r->waiting_sets = c->nsets - placed;
        r->index_bytes = heap_bytes() - heap0;
    }
    r->place_s = median(t, (size_t)runs);
    r->node_build_s = median(tb, (size_t)runs);
    binder_stats st;
    binder_stats_get(ix, &st);
    r->bound_claims = st.bound;
    cozy_err err;
    binder_rc vrc = binder_verify(ix, &err);
    if(vrc) {
        fprintf(stderr, "binder bench: the index is inconsistent: %s\n", err.msg);
        exit(1);
    }
    /* events on the full state */
    double *add = calloc((size_t)events, sizeof *add), *lost = calloc((size_t)events, sizeof *lost),
           *repl = calloc((size_t)events, sizeof *repl);
    size_t lost_claims = 0;
    static char ns[16], name[32];
    for(int e = 0; e < events; e++) {
        /* a claim added and placed: a new small set */
        setdef s;
        size_t k = c->nclaims;
        cluster tmp = *c; /* reuse the name pools' spare slots */
        make_set(&tmp, &s);
        s.n = 1;
        snprintf(ns, sizeof ns, "%s", tmp.ns[k]);
        snprintf(name, sizeof name, "event-%d", e);
        s.refs[0] = (binder_claim_ref){ns, name};
        double t0 = now();
        int ok = place(ix, &s);
        add[e] = (now() - t0) * 1e6;
        (void)ok;
        binder_rc rc = binder_claim_delete(ix, ns, name);
        if(rc)
            die(rc, "event claim delete");
        /* a node lost: its claims unbound, then placed elsewhere */
        const nodedef *d = &c->nodes[rnd((uint32_t)c->nnodes)];
        struct collect col;
        col.n = 0;
        t0 = now();
        if((rc = binder_node_delete(ix, d->name, on_unbound, &col)))
            die(rc, "node delete");
        lost[e] = (now() - t0) * 1e6;
        lost_claims += col.n;
        /* re-placing them one by one (each claim its own set here: the
         * index does not know which claims form a VM's set) */
        char moved_to[256][32];
        t0 = now();
        for(size_t j = 0; j < col.n; j++) {
            binder_claim_view v;
            binder_claim_get(ix, col.refs[j].ns, col.refs[j].name, &v);
            binder_candidate cand[CANDIDATES];
            size_t n = 0;
            moved_to[j][0] = 0;
            if(binder_candidates(ix, v.class_name, v.count, &tol_dedicated, 1, cand, CANDIDATES, &n) == BINDER_OK && n &&
               binder_bind_set(ix, &col.refs[j], 1, cand[0].node, 0, NULL) == BINDER_OK)
                snprintf(moved_to[j], sizeof moved_to[j], "%s", cand[0].node);
        }
        repl[e] = (now() - t0) * 1e6;
        /* back as it was (not timed) */
        for(size_t j = 0; j < col.n; j++)
            if(moved_to[j][0])
                binder_unbind(ix, col.refs[j].ns, col.refs[j].name);
        if((rc = node_put(ix, d)))
            die(rc, "node back");
        if(col.n && (rc = binder_bind_set(ix, col.refs, col.n, d->name, BINDER_BIND_RESTORE, NULL)))
            die(rc, "claims back");
    }
    if((vrc = binder_verify(ix, &err))) {
        fprintf(stderr, "binder bench: the index is inconsistent after the events: %s\n", err.msg);
        exit(1);
    }
    binder_stats_get(ix, &st);
    if(st.bound != r->bound_claims) {
        fprintf(stderr, "binder bench: %zu claims bound after the events, %zu before\n", st.bound, r->bound_claims);
        exit(1);
    }
    r->add_med_us = median(add, (size_t)events);
    r->add_p99_us = pct(add, (size_t)events, 0.99);
    r->lost_med_us = median(lost, (size_t)events);
    r->lost_p99_us = pct(lost, (size_t)events, 0.99);
    r->replace_med_us = median(repl, (size_t)events);
    r->replace_p99_us = pct(repl, (size_t)events, 0.99);
    r->lost_claims_avg = (double)lost_claims / events;
    r->rss_kib = peak_rss_kib();
    printf("%7zu claims on %6zu nodes: placed in %8.1f ms (median of %d; nodes loaded in %.1f ms before): "
           "%.0f sets/s (%.0f claims/s); %zu sets placed, %zu waiting; %zu claims bound; "
           "capacity %" PRIu64 " units, demand %" PRIu64 "\n",
           nclaims, nnodes, r->place_s * 1e3, runs, r->node_build_s * 1e3, (double)c->nsets / r->place_s,
           (double)nclaims / r->place_s, r->placed_sets, r->waiting_sets, r->bound_claims, c->capacity, c->demand);
    printf("        one event on the full state (median / p99 of %d): claim added and placed %.2f / %.2f us; "
           "node lost, its claims unbound %.2f / %.2f us (%.1f claims); those claims placed elsewhere %.2f / %.2f us\n",
           events, r->add_med_us, r->add_p99_us, r->lost_med_us, r->lost_p99_us, r->lost_claims_avg,
           r->replace_med_us, r->replace_p99_us);
    printf("        memory: index %.1f MB (heap in use), peak RSS of the process %.1f MB\n",
           (double)r->index_bytes / 1e6, (double)r->rss_kib / 1024.0);
    fflush(stdout);
    free(add);
    free(lost);
    free(repl);
    free(t);
    free(tb);
    binder_free(ix);
    free_cluster(c);
}

/* ------------------------------------------------ the state machine */

/* The same cluster, built through the binder's state machine (binder.h):
 * classes, nodes, claims and VMs (one per set) given as the watches would,
 * then binder_reconcile places them all (the default chooser: the index's
 * packing order; no budget hook), then the VMIs of half the placed sets
 * run on their node (a reconcile attaches their claims). The build is
 * timed as the median of several (5 below 10k nodes, 3 at 10k). Then
 * events on the last build's full state, each timed with the
 * binder_reconcile that follows it (what the leader's loop pays per watch
 * event), each kind --state-events times:
 *   - a claim created (a lone order of one vGPU) and placed, then the same
 *     claim deleted (its room a gain: the sets waiting on its class are
 *     checked against its node, decision 0042);
 *   - a node deleted with its claims (a random node holding claims): its
 *     sets move or go Lost, in the same reconcile; then the node given
 *     back (its room a gain);
 *   - a node cordoned (every class here is onCordon: Move, so its
 *     unattached sets move), then uncordoned;
 *   - a node's capacity cut to half of its first offer (the most recently
 *     bound unattached claims over it move), then given back;
 *   - a VMI ending (a running VMI Succeeded): its claims leave Attached.
 * After each pair the state is settled (reconciled until nothing changes,
 * not timed), so every timed event meets a settled state. */
enum { EV_ADD, EV_DELETE, EV_LOST, EV_BACK, EV_CORDON, EV_UNCORDON, EV_CUT, EV_REGROW, EV_VMI_END, EV_KINDS };
static const char *const ev_names[EV_KINDS] = {"claim created", "claim deleted",   "node lost",
                                               "node back",     "node cordoned",   "node uncordoned",
                                               "capacity cut",  "capacity back",   "VMI ended"};

/* One kind's timings (microseconds) and the claim transitions it caused. */
typedef struct evrec {
    double *us;
    size_t n, cap;
    size_t transitions;
} evrec;

/* What one size gave, for the growth between sizes. */
typedef struct smres {
    size_t nodes, claims;
    double load_ms, first_ms, vmis_ms; /* medians of the builds */
    double med[EV_KINDS], p99[EV_KINDS];
    double heap_mb;
} smres;

typedef struct smrun {
    binder_state *st;
    cluster *c;
    int *running; /* per set: its VMI runs */
} smrun;

/* The VM of set i ("vm-%07zu"), into buf. */
static const char *vm_name(char buf[32], size_t i)
{
    snprintf(buf, 32, "vm-%07zu", i);
    return buf;
}

static void sm_die(binder_rc rc, const cozy_err *err, const char *what)
{
    fprintf(stderr, "binder bench (state): %s: %s: %s\n", what, binder_strerror(rc), err ? err->msg : "");
    exit(2);
}

/* Reconciles until nothing changes (not timed: the state an event meets
 * is a settled one, as the leader's loop leaves it). */
static void sm_settle(binder_state *st)
{
    for(int i = 0; i < 16 && binder_reconcile(st, NULL); i++)
        ;
}

/* The leader's writes one change costs (bounded per
 * change): a claim status write per transition; a usage record write per
 * claim whose record appears, goes or changes (a Workload per Bound or
 * Attached claim, operational while Attached: DESIGN.md §3, decision
 * 0028); a GPUClass status write per class whose free or maxFreePerNode
 * moved (decision 0030). */
typedef struct sm_writes {
    size_t status, records, classes;
} sm_writes;

static int billed(binder_phase p)
{
    return p == BINDER_BOUND || p == BINDER_ATTACHED;
}

static void sm_count_writes(void *ud, const binder_event *ev)
{
    sm_writes *w = ud;
    w->status++;
    if(billed(ev->from) != billed(ev->to) || (billed(ev->to) && ev->from != ev->to))
        w->records++;
}

static const char *const sm_classes[] = {L40S, H100, VG};

/* The three classes' status as the leader would write it (free, and the
 * most free on one node; maxCount caps are Lua's and cost nothing here),
 * into out[0..5]; returns the time it took in microseconds. */
static double sm_class_status(const binder_state *st, uint64_t out[6])
{
    double a = now();
    for(int i = 0; i < 3; i++) {
        binder_class_view v;
        binder_state_class_view(st, sm_classes[i], &v);
        out[2 * i] = v.units.free;
        out[2 * i + 1] = v.units.max_free;
    }
    return (now() - a) * 1e6;
}

static size_t sm_class_changes(const uint64_t before[6], const uint64_t after[6])
{
    size_t n = 0;
    for(int i = 0; i < 3; i++)
        n += before[2 * i] != after[2 * i] || before[2 * i + 1] != after[2 * i + 1];
    return n;
}

/* --instructions: the build's phases are counted by callgrind, each in
 * its own dump named "<phase> <claims>" (bench/binder-growth.sh reads
 * them); the VMIs' phase counts only the reconcile that attaches them. */
static int instr_mode;

static void phase_begin(void)
{
    if(instr_mode)
        CALLGRIND_TOGGLE_COLLECT;
}

static void phase_end(const char *name)
{
    if(instr_mode) {
        CALLGRIND_TOGGLE_COLLECT;
        CALLGRIND_DUMP_STATS_AT(name);
    }
}

/* Builds the state of cluster c into r (claims, VMs, first reconcile,
 * half the placed sets' VMIs running); the three phases' times in ms. */
static void sm_build(smrun *r, double *load_ms, double *first_ms, double *vmis_ms, size_t *placed, size_t *ran)
{
    cluster *c = r->c;
    cozy_err err = {0};
    binder_rc rc;
    char phase[64];
    double t0 = now();
    phase_begin();
    r->st = binder_state_new();
    if(!r->st)
        sm_die(BINDER_ERR_MEMORY, NULL, "state");
    static const char *const classes[] = {L40S, H100, VG};
    for(size_t i = 0; i < 3; i++)
        if((rc = binder_state_class_set(r->st, classes[i], BINDER_CORDON_MOVE, 0, &tol_dedicated, i == 2 ? 1 : 0, &err)))
            sm_die(rc, &err, "class");
    for(size_t i = 0; i < c->nnodes; i++) {
        const nodedef *d = &c->nodes[i];
        binder_node_spec spec = {d->flags, d->offers, d->n_offers, d->tainted ? &dedicated : NULL, d->tainted ? 1u : 0u};
        if((rc = binder_state_node_set(r->st, d->name, &spec, &err)))
            sm_die(rc, &err, "node");
    }
    char vm[32];
    for(size_t i = 0; i < c->nsets; i++) {
        const setdef *s = &c->sets[i];
        const char *names[4];
        for(size_t j = 0; j < s->n; j++) {
            if((rc = binder_state_claim_add(r->st, s->refs[j].ns, s->refs[j].name, s->needs[j].class_name,
                                            s->needs[j].units, 0, &err)))
                sm_die(rc, &err, "claim");
            names[j] = s->refs[j].name;
        }
        if(s->n && (rc = binder_state_set_put(r->st, s->refs[0].ns, vm_name(vm, i), names, s->n, BINDER_VMI_NONE,
                                              NULL, &err)))
            sm_die(rc, &err, "set");
    }
    double t1 = now();
    snprintf(phase, sizeof phase, "load %zu", c->nclaims);
    phase_end(phase);
    phase_begin();
    binder_reconcile(r->st, NULL);
    double t2 = now();
    snprintf(phase, sizeof phase, "first-reconcile %zu", c->nclaims);
    phase_end(phase);
    /* half the placed sets run */
    *placed = *ran = 0;
    for(size_t i = 0; i < c->nsets; i++) {
        const setdef *s = &c->sets[i];
        binder_claim_status cs;
        r->running[i] = 0;
        if(!s->n || binder_state_claim_get(r->st, s->refs[0].ns, s->refs[0].name, &cs) || cs.phase != BINDER_BOUND)
            continue;
        (*placed)++;
        if(rnd(2) == 0)
            continue;
        if((rc = binder_state_set_vmi(r->st, s->refs[0].ns, vm_name(vm, i), BINDER_VMI_RUNNING, cs.node, &err)))
            sm_die(rc, &err, "vmi");
        r->running[i] = 1;
        (*ran)++;
    }
    phase_begin();
    binder_reconcile(r->st, NULL);
    double t3 = now();
    snprintf(phase, sizeof phase, "vmis-attached %zu", c->nclaims);
    phase_end(phase);
    *load_ms = (t1 - t0) * 1e3;
    *first_ms = (t2 - t1) * 1e3;
    *vmis_ms = (t3 - t2) * 1e3;
}

/* A node that holds the first claim of a random placed set (its index in
 * c->nodes), or -1 when none does. */
static long sm_pick_node(const smrun *r)
{
    const cluster *c = r->c;
    size_t si = rnd((uint32_t)c->nsets);
    for(size_t k = 0; k < c->nsets; k++, si = (si + 1) % c->nsets) {
        const setdef *s = &c->sets[si];
        binder_claim_status cs;
        if(s->n && !binder_state_claim_get(r->st, s->refs[0].ns, s->refs[0].name, &cs) && cs.node &&
           (cs.phase == BINDER_BOUND || cs.phase == BINDER_ATTACHED))
            return strtol(cs.node + 5, NULL, 10); /* "node-%05zu" */
    }
    return -1;
}

static void ev_put(evrec *e, double us, size_t transitions)
{
    if(e->n < e->cap)
        e->us[e->n++] = us;
    e->transitions += transitions;
}

static void sm_run_size(size_t nnodes, size_t nclaims, int events, smres *res)
{
    cluster *c = make_cluster(nnodes, nclaims);
    for(size_t i = 0; i < c->nsets; i++) /* a VM's claims are in its namespace */
        for(size_t j = 1; j < c->sets[i].n; j++)
            memcpy((char *)c->sets[i].refs[j].ns, c->sets[i].refs[0].ns, sizeof c->ns[0]);
    smrun r = {NULL, c, calloc(c->nsets, sizeof *r.running)};
    cozy_err err = {0};
    binder_rc rc;
    int builds = instr_mode ? 1 : nnodes < 10000 ? 5 : 3;
    double load[5], first[5], vmis[5];
    size_t placed = 0, ran = 0, built_bytes = 0;
    for(int b = 0; b < builds; b++) {
        if(r.st) {
            binder_state_free(r.st);
            r.st = NULL;
        }
        size_t heap0 = heap_bytes();
        sm_build(&r, &load[b], &first[b], &vmis[b], &placed, &ran);
        sm_settle(r.st);
        built_bytes = heap_bytes() - heap0;
    }
    if((rc = binder_state_verify(r.st, &err)))
        sm_die(rc, &err, "verify after build");
    memset(res, 0, sizeof *res);
    res->nodes = nnodes;
    res->claims = nclaims;
    res->load_ms = median(load, (size_t)builds);
    res->first_ms = median(first, (size_t)builds);
    res->vmis_ms = median(vmis, (size_t)builds);
    res->heap_mb = (double)built_bytes / 1e6;
    printf("%7zu claims on %6zu nodes through the state machine (medians of %d builds): loaded in %.1f ms, first "
           "reconcile placed %zu of %zu sets in %.1f ms, %zu VMIs started and attached in %.1f ms; state %.1f MB "
           "(heap in use)\n",
           nclaims, nnodes, builds, res->load_ms, placed, c->nsets, res->first_ms, ran, res->vmis_ms, res->heap_mb);
    fflush(stdout);
    evrec ev[EV_KINDS];
    for(int k = 0; k < EV_KINDS; k++)
        ev[k] = (evrec){calloc((size_t)events, sizeof(double)), 0, (size_t)events, 0};
    /* per change: the class status computation (us) and the writes */
    size_t nch = 0, cap = (size_t)events * EV_KINDS;
    double *cls_us = calloc(cap, sizeof *cls_us), *wr = calloc(cap, sizeof *wr);
    size_t max_status = 0, max_records = 0, max_classes = 0, sum_status = 0, sum_records = 0, sum_classes = 0;
    uint64_t cs_before[6], cs_after[6];
    sm_class_status(r.st, cs_before);
    sm_writes w;
    binder_hooks hw = {&w, NULL, NULL, sm_count_writes, NULL};
    double a;
    /* one timed event: the input, then binder_reconcile; its writes counted */
#define SM_EVENT(kind, input)                                                                                          \
    do {                                                                                                               \
        memset(&w, 0, sizeof w);                                                                                       \
        a = now();                                                                                                     \
        if((rc = (input)))                                                                                             \
            sm_die(rc, &err, ev_names[kind]);                                                                          \
        binder_reconcile(r.st, &hw);                                                                                   \
        ev_put(&ev[kind], (now() - a) * 1e6, w.status);                                                                \
        if((kind) == EV_ADD)                                                                                           \
            w.status++; /* a new claim gets its first status written even when it only waits */                       \
        cls_us[nch] = sm_class_status(r.st, cs_after);                                                                 \
        w.classes = sm_class_changes(cs_before, cs_after);                                                             \
        memcpy(cs_before, cs_after, sizeof cs_before);                                                                 \
        wr[nch++] = (double)(w.status + w.records + w.classes);                                                        \
        max_status = w.status > max_status ? w.status : max_status;                                                    \
        max_records = w.records > max_records ? w.records : max_records;                                               \
        max_classes = w.classes > max_classes ? w.classes : max_classes;                                               \
        sum_status += w.status, sum_records += w.records, sum_classes += w.classes;                                    \
    } while(0)
#define SM_SETTLED()                                                                                                   \
    do {                                                                                                               \
        sm_settle(r.st);                                                                                               \
        sm_class_status(r.st, cs_before);                                                                              \
    } while(0)
    char vm[32];
    for(int e = 0; e < events; e++) {
        /* a claim created and placed, then deleted */
        char ns[16], name[32];
        snprintf(ns, sizeof ns, "tenant-%03u", rnd(200));
        snprintf(name, sizeof name, "event-%d", e);
        SM_EVENT(EV_ADD, binder_state_claim_add(r.st, ns, name, VG, 1, 0, &err));
        SM_SETTLED();
        SM_EVENT(EV_DELETE, binder_state_claim_delete(r.st, ns, name, &err));
        SM_SETTLED();
        /* a node lost with its claims, then given back */
        long ni = sm_pick_node(&r);
        if(ni >= 0) {
            const nodedef *d = &c->nodes[ni];
            binder_node_spec spec = {d->flags, d->offers, d->n_offers, d->tainted ? &dedicated : NULL,
                                     d->tainted ? 1u : 0u};
            SM_EVENT(EV_LOST, binder_state_node_delete(r.st, d->name, &err));
            SM_EVENT(EV_BACK, binder_state_node_set(r.st, d->name, &spec, &err));
            SM_SETTLED();
        }
        /* a node cordoned, then uncordoned */
        if((ni = sm_pick_node(&r)) >= 0) {
            const nodedef *d = &c->nodes[ni];
            SM_EVENT(EV_CORDON, binder_state_node_flags(r.st, d->name, d->flags & ~BINDER_NODE_SCHEDULABLE, &err));
            SM_SETTLED();
            SM_EVENT(EV_UNCORDON, binder_state_node_flags(r.st, d->name, d->flags, &err));
            SM_SETTLED();
        }
        /* a node's capacity cut to half its first offer, then given back */
        if((ni = sm_pick_node(&r)) >= 0) {
            const nodedef *d = &c->nodes[ni];
            binder_offer cut[2];
            memcpy(cut, d->offers, sizeof cut);
            cut[0].units = cut[0].units / 2;
            binder_node_spec spec = {d->flags, cut, d->n_offers, d->tainted ? &dedicated : NULL, d->tainted ? 1u : 0u};
            SM_EVENT(EV_CUT, binder_state_node_set(r.st, d->name, &spec, &err));
            SM_SETTLED();
            spec.offers = d->offers;
            SM_EVENT(EV_REGROW, binder_state_node_set(r.st, d->name, &spec, &err));
            SM_SETTLED();
        }
        /* a VMI ending */
        size_t vi = rnd((uint32_t)c->nsets);
        for(size_t k = 0; k < c->nsets && !r.running[vi]; k++)
            vi = (vi + 1) % c->nsets;
        if(r.running[vi]) {
            const setdef *s = &c->sets[vi];
            binder_vmi_phase ph;
            const char *on = NULL;
            char where[32] = "";
            if(!binder_state_set_get(r.st, s->refs[0].ns, vm_name(vm, vi), &ph, &on) && on)
                snprintf(where, sizeof where, "%s", on);
            SM_EVENT(EV_VMI_END, binder_state_set_vmi(r.st, s->refs[0].ns, vm, BINDER_VMI_SUCCEEDED,
                                                      where[0] ? where : NULL, &err));
            binder_claim_status cs;
            if(!binder_state_claim_get(r.st, s->refs[0].ns, s->refs[0].name, &cs) && cs.phase == BINDER_BOUND) {
                if((rc = binder_state_set_vmi(r.st, s->refs[0].ns, vm, BINDER_VMI_RUNNING, cs.node, &err)))
                    sm_die(rc, &err, "event vmi again");
            } else {
                if((rc = binder_state_set_vmi(r.st, s->refs[0].ns, vm, BINDER_VMI_NONE, NULL, &err)))
                    sm_die(rc, &err, "event vmi removed");
                r.running[vi] = 0;
            }
            SM_SETTLED();
        }
    }
#undef SM_EVENT
#undef SM_SETTLED
    if((rc = binder_state_verify(r.st, &err)))
        sm_die(rc, &err, "verify after the events");
    /* the incremental passes left a settled state: a full pass finds nothing to do */
    size_t left = binder_reconcile_all(r.st, NULL);
    if(left) {
        fprintf(stderr, "binder bench (state): a full pass after the events made %zu transitions the incremental "
                        "passes had not\n", left);
        exit(1);
    }
    printf("        one event + binder_reconcile on the full state, median / p99 in us (claim transitions per event; "
           "%d of each kind):\n         ", events);
    for(int k = 0; k < EV_KINDS; k++) {
        res->med[k] = ev[k].n ? median(ev[k].us, ev[k].n) : 0;
        res->p99[k] = ev[k].n ? pct(ev[k].us, ev[k].n, 0.99) : 0;
        printf(" %s %.1f / %.1f (%.1f)%s", ev_names[k], res->med[k], res->p99[k],
               ev[k].n ? (double)ev[k].transitions / (double)ev[k].n : 0.0,
               k == EV_KINDS - 1 ? "; then a full pass (binder_reconcile_all) finds nothing left to do\n"
               : k == 3          ? ";\n         "
                                 : ";");
    }
    double cm = nch ? median(cls_us, nch) : 0, cp = nch ? pct(cls_us, nch, 0.99) : 0;
    double wm = nch ? median(wr, nch) : 0, wp = nch ? pct(wr, nch, 0.99) : 0;
    printf("        GPUClass status of all 3 classes after each of %zu changes: computed in %.2f / %.2f us (median / p99);"
           " the leader's writes per change %.0f / %.0f (median / p99): claim status %.2f avg (max %zu), usage records"
           " %.2f avg (max %zu), class status %.2f avg (max %zu of 3)\n",
           nch, cm, cp, wm, wp, nch ? (double)sum_status / (double)nch : 0.0, max_status,
           nch ? (double)sum_records / (double)nch : 0.0, max_records, nch ? (double)sum_classes / (double)nch : 0.0,
           max_classes);
    if(nnodes == 10000) {
        double worst = 0;
        for(int k = 0; k < EV_KINDS; k++)
            worst = res->p99[k] > worst ? res->p99[k] : worst;
        /* a change reaches the API after: the event's pass (p99 above), the
         * class status computation (p99), and at most the 250 ms gap between
         * class status writes (decision 0030); records and claim statuses are
         * written in the same flush, each one request */
        double worst_ms = worst / 1e3 + cp / 1e3 + 250;
        printf("target at 100k claims on 10k nodes, class status and records current within 1 s of a change: %s "
               "(pass p99 + status p99 + write gap = %.1f ms before the writes go out; writes per change p99 %.0f, "
               "bounded by the transitions of the change + 3 classes)\n",
               worst_ms < 1000 ? "met" : "NOT MET", worst_ms, wp);
    }
    fflush(stdout);
    free(cls_us);
    free(wr);
    for(int k = 0; k < EV_KINDS; k++)
        free(ev[k].us);
    free(r.running);
    binder_state_free(r.st);
    free_cluster(c);
}

/* The exponent k of cost ~ n^k between two sizes (n the claims). */
static double growth_exp(double cost_a, double cost_b, size_t n_a, size_t n_b)
{
    return cost_a > 0 && cost_b > 0 ? log(cost_b / cost_a) / log((double)n_b / (double)n_a) : 0;
}

/* The exponent n log n has between those sizes. */
static double nlogn_exp(size_t n_a, size_t n_b)
{
    double a = (double)n_a * log((double)n_a), b = (double)n_b * log((double)n_b);
    return log(b / a) / log((double)n_b / (double)n_a);
}

/* The growth between the state machine's sizes, and its targets at the
 * largest: builds no worse than n log n, every event kind under 1 ms p99,
 * the process's peak RSS under 100 MiB. */
static void sm_report(const smres *res, size_t n)
{
    printf("how the state machine's cost grows (each size against the one before, 10x the nodes and claims; the "
           "exponent k of n^k, beside the one n log n has):\n");
    int builds_ok = 1;
    for(size_t i = 1; i < n; i++) {
        const smres *x = &res[i - 1], *y = &res[i];
        double ref = nlogn_exp(x->claims, y->claims);
        double el = growth_exp(x->load_ms, y->load_ms, x->claims, y->claims);
        double ef = growth_exp(x->first_ms, y->first_ms, x->claims, y->claims);
        double ev = growth_exp(x->vmis_ms, y->vmis_ms, x->claims, y->claims);
        if(y->nodes >= 1000 && (el > ref || ef > ref || ev > ref))
            builds_ok = 0;
        printf("  %6zu -> %6zu nodes (n log n: %.2f): load %.2f, first reconcile %.2f, VMIs started %.2f, state "
               "memory %.2f; one event's p99 x",
               x->nodes, y->nodes, ref, el, ef, ev, growth_exp(x->heap_mb, y->heap_mb, x->claims, y->claims));
        for(int k = 0; k < EV_KINDS; k++)
            printf("%s %s %.2f", k ? "," : "", ev_names[k], x->p99[k] > 0 ? y->p99[k] / x->p99[k] : 0.0);
        printf("\n");
    }
    const smres *big = &res[n - 1];
    if(n < 3 || big->nodes != 10000)
        return;
    double worst = 0;
    int wk = 0;
    for(int k = 0; k < EV_KINDS; k++)
        if(big->p99[k] > worst)
            worst = big->p99[k], wk = k;
    printf("target at 100k claims on 10k nodes, every event kind (with its reconcile) under 1 ms p99: %s (the slowest, "
           "%s, %.1f us)\n",
           worst < 1000 ? "met" : "NOT MET", ev_names[wk], worst);
    printf("target, building the state grows no worse than n log n from 1k to 100k claims (load, first reconcile, "
           "VMIs started), in time: %s; in instructions: bench/binder-growth.sh (make bench-binder runs it)\n",
           builds_ok ? "met"
                     : "NOT MET (exponents above; the state outgrows the CPU caches between 10k and 100k claims, "
                       "and each lookup waits on memory)");
    double rss = (double)peak_rss_kib() / 1024.0;
    printf("target, peak RSS of this whole process under 100 MiB at 100k claims on 10k nodes: %s (%.1f MiB, with "
           "the bench's own cluster description; the state %.1f MB of it)\n",
           rss < 100 ? "met" : "NOT MET", rss, big->heap_mb);
}

int main(int argc, char **argv)
{
    uint64_t seed = 0;
    int runs = 5, events = 1000;
    size_t max_nodes = 10000, state_max_nodes = 10000;
    int state_events = 200;
    for(int i = 1; i < argc; i++) {
        if(!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if(!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if(!strcmp(argv[i], "--events") && i + 1 < argc)
            events = atoi(argv[++i]);
        else if(!strcmp(argv[i], "--max-nodes") && i + 1 < argc)
            max_nodes = strtoull(argv[++i], NULL, 10);
        else if(!strcmp(argv[i], "--state-max-nodes") && i + 1 < argc)
            state_max_nodes = strtoull(argv[++i], NULL, 10);
        else if(!strcmp(argv[i], "--state-events") && i + 1 < argc)
            state_events = atoi(argv[++i]);
        else if(!strcmp(argv[i], "--instructions"))
            instr_mode = 1;
        else {
            fprintf(stderr, "usage: %s [--seed N] [--runs N] [--events N] [--max-nodes N] [--state-max-nodes N] [--state-events N] [--instructions]\n",
                    argv[0]);
            return 2;
        }
    }
    if(runs < 1 || events < 1) {
        fprintf(stderr, "--runs and --events take a number above 0\n");
        return 2;
    }
    if(!seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
        if(!seed)
            seed = 1;
    }
    if(instr_mode && !RUNNING_ON_VALGRIND) {
        fprintf(stderr, "--instructions: run under valgrind --tool=callgrind --collect-atstart=no "
                        "(bench/binder-growth.sh does)\n");
        return 2;
    }
    printf("binder index bench: seed %" PRIu64 " (--seed %" PRIu64 " replays it)\n", seed, seed);
    result r[8];
    size_t nr = 0;
    for(size_t n = 100; n <= max_nodes && nr < 8 && !instr_mode; n *= 10) {
        rng = seed + n; /* each size its own stream, the same for every run */
        run_size(n, n * 10, n < 10000 ? runs * 5 : runs, events, &r[nr++]);
    }
    printf("how the cost grows with N (each size against the one before, 10x the nodes and claims):\n");
    for(size_t i = 1; i < nr; i++)
        printf("  %6zu -> %6zu nodes: placing all x%.1f (per placement x%.2f), claim added x%.2f, node lost x%.2f, "
               "index memory x%.1f\n",
               r[i - 1].nodes, r[i].nodes, r[i].place_s / r[i - 1].place_s,
               (r[i].place_s / (double)r[i].claims) / (r[i - 1].place_s / (double)r[i - 1].claims),
               r[i].add_med_us / r[i - 1].add_med_us, r[i].lost_med_us / r[i - 1].lost_med_us,
               (double)r[i].index_bytes / (double)r[i - 1].index_bytes);
    const result *big = nr ? &r[nr - 1] : NULL;
    if(big && big->nodes == 10000) {
        printf("targets at 100k claims on 10k nodes: placed in under 2 s: %s (%.3f s); one event under 1 ms: %s "
               "(claim added p99 %.1f us, node lost p99 %.1f us); memory under 200 MB: %s (peak RSS %.1f MB)\n",
               big->place_s < 2 ? "met" : "NOT MET", big->place_s,
               big->add_p99_us < 1000 && big->lost_p99_us < 1000 ? "met" : "NOT MET", big->add_p99_us,
               big->lost_p99_us, big->rss_kib < 200 * 1024 ? "met" : "NOT MET", (double)big->rss_kib / 1024.0);
    }
    if(state_events < 1) {
        fprintf(stderr, "--state-events takes a number above 0\n");
        return 2;
    }
    printf("the binder's state machine (binder.h: claims, sets, VMIs, the rules) over the same clusters, "
           "seed %" PRIu64 ":\n", seed);
    smres sr[8];
    size_t nsr = 0;
    for(size_t n = 100; n <= state_max_nodes && nsr < 8; n *= 10) {
        rng = seed + n;
        sm_run_size(n, n * 10, n < 10000 ? state_events * 5 : state_events, &sr[nsr++]);
    }
    sm_report(sr, nsr);
    return 0;
}
