#!/usr/bin/env bash
# Sets up what the tests need and runs all of them: lints (buf, rustfmt, clippy), unit and
# in-process tests, and the end-to-end tests in network namespaces on the real kernel (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

scripts/setup.sh
scripts/lint.sh
# The end-to-end tests start the workspace's binaries; build them in the tests' profile first.
cargo build --workspace --bins
cargo test --workspace --no-fail-fast
