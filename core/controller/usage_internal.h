/* usage_internal.h — shared between the files of the usage-record
 * writer only (DESIGN.md §3 "Usage records"; docs/decisions/0028), every
 * name prefixed ctl_usage_ (internal.h's convention):
 *   usage.c         the thread, its queue and the watcher's callbacks,
 *                   whether the Workload types are served, the rounds
 *   usage_record.c  a claim's record and a namespace's monitor: the name,
 *                   the objects as they should be, the writes
 * The thread's entry points and ctl_usage_record_name are in internal.h.
 */
#ifndef COZYGPU_CONTROLLER_USAGE_INTERNAL_H
#define COZYGPU_CONTROLLER_USAGE_INTERNAL_H

#include "controller/internal.h"

/* the longest object name (a DNS subdomain) */
#define CTL_USAGE_NAME_MAX_LEN 253

/* The usage thread's state (usage.c). */
typedef struct ctl_usage_state {
    int active;          /* built for this lead */
    int full;            /* every cached claim and record to compare (the lead taken, the types served) */
    int avail;           /* the Workload types are served: 1 yes, 0 no, -1 not known */
    long long next_probe; /* ms: when avail is 0, the next probe */
    long long next_warn;  /* ms: the next warning while unavailable */
    ctl_key *work;       /* keys to reconcile (the queue's, and retries) */
    json_t *wanted;      /* "ns/claim" -> true: claims that want a record */
    json_t *ns_count;    /* ns -> number of claims in `wanted` there */
    json_t *mon_ok;      /* ns -> true: the monitor was written or seen right in this lead */
    json_t *written;     /* "ns/record" -> {obj, behind}: remember() in usage_record.c */
} ctl_usage_state;

/* The outcome of a write or a reconcile: done, to be tried again (the key
 * stays queued), or the cluster does not serve the type (404 without
 * details.name). */
enum { CTL_USAGE_W_OK = 0, CTL_USAGE_W_RETRY = -1, CTL_USAGE_W_MISSING = -2 };

/* ---- usage.c ---- */

/* Whether this replica leads (lease_is_leader): checked before every
 * write. */
int ctl_usage_leading(void);

/* The name of obj's GPUClaim owner reference (apiVersion cozystack.io/...),
 * or NULL; *uid (if uid) its uid. Borrowed from obj. */
const char *ctl_usage_claim_owner(const json_t *obj, const char **uid);

/* "<prefix>ns/name" into out (size n); -1 when it does not fit. */
int ctl_usage_join_key(char *out, size_t n, const char *prefix, const char *ns, const char *name);

/* ---- usage_record.c ---- */

/* DELETE r ns/name if its uid is still `uid` (a precondition: an object
 * re-created under the name in between is left alone); `object` is the
 * metric's label ("record", "monitor"). 404 and 409 are done. Returns
 * CTL_USAGE_W_OK or CTL_USAGE_W_RETRY. */
int ctl_usage_delete_uid(const kube_resource *r, const char *object, const char *ns, const char *name, const char *uid);

/* The WorkloadMonitor of namespace `ns` made as it should be (created, or
 * its label and spec put back). `force`: compare with the cache even when
 * this lead wrote it already. Returns a CTL_USAGE_W_ outcome. */
int ctl_usage_ensure_monitor(ctl_usage_state *U, const char *ns, int force);

/* Claim ns/name against its record: the record written when the claim is
 * held (Bound, Attached), with the namespace's monitor; deleted when not.
 * `probe_api`: the record left the selected watch, so a missing cache
 * entry may still exist in the API (read by name). Returns a CTL_USAGE_W_
 * outcome. */
int ctl_usage_reconcile_claim(ctl_usage_state *U, const char *ns, const char *name, int probe_api);

#endif
