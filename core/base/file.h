/* file.h — reading whole files and directories, with a ceiling.
 *
 * Every read names its ceiling after its purpose at the call site (policy
 * source, PEM bundle, token, manifest); nothing reads without one.
 */
#ifndef COZYGPU_FILE_H
#define COZYGPU_FILE_H

#include <stddef.h>
#include <stdio.h>

/* Reads all of `path` (at most `max` bytes). Returns 0 with a malloc'd,
 * NUL-terminated buffer in *out (caller frees; *len excludes the NUL), or
 * an errno value: the open's or read's (ENOENT, EACCES, EISDIR, ...),
 * EFBIG when the file holds more than `max` bytes, ENOMEM. *out is
 * untouched on error. The caller words the message (it knows which field
 * or flag named the file). `max` 0 accepts only an empty file (unlike
 * cozy_buf, where 0 means no ceiling). */
int cozy_read_file(const char *path, size_t max, char **out, size_t *len);

/* The same for an open stream (stdin, a pipe), read to its end. */
int cozy_read_stream(FILE *f, size_t max, char **out, size_t *len);

/* Lists the entries of directory `path` but "." and "..", keeping those for
 * which keep(name, ctx) returns nonzero (keep NULL: all), sorted by byte
 * order (strcmp), so that every run sees the same order whatever the file
 * system's. Returns 0 with a malloc'd array of malloc'd names in *names
 * and its length in *n (free with cozy_free_names), or an errno value
 * (opendir's or readdir's, ENOMEM); *names is untouched on error. */
int cozy_list_dir(const char *path, int (*keep)(const char *name, void *ctx), void *ctx, char ***names, size_t *n);

/* Frees a list from cozy_list_dir. NULL is allowed. */
void cozy_free_names(char **names, size_t n);

#endif
