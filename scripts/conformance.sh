#!/usr/bin/env bash
# Runs upstream Kubernetes' own [sig-network] Service e2e tests (v1.36.3, tests/cluster/e2e)
# against the lab cluster (scripts/cluster.sh) with a Service proxy, and writes a results table.
#
#   scripts/conformance.sh [--proxy kube-proxy|iptables|nftables|ebpf]... [--focus REGEX]
#                          [--skip REGEX] [--procs N] [--workers N] [--output DIR]
#
# --proxy     kube-proxy (upstream, as kubeadm installs it), iptables, nftables (splitproxy,
#             from deploy/) or ebpf (from deploy/ebpf/); repeat for several. Default: all four,
#             each on a fresh cluster, in that order. A single one brings the cluster up if needed and installs the proxy
#             (replacing another).
# --focus     the specs to run (default: Services, Networking Granular Checks: Services,
#             Conntrack, EndpointSlice, Topology Hints, Traffic Distribution)
# --skip      more specs to leave out, beside tests/cluster/e2e/skips.tsv (the lab's list)
# --procs     Ginkgo processes running specs at once (default 1; [Serial] specs run alone)
# --workers   the cluster's worker nodes (default 6: three zones of two, which the topology
#             and traffic-distribution specs need; fewer skip those specs)
# --output    where reports go (default target/conformance): DIR/PROXY/report.json per proxy
#             and DIR/results.md, the table (test → state and time per proxy)
#
# Prints Ginkgo's usual summary per proxy and exits non-zero when a selected test failed with
# any proxy run (and says which tests pass with kube-proxy but not with splitproxy).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh

focus='\[sig-network\] (Services|Networking Granular Checks: Services|Conntrack|EndpointSlice|Topology Hints|Traffic Distribution) '
skip=
procs=1
workers=6
out=target/conformance
proxies=()
while (($#)); do
    case $1 in
        --proxy) proxies+=("$2"); shift 2 ;;
        --focus) focus=$2; shift 2 ;;
        --skip) skip=$2; shift 2 ;;
        --procs) procs=$2; shift 2 ;;
        --workers) workers=$2; shift 2 ;;
        --output) out=$2; shift 2 ;;
        *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 64 ;;
    esac
done
((${#proxies[@]})) || proxies=(kube-proxy iptables nftables ebpf)
fresh=$(( ${#proxies[@]} > 1 ))
mkdir -p "$out"
out="$(cd "$out" && pwd)"

e2e_bin="$(tests/cluster/build-e2e.sh | tail -n1)"
kube_bin="$(tests/controlplane/build-kubernetes.sh | tail -n1)"
skips="$(grep -v '^#' tests/cluster/e2e/skips.tsv | cut -f1 | paste -sd'|')"
[[ -n $skip ]] && skips="$skips|$skip"

status=0
for proxy in "${proxies[@]}"; do
    case $proxy in
        kube-proxy) install=kube-proxy ;;
        iptables | nftables | ebpf) install=splitproxy-$proxy ;;
        *) echo "conformance.sh: unknown proxy $proxy" >&2; exit 64 ;;
    esac
    ((fresh)) && scripts/cluster.sh down
    kubeconfig="$(scripts/cluster.sh up --workers "$workers" | tail -n1)"
    if ! scripts/cluster.sh install "$install"; then
        echo "conformance.sh: $proxy: the install failed; no specs ran" >&2
        status=1
        continue
    fi
    mkdir -p "$out/$proxy"
    rm -f "$out/$proxy/report.json"
    echo "conformance.sh: $proxy: running upstream's specs matching $focus" >&2
    started=$SECONDS
    # The suite runs from the host, which reaches the API server and the nodes over the lab LAN;
    # every data-plane check runs inside Pods (kubectl exec).
    "$e2e_bin/ginkgo" --procs="$procs" --timeout=6h --no-color --poll-progress-after=10m \
        --focus="$focus" --skip="$skips" --silence-skips --json-report=report.json \
        --output-dir="$out/$proxy" \
        "$e2e_bin/e2e-network.test" -- \
        --kubeconfig="$kubeconfig" --provider=skeleton --kubectl-path="$kube_bin/kubectl" \
        --dns-domain=cluster.local --report-dir="$out/$proxy" \
        >"$out/$proxy/ginkgo.log" 2>&1 || status=1
    # Ginkgo's summary: from the "Ran N of M Specs" line on.
    sed -n '/^Ran [0-9]* of [0-9]* Specs/,$p' "$out/$proxy/ginkgo.log"
    echo "conformance.sh: $proxy took $((SECONDS - started)) s (log: $out/$proxy/ginkgo.log)" >&2
done

tests/cluster/e2e/results.sh "$out" "${proxies[@]}" >"$out/results.md"
echo "conformance.sh: results in $out/results.md" >&2
# The specs upstream kube-proxy passes and splitproxy does not, when both ran.
sed -n '/^Specs upstream kube-proxy passes/,/^$/p' "$out/results.md" >&2
exit "$status"
