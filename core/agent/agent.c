/* agent.c — `cozygpu agent` (agent.h; DESIGN.md §7; docs/decisions/0011).
 *
 * One thread does the passes; the watch thread (watch.h) of the node's
 * GPUNode only wakes it (SIGUSR2 to the main thread, which waits for
 * signals with a timeout of --interval). A pass:
 *
 *   1. the GPUNode (from the watch cache; with --once a GET). Missing: it is
 *      created, with an owner reference to the Node; present without that
 *      reference (a hoster created it first): the reference is added.
 *   2. inventory_scan, agent_scan_in_use.
 *   3. rounds of layout.plan -> writes of nvidia/current_vgpu_type -> scan
 *      again, until a round has nothing to write (at most layout.MAX_ROUNDS).
 *   4. layout.status; PUT /status only when it differs from the stored one.
 *
 * Every write, and every refusal or pending change not already in the
 * stored status, is logged.
 */
#include "agent/agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/duration.h"
#include "host/inventory.h"
#include "kube/kube.h"
#include "kube/lease.h"
#include "base/log.h"
#include "engine/luajson.h"
#include "kube/watch.h"

#define AGENT_VERSION "0.1.0"

#ifndef COZYGPU_LIBDIR
#define COZYGPU_LIBDIR "lua"
#endif

typedef struct agent_flags {
    const char *node, *sysfs, *proc, *pci_ids, *pci_method, *library, *ns, *identity;
    const char *kubeconfig, *context, *server;
    long interval_ms, resync_ms;
    int once;
} agent_flags;

typedef struct agent {
    agent_flags f;
    kube_client *client;
    kube_watcher *watcher;
    kube_informer *inf;
    lua_State *L;
    int layout_ref;
    pthread_t main_thread;
    char *checked_owner_uid; /* GPUNode uid whose owner reference was checked */
    time_t owner_checked_at;
    json_t *backlog; /* writes done but not yet in a stored status */
    lease_elector *lease; /* one writer per node: Lease cozygpu-agent-<node> */
    char lease_name[254];
    int said_not_holder;
    volatile sig_atomic_t stopping;
} agent;

static void usage(FILE *f)
{
    fputs("usage: cozygpu agent --node NAME [options]\n"
          "\n"
          "The node agent (a DaemonSet on GPU nodes): writes the node's NVIDIA PCI\n"
          "functions, their health and the state of the declared vGPU layout to the\n"
          "GPUNode named after the node, and makes each VF's vGPU type match\n"
          "GPUNode.spec (docs/decisions/0011). A VF that a running VM holds is never\n"
          "written: its change stays pending. Runs a pass at start, every --interval,\n"
          "and when the GPUNode changes.\n"
          "\n"
          "options:\n"
          "  --node NAME          the Node (default: $NODE_NAME)\n"
          "  --sysfs ROOT         the host's /sys (default /sys)\n"
          "  --proc ROOT          the host's /proc, to see which VFIO devices a process\n"
          "                       holds and the boot id (default /proc)\n"
          "  --pci-ids FILE       PCI ID database (default: libpci's)\n"
          "  --pci-method NAME    libpci access method (default linux-sysfs)\n"
          "  --library DIR        the Lua library with runtime/layout.lua (default: the\n"
          "                       installed lua/)\n"
          "  --interval DURATION  between passes besides watch events (default 30s)\n"
          "  --once               one pass, then exit (status 1 when it failed)\n"
          "  --kubeconfig FILE    kubeconfig (default: $KUBECONFIG, then in-cluster, then\n"
          "                       ~/.kube/config)\n"
          "  --context NAME       kubeconfig context\n"
          "  --server URL         API server URL, overriding the kubeconfig's\n"
          "  --resync DURATION    relist the GPUNode this often (default 10m)\n"
          "  --namespace NS       namespace of the node's Lease cozygpu-agent-<node>, which\n"
          "                       makes one agent the node's only writer and is its\n"
          "                       heartbeat (default: $POD_NAMESPACE, else cozy-gpu-agent)\n"
          "  --identity ID        this agent's name in the Lease (default: $POD_NAME, else\n"
          "                       HOSTNAME-PID)\n"
          "  --log-format json|text, --log-level debug|info|warn|error\n"
          "\n"
          "exit status: 0 after SIGTERM/SIGINT or a good --once pass, 1 when the --once\n"
          "pass failed, 2 on bad flags or a start-up failure\n",
          f);
}

/* ---- small helpers -------------------------------------------------------- */

static void now_rfc3339(char *buf, size_t n)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int all_digits(const char *s)
{
    if(!*s)
        return 0;
    for(; *s; s++)
        if(*s < '0' || *s > '9')
            return 0;
    return 1;
}

/* Reads a small file into buf, trimming the trailing newline. -1 on error. */
static int read_small(const char *path, char *buf, size_t n)
{
    FILE *fp = fopen(path, "r");
    if(!fp)
        return -1;
    size_t got = fread(buf, 1, n - 1, fp);
    fclose(fp);
    buf[got] = 0;
    while(got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == ' '))
        buf[--got] = 0;
    return 0;
}

