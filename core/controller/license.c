/* license.c — the leader's license copier (internal.h, ctl_license_): the
 * hoster's NVIDIA client configuration token, named by a licensed vGPU
 * class's spec.license.secretRef, copied as the Secret
 * `gpu-license-<class>` into every namespace that is entitled to vGPU and
 * uses the class; the class's `LicenseReady` condition.
 *
 * Rules: DESIGN.md §3 (GPUClass spec.license), §5 (vGPU entitlement: the
 * rule is cozygpu.tenant's vgpu_entitled, asked through runtime.license,
 * never re-implemented here), §8 (licensing); docs/decisions/0004 (the
 * copy's name, the VMI's volume), 0029 (this copier: what a copy holds,
 * who owns it, what a namespace that lost the entitlement keeps, the
 * token check), 0035 (least privilege: what it may read and write).
 *
 * What it reads of Secrets (decision 0035): only those of the controller's
 * own namespace, through a watch of that namespace, where the hoster keeps
 * the token sources. A class whose secretRef names another namespace gets
 * LicenseReady False SecretNamespaceNotAllowed; that Secret is never read.
 * The copies in tenant namespaces are never read, listed or watched: the
 * ServiceAccount has no read access to Secrets outside its namespace, and
 * may only create, update (PUT) and delete Secrets that are copies (RBAC
 * with deploy/56-controller-secrets-policy.yaml).
 *
 * So the leader knows its copies from what it wrote: for every pair
 * (namespace, class) it remembers the copy as its last write answered
 * (S->copies), or that there is none, or that it does not know. It writes
 * by name, idempotently: a PUT of the whole copy (unconditional; 404:
 * create), a create (409: the pair becomes unknown and is PUT), a delete
 * (404 is done), and delete then create when the token changed (the data
 * of an immutable Secret cannot change in place; the PUT answers 422).
 *
 * One thread, like the binder (bind.c). The watcher thread's callbacks
 * record which objects changed ("K:ns/name") and wake it. While this
 * replica leads and every cache has listed, the thread:
 *   1. on taking the lead, reads every namespace (into runtime.license),
 *      class, claim and VMI from the caches once; every pair that has a
 *      user is unknown and asserted: its wanted copy PUT, or, when it
 *      wants none, deleted by name (skipped for a class that is not
 *      licensed and shows no LicenseReady condition: it never had
 *      copies), at most ASSERTS_PER_SEC pairs a second;
 *   2. after that applies each changed object and compares only the pairs
 *      it touches: a claim or VMI its namespace's pairs of its classes, a
 *      namespace the pairs of the namespaces whose entitlement it changed
 *      (itself and those below it in the tenant tree), a class or its
 *      source Secret the pairs of that class;
 *   3. writes a copy only when what it remembers differs from what the
 *      pair wants, each write after checking the Lease; a failed write
 *      stays queued and is retried a second later, a refused one makes the
 *      pair unknown;
 *   4. every --resync re-asserts (PUTs) every copy it remembers and every
 *      unknown pair, at most ASSERTS_PER_SEC a second: a copy deleted or
 *      changed behind its back (a privileged user; anyone on a cluster
 *      without the copies' policy) comes back then, or at once when its
 *      pair needs a write before (a user comes or goes, the token
 *      rotates);
 *   5. writes each class's LicenseReady condition through the status
 *      subresource when it changed (read-modify-write of that condition
 *      only, as status.c does for Accepted), and reports a bad source once
 *      per reason with a log line and a Warning Event on the class. The
 *      condition of a class that stops being licensed is removed only
 *      once none of its pairs waits for a write: until then a next leader
 *      still sees that the class may have copies (1).
 * Losing the lead drops the state.
 */
#include "controller/internal.h"

#include <lua.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uthash.h>

#include "base/b64.h"
#include "base/log.h"
#include "base/metrics.h"
#include "engine/luajson.h"
#include "format/kobject.h"
#include "base/clock.h"

#define PREFIX CTL_LICENSE_PREFIX
#define LABEL_CLASS CTL_LICENSE_CLASS_LABEL
#define LABEL_MANAGED "app.kubernetes.io/managed-by"
#define MANAGED_BY "cozygpu"
#define COND "LicenseReady"
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

/* ------------------------------------------------------------ the state */

/* One GPUClass as the copier sees it. */
typedef struct lclass {
    char *name;
    int licensed;        /* VGPU with spec.license.secretRef (name and namespace) */
    int had_cond;        /* its cached status showed LicenseReady when the lead was taken */
    char *src_ns, *src_name;
    char *resource_name; /* spec.resourceName: a VMI's deviceName maps to the class through it */
    char *token;         /* the source's token when it passed the check, else NULL */
    size_t token_len;
    char *key;           /* the source key it came from */
    char reason[32];     /* LicenseReady: "" (no condition: not licensed), TokenFound, or the failure */
    char message[1024];
    char reported[32];   /* the failure reason last reported (log, Event), "" none */
    json_int_t generation;
    UT_hash_handle hh;
} lclass;

typedef struct state {
    int built;
    engine *e;        /* runtime.license */
    lclass *classes;
    json_t *users;    /* "ns/class" -> {"Kind/name": {"uid": U, "active": bool}} */
    json_t *contrib;  /* "K:ns/name" (claim 'l', VMI 'i') -> {class: true}: what it added to users */
    json_t *ns_classes; /* ns -> {class: true}: pairs with a user or a copy, by namespace */
    json_t *class_ns; /* class -> {ns: true}: the same pairs, by class */
    json_t *copies;   /* "ns/class" -> the copy as the leader's last write answered (managedFields
                         dropped, data strings shared through `tokens`), or null: there is none;
                         no key: unknown (taken the lead, or a write was refused) */
    json_t *tokens;   /* base64 data string -> that string, shared by every remembered copy */
    lkey *due;        /* pairs "ns/class" to compare */
    lkey *asserting;  /* pairs to assert, moved into `due` at ASSERTS_PER_SEC */
    lkey *force;      /* pairs whose next compare writes even when the copy seems as wanted */
    lkey *conds;      /* classes whose condition must be compared and written */
    double budget;    /* asserts allowed now */
    long long budget_ms, next_resync_ms;
} state;

