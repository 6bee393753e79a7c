/* binder_check — table-driven checks of the binder's index
 * (core/binder/index.c), run under ASan/UBSan by spec/core/run-binder-check.sh.
 *
 * Expected values come from the rules, not from the code's output:
 *   - DESIGN.md §6 and decision 0022: a candidate is Ready,
 *     schedulable, has no pending layout change, its gpu.cozystack.io/
 *     taints are covered by the set's tolerations (Kubernetes'
 *     ToleratesTaint; NoSchedule and NoExecute filter, PreferNoSchedule and
 *     other prefixes do not), and it has room for every class of the set;
 *     all of a set goes to ONE node;
 *   - "never two claims on more units than a node has": a bind that would
 *     overcommit is refused, a set binds all or nothing;
 *   - a capacity drop keeps the bound claims and reports the overcommit;
 *   - packing order (index.h): nodes already holding units of the class
 *     before untouched ones, fewest free units first, then the node that
 *     has waited longest at that level;
 *   - a seeded random run against a brute-force model of the same rules
 *     (every node scanned), with binder_verify after every step.
 *
 * Usage: binder_check [STEPS]   Prints "N passed, N failed", exit 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "binder/index.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static void eq_rc(binder_rc got, binder_rc want, const char *what)
{
    char d[160];
    snprintf(d, sizeof d, "got %s, want %s", binder_strerror(got), binder_strerror(want));
    ok(got == want, what, got == want ? NULL : d);
}

static void eq_u(uint64_t got, uint64_t want, const char *what)
{
    char d[96];
    snprintf(d, sizeof d, "got %" PRIu64 ", want %" PRIu64, got, want);
    ok(got == want, what, got == want ? NULL : d);
}

static void eq_s(const char *got, const char *want, const char *what)
{
    char d[600];
    snprintf(d, sizeof d, "got \"%s\", want \"%s\"", got ? got : "(null)", want ? want : "(null)");
    int same = (!got && !want) || (got && want && !strcmp(got, want));
    ok(same, what, same ? NULL : d);
}

static void verified(const binder_index *ix, const char *what)
{
    cozy_err err = {{0}};
    binder_rc rc = binder_verify(ix, &err);
    ok(rc == BINDER_OK, what, rc ? err.msg : NULL);
}

/* ------------------------------------------------------------ builders */

#define F_OK (BINDER_NODE_READY | BINDER_NODE_SCHEDULABLE)

/* A node from "a:8 b:4" and up to 4 taints "key=value:Effect". */
static binder_rc node(binder_index *ix, const char *name, uint32_t flags, const char *offers, const char *taints,
                      size_t *over)
{
    binder_offer o[8];
    char ob[8][64];
    size_t no = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", offers ? offers : "");
    for(char *save = NULL, *t = strtok_r(buf, " ", &save); t && no < 8; t = strtok_r(NULL, " ", &save)) {
        char *colon = strchr(t, ':');
        *colon = 0;
        snprintf(ob[no], sizeof ob[no], "%s", t);
        o[no] = (binder_offer){ob[no], (uint32_t)strtoul(colon + 1, NULL, 10)};
        no++;
    }
    binder_taint tt[4];
    char tb[4][3][128];
    size_t nt = 0;
    snprintf(buf, sizeof buf, "%s", taints ? taints : "");
    for(char *save = NULL, *t = strtok_r(buf, " ", &save); t && nt < 4; t = strtok_r(NULL, " ", &save)) {
        char *colon = strrchr(t, ':'), *eq = strchr(t, '=');
        *colon = 0;
        if(eq)
            *eq = 0;
        snprintf(tb[nt][0], sizeof tb[nt][0], "%s", t);
        snprintf(tb[nt][1], sizeof tb[nt][1], "%s", eq ? eq + 1 : "");
        snprintf(tb[nt][2], sizeof tb[nt][2], "%s", colon + 1);
        tt[nt] = (binder_taint){tb[nt][0], tb[nt][1], tb[nt][2]};
        nt++;
    }
    binder_node_spec spec = {flags, o, no, tt, nt};
    return binder_node_upsert(ix, name, &spec, over, NULL);
}

/* The candidates for needs "a:1 b:2" as "n1 n2 ...". */
static const char *cands(const binder_index *ix, const char *needs, const binder_toleration *tol, size_t ntol,
                         size_t max, size_t max_examined, binder_rc *rcp)
{
    static char out[1024];
    binder_need nd[8];
    char nb[8][64];
    size_t n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", needs);
    for(char *save = NULL, *t = strtok_r(buf, " ", &save); t && n < 8; t = strtok_r(NULL, " ", &save)) {
        char *colon = strchr(t, ':');
        *colon = 0;
        snprintf(nb[n], sizeof nb[n], "%s", t);
        nd[n] = (binder_need){nb[n], (uint32_t)strtoul(colon + 1, NULL, 10)};
        n++;
    }
    binder_candidate c[64];
    size_t got = 0;
    binder_query q = {nd, n, tol, ntol, max_examined};
    binder_rc rc = binder_candidates_set(ix, &q, c, max < 64 ? max : 64, &got);
    if(rcp)
        *rcp = rc;
    out[0] = 0;
    size_t at = 0;
    for(size_t i = 0; i < got; i++)
        at += (size_t)snprintf(out + at, sizeof out - at, "%s%s", i ? " " : "", c[i].node);
    return out;
}

static binder_rc claim(binder_index *ix, const char *name, const char *cls, uint32_t count)
{
    return binder_claim_upsert(ix, "tenant-a", name, cls, count, NULL);
}

static binder_rc bind(binder_index *ix, const char *name, const char *nodename)
{
    return binder_bind(ix, "tenant-a", name, nodename, 0, NULL);
}

static binder_slot_view slot(const binder_index *ix, const char *n, const char *cls)
{
    binder_slot_view v = {0, 0};
    binder_node_slot(ix, n, cls, &v);
    return v;
}

/* -------------------------------------------------------- packing order */

