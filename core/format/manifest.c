/* manifest.c — manifest files and directories (manifest.h). */
#include "format/manifest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/buf.h"
#include "base/file.h"
#include "format/yamlload.h"

static int is_list_kind(json_t *obj)
{
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    size_t n = kind ? strlen(kind) : 0;
    return n >= 4 && strcmp(kind + n - 4, "List") == 0 && json_is_array(json_object_get(obj, "items"));
}

static cozy_result append_doc(json_t *out, const char *name, size_t index, json_t *obj, cozy_err *err)
{
    if(!json_is_object(obj))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: document %zu is not an object", name, index + 1);
    if(is_list_kind(obj)) {
        size_t i;
        json_t *item;
        json_array_foreach(json_object_get(obj, "items"), i, item) {
            if(!json_is_object(item))
                return cozy_fail(err, COZY_ERR_INPUT, "%s: document %zu: items[%zu] is not an object", name,
                                 index + 1, i);
            json_array_append_new(out, json_pack("{s:s, s:I, s:O}", "file", name, "index", (json_int_t)index,
                                                 "object", item));
        }
        return COZY_OK;
    }
    json_array_append_new(out, json_pack("{s:s, s:I, s:O}", "file", name, "index", (json_int_t)index, "object", obj));
    return COZY_OK;
}

/* JSON integers outside int64 (Go's uint64 fields, e.g. in KubeVirt's API
 * round-trip fixtures) make jansson fail. Kubernetes decodes such a number
 * into an unstructured object as a float64 (apimachinery's JSON decoding
 * keeps int64 where it fits), so do the same: returns a copy of the text in
 * which each such integer token, outside strings, gets a ".0", or NULL when
 * there is none. Caller frees. */
static char *widen_big_integers(const char *buf, size_t len, size_t *outlen)
{
    cozy_buf out = {0};
    int changed = 0, in_str = 0;
    for(size_t i = 0; i < len;) {
        size_t start = i, end = i + 1;
        int big = 0;
        if(in_str) {
            if(buf[i] == '\\' && i + 1 < len)
                end = i + 2;
            else if(buf[i] == '"')
                in_str = 0;
        } else if(buf[i] == '"') {
            in_str = 1;
        } else if(buf[i] == '-' || (buf[i] >= '0' && buf[i] <= '9')) {
            int integral = 1;
            end = i + 1;
            while(end < len && strchr("0123456789.eE+-", buf[end])) {
                if(strchr(".eE", buf[end]))
                    integral = 0;
                end++;
            }
            if(integral) {
                char tmp[64];
                size_t n = end - start;
                if(n < sizeof tmp) {
                    memcpy(tmp, buf + start, n);
                    tmp[n] = 0;
                    errno = 0;
                    (void)strtoll(tmp, NULL, 10);
                    big = errno == ERANGE;
                } else
                    big = 1;
            }
        }
        if(cozy_buf_add(&out, buf + start, end - start) != 0 || (big && cozy_buf_add(&out, ".0", 2) != 0)) {
            cozy_buf_free(&out);
            return NULL;
        }
        changed |= big;
        i = end;
    }
    if(!changed) {
        cozy_buf_free(&out);
        return NULL;
    }
    *outlen = out.len;
    return out.p;
}

