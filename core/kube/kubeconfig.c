/* kubeconfig.c — kubeconfig files and the in-cluster service account to
 * connection settings (kube_internal.h).
 *
 * Rules and their sources:
 *  - loading order: explicit path, $KUBECONFIG (a ':'-separated list whose
 *    files are merged, the first file to define a name winning, and the
 *    first non-empty current-context winning), in-cluster when
 *    KUBERNETES_SERVICE_HOST is set, ~/.kube/config
 *    (client-go tools/clientcmd loader.go ClientConfigLoadingRules.Load);
 *  - relative file paths resolve against the directory of the kubeconfig
 *    that names them (loader.go ResolveLocalPaths);
 *  - "-data" fields are base64 of the PEM and win over the file form
 *    (client_config.go getUserIdentificationPartialConfig);
 *  - tokenFile is re-read when it changes and wins over token (rest.Config
 *    BearerTokenFile);
 *  - in-cluster: https://KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT
 *    (net.JoinHostPort: IPv6 in brackets), token and ca.crt from
 *    /var/run/secrets/kubernetes.io/serviceaccount (rest/config.go
 *    InClusterConfig).
 * exec and auth-provider plugins are refused with a message naming the field.
 */
#include "kube/kube_internal.h"
#include "format/yamlload.h"

#include "base/b64.h"
#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KUBECONFIG_MAX_FILES 16
#define KUBE_PEM_MAX_BYTES (1u * 1024u * 1024u)

static const char *const SA_ROOT = "/var/run/secrets/kubernetes.io/serviceaccount";

unsigned char *kube_base64_decode(const char *s, size_t *len)
{
    unsigned char *out = NULL;
    return cozy_base64_decode(s, strlen(s), &out, len) == 0 ? out : NULL;
}

void kube_config_clear(kube_config *cfg)
{
    free(cfg->source);
    free(cfg->server);
    free(cfg->ca);
    free(cfg->cert);
    free(cfg->key);
    free(cfg->token);
    free(cfg->token_file);
    free(cfg->token_field);
    memset(cfg, 0, sizeof *cfg);
}

/* One loaded kubeconfig file. */
typedef struct kcfile {
    char *path;
    char *dir; /* for relative paths */
    json_t *doc; /* object (possibly empty) */
} kcfile;

/* Joins dir and a path unless the path is absolute. */
static char *resolve(const char *dir, const char *p)
{
    char *out = NULL;
    if(p[0] == '/' || !dir || !*dir) {
        out = strdup(p);
    } else if(asprintf(&out, "%s/%s", dir, p) < 0) {
        out = NULL;
    }
    return out;
}

/* Finds the entry named `name` in list `list` ("clusters", "users",
   "contexts") of the first file that defines it. */
static json_t *find_named(kcfile *files, int n, const char *list, const char *name,
                          int *file_idx, size_t *index)
{
    for(int f = 0; f < n; f++) {
        json_t *arr = json_object_get(files[f].doc, list);
        size_t i;
        json_t *e;
        if(!json_is_array(arr))
            continue;
        json_array_foreach(arr, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            if(nm && strcmp(nm, name) == 0) {
                *file_idx = f;
                *index = i;
                return e;
            }
        }
    }
    return NULL;
}

/* String field of obj: *out = value or NULL. Error when present and not a string. */
static cozy_result str_field(const json_t *obj, const char *key, const char **out,
                             const char *file, const char *where, cozy_err *err)
{
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if(!v || json_is_null(v))
        return COZY_OK;
    if(!json_is_string(v))
        return cozy_fail(err, COZY_ERR_CONFIG, "%s: %s.%s: must be a string", file, where, key);
    *out = json_string_value(v);
    if(!**out)
        *out = NULL; /* "" means unset, as in client-go */
    return COZY_OK;
}

