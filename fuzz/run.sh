#!/usr/bin/env bash
# fuzz/run.sh TARGET BUILD SECONDS — runs one libFuzzer target for SECONDS
# over BUILD/corpus/TARGET (plus fuzz/regressions/TARGET, read only), and
# prints one TAP line with libFuzzer's final statistics: total execs and
# execs per second. Fails (exit 1, "not ok") on a crash, leak, timeout,
# out-of-memory or any sanitizer report; the log is BUILD/logs/TARGET.log,
# the reproducer BUILD/artifacts/TARGET/.
set -u -o pipefail
t=$1 build=$2 secs=$3
bin=$build/bin/$t
log=$build/logs/$t.log
art=$build/artifacts/$t/
mkdir -p "$build/logs" "$art" "$build/corpus/$t"
[ -x "$bin" ] || { echo "not ok - fuzz $t: $bin missing (make fuzz-build)"; exit 1; }
dirs=("$build/corpus/$t")
# the harnesses write their temporary files (a settings file, a kubeconfig,
# a sysfs tree per input) under $TMPDIR: a tmpfs when there is one
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
[ -d "fuzz/regressions/$t" ] && dirs+=("fuzz/regressions/$t")

ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
"$bin" -max_total_time="$secs" -print_final_stats=1 -timeout=25 -rss_limit_mb=2048 \
  -artifact_prefix="$art" "${dirs[@]}" >"$log" 2>&1
rc=$?

stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
execs=$(stat number_of_executed_units)
rate=$(stat average_exec_per_sec)
units=$(stat new_units_added)
rss=$(stat peak_rss_mb)
corpus=$(ls "$build/corpus/$t" | wc -l)
summary="$t: ${execs:-?} execs, ${rate:-?} execs/s (${secs} s; ${units:-?} new units, corpus ${corpus}, peak RSS ${rss:-?} MB)"
bad=$(grep -E -m1 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|==[0-9]+==ERROR|deadly signal|check failed' "$log")
if [ "$rc" -ne 0 ] || [ -n "$bad" ] || [ -z "$execs" ]; then
  echo "# $t: exit $rc; log $log; reproducer in $art"
  grep -E -A40 -m1 'ERROR: |runtime error:|deadly signal|check failed' "$log" | head -60 | sed 's/^/#   /'
  echo "not ok - fuzz $summary"
  exit 1
fi
echo "ok - fuzz $summary"
