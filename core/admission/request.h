/* request.h — what an AdmissionRequest must look like before any rule
 * sees it, checked the same way for the webhook and for `cozygpu review`.
 *
 * admission.k8s.io/v1 AdmissionRequest (k8s.io/api/admission/v1 types.go):
 * uid, kind {group, version, kind}, resource, operation (CREATE, UPDATE,
 * DELETE, CONNECT), object (CREATE, UPDATE), oldObject (UPDATE), userInfo.
 * The API server always sends these with these types; anything else is a
 * forged or broken request, refused rather than judged (found in hardening: the
 * webhook used to allow an over-maxCount VMI whose operation was missing,
 * a number, lower-case or CONNECT).
 */
#ifndef COZYGPU_REQUEST_H
#define COZYGPU_REQUEST_H

#include <jansson.h>

#include "base/result.h"

/* Checks `req` (borrowed). COZY_OK, or COZY_ERR_INPUT with err naming
 * `where` and the field: "<where>: request.operation must be one of CREATE,
 * UPDATE, DELETE, CONNECT (got "create")". */
cozy_result admission_check_request(const json_t *req, const char *where, cozy_err *err);

/* 1 when `op` is one of the `n` operations in `ops` (exact, as the API
 * server writes them). */
int admission_operation_in(const char *op, const char *const *ops, size_t n);

#endif
