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
