#!/bin/sh
# bench/bench.sh — admission webhook benchmark: the target (the controller,
# or a stand-in) beside a bare libmicrohttpd TLS server with a fixed answer
# (the transport limit), under the same load from the same client, from one
# command. Prints medians over --runs repetitions (the machine is shared and
# noisy: single runs mislead).
#
#   bench/bench.sh --target-cmd 'CMD' [options]     start the target ourselves
#   bench/bench.sh --target-url URL --target-ca F   a target already running
#
# CMD is run through sh after substituting {cert} {key} {ca} {port_file}; it
# must serve HTTPS with that pair and write its port to {port_file} (as the
# controller's --port 0 --port-file do). The reviews are posted to
# https://127.0.0.1:PORT{path}.
#
# Options:
#   --path P          webhook path on the target (default /validate)
#   --route K=P       path per request kind (repeatable; passed to the load tool)
#   --reviews D       files or directory of recorded reviews (default examples/reviews)
#   --runs N          repetitions (default 5)
#   --concurrency C   closed-loop concurrency (default 8)
#   --rate R          open-loop rate, reviews/s (default 1000; 0 skips it)
#   --duration S      measured seconds per run (default 5), after 1 s warm-up
#   --workers N       bare server threads (default 4; give the target the same)
#   --hostile F       a review that holds a review thread until its deadline
#                     (the target's bundle must make it so; see
#                     bench/hostile/): each run also measures the fixed rate
#                     while F is sent back to back (cozygpu-load --hostile),
#                     so one review thread is always stuck
#
# Targets: p99 under 2 ms at 1,000 reviews/s; at saturation at least half
# the transport limit's throughput; the server's own CPU per review (from
# /proc/PID/stat, the controller's pid from {port_file}.pid when the
# command writes one) at most 3x the bare server's per request, each
# ratio taken per pair of adjacent runs and its median and range printed. Decision 0017: with one review
# thread stuck, the fixed-rate p99 within 2x of the unloaded one.
set -eu

BUILD=${BUILD:-build}
LOAD=$BUILD/bin/cozygpu-load
BARE=$BUILD/bin/cozygpu-bare
target_cmd= target_url= target_ca= path=/validate reviews=examples/reviews
runs=5 conc=8 rate=1000 duration=5 workers=4 routes= hostile=
while [ $# -gt 0 ]; do
    case $1 in
    --target-cmd) target_cmd=$2; shift 2 ;;
    --target-url) target_url=$2; shift 2 ;;
    --target-ca) target_ca=$2; shift 2 ;;
    --path) path=$2; shift 2 ;;
    --route) routes="$routes --route $2"; shift 2 ;;
    --reviews) reviews=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --hostile) hostile=$2; shift 2 ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$target_cmd" ] || [ -n "$target_url" ] || { echo "bench.sh: --target-cmd or --target-url is required" >&2; exit 2; }
for b in "$LOAD" "$BARE"; do
    [ -x "$b" ] || { echo "bench.sh: $b is missing (make bench-tools)" >&2; exit 2; }
done

