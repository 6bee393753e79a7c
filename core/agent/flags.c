/* flags.c — the command line of `cozygpu agent` (flags.h): the options,
 * their defaults from the environment, the usage text.
 */
#include "agent/flags.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/duration.h"
#include "kube/lease.h"

#ifndef COZYGPU_LIBDIR
#define COZYGPU_LIBDIR "lua"
#endif

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
          "                       HOSTNAME_RANDOM, a new suffix per start)\n"
          "  --log-format json|text, --log-level debug|info|warn|error\n"
          "\n"
          "exit status: 0 after SIGTERM/SIGINT or a good --once pass, 1 when the --once\n"
          "pass failed, 2 on bad flags or a start-up failure\n",
          f);
}

int agent_flags_parse(agent_flags *f, int argc, char **argv)
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
    *f = (agent_flags){.node = getenv("NODE_NAME"), .sysfs = "/sys", .proc = "/proc", .library = COZYGPU_LIBDIR,
                       .interval_ms = 30000, .resync_ms = 600000, .log_level = LOG_INFO};
    int c;
    optind = 1;
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch(c) {
        case 'n': f->node = optarg; break;
        case 's': f->sysfs = optarg; break;
        case 'p': f->proc = optarg; break;
        case 'i': f->pci_ids = optarg; break;
        case 'm': f->pci_method = optarg; break;
        case 'L': f->library = optarg; break;
        case '1': f->once = 1; break;
        case 'k': f->kubeconfig = optarg; break;
        case 'c': f->context = optarg; break;
        case 'S': f->server = optarg; break;
        case 'N': f->ns = optarg; break;
        case 'I': f->identity = optarg; break;
        case 't':
        case 'r': {
            long ms;
            if(cozy_parse_duration(optarg, &ms) != 0 || (c == 't' && ms < 100)) {
                fprintf(stderr, "cozygpu agent: --%s: not a duration%s: %s\n", c == 't' ? "interval" : "resync",
                        c == 't' ? " of at least 100ms" : "", optarg);
                return 2;
            }
            if(c == 't')
                f->interval_ms = ms;
            else
                f->resync_ms = ms;
            break;
        }
        case 'F':
            if(strcmp(optarg, "json") && strcmp(optarg, "text")) {
                fprintf(stderr, "cozygpu agent: --log-format must be json or text\n");
                return 2;
            }
            f->json_logs = strcmp(optarg, "json") == 0;
            break;
        case 'l':
            if(log_level_parse(optarg, &f->log_level) != 0) {
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
    if(!f->node || !*f->node) {
        fprintf(stderr, "cozygpu agent: --node is required (or set NODE_NAME)\n");
        return 2;
    }
    if(!f->ns) {
        const char *e = getenv("POD_NAMESPACE");
        f->ns = e && *e ? e : "cozy-gpu-agent";
    }
    if(!f->identity)
        f->identity = lease_default_identity(f->identity_buf, sizeof f->identity_buf);
    if(!*f->ns || !*f->identity) {
        fprintf(stderr, "cozygpu agent: --namespace and --identity must not be empty\n");
        return 2;
    }
    if(snprintf(f->lease_name, sizeof f->lease_name, "cozygpu-agent-%s", f->node) >= (int)sizeof f->lease_name) {
        fprintf(stderr, "cozygpu agent: --node %s: too long for the Lease name cozygpu-agent-<node> (253 characters)\n",
                f->node);
        return 2;
    }
    return -1;
}
