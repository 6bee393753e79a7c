/* flags.h — the command line of `cozygpu controller`: what it accepts, its
 * defaults and its checks, beside the runtime it configures (the way h2o
 * keeps lib/handler/configurator/ next to each handler).
 *
 * Private to core/controller/: controller.h (controller_main) is the
 * public interface.
 */
#ifndef COZYGPU_CONTROLLER_FLAGS_H
#define COZYGPU_CONTROLLER_FLAGS_H

/* The most review threads the default gives (decision 0047): the
 * Deployment's memory limit is sized for this many Lua states. */
#define CTL_DEFAULT_MAX_WORKERS 4

#include "base/log.h"

/* The parsed command line. Every string points into argv, the
 * environment, or static storage of flags.c: nothing here is owned or
 * freed. Durations are in milliseconds. */
typedef struct ctl_flags {
    const char *kubeconfig, *context, *server;
    const char *ns, *identity;
    const char *config_file;
    const char *policies_configmap; /* "" disables the ConfigMap */
    const char *policies_dir, *library_dir, *state_dir;
    const char *address;
    int port;                       /* 0: a free one */
    int probe_port;                 /* -1: no probe listener; 0: a free one */
    const char *probe_port_file;    /* where the bound probe port is written, or NULL */
    const char *port_file;
    const char *cert_file, *key_file;
    int workers;                    /* 1..256: review threads (default: the CPUs available, 2 to
                                       CTL_DEFAULT_MAX_WORKERS) */
    int io_threads;                 /* 1..64: the webhook server's TLS and HTTP threads (default: half the
                                       CPUs available, 1 to CTL_DEFAULT_MAX_WORKERS / 2) */
    long review_timeout_ms;         /* 100..29000 */
    long max_body;                  /* bytes, >= 1024 */
    int max_connections;            /* open webhook connections in all, 1..65536 */
    int max_connections_per_address; /* from one client address, 1..max_connections */
    long request_timeout_ms;        /* accept to complete request, 100..60000 */
    long max_body_in_flight;        /* bytes of review bodies held at once, >= max_body */
    int leader_elect;
    const char *lease_name;
    long lease_ms, renew_ms, retry_ms;
    long resync_ms;                 /* 0: never relist (nor re-assert the license copies) */
    long shutdown_grace_ms;
    long status_interval_ms;
    int log_json;
    log_level level;
} ctl_flags;

/* Parses argv (getopt_long, long options only; restarts at optind 1) into
 * *f, after filling in the defaults: --namespace from $POD_NAMESPACE else
 * cozy-gpu, --identity from $POD_NAME else HOSTNAME_<12 random hex digits>
 * (kube-controller-manager's rule, so two processes on one host never share
 * a Lease identity), --state-dir from $TMPDIR else /tmp; the rest as the
 * usage text says.
 *
 * Checks what the API server or the runtime would refuse later: a port
 * number, 1..256 workers, a body limit >= 1024 bytes, durations (Go/kubectl
 * syntax, base/duration.h), a ConfigMap name that is an RFC 1123 DNS
 * subdomain (Kubernetes docs, "Object Names and IDs"), retry < renew <
 * lease duration (client-go leaderelection's rule), both TLS files (the API
 * server calls webhooks over HTTPS only), a writable --state-dir, a
 * review timeout of 100ms..29s (webhook timeoutSeconds is at most 30,
 * admissionregistration.k8s.io/v1), the client bounds (decision 0015):
 * 1..65536 connections, a per-address limit no larger than that (its
 * default, 128, is lowered to --max-connections when that is smaller), a request
 * timeout of 100ms..60s, and a body budget no smaller than --max-body-bytes
 * (else the largest review could never be taken).
 *
 * Returns 0 to run, 1 after printing the usage to stdout for --help, -1
 * after printing one "cozygpu controller: ..." line (or the usage, for an
 * unknown option) to stderr. */
int ctl_flags_parse(int argc, char **argv, ctl_flags *f);

#endif
