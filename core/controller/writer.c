/* writer.c — the loop every leader-only writer runs (internal.h,
 * ctl_writer_run): wait for keys, build on taking the lead, apply, work,
 * drop on losing it. DESIGN.md §2 (writers run on the leader only, via a
 * Lease), decision 0009 (the first leader-only writer).
 */
#include "controller/internal.h"

#include <stdio.h>

#include "base/log.h"
#include "base/metrics.h"

void ctl_writer_run(const ctl_writer *w)
{
    int built = 0;
    for(;;) {
        long wait = w->wait_ms ? w->wait_ms(w->ud) : 1000;
        int stop;
        ctl_key *batch = ctl_key_wait_take(w->queue, w->wake, wait < 0 ? 0 : wait, &stop, w->take, w->ud);
        if(stop)
            break;
        int leading = lease_is_leader(ctl_proc->lease);
        char labels[96];
        snprintf(labels, sizeof labels, "writer=\"%s\",leading=\"%s\"", w->component, leading ? "true" : "false");
        metrics_counter_add("cozygpu_writer_wakes_total", labels, 1);
        if(!leading || !kube_watcher_synced(ctl_proc->watcher)) {
            keyset_free(&batch);
            if(built) {
                if(w->dropped)
                    log_write(LOG_INFO, w->component, w->dropped, NULL);
                if(w->drop)
                    w->drop(w->ud);
                built = 0;
            }
            continue;
        }
        int had_batch = batch != NULL;
        if(!built) {
            keyset_free(&batch); /* the caches hold all of it */
            if(w->build && w->build(w->ud) != 0)
                continue;
            built = 1;
        } else if(batch && w->apply)
            w->apply(w->ud, batch);
        keyset_free(&batch);
        if(w->work)
            w->work(w->ud, had_batch);
    }
    if(built && w->drop)
        w->drop(w->ud);
}
