/* config.c — settings file (config.h). */
#include "format/config.h"

#include <string.h>

#include "format/manifest.h"
#include "format/yamlload.h"

json_t *config_defaults(void)
{
    return json_pack("{s:s, s:[], s:[s,s,s], s:s, s:s, s:{s:I, s:I}}", "rawResourceNames", "Allowed",
                     "gpuResourceNames", "gpuDeviceClasses", "gpu.nvidia.com", "vfio.gpu.nvidia.com",
                     "mig.nvidia.com", "virtControllerUser", "", "tenantRoot", "tenant-root", "policyBudget",
                     "instructions", (json_int_t)10000000, "memoryBytes", (json_int_t)67108864);
}

static cozy_result check_string_list(const json_t *v, const char *source, const char *key, cozy_err *err)
{
    if(!json_is_array(v))
        return cozy_fail(err, COZY_ERR_CONFIG, "%s: %s: must be a list of strings", source, key);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if(!json_is_string(s) || json_string_length(s) == 0)
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: %s[%zu]: must be a non-empty string", source, key, i);
    }
    return COZY_OK;
}

static cozy_result check_budget(const json_t *v, const char *source, json_t *into, cozy_err *err)
{
    if(!json_is_object(v))
        return cozy_fail(err, COZY_ERR_CONFIG, "%s: policyBudget: must be a mapping", source);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        if(strcmp(key, "instructions") != 0 && strcmp(key, "memoryBytes") != 0)
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: policyBudget.%s: unknown key (known: instructions, memoryBytes)",
                             source, key);
        if(!json_is_integer(val) || json_integer_value(val) <= 0)
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: policyBudget.%s: must be a positive integer", source, key);
        if(strcmp(key, "memoryBytes") == 0 && json_integer_value(val) < 1024 * 1024)
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: policyBudget.memoryBytes: must be at least 1048576", source);
        json_object_set(into, key, val);
    }
    return COZY_OK;
}

cozy_result config_from_json(const json_t *settings, const char *source, json_t **out, cozy_err *err)
{
    if(!json_is_object(settings))
        return cozy_fail(err, COZY_ERR_CONFIG, "%s: settings must be a mapping", source);
    json_t *cfg = config_defaults();
    cozy_result rc = COZY_OK;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)settings, key, v) {
        if(strcmp(key, "rawResourceNames") == 0) {
            const char *s = json_string_value(v);
            if(!s || (strcmp(s, "Allowed") && strcmp(s, "Warn") && strcmp(s, "Forbidden"))) {
                rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: rawResourceNames: must be one of Allowed, Warn, Forbidden",
                               source);
                break;
            }
        } else if(strcmp(key, "gpuResourceNames") == 0 || strcmp(key, "gpuDeviceClasses") == 0) {
            if((rc = check_string_list(v, source, key, err)) != COZY_OK)
                break;
        } else if(strcmp(key, "virtControllerUser") == 0 || strcmp(key, "tenantRoot") == 0) {
            if(!json_is_string(v)) {
                rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: %s: must be a string", source, key);
                break;
            }
            if(strcmp(key, "tenantRoot") == 0 && json_string_length(v) == 0) {
                rc = cozy_fail(err, COZY_ERR_CONFIG, "%s: tenantRoot: must not be empty", source);
                break;
            }
        } else if(strcmp(key, "policyBudget") == 0) {
            if((rc = check_budget(v, source, json_object_get(cfg, "policyBudget"), err)) != COZY_OK)
                break;
            continue;
        } else {
            rc = cozy_fail(err, COZY_ERR_CONFIG,
                           "%s: unknown key \"%s\" (known: rawResourceNames, gpuResourceNames, gpuDeviceClasses, "
                           "virtControllerUser, tenantRoot, policyBudget)",
                           source, key);
            break;
        }
        json_object_set(cfg, key, v);
    }
    if(rc != COZY_OK) {
        json_decref(cfg);
        return rc;
    }
    *out = cfg;
    return COZY_OK;
}

cozy_result config_load_file(const char *path, json_t **out, cozy_err *err)
{
    json_t *docs = json_array();
    cozy_result rc = manifest_load_file(path, docs, err);
    if(rc != COZY_OK) {
        json_decref(docs);
        return rc == COZY_ERR_INPUT ? COZY_ERR_CONFIG : rc;
    }
    if(json_array_size(docs) != 1) {
        json_decref(docs);
        return cozy_fail(err, COZY_ERR_CONFIG, "%s: expected one settings document, found %zu", path,
                         json_array_size(docs));
    }
    json_t *obj = json_object_get(json_array_get(docs, 0), "object");
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    json_t *parsed = NULL;
    if(kind && strcmp(kind, "ConfigMap") == 0) {
        /* the deployed form: data["config.yaml"] holds the settings */
        const char *text = json_string_value(json_object_get(json_object_get(obj, "data"), "config.yaml"));
        if(!text) {
            json_decref(docs);
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: ConfigMap has no data[\"config.yaml\"]", path);
        }
        yamlload_error yerr;
        memset(&yerr, 0, sizeof yerr);
        json_t *inner = yamlload_parse(text, strlen(text), path, &yerr);
        if(!inner) {
            json_decref(docs);
            return cozy_fail(err, COZY_ERR_CONFIG, "%s: data[\"config.yaml\"]:%lu:%lu: %s", path, yerr.line,
                             yerr.column, yerr.message);
        }
        parsed = json_incref(json_array_size(inner) ? json_array_get(inner, 0) : NULL);
        json_decref(inner);
        if(!parsed)
            parsed = json_object();
    } else {
        parsed = json_incref(obj);
    }
    json_decref(docs);
    rc = config_from_json(parsed, path, out, err);
    json_decref(parsed);
    return rc;
}