static const binder_toleration tol_maint_exists[] = {{"gpu.cozystack.io/maintenance", "Exists", NULL, NULL}};
static const binder_toleration tol_maint_yes[] = {{"gpu.cozystack.io/maintenance", "Equal", "yes", NULL}};
static const binder_toleration tol_maint_no[] = {{"gpu.cozystack.io/maintenance", "Equal", "no", NULL}};
static const binder_toleration tol_maint_default_op[] = {{"gpu.cozystack.io/maintenance", NULL, "yes", "NoSchedule"}};
static const binder_toleration tol_maint_noexec[] = {{"gpu.cozystack.io/maintenance", "Exists", NULL, "NoExecute"}};
static const binder_toleration tol_all[] = {{NULL, "Exists", NULL, NULL}};
static const binder_toleration tol_other_key[] = {{"gpu.cozystack.io/other", "Exists", NULL, NULL}};

struct cand_case {
    const char *what;
    const char *needs;
    const binder_toleration *tol;
    size_t ntol;
    size_t max;
    const char *want;
};

static void check_packing(void)
{
    binder_index *ix = binder_new();
    /* n1..n4 as DESIGN §6 candidates; n5 full; n6 cordoned; n7 NotReady;
     * n8 layout pending; n9 tainted; n10 PreferNoSchedule only; n11 a taint
     * that is not ours */
    eq_rc(node(ix, "n1", F_OK, "a:8", NULL, NULL), BINDER_OK, "packing: n1");
    eq_rc(node(ix, "n2", F_OK, "a:8", NULL, NULL), BINDER_OK, "packing: n2");
    eq_rc(node(ix, "n3", F_OK, "a:2", NULL, NULL), BINDER_OK, "packing: n3");
    eq_rc(node(ix, "n4", F_OK, "a:8", NULL, NULL), BINDER_OK, "packing: n4");
    eq_rc(node(ix, "n5", F_OK, "a:4", NULL, NULL), BINDER_OK, "packing: n5");
    eq_rc(node(ix, "n6", BINDER_NODE_READY, "a:8", NULL, NULL), BINDER_OK, "packing: n6 cordoned");
    eq_rc(node(ix, "n7", BINDER_NODE_SCHEDULABLE, "a:8", NULL, NULL), BINDER_OK, "packing: n7 NotReady");
    eq_rc(node(ix, "n8", F_OK | BINDER_NODE_LAYOUT_PENDING, "a:8", NULL, NULL), BINDER_OK, "packing: n8 pending");
    eq_rc(node(ix, "n9", F_OK, "a:8", "gpu.cozystack.io/maintenance=yes:NoSchedule", NULL), BINDER_OK,
          "packing: n9 tainted");
    eq_rc(node(ix, "n10", F_OK, "a:8", "gpu.cozystack.io/drain=soon:PreferNoSchedule", NULL), BINDER_OK,
          "packing: n10 PreferNoSchedule");
    eq_rc(node(ix, "n11", F_OK, "a:8", "example.com/dedicated=x:NoSchedule", NULL), BINDER_OK,
          "packing: n11 foreign taint");
    eq_rc(claim(ix, "c1", "a", 6), BINDER_OK, "packing: claim c1");
    eq_rc(claim(ix, "c2", "a", 3), BINDER_OK, "packing: claim c2");
    eq_rc(claim(ix, "c5", "a", 4), BINDER_OK, "packing: claim c5");
    eq_rc(bind(ix, "c1", "n1"), BINDER_OK, "packing: c1 on n1 (free 2)");
    eq_rc(bind(ix, "c2", "n2"), BINDER_OK, "packing: c2 on n2 (free 5)");
    eq_rc(bind(ix, "c5", "n5"), BINDER_OK, "packing: c5 on n5 (free 0)");
    verified(ix, "packing: verify after setup");

    static const struct cand_case cases[] = {
        {"1 unit: used nodes by free, then whole ones by free", "a:1", NULL, 0, 16, "n1 n2 n3 n4 n10 n11"},
        {"3 units: n1 and n3 too small", "a:3", NULL, 0, 16, "n2 n4 n10 n11"},
        {"6 units: whole nodes only", "a:6", NULL, 0, 16, "n4 n10 n11"},
        {"9 units: no node offers them", "a:9", NULL, 0, 16, ""},
        {"bounded: max 2", "a:1", NULL, 0, 2, "n1 n2"},
        {"max 0", "a:1", NULL, 0, 0, ""},
        {"unknown class", "z:1", NULL, 0, 16, ""},
        {"tolerated by Exists: tainted pool after the untainted one", "a:8", tol_maint_exists, 1, 16,
         "n4 n10 n11 n9"},
        {"tolerated by Equal yes", "a:8", tol_maint_yes, 1, 16, "n4 n10 n11 n9"},
        {"Equal no does not tolerate value yes", "a:8", tol_maint_no, 1, 16, "n4 n10 n11"},
        {"empty operator is Equal, effect NoSchedule matches", "a:8", tol_maint_default_op, 1, 16,
         "n4 n10 n11 n9"},
        {"effect NoExecute does not tolerate NoSchedule", "a:8", tol_maint_noexec, 1, 16, "n4 n10 n11"},
        {"empty key with Exists tolerates everything", "a:8", tol_all, 1, 16, "n4 n10 n11 n9"},
        {"another key does not tolerate", "a:8", tol_other_key, 1, 16, "n4 n10 n11"},
    };
    for(size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[160];
        snprintf(what, sizeof what, "packing: %s", cases[i].what);
        binder_rc rc;
        eq_s(cands(ix, cases[i].needs, cases[i].tol, cases[i].ntol, cases[i].max, 0, &rc), cases[i].want, what);
        eq_rc(rc, BINDER_OK, what);
    }

    /* flag changes move nodes out and back; back in, a node waits behind
     * the others at its level */
    eq_rc(binder_node_set_flags(ix, "n4", BINDER_NODE_READY), BINDER_OK, "cordon n4");
    eq_s(cands(ix, "a:6", NULL, 0, 16, 0, NULL), "n10 n11", "cordoned n4 is no candidate");
    eq_rc(binder_node_set_flags(ix, "n4", F_OK), BINDER_OK, "uncordon n4");
    eq_s(cands(ix, "a:6", NULL, 0, 16, 0, NULL), "n10 n11 n4", "uncordoned n4 comes back last at its level");
    eq_rc(binder_node_set_flags(ix, "n7", F_OK), BINDER_OK, "n7 Ready");
    eq_rc(binder_node_set_flags(ix, "n8", F_OK), BINDER_OK, "n8 layout applied");
    eq_rc(binder_node_set_flags(ix, "n6", F_OK), BINDER_OK, "n6 uncordoned");
    eq_s(cands(ix, "a:6", NULL, 0, 16, 0, NULL), "n10 n11 n4 n7 n8 n6", "returned nodes in the order they came back");
    eq_rc(binder_node_set_flags(ix, "n7", BINDER_NODE_SCHEDULABLE), BINDER_OK, "n7 NotReady again");
    eq_rc(binder_node_set_flags(ix, "n8", F_OK | BINDER_NODE_LAYOUT_PENDING), BINDER_OK, "n8 pending again");
    eq_rc(binder_node_set_flags(ix, "n6", BINDER_NODE_READY), BINDER_OK, "n6 cordoned again");
    eq_s(cands(ix, "a:6", NULL, 0, 16, 0, NULL), "n10 n11 n4", "NotReady, pending, cordoned: out again");
    eq_rc(binder_node_set_flags(ix, "nope", F_OK), BINDER_ERR_NO_NODE, "flags of an unknown node");
    /* a taint added by upsert moves the node to the tainted pool */
    eq_rc(node(ix, "n10", F_OK, "a:8", "gpu.cozystack.io/maintenance=yes:NoExecute", NULL), BINDER_OK,
          "n10 gets a NoExecute taint");
    eq_s(cands(ix, "a:6", NULL, 0, 16, 0, NULL), "n11 n4", "NoExecute-tainted n10 is out");
    eq_s(cands(ix, "a:6", tol_maint_noexec, 1, 16, 0, NULL), "n11 n4 n10", "... unless tolerated");
    /* binding moves a whole node to the used group */
    eq_rc(claim(ix, "c6", "a", 1), BINDER_OK, "claim c6");
    eq_rc(bind(ix, "c6", "n11"), BINDER_OK, "c6 on n11");
    eq_s(cands(ix, "a:1", NULL, 0, 16, 0, NULL), "n1 n2 n11 n3 n4", "n11 now used (free 7), before whole nodes");
    binder_candidate c[4];
    size_t n = 0;
    eq_rc(binder_candidates(ix, "a", 7, NULL, 0, c, 4, &n), BINDER_OK, "one-class candidates");
    eq_u(n, 2, "one-class candidates: count");
    eq_s(n ? c[0].node : NULL, "n11", "one-class candidates: first");
    eq_u(n ? c[0].free : 0, 7, "candidate free units");
    eq_u(n ? c[0].bound : 0, 1, "candidate bound units");
    eq_u(n ? c[0].offered : 0, 8, "candidate offered units");
    binder_rc rc;
    cands(ix, "a:0", NULL, 0, 16, 0, &rc);
    eq_rc(rc, BINDER_ERR_INPUT, "0 units is refused");
    cands(ix, "a:5000", NULL, 0, 16, 0, &rc);
    eq_rc(rc, BINDER_ERR_INPUT, "units above the ceiling are refused");
    verified(ix, "packing: verify at the end");
    binder_free(ix);
}