static int leading(void)
{
    return lease_is_leader(ctl_proc->lease);
}

static void class_free(lclass *c)
{
    free(c->name);
    free(c->src_ns);
    free(c->src_name);
    free(c->resource_name);
    free(c->token);
    free(c->key);
    free(c);
}

static void state_drop(state *S)
{
    lclass *c, *t;
    HASH_ITER(hh, S->classes, c, t)
    {
        HASH_DEL(S->classes, c);
        class_free(c);
    }
    json_decref(S->users);
    json_decref(S->contrib);
    json_decref(S->ns_classes);
    json_decref(S->class_ns);
    json_decref(S->copies);
    json_decref(S->tokens);
    keyset_free(&S->due);
    keyset_free(&S->asserting);
    keyset_free(&S->force);
    keyset_free(&S->conds);
    S->users = S->contrib = S->ns_classes = S->class_ns = S->copies = S->tokens = NULL;
    S->built = 0;
    if(S->e) {
        engine_push_runtime_fn(S->e, "reset");
        cozy_err err;
        engine_call(S->e, 0, 0, 0, &err);
    }
}

/* Queues pair (ns, class) and indexes it both ways. A pair first indexed
 * after the lead was taken has no copy (every copy has an owner among the
 * pair's users, so a pair with a copy was found when the lead was taken,
 * or its copy was written since). */
static void pair_touch(state *S, const char *ns, const char *cls)
{
    char key[600];
    if(snprintf(key, sizeof key, "%s/%s", ns, cls) >= (int)sizeof key)
        return;
    keyset_add(&S->due, key);
    json_t *a = json_object_get(S->ns_classes, ns);
    if(!a) {
        a = json_object();
        json_object_set_new(S->ns_classes, ns, a);
    }
    if(S->built && !json_object_get(a, cls) && !json_object_get(S->copies, key))
        json_object_set_new(S->copies, key, json_null());
    json_object_set_new(a, cls, json_true());
    json_t *b = json_object_get(S->class_ns, cls);
    if(!b) {
        b = json_object();
        json_object_set_new(S->class_ns, cls, b);
    }
    json_object_set_new(b, ns, json_true());
}

/* Forgets pair (ns, class) in both indexes (no user, no copy left). */
static void pair_forget(state *S, const char *ns, const char *cls)
{
    json_t *a = json_object_get(S->ns_classes, ns);
    json_object_del(a, cls);
    if(a && json_object_size(a) == 0)
        json_object_del(S->ns_classes, ns);
    json_t *b = json_object_get(S->class_ns, cls);
    json_object_del(b, ns);
    if(b && json_object_size(b) == 0)
        json_object_del(S->class_ns, cls);
    char key[600];
    if(snprintf(key, sizeof key, "%s/%s", ns, cls) < (int)sizeof key)
        json_object_del(S->copies, key);
}

/* Every pair of class `cls` queued (its license or token changed). */
static void class_touch(state *S, const char *cls)
{
    const char *ns;
    json_t *v;
    char key[600];
    json_object_foreach(json_object_get(S->class_ns, cls), ns, v)
    {
        if(snprintf(key, sizeof key, "%s/%s", ns, cls) < (int)sizeof key)
            keyset_add(&S->due, key);
    }
}

/* --- entitlement through runtime.license --- */

/* Calls runtime.license[fn] with one argument (a JSON object, or a string
 * when obj is NULL) and returns the names it answered (a new array), or
 * NULL when it failed (logged). */
static json_t *lua_changed(state *S, const char *fn, const json_t *obj, const char *name)
{
    lua_State *L = engine_lua(S->e);
    engine_push_runtime_fn(S->e, fn);
    if(obj)
        luajson_push(L, obj);
    else
        lua_pushstring(L, name);
    cozy_err err;
    if(engine_call(S->e, 1, 1, 0, &err) != ENGINE_ALLOWED) {
        log_write(LOG_WARN, "license", "runtime.license failed on a namespace", "namespace", name, "error", err.msg,
                  NULL);
        return NULL;
    }
    json_t *out = NULL;
    if(engine_to_json(S->e, -1, &out, &err) != COZY_OK)
        out = NULL;
    lua_pop(L, 1);
    return out;
}

static int entitled(state *S, const char *ns)
{
    lua_State *L = engine_lua(S->e);
    engine_push_runtime_fn(S->e, "entitled");
    lua_pushstring(L, ns);
    cozy_err err;
    if(engine_call(S->e, 1, 1, 0, &err) != ENGINE_ALLOWED) {
        log_write(LOG_WARN, "license", "runtime.license.entitled failed; the namespace counts as not entitled",
                  "namespace", ns, "error", err.msg, NULL);
        return 0;
    }
    int yes = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return yes;
}

/* Namespace `name` from the cache into runtime.license; queues the pairs
 * of every namespace whose entitlement changed. */
static void apply_namespace(state *S, const char *name)
{
    json_t *obj = kube_informer_get(ctl_cluster_informer(&KUBE_NAMESPACES), NULL, name);
    json_t *changed = obj ? lua_changed(S, "namespace_set", obj, name) : lua_changed(S, "namespace_gone", NULL, name);
    json_decref(obj);
    size_t i;
    json_t *n;
    json_array_foreach(changed, i, n)
    {
        const char *ns = json_string_value(n);
        const char *cls;
        json_t *v;
        char key[600];
        json_object_foreach(json_object_get(S->ns_classes, ns ? ns : ""), cls, v)
        {
            if(snprintf(key, sizeof key, "%s/%s", ns, cls) < (int)sizeof key)
                keyset_add(&S->due, key);
        }
    }
    json_decref(changed);
}

/* --- classes and their source --- */

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static int str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Whether class c's source may be read: only Secrets of the controller's
 * own namespace are (decision 0035). */
static int source_allowed(const lclass *c)
{
    return strcmp(c->src_ns, ctl_proc->f.ns) == 0;
}

/* The source Secret of class c from the watch of the controller's
 * namespace: a new reference, or NULL when it does not exist or is
 * elsewhere. */
