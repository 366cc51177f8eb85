#!/usr/bin/env bash
# Idempotent build of Jaeger v2 (`github.com/jaegertracing/jaeger/cmd/jaeger`, the OpenTelemetry
# Collector based all-in-one) for the tracing tests: a real OTLP receiver with an HTTP query API
# and the web UI, built from the official Go module fetched through the Go module proxy.
#
# Output: $SPLITPROXY_TOOLS/jaeger-<version>/bin/jaeger. The last line on stdout is that bin
# directory; progress goes to stderr. When the binary is already there it does nothing.
#
# Versions: Jaeger tags each release twice, v1.N (the Go module's version; the module path has no
# /v2 suffix) and v2.M (the binary's release name). The module proxy serves the v1.N tags;
# v1.76.0 holds the v2 binary under cmd/jaeger.
# Why a throwaway module instead of `go install ...@v1.76.0`: jaeger's go.mod has a `replace`
# (github.com/Shopify/sarama), which `go install pkg@version` refuses. The throwaway module
# requires jaeger at the release and repeats the release's module-to-module replaces, so the
# dependency graph is the release's own, and starts from the release's go.sum.
# The module zip carries no web UI assets (upstream builds them from a separate JavaScript
# repository into cmd/query/app/ui/actual); this binary serves the placeholder page at `/`, and
# the query API (`/api/traces`) the tests use is complete.
# Build time on 2 cores: see tests/tracing/README.md.
set -euo pipefail

JAEGER_MODULE_VERSION=v1.76.0

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
SCRIPT=build-jaeger.sh
# shellcheck source=tests/controlplane/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/../controlplane/go-build.sh"
TOOLS="$SPLITPROXY_TOOLS"
build_begin "$TOOLS/jaeger-$JAEGER_MODULE_VERSION" jaeger

module=github.com/jaegertracing/jaeger
src="$(go_module_src "$module" "$JAEGER_MODULE_VERSION" "$WORK")"

go_directive="$(go_version_of "$src/go.mod")"
require_go "$go_directive" "$module@$JAEGER_MODULE_VERSION"

# The release's replaces that point at another module version (not at a local path).
mapfile -t replaces < <(awk '$1 == "replace" && $3 == "=>" && $4 !~ /^\.\.?\// { print $2, "=>", $4, $5 }' "$src/go.mod")

{
    echo "module splitproxy.invalid/jaeger-build"
    echo
    echo "go $go_directive"
    echo
    echo "require $module $JAEGER_MODULE_VERSION"
    echo
    for r in "${replaces[@]}"; do echo "replace $r"; done
} >"$WORK/go.mod"

# The release's go.sum checks every module of that graph locally. Without it, each would be looked
# up in the checksum database, which does not answer for some of them here.
cp "$src/go.sum" "$WORK/go.sum"
chmod u+w "$WORK/go.sum"

log "resolving dependencies"
(cd "$WORK" && go get "$module/cmd/jaeger@$JAEGER_MODULE_VERSION" >&2)

log "building jaeger"
(cd "$WORK" && go build -trimpath \
    -ldflags "-s -w -X $module/internal/version.latestVersion=$JAEGER_MODULE_VERSION" \
    -o "$TMP/bin/jaeger" "$module/cmd/jaeger")
cp "$WORK/go.mod" "$WORK/go.sum" "$TMP/"   # how it was built, for the record
"$TMP/bin/jaeger" version >&2 || "$TMP/bin/jaeger" --help >/dev/null

build_finish
