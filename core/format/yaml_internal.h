/* yaml_internal.h — shared between yamlload.c (the libyaml event loader),
 * yamlescape.c (double-quoted escapes) and yamlscalar.c (scalar
 * resolution) only; not a public interface.
 *
 * The rules and their sources are in yamlload.h and
 * docs/decisions/0002-yaml-scalars.md.
 */
#ifndef COZYGPU_YAML_INTERNAL_H
#define COZYGPU_YAML_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <yaml.h>

#define TAG_PREFIX "tag:yaml.org,2002:"
#define TAG_PREFIX_LEN (sizeof(TAG_PREFIX) - 1)
#define SNIPPET_MAX 64 /* how much of a scalar an error message quotes */

/* One yamlload_parse call's state (yamlload.c). */
typedef struct loader loader;

typedef enum { SC_NULL, SC_BOOL, SC_INT, SC_FLOAT, SC_STR } sc_kind;

/* A resolved scalar, before it becomes a json value or a key string: the
   Go type go-yaml v2 would have produced matters for keys (a float key is
   printed as float32, an int key in decimal). */
typedef struct scalar {
    sc_kind kind;
    int b;
    long long i;
    double f;
    int from_uint64; /* SC_FLOAT: go-yaml v2 had a uint64 (kubectl: float64) */
    char *s; /* SC_STR: owned, NUL-terminated, may contain NUL */
    size_t slen;
} scalar;

/* --- yamlload.c ---------------------------------------------------------- */

/* Records the loader's first error: `line` and `column` 1-based (0 when
 * unknown), the message formatted from fmt (truncated to
 * yamlload_error.message). Later calls do nothing, so the first cause is
 * the one reported; the loader stops at its next event. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
void yl_fail(loader *l, unsigned long line, unsigned long column, const char *fmt, ...);

/* yl_fail(l, 0, 0, "out of memory"). */
void yl_fail_oom(loader *l);

/* libyaml's 0-based mark as the 1-based line and column errors carry. */
void yl_mark_of(const yaml_mark_t *m, unsigned long *line, unsigned long *column);

/* --- yamlescape.c -------------------------------------------------------- */

/* The input as libyaml reads it, and a cursor that follows libyaml's
 * character index through it (events come in order). */
typedef struct yl_input {
    const unsigned char *b;
    size_t len;
    int enc;          /* YAML_UTF8_ENCODING, _UTF16LE_ or _UTF16BE_ */
    size_t start;     /* after a byte order mark */
    size_t cur_index; /* libyaml's character index at ... */
    size_t cur_pos;   /* ... this byte offset in b */
} yl_input;

/* Sets up *in over buf (len bytes, borrowed): the encoding and where the
 * text starts, as libyaml's reader decides (reader.c
 * yaml_parser_determine_encoding: a UTF-16 byte order mark, else UTF-8
 * with an optional mark; marks count characters after it). */
void yl_input_start(yl_input *in, const char *buf, size_t len);

/* The character at byte offset *pos of the input (libyaml has checked the
 * encoding); advances *pos past it. Returns -1 at the end. */
long yl_next_char(const yl_input *in, size_t *pos);

/* Re-reads double-quoted scalar event ev's raw text in `in`: the first
 * escape go-yaml v2 does not know is refused as go-yaml refuses it
 * ("found unknown escape character", yl_fail on loader l); each "\'" that
 * libyaml was made to read as '"' becomes "'" in *fixed, a malloc'd copy
 * of the value (same length; NULL when nothing changed). Returns 0, or -1
 * after yl_fail. */
int yl_check_escapes(loader *l, yl_input *in, const yaml_event_t *ev, unsigned char **fixed);

/* --- yamlscalar.c -------------------------------------------------------- */

/* Frees sc->s (SC_STR) and sets it to NULL; the rest of *sc is left. */
void yl_scalar_free(scalar *sc);

/* A deep copy of *src in *dst (its own string). Returns 0, or -1 when out
 * of memory (*dst then holds no string). */
int yl_scalar_copy(scalar *dst, const scalar *src);

/* Resolves one libyaml scalar event as go-yaml v2's decoder.scalar() does
 * (resolve.go resolve(), decode.go): a plain scalar by the implicit table
 * (null, bool, int, float, else string), a quoted or block one as a string,
 * an explicit !!str !!bool !!int !!float !!null !!timestamp checked against
 * its text, !!binary decoded as Go's base64.StdEncoding and made valid
 * UTF-8 (invalid bytes become U+FFFD, NUL kept) as json.Marshal writes it;
 * any other tag gives a string. Fills *out (the caller frees it with
 * yl_scalar_free). Returns 0, or -1 after yl_fail (with the event's line
 * and column: a tag that does not fit, bad base64; or out of memory). */
int yl_resolve_event(loader *l, const yaml_event_t *ev, scalar *out);

/* A resolved scalar as the value kubectl's unstructured object holds
 * (sigs.k8s.io/yaml, then sigs.k8s.io/json with int64 preserved): a new
 * json_t reference, or NULL after yl_fail (.inf, -.inf and .nan, which JSON
 * cannot carry, at mark m; out of memory). */
json_t *yl_scalar_to_json(loader *l, const scalar *sc, const yaml_mark_t *m);

/* A resolved scalar as a mapping key, as sigs.k8s.io/yaml
 * convertToJSONableObject makes it: booleans "true"/"false", integers in
 * decimal, floats as Go's FormatFloat(f, 'g', -1, 32), strings as they are.
 * `text` (textlen bytes) is the key as written, for messages. Returns 0
 * with a malloc'd NUL-terminated key in *key (caller frees) and its length
 * in *keylen, or -1 after yl_fail (a null or uint64 key at mark m; out of
 * memory). */
int yl_scalar_to_key(loader *l, const scalar *sc, const char *text, size_t textlen, const yaml_mark_t *m,
                     char **key, size_t *keylen);

#endif
