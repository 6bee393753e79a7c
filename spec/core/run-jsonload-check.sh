#!/bin/sh
# Build core/base/jsonload.c with its checks (spec/core/jsonload_check.c:
# against jansson's json_loadb) under ASan/UBSan (LSan included) and run
# them over the examples' JSON, the fuzz seeds and their mutations.
#   spec/core/run-jsonload-check.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
exec sh "$here/run-san-check.sh" "jansson yajl" "$here/jsonload_check.c" base/jsonload.c base/utf8.c \
    -- $(find "$root/examples" -name '*.json' | sort) $(find "$root/fuzz/seeds/fuzz_jsonload" -type f | sort)
