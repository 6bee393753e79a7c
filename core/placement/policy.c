/* policy.c — the binder's Lua hooks (policy.h): the chooser and the
 * budget check at bind over the state's held units. Rules: DESIGN.md §5
 * (budgets at bind), §6 (the chooser), docs/decisions/0020 §3, 0024, 0044.
 */
#include "placement/policy.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

void placement_policy_init(placement_policy *bp, engine *e, binder_state *st)
{
    memset(bp, 0, sizeof *bp);
    bp->e = e;
    bp->st = st;
}

void placement_policy_free(placement_policy *bp)
{
    (void)bp;
}

/* engine_held over the binder's state (binder_state_held_next). */
static int held_next(void *ud, const void **pos, const char **ns, const char **class_name, long long *units)
{
    uint64_t u = 0;
    if(!binder_state_held_next(ud, pos, ns, class_name, &u))
        return 0;
    *units = u > (uint64_t)LLONG_MAX ? LLONG_MAX : (long long)u;
    return 1;
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

void placement_policy_settle(placement_policy *bp)
{
    binder_state_held_settle(bp->st);
}

int placement_policy_budget(placement_policy *bp, const binder_claim_status *c, char *why, size_t why_size,
                      engine_binder_verdict *out)
{
    engine_binder_verdict v;
    memset(&v, 0, sizeof v);
    cozy_err err;
    engine_held held = {bp->st, held_next};
    if(engine_binder_budget(bp->e, c->ns, c->class_name, c->count, &held, &v, &err) != COZY_OK) {
        if(v.allow || !v.message[0])
            snprintf(v.message, sizeof v.message, "the budget check failed: %.400s", err.msg);
        v.allow = 0;
    }
    if(v.allow && binder_state_held_promise(bp->st, c->ns, c->name, &err) != BINDER_OK) {
        /* not counted, so not allowed: the next claim would not see it */
        v.allow = 0;
        v.outcome = ENGINE_POLICY_ERROR;
        snprintf(v.message, sizeof v.message, "the budget check failed: cannot count the claim's units: %.400s",
                 err.msg);
    }
    if(out)
        *out = v;
    if(!v.allow) {
        /* the set waits whole: what this pass allowed and is not Bound yet
         * (the set's earlier claims) is released now, so no later set of
         * the pass counts it */
        binder_state_held_settle(bp->st);
        snprintf(why, why_size, "%s", v.message);
        return 0;
    }
    return 1;
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
