/* keys.c — the sets of object keys the leader's loops keep (internal.h,
 * ctl_key_, base/keyset.h): what changed, what to write, what to compare.
 *
 * The watcher thread fills a loop's queue under ctl.mu (ctl_key_queue);
 * the loop takes the whole queue in one swap and works on its own sets
 * without the lock. Out of memory, a key is dropped: every loop compares
 * everything again when it takes the lead, and the watches relist.
 */
#include "controller/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void ctl_key_queue(ctl_key **queue, const char *key)
{
    pthread_mutex_lock(&ctl_proc->mu);
    keyset_add(queue, key);
    pthread_cond_broadcast(&ctl_proc->cv);
    pthread_mutex_unlock(&ctl_proc->mu);
}

void ctl_key_queue_object(ctl_key **queue, char kind, const json_t *obj)
{
    const json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    if(!name)
        return;
    size_t n = strlen(name) + (ns ? strlen(ns) : 0) + 4;
    char *key = malloc(n);
    if(!key)
        return;
    snprintf(key, n, "%c:%s/%s", kind, ns ? ns : "", name);
    ctl_key_queue(queue, key);
    free(key);
}

ctl_key *ctl_key_wait(ctl_key **queue, int *wake, long wait_ms, int *stop)
{
    return ctl_key_wait_take(queue, wake, wait_ms, stop, NULL, NULL);
}

ctl_key *ctl_key_wait_take(ctl_key **queue, int *wake, long wait_ms, int *stop, void (*take)(void *ud), void *ud)
{
    pthread_mutex_lock(&ctl_proc->mu);
    if(!ctl_proc->stopping && !*queue && !*wake) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += wait_ms / 1000;
        ts.tv_nsec += (wait_ms % 1000) * 1000000;
        if(ts.tv_nsec >= 1000000000)
            ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&ctl_proc->cv, &ctl_proc->mu, &ts);
    }
    *stop = ctl_proc->stopping;
    ctl_key *batch = *queue;
    *queue = NULL;
    *wake = 0;
    if(take && !*stop)
        take(ud);
    pthread_mutex_unlock(&ctl_proc->mu);
    if(*stop)
        keyset_free(&batch);
    return batch;
}
