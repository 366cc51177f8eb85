#!/usr/bin/env bash
# Builds the benchmark in release mode and runs B1 (fan-out): a real controller and hollow agents in
# one process, endpoint churn, programming latency. Defaults to 1,000 Services / 10,000 endpoints /
# 1,000 agents, which fits this 2-core machine in about a minute; any flag of splitproxy-bench
# overrides it (e.g. `scripts/bench.sh --agents 100 --output bench/results/100-agents`).
# Results: bench/results/b1.json and b1.svg unless --output says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo build --release -p splitproxy-bench
exec target/release/splitproxy-bench \
  --services 1000 --endpoints 10000 --agents 1000 --changes 50 --interval-ms 200 \
  --output bench/results "$@"
