/* sim_store.c — the in-memory API server of `cozygpu simulate` (sim.h):
 * objects by kind, with what kube-apiserver and the garbage collector do
 * to them (resourceVersion on every write, uid and creationTimestamp on
 * create, a status subresource that takes only status, preconditions,
 * finalizers holding a deletion, dependents deleted with their owner:
 * k8s.io/apiserver registry/generic/registry/store.go, and the garbage
 * collector's background propagation), and the placement model's io over
 * it. Not a general API server: the few writes the model and KubeVirt's
 * part make.
 */
#include "cli/sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "format/kobject.h"

/* The creationTimestamp of the first object the store makes
 * (2026-01-01T00:00:00Z). */
#define SIM_EPOCH ((time_t)1767225600)

struct sim_store {
    json_t *objs[PLACEMENT_KINDS]; /* "ns/name" -> object (insertion order) */
    unsigned long long rv;         /* the last resourceVersion given */
    unsigned long long uid;        /* the last uid given */
    unsigned long long created;    /* objects created: the next creationTimestamp's offset (seconds) */
    keyset *changes;               /* keys changed since sim_store_changes */
    void (*note)(void *ud, const placement_note *n);
    void *note_ud;
};

sim_store *sim_store_new(void)
{
    sim_store *st = calloc(1, sizeof *st);
    if(!st)
        return NULL;
    for(int k = 0; k < PLACEMENT_KINDS; k++)
        if(!(st->objs[k] = json_object())) {
            sim_store_free(st);
            return NULL;
        }
    return st;
}

void sim_store_free(sim_store *st)
{
    if(!st)
        return;
    for(int k = 0; k < PLACEMENT_KINDS; k++)
        json_decref(st->objs[k]);
    keyset_free(&st->changes);
    free(st);
}

static void key_of(const char *ns, const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", ns ? ns : "", name);
}

json_t *sim_store_get(sim_store *st, placement_kind k, const char *ns, const char *name)
{
    if(!name || k >= PLACEMENT_KINDS)
        return NULL;
    char key[600];
    key_of(ns, name, key, sizeof key);
    return json_incref(json_object_get(st->objs[k], key));
}

json_t *sim_store_list(sim_store *st, placement_kind k)
{
    json_t *a = json_array();
    const char *key;
    json_t *o;
    if(k < PLACEMENT_KINDS)
        json_object_foreach(st->objs[k], key, o) json_array_append(a, o);
    return a;
}

/* Records a change of `obj` of kind k and gives it the next
 * resourceVersion. */
static void changed(sim_store *st, placement_kind k, json_t *obj)
{
    char rv[32], key[700];
    snprintf(rv, sizeof rv, "%llu", ++st->rv);
    json_t *md = json_object_get(obj, "metadata");
    json_object_set_new(md, "resourceVersion", json_string(rv));
    if(placement_key_of(k, obj, key, sizeof key))
        keyset_add(&st->changes, key);
}

/* Whether `obj` is being deleted and holds no finalizer any more. */
static int released(const json_t *obj)
{
    return kobject_meta_str(obj, "deletionTimestamp") &&
           json_array_size(json_object_get(json_object_get(obj, "metadata"), "finalizers")) == 0;
}

static void drop(sim_store *st, placement_kind k, const char *key);

/* The store's key of `obj` into key (n bytes); -1 (obj released) when it
 * has no metadata.name. */
static int obj_key(json_t *obj, char *key, size_t n)
{
    const char *name = kobject_meta_str(obj, "name");
    if(!name) {
        json_decref(obj);
        return -1;
    }
    key_of(kobject_meta_str(obj, "namespace"), name, key, n);
    return 0;
}

long sim_store_create(sim_store *st, placement_kind k, json_t *obj)
{
    char key[600];
    if(obj_key(obj, key, sizeof key))
        return 422;
    if(json_object_get(st->objs[k], key)) {
        json_decref(obj);
        return 409;
    }
    json_t *md = json_object_get(obj, "metadata");
    if(!kobject_meta_str(obj, "uid")) { /* a snapshot's object keeps its own */
        char uid[64];
        snprintf(uid, sizeof uid, "sim-%08llx", ++st->uid);
        json_object_set_new(md, "uid", json_string(uid));
    }
    if(!json_is_integer(json_object_get(md, "generation")))
        json_object_set_new(md, "generation", json_integer(1));
    if(!kobject_meta_str(obj, "creationTimestamp")) {
        /* one second apart, in the order created: a new leader takes
         * claims by creationTimestamp (whole seconds), as in a cluster
         * where they were made that far apart */
        char ts[32];
        json_object_set_new(md, "creationTimestamp", json_string(clock_rfc3339(SIM_EPOCH + (time_t)st->created++, ts,
                                                                               sizeof ts)));
    }
    if(!json_object_get(obj, "apiVersion"))
        json_object_set_new(obj, "apiVersion", json_string(placement_api_version[k]));
    if(!json_object_get(obj, "kind"))
        json_object_set_new(obj, "kind", json_string(placement_kind_name[k]));
    changed(st, k, obj);
    json_object_set_new(st->objs[k], key, obj);
    if(released(obj))
        drop(st, k, key); /* being deleted with nothing holding it: the API server would not keep it */
    return 201;
}

