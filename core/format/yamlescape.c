/* yamlescape.c — double-quoted scalars re-read from the raw input
 * (yaml_internal.h): libyaml decodes their escapes as go-yaml v2 does but
 * for "\/" (libyaml takes it, go-yaml refuses it) and "\'" (go-yaml
 * reads "'", libyaml refuses it), so the loader (yamlload.c) checks each
 * such scalar's text as written. Sources: libyaml reader.c and scanner.c,
 * go-yaml v2 scannerc.go (kubectl's sigs.k8s.io/yaml/goyaml.v2);
 * docs/decisions/0002-yaml-scalars.md.
 */
#include "format/yaml_internal.h"

#include <stdlib.h>
#include <string.h>

#include <yaml.h>

/* The input's encoding and where its text starts, as libyaml's reader
   decides (reader.c yaml_parser_determine_encoding): a UTF-16 byte order
   mark, else UTF-8 with an optional mark; marks count characters after it. */
void yl_input_start(yl_input *l, const char *buf, size_t len)
{
    const unsigned char *b = (const unsigned char *)buf;
    l->b = b;
    l->len = len;
    l->enc = YAML_UTF8_ENCODING;
    l->cur_index = 0;
    l->cur_pos = 0;
    if (len >= 2 && b[0] == 0xFF && b[1] == 0xFE) {
        l->enc = YAML_UTF16LE_ENCODING;
        l->cur_pos = 2;
    } else if (len >= 2 && b[0] == 0xFE && b[1] == 0xFF) {
        l->enc = YAML_UTF16BE_ENCODING;
        l->cur_pos = 2;
    } else if (len >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF) {
        l->cur_pos = 3;
    }
    l->start = l->cur_pos;
}

/* The character at byte offset *pos of the input (libyaml has already
   checked the encoding); advances *pos past it. Returns -1 at the end. */
long yl_next_char(const yl_input *l, size_t *pos)
{
    const unsigned char *b = l->b;
    size_t p = *pos, n = l->len;
    unsigned long c;
    if (p >= n)
        return -1;
    if (l->enc == YAML_UTF8_ENCODING) {
        size_t w = b[p] < 0x80 ? 1 : b[p] >= 0xF0 ? 4 : b[p] >= 0xE0 ? 3 : 2, i;
        c = w == 1 ? b[p] : w == 2 ? b[p] & 0x1Fu : w == 3 ? b[p] & 0x0Fu : b[p] & 0x07u;
        for (i = 1; i < w && p + i < n; i++)
            c = (c << 6) | (b[p + i] & 0x3Fu);
        *pos = p + w < n ? p + w : n;
        return (long)c;
    }
    if (p + 2 > n) {
        *pos = n;
        return -1;
    }
    c = l->enc == YAML_UTF16LE_ENCODING ? (unsigned long)(b[p] | b[p + 1] << 8)
                                           : (unsigned long)(b[p] << 8 | b[p + 1]);
    p += 2;
    if (c >= 0xD800 && c <= 0xDBFF && p + 2 <= n) {
        unsigned long lo = l->enc == YAML_UTF16LE_ENCODING ? (unsigned long)(b[p] | b[p + 1] << 8)
                                                              : (unsigned long)(b[p] << 8 | b[p + 1]);
        c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
        p += 2;
    }
    *pos = p;
    return (long)c;
}

/* A line break as libyaml and go-yaml count one (is_break). */
static int is_break_char(long c) { return c == '\r' || c == '\n' || c == 0x85 || c == 0x2028 || c == 0x2029; }

/* go-yaml v2 scannerc.go yaml_parser_scan_flow_scalar, the switch over the
   character after '\\' (kubectl 1.32: sigs.k8s.io/yaml/goyaml.v2). libyaml
   0.2.5 also takes '/', which go-yaml refuses. */
static int goyaml_escape(long c)
{
    return c > 0 && c < 0x80 && strchr("0abt\tnvfre \"'\\N_LPxuU", (int)c) != NULL;
}

