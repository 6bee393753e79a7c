#!/usr/bin/env bash
# Runs spec suites as busted processes at once (make test, make
# test-asan): the specs that need no cluster (mostly CPU) beside, unless
# COZYGPU_CLUSTER_SPECS=0, the cluster specs (spec/cluster: real control
# planes, mostly waiting on them) in two groups of files balanced by size.
# On two cores they overlap well; one after the other they would take
# their sum.
#
#   spec/support/run-suites.sh SCRATCH BUSTED...
#
# SCRATCH: a directory for the specs' temporary files (each process gets
# its own below it) and the cluster groups' TAP. The other specs' TAP goes
# to stdout as it comes; each cluster group's follows when all are done, so
# each stream stays whole. Exit status: 0 when every process passed.
set -u
scratch=$1
shift
rm -rf "$scratch" && mkdir -p "$scratch/local" || exit 2
local_dirs=()
for d in spec/*/; do
    d=${d%/}
    [ "$d" = spec/cluster ] || [ "$d" = spec/support ] || local_dirs+=("$d")
done
pids=()
if [ "${COZYGPU_CLUSTER_SPECS:-1}" != 0 ]; then
    # greedy: the largest file to the group with fewer bytes so far
    g0=() g1=() s0=0 s1=0
    while read -r size f; do
        if [ "$s0" -le "$s1" ]; then g0+=("$f"); s0=$((s0 + size)); else g1+=("$f"); s1=$((s1 + size)); fi
    done < <(wc -c spec/cluster/*_spec.lua | grep -v ' total$' | sort -rn)
    for g in 0 1; do
        eval "files=(\"\${g$g[@]}\")"
        [ "${#files[@]}" -gt 0 ] || continue
        mkdir -p "$scratch/cluster$g"
        COZYGPU_SCRATCH="$scratch/cluster$g" "$@" --output=TAP "${files[@]}" >"$scratch/cluster$g.tap" 2>&1 &
        pids+=("$g:$!")
    done
fi
COZYGPU_SCRATCH="$scratch/local" "$@" --output=TAP "${local_dirs[@]}"
st=$?
for p in "${pids[@]}"; do
    g=${p%%:*}
    wait "${p#*:}" || st=1
    echo "# spec/cluster, group $g (run beside the others):"
    cat "$scratch/cluster$g.tap"
done
rm -rf "$scratch"
exit "$st"