static void collect(sim_store *st, const char *uid);

/* Removes the object at key of kind k (it has no finalizer left) and
 * deletes its dependents. */
static void drop(sim_store *st, placement_kind k, const char *key)
{
    json_t *o = json_incref(json_object_get(st->objs[k], key));
    if(!o)
        return;
    char ck[700];
    if(placement_key_of(k, o, ck, sizeof ck))
        keyset_add(&st->changes, ck);
    st->rv++;
    json_object_del(st->objs[k], key);
    char uid[64];
    snprintf(uid, sizeof uid, "%s", kobject_meta_str(o, "uid") ? kobject_meta_str(o, "uid") : "");
    json_decref(o);
    if(*uid)
        collect(st, uid);
}

/* The garbage collector: every object whose ownerReferences name `uid`
 * is deleted (background propagation: after the owner is gone). */
static void collect(sim_store *st, const char *uid)
{
    for(int k = 0; k < PLACEMENT_KINDS; k++) {
        json_t *doomed = json_array();
        const char *key;
        json_t *o;
        json_object_foreach(st->objs[k], key, o)
        {
            size_t i;
            json_t *r;
            json_array_foreach(json_object_get(json_object_get(o, "metadata"), "ownerReferences"), i, r)
            {
                const char *ru = json_string_value(json_object_get(r, "uid"));
                if(ru && strcmp(ru, uid) == 0) {
                    json_array_append_new(doomed, json_string(key));
                    break;
                }
            }
        }
        size_t i;
        json_t *d;
        json_array_foreach(doomed, i, d)
        {
            json_t *obj = json_object_get(st->objs[k], json_string_value(d));
            if(!obj)
                continue;
            const char *ns = kobject_meta_str(obj, "namespace");
            char name[300];
            snprintf(name, sizeof name, "%s", kobject_meta_str(obj, "name"));
            char nsb[300];
            snprintf(nsb, sizeof nsb, "%s", ns ? ns : "");
            sim_store_delete(st, (placement_kind)k, nsb, name, NULL);
        }
        json_decref(doomed);
    }
}

long sim_store_replace(sim_store *st, placement_kind k, json_t *obj)
{
    char key[600];
    if(obj_key(obj, key, sizeof key))
        return 422;
    json_t *old = json_object_get(st->objs[k], key);
    if(!old) {
        json_decref(obj);
        return 404;
    }
    json_t *md = json_object_get(obj, "metadata");
    static const char *const kept[] = {"uid", "creationTimestamp", "deletionTimestamp", "generation"};
    for(size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        json_t *v = json_object_get(json_object_get(old, "metadata"), kept[i]);
        if(v)
            json_object_set(md, kept[i], v);
        else
            json_object_del(md, kept[i]);
    }
    if(!json_equal(json_object_get(obj, "spec"), json_object_get(old, "spec")))
        json_object_set_new(md, "generation", json_integer(json_integer_value(json_object_get(md, "generation")) + 1));
    changed(st, k, obj);
    json_object_set_new(st->objs[k], key, obj);
    if(released(obj))
        drop(st, k, key);
    return 200;
}

long sim_store_delete(sim_store *st, placement_kind k, const char *ns, const char *name, const char *uid)
{
    char key[600];
    key_of(ns, name, key, sizeof key);
    json_t *o = json_object_get(st->objs[k], key);
    if(!o)
        return 404;
    if(uid && (!kobject_meta_str(o, "uid") || strcmp(uid, kobject_meta_str(o, "uid")) != 0))
        return 409;
    if(json_array_size(json_object_get(json_object_get(o, "metadata"), "finalizers")) == 0) {
        drop(st, k, key);
        return 200;
    }
    if(!kobject_meta_str(o, "deletionTimestamp")) {
        json_t *c = json_deep_copy(o);
        json_object_set_new(json_object_get(c, "metadata"), "deletionTimestamp", json_string("2026-01-01T00:00:00Z"));
        changed(st, k, c);
        json_object_set_new(st->objs[k], key, c);
    }
    return 200;
}

