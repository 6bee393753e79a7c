/* binder.c — the binder's rules as a state machine over the index
 * (binder.h says what each rule is and where it comes from).
 *
 * Objects (claims, sets, classes, nodes) are kept in uthash tables (Debian's
 * uthash-dev, header-only, as the index): claims and sets keyed by
 * "ns\0name", nodes and classes by name, so every lookup on an event's
 * path is O(1) expected. A table's iteration order is its insertion order
 * and a deletion keeps the others' order, so walking `claims` is creation
 * order (the order binder.h promises), and a node replaced in place keeps
 * its place (binder_state_restore gives the index the nodes in the order
 * they were first given, as before).
 *
 * binder_reconcile is incremental (binder.h says what it looks at): the
 * inputs mark claims on a dirty list (`mark`), classes that gained room on
 * a usable node are listed (`gain`), and waiting claims sit in a bucket per
 * class (`wait_update`, after each pass) so that a gain retries only the
 * sets waiting on that class. A pass (`run_pass`) takes its groups, widens
 * them (over-committed nodes, gains, sets waiting on a hook) and runs the
 * same steps as the full pass (binder_reconcile_all) on them, in the same
 * order; a group left out is one whose full-pass steps would change
 * nothing (the random run in spec/core/binder_rules_check.c checks that
 * against a twin driven by full passes after every step).
 */
#include "binder/binder.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* uthash: report a failed allocation instead of exit(): the element is not
 * added and its hh.tbl is NULL, which the callers check. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>
#include <utlist.h>

#define MAX_TOLS 32
/* "ns\0name" of a claim or set, with its terminating NUL */
#define KEY_MAX (BINDER_MAX_NAMESPACE + 1 + BINDER_MAX_NAME + 1)
#define MSG_MAX 256

typedef struct sm_class {
    char *name;
    binder_on_cordon on_cordon;
    int deleting;
    binder_toleration *tols; /* strings owned */
    size_t n_tols;
    UT_hash_handle hh; /* binder_state.classes, by name */
} sm_class;

typedef struct sm_node {
    char *name;
    uint32_t flags;
    binder_offer *offers; /* class names owned */
    size_t n_offers;
    binder_taint *taints; /* strings owned */
    size_t n_taints;
    unsigned stamp;    /* pass that looked at it (scratch) */
    UT_hash_handle hh; /* binder_state.nodes, by name */
} sm_node;

struct sm_set;
struct wbucket;

/* The claims of one class name by phase (binder_state_class_view), kept
 * as claims come, change phase and go. Made when a claim first names the
 * class, freed with the state. */
typedef struct sm_tally {
    char *name;
    uint64_t units[BINDER_PHASE_LAST];
    uint64_t claims[BINDER_PHASE_LAST];
    UT_hash_handle hh; /* binder_state.tallies, by name */
} sm_tally;

typedef struct sm_claim {
    char *ns, *name, *class_name;
    sm_tally *tally;
    uint32_t count;
    int tmpl;
    binder_phase phase;
    char *node;
    char *attached_to;
    binder_reason reason;
    char msg[MSG_MAX];
    uint64_t seq;
    struct sm_set *set;
    size_t gi;   /* its group in the current pass (scratch) */
    unsigned stamp; /* pass that took it as a lone group (scratch) */
    int dirty;      /* on binder_state.dirty */
    int vol;        /* waits on a hook's answer (budget, chooser), not on room */
    struct sm_claim *dnext, *dprev;
    struct wbucket *wb; /* the waiting bucket it is in, NULL: none */
    struct sm_claim *wnext, *wprev;
    char *key;   /* "ns\0name" */
    size_t keylen;
    UT_hash_handle hh; /* binder_state.claims, by key, creation order */
} sm_claim;

typedef struct sm_set {
    char *ns, *name;
    sm_claim **claims;
    size_t n;
    binder_vmi_phase phase;
    char *node;
    uint64_t seq;
    char *key; /* "ns\0name" */
    size_t keylen;
    unsigned stamp; /* pass that took it as a group (scratch) */
    char **allowed;   /* the only nodes the set may go to (a volume bound to them), NULL: any */
    size_t n_allowed;
    struct onode *on;             /* the list of sets whose VMI is on `node`, NULL: not in one */
    struct sm_set *onext, *oprev; /* utlist, in on->head */
    UT_hash_handle hh; /* binder_state.sets, by key, creation order */
} sm_set;

/* The sets whose VMI names node `node` (set->node), so that a node's
 * arrival finds them without a walk of every set (mark_sets_on). */
typedef struct onode {
    char *node;
    struct sm_set *head; /* utlist, onext/oprev */
    UT_hash_handle hh;
} onode;

/* Waiting claims of one class (the claims whose sets a gain of room in
 * that class may let move or be placed); class "" holds the claims that
 * wait on a hook's answer (OverBudget, a chooser's refusal), retried by
 * every pass as a full pass would. */
typedef struct wbucket {
    char *cls;
    sm_claim *head; /* utlist, wnext/wprev */
    UT_hash_handle hh;
} wbucket;

#define MAX_GAINED 64

struct binder_state {
    binder_index *ix;
    sm_class *classes; /* uthash heads */
    sm_node *nodes;
    sm_claim *claims;
    sm_set *sets;
    uint64_t seq;
    /* incremental reconcile (binder_reconcile) */
    sm_claim *dirty;     /* utlist, dnext/dprev: claims whose set must be looked at */
    wbucket *waits;      /* by class name */
    char *gained[MAX_GAINED]; /* classes that gained room on a usable node since they were last retried */
    size_t n_gained;
    size_t gained_floor; /* during a pass: gained[0..floor) are being retried now; a gain
                            after that point is a new one, for the next pass */
    int full;            /* the next binder_reconcile runs a full pass */
    unsigned stamp;
    onode *on_node;      /* by node name: the sets whose VMI is there */
    sm_tally *tallies;   /* by class name */
};

/* ------------------------------------------------------------- names */

static const char *const phase_names[BINDER_PHASE_LAST] = {"Pending", "Bound", "Attached", "Lost"};
static const char *const vmi_names[BINDER_VMI_PHASE_LAST] = {"None",    "Pending",   "Scheduled",
                                                               "Running", "Succeeded", "Failed"};
static const char *const reason_names[BINDER_R_LAST] = {
    "",         "Placed",     "Attached",     "NoNodeWithRoom",   "OverBudget",         "ClassNotFound",
    "ClassBeingDeleted", "NodeCordoned", "NodeLost", "WaitingForVMIEnd", "LayoutChangePending",
};

const char *binder_phase_name(binder_phase p)
{
    return (unsigned)p < BINDER_PHASE_LAST ? phase_names[p] : "?";
}

const char *binder_vmi_phase_name(binder_vmi_phase p)
{
    return (unsigned)p < BINDER_VMI_PHASE_LAST ? vmi_names[p] : "?";
}

const char *binder_reason_name(binder_reason r)
{
    return (unsigned)r < BINDER_R_LAST ? reason_names[r] : "?";
}