/* Reads a PEM file or decodes a -data field into *buf. */
static cozy_result pem_field(const json_t *obj, const char *file_key, const char *data_key,
                             const kcfile *kf, const char *where,
                             unsigned char **buf, size_t *len, cozy_err *err)
{
    const char *path, *data;
    cozy_result rc;
    if((rc = str_field(obj, file_key, &path, kf->path, where, err)) != COZY_OK ||
       (rc = str_field(obj, data_key, &data, kf->path, where, err)) != COZY_OK)
        return rc;
    if(data) {
        *buf = kube_base64_decode(data, len);
        if(!*buf)
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: %s.%s: invalid base64", kf->path, where,
                             data_key);
        if(!memmem(*buf, *len, "-----BEGIN ", 11)) {
            free(*buf);
            *buf = NULL;
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: %s.%s: not PEM (no -----BEGIN line after base64)",
                             kf->path, where, data_key);
        }
        return COZY_OK;
    }
    if(path) {
        char *full = resolve(kf->dir, path);
        char *data_read = NULL;
        if(!full)
            return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        int e = cozy_read_file(full, KUBE_PEM_MAX_BYTES, &data_read, len);
        *buf = (unsigned char *)data_read;
        if(e) {
            rc = cozy_fail(err, COZY_ERR_IO, "%s: %s.%s: cannot read %s: %s", kf->path, where,
                           file_key, path, strerror(e));
            free(full);
            return rc;
        }
        free(full);
        if(!memmem(*buf, *len, "-----BEGIN ", 11)) {
            free(*buf);
            *buf = NULL;
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: %s.%s: %s is not PEM (no -----BEGIN line)", kf->path,
                             where, file_key, path);
        }
    }
    return COZY_OK;
}