/* ------------------------------------------------------ no overcommit */

static void check_no_overcommit(void)
{
    binder_index *ix = binder_new();
    eq_rc(node(ix, "m1", F_OK, "a:4", NULL, NULL), BINDER_OK, "m1 offers 4");
    eq_rc(node(ix, "m2", F_OK, "a:3", NULL, NULL), BINDER_OK, "m2 offers 3");
    eq_rc(claim(ix, "c1", "a", 3), BINDER_OK, "c1: 3");
    eq_rc(claim(ix, "c2", "a", 2), BINDER_OK, "c2: 2");
    eq_rc(claim(ix, "c3", "a", 1), BINDER_OK, "c3: 1");
    eq_rc(claim(ix, "c4", "a", 2), BINDER_OK, "c4: 2");
    eq_rc(claim(ix, "c5", "a", 2), BINDER_OK, "c5: 2");
    eq_rc(bind(ix, "c1", "m1"), BINDER_OK, "c1 on m1: 3 of 4");
    eq_rc(bind(ix, "c2", "m1"), BINDER_ERR_NO_ROOM, "c2 on m1: 5 of 4 refused");
    binder_claim_view v;
    eq_rc(binder_claim_get(ix, "tenant-a", "c2", &v), BINDER_OK, "c2 known");
    eq_s(v.node, NULL, "refused c2 stays unbound");
    eq_u(slot(ix, "m1", "a").bound, 3, "m1 holds 3");
    eq_rc(bind(ix, "c3", "m1"), BINDER_OK, "c3 on m1: 4 of 4");
    eq_s(cands(ix, "a:1", NULL, 0, 16, 0, NULL), "m2", "full m1 is no candidate");
    eq_rc(bind(ix, "c1", "m2"), BINDER_ERR_BOUND, "a bound claim is not bound twice");
    /* a set binds all or nothing */
    binder_claim_ref set[] = {{"tenant-a", "c4"}, {"tenant-a", "c5"}};
    cozy_err err = {{0}};
    eq_rc(binder_bind_set(ix, set, 2, "m2", 0, &err), BINDER_ERR_NO_ROOM, "set of 2+2 on m2 (3) refused");
    eq_s(err.msg, "bind: node m2 has 3 free units of class a, the set needs 4", "the refusal names node and class");
    eq_u(slot(ix, "m2", "a").bound, 0, "nothing of the refused set is bound");
    eq_rc(binder_claim_get(ix, "tenant-a", "c4", &v), BINDER_OK, "c4 known");
    eq_s(v.node, NULL, "c4 unbound after the refused set");
    binder_claim_ref twice[] = {{"tenant-a", "c4"}, {"tenant-a", "c4"}};
    eq_rc(binder_bind_set(ix, twice, 2, "m2", 0, NULL), BINDER_ERR_BOUND, "a claim named twice in a set");
    binder_claim_ref ghost[] = {{"tenant-a", "c4"}, {"tenant-a", "ghost"}};
    eq_rc(binder_bind_set(ix, ghost, 2, "m2", 0, NULL), BINDER_ERR_NO_CLAIM, "a set naming an unknown claim");
    eq_u(slot(ix, "m2", "a").bound, 0, "... binds nothing");
    eq_rc(binder_bind_set(ix, set, 0, "m2", 0, NULL), BINDER_ERR_INPUT, "an empty set");
    eq_rc(bind(ix, "c4", "nowhere"), BINDER_ERR_NO_NODE, "bind to an unknown node");
    eq_rc(binder_claim_upsert(ix, "tenant-b", "c4", "b", 1, NULL), BINDER_OK, "same name, other namespace");
    eq_rc(bind(ix, "c4", "m2"), BINDER_OK, "c4 on m2: 2 of 3");
    eq_rc(binder_bind(ix, "tenant-b", "c4", "m2", 0, NULL), BINDER_ERR_NO_ROOM, "m2 offers no class b");
    eq_rc(bind(ix, "c5", "m2"), BINDER_ERR_NO_ROOM, "c5 on m2: 4 of 3 refused");
    eq_rc(binder_unbind(ix, "tenant-a", "c1"), BINDER_OK, "unbind c1");
    eq_rc(binder_unbind(ix, "tenant-a", "c1"), BINDER_ERR_NOT_BOUND, "unbind c1 twice");
    eq_u(slot(ix, "m1", "a").bound, 1, "m1 holds 1 after c1 left");
    eq_s(cands(ix, "a:3", NULL, 0, 16, 0, NULL), "m1", "m1 has room for 3 again");
    eq_rc(bind(ix, "c5", "m1"), BINDER_OK, "c5 on m1");
    eq_rc(binder_claim_delete(ix, "tenant-a", "c5"), BINDER_OK, "delete bound c5");
    eq_u(slot(ix, "m1", "a").bound, 1, "deleting a bound claim frees its units");
    eq_rc(binder_claim_delete(ix, "tenant-a", "c5"), BINDER_ERR_NO_CLAIM, "delete c5 twice");
    /* claims: spec immutable, bad input */
    eq_rc(claim(ix, "c3", "a", 1), BINDER_OK, "recording c3 again unchanged");
    eq_rc(claim(ix, "c3", "a", 2), BINDER_ERR_CHANGED, "c3 with another count");
    eq_rc(claim(ix, "c3", "b", 1), BINDER_ERR_CHANGED, "c3 with another class");
    eq_rc(claim(ix, "c9", "a", 0), BINDER_ERR_INPUT, "count 0");
    eq_rc(claim(ix, "c9", "a", BINDER_MAX_UNITS + 1), BINDER_ERR_INPUT, "count above the ceiling");
    eq_rc(claim(ix, "", "a", 1), BINDER_ERR_INPUT, "empty claim name");
    eq_rc(claim(ix, "c9", "", 1), BINDER_ERR_INPUT, "empty class");
    char longns[80];
    memset(longns, 'n', 64);
    longns[64] = 0;
    eq_rc(binder_claim_upsert(ix, longns, "c9", "a", 1, NULL), BINDER_ERR_INPUT, "namespace of 64 characters");
    longns[63] = 0;
    eq_rc(binder_claim_upsert(ix, longns, "c9", "a", 1, NULL), BINDER_OK, "namespace of 63 characters");
    eq_rc(binder_unbind(ix, "tenant-a", "ghost"), BINDER_ERR_NO_CLAIM, "unbind an unknown claim");
    binder_stats st;
    binder_stats_get(ix, &st);
    eq_u(st.claims, 6, "claims known");
    eq_u(st.bound, 2, "claims bound (c3 on m1, c4 on m2)");
    eq_u(st.overcommit, 0, "no overcommit");
    verified(ix, "no overcommit: verify");
    binder_free(ix);
}

