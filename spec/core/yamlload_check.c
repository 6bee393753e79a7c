/* yamlload_check — table-driven checks for core/format/yamlload.c.
 *
 * Every case is data: YAML in, the expected JSON (all documents, as a JSON
 * array) or the expected error (line, column, exact message) out.  Expected
 * values follow docs/decisions/0002-yaml-scalars.md; the value cases were
 * also compared with kubectl v1.32 (kubectl label --local -o json), except
 * where the record says we refuse what kubectl accepts.  JSON integers and
 * reals are different values here: json_equal(1000, 1000.0) is false.
 *
 * Usage: yamlload_check [FIXTURES_DIR]   (default /work/shared/fixtures/kubevirt)
 * Prints "N passed, N failed" and exits 1 on any failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "format/yamlload.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static void ok(int cond, const char *name, const char *fmt, const char *a, const char *b)
{
    if (cond) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL %s: ", name);
    printf(fmt, a ? a : "(null)", b ? b : "(null)");
    printf("\n");
}

static char *dump(const json_t *v)
{
    return v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_SORT_KEYS |
                                 JSON_REAL_PRECISION(17))
             : NULL;
}

/* ------------------------------------------------------------ value cases */

struct value_case {
    const char *name;
    const char *yaml;
    const char *want; /* JSON array: one element per non-empty document */
};