static int parse_name(const char *s, const char *const *names, int n, int from)
{
    if(!s)
        return -1;
    for(int i = from; i < n; i++)
        if(strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int binder_phase_parse(const char *s, binder_phase *out)
{
    int i = parse_name(s, phase_names, BINDER_PHASE_LAST, 0);
    if(i < 0)
        return -1;
    *out = (binder_phase)i;
    return 0;
}

int binder_vmi_phase_parse(const char *s, binder_vmi_phase *out)
{
    int i = parse_name(s, vmi_names, BINDER_VMI_PHASE_LAST, 0);
    if(i < 0)
        return -1;
    *out = (binder_vmi_phase)i;
    return 0;
}

int binder_reason_parse(const char *s, binder_reason *out)
{
    int i = parse_name(s, reason_names, BINDER_R_LAST, 1);
    if(i < 0)
        return -1;
    *out = (binder_reason)i;
    return 0;
}

/* ----------------------------------------------------------- helpers */

/* cozy_say's message, and `rc` (the binder's own result codes) */
#define fail(err, rc, ...) (cozy_say((err), __VA_ARGS__), (rc))

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static int same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static int name_ok(const char *s, size_t max)
{
    return s && *s && strlen(s) <= max;
}

static sm_class *class_find(const binder_state *st, const char *name)
{
    sm_class *c = NULL;
    if(name)
        HASH_FIND_STR(st->classes, name, c);
    return c;
}

/* The tally of class `name`, made when missing; NULL when out of memory. */
static sm_tally *tally_get(binder_state *st, const char *name)
{
    sm_tally *t = NULL;
    HASH_FIND_STR(st->tallies, name, t);
    if(t)
        return t;
    if(!(t = calloc(1, sizeof *t)) || !(t->name = strdup(name))) {
        free(t);
        return NULL;
    }
    HASH_ADD_KEYPTR(hh, st->tallies, t->name, strlen(t->name), t);
    if(!t->hh.tbl) {
        free(t->name);
        free(t);
        return NULL;
    }
    return t;
}

static sm_node *node_find(const binder_state *st, const char *name)
{
    sm_node *n = NULL;
    if(name)
        HASH_FIND_STR(st->nodes, name, n);
    return n;
}

/* "ns\0name" into buf (KEY_MAX bytes); its length, or 0 when a part is
 * missing or too long (no object has such a key). */
static size_t key_of(const char *ns, const char *name, char *buf)
{
    if(!ns || !name)
        return 0;
    size_t a = strlen(ns), b = strlen(name);
    if(a > BINDER_MAX_NAMESPACE || b > BINDER_MAX_NAME)
        return 0;
    memcpy(buf, ns, a);
    buf[a] = 0;
    memcpy(buf + a + 1, name, b + 1);
    return a + 1 + b;
}

static char *key_dup(const char *ns, const char *name, size_t *len)
{
    char buf[KEY_MAX];
    *len = key_of(ns, name, buf);
    if(!*len)
        return NULL;
    char *k = malloc(*len + 1);
    if(k)
        memcpy(k, buf, *len + 1);
    return k;
}

static sm_claim *claim_find(const binder_state *st, const char *ns, const char *name)
{
    char buf[KEY_MAX];
    size_t len = key_of(ns, name, buf);
    sm_claim *c = NULL;
    if(len)
        HASH_FIND(hh, st->claims, buf, len, c);
    return c;
}

static sm_set *set_find(const binder_state *st, const char *ns, const char *name)
{
    char buf[KEY_MAX];
    size_t len = key_of(ns, name, buf);
    sm_set *s = NULL;
    if(len)
        HASH_FIND(hh, st->sets, buf, len, s);
    return s;
}

/* ------------------------------------------------- dirty and waiting */

static void mark(binder_state *st, sm_claim *c)
{
    if(c && !c->dirty) {
        c->dirty = 1;
        DL_APPEND2(st->dirty, c, dprev, dnext);
    }
}

static void mark_set(binder_state *st, sm_set *s)
{
    for(size_t i = 0; s && i < s->n; i++)
        mark(st, s->claims[i]);
}

static int node_usable(const sm_node *n);

/* Class `cls` gained room (or may have) on a usable node: its waiting
 * claims' sets are retried by the next pass. Past MAX_GAINED classes,
 * or out of memory, the next pass is a full one. */
static void gain(binder_state *st, const char *cls)
{
    for(size_t i = st->gained_floor; i < st->n_gained; i++)
        if(!strcmp(st->gained[i], cls))
            return;
    char *c = st->n_gained < MAX_GAINED ? strdup(cls) : NULL;
    if(!c) {
        st->full = 1;
        return;
    }
    st->gained[st->n_gained++] = c;
}

static void gain_node(binder_state *st, const sm_node *n)
{
    if(!node_usable(n))
        return;
    for(size_t i = 0; i < n->n_offers; i++)
        gain(st, n->offers[i].class_name);
}

static void wait_remove(binder_state *st, sm_claim *c)
{
    (void)st;
    if(c->wb) {
        DL_DELETE2(c->wb->head, c, wprev, wnext);
        c->wb = NULL;
    }
}

/* Puts c in the waiting bucket it belongs in after a pass, or none. */
static void wait_update(binder_state *st, sm_claim *c)
{
    /* a claim waiting for its VMI to end waits on the VMI (its set is
     * marked when that changes), not on room */
    int waiting = c->vol || (c->reason != BINDER_R_PLACED && c->reason != BINDER_R_ATTACHED &&
                             c->reason != BINDER_R_WAITING_FOR_VMI_END);
    const char *cls = c->vol || c->reason == BINDER_R_OVER_BUDGET ? "" : c->class_name;
    if(c->wb && (!waiting || strcmp(c->wb->cls, cls)))
        wait_remove(st, c);
    if(!waiting || c->wb)
        return;
    wbucket *b = NULL;
    HASH_FIND_STR(st->waits, cls, b);
    if(!b) {
        b = calloc(1, sizeof *b);
        if(!b || !(b->cls = strdup(cls))) {
            free(b);
            st->full = 1; /* out of memory: the next pass looks at everything */
            return;
        }
        HASH_ADD_KEYPTR(hh, st->waits, b->cls, strlen(b->cls), b);
        if(!b->hh.tbl) {
            free(b->cls);
            free(b);
            st->full = 1;
            return;
        }
    }
    DL_APPEND2(b->head, c, wprev, wnext);
    c->wb = b;
}

/* The claims booked on node `name`, for marking (index walk: O(claims there)). */
typedef struct mark_walk {
    binder_state *st;
} mark_walk;

static sm_claim *claim_find(const binder_state *st, const char *ns, const char *name);

static void mark_booked(void *ud, const binder_claim_view *v)
{
    mark_walk *w = ud;
    mark(w->st, claim_find(w->st, v->ns, v->name));
}

static void mark_node(binder_state *st, const char *name)
{
    mark_walk w = {st};
    binder_node_claims(st->ix, name, mark_booked, &w);
}

static void free_tols(binder_toleration *t, size_t n)
{
    for(size_t i = 0; i < n; i++) {
        free((char *)t[i].key);
        free((char *)t[i].op);
        free((char *)t[i].value);
        free((char *)t[i].effect);
    }
    free(t);
}

static void node_free(sm_node *n)
{
    if(!n)
        return;
    for(size_t i = 0; i < n->n_offers; i++)
        free((char *)n->offers[i].class_name);
    free(n->offers);
    for(size_t i = 0; i < n->n_taints; i++) {
        free((char *)n->taints[i].key);
        free((char *)n->taints[i].value);
        free((char *)n->taints[i].effect);
    }
    free(n->taints);
    free(n->name);
    free(n);
}

static void claim_free(sm_claim *c)
{
    if(!c)
        return;
    free(c->ns);
    free(c->name);
    free(c->class_name);
    free(c->node);
    free(c->attached_to);
    free(c->key);
    free(c);
}

/* Takes set s out of its node's list (before s->node changes or s goes). */
static void on_node_unlink(binder_state *st, sm_set *s)
{
    onode *o = s->on;
    if(!o)
        return;
    DL_DELETE2(o->head, s, oprev, onext);
    s->on = NULL;
    if(!o->head) {
        HASH_DEL(st->on_node, o);
        free(o->node);
        free(o);
    }
}

/* Puts set s in the list of s->node (after it is set). Out of memory: the
 * set is left out and the next pass is a full one (decision 0023). */
static void on_node_link(binder_state *st, sm_set *s)
{
    if(!s->node || s->on)
        return;
    onode *o;
    HASH_FIND_STR(st->on_node, s->node, o);
    if(!o) {
        o = calloc(1, sizeof *o);
        if(!o || !(o->node = strdup(s->node))) {
            free(o);
            st->full = 1;
            return;
        }
        HASH_ADD_KEYPTR(hh, st->on_node, o->node, strlen(o->node), o);
        if(!o->hh.tbl) {
            free(o->node);
            free(o);
            st->full = 1;
            return;
        }
    }
    DL_APPEND2(o->head, s, oprev, onext);
    s->on = o;
}

static void free_allowed(sm_set *s)
{
    for(size_t i = 0; i < s->n_allowed; i++)
        free(s->allowed[i]);
    free(s->allowed);
    s->allowed = NULL;
    s->n_allowed = 0;
}

static void set_free(sm_set *s)
{
    if(!s)
        return;
    free_allowed(s);
    free(s->ns);
    free(s->name);
    free(s->claims);
    free(s->node);
    free(s->key);
    free(s);
}

static void view_of(const sm_claim *c, binder_claim_status *out)
{
    out->ns = c->ns;
    out->name = c->name;
    out->class_name = c->class_name;
    out->count = c->count;
    out->template_claim = c->tmpl;
    out->phase = c->phase;
    out->node = c->node;
    out->attached_to = c->attached_to;
    out->reason = c->reason;
    out->message = c->msg;
}

/* ------------------------------------------------------------ state */

binder_state *binder_state_new(void)
{
    binder_state *st = calloc(1, sizeof *st);
    if(!st)
        return NULL;
    st->ix = binder_new();
    if(!st->ix) {
        free(st);
        return NULL;
    }
    return st;
}

void binder_state_free(binder_state *st)
{
    if(!st)
        return;
    onode *o, *otmp;
    HASH_ITER(hh, st->on_node, o, otmp)
    {
        HASH_DEL(st->on_node, o);
        free(o->node);
        free(o);
    }
    sm_tally *t, *ttmp;
    HASH_ITER(hh, st->tallies, t, ttmp)
    {
        HASH_DEL(st->tallies, t);
        free(t->name);
        free(t);
    }
    sm_class *k, *ktmp;
    HASH_ITER(hh, st->classes, k, ktmp) {
        HASH_DEL(st->classes, k);
        free_tols(k->tols, k->n_tols);
        free(k->name);
        free(k);
    }
    sm_node *n, *ntmp;
    HASH_ITER(hh, st->nodes, n, ntmp) {
        HASH_DEL(st->nodes, n);
        node_free(n);
    }
    sm_claim *c, *ctmp;
    HASH_ITER(hh, st->claims, c, ctmp) {
        HASH_DEL(st->claims, c);
        claim_free(c);
    }
    sm_set *s, *stmp;
    HASH_ITER(hh, st->sets, s, stmp) {
        HASH_DEL(st->sets, s);
        set_free(s);
    }
    wbucket *b, *btmp;
    HASH_ITER(hh, st->waits, b, btmp) {
        HASH_DEL(st->waits, b);
        free(b->cls);
        free(b);
    }
    for(size_t i = 0; i < st->n_gained; i++)
        free(st->gained[i]);
    binder_free(st->ix);
    free(st);
}

const binder_index *binder_state_index(const binder_state *st)
{
    return st->ix;
}

/* ----------------------------------------------------------- classes */

binder_rc binder_state_class_set(binder_state *st, const char *name, binder_on_cordon on_cordon, int deleting,
                                 const binder_toleration *tols, size_t n_tols, cozy_err *err)
{
    if(!name_ok(name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "class: empty or too long name");
    if(n_tols > MAX_TOLS)
        return fail(err, BINDER_ERR_INPUT, "class %s: more than %d tolerations", name, MAX_TOLS);
    binder_toleration *copy = n_tols ? calloc(n_tols, sizeof *copy) : NULL;
    if(n_tols && !copy)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    int oom = 0;
    for(size_t i = 0; i < n_tols; i++) {
        copy[i].key = dup_or_null(tols[i].key);
        copy[i].op = dup_or_null(tols[i].op);
        copy[i].value = dup_or_null(tols[i].value);
        copy[i].effect = dup_or_null(tols[i].effect);
        oom |= (tols[i].key && !copy[i].key) || (tols[i].op && !copy[i].op) ||
               (tols[i].value && !copy[i].value) || (tols[i].effect && !copy[i].effect);
    }
    sm_class *c = class_find(st, name);
    if(!oom && !c) {
        c = calloc(1, sizeof *c);
        if(c && !(c->name = strdup(name))) {
            free(c);
            c = NULL;
        }
        if(c)
            HASH_ADD_KEYPTR(hh, st->classes, c->name, strlen(c->name), c);
        if(!c || !c->hh.tbl) {
            if(c)
                free(c->name);
            free(c);
            c = NULL;
            oom = 1;
        }
    }
    if(oom) {
        free_tols(copy, n_tols);
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    }
    free_tols(c->tols, c->n_tols);
    c->tols = copy;
    c->n_tols = n_tols;
    c->on_cordon = on_cordon;
    c->deleting = !!deleting;
    st->full = 1; /* a class change: the next pass looks at every claim */
    return BINDER_OK;
}

binder_rc binder_state_class_delete(binder_state *st, const char *name, cozy_err *err)
{
    sm_class *c = class_find(st, name);
    if(!c)
        return fail(err, BINDER_ERR_INPUT, "class %s: not known", name);
    HASH_DEL(st->classes, c);
    free_tols(c->tols, c->n_tols);
    free(c->name);
    free(c);
    st->full = 1;
    return BINDER_OK;
}

/* ------------------------------------------------------------- nodes */

static sm_node *node_copy(const char *name, const binder_node_spec *spec)
{
    sm_node *n = calloc(1, sizeof *n);
    if(!n)
        return NULL;
    n->name = strdup(name);
    n->flags = spec->flags;
    n->offers = spec->n_offers ? calloc(spec->n_offers, sizeof *n->offers) : NULL;
    n->taints = spec->n_taints ? calloc(spec->n_taints, sizeof *n->taints) : NULL;
    if(!n->name || (spec->n_offers && !n->offers) || (spec->n_taints && !n->taints)) {
        node_free(n);
        return NULL;
    }
    for(size_t i = 0; i < spec->n_offers; i++, n->n_offers++) {
        n->offers[i].units = spec->offers[i].units;
        if(!(n->offers[i].class_name = strdup(spec->offers[i].class_name))) {
            node_free(n);
            return NULL;
        }
    }
    for(size_t i = 0; i < spec->n_taints; i++, n->n_taints++) {
        n->taints[i].key = dup_or_null(spec->taints[i].key);
        n->taints[i].value = dup_or_null(spec->taints[i].value);
        n->taints[i].effect = dup_or_null(spec->taints[i].effect);
        if(!n->taints[i].key || (spec->taints[i].value && !n->taints[i].value) ||
           (spec->taints[i].effect && !n->taints[i].effect)) {
            n->n_taints++;
            node_free(n);
            return NULL;
        }
    }
    return n;
}

static binder_node_spec spec_of(const sm_node *n)
{
    binder_node_spec s = {n->flags, n->offers, n->n_offers, n->taints, n->n_taints};
    return s;
}

/* A node arrives or turns Ready: the sets whose VMI is scheduled or runs
 * there are looked at, so that claims released when the node was deleted
 * go back to Attached on it (upkeep). Their claims are not booked on the
 * node, so mark_node does not reach them. O(sets on the node): st->on_node
 * lists them by node. */
static void mark_sets_on(binder_state *st, const char *name)
{
    onode *o;
    HASH_FIND_STR(st->on_node, name, o);
    sm_set *s;
    if(o)
        DL_FOREACH2(o->head, s, onext)
        {
            if(s->phase == BINDER_VMI_SCHEDULED || s->phase == BINDER_VMI_RUNNING)
                mark_set(st, s);
        }
}

binder_rc binder_state_node_set(binder_state *st, const char *name, const binder_node_spec *spec, cozy_err *err)
{
    if(!name_ok(name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "node: empty or too long name");
    sm_node *copy = node_copy(name, spec);
    if(!copy)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    sm_node *old = node_find(st, name);
    uint32_t tmp_flags = old ? old->flags : 0;
    if(!old) {
        HASH_ADD_KEYPTR(hh, st->nodes, copy->name, strlen(copy->name), copy);
        if(!copy->hh.tbl) {
            node_free(copy);
            return fail(err, BINDER_ERR_MEMORY, "out of memory");
        }
    }
    binder_rc rc = binder_node_upsert(st->ix, name, spec, NULL, err);
    if(rc) {
        if(!old)
            HASH_DEL(st->nodes, copy);
        node_free(copy);
        return rc;
    }
    if(old) {
        /* replaced in place: the node keeps its place in the table's order */
        sm_node tmp = *old;
        old->flags = copy->flags;
        old->offers = copy->offers;
        old->n_offers = copy->n_offers;
        old->taints = copy->taints;
        old->n_taints = copy->n_taints;
        copy->offers = tmp.offers;
        copy->n_offers = tmp.n_offers;
        copy->taints = tmp.taints;
        copy->n_taints = tmp.n_taints;
        node_free(copy);
    }
    mark_node(st, name);
    if(!old || (!(tmp_flags & BINDER_NODE_READY) && (spec->flags & BINDER_NODE_READY)))
        mark_sets_on(st, name);
    gain_node(st, node_find(st, name));
    return BINDER_OK;
}

binder_rc binder_state_node_flags(binder_state *st, const char *name, uint32_t flags, cozy_err *err)
{
    sm_node *n = node_find(st, name);
    if(!n)
        return fail(err, BINDER_ERR_NO_NODE, "node %s: not known", name);
    binder_rc rc = binder_node_set_flags(st->ix, name, flags);
    if(rc)
        return fail(err, rc, "node %s: %s", name, binder_strerror(rc));
    uint32_t was = n->flags;
    n->flags = flags;
    mark_node(st, name);
    if(!(was & BINDER_NODE_READY) && (flags & BINDER_NODE_READY))
        mark_sets_on(st, name);
    gain_node(st, n);
    return BINDER_OK;
}

binder_rc binder_state_node_delete(binder_state *st, const char *name, cozy_err *err)
{
    sm_node *n = node_find(st, name);
    if(!n)
        return fail(err, BINDER_ERR_NO_NODE, "node %s: not known", name);
    mark_node(st, name);
    binder_rc rc = binder_node_delete(st->ix, name, NULL, NULL);
    if(rc)
        return fail(err, rc, "node %s: %s", name, binder_strerror(rc));
    HASH_DEL(st->nodes, n);
    node_free(n);
    return BINDER_OK;
}

/* ------------------------------------------------------------ claims */

/* Adds (sign +1) or removes (-1) claim c in its class's tally, at its phase. */
static void tally(const sm_claim *c, int sign)
{
    c->tally->units[c->phase] += (uint64_t)(int64_t)sign * c->count;
    c->tally->claims[c->phase] += (uint64_t)(int64_t)sign;
}

static binder_rc claim_new(binder_state *st, const char *ns, const char *name, const char *class_name,
                           uint32_t count, int tmpl, sm_claim **out, cozy_err *err)
{
    if(!name_ok(ns, BINDER_MAX_NAMESPACE) || !name_ok(name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "claim: empty or too long namespace or name");
    if(!name_ok(class_name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "claim %s/%s: spec.class: empty or too long", ns, name);
    if(count == 0 || count > BINDER_MAX_UNITS)
        return fail(err, BINDER_ERR_INPUT, "claim %s/%s: spec.count: must be 1 to %d", ns, name, BINDER_MAX_UNITS);
    if(claim_find(st, ns, name))
        return fail(err, BINDER_ERR_BOUND, "claim %s/%s: known already", ns, name);
    sm_claim *c = calloc(1, sizeof *c);
    if(!c || !(c->ns = strdup(ns)) || !(c->name = strdup(name)) || !(c->class_name = strdup(class_name)) ||
       !(c->key = key_dup(ns, name, &c->keylen)) || !(c->tally = tally_get(st, class_name))) {
        claim_free(c);
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    }
    binder_rc rc = binder_claim_upsert(st->ix, ns, name, class_name, count, err);
    if(rc) {
        claim_free(c);
        return rc;
    }
    HASH_ADD_KEYPTR(hh, st->claims, c->key, c->keylen, c);
    if(!c->hh.tbl) {
        binder_claim_delete(st->ix, ns, name);
        claim_free(c);
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    }
    c->count = count;
    c->tmpl = !!tmpl;
    c->phase = BINDER_PENDING;
    tally(c, +1);
    c->seq = ++st->seq;
    mark(st, c);
    *out = c;
    return BINDER_OK;
}

binder_rc binder_state_claim_add(binder_state *st, const char *ns, const char *name, const char *class_name,
                                 uint32_t count, int template_claim, cozy_err *err)
{
    sm_claim *c;
    return claim_new(st, ns, name, class_name, count, template_claim, &c, err);
}

binder_rc binder_state_claim_put(binder_state *st, const binder_claim_status *s, cozy_err *err)
{
    if((s->phase == BINDER_BOUND || s->phase == BINDER_ATTACHED) && !s->node)
        return fail(err, BINDER_ERR_INPUT, "claim %s/%s: status.node: required when %s", s->ns, s->name,
                    binder_phase_name(s->phase));
    if((unsigned)s->phase >= BINDER_PHASE_LAST || (unsigned)s->reason >= BINDER_R_LAST)
        return fail(err, BINDER_ERR_INPUT, "claim %s/%s: status: bad phase or reason", s->ns, s->name);
    char *node = dup_or_null(s->node), *att = dup_or_null(s->attached_to);
    if((s->node && !node) || (s->attached_to && !att)) {
        free(node);
        free(att);
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    }
    sm_claim *c;
    binder_rc rc = claim_new(st, s->ns, s->name, s->class_name, s->count, s->template_claim, &c, err);
    if(rc) {
        free(node);
        free(att);
        return rc;
    }
    tally(c, -1);
    c->phase = s->phase;
    tally(c, +1);
    c->node = node;
    c->attached_to = att;
    c->reason = s->reason;
    snprintf(c->msg, sizeof c->msg, "%s", s->message ? s->message : "");
    return BINDER_OK;
}

static void set_drop_claim(sm_set *s, sm_claim *c)
{
    for(size_t i = 0; i < s->n; i++)
        if(s->claims[i] == c) {
            memmove(s->claims + i, s->claims + i + 1, (s->n - i - 1) * sizeof *s->claims);
            s->n--;
            return;
        }
}

binder_rc binder_state_claim_delete(binder_state *st, const char *ns, const char *name, cozy_err *err)
{
    sm_claim *c = claim_find(st, ns, name);
    if(!c)
        return fail(err, BINDER_ERR_NO_CLAIM, "claim %s/%s: not known", ns, name);
    binder_claim_view v;
    if(!binder_claim_get(st->ix, ns, name, &v) && v.node)
        gain_node(st, node_find(st, v.node));
    binder_claim_delete(st->ix, ns, name);
    if(c->set) {
        set_drop_claim(c->set, c);
        mark_set(st, c->set);
    }
    if(c->dirty)
        DL_DELETE2(st->dirty, c, dprev, dnext);
    wait_remove(st, c);
    tally(c, -1);
    HASH_DEL(st->claims, c);
    claim_free(c);
    return BINDER_OK;
}

void binder_state_class_view(const binder_state *st, const char *name, binder_class_view *out)
{
    memset(out, 0, sizeof *out);
    if(!name || !*name)
        return;
    const sm_class *k = class_find(st, name);
    binder_class_units_get(st->ix, name, k ? k->tols : NULL, k ? k->n_tols : 0, &out->units);
    if(!k || k->deleting)
        out->units.free = out->units.max_free = 0; /* no new order of it is placed */
    sm_tally *t = NULL;
    HASH_FIND_STR(st->tallies, name, t);
    if(t) {
        memcpy(out->claim_units, t->units, sizeof out->claim_units);
        memcpy(out->claims, t->claims, sizeof out->claims);
    }
}

binder_rc binder_state_claim_get(const binder_state *st, const char *ns, const char *name, binder_claim_status *out)
{
    sm_claim *c = claim_find(st, ns, name);
    if(!c)
        return BINDER_ERR_NO_CLAIM;
    view_of(c, out);
    return BINDER_OK;
}

void binder_state_claims(const binder_state *st, void (*fn)(void *ud, const binder_claim_status *c), void *ud)
{
    for(const sm_claim *c = st->claims; c; c = c->hh.next) {
        binder_claim_status v;
        view_of(c, &v);
        fn(ud, &v);
    }
}

/* -------------------------------------------------------------- sets */

static binder_rc vmi_check(const char *ns, const char *name, binder_vmi_phase phase, const char *node, cozy_err *err)
{
    if((unsigned)phase >= BINDER_VMI_PHASE_LAST)
        return fail(err, BINDER_ERR_INPUT, "VMI %s/%s: status.phase: unknown", ns, name);
    if(node && (phase == BINDER_VMI_NONE || phase == BINDER_VMI_PENDING))
        return fail(err, BINDER_ERR_INPUT, "VMI %s/%s: status.nodeName: set while %s", ns, name,
                    binder_vmi_phase_name(phase));
    if((phase == BINDER_VMI_SCHEDULED || phase == BINDER_VMI_RUNNING) && !node)
        return fail(err, BINDER_ERR_INPUT, "VMI %s/%s: status.nodeName: required while %s", ns, name,
                    binder_vmi_phase_name(phase));
    return BINDER_OK;
}

binder_rc binder_state_set_put(binder_state *st, const char *ns, const char *name, const char *const *claims,
                               size_t n_claims, binder_vmi_phase phase, const char *node, cozy_err *err)
{
    if(!name_ok(ns, BINDER_MAX_NAMESPACE) || !name_ok(name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "VM: empty or too long namespace or name");
    if(n_claims == 0 || n_claims > BINDER_MAX_SET_CLAIMS)
        return fail(err, BINDER_ERR_INPUT, "VM %s/%s: claims: must name 1 to %d claims", ns, name,
                    BINDER_MAX_SET_CLAIMS);
    binder_rc rc = vmi_check(ns, name, phase, node, err);
    if(rc)
        return rc;
    sm_set *old = set_find(st, ns, name);
    sm_claim **list = calloc(n_claims, sizeof *list);
    if(!list)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    for(size_t i = 0; i < n_claims; i++) {
        sm_claim *c = claims[i] ? claim_find(st, ns, claims[i]) : NULL;
        if(!c) {
            free(list);
            return fail(err, BINDER_ERR_NO_CLAIM, "VM %s/%s: claims[%zu]: no claim \"%s\" in namespace %s", ns,
                        name, i, claims[i] ? claims[i] : "", ns);
        }
        for(size_t j = 0; j < i; j++)
            if(list[j] == c) {
                free(list);
                return fail(err, BINDER_ERR_INPUT, "VM %s/%s: claims[%zu]: claim \"%s\" named twice", ns, name, i,
                            claims[i]);
            }
        if(c->set && c->set != old) {
            free(list);
            return fail(err, BINDER_ERR_BOUND, "VM %s/%s: claims[%zu]: claim \"%s\" is named by VM %s too", ns,
                        name, i, claims[i], c->set->name);
        }
        list[i] = c;
    }
    char *nodecopy = dup_or_null(node);
    sm_set *s = old;
    if(!s) {
        s = calloc(1, sizeof *s);
        if(!s || !(s->ns = strdup(ns)) || !(s->name = strdup(name)) || !(s->key = key_dup(ns, name, &s->keylen))) {
            set_free(s);
            s = NULL;
        }
        if(s) {
            HASH_ADD_KEYPTR(hh, st->sets, s->key, s->keylen, s);
            if(!s->hh.tbl) {
                set_free(s);
                s = NULL;
            }
        }
    }
    if(!s || (node && !nodecopy)) {
        if(s && s != old) {
            HASH_DEL(st->sets, s);
            set_free(s);
        }
        free(nodecopy);
        free(list);
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    }
    if(old) {
        mark_set(st, old);
        for(size_t i = 0; i < old->n; i++)
            old->claims[i]->set = NULL;
    } else
        s->seq = ++st->seq;
    free(s->claims);
    s->claims = list;
    s->n = n_claims;
    for(size_t i = 0; i < n_claims; i++)
        list[i]->set = s;
    mark_set(st, s);
    on_node_unlink(st, s);
    free(s->node);
    s->node = nodecopy;
    s->phase = phase;
    on_node_link(st, s);
    return BINDER_OK;
}

binder_rc binder_state_set_vmi(binder_state *st, const char *ns, const char *name, binder_vmi_phase phase,
                               const char *node, cozy_err *err)
{
    sm_set *s = set_find(st, ns, name);
    if(!s)
        return fail(err, BINDER_ERR_NO_CLAIM, "VM %s/%s: not known", ns, name);
    binder_rc rc = vmi_check(ns, name, phase, node, err);
    if(rc)
        return rc;
    char *copy = dup_or_null(node);
    if(node && !copy)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    on_node_unlink(st, s);
    free(s->node);
    s->node = copy;
    s->phase = phase;
    on_node_link(st, s);
    mark_set(st, s);
    return BINDER_OK;
}

binder_rc binder_state_set_delete(binder_state *st, const char *ns, const char *name, cozy_err *err)
{
    sm_set *s = set_find(st, ns, name);
    if(!s)
        return fail(err, BINDER_ERR_NO_CLAIM, "VM %s/%s: not known", ns, name);
    mark_set(st, s);
    for(size_t k = 0; k < s->n; k++)
        s->claims[k]->set = NULL;
    on_node_unlink(st, s);
    HASH_DEL(st->sets, s);
    set_free(s);
    return BINDER_OK;
}

binder_rc binder_state_set_nodes(binder_state *st, const char *ns, const char *name, const char *const *nodes,
                                 size_t n, cozy_err *err)
{
    sm_set *s = set_find(st, ns, name);
    if(!s)
        return fail(err, BINDER_ERR_NO_CLAIM, "VM %s/%s: not known", ns, name);
    if(n > BINDER_MAX_SET_NODES)
        return fail(err, BINDER_ERR_INPUT, "VM %s/%s: more than %d nodes allowed", ns, name, BINDER_MAX_SET_NODES);
    int same_list = n == s->n_allowed;
    for(size_t i = 0; same_list && i < n; i++)
        same_list = nodes[i] && strcmp(nodes[i], s->allowed[i]) == 0;
    if(same_list)
        return BINDER_OK;
    char **copy = n ? calloc(n, sizeof *copy) : NULL;
    if(n && !copy)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    for(size_t i = 0; i < n; i++) {
        if(!name_ok(nodes[i], BINDER_MAX_NAME) || !(copy[i] = strdup(nodes[i]))) {
            for(size_t j = 0; j <= i && j < n; j++)
                free(copy[j]);
            free(copy);
            return name_ok(nodes[i], BINDER_MAX_NAME) ? fail(err, BINDER_ERR_MEMORY, "out of memory")
                                                      : fail(err, BINDER_ERR_INPUT, "VM %s/%s: empty or long node name",
                                                             ns, name);
        }
    }
    free_allowed(s);
    s->allowed = copy;
    s->n_allowed = n;
    mark_set(st, s);
    return BINDER_OK;
}

const char *binder_state_claim_set(const binder_state *st, const char *ns, const char *name)
{
    sm_claim *c = claim_find(st, ns, name);
    return c && c->set ? c->set->name : NULL;
}

binder_rc binder_state_set_get(const binder_state *st, const char *ns, const char *name, binder_vmi_phase *phase,
                               const char **node)
{
    sm_set *s = set_find(st, ns, name);
    if(!s)
        return BINDER_ERR_NO_CLAIM;
    if(phase)
        *phase = s->phase;
    if(node)
        *node = s->node;
    return BINDER_OK;
}

/* --------------------------------------------------------- reconcile */

typedef struct pass {
    binder_state *st;
    const binder_hooks *h;
    size_t events;
    int refused; /* the last choose() had candidates and the hook took none */
} pass;

/* Sets a claim's status, emitting an event when phase, node or reason
 * changed. `node` may alias c->node. */
static void set_status(pass *p, sm_claim *c, binder_phase phase, const char *node, binder_reason reason,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void set_status(pass *p, sm_claim *c, binder_phase phase, const char *node, binder_reason reason,
                       const char *fmt, ...)
{
    char msg[MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int changed = c->phase != phase || !same(c->node, node) || c->reason != reason;
    if(changed || strcmp(c->msg, msg))
        mark(p->st, c); /* what changed is looked at again by the next pass */
    char *old_node = NULL; /* kept until the event is delivered */
    binder_phase old_phase = c->phase;
    int moved = !same(c->node, node);
    if(moved) {
        char *copy = dup_or_null(node);
        if(node && !copy)
            return; /* out of memory: the claim keeps its status; the next pass retries */
        old_node = c->node;
        c->node = copy;
    }
    tally(c, -1);
    c->phase = phase;
    tally(c, +1);
    c->reason = reason;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    if(phase != BINDER_ATTACHED) {
        free(c->attached_to);
        c->attached_to = NULL;
    }
    if(changed) {
        p->events++;
        if(p->h && p->h->event) {
            binder_event ev = {c->ns, c->name, old_phase, phase, moved ? old_node : c->node, c->node, reason, c->msg};
            p->h->event(p->h->ud, &ev);
        }
    }
    free(old_node);
}

/* The node the index books the claim on (NULL: none). */
static const char *booked(const binder_state *st, const sm_claim *c)
{
    binder_claim_view v;
    if(binder_claim_get(st->ix, c->ns, c->name, &v))
        return NULL;
    return v.node;
}

/* Releases a booked claim's units; a usable node's room is a gain. */
static void unbind_claim(binder_state *st, const sm_claim *c)
{
    const char *at = booked(st, c);
    if(!at)
        return;
    const sm_node *n = node_find(st, at);
    binder_unbind(st->ix, c->ns, c->name);
    if(node_usable(n))
        gain(st, c->class_name);
}

static binder_vmi_phase vmi_of(const sm_claim *c)
{
    return c->set ? c->set->phase : BINDER_VMI_NONE;
}

static int vmi_live(binder_vmi_phase ph)
{
    return ph == BINDER_VMI_SCHEDULED || ph == BINDER_VMI_RUNNING;
}

static int node_usable(const sm_node *n)
{
    if(!n)
        return 0;
    return n && (n->flags & BINDER_NODE_READY) && (n->flags & BINDER_NODE_SCHEDULABLE) &&
           !(n->flags & BINDER_NODE_LAYOUT_PENDING);
}

/* Step 1: attach, detach, NotReady, node gone while attached. */
static void upkeep(pass *p, sm_claim *c)
{
    binder_state *st = p->st;
    binder_vmi_phase vp = vmi_of(c);
    sm_node *n = node_find(st, c->node);
    int ready = n && (n->flags & BINDER_NODE_READY);
    const char *vmi = c->set ? c->set->name : NULL;

    switch(c->phase) {
    case BINDER_BOUND:
        if(vp == BINDER_VMI_RUNNING && ready && same(c->set->node, c->node)) {
            set_status(p, c, BINDER_ATTACHED, c->node, BINDER_R_ATTACHED, "attached to VMI %s on node %s", vmi,
                       c->node);
            if(!c->attached_to)
                c->attached_to = strdup(vmi);
        }
        break;
    case BINDER_ATTACHED:
        if(!vmi_live(vp)) { /* DESIGN §6: leaves Attached only when its VMI is final or removed */
            /* the VMI's name: the one it was attached to (its set may be
             * gone with its VM) */
            const char *was = c->attached_to ? c->attached_to : vmi ? vmi : "?";
            if(n)
                set_status(p, c, BINDER_BOUND, c->node, BINDER_R_PLACED,
                           "VMI %s is no longer running; the claim keeps node %s", was, c->node);
            else
                set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                           "VMI %s is no longer running and node %s is gone; waiting for a node with room", was,
                           c->node);
        } else if(!n)
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_WAITING_FOR_VMI_END,
                       "node %s is gone; waiting for VMI %s to end before placing the claim again", c->node, vmi);
        else if(!ready)
            set_status(p, c, BINDER_LOST, c->node, BINDER_R_WAITING_FOR_VMI_END,
                       "node %s is NotReady; waiting for VMI %s to end (or the node to return)", c->node, vmi);
        break;
    case BINDER_LOST:
        if(c->reason != BINDER_R_WAITING_FOR_VMI_END)
            break;
        if(!vmi_live(vp)) {
            unbind_claim(st, c);
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                       "its VMI ended and its node was lost; waiting for a node with room");
        } else if(!n && c->node) {
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_WAITING_FOR_VMI_END,
                       "node %s is gone; waiting for VMI %s to end before placing the claim again", c->node, vmi);
        } else if(n && ready && vp == BINDER_VMI_RUNNING && same(c->set->node, c->node)) {
            set_status(p, c, BINDER_ATTACHED, c->node, BINDER_R_ATTACHED, "node %s is back; attached to VMI %s",
                       c->node, vmi);
            if(!c->attached_to)
                c->attached_to = strdup(vmi);
        } else if(!c->node && vp == BINDER_VMI_RUNNING && c->set->node) {
            /* its node was deleted and is registered again while the VMI
             * still runs there: the VMI holds those units, so they are
             * booked again (past what the node offers if others took them:
             * the unattached ones then move, step 2) and it is Attached */
            sm_node *vn = node_find(st, c->set->node);
            if(vn && (vn->flags & BINDER_NODE_READY) &&
               binder_bind(st->ix, c->ns, c->name, c->set->node, BINDER_BIND_RESTORE, NULL) == BINDER_OK) {
                set_status(p, c, BINDER_ATTACHED, c->set->node, BINDER_R_ATTACHED,
                           "node %s is back; attached to VMI %s", c->set->node, vmi);
                if(!c->attached_to)
                    c->attached_to = strdup(vmi);
            }
        }
        break;
    default: break;
    }
}

/* The claims of one set (a VM's, or a lone claim), in a scratch array. */
typedef struct group {
    sm_claim *m[BINDER_MAX_SET_CLAIMS];
    size_t n;
    sm_set *set;
} group;

static void group_of_set(group *g, sm_set *s)
{
    g->set = s;
    g->n = s->n < BINDER_MAX_SET_CLAIMS ? s->n : BINDER_MAX_SET_CLAIMS;
    memcpy(g->m, s->claims, g->n * sizeof *g->m);
}

static void group_of_claim(group *g, sm_claim *c)
{
    g->set = NULL;
    g->n = 1;
    g->m[0] = c;
}

/* g waits on a hook's answer: retried by every pass (wait_update). */
static void group_vol(const group *g)
{
    for(size_t i = 0; i < g->n; i++)
        g->m[i]->vol = 1;
}

/* Needs of the claims in g that `pick` selects, and their tolerations. */
typedef struct needs {
    binder_need need[BINDER_MAX_SET_CLASSES];
    size_t n;
    binder_toleration tols[MAX_TOLS * 4];
    size_t n_tols;
} needs;

static int needs_of(const binder_state *st, const group *g, int (*pick)(const sm_claim *), needs *out)
{
    memset(out, 0, sizeof *out);
    for(size_t i = 0; i < g->n; i++) {
        const sm_claim *c = g->m[i];
        if(pick && !pick(c))
            continue;
        size_t k;
        for(k = 0; k < out->n; k++)
            if(strcmp(out->need[k].class_name, c->class_name) == 0)
                break;
        if(k == out->n) {
            if(out->n == BINDER_MAX_SET_CLASSES)
                return -1;
            out->need[out->n].class_name = c->class_name;
            out->n++;
            const sm_class *cl = class_find(st, c->class_name);
            for(size_t t = 0; cl && t < cl->n_tols && out->n_tols < sizeof out->tols / sizeof *out->tols; t++)
                out->tols[out->n_tols++] = cl->tols[t];
        }
        out->need[k].units += c->count;
    }
    return 0;
}

static void set_view_of(const group *g, binder_claim_status *views, binder_set_view *sv)
{
    for(size_t i = 0; i < g->n; i++)
        view_of(g->m[i], &views[i]);
    sv->ns = g->m[0]->ns;
    sv->vm = g->set ? g->set->name : NULL;
    sv->claims = views;
    sv->n = g->n;
}

/* The candidates for the needs of group g (BINDER_MAX_CANDIDATES at most:
 * the index's packing order, or the set's allowed nodes): how many. */
static size_t candidates_of(pass *p, const group *g, const needs *nd, binder_candidate *cands)
{
    size_t nc = 0;
    binder_query q = {nd->need, nd->n, nd->tols, nd->n_tols, 0};
    if(g->set && g->set->n_allowed) {
        /* a set limited to named nodes (DESIGN.md §6: a volume bound to a
         * node): those of them that are candidates, in the order given */
        for(size_t i = 0; i < g->set->n_allowed && nc < BINDER_MAX_CANDIDATES; i++) {
            int fits = 0;
            if(binder_node_candidate(p->st->ix, g->set->allowed[i], &q, &cands[nc], &fits) == BINDER_OK && fits)
                nc++;
        }
        return nc;
    }
    if(binder_candidates_set(p->st->ix, &q, cands, BINDER_MAX_CANDIDATES, &nc))
        return 0;
    return nc;
}

/* The hook's pick among nc >= 1 candidates: the node name (borrowed from
 * the index), or NULL when the hook took none (p->refused set). */
static const char *pick_of(pass *p, const group *g, const binder_candidate *cands, size_t nc)
{
    int pick = 0;
    if(p->h && p->h->choose) {
        binder_claim_status views[BINDER_MAX_SET_CLAIMS];
        binder_set_view sv;
        set_view_of(g, views, &sv);
        pick = p->h->choose(p->h->ud, &sv, cands, nc);
    }
    if(pick < 0 || (size_t)pick >= nc) {
        p->refused = 1; /* candidates were there: the hook's answer, not room, keeps the set waiting */
        return NULL;
    }
    return cands[pick].node;
}

/* Candidates for the needs, chosen by the hook. Returns the node name
 * (borrowed from the index) or NULL. */
static const char *choose(pass *p, const group *g, const needs *nd)
{
    p->refused = 0;
    binder_candidate cands[BINDER_MAX_CANDIDATES];
    size_t nc = candidates_of(p, g, nd, cands);
    return nc ? pick_of(p, g, cands, nc) : NULL;
}

static binder_rc bind_group(binder_state *st, const group *g, int (*pick)(const sm_claim *), const char *node,
                            uint32_t flags)
{
    binder_claim_ref refs[BINDER_MAX_SET_CLAIMS];
    size_t n = 0;
    for(size_t i = 0; i < g->n; i++)
        if(!pick || pick(g->m[i]))
            refs[n++] = (binder_claim_ref){g->m[i]->ns, g->m[i]->name};
    return n ? binder_bind_set(st->ix, refs, n, node, flags, NULL) : BINDER_OK;
}

enum move_cause { MOVE_NONE = 0, MOVE_GONE, MOVE_LAYOUT, MOVE_CAPACITY, MOVE_CORDON, MOVE_NOT_READY };

static int is_bound(const sm_claim *c)
{
    return c->phase == BINDER_BOUND;
}

/* Step 2 for one group whose members are Bound on `node` (the first
 * Bound member's). */
static void move_group(pass *p, group *g, enum move_cause cause)
{
    binder_state *st = p->st;
    sm_claim *first = NULL;
    for(size_t i = 0; i < g->n; i++)
        if(is_bound(g->m[i])) {
            first = g->m[i];
            break;
        }
    if(!first)
        return;
    char from[BINDER_MAX_NAME + 1];
    snprintf(from, sizeof from, "%s", first->node);
    binder_vmi_phase vp = g->set ? g->set->phase : BINDER_VMI_NONE;
    if(vmi_live(vp)) {
        /* scheduled: it runs there or fails (a running one has Attached
         * claims); on a deleted node it can only fail: wait for its end */
        if(cause == MOVE_GONE)
            for(size_t i = 0; i < g->n; i++)
                if(is_bound(g->m[i]))
                    set_status(p, g->m[i], BINDER_LOST, NULL, BINDER_R_WAITING_FOR_VMI_END,
                               "node %s was deleted; waiting for VMI %s to end before placing the claim again", from,
                               g->set->name);
        return;
    }
    static const char *const why[] = {"", "node deleted", "layout change pending", "node lost the capacity",
                                      "node cordoned, onCordon Move", "node NotReady while its VMI waits"};
    needs nd;
    if(needs_of(st, g, is_bound, &nd))
        return;
    const char *to = choose(p, g, &nd);
    if(p->refused)
        group_vol(g);
    if(to && !strcmp(to, from))
        to = NULL;
    /* DESIGN §6: a set that must move while its VMI exists but is not yet
     * scheduled has that VMI deleted, so the set becomes unattached and
     * moves (its launcher pod was pinned to the old node). Asked only when
     * the set does leave the node: to a new one, or Lost because the node
     * is gone or lost the capacity; a set that keeps its hold (cordon or
     * layout with no room elsewhere) keeps its VMI waiting too. */
    if(vp == BINDER_VMI_PENDING && (to || cause == MOVE_GONE || cause == MOVE_CAPACITY) && p->h && p->h->delete_vmi)
        p->h->delete_vmi(p->h->ud, g->set->ns, g->set->name, why[cause]);
    if(to) {
        char tocopy[BINDER_MAX_NAME + 1];
        snprintf(tocopy, sizeof tocopy, "%s", to);
        /* keep the hold: the target was a candidate with room for the whole
         * set, so the bind cannot fail for room; release, bind, and on any
         * failure book the old node again (RESTORE) before anything else runs */
        for(size_t i = 0; i < g->n; i++)
            if(is_bound(g->m[i]))
                unbind_claim(st, g->m[i]);
        if(bind_group(st, g, is_bound, tocopy, 0) == BINDER_OK) {
            for(size_t i = 0; i < g->n; i++)
                if(is_bound(g->m[i]))
                    set_status(p, g->m[i], BINDER_BOUND, tocopy, BINDER_R_PLACED, "moved from node %s (%s) to node %s",
                               from, why[cause], tocopy);
            return;
        }
        if(cause != MOVE_GONE)
            bind_group(st, g, is_bound, from, BINDER_BIND_RESTORE);
    }
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(!is_bound(c))
            continue;
        switch(cause) {
        case MOVE_GONE:
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                       "node %s was deleted and no other node has room; waiting for room", from);
            break;
        case MOVE_CAPACITY:
            unbind_claim(st, c);
            set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                       "node %s lost the capacity of class %s and no other node has room; waiting for room", from,
                       c->class_name);
            break;
        case MOVE_LAYOUT:
            set_status(p, c, BINDER_BOUND, c->node, BINDER_R_LAYOUT_CHANGE_PENDING,
                       "node %s has a layout change pending and no other node has room; the claim keeps its hold",
                       from);
            break;
        case MOVE_NOT_READY:
            set_status(p, c, BINDER_BOUND, c->node, BINDER_R_NODE_LOST,
                       "node %s is NotReady and no other node has room; the claim keeps its hold there", from);
            break;
        default:
            set_status(p, c, BINDER_BOUND, c->node, BINDER_R_NODE_CORDONED,
                       "node %s is cordoned (onCordon: Move) and no other node has room yet; the claim keeps its "
                       "hold there",
                       from);
            break;
        }
    }
}

/* A group's place in line: its oldest claim's creation. */
static uint64_t group_seq(const group *g)
{
    uint64_t s = UINT64_MAX;
    for(size_t i = 0; i < g->n; i++)
        if(g->m[i]->seq < s)
            s = g->m[i]->seq;
    return s;
}

static int group_cmp(const void *a, const void *b)
{
    uint64_t sx = group_seq(a), sy = group_seq(b);
    return sx < sy ? -1 : sx > sy;
}

/* The groups a pass looks at: a growing array, each set or lone claim
 * once (stamps of the pass). */
typedef struct glist {
    group *g;
    size_t n, cap;
    int oom;
} glist;

/* Adds c's group (its set's, or c alone) unless the pass has it. */
static void gl_add(binder_state *st, glist *gl, sm_claim *c)
{
    if(c->set ? c->set->stamp == st->stamp : c->stamp == st->stamp)
        return;
    if(gl->n == gl->cap) {
        size_t cap = gl->cap ? gl->cap * 2 : 64;
        group *g = realloc(gl->g, cap * sizeof *g);
        if(!g) {
            gl->oom = 1;
            return;
        }
        gl->g = g;
        gl->cap = cap;
    }
    if(c->set) {
        c->set->stamp = st->stamp;
        group_of_set(&gl->g[gl->n++], c->set);
    } else {
        c->stamp = st->stamp;
        group_of_claim(&gl->g[gl->n++], c);
    }
}

static int claim_seq_cmp(const void *a, const void *b)
{
    const sm_claim *x = *(sm_claim *const *)a, *y = *(sm_claim *const *)b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Capacity drops: per node, per class bound above offered, mark the most
 * recently bound movable claims' groups until the class fits. */
typedef struct cap_walk {
    const binder_state *st;
    const char *node;
    sm_claim *list[256];
    size_t n;
} cap_walk;

static void cap_collect(void *ud, const binder_claim_view *v)
{
    cap_walk *w = ud;
    if(w->n < sizeof w->list / sizeof *w->list) {
        sm_claim *c = claim_find(w->st, v->ns, v->name);
        if(c)
            w->list[w->n++] = c;
    }
}

/* Whether c is among g's members (a set past BINDER_MAX_SET_CLAIMS is cut
 * in its group). */
static int in_group(const group *g, const sm_claim *c)
{
    for(size_t m = 0; m < g->n; m++)
        if(g->m[m] == c)
            return 1;
    return 0;
}

static int movable(const sm_claim *c)
{
    return c->phase == BINDER_BOUND && !vmi_live(vmi_of(c));
}

static void mark_capacity(binder_state *st, group *gs, sm_node *const *nodes, size_t nn, enum move_cause *causes)
{
    for(size_t ni = 0; ni < nn; ni++) {
        const sm_node *n = nodes[ni];
        cap_walk w = {st, n->name, {0}, 0};
        binder_node_claims(st->ix, n->name, cap_collect, &w);
        for(size_t i = 0; i < w.n; i++) {
            sm_claim *c = w.list[i];
            binder_slot_view sl;
            if(binder_node_slot(st->ix, n->name, c->class_name, &sl) || sl.bound <= sl.offered)
                continue;
            /* the class is over: count what the groups already marked free */
            uint32_t leaving = 0;
            for(size_t k = 0; k < w.n; k++) {
                sm_claim *o = w.list[k];
                if(strcmp(o->class_name, c->class_name))
                    continue;
                if(causes[o->gi] == MOVE_CAPACITY && in_group(&gs[o->gi], o))
                    leaving += o->count;
            }
            if(sl.bound - leaving <= sl.offered || !movable(c))
                continue;
            if(in_group(&gs[c->gi], c) && causes[c->gi] != MOVE_GONE)
                causes[c->gi] = MOVE_CAPACITY; /* stronger than a pending layout: no hold past the offer */
        }
    }
}

static int unplaced(const sm_claim *c)
{
    return c->phase == BINDER_PENDING || (c->phase == BINDER_LOST && !c->node && c->reason != BINDER_R_WAITING_FOR_VMI_END);
}

static int is_pending(const sm_claim *c)
{
    return c->phase == BINDER_PENDING;
}

/* Leaves every unplaced member of g waiting with `reason`. */
static void wait_group(pass *p, group *g, binder_reason reason, const char *msg)
{
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(!unplaced(c))
            continue;
        binder_reason r = reason;
        if(c->phase == BINDER_LOST && (r == BINDER_R_NO_NODE_WITH_ROOM || r == BINDER_R_OVER_BUDGET))
            r = BINDER_R_NODE_LOST; /* a Lost claim never fails a budget check; it waits for room */
        set_status(p, c, c->phase, NULL, r, "%s", msg);
    }
}

/* Step 3 for one group with unplaced members. */
static void place_group(pass *p, group *g)
{
    binder_state *st = p->st;
    char msg[MSG_MAX];
    const char *anchor = NULL;
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(c->phase == BINDER_LOST && c->reason == BINDER_R_WAITING_FOR_VMI_END) {
            /* its VMI still holds the set: the others wait with it */
            snprintf(msg, sizeof msg, "claim %s of the same VM waits for VMI %s to end; this one waits with it",
                     c->name, g->set ? g->set->name : "");
            wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, msg);
            return;
        }
        if((c->phase == BINDER_BOUND || c->phase == BINDER_ATTACHED) && !anchor)
            anchor = c->node;
    }
    /* classes: a missing class blocks the set; a class being deleted blocks
     * a Pending claim only (DESIGN §6: it keeps serving Lost ones) */
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(!unplaced(c))
            continue;
        const sm_class *cl = class_find(st, c->class_name);
        if(!cl || (cl->deleting && c->phase == BINDER_PENDING)) {
            binder_reason r = cl ? BINDER_R_CLASS_BEING_DELETED : BINDER_R_CLASS_NOT_FOUND;
            snprintf(msg, sizeof msg, cl ? "class %s is being deleted; claim %s waits" : "class %s not found (claim %s)",
                     c->class_name, c->name);
            for(size_t k = 0; k < g->n; k++)
                if(unplaced(g->m[k]))
                    set_status(p, g->m[k], g->m[k]->phase, NULL, r, "%s", msg);
            return;
        }
    }
    needs nd;
    if(needs_of(st, g, unplaced, &nd)) {
        wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, "the set names more classes than one node can be asked for");
        return;
    }
    char target[BINDER_MAX_NAME + 1];
    if(anchor) {
        /* the set's other claims hold node `anchor`: all of a set on one node */
        const sm_node *n = node_find(st, anchor);
        int room = node_usable(n);
        for(size_t k = 0; room && k < nd.n; k++) {
            binder_slot_view sl;
            room = !binder_node_slot(st->ix, anchor, nd.need[k].class_name, &sl) && sl.offered >= sl.bound &&
                   sl.offered - sl.bound >= nd.need[k].units;
        }
        if(!room) {
            snprintf(msg, sizeof msg, "the other claims of VM %s hold node %s, which has no room for this one",
                     g->set ? g->set->name : "", anchor);
            wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, msg);
            return;
        }
        snprintf(target, sizeof target, "%s", anchor);
    }
    binder_candidate cands[BINDER_MAX_CANDIDATES];
    size_t nc = 0;
    if(!anchor) {
        p->refused = 0;
        nc = candidates_of(p, g, &nd, cands);
        if(nc == 0) {
            snprintf(msg, sizeof msg, "no node has room for %s%s (class %s)", g->set ? "the claims of VM " : "claim ",
                     g->set ? g->set->name : g->m[0]->name, nd.need[0].class_name);
            wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, msg);
            return;
        }
    }
    /* budgets: once per Pending -> Bound, serially (decision 0020 §3);
     * after the index found room and before the chooser runs, so that a
     * set over its budget costs no policy call (decision 0026) */
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(!is_pending(c) || !p->h || !p->h->budget)
            continue;
        binder_claim_status v;
        view_of(c, &v);
        char why[MSG_MAX - 64] = "";
        if(!p->h->budget(p->h->ud, &v, why, sizeof why)) {
            if(why[0])
                snprintf(msg, sizeof msg, "claim %s: %s", c->name, why);
            else
                snprintf(msg, sizeof msg, "claim %s would exceed a budget of namespace %s", c->name, c->ns);
            wait_group(p, g, BINDER_R_OVER_BUDGET, msg);
            return;
        }
    }
    if(!anchor) {
        const char *to = pick_of(p, g, cands, nc);
        if(p->refused)
            group_vol(g);
        if(!to) {
            snprintf(msg, sizeof msg, "no node has room for %s%s (class %s)", g->set ? "the claims of VM " : "claim ",
                     g->set ? g->set->name : g->m[0]->name, nd.need[0].class_name);
            wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, msg);
            return;
        }
        snprintf(target, sizeof target, "%s", to);
    }
    if(bind_group(st, g, unplaced, target, 0) != BINDER_OK) {
        wait_group(p, g, BINDER_R_NO_NODE_WITH_ROOM, "no node has room");
        return;
    }
    for(size_t i = 0; i < g->n; i++) {
        sm_claim *c = g->m[i];
        if(unplaced(c))
            set_status(p, c, BINDER_BOUND, target, BINDER_R_PLACED, "%s on node %s",
                       c->phase == BINDER_LOST ? "placed again" : "placed", target);
    }
}

