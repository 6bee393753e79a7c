/* license_internal.h — shared between the files of the license copier
 * only (DESIGN.md §8; docs/decisions/0004, 0029, 0035), every name
 * prefixed ctl_license_ (internal.h's convention):
 *   license.c         the copier's state and its inputs: classes and their
 *                     source token, namespaces (entitlement through
 *                     runtime.license), claims and VMIs (the users)
 *   license_copy.c    the copy a pair (namespace, class) wants, and the
 *                     writes that make it so
 *   license_status.c  the class's LicenseReady condition, its Events
 *   license_loop.c    the thread, its queue, building the state on taking
 *                     the lead, --resync, the assert budget
 * The thread's entry points are in internal.h. Everything here runs on
 * the copier's thread but the state types, which only it touches.
 */
#ifndef COZYGPU_CONTROLLER_LICENSE_INTERNAL_H
#define COZYGPU_CONTROLLER_LICENSE_INTERNAL_H

#include "controller/internal.h"

/* the condition the copier writes on a GPUClass */
#define CTL_LICENSE_COND "LicenseReady"

/* One GPUClass as the copier sees it. */
typedef struct ctl_license_class {
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
} ctl_license_class;

/* The copier's state, built on taking the lead (license_loop.c). */
typedef struct ctl_license_state {
    int built;
    engine *e;        /* runtime.license */
    ctl_license_class *classes;
    json_t *users;    /* "ns/class" -> {"Kind/name": {"uid": U, "active": bool}} */
    json_t *contrib;  /* "K:ns/name" (claim 'l', VMI 'i') -> {class: true}: what it added to users */
    json_t *ns_classes; /* ns -> {class: true}: pairs with a user or a copy, by namespace */
    json_t *class_ns; /* class -> {ns: true}: the same pairs, by class */
    json_t *copies;   /* "ns/class" -> the copy as the leader's last write answered (managedFields
                         dropped, data strings shared through `tokens`), or null: there is none;
                         no key: unknown (taken the lead, or a write was refused) */
    json_t *tokens;   /* base64 data string -> that string, shared by every remembered copy */
    ctl_key *due;       /* pairs "ns/class" to compare */
    ctl_key *asserting; /* pairs to assert, moved into `due` at ASSERTS_PER_SEC */
    ctl_key *force;     /* pairs whose next compare writes even when the copy seems as wanted */
    ctl_key *conds;     /* classes whose condition must be compared and written */
    double budget;    /* asserts allowed now */
    long long budget_ms, next_resync_ms;
} ctl_license_state;

/* ---- license.c ---- */

/* Whether this replica leads (lease_is_leader): checked before every
 * write. */
int ctl_license_leading(void);

/* Frees everything the state holds but the engine, and resets
 * runtime.license: the lead is lost or the thread ends. */
void ctl_license_state_drop(ctl_license_state *S);

/* Forgets pair (ns, class) in both indexes (no user, no copy left). */
void ctl_license_pair_forget(ctl_license_state *S, const char *ns, const char *cls);

/* Calls runtime.license[fn] with one argument (the JSON object `obj`, or
 * the string `name` when obj is NULL) and returns the namespace names it
 * answered (a new array), or NULL when it failed (logged). */
json_t *ctl_license_lua_changed(ctl_license_state *S, const char *fn, const json_t *obj, const char *name);

/* Whether namespace `ns` is entitled to vGPU (runtime.license.entitled);
 * 0 when the call fails (logged). */
int ctl_license_entitled(ctl_license_state *S, const char *ns);

/* Whether two strings, either NULL, are equal (both NULL is). */
int ctl_license_str_eq(const char *a, const char *b);

/* Each reads one object from its watch cache into the state and queues
 * the pairs it touches (a class's, a namespace's whose entitlement
 * changed, a claim's or VMI's namespace's pairs of its classes); a source
 * Secret (ns/name) has every class naming it read it again. */
void ctl_license_apply_class(ctl_license_state *S, const char *name);
void ctl_license_apply_namespace(ctl_license_state *S, const char *name);
void ctl_license_apply_claim(ctl_license_state *S, const char *ns, const char *name);
void ctl_license_apply_vmi(ctl_license_state *S, const char *ns, const char *name);
void ctl_license_apply_source(ctl_license_state *S, const char *ns, const char *name);

/* ---- license_copy.c ---- */

/* Outcome of one write: done, retry (stays queued), or drop (a refusal a
 * retry would repeat: logged; the pair becomes unknown, and its next event
 * or the next --resync tries again). */
enum { CTL_LICENSE_W_DONE, CTL_LICENSE_W_RETRY, CTL_LICENSE_W_DROP };

/* Compares pair ns/cls with what the leader knows of its copy and writes
 * the difference (decision 0029: what the pair wants). Returns
 * CTL_LICENSE_W_DONE (nothing left to do), CTL_LICENSE_W_RETRY or
 * CTL_LICENSE_W_DROP. */
int ctl_license_reconcile_pair(ctl_license_state *S, const char *ns, const char *cls);

/* ---- license_status.c ---- */

/* Writes the LicenseReady condition of class `name` when it changed,
 * reporting a new failure (log, Warning Event); 1 when done, 0 to try
 * again (a condition to remove waits until none of the class's pairs
 * waits). */
int ctl_license_write_cond(ctl_license_state *S, const char *name);

#endif
