/* response.h — the AdmissionReview answer envelope, built in one place.
 *
 * admission.k8s.io/v1 (Kubernetes "Dynamic Admission Control": the
 * webhook's response is an AdmissionReview of the request's apiVersion
 * carrying `response` {uid, allowed, status, patchType, patch, warnings}).
 * The webhook transport (server/) keeps its own last-resort refusal for
 * when the review callback itself fails: it sits below this layer.
 */
#ifndef COZYGPU_RESPONSE_H
#define COZYGPU_RESPONSE_H

#include <jansson.h>

/* The AdmissionReview that carries `response` (stolen: the envelope owns
 * it, also on failure) for a request of `api_version` ("admission.k8s.io/v1"
 * when NULL). Returns a new object (caller owns), or NULL when out of
 * memory. */
json_t *admission_envelope(const char *api_version, json_t *response);

/* A refusal the runtime answers itself (not a policy's verdict), as an
 * AdmissionResponse: uid of `request` echoed, allowed false, status
 * {code, reason, message}; reason is "BadRequest" for 400 and
 * "InternalError" otherwise (metav1.StatusReason). Returns a new object
 * (caller owns), or NULL when out of memory. */
json_t *admission_refusal(const json_t *request, int code, const char *message);

#endif