tmp=$(mktemp -d)
bare_pid= target_pid=
cleanup() {
    [ -n "$bare_pid" ] && kill "$bare_pid" 2>/dev/null || true
    [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# one CA and a server certificate for 127.0.0.1 (ECDSA P-256, as cert-manager issues by default for webhooks here)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=bench-ca \
    -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=bench \
    -keyout "$tmp/tls.key" -out "$tmp/tls.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$tmp/ext"
openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial -days 1 \
    -extfile "$tmp/ext" -out "$tmp/tls.crt" 2>/dev/null

wait_port() { # file pid name
    i=0
    while [ ! -s "$1" ]; do
        kill -0 "$2" 2>/dev/null || { echo "bench.sh: $3 exited before listening; its log:" >&2; cat "$tmp/$3.log" >&2; exit 1; }
        i=$((i + 1)); [ $i -lt 200 ] || { echo "bench.sh: $3 did not start" >&2; exit 1; }
        sleep 0.05
    done
    tr -dc 0-9 <"$1"
}

"$BARE" --cert "$tmp/tls.crt" --key "$tmp/tls.key" --port 0 --port-file "$tmp/bare.port" --workers "$workers" \
    >"$tmp/bare.log" 2>&1 &
bare_pid=$!
bare_url=https://127.0.0.1:$(wait_port "$tmp/bare.port" "$bare_pid" bare)$path

if [ -n "$target_cmd" ]; then
    cmd=$(printf '%s' "$target_cmd" | sed -e "s|{cert}|$tmp/tls.crt|g" -e "s|{key}|$tmp/tls.key|g" \
        -e "s|{ca}|$tmp/ca.crt|g" -e "s|{port_file}|$tmp/target.port|g")
    sh -c "exec $cmd" >"$tmp/target.log" 2>&1 &
    target_pid=$!
    target_url=https://127.0.0.1:$(wait_port "$tmp/target.port" "$target_pid" target)$path
    target_ca=$tmp/ca.crt
fi
[ -n "$target_ca" ] || { echo "bench.sh: --target-ca is required with --target-url" >&2; exit 2; }

echo "bench: $(nproc) CPUs, $runs runs x ${duration}s (+1s warm-up), reviews from $reviews"
echo "bench: target $target_url${target_cmd:+ ($(printf '%s' "$target_cmd" | cut -c1-80))}"
echo "bench: bare   $bare_url ($workers workers)"

results=$tmp/results
: >"$results"
# user + system CPU time of process $1 in clock ticks (/proc/PID/stat
# fields 14 and 15, counted after the parenthesised command name)
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12 + $13 }'; }
hz=$(getconf CLK_TCK)
# the server process a label measures: the target's (the controller's own
# pid when its command wrote one beside the port file) or the bare one's
server_pid() {
    case $1 in
    bare-*) echo "$bare_pid" ;;
    *) if [ -s "$tmp/target.port.pid" ]; then cat "$tmp/target.port.pid"; else echo "$target_pid"; fi ;;
    esac
}
run_load() { # label url ca mode-args...
    label=$1 url=$2 ca=$3; shift 3
    spid=$(server_pid "$label")
    c0=$(cpu_ticks "$spid")
    # shellcheck disable=SC2086
    line=$("$LOAD" --url "$url" --cacert "$ca" --duration "$duration" --warmup 1 --label "$label" $routes "$@" \
        "$reviews" 2>>"$tmp/load.log" | grep '^RESULT' || true)
    c1=$(cpu_ticks "$spid")
    [ -n "$line" ] || return 0
    # the server's CPU per request, in microseconds: its CPU time over the
    # whole run (warm-up second included) over the requests of the whole
    # run, taken as the measured ones scaled by (duration + 1) / duration
    # at the same pace (the load tool counts only the measured ones)
    n=$(printf '%s' "$line" | sed -n 's/.* n=\([0-9]*\).*/\1/p')
    cpu_us=$(awk -v a="${c0:-0}" -v b="${c1:-0}" -v hz="$hz" -v n="${n:-0}" -v d="$duration" \
        'BEGIN { if (n > 0 && b > a) printf "%.1f", (b - a) / hz * 1e6 / (n * (d + 1) / d); else print "nan" }')
    printf '%s cpu_us=%s\n' "$line" "$cpu_us" >>"$results"
}
# scheme, host and port of the target
target_base() { printf '%s' "$target_url" | sed 's|^\(https*://[^/]*\).*|\1|'; }
# the target's review threads running a review (its /metrics)
busy_threads() {
    curl -sS --max-time 5 --cacert "$target_ca" "$(target_base)/metrics" 2>/dev/null |
        sed -n 's/^cozygpu_webhook_review_threads_busy \([0-9]*\).*/\1/p'
}
# the fixed rate while the hostile review keeps one review thread stuck:
# the load tool sends it back to back on one more handle, over the same
# connection pool as the counted reviews (as the API server does)
run_stuck() {
    run_load target-stuck "$target_url" "$target_ca" --rate "$rate" --hostile "$hostile"
    i=0 # the last hostile review ends (at its deadline) before the next measurement
    while [ "$(busy_threads)" != 0 ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
}
r=1
while [ "$r" -le "$runs" ]; do
    # alternate the order so drift on the machine hits both sides alike
    if [ $((r % 2)) -eq 1 ]; then
        run_load target-sat "$target_url" "$target_ca" --concurrency "$conc"
        run_load bare-sat "$bare_url" "$tmp/ca.crt" --concurrency "$conc"
    else
        run_load bare-sat "$bare_url" "$tmp/ca.crt" --concurrency "$conc"
        run_load target-sat "$target_url" "$target_ca" --concurrency "$conc"
    fi
    if [ "$rate" != 0 ]; then
        run_load target-rate "$target_url" "$target_ca" --rate "$rate"
        run_load bare-rate "$bare_url" "$tmp/ca.crt" --rate "$rate"
        [ -z "$hostile" ] || run_stuck
    fi
    printf 'bench: run %s/%s done\n' "$r" "$runs" >&2
    r=$((r + 1))
done

if grep -q 'errors=[1-9]' "$results"; then
    echo "bench: some requests failed (non-200 or transport errors):"
    grep 'errors=[1-9]' "$results"
    head -5 "$tmp/load.log"
fi

# medians per label and field
median() { # label field
    grep "label=$1 " "$results" | sed -n "s/.* $2=\([0-9.naif-]*\).*/\1/p" | sort -g |
        awk '{v[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print v[(NR+1)/2]; else printf "%.3f\n", (v[NR/2]+v[NR/2+1])/2}'
}
ts_rps=$(median target-sat rps) ts_p50=$(median target-sat p50_ms) ts_p99=$(median target-sat p99_ms)
bs_rps=$(median bare-sat rps) bs_p50=$(median bare-sat p50_ms) bs_p99=$(median bare-sat p99_ms)
echo
printf 'saturation, %s concurrent keep-alive connections (medians of %s runs)\n' "$conc" "$runs"
printf '  %-28s %10s %10s %12s\n' "" "p50 ms" "p99 ms" "reviews/s"
printf '  %-28s %10s %10s %12s\n' "target" "$ts_p50" "$ts_p99" "$ts_rps"
printf '  %-28s %10s %10s %12s\n' "bare MHD TLS (transport)" "$bs_p50" "$bs_p99" "$bs_rps"
ratio=$(awk -v a="$ts_rps" -v b="$bs_rps" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }')
printf '  %-28s %10s %10s %12s\n' "target / bare" \
    "$(awk -v a="$ts_p50" -v b="$bs_p50" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }')" \
    "$(awk -v a="$ts_p99" -v b="$bs_p99" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }')" "$ratio"
verdict_sat=$(awk -v r="$ratio" 'BEGIN { print (r + 0 >= 0.5) ? "PASS" : "FAIL" }')
# per run (a target run and the bare run beside it): the throughput ratio
# and the server CPU per review, target over bare; median and range
pairs() { # field
    awk -v f="$1" '
        function val(line,   m) { if (match(line, " " f "=[0-9.]+")) return substr(line, RSTART + length(f) + 2, RLENGTH - length(f) - 2); return "" }
        / label=target-sat / { t[++nt] = val($0) }
        / label=bare-sat / { b[++nb] = val($0) }
        END {
            n = 0
            for (i = 1; i <= nt && i <= nb; i++) if (t[i] != "" && b[i] != "" && b[i] + 0 > 0) r[++n] = t[i] / b[i]
            if (n == 0) { print "nan nan nan"; exit }
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { x = r[i]; r[i] = r[j]; r[j] = x }
            med = (n % 2) ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
            printf "%.2f %.2f %.2f\n", med, r[1], r[n]
        }' "$results"
}
set -- $(pairs rps)
sat_med=$1 sat_lo=$2 sat_hi=$3
set -- $(pairs cpu_us)
cpu_med=$1 cpu_lo=$2 cpu_hi=$3
tc_us=$(median target-sat cpu_us) bc_us=$(median bare-sat cpu_us)
echo
printf 'server CPU per review at saturation, from each server process'"'"'s own CPU time (/proc; medians of %s runs)\n' "$runs"
printf '  %-28s %10s us\n' "target" "$tc_us" "bare MHD TLS (transport)" "$bc_us"
printf '  target / bare, per pair of runs: median %s (range %s to %s); throughput target / bare per pair: median %s (range %s to %s)\n' \
    "$cpu_med" "$cpu_lo" "$cpu_hi" "$sat_med" "$sat_lo" "$sat_hi"
# the load client's own CPU (cores it used in the measured window): near
# one core (it is single-threaded) means the client, not the server, set
# the saturation figure; it shares the machine's CPUs with the server
printf '  load client CPU at saturation (cores it used; it is single-threaded, on the same %s CPUs): target runs %s, bare runs %s\n' \
    "$(nproc)" "$(median target-sat client_cores)" "$(median bare-sat client_cores)"
verdict_cpu=$(awk -v r="$cpu_med" 'BEGIN { print (r + 0 > 0 && r + 0 <= 3) ? "PASS" : "FAIL" }')
if [ "$rate" != 0 ]; then
    tr_p50=$(median target-rate p50_ms) tr_p99=$(median target-rate p99_ms) tr_rps=$(median target-rate rps)
    br_p50=$(median bare-rate p50_ms) br_p99=$(median bare-rate p99_ms) br_rps=$(median bare-rate rps)
    echo
    printf 'fixed rate %s reviews/s, open loop, latency from the scheduled send (medians of %s runs)\n' "$rate" "$runs"
    printf '  %-28s %10s %10s %12s\n' "" "p50 ms" "p99 ms" "reviews/s"
    printf '  %-28s %10s %10s %12s\n' "target" "$tr_p50" "$tr_p99" "$tr_rps"
    printf '  %-28s %10s %10s %12s\n' "bare MHD TLS (transport)" "$br_p50" "$br_p99" "$br_rps"
    verdict_rate=$(awk -v p="$tr_p99" 'BEGIN { print (p + 0 > 0 && p + 0 < 2) ? "PASS" : "FAIL" }')
    if [ -n "$hostile" ]; then
        st_p50=$(median target-stuck p50_ms) st_p99=$(median target-stuck p99_ms) st_rps=$(median target-stuck rps)
        st_max=$(median target-stuck max_ms)
        stuck_ratio=$(awk -v a="$st_p99" -v b="$tr_p99" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }')
        echo
        printf 'fixed rate %s reviews/s with one review thread stuck on %s (medians of %s runs)\n' "$rate" \
            "$(basename "$hostile")" "$runs"
        printf '  %-28s %10s %10s %12s %10s\n' "" "p50 ms" "p99 ms" "reviews/s" "max ms"
        printf '  %-28s %10s %10s %12s %10s\n' "target, unloaded" "$tr_p50" "$tr_p99" "$tr_rps" \
            "$(median target-rate max_ms)"
        printf '  %-28s %10s %10s %12s %10s\n' "target, one thread stuck" "$st_p50" "$st_p99" "$st_rps" "$st_max"
        printf '  %-28s %10s %10s\n' "stuck / unloaded" \
            "$(awk -v a="$st_p50" -v b="$tr_p50" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }')" \
            "$stuck_ratio"
        verdict_stuck=$(awk -v r="$stuck_ratio" 'BEGIN { print (r + 0 > 0 && r + 0 <= 2) ? "PASS" : "FAIL" }')
    fi
    echo
    printf 'target p99 < 2 ms at %s reviews/s: %s (%s ms)\n' "$rate" "$verdict_rate" "$tr_p99"
    [ -z "$hostile" ] ||
        printf 'p99 with one review thread stuck <= 2 x unloaded p99: %s (%s)\n' "$verdict_stuck" "$stuck_ratio"
fi
printf 'target throughput >= 0.5 x transport limit: %s (%s)\n' "$verdict_sat" "$ratio"
printf 'server CPU per review <= 3 x the bare server'"'"'s per request: %s (%s)\n' "$verdict_cpu" "$cpu_med"
echo "per-run figures:"
sed 's/^RESULT /  /' "$results"
