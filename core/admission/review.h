/* review.h — turning input documents into AdmissionRequests and answers
 * into AdmissionReviews (`cozygpu review`, `cozygpu policy test`).
 *
 * Inputs (DESIGN.md §2): an AdmissionReview (admission.k8s.io/v1 or
 * v1beta1) with `request.uid`; a bare AdmissionRequest (an object with
 * `uid`, `operation` and a `kind` object, as Gatekeeper records them); or a
 * plain Kubernetes object, wrapped as a CREATE by the user of
 * review_options. A VirtualMachine is judged by its spec.template as the
 * VirtualMachineInstance KubeVirt would create from it; the answer says so
 * in response.auditAnnotations["gpu.cozystack.io/judged-as"].
 */
#ifndef COZYGPU_REVIEW_H
#define COZYGPU_REVIEW_H

#include <jansson.h>

#include "engine/engine.h"
#include "base/result.h"

typedef struct review_options {
    const char *username;  /* userInfo.username for plain objects */
    const json_t *groups;  /* userInfo.groups (array of strings) or NULL */
    engine_phase phases;   /* which webhooks to run */
    json_t *notes;         /* if set, an array that receives notes about the
                              input (e.g. an assumed apiVersion) */
} review_options;

/* True when `doc` is an AdmissionReview that carries only a response (a
 * recorded answer): there is nothing to review, and callers skip it. */
int review_is_response_only(const json_t *doc);

/* Reviews one input document (`doc`, borrowed). `where` names it in
 * messages ("file.yaml, document 2"); `seq` numbers generated uids.
 * On success *out is a new AdmissionReview with `response` (caller owns)
 * and *outcome (when not NULL) says what the engine decided (an engine
 * failure is ENGINE_POLICY_ERROR). Returns COZY_ERR_INPUT when the document is not a valid input (e.g. an
 * AdmissionReview without request.uid), with err naming `where` and the
 * field. An engine failure is answered as a refusal (fail closed), not an
 * error. */
cozy_result review_document(engine *e, const json_t *doc, const char *where, unsigned long seq,
                            const review_options *opt, json_t **out, engine_outcome *outcome, cozy_err *err);

/* Builds the AdmissionRequest for `doc` (see above) without reviewing it.
 * *judged_vmi is set to 1 when a VirtualMachine was turned into its VMI. */
cozy_result review_build_request(const json_t *doc, const char *where, unsigned long seq, const review_options *opt,
                                 json_t **request, const char **api_version, int *judged_vmi, cozy_err *err);

/* Decodes a base64 JSONPatch from a response into a JSON array (new
 * reference), or NULL when absent or malformed. */
json_t *review_decode_patch(const json_t *response);

#endif
