/* flags.h — the command line of `cozygpu agent` (agent.h; the options are
 * listed by `cozygpu agent --help` and in the DaemonSet, deploy/).
 */
#ifndef COZYGPU_AGENT_FLAGS_H
#define COZYGPU_AGENT_FLAGS_H

#include "base/log.h"

typedef struct agent_flags {
    const char *node, *sysfs, *proc, *pci_ids, *pci_method, *library, *ns, *identity;
    const char *kubeconfig, *context, *server;
    long interval_ms, resync_ms;
    int once;
    int json_logs;           /* --log-format json */
    log_level log_level;     /* --log-level */
    char lease_name[254];    /* cozygpu-agent-<node> */
    char identity_buf[320];  /* the default identity (lease_default_identity) */
} agent_flags;

/* Parses the agent's arguments (argv[0] is "agent") into *f, filling the
 * defaults: --node from $NODE_NAME, --namespace from $POD_NAMESPACE (else
 * "cozy-gpu-agent"), --identity from $POD_NAME (else HOSTNAME_<12 random hex
 * digits>, lease_default_identity; kept in
 * f->identity_buf), intervals in milliseconds (--interval 30s, at least
 * 100ms; --resync 10m), and f->lease_name. The strings of *f point into
 * argv, the environment or *f itself (argv and the environment must
 * outlive it). Returns -1 when the agent should run; otherwise the exit
 * status: 0 after --help (usage on stdout), 2 on a bad flag (message or
 * usage on stderr, texts as `cozygpu agent --help` documents). Resets
 * getopt (optind). */
int agent_flags_parse(agent_flags *f, int argc, char **argv);

#endif
