#!/bin/sh
# Build the binder's state machine (core/binder/binder_*.c over index.c) with
# its rule checks (spec/core/binder_rules_check.c) under ASan/UBSan (LSan
# included) and run them.
#   spec/core/run-binder-rules-check.sh [STEPS [SEED]]   (the random run; default 20000 steps, seed 12)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/run-san-check.sh" "" "$here/binder_rules_check.c" binder/index.c binder/index_nodes.c binder/index_query.c \
    binder/binder_store.c binder/binder_queue.c binder/binder_choose.c binder/binder_pass.c binder/binder_lazy.c binder/binder_held.c binder/binder_verify.c \
    base/result.c -- "$@"
