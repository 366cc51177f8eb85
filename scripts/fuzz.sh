#!/usr/bin/env bash
# Runs each cargo-fuzz target in fuzz/ for a bounded time: the agent's protocol → model
# conversion (seeded with the revisions the controller sends for tests/corpus) and the iptables
# render. Prints the executions per target; a crash fails the script and leaves its input in
# fuzz/artifacts/TARGET/ (add it as a regression unit test once fixed).
#
#   scripts/fuzz.sh [SECONDS]   # per target, default 60
#
# Needs cargo-fuzz and the nightly toolchain (scripts/setup.sh installs both).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

seconds="${1:-60}"
if [[ ! $seconds =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS per target, a positive integer]" >&2
    exit 64
fi

cargo run -q -p splitproxy-controller --example fuzz_seeds -- \
    fuzz/corpus/sync_response tests/corpus/*.yaml
mkdir -p fuzz/corpus/render
# The instrumented build takes about ten minutes cold on two cores: keep it in the tools cache,
# so fresh clones (CI) rebuild only what changed.
export CARGO_TARGET_DIR="$SPLITPROXY_TOOLS/fuzz-target"
cd fuzz
# Quiet when it builds; on failure built again, loudly, to show why.
cargo +nightly fuzz build -O >/dev/null 2>&1 || cargo +nightly fuzz build -O

log="$(mktemp -t splitproxy-fuzz.XXXXXX)"
trap 'rm -f "$log"' EXIT
# The render target builds its model from the bytes: without length control it gets inputs long
# enough for several Services from the start.
declare -A options=([sync_response]="" [render]="-len_control=0 -max_len=4096")
for target in sync_response render; do
    # shellcheck disable=SC2086 # the options are separate words
    if ! cargo +nightly fuzz run -O "$target" "corpus/$target" -- \
        -max_total_time="$seconds" ${options[$target]} >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        echo "fuzz: $target failed; its input is in fuzz/artifacts/$target/" >&2
        exit 1
    fi
    runs="$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$log")"
    echo "fuzz: $target: ${runs:-no summary}, no crash"
done
