#!/bin/sh
# bench/engine-instructions.sh — instructions per review of the server's
# engine path (the body parsed, checked, reviewed in its webhook's phase,
# answered and written out; no TLS, HTTP or threads), counted by valgrind
# --tool=callgrind: the same count whatever else the machine does, so a
# regression shows as a number, not as noise. Prints the count per review
# beside the committed baseline (bench/engine-instructions.baseline) and
# the ratio; the target is at least 2x fewer than the baseline.
#
#   bench/engine-instructions.sh ENGINE_BENCH [REVIEWS]     (make bench runs it)
#   bench/engine-instructions.sh --record ENGINE_BENCH      write the baseline anew
#
# The baseline is recorded with the examples (examples/classes,
# examples/cluster, examples/reviews) and the default policies; it says
# the commit it was counted at. A change that makes reviews cheaper on
# purpose keeps the old baseline (the target is against it); record anew
# only when the mix of reviews itself changes.
set -eu
record=
if [ "${1:-}" = --record ]; then record=1; shift; fi
bench=${1:?usage: bench/engine-instructions.sh [--record] ENGINE_BENCH [REVIEWS]}
reviews=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
bench=$(cd "$(dirname "$bench")" && pwd)/$(basename "$bench")
case $reviews in "" | /*) ;; *) reviews=$(pwd)/$reviews ;; esac
cd "$here/.." # the examples' cluster is read from the repository root
reviews=${reviews:-examples/reviews}
baseline=$here/engine-instructions.baseline
command -v valgrind >/dev/null || { echo "engine-instructions: valgrind is not installed (make deps)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rounds=20
valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$dir/cg" \
    "$bench" --instructions --rounds "$rounds" --cluster examples/classes --cluster examples/cluster "$reviews" \
    >"$dir/out" 2>"$dir/err" || {
    echo "engine-instructions: the bench failed under callgrind:" >&2
    tail -20 "$dir/err" >&2
    exit 2
}
ir=$(awk '/^summary: / { print $2 }' "$dir/cg")
n=$(awk '/^reviews / { print $2 }' "$dir/out")
bytes=$(awk '/^answer-bytes / { print $2 }' "$dir/out")
hash=$(awk '/^answers-fnv1a / { print $2 }' "$dir/out")
[ -n "$ir" ] && [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "engine-instructions: no count" >&2; exit 2; }
per=$((ir / n))
if [ -n "$record" ]; then
    rev=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
    {
        echo "# instructions per review of the engine path (bench/engine-instructions.sh --record)"
        echo "# counted at commit $rev, $(date -u +%Y-%m-%d), valgrind $(valgrind --version | sed 's/^valgrind-//')"
        echo "instructions_per_review $per"
        echo "answer_bytes_per_round $((bytes / rounds))"
        echo "answers_fnv1a $hash"
    } >"$baseline"
    echo "engine-instructions: recorded $per instructions per review in $baseline"
    exit 0
fi
base=$(awk '/^instructions_per_review / { print $2 }' "$baseline" 2>/dev/null || true)
echo "the engine path, instructions per review (callgrind, $n reviews: $rounds rounds of $reviews in the server's mix):"
if [ -z "$base" ]; then
    echo "  now $per (no baseline: bench/engine-instructions.sh --record)"
    exit 0
fi
echo "  now $per; baseline $base ($(sed -n 's/^# counted at //p' "$baseline")); baseline / now $(awk -v b="$base" -v p="$per" 'BEGIN { printf "%.2f", b / p }')"
ahash=$(awk '/^answers_fnv1a / { print $2 }' "$baseline")
if [ "$ahash" = "$hash" ]; then
    echo "  the answers are the baseline's (FNV-1a $hash over a round, keys sorted)"
else
    echo "  the answers DIFFER from the baseline's (FNV-1a $hash, baseline $ahash): the figures compare other work"
fi
awk -v b="$base" -v p="$per" 'BEGIN { printf "target, at least 2x fewer instructions per review than the baseline: %s\n", (b >= 2 * p) ? "met" : "NOT MET" }'