static json_t *source_of(const lclass *c)
{
    if(!source_allowed(c))
        return NULL;
    return kube_informer_get(ctl_proc->license_src_inf, c->src_ns, c->src_name);
}

static const char *token_problem(const unsigned char *b, size_t n, char *buf, size_t bn)
{
    if(n == 0)
        return "it is empty";
    if(n > CTL_LICENSE_TOKEN_MAX_BYTES) {
        snprintf(buf, bn, "it is %zu bytes, more than %u", n, (unsigned)CTL_LICENSE_TOKEN_MAX_BYTES);
        return buf;
    }
    size_t text = 0;
    for(size_t i = 0; i < n; i++) {
        unsigned char ch = b[i];
        if(ch == '\t' || ch == '\r' || ch == '\n')
            continue;
        if(ch < 0x20 || ch > 0x7e) {
            snprintf(buf, bn, "byte 0x%02x at offset %zu is not printable text", ch, i);
            return buf;
        }
        text += ch != ' '; /* a space is a blank too */
    }
    if(text == 0)
        return "it holds only blanks";
    return NULL;
}

/* The key of the source that holds the token: TOKEN_KEY, or else the only
 * key ending in ".tok" (a token kept under the name the NVIDIA Licensing
 * Portal downloads it as). NULL when neither. */
static const char *token_key(const json_t *data)
{
    if(json_is_string(json_object_get(data, CTL_LICENSE_TOKEN_KEY)))
        return CTL_LICENSE_TOKEN_KEY;
    const char *k, *found = NULL;
    json_t *v;
    int n = 0;
    json_object_foreach((json_t *)data, k, v)
    {
        size_t l = strlen(k);
        if(l > 4 && strcmp(k + l - 4, ".tok") == 0 && json_is_string(v)) {
            found = k;
            n++;
        }
    }
    return n == 1 ? found : NULL;
}

/* Reads class c's source into c->token and the wanted condition; returns
 * 1 when the token or the condition changed. */
static int read_source(state *S, lclass *c)
{
    char *old_token = c->token;
    size_t old_len = c->token_len;
    char old_reason[32], old_message[sizeof c->message];
    snprintf(old_reason, sizeof old_reason, "%s", c->reason);
    snprintf(old_message, sizeof old_message, "%s", c->message);
    c->token = NULL;
    c->token_len = 0;
    free(c->key);
    c->key = NULL;
    if(!c->licensed) {
        c->reason[0] = c->message[0] = 0;
    } else {
        json_t *src = source_of(c);
        const json_t *data = json_object_get(src, "data");
        const char *key = src ? token_key(data) : NULL;
        unsigned char *raw = NULL;
        size_t rawn = 0;
        char why[160];
        const char *problem = NULL;
        if(!source_allowed(c)) {
            snprintf(c->reason, sizeof c->reason, "SecretNamespaceNotAllowed");
            snprintf(c->message, sizeof c->message,
                     "GPUClass %s: the license Secret %s/%s (spec.license.secretRef) is not read: the controller "
                     "reads Secrets only in its own namespace %s; move the Secret there",
                     c->name, c->src_ns, c->src_name, ctl_proc->f.ns);
        } else if(!src) {
            snprintf(c->reason, sizeof c->reason, "SecretNotFound");
            snprintf(c->message, sizeof c->message, "GPUClass %s: the license Secret %s/%s (spec.license.secretRef) is not found",
                     c->name, c->src_ns, c->src_name);
        } else if(!key) {
            snprintf(c->reason, sizeof c->reason, "KeyNotFound");
            snprintf(c->message, sizeof c->message,
                     "GPUClass %s: the license Secret %s/%s (spec.license.secretRef) has no key %s, nor exactly "
                     "one key ending in .tok",
                     c->name, c->src_ns, c->src_name, CTL_LICENSE_TOKEN_KEY);
        } else {
            const char *v = json_string_value(json_object_get(data, key));
            int rc = cozy_base64_decode(v, strlen(v), &raw, &rawn);
            if(rc == -2) {
                snprintf(c->reason, sizeof c->reason, "%s", old_reason);
                snprintf(c->message, sizeof c->message, "%s", old_message);
                c->token = old_token;
                c->token_len = old_len;
                json_decref(src);
                return 0; /* out of memory: keep what was there */
            }
            if(rc != 0)
                problem = "its data is not base64";
            else
                problem = token_problem(raw, rawn, why, sizeof why);
            if(problem) {
                snprintf(c->reason, sizeof c->reason, "NotAToken");
                snprintf(c->message, sizeof c->message,
                         "GPUClass %s: key %s of the license Secret %s/%s (spec.license.secretRef) is not an NVIDIA "
                         "client configuration token: %s",
                         c->name, key, c->src_ns, c->src_name, problem);
                free(raw);
            } else {
                c->token = (char *)raw;
                c->token_len = rawn;
                c->key = strdup(key);
                snprintf(c->reason, sizeof c->reason, "TokenFound");
                snprintf(c->message, sizeof c->message,
                         "GPUClass %s: the token of the license Secret %s/%s (key %s) is copied as Secret %s%s into the "
                         "entitled namespaces that use the class",
                         c->name, c->src_ns, c->src_name, key, PREFIX, c->name);
            }
        }
        json_decref(src);
    }
    int changed = !(old_token == NULL && c->token == NULL) &&
                  !(old_token && c->token && old_len == c->token_len && memcmp(old_token, c->token, old_len) == 0);
    free(old_token);
    if(strcmp(old_reason, c->reason) != 0 || strcmp(old_message, c->message) != 0) {
        keyset_add(&S->conds, c->name);
        changed = 1;
    }
    return changed;
}