static int group_has(const group *g, binder_phase ph)
{
    for(size_t i = 0; i < g->n; i++)
        if(g->m[i]->phase == ph && unplaced(g->m[i]))
            return 1;
    return 0;
}

static int group_unplaced(const group *g)
{
    for(size_t i = 0; i < g->n; i++)
        if(unplaced(g->m[i]))
            return 1;
    return 0;
}

/* A node deleted and given again between two passes: claims whose status
 * names it are booked there again (Attached, and Lost waiting for a VMI,
 * even past what it offers: their VMI holds the units; a Bound one only
 * where it fits, else it goes Lost and is placed again). */
static void rebook(pass *p, sm_claim *c)
{
    binder_state *st = p->st;
    if(!c->node || booked(st, c) || !node_find(st, c->node))
        return;
    if(c->phase == BINDER_ATTACHED || (c->phase == BINDER_LOST && c->reason == BINDER_R_WAITING_FOR_VMI_END))
        binder_bind(st->ix, c->ns, c->name, c->node, BINDER_BIND_RESTORE, NULL);
    else if(c->phase == BINDER_BOUND && binder_bind(st->ix, c->ns, c->name, c->node, 0, NULL) != BINDER_OK)
        set_status(p, c, BINDER_LOST, NULL, BINDER_R_NODE_LOST,
                   "node %s came back without room for the claim; waiting for a node with room", c->node);
}

