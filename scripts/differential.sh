#!/usr/bin/env bash
# The differential test against upstream kube-proxy over many seeds: the same real API server
# feeds kube-proxy v1.36.3 and splitproxy, and after every round of random Service and
# EndpointSlice changes both nodes' rules must agree. CI runs two seeds; this runs more.
#
#   scripts/differential.sh [--seeds N|A,B,C] [--rounds R] [--services S]
#
# A failure prints its seed; `--seeds <that seed>` replays it. Needs root (network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

seeds=20 rounds=5 services=40
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seeds) seeds="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --services) services="$2"; shift 2 ;;
        -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "differential.sh: unknown argument $1" >&2; exit 64 ;;
    esac
done
if [[ "$seeds" =~ ^[0-9]+$ ]]; then
    seeds=$(seq -s, 1 "$seeds")
fi

scripts/setup.sh >&2
tests/controlplane/build-kubernetes.sh >/dev/null
tests/controlplane/build-etcd.sh >/dev/null
# Every target, as scripts/test.sh builds them: its build (in its cargo target folder) is reused.
cargo build --workspace --all-targets
SPLITPROXY_DIFF_SEEDS="$seeds" SPLITPROXY_DIFF_ROUNDS="$rounds" SPLITPROXY_DIFF_SERVICES="$services" \
    cargo nextest run -p splitproxy-e2e --test kube_proxy_differential --no-capture
