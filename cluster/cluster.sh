#!/usr/bin/env bash
# cluster/cluster.sh — a local Kubernetes control plane on loopback, built
# from Kubernetes' own Go modules (cluster/cluster.mk, `make cluster-bins`).
#
#   cluster/cluster.sh up DIR      start etcd, kube-apiserver, (the CRDs
#                                  in $COZYGPU_CLUSTER_CRDS),
#                                  kube-controller-manager, kube-scheduler;
#                                  state, logs and DIR/admin.kubeconfig in DIR
#   cluster/cluster.sh down DIR    stop what `up DIR` started (idempotent)
#   cluster/cluster.sh status DIR  0 while the API server answers /readyz
#   cluster/cluster.sh user DIR NAME [GROUP...]
#                                  DIR/NAME.kubeconfig: user NAME in GROUPs,
#                                  by a client certificate of the cluster CA
#
# Environment: COZYGPU_CLUSTER_BIN (the directory holding the binaries;
# cluster.mk sets it), COZYGPU_CLUSTER_CRDS (CRDs applied before the
# controller manager starts), COZYGPU_CLUSTER_OWNER (a pid: everything is
# stopped once that process is gone). Everything listens on 127.0.0.1 only. No
# kubelet and no kube-proxy run: Nodes are objects a test creates (with
# allocatable and a Ready condition), kube-scheduler binds pods to them, and
# no container ever starts. The node-lifecycle controller runs (it takes
# the node.kubernetes.io/not-ready taint that admission puts on a new Node
# off once its Ready condition is True, and taints a Node whose Ready turns
# False or Unknown), with a heartbeat grace period of a day, so a Node
# without a kubelet is judged by the conditions a test writes, not by
# missing heartbeats. node-ipam (pod CIDRs) is off; garbage collection,
# namespace deletion, service accounts, taint eviction and the rest run as
# in any cluster.
#
# Authentication and authorization are real: client certificates signed
# by DIR/pki/ca.crt (the admin is in system:masters), ServiceAccount tokens
# signed with DIR/pki/sa.key (TokenRequest API), the Node and RBAC
# authorizers. `up` fails, stopping what it started, with the name of the
# component that did not come up and the end of its log; every wait has a
# deadline.
set -u -o pipefail

die() { echo "cluster: $*" >&2; exit 1; }

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: cluster/cluster.sh up|down|status|user DIR"

# --- down -------------------------------------------------------------------
# Stops every process recorded in DIR/pids (TERM, then KILL after 10 s),
# the last started first.
stop_all() {
    local pids=() p
    [ -f "$dir/pids" ] || return 0
    # not this shell: the owner watcher runs `down` in its own process
    while read -r name p; do [ "$p" = "$$" ] || pids+=("$p"); done < <(tac "$dir/pids")
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    local deadline=$((SECONDS + 10))
    for p in "${pids[@]}"; do
        while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    # a killed process is gone once the kernel has torn it down
    deadline=$((SECONDS + 5))
    for p in "${pids[@]}"; do
        while [ -e "/proc/$p" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$p/status" 2>/dev/null \
            && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    done
    rm -f "$dir/pids"
}

case "$cmd" in
down) stop_all; exit 0 ;;
status)
    [ -f "$dir/admin.kubeconfig" ] || exit 1
    port=$(cat "$dir/ports/apiserver" 2>/dev/null) || exit 1
    curl -sf --max-time 3 --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" \
        "https://127.0.0.1:$port/readyz" >/dev/null
    exit $? ;;
up|user) ;;
*) die "unknown command '$cmd' (up, down, status or user)" ;;
esac

[ -d "$dir" ] || [ "$cmd" = up ] || die "$dir: no such directory"
mkdir -p "$dir" && dir=$(cd "$dir" && pwd) || die "$dir: cannot create"
pki=$dir/pki
ossl() { openssl "$@" >>"$dir/logs/openssl.log" 2>&1 || die "openssl $1 failed (log: $dir/logs/openssl.log)"; }
# cert NAME SUBJECT EXT: a key and a certificate signed by the cluster CA
cert() {
    ossl ecparam -name prime256v1 -genkey -noout -out "$pki/$1.key"
    ossl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr"
    printf '%s\n' "$3" >"$pki/$1.ext"
    ossl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 \
        -extfile "$pki/$1.ext" -out "$pki/$1.crt"
}
client_ext="keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
# kubeconfig NAME USER: DIR/NAME.kubeconfig with USER's client certificate
kubeconfig() {
    cat >"$dir/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: local
  context: {cluster: local, user: $2}
current-context: local
EOF
}

