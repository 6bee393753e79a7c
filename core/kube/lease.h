/* lease.h — leader election with a coordination.k8s.io/v1 Lease.
 *
 * Follows client-go's leaderelection package (tools/leaderelection:
 * leaderelection.go tryAcquireOrRenew, resourcelock/leaselock.go):
 *   - the Lease `spec` holds holderIdentity, leaseDurationSeconds,
 *     acquireTime, renewTime (MicroTime) and leaseTransitions;
 *   - a candidate takes the Lease when it does not exist (create), when its
 *     holder is empty (released), or when the record it observed has not
 *     changed for leaseDuration by the candidate's own monotonic clock (the
 *     timestamps inside the record are not compared with the local clock,
 *     so clock skew between nodes does not matter);
 *   - every write is an update with the resourceVersion read, so two
 *     candidates never both win: the loser gets 409 Conflict;
 *   - the leader renews every retry period; it considers itself leader only
 *     until renewDeadline after its last successful renewal, which is
 *     shorter than leaseDuration, so it stops acting before anyone else may
 *     take over;
 *   - on release (shutdown) the leader writes an empty holderIdentity with
 *     leaseDurationSeconds 1, so a successor takes over at once.
 * DESIGN.md §2: only the leader runs writers; every replica serves admission.
 */
#ifndef COZYGPU_LEASE_H
#define COZYGPU_LEASE_H

#include "kube/kube.h"
#include "base/result.h"

typedef struct lease_elector lease_elector;

typedef struct lease_options {
    const char *namespace_;    /* the Lease's namespace */
    const char *name;          /* the Lease's name ("cozygpu-controller") */
    const char *identity;      /* this replica (pod name); unique */
    long lease_duration_ms;    /* how long a record stays valid (client-go default 15 s) */
    long renew_deadline_ms;    /* the leader gives up after this without a renewal (10 s); < duration */
    long retry_period_ms;      /* between attempts and renewals (2 s); < renew deadline */
    /* Called on the elector's thread when this replica starts or stops
     * leading. May be NULL. */
    void (*on_change)(void *ctx, int leading);
    void *ctx;
} lease_options;

/* Starts the elector thread. `client` is borrowed and must outlive the
 * elector. COZY_ERR_USAGE when the durations are not ordered
 * retry < renew deadline < lease duration, or a name is missing. */
cozy_result lease_start(lease_elector **out, kube_client *client, const lease_options *o, cozy_err *err);

/* True while this replica holds the Lease and its last successful renewal
 * is younger than the renew deadline. Writers call it before every write.
 * Thread-safe. */
int lease_is_leader(lease_elector *le);

/* Stops the thread; when leading and `release` is nonzero, releases the
 * Lease first (holderIdentity "", leaseDurationSeconds 1). Frees the
 * elector. NULL is allowed. */
void lease_stop(lease_elector *le, int release);

/* The default identity of a Lease candidate, the same for the controller
 * and the agent: $POD_NAME when set and not empty, else the host name and
 * 12 random hex digits (HOSTNAME_0123456789ab), as kube-controller-manager
 * does, so two processes on one host never share an identity by accident.
 * Written to buf (at most n bytes, NUL-terminated); returns buf. */
char *lease_default_identity(char *buf, size_t n);

#endif
