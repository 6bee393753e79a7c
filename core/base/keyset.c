/* keyset.c — sets of string keys (keyset.h). */
#include "base/keyset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void keyset_add(keyset **set, const char *key)
{
    keyset *k;
    HASH_FIND_STR(*set, key, k);
    if(k)
        return;
    k = calloc(1, sizeof *k);
    if(!k || !(k->key = strdup(key))) {
        free(k);
        return;
    }
    HASH_ADD_KEYPTR(hh, *set, k->key, strlen(k->key), k);
}

keyset *keyset_find(keyset *set, const char *key)
{
    keyset *k = NULL;
    HASH_FIND_STR(set, key, k);
    return k;
}

void keyset_drop(keyset **set, keyset *k)
{
    HASH_DEL(*set, k);
    free(k->key);
    free(k);
}

void keyset_free(keyset **set)
{
    keyset *k, *t;
    HASH_ITER(hh, *set, k, t) keyset_drop(set, k);
}

void keyset_split(const char *key, char *buf, size_t n, const char **ns, const char **name)
{
    snprintf(buf, n, "%s", key);
    char *slash = strchr(buf, '/');
    if(!slash) {
        *ns = "";
        *name = buf;
        return;
    }
    *slash = 0;
    *ns = buf;
    *name = slash + 1;
}
