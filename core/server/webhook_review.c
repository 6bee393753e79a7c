/* webhook_review.c — the webhook server's review side: the review of one
 * AdmissionReview and the pool of review threads that run them.
 *
 * A review request is parsed (duplicate keys refused), checked
 * (admission.k8s.io/v1 AdmissionReview with a request.uid), reviewed by the
 * callback within its deadline, and its answer checked (fail closed: a
 * failed review or an unusable answer is a 500 refusal). Where reviews
 * run: "review slots and threads" below (decisions 0017, 0052).
 */
#include "server/webhook.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/jsonload.h"
#include "server/webhook_internal.h"

/* NULL when `doc` is an admission.k8s.io/v1 AdmissionReview with a request
   and a request.uid; else what is wrong with it. */
static const char *wh_review_problem(const json_t *doc, char *buf, size_t len)
{
    if(!json_is_object(doc))
        return "the body is not a JSON object";
    const char *av = json_string_value(json_object_get(doc, "apiVersion"));
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    if(!kind || strcmp(kind, "AdmissionReview") != 0) {
        snprintf(buf, len, "kind is %s%s%s, want \"AdmissionReview\"", kind ? "\"" : "", kind ? kind : "missing",
                 kind ? "\"" : "");
        return buf;
    }
    if(!av || strcmp(av, "admission.k8s.io/v1") != 0) {
        snprintf(buf, len, "apiVersion is %s%s%s, want \"admission.k8s.io/v1\" (admissionReviewVersions: [v1])",
                 av ? "\"" : "", av ? av : "missing", av ? "\"" : "");
        return buf;
    }
    const json_t *req = json_object_get(doc, "request");
    if(!json_is_object(req))
        return "request is missing or not an object";
    const char *uid = json_string_value(json_object_get(req, "uid"));
    if(!uid || !*uid)
        return "request.uid is missing or empty";
    return NULL;
}

/* NULL when the callback's answer is usable; else why not. */
static const char *wh_response_problem(const json_t *out, const char *uid)
{
    if(!json_is_object(out))
        return "no AdmissionReview";
    const json_t *resp = json_object_get(out, "response");
    if(!json_is_object(resp))
        return "response missing";
    const char *ruid = json_string_value(json_object_get(resp, "uid"));
    if(!ruid || strcmp(ruid, uid) != 0)
        return "response.uid differs from request.uid";
    if(!json_is_boolean(json_object_get(resp, "allowed")))
        return "response.allowed missing";
    return NULL;
}