/* ------------------------------------------------------ capacity drop */

struct acc {
    char out[256];
    size_t at;
};

static void acc_name(void *ud, const binder_claim_view *c)
{
    struct acc *a = ud;
    a->at += (size_t)snprintf(a->out + a->at, sizeof a->out - a->at, "%s%s", a->at ? " " : "", c->name);
}

/* The names of the claims bound on node n, as binder_node_claims walks them. */
static const char *claims_of(const binder_index *ix, const char *n)
{
    static struct acc a;
    a.out[0] = 0;
    a.at = 0;
    binder_node_claims(ix, n, acc_name, &a);
    return a.out;
}

struct lost {
    char names[256];
    size_t at;
    int unbound_seen;
};

static void on_unbound(void *ud, const binder_claim_view *c)
{
    struct lost *l = ud;
    l->at += (size_t)snprintf(l->names + l->at, sizeof l->names - l->at, "%s%s", l->at ? " " : "", c->name);
    l->unbound_seen += c->node == NULL;
}

static void check_capacity_drop(void)
{
    binder_index *ix = binder_new();
    size_t over = 99;
    eq_rc(node(ix, "k1", F_OK, "a:8", NULL, &over), BINDER_OK, "k1 offers 8");
    eq_u(over, 0, "no overcommit on a new node");
    eq_rc(node(ix, "k2", F_OK, "a:8", NULL, NULL), BINDER_OK, "k2 offers 8");
    eq_rc(claim(ix, "x", "a", 3), BINDER_OK, "x: 3");
    eq_rc(claim(ix, "y", "a", 3), BINDER_OK, "y: 3");
    eq_rc(claim(ix, "z", "a", 1), BINDER_OK, "z: 1");
    eq_rc(bind(ix, "x", "k1"), BINDER_OK, "x on k1");
    eq_rc(bind(ix, "y", "k1"), BINDER_OK, "y on k1");
    eq_rc(node(ix, "k1", F_OK, "a:4", NULL, &over), BINDER_OK, "k1 drops to 4 (6 bound)");
    eq_u(over, 1, "the drop reports one overcommitted class");
    eq_u(slot(ix, "k1", "a").offered, 4, "k1 offers 4");
    eq_u(slot(ix, "k1", "a").bound, 6, "k1 still holds 6: no claim lost");
    eq_s(claims_of(ix, "k1"), "y x", "both claims still on k1, most recent first");
    binder_stats st;
    binder_stats_get(ix, &st);
    eq_u(st.overcommit, 1, "stats count the overcommit");
    eq_s(cands(ix, "a:1", NULL, 0, 16, 0, NULL), "k2", "an overcommitted node is no candidate");
    eq_rc(bind(ix, "z", "k1"), BINDER_ERR_NO_ROOM, "no bind on an overcommitted node");
    verified(ix, "capacity drop: verify");
    /* the caller picks the claim that goes Lost */
    eq_rc(binder_unbind(ix, "tenant-a", "y"), BINDER_OK, "caller unbinds y (Lost)");
    binder_stats_get(ix, &st);
    eq_u(st.overcommit, 0, "overcommit gone");
    eq_s(cands(ix, "a:1", NULL, 0, 16, 0, NULL), "k1 k2", "k1 (free 1, used) before untouched k2");
    /* the class disappears from the node: its claims stay, offer 0 */
    eq_rc(node(ix, "k1", F_OK, "b:2", NULL, &over), BINDER_OK, "k1 now offers only class b");
    eq_u(over, 1, "class a overcommitted (0 offered, 3 bound)");
    eq_u(slot(ix, "k1", "a").offered, 0, "a: 0 offered");
    eq_u(slot(ix, "k1", "a").bound, 3, "a: 3 still bound");
    eq_u(slot(ix, "k1", "b").offered, 2, "b: 2 offered");
    verified(ix, "class gone: verify");
    /* capacity back */
    eq_rc(node(ix, "k1", F_OK, "a:8 b:2", NULL, &over), BINDER_OK, "k1 offers a again");
    eq_u(over, 0, "no overcommit");
    eq_s(cands(ix, "a:5", NULL, 0, 16, 0, NULL), "k1 k2", "k1 has 5 free again");
    /* offers of one class named twice add up; too many units refused */
    eq_rc(node(ix, "k3", F_OK, "a:4 a:4", NULL, NULL), BINDER_OK, "a named twice");
    eq_u(slot(ix, "k3", "a").offered, 8, "adds up to 8");
    eq_rc(node(ix, "k3", F_OK, "a:4096 a:1", NULL, NULL), BINDER_ERR_INPUT, "4097 units refused");
    eq_u(slot(ix, "k3", "a").offered, 8, "a refused upsert changes nothing");
    eq_rc(node(ix, "k3", F_OK, "a:8", "gpu.cozystack.io/x=y:Sometimes", NULL), BINDER_ERR_INPUT, "a bad effect");
    eq_rc(node(ix, "", F_OK, "a:8", NULL, NULL), BINDER_ERR_INPUT, "an empty node name");
    /* node lost: its claims unbound and reported */
    eq_rc(bind(ix, "z", "k1"), BINDER_OK, "z on k1");
    struct lost l = {{0}, 0, 0};
    eq_rc(binder_node_delete(ix, "k1", on_unbound, &l), BINDER_OK, "delete k1");
    eq_s(l.names, "z x", "its claims reported");
    eq_u((uint64_t)l.unbound_seen, 2, "reported unbound");
    binder_claim_view v;
    eq_rc(binder_claim_get(ix, "tenant-a", "x", &v), BINDER_OK, "x still known");
    eq_s(v.node, NULL, "x unbound");
    eq_rc(binder_node_delete(ix, "k1", NULL, NULL), BINDER_ERR_NO_NODE, "delete k1 twice");
    binder_stats_get(ix, &st);
    eq_u(st.nodes, 2, "two nodes left");
    eq_u(st.bound, 0, "nothing bound");
    eq_u(st.listed, 2, "k2 and k3 listed");
    verified(ix, "node lost: verify");
    /* rebuilding from the API: RESTORE records what the status says */
    eq_rc(node(ix, "r1", BINDER_NODE_SCHEDULABLE, "a:2", NULL, NULL), BINDER_OK, "r1 NotReady, offers 2");
    eq_rc(binder_bind(ix, "tenant-a", "x", "r1", BINDER_BIND_RESTORE, NULL), BINDER_OK, "restore x (3) on r1 (2)");
    eq_u(slot(ix, "r1", "a").bound, 3, "restored past the offer");
    eq_rc(binder_claim_upsert(ix, "tenant-a", "w", "b", 2, NULL), BINDER_OK, "w of class b");
    eq_rc(binder_bind(ix, "tenant-a", "w", "r1", BINDER_BIND_RESTORE, NULL), BINDER_OK,
          "restore w on r1, which offers no b");
    eq_u(slot(ix, "r1", "b").bound, 2, "b bound 2 on r1");
    binder_stats_get(ix, &st);
    eq_u(st.overcommit, 2, "both restored classes overcommitted");
    eq_rc(bind(ix, "z", "k2"), BINDER_OK, "bind checks room, not candidacy: z on k2");
    verified(ix, "restore: verify");
    binder_free(ix);
}

