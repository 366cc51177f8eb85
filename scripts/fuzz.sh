#!/usr/bin/env bash
# Runs each cargo-fuzz target in fuzz/ for a bounded time, side by side: the agent's protocol →
# model conversion (seeded with the revisions the controller sends for tests/corpus) and the
# iptables render. Prints the executions per target; a crash fails the script and leaves its
# input in fuzz/artifacts/TARGET/ (add it as a regression unit test once fixed).
#
#   scripts/fuzz.sh [SECONDS]     # per target, default 60
#   scripts/fuzz.sh --build-only  # only the instrumented build (scripts/test.sh runs it beside
#                                 # the tests, and the fuzzers after them)
#
# Needs cargo-fuzz and the nightly toolchain (scripts/setup.sh installs both).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

seconds="${1:-60}"
if [[ $seconds != --build-only && ! $seconds =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS per target, a positive integer | --build-only]" >&2
    exit 64
fi

if [[ $seconds != --build-only ]]; then
    # The seed writer as the workspace build has it (scripts/test.sh builds every target first,
    # with the workspace's features, so that this compiles nothing more there).
    cargo build -q --workspace --examples
    "${CARGO_TARGET_DIR:-target}/debug/examples/fuzz_seeds" fuzz/corpus/sync_response \
        tests/corpus/*.yaml
    mkdir -p fuzz/corpus/render
fi
# The instrumented build takes about ten minutes cold on two cores: keep it in the tools cache,
# so fresh clones (CI) rebuild only what changed.
export CARGO_TARGET_DIR="$SPLITPROXY_TOOLS/fuzz-target"
scripts/lib/prune-other-work-trees.py "$PWD" "$CARGO_TARGET_DIR"
cd fuzz
# Quiet when it builds; on failure built again, loudly, to show why.
cargo +nightly fuzz build -O >/dev/null 2>&1 || cargo +nightly fuzz build -O
[[ $seconds != --build-only ]] || exit 0

logs="$(mktemp -d -t splitproxy-fuzz.XXXXXX)"
trap 'rm -rf "$logs"' EXIT
# The render target builds its model from the bytes: without length control it gets inputs long
# enough for several Services from the start.
declare -A options=([sync_response]="" [render]="-len_control=0 -max_len=4096")
targets=(sync_response render)
# Each fuzzer runs on one core: the targets run side by side.
declare -A pids
for target in "${targets[@]}"; do
    # shellcheck disable=SC2086 # the options are separate words
    cargo +nightly fuzz run -O "$target" "corpus/$target" -- \
        -max_total_time="$seconds" ${options[$target]} >"$logs/$target" 2>&1 &
    pids[$target]=$!
done
status=0
for target in "${targets[@]}"; do
    if ! wait "${pids[$target]}"; then
        tail -n 60 "$logs/$target" >&2
        echo "fuzz: $target failed; its input is in fuzz/artifacts/$target/" >&2
        status=1
        continue
    fi
    runs="$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$logs/$target")"
    echo "fuzz: $target: ${runs:-no summary}, no crash"
done
exit "$status"
