/* hooks.c — the binder's hooks on the model (internal.h, pl_): each
 * transition (metrics, the status to write), the chooser
 * (policies/binder.lua, decision 0024), the budget check at bind
 * (DESIGN.md §5, decision 0020 §3), VMI deletions for a move (DESIGN.md
 * §6), and the policy engine's cluster view.
 */
#include "placement/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "format/kobject.h"
#include "placement/read.h"

/* The binder's counters of one transition (decision 0030):
 * placements (a Pending claim Bound: its first node), moves (a Bound claim
 * to another node), rebinds (a Lost claim Bound or Attached again),
 * refusals (a claim left waiting, Pending or Lost, with a new reason), by
 * class, and for a placement the time from the claim's creation
 * (metadata.creationTimestamp, whole seconds) to Bound. */
static void count_transition(placement *L, const binder_event *ev)
{
    binder_claim_status c;
    if(binder_state_claim_get(L->st, ev->ns, ev->name, &c) != BINDER_OK)
        return;
    char *cls = metrics_escape(c.class_name);
    if(!cls)
        return;
    char lb[600];
    if(ev->from == BINDER_PENDING && ev->to == BINDER_BOUND) {
        snprintf(lb, sizeof lb, "class=\"%s\"", cls);
        metrics_counter_add("cozygpu_binder_placements_total", lb, 1);
        json_t *obj = pl_get(L, PLACEMENT_CLAIM, ev->ns, ev->name);
        double age = clock_seconds_since(kobject_meta_str(obj, "creationTimestamp"));
        if(age >= 0)
            metrics_histogram_observe("cozygpu_binder_bind_latency_seconds", lb, age);
        json_decref(obj);
    } else if(ev->from == BINDER_BOUND && ev->to == BINDER_BOUND && ev->from_node && ev->to_node &&
              strcmp(ev->from_node, ev->to_node) != 0) {
        snprintf(lb, sizeof lb, "class=\"%s\"", cls);
        metrics_counter_add("cozygpu_binder_moves_total", lb, 1);
    } else if(ev->from == BINDER_LOST && (ev->to == BINDER_BOUND || ev->to == BINDER_ATTACHED) &&
              !(ev->from_node && ev->to_node && strcmp(ev->from_node, ev->to_node) == 0)) {
        snprintf(lb, sizeof lb, "class=\"%s\"", cls);
        metrics_counter_add("cozygpu_binder_rebinds_total", lb, 1);
    } else if((ev->to == BINDER_PENDING || ev->to == BINDER_LOST) && ev->reason != BINDER_R_NONE) {
        snprintf(lb, sizeof lb, "class=\"%s\",reason=\"%s\"", cls, binder_reason_name(ev->reason));
        metrics_counter_add("cozygpu_binder_refusals_total", lb, 1);
    }
    free(cls);
}

void pl_note(placement *L, const placement_note *n)
{
    if(L->io.note)
        L->io.note(L->io.ud, n);
}

void pl_explain(placement *L, const char *fmt, ...)
{
    if(!L->io.note)
        return;
    char m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    pl_note(L, &(placement_note){.kind = PLACEMENT_NOTE_EXPLAIN, .message = m});
}

static void on_event(void *ud, const binder_event *ev)
{
    placement *L = ud;
    pl_note(L, &(placement_note){.kind = PLACEMENT_NOTE_TRANSITION, .event = ev});
    count_transition(L, ev);
    const char *set = binder_state_claim_set(L->st, ev->ns, ev->name);
    if(set) {
        char vk[600];
        snprintf(vk, sizeof vk, "%s/%s", ev->ns, set);
        keyset_add(&L->recheck, vk); /* does it still cover its VMI's devices? */
    }
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ev->ns, ev->name);
    keyset_add(&L->writes, key);
    metrics_counter_add("cozygpu_binder_transitions_total", NULL, 1);
}

static void on_delete_vmi(void *ud, const char *ns, const char *vmi, const char *why)
{
    placement *L = ud;
    char key[600];
    snprintf(key, sizeof key, "%s/%s", ns, vmi);
    keyset_add(&L->deletes, key);
    log_write(LOG_INFO, "binder", "deleting a pending VMI whose claims left its node", "namespace", ns, "vmi", vmi,
              "why", why, NULL);
}

/* A deadline one second from now for one policy call of the binder (the
 * instruction budget bounds its CPU; this bounds a call stuck otherwise). */
static void policy_deadline(placement *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += 1;
    engine_set_deadline(L->pe, &ts);
}

/* placement_policy's labels: a candidate node's metadata.labels as io
 * shows the Node (new reference, NULL when none). */
static json_t *node_labels(void *ud, const char *node)
{
    placement *L = ud;
    json_t *n = pl_get(L, PLACEMENT_NODE, NULL, node);
    json_t *labels = json_incref(json_object_get(json_object_get(n, "metadata"), "labels"));
    json_decref(n);
    return labels;
}

/* binder_hooks.choose: policies/binder.lua (decision 0024); a failure
 * places in packing order, is counted and logged. */