if [ "$cmd" = user ]; then
    name=${3:-}
    [[ "$name" =~ ^[a-z0-9][a-z0-9.@-]*$ ]] || die "user: a user name (lower case, digits, . @ -) is needed"
    [ -f "$pki/ca.key" ] || die "$dir: no control plane there (cluster/cluster.sh up $dir first)"
    server="https://127.0.0.1:$(cat "$dir/ports/apiserver")"
    subj=""
    for g in "${@:4}"; do subj="$subj/O=$g"; done
    cert "user-$name" "$subj/CN=$name" "$client_ext"
    kubeconfig "$name" "user-$name"
    echo "$dir/$name.kubeconfig"
    exit 0
fi

bin=${COZYGPU_CLUSTER_BIN:-}
[ -n "$bin" ] || die "COZYGPU_CLUSTER_BIN is not set (run through make: make cluster-bins builds the binaries)"
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$bin/$b" ] || die "$bin/$b: missing (run make cluster-bins)"
done
command -v openssl >/dev/null || die "openssl is missing (make deps installs it)"
command -v curl >/dev/null || die "curl is missing (make deps installs it)"
[ -f "$dir/pids" ] && die "$dir: a control plane is recorded there already (cluster/cluster.sh down $dir first)"

mkdir -p "$dir/pki" "$dir/logs" "$dir/ports" || die "$dir: cannot create"
dir=$(cd "$dir" && pwd)
trap 'echo "cluster: interrupted; stopping what was started" >&2; stop_all; exit 1' INT TERM

# A loopback port nobody listens on (bash's /dev/tcp: a refused connect means
# free), drawn at random below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range), which outgoing connections and port-0
# listeners take from: a port checked free there could be taken by one
# before the component binds it. Parallel control planes (two spec runs)
# rarely collide; a collision fails `up` with the component's log, never
# silently.
ephemeral=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
[ -n "$ephemeral" ] && [ "$ephemeral" -gt 12000 ] || ephemeral=32768
taken=" "
free_port() {
    local p i
    for i in $(seq 1 200); do
        p=$((10000 + RANDOM % (ephemeral - 10000)))
        case "$taken" in *" $p "*) continue ;; esac
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then taken="$taken$p "; echo "$p"; return 0; fi
    done
    die "no free loopback port found"
}

# --- certificates ---------------------------------------------------------
ossl ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key"
ossl req -x509 -new -key "$pki/ca.key" -subj "/CN=cozygpu-test-cluster-ca" -days 30 -out "$pki/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
cert apiserver "/CN=kube-apiserver" "keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
cert admin "/O=system:masters/CN=cozygpu-test-admin" "$client_ext"
cert kube-controller-manager "/CN=system:kube-controller-manager" "$client_ext"
cert kube-scheduler "/CN=system:kube-scheduler" "$client_ext"
# the API server's client certificate towards webhooks is not needed: the
# webhooks authenticate the API server by nothing but TLS (as in-cluster)
ossl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key"
ossl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port)
echo "$api_port" >"$dir/ports/apiserver"
echo "$etcd_port" >"$dir/ports/etcd"
server="https://127.0.0.1:$api_port"

kubeconfig admin admin
kubeconfig kube-controller-manager kube-controller-manager
kubeconfig kube-scheduler kube-scheduler

