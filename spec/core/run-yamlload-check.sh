#!/bin/sh
# Build core/format/yamlload.c (with yamlscalar.c and the base helpers) with its checks (spec/core/yamlload_check.c)
# under ASan/UBSan (LSan included) and run them against the KubeVirt fixtures.
#   spec/core/run-yamlload-check.sh [FIXTURES_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/yamlload_check.$$
trap 'rm -f "$out"' EXIT INT TERM
gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -fsanitize=address,undefined \
    -fno-sanitize-recover=all -I"$root/core" \
    -o "$out" "$here/yamlload_check.c" "$root/core/format/yamlload.c" "$root/core/format/yamlscalar.c" \
    "$root/core/base/buf.c" "$root/core/base/b64.c" "$root/core/base/utf8.c" "$root/core/base/file.c" \
    $(pkg-config --cflags --libs yaml-0.1 jansson)
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$out" "${1:-/work/shared/fixtures/kubevirt}"
