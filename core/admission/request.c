/* request.c — the shape of an AdmissionRequest (request.h). */
#include "admission/request.h"

#include <stdio.h>
#include <string.h>

static const char *const OPERATIONS[] = {"CREATE", "UPDATE", "DELETE", "CONNECT"};

int admission_operation_in(const char *op, const char *const *ops, size_t n)
{
    for(size_t i = 0; op && i < n; i++)
        if(strcmp(op, ops[i]) == 0)
            return 1;
    return 0;
}

/* "a string", "an object", ... for messages */
static const char *type_name(const json_t *v)
{
    switch(json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* a present field of the wrong type */
static int wrong(const json_t *v, int (*ok)(const json_t *))
{
    return v && !ok(v);
}

static int is_string(const json_t *v) { return json_is_string(v); }
static int is_object(const json_t *v) { return json_is_object(v); }
static int is_boolean(const json_t *v) { return json_is_boolean(v); }
static int is_object_or_null(const json_t *v) { return json_is_object(v) || json_is_null(v); }

cozy_result admission_check_request(const json_t *req, const char *where, cozy_err *err)
{
    const json_t *v;
    const char *uid = json_string_value(json_object_get(req, "uid"));
    if(!uid || !*uid)
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.uid is missing or empty (AdmissionReview v1 requires it)",
                         where);
    const json_t *kind = json_object_get(req, "kind");
    if(!json_is_object(kind))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.kind must be an object {group, version, kind}", where);
    if(!json_is_string(json_object_get(kind, "kind")))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.kind.kind is missing", where);
    static const char *const gvk[] = {"group", "version"};
    for(size_t i = 0; i < 2; i++)
        if(wrong(json_object_get(kind, gvk[i]), is_string))
            return cozy_fail(err, COZY_ERR_INPUT, "%s: request.kind.%s must be a string", where, gvk[i]);
    if(wrong(json_object_get(req, "resource"), is_object))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.resource must be an object", where);
    const json_t *opv = json_object_get(req, "operation");
    if(!opv || (json_is_string(opv) && !*json_string_value(opv)))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.operation is missing", where);
    const char *op = json_string_value(opv);
    if(!op || !admission_operation_in(op, OPERATIONS, 4)) {
        char got[80];
        if(op)
            snprintf(got, sizeof got, "\"%.60s\"", op);
        else
            snprintf(got, sizeof got, "%s", type_name(opv));
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.operation must be one of CREATE, UPDATE, DELETE, CONNECT (got %s)",
                         where, got);
    }
    int writes = strcmp(op, "CREATE") == 0 || strcmp(op, "UPDATE") == 0;
    v = json_object_get(req, "object");
    if(writes ? !json_is_object(v) : wrong(v, is_object_or_null))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.object must be an object%s%s (got %s)", where,
                         writes ? " for " : " or null", writes ? op : "", v ? type_name(v) : "none");
    v = json_object_get(req, "oldObject");
    if(strcmp(op, "UPDATE") == 0 ? !json_is_object(v) : wrong(v, is_object_or_null))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.oldObject must be an object%s (got %s)", where,
                         strcmp(op, "UPDATE") == 0 ? " for an UPDATE" : " or null", v ? type_name(v) : "none");
    static const char *const strings[] = {"name", "namespace", "subResource"};
    for(size_t i = 0; i < 3; i++)
        if(wrong(json_object_get(req, strings[i]), is_string))
            return cozy_fail(err, COZY_ERR_INPUT, "%s: request.%s must be a string", where, strings[i]);
    if(wrong(json_object_get(req, "dryRun"), is_boolean))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.dryRun must be a boolean", where);
    const json_t *ui = json_object_get(req, "userInfo");
    if(wrong(ui, is_object))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.userInfo must be an object", where);
    if(wrong(json_object_get(ui, "username"), is_string))
        return cozy_fail(err, COZY_ERR_INPUT, "%s: request.userInfo.username must be a string", where);
    const json_t *groups = json_object_get(ui, "groups");
    if(groups) {
        size_t i;
        const json_t *g;
        int ok = json_is_array(groups);
        json_array_foreach(groups, i, g) ok = ok && json_is_string(g);
        if(!ok)
            return cozy_fail(err, COZY_ERR_INPUT, "%s: request.userInfo.groups must be a list of strings", where);
    }
    return COZY_OK;
}
