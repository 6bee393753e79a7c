/* binder_internal.h — shared by the binder's files only (binder_store.c,
 * binder_queue.c, binder_choose.c, binder_pass.c, binder_verify.c); not a
 * public interface. The public one is binder.h, which says what each rule
 * is and where it comes from (DESIGN.md §6,
 * docs/decisions/0020-claim-lifecycle-and-binding.md, 0021, 0023).
 *
 * The store's objects (binder_store.c says how they are kept), the state,
 * the scratch types of a pass, and the functions one file calls in
 * another (binder_i_*).
 */
#ifndef COZYGPU_BINDER_BINDER_INTERNAL_H
#define COZYGPU_BINDER_BINDER_INTERNAL_H

#include "binder/binder.h"

#include <stddef.h>
#include <stdint.h>

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

/* The units one namespace holds of one class (DESIGN.md §5 at bind: the
 * budget check's count; binder_state_held_next): its Bound, Attached and
 * Lost claims (binder_phase_holds), plus the Pending ones a pass promised
 * (binder_state_held_promise). Made when a claim first names the pair,
 * freed when its last claim goes, so that counting never allocates. */
typedef struct sm_held {
    sm_tally *tally;            /* the class (its name) */
    uint64_t units;             /* held now */
    uint32_t claims;            /* claims naming the pair, in any phase */
    uint16_t keylen;
    struct sm_held *lnext, *lprev; /* utlist, binder_state.holding, while units > 0 */
    UT_hash_handle hh;          /* binder_state.held, by key */
    char key[];                 /* "ns\0class", in the same allocation */
} sm_held;

/* A claim. Its namespace and name point into its key, its class name
 * into its tally; the fields are ordered to keep it small (100k of them
 * on a leader: decision 0042). */
typedef struct sm_claim {
    const char *ns, *name;   /* in key */
    const char *class_name;  /* held->tally->name */
    sm_held *held;           /* its namespace's units of its class */
    char *node;              /* owned, NULL: none */
    char *attached_to;       /* owned, NULL: none */
    char *msg;               /* the condition's message, owned; NULL: "" */
    struct sm_set *set;
    struct sm_claim *dnext, *dprev;
    struct wbucket *wb; /* the waiting bucket it is in, NULL: none */
    struct sm_claim *wnext, *wprev;
    struct sm_claim *self; /* itself: a lone claim's group lists it from here */
    uint64_t seq;
    uint32_t count;
    binder_phase phase;
    binder_reason reason;
    uint32_t gi;     /* its group in the current pass (scratch) */
    unsigned stamp;  /* pass that took it as a lone group (scratch) */
    unsigned lstamp; /* pass that listed it as a lone group to check lazily (scratch) */
    uint16_t keylen;
    uint8_t tmpl;
    uint8_t dirty; /* on binder_state.dirty */
    uint8_t vol;   /* waits on a hook's answer (budget, chooser), not on room */
    uint8_t promised; /* Pending, its units counted in held (binder_state_held_promise) */
    UT_hash_handle hh; /* binder_state.claims, by key, creation order */
    char key[];        /* "ns\0name", in the same allocation */
} sm_claim;

typedef struct sm_set {
    const char *ns, *name; /* in key */
    sm_claim **claims;     /* owned, or &one */
    sm_claim *one;         /* the claim of a set of one */
    size_t n;
    binder_vmi_phase phase;
    char *node;
    uint64_t seq;
    size_t keylen;
    unsigned stamp; /* pass that took it as a group (scratch) */
    unsigned lstamp; /* pass that listed it to check lazily (scratch) */
    char **allowed;   /* the only nodes the set may go to (a volume bound to them), NULL: any */
    size_t n_allowed;
    struct onode *on;             /* the list of sets whose VMI is on `node`, NULL: not in one */
    struct sm_set *onext, *oprev; /* utlist, in on->head */
    UT_hash_handle hh; /* binder_state.sets, by key, creation order */
    char key[];        /* "ns\0name", in the same allocation */
} sm_set;

/* The sets whose VMI names node `node` (set->node), so that a node's
 * arrival finds them without a walk of every set (binder_i_mark_sets_on). */
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

/* Room gained: class `cls` may have room on node `node` (usable when
 * recorded) that it had not when its waiting claims were last looked at
 * (binder_i_gain). */
