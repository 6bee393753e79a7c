/* keyset.h — a set of string keys ("K:ns/name", "ns/name", a class
 * name...): a uthash table (Debian's uthash-dev), one entry per key. The
 * head is a `keyset *`, NULL when empty; iterate with uthash's HASH_ITER
 * over `hh`. Not locked: a caller sharing a set across threads guards it.
 * Out of memory, a key is dropped (keyset_add says nothing): the users
 * (the leader's loops, the placement model) compare everything again when
 * they take the lead, and the watches relist.
 */
#ifndef COZYGPU_BASE_KEYSET_H
#define COZYGPU_BASE_KEYSET_H

#include <stddef.h>
#include <uthash.h>

typedef struct keyset {
    char *key; /* owned */
    UT_hash_handle hh;
} keyset;

/* Adds a copy of `key` unless it is there already (dropped when out of
 * memory). */
void keyset_add(keyset **set, const char *key);

/* The entry of `key` in `set` (borrowed), or NULL. */
keyset *keyset_find(keyset *set, const char *key);

/* Removes entry k (from keyset_find or an iteration) and frees it. */
void keyset_drop(keyset **set, keyset *k);

/* Empties the set. */
void keyset_free(keyset **set);

/* "ns/name" split at its first '/' into *ns and *name, pointing into buf
 * (n bytes; the key is cut to fit); a key without '/' is a cluster-scoped
 * name: *ns "" and *name the key. */
void keyset_split(const char *key, char *buf, size_t n, const char **ns, const char **name);

#endif
