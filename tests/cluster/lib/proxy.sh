# shellcheck shell=bash
# Sourced by tests/cluster/cluster.sh: the cluster's Service proxy. splitproxy is installed as a
# user installs it (scripts/images.sh, then `kubectl apply -k` of an overlay of deploy/, or of
# deploy/ebpf/, that sets only the images, the proxy mode, the cluster CIDR and the API server's
# address, and for the lab's shared host each node's BPF and cgroup folders); kube-proxy as
# kubeadm installs it. One at a time: installing another splitproxy mode applies its overlay over
# the installed one, as an operator switches modes; anything else first removes the one in place
# and cleans the nodes' rules with `splitproxy-agent --cleanup`.

PROXY_FILE="$CLUSTER_DIR/proxy"
# Where the nodes' agents mount their BPF filesystems in ebpf mode: NODE/ for each node.
BPF_DIR="$RUN_DIR/bpf"
SPLITPROXY_TAG=lab

proxy_installed() {
    cat "$PROXY_FILE" 2>/dev/null || echo none
}

# _overlay_head DIR BASE: the start of an overlay, in DIR, of BASE (a folder of the repository)
# with this cluster's image tags.
_overlay_head() {
    cat <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $(realpath --relative-to="$1" "$REPO/$2")
images:
- name: localhost/splitproxy/agent
  newTag: $SPLITPROXY_TAG
- name: localhost/splitproxy/controller
  newTag: $SPLITPROXY_TAG
YAML
}

# _splitproxy_overlay MODE: the overlay of deploy/ (deploy/ebpf/ for the ebpf mode) for this
# cluster, in the cluster's folder.
_splitproxy_overlay() {
    local dir="$CLUSTER_DIR/splitproxy-overlay"
    mkdir -p "$dir"
    {
        if [[ $1 == ebpf ]]; then
            _overlay_head "$dir" deploy/ebpf
        else
            _overlay_head "$dir" deploy
        fi
        _node_folders "$1"
        cat <<YAML
configMapGenerator:
- name: agent-config
  behavior: merge
  literals:
  - SPLITPROXY_PROXY_MODE=$1
  - SPLITPROXY_CLUSTER_CIDR=$POD_CIDR
- name: api-server
  behavior: merge
  literals:
  - SPLITPROXY_MASTER=$API_SERVER
YAML
    } >"$dir/kustomization.yaml"
    echo "$dir"
}

# _node_folders MODE: the lab's nodes share the host's mounts, so each node's agent gets its own
# BPF filesystem (in every mode, which removes the ebpf mode's pins; in ebpf mode mounted by the
# init container under the lab's shared folder, as on a node's /sys/fs/bpf) and, in ebpf mode,
# its own cgroup root (the node's, under the hybrid host's unified hierarchy).
_node_folders() {
    local init_args="" cgroup_arg=""
    mkdir -p "$BPF_DIR"
    if ! mountpoint -q "$BPF_DIR"; then
        mount -t tmpfs splitproxy-lab-bpf "$BPF_DIR"
        mount --make-shared "$BPF_DIR"
    fi
    if [[ $1 == ebpf ]]; then
        init_args='
          initContainers:
          - name: node-setup
            args: [--init-only, --bpf-root=/sys/fs/bpf/$(NODE_NAME)]'
        cgroup_arg="
            - --cgroup-root=/host/cgroup/unified/$NETNS_PREFIX\$(NODE_NAME)"
    fi
    cat <<YAML
patches:
- patch: |
    apiVersion: apps/v1
    kind: DaemonSet
    metadata:
      name: splitproxy-agent
    spec:
      template:
        spec:$init_args
          containers:
          - name: agent
            args:
            - --bpf-root=/sys/fs/bpf/\$(NODE_NAME)$cgroup_arg
          volumes:
          - name: bpffs
            hostPath:
              path: $BPF_DIR
YAML
}

# _migration_overlay: deploy/migrate-from-kube-proxy with this cluster's image tags, which turns
# the installed kube-proxy into splitproxy in place and needs no address.
_migration_overlay() {
    local dir="$CLUSTER_DIR/splitproxy-migration"
    mkdir -p "$dir"
    _overlay_head "$dir" deploy/migrate-from-kube-proxy >"$dir/kustomization.yaml"
    echo "$dir"
}

_kube_proxy_manifest() {
    sed -e "s|@MODE@|$1|g" -e "s|@POD_CIDR@|$POD_CIDR|g" -e "s|@API_SERVER@|$API_SERVER|g" \
        -e "s|@KUBE_PROXY_IMAGE@|$KUBE_PROXY_IMAGE|g" "$CLUSTER/manifests/kube-proxy.yaml"
}