/* Class `name` from the cache into the state. */
static void apply_class(state *S, const char *name)
{
    json_t *obj = kube_informer_get(ctl_proc->classes_inf, NULL, name);
    lclass *c;
    HASH_FIND_STR(S->classes, name, c);
    if(!c) {
        if(!obj)
            return;
        c = calloc(1, sizeof *c);
        if(!c || !(c->name = strdup(name))) {
            free(c);
            json_decref(obj);
            return;
        }
        HASH_ADD_KEYPTR(hh, S->classes, c->name, strlen(c->name), c);
    }
    const json_t *spec = json_object_get(obj, "spec");
    const json_t *ref = json_object_get(json_object_get(spec, "license"), "secretRef");
    const char *mode = json_string_value(json_object_get(spec, "mode"));
    const char *sns = json_string_value(json_object_get(ref, "namespace"));
    const char *sname = json_string_value(json_object_get(ref, "name"));
    int licensed = obj && mode && strcmp(mode, "VGPU") == 0 && sns && *sns && sname && *sname;
    int moved = licensed != c->licensed || !str_eq(licensed ? sns : NULL, c->src_ns) ||
                !str_eq(licensed ? sname : NULL, c->src_name);
    c->licensed = licensed;
    free(c->src_ns);
    free(c->src_name);
    c->src_ns = licensed ? strdup(sns) : NULL;
    c->src_name = licensed ? strdup(sname) : NULL;
    free(c->resource_name);
    c->resource_name = dup_or_null(json_string_value(json_object_get(spec, "resourceName")));
    if(!S->built) {
        /* when the lead is taken: a class that shows LicenseReady may have
         * copies, even when it is not licensed any more (the condition
         * goes only once its copies are deleted: write_cond) */
        size_t i;
        json_t *x;
        c->had_cond = 0;
        json_array_foreach(json_object_get(json_object_get(obj, "status"), "conditions"), i, x)
        {
            const char *t = json_string_value(json_object_get(x, "type"));
            if(t && strcmp(t, COND) == 0)
                c->had_cond = 1;
        }
    }
    json_int_t gen = json_integer_value(json_object_get(json_object_get(obj, "metadata"), "generation"));
    if(gen != c->generation)
        keyset_add(&S->conds, c->name);
    c->generation = gen;
    if(licensed && (!c->src_ns || !c->src_name))
        c->licensed = 0; /* out of memory */
    if(read_source(S, c) || moved)
        class_touch(S, name);
    keyset_add(&S->conds, c->name);
    json_decref(obj);
}

/* A source Secret changed (ns/name): every class naming it reads it again. */
static void apply_source(state *S, const char *ns, const char *name)
{
    lclass *c, *t;
    HASH_ITER(hh, S->classes, c, t)
    {
        if(c->licensed && strcmp(c->src_ns, ns) == 0 && strcmp(c->src_name, name) == 0 && read_source(S, c))
            class_touch(S, c->name);
    }
}

/* --- users: claims and VMIs --- */

static int vmi_final(const json_t *vmi)
{
    const char *ph = json_string_value(json_object_get(json_object_get(vmi, "status"), "phase"));
    return ph && (strcmp(ph, "Succeeded") == 0 || strcmp(ph, "Failed") == 0);
}

/* The class whose spec.resourceName is `rn`, or NULL. */
static const char *class_for_resource(state *S, const char *rn)
{
    lclass *c, *t;
    HASH_ITER(hh, S->classes, c, t)
    {
        if(c->resource_name && rn && strcmp(c->resource_name, rn) == 0)
            return c->name;
    }
    return NULL;
}

/* Removes what object `ckey` ("K:ns/name") added to the users and queues
 * its pairs; then adds `classes` ({class: true}) for it as user `ukey`
 * ("Kind/name") with `uid` and `active`. classes NULL: gone. */
static void set_user(state *S, const char *ckey, const char *ns, const char *ukey, json_t *classes, const char *uid,
                     int active)
{
    char key[600];
    const char *cls;
    json_t *v;
    json_t *prev = json_object_get(S->contrib, ckey);
    if(prev && classes && json_equal(prev, classes)) {
        /* the same classes, uid and activity (a status write, a label):
         * no pair changes, none is compared again */
        int same = 1;
        json_object_foreach(classes, cls, v)
        {
            snprintf(key, sizeof key, "%s/%s", ns, cls);
            const json_t *u = json_object_get(json_object_get(S->users, key), ukey);
            if(!u || !str_eq(json_string_value(json_object_get(u, "uid")), uid ? uid : "") ||
               json_is_true(json_object_get(u, "active")) != !!active)
                same = 0;
        }
        if(same) {
            json_decref(classes);
            return;
        }
    }
    json_object_foreach(prev, cls, v)
    {
        if(snprintf(key, sizeof key, "%s/%s", ns, cls) >= (int)sizeof key)
            continue;
        json_t *u = json_object_get(S->users, key);
        json_object_del(u, ukey);
        if(u && json_object_size(u) == 0)
            json_object_del(S->users, key);
        keyset_add(&S->due, key);
    }
    if(!classes || json_object_size(classes) == 0) {
        json_object_del(S->contrib, ckey);
        json_decref(classes);
        return;
    }
    json_object_foreach(classes, cls, v)
    {
        if(snprintf(key, sizeof key, "%s/%s", ns, cls) >= (int)sizeof key)
            continue;
        json_t *u = json_object_get(S->users, key);
        if(!u) {
            u = json_object();
            json_object_set_new(S->users, key, u);
        }
        json_object_set_new(u, ukey, json_pack("{s:s, s:b}", "uid", uid ? uid : "", "active", active));
        pair_touch(S, ns, cls);
    }
    json_object_set_new(S->contrib, ckey, classes);
}

static void apply_claim(state *S, const char *ns, const char *name)
{
    json_t *obj = kube_informer_get(ctl_cluster_informer(&KUBE_GPUCLAIMS), ns, name);
    char ckey[600], ukey[400];
    snprintf(ckey, sizeof ckey, "l:%s/%s", ns, name);
    snprintf(ukey, sizeof ukey, "GPUClaim/%s", name);
    const char *cls = json_string_value(json_object_get(json_object_get(obj, "spec"), "class"));
    json_t *classes = NULL;
    if(obj && cls && *cls) {
        classes = json_object();
        json_object_set_new(classes, cls, json_true());
    }
    set_user(S, ckey, ns, ukey, classes, kobject_meta_str(obj, "uid"), 1);
    json_decref(obj);
}

