/* agent.c — `cozygpu agent` (agent.h; DESIGN.md §7; docs/decisions/0011).
 *
 * One thread does the passes; the watch thread (watch.h) of the node's
 * GPUNode only wakes it (SIGUSR2 to the main thread, which waits for
 * signals with a timeout of --interval). A pass:
 *
 *   1. the GPUNode (from the watch cache; with --once a GET). Missing: it is
 *      created, with an owner reference to the Node; present without that
 *      reference (a hoster created it first): the reference is added.
 *   2. inventory_scan, inuse_scan.
 *   3. rounds of layout.plan -> writes of nvidia/current_vgpu_type -> scan
 *      again, until a round has nothing to write (at most layout.MAX_ROUNDS).
 *   4. layout.status; PUT /status only when it differs from the stored one.
 *
 * Every write, and every refusal or pending change not already in the
 * stored status, is logged.
 */
#include "base/clock.h"
#include "agent/agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/flags.h"
#include "agent/gpunode.h"
#include "base/log.h"
#include "engine/engine.h"
#include "engine/luajson.h"
#include "host/inuse.h"
#include "host/inventory.h"
#include "kube/kube.h"
#include "kube/lease.h"
#include "kube/watch.h"

#define AGENT_VERSION "0.1.0"

typedef struct agent {
    agent_flags f;
    kube_client *client;
    kube_watcher *watcher;
    gpunode_ctx gpunode; /* the GPUNode's client side: informer, owner check */
    engine *e;    /* runtime.layout, on the engine's Lua host */
    lua_State *L; /* engine_lua(e) */
    pthread_t main_thread;
    json_t *backlog; /* writes done but not yet in a stored status */
    lease_elector *lease; /* one writer per node: Lease f.lease_name */
    int said_not_holder;
    volatile sig_atomic_t stopping;
} agent;

/* ---- small helpers -------------------------------------------------------- */

/* ---- the Lua side --------------------------------------------------------- */
/* The agent's decisions are runtime.layout (lua/runtime/layout.lua), run on
 * the engine's Lua host: the same library allow-list and sandboxed require
 * as policies, every call through engine_call (trusted: our own code, no
 * instruction budget). */

static cozy_result lua_setup(agent *A, cozy_err *err)
{
    engine_options eo = {.library_dir = A->f.library};
    cozy_err oerr;
    if(engine_open_runtime(&A->e, &eo, "layout", &oerr) != COZY_OK)
        return cozy_fail(err, COZY_ERR_POLICY, "--library %s: %s", A->f.library, oerr.msg);
    A->L = engine_lua(A->e);
    return COZY_OK;
}

/* Pushes layout[name]. */
static void push_layout_fn(agent *A, const char *name)
{
    engine_push_runtime_fn(A->e, name);
}