# _splitproxy_images: builds the product's images from the work tree and imports them into
# every node; prints the release binaries' folder.
_splitproxy_images() {
    local out="$CLUSTER_DIR/splitproxy-images" node
    "$REPO/scripts/images.sh" --tag "$SPLITPROXY_TAG" --output "$out" >&2
    for node in "${NODES[@]}"; do
        images_import "$node" "$out"/splitproxy-{agent,controller}.tar
    done
}

_proxy_remove() {
    local installed node agent
    installed="$(proxy_installed)"
    case $installed in
        none) return 0 ;;
        splitproxy-migrated)
            kc delete --wait -k "$CLUSTER_DIR/splitproxy-migration" --ignore-not-found >/dev/null
            _kube_proxy_manifest iptables | kc delete --wait --ignore-not-found -f - >/dev/null
            ;;
        splitproxy-*) kc delete --wait -k "$CLUSTER_DIR/splitproxy-overlay" --ignore-not-found >/dev/null ;;
        kube-proxy) _kube_proxy_manifest iptables | kc delete --wait --ignore-not-found -f - >/dev/null ;;
    esac
    wait_for "the $installed Pods to go" 120 _no_proxy_pods
    agent="$(_release_dir)/splitproxy-agent"
    for node in "${NODES[@]}"; do
        in_node "$node" "$agent" --cleanup --bpf-root "$BPF_DIR/$node" >/dev/null 2>&1 ||
            log "splitproxy-agent --cleanup on $node failed"
    done
    rm -f "$PROXY_FILE"
}

_release_dir() {
    echo "${SPLITPROXY_CACHE:-$(dirname "$SPLITPROXY_TOOLS")}/cargo-target/release"
}

_no_proxy_pods() {
    [[ -z $(kc get pods -A -l 'app.kubernetes.io/name in (splitproxy-agent,splitproxy-controller)' -o name) &&
        -z $(kc get pods -n kube-system -l k8s-app=kube-proxy -o name) ]]
}

# proxy_install PROXY: installs PROXY and waits until it runs on every node and the cluster DNS
# answers through its Service. splitproxy-migrated is kube-proxy (installed first if it is not)
# turned into splitproxy in place by deploy/migrate-from-kube-proxy, as a rolling update.
proxy_install() {
    local proxy=$1 installed mode
    case $proxy in
        splitproxy-iptables | splitproxy-nftables | splitproxy-ebpf | kube-proxy | splitproxy-migrated) ;;
        *) die "unknown proxy $proxy (splitproxy-iptables, splitproxy-nftables, splitproxy-ebpf, kube-proxy, splitproxy-migrated)" ;;
    esac
    installed="$(proxy_installed)"
    if [[ $proxy == splitproxy-migrated && $installed != "$proxy" ]]; then
        [[ $installed == kube-proxy ]] || proxy_install kube-proxy
        installed=kube-proxy
    elif [[ $installed == splitproxy-@(iptables|nftables|ebpf) && $proxy == splitproxy-@(iptables|nftables|ebpf) ]]; then
        # Another mode, as an operator switches it: the new overlay applied over the old one,
        # so the agents roll node by node and each takes its node over from the old mode.
        log "switching $installed to $proxy in place"
    elif [[ $installed != "$proxy" && $installed != none ]]; then
        _proxy_remove
    fi
    _splitproxy_images >/dev/null
    case $proxy in
        splitproxy-migrated)
            # As an operator would on a kubeadm cluster, whose DaemonSet kubeadm created.
            kc apply --server-side --force-conflicts -k "$(_migration_overlay)" >/dev/null
            kc -n kube-system rollout status deployment/splitproxy-controller --timeout=300s >&2
            kc -n kube-system rollout status daemonset/kube-proxy --timeout=600s >&2
            ;;
        splitproxy-*)
            mode=${proxy#splitproxy-}
            kc apply -k "$(_splitproxy_overlay "$mode")" >/dev/null
            kc -n splitproxy-system rollout status deployment/splitproxy-controller --timeout=300s >&2
            kc -n splitproxy-system rollout status daemonset/splitproxy-agent --timeout=300s >&2
            ;;
        kube-proxy)
            _kube_proxy_manifest iptables | kc apply -f - >/dev/null
            kc -n kube-system rollout status daemonset/kube-proxy --timeout=300s >&2
            ;;
    esac
    echo "$proxy" >"$PROXY_FILE"
    # CoreDNS reaches the API server through the kubernetes Service, so it is ready only once a
    # proxy runs; by then its rollout may have passed its progress deadline, which `rollout
    # status` takes for a failure although the Pods become ready.
    kc -n kube-system wait deployment/coredns --for=jsonpath='{.status.readyReplicas}'=2 \
        --timeout=300s >&2
    log "installed $proxy"
}