/* ---- which functions a process holds ------------------------------------ */

cozy_result agent_scan_in_use(const char *proc_root, const char *sysfs_root, const json_t *inventory,
                              json_t **out, cozy_err *err)
{
    *out = NULL;
    DIR *d = opendir(proc_root);
    if(!d)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", proc_root, strerror(errno));
    json_t *groups = json_object(), *cdevs = json_object();
    struct dirent *de;
    char path[PATH_MAX], target[256], comm[64], why[512], blind[512] = "";
    while((de = readdir(d))) {
        if(!all_digits(de->d_name))
            continue;
        snprintf(path, sizeof path, "%s/%s/fd", proc_root, de->d_name);
        DIR *fd = opendir(path);
        if(!fd) {
            /* gone (ENOENT, ESRCH): fine; not readable: cannot tell (below) */
            if((errno == EACCES || errno == EPERM) && !blind[0])
                snprintf(blind, sizeof blind, "%.300s: %.64s", path, strerror(errno));
            continue;
        }
        int have_comm = 0;
        struct dirent *fe;
        while((fe = readdir(fd))) {
            if(fe->d_name[0] == '.')
                continue;
            ssize_t len = readlinkat(dirfd(fd), fe->d_name, target, sizeof target - 1);
            if(len < 0 && (errno == EACCES || errno == EPERM) && !blind[0])
                snprintf(blind, sizeof blind, "%.300s/%.64s: %.64s", path, fe->d_name, strerror(errno));
            if(len <= 0)
                continue;
            target[len] = 0;
            if(strncmp(target, "/dev/vfio/", 10) != 0)
                continue;
            const char *rest = target + 10;
            json_t *into = NULL;
            const char *key = NULL;
            if(strncmp(rest, "devices/", 8) == 0 && rest[8])
                into = cdevs, key = rest + 8;
            else if(all_digits(rest))
                into = groups, key = rest;
            if(!into || json_object_get(into, key))
                continue;
            if(!have_comm) {
                snprintf(path, sizeof path, "%s/%s/comm", proc_root, de->d_name);
                if(read_small(path, comm, sizeof comm) != 0)
                    comm[0] = 0;
                have_comm = 1;
            }
            if(comm[0])
                snprintf(why, sizeof why, "pid %.20s (%.63s) holds %.255s", de->d_name, comm, target);
            else
                snprintf(why, sizeof why, "pid %.20s holds %.255s", de->d_name, target);
            json_object_set_new(into, key, json_string(why));
        }
        closedir(fd);
    }
    closedir(d);

    json_t *res = json_object();
    size_t i;
    const json_t *fn;
    json_array_foreach(json_object_get(inventory, "functions"), i, fn)
    {
        const char *addr = json_string_value(json_object_get(fn, "address"));
        if(!addr)
            continue;
        const json_t *g = json_object_get(fn, "iommuGroup");
        if(json_is_integer(g)) {
            char k[32];
            snprintf(k, sizeof k, "%lld", (long long)json_integer_value(g));
            const json_t *w = json_object_get(groups, k);
            if(w) {
                json_object_set(res, addr, (json_t *)w);
                continue;
            }
        }
        if(json_object_size(cdevs) == 0)
            continue;
        snprintf(path, sizeof path, "%s/bus/pci/devices/%s/vfio-dev", sysfs_root, addr);
        DIR *vd = opendir(path);
        if(!vd)
            continue;
        while((de = readdir(vd))) {
            const json_t *w = json_object_get(cdevs, de->d_name);
            if(w) {
                json_object_set(res, addr, (json_t *)w);
                break;
            }
        }
        closedir(vd);
    }
    if(blind[0]) {
        /* fail closed: a process we cannot see may hold any function */
        snprintf(why, sizeof why, "cannot tell whether a VM holds it (%.300s); the agent needs CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE", blind);
        json_array_foreach(json_object_get(inventory, "functions"), i, fn)
        {
            const char *addr = json_string_value(json_object_get(fn, "address"));
            if(addr && !json_object_get(res, addr))
                json_object_set_new(res, addr, json_string(why));
        }
    }
    json_decref(groups);
    json_decref(cdevs);
    *out = res;
    return COZY_OK;
}

/* ---- the Lua side --------------------------------------------------------- */

static cozy_result lua_setup(agent *A, cozy_err *err)
{
    lua_State *L = luaL_newstate();
    if(!L)
        return cozy_fail(err, COZY_ERR_INTERNAL, "cannot create a Lua state");
    A->L = L;
    luaL_openlibs(L);
    luajson_open_markers(L);
    /* package.path = <library>/?.lua; cozygpu.json from C */
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/?.lua", A->f.library);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, luaopen_cozygpu_json);
    lua_setfield(L, -2, "cozygpu.json");
    lua_pop(L, 2);
    lua_getglobal(L, "require");
    lua_pushstring(L, "runtime.layout");
    if(lua_pcall(L, 1, 1, 0) != LUA_OK)
        return cozy_fail(err, COZY_ERR_POLICY, "--library %s: %s", A->f.library, lua_tostring(L, -1));
    A->layout_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return COZY_OK;
}