static void push_json_or_nil(lua_State *L, const json_t *j)
{
    if(j && !json_is_null(j))
        luajson_push(L, j);
    else
        lua_pushnil(L);
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
    cozy_err cerr;
    if(engine_call(A->e, 4, 1, 0, &cerr) != ENGINE_ALLOWED) {
        lua_pop(L, 1);
        return cozy_fail(err, COZY_ERR_POLICY, "layout.plan: %s", cerr.msg);
    }
    return COZY_OK;
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

static cozy_result scan(agent *A, json_t **inv, cozy_err *err)
{
    inventory_options io = {.sysfs_root = A->f.sysfs, .pci_method = A->f.pci_method, .pci_ids = A->f.pci_ids};
    return inventory_scan(&io, inv, err);
}

static cozy_result pass(agent *A, cozy_err *err)
{
    if(!lease_is_leader(A->lease)) {
        if(!A->said_not_holder)
            log_write(LOG_WARN, "agent", "another agent holds the node's Lease; waiting", "lease", A->f.lease_name, NULL);
        A->said_not_holder = 1;
        return COZY_OK;
    }
    A->said_not_holder = 0;
    lua_State *L = A->L;
    int top = lua_gettop(L);
    cozy_result rc = COZY_OK;
    json_t *gn = NULL, *inv = NULL, *in_use = NULL, *failures = json_array(), *status = NULL;
    if(gpunode_get(&A->gpunode, &gn, err) != COZY_OK) {
        rc = COZY_ERR_IO;
        goto out;
    }
    if(!gn) {
        if((rc = gpunode_create(&A->gpunode, &gn, err)) != COZY_OK)
            goto out;
        if(!gn)
            goto out; /* created meanwhile by someone else: the watch brings it */
    } else {
        json_t *patched = NULL;
        if((rc = gpunode_ensure_owner(&A->gpunode, gn, &patched, err)) != COZY_OK)
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
    if((rc = inuse_scan(A->f.proc, A->f.sysfs, inv, &in_use, err)) != COZY_OK)
        goto out;

    char boot_id[128] = "";
    inuse_boot_id(A->f.proc, boot_id, sizeof boot_id);
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
        json_t *ws = NULL;
        if(engine_to_json(A->e, -1, &ws, err) != COZY_OK)
            ws = NULL;
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
            rc = cozy_fail(err, COZY_ERR_IO, "lost the node's Lease %s; stopping this pass", A->f.lease_name);
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
                clock_rfc3339_now(when, sizeof when);
                json_t *rec = json_pack("{s:s,s:I,s:I,s:s}", "address", addr, "from", (json_int_t)from, "to",
                                        (json_int_t)to, "time", when);
                if(profile && to != 0)
                    json_object_set_new(rec, "profile", json_string(profile));
                json_array_append_new(A->backlog, rec);
                log_write(LOG_INFO, "agent", to ? "set the vGPU type of a VF" : "removed the vGPU type of a VF",
                          "address", addr, LOG_NUM "from", fs, LOG_NUM "to", ts, "profile", to ? profile : NULL, NULL);
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
    clock_rfc3339_now(now, sizeof now);
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
    cozy_err cerr;
    if(engine_call(A->e, 1, 1, 0, &cerr) != ENGINE_ALLOWED) {
        rc = cozy_fail(err, COZY_ERR_POLICY, "layout.status: %s", cerr.msg);
        goto out;
    }
    if(engine_to_json(A->e, -1, &status, err) != COZY_OK)
        status = NULL;
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
        rc = cozy_fail(err, COZY_ERR_IO, "lost the node's Lease %s; the status is not written", A->f.lease_name);
        goto out;
    }
    int written = 0;
    rc = gpunode_write_status(&A->gpunode, gn, status, &written, err);
    if(rc == COZY_OK && written)
        json_array_clear(A->backlog); /* the writes are in status.layout.lastWrites now */

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
    lease_options lo = {.namespace_ = A->f.ns, .name = A->f.lease_name, .identity = A->f.identity,
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
    agent A = {.e = NULL};
    int st = agent_flags_parse(&A.f, argc, argv);
    if(st >= 0)
        return st;
    log_setup(A.f.json_logs, A.f.log_level);

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
    A.gpunode = (gpunode_ctx){.client = A.client, .node = A.f.node, .once = A.f.once};
    log_write(LOG_INFO, "agent", "starting", "node", A.f.node, "identity", A.f.identity, "sysfs", A.f.sysfs, "proc",
              A.f.proc, "server", kube_client_server(A.client), NULL);

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
            log_write(LOG_ERROR, "agent", "another agent holds the node's Lease", "lease", A.f.lease_name, NULL);
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
    A.gpunode.inf = A.watcher ? kube_watcher_add(A.watcher, &KUBE_GPUNODES, NULL, NULL, fsel, on_gpunode, NULL) : NULL;
    if(!A.gpunode.inf || kube_watcher_start(A.watcher, &err) != COZY_OK) {
        fprintf(stderr, "cozygpu agent: cannot start the GPUNode watch: %s\n",
                A.gpunode.inf ? err.msg : "out of memory");
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
    engine_close(A.e);
    gpunode_ctx_free(&A.gpunode);
    json_decref(A.backlog);
    return status;
}
