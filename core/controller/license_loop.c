/* license_loop.c — the license copier's thread and its queue
 * (license_internal.h, ctl_license_): the watcher thread's callbacks
 * record which objects changed ("K:ns/name") and wake it; while this
 * replica leads and every cache has listed, the thread builds its state
 * from the caches on taking the lead (every pair with a user asserted),
 * then applies each changed object, re-asserts every --resync, and
 * compares and writes the pairs and class conditions due, the asserts at
 * most ASSERTS_PER_SEC a second. Losing the lead drops the state.
 *
 * Rules: license.c's header (the steps 1-5), DESIGN.md §8,
 * docs/decisions/0029, 0035.
 */
#include "controller/internal.h"
#include "controller/license_internal.h"

#include <stdio.h>
#include <uthash.h>

#include "base/clock.h"
#include "base/log.h"
#include "engine/luajson.h"
#include "format/kobject.h"

/* pairs asserted (written without knowing the copy: on taking the lead,
 * every --resync) per second at most, so that a leader change or a resync
 * at 10,000 pairs is a steady trickle of PUTs, not a burst */
#define ASSERTS_PER_SEC 25

/* ------------------------------------------------------------ dirty keys */

typedef ctl_key lkey; /* keys.c */

static lkey *g_dirty; /* mu */
static int g_wake;    /* mu: leadership changed */


void ctl_license_on_event(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    (void)inf, (void)type;
    char kind = (char)(intptr_t)ctx;
    ctl_key_queue_object(&g_dirty, kind, obj);
}

void ctl_license_on_leader_change(void *ctx, int leading)
{
    (void)ctx, (void)leading;
    pthread_mutex_lock(&ctl_proc->mu);
    g_wake = 1;
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
}

typedef ctl_license_state state;
typedef ctl_license_class lclass;

/* --- the loop --- */

static void build(state *S)
{
    long long t0 = clock_mono_ms();
    S->users = json_object();
    S->contrib = json_object();
    S->ns_classes = json_object();
    S->class_ns = json_object();
    S->copies = json_object();
    S->tokens = json_object();
    S->budget = ASSERTS_PER_SEC;
    S->budget_ms = t0;
    S->next_resync_ms = ctl_proc->f.resync_ms > 0 ? t0 + ctl_proc->f.resync_ms : 0;
    engine_push_runtime_fn(S->e, "reset");
    cozy_err err;
    engine_call(S->e, 0, 0, 0, &err);
    engine_push_runtime_fn(S->e, "settings");
    luajson_push(engine_lua(S->e), ctl_proc->settings);
    engine_call(S->e, 1, 0, 0, &err);
    json_t *list = kube_informer_list(ctl_cluster_informer(&KUBE_NAMESPACES));
    size_t i;
    json_t *o;
    json_array_foreach(list, i, o)
    {
        json_decref(ctl_license_lua_changed(S, "namespace_set", o, kobject_meta_str(o, "name")));
    }
    json_decref(list);
    list = kube_informer_list(ctl_proc->classes_inf);
    json_array_foreach(list, i, o)
    {
        if(kobject_meta_str(o, "name"))
            ctl_license_apply_class(S, kobject_meta_str(o, "name"));
    }
    json_decref(list);
    static const kube_resource *const kinds[] = {&KUBE_GPUCLAIMS, &KUBE_VMIS};
    for(size_t k = 0; k < 2; k++) {
        list = kube_informer_list(ctl_cluster_informer(kinds[k]));
        json_array_foreach(list, i, o)
        {
            const char *ns = kobject_meta_str(o, "namespace"), *name = kobject_meta_str(o, "name");
            if(!ns || !name)
                continue;
            if(kinds[k] == &KUBE_GPUCLAIMS)
                ctl_license_apply_claim(S, ns, name);
            else
                ctl_license_apply_vmi(S, ns, name);
        }
        json_decref(list);
    }
    /* every pair found has a user; what is in its namespace is unknown,
     * and asserted, except for a class that has no license and shows no
     * LicenseReady condition: it never had copies */
    unsigned pairs = 0, asserted = 0;
    lkey *d, *t;
    HASH_ITER(hh, S->due, d, t)
    {
        char buf[600];
        const char *ns, *cls;
        keyset_split(d->key, buf, sizeof buf, &ns, &cls);
        lclass *c;
        HASH_FIND_STR(S->classes, cls, c);
        pairs++;
        if(c && !c->licensed && !c->had_cond) {
            json_object_set_new(S->copies, d->key, json_null());
            continue;
        }
        asserted++;
        keyset_add(&S->asserting, d->key);
        keyset_drop(&S->due, d);
    }
    S->built = 1;
    char np[24], na[24], ms[24];
    snprintf(np, sizeof np, "%u", pairs);
    snprintf(na, sizeof na, "%u", asserted);
    snprintf(ms, sizeof ms, "%lld", clock_mono_ms() - t0);
    log_write(LOG_INFO, "license", "leading: every license copy is asserted once", LOG_NUM "pairs", np,
              LOG_NUM "asserted", na, LOG_NUM "read_ms", ms, NULL);
}

