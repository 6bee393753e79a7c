#!/bin/sh
# Build the base helpers (core/base/b64.c, utf8.c, buf.c, file.c) with their
# checks (spec/core/base_check.c) under ASan/UBSan (LSan included) and run them.
#   spec/core/run-base-check.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/base_check.$$
trap 'rm -f "$out"' EXIT INT TERM
gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -fsanitize=address,undefined \
    -fno-sanitize-recover=all -I"$root/core" \
    -o "$out" "$here/base_check.c" "$root/core/base/b64.c" "$root/core/base/utf8.c" \
    "$root/core/base/buf.c" "$root/core/base/file.c"
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 "$out"
