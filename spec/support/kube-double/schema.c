/* schema.c — structural-schema defaulting and pruning for custom resources,
 * as k8s.io/apiextensions-apiserver does on every write
 * (pkg/apiserver/schema/defaulting/algorithm.go and pkg/apiserver/schema/
 * pruning/algorithm.go): properties with a `default` are set when absent
 * (recursively, into present objects and array items), fields not declared
 * are dropped unless x-kubernetes-preserve-unknown-fields is true, and
 * additionalProperties schemas apply to every key. Only what the product's
 * CRDs use is handled (no allOf/anyOf defaults, no embedded resources).
 */
#include "double.h"

#include <stdio.h>
#include <string.h>

static void walk(const json_t *schema, json_t *v, json_t *unknown, const char *path, int top)
{
    if (!schema) return;
    if (json_is_object(v)) {
        const json_t *props = json_object_get(schema, "properties");
        const json_t *addl = json_object_get(schema, "additionalProperties");
        int preserve = json_is_true(json_object_get(schema, "x-kubernetes-preserve-unknown-fields"));
        /* defaults first, so defaulted objects are walked too */
        const char *k;
        json_t *ps;
        json_object_foreach((json_t *)props, k, ps) {
            const json_t *def = json_object_get(ps, "default");
            if (def && !json_object_get(v, k)) json_object_set_new(v, k, json_deep_copy(def));
        }
        void *tmp;
        json_t *child;
        json_object_foreach_safe(v, tmp, k, child) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.%s", path, k);
            if (top && (!strcmp(k, "apiVersion") || !strcmp(k, "kind") || !strcmp(k, "metadata"))) continue;
            const json_t *cs = json_object_get(props, k);
            if (!cs && json_is_object(addl)) cs = addl;
            if (cs) {
                walk(cs, child, unknown, sub, 0);
            } else if (!preserve && !json_is_true(addl)) {
                if (unknown) json_array_append_new(unknown, json_string(sub + 1));
                json_object_del(v, k);
            }
        }
    } else if (json_is_array(v)) {
        const json_t *items = json_object_get(schema, "items");
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            walk(items, e, unknown, sub, 0);
        }
    }
}

void dbl_schema_apply(const json_t *schema, json_t *obj, json_t *unknown)
{
    walk(schema, obj, unknown, "", 1);
}