/* A VMI uses the classes its gpus[] and hostDevices[] deviceNames map to
 * (a class's spec.resourceName, DESIGN.md §3), as the VMI mutation that
 * gives it the license volume reads them (policies/vmi-record.lua). */
static void apply_vmi(state *S, const char *ns, const char *name)
{
    json_t *obj = kube_informer_get(ctl_cluster_informer(&KUBE_VMIS), ns, name);
    char ckey[600], ukey[400];
    snprintf(ckey, sizeof ckey, "i:%s/%s", ns, name);
    snprintf(ukey, sizeof ukey, "VirtualMachineInstance/%s", name);
    json_t *classes = NULL;
    if(obj) {
        const json_t *dev = json_object_get(json_object_get(json_object_get(obj, "spec"), "domain"), "devices");
        static const char *const lists[] = {"gpus", "hostDevices"};
        for(size_t l = 0; l < 2; l++) {
            size_t i;
            json_t *g;
            json_array_foreach(json_object_get(dev, lists[l]), i, g)
            {
                const char *cls = class_for_resource(S, json_string_value(json_object_get(g, "deviceName")));
                if(cls) {
                    if(!classes)
                        classes = json_object();
                    json_object_set_new(classes, cls, json_true());
                }
            }
        }
    }
    set_user(S, ckey, ns, ukey, classes, kobject_meta_str(obj, "uid"), obj && !vmi_final(obj));
    json_decref(obj);
}

/* --- the copy a pair wants --- */

/* The ownerReferences of the copy: the users of the pair, sorted by
 * "Kind/name" (claims before VMIs), at most CTL_LICENSE_MAX_OWNERS; with
 * `active_vmis_only`, only the VMIs that are not final. A new array. */
static json_t *owners_of(const json_t *users, int active_vmis_only)
{
    const char **keys = NULL;
    size_t n = 0, cap = json_object_size(users);
    if(cap)
        keys = calloc(cap, sizeof *keys);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)users, k, v)
    {
        if(!keys)
            break;
        int vmi = strncmp(k, "VirtualMachineInstance/", 23) == 0;
        if(active_vmis_only && (!vmi || !json_is_true(json_object_get(v, "active"))))
            continue;
        if(vmi && !json_is_true(json_object_get(v, "active")))
            continue; /* a final VMI is no user: the copy does not wait for it */
        keys[n++] = k;
    }
    /* insertion sort: the lists are short (one namespace's users of one class) */
    for(size_t i = 1; i < n; i++)
        for(size_t j = i; j > 0 && strcmp(keys[j - 1], keys[j]) > 0; j--) {
            const char *x = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = x;
        }
    json_t *out = json_array();
    for(size_t i = 0; i < n && i < CTL_LICENSE_MAX_OWNERS; i++) {
        int vmi = strncmp(keys[i], "VirtualMachineInstance/", 23) == 0;
        const char *slash = strchr(keys[i], '/');
        json_array_append_new(out, json_pack("{s:s, s:s, s:s, s:s}", "apiVersion",
                                             vmi ? "kubevirt.io/v1" : "cozystack.io/v1alpha1", "kind",
                                             vmi ? "VirtualMachineInstance" : "GPUClaim", "name", slash + 1, "uid",
                                             json_string_value(json_object_get(json_object_get(users, keys[i]), "uid"))));
    }
    free(keys);
    return out;
}

/* The label value naming class `cls`: the name, cut to 63 characters
 * without a trailing '-' or '.' (a label value's limits). */
static void class_label(const char *cls, char *buf, size_t n)
{
    size_t l = strlen(cls);
    if(l > 63)
        l = 63;
    if(l >= n)
        l = n - 1;
    memcpy(buf, cls, l);
    buf[l] = 0;
    while(l > 0 && (buf[l - 1] == '-' || buf[l - 1] == '.'))
        buf[--l] = 0;
}

static json_t *labels_of(const char *cls)
{
    char lv[64];
    class_label(cls, lv, sizeof lv);
    return json_pack("{s:s, s:s}", LABEL_MANAGED, MANAGED_BY, LABEL_CLASS, lv);
}

/* Whether `copy`'s data is exactly the token (one key, its bytes), its
 * type Opaque and it is immutable. */
static int data_matches(const json_t *copy, const lclass *c)
{
    const json_t *data = json_object_get(copy, "data");
    const char *type = json_string_value(json_object_get(copy, "type"));
    if(!json_is_true(json_object_get(copy, "immutable")) || !type || strcmp(type, "Opaque") != 0 ||
       json_object_size(data) != 1 || json_object_get(copy, "stringData"))
        return 0;
    const char *v = json_string_value(json_object_get(data, CTL_LICENSE_TOKEN_KEY));
    if(!v)
        return 0;
    unsigned char *raw = NULL;
    size_t n = 0;
    if(cozy_base64_decode(v, strlen(v), &raw, &n) != 0)
        return 0;
    int same = n == c->token_len && memcmp(raw, c->token, n) == 0;
    free(raw);
    return same;
}

/* Whether `copy`'s metadata is what the pair wants: the two labels, no
 * annotations, these owners. */
static int meta_matches(const json_t *copy, const json_t *labels, const json_t *owners)
{
    const json_t *md = json_object_get(copy, "metadata");
    const json_t *ann = json_object_get(md, "annotations");
    const json_t *refs = json_object_get(md, "ownerReferences");
    if(ann && json_object_size(ann) > 0)
        return 0;
    if(!json_equal((json_t *)json_object_get(md, "labels"), (json_t *)labels))
        return 0;
    if(json_array_size(refs) != json_array_size(owners))
        return 0;
    size_t i;
    json_t *r;
    json_array_foreach(owners, i, r)
    {
        const json_t *x = json_array_get(refs, i);
        static const char *const f[] = {"apiVersion", "kind", "name", "uid"};
        for(size_t j = 0; j < 4; j++)
            if(!str_eq(json_string_value(json_object_get(x, f[j])), json_string_value(json_object_get(r, f[j]))))
                return 0;
        if(json_object_get(x, "controller") || json_object_get(x, "blockOwnerDeletion"))
            return 0;
    }
    return 1;
}

