#!/bin/sh
# Build core/yamlload.c with its checks under ASan/UBSan (LSan included) and
# run them against the KubeVirt fixtures.
#   core/tests/run-yamlload-check.sh [FIXTURES_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
core=$(dirname "$here")
out=${TMPDIR:-/tmp}/yamlload_check.$$
trap 'rm -f "$out"' EXIT INT TERM
gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -fsanitize=address,undefined \
    -fno-sanitize-recover=all \
    -o "$out" "$here/yamlload_check.c" "$core/yamlload.c" \
    $(pkg-config --cflags --libs yaml-0.1 jansson)
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$out" "${1:-/work/shared/fixtures/kubevirt}"
