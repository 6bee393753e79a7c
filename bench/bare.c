/* bare.c — the transport limit for the benchmark (cozygpu-bare): a
 * libmicrohttpd TLS server set up like core/server/webhook.c (TLS 1.2/1.3 priority
 * string, internal thread pool with epoll, keep-alive) that reads each POST
 * body and answers a fixed AdmissionReview without looking at it. Whatever
 * the webhook costs beyond this is ours.
 *
 *   cozygpu-bare --cert F --key F [--address A] [--port N] [--port-file F] [--workers N]
 *
 * SIGTERM/SIGINT stop it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char ANSWER[] =
    "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"response\":"
    "{\"uid\":\"00000000-0000-0000-0000-000000000000\",\"allowed\":true}}";

static struct MHD_Response *answer;

static enum MHD_Result handle(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                              const char *version, const char *data, size_t *data_size, void **con_cls)
{
    (void)cls, (void)url, (void)method, (void)version, (void)data;
    if(*con_cls == NULL) { /* headers in: wait for the body */
        *con_cls = (void *)1;
        return MHD_YES;
    }
    if(*data_size) { /* drop the body */
        *data_size = 0;
        return MHD_YES;
    }
    return MHD_queue_response(con, MHD_HTTP_OK, answer);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if(!f) {
        fprintf(stderr, "cozygpu-bare: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    char *out = malloc(n + 1);
    memcpy(out, buf, n);
    out[n] = '\0';
    return out;
}

int main(int argc, char **argv)
{
    const char *cert = NULL, *key = NULL, *addr = "127.0.0.1", *port_file = NULL;
    int port = 0;
    unsigned workers = 4;
    for(int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if(strcmp(a, "--cert") == 0)
            cert = v;
        else if(strcmp(a, "--key") == 0)
            key = v;
        else if(strcmp(a, "--address") == 0)
            addr = v;
        else if(strcmp(a, "--port") == 0)
            port = atoi(v);
        else if(strcmp(a, "--port-file") == 0)
            port_file = v;
        else if(strcmp(a, "--workers") == 0)
            workers = (unsigned)atoi(v);
        else {
            fprintf(stderr, "usage: cozygpu-bare --cert F --key F [--address A] [--port N] [--port-file F] [--workers N]\n");
            return 2;
        }
    }
    if(!cert || !key) {
        fprintf(stderr, "cozygpu-bare: --cert and --key are required\n");
        return 2;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if(inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        fprintf(stderr, "cozygpu-bare: %s is not an IPv4 address\n", addr);
        return 2;
    }
    answer = MHD_create_response_from_buffer(sizeof ANSWER - 1, (void *)ANSWER, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(answer, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    char *cpem = slurp(cert), *kpem = slurp(key);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_TLS | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_USE_ERROR_LOG,
        (uint16_t)port, NULL, NULL, handle, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_THREAD_POOL_SIZE, workers, MHD_OPTION_HTTPS_PRIORITIES, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2",
        MHD_OPTION_HTTPS_MEM_CERT, cpem, MHD_OPTION_HTTPS_MEM_KEY, kpem, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
        MHD_OPTION_END);
    if(!d) {
        fprintf(stderr, "cozygpu-bare: cannot start on %s port %d\n", addr, port);
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if(port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if(!f || fprintf(f, "%u\n", info ? info->port : (unsigned)port) < 0 || fclose(f) != 0 || rename(tmp, port_file) != 0) {
            fprintf(stderr, "cozygpu-bare: cannot write %s\n", port_file);
            return 1;
        }
    }
    int sig;
    sigwait(&set, &sig);
    MHD_stop_daemon(d);
    MHD_destroy_response(answer);
    free(cpem);
    free(kpem);
    return 0;
}