/* Leaves a plain-text answer in r for the I/O thread (review threads). */
static void wh_answer_text(wh_req *r, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void wh_answer_text(wh_req *r, unsigned status, const char *fmt, ...)
{
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    r->ans_status = status;
    r->ans_ctype = "text/plain; charset=utf-8";
    r->ans_text = n < 0 ? NULL : msg; /* NULL: the I/O thread closes the connection */
    r->ans_len = n < 0 ? 0 : (size_t)n;
}

/* The review slot this thread holds (webhook_review_slot), and whether it
   runs the review inline (webhook_running_inline). */
static __thread int wh_slot = -1;
static __thread int wh_inline;

int webhook_review_slot(void)
{
    return wh_slot;
}

int webhook_running_inline(void)
{
    return wh_inline;
}

/* Frees r's body: its bytes go back to the budget. */
static void wh_body_free(webhook_server *s, wh_req *r)
{
    cozy_buf_free(&r->body);
    r->body = (cozy_buf){ 0 };
    webhook_body_release(s, r->reserved);
    r->reserved = 0;
}

/* Parses, checks and reviews r's body, and leaves the answer in r; in
 * `slot`. Touches neither the connection nor MHD. With `inline_run` (the
 * I/O thread), returns 1 when the callback moved the review (nothing is
 * answered and the body is kept for the review thread); else 0. */
static int wh_review(webhook_server *s, wh_req *r, int slot, int inline_run)
{
    const webhook_endpoint *ep = r->ep;
    const wh_endpoint_labels *lab = &s->labels[r->ep_index];
    json_error_t jerr;
    wh_slot = slot;
    wh_inline = inline_run;
    struct timespec deadline = r->start;
    deadline.tv_sec += s->timeout_ms / 1000;
    deadline.tv_nsec += (s->timeout_ms % 1000) * 1000000L;
    if(deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    /* a review past its deadline is refused below without the callback:
       its body is read plainly, for the uid, and not by the parse hook
       (which may make an engine ready for a review that will not run) */
    int late = webhook_elapsed_ns(&deadline, &now) >= 0;
    /* duplicate keys are refused, as `cozygpu review` refuses them: one
     * decoding for both */
    const char *body = r->body.p ? r->body.p : "";
    json_t *doc = s->parse && !late ? s->parse(s->ctx, ep, body, r->body.len, &jerr)
                                    : cozy_json_loadb(body, r->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if(!inline_run)
        wh_body_free(s, r); /* parsed: a review thread never needs it again */
    if(!doc) {
        wh_answer_text(r, MHD_HTTP_BAD_REQUEST, "cozygpu webhook %s: the body is not JSON: %s (line %d, column %d)\n",
                       ep->name, jerr.text, jerr.line, jerr.column);
        goto done;
    }
    char why[256];
    const char *problem = wh_review_problem(doc, why, sizeof why);
    if(problem) {
        json_decref(doc);
        wh_answer_text(r, MHD_HTTP_BAD_REQUEST,
                       "cozygpu webhook %s: the body is not an admission.k8s.io/v1 AdmissionReview: %s\n", ep->name,
                       problem);
        goto done;
    }
    const char *uid = json_string_value(json_object_get(json_object_get(doc, "request"), "uid"));
    webhook_answer ans = {0};
    webhook_decision said = WEBHOOK_ERROR;
    const char *bad;
    if(late) {
        /* waited for a review thread past its deadline: the API server has
           given up or is about to; refuse without running it */
        bad = "its deadline passed while it waited for a review thread (every one was busy)";
    } else {
        int rc = s->review(s->ctx, ep, doc, &deadline, inline_run, &ans, &said);
        if(rc == WEBHOOK_MOVE && inline_run) {
            json_decref(ans.review);
            free(ans.text);
            json_decref(doc);
            wh_slot = -1;
            wh_inline = 0;
            return 1;
        }
        bad = rc != 0                      ? "the review callback failed"
              : ans.text && ans.review     ? "the review callback answered twice"
              : ans.text                   ? NULL
                                           : wh_response_problem(ans.review, uid);
    }
    const char *decision;
    json_t *out = ans.review;
    char *text = ans.text;
    size_t text_len = ans.len;
    int allowed = ans.text ? ans.allowed != 0 : json_is_true(json_object_get(json_object_get(out, "response"), "allowed"));
    if(bad) {
        log_write(LOG_ERROR, WH_COMPONENT, "review failed; refusing (fail closed)", "webhook", ep->name, "uid", uid,
                  "error", bad, NULL);
        json_decref(out);
        free(text);
        text = NULL;
        char msg[300];
        snprintf(msg, sizeof msg, "cozygpu webhook %s: internal error", ep->name);
        out = json_pack("{s:O?,s:s,s:{s:s,s:b,s:{s:i,s:s}}}", "apiVersion", json_object_get(doc, "apiVersion"), "kind",
                        "AdmissionReview", "response", "uid", uid, "allowed", 0, "status", "code", 500, "message", msg);
        decision = lab->error;
    } else {
        decision = said == WEBHOOK_ERROR               ? lab->error
                   : said == WEBHOOK_ALLOWED && allowed ? lab->allowed
                                                        : lab->denied;
    }
    json_decref(doc);
    if(!text) {
        text = out ? json_dumps(out, JSON_COMPACT) : NULL;
        text_len = text ? strlen(text) : 0;
    }
    json_decref(out);
    if(!text) { /* out of memory: the API server's failurePolicy Fail refuses for us */
        wh_answer_text(r, MHD_HTTP_INTERNAL_SERVER_ERROR, "cozygpu webhook %s: internal error\n", ep->name);
        goto done;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    double took = webhook_elapsed_ns(&r->start, &now) / 1e9;
    metrics_counter_add(WH_REVIEWS, decision, 1);
    metrics_histogram_observe(WH_DURATION, lab->webhook, took);
    if(webhook_elapsed_ns(&deadline, &now) > 0)
        log_write(LOG_WARN, WH_COMPONENT, "review answered after its deadline", "webhook", ep->name, NULL);
    r->ans_status = MHD_HTTP_OK;
    r->ans_ctype = "application/json";
    r->ans_text = text;
    r->ans_len = text_len;
done:
    wh_body_free(s, r);
    wh_slot = -1;
    wh_inline = 0;
    return 0;
}

/* --- review slots and threads --------------------------------------------
 * A review runs in one of n_pool review slots (the controller's Lua state
 * per slot). A complete review request is first tried on the I/O thread
 * that read it (webhook_review_inline: a free slot and nobody waiting for
 * one); otherwise, or when the callback moved it, it is queued (FIFO) and
 * its connection suspended (MHD_suspend_connection); one of n_pool review
 * threads takes it with a free slot, runs wh_review, leaves the answer in
 * the request and resumes the connection (MHD_resume_connection, which
 * wakes the I/O thread through its inter-thread channel); MHD then calls
 * webhook_access again and the answer is queued there. So a review stuck
 * until its deadline holds one review thread and one slot, and an I/O
 * thread for at most the callback's slice: other reviews run in the free
 * slots, whatever connection or I/O thread they came on (decisions 0017,
 * 0052). The gauges read q_len and busy when scraped. */

/* Takes a free slot (under q_lock); -1 when none is. */
static int wh_slot_take(webhook_server *s)
{
    if(s->n_free == 0)
        return -1;
    atomic_fetch_add(&s->busy, 1);
    return s->free_slots[--s->n_free];
}

/* Gives `slot` back; wakes a review thread when a review waits for one. */
static void wh_slot_give(webhook_server *s, int slot)
{
    pthread_mutex_lock(&s->q_lock);
    s->free_slots[s->n_free++] = slot;
    atomic_fetch_sub(&s->busy, 1);
    int waiting = s->q_head != NULL;
    pthread_mutex_unlock(&s->q_lock);
    if(waiting)
        pthread_cond_signal(&s->q_cond);
}

int webhook_review_inline(webhook_server *s, wh_req *r)
{
    pthread_mutex_lock(&s->q_lock);
    /* queued reviews go first; a stopping server queues (and refuses) */
    int slot = s->q_stop || s->q_head ? -1 : wh_slot_take(s);
    pthread_mutex_unlock(&s->q_lock);
    if(slot < 0)
        return 0;
    int moved = wh_review(s, r, slot, 1);
    wh_slot_give(s, slot);
    if(moved)
        metrics_counter_add(WH_MOVED, s->labels[r->ep_index].webhook, 1);
    return moved ? -1 : 1;
}

/* Suspends r's connection and queues r for a review thread (I/O thread).
   Returns 0, or -1 when the pool is stopping (nothing done). */
int webhook_pool_push(webhook_server *s, wh_req *r, struct MHD_Connection *con)
{
    pthread_mutex_lock(&s->q_lock);
    if(s->q_stop) {
        pthread_mutex_unlock(&s->q_lock);
        return -1;
    }
    r->con = con;
    atomic_store(&r->state, WHR_QUEUED);
    MHD_suspend_connection(con); /* before a review thread can see r and resume it */
    r->qnext = NULL;
    if(s->q_tail)
        s->q_tail->qnext = r;
    else
        s->q_head = r;
    s->q_tail = r;
    atomic_fetch_add(&s->q_len, 1);
    pthread_mutex_unlock(&s->q_lock);
    /* signalled once the lock is free: the woken thread does not wake
       only to wait for the lock (a futex round trip per review) */
    pthread_cond_signal(&s->q_cond);
    return 0;
}

void *webhook_pool_main(void *arg)
{
    webhook_server *s = arg;
    for(;;) {
        pthread_mutex_lock(&s->q_lock);
        /* a review and a slot for it; when stopping, whatever is queued is
           refused without a slot */
        while(!s->q_stop && !(s->q_head && s->n_free > 0))
            pthread_cond_wait(&s->q_cond, &s->q_lock);
        wh_req *r = s->q_head;
        if(!r) { /* stopping and nothing left */
            pthread_mutex_unlock(&s->q_lock);
            return NULL;
        }
        s->q_head = r->qnext;
        if(!s->q_head)
            s->q_tail = NULL;
        atomic_fetch_sub(&s->q_len, 1);
        int stopping = s->q_stop;
        int slot = stopping ? -1 : wh_slot_take(s);
        int more = s->q_head && s->n_free > 0; /* another thread can start one too */
        pthread_mutex_unlock(&s->q_lock);
        if(more)
            pthread_cond_signal(&s->q_cond);
        if(stopping)
            wh_answer_text(r, MHD_HTTP_SERVICE_UNAVAILABLE, "cozygpu webhook %s: shutting down\n", r->ep->name);
        else {
            wh_review(s, r, slot, 0);
            wh_slot_give(s, slot);
        }
        struct MHD_Connection *con = r->con;
        atomic_store(&r->state, WHR_ANSWERED); /* r belongs to the I/O thread again */
        MHD_resume_connection(con);
    }
}

/* Stops the review threads once the queue is empty (what is still queued
   is answered 503) and joins them; each finishes the review it runs, which
   its deadline bounds. */
void webhook_pool_stop(webhook_server *s)
{
    pthread_mutex_lock(&s->q_lock);
    s->q_stop = 1;
    pthread_cond_broadcast(&s->q_cond);
    pthread_mutex_unlock(&s->q_lock);
    for(unsigned i = 0; i < s->n_pool; i++)
        pthread_join(s->pool[i], NULL);
    s->n_pool = 0;
}
