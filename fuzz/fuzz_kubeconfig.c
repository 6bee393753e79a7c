/* fuzz_kubeconfig — libFuzzer target for kubeconfig loading
 * (core/kube/kubeconfig.c: kube_config_load, kube_base64_decode).
 *
 * Feeds: the input bytes as the contents of a kubeconfig file, written to
 * `config` in a temporary directory made in LLVMFuzzerInitialize, which
 * also holds ca.crt, client.crt, client.key and token (PEM and token text
 * the seeds name by relative path); kube_config_load reads it with the
 * path given explicitly (never $KUBECONFIG, in-cluster or ~/.kube/config).
 * The bytes, NUL-terminated, also go to kube_base64_decode.
 * No network: loading only reads files.
 * Skipped inputs: any that mention /dev, /proc or /sys, which would make the
 * loader open a device or a FIFO (it opens named files with fopen, as
 * kubectl does) and block the fuzzer; this is a harness limit, not a check.
 * Checks, besides the sanitizers (ASan, UBSan, LeakSanitizer):
 *   - success gives a server URL with "://" and no trailing '/', a source,
 *     and PEM buffers whose lengths match (a length only with a buffer, and
 *     every buffer containing "-----BEGIN ");
 *   - failure leaves the config cleared (all zero) and a non-empty message;
 *   - kube_config_clear leaves it all zero;
 *   - kube_base64_decode gives a NUL-terminated buffer of the length it
 *     reports, or NULL.
 * Seeds: the kubeconfigs of fuzz/seeds/kubeconfig/ (the forms the specs
 * use: -data fields, relative files, tokenFile, insecure, several contexts).
 */
#include "fuzz_tmp.h"
#include "kube/kube_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHECK(c) do { if(!(c)) { fprintf(stderr, "fuzz_kubeconfig: check failed: %s\n", #c); abort(); } } while(0)

static char dir[4096], path[4200];
static const char *const files[][2] = {
    {"ca.crt", "-----BEGIN CERTIFICATE-----\nMIIBfake-ca\n-----END CERTIFICATE-----\n"},
    {"client.crt", "-----BEGIN CERTIFICATE-----\nMIIBfake-client\n-----END CERTIFICATE-----\n"},
    {"client.key", "-----BEGIN EC PRIVATE KEY-----\nMHcfake-key\n-----END EC PRIVATE KEY-----\n"},
    {"token", "fuzz-token\n"},
    {"tok", "fuzz-token\n"},
};

static void write_file(const char *p, const void *data, size_t size)
{
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, size, f) == size);
    CHECK(fclose(f) == 0);
}

static void cleanup(void)
{
    char p[4200];
    for(size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i][0]);
        unlink(p);
    }
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tmpdir(dir, sizeof dir, "kubeconfig");
    char p[4200];
    for(size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i][0]);
        write_file(p, files[i][1], strlen(files[i][1]));
    }
    snprintf(path, sizeof path, "%s/config", dir);
    atexit(cleanup);
    return 0;
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for(size_t i = 0; i < n; i++)
        if(b[i])
            return 0;
    return 1;
}

static void check_pem(const unsigned char *buf, size_t len)
{
    if(!buf) {
        CHECK(len == 0);
        return;
    }
    CHECK(memmem(buf, len, "-----BEGIN ", 11) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if(memmem(data, size, "/dev", 4) || memmem(data, size, "/proc", 5) || memmem(data, size, "/sys", 4))
        return -1; /* not added to the corpus */

    /* kube_base64_decode on the bytes as a C string */
    char *s = malloc(size + 1);
    CHECK(s != NULL);
    memcpy(s, data, size);
    s[size] = 0;
    size_t n = 12345;
    unsigned char *dec = kube_base64_decode(s, &n);
    if(dec) {
        CHECK(n <= size);
        CHECK(dec[n] == 0);
        free(dec);
    }
    free(s);

    write_file(path, data, size);
    kube_client_options o = {0};
    o.kubeconfig = path;
    kube_config cfg;
    memset(&cfg, 0x5a, sizeof cfg);
    cozy_err err = {{0}};
    cozy_result rc = kube_config_load(&cfg, &o, &err);
    if(rc != COZY_OK) {
        CHECK(all_zero(&cfg, sizeof cfg));
        CHECK(err.msg[0] != 0);
        return 0;
    }
    CHECK(cfg.source != NULL);
    CHECK(cfg.server != NULL);
    CHECK(strstr(cfg.server, "://") != NULL);
    size_t l = strlen(cfg.server);
    CHECK(l > 0 && cfg.server[l - 1] != '/');
    check_pem(cfg.ca, cfg.ca_len);
    check_pem(cfg.cert, cfg.cert_len);
    check_pem(cfg.key, cfg.key_len);
    kube_config_clear(&cfg);
    CHECK(all_zero(&cfg, sizeof cfg));
    return 0;
}
