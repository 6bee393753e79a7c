/* binder_store.c — the binder's store: its objects (classes, nodes,
 * claims, sets) and the binder_state_* calls that set and read them
 * (binder.h says what each rule is and where it comes from: DESIGN.md §6,
 * docs/decisions/0020-claim-lifecycle-and-binding.md, 0021, 0023).
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
 * Each setter marks what the next pass must look at (binder_queue.c); the
 * pass is binder_pass.c, restore and verify binder_verify.c.
 */
#include "binder/binder_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

char *binder_i_dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

int binder_i_same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static int name_ok(const char *s, size_t max)
{
    return s && *s && strlen(s) <= max;
}

sm_class *binder_i_class_find(const binder_state *st, const char *name)
{
    sm_class *c = NULL;
    if(name)
        HASH_FIND_STR(st->classes, name, c);
    return c;
}


sm_tally *binder_i_tally_get(binder_state *st, const char *name)
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


sm_node *binder_i_node_find(const binder_state *st, const char *name)
{
    sm_node *n = NULL;
    if(name)
        HASH_FIND_STR(st->nodes, name, n);
    return n;
}

sm_claim *binder_i_claim_find(const binder_state *st, const char *ns, const char *name)
{
    char buf[KEY_MAX];
    size_t len = binder_i_key_of(ns, name, buf);
    sm_claim *c = NULL;
    if(len)
        HASH_FIND(hh, st->claims, buf, len, c);
    return c;
}

static sm_set *set_find(const binder_state *st, const char *ns, const char *name)
{
    char buf[KEY_MAX];
    size_t len = binder_i_key_of(ns, name, buf);
    sm_set *s = NULL;
    if(len)
        HASH_FIND(hh, st->sets, buf, len, s);
    return s;
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
    free(c->node);
    free(c->attached_to);
    free(c->msg);
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
    if(s->claims != &s->one)
        free(s->claims);
    free(s->node);
    free(s);
}

void binder_i_view_of(const sm_claim *c, binder_claim_status *out)
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
    out->message = c->msg ? c->msg : "";
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
    sm_held *h, *htmp;
    HASH_ITER(hh, st->held, h, htmp)
    {
        HASH_DEL(st->held, h);
        free(h);
    }
    free(st->promised);
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
    for(size_t i = 0; i < st->n_gained; i++) {
        free(st->gained[i].cls);
        free(st->gained[i].node);
    }
    free(st->gained);
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
        copy[i].key = binder_i_dup_or_null(tols[i].key);
        copy[i].op = binder_i_dup_or_null(tols[i].op);
        copy[i].value = binder_i_dup_or_null(tols[i].value);
        copy[i].effect = binder_i_dup_or_null(tols[i].effect);
        oom |= (tols[i].key && !copy[i].key) || (tols[i].op && !copy[i].op) ||
               (tols[i].value && !copy[i].value) || (tols[i].effect && !copy[i].effect);
    }
    sm_class *c = binder_i_class_find(st, name);
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
    sm_class *c = binder_i_class_find(st, name);
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
        n->taints[i].key = binder_i_dup_or_null(spec->taints[i].key);
        n->taints[i].value = binder_i_dup_or_null(spec->taints[i].value);
        n->taints[i].effect = binder_i_dup_or_null(spec->taints[i].effect);
        if(!n->taints[i].key || (spec->taints[i].value && !n->taints[i].value) ||
           (spec->taints[i].effect && !n->taints[i].effect)) {
            n->n_taints++;
            node_free(n);
            return NULL;
        }
    }
    return n;
}

binder_rc binder_state_node_set(binder_state *st, const char *name, const binder_node_spec *spec, cozy_err *err)
{
    if(!name_ok(name, BINDER_MAX_NAME))
        return fail(err, BINDER_ERR_INPUT, "node: empty or too long name");
    sm_node *copy = node_copy(name, spec);
    if(!copy)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    sm_node *old = binder_i_node_find(st, name);
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
    binder_i_mark_node(st, name);
    if(!old || (!(tmp_flags & BINDER_NODE_READY) && (spec->flags & BINDER_NODE_READY)))
        binder_i_mark_sets_on(st, name);
    binder_i_gain_node(st, binder_i_node_find(st, name));
    return BINDER_OK;
}

