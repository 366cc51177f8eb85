#!/usr/bin/env bash
# Builds the benchmarks in release mode and runs one: `scripts/bench.sh b1 [flags]` (the default
# when no benchmark is named). Every flag of `splitproxy-bench <benchmark>` overrides the defaults
# below; results go to bench/results/ unless --output says otherwise.
#   b1: fan-out, a real controller and hollow agents in one process. Defaults to 1,000 Services /
#       10,000 endpoints / 1,000 agents, about a minute on this 2-core machine.
#   b2: dataplane, a splitproxy agent next to upstream kube-proxy on a real control plane (root),
#       at 1k Services / 10k endpoints and 10k / 100k (its defaults).
#   b3: API-server load, upstream kube-proxies versus splitproxy against a real control plane, at
#       10, 20 and 50 nodes with 1,000 Services / 10,000 endpoints (needs root; tens of minutes).
#   b4: scale, the controller in its own process pinned to CPU 0 and thousands of thin protocol
#       clients in this one on CPU 1. Defaults to 1,000 nodes / 10,000 Services / 100,000
#       endpoints; `--nodes 5000 --restart`, `--hints`, `--min-sync-period-ms 500` for the rest.
#   b5: datapath, connections per second and latency through a Service: kube-proxy and
#       splitproxy in iptables and nftables mode next to the no-proxy limits, at 1, 1,000, 10,000
#       and 50,000 Services (root; the first three sizes take about 20 minutes, and
#       `--profile quick --services 1,50000` 43 minutes, 30 of them the API server creating the
#       Services); `--profile quick` for 1 / 1k / 10k, ClusterIP and pod IP only.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
benchmark=b1
if [[ $# -gt 0 && $1 != -* ]]; then
  benchmark=$1
  shift
fi
cargo build --release --workspace --bins
bench=target/release/splitproxy-bench
# The default output folder, unless the flags name one (clap takes each flag once).
output=(--output bench/results)
for arg in "$@"; do
  [[ $arg == --output || $arg == --output=* ]] && output=()
done
case $benchmark in
  b1)
    exec "$bench" b1 --services 1000 --endpoints 10000 --agents 1000 --changes 50 \
      --interval-ms 200 "${output[@]}" "$@"
    ;;
  b2)
    exec "$bench" b2 "${output[@]}" "$@"
    ;;
  b3)
    exec "$bench" b3 --services 1000 --endpoints 10000 --nodes 10,20,50 --changes 50 \
      --interval-ms 200 "${output[@]}" "$@"
    ;;
  b4)
    # The generator on the CPU the controller is not pinned to, when there is one.
    pin=()
    if command -v taskset >/dev/null && (($(nproc) > 1)); then
      pin=(taskset --cpu-list 1)
    fi
    exec "${pin[@]}" "$bench" b4 "${output[@]}" "$@"
    ;;
  b5)
    exec "$bench" b5 "${output[@]}" "$@"
    ;;
  *)
    echo "scripts/bench.sh: unknown benchmark '$benchmark' (known: b1, b2, b3, b4, b5)" >&2
    exit 64
    ;;
esac