/* Pushes layout[name]. */
static void push_layout_fn(agent *A, const char *name)
{
    lua_rawgeti(A->L, LUA_REGISTRYINDEX, A->layout_ref);
    lua_getfield(A->L, -1, name);
    lua_remove(A->L, -2);
}

static void push_json_or_nil(lua_State *L, const json_t *j)
{
    if(j && !json_is_null(j))
        luajson_push(L, j);
    else
        lua_pushnil(L);
}

/* ---- writes --------------------------------------------------------------- */

/* Writes "<type>\n" to <sysfs>/bus/pci/devices/<addr>/nvidia/current_vgpu_type
 * (LAYOUT §5: a type id creates the vGPU, 0 removes it). Returns 0, or the
 * errno of the open or the write. */
static int write_vgpu_type(const char *sysfs, const char *addr, long long type)
{
    char path[PATH_MAX], buf[32];
    snprintf(path, sizeof path, "%s/bus/pci/devices/%s/nvidia/current_vgpu_type", sysfs, addr);
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if(fd < 0)
        return errno;
    int n = snprintf(buf, sizeof buf, "%lld\n", type);
    ssize_t w = write(fd, buf, (size_t)n);
    int e = w == n ? 0 : (w < 0 ? errno : EIO);
    if(close(fd) != 0 && e == 0)
        e = errno;
    return e;
}

/* ---- one pass ------------------------------------------------------------- */

static json_t *get_gpunode(agent *A, cozy_err *err, int *failed)
{
    *failed = 0;
    if(!A->f.once)
        return kube_informer_get(A->inf, NULL, A->f.node);
    long st = 0;
    json_t *obj = NULL;
    if(kube_get(A->client, &KUBE_GPUNODES, NULL, A->f.node, &st, &obj, err) != COZY_OK) {
        *failed = 1;
        return NULL;
    }
    if(st == 200)
        return obj;
    json_decref(obj);
    if(st != 404) {
        cozy_fail(err, COZY_ERR_IO, "GET gpunodes/%s: HTTP %ld", A->f.node, st);
        *failed = 1;
    }
    return NULL;
}

static json_t *owner_ref(const json_t *node)
{
    const json_t *md = json_object_get(node, "metadata");
    return json_pack("{s:s,s:s,s:O,s:O}", "apiVersion", "v1", "kind", "Node", "name", json_object_get(md, "name"),
                     "uid", json_object_get(md, "uid"));
}

static cozy_result get_node(agent *A, json_t **node, cozy_err *err)
{
    long st = 0;
    *node = NULL;
    if(kube_get(A->client, &KUBE_NODES, NULL, A->f.node, &st, node, err) != COZY_OK)
        return COZY_ERR_IO;
    if(st != 200) {
        json_decref(*node);
        *node = NULL;
        return cozy_fail(err, COZY_ERR_INPUT, "GET nodes/%s: HTTP %ld%s", A->f.node, st,
                         st == 404 ? " (the GPUNode is owned by its Node, which must exist)" : "");
    }
    return COZY_OK;
}

/* Creates the GPUNode (empty spec) owned by the Node. *out: the created
 * object, or NULL when it already existed (the watch brings it). */
static cozy_result create_gpunode(agent *A, json_t **out, cozy_err *err)
{
    *out = NULL;
    json_t *node = NULL;
    cozy_result rc = get_node(A, &node, err);
    if(rc != COZY_OK)
        return rc;
    json_t *obj = json_pack("{s:s,s:s,s:{s:s,s:{s:s},s:[o]},s:{}}", "apiVersion", "cozystack.io/v1alpha1", "kind",
                            "GPUNode", "metadata", "name", A->f.node, "labels", "app.kubernetes.io/managed-by",
                            "cozygpu-agent", "ownerReferences", owner_ref(node), "spec");
    json_decref(node);
    long st = 0;
    json_t *res = NULL;
    rc = kube_create(A->client, &KUBE_GPUNODES, NULL, obj, &st, &res, err);
    json_decref(obj);
    if(rc != COZY_OK)
        return rc;
    if(st == 201 || st == 200) {
        log_write(LOG_INFO, "agent", "created the GPUNode", "name", A->f.node, NULL);
        *out = res;
        return COZY_OK;
    }
    json_decref(res);
    if(st == 409)
        return COZY_OK;
    return cozy_fail(err, COZY_ERR_INPUT, "POST gpunodes %s: HTTP %ld", A->f.node, st);
}

/* Adds the owner reference to the Node when the GPUNode lacks it (or names
 * another Node object of this name, e.g. after the Node was recreated).
 * *patched: the object as patched (caller owns it), or NULL when nothing
 * was written. */
