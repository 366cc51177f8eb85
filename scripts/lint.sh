#!/usr/bin/env bash
# Lints the wire contract (buf) and the Rust workspace (rustfmt, clippy), from the repo root.
# Needs the tools scripts/setup.sh installs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh

buf lint
buf format --exit-code -d proto
cargo fmt --check
cargo clippy --workspace --all-targets -- -D warnings