static void count_write(const char *op, const char *result)
{
    char lbl[80];
    snprintf(lbl, sizeof lbl, "op=\"%s\",result=\"%s\"", op, result);
    metrics_counter_add("cozygpu_license_copy_writes_total", lbl, 1);
}


/* Outcome of one write: done, retry (stays queued), or drop (a refusal a
 * retry would repeat: logged; the pair becomes unknown, and its next event
 * or the next --resync tries again). */
enum { W_DONE, W_RETRY, W_DROP };

static int write_outcome(const char *op, const char *ns, const char *cls, cozy_result rc, long code, const json_t *res,
                         const cozy_err *err)
{
    if(rc == COZY_OK && code / 100 == 2) {
        count_write(op, "ok");
        return W_DONE;
    }
    char cs[16];
    snprintf(cs, sizeof cs, "%ld", code);
    const char *msg = rc != COZY_OK ? err->msg : json_string_value(json_object_get(res, "message"));
    count_write(op, rc != COZY_OK || code == 409 || code == 429 || code >= 500 ? "retry" : "error");
    log_write(code == 409 ? LOG_INFO : LOG_WARN, "license", "cannot write the license copy", "op", op, "namespace", ns,
              "gpuclass", cls, LOG_NUM "status", cs, "error", msg ? msg : "", NULL);
    if(rc != COZY_OK || code == 409 || code == 429 || code >= 500)
        return W_RETRY;
    return W_DROP;
}

/* Remembers `res` (what a write of pair `key` answered) as the pair's
 * copy: without managedFields, its data strings shared with every other
 * copy of the same token (S->tokens), so that 10,000 copies of one token
 * hold it once. res NULL: there is none. */
static void remember(state *S, const char *key, const json_t *res)
{
    if(!json_is_object(res)) {
        json_object_set_new(S->copies, key, json_null());
        return;
    }
    json_t *o = json_deep_copy(res);
    if(!o) {
        json_object_del(S->copies, key); /* out of memory: unknown */
        return;
    }
    json_object_del(json_object_get(o, "metadata"), "managedFields");
    json_t *data = json_object_get(o, "data");
    for(void *it = json_object_iter(data); it; it = json_object_iter_next(data, it)) {
        json_t *v = json_object_iter_value(it);
        const char *s = json_string_value(v);
        if(!s)
            continue;
        json_t *shared = json_object_get(S->tokens, s);
        if(!shared)
            json_object_set(S->tokens, s, v);
        else
            json_object_iter_set(data, it, shared);
    }
    json_object_set_new(S->copies, key, o);
}

/* Forgets what the leader knew of pair `key`'s copy: unknown. */
static void forget(state *S, const char *key)
{
    json_object_del(S->copies, key);
}

/* Deletes the copy of pair ns/cls by name, whatever it holds (decision
 * 0004 reserves the name; the Secret-writes policy refuses the delete of a
 * Secret that is not a copy). 404 is done: there is none. */
static int delete_copy(state *S, const char *key, const char *ns, const char *cls)
{
    if(!leading())
        return W_RETRY; /* checked just before each write */
    char name[600];
    snprintf(name, sizeof name, "%s%s", PREFIX, cls);
    long code = 0;
    json_t *res = NULL;
    cozy_err err;
    cozy_result rc = kube_delete(ctl_proc->client, &KUBE_SECRETS, ns, name, &code, &res, &err);
    int w = rc == COZY_OK && code == 404 ? W_DONE : write_outcome("delete", ns, cls, rc, code, res, &err);
    if(w == W_DONE)
        remember(S, key, NULL);
    json_decref(res);
    return w;
}

/* The copy pair ns/class c wants: the token, the labels, the owners. A new
 * object, or NULL (out of memory). */
static json_t *copy_of(const char *ns, const lclass *c, const json_t *labels, const json_t *owners)
{
    char name[600];
    snprintf(name, sizeof name, "%s%s", PREFIX, c->name);
    char *b64 = cozy_base64_encode(c->token, c->token_len);
    if(!b64)
        return NULL;
    json_t *obj = json_pack("{s:s, s:s, s:{s:s, s:s, s:O, s:O}, s:s, s:b, s:{s:s}}", "apiVersion", "v1", "kind",
                            "Secret", "metadata", "name", name, "namespace", ns, "labels", labels, "ownerReferences",
                            owners, "type", "Opaque", "immutable", 1, "data", CTL_LICENSE_TOKEN_KEY, b64);
    free(b64);
    return obj;
}

/* Creates `obj` as pair key's copy. 409: a Secret of the name exists that
 * the leader did not know of; the pair becomes unknown and is PUT on the
 * retry. */
static int create_copy(state *S, const char *key, const char *ns, const char *cls, const json_t *obj)
{
    if(!leading())
        return W_RETRY; /* checked just before each write */
    long code = 0;
    json_t *res = NULL;
    cozy_err err;
    cozy_result rc = kube_create(ctl_proc->client, &KUBE_SECRETS, ns, obj, &code, &res, &err);
    if(rc == COZY_OK && code == 409) {
        json_decref(res);
        forget(S, key);
        return W_RETRY;
    }
    int w = write_outcome("create", ns, cls, rc, code, res, &err);
    if(w == W_DONE)
        remember(S, key, res);
    json_decref(res);
    return w;
}

/* PUTs `obj` (no resourceVersion: an unconditional update) as pair key's
 * copy, without knowing what is there. 404: none is there; it is created
 * when `may_create`. 422 (the token or the type differs: both are
 * immutable) or 403 (a Secret of the name that is not a copy, which the
 * Secret-writes policy keeps the controller from writing): deleted and
 * created when `may_create`, else the pair becomes unknown (a copy whose
 * data must stay, decision 0029 (2), cannot be written without it). */