static cozy_result ensure_owner(agent *A, const json_t *gn, json_t **patched, cozy_err *err)
{
    *patched = NULL;
    const char *uid = json_string_value(json_object_get(json_object_get(gn, "metadata"), "uid"));
    /* checked once per GPUNode object, and again every 10 minutes: a Node
       deleted and registered again has a new uid */
    if(uid && A->checked_owner_uid && strcmp(uid, A->checked_owner_uid) == 0 && time(NULL) - A->owner_checked_at < 600)
        return COZY_OK;
    json_t *node = NULL;
    cozy_result rc = get_node(A, &node, err);
    if(rc != COZY_OK)
        return rc;
    const char *node_uid = json_string_value(json_object_get(json_object_get(node, "metadata"), "uid"));
    json_t *refs = json_array();
    int found = 0;
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(json_object_get(gn, "metadata"), "ownerReferences"), i, r)
    {
        const char *kind = json_string_value(json_object_get(r, "kind"));
        if(kind && strcmp(kind, "Node") == 0 && json_is_string(json_object_get(r, "apiVersion")) &&
           strcmp(json_string_value(json_object_get(r, "apiVersion")), "v1") == 0) {
            const char *ru = json_string_value(json_object_get(r, "uid"));
            if(ru && node_uid && strcmp(ru, node_uid) == 0)
                found = 1;
            else
                continue; /* a reference to a Node object that is gone */
        }
        json_array_append(refs, (json_t *)r);
    }
    if(!found) {
        json_array_append_new(refs, owner_ref(node));
        json_t *patch = json_pack("{s:{s:o}}", "metadata", "ownerReferences", refs);
        long st = 0;
        json_t *res = NULL;
        rc = kube_patch(A->client, &KUBE_GPUNODES, NULL, A->f.node, "application/merge-patch+json", patch, &st, &res,
                        err);
        json_decref(patch);
        if(rc == COZY_OK && st != 200)
            rc = cozy_fail(err, COZY_ERR_INPUT, "PATCH gpunodes/%s (owner reference): HTTP %ld", A->f.node, st);
        if(rc == COZY_OK) {
            log_write(LOG_INFO, "agent", "added the owner reference to the Node", "name", A->f.node, NULL);
            *patched = res;
            res = NULL;
        }
        json_decref(res);
    } else
        json_decref(refs);
    json_decref(node);
    if(rc == COZY_OK && uid) {
        free(A->checked_owner_uid);
        A->checked_owner_uid = strdup(uid);
        A->owner_checked_at = time(NULL);
    }
    return rc;
}

/* Messages of status.layout.<key>[*].message, to log only what is new. */
static int message_known(const json_t *status, const char *key, const char *msg)
{
    size_t i;
    const json_t *e;
    json_array_foreach(json_object_get(json_object_get(status, "layout"), key), i, e)
    {
        const char *m = json_string_value(json_object_get(e, "message"));
        if(m && msg && strcmp(m, msg) == 0)
            return 1;
    }
    return 0;
}

static void log_news(const json_t *now, const json_t *before)
{
    static const char *const keys[] = {"refused", "pendingChanges", "errors"};
    for(int k = 0; k < 3; k++) {
        size_t i;
        const json_t *e;
        json_array_foreach(json_object_get(json_object_get(now, "layout"), keys[k]), i, e)
        {
            const char *m = json_string_value(json_object_get(e, "message"));
            if(m && !message_known(before, keys[k], m))
                log_write(k == 1 ? LOG_INFO : LOG_WARN, "agent",
                          k == 0 ? "layout refused" : k == 1 ? "layout change pending" : "layout error", "message", m,
                          NULL);
        }
    }
}

