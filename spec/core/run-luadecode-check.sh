#!/bin/sh
# Build the engine layer (core/base, core/format, core/engine) with the
# one-pass review decode's checks (spec/core/luadecode_check.c: against
# cozy_json_loadb and luajson_push) under ASan/UBSan (LSan included) and
# run them over the example reviews and their mutations.
#   spec/core/run-luadecode-check.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root/core"
srcs=$(ls base/*.c format/*.c engine/*.c)
cd "$root"
# the built-in paths engine.c needs (the check passes its own)
SAN_CFLAGS="-DCOZYGPU_LIBDIR=\"$root/lua\" -DCOZYGPU_POLICYDIR=\"$root/policies\"" \
    exec sh "$here/run-san-check.sh" "lua5.4 jansson yaml-0.1 yajl" "$here/luadecode_check.c" $srcs \
    -- "$root/lua" "$root/policies" --cluster "$root/examples/classes" --cluster "$root/examples/cluster" $(find "$root/examples/reviews" -type f | sort)
