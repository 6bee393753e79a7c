/* binder_held.c — the units each namespace holds of each class, kept in
 * the binder's state for the budget check at bind (binder.h
 * "binder_state_held"; DESIGN.md §5, decision 0020 §3, 0044): the
 * Bound, Attached and Lost claims of the pair plus the Pending ones the
 * check promised in this pass. An entry per (namespace, class) that a
 * claim names, made with the first claim (binder_i_held_get, where a
 * failed allocation refuses the claim) and freed with the last, so that
 * counting (binder_i_held_add, from binder_i_tally) never allocates; the
 * pairs holding units are on a list the walk follows.
 */
#include "binder/binder_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "ns\0name" into buf (KEY_MAX bytes); its length, or 0 when a part is
 * missing or too long (no object has such a key). */
size_t binder_i_key_of(const char *ns, const char *name, char *buf)
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

/* The held units of namespace `ns` and class `name` (their tally made
 * when missing), one more claim naming them; NULL when out of memory. */
sm_held *binder_i_held_get(binder_state *st, const char *ns, const char *name)
{
    char key[KEY_MAX];
    size_t keylen = binder_i_key_of(ns, name, key);
    sm_held *h = NULL;
    HASH_FIND(hh, st->held, key, keylen, h);
    if(!h) {
        sm_tally *t = binder_i_tally_get(st, name);
        if(!t || !(h = calloc(1, sizeof *h + keylen + 1)))
            return NULL;
        memcpy(h->key, key, keylen + 1);
        h->keylen = (uint16_t)keylen;
        h->tally = t;
        HASH_ADD_KEYPTR(hh, st->held, h->key, h->keylen, h);
        if(!h->hh.tbl) {
            free(h);
            return NULL;
        }
    }
    h->claims++;
    return h;
}

/* One claim fewer names h: freed with the last (its units are 0 then). */
void binder_i_held_put(binder_state *st, sm_held *h)
{
    if(!h || --h->claims > 0)
        return;
    if(h->units > 0)
        DL_DELETE2(st->holding, h, lprev, lnext);
    HASH_DEL(st->held, h);
    free(h);
}

/* h->units += sign * n, kept on the holding list while above 0. */
void binder_i_held_add(binder_state *st, sm_held *h, int sign, uint32_t n)
{
    uint64_t was = h->units;
    h->units += (uint64_t)(int64_t)sign * n;
    if(was == 0 && h->units > 0)
        DL_APPEND2(st->holding, h, lprev, lnext);
    else if(was > 0 && h->units == 0)
        DL_DELETE2(st->holding, h, lprev, lnext);
}

int binder_phase_holds(binder_phase p)
{
    return p == BINDER_BOUND || p == BINDER_ATTACHED || p == BINDER_LOST;
}

binder_rc binder_state_held_promise(binder_state *st, const char *ns, const char *name, cozy_err *err)
{
    sm_claim *c = binder_i_claim_find(st, ns, name);
    if(!c)
        return fail(err, BINDER_ERR_NO_CLAIM, "claim %s/%s: not known", ns, name);
    if(c->phase != BINDER_PENDING)
        return fail(err, BINDER_ERR_INPUT, "claim %s/%s: only a Pending claim is promised (it is %s)", ns, name,
                    binder_phase_name(c->phase));
    if(c->promised)
        return BINDER_OK;
    if(st->n_promised == st->cap_promised) {
        size_t cap = st->cap_promised ? st->cap_promised * 2 : 16;
        sm_claim **p = realloc(st->promised, cap * sizeof *p);
        if(!p)
            return fail(err, BINDER_ERR_MEMORY, "out of memory");
        st->promised = p;
        st->cap_promised = cap;
    }
    st->promised[st->n_promised++] = c;
    c->promised = 1;
    binder_i_held_add(st, c->held, +1, c->count);
    return BINDER_OK;
}

void binder_state_held_settle(binder_state *st)
{
    for(size_t i = 0; i < st->n_promised; i++) {
        sm_claim *c = st->promised[i];
        if(c && c->promised) {
            c->promised = 0;
            binder_i_held_add(st, c->held, -1, c->count);
        }
    }
    st->n_promised = 0;
}

int binder_state_held_next(const binder_state *st, const void **pos, const char **ns, const char **class_name,
                           uint64_t *units)
{
    const sm_held *h = *pos ? ((const sm_held *)*pos)->lnext : st->holding;
    *pos = h;
    if(!h)
        return 0;
    *ns = h->key;
    *class_name = h->tally->name;
    *units = h->units;
    return 1;
}

uint64_t binder_state_held(const binder_state *st, const char *ns, const char *class_name)
{
    char key[KEY_MAX];
    size_t keylen = binder_i_key_of(ns, class_name, key);
    if(!keylen)
        return 0;
    sm_held *h = NULL;
    HASH_FIND(hh, st->held, key, keylen, h);
    return h ? h->units : 0;
}