binder_rc binder_state_node_flags(binder_state *st, const char *name, uint32_t flags, cozy_err *err)
{
    sm_node *n = binder_i_node_find(st, name);
    if(!n)
        return fail(err, BINDER_ERR_NO_NODE, "node %s: not known", name);
    binder_rc rc = binder_node_set_flags(st->ix, name, flags);
    if(rc)
        return fail(err, rc, "node %s: %s", name, binder_strerror(rc));
    uint32_t was = n->flags;
    n->flags = flags;
    binder_i_mark_node(st, name);
    if(!(was & BINDER_NODE_READY) && (flags & BINDER_NODE_READY))
        binder_i_mark_sets_on(st, name);
    binder_i_gain_node(st, n);
    return BINDER_OK;
}

binder_rc binder_state_node_delete(binder_state *st, const char *name, cozy_err *err)
{
    sm_node *n = binder_i_node_find(st, name);
    if(!n)
        return fail(err, BINDER_ERR_NO_NODE, "node %s: not known", name);
    binder_i_mark_node(st, name);
    binder_rc rc = binder_node_delete(st->ix, name, NULL, NULL);
    if(rc)
        return fail(err, rc, "node %s: %s", name, binder_strerror(rc));
    HASH_DEL(st->nodes, n);
    node_free(n);
    return BINDER_OK;
}

/* ------------------------------------------------------------ claims */

void binder_i_tally(binder_state *st, sm_claim *c, int sign)
{
    sm_tally *t = c->held->tally;
    t->units[c->phase] += (uint64_t)(int64_t)sign * c->count;
    t->claims[c->phase] += (uint64_t)(int64_t)sign;
    if(binder_phase_holds(c->phase))
        binder_i_held_add(st, c->held, sign, c->count);
    if(sign < 0 && c->promised) {
        c->promised = 0;
        binder_i_held_add(st, c->held, -1, c->count);
    }
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
    if(binder_i_claim_find(st, ns, name))
        return fail(err, BINDER_ERR_BOUND, "claim %s/%s: known already", ns, name);
    char key[KEY_MAX];
    size_t keylen = binder_i_key_of(ns, name, key);
    sm_claim *c = calloc(1, sizeof *c + keylen + 1);
    if(!c || !(c->held = binder_i_held_get(st, ns, class_name))) {
        free(c);
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    }
    memcpy(c->key, key, keylen + 1);
    c->self = c;
    c->keylen = (uint16_t)keylen;
    c->ns = c->key;
    c->name = c->key + strlen(c->key) + 1;
    c->class_name = c->held->tally->name;
    binder_rc rc = binder_claim_upsert(st->ix, ns, name, class_name, count, err);
    if(rc) {
        binder_i_held_put(st, c->held);
        claim_free(c);
        return rc;
    }
    HASH_ADD_KEYPTR(hh, st->claims, c->key, c->keylen, c);
    if(!c->hh.tbl) {
        binder_claim_delete(st->ix, ns, name);
        binder_i_held_put(st, c->held);
        claim_free(c);
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    }
    binder_claim_tag(st->ix, ns, name, c);
    c->count = count;
    c->tmpl = !!tmpl;
    c->phase = BINDER_PENDING;
    binder_i_tally(st, c, +1);
    c->seq = ++st->seq;
    binder_i_mark(st, c);
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
    char *node = binder_i_dup_or_null(s->node), *att = binder_i_dup_or_null(s->attached_to);
    char *msg = s->message && s->message[0] ? strndup(s->message, MSG_MAX - 1) : NULL;
    if((s->node && !node) || (s->attached_to && !att) || (s->message && s->message[0] && !msg)) {
        free(node);
        free(att);
        free(msg);
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    }
    sm_claim *c;
    binder_rc rc = claim_new(st, s->ns, s->name, s->class_name, s->count, s->template_claim, &c, err);
    if(rc) {
        free(node);
        free(att);
        free(msg);
        return rc;
    }
    binder_i_tally(st, c, -1);
    c->phase = s->phase;
    binder_i_tally(st, c, +1);
    c->node = node;
    c->attached_to = att;
    c->reason = s->reason;
    c->msg = msg;
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
    sm_claim *c = binder_i_claim_find(st, ns, name);
    if(!c)
        return fail(err, BINDER_ERR_NO_CLAIM, "claim %s/%s: not known", ns, name);
    binder_claim_view v;
    if(!binder_claim_get(st->ix, ns, name, &v) && v.node)
        binder_i_gain_node(st, binder_i_node_find(st, v.node));
    binder_claim_delete(st->ix, ns, name);
    if(c->set) {
        set_drop_claim(c->set, c);
        binder_i_mark_set(st, c->set);
    }
    if(c->dirty)
        DL_DELETE2(st->dirty, c, dprev, dnext);
    binder_i_wait_remove(st, c);
    if(c->promised)
        for(size_t i = 0; i < st->n_promised; i++)
            if(st->promised[i] == c)
                st->promised[i] = NULL;
    binder_i_tally(st, c, -1);
    binder_i_held_put(st, c->held);
    HASH_DEL(st->claims, c);
    claim_free(c);
    return BINDER_OK;
}

