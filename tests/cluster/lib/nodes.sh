# shellcheck shell=bash
# Sourced by tests/cluster/cluster.sh: the nodes. Each has its own containerd (v2, runc, the CNI
# bridge and host-local plugins) and kubelet in its network namespace, its own folders, and its
# own cgroup root (this machine has cgroup v1: every hierarchy gets /spc-NODE).

node_dir() { echo "$CLUSTER_DIR/nodes/$1"; }
node_socket() { echo "$RUN_DIR/$1/containerd.sock"; }
node_cgroup() { echo "/$NETNS_PREFIX$1"; }

# ctr_on NODE ARGS...: the node's containerd's CLI, in the namespace the kubelet uses.
ctr_on() {
    local node=$1
    shift
    "$CONTAINERD_BIN/ctr" --address "$(node_socket "$node")" --namespace k8s.io "$@"
}

# _node_cgroups NODE: the node's cgroup root in every v1 hierarchy (cpuset's needs its parent's
# cpus and mems before anything can join it).
_node_cgroups() {
    local hierarchy dir
    for hierarchy in /sys/fs/cgroup/*/; do
        [[ $hierarchy == */unified/ ]] && continue
        dir="$hierarchy${NETNS_PREFIX}$1"
        mkdir -p "$dir"
        if [[ -f $dir/cpuset.cpus && -z $(cat "$dir/cpuset.cpus") ]]; then
            cat "$hierarchy/cpuset.cpus" >"$dir/cpuset.cpus"
            cat "$hierarchy/cpuset.mems" >"$dir/cpuset.mems"
        fi
    done
}

# _node_configs NODE: containerd's config, the CNI network, and the kubelet's config.
_node_configs() {
    local node=$1 dir run
    dir="$(node_dir "$node")"
    run="$RUN_DIR/$node"
    mkdir -p "$dir/cni" "$dir/pod-logs" "$run"
    # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, so sandboxes cannot lower their
    # OOM score below containerd's. NRI is off: its socket path is global, and four containerds
    # share this machine; so are the host's /etc/containerd imports. Pod network namespaces are
    # mounted in the node's own state folder.
    cat >"$dir/containerd.toml" <<TOML
version = 4
root = "$dir/containerd"
state = "$run/containerd"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri"]

[plugins."io.containerd.server.v1.grpc"]
  address = "$(node_socket "$node")"
[plugins."io.containerd.server.v1.ttrpc"]
  address = "$(node_socket "$node").ttrpc"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$RUNC"
        Root = "$run/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$dir/cni"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
TOML
    cat >"$dir/cni/10-lab.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "lab",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$dir/ipam",
        "ranges": [[{"subnet": "${NODE_POD_CIDR[$node]}"}]], "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
    cat >"$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $(node_cgroup "$node")
containerRuntimeEndpoint: unix://$(node_socket "$node")
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI_DIR/ca.crt}
authorization: {mode: Webhook}
clusterDNS: [$DNS_SERVICE_IP]
clusterDomain: $CLUSTER_DOMAIN
resolvConf: ""
podLogsDir: $dir/pod-logs
staticPodPath: ""
enforceNodeAllocatable: []
localStorageCapacityIsolation: true
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
}

# _node_register NODE: the Node object, before its kubelet, with what kubeadm, the cloud and the
# cluster's network plugin give a node: its pod CIDR, role and zone labels, and the control-plane
# taint.
_node_register() {
    local node=$1 taints="[]"
    kc get node "$node" >/dev/null 2>&1 && return 0
    [[ ${NODE_ROLE[$node]} == control-plane ]] &&
        taints='[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]'
    kc create -f - >/dev/null <<JSON
{
  "apiVersion": "v1", "kind": "Node",
  "metadata": {"name": "$node", "labels": {
    "kubernetes.io/hostname": "$node", "kubernetes.io/os": "linux",
    "topology.kubernetes.io/zone": "${NODE_ZONE[$node]}",
    "node-role.kubernetes.io/${NODE_ROLE[$node]}": ""}},
  "spec": {"podCIDR": "${NODE_POD_CIDR[$node]}", "podCIDRs": ["${NODE_POD_CIDR[$node]}"], "taints": $taints}
}
JSON
}

nodes_up() {
    local node dir
    for node in "${NODES[@]}"; do
        dir="$(node_dir "$node")"
        _node_cgroups "$node"
        _node_configs "$node"
        _node_register "$node"
        process_running "containerd-$node" || PATH="$CONTAINERD_BIN:$PATH" start_process \
            "containerd-$node" "$node" "$CONTAINERD_BIN/containerd" --config "$dir/containerd.toml"
    done
    for node in "${NODES[@]}"; do
        wait_for "containerd on $node" 60 ctr_on "$node" version
        images_import "$node" "${LAB_IMAGES[@]}"
        dir="$(node_dir "$node")"
        process_running "kubelet-$node" || start_process "kubelet-$node" "$node" \
            "$KUBE_BIN/kubelet" --config="$dir/kubelet.yaml" \
            --kubeconfig="$CLUSTER_DIR/node-$node.kubeconfig" \
            --root-dir="$dir/kubelet" --cert-dir="$dir/kubelet/pki" \
            --hostname-override="$node" --node-ip="${NODE_IP[$node]}" --v=1
    done
    wait_for "every node Ready" 300 kc wait --for=condition=Ready node --all --timeout=1s
}

# images_import NODE ARCHIVE...: imports OCI archives into NODE's containerd (again is a no-op
# for an image it holds).
images_import() {
    local node=$1 archive
    shift
    local output
    for archive in "$@"; do
        # ctr warns about cgroup v1 on every call: show its output only when it fails.
        output="$(ctr_on "$node" images import --local "$archive" 2>&1)" ||
            die "importing $archive into $node: $output"
    done
}

# _node_pods_kill NODE: kills every process in the node's cgroup root (its Pods' containers)
# and the node's container shims.
_node_pods_kill() {
    local node=$1 root pid
    root="/sys/fs/cgroup/pids$(node_cgroup "$node")"
    if [[ -d $root ]]; then
        # Cgroups vanish under find as their last process dies: its failure to read one is
        # expected, and must not stop `down` (pipefail).
        { find "$root" -name cgroup.procs -exec cat {} + 2>/dev/null || true; } |
            while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done
    fi
    pkill -9 -f -- "-address $(node_socket "$node")" 2>/dev/null || true
}

# _node_cgroups_remove NODE: the node's cgroup folders, deepest first.
_node_cgroups_remove() {
    local hierarchy
    for hierarchy in /sys/fs/cgroup/*/; do
        [[ -d $hierarchy${NETNS_PREFIX}$1 ]] || continue
        find "$hierarchy${NETNS_PREFIX}$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}

nodes_down() {
    local node
    for node in "${NODES[@]}"; do stop_process "kubelet-$node"; done
    for node in "${NODES[@]}"; do
        _node_pods_kill "$node"
        stop_process "containerd-$node"
        _node_pods_kill "$node"
    done
    # Container root folders, Pod volumes and Pod network namespaces are mounts under the
    # cluster's folders: unmount them, deepest first.
    findmnt -rn -o TARGET | grep -E "^($CLUSTER_DIR|$RUN_DIR)/" | sort -r |
        xargs -r -n1 umount -l 2>/dev/null || true
    for node in "${NODES[@]}"; do _node_cgroups_remove "$node"; done
}