static int put_copy(state *S, const char *key, const char *ns, const char *cls, const json_t *obj, int may_create)
{
    if(!leading())
        return W_RETRY; /* checked just before each write */
    long code = 0;
    json_t *res = NULL;
    cozy_err err;
    cozy_result rc = kube_update(ctl_proc->client, &KUBE_SECRETS, ns, obj, &code, &res, &err);
    if(rc == COZY_OK && code == 404) {
        json_decref(res);
        remember(S, key, NULL);
        return may_create ? create_copy(S, key, ns, cls, obj) : W_DONE;
    }
    if(rc == COZY_OK && (code == 422 || code == 403) && may_create) {
        json_decref(res);
        int w = delete_copy(S, key, ns, cls);
        return w == W_DONE ? create_copy(S, key, ns, cls, obj) : w;
    }
    int w = write_outcome("update", ns, cls, rc, code, res, &err);
    if(w == W_DONE)
        remember(S, key, res);
    json_decref(res);
    return w;
}

/* Compares pair ns/cls with what the leader knows of its copy and writes
 * the difference. Returns W_DONE (nothing left to do), W_RETRY or W_DROP.
 *
 * The pair wants (docs/decisions/0029):
 *  - a copy with the token, owned by every user (claims, VMIs not final),
 *    when the class is licensed with a valid token and the namespace is
 *    entitled and has a user;
 *  - when the source is bad: an existing copy kept with its data (owners
 *    and labels kept current), none created;
 *  - when the namespace is not entitled: an existing copy kept, data
 *    untouched, while a VMI of the class that is not final runs there
 *    (DESIGN.md §8, "the next VM start"), owned by those VMIs only; none
 *    created;
 *  - else no copy.
 * A copy to keep whose data the leader does not know (it took the lead
 * meanwhile) is left as it is: a PUT needs the data, and the leader cannot
 * read it (decision 0035); it goes by name once the pair wants none. */
static int reconcile_pair(state *S, const char *ns, const char *cls)
{
    lclass *c;
    HASH_FIND_STR(S->classes, cls, c);
    char key[1280];
    snprintf(key, sizeof key, "%s/%s", ns, cls);
    const json_t *users = json_object_get(S->users, key);
    const json_t *mem = json_object_get(S->copies, key); /* NULL: unknown */
    const json_t *copy = json_is_object(mem) ? mem : NULL;
    lkey *fk = keyset_find(S->force, key);
    int known = mem != NULL, force = fk != NULL;
    json_t *labels = labels_of(cls);
    json_t *owners = NULL;
    int keep_data = 0;
    if(c && c->licensed) {
        if(entitled(S, ns)) {
            owners = owners_of(users, 0);
            keep_data = c->token == NULL;
        } else {
            owners = owners_of(users, 1);
            keep_data = 1;
        }
        if(json_array_size(owners) == 0 || (keep_data && known && !copy)) {
            json_decref(owners);
            owners = NULL;
        }
    }
    json_t *obj = NULL;
    int w = W_DONE;
    if(!leading())
        w = W_RETRY;
    else if(!owners) {
        if(!known || copy || force)
            w = delete_copy(S, key, ns, cls);
    } else if(keep_data) {
        if(copy && (force || !meta_matches(copy, labels, owners))) {
            /* the data as it was, the metadata as wanted */
            obj = json_deep_copy(copy);
            json_t *md = json_object_get(obj, "metadata");
            json_object_set(md, "labels", labels);
            json_object_del(md, "annotations");
            json_object_set(md, "ownerReferences", owners);
            json_object_del(md, "resourceVersion");
            w = obj ? put_copy(S, key, ns, cls, obj, 0) : W_RETRY;
        }
    } else if(!(obj = copy_of(ns, c, labels, owners)))
        w = W_RETRY;
    else if(known && !copy && !force)
        w = create_copy(S, key, ns, cls, obj);
    else if(copy && !data_matches(copy, c)) {
        /* the data of an immutable Secret cannot change in place: delete,
         * then create */
        w = delete_copy(S, key, ns, cls);
        if(w == W_DONE)
            w = create_copy(S, key, ns, cls, obj);
    } else if(!copy || force || !meta_matches(copy, labels, owners))
        w = put_copy(S, key, ns, cls, obj, 1);
    if(w == W_DROP)
        forget(S, key);
    if(w != W_RETRY && fk)
        keyset_drop(&S->force, fk);
    if(w == W_DONE && !owners && !json_object_size(users))
        pair_forget(S, ns, cls);
    json_decref(obj);
    json_decref(owners);
    json_decref(labels);
    return w;
}
/* --- the class condition --- */

typedef struct cond_want {
    const char *reason, *message, *now;
    json_int_t generation;
} cond_want;

/* kube_update_retry mutate: sets (or with reason "" removes) the
 * LicenseReady condition, leaving every other condition and status field
 * as read. */
static int set_cond(json_t *obj, void *ctx)
{
    cond_want *w = ctx;
    json_t *status = json_object_get(obj, "status");
    json_t *conds = json_object_get(status, "conditions");
    json_t *mine = NULL;
    size_t i, at = 0;
    json_t *x;
    json_array_foreach(conds, i, x)
    {
        const char *t = json_string_value(json_object_get(x, "type"));
        if(t && strcmp(t, COND) == 0) {
            mine = x;
            at = i;
        }
    }
    if(!*w->reason) {
        if(!mine)
            return 1;
        json_array_remove(conds, at);
        return leading() ? 0 : -1;
    }
    const char *st = strcmp(w->reason, "TokenFound") == 0 ? "True" : "False";
    if(mine) {
        const char *ost = json_string_value(json_object_get(mine, "status"));
        if(str_eq(ost, st) && str_eq(json_string_value(json_object_get(mine, "reason")), w->reason) &&
           str_eq(json_string_value(json_object_get(mine, "message")), w->message) &&
           json_integer_value(json_object_get(mine, "observedGeneration")) == w->generation)
            return 1;
        if(!str_eq(ost, st))
            json_object_set_new(mine, "lastTransitionTime", json_string(w->now));
    } else {
        if(!json_is_object(status)) {
            status = json_object();
            json_object_set_new(obj, "status", status);
        }
        if(!json_is_array(conds)) {
            conds = json_array();
            json_object_set_new(status, "conditions", conds);
        }
        mine = json_pack("{s:s, s:s}", "type", COND, "lastTransitionTime", w->now);
        json_array_append_new(conds, mine);
    }
    json_object_set_new(mine, "status", json_string(st));
    json_object_set_new(mine, "reason", json_string(w->reason));
    json_object_set_new(mine, "message", json_string(w->message));
    json_object_set_new(mine, "observedGeneration", json_integer(w->generation));
    return leading() ? 0 : -1; /* last check before the write */
}

