#!/usr/bin/env bash
# Runs the spec suite as two busted processes at once (make test, make
# test-asan): the cluster specs (spec/cluster: real control planes, mostly
# waiting on them) and everything else (mostly CPU). On two cores the two
# overlap well; one after the other they would take their sum.
#
#   spec/support/run-suites.sh SCRATCH BUSTED...
#
# SCRATCH: a directory for the specs' temporary files (each process gets
# its own below it) and the cluster run's TAP. The other specs' TAP goes to
# stdout as it comes; the cluster specs' follows when both are done, so
# each stream stays whole. Exit status: 0 when both passed.
set -u
scratch=$1
shift
rm -rf "$scratch" && mkdir -p "$scratch/local" "$scratch/cluster" || exit 2
local_dirs=()
for d in spec/*/; do
    d=${d%/}
    [ "$d" = spec/cluster ] || [ "$d" = spec/support ] || local_dirs+=("$d")
done
COZYGPU_SCRATCH="$scratch/cluster" "$@" --output=TAP spec/cluster >"$scratch/cluster.tap" 2>&1 &
cluster=$!
COZYGPU_SCRATCH="$scratch/local" "$@" --output=TAP "${local_dirs[@]}"
st_local=$?
wait "$cluster"
st_cluster=$?
echo "# spec/cluster (run beside the others):"
cat "$scratch/cluster.tap"
rm -rf "$scratch"
[ "$st_local" -eq 0 ] && [ "$st_cluster" -eq 0 ]
