/* kobject.c — reading Kubernetes objects (kobject.h). */
#include "format/kobject.h"

#include <string.h>

const char *kobject_meta_str(const json_t *obj, const char *field)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), field));
}

const char *kobject_annotation(const json_t *obj, const char *key)
{
    return json_string_value(json_object_get(json_object_get(json_object_get(obj, "metadata"), "annotations"), key));
}

json_t *kobject_with_kind(json_t *obj, const char *api_version, const char *kind)
{
    if(json_object_get(obj, "kind"))
        return json_incref(obj);
    json_t *c = json_copy(obj);
    if(!c)
        return NULL;
    json_object_set_new(c, "apiVersion", json_string(api_version));
    json_object_set_new(c, "kind", json_string(kind));
    return c;
}

int kobject_has_finalizer(const json_t *obj, const char *fin)
{
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(json_object_get(obj, "metadata"), "finalizers"), i, f)
    {
        if(json_is_string(f) && strcmp(json_string_value(f), fin) == 0)
            return 1;
    }
    return 0;
}

static int str_eq(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* The condition `type` in conditions and its position. */
static json_t *condition_find(const json_t *conditions, const char *type, size_t *at)
{
    size_t i;
    json_t *x;
    json_array_foreach(conditions, i, x)
    {
        if(str_eq(json_string_value(json_object_get(x, "type")), type)) {
            if(at)
                *at = i;
            return x;
        }
    }
    return NULL;
}

const json_t *kobject_condition_get(const json_t *conditions, const char *type)
{
    return condition_find(conditions, type, NULL);
}

int kobject_condition_shown(const json_t *conditions, const kobject_condition *c)
{
    const json_t *x = condition_find(conditions, c->type, NULL);
    return x && str_eq(json_string_value(json_object_get(x, "status")), c->status) &&
           str_eq(json_string_value(json_object_get(x, "reason")), c->reason) &&
           str_eq(json_string_value(json_object_get(x, "message")), c->message) &&
           json_is_integer(json_object_get(x, "observedGeneration")) &&
           json_integer_value(json_object_get(x, "observedGeneration")) == c->generation;
}

const char *kobject_condition_since(const json_t *conditions, const kobject_condition *c, const char *now)
{
    const json_t *x = condition_find(conditions, c->type, NULL);
    const char *lt = json_string_value(json_object_get(x, "lastTransitionTime"));
    return lt && str_eq(json_string_value(json_object_get(x, "status")), c->status) ? lt : now;
}

int kobject_condition_set(json_t *obj, const kobject_condition *c, const char *now)
{
    json_t *status = json_object_get(obj, "status");
    json_t *conds = json_object_get(status, "conditions");
    if(kobject_condition_shown(conds, c))
        return 1;
    if(!json_is_object(status)) {
        status = json_object();
        if(!status || json_object_set_new(obj, "status", status))
            return -1;
    }
    if(!json_is_array(conds)) {
        conds = json_array();
        if(!conds || json_object_set_new(status, "conditions", conds))
            return -1;
    }
    json_t *mine = json_pack("{s:s, s:s, s:s, s:s, s:I, s:s}", "type", c->type, "status", c->status, "reason",
                             c->reason, "message", c->message, "observedGeneration", c->generation,
                             "lastTransitionTime", kobject_condition_since(conds, c, now));
    if(!mine)
        return -1;
    size_t at;
    if(condition_find(conds, c->type, &at))
        return json_array_set_new(conds, at, mine) ? -1 : 0;
    return json_array_append_new(conds, mine) ? -1 : 0;
}

int kobject_condition_remove(json_t *obj, const char *type)
{
    json_t *conds = json_object_get(json_object_get(obj, "status"), "conditions");
    size_t at;
    if(!condition_find(conds, type, &at))
        return 1;
    json_array_remove(conds, at);
    return 0;
}