# --- processes ------------------------------------------------------------
# start NAME ARGS...: runs $bin/NAME in its own session, output to
# DIR/logs/NAME.log, pid recorded in DIR/pids
start() {
    local name=$1; shift
    setsid "$bin/$name" "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
    echo "$name $!" >>"$dir/pids"
}
# failed NAME WHAT: stops everything, names the component and its log
failed() {
    echo "cluster: $1 $2; its log is $dir/logs/$1.log, which ends:" >&2
    tail -n 15 "$dir/logs/$1.log" >&2 2>/dev/null
    # klog's error and fatal lines (E1201 ..., F1201 ...), which a long
    # tail of flags at start-up can push out of sight
    if grep -qE '^[EF][0-9]{4} ' "$dir/logs/$1.log" 2>/dev/null; then
        echo "cluster: its last errors:" >&2
        grep -E '^[EF][0-9]{4} ' "$dir/logs/$1.log" | tail -n 10 >&2
    fi
    stop_all
    exit 1
}
alive() { local p; p=$(awk -v n="$1" '$1 == n {print $2}' "$dir/pids"); kill -0 "$p" 2>/dev/null; }
# wait_for NAME SECONDS CHECK...: polls CHECK every 0.2 s until it succeeds,
# NAME dies or the deadline passes
wait_for() {
    local name=$1 secs=$2; shift 2
    local deadline=$((SECONDS + secs))
    while [ $SECONDS -lt $deadline ]; do
        "$@" >/dev/null 2>&1 && return 0
        alive "$name" || failed "$name" "exited while starting"
        sleep 0.2
    done
    failed "$name" "did not become ready within ${secs}s (waited for: $*)"
}
curl_admin() { curl -sf --max-time 3 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$@"; }

start etcd --name default --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "default=http://127.0.0.1:$etcd_peer" \
    --unsafe-no-fsync --log-level warn
wait_for etcd 30 curl -sf --max-time 2 "http://127.0.0.1:$etcd_port/health"

# The API server's audit log (DIR/logs/audit.log, one JSON event per line):
# every request of cozygpu's ServiceAccounts and every write, at Metadata
# level (who, user agent, verb, object, status code, when), so a spec can
# check who wrote what, and that nothing of cozygpu's was forbidden, by the
# real server's own record.
cat >"$dir/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts:cozy-gpu", "system:serviceaccounts:cozy-gpu-agent"]
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
POLICY

# --endpoint-reconciler-type none: the Endpoints of the "kubernetes" Service
# would carry 127.0.0.1, which Endpoints validation refuses (no pod here
# talks to it: there is no kube-proxy).
start kube-apiserver \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-cluster-ip-range 10.96.0.0/16 --endpoint-reconciler-type none \
    --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/logs/audit.log" \
    --audit-log-format json --audit-log-maxbackup 0 \
    --allow-privileged=true --profiling=false --v=1
wait_for kube-apiserver 90 curl_admin "$server/readyz"

# CRDs first when asked (COZYGPU_CLUSTER_CRDS: files or folders), so the
# controller manager's garbage collector and quota controller know their
# kinds from the start instead of at their next discovery (every 30 s)
if [ -n "${COZYGPU_CLUSTER_CRDS:-}" ]; then
    for f in $COZYGPU_CLUSTER_CRDS; do
        "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" apply --server-side -f "$f" \
            >>"$dir/logs/crds.log" 2>&1 || failed crds "could not be applied ($f)"
    done
    "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" wait --for=condition=Established --timeout=60s crd --all \
        >>"$dir/logs/crds.log" 2>&1 || failed crds "were not established within 60s"
fi

start kube-controller-manager \
    --kubeconfig "$dir/kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --controllers '*,-node-ipam-controller' --node-monitor-grace-period 24h \
    --concurrent-gc-syncs 5 --v=1
# --secure-port 0: neither serves HTTPS (no port to collide with another
# control plane's; nothing here scrapes their metrics)
start kube-scheduler \
    --kubeconfig "$dir/kube-scheduler.kubeconfig" \
    --secure-port 0 --leader-elect=false --v=1

# ready: the default ServiceAccount of "default" exists (the controller
# manager's serviceaccount controller runs) and the scheduler answers
wait_for kube-controller-manager 60 curl_admin "$server/api/v1/namespaces/default/serviceaccounts/default"
alive kube-scheduler || failed kube-scheduler "exited while starting"

# COZYGPU_CLUSTER_OWNER=PID: the control plane lives no longer than that
# process (a spec run killed before its teardown leaves nothing running): a
# watcher polls it every second and runs `down` once it is gone.
if [ -n "${COZYGPU_CLUSTER_OWNER:-}" ]; then
    owner=$COZYGPU_CLUSTER_OWNER
    setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down "$3"' \
        cluster-owner-watch "$owner" "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" "$dir" \
        >/dev/null 2>&1 </dev/null &
    echo "owner-watch $!" >>"$dir/pids"
fi

cat >"$dir/env" <<EOF
KUBECONFIG=$dir/admin.kubeconfig
COZYGPU_CLUSTER_SERVER=$server
COZYGPU_CLUSTER_DIR=$dir
EOF
trap - INT TERM
echo "cluster: up at $server (kubeconfig $dir/admin.kubeconfig; logs in $dir/logs)"
