/* yamlload — YAML manifests to jansson values, read the way kubectl reads them.
 *
 * kubectl splits a stream on "---" lines (k8s.io/apimachinery
 * pkg/util/yaml/decoder.go), turns each document into JSON with
 * sigs.k8s.io/yaml (yaml.go: go-yaml v2 decode, then convertToJSONableObject,
 * then json.Marshal) and decodes that JSON into an unstructured object in
 * which a number is an int64 when its JSON text parses as one and a float64
 * otherwise (sigs.k8s.io/json, UnmarshalCaseSensitivePreserveInts).  This
 * module reproduces the result of that chain with libyaml and jansson.
 * docs/decisions/0002-yaml-scalars.md lists every rule, its source, and the
 * few places where we refuse input that kubectl would accept.
 *
 * Thread safety: no global state; calls on different threads are independent.
 */
#ifndef COZYGPU_YAMLLOAD_H
#define COZYGPU_YAMLLOAD_H

#include <jansson.h>
#include <stddef.h>

/* Ceilings.  A file larger than YAMLLOAD_FILE_MAX_BYTES is refused by
   yamlload_file; collections nested deeper than YAMLLOAD_MAX_DEPTH are refused
   by both functions (go-yaml v2 stops at 10000 flow levels or indents). */
#define YAMLLOAD_FILE_MAX_BYTES (32u * 1024u * 1024u)
#define YAMLLOAD_MAX_DEPTH 10000

typedef struct yamlload_error {
    char file[256];       /* the name passed in (truncated to fit) */
    unsigned long line;   /* 1-based, 0 when unknown */
    unsigned long column; /* 1-based, 0 when unknown */
    char message[256];    /* one line, no trailing newline, truncated to fit */
} yamlload_error;

/* Parse every document of a YAML stream.
 *
 * buf, len: the stream; it need not be NUL-terminated.  buf may be NULL only
 *   when len is 0 (an empty stream).
 * filename: used only to fill err->file; may be NULL (err->file is then "").
 * err: may be NULL when the caller does not want details.
 *
 * Returns a new json_t array, owned by the caller (release with json_decref),
 * holding one element per document in stream order.  A document that is
 * empty (nothing, or only comments) or whose root is null (`~`, `null`) is
 * skipped, as kubectl's StreamVisitor skips a document whose JSON is empty or
 * "null" (k8s.io/cli-runtime pkg/resource/visitor.go).  Any other root (an
 * object, but also an array or a scalar) is returned as it is; deciding
 * whether it is a valid object is the caller's business.
 *
 * Values:
 *   - mappings become objects, sequences arrays; {} and [] stay empty
 *     containers, and a key whose value is empty is present with null;
 *   - plain scalars are resolved by go-yaml v2's table (resolve.go): null
 *     (~ null Null NULL and empty), booleans (y Y yes Yes YES true True TRUE
 *     on On ON and their negatives n N no No NO false False FALSE off Off OFF),
 *     integers (sign, underscores, 0x 0o 0b and a leading 0 for octal, as Go's
 *     strconv.ParseInt base 0), floats; anything else is a string;
 *   - quoted and block scalars are strings unless explicitly tagged;
 *   - a double-quoted scalar's escapes are go-yaml v2's (scannerc.go):
 *     \0 \a \b \t \<TAB> \n \v \f \r \e \<SPACE> \" \' \\ \N \_ \L \P
 *     \xHH \uHHHH \UHHHHHHHH and an escaped line break; \' is ' (libyaml
 *     alone refuses it);
 *   - tags !!str !!int !!float !!bool !!null !!timestamp !!binary are
 *     honoured as go-yaml v2 does; any other tag on a scalar makes it a
 *     string, and tags on mappings and sequences are ignored;
 *   - an integer that fits int64 is a json integer; one beyond int64 is the
 *     nearest json real when go-yaml v2 reads it as a uint64 or a float, as
 *     kubectl's float64 (18446744073709551615 -> 1.8446744073709552e19), and
 *     a string otherwise (-0x8000000000000001); a float that Go would print
 *     without a fraction or exponent becomes the json integer of that text
 *     when it fits int64 (1e3 -> 1000, 1.0 -> 1); any other float is a json
 *     real;
 *   - keys that are not strings become strings as sigs.k8s.io/yaml does:
 *     booleans "true"/"false" (so `on:` and `y:` become "true"), integers in
 *     decimal, floats as Go's FormatFloat(f, 'g', -1, 32) (1e7 -> "1e+07");
 *   - anchors and aliases are expanded (each alias is a deep copy); merge
 *     keys `<<` take a mapping or a sequence of mappings, applied in document
 *     order and overwriting keys already set, as go-yaml v2 does.
 *
 * Errors (NULL is returned, nothing partial, *err filled when err != NULL):
 *   - libyaml's reader, scanner and parser errors, with libyaml's problem text
 *     and its 1-based line and column (e.g. a tab used for indentation:
 *     "found character that cannot start any token");
 *   - a double-quoted escape go-yaml v2 does not know, \/ included (which
 *     libyaml alone decodes), with go-yaml's and libyaml's text "found
 *     unknown escape character" at the backslash;
 *   - a line starting with "---" followed by anything but spaces or a comment
 *     (kubectl: "invalid Yaml document separator: ...");
 *   - a duplicate key in one mapping, after keys are made strings (kubectl
 *     keeps one of them silently; we refuse), naming the key and both lines;
 *   - .inf, -.inf and .nan as values (kubectl fails: JSON cannot carry them);
 *   - a null key, a uint64 key, a mapping or sequence used as a key, a
 *     tagged scalar that does not fit its tag, bad !!binary base64, a bad
 *     merge value, an unknown anchor, an anchor that contains itself,
 *     excessive aliasing (go-yaml v2's billion-laughs ratio) and nesting
 *     beyond YAMLLOAD_MAX_DEPTH, each with the line and column of the node;
 *   - out of memory (line 0).
 */
json_t *yamlload_parse(const char *buf, size_t len, const char *filename, yamlload_error *err);

/* Read the file at path (at most YAMLLOAD_FILE_MAX_BYTES) and return
 * yamlload_parse(contents, size, path, err).  Ownership and errors are those
 * of yamlload_parse; in addition an open or read failure, or a file over the
 * ceiling, returns NULL with err->line 0 and a message naming the cause
 * ("cannot open: No such file or directory").
 */
json_t *yamlload_file(const char *path, yamlload_error *err);

#endif /* COZYGPU_YAMLLOAD_H */