/* -------------------------------------------------- sets across classes */

static void check_sets(void)
{
    binder_index *ix = binder_new();
    eq_rc(node(ix, "s1", F_OK, "a:8", NULL, NULL), BINDER_OK, "s1: a 8");
    eq_rc(node(ix, "s2", F_OK, "a:2 b:4", NULL, NULL), BINDER_OK, "s2: a 2, b 4");
    eq_rc(node(ix, "s3", F_OK, "a:4 b:1", NULL, NULL), BINDER_OK, "s3: a 4, b 1");
    eq_rc(node(ix, "s4", BINDER_NODE_READY, "a:4 b:4", NULL, NULL), BINDER_OK, "s4: cordoned");
    eq_rc(node(ix, "s5", F_OK, "b:8", NULL, NULL), BINDER_OK, "s5: b 8");
    static const struct cand_case cases[] = {
        {"a2+b2: only s2 has both", "a:2 b:2", NULL, 0, 16, "s2"},
        {"a1+b1: s2 and s3, by free a", "a:1 b:1", NULL, 0, 16, "s2 s3"},
        {"needs of a class add up: a1+a1+b1", "a:1 a:1 b:1", NULL, 0, 16, "s2 s3"},
        {"a5+b1: the node with 5 a has no b", "a:5 b:1", NULL, 0, 16, ""},
        {"b4 drives (fewer nodes), a1 checked", "a:1 b:4", NULL, 0, 16, "s2"},
        {"a class no node offers", "a:1 z:1", NULL, 0, 16, ""},
    };
    for(size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[160];
        snprintf(what, sizeof what, "sets: %s", cases[i].what);
        eq_s(cands(ix, cases[i].needs, NULL, 0, cases[i].max, 0, NULL), cases[i].want, what);
    }
    eq_s(cands(ix, "a:1 b:1", NULL, 0, 16, 1, NULL), "s2", "max_examined 1 stops after one node");
    /* s1 (class a only) used, free 1: first in a's packing order, yet a
     * two-class set never examines it (its shape lacks b) */
    eq_rc(binder_claim_upsert(ix, "vm", "big-a", "a", 7, NULL), BINDER_OK, "claim big-a: a 7");
    eq_rc(binder_bind(ix, "vm", "big-a", "s1", 0, NULL), BINDER_OK, "big-a on s1");
    eq_s(cands(ix, "a:1", NULL, 0, 16, 0, NULL), "s1 s2 s3", "s1 first for class a alone");
    eq_s(cands(ix, "a:1 b:1", NULL, 0, 16, 1, NULL), "s2", "a two-class set skips s1 without examining it");
    binder_stats sst;
    binder_stats_get(ix, &sst);
    eq_u(sst.shapes, 4, "shapes: none (id 0), {a}, {a,b}, {b}");
    binder_need needs[] = {{"a", 1}, {"b", 1}};
    binder_query q = {needs, 2, NULL, 0, 0};
    binder_candidate c[4];
    size_t n = 0;
    eq_rc(binder_candidates_set(ix, &q, c, 4, &n), BINDER_OK, "set query");
    eq_u(n ? c[0].free : 0, 6, "s2's free units add up over the set's classes (2 + 4)");
    eq_u(n ? c[0].offered : 0, 6, "... and its offered units");
    eq_rc(binder_claim_upsert(ix, "vm", "gpu-a", "a", 2, NULL), BINDER_OK, "claim gpu-a: a 2");
    eq_rc(binder_claim_upsert(ix, "vm", "gpu-b", "b", 2, NULL), BINDER_OK, "claim gpu-b: b 2");
    binder_claim_ref set[] = {{"vm", "gpu-a"}, {"vm", "gpu-b"}};
    eq_rc(binder_bind_set(ix, set, 2, "s3", 0, NULL), BINDER_ERR_NO_ROOM, "the set does not fit s3 (b 1)");
    eq_u(slot(ix, "s3", "a").bound, 0, "s3: class a untouched by the refused set");
    eq_rc(binder_bind_set(ix, set, 2, "s2", 0, NULL), BINDER_OK, "the set on s2");
    eq_u(slot(ix, "s2", "a").bound, 2, "s2: a 2 bound");
    eq_u(slot(ix, "s2", "b").bound, 2, "s2: b 2 bound");
    eq_s(cands(ix, "a:1 b:1", NULL, 0, 16, 0, NULL), "s3", "s2 has no a left");
    eq_s(cands(ix, "b:2", NULL, 0, 16, 0, NULL), "s2 s5", "s2 (b used, free 2) before untouched s5");
    binder_need none[] = {{"a", 1}};
    binder_query bad = {none, 0, NULL, 0, 0};
    eq_rc(binder_candidates_set(ix, &bad, c, 4, &n), BINDER_ERR_INPUT, "a set of no needs");
    verified(ix, "sets: verify");
    binder_free(ix);
}