typedef struct gain {
    char *cls;
    char *node; /* NULL: anywhere (many nodes gained at once) */
} gain;

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
    gain *gained;        /* room gained on a usable node since the class's waiting claims were last retried */
    size_t n_gained, cap_gained;
    size_t gained_floor; /* during a pass: gained[0..floor) are being retried now; a gain
                            after that point is a new one, for the next pass */
    int full;            /* the next binder_reconcile runs a full pass */
    unsigned stamp;
    onode *on_node;      /* by node name: the sets whose VMI is there */
    sm_tally *tallies;   /* by class name */
    sm_held *held;       /* by "ns\0class" */
    sm_held *holding;    /* utlist, lnext/lprev: those with units > 0 */
    sm_claim **promised; /* the claims promised since the last binder_state_held_settle */
    size_t n_promised, cap_promised;
};


/* cozy_say's message, and `rc` (the binder's own result codes) */
#define fail(err, rc, ...) (cozy_say((err), __VA_ARGS__), (rc))

/* --------------------------------------------------------- pass types */

typedef struct pass {
    binder_state *st;
    const binder_hooks *h;
    size_t events;
    int refused; /* the last binder_i_choose() had candidates and the hook took none */
} pass;

/* The claims of one set (a VM's: its first BINDER_MAX_SET_CLAIMS; or a
 * lone claim), borrowed: a pass lists one per set, so it stays small. */
typedef struct group {
    sm_claim *const *m; /* set->claims, or &claim->self */
    size_t n;
    sm_set *set;
} group;

/* Needs of the claims in g that `pick` selects, and their tolerations. */
typedef struct needs {
    binder_need need[BINDER_MAX_SET_CLASSES];
    size_t n;
    binder_toleration tols[MAX_TOLS * 4];
    size_t n_tols;
} needs;

/* The claims booked on one node (binder_i_cap_collect fills it, at most
 * 256 of them). */
typedef struct cap_walk {
    const binder_state *st;
    const char *node;
    sm_claim *list[256];
    size_t n;
} cap_walk;

/* --------------------------------------------- binder_store.c: store */

char *binder_i_dup_or_null(const char *s);
int binder_i_same(const char *a, const char *b);
sm_class *binder_i_class_find(const binder_state *st, const char *name);
sm_node *binder_i_node_find(const binder_state *st, const char *name);
sm_claim *binder_i_claim_find(const binder_state *st, const char *ns, const char *name);
/* "ns\0name" into buf (KEY_MAX bytes); its length, or 0 when a part is
 * missing or too long (no object has such a key). */
size_t binder_i_key_of(const char *ns, const char *name, char *buf);
/* The tally of class `name`, made when missing; NULL when out of memory. */
sm_tally *binder_i_tally_get(binder_state *st, const char *name);

/* ---------------------------------------- binder_held.c: held units */

/* The held units of namespace `ns` and class `name` (their tally made
 * when missing), one more claim naming them; NULL when out of memory. */
sm_held *binder_i_held_get(binder_state *st, const char *ns, const char *name);
/* One claim fewer names h: freed with the last (its units are 0 then). */
void binder_i_held_put(binder_state *st, sm_held *h);
/* h->units += sign * n, kept on the holding list while above 0. */
void binder_i_held_add(binder_state *st, sm_held *h, int sign, uint32_t n);

/* Adds (sign +1) or removes (-1) claim c in its class's tally and its
 * namespace's held units, at its phase. Removing a promised claim also
 * drops its promise (a phase change or deletion ends it). */
void binder_i_tally(binder_state *st, sm_claim *c, int sign);
void binder_i_view_of(const sm_claim *c, binder_claim_status *out);

/* ----------------------------------- binder_queue.c: dirty and waiting */

void binder_i_mark(binder_state *st, sm_claim *c);
void binder_i_mark_set(binder_state *st, sm_set *s);
/* Class `cls` gained room (or may have) on usable node `node`: its
 * waiting claims' sets are retried by the next pass, each against the
 * nodes that gained (binder_pass.c). Out of memory: the next pass is a
 * full one. */
void binder_i_gain(binder_state *st, const char *cls, const char *node);
/* binder_i_gain for every class node n offers, when n is usable. */
void binder_i_gain_node(binder_state *st, const sm_node *n);
void binder_i_wait_remove(binder_state *st, sm_claim *c);
/* Puts c in the waiting bucket it belongs in after a pass, or none. */
void binder_i_wait_update(binder_state *st, sm_claim *c);
/* Marks the claims booked on node `name`. */
void binder_i_mark_node(binder_state *st, const char *name);
/* Marks the sets whose VMI is scheduled or runs on node `name`. */
void binder_i_mark_sets_on(binder_state *st, const char *name);

