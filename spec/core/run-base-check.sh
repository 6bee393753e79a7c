#!/bin/sh
# Build the base helpers (core/base/b64.c, utf8.c, buf.c, file.c, log.c) with their
# checks (spec/core/base_check.c) under ASan/UBSan (LSan included) and run them.
#   spec/core/run-base-check.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/run-san-check.sh" "" "$here/base_check.c" base/b64.c base/utf8.c base/buf.c base/file.c base/log.c base/cpus.c
