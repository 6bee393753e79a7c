/* policy.c — the binder's Lua hooks and the usage table
 * (policy.h). Rules: DESIGN.md §5 (budgets at bind), §6 (the chooser),
 * docs/decisions/0020 §3 and 0024.
 */
#include "placement/policy.h"

#include <stdio.h>
#include <string.h>

void placement_policy_init(placement_policy *bp, engine *e, const binder_state *st)
{
    memset(bp, 0, sizeof *bp);
    bp->e = e;
    bp->st = st;
    bp->allowed = json_object();
}

void placement_policy_free(placement_policy *bp)
{
    json_decref(bp->allowed);
    bp->allowed = NULL;
}

int placement_policy_holds(binder_phase p)
{
    return p == BINDER_BOUND || p == BINDER_ATTACHED || p == BINDER_LOST;
}

static void usage_add(placement_policy *bp, const char *ns, const char *cls, long long delta)
{
    cozy_err err;
    if(engine_binder_usage_add(bp->e, ns, cls, delta, &err) != COZY_OK)
        bp->last_error = err;
}

typedef struct feed_ctx {
    placement_policy *bp;
    cozy_result rc;
    cozy_err *err;
} feed_ctx;

static void feed_claim(void *ud, const binder_claim_status *c)
{
    feed_ctx *f = ud;
    if(f->rc != COZY_OK || !placement_policy_holds(c->phase))
        return;
    f->rc = engine_binder_usage_add(f->bp->e, c->ns, c->class_name, (long long)c->count, f->err);
}

cozy_result placement_policy_feed(placement_policy *bp, cozy_err *err)
{
    json_object_clear(bp->allowed);
    cozy_result rc = engine_binder_usage_reset(bp->e, err);
    if(rc != COZY_OK)
        return rc;
    feed_ctx f = {bp, COZY_OK, err};
    binder_state_claims(bp->st, feed_claim, &f);
    return f.rc;
}

int placement_policy_choose(placement_policy *bp, const binder_set_view *sv, const binder_candidate *cands, size_t n,
                      engine_binder_choice *out)
{
    engine_binder_choice ch;
    memset(&ch, 0, sizeof ch);
    json_t *claims = json_array(), *list = json_array();
    const binder_index *ix = binder_state_index(bp->st);
    for(size_t i = 0; i < sv->n; i++) {
        const binder_claim_status *c = &sv->claims[i];
        json_array_append_new(claims, json_pack("{s:s,s:s,s:I,s:s,s:o}", "name", c->name, "class", c->class_name,
                                                "count", (json_int_t)c->count, "phase", binder_phase_name(c->phase),
                                                "node", c->node ? json_string(c->node) : json_null()));
    }
    json_t *set = json_pack("{s:s,s:o,s:o}", "namespace", sv->ns, "vm", sv->vm ? json_string(sv->vm) : json_null(),
                            "claims", claims);
    for(size_t k = 0; k < n; k++) {
        json_t *classes = json_object();
        for(size_t i = 0; i < sv->n; i++) {
            binder_slot_view sl = {0, 0};
            binder_node_slot(ix, cands[k].node, sv->claims[i].class_name, &sl);
            json_object_set_new(classes, sv->claims[i].class_name,
                                json_pack("{s:I,s:I,s:I}", "offered", (json_int_t)sl.offered, "bound",
                                          (json_int_t)sl.bound, "free",
                                          (json_int_t)(sl.offered > sl.bound ? sl.offered - sl.bound : 0)));
        }
        json_t *labels = bp->labels ? bp->labels(bp->labels_ud, cands[k].node) : NULL;
        json_array_append_new(list, json_pack("{s:s,s:o,s:o}", "node", cands[k].node, "classes", classes, "labels",
                                              labels ? labels : json_object()));
    }
    cozy_err err;
    cozy_result rc = engine_binder_choose(bp->e, set, list, &ch, &err);
    json_decref(set);
    json_decref(list);
    if(rc == COZY_ERR_INPUT) {
        ch.index = -1;
        ch.outcome = ENGINE_POLICY_ERROR;
        snprintf(ch.message, sizeof ch.message, "the chooser's input: %.400s", err.msg);
    }
    if(ch.outcome != ENGINE_ALLOWED && ch.outcome < ENGINE_OUTCOME_LAST)
        bp->failures[ch.outcome]++;
    if(out)
        *out = ch;
    return ch.index;
}

