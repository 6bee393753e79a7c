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
 *
 * Files (license_internal.h): this one holds the state and its inputs
 * (classes and their source token, namespaces' entitlement, the users);
 * license_copy.c the copy a pair wants and the writes (3);
 * license_status.c the LicenseReady condition (5); license_loop.c the
 * thread, its queue, taking the lead (1), --resync (4).
 */
#include "controller/internal.h"
#include "controller/license_internal.h"

#include <lua.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "base/b64.h"
#include "base/log.h"
#include "engine/luajson.h"
#include "format/kobject.h"

#define PREFIX CTL_LICENSE_PREFIX
#define COND CTL_LICENSE_COND

typedef ctl_license_state state;
typedef ctl_license_class lclass;

/* ------------------------------------------------------------ the state */

int ctl_license_leading(void)
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

void ctl_license_state_drop(state *S)
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
void ctl_license_pair_forget(state *S, const char *ns, const char *cls)
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
json_t *ctl_license_lua_changed(state *S, const char *fn, const json_t *obj, const char *name)
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

int ctl_license_entitled(state *S, const char *ns)
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
void ctl_license_apply_namespace(state *S, const char *name)
{
    json_t *obj = kube_informer_get(ctl_cluster_informer(&KUBE_NAMESPACES), NULL, name);
    json_t *changed = obj ? ctl_license_lua_changed(S, "namespace_set", obj, name) : ctl_license_lua_changed(S, "namespace_gone", NULL, name);
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

int ctl_license_str_eq(const char *a, const char *b)
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
void ctl_license_apply_class(state *S, const char *name)
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
    int moved = licensed != c->licensed || !ctl_license_str_eq(licensed ? sns : NULL, c->src_ns) ||
                !ctl_license_str_eq(licensed ? sname : NULL, c->src_name);
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
void ctl_license_apply_source(state *S, const char *ns, const char *name)
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
            if(!u || !ctl_license_str_eq(json_string_value(json_object_get(u, "uid")), uid ? uid : "") ||
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

void ctl_license_apply_claim(state *S, const char *ns, const char *name)
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
void ctl_license_apply_vmi(state *S, const char *ns, const char *name)
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