static const struct value_case value_cases[] = {
    /* null */
    {"null forms", "a: ~\nb: null\nc: Null\nd: NULL\ne:\nf: nUll\n",
     "[{\"a\":null,\"b\":null,\"c\":null,\"d\":null,\"e\":null,\"f\":\"nUll\"}]"},
    {"empty containers and null vs absent", "a: {}\nb: []\nc:\nd: ~\ne: \"\"\n",
     "[{\"a\":{},\"b\":[],\"c\":null,\"d\":null,\"e\":\"\"}]"},

    /* booleans: go-yaml v2 resolve.go, y/n included */
    {"true forms", "[y, Y, yes, Yes, YES, true, True, TRUE, on, On, ON]",
     "[[true,true,true,true,true,true,true,true,true,true,true]]"},
    {"false forms", "[n, N, no, No, NO, false, False, FALSE, off, Off, OFF]",
     "[[false,false,false,false,false,false,false,false,false,false,false]]"},
    {"mixed case is a string", "[yEs, tRUE, oN, nO, fALSE]",
     "[[\"yEs\",\"tRUE\",\"oN\",\"nO\",\"fALSE\"]]"},

    /* integers: strconv.ParseInt(s, 0, 64) after removing every '_' */
    {"decimal integers", "[0, -0, +0, 12, -12, +12, 1_000, 1__0, 1_]",
     "[[0,0,0,12,-12,12,1000,10,1]]"},
    {"hex octal binary", "[0x1F, 0X1f, -0x1F, +0x1f, 0x_1F, 0o17, 0O17, 017, -017, 0b101, 0B101, -0b101]",
     "[[31,31,-31,31,31,15,15,15,-15,5,5,-5]]"},
    {"int64 limits are exact",
     "[9007199254740993, 9223372036854775807, -9223372036854775808, -0x8000000000000000]",
     "[[9007199254740993,9223372036854775807,-9223372036854775808,-9223372036854775808]]"},
    {"not integers", "[0x, 0b, 0o, _1, 08, 09.5, 1-, +-1]",
     "[[\"0x\",\"0b\",\"0o\",\"_1\",8,9.5,\"1-\",\"+-1\"]]"},
    {"beyond int64: uint64 text is the nearest float64",
     "[9223372036854775808, 18446744073709551615, 1_8446744073709551615, 0x8000000000000000, "
     "0xFFFFFFFFFFFFFFFF, 01777777777777777777777, 01000000000000000000000, !!int 18446744073709551615]",
     "[[9.2233720368547758e18,1.8446744073709552e19,1.8446744073709552e19,9.2233720368547758e18,"
     "1.8446744073709552e19,1.8446744073709552e19,9.2233720368547758e18,1.8446744073709552e19]]"},
    {"beyond int64: signed or beyond uint64 decimal goes through the float rule",
     "[-9223372036854775809, +18446744073709551615, 99999999999999999999, !!float 99999999999999999999]",
     "[[-9.2233720368547758e18,1.8446744073709552e19,1e20,1e20]]"},
    {"beyond int64: other spellings stay strings",
     "[0x10000000000000000, -0x8000000000000001, -0o1000000000000000000001, 0o2000000000000000000000]",
     "[[\"0x10000000000000000\",\"-0x8000000000000001\",\"-0o1000000000000000000001\","
     "\"0o2000000000000000000000\"]]"},
    {"beyond int64 as keys", "99999999999999999999: a\n0x10000000000000000: b\n",
     "[{\"1e+20\":\"a\",\"0x10000000000000000\":\"b\"}]"},

    /* floats: integral ones Go prints without '.' become int64 */
    {"integral floats become integers", "[1e3, 1E3, 1e+3, 1.0, 1., -0.0, 1.e2, 123456.789e3, 1e-400]",
     "[[1000,1000,1000,1,1,0,100,123456789,0]]"},
    {"1e3 is integer 1000", "replicas: 1e3\n", "[{\"replicas\":1000}]"},
    {"integral float keeps Go's shortest digits",
     "[9007199254740993.0, 4611686018427387904.0, 123456789012345678.0]",
     "[[9007199254740992,4611686018427388000,123456789012345680]]"},
    {"fractional floats stay real", "[1.5, -1.5, .5, -.5, +.5, 1e-3, 0.1, .5_5, 1_0.5]",
     "[[1.5,-1.5,0.5,-0.5,0.5,0.001,0.1,0.55,10.5]]"},
    {"large or exponent floats stay real",
     "[1e20, 1e21, -1e20, 9223372036854775807.0, 99999999999999999999.5, 1e-6, 1e-7]",
     "[[1e20,1e21,-1e20,9.2233720368547758e18,1e20,1e-6,1e-7]]"},
    {"not floats", "[1e999, ., .e3, ._5, .inf1, 1e, e3, 0.0.1]",
     "[[\"1e999\",\".\",\".e3\",\"._5\",\".inf1\",\"1e\",\"e3\",\"0.0.1\"]]"},
    {"other strings", "[-, +, <<, =, 12:30, 1:2:3, 2001-12-14, 2001-12-14T21:59:43.10-05:00]",
     "[[\"-\",\"+\",\"<<\",\"=\",\"12:30\",\"1:2:3\",\"2001-12-14\",\"2001-12-14T21:59:43.10-05:00\"]]"},

    /* quoted and block scalars are strings */
    {"quoted scalars stay strings",
     "a: \"1\"\nb: '1e3'\nc: \"true\"\nd: 'null'\ne: \"~\"\nf: 'y'\ng: \"\"\nh: ''\ni: \"0x10\"\n",
     "[{\"a\":\"1\",\"b\":\"1e3\",\"c\":\"true\",\"d\":\"null\",\"e\":\"~\",\"f\":\"y\",\"g\":\"\","
     "\"h\":\"\",\"i\":\"0x10\"}]"},
    {"double-quoted escapes", "a: \"A\\tB\\u00e9\\x41\\\"\"\nb: 'it''s'\n",
     "[{\"a\":\"A\\tB\\u00e9A\\\"\",\"b\":\"it's\"}]"},

    /* double-quoted escapes: go-yaml v2 scannerc.go yaml_parser_scan_flow_scalar
       (vendored by kubectl 1.32 as sigs.k8s.io/yaml/goyaml.v2) knows exactly
       0 a b t TAB n v f r e SPACE " ' \ N _ L P x u U and an escaped line
       break; each decodes as below (kubectl v1.32.4 gives the same) */
    /* \0 is one too, refused: it yields U+0000 (the error cases below) */
    {"every escape go-yaml knows but \\0",
     "a: \"\\a\\b\\t\\\t\\n\\v\\f\\r\\e\\ \\\"\\\\\\N\\_\\L\\P\"\n",
     "[{\"a\":\"\\u0007\\b\\t\\t\\n\\u000b\\f\\r\\u001b \\\"\\\\\\u0085\\u00a0\\u2028\\u2029\"}]"},
    {"hex escapes are code points written as UTF-8",
     "- \"\\x41\\x7f\\x80\\xFF\"\n- \"\\u00e9\\u07FF\\u0800\\uD7FF\\uE000\\uFFFF\"\n"
     "- \"\\U0001F600\\U0010FFFF\\U00000041\"\n",
     "[[\"A\\u007f\\u0080\\u00ff\",\"\\u00e9\\u07ff\\u0800\\ud7ff\\ue000\\uffff\","
     "\"\\ud83d\\ude00\\udbff\\udfffA\"]]"},
    {"escaped backslash then slash is two characters", "a: \"\\\\/\"\nb: \"/\"\n",
     "[{\"a\":\"\\\\/\",\"b\":\"/\"}]"},
    {"escaped line breaks and folding in double quotes",
     "a: \"x\\\n  y\"\nb: \"x \\\n  y\"\nc: \"x\\\n\n  y\"\nd: \"x\n  y\"\ne: \"x\n\n  y\"\nf: \"x\\\r\n  y\"\n",
     "[{\"a\":\"xy\",\"b\":\"x y\",\"c\":\"x\\ny\",\"d\":\"x y\",\"e\":\"x\\ny\",\"f\":\"xy\"}]"},
    /* "\'" is go-yaml's and not libyaml 0.2.5's (which refuses it) */
    {"escaped apostrophe", "a: \"it\\'s\"\n\"k\\'\": \"v\\'\"\nc: '\\'\nd: \"x\\\n  \\'y\"\n",
     "[{\"a\":\"it's\",\"k'\":\"v'\",\"c\":\"\\\\\",\"d\":\"x'y\"}]"},
    {"escaped apostrophes among escaped quotes",
     "a: \"\\\"\\'\\x22\\'\\u0022\\U00000022\\'\"\n",
     "[{\"a\":\"\\\"'\\\"'\\\"\\\"'\"}]"},
    {"escaped apostrophes in several scalars and documents",
     "- \"\\'\"\n- '\\'\n- \"\\'\\'\"\n---\nb: [\"\\'\", &x \"\\\\\\'\", *x]\n",
     "[[\"'\",\"\\\\\",\"''\"],{\"b\":[\"'\",\"\\\\'\",\"\\\\'\"]}]"},
    {"backslashes outside double quotes are text",
     "a: 'x\\/y\\q\\'\nb: x\\/y\\q\nc: |\n  \\/ \\q \"\\/\"\nd: >-\n  \\/\n\"e\": \\/\n# \"\\/\"\nf: [\\/, '\\/']\n",
     "[{\"a\":\"x\\\\/y\\\\q\\\\\",\"b\":\"x\\\\/y\\\\q\",\"c\":\"\\\\/ \\\\q \\\"\\\\/\\\"\\n\","
     "\"d\":\"\\\\/\",\"e\":\"\\\\/\",\"f\":[\"\\\\/\",\"\\\\/\"]}]"},
    {"literal block, clip", "a: |\n  l1\n  l2\n", "[{\"a\":\"l1\\nl2\\n\"}]"},
    {"literal block, strip", "a: |-\n  l1\n  l2\n", "[{\"a\":\"l1\\nl2\"}]"},
    {"literal block, keep", "a: |+\n  l1\n\nb: 1\n", "[{\"a\":\"l1\\n\\n\",\"b\":1}]"},
    {"folded block", "a: >\n  f1\n  f2\n\n  p2\n", "[{\"a\":\"f1 f2\\np2\\n\"}]"},
    {"folded block, strip", "a: >-\n  f1\n  f2\n", "[{\"a\":\"f1 f2\"}]"},
    {"block scalar of digits is a string", "a: |\n  12\nb: >-\n  true\n",
     "[{\"a\":\"12\\n\",\"b\":\"true\"}]"},
    {"indentation indicator", "a: |2\n   x\n", "[{\"a\":\" x\\n\"}]"},

    /* explicit tags */
    {"core tags honoured",
     "- !!str 1\n- !!str true\n- !!str ~\n- !!int \"12\"\n- !!int '0x10'\n- !!int \"1_0\"\n"
     "- !!float 1\n- !!float \"1.5\"\n- !!float 1e3\n- !!bool \"yes\"\n- !!bool n\n"
     "- !!null \"\"\n- !!null ~\n- !!str\n- !!null\n",
     "[[\"1\",\"true\",\"~\",12,16,10,1,1.5,1000,true,false,null,null,\"\",null]]"},
    {"timestamp and binary tags",
     "- !!timestamp 2001-12-14\n- !!timestamp 2001-12-14t21:59:43.10-05:00\n"
     "- !!timestamp 2001-2-3 4:5:6\n- !!timestamp 2000-02-29\n- !!binary aGVsbG8=\n"
     "- !!binary \"aGVs\\nbG8=\"\n- !!binary \"\"\n- !!binary /w==\n",
     "[[\"2001-12-14\",\"2001-12-14t21:59:43.10-05:00\",\"2001-2-3 4:5:6\",\"2000-02-29\","
     "\"hello\",\"hello\",\"\",\"\\ufffd\"]]"},
    {"other tags on scalars give the text",
     "- ! 12\n- !foo 12\n- !foo true\n- !<tag:example.com,2000:x> 1\n- !!merge x\n- !!seq x\n",
     "[[\"12\",\"12\",\"true\",\"1\",\"x\",\"x\"]]"},
    {"tags on collections are ignored", "a: !!set {x, z}\nb: !!str [1]\nc: !foo {d: 1}\n",
     "[{\"a\":{\"x\":null,\"z\":null},\"b\":[1],\"c\":{\"d\":1}}]"},

    /* keys: sigs.k8s.io/yaml convertToJSONableObject */
    {"non-string keys become strings",
     "on: a\nno: b\n1: c\n0x10: d\n1e7: e\n1.5: f\n0.1: g\n-0.0: h\n.inf: i\n-.inf: j\n.nan: k\n"
     "123456.0: l\n0.00001: m\n3.14159265358979: pi\n16777217.0: o\n2001-01-01: p\n\"1.0\": q\n"
     "!!binary aGk=: r\n",
     "[{\"true\":\"a\",\"false\":\"b\",\"1\":\"c\",\"16\":\"d\",\"1e+07\":\"e\",\"1.5\":\"f\","
     "\"0.1\":\"g\",\"-0\":\"h\",\".inf\":\"i\",\"-.inf\":\"j\",\".nan\":\"k\",\"123456\":\"l\","
     "\"1e-05\":\"m\",\"3.1415927\":\"pi\",\"1.6777216e+07\":\"o\",\"2001-01-01\":\"p\","
     "\"1.0\":\"q\",\"hi\":\"r\"}]"},
    {"y as a key is true", "y: 1\n", "[{\"true\":1}]"},

    /* anchors, aliases, merge keys: go-yaml v2 decode.go */
    {"alias is a copy", "a: &x {b: [1, {c: 2}]}\nd: *x\n",
     "[{\"a\":{\"b\":[1,{\"c\":2}]},\"d\":{\"b\":[1,{\"c\":2}]}}]"},
    {"scalar alias as value and key", "a: &k 1e7\n*k : 2\nc: *k\n",
     "[{\"a\":10000000,\"1e+07\":2,\"c\":10000000}]"},
    {"anchor redefined", "a: &a 1\nb: &a 2\nc: *a\n", "[{\"a\":1,\"b\":2,\"c\":2}]"},
    {"merge one mapping, explicit key after it wins", "b: &b {x: 1, w: 2}\nm: {<<: *b, w: 3}\n",
     "[{\"b\":{\"x\":1,\"w\":2},\"m\":{\"x\":1,\"w\":3}}]"},
    {"merge after an explicit key overwrites it (v2 order)", "b: &b {x: 1, w: 2}\nm: {w: 3, <<: *b}\n",
     "[{\"b\":{\"x\":1,\"w\":2},\"m\":{\"x\":1,\"w\":2}}]"},
    {"merge sequence, earlier maps win", "b: &b {x: 1, w: 2}\nm: {<<: [{x: 9}, *b], z: 1}\n",
     "[{\"b\":{\"x\":1,\"w\":2},\"m\":{\"x\":9,\"w\":2,\"z\":1}}]"},
    {"merge in block style", "defaults: &d\n  cpu: 1\n  gpu: 0\nvm:\n  <<: *d\n  gpu: 2\n",
     "[{\"defaults\":{\"cpu\":1,\"gpu\":0},\"vm\":{\"cpu\":1,\"gpu\":2}}]"},
    {"merge of an inline anchored mapping", "m: {<<: &i {x: 1}, w: *i}\n",
     "[{\"m\":{\"x\":1,\"w\":{\"x\":1}}}]"},
    {"merge of an empty sequence", "m: {<<: [], a: 1}\n", "[{\"m\":{\"a\":1}}]"},
    {"quoted << is an ordinary key", "m: {\"<<\": 1, !!merge \"<<\": {c: 2}}\n",
     "[{\"m\":{\"<<\":1,\"c\":2}}]"},
    {"merged keys are not duplicates", "b: &b {x: 1}\nm:\n  <<: *b\n  x: 2\n",
     "[{\"b\":{\"x\":1},\"m\":{\"x\":2}}]"},

    /* streams: kubectl's StreamVisitor skips empty and null documents */
    {"empty stream", "", "[]"},
    {"comments only", "# nothing here\n", "[]"},
    {"multi-document with empty and null documents",
     "---\n# only a comment\n---\na: 1\n---\n~\n---\nnull\n--- # comment\nb: 2\n...\n---\n\n",
     "[{\"a\":1},{\"b\":2}]"},
    {"non-object documents are returned", "---\n[]\n---\n'hello'\n---\n{}\n---\n''\n",
     "[[],\"hello\",{},\"\"]"},
    {"separator with trailing spaces and CRLF", "a: 1\r\n---  \r\nb: 2\r\n",
     "[{\"a\":1},{\"b\":2}]"},
    {"--- inside a block scalar line is content", "a: |\n  ---x\n", "[{\"a\":\"---x\\n\"}]"},
};

