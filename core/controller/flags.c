/* flags.c — `cozygpu controller` flags: defaults, parsing, checks and the
 * usage text (flags.h). The specs match the messages and the --help text
 * word for word.
 */
#include "controller/flags.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/cpus.h"
#include "base/duration.h"
#include "base/log.h"
#include "kube/lease.h"

/* Prints "cozygpu controller: " and the formatted message as one line to
 * stderr; returns -1, what ctl_flags_parse returns for it. */
static int flag_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int flag_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cozygpu controller: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

/* Parses arg as a decimal int into *out (strtol, then narrowed to int, as
 * the flags always were) and returns 0 when it is all digits and in
 * lo..hi; else -1 (*out holds what was parsed). */
static int int_in(const char *arg, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10); /* range-checked before it is narrowed to int */
    if(!*arg || *end || errno == ERANGE || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* Sets *out to 1 when arg is `one`, to 0 when it is `zero`, and returns
 * 0; returns -1 (and leaves *out) for anything else. */
static int one_of_two(const char *arg, const char *one, const char *zero, int *out)
{
    if(strcmp(arg, one) == 0)
        *out = 1;
    else if(strcmp(arg, zero) == 0)
        *out = 0;
    else
        return -1;
    return 0;
}

/* The --help text (and, to stderr, the answer to an unknown option). */
static void usage(FILE *f)
{
    fputs(
        "usage: cozygpu controller [options]\n"
        "\n"
        "Serves the admission webhooks over HTTPS (every replica), watches the cluster,\n"
        "reloads policies from a ConfigMap, and, while it holds the Lease, runs the\n"
        "writers (the binder's claim status and launcher pod pins, GPUClass status,\n"
        "usage records, license token copies). Stops gracefully on SIGTERM.\n"
        "\n"
        "API server:\n"
        "  --kubeconfig FILE        kubeconfig (default: $KUBECONFIG, then in-cluster,\n"
        "                           then ~/.kube/config)\n"
        "  --context NAME           kubeconfig context (default: current-context)\n"
        "  --server URL             API server URL, overriding the kubeconfig's\n"
        "  --namespace NS           the controller's namespace: policies ConfigMap, Lease,\n"
        "                           Events (default: $POD_NAMESPACE, else cozy-gpu)\n"
        "  --identity ID            this replica's name in the Lease; must be unique (default:\n"
        "                           $POD_NAME, else HOSTNAME_RANDOM, a new suffix per start)\n"
        "  --resync DURATION        relist every watched resource, and re-assert the license\n"
        "                           token copies (written, never read), this often\n"
        "                           (default 10m; 0 never)\n"
        "\n"
        "policies and settings:\n"
        "  --config FILE            settings file (DESIGN.md §10; default: built-in defaults)\n"
        "  --policies-configmap NAME  ConfigMap in --namespace whose *.lua keys override the\n"
        "                           default policies; reloaded on change (default\n"
        "                           cozygpu-policies; \"\" to disable)\n"
        "  --policies DIR           default policy bundle (default: the installed policies/)\n"
        "  --library DIR            policy library (default: the installed lua/)\n"
        "  --state-dir DIR          where SIGUSR1 writes cache.json (default: $TMPDIR or /tmp)\n"
        "\n"
        "webhook server:\n"
        "  --address ADDR           listen address (default 0.0.0.0)\n"
        "  --port N                 HTTPS port (default 8443; 0 picks a free one)\n"
        "  --port-file FILE         write the bound port to FILE once listening\n"
        "  --probe-port N           also serve /healthz, /readyz and /metrics over plain\n"
        "                           HTTP on port N, on their own thread, so that busy\n"
        "                           review workers never fail the probes (default: off;\n"
        "                           0 picks a free one)\n"
        "  --probe-port-file FILE   write the bound probe port to FILE once listening\n"
        "  --tls-cert-file FILE     PEM certificate (chain); re-read when it changes\n"
        "  --tls-key-file FILE      PEM private key; re-read when it changes\n"
        "  --workers N              review slots, one Lua state each, and review threads\n"
        "                           (default: as many as CPUs available, from 2 to 4;\n"
        "                           CPUs available is the affinity mask lowered to the\n"
        "                           cgroup's CPU quota)\n"
        "  --io-threads N           TLS and HTTP threads; they run a small review in a\n"
        "                           free slot for up to 2 ms of CPU and queue the rest\n"
        "                           for the review threads (default: half the CPUs\n"
        "                           available, 1 or 2)\n"
        "  --review-timeout DURATION  deadline for one review; keep it below the\n"
        "                           webhooks' timeoutSeconds (default 8s)\n"
        "  --max-body-bytes N       largest AdmissionReview accepted (default 3145728)\n"
        "  --shutdown-grace DURATION  how long SIGTERM waits for reviews in flight\n"
        "                           (default 25s)\n"
        "\n"
        "webhook clients (what one client can hold; defaults fit a 512Mi memory limit):\n"
        "  --max-connections N      open connections in all (default 512)\n"
        "  --max-connections-per-address N  open connections from one IP address; more\n"
        "                           are closed at once (default 128, or\n"
        "                           --max-connections when smaller)\n"
        "  --request-timeout DURATION  time from accept (or, on a kept-alive connection,\n"
        "                           from the request line) to a complete request; the\n"
        "                           connection is closed after it (default 10s)\n"
        "  --max-body-bytes-in-flight N  bytes of review bodies held at once across\n"
        "                           connections; above it a review gets 503 with\n"
        "                           Retry-After (default 67108864; >= --max-body-bytes)\n"
        "\n"
        "leader election (coordination.k8s.io/v1 Lease in --namespace):\n"
        "  --leader-elect true|false  run leader election (default true); false: this\n"
        "                           replica never runs the writers\n"
        "  --lease-name NAME        (default cozygpu-controller)\n"
        "  --lease-duration DURATION  how long a holder's record is valid (default 15s)\n"
        "  --renew-deadline DURATION  the leader stops acting when it could not renew\n"
        "                           for this long (default 10s)\n"
        "  --retry-period DURATION  between acquire and renew attempts (default 2s)\n"
        "  --status-interval DURATION  how often the leader re-checks GPUClass status\n"
        "                           besides watch events (default 30s)\n"
        "\n"
        "DURATION is a number with a unit, as in Go and kubectl: 500ms, 15s, 2m, 1h, 1m30s\n"
        "(a bare number is seconds).\n"
        "\n"
        "logging:\n"
        "  --log-format json|text   (default text)\n"
        "  --log-level debug|info|warn|error  (default info)\n"
        "\n"
        "signals: SIGTERM/SIGINT shut down gracefully; SIGUSR1 writes what the watch\n"
        "caches hold to STATE-DIR/cache.json\n"
        "\n"
        "exit status: 0 after a graceful shutdown, 2 on bad flags or a start-up failure\n",
        f);
}

/* The long name of option `code` in `opts` (searched: the table is not
 * in enum order). */
static const char *option_name(const struct option *opts, int code)
{
    for(; opts->name; opts++)
        if(opts->val == code)
            return opts->name;
    return "?";
}

int ctl_flags_parse(int argc, char **argv, ctl_flags *f)
{
    enum {
        O_KUBECONFIG = 1000, O_CONTEXT, O_SERVER, O_NS, O_ID, O_CONFIG, O_PCM, O_POLICIES, O_LIBRARY, O_STATE,
        O_ADDRESS, O_PORT, O_PORTFILE, O_CERT, O_KEY, O_WORKERS, O_RTIMEOUT, O_MAXBODY, O_LEADER, O_LEASE,
        O_LEASEDUR, O_RENEW, O_RETRY, O_RESYNC, O_GRACE, O_STATUSINT, O_LOGFMT, O_LOGLVL, O_HELP, O_MAXCONN,
        O_MAXCONNADDR, O_REQTIMEOUT, O_BODYFLIGHT, O_PROBEPORT, O_PROBEPORTFILE, O_IOTHREADS
    };
    static const struct option opts[] = {
        {"kubeconfig", required_argument, 0, O_KUBECONFIG}, {"context", required_argument, 0, O_CONTEXT},
        {"server", required_argument, 0, O_SERVER},         {"namespace", required_argument, 0, O_NS},
        {"identity", required_argument, 0, O_ID},           {"config", required_argument, 0, O_CONFIG},
        {"policies-configmap", required_argument, 0, O_PCM}, {"policies", required_argument, 0, O_POLICIES},
        {"library", required_argument, 0, O_LIBRARY},       {"state-dir", required_argument, 0, O_STATE},
        {"address", required_argument, 0, O_ADDRESS},       {"port", required_argument, 0, O_PORT},
        {"port-file", required_argument, 0, O_PORTFILE},    {"probe-port", required_argument, 0, O_PROBEPORT},
        {"probe-port-file", required_argument, 0, O_PROBEPORTFILE},    {"tls-cert-file", required_argument, 0, O_CERT},
        {"tls-key-file", required_argument, 0, O_KEY},      {"workers", required_argument, 0, O_WORKERS},
        {"review-timeout", required_argument, 0, O_RTIMEOUT}, {"max-body-bytes", required_argument, 0, O_MAXBODY},
        {"leader-elect", required_argument, 0, O_LEADER},   {"lease-name", required_argument, 0, O_LEASE},
        {"lease-duration", required_argument, 0, O_LEASEDUR}, {"renew-deadline", required_argument, 0, O_RENEW},
        {"retry-period", required_argument, 0, O_RETRY},    {"resync", required_argument, 0, O_RESYNC},
        {"shutdown-grace", required_argument, 0, O_GRACE},  {"status-interval", required_argument, 0, O_STATUSINT},
        {"log-format", required_argument, 0, O_LOGFMT},     {"log-level", required_argument, 0, O_LOGLVL},
        {"help", no_argument, 0, O_HELP},
        {"max-connections", required_argument, 0, O_MAXCONN},
        {"max-connections-per-address", required_argument, 0, O_MAXCONNADDR},
        {"request-timeout", required_argument, 0, O_REQTIMEOUT},
        {"max-body-bytes-in-flight", required_argument, 0, O_BODYFLIGHT},
        {"io-threads", required_argument, 0, O_IOTHREADS},
        {0, 0, 0, 0},
    };
    static char identity[300];
    const char *env_ns = getenv("POD_NAMESPACE");
    const char *tmp = getenv("TMPDIR");
    *f = (ctl_flags){
        .ns = env_ns && *env_ns ? env_ns : "cozy-gpu",
        .identity = lease_default_identity(identity, sizeof identity),
        .policies_configmap = "cozygpu-policies",
        .state_dir = tmp && *tmp ? tmp : "/tmp",
        .address = "0.0.0.0",
        .port = 8443,
        .probe_port = -1,
        .workers = 0,    /* 0: from the CPUs available (ctl_flags_threads) */
        .io_threads = 0,
        .review_timeout_ms = 8000,
        .max_body = 3 * 1024 * 1024,
        .max_connections = 512,
        .max_connections_per_address = 128,
        .request_timeout_ms = 10000,
        .max_body_in_flight = 64L * 1024 * 1024,
        .leader_elect = 1,
        .lease_name = "cozygpu-controller",
        .lease_ms = 15000,
        .renew_ms = 10000,
        .retry_ms = 2000,
        .resync_ms = 600000,
        .shutdown_grace_ms = 25000,
        .status_interval_ms = 30000,
        .level = LOG_INFO,
    };
    int c, per_address_set = 0;
    optind = 1;
    while((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        long *dur = NULL;
        char *end;
        switch(c) {
        case O_KUBECONFIG: f->kubeconfig = optarg; break;
        case O_CONTEXT: f->context = optarg; break;
        case O_SERVER: f->server = optarg; break;
        case O_NS: f->ns = optarg; break;
        case O_ID: f->identity = optarg; break;
        case O_CONFIG: f->config_file = optarg; break;
        case O_PCM: f->policies_configmap = optarg; break;
        case O_POLICIES: f->policies_dir = optarg; break;
        case O_LIBRARY: f->library_dir = optarg; break;
        case O_STATE: f->state_dir = optarg; break;
        case O_ADDRESS: f->address = optarg; break;
        case O_PORT:
            if(int_in(optarg, 0, 65535, &f->port) != 0)
                return flag_error("--port: not a port number: %s", optarg);
            break;
        case O_PORTFILE: f->port_file = optarg; break;
        case O_PROBEPORT:
            if(int_in(optarg, 0, 65535, &f->probe_port) != 0)
                return flag_error("--probe-port: not a port number: %s", optarg);
            break;
        case O_PROBEPORTFILE: f->probe_port_file = optarg; break;
        case O_CERT: f->cert_file = optarg; break;
        case O_KEY: f->key_file = optarg; break;
        case O_WORKERS:
            if(int_in(optarg, 1, 256, &f->workers) != 0)
                return flag_error("--workers: need 1..256, got %s", optarg);
            break;
        case O_IOTHREADS:
            if(int_in(optarg, 1, 64, &f->io_threads) != 0)
                return flag_error("--io-threads: need 1..64, got %s", optarg);
            break;
        case O_MAXBODY:
            f->max_body = strtol(optarg, &end, 10);
            if(!*optarg || *end || f->max_body < 1024)
                return flag_error("--max-body-bytes: need an integer >= 1024, got %s", optarg);
            break;
        case O_MAXCONN:
            if(int_in(optarg, 1, 65536, &f->max_connections) != 0)
                return flag_error("--max-connections: need 1..65536, got %s", optarg);
            break;
        case O_MAXCONNADDR:
            if(int_in(optarg, 1, 65536, &f->max_connections_per_address) != 0)
                return flag_error("--max-connections-per-address: need 1..65536, got %s", optarg);
            per_address_set = 1;
            break;
        case O_REQTIMEOUT: dur = &f->request_timeout_ms; break;
        case O_BODYFLIGHT:
            f->max_body_in_flight = strtol(optarg, &end, 10);
            if(!*optarg || *end || f->max_body_in_flight < 1024)
                return flag_error("--max-body-bytes-in-flight: need an integer >= 1024, got %s", optarg);
            break;
        case O_LEADER:
            if(one_of_two(optarg, "true", "false", &f->leader_elect) != 0)
                return flag_error("--leader-elect: true or false, got %s", optarg);
            break;
        case O_LEASE: f->lease_name = optarg; break;
        case O_RTIMEOUT: dur = &f->review_timeout_ms; break;
        case O_LEASEDUR: dur = &f->lease_ms; break;
        case O_RENEW: dur = &f->renew_ms; break;
        case O_RETRY: dur = &f->retry_ms; break;
        case O_RESYNC: dur = &f->resync_ms; break;
        case O_GRACE: dur = &f->shutdown_grace_ms; break;
        case O_STATUSINT: dur = &f->status_interval_ms; break;
        case O_LOGFMT:
            if(one_of_two(optarg, "json", "text", &f->log_json) != 0)
                return flag_error("--log-format: json or text, got %s", optarg);
            break;
        case O_LOGLVL:
            if(log_level_parse(optarg, &f->level) != 0)
                return flag_error("--log-level: debug, info, warn or error, got %s", optarg);
            break;
        case O_HELP: usage(stdout); return 1;
        default: usage(stderr); return -1;
        }
        if(dur && cozy_parse_duration(optarg, dur) != 0)
            return flag_error("--%s: not a duration (like 500ms, 15s, 2m): %s", option_name(opts, c),
                              optarg);
    }
    if(optind < argc)
        return flag_error("unexpected argument \"%s\"", argv[optind]);
    const struct {
        const char *flag;
        const char **value;
    } names[] = {{"--namespace", &f->ns}, {"--identity", &f->identity}, {"--lease-name", &f->lease_name}};
    for(size_t i = 0; i < sizeof names / sizeof *names; i++)
        if(!*names[i].value || !**names[i].value)
            return flag_error("%s: must not be empty", names[i].flag);
    if(f->policies_configmap && *f->policies_configmap) {
        /* a ConfigMap name is a DNS subdomain (RFC 1123): lowercase
         * letters, digits, '-' and '.', at most 253 */
        const char *n = f->policies_configmap;
        int ok = strlen(n) <= 253 && isalnum((unsigned char)n[0]) && isalnum((unsigned char)n[strlen(n) - 1]);
        for(const char *q = n; ok && *q; q++)
            ok = (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '-' || *q == '.';
        if(!ok)
            return flag_error("--policies-configmap: \"%s\" is not a ConfigMap name "
                              "(lowercase letters, digits, '-' and '.')",
                              n);
    }
    if(f->workers == 0 || f->io_threads == 0) {
        /* from the CPUs this process may use (base/cpus.h): a review
         * thread per CPU, and never fewer than two, so that one review
         * stuck until its deadline leaves another to run (decision 0017);
         * half as many I/O threads (they only move bytes) */
        int cpus = cozy_cpus_available(NULL);
        /* at most CTL_DEFAULT_MAX_WORKERS: each review thread holds a Lua
         * state of up to policyBudget.memoryBytes, and the Deployment's
         * memory limit (deploy/40-controller.yaml) is sized for that many;
         * the Deployment sets no CPU limit, so a large node's count alone
         * would be far too many */
        if(f->workers == 0)
            f->workers = cpus < 2 ? 2 : cpus > CTL_DEFAULT_MAX_WORKERS ? CTL_DEFAULT_MAX_WORKERS : cpus;
        if(f->io_threads == 0)
            f->io_threads = cpus / 2 < 1 ? 1 : cpus / 2 > CTL_DEFAULT_MAX_WORKERS / 2 ? CTL_DEFAULT_MAX_WORKERS / 2
                                                                                  : cpus / 2;
    }
    if(f->leader_elect && !(f->retry_ms > 0 && f->retry_ms < f->renew_ms && f->renew_ms < f->lease_ms))
        return flag_error("--retry-period (%ld ms) < --renew-deadline (%ld ms) < --lease-duration (%ld ms) is "
                          "required",
                          f->retry_ms, f->renew_ms, f->lease_ms);
    if(!f->cert_file || !f->key_file)
        return flag_error("--tls-cert-file and --tls-key-file are required (the API server calls webhooks over "
                          "HTTPS only)");
    {
        struct stat st;
        errno = 0;
        if(stat(f->state_dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(f->state_dir, W_OK | X_OK) != 0)
            return flag_error("--state-dir %s: not a writable directory%s%s", f->state_dir, errno ? ": " : "",
                              errno ? strerror(errno) : "");
    }
    if(f->review_timeout_ms < 100 || f->review_timeout_ms > 29000)
        return flag_error("--review-timeout: need 100ms..29s (webhooks time out at 30s at most)");
    if(f->request_timeout_ms < 100 || f->request_timeout_ms > 60000)
        return flag_error("--request-timeout: need 100ms..60s");
    if(f->status_interval_ms < 1000) /* the leader's status loop would spin */
        return flag_error("--status-interval: need at least 1s");
    if(!per_address_set && f->max_connections_per_address > f->max_connections)
        f->max_connections_per_address = f->max_connections; /* the default follows a smaller total */
    if(f->max_connections_per_address > f->max_connections)
        return flag_error("--max-connections-per-address (%d) must not be above --max-connections (%d)",
                          f->max_connections_per_address, f->max_connections);
    if(f->max_body_in_flight < f->max_body)
        return flag_error("--max-body-bytes-in-flight (%ld) must be at least --max-body-bytes (%ld), or the "
                          "largest review could never be taken",
                          f->max_body_in_flight, f->max_body);
    return 0;
}