/* Whether a class of node n holds more than it offers; when so, its
 * booked claims are in w. */
static int node_over(binder_state *st, const sm_node *n, cap_walk *w)
{
    w->st = st;
    w->node = n->name;
    w->n = 0;
    binder_node_claims(st->ix, n->name, cap_collect, w);
    for(size_t i = 0; i < w->n; i++) {
        binder_slot_view sl;
        if(!binder_node_slot(st->ix, n->name, w->list[i]->class_name, &sl) && sl.bound > sl.offered)
            return 1;
    }
    return 0;
}

/* One pass over the groups in gl (all of them, or the incremental
 * selection): the steps binder.h lists, in the same order for the groups
 * it has as a full pass. */
static size_t run_pass(binder_state *st, const binder_hooks *hooks, glist *gl, int full)
{
    pass p = {st, hooks, 0, 0};
    /* 0-1. rebook, then status upkeep, claim by claim in creation order */
    size_t nc = 0;
    for(size_t gi = 0; gi < gl->n; gi++)
        nc += gl->g[gi].n;
    sm_claim **cl = malloc((nc + 1) * sizeof *cl);
    if(!cl) {
        st->full = 1;
        return 0;
    }
    nc = 0;
    for(size_t gi = 0; gi < gl->n; gi++)
        for(size_t m = 0; m < gl->g[gi].n; m++)
            cl[nc++] = gl->g[gi].m[m];
    qsort(cl, nc, sizeof *cl, claim_seq_cmp);
    for(size_t i = 0; i < nc; i++)
        rebook(&p, cl[i]);
    for(size_t i = 0; i < nc; i++)
        upkeep(&p, cl[i]);
    free(cl);

    /* the incremental pass widens its selection before the moves: every
     * set on an over-committed node it touches (their classes gain room as
     * the most recent leave), and the waiting sets of each class that
     * gained room since it was last retried, and those waiting on a hook;
     * until nothing is added. A full pass has them all. */
    sm_node **nodes = NULL;
    size_t nn = 0, ncap = 0;
    cap_walk w;
    if(full) {
        ncap = HASH_COUNT(st->nodes) + 1;
        nodes = malloc(ncap * sizeof *nodes);
        if(!nodes) {
            st->full = 1;
            return p.events;
        }
        for(sm_node *n = st->nodes; n; n = n->hh.next)
            nodes[nn++] = n;
    } else {
        size_t scanned = 0, applied = 0;
        int vol_done = 0;
        for(;;) {
            for(; scanned < gl->n; scanned++) {
                group *g = &gl->g[scanned];
                for(size_t m = 0; m < g->n; m++) {
                    sm_node *n = node_find(st, booked(st, g->m[m]));
                    if(!n || n->stamp == st->stamp)
                        continue;
                    n->stamp = st->stamp;
                    if(nn == ncap) {
                        size_t cap = ncap ? ncap * 2 : 32;
                        sm_node **q = realloc(nodes, cap * sizeof *q);
                        if(!q) {
                            free(nodes);
                            st->full = 1;
                            return p.events;
                        }
                        nodes = q;
                        ncap = cap;
                    }
                    nodes[nn++] = n;
                    if(node_over(st, n, &w))
                        for(size_t k = 0; k < w.n; k++) {
                            gain(st, w.list[k]->class_name);
                            gl_add(st, gl, w.list[k]);
                        }
                }
            }
            size_t before = gl->n;
            for(; applied < st->n_gained; applied++) {
                wbucket *b = NULL;
                HASH_FIND_STR(st->waits, st->gained[applied], b);
                for(sm_claim *c = b ? b->head : NULL; c; c = c->wnext)
                    gl_add(st, gl, c);
            }
            if(!vol_done) {
                vol_done = 1;
                wbucket *b = NULL;
                HASH_FIND_STR(st->waits, "", b);
                for(sm_claim *c = b ? b->head : NULL; c; c = c->wnext)
                    gl_add(st, gl, c);
            }
            if(gl->oom) {
                free(nodes);
                st->full = 1;
                return p.events;
            }
            if(gl->n == before && scanned == gl->n)
                break;
        }
    }
    /* the gains retried now are consumed; later ones (a move below
     * freeing room) wait for the next pass */
    size_t consumed = st->n_gained;
    st->gained_floor = consumed;

    group *gs = gl->g;
    size_t ng = gl->n;
    if(ng)
        qsort(gs, ng, sizeof *gs, group_cmp);
    for(size_t i = 0; i < ng; i++)
        for(size_t m = 0; m < gs[i].n; m++) {
            gs[i].m[m]->gi = i;
            gs[i].m[m]->vol = 0;
        }
    enum move_cause *causes = calloc(ng + 1, sizeof *causes);
    if(!causes) {
        free(nodes);
        st->full = 1;
        st->gained_floor = 0;
        return p.events;
    }
    /* 2. sets that must move */
    for(size_t gi = 0; gi < ng; gi++) {
        group *g = &gs[gi];
        for(size_t i = 0; i < g->n; i++) {
            sm_claim *c = g->m[i];
            if(!is_bound(c))
                continue;
            sm_node *n = node_find(st, c->node);
            if(!n)
                causes[gi] = MOVE_GONE;
            else if(n->flags & BINDER_NODE_LAYOUT_PENDING)
                causes[gi] = MOVE_LAYOUT;
            break;
        }
    }
    mark_capacity(st, gs, nodes, nn, causes);
    free(nodes);
    for(size_t gi = 0; gi < ng; gi++) {
        group *g = &gs[gi];
        if(causes[gi] != MOVE_NONE)
            continue;
        for(size_t i = 0; i < g->n; i++) {
            sm_claim *c = g->m[i];
            if(!is_bound(c))
                continue;
            sm_node *n = node_find(st, c->node);
            const sm_class *cl = class_find(st, c->class_name);
            if(n && !(n->flags & BINDER_NODE_READY) && vmi_of(c) == BINDER_VMI_PENDING) {
                /* its VMI waits for a node that cannot run it (decision 0021) */
                causes[gi] = MOVE_NOT_READY;
            } else if(n && !(n->flags & BINDER_NODE_SCHEDULABLE)) {
                if(cl && cl->on_cordon == BINDER_CORDON_STAY)
                    set_status(&p, c, BINDER_BOUND, c->node, BINDER_R_NODE_CORDONED,
                               "node %s is cordoned; class %s has onCordon: Stay, the claim waits there", c->node,
                               c->class_name);
                else
                    causes[gi] = MOVE_CORDON;
            } else if(n && (c->reason == BINDER_R_NODE_CORDONED || c->reason == BINDER_R_LAYOUT_CHANGE_PENDING ||
                            c->reason == BINDER_R_NODE_LOST))
                set_status(&p, c, BINDER_BOUND, c->node, BINDER_R_PLACED, "placed on node %s", c->node);
        }
    }
    for(size_t gi = 0; gi < ng; gi++)
        if(causes[gi] != MOVE_NONE)
            move_group(&p, &gs[gi], causes[gi]);

    /* 3. placement: Lost sets first, then new orders */
    for(int round = 0; round < 2; round++)
        for(size_t gi = 0; gi < ng; gi++) {
            group *g = &gs[gi];
            if(!group_unplaced(g))
                continue;
            int lost = group_has(g, BINDER_LOST);
            if((round == 0) != !!lost)
                continue;
            place_group(&p, g);
        }
    free(causes);
    for(size_t gi = 0; gi < ng; gi++)
        for(size_t m = 0; m < gs[gi].n; m++)
            wait_update(st, gs[gi].m[m]);
    for(size_t i = 0; i < consumed; i++)
        free(st->gained[i]);
    memmove(st->gained, st->gained + consumed, (st->n_gained - consumed) * sizeof *st->gained);
    st->n_gained -= consumed;
    st->gained_floor = 0;
    return p.events;
}