void binder_state_class_view(const binder_state *st, const char *name, binder_class_view *out)
{
    memset(out, 0, sizeof *out);
    if(!name || !*name)
        return;
    const sm_class *k = binder_i_class_find(st, name);
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
    sm_claim *c = binder_i_claim_find(st, ns, name);
    if(!c)
        return BINDER_ERR_NO_CLAIM;
    binder_i_view_of(c, out);
    return BINDER_OK;
}

void binder_state_claims(const binder_state *st, void (*fn)(void *ud, const binder_claim_status *c), void *ud)
{
    for(const sm_claim *c = st->claims; c; c = c->hh.next) {
        binder_claim_status v;
        binder_i_view_of(c, &v);
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
        sm_claim *c = claims[i] ? binder_i_claim_find(st, ns, claims[i]) : NULL;
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
    char *nodecopy = binder_i_dup_or_null(node);
    sm_set *s = old;
    if(!s) {
        char key[KEY_MAX];
        size_t keylen = binder_i_key_of(ns, name, key);
        s = calloc(1, sizeof *s + keylen + 1);
        if(s) {
            memcpy(s->key, key, keylen + 1);
            s->keylen = keylen;
            s->ns = s->key;
            s->name = s->key + strlen(s->key) + 1;
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
        binder_i_mark_set(st, old);
        for(size_t i = 0; i < old->n; i++)
            old->claims[i]->set = NULL;
    } else
        s->seq = ++st->seq;
    if(s->claims != &s->one)
        free(s->claims);
    if(n_claims == 1) {
        s->one = list[0];
        free(list);
        list = s->claims = &s->one;
    } else
        s->claims = list;
    s->n = n_claims;
    for(size_t i = 0; i < n_claims; i++)
        list[i]->set = s;
    binder_i_mark_set(st, s);
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
    char *copy = binder_i_dup_or_null(node);
    if(node && !copy)
        return fail(err, BINDER_ERR_MEMORY, "out of memory");
    on_node_unlink(st, s);
    free(s->node);
    s->node = copy;
    s->phase = phase;
    on_node_link(st, s);
    binder_i_mark_set(st, s);
    return BINDER_OK;
}

binder_rc binder_state_set_delete(binder_state *st, const char *ns, const char *name, cozy_err *err)
{
    sm_set *s = set_find(st, ns, name);
    if(!s)
        return fail(err, BINDER_ERR_NO_CLAIM, "VM %s/%s: not known", ns, name);
    binder_i_mark_set(st, s);
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
    binder_i_mark_set(st, s);
    return BINDER_OK;
}

const char *binder_state_claim_set(const binder_state *st, const char *ns, const char *name)
{
    sm_claim *c = binder_i_claim_find(st, ns, name);
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
