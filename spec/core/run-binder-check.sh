#!/bin/sh
# Build the binder's index (core/binder/index.c, index_nodes.c, index_query.c) with its checks
# (spec/core/binder_check.c) under ASan/UBSan (LSan included) and run them.
#   spec/core/run-binder-check.sh [STEPS [SEED]]   (the random run; default 20000 steps)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/run-san-check.sh" "" "$here/binder_check.c" binder/index.c binder/index_nodes.c binder/index_query.c base/result.c -- "$@"
