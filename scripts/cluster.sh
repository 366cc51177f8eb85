#!/usr/bin/env bash
# A Kubernetes cluster on this machine with kubelet nodes in network namespaces, for trying
# splitproxy by hand and for its cluster tests: `scripts/cluster.sh up|down|status|install PROXY`.
# See tests/cluster/cluster.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/../tests/cluster/cluster.sh" "$@"