static int on_choose(void *ud, const binder_set_view *sv, const binder_candidate *cands, size_t n)
{
    placement *L = ud;
    /* a template set does not go back to a node one of its VM's VMIs
     * failed on (DESIGN.md §6, last rule; in memory: a restart forgets) */
    binder_candidate kept[BINDER_MAX_CANDIDATES];
    size_t at[BINDER_MAX_CANDIDATES], left;
    size_t k = placement_policy_avoid(L->refused, sv, cands, n, kept, at, &left);
    L->choose_calls++;
    if(left)
        pl_note(L, &(placement_note){.kind = PLACEMENT_NOTE_AVOIDED, .ns = sv->ns, .name = sv->vm ? sv->vm : "",
                                     .left = left, .candidates = n});
    policy_deadline(L);
    engine_binder_choice ch;
    int i = placement_policy_choose(&L->bp, sv, kept, k, &ch);
    if(i >= 0 && (size_t)i < k)
        i = (int)at[i];
    if(ch.outcome != ENGINE_ALLOWED) {
        pl_note(L, &(placement_note){.kind = PLACEMENT_NOTE_POLICY_FAILED, .outcome = ch.outcome,
                                     .message = ch.message});
        char lbl[64];
        snprintf(lbl, sizeof lbl, "kind=\"%s\"", engine_outcome_name(ch.outcome));
        metrics_counter_add("cozygpu_binder_policy_failures_total", lbl, 1);
        /* at most one line per 10 s (the metric counts every failure) */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
        if(ms >= L->log_quiet_until) {
            char held[32];
            snprintf(held, sizeof held, "%lu", L->log_held);
            log_write(LOG_WARN, "binder", "the binder policy failed; placing in packing order", "namespace", sv->ns,
                      "vm", sv->vm ? sv->vm : "", "gpuclaim", sv->n ? sv->claims[0].name : "", "kind",
                      engine_outcome_name(ch.outcome), "error", ch.message, LOG_NUM "failures_not_logged", held, NULL);
            L->log_quiet_until = ms + 10000;
            L->log_held = 0;
        } else
            L->log_held++;
    }
    return i;
}

/* binder_hooks.budget: the tenant-tree budgets at bind (DESIGN.md §5,
 * decision 0020 §3), fail closed. */
static int on_budget(void *ud, const binder_claim_status *c, char *why, size_t why_size)
{
    placement *L = ud;
    policy_deadline(L);
    engine_binder_verdict v;
    int ok = placement_policy_budget(&L->bp, c, why, why_size, &v);
    if(!ok && v.outcome != ENGINE_ALLOWED)
        pl_note(L, &(placement_note){.kind = PLACEMENT_NOTE_BUDGET_FAILED, .ns = c->ns, .name = c->name,
                                     .outcome = v.outcome, .message = v.message});
    if(!ok && v.outcome != ENGINE_ALLOWED)
        log_write(LOG_WARN, "binder", "the budget check at bind failed; the claim waits", "namespace", c->ns,
                  "gpuclaim", c->name, "kind", engine_outcome_name(v.outcome), "error", v.message, NULL);
    return ok;
}

binder_hooks pl_hooks(placement *L)
{
    return (binder_hooks){.ud = L, .choose = on_choose, .budget = on_budget, .event = on_event,
                          .delete_vmi = on_delete_vmi};
}

void placement_set_policy(placement *L, engine *pe, int changed)
{
    if(!changed && L->pe == pe && L->bp.e == pe)
        return;
    L->pe = pe;
    L->view_dirty = 1;
    placement_policy_free(&L->bp);
    placement_policy_init(&L->bp, L->pe, L->st);
    L->bp.labels = node_labels;
    L->bp.labels_ud = L;
}

/* The policy engine's cluster view (Namespaces, ResourceQuotas,
 * GPUClasses, Running raw-name VMIs: what the budget rules read), set
 * again when one of those changed. */
void pl_policy_view(placement *L)
{
    cozy_err err;
    if(!L->view_dirty || !L->pe)
        return;
    json_t *view = json_array();
    static const placement_kind kinds[] = {PLACEMENT_NAMESPACE, PLACEMENT_QUOTA, PLACEMENT_CLASS};
    for(size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        json_t *items = pl_list(L, kinds[k]);
        size_t i;
        json_t *o;
        json_array_foreach(items, i, o) json_array_append_new(view, pl_with_kind(o, kinds[k]));
        json_decref(items);
    }
    pl_raw_use *r, *rt;
    HASH_ITER(hh, L->raw, r, rt)
    {
        char buf[600];
        const char *ns, *name;
        keyset_split(r->key, buf, sizeof buf, &ns, &name);
        json_t *v = pl_get(L, PLACEMENT_VMI, ns, name);
        if(v)
            json_array_append_new(view, pl_with_kind(v, PLACEMENT_VMI));
        json_decref(v);
    }
    if(engine_set_cluster(L->pe, view, L->settings, &err) != COZY_OK)
        log_write(LOG_ERROR, "binder", "cannot give the binder policy its cluster view", "error", err.msg, NULL);
    else
        L->view_dirty = 0;
    json_decref(view);
}