/* ------------------------------------------------------------ error cases */

struct error_case {
    const char *name;
    const char *yaml;
    unsigned long line, column;
    const char *message;
};

static const struct error_case error_cases[] = {
    /* libyaml's own errors, with its text and position */
    {"tab used for indentation", "a:\n\tb: 1\n", 2, 1,
     "found character that cannot start any token (while scanning for the next token)"},
    {"tab after a plain scalar", "a: 1\n\tb: 2\n", 2, 1,
     "found a tab character that violates indentation (while scanning a plain scalar at line 1, column 4)"},
    {"tab at the start", "\ta: 1\n", 1, 1,
     "found character that cannot start any token (while scanning for the next token)"},
    {"unclosed flow sequence", "a: [1, 2\n", 2, 1,
     "did not find expected ',' or ']' (while parsing a flow sequence at line 1, column 4)"},
    {"unclosed quote", "a: 'x\n", 2, 1,
     "found unexpected end of stream (while scanning a quoted scalar at line 1, column 4)"},
    {"mapping in a plain value", "a: b: c\n", 1, 5, "mapping values are not allowed in this context"},
    {"bad indentation", "a:\n  - 1\n - 2\n", 3, 2,
     "did not find expected key (while parsing a block mapping at line 1, column 1)"},
    {"unknown escape", "a: \"\\q\"\n", 1, 5,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},

    /* escapes libyaml 0.2.5 decodes but go-yaml v2 refuses (its switch has no
       '/'): kubectl fails with "found unknown escape character", at the
       backslash, so we do too */
    {"escaped slash", "a: \"\\/\"\n", 1, 5,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},
    {"escaped slash in a key", "\"k\\/\": 1\n", 1, 3,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 1)"},
    {"escaped slash on a continuation line", "a: \"x\n  y \\/\"\n", 2, 5,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},
    {"escaped slash after an escaped line break", "a: \"x\\\n  \\/\"\n", 2, 3,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},
    {"escaped slash after an escaped backslash", "a: \"\\\\\\/\"\n", 1, 7,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},
    {"escaped slash after an escaped quote", "a: \"\\\"\\/\"\n", 1, 7,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},
    {"escaped slash after multibyte characters", "a: \"\xc3\xa9\xe2\x82\xac\\/\"\n", 1, 7,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},
    {"escaped slash after a byte order mark", "\xef\xbb\xbf" "a: \"\\/\"\n", 1, 5,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},
    {"escaped slash in a tagged, anchored scalar", "a: !!str &x\n  \"\\/\"\n", 2, 4,
     "found unknown escape character (while parsing a quoted scalar at line 2, column 3)"},
    {"escaped slash after a comment holding a quote", "a: !!str # \"\n  \"\\/\"\n", 2, 4,
     "found unknown escape character (while parsing a quoted scalar at line 2, column 3)"},
    {"escaped slash in a flow sequence of a later document, CRLF",
     "a: 1\r\n---\r\nb: [\"ok\", \"x\\/\"]\r\n", 3, 13,
     "found unknown escape character (while parsing a quoted scalar at line 3, column 11)"},
    {"escaped slash as !!binary", "a: !!binary \"aGk\\/\"\n", 1, 17,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 13)"},
    {"escaped slash after escaped apostrophes", "a: \"\\'\"\nb: \"\\'\\/\"\n", 2, 7,
     "found unknown escape character (while parsing a quoted scalar at line 2, column 4)"},
    {"error after an escaped apostrophe keeps its place", "a: \"\\'\"\nb: [1\n", 3, 1,
     "did not find expected ',' or ']' (while parsing a flow sequence at line 2, column 4)"},
    /* refused by both, with the same text */
    {"short hex escape", "a: \"\\x4\"\n", 1, 7,
     "did not find expected hexdecimal number (while parsing a quoted scalar at line 1, column 4)"},
    {"surrogate escape", "a: \"\\uD800\"\n", 1, 7,
     "found invalid Unicode character escape code (while parsing a quoted scalar at line 1, column 4)"},
    {"escape beyond U+10FFFF", "a: \"\\U00110000\"\n", 1, 7,
     "found invalid Unicode character escape code (while parsing a quoted scalar at line 1, column 4)"},
    {"escaped multibyte character", "a: \"\\\xc3\xa9\"\n", 1, 5,
     "found unknown escape character (while parsing a quoted scalar at line 1, column 4)"},
    {"invalid UTF-8", "a: \xff\n", 1, 4, "invalid leading UTF-8 octet"},
    {"control character", "a: \x01\n", 1, 4, "control characters are not allowed"},
    /* the fuzzer's find: an escape that yields U+0000 (a C string would end
       there; the webhooks' JSON parser refuses \u0000 too) */
    {"NUL from \\0", "a: \"2024-02-16\\04:39\"\n", 1, 4,
     "a string holds a NUL character (U+0000, from an escape such as \\0): not accepted"},
    {"NUL from \\u0000 in a key", "\"k\\u0000\": 1\n", 1, 1,
     "a string holds a NUL character (U+0000, from an escape such as \\0): not accepted"},
    {"document after ... without ---", "a: 1\n...\nb: 2\n", 3, 1,
     "did not find expected <document start>"},

    /* kubectl's document separator rule */
    {"separator followed by content", "a: 1\n--- !!map\nb: 2\n", 2, 1,
     "invalid Yaml document separator: !!map"},
    {"four dashes", "a: 1\n----\n", 2, 1, "invalid Yaml document separator: -"},
    {"separator followed by a flow mapping", "--- {a: 1}\n", 1, 1,
     "invalid Yaml document separator: {a: 1}"},

    /* duplicate keys */
    {"duplicate key", "a: 1\nb: 2\na: 3\n", 3, 1, "duplicate key \"a\" (first at line 1)"},
    {"duplicate key in flow mapping", "x: {b: 1, b: 2}\n", 1, 11, "duplicate key \"b\" (first at line 1)"},
    {"duplicate after keys become strings", "on: 1\ntrue: 2\n", 2, 1,
     "duplicate key \"true\" (first at line 1)"},
    {"int and string key collide", "1: a\n\"1\": b\n", 2, 1, "duplicate key \"1\" (first at line 1)"},
    {"float keys collide at float32", "1e39: a\n.inf: b\n", 2, 1,
     "duplicate key \".inf\" (first at line 1)"},

    /* numbers JSON cannot carry, and uint64 keys */
    {"uint64 key", "18446744073709551615: a\n", 1, 1,
     "unsupported map key: `18446744073709551615` is a uint64"},
    {"!!float of a uint64", "a: !!float 18446744073709551615\n", 1, 4,
     "cannot decode !!int `18446744073709551615` as a !!float"},
    {"!!int of a decimal beyond uint64", "a: !!int 99999999999999999999\n", 1, 4,
     "cannot decode !!float `99999999999999999999` as a !!int"},
    {"!!int of hex beyond uint64", "a: !!int 0x10000000000000000\n", 1, 4,
     "cannot decode !!str `0x10000000000000000` as a !!int"},
    {".inf", "a: .inf\n", 1, 4, ".inf has no JSON form (kubectl fails: json: unsupported value: +Inf)"},
    {"-.Inf", "a: -.Inf\n", 1, 4, "-.inf has no JSON form (kubectl fails: json: unsupported value: -Inf)"},
    {".nan", "a: [1, .NaN]\n", 1, 8, ".nan has no JSON form (kubectl fails: json: unsupported value: NaN)"},
    {"!!float .inf", "a: !!float +.inf\n", 1, 4,
     ".inf has no JSON form (kubectl fails: json: unsupported value: +Inf)"},

    /* keys */
    {"null key", "~: 1\n", 1, 1, "unsupported map key: `~` is null"},
    {"null key via alias", "a: &n null\n*n : 1\n", 2, 1, "unsupported map key: `*n` is null"},
    {"sequence key", "? [a]\n: 1\n", 1, 3, "invalid map key: a sequence cannot be a key"},
    {"mapping key", "? {a: 1}\n: 1\n", 1, 3, "invalid map key: a mapping cannot be a key"},
    {"alias of a sequence as key", "a: &s [1]\n*s : 1\n", 2, 1, "invalid map key: *s is a sequence"},

    /* tags */
    {"!!int of a float", "a: !!int 1.5\n", 1, 4, "cannot decode !!float `1.5` as a !!int"},
    {"!!int of text", "a: !!int abc\n", 1, 4, "cannot decode !!str `abc` as a !!int"},
    {"!!int of nothing", "a: !!int \"\"\n", 1, 4, "cannot decode !!null `` as a !!int"},
    {"!!bool of an int", "a: !!bool 1\n", 1, 4, "cannot decode !!int `1` as a !!bool"},
    {"!!null of an int", "a: !!null 0\n", 1, 4, "cannot decode !!int `0` as a !!null"},
    {"!!float of text", "a: !!float abc\n", 1, 4, "cannot decode !!str `abc` as a !!float"},
    {"!!int of a block scalar", "a: !!int |\n  12\n", 1, 4, "cannot decode !!str `12\n` as a !!int"},
    {"!!timestamp, no such day", "a: !!timestamp 2001-02-29\n", 1, 4,
     "cannot decode !!str `2001-02-29` as a !!timestamp"},
    {"!!timestamp, hour 24", "a: !!timestamp 2001-12-14T24:00:00Z\n", 1, 4,
     "cannot decode !!str `2001-12-14T24:00:00Z` as a !!timestamp"},
    {"!!timestamp of an int", "a: !!timestamp 12\n", 1, 4, "cannot decode !!int `12` as a !!timestamp"},
    {"!!binary without padding", "a: !!binary aGVsbG8\n", 1, 4,
     "!!binary value contains invalid base64 data"},

    /* anchors and merges */
    {"unknown anchor", "a: *nope\n", 1, 4, "unknown anchor 'nope' referenced"},
    {"anchor contains itself", "a: &a [*a]\n", 1, 8, "anchor 'a' value contains itself"},
    {"anchors are per document", "a: &x 1\n---\nb: *x\n", 3, 4, "unknown anchor 'x' referenced"},
    {"merge of a scalar", "a: {<<: 1}\n", 1, 5, "map merge requires map or sequence of maps as the value"},
    {"merge of null", "a: {<<: ~}\n", 1, 5, "map merge requires map or sequence of maps as the value"},
    {"merge of a sequence of scalars", "a: {<<: [1]}\n", 1, 5,
     "map merge requires map or sequence of maps as the value"},
    {"merge of an alias of a sequence", "s: &s [{x: 1}]\nm: {<<: *s}\n", 2, 5,
     "map merge requires map or sequence of maps as the value"},
    {"billion laughs",
     "a: &a [x, x, x, x, x, x, x, x, x]\n"
     "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
     "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
     "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
     4, 20, "document contains excessive aliasing"},
};