/* The value of the code_length hex digits at *pos (libyaml checked them). */
static long hex_value(const yl_input *l, size_t *pos, int code_length)
{
    long v = 0, c;
    int k;
    for (k = 0; k < code_length; k++) {
        c = yl_next_char(l, pos);
        v = v * 16 + (c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                   : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 0);
    }
    return v;
}

/* libyaml hands us a double-quoted scalar decoded, and decodes it as go-yaml
   v2 does but for two escapes: it takes "\/", which go-yaml refuses, and
   refuses "\'", which go-yaml reads as "'" (run() has libyaml read each
   such "\'" as "\"" instead, see patch_apostrophes). Re-read the scalar's
   raw text in the input as written, from the event's start (its tag or
   anchor, if any, then perhaps a comment, then the opening quote) to the
   closing quote:
   - the first escape go-yaml does not know is refused as go-yaml does: at
     the backslash, "found unknown escape character", in the context of the
     opening quote;
   - a "\'" is the n-th '"' of the decoded value (a '"' can only come from an
     escape), so that '"' becomes "'": *fixed is then a malloc'd copy of the
     value so corrected (same length), else NULL.
   Returns 0, or -1 after yl_fail. */
int yl_check_escapes(loader *ld, yl_input *l, const yaml_event_t *ev, unsigned char **fixed)
{
    size_t target = ev->start_mark.index, pos, nquotes = 0, vpos = 0, vseen = 0;
    unsigned long line = (unsigned long)ev->start_mark.line, col = (unsigned long)ev->start_mark.column;
    unsigned long qline = 0, qcol = 0;
    int quoted = 0, comment = 0;
    long c;

    *fixed = NULL;
    if (target < l->cur_index) { /* events come in order; be safe anyway */
        l->cur_index = 0;
        l->cur_pos = l->start;
    }
    while (l->cur_index < target && yl_next_char(l, &l->cur_pos) >= 0)
        l->cur_index++;
    pos = l->cur_pos;
    for (;;) {
        unsigned long at_line = line, at_col = col;
        c = yl_next_char(l, &pos);
        if (c < 0)
            return 0; /* libyaml found the closing quote; not reached */
        if (is_break_char(c)) {
            size_t peek = pos;
            if (c == '\r' && yl_next_char(l, &peek) == '\n')
                pos = peek;
            line++;
            col = 0;
            comment = 0;
            continue;
        }
        col++;
        if (!quoted) {
            if (comment)
                continue;
            if (c == '#')
                comment = 1;
            else if (c == '"') {
                quoted = 1;
                qline = at_line;
                qcol = at_col;
            }
            continue;
        }
        if (c == '"')
            return 0;
        if (c != '\\')
            continue;
        c = yl_next_char(l, &pos);
        if (is_break_char(c)) { /* an escaped line break */
            size_t peek = pos;
            if (c == '\r' && yl_next_char(l, &peek) == '\n')
                pos = peek;
            line++;
            col = 0;
            continue;
        }
        if (!goyaml_escape(c)) {
            free(*fixed);
            *fixed = NULL;
            yl_fail(ld, at_line + 1, at_col + 1,
                    "found unknown escape character (while parsing a quoted scalar at line %lu, column %lu)",
                    qline + 1, qcol + 1);
            return -1;
        }
        col++;
        if (c == 'x' || c == 'u' || c == 'U') {
            int code_length = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            if (hex_value(l, &pos, code_length) == '"')
                nquotes++;
            col += (unsigned long)code_length;
        } else if (c == '"') {
            nquotes++;
        } else if (c == '\'') {
            /* libyaml read it as '"': the nquotes-th '"' of the value */
            size_t i, n = ev->data.scalar.length;
            const unsigned char *v = ev->data.scalar.value;
            for (; vpos < n; vpos++)
                if (v[vpos] == '"' && vseen++ == nquotes)
                    break;
            i = vpos++;
            nquotes++;
            if (i >= n)
                continue; /* not reached */
            if (!*fixed) {
                *fixed = malloc(n + 1);
                if (!*fixed) {
                    yl_fail_oom(ld);
                    return -1;
                }
                memcpy(*fixed, ev->data.scalar.value, n + 1);
            }
            (*fixed)[i] = '\'';
        }
    }
}
