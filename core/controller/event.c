/* event.c — core/v1 Events on the controller's own objects (internal.h,
 * ctl_event_).
 *
 * Rules: client-go tools/record (EventRecorder: an Event named
 * "<object>.<hex nanoseconds>" in the object's namespace, with
 * involvedObject, reason, message, source and the first and last
 * timestamps); the Kubernetes API conventions on Events. Used by bundle.c
 * (the policies ConfigMap), usage.c (the Lease) and license.c (GPUClasses,
 * cluster-scoped: their Events go to "default").
 */
#include "base/clock.h"
#include "controller/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/utf8.h"

void ctl_event_record(const json_t *obj, const char *api_version, const char *kind, const char *type,
                      const char *reason, const char *message)
{
    const json_t *md = json_object_get(obj, "metadata");
    const char *name = json_string_value(json_object_get(md, "name"));
    /* a cluster-scoped object's Event goes to "default", with no
     * involvedObject.namespace: kube-apiserver refuses any other namespace
     * for a core/v1 Event without eventTime (pkg/apis/core/validation/
     * events.go, ValidateEventCreate), and client-go's recorder does so */
    const char *obj_ns = json_string_value(json_object_get(md, "namespace"));
    const char *ns = obj_ns ? obj_ns : "default";
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char ev_name[300], stamp[40];
    snprintf(ev_name, sizeof ev_name, "%s.%llx", name ? name : "cozygpu",
             (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    clock_rfc3339(ts.tv_sec, stamp, sizeof stamp);
    /* keep Event messages near 1 KiB; a cut inside a UTF-8 sequence (and
     * any other byte jansson would refuse) becomes U+FFFD, so the Event is
     * never dropped for its text */
    size_t mlen = strlen(message), slen = 0;
    char *msg = cozy_utf8_sanitize(message, mlen > 1000 ? 1000 : mlen, 0, &slen);
    if(!msg) {
        log_write(LOG_WARN, "events", "cannot record an event", "reason", reason, "error", "out of memory", NULL);
        return;
    }
    json_t *ev = json_pack(
        "{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:s, s:s?, s:s, s:s?, s:s?}, s:s, s:s, s:s, s:{s:s}, s:s, s:s, s:s, s:s, s:i}",
        "apiVersion", "v1", "kind", "Event", "metadata", "name", ev_name, "namespace", ns, "involvedObject",
        "apiVersion", api_version, "kind", kind, "namespace", obj_ns, "name", name ? name : "", "uid",
        json_string_value(json_object_get(md, "uid")), "resourceVersion",
        json_string_value(json_object_get(md, "resourceVersion")), "type", type, "reason", reason, "message", msg,
        "source", "component", "cozygpu-controller", "reportingComponent", "cozygpu-controller",
        "reportingInstance", ctl_proc->f.identity, "firstTimestamp", stamp, "lastTimestamp", stamp, "count", 1);
    free(msg);
    if(!ev) {
        log_write(LOG_WARN, "events", "cannot record an event", "reason", reason, "error",
                  "cannot build the Event (a field is not valid UTF-8)", NULL);
        return;
    }
    char *path = kube_path(&KUBE_EVENTS, ns, NULL, NULL);
    long status = 0;
    json_t *res = NULL;
    cozy_err err = {.msg = "out of memory building the Event's path"};
    if(!path || kube_request(ctl_proc->client, "POST", path, NULL, ev, &status, &res, &err) != COZY_OK)
        log_write(LOG_WARN, "events", "cannot record an event", "reason", reason, "error", err.msg, NULL);
    else if(status != 201 && status != 200) {
        /* refused (a missing grant, an invalid Event): said with the API
         * server's reason, not dropped in silence */
        char code[16];
        snprintf(code, sizeof code, "%ld", status);
        const char *why = json_string_value(json_object_get(res, "message"));
        log_write(LOG_WARN, "events", "event refused", "reason", reason, LOG_NUM "status", code, "error",
                  why ? why : "", NULL);
    }
    free(path);
    json_decref(res);
    json_decref(ev);
}
