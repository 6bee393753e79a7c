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

#endif
