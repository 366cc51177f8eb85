#!/usr/bin/env bash
# A Kubernetes cluster on this machine, for splitproxy's tests and by hand (as people use kind):
# etcd, kube-apiserver, kube-controller-manager and kube-scheduler of the pinned release, and
# nodes (two control-plane, two workers or more), each a network namespace with its own containerd
# and kubelet, on a routed pod network. Every image is built here and imported into the nodes;
# nothing is pulled. CoreDNS runs as the cluster DNS behind kube-dns. No Service proxy is
# installed: `install` puts in splitproxy (from deploy/, as a user does) or kube-proxy (as
# kubeadm does). Needs root.
#
#   cluster.sh up [--workers N]    starts (or finishes starting) the cluster with N workers
#                                  (default 2; one of another size is taken down first); the
#                                  last stdout line is the admin kubeconfig's path
#   cluster.sh install PROXY       installs splitproxy-iptables, splitproxy-nftables,
#                                  splitproxy-ebpf or kube-proxy (iptables mode), replacing
#                                  the one installed
#   cluster.sh down                stops everything and removes the cluster's state
#   cluster.sh status              what runs, and which proxy is installed
#   cluster.sh kubeconfig          the admin kubeconfig's path
#
# The host reaches the API server and the nodes over the lab LAN ($HOST_IP on `spc-host`).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER="$REPO/tests/cluster"
# shellcheck source=scripts/env.sh
source "$REPO/scripts/env.sh"
# shellcheck source=tests/cluster/lib/common.sh
source "$CLUSTER/lib/common.sh"
# shellcheck source=tests/cluster/lib/pki.sh
source "$CLUSTER/lib/pki.sh"
# shellcheck source=tests/cluster/lib/network.sh
source "$CLUSTER/lib/network.sh"
# shellcheck source=tests/cluster/lib/controlplane.sh
source "$CLUSTER/lib/controlplane.sh"
# shellcheck source=tests/cluster/lib/nodes.sh
source "$CLUSTER/lib/nodes.sh"
# shellcheck source=tests/cluster/lib/proxy.sh
source "$CLUSTER/lib/proxy.sh"

# One command at a time: `up` from two tests at once must not start two of everything.
mkdir -p "$RUN_DIR"
exec 9>"$RUN_DIR/lock"
flock 9
cluster_layout "$(cluster_workers)"

# _binaries: builds (the first time) and finds what the cluster runs.
_binaries() {
    KUBE_BIN="$(built tests/controlplane/build-kubernetes.sh)"
    ETCD_BIN="$(built tests/controlplane/build-etcd.sh)"
    CONTAINERD_BIN="$(built tests/cluster/build-containerd.sh)"
    CNI_BIN="$(built tests/cluster/build-cni-plugins.sh)"
    RUNC="$(command -v runc)" || die "runc not found (tests/cluster/setup.sh installs it)"
    local images
    images="$(built tests/cluster/images.sh)"
    mapfile -t LAB_IMAGES < <(find "$images" -name '*.tar' | sort)
}

_dns_up() {
    sed -e "s|@DNS_SERVICE_IP@|$DNS_SERVICE_IP|g" -e "s|@CLUSTER_DOMAIN@|$CLUSTER_DOMAIN|g" \
        -e "s|@COREDNS_IMAGE@|$COREDNS_IMAGE|g" "$CLUSTER/manifests/coredns.yaml" |
        kc apply -f - >/dev/null
}

cmd_up() {
    local workers=$1
    # The layout loaded above is the running cluster's, which down needs.
    if [[ -e $WORKERS_FILE && $(cluster_workers) != "$workers" ]]; then
        log "up: the cluster has $(cluster_workers) workers; recreating it with $workers"
        cmd_down
    fi
    cluster_layout "$workers"
    "$CLUSTER/setup.sh"
    _binaries
    mkdir -p "$CLUSTER_DIR"
    echo "$workers" >"$WORKERS_FILE"
    pki_generate
    network_up
    controlplane_up
    nodes_up
    _dns_up
    log "up: ${#NODES[@]} nodes Ready; proxy: $(proxy_installed)"
    echo "$CLUSTER_DIR/admin.kubeconfig"
}

cmd_down() {
    nodes_down
    controlplane_down
    network_down
    rm -rf "$CLUSTER_DIR" "$RUN_DIR/pids"
    log "down"
}

cmd_status() {
    local name
    for name in etcd kube-apiserver kube-controller-manager kube-scheduler \
        "${NODES[@]/#/containerd-}" "${NODES[@]/#/kubelet-}"; do
        if process_running "$name"; then echo "$name: running"; else echo "$name: stopped"; fi
    done
    echo "proxy: $(proxy_installed)"
}

case ${1:-} in
    up)
        if [[ ${2:-} == --workers && $# -eq 3 ]]; then
            check_workers "$3"
            cmd_up "$3"
        elif [[ $# -eq 1 ]]; then
            cmd_up "$DEFAULT_WORKERS"
        else
            die "usage: $0 up [--workers N]"
        fi
        ;;
    down) cmd_down ;;
    status) cmd_status ;;
    kubeconfig) echo "$CLUSTER_DIR/admin.kubeconfig" ;;
    install)
        [[ $# -eq 2 ]] || die "usage: $0 install splitproxy-iptables|splitproxy-nftables|splitproxy-ebpf|kube-proxy|splitproxy-migrated"
        _binaries
        proxy_install "$2"
        ;;
    *)
        echo "usage: $0 up|down|status|kubeconfig|install PROXY" >&2
        exit 64
        ;;
esac