keyset *sim_store_changes(sim_store *st)
{
    keyset *c = st->changes;
    st->changes = NULL;
    return c;
}

/* ------------------------------------------------------ placement_io */

static json_t *io_get(void *ud, placement_kind k, const char *ns, const char *name)
{
    return sim_store_get(ud, k, ns, name);
}

static json_t *io_list(void *ud, placement_kind k)
{
    return sim_store_list(ud, k);
}

static long io_list_claims(void *ud, json_t **out, cozy_err *err)
{
    (void)err;
    *out = json_pack("{s:s,s:s,s:o}", "apiVersion", "cozystack.io/v1alpha1", "kind", "GPUClaimList", "items",
                     sim_store_list(ud, PLACEMENT_CLAIM));
    return 200;
}

static int io_leading(void *ud)
{
    (void)ud;
    return 1;
}

/* PUT of the status subresource: only status is taken, on the
 * resourceVersion read. */
static long io_claim_status(void *ud, const char *ns, const json_t *obj, json_t **out, cozy_err *err)
{
    (void)err;
    sim_store *st = ud;
    json_t *cur = sim_store_get(st, PLACEMENT_CLAIM, ns, kobject_meta_str(obj, "name"));
    if(!cur)
        return 404;
    const char *rv = kobject_meta_str(obj, "resourceVersion"), *have = kobject_meta_str(cur, "resourceVersion");
    if(rv && have && strcmp(rv, have) != 0) {
        json_decref(cur);
        return 409;
    }
    json_t *c = json_deep_copy(cur);
    json_decref(cur);
    json_object_set(c, "status", json_object_get(obj, "status"));
    if(out)
        *out = json_incref(c);
    return sim_store_replace(st, PLACEMENT_CLAIM, c);
}

/* JSON merge patch (RFC 7386) of `patch` into `target`. */
static void merge(json_t *target, const json_t *patch)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)patch, k, v)
    {
        json_t *t = json_object_get(target, k);
        if(json_is_null(v))
            json_object_del(target, k);
        else if(json_is_object(v) && json_is_object(t))
            merge(t, v);
        else
            json_object_set_new(target, k, json_deep_copy(v));
    }
}

static long io_class_status(void *ud, const char *name, const json_t *patch, cozy_err *err)
{
    (void)err;
    sim_store *st = ud;
    json_t *cur = sim_store_get(st, PLACEMENT_CLASS, NULL, name);
    if(!cur)
        return 404;
    json_t *c = json_deep_copy(cur);
    json_decref(cur);
    json_t *status = json_object_get(c, "status");
    if(!json_is_object(status))
        json_object_set_new(c, "status", status = json_object());
    merge(status, json_object_get(patch, "status"));
    return sim_store_replace(st, PLACEMENT_CLASS, c);
}

static long io_update(void *ud, placement_kind k, const char *ns, const char *name, placement_mutate_fn mutate,
                      void *ctx, cozy_err *err)
{
    sim_store *st = ud;
    json_t *cur = sim_store_get(st, k, ns, name);
    if(!cur)
        return 404;
    json_t *c = json_deep_copy(cur);
    json_decref(cur);
    int r = mutate(c, ctx);
    if(r != 0) {
        json_decref(c);
        if(r < 0)
            snprintf(err->msg, sizeof err->msg, "not written (the change was given up)");
        return r > 0 ? 200 : 0;
    }
    return sim_store_replace(st, k, c);
}

static long io_create_claim(void *ud, const char *ns, const json_t *obj, json_t **out, cozy_err *err)
{
    (void)ns;
    (void)err;
    long code = sim_store_create(ud, PLACEMENT_CLAIM, json_deep_copy(obj));
    if(out)
        *out = NULL;
    return code;
}

static long io_remove(void *ud, placement_kind k, const char *ns, const char *name, const char *uid, cozy_err *err)
{
    (void)err;
    return sim_store_delete(ud, k, ns, name, uid);
}

static void io_note(void *ud, const placement_note *n)
{
    sim_store *st = ud;
    if(st->note)
        st->note(st->note_ud, n);
}

placement_io sim_store_io(sim_store *st, void (*note)(void *ud, const placement_note *n), void *ud)
{
    st->note = note;
    st->note_ud = ud;
    return (placement_io){.ud = st,
                          .get = io_get,
                          .list = io_list,
                          .list_claims = io_list_claims,
                          .leading = io_leading,
                          .claim_status = io_claim_status,
                          .class_status = io_class_status,
                          .update = io_update,
                          .create_claim = io_create_claim,
                          .remove = io_remove,
                          .note = io_note};
}