/* ------------------------------------------- random run against a model */

#define RN 24 /* nodes */
#define RC 3  /* classes */
#define RK 160 /* claims */

struct model {
    int exists[RN];
    uint32_t flags[RN];
    int taint[RN]; /* 0 none, 1 maintenance NoSchedule, 2 other NoExecute */
    uint32_t offered[RN][RC];
    uint32_t bound[RN][RC];
    int kclass[RK];
    uint32_t kcount[RK];
    int knode[RK]; /* -1 unbound, -2 not recorded */
};

static uint64_t rng;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static const char *cls_name[RC] = {"a", "b", "c"};
static const char *taint_of[3] = {NULL, "gpu.cozystack.io/maintenance=yes:NoSchedule", "gpu.cozystack.io/gone:NoExecute"};

static void model_node(binder_index *ix, struct model *m, int i)
{
    char name[16], offers[64] = "";
    snprintf(name, sizeof name, "n%d", i);
    size_t at = 0;
    for(int c = 0; c < RC; c++)
        if(m->offered[i][c])
            at += (size_t)snprintf(offers + at, sizeof offers - at, "%s:%u ", cls_name[c], m->offered[i][c]);
    size_t over = 0;
    binder_rc rc = node(ix, name, m->flags[i], offers, taint_of[m->taint[i]], &over);
    size_t want = 0;
    for(int c = 0; c < RC; c++)
        want += m->bound[i][c] > m->offered[i][c];
    if(rc || over != want) {
        check_failed++;
        printf("FAIL random: upsert %s: %s, overcommit %zu want %zu\n", name, binder_strerror(rc), over, want);
    }
}