/* -------------------------------- binder_choose.c: choosing a node */

int binder_i_needs_of(const binder_state *st, const group *g, int (*pick)(const sm_claim *), needs *out);
/* The candidates for the needs of group g: how many. */
size_t binder_i_candidates_of(pass *p, const group *g, const needs *nd, binder_candidate *cands);
/* The hook's pick among nc >= 1 candidates, or NULL (p->refused set). */
const char *binder_i_pick_of(pass *p, const group *g, const binder_candidate *cands, size_t nc);
/* Candidates for the needs, chosen by the hook, or NULL. */
const char *binder_i_choose(pass *p, const group *g, const needs *nd);
binder_rc binder_i_bind_group(binder_state *st, const group *g, int (*pick)(const sm_claim *), const char *node,
                              uint32_t flags);

/* ------------------------------------------------ binder_pass.c: pass */

/* Status of claim c is unplaced: Pending, or Lost with no node and not
 * waiting for its VMI to end. */
int binder_i_unplaced(const sm_claim *c);
/* Group g is the claims of set s (its first BINDER_MAX_SET_CLAIMS), or
 * the lone claim c (borrowed). */
void binder_i_group_of_set(group *g, sm_set *s);
void binder_i_group_of_claim(group *g, sm_claim *c);
/* Step 3 (placement) for one group with unplaced members. */
void binder_i_place_group(pass *p, group *g);
/* Whether a member of g is unplaced (and of phase ph). */
int binder_i_group_unplaced(const group *g);
int binder_i_group_has(const group *g, binder_phase ph);

/* ------------------------------- binder_lazy.c: waiting sets, lazily */

/* A set (or lone claim) retried because one of its classes gained room,
 * whose claims all wait for room and nothing else (lazy_list): room for
 * it can only be on a node that gained some since it was last looked at,
 * so in step 3 it is placed only when one of those nodes is a candidate
 * for it at its turn, and else left as it is, which is what the full
 * steps would leave (decision 0042). Its signature (classes and units, by
 * class tally) lets sets asking the same be answered once. */
#define LAZY_SIG 4
typedef struct lazy {
    uint64_t seq; /* its oldest claim's creation: its place in line */
    sm_set *set;  /* NULL: the lone claim c */
    sm_claim *c;
    int lost;     /* a claim of it is Lost: placed in the first round */
    size_t nsig;  /* 0: more classes than a signature holds */
    const sm_tally *cls[LAZY_SIG];
    uint32_t units[LAZY_SIG];
} lazy;

typedef struct lzlist {
    lazy *v;
    size_t n, cap;
    int oom;
} lzlist;

/* The nodes that gained room (the gains of this pass and those recorded
 * during it), and the signatures none of them had room for: in step 3
 * room only shrinks (sets are bound, none released), so a set asking the
 * same fits none of them later either. */
#define LAZY_MAX_NODES 16
#define LAZY_MAX_FAIL 32
typedef struct lazy_ctx {
    const char *nodes[LAZY_MAX_NODES];
    size_t n;
    int wide; /* more nodes gained than checked one by one: every listed set is tried as a taken one is */
    lazy fail[LAZY_MAX_FAIL]; /* copies: the list is compacted under them */
    size_t n_fail;
} lazy_ctx;

/* Lists c's group to be checked at its turn when every claim of it waits
 * for room only; 0 when it does not (the pass takes it as any other). */
int binder_i_lazy_list(binder_state *st, lzlist *lz, sm_claim *c);
/* The nodes that gained room, from st->gained. */
void binder_i_lazy_ctx_init(const binder_state *st, lazy_ctx *lc);
/* Before step 3: drops the listed sets no gained node has room for and
 * sorts the rest in line. */
void binder_i_lazy_prune(const binder_state *st, lazy_ctx *lc, lzlist *lz);
/* Step 3 for a listed group at its turn (round 0: Lost sets, 1: the rest). */
void binder_i_lazy_try(pass *p, lazy_ctx *lc, const lazy *e, int round);


/* The node the index books the claim on (NULL: none). */
const char *binder_i_booked(const binder_state *st, const sm_claim *c);
binder_vmi_phase binder_i_vmi_of(const sm_claim *c);
int binder_i_vmi_live(binder_vmi_phase ph);
int binder_i_node_usable(const sm_node *n);
/* binder_node_claims callback: adds the claim to the cap_walk `ud`. */
void binder_i_cap_collect(void *ud, const binder_claim_view *v);
int binder_i_movable(const sm_claim *c);

#endif