static cozy_result load_kubeconfig(kube_config *cfg, const char *paths,
                                   const kube_client_options *o, cozy_err *err)
{
    kcfile files[KUBECONFIG_MAX_FILES];
    int n = 0;
    cozy_result rc = COZY_OK;
    char *list = strdup(paths), *save = NULL;
    if(!list)
        return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    memset(files, 0, sizeof files);
    for(char *p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
        struct stat st;
        yamlload_error ye;
        json_t *docs;
        if(!*p)
            continue;
        /* in a list, missing files are skipped (loader.go); a single explicit
           path must exist */
        if(stat(p, &st) != 0 && strchr(paths, ':'))
            continue;
        if(n == KUBECONFIG_MAX_FILES) {
            rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: more than %d kubeconfig files", paths,
                           KUBECONFIG_MAX_FILES);
            goto out;
        }
        docs = yamlload_file(p, &ye);
        if(!docs) {
            if(ye.line)
                rc = cozy_fail(err, COZY_ERR_PARSE, "%s:%lu:%lu: %s", p, ye.line, ye.column,
                               ye.message);
            else
                rc = cozy_fail(err, COZY_ERR_IO, "%s: %s", p, ye.message);
            goto out;
        }
        json_t *doc = json_array_get(docs, 0);
        if(doc && !json_is_object(doc)) {
            json_decref(docs);
            rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: not a kubeconfig (the document is not a mapping)", p);
            goto out;
        }
        files[n].path = strdup(p);
        files[n].doc = doc ? json_incref(doc) : json_object();
        json_decref(docs);
        {
            const char *slash = strrchr(p, '/');
            files[n].dir = slash ? strndup(p, (size_t)(slash - p == 0 ? 1 : slash - p)) : strdup(".");
        }
        n++;
    }
    if(n == 0) {
        rc = cozy_fail(err, COZY_ERR_IO, "%s: cannot open: No such file or directory", paths);
        goto out;
    }

    const char *ctx_name = o->context;
    if(!ctx_name) {
        for(int f = 0; f < n && !ctx_name; f++) {
            const char *cc;
            if((rc = str_field(files[f].doc, "current-context", &cc, files[f].path, "(root)", err)))
                goto out;
            ctx_name = cc;
        }
        if(!ctx_name) {
            rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: current-context is not set (and no context was given)",
                           paths);
            goto out;
        }
    }
    int fi;
    size_t idx;
    char where[96];
    json_t *ctx = find_named(files, n, "contexts", ctx_name, &fi, &idx);
    if(!ctx) {
        rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: contexts: no context named \"%s\"", paths, ctx_name);
        goto out;
    }
    json_t *cbody = json_object_get(ctx, "context");
    snprintf(where, sizeof where, "contexts[%zu].context", idx);
    if(!json_is_object(cbody)) {
        rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s: missing", files[fi].path, where);
        goto out;
    }
    const char *cluster_name, *user_name;
    if((rc = str_field(cbody, "cluster", &cluster_name, files[fi].path, where, err)) ||
       (rc = str_field(cbody, "user", &user_name, files[fi].path, where, err)))
        goto out;
    if(!cluster_name) {
        rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s.cluster: missing", files[fi].path, where);
        goto out;
    }

    /* cluster */
    json_t *cl = find_named(files, n, "clusters", cluster_name, &fi, &idx);
    if(!cl) {
        rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: clusters: no cluster named \"%s\" (context \"%s\")",
                       paths, cluster_name, ctx_name);
        goto out;
    }
    json_t *cbody2 = json_object_get(cl, "cluster");
    snprintf(where, sizeof where, "clusters[%zu].cluster", idx);
    if(!json_is_object(cbody2)) {
        rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s: missing", files[fi].path, where);
        goto out;
    }
    const char *server;
    if((rc = str_field(cbody2, "server", &server, files[fi].path, where, err)))
        goto out;
    if(!server && !o->server) {
        rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s.server: missing", files[fi].path, where);
        goto out;
    }
    if(server && !(cfg->server = strdup(server)))
        goto oom;
    json_t *insecure = json_object_get(cbody2, "insecure-skip-tls-verify");
    if(insecure && !json_is_boolean(insecure)) {
        rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s.insecure-skip-tls-verify: must be a boolean",
                       files[fi].path, where);
        goto out;
    }
    cfg->insecure = json_is_true(insecure);
    if((rc = pem_field(cbody2, "certificate-authority", "certificate-authority-data", &files[fi],
                       where, &cfg->ca, &cfg->ca_len, err)))
        goto out;
    if(cfg->insecure && cfg->ca) {
        /* client-go validation: "specifying a root certificates file with the
           insecure flag is not allowed" */
        rc = cozy_fail(err, COZY_ERR_CONFIG,
                       "%s: %s: certificate-authority and insecure-skip-tls-verify are exclusive",
                       files[fi].path, where);
        goto out;
    }

    /* user (a context may name none: anonymous) */
    if(user_name) {
        json_t *us = find_named(files, n, "users", user_name, &fi, &idx);
        if(!us) {
            rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: users: no user named \"%s\" (context \"%s\")",
                           paths, user_name, ctx_name);
            goto out;
        }
        json_t *ubody = json_object_get(us, "user");
        snprintf(where, sizeof where, "users[%zu].user", idx);
        if(ubody && !json_is_object(ubody)) {
            rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s: must be a mapping", files[fi].path, where);
            goto out;
        }
        if(ubody) {
            static const char *const unsupported[] = {"exec", "auth-provider", "username", "password"};
            for(size_t k = 0; k < sizeof unsupported / sizeof *unsupported; k++)
                if(json_object_get(ubody, unsupported[k]) &&
                   !json_is_null(json_object_get(ubody, unsupported[k]))) {
                    rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s.%s: not supported (use a token, tokenFile or client certificate)",
                                   files[fi].path, where, unsupported[k]);
                    goto out;
                }
            const char *token, *token_file;
            if((rc = str_field(ubody, "token", &token, files[fi].path, where, err)) ||
               (rc = str_field(ubody, "tokenFile", &token_file, files[fi].path, where, err)))
                goto out;
            if(token && !(cfg->token = strdup(token)))
                goto oom;
            if(token_file) {
                if(!(cfg->token_file = resolve(files[fi].dir, token_file)))
                    goto oom;
                if(asprintf(&cfg->token_field, "%s: %s.tokenFile", files[fi].path, where) < 0) {
                    cfg->token_field = NULL;
                    goto oom;
                }
            }
            if((rc = pem_field(ubody, "client-certificate", "client-certificate-data", &files[fi],
                               where, &cfg->cert, &cfg->cert_len, err)) ||
               (rc = pem_field(ubody, "client-key", "client-key-data", &files[fi], where,
                               &cfg->key, &cfg->key_len, err)))
                goto out;
            if(!!cfg->cert != !!cfg->key) {
                rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s: %s given without %s", files[fi].path,
                               where, cfg->cert ? "client-certificate" : "client-key",
                               cfg->cert ? "client-key" : "client-certificate");
                goto out;
            }
        }
    }
    if(!(cfg->source = strdup(paths)))
        goto oom;
    goto out;
oom:
    rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
