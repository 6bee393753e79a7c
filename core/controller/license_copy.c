/* license_copy.c — the copy a pair (namespace, class) of the license
 * copier wants, and the writes that make it so (license_internal.h,
 * ctl_license_): the Secret's labels, owners and token, compared with what
 * the leader's last write answered, then created, PUT or deleted by name.
 *
 * Rules: docs/decisions/0029 (what a copy holds, who owns it, what a
 * namespace that lost the entitlement keeps), 0004 (the copy's name), 0035
 * (the copies are never read: the leader knows them from its own writes'
 * answers; a write is idempotent by name).
 */
#include "controller/internal.h"
#include "controller/license_internal.h"

#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "base/b64.h"
#include "base/log.h"
#include "base/metrics.h"

#define PREFIX CTL_LICENSE_PREFIX
#define LABEL_CLASS CTL_LICENSE_CLASS_LABEL
#define LABEL_MANAGED "app.kubernetes.io/managed-by"
#define MANAGED_BY "cozygpu"

typedef ctl_key lkey; /* keys.c */
typedef ctl_license_state state;
typedef ctl_license_class lclass;

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
            if(!ctl_license_str_eq(json_string_value(json_object_get(x, f[j])), json_string_value(json_object_get(r, f[j]))))
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

/* A write's outcome is CTL_LICENSE_W_DONE, _RETRY or _DROP
 * (license_internal.h). */

static int write_outcome(const char *op, const char *ns, const char *cls, cozy_result rc, long code, const json_t *res,
                         const cozy_err *err)
{
    if(rc == COZY_OK && code / 100 == 2) {
        count_write(op, "ok");
        return CTL_LICENSE_W_DONE;
    }
    char cs[16];
    snprintf(cs, sizeof cs, "%ld", code);
    const char *msg = rc != COZY_OK ? err->msg : json_string_value(json_object_get(res, "message"));
    count_write(op, rc != COZY_OK || code == 409 || code == 429 || code >= 500 ? "retry" : "error");
    log_write(code == 409 ? LOG_INFO : LOG_WARN, "license", "cannot write the license copy", "op", op, "namespace", ns,
              "gpuclass", cls, LOG_NUM "status", cs, "error", msg ? msg : "", NULL);
    if(rc != COZY_OK || code == 409 || code == 429 || code >= 500)
        return CTL_LICENSE_W_RETRY;
    return CTL_LICENSE_W_DROP;
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
    if(!ctl_license_leading())
        return CTL_LICENSE_W_RETRY; /* checked just before each write */
    char name[600];
    snprintf(name, sizeof name, "%s%s", PREFIX, cls);
    long code = 0;
    json_t *res = NULL;
    cozy_err err;
    cozy_result rc = kube_delete(ctl_proc->client, &KUBE_SECRETS, ns, name, &code, &res, &err);
    int w = rc == COZY_OK && code == 404 ? CTL_LICENSE_W_DONE : write_outcome("delete", ns, cls, rc, code, res, &err);
    if(w == CTL_LICENSE_W_DONE)
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
    if(!ctl_license_leading())
        return CTL_LICENSE_W_RETRY; /* checked just before each write */
    long code = 0;
    json_t *res = NULL;
    cozy_err err;
    cozy_result rc = kube_create(ctl_proc->client, &KUBE_SECRETS, ns, obj, &code, &res, &err);
    if(rc == COZY_OK && code == 409) {
        json_decref(res);
        forget(S, key);
        return CTL_LICENSE_W_RETRY;
    }
    int w = write_outcome("create", ns, cls, rc, code, res, &err);
    if(w == CTL_LICENSE_W_DONE)
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
    if(!ctl_license_leading())
        return CTL_LICENSE_W_RETRY; /* checked just before each write */
    long code = 0;
    json_t *res = NULL;
    cozy_err err;
    cozy_result rc = kube_update(ctl_proc->client, &KUBE_SECRETS, ns, obj, &code, &res, &err);
    if(rc == COZY_OK && code == 404) {
        json_decref(res);
        remember(S, key, NULL);
        return may_create ? create_copy(S, key, ns, cls, obj) : CTL_LICENSE_W_DONE;
    }
    if(rc == COZY_OK && (code == 422 || code == 403) && may_create) {
        json_decref(res);
        int w = delete_copy(S, key, ns, cls);
        return w == CTL_LICENSE_W_DONE ? create_copy(S, key, ns, cls, obj) : w;
    }
    int w = write_outcome("update", ns, cls, rc, code, res, &err);
    if(w == CTL_LICENSE_W_DONE)
        remember(S, key, res);
    json_decref(res);
    return w;
}

/* Compares pair ns/cls with what the leader knows of its copy and writes
 * the difference. Returns CTL_LICENSE_W_DONE (nothing left to do), CTL_LICENSE_W_RETRY or CTL_LICENSE_W_DROP.
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
int ctl_license_reconcile_pair(state *S, const char *ns, const char *cls)
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
        if(ctl_license_entitled(S, ns)) {
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
    int w = CTL_LICENSE_W_DONE;
    if(!ctl_license_leading())
        w = CTL_LICENSE_W_RETRY;
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
            w = obj ? put_copy(S, key, ns, cls, obj, 0) : CTL_LICENSE_W_RETRY;
        }
    } else if(!(obj = copy_of(ns, c, labels, owners)))
        w = CTL_LICENSE_W_RETRY;
    else if(known && !copy && !force)
        w = create_copy(S, key, ns, cls, obj);
    else if(copy && !data_matches(copy, c)) {
        /* the data of an immutable Secret cannot change in place: delete,
         * then create */
        w = delete_copy(S, key, ns, cls);
        if(w == CTL_LICENSE_W_DONE)
            w = create_copy(S, key, ns, cls, obj);
    } else if(!copy || force || !meta_matches(copy, labels, owners))
        w = put_copy(S, key, ns, cls, obj, 1);
    if(w == CTL_LICENSE_W_DROP)
        forget(S, key);
    if(w != CTL_LICENSE_W_RETRY && fk)
        keyset_drop(&S->force, fk);
    if(w == CTL_LICENSE_W_DONE && !owners && !json_object_size(users))
        ctl_license_pair_forget(S, ns, cls);
    json_decref(obj);
    json_decref(owners);
    json_decref(labels);
    return w;
}