/* ------------------------------------------------------------ fixtures */

struct fixture_value {
    const char *file;    /* relative to the fixtures directory */
    size_t doc;          /* index in the returned array */
    const char *pointer; /* RFC 6901 JSON pointer into that document */
    const char *want;    /* JSON */
};

static const struct fixture_value fixture_values[] = {
    {"kubevirt-user-guide/host-devices-permittedHostDevices.yaml", 0,
     "/configuration/permittedHostDevices/pciHostDevices/0/resourceName",
     "\"nvidia.com/TU104GL_Tesla_T4\""},
    {"kubevirt-user-guide/host-devices-permittedHostDevices.yaml", 0,
     "/configuration/permittedHostDevices/pciHostDevices/0/externalResourceProvider", "true"},
    {"kubevirt-user-guide/host-devices-permittedHostDevices.yaml", 0,
     "/configuration/permittedHostDevices/mediatedDevices/0/resourceName",
     "\"nvidia.com/GRID_T4-1Q\""},
    {"kubevirt-examples/vmi-gpu.yaml", 0, "/spec/domain/devices/gpus/0/deviceName",
     "\"nvidia.com/GP102GL_Tesla_P40\""},
    {"kubevirt-examples/vmi-gpu.yaml", 0, "/spec/terminationGracePeriodSeconds", "0"},
    {"kubevirt-examples/vmi-gpu.yaml", 0, "/spec/domain/devices/rng", "{}"},
    {"kubevirt-examples/vmi-gpu.yaml", 0, "/spec/volumes/1/cloudInitNoCloud/userData",
     "\"#cloud-config\\npassword: fedora\\nchpasswd: { expire: False }\""},
    {"nvidia-kubevirt-gpu-device-plugin/kubevirt-featuregate-cm.yaml", 0,
     "/spec/configuration/permittedHostDevices/pciHostDevices/0/resourceName",
     "\"nvidia.com/TU104GL_Tesla_T4\""},
    {"nvidia-kubevirt-gpu-device-plugin/kubevirt-featuregate-cm.yaml", 0,
     "/spec/configuration/developerConfiguration/featureGates", "[\"GPU\"]"},
    {"cozystack/extra-instancetypes.yaml", 0, "/spec/cpu/guest", "8"},
    {"cozystack/extra-instancetypes.yaml", 0, "/metadata/labels/instancetype.kubevirt.io~1cpu", "\"8\""},
    {"cozystack/extra-instancetypes.yaml", 0, "/spec/gpus/0/deviceName", "\"nvidia.com/A400\""},
    {"cozystack/extra-instancetypes.yaml", 8, "/metadata/name", "\"centos.stream8.dpdk\""},
    {"cozystack/gpu-passthrough-defaults.yaml", 0, "/pciHostDevices/0/resourceName",
     "\"nvidia.com/GH100_H200_SXM_141GB\""},
    {"cozystack/docs-gpu-vgpu-sample-vm.yaml", 0,
     "/spec/template/spec/domain/devices/hostDevices/0/deviceName", "\"nvidia.com/L40S-24Q\""},
    /* KubeVirt's generated API testdata fills uint fields with values above
       int64: kubectl holds them as float64 */
    {"kubevirt-api-testdata/kubevirt.io.v1.KubeVirt.yaml", 0,
     "/spec/configuration/developerConfiguration/logVerbosity/nodeVerbosity/nodeVerbosityKey",
     "1.8446744073709552e19"},
    {"kubevirt-api-testdata/kubevirt.io.v1.KubeVirt.yaml", 0,
     "/spec/configuration/developerConfiguration/cpuAllocationRatio", "-18"},
    {"kubevirt-api-testdata/kubevirt.io.v1.VirtualMachineInstance.yaml", 0,
     "/spec/domain/devices/disks/0/blockSize/custom/discardGranularity", "1.8446744073709552e19"},
    {"kubevirt-api-testdata/kubevirt.io.v1.VirtualMachine.yaml", 0, "/kind", "\"VirtualMachine\""},
};