out:
    for(int f = 0; f < n; f++) {
        free(files[f].path);
        free(files[f].dir);
        json_decref(files[f].doc);
    }
    free(list);
    return rc;
}

static cozy_result load_in_cluster(kube_config *cfg, const kube_client_options *o, cozy_err *err)
{
    const char *root = o->in_cluster_root ? o->in_cluster_root : SA_ROOT;
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    char *path = NULL;
    int e = 0;
    if(!host || !*host || !port || !*port)
        return cozy_fail(err, COZY_ERR_CONFIG,
                         "in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set");
    if(asprintf(&cfg->server, strchr(host, ':') ? "https://[%s]:%s" : "https://%s:%s", host, port) < 0)
        goto oom;
    if(asprintf(&cfg->token_file, "%s/token", root) < 0 || !(cfg->token_field = strdup(cfg->token_file)))
        goto oom;
    {
        /* the token must be readable now (InClusterConfig fails otherwise) */
        size_t len;
        char *t = NULL;
        if((e = cozy_read_file(cfg->token_file, KUBE_PEM_MAX_BYTES, &t, &len)) != 0)
            return cozy_fail(err, COZY_ERR_IO, "in-cluster: cannot read %s: %s", cfg->token_file,
                             strerror(e));
        free(t);
    }
    if(asprintf(&path, "%s/ca.crt", root) < 0)
        goto oom;
    char *ca = NULL;
    e = cozy_read_file(path, KUBE_PEM_MAX_BYTES, &ca, &cfg->ca_len);
    cfg->ca = (unsigned char *)ca;
    if(e) {
        cozy_result rc = cozy_fail(err, COZY_ERR_IO, "in-cluster: cannot read %s: %s", path, strerror(e));
        free(path);
        return rc;
    }
    free(path);
    if(!(cfg->source = strdup("in-cluster")))
        goto oom;
    return COZY_OK;
oom:
    return cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
}

cozy_result kube_config_load(kube_config *cfg, const kube_client_options *o, cozy_err *err)
{
    cozy_result rc;
    const char *env = getenv("KUBECONFIG");
    memset(cfg, 0, sizeof *cfg);
    if(o->kubeconfig && *o->kubeconfig) {
        rc = load_kubeconfig(cfg, o->kubeconfig, o, err);
    } else if(env && *env) {
        rc = load_kubeconfig(cfg, env, o, err);
    } else if(getenv("KUBERNETES_SERVICE_HOST") && *getenv("KUBERNETES_SERVICE_HOST")) {
        rc = load_in_cluster(cfg, o, err);
    } else {
        const char *home = getenv("HOME");
        char *p = NULL;
        struct stat st;
        if(home && asprintf(&p, "%s/.kube/config", home) < 0)
            p = NULL;
        if(p && stat(p, &st) == 0) {
            rc = load_kubeconfig(cfg, p, o, err);
        } else if(o->server) {
            /* no configuration at all: kubectl --server alone works anonymously */
            rc = (cfg->source = strdup("(none)")) ? COZY_OK : cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
        } else {
            rc = cozy_fail(err, COZY_ERR_CONFIG,
                           "no configuration: no kubeconfig given, $KUBECONFIG unset, not in a cluster, and %s missing",
                           p ? p : "~/.kube/config");
        }
        free(p);
    }
    if(rc == COZY_OK && o->server) {
        free(cfg->server);
        if(!(cfg->server = strdup(o->server)))
            rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
    }
    if(rc == COZY_OK) {
        size_t l = strlen(cfg->server);
        while(l > 0 && cfg->server[l - 1] == '/')
            cfg->server[--l] = 0;
        if(!strstr(cfg->server, "://")) {
            /* "host:port" means https (client-go rest.DefaultServerURL) */
            char *u = NULL;
            if(asprintf(&u, "https://%s", cfg->server) < 0)
                rc = cozy_fail(err, COZY_ERR_INTERNAL, "out of memory");
            else {
                free(cfg->server);
                cfg->server = u;
            }
        } else if(strncmp(cfg->server, "https://", 8) != 0 && strncmp(cfg->server, "http://", 7) != 0) {
            rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: server \"%s\": must be an https:// or http:// URL",
                           cfg->source, cfg->server);
        }
    }
    if(rc != COZY_OK)
        kube_config_clear(cfg);
    return rc;
}