/* What this pass allowed and is not Bound yet leaves the usage table. */
void placement_policy_settle(placement_policy *bp)
{
    const char *k;
    json_t *v;
    json_object_foreach(bp->allowed, k, v)
    {
        char ns[BINDER_MAX_NAMESPACE + 1];
        const char *slash = strchr(k, '/');
        snprintf(ns, sizeof ns, "%.*s", (int)(slash ? slash - k : 0), k);
        usage_add(bp, ns, json_string_value(json_object_get(v, "class")),
                  -(long long)json_integer_value(json_object_get(v, "count")));
    }
    json_object_clear(bp->allowed);
}

int placement_policy_budget(placement_policy *bp, const binder_claim_status *c, char *why, size_t why_size,
                      engine_binder_verdict *out)
{
    engine_binder_verdict v;
    memset(&v, 0, sizeof v);
    cozy_err err;
    if(engine_binder_budget(bp->e, c->ns, c->class_name, c->count, &v, &err) != COZY_OK) {
        if(v.allow || !v.message[0])
            snprintf(v.message, sizeof v.message, "the budget check failed: %.400s", err.msg);
        v.allow = 0;
    }
    if(out)
        *out = v;
    if(!v.allow) {
        /* the set waits whole: what this pass allowed and is not Bound yet
         * (the set's earlier claims) is taken back now, so no later set of
         * the pass counts it */
        placement_policy_settle(bp);
        snprintf(why, why_size, "%s", v.message);
        return 0;
    }
    char key[BINDER_MAX_NAMESPACE + BINDER_MAX_NAME + 2];
    snprintf(key, sizeof key, "%s/%s", c->ns, c->name);
    json_object_set_new(bp->allowed, key,
                        json_pack("{s:s,s:I}", "class", c->class_name, "count", (json_int_t)c->count));
    usage_add(bp, c->ns, c->class_name, (long long)c->count);
    return 1;
}

void placement_policy_on_event(placement_policy *bp, const binder_event *e)
{
    binder_claim_status cs;
    if(binder_state_claim_get(bp->st, e->ns, e->name, &cs) != BINDER_OK)
        return;
    char key[BINDER_MAX_NAMESPACE + BINDER_MAX_NAME + 2];
    snprintf(key, sizeof key, "%s/%s", e->ns, e->name);
    if(json_object_get(bp->allowed, key) && e->from == BINDER_PENDING && placement_policy_holds(e->to)) {
        json_object_del(bp->allowed, key); /* added when it was allowed */
        return;
    }
    if(placement_policy_holds(e->from) != placement_policy_holds(e->to))
        usage_add(bp, e->ns, cs.class_name, placement_policy_holds(e->to) ? (long long)cs.count : -(long long)cs.count);
}

void placement_policy_on_delete(placement_policy *bp, const char *ns, const char *name)
{
    binder_claim_status cs;
    if(binder_state_claim_get(bp->st, ns, name, &cs) == BINDER_OK && placement_policy_holds(cs.phase))
        usage_add(bp, ns, cs.class_name, -(long long)cs.count);
}

int placement_policy_refuse(json_t *refused, const char *ns, const char *vm, const char *node)
{
    char rk[BINDER_MAX_NAMESPACE + BINDER_MAX_NAME + 2];
    snprintf(rk, sizeof rk, "%s/%s", ns, vm);
    json_t *r = json_object_get(refused, rk);
    if(!r) {
        r = json_object();
        if(json_object_set_new(refused, rk, r) != 0)
            return 0;
    }
    if(json_object_get(r, node) || json_object_size(r) >= PLACEMENT_POLICY_MAX_REFUSED)
        return 0;
    return json_object_set_new(r, node, json_true()) == 0;
}

size_t placement_policy_avoid(const json_t *refused, const binder_set_view *sv, const binder_candidate *cands, size_t n,
                        binder_candidate *kept, size_t *at, size_t *left_out)
{
    const json_t *r = NULL;
    if(sv->vm) {
        char rk[BINDER_MAX_NAMESPACE + BINDER_MAX_NAME + 2];
        snprintf(rk, sizeof rk, "%s/%s", sv->ns, sv->vm);
        r = json_object_get(refused, rk);
    }
    size_t k = 0;
    for(size_t j = 0; j < n && k < BINDER_MAX_CANDIDATES; j++) {
        if(r && json_object_get(r, cands[j].node))
            continue;
        at[k] = j;
        kept[k++] = cands[j];
    }
    *left_out = n - k;
    if(k == 0) /* no elsewhere: they are tried again rather than none */
        for(size_t j = 0; j < n && k < BINDER_MAX_CANDIDATES; j++) {
            at[k] = j;
            kept[k++] = cands[j];
        }
    return k;
}
