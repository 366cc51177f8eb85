#!/usr/bin/env bash
# Idempotent build of CoreDNS, the lab cluster's DNS (the kube-dns Service the kubelet's
# clusterDNS points at, and that upstream's e2e DNS tests query), from the official Go module
# github.com/coredns/coredns at the version kubeadm pins for the Kubernetes release the other
# scripts build, fetched through the Go module proxy.
#
# Output: $SPLITPROXY_TOOLS/coredns-<version>/bin/coredns. The last line on stdout is that bin
# directory; progress goes to stderr. When the binary is already there it does nothing (no
# network, well under a second).
#
# Why v1.14.2: k8s.io/kubernetes@v1.36.3's cmd/kubeadm/app/constants/constants.go has
# `CoreDNSVersion = "v1.14.2"` (the image kubeadm deploys, registry.k8s.io/coredns/coredns:v1.14.2).
# Its go.mod says `go 1.25.0` and has no `replace` directives, so plain `go install pkg@version`
# builds it with the release's own go.sum; the main package is the module root (coredns.go), with
# the release's generated plugin list (core/plugin/zplugin.go, from plugin.cfg).
# Flags mirror upstream's Makefile: CGO_ENABLED=0, -tags grpcnotrace, -ldflags "-s -w" and
# coremain.GitCommit (the release commit's short hash when the proxy recorded the module's
# origin, else empty). `coredns -version` prints `CoreDNS-1.14.2` and `linux/amd64, go1.26.8, <commit>`
# (upstream builds with go1.26.1 from .go-version; GOTOOLCHAIN=local uses the local Go).
# Build on 2 cores (see BUILD-NOTES.md in this folder): cold, from empty module and build caches,
# 133 s (112 module downloads included); warm Go build cache ~9 s.
set -euo pipefail

COREDNS_VERSION=v1.14.2

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
SCRIPT=build-coredns.sh
# shellcheck source=tests/controlplane/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/../controlplane/go-build.sh"
TOOLS="$SPLITPROXY_TOOLS"
build_begin "$TOOLS/coredns-$COREDNS_VERSION" coredns

module=github.com/coredns/coredns
src="$(go_module_src "$module" "$COREDNS_VERSION" "$WORK")"
require_go "$(go_version_of "$src/go.mod")" "$module@$COREDNS_VERSION"

commit="$(go_module_info_field "$module" "$COREDNS_VERSION" Hash)"
log "building coredns"
(cd "$WORK" && GOBIN="$TMP/bin" go install -trimpath -tags grpcnotrace \
    -ldflags "-s -w -X $module/coremain.GitCommit=${commit:0:7}" "$module@$COREDNS_VERSION")
version="$("$TMP/bin/coredns" -version)"
echo "$version" >&2
[[ $version == *"CoreDNS-${COREDNS_VERSION#v}"* ]] || { log "coredns is not ${COREDNS_VERSION#v}"; exit 1; }

build_finish
