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
# The binaries as they ship, without the test support other crates' tests switch on: code only
# the tests use would otherwise hide from the dead-code lint.
cargo clippy -p splitproxy-agent -p splitproxy-controller --bins -- -D warnings
