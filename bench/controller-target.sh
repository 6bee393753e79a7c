#!/bin/sh
# bench/controller-target.sh — the bench target: the API server double with
# the examples loaded (kubectl), and `cozygpu controller` against it.
#   bench/controller-target.sh CERT KEY PORT_FILE [controller flags...]
# Environment: BENCH_OVERRIDE=FILE.lua adds that rule to the bundle (as a
# key of the cozygpu-policies ConfigMap, as a hoster adds one);
# BENCH_CONFIG=FILE replaces examples/config.yaml.
# bench.sh starts it as --target-cmd and stops it with SIGTERM; the double
# goes with it. The controller's pid is written to PORT_FILE.pid (bench.sh
# measures the server's own CPU time per review from /proc). Runs from the repository root; BUILD picks the build dir.
set -eu
BUILD=${BUILD:-build}
cert=$1 key=$2 port_file=$3
shift 3
tmp=$(mktemp -d)
dpid= cpid=
cleanup() {
    [ -n "$cpid" ] && kill "$cpid" 2>/dev/null && wait "$cpid" 2>/dev/null
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 0' TERM INT

"$BUILD/bin/kube-double" --port 0 --port-file "$tmp/double.port" >"$tmp/double.log" 2>&1 &
dpid=$!
i=0
while [ ! -s "$tmp/double.port" ]; do
    i=$((i + 1)); [ $i -le 200 ] || { echo "controller-target: the double did not start" >&2; exit 1; }
    sleep 0.05
done
url=http://127.0.0.1:$(cat "$tmp/double.port")
k() { kubectl --cache-dir "$tmp/kube-cache" --server "$url" --request-timeout=10s "$@" >/dev/null; }
k apply -f deploy/crds -f examples/cluster/namespaces.yaml -f deploy/00-namespace.yaml
k apply -f examples/classes -f examples/cluster/kubevirt.yaml -f examples/cluster/quotas.yaml
if [ -n "${BENCH_OVERRIDE:-}" ]; then
    # (create, then apply: `kubectl create` would send protobuf, which the double does not read)
    kubectl create configmap cozygpu-policies -n cozy-gpu --dry-run=client -o yaml \
        --from-file="$(basename "$BENCH_OVERRIDE")=$BENCH_OVERRIDE" >"$tmp/override.yaml"
    k apply -f "$tmp/override.yaml"
fi

"$BUILD/bin/cozygpu" controller --server "$url" --namespace cozy-gpu --identity bench \
    --tls-cert-file "$cert" --tls-key-file "$key" --address 127.0.0.1 --port 0 --port-file "$port_file" \
    --config "${BENCH_CONFIG:-examples/config.yaml}" --state-dir "$tmp" --log-level warn "$@" &
cpid=$!
# the controller's pid beside its port file: bench.sh reads its CPU time
echo "$cpid" >"$port_file.pid"
wait "$cpid"
