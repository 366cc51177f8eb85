#!/usr/bin/env bash
# Takes docs/trace.png: the demo cluster exporting traces to a real Jaeger, one Service added,
# and that change's trace (controller → both agents → their iptables transactions) in the Jaeger
# UI, captured by headless Chromium. Needs root. Not part of CI.
#
#   scripts/trace-screenshot.sh JAEGER_UI_ASSETS [OUT.png]
#
# JAEGER_UI_ASSETS is a built Jaeger UI (the folder holding index.html and static/, what
# `npm run build` leaves in packages/jaeger-ui/build of the jaeger-ui repository). The Jaeger Go
# module carries no UI: upstream embeds it from that separate JavaScript repository at release
# time, and no package registry reachable here ships it built.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

assets="${1:?usage: $0 JAEGER_UI_ASSETS [OUT.png]}"
out="${2:-docs/trace.png}"
[[ -f $assets/index.html ]] || { echo "$0: no index.html in $assets" >&2; exit 64; }

if ! command -v chromium >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
tests/tracing/build-jaeger.sh >/dev/null
cargo build --workspace --bins
mkdir -p "$(dirname "$out")"
target/debug/sp-trace-screenshot "$(realpath "$assets")" "$out"
