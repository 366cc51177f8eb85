#!/usr/bin/env bash
# Sets up and runs the demo: the whole product on the manifests source, in network namespaces on
# this machine (needs root). Everything it creates is removed when it ends. `--ebpf` adds node-1
# switching to the ebpf mode.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

scripts/setup.sh
cargo build --workspace --bins
exec target/debug/splitproxy-demo "$@"
