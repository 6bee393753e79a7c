#!/bin/sh
# Build the kube client / watch test driver (core/tests/kube_check.c).
#   core/tests/run-kube-check.sh [OUT]      default OUT: build/bin/kube_check
#   SAN=1 core/tests/run-kube-check.sh ...  build with ASan+UBSan
# Then run its pure checks: OUT selftest.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
core=$(dirname "$here")
out=${1:-$(dirname "$core")/build/bin/kube_check}
mkdir -p "$(dirname "$out")"
san=""
[ "${SAN:-0}" = 1 ] && san="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
gcc -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -g -O1 $san \
    -o "$out" "$here/kube_check.c" "$core/kube.c" "$core/kubeconfig.c" "$core/watch.c" \
    "$core/log.c" "$core/yamlload.c" "$core/result.c" \
    $(pkg-config --cflags --libs libcurl jansson yaml-0.1) -lpthread
"$out" selftest