/* --resync: every copy the leader remembers is PUT again (a copy deleted
 * or changed behind its back comes back), every unknown pair asserted. */
static void resync(state *S)
{
    const char *cls, *ns;
    json_t *nss, *v;
    char key[600];
    json_object_foreach(S->class_ns, cls, nss)
    {
        json_object_foreach(nss, ns, v)
        {
            if(snprintf(key, sizeof key, "%s/%s", ns, cls) >= (int)sizeof key)
                continue;
            const json_t *mem = json_object_get(S->copies, key);
            if(json_is_null(mem))
                continue; /* none there, none wanted since: nothing to assert */
            if(mem)
                keyset_add(&S->force, key);
            keyset_add(&S->asserting, key);
        }
    }
}

/* Moves as many pairs from `asserting` to `due` as the budget allows
 * (ASSERTS_PER_SEC). */
static void promote_asserts(state *S)
{
    long long now = clock_mono_ms();
    S->budget += (double)(now - S->budget_ms) * ASSERTS_PER_SEC / 1000.0;
    if(S->budget > ASSERTS_PER_SEC)
        S->budget = ASSERTS_PER_SEC;
    S->budget_ms = now;
    lkey *d, *t;
    HASH_ITER(hh, S->asserting, d, t)
    {
        if(S->budget < 1)
            break;
        S->budget -= 1;
        keyset_add(&S->due, d->key);
        keyset_drop(&S->asserting, d);
    }
}

static void apply_batch(state *S, lkey *batch)
{
    /* classes and namespaces first: a claim or VMI of the same batch maps
     * to classes through them */
    for(int pass = 0; pass < 2; pass++) {
        lkey *d, *t;
        HASH_ITER(hh, batch, d, t)
        {
            char kind = d->key[0];
            int first = kind == 'c' || kind == 's';
            if(first != (pass == 0))
                continue;
            char buf[600];
            const char *ns, *name;
            keyset_split(d->key + 2, buf, sizeof buf, &ns, &name);
            switch(kind) {
            case 'c': ctl_license_apply_class(S, name); break;
            case 's': ctl_license_apply_namespace(S, name); break;
            case 'l': ctl_license_apply_claim(S, ns, name); break;
            case 'i': ctl_license_apply_vmi(S, ns, name); break;
            case 'y': ctl_license_apply_source(S, ns, name); break;
            default: break;
            }
        }
    }
}

static void flush(state *S)
{
    promote_asserts(S);
    lkey *d, *t;
    HASH_ITER(hh, S->due, d, t)
    {
        if(!ctl_license_leading())
            return;
        char buf[600];
        const char *ns, *cls;
        keyset_split(d->key, buf, sizeof buf, &ns, &cls);
        if(ctl_license_reconcile_pair(S, ns, cls) != CTL_LICENSE_W_RETRY)
            keyset_drop(&S->due, d);
    }
    HASH_ITER(hh, S->conds, d, t)
    {
        if(!ctl_license_leading())
            return;
        if(ctl_license_write_cond(S, d->key))
            keyset_drop(&S->conds, d);
    }
}

/* ------------------------------------------------- the writer (writer.c) */

static int lw_build(void *ud)
{
    build(ud);
    return 0;
}

static void lw_apply(void *ud, ctl_key *batch)
{
    apply_batch(ud, batch);
}

static void lw_work(void *ud, int had_batch)
{
    (void)had_batch;
    state *S = ud;
    if(S->next_resync_ms && clock_mono_ms() >= S->next_resync_ms) {
        resync(S);
        S->next_resync_ms = clock_mono_ms() + ctl_proc->f.resync_ms;
    }
    flush(S);
}

static void lw_drop(void *ud)
{
    state *S = ud;
    if(S->built)
        ctl_license_state_drop(S);
}

void *ctl_license_main(void *arg)
{
    (void)arg;
    state S = {0};
    engine_options eo = ctl_proc->eo;
    eo.bundle_dir = NULL;
    cozy_err err;
    if(engine_open_runtime(&S.e, &eo, "license", &err) != COZY_OK) {
        log_write(LOG_ERROR, "license", "cannot open runtime.license; license Secrets are not copied", "error",
                  err.msg, NULL);
        return NULL;
    }
    /* a second at most between wakes: retries of failed writes; asserts */
    const ctl_writer w = {.component = "license",
                          .dropped = "not leading: the license copier's state is dropped",
                          .queue = &g_dirty,
                          .wake = &g_wake,
                          .ud = &S,
                          .build = lw_build,
                          .apply = lw_apply,
                          .work = lw_work,
                          .drop = lw_drop};
    ctl_writer_run(&w);
    engine_close(S.e);
    pthread_mutex_lock(&ctl_proc->mu);
    keyset_free(&g_dirty);
    pthread_mutex_unlock(&ctl_proc->mu);
    return NULL;
}