/* RFC 6901 JSON pointer: "/a/0/b", "~1" for '/', "~0" for '~'. */
static json_t *pointer_get(json_t *v, const char *p)
{
    char seg[256];
    while (v && *p == '/') {
        size_t n = 0;
        p++;
        while (*p && *p != '/' && n + 1 < sizeof seg) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[n++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                seg[n++] = *p++;
            }
        }
        seg[n] = '\0';
        if (json_is_array(v))
            v = json_array_get(v, strtoul(seg, NULL, 10));
        else
            v = json_object_get(v, seg);
    }
    return v;
}

static const char *fixtures_dir = "/work/shared/fixtures/kubevirt";
static int swept;

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int sweep_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    yamlload_error err;
    json_t *v;
    (void)st;
    (void)ftw;
    if (type != FTW_F || !ends_with(path, ".yaml") || ends_with(path, ".partial.yaml"))
        return 0; /* *.tpl never ends with .yaml */
    swept++;
    v = yamlload_file(path, &err);
    ok(v != NULL && json_is_array(v) && json_array_size(v) > 0, path, "does not parse: %s%s",
       err.message, "");
    json_decref(v);
    return 0;
}

/* ------------------------------------------------------------ main */

int main(int argc, char **argv)
{
    size_t i;
    char path[4096];

    if (argc > 1)
        fixtures_dir = argv[1];

    for (i = 0; i < sizeof value_cases / sizeof value_cases[0]; i++) {
        const struct value_case *c = &value_cases[i];
        yamlload_error err;
        json_error_t jerr;
        json_t *want = json_loads(c->want, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        json_t *got = yamlload_parse(c->yaml, strlen(c->yaml), "case.yaml", &err);
        char *gs = got ? dump(got) : NULL, *ws = dump(want);
        if (!want) {
            ok(0, c->name, "bad expected JSON %s (%s)", c->want, jerr.text);
        } else if (!got) {
            ok(0, c->name, "error %s, want %s", err.message, ws);
        } else {
            ok(json_equal(got, want), c->name, "got %s, want %s", gs, ws);
        }
        free(gs);
        free(ws);
        json_decref(got);
        json_decref(want);
    }

    for (i = 0; i < sizeof error_cases / sizeof error_cases[0]; i++) {
        const struct error_case *c = &error_cases[i];
        yamlload_error err;
        json_t *got = yamlload_parse(c->yaml, strlen(c->yaml), "case.yaml", &err);
        char *gs = dump(got), where[64], want_where[64];
        snprintf(where, sizeof where, "%lu:%lu", err.line, err.column);
        snprintf(want_where, sizeof want_where, "%lu:%lu", c->line, c->column);
        ok(got == NULL, c->name, "got %s, want error %s", gs, c->message);
        if (!got) {
            ok(strcmp(err.message, c->message) == 0, c->name, "message \"%s\", want \"%s\"",
               err.message, c->message);
            ok(strcmp(where, want_where) == 0, c->name, "at %s, want %s", where, want_where);
            ok(strcmp(err.file, "case.yaml") == 0, c->name, "file %s, want %s", err.file,
               "case.yaml");
        }
        free(gs);
        json_decref(got);
    }

    /* API edges */
    {
        yamlload_error err;
        json_t *v;
        char buf[] = {'a', ':', ' ', '1', 'x', 'y', 'z'}; /* not NUL-terminated; len 4 */
        char deep[YAMLLOAD_MAX_DEPTH + 2];

        json_t *want = json_pack("[{s:i}]", "a", 1);
        v = yamlload_parse(buf, 4, NULL, &err);
        ok(v && json_equal(v, want), "length bounds the input", "got %s%s",
           v ? "a different value" : err.message, "");
        json_decref(v);
        json_decref(want);

        v = yamlload_parse(NULL, 0, NULL, NULL);
        ok(v && json_is_array(v) && json_array_size(v) == 0, "NULL buffer, length 0",
           "want []%s%s", "", "");
        json_decref(v);

        v = yamlload_parse(NULL, 3, "x.yaml", &err);
        ok(!v && strcmp(err.message, "invalid argument: no buffer") == 0, "NULL buffer, length 3",
           "message %s%s", err.message, "");
        json_decref(v);

        v = yamlload_parse("a: [", 4, NULL, &err);
        ok(!v && strcmp(err.file, "") == 0, "NULL filename gives empty file", "file %s%s",
           err.file, "");
        json_decref(v);

        v = yamlload_parse("a: .inf", 7, NULL, NULL);
        ok(!v, "error with NULL err", "want NULL%s%s", "", "");
        json_decref(v);

        memset(deep, '[', sizeof deep - 1);
        deep[sizeof deep - 1] = '\0';
        v = yamlload_parse(deep, strlen(deep), "deep.yaml", &err);
        ok(!v && strcmp(err.message, "exceeded max depth of 10000") == 0 && err.line == 1 &&
               err.column == YAMLLOAD_MAX_DEPTH + 1,
           "nesting ceiling", "message %s%s", err.message, "");
        json_decref(v);

        {
            char *within = malloc(2 * YAMLLOAD_MAX_DEPTH + 1);
            memset(within, '[', YAMLLOAD_MAX_DEPTH);
            memset(within + YAMLLOAD_MAX_DEPTH, ']', YAMLLOAD_MAX_DEPTH);
            within[2 * YAMLLOAD_MAX_DEPTH] = '\0';
            v = yamlload_parse(within, strlen(within), "deep.yaml", &err);
            ok(v != NULL, "nesting at the ceiling parses", "error %s%s", err.message, "");
            json_decref(v);
            free(within);
        }

        {
            /* UTF-16 input (libyaml and go-yaml both read it after a byte
               order mark): the raw text is re-read in its own encoding */
            const char *text = "a: \"\xe9\\/\"\n", *p;
            char u16[2][64];
            size_t n = 2;
            int be;
            for (be = 0; be < 2; be++) {
                u16[be][0] = be ? '\xfe' : '\xff';
                u16[be][1] = be ? '\xff' : '\xfe';
                for (p = text, n = 2; *p; p++, n += 2) {
                    u16[be][n + (be ? 1 : 0)] = *p;
                    u16[be][n + (be ? 0 : 1)] = 0;
                }
                v = yamlload_parse(u16[be], n, "u16.yaml", &err);
                ok(!v && err.line == 1 && err.column == 6 &&
                       strcmp(err.message, "found unknown escape character (while parsing a quoted "
                                           "scalar at line 1, column 4)") == 0,
                   be ? "escaped slash in UTF-16BE" : "escaped slash in UTF-16LE", "message %s%s",
                   err.message, "");
                json_decref(v);
            }
        }

        {
            /* each double-quoted scalar with "\'" costs libyaml a pass; the
               passes are bounded: 64 for an input of 1 MiB or more */
            size_t pad = 1024 * 1024, n, k;
            char *big = malloc(pad + 65 * 8 + 1);
            memset(big, ' ', pad);
            big[0] = '#';
            big[pad - 1] = '\n';
            for (n = pad, k = 0; k < 64; k++, n += 7)
                memcpy(big + n, "- \"\\'\"\n", 7);
            v = yamlload_parse(big, n, "big.yaml", &err);
            ok(v && json_array_size(json_array_get(v, 0)) == 64, "64 scalars with \\' in 1 MiB",
               "error %s%s", err.message, "");
            json_decref(v);
            memcpy(big + n, "- \"\\'\"\n", 7);
            n += 7;
            v = yamlload_parse(big, n, "big.yaml", &err);
            ok(!v && err.line == 66 && err.column == 4 &&
                   strcmp(err.message, "too many double-quoted scalars with \\' escapes to read them "
                                       "as kubectl does (\\' is ') (while parsing a quoted scalar at "
                                       "line 66, column 3)") == 0,
               "65 scalars with \\' in 1 MiB", "message %s%s", err.message, "");
            json_decref(v);
            free(big);
        }
        {
            const char *text = "a: \"\xe9\\'\"\n", *p;
            char u16[2][64];
            size_t n = 2;
            int be;
            for (be = 0; be < 2; be++) {
                u16[be][0] = be ? '\xfe' : '\xff';
                u16[be][1] = be ? '\xff' : '\xfe';
                for (p = text, n = 2; *p; p++, n += 2) {
                    u16[be][n + (be ? 1 : 0)] = *p;
                    u16[be][n + (be ? 0 : 1)] = 0;
                }
                want = json_pack("[{s:s}]", "a", "\xc3\xa9'");
                v = yamlload_parse(u16[be], n, "u16.yaml", &err);
                ok(v && json_equal(v, want), be ? "escaped apostrophe in UTF-16BE" : "escaped apostrophe in UTF-16LE",
                   "error %s%s", v ? "(a different value)" : err.message, "");
                json_decref(v);
                json_decref(want);
            }
        }

        v = yamlload_file("/nonexistent/cozygpu.yaml", &err);
        ok(!v && strcmp(err.message, "cannot open: No such file or directory") == 0 &&
               strcmp(err.file, "/nonexistent/cozygpu.yaml") == 0 && err.line == 0,
           "missing file", "message %s%s", err.message, "");
        json_decref(v);

        v = yamlload_file(fixtures_dir, &err);
        ok(!v && strcmp(err.message, "cannot read: Is a directory") == 0, "directory",
           "message %s%s", err.message, "");
        json_decref(v);
    }

    /* real files */
    for (i = 0; i < sizeof fixture_values / sizeof fixture_values[0]; i++) {
        const struct fixture_value *c = &fixture_values[i];
        yamlload_error err;
        json_t *docs, *want = json_loads(c->want, JSON_DECODE_ANY, NULL), *got;
        char *gs, *ws = dump(want);
        snprintf(path, sizeof path, "%s/%s", fixtures_dir, c->file);
        docs = yamlload_file(path, &err);
        got = docs ? pointer_get(json_array_get(docs, c->doc), c->pointer) : NULL;
        gs = dump(got);
        if (!docs)
            ok(0, c->file, "error %s%s", err.message, "");
        else
            ok(got && want && json_equal(got, want), c->pointer, "got %s, want %s", gs, ws);
        free(gs);
        free(ws);
        json_decref(want);
        json_decref(docs);
    }
    if (nftw(fixtures_dir, sweep_one, 16, FTW_PHYS) != 0)
        ok(0, "fixture sweep", "cannot walk %s%s", fixtures_dir, "");
    ok(swept >= 20, "fixture sweep", "only %s files%s", swept ? "a few" : "no", "");

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
