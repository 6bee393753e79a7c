/* config.h — the settings file (DESIGN.md §10), read the same way by every
 * command (`controller`, `review`, `policy test`, `simulate`).
 *
 * Keys (all optional; unknown keys are an error):
 *   rawResourceNames: Allowed | Warn | Forbidden       (default Allowed, §4)
 *   gpuResourceNames: [string]                          (default [])
 *   gpuDeviceClasses: [string]  (default [gpu.nvidia.com, vfio.gpu.nvidia.com, mig.nvidia.com])
 *   virtControllerUser: string  (default "": derived from the KubeVirt CR namespace)
 *   tenantRoot: string          (default tenant-root)
 *   policyBudget: {instructions: int > 0, memoryBytes: int > 0}
 *                               (default 10000000 instructions, 67108864 bytes)
 * The file is either the settings mapping itself or the `cozygpu-config`
 * ConfigMap that carries it under data["config.yaml"].
 */
#ifndef COZYGPU_CONFIG_H
#define COZYGPU_CONFIG_H

#include <jansson.h>

#include "base/result.h"

/* Returns a new object holding every key with its default value. Caller owns. */
json_t *config_defaults(void);

/* Validates `settings` (borrowed) and returns in *out a new object with
 * defaults filled in (caller owns). `source` names the file in messages:
 * "FILE: rawResourceNames: must be one of Allowed, Warn, Forbidden (got "x")".
 * Returns COZY_ERR_CONFIG on any unknown key or bad value; *out untouched. */
cozy_result config_from_json(const json_t *settings, const char *source, json_t **out, cozy_err *err);

/* Reads a settings file (YAML or JSON; a single document) and validates it
 * as config_from_json does. I/O and syntax errors name the file and position. */
cozy_result config_load_file(const char *path, json_t **out, cozy_err *err);

#endif
