#!/bin/sh
# Build the kube client / watch test driver (spec/kube/kube_check.c) by hand;
# `make` builds the same as build/bin/kube_check.
#   spec/kube/run-kube-check.sh [OUT]      default OUT: build/bin/kube_check
#   SAN=1 spec/kube/run-kube-check.sh ...  build with ASan+UBSan
# Then run its pure checks: OUT selftest.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
core=$root/core
out=${1:-$root/build/bin/kube_check}
mkdir -p "$(dirname "$out")"
san=""
[ "${SAN:-0}" = 1 ] && san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -O1 $san -I"$core" \
    -o "$out" "$here/kube_check.c" "$core/kube/kube.c" "$core/kube/kubeconfig.c" "$core/kube/watch.c" \
    "$core/kube/watch_stream.c" \
    "$core/base/log.c" "$core/format/yamlload.c" "$core/format/yamlescape.c" "$core/format/yamlscalar.c" "$core/base/result.c" \
    "$core/base/buf.c" "$core/base/b64.c" "$core/base/utf8.c" "$core/base/file.c" \
    $(pkg-config --cflags --libs libcurl jansson yaml-0.1) -lpthread
"$out" selftest
