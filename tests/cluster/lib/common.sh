# shellcheck shell=bash disable=SC2034 # the settings here are read by the scripts that source it
# Sourced by tests/cluster/cluster.sh: the lab cluster's layout (addresses, nodes, folders) and
# helpers to start and stop its processes.

# Where the cluster keeps its state (certificates, etcd, containerd and kubelet folders, logs)
# and its runtime files (sockets, pids); outside the work tree, removed by `down`.
CLUSTER_DIR="${SPLITPROXY_CLUSTER_DIR:-/var/lib/splitproxy-cluster}"
RUN_DIR=/run/splitproxy-cluster

# The lab LAN (a bridge in its own network namespace) and the host's address on it: the host
# reaches the API server and the nodes, and nothing in the lab routes beyond it.
LAN_PREFIX=198.19.0
HOST_IP=$LAN_PREFIX.1
# The LAN's gateway: the bridge's own address in its namespace, which forwards nothing. Nodes
# route through it so that connect() finds a route for Service IPs (rules rewrite them after).
GATEWAY_IP=$LAN_PREFIX.254
NETNS_PREFIX=spc-
LAN_NETNS=${NETNS_PREFIX}lan

# Nodes: name, LAN address, pod CIDR, role, zone. Two control-plane nodes (tainted, as kubeadm's)
# hold the control plane and the splitproxy controller's two replicas; workers (two unless `up
# --workers N` asks for more) run workloads; cluster_layout adds them.
NODES=(cp-1 cp-2)
declare -A NODE_IP=([cp-1]=$LAN_PREFIX.10 [cp-2]=$LAN_PREFIX.11)
declare -A NODE_POD_CIDR=([cp-1]=10.244.1.0/24 [cp-2]=10.244.2.0/24)
declare -A NODE_ROLE=([cp-1]=control-plane [cp-2]=control-plane)
declare -A NODE_ZONE=([cp-1]=zone-c [cp-2]=zone-c)
DEFAULT_WORKERS=2
# check_workers N: refuses a worker count the LAN's and pod network's numbering cannot hold.
check_workers() {
    if ! [[ $1 =~ ^[0-9]+$ ]] || (($1 < 1 || $1 > 30)); then
        die "between 1 and 30 workers, not $1"
    fi
}

# The worker count of the cluster that is up, kept beside its state.
WORKERS_FILE="$CLUSTER_DIR/workers"

# cluster_layout WORKERS: the nodes of a cluster with that many workers. Workers take zones
# a, b, c in turn, so that six give upstream's topology specs the three zones of two schedulable
# nodes each that they ask for; the control plane sits in zone-c.
cluster_layout() {
    local workers=$1 i node zones=(a b c)
    NODES=(cp-1 cp-2)
    for ((i = 1; i <= workers; i++)); do
        node=worker-$i
        NODES+=("$node")
        NODE_IP[$node]=$LAN_PREFIX.$((19 + i))
        NODE_POD_CIDR[$node]=10.244.$((2 + i)).0/24
        NODE_ROLE[$node]=worker
        NODE_ZONE[$node]=zone-${zones[(i - 1) % 3]}
    done
}

# check_workers N: refuses a worker count the LAN's and pod network's numbering cannot hold.
check_workers() {
    if ! [[ $1 =~ ^[0-9]+$ ]] || (($1 < 1 || $1 > 30)); then
        die "between 1 and 30 workers, not $1"
    fi
}

# The worker count of the cluster that is up (the default when none is).
cluster_workers() {
    cat "$WORKERS_FILE" 2>/dev/null || echo "$DEFAULT_WORKERS"
}

POD_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10
CLUSTER_DOMAIN=cluster.local
# etcd and kube-apiserver run on cp-1, kube-controller-manager and kube-scheduler on cp-2.
API_NODE=cp-1
API_SERVER=https://${NODE_IP[$API_NODE]}:6443
SCHEDULER_NODE=cp-2

# The release tests/controlplane/go-build.sh pins for every Kubernetes binary.
KUBERNETES_VERSION="$(sed -n 's/^KUBERNETES_VERSION=//p' "$REPO/tests/controlplane/go-build.sh")"

# The images the lab runs besides splitproxy's, by the names the kubelet, kubeadm's manifests and
# upstream's e2e tests ask for (tests/cluster/images.sh builds them all here).
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
COREDNS_IMAGE=registry.k8s.io/coredns/coredns:v1.14.2
AGNHOST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:2.63.0
BUSYBOX_IMAGE=registry.k8s.io/e2e-test-images/busybox:1.37.0-1
NGINX_IMAGE=registry.k8s.io/e2e-test-images/nginx:1.15-4
REGRESSION_74839_IMAGE=registry.k8s.io/e2e-test-images/regression-issue-74839:1.4
KUBE_PROXY_IMAGE=registry.k8s.io/kube-proxy:$KUBERNETES_VERSION

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }

netns_of() { echo "$NETNS_PREFIX$1"; }

# A node's own namespaces: its network namespace (`ip netns`), and a UTS namespace holding its
# name as host name, which host-network Pods see as theirs (as on a real node).
node_uts() { echo "$RUN_DIR/$1/uts"; }

# in_node NODE CMD...: runs CMD in NODE's network and UTS namespaces only. Not `ip netns exec`,
# which remounts /sys and so hides the cgroup mounts the kubelet and runc need.
in_node() {
    local node=$1
    shift
    nsenter --net="/run/netns/$(netns_of "$node")" --uts="$(node_uts "$node")" -- "$@"
}

# start_process NAME NODE CMD...: starts CMD in NODE's namespaces as a daemon, its output in
# $CLUSTER_DIR/logs/NAME.log and its pid in $RUN_DIR/pids/NAME.pid.
start_process() {
    local name=$1 node=$2
    shift 2
    mkdir -p "$CLUSTER_DIR/logs" "$RUN_DIR/pids"
    # Without job control a background job is no group leader, so setsid and nsenter both exec:
    # $! is the daemon itself.
    setsid nsenter --net="/run/netns/$(netns_of "$node")" --uts="$(node_uts "$node")" -- "$@" \
        >>"$CLUSTER_DIR/logs/$name.log" 2>&1 </dev/null 9>&- &
    echo $! >"$RUN_DIR/pids/$name.pid"
}

# process_running NAME: whether the daemon NAME started is alive.
process_running() {
    local pid
    pid="$(cat "$RUN_DIR/pids/$1.pid" 2>/dev/null)" || return 1
    kill -0 "$pid" 2>/dev/null
}

# stop_process NAME: kills the daemon NAME (SIGTERM, then SIGKILL after 10 s).
stop_process() {
    local pid i
    pid="$(cat "$RUN_DIR/pids/$1.pid" 2>/dev/null)" || return 0
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$RUN_DIR/pids/$1.pid"
}

# wait_for WHAT SECONDS CMD...: runs CMD every second until it succeeds; fails after SECONDS.
wait_for() {
    local what=$1 seconds=$2 start=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS - start < seconds)) || { log "timed out after ${seconds}s waiting for $what"; return 1; }
        sleep 1
    done
}

# kubectl as the cluster admin.
kc() {
    "$KUBE_BIN/kubectl" --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" "$@"
}

# built SCRIPT: the bin folder a build script prints (building it the first time).
built() {
    "$REPO/$1" | tail -n1
}
