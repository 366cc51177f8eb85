# shellcheck shell=bash
# Sourced by tests/cluster/cluster.sh: the nodes' namespaces and the lab network. A bridge in its own namespace is the LAN;
# each node is a network namespace with one link to it, routes to the other nodes' pod CIDRs
# (as a routed pod network without an overlay), forwarding on and bridged traffic through
# netfilter (what kube-proxy expects of a node); the host gets one link and one address on it.

network_up() {
    local node ns
    if ! ip netns list | grep -qx "$LAN_NETNS\( .*\)\?"; then
        ip netns add "$LAN_NETNS"
        ip -n "$LAN_NETNS" link set lo up
        ip -n "$LAN_NETNS" link add br0 type bridge
        ip -n "$LAN_NETNS" addr add "$GATEWAY_IP/24" dev br0
        ip -n "$LAN_NETNS" link set br0 up
    fi
    if ! ip link show spc-host >/dev/null 2>&1; then
        ip link add spc-host type veth peer name n-host netns "$LAN_NETNS"
        ip -n "$LAN_NETNS" link set n-host master br0 up
        ip addr add "$HOST_IP/24" dev spc-host
        ip link set spc-host up
    fi
    for node in "${NODES[@]}"; do
        ns="$(netns_of "$node")"
        if [[ ! -f $(node_uts "$node") ]]; then
            mkdir -p "$RUN_DIR/$node"
            touch "$(node_uts "$node")"
            unshare --uts="$(node_uts "$node")" hostname "$node"
        fi
        ip netns list | grep -qx "$ns\( .*\)\?" && continue
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip link add eth0 netns "$ns" type veth peer name "n-$node" netns "$LAN_NETNS"
        ip -n "$LAN_NETNS" link set "n-$node" master br0 up
        ip -n "$ns" addr add "${NODE_IP[$node]}/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" route add default via "$GATEWAY_IP"
        in_node "$node" sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 \
            net.bridge.bridge-nf-call-ip6tables=1
    done
    for node in "${NODES[@]}"; do
        local other
        for other in "${NODES[@]}"; do
            [[ $other == "$node" ]] && continue
            ip -n "$(netns_of "$node")" route replace "${NODE_POD_CIDR[$other]}" via "${NODE_IP[$other]}"
        done
    done
}

network_down() {
    local node
    for node in "${NODES[@]}"; do
        ip netns delete "$(netns_of "$node")" 2>/dev/null || true
        umount "$(node_uts "$node")" 2>/dev/null || true
        rm -f "$(node_uts "$node")"
    done
    ip link delete spc-host 2>/dev/null || true
    ip netns delete "$LAN_NETNS" 2>/dev/null || true
}