/* Takes the dirty list (claims marked since the last pass). */
static void take_dirty(binder_state *st, glist *gl, int add)
{
    sm_claim *c, *tmp;
    DL_FOREACH_SAFE2(st->dirty, c, tmp, dnext) {
        DL_DELETE2(st->dirty, c, dprev, dnext);
        c->dirty = 0;
        if(add)
            gl_add(st, gl, c);
    }
}

size_t binder_reconcile_all(binder_state *st, const binder_hooks *hooks)
{
    glist gl = {0};
    st->stamp++;
    st->full = 0;
    take_dirty(st, &gl, 0);
    for(sm_claim *c = st->claims; c; c = c->hh.next)
        gl_add(st, &gl, c);
    if(gl.oom) {
        free(gl.g);
        st->full = 1;
        return 0;
    }
    size_t n = run_pass(st, hooks, &gl, 1);
    free(gl.g);
    return n;
}

size_t binder_reconcile(binder_state *st, const binder_hooks *hooks)
{
    if(st->full)
        return binder_reconcile_all(st, hooks);
    glist gl = {0};
    st->stamp++;
    take_dirty(st, &gl, 1);
    if(gl.oom) {
        free(gl.g);
        return binder_reconcile_all(st, hooks);
    }
    size_t n = run_pass(st, hooks, &gl, 0);
    free(gl.g);
    return n;
}