/* Pushes layout.plan(inv, spec, in_use, prev) on A->L. */
static cozy_result run_plan(agent *A, const json_t *inv, const json_t *spec, const json_t *in_use, const json_t *prev,
                            cozy_err *err)
{
    lua_State *L = A->L;
    push_layout_fn(A, "plan");
    luajson_push(L, inv);
    push_json_or_nil(L, spec);
    luajson_push(L, in_use);
    push_json_or_nil(L, prev);
    if(lua_pcall(L, 4, 1, 0) != LUA_OK) {
        cozy_result rc = cozy_fail(err, COZY_ERR_POLICY, "layout.plan: %s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return rc;
    }
    return COZY_OK;
}

static cozy_result scan(agent *A, json_t **inv, cozy_err *err)
{
    inventory_options io = {.sysfs_root = A->f.sysfs, .pci_method = A->f.pci_method, .pci_ids = A->f.pci_ids};
    return inventory_scan(&io, inv, err);
}

static cozy_result pass(agent *A, cozy_err *err)
{
    if(!lease_is_leader(A->lease)) {
        if(!A->said_not_holder)
            log_write(LOG_WARN, "agent", "another agent holds the node's Lease; waiting", "lease", A->lease_name, NULL);
        A->said_not_holder = 1;
        return COZY_OK;
    }
    A->said_not_holder = 0;
    lua_State *L = A->L;
    int top = lua_gettop(L);
    cozy_result rc = COZY_OK;
    int failed = 0;
    json_t *gn = get_gpunode(A, err, &failed), *inv = NULL, *in_use = NULL, *failures = json_array(),
           *status = NULL;
    if(failed) {
        rc = COZY_ERR_IO;
        goto out;
    }
    if(!gn) {
        if((rc = create_gpunode(A, &gn, err)) != COZY_OK)
            goto out;
        if(!gn)
            goto out; /* created meanwhile by someone else: the watch brings it */
    } else {
        json_t *patched = NULL;
        if((rc = ensure_owner(A, gn, &patched, err)) != COZY_OK)
            goto out;
        if(patched) {
            json_decref(gn);
            gn = patched;
        }
    }

    const json_t *spec = json_object_get(gn, "spec");
    const json_t *prev = json_object_get(gn, "status");
    if((rc = scan(A, &inv, err)) != COZY_OK)
        goto out;
    if((rc = agent_scan_in_use(A->f.proc, A->f.sysfs, inv, &in_use, err)) != COZY_OK)
        goto out;

    char boot_id[128] = "", path[PATH_MAX];
    snprintf(path, sizeof path, "%s/sys/kernel/random/boot_id", A->f.proc);
    if(read_small(path, boot_id, sizeof boot_id) != 0)
        boot_id[0] = 0;
    const char *prev_boot = json_string_value(json_object_get(prev, "bootID"));
    if(boot_id[0] && prev_boot && strcmp(prev_boot, boot_id) != 0)
        log_write(LOG_INFO, "agent", "the node rebooted since the last pass; re-applying the layout", "previousBootID",
                  prev_boot, "bootID", boot_id, NULL);

    /* names of the cards' types seen before are carried within one boot
       only: a reboot may bring another driver, with other ids */
    const json_t *prev_names = (!prev_boot || !boot_id[0] || strcmp(prev_boot, boot_id) == 0) ? prev : NULL;

    /* rounds */
    push_layout_fn(A, "MAX_ROUNDS");
    int max_rounds = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    int unconverged = 0, plan_idx = 0;
    for(int round = 0;; round++) {
        lua_settop(L, top);
        if((rc = run_plan(A, inv, spec, in_use, prev_names, err)) != COZY_OK)
            goto out;
        plan_idx = lua_gettop(L);
        lua_getfield(L, plan_idx, "writes");
        json_t *ws = luajson_to_json(L, -1, err);
        lua_pop(L, 1);
        if(!ws) {
            rc = COZY_ERR_INTERNAL;
            goto out;
        }
        if(json_array_size(ws) == 0) {
            json_decref(ws);
            break;
        }
        if(round >= max_rounds) {
            unconverged = 1;
            json_decref(ws);
            break;
        }
        if(!lease_is_leader(A->lease)) {
            json_decref(ws);
            rc = cozy_fail(err, COZY_ERR_IO, "lost the node's Lease %s; stopping this pass", A->lease_name);
            goto out;
        }
        int any_failure = 0;
        size_t i;
        json_t *w;
        json_array_foreach(ws, i, w)
        {
            const char *addr = json_string_value(json_object_get(w, "address"));
            long long from = json_integer_value(json_object_get(w, "from")),
                      to = json_integer_value(json_object_get(w, "to"));
            const char *profile = json_string_value(json_object_get(w, "profile"));
            char fs[24], ts[24], when[32], msg[768];
            snprintf(fs, sizeof fs, "%lld", from);
            snprintf(ts, sizeof ts, "%lld", to);
            int e = write_vgpu_type(A->f.sysfs, addr, to);
            if(e == 0) {
                now_rfc3339(when, sizeof when);
                json_t *rec = json_pack("{s:s,s:I,s:I,s:s}", "address", addr, "from", (json_int_t)from, "to",
                                        (json_int_t)to, "time", when);
                if(profile && to != 0)
                    json_object_set_new(rec, "profile", json_string(profile));
                json_array_append_new(A->backlog, rec);
                log_write(LOG_INFO, "agent", to ? "set the vGPU type of a VF" : "removed the vGPU type of a VF",
                          "address", addr, "from", fs, "to", ts, "profile", to ? profile : NULL, NULL);
            } else if(e == EBUSY) {
                snprintf(msg, sizeof msg, "the driver answered EBUSY writing %s/bus/pci/devices/%s/nvidia/current_vgpu_type",
                         A->f.sysfs, addr);
                json_object_set_new(in_use, addr, json_string(msg));
                log_write(LOG_INFO, "agent", "a VF is busy; its change stays pending", "address", addr, NULL);
            } else {
                snprintf(msg, sizeof msg, "writing %s to %s/bus/pci/devices/%s/nvidia/current_vgpu_type: %s", ts,
                         A->f.sysfs, addr, strerror(e));
                json_array_append_new(failures,
                                      json_pack("{s:s,s:s,s:s}", "address", addr, "reason", "WriteFailed", "message", msg));
                log_write(LOG_DEBUG, "agent", "a layout write failed", "address", addr, "error", msg, NULL);
                any_failure = 1;
            }
        }
        json_decref(ws);
        json_decref(inv);
        inv = NULL;
        if((rc = scan(A, &inv, err)) != COZY_OK)
            goto out;
        if(any_failure) {
            /* plan once more on what the node has now, without writing again */
            lua_settop(L, top);
            if((rc = run_plan(A, inv, spec, in_use, prev_names, err)) != COZY_OK)
                goto out;
            plan_idx = lua_gettop(L);
            break;
        }
    }

    /* status */
    char now[32];
    now_rfc3339(now, sizeof now);
    push_layout_fn(A, "status");
    lua_createtable(L, 0, 12);
    luajson_push(L, inv);
    lua_setfield(L, -2, "inventory");
    push_json_or_nil(L, spec);
    lua_setfield(L, -2, "spec");
    lua_pushinteger(L, json_integer_value(json_object_get(json_object_get(gn, "metadata"), "generation")));
    lua_setfield(L, -2, "generation");
    lua_pushvalue(L, plan_idx);
    lua_setfield(L, -2, "plan");
    luajson_push(L, A->backlog);
    lua_setfield(L, -2, "writes");
    luajson_push(L, failures);
    lua_setfield(L, -2, "failures");
    luajson_push(L, in_use);
    lua_setfield(L, -2, "in_use");
    push_json_or_nil(L, prev);
    lua_setfield(L, -2, "previous");
    lua_pushstring(L, now);
    lua_setfield(L, -2, "now");
    if(boot_id[0]) {
        lua_pushstring(L, boot_id);
        lua_setfield(L, -2, "boot_id");
    }
    lua_pushboolean(L, unconverged);
    lua_setfield(L, -2, "unconverged");
    if(lua_pcall(L, 1, 1, 0) != LUA_OK) {
        rc = cozy_fail(err, COZY_ERR_POLICY, "layout.status: %s", lua_tostring(L, -1));
        goto out;
    }
    status = luajson_to_json(L, -1, err);
    if(!status) {
        rc = COZY_ERR_INTERNAL;
        goto out;
    }
    log_news(status, prev);
    if(prev && json_equal(status, (json_t *)prev)) {
        log_write(LOG_DEBUG, "agent", "status unchanged", NULL);
        json_array_clear(A->backlog);
        goto out;
    }
    if(!lease_is_leader(A->lease)) {
        rc = cozy_fail(err, COZY_ERR_IO, "lost the node's Lease %s; the status is not written", A->lease_name);
        goto out;
    }
    {
        json_t *obj = json_deep_copy(gn);
        json_object_set(obj, "status", status);
        long st = 0;
        json_t *res = NULL;
        rc = kube_update_status(A->client, &KUBE_GPUNODES, NULL, obj, &st, &res, err);
        json_decref(obj);
        json_decref(res);
        if(rc != COZY_OK)
            goto out;
        if(st == 409) {
            /* the object changed meanwhile: the watch brings it, and the next
               pass writes again */
            log_write(LOG_DEBUG, "agent", "status write conflicted; retrying on the next pass", NULL);
            if(A->f.once)
                rc = cozy_fail(err, COZY_ERR_IO, "PUT gpunodes/%s/status: conflict", A->f.node);
        } else if(st != 200 && st != 201)
            rc = cozy_fail(err, COZY_ERR_INPUT, "PUT gpunodes/%s/status: HTTP %ld", A->f.node, st);
        else {
            log_write(LOG_INFO, "agent", "wrote the GPUNode status", "name", A->f.node, NULL);
            json_array_clear(A->backlog); /* the writes are in status.layout.lastWrites now */
        }
    }

out:
    lua_settop(L, top);
    json_decref(gn);
    json_decref(inv);
    json_decref(in_use);
    json_decref(failures);
    json_decref(status);
    return rc;
}

/* ---- main ----------------------------------------------------------------- */

static agent *A_self; /* for the watch callback and the signal thread */

static void on_gpunode(void *ctx, kube_informer *inf, const char *type, const json_t *obj)
{
    (void)ctx, (void)inf, (void)type, (void)obj;
    if(A_self)
        pthread_kill(A_self->main_thread, SIGUSR2);
}

static void on_lease(void *ctx, int leading)
{
    (void)ctx;
    log_write(LOG_INFO, "agent", leading ? "holds the node's Lease" : "lost the node's Lease", NULL);
    if(A_self)
        pthread_kill(A_self->main_thread, SIGUSR2);
}

/* Starts the node's Lease elector (client-go leaderelection defaults:
 * 15 s duration, 10 s renew deadline, 2 s retry). */
static cozy_result start_lease(agent *A, cozy_err *err)
{
    lease_options lo = {.namespace_ = A->f.ns, .name = A->lease_name, .identity = A->f.identity,
                        .lease_duration_ms = 15000, .renew_deadline_ms = 10000, .retry_period_ms = 2000,
                        .on_change = on_lease};
    return lease_start(&A->lease, A->client, &lo, err);
}

/* Waits for SIGTERM/SIGINT: asks the main thread to stop (it finishes the
 * file write in progress; every write is one write(2)), and exits the
 * process after AGENT_STOP_GRACE_S if a request to the API server still
 * holds it (retries can last a minute; the DaemonSet's grace period is
 * shorter). Nothing is lost: the next start begins with a full pass. */
#define AGENT_STOP_GRACE_S 5
static void *signal_main(void *arg)
{
    sigset_t *stop = arg;
    int sig = 0;
    if(sigwait(stop, &sig) != 0)
        return NULL;
    log_write(LOG_INFO, "agent", "shutting down", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
    A_self->stopping = 1;
    pthread_kill(A_self->main_thread, SIGUSR2);
    sleep(AGENT_STOP_GRACE_S);
    log_write(LOG_WARN, "agent", "a pass is still waiting for the API server; exiting", NULL);
    _exit(0);
    return NULL;
}

int agent_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"node", required_argument, 0, 'n'},       {"sysfs", required_argument, 0, 's'},
        {"proc", required_argument, 0, 'p'},       {"pci-ids", required_argument, 0, 'i'},
        {"pci-method", required_argument, 0, 'm'}, {"library", required_argument, 0, 'L'},
        {"interval", required_argument, 0, 't'},   {"once", no_argument, 0, '1'},
        {"kubeconfig", required_argument, 0, 'k'}, {"context", required_argument, 0, 'c'},
        {"server", required_argument, 0, 'S'},     {"resync", required_argument, 0, 'r'},
        {"log-format", required_argument, 0, 'F'}, {"log-level", required_argument, 0, 'l'},
        {"namespace", required_argument, 0, 'N'},  {"identity", required_argument, 0, 'I'},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    agent A = {.f = {.node = getenv("NODE_NAME"), .sysfs = "/sys", .proc = "/proc", .library = COZYGPU_LIBDIR,
                     .interval_ms = 30000, .resync_ms = 600000},
               .layout_ref = LUA_NOREF};
    int json_logs = 0, c;
    log_level lvl = LOG_INFO;
    optind = 1;
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch(c) {
        case 'n': A.f.node = optarg; break;
        case 's': A.f.sysfs = optarg; break;
        case 'p': A.f.proc = optarg; break;
        case 'i': A.f.pci_ids = optarg; break;
        case 'm': A.f.pci_method = optarg; break;
        case 'L': A.f.library = optarg; break;
        case '1': A.f.once = 1; break;
        case 'k': A.f.kubeconfig = optarg; break;
        case 'c': A.f.context = optarg; break;
        case 'S': A.f.server = optarg; break;
        case 'N': A.f.ns = optarg; break;
        case 'I': A.f.identity = optarg; break;
        case 't':
        case 'r': {
            long ms;
            if(cozy_parse_duration(optarg, &ms) != 0 || (c == 't' && ms < 100)) {
                fprintf(stderr, "cozygpu agent: --%s: not a duration%s: %s\n", c == 't' ? "interval" : "resync",
                        c == 't' ? " of at least 100ms" : "", optarg);
                return 2;
            }
            if(c == 't')
                A.f.interval_ms = ms;
            else
                A.f.resync_ms = ms;
            break;
        }
        case 'F':
            if(strcmp(optarg, "json") && strcmp(optarg, "text")) {
                fprintf(stderr, "cozygpu agent: --log-format must be json or text\n");
                return 2;
            }
            json_logs = strcmp(optarg, "json") == 0;
            break;
        case 'l':
            if(log_level_parse(optarg, &lvl) != 0) {
                fprintf(stderr, "cozygpu agent: --log-level must be debug, info, warn or error\n");
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if(optind < argc) {
        fprintf(stderr, "cozygpu agent: unexpected argument: %s\n", argv[optind]);
        return 2;
    }
    if(!A.f.node || !*A.f.node) {
        fprintf(stderr, "cozygpu agent: --node is required (or set NODE_NAME)\n");
        return 2;
    }
    if(!A.f.ns) {
        const char *e = getenv("POD_NAMESPACE");
        A.f.ns = e && *e ? e : "cozy-gpu-agent";
    }
    char id_buf[320];
    if(!A.f.identity) {
        const char *e = getenv("POD_NAME");
        char host[256] = "agent";
        if(gethostname(host, sizeof host - 1) != 0)
            snprintf(host, sizeof host, "agent");
        snprintf(id_buf, sizeof id_buf, "%s-%ld", host, (long)getpid());
        A.f.identity = e && *e ? e : id_buf;
    }
    if(!*A.f.ns || !*A.f.identity) {
        fprintf(stderr, "cozygpu agent: --namespace and --identity must not be empty\n");
        return 2;
    }
    if(snprintf(A.lease_name, sizeof A.lease_name, "cozygpu-agent-%s", A.f.node) >= (int)sizeof A.lease_name) {
        fprintf(stderr, "cozygpu agent: --node %s: too long for the Lease name cozygpu-agent-<node> (253 characters)\n",
                A.f.node);
        return 2;
    }
    log_setup(json_logs, lvl);

    /* signals: blocked in every thread; the main thread waits for them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    A.main_thread = pthread_self();

    int status = 2;
    cozy_err err;
    A.backlog = json_array();
    if(lua_setup(&A, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu agent: %s\n", err.msg);
        goto out;
    }
    {
        /* the sysfs root and the PCI options must work before anything runs */
        json_t *probe = NULL;
        if(scan(&A, &probe, &err) != COZY_OK) {
            fprintf(stderr, "cozygpu agent: %s\n", err.msg);
            goto out;
        }
        json_decref(probe);
        DIR *d = opendir(A.f.proc);
        if(!d) {
            fprintf(stderr, "cozygpu agent: --proc %s: %s\n", A.f.proc, strerror(errno));
            goto out;
        }
        closedir(d);
    }
    char ua[256];
    snprintf(ua, sizeof ua, "cozygpu-agent/" AGENT_VERSION " (%s)", A.f.node);
    kube_client_options ko = {.kubeconfig = A.f.kubeconfig, .context = A.f.context, .server = A.f.server,
                              .user_agent = ua, .timeout_ms = 10000, .max_retries = 2};
    if(kube_client_new(&A.client, &ko, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu agent: %s\n", err.msg);
        goto out;
    }
    log_write(LOG_INFO, "agent", "starting", "node", A.f.node, "sysfs", A.f.sysfs, "proc", A.f.proc, "server",
              kube_client_server(A.client), NULL);

    A_self = &A;
    if(start_lease(&A, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu agent: %s\n", err.msg);
        goto out;
    }
    if(A.f.once) {
        /* one pass, as the node's only writer: wait for the Lease as long as
           a holder's record stays valid (15 s) and a retry */
        struct timespec step = {0, 50000000L};
        for(int i = 0; i < 17000 / 50 && !lease_is_leader(A.lease); i++)
            nanosleep(&step, NULL);
        if(!lease_is_leader(A.lease)) {
            log_write(LOG_ERROR, "agent", "another agent holds the node's Lease", "lease", A.lease_name, NULL);
            status = 1;
            goto out;
        }
        if(pass(&A, &err) != COZY_OK) {
            log_write(LOG_ERROR, "agent", "the pass failed", "error", err.msg, NULL);
            status = 1;
        } else
            status = 0;
        goto out;
    }

    char fsel[512];
    snprintf(fsel, sizeof fsel, "metadata.name=%s", A.f.node);
    A.watcher = kube_watcher_new(A.client, A.f.resync_ms / 1000);
    A.inf = A.watcher ? kube_watcher_add(A.watcher, &KUBE_GPUNODES, NULL, NULL, fsel, on_gpunode, NULL) : NULL;
    if(!A.inf || kube_watcher_start(A.watcher, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu agent: cannot start the GPUNode watch: %s\n", A.inf ? err.msg : "out of memory");
        goto out;
    }
    sigset_t stop, wake;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigemptyset(&wake);
    sigaddset(&wake, SIGUSR2);
    pthread_t sig_thread;
    if(pthread_create(&sig_thread, NULL, signal_main, &stop) != 0) {
        fprintf(stderr, "cozygpu agent: cannot start the signal thread\n");
        goto out;
    }
    pthread_detach(sig_thread);
    while(!A.stopping) {
        struct timespec to = {.tv_sec = A.f.interval_ms / 1000, .tv_nsec = (A.f.interval_ms % 1000) * 1000000L};
        if(kube_watcher_synced(A.watcher)) {
            if(pass(&A, &err) != COZY_OK && !A.stopping)
                log_write(LOG_ERROR, "agent", "the pass failed; retrying", "error", err.msg, NULL);
        } else
            to = (struct timespec){.tv_sec = 0, .tv_nsec = 100000000L};
        if(A.stopping)
            break;
        /* SIGUSR2 (the GPUNode changed, or a stop) or the interval: another
           pass; drain the wake-ups that arrived meanwhile */
        sigtimedwait(&wake, NULL, &to);
        struct timespec zero = {0, 0};
        while(sigtimedwait(&wake, NULL, &zero) == SIGUSR2)
            ;
    }
    status = 0;

out:
    if(A.watcher)
        kube_watcher_free(A.watcher); /* stops and joins the watch thread */
    lease_stop(A.lease, 1);           /* released: a successor takes over at once */
    A_self = NULL;
    kube_client_free(A.client);
    if(A.L)
        lua_close(A.L);
    free(A.checked_owner_uid);
    json_decref(A.backlog);
    return status;
}