/* Records a Warning Event on GPUClass `obj` (event.c: a cluster-scoped
 * object's Events go to "default", decision 0029 item 7). */
static void class_event(const json_t *obj, const char *reason, const char *message)
{
    ctl_event_record(obj, "cozystack.io/v1alpha1", "GPUClass", "Warning", reason, message);
}

/* Whether the cached class already shows the wanted condition. */
static int cond_shown(const json_t *obj, const lclass *c)
{
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(json_object_get(obj, "status"), "conditions"), i, x)
    {
        const char *t = json_string_value(json_object_get(x, "type"));
        if(t && strcmp(t, COND) == 0)
            return *c->reason && str_eq(json_string_value(json_object_get(x, "reason")), c->reason) &&
                   str_eq(json_string_value(json_object_get(x, "message")), c->message) &&
                   json_integer_value(json_object_get(x, "observedGeneration")) == c->generation;
    }
    return !*c->reason;
}

/* Whether a pair of class `cls` still waits to be compared or asserted. */
static int class_pending(state *S, const char *cls)
{
    const char *ns;
    json_t *v;
    char key[600];
    json_object_foreach(json_object_get(S->class_ns, cls), ns, v)
    {
        if(snprintf(key, sizeof key, "%s/%s", ns, cls) < (int)sizeof key &&
           (keyset_find(S->due, key) || keyset_find(S->asserting, key)))
            return 1;
    }
    return 0;
}

/* Writes the condition of class `name`; 1 when done. A condition to remove
 * (the class is not licensed any more) waits until none of the class's
 * pairs waits: a leader taken over meanwhile still deletes the copies of a
 * class that shows the condition (build). */
static int write_cond(state *S, const char *name)
{
    lclass *c;
    HASH_FIND_STR(S->classes, name, c);
    json_t *obj = kube_informer_get(ctl_proc->classes_inf, NULL, name);
    if(!c || !obj) {
        json_decref(obj);
        return 1;
    }
    int failed = *c->reason && strcmp(c->reason, "TokenFound") != 0;
    if(failed && strcmp(c->reported, c->reason) != 0 && leading()) {
        log_write(LOG_WARN, "license", "the license Secret of a class cannot be copied", "gpuclass", c->name,
                  "reason", c->reason, "error", c->message, NULL);
        class_event(obj, c->reason, c->message);
        snprintf(c->reported, sizeof c->reported, "%s", c->reason);
    } else if(!failed && *c->reported) {
        log_write(LOG_INFO, "license", "the license Secret of a class is readable again", "gpuclass", c->name, NULL);
        c->reported[0] = 0;
    }
    if(cond_shown(obj, c)) {
        json_decref(obj);
        return 1;
    }
    json_decref(obj);
    if(!*c->reason && class_pending(S, name))
        return 0;
    char now[40];
    clock_rfc3339_now(now, sizeof now);
    cond_want w = {c->reason, c->message, now, c->generation};
    json_t *out = NULL;
    cozy_err err;
    int ok = 1;
    if(!leading())
        return 0;
    if(kube_update_retry(ctl_proc->client, &KUBE_GPUCLASSES, NULL, name, 1, set_cond, &w, &out, &err) != COZY_OK) {
        log_write(LOG_WARN, "license", "cannot write GPUClass status", "gpuclass", name, "error", err.msg, NULL);
        ok = strstr(err.msg, "404") != NULL || strstr(err.msg, "NotFound") != NULL;
    }
    json_decref(out);
    return ok;
}


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
        json_decref(lua_changed(S, "namespace_set", o, kobject_meta_str(o, "name")));
    }
    json_decref(list);
    list = kube_informer_list(ctl_proc->classes_inf);
    json_array_foreach(list, i, o)
    {
        if(kobject_meta_str(o, "name"))
            apply_class(S, kobject_meta_str(o, "name"));
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
                apply_claim(S, ns, name);
            else
                apply_vmi(S, ns, name);
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
            case 'c': apply_class(S, name); break;
            case 's': apply_namespace(S, name); break;
            case 'l': apply_claim(S, ns, name); break;
            case 'i': apply_vmi(S, ns, name); break;
            case 'y': apply_source(S, ns, name); break;
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
        if(!leading())
            return;
        char buf[600];
        const char *ns, *cls;
        keyset_split(d->key, buf, sizeof buf, &ns, &cls);
        if(reconcile_pair(S, ns, cls) != W_RETRY)
            keyset_drop(&S->due, d);
    }
    HASH_ITER(hh, S->conds, d, t)
    {
        if(!leading())
            return;
        if(write_cond(S, d->key))
            keyset_drop(&S->conds, d);
    }
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
    for(;;) {
        int stop; /* a second at most: retries of failed writes; asserts */
        lkey *batch = ctl_key_wait(&g_dirty, &g_wake, 1000, &stop);
        if(stop)
            break;
        if(!leading() || !kube_watcher_synced(ctl_proc->watcher)) {
            if(S.built)
                log_write(LOG_INFO, "license", "not leading: the license copier's state is dropped", NULL);
            if(S.built)
                state_drop(&S);
            keyset_free(&batch);
            continue;
        }
        if(!S.built) {
            keyset_free(&batch); /* the caches hold all of it */
            build(&S);
        } else if(batch) {
            apply_batch(&S, batch);
            keyset_free(&batch);
        }
        if(S.next_resync_ms && clock_mono_ms() >= S.next_resync_ms) {
            resync(&S);
            S.next_resync_ms = clock_mono_ms() + ctl_proc->f.resync_ms;
        }
        flush(&S);
    }
    if(S.built)
        state_drop(&S);
    engine_close(S.e);
    pthread_mutex_lock(&ctl_proc->mu);
    keyset_free(&g_dirty);
    pthread_mutex_unlock(&ctl_proc->mu);
    return NULL;
}