/* ------------------------------------------------------------ restore */

binder_rc binder_state_restore(binder_state *st, cozy_err *err)
{
    binder_index *ix = binder_new();
    if(!ix)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    binder_rc rc = BINDER_OK;
    for(const sm_node *n = st->nodes; n && !rc; n = n->hh.next) {
        binder_node_spec s = spec_of(n);
        rc = binder_node_upsert(ix, n->name, &s, NULL, err);
    }
    for(sm_claim *c = st->claims; c && !rc; c = c->hh.next) {
        rc = binder_claim_upsert(ix, c->ns, c->name, c->class_name, c->count, err);
        int book = c->node && (c->phase == BINDER_BOUND || c->phase == BINDER_ATTACHED || c->phase == BINDER_LOST);
        if(!rc && book && node_find(st, c->node))
            rc = binder_bind(ix, c->ns, c->name, c->node, BINDER_BIND_RESTORE, err);
    }
    if(rc) {
        binder_free(ix);
        return rc;
    }
    binder_free(st->ix);
    st->ix = ix;
    st->full = 1; /* a new leader's first pass looks at every claim */
    return BINDER_OK;
}

/* ------------------------------------------------------------- verify */

binder_rc binder_state_verify(const binder_state *st, cozy_err *err)
{
    binder_rc rc = binder_verify(st->ix, err);
    if(rc)
        return rc;
    for(const sm_claim *c = st->claims; c; c = c->hh.next) {
        const char *b = booked(st, c);
        int should = c->node && node_find(st, c->node) &&
                     (c->phase == BINDER_BOUND || c->phase == BINDER_ATTACHED || c->phase == BINDER_LOST);
        if(should != (b != NULL) || (b && !same(b, c->node)))
            return fail(err, BINDER_ERR_INPUT, "claim %s/%s: %s on node %s but booked on %s", c->ns, c->name,
                        binder_phase_name(c->phase), c->node ? c->node : "(none)", b ? b : "(none)");
        if(c->phase == BINDER_ATTACHED && !vmi_live(vmi_of(c)))
            return fail(err, BINDER_ERR_INPUT, "claim %s/%s: Attached to a VMI that is %s", c->ns, c->name,
                        c->set ? binder_vmi_phase_name(c->set->phase) : "gone");
        if((c->phase == BINDER_PENDING || c->phase == BINDER_LOST) && c->reason == BINDER_R_NONE)
            return fail(err, BINDER_ERR_INPUT, "claim %s/%s: %s without a reason", c->ns, c->name,
                        binder_phase_name(c->phase));
    }
    for(const sm_node *n = st->nodes; n; n = n->hh.next) {
        cap_walk w = {st, n->name, {0}, 0};
        binder_node_claims(st->ix, n->name, cap_collect, &w);
        for(size_t i = 0; i < w.n; i++) {
            binder_slot_view sl;
            if(binder_node_slot(st->ix, n->name, w.list[i]->class_name, &sl) || sl.bound <= sl.offered)
                continue;
            /* over: allowed only while what holds it cannot move yet */
            for(size_t k = 0; k < w.n; k++)
                if(!strcmp(w.list[k]->class_name, w.list[i]->class_name) && movable(w.list[k]) &&
                   vmi_of(w.list[k]) != BINDER_VMI_PENDING)
                    return fail(err, BINDER_ERR_INPUT,
                                "node %s: class %s holds %u units of %u offered, and claim %s/%s could move",
                                n->name, w.list[i]->class_name, sl.bound, sl.offered, w.list[k]->ns,
                                w.list[k]->name);
        }
    }
    return BINDER_OK;
}