cozy_result manifest_load_buffer(const char *buf, size_t len, const char *name, json_t *out, cozy_err *err)
{
    size_t i = 0;
    while(i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == '\n'))
        i++;
    json_t *docs = NULL;
    if(i < len && buf[i] == '{') {
        json_error_t jerr;
        json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if(!j && strstr(jerr.text, "too big integer")) {
            size_t wlen = 0;
            char *wide = widen_big_integers(buf, len, &wlen);
            if(wide) {
                j = json_loadb(wide, wlen, JSON_REJECT_DUPLICATES, &jerr);
                free(wide);
            }
        }
        if(!j)
            return cozy_fail(err, COZY_ERR_PARSE, "%s:%d:%d: %s", name, jerr.line, jerr.column, jerr.text);
        docs = json_array();
        json_array_append_new(docs, j);
    } else {
        yamlload_error yerr;
        memset(&yerr, 0, sizeof yerr);
        docs = yamlload_parse(buf, len, name, &yerr);
        if(!docs) {
            if(yerr.line)
                return cozy_fail(err, COZY_ERR_PARSE, "%s:%lu:%lu: %s", name, yerr.line, yerr.column, yerr.message);
            return cozy_fail(err, COZY_ERR_PARSE, "%s: %s", name, yerr.message);
        }
    }
    json_t *staged = json_array();
    cozy_result rc = COZY_OK;
    size_t k;
    json_t *doc;
    json_array_foreach(docs, k, doc) {
        if((rc = append_doc(staged, name, k, doc, err)) != COZY_OK)
            break;
    }
    if(rc == COZY_OK)
        json_array_extend(out, staged);
    json_decref(staged);
    json_decref(docs);
    return rc;
}

cozy_result manifest_load_file(const char *path, json_t *out, cozy_err *err)
{
    FILE *f = fopen(path, "rb");
    if(!f)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if(fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return cozy_fail(err, COZY_ERR_IO, "%s: not a regular file", path);
    }
    char *buf = NULL;
    size_t len = 0;
    int e = cozy_read_stream(f, MANIFEST_MAX_FILE_BYTES, &buf, &len);
    fclose(f);
    if(e == EFBIG)
        return cozy_fail(err, COZY_ERR_IO, "%s: larger than %u bytes", path, MANIFEST_MAX_FILE_BYTES);
    if(e)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, e == ENOMEM ? "out of memory" : "read error");
    cozy_result rc = manifest_load_buffer(buf, len, path, out, err);
    free(buf);
    return rc;
}

static int has_manifest_ext(const char *name)
{
    size_t n = strlen(name);
    return (n > 5 && strcmp(name + n - 5, ".json") == 0) || (n > 5 && strcmp(name + n - 5, ".yaml") == 0) ||
           (n > 4 && strcmp(name + n - 4, ".yml") == 0);
}

/* cozy_list_dir filter: hidden entries (and "." and "..") are skipped */
static int not_hidden(const char *name, void *ctx)
{
    (void)ctx;
    return name[0] != '.';
}

static cozy_result list_into(const char *path, json_t *files, int top, cozy_err *err)
{
    struct stat st;
    if(stat(path, &st) != 0)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, strerror(errno));
    if(!S_ISDIR(st.st_mode)) {
        if(top || has_manifest_ext(path))
            json_array_append_new(files, json_string(path));
        return COZY_OK;
    }
    char **names = NULL;
    size_t n = 0;
    int e = cozy_list_dir(path, not_hidden, NULL, &names, &n);
    if(e)
        return cozy_fail(err, COZY_ERR_IO, "%s: %s", path, e == ENOMEM ? "out of memory" : strerror(e));
    cozy_result rc = COZY_OK;
    for(size_t i = 0; i < n && rc == COZY_OK; i++) {
        char *child;
        if(asprintf(&child, "%s/%s", path, names[i]) < 0)
            rc = cozy_fail(err, COZY_ERR_IO, "%s: out of memory", path);
        else {
            rc = list_into(child, files, 0, err);
            free(child);
        }
    }
    cozy_free_names(names, n);
    return rc;
}

cozy_result manifest_list_files(const char *path, json_t **files, cozy_err *err)
{
    json_t *list = json_array();
    cozy_result rc = list_into(path, list, 1, err);
    if(rc != COZY_OK) {
        json_decref(list);
        return rc;
    }
    *files = list;
    return COZY_OK;
}

cozy_result manifest_load_path(const char *path, json_t *out, cozy_err *err)
{
    json_t *files;
    cozy_result rc = manifest_list_files(path, &files, err);
    if(rc != COZY_OK)
        return rc;
    json_t *staged = json_array();
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        if((rc = manifest_load_file(json_string_value(f), staged, err)) != COZY_OK)
            break;
    }
    if(rc == COZY_OK)
        json_array_extend(out, staged);
    json_decref(staged);
    json_decref(files);
    return rc;
}
