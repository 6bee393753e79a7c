/* response.c — the AdmissionReview answer envelope (response.h). */
#include "admission/response.h"

json_t *admission_envelope(const char *api_version, json_t *response)
{
    return json_pack("{s:s, s:s, s:o}", "apiVersion", api_version ? api_version : "admission.k8s.io/v1", "kind",
                     "AdmissionReview", "response", response);
}

json_t *admission_refusal(const json_t *request, int code, const char *message)
{
    return json_pack("{s:O?, s:b, s:{s:i, s:s, s:s}}", "uid", json_object_get(request, "uid"), "allowed", 0,
                     "status", "code", code, "reason", code == 400 ? "BadRequest" : "InternalError", "message",
                     message);
}
