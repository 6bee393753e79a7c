#!/bin/sh
# bench/binder-growth.sh — how the binder's state machine grows, counted in
# instructions (valgrind --tool=callgrind: the same count whatever else the
# machine does, and blind to cache misses, so it shows the algorithm's
# growth where `make bench-binder`'s times show the machine's).
#
# Runs cozygpu-binder-bench --instructions under callgrind: one build per
# size (1k claims on 100 nodes, 10k on 1k, 100k on 10k), each phase in its
# own dump (load: classes, nodes, claims and VMs given; first-reconcile:
# every set placed; vmis-attached: the reconcile after half the placed
# sets' VMIs start). Prints instructions per claim and the exponent k of
# n^k between sizes beside the one n log n has, and whether every phase
# grows no worse than n log n (exit 1 when not). Takes about a minute.
#
#   bench/binder-growth.sh BENCH_BINARY [--seed N]
set -eu
bench=${1:?usage: bench/binder-growth.sh BENCH_BINARY [--seed N]}
shift
command -v valgrind >/dev/null || { echo "binder-growth: valgrind is not installed (make deps)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$dir/cg.%p" \
    "$bench" --instructions --state-events 2 "$@" >"$dir/out" 2>"$dir/err" || {
    echo "binder-growth: the bench failed under callgrind:" >&2
    tail -20 "$dir/err" >&2
    exit 2
}
# each dump: "desc: Trigger: Client Request: <phase> <claims>" and "summary: <Ir>"
for f in "$dir"/cg.*; do
    awk '/^desc: Trigger: Client Request: / { sub(/^desc: Trigger: Client Request: /, ""); name = $0 }
         /^(summary|totals): / { ir = $2 }
         END { if (name != "") print name, ir }' "$f"
done | sort -k1,1 -k2,2n >"$dir/counts"
[ -s "$dir/counts" ] || { echo "binder-growth: callgrind wrote no phase counts" >&2; exit 2; }
awk '
function nlogn_exp(a, b) { return log((b * log(b)) / (a * log(a))) / log(b / a) }
{ ir[$1, $2] = $3; if (!($2 in seen)) { seen[$2] = 1; sizes[++ns] = $2 }; if (!($1 in ph)) { ph[$1] = 1; phases[++np] = $1 } }
END {
    # sizes in order
    for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++) if (sizes[j] + 0 < sizes[i] + 0) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
    printf "the binder state machine, instructions per claim (callgrind; one build per size):\n"
    for (p = 1; p <= np; p++) {
        printf "  %-16s", phases[p]
        for (i = 1; i <= ns; i++) printf " %7d claims %8.0f", sizes[i], ir[phases[p], sizes[i]] / sizes[i]
        printf "\n"
    }
    ok = 1
    printf "growth, the exponent k of n^k between sizes (n log n beside it):\n"
    for (i = 2; i <= ns; i++) {
        a = sizes[i - 1]; b = sizes[i]; ref = nlogn_exp(a, b)
        printf "  %7d -> %7d claims (n log n: %.2f):", a, b, ref
        for (p = 1; p <= np; p++) {
            x = ir[phases[p], a]; y = ir[phases[p], b]
            k = (x > 0 && y > 0) ? log(y / x) / log(b / a) : 0
            if (k > ref) ok = 0
            printf " %s %.2f", phases[p], k
        }
        printf "\n"
    }
    printf "target, every phase grows no worse than n log n in instructions: %s\n", ok ? "met" : "NOT MET"
    exit ok ? 0 : 1
}' "$dir/counts"
