#!/bin/sh
# Build a table-driven C check with the core sources it tests under ASan/UBSan
# (LSan included) and run it; its exit status is the check's.
#   spec/core/run-san-check.sh "PKG-CONFIG PACKAGES" CHECK.c CORE_SOURCE... [-- ARGS...]
# CORE_SOURCE paths are relative to core/ (e.g. base/b64.c). SAN_CFLAGS, when
# set, adds compiler flags (defines a source needs).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
pkgs=$1
check=$2
shift 2
srcs=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    srcs="$srcs $root/core/$1"
    shift
done
[ $# -gt 0 ] && shift
out=${TMPDIR:-/tmp}/$(basename "$check" .c).$$
trap 'rm -f "$out"' EXIT INT TERM
# shellcheck disable=SC2086 # the source list and pkg-config's flags split on purpose
gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -fsanitize=address,undefined \
    -fno-sanitize-recover=all -I"$root/core" ${SAN_CFLAGS:-} -o "$out" "$check" $srcs \
    ${pkgs:+$(pkg-config --cflags --libs $pkgs)} -lpthread -lm
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "$out" "$@"
