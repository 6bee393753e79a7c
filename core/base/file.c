/* file.c — whole-file reads and sorted directory listings (file.h). */
#include "base/file.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"

int cozy_read_stream(FILE *f, size_t max, char **out, size_t *len)
{
    cozy_buf b = {0}; /* the ceiling is checked here: cozy_buf reads max 0 as "none" */
    char chunk[65536];
    int rc = 0;
    errno = 0; /* a read error that sets none is EIO, not a stale value */
    for(;;) {
        size_t room = max - b.len; /* b.len <= max */
        /* read one byte past the ceiling, to tell "exactly max" from more */
        size_t want = room < sizeof chunk ? room + 1 : sizeof chunk;
        size_t got = fread(chunk, 1, want, f);
        if(got > room) {
            rc = EFBIG;
            break;
        }
        if(got && (rc = cozy_buf_add(&b, chunk, got)) != 0)
            break;
        if(got < want) {
            if(ferror(f))
                rc = errno ? errno : EIO;
            break;
        }
    }
    if(rc) {
        cozy_buf_free(&b);
        return rc;
    }
    if(!b.p && cozy_buf_add(&b, "", 0) != 0)
        return ENOMEM;
    *out = b.p;
    *len = b.len;
    return 0;
}

int cozy_read_file(const char *path, size_t max, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if(!f)
        return errno ? errno : EIO;
    int rc = cozy_read_stream(f, max, out, len);
    fclose(f);
    return rc;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void cozy_free_names(char **names, size_t n)
{
    if(!names)
        return;
    for(size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

int cozy_list_dir(const char *path, int (*keep)(const char *name, void *ctx), void *ctx, char ***names, size_t *n)
{
    DIR *d = opendir(path);
    if(!d)
        return errno ? errno : EIO;
    char **v = NULL;
    size_t count = 0, cap = 0;
    int rc = 0;
    for(;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if(!de) {
            rc = errno;
            break;
        }
        const char *name = de->d_name;
        if(strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || (keep && !keep(name, ctx)))
            continue;
        char **nv = cozy_grow(v, &cap, count + 1, sizeof *v);
        char *copy = nv ? strdup(name) : NULL;
        if(nv)
            v = nv;
        if(!copy) {
            rc = ENOMEM;
            break;
        }
        v[count++] = copy;
    }
    closedir(d);
    if(rc) {
        cozy_free_names(v, count);
        return rc;
    }
    if(count)
        qsort(v, count, sizeof *v, cmp_names);
    *names = v;
    *n = count;
    return 0;
}
