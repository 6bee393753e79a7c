/* jsonload.h — JSON text to a jansson value, faster than json_loadb and
 * with json_loadb's answer for every input.
 *
 * jansson's own parser costs about 190 instructions per byte of an
 * AdmissionReview (bench/engine-instructions.sh): the largest single cost
 * of a review (decision 0046). This parses
 * with yajl (Debian's libyajl2, a callback parser) and builds the same
 * jansson tree: objects with their keys in document order, integers as
 * json_int_t, other numbers as reals, strings as UTF-8. Whenever yajl's
 * reading could differ from jansson's, or the text is refused, the text
 * is parsed again by json_loadb itself, so the result, and on a refusal
 * the error (text, line, column, position), are jansson's:
 *   - any yajl error (syntax, an integer or real out of range, trailing
 *     text, bad UTF-8), a duplicate key (with JSON_REJECT_DUPLICATES),
 *     nesting deeper than jansson's limit (JSON_PARSER_MAX_DEPTH, 2048),
 *     a top-level scalar without JSON_DECODE_ANY;
 *   - a "\u" escape of U+0000 or of a UTF-16 surrogate anywhere in the
 *     text (jansson refuses NUL and lone surrogates; yajl would write
 *     them, or '?', into the string);
 *   - text that ends inside a string (yajl accepts `{}"x`: a string cut by
 *     the end, after a complete value);
 *   - a vertical tab or form feed byte anywhere (yajl takes both as
 *     whitespace between tokens; JSON and jansson do not);
 *   - any flag but JSON_REJECT_DUPLICATES and JSON_DECODE_ANY.
 */
#ifndef COZYGPU_BASE_JSONLOAD_H
#define COZYGPU_BASE_JSONLOAD_H

#include <jansson.h>
#include <stddef.h>

/* As json_loadb(buf, len, flags, error): a new reference, or NULL with
 * *error filled (error may be NULL); after a success *error is as
 * json_loadb leaves it (no text, "<buffer>", line and column -1, the
 * position at the end). Numbers are read with strtod in the C locale, as
 * the process runs (nothing calls setlocale): under a locale with a
 * decimal comma yajl would cut "1.5" to 1. `flags`: JSON_REJECT_DUPLICATES and
 * JSON_DECODE_ANY as jansson reads them; any other flag sends the text to
 * json_loadb. */
json_t *cozy_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *error);

/* --- for another yajl reader that must read as cozy_json_loadb does
 * (engine/luadecode.c) ----------------------------------------------- */

/* Deeper than this a text goes to json_loadb, whose limit
 * (JSON_PARSER_MAX_DEPTH, 2048 in jansson 2.14) then decides. */
#define JSONLOAD_MAX_DEPTH 1024

/* 1 when yajl may read `buf` (len bytes) with `flags`: none of the cases
 * listed above that send a text to json_loadb holds before parsing (flags,
 * a risky "\u" escape, a text ending inside a string, vertical tab or form
 * feed, invalid UTF-8). What only the parse finds (a yajl error, a
 * duplicate key, the depth) is the reader's to check. */
int cozy_json_yajl_reads_as_jansson(const char *buf, size_t len, size_t flags);

/* Fills *error (may be NULL) as json_loadb leaves it after a success on
 * `len` bytes. */
void cozy_json_loaded(json_error_t *error, size_t len);

/* The jansson tree yajl's callbacks build (model: yajl_tree.c): a stack of
 * open containers, each object's key waiting for its value. Zero it to
 * start; `dups` 1 refuses duplicate keys. */
typedef struct cozy_json_frame {
    json_t *c;    /* the open object or array (borrowed: its parent, or root, holds it) */
    char *key;    /* an object's key waiting for its value (owned), NULL: none */
    size_t keylen;
} cozy_json_frame;

typedef struct cozy_json_builder {
    json_t *root; /* owned */
    cozy_json_frame *st;
    size_t depth, cap;
    int dups;
} cozy_json_builder;

/* Puts v (stolen, NULL: out of memory) where the parse is: root, the open
 * array's end, or under the waiting key. Returns 1, or 0 to stop the parse
 * (a duplicate key, a second root, out of memory). */
int cozy_json_builder_put(cozy_json_builder *b, json_t *v);

/* Puts container c (stolen) as a value and opens it. 0 as put, and also
 * past JSONLOAD_MAX_DEPTH. */
int cozy_json_builder_open(cozy_json_builder *b, json_t *c);

/* Closes the innermost open container. 0 when none is open. */
int cozy_json_builder_close(cozy_json_builder *b);

/* The open object's next key (copied). 0: out of memory. */
int cozy_json_builder_key(cozy_json_builder *b, const char *s, size_t len);

/* Frees what b holds (the root too) and zeroes it for reuse. */
void cozy_json_builder_free(cozy_json_builder *b);

#endif
