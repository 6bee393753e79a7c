/* manifest.h — reading Kubernetes manifests (JSON or YAML) from files and
 * directories, the way kubectl does (`kubectl apply -f PATH`).
 *
 * A file is JSON when its first non-blank byte is `{`; otherwise it is read
 * as a YAML stream (core/format/yamlload.h), which may hold several documents.
 * Objects of `kind: List` (or `*List`, with `items`) are expanded into their
 * items. Directories are read in sorted name order, recursively, taking
 * files ending in .json, .yaml and .yml.
 */
#ifndef COZYGPU_MANIFEST_H
#define COZYGPU_MANIFEST_H

#include <jansson.h>

#include "base/result.h"

/* Ceiling on one manifest file, in bytes: larger files are refused rather
 * than read into memory. */
#define MANIFEST_MAX_FILE_BYTES (64u * 1024u * 1024u)

/* Loads one file. On success appends to `out` (a JSON array the caller owns)
 * one record per document: {"file": PATH, "index": N (0-based document
 * number in the file), "object": OBJECT}. Documents that are not JSON
 * objects are an error. On failure appends nothing and returns
 * COZY_ERR_IO or COZY_ERR_PARSE with err->msg "PATH:LINE:COLUMN: problem"
 * (line/column 1-based, omitted when unknown). */
cozy_result manifest_load_file(const char *path, json_t *out, cozy_err *err);

/* Like manifest_load_file for a file; for a directory, loads every
 * .json/.yaml/.yml file below it in sorted order. Stops at the first file
 * that fails, leaving `out` as it was before the call. */
cozy_result manifest_load_path(const char *path, json_t *out, cozy_err *err);

/* Parses an in-memory buffer as manifest_load_file does (`name` is used in
 * records and messages only). */
cozy_result manifest_load_buffer(const char *buf, size_t len, const char *name, json_t *out, cozy_err *err);

/* Lists the manifest files under `path` (itself, if a file) in the order
 * manifest_load_path reads them. Returns a new JSON array of strings. */
cozy_result manifest_list_files(const char *path, json_t **files, cozy_err *err);

#endif
