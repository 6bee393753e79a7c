#!/bin/sh
# Build core/format/yamlload.c (with yamlscalar.c and the base helpers) with its checks
# (spec/core/yamlload_check.c) under ASan/UBSan (LSan included) and run them
# against the KubeVirt fixtures.
#   spec/core/run-yamlload-check.sh [FIXTURES_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/run-san-check.sh" "yaml-0.1 jansson" "$here/yamlload_check.c" \
    format/yamlload.c format/yamlescape.c format/yamlscalar.c base/buf.c base/b64.c base/utf8.c base/file.c \
    -- "${1:-/work/shared/fixtures/kubevirt}"