static void check_random(unsigned long steps, uint64_t seed)
{
    struct model m;
    memset(&m, 0, sizeof m);
    for(int k = 0; k < RK; k++)
        m.knode[k] = -2;
    binder_index *ix = binder_new();
    rng = seed;
    int bad = 0;
    unsigned long binds = 0, sets = 0, no_room = 0, queries = 0, found = 0, overcommits = 0;
    for(unsigned long step = 0; step < steps && bad < 5; step++) {
        int before = check_failed;
        uint32_t op = rnd(100);
        int i = (int)rnd(RN), k = (int)rnd(RK);
        char nn[16], kn[16];
        snprintf(nn, sizeof nn, "n%d", i);
        snprintf(kn, sizeof kn, "k%d", k);
        if(op < 8) { /* node upsert: capacity, flags, taints */
            m.exists[i] = 1;
            m.flags[i] = rnd(8) < 6 ? F_OK : rnd(8);
            m.taint[i] = rnd(5) == 0 ? (int)rnd(3) : 0;
            for(int c = 0; c < RC; c++)
                m.offered[i][c] = rnd(3) ? rnd(9) : 0;
            model_node(ix, &m, i);
        } else if(op < 22) { /* flags only */
            uint32_t f = rnd(8);
            binder_rc rc = binder_node_set_flags(ix, nn, f);
            if((rc == BINDER_OK) != m.exists[i]) {
                check_failed++;
                printf("FAIL random step %lu: set_flags %s: %s\n", step, nn, binder_strerror(rc));
            }
            if(m.exists[i])
                m.flags[i] = f;
        } else if(op < 25) { /* node deleted */
            binder_rc rc = binder_node_delete(ix, nn, NULL, NULL);
            if((rc == BINDER_OK) != m.exists[i]) {
                check_failed++;
                printf("FAIL random step %lu: delete %s: %s\n", step, nn, binder_strerror(rc));
            }
            m.exists[i] = 0;
            memset(m.offered[i], 0, sizeof m.offered[i]);
            memset(m.bound[i], 0, sizeof m.bound[i]);
            for(int q = 0; q < RK; q++)
                if(m.knode[q] == i)
                    m.knode[q] = -1;
        } else if(op < 40) { /* claim recorded */
            if(m.knode[k] == -2) {
                m.kclass[k] = (int)rnd(RC);
                m.kcount[k] = 1 + rnd(4);
                m.knode[k] = -1;
            }
            binder_rc rc = claim(ix, kn, cls_name[m.kclass[k]], m.kcount[k]);
            if(rc) {
                check_failed++;
                printf("FAIL random step %lu: claim %s: %s\n", step, kn, binder_strerror(rc));
            }
        } else if(op < 45) { /* claim deleted */
            binder_rc rc = binder_claim_delete(ix, "tenant-a", kn);
            if((rc == BINDER_OK) != (m.knode[k] != -2)) {
                check_failed++;
                printf("FAIL random step %lu: delete claim %s: %s\n", step, kn, binder_strerror(rc));
            }
            if(m.knode[k] >= 0)
                m.bound[m.knode[k]][m.kclass[k]] -= m.kcount[k];
            m.knode[k] = -2;
        } else if(op < 55) { /* unbind */
            binder_rc rc = binder_unbind(ix, "tenant-a", kn);
            binder_rc want = m.knode[k] == -2 ? BINDER_ERR_NO_CLAIM : m.knode[k] == -1 ? BINDER_ERR_NOT_BOUND : 0;
            if(rc != want) {
                check_failed++;
                printf("FAIL random step %lu: unbind %s: %s\n", step, kn, binder_strerror(rc));
            }
            if(m.knode[k] >= 0) {
                m.bound[m.knode[k]][m.kclass[k]] -= m.kcount[k];
                m.knode[k] = -1;
            }
        } else if(op < 75) { /* bind to a random node or the first candidate: refused exactly when the rules say */
            if(m.knode[k] == -1 && rnd(2)) {
                binder_candidate first;
                size_t n = 0;
                binder_candidates(ix, cls_name[m.kclass[k]], m.kcount[k], NULL, 0, &first, 1, &n);
                if(n) {
                    i = atoi(first.node + 1);
                    snprintf(nn, sizeof nn, "n%d", i);
                }
            }
            binder_rc rc = bind(ix, kn, nn);
            binder_rc want;
            if(!m.exists[i])
                want = BINDER_ERR_NO_NODE;
            else if(m.knode[k] == -2)
                want = BINDER_ERR_NO_CLAIM;
            else if(m.knode[k] >= 0)
                want = BINDER_ERR_BOUND;
            else if(m.bound[i][m.kclass[k]] + m.kcount[k] > m.offered[i][m.kclass[k]])
                want = BINDER_ERR_NO_ROOM;
            else
                want = BINDER_OK;
            if(rc != want) {
                check_failed++;
                printf("FAIL random step %lu: bind %s to %s: %s, want %s\n", step, kn, nn, binder_strerror(rc),
                       binder_strerror(want));
            }
            binds += rc == BINDER_OK;
            no_room += rc == BINDER_ERR_NO_ROOM;
            if(rc == BINDER_OK) {
                m.knode[k] = i;
                m.bound[i][m.kclass[k]] += m.kcount[k];
            }
        } else if(op < 80) { /* a set of two claims, all or nothing; or one restored past the offer */
            int k2 = (int)rnd(RK);
            char kn2[16];
            snprintf(kn2, sizeof kn2, "k%d", k2);
            if(rnd(4) == 0) {
                binder_rc rc = binder_bind(ix, "tenant-a", kn, nn, BINDER_BIND_RESTORE, NULL);
                binder_rc want = !m.exists[i]       ? BINDER_ERR_NO_NODE
                                 : m.knode[k] == -2 ? BINDER_ERR_NO_CLAIM
                                 : m.knode[k] >= 0  ? BINDER_ERR_BOUND
                                                    : BINDER_OK;
                if(rc != want) {
                    check_failed++;
                    printf("FAIL random step %lu: restore %s on %s: %s, want %s\n", step, kn, nn,
                           binder_strerror(rc), binder_strerror(want));
                }
                if(rc == BINDER_OK) {
                    m.knode[k] = i;
                    m.bound[i][m.kclass[k]] += m.kcount[k];
                }
            } else {
                binder_claim_ref set[2] = {{"tenant-a", kn}, {"tenant-a", kn2}};
                binder_rc rc = binder_bind_set(ix, set, 2, nn, 0, NULL);
                binder_rc want;
                if(!m.exists[i])
                    want = BINDER_ERR_NO_NODE;
                else if(m.knode[k] == -2 || m.knode[k2] == -2)
                    want = m.knode[k] == -2 ? BINDER_ERR_NO_CLAIM
                           : m.knode[k] >= 0 ? BINDER_ERR_BOUND
                                             : BINDER_ERR_NO_CLAIM;
                else if(m.knode[k] >= 0 || m.knode[k2] >= 0 || k == k2)
                    want = BINDER_ERR_BOUND;
                else {
                    uint32_t need[RC] = {0};
                    need[m.kclass[k]] += m.kcount[k];
                    need[m.kclass[k2]] += m.kcount[k2];
                    want = BINDER_OK;
                    for(int c = 0; c < RC; c++)
                        if(need[c] && m.bound[i][c] + need[c] > m.offered[i][c])
                            want = BINDER_ERR_NO_ROOM;
                }
                if(rc != want) {
                    check_failed++;
                    printf("FAIL random step %lu: bind set %s+%s on %s: %s, want %s\n", step, kn, kn2, nn,
                           binder_strerror(rc), binder_strerror(want));
                }
                sets += rc == BINDER_OK;
                if(rc == BINDER_OK) {
                    m.knode[k] = i;
                    m.bound[i][m.kclass[k]] += m.kcount[k];
                    m.knode[k2] = i;
                    m.bound[i][m.kclass[k2]] += m.kcount[k2];
                }
            }
        } else { /* candidates for a random set against a scan of every node */
            int c1 = (int)rnd(RC), c2 = (int)rnd(RC);
            uint32_t u1 = 1 + rnd(6), u2 = rnd(3) ? 0 : 1 + rnd(3);
            int tolerate = (int)rnd(3); /* 0 none, 1 maintenance, 2 all */
            binder_need nd[2] = {{cls_name[c1], u1}, {cls_name[c2], u2}};
            binder_toleration tl[1] = {{tolerate == 1 ? "gpu.cozystack.io/maintenance" : NULL, "Exists", NULL, NULL}};
            binder_query q = {nd, u2 ? 2 : 1, tl, tolerate ? 1 : 0, 0};
            binder_candidate out[RN + 1];
            size_t n = 0;
            binder_rc rc = binder_candidates_set(ix, &q, out, RN + 1, &n);
            uint32_t need[RC] = {0};
            need[c1] += u1;
            if(u2)
                need[c2] += u2;
            int want[RN] = {0};
            size_t nwant = 0;
            for(int j = 0; j < RN; j++) {
                int fits = m.exists[j] && (m.flags[j] & BINDER_NODE_READY) && (m.flags[j] & BINDER_NODE_SCHEDULABLE) &&
                           !(m.flags[j] & BINDER_NODE_LAYOUT_PENDING) &&
                           (m.taint[j] == 0 || tolerate == 2 || (tolerate == 1 && m.taint[j] == 1));
                for(int c = 0; c < RC && fits; c++)
                    if(need[c])
                        fits = m.offered[j][c] >= m.bound[j][c] + need[c];
                want[j] = fits;
                nwant += (size_t)fits;
            }
            int okay = rc == BINDER_OK && n == nwant;
            queries++;
            found += n;
            /* packing order of the class that drove: used before whole, free ascending;
             * we check the order is a valid packing order for one of the set's classes */
            int order_ok[2] = {1, 1};
            for(size_t r = 0; r < n && okay; r++) {
                int j = atoi(out[r].node + 1);
                okay = want[j];
                want[j] = 0; /* no node twice */
                for(int w = 0; w < 2; w++) {
                    int c = w ? c2 : c1;
                    if(r == 0 || (w && !u2))
                        continue;
                    int p = atoi(out[r - 1].node + 1);
                    uint32_t fp = m.offered[p][c] - m.bound[p][c], fr = m.offered[j][c] - m.bound[j][c];
                    int gp = m.bound[p][c] == 0, gr = m.bound[j][c] == 0;
                    if(gp > gr || (gp == gr && fp > fr))
                        order_ok[w] = 0;
                }
            }
            if(!okay || !(order_ok[0] || (u2 && order_ok[1]))) {
                check_failed++;
                printf("FAIL random step %lu: candidates %s:%u %s:%u tol %d: %zu nodes, want %zu (order %d %d)\n",
                       step, cls_name[c1], u1, cls_name[c2], u2, tolerate, n, nwant, order_ok[0], order_ok[1]);
            }
        }
        /* the index agrees with the model on every node's units */
        for(int j = 0; j < RN; j++) {
            char name[16];
            snprintf(name, sizeof name, "n%d", j);
            for(int c = 0; c < RC && m.exists[j]; c++) {
                binder_slot_view v = slot(ix, name, cls_name[c]);
                if(v.offered != m.offered[j][c] || v.bound != m.bound[j][c]) {
                    check_failed++;
                    printf("FAIL random step %lu: %s %s: offered %u bound %u, model %u %u\n", step, name,
                           cls_name[c], v.offered, v.bound, m.offered[j][c], m.bound[j][c]);
                }
            }
        }
        /* and on every class's units: offered and bound over all nodes, free
         * and the most free on one node over the nodes a new set tolerating
         * nothing, the maintenance taint, or everything could be placed on */
        for(int c = 0; c < RC; c++)
            for(int tolerate = 0; tolerate < 3; tolerate++) {
                uint64_t offered = 0, held = 0, free_units = 0;
                uint32_t max_free = 0;
                for(int j = 0; j < RN; j++) {
                    if(!m.exists[j])
                        continue;
                    offered += m.offered[j][c];
                    held += m.bound[j][c];
                    int usable = (m.flags[j] & BINDER_NODE_READY) && (m.flags[j] & BINDER_NODE_SCHEDULABLE) &&
                                 !(m.flags[j] & BINDER_NODE_LAYOUT_PENDING) &&
                                 (m.taint[j] == 0 || tolerate == 2 || (tolerate == 1 && m.taint[j] == 1));
                    uint32_t fr = m.offered[j][c] > m.bound[j][c] ? m.offered[j][c] - m.bound[j][c] : 0;
                    if(usable) {
                        free_units += fr;
                        if(fr > max_free)
                            max_free = fr;
                    }
                }
                binder_toleration tl[1] = {{tolerate == 1 ? "gpu.cozystack.io/maintenance" : NULL, "Exists", NULL, NULL}};
                binder_class_units u;
                binder_rc rc = binder_class_units_get(ix, cls_name[c], tl, tolerate ? 1 : 0, &u);
                if(rc || u.offered != offered || u.bound != held || u.free != free_units || u.max_free != max_free) {
                    check_failed++;
                    printf("FAIL random step %lu: class %s tol %d: offered %llu bound %llu free %llu max %u, model %llu %llu "
                           "%llu %u\n", step, cls_name[c], tolerate, (unsigned long long)u.offered,
                           (unsigned long long)u.bound, (unsigned long long)u.free, u.max_free,
                           (unsigned long long)offered, (unsigned long long)held, (unsigned long long)free_units,
                           max_free);
                }
            }
        binder_stats st;
        binder_stats_get(ix, &st);
        overcommits += st.overcommit > 0;
        cozy_err err = {{0}};
        if(binder_verify(ix, &err)) {
            check_failed++;
            printf("FAIL random step %lu: verify: %s\n", step, err.msg);
        }
        bad += check_failed > before;
    }
    char what[96];
    snprintf(what, sizeof what, "random run of %lu steps, seed %" PRIu64 ", matches the model", steps, seed);
    ok(bad == 0, what, NULL);
    printf("random: %lu steps, seed %" PRIu64 ": %lu binds, %lu sets of two bound, %lu refused for room, %lu candidate queries returning "
           "%lu nodes, %lu steps with an overcommitted node\n", steps, seed, binds, sets, no_room, queries, found, overcommits);
    binder_free(ix);
}

int main(int argc, char **argv)
{
    unsigned long steps = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 20261201;
    check_packing();
    check_no_overcommit();
    check_capacity_drop();
    check_sets();
    check_random(steps, seed);
    return check_finish();
}
