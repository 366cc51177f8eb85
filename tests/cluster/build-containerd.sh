#!/usr/bin/env bash
# Idempotent build of containerd v2 for the lab cluster's nodes (the kubelet's container runtime):
# containerd, containerd-shim-runc-v2 and ctr from the official Go module
# github.com/containerd/containerd/v2 at one pinned release, fetched through the Go module proxy.
# runc is not built here (Debian's runc package).
#
# Output: $SPLITPROXY_TOOLS/containerd-<version>/bin/{containerd,containerd-shim-runc-v2,ctr}.
# The last line on stdout is that bin directory; progress goes to stderr. When the binaries are
# already there it does nothing (no network, well under a second).
#
# Why v2.4.2 and not Debian's containerd 1.6.20: Kubernetes 1.36 supports only containerd 2.x
# (the kubelet still talks to 1.6, see /work/shared/reference/real-cluster-notes.md, but logs
# `RuntimeConfig ... Unimplemented`). v2.4.2's go.mod has no `replace` directives, so plain
# `go install pkg@version` builds it (with the release's own go.sum); it says `go 1.26.6`.
#
# Flags mirror upstream's `make STATIC=1` (its static release tarball, Makefile and
# Makefile.linux of the release): tags `urfave_cli_no_docs osusergo netgo static_build`, the shim
# also `no_grpc`; -ldflags "-s -w" with version.Version=v2.4.2 (what `git describe` gives on the
# tag) and version.Package, so `containerd --version` prints
# `containerd github.com/containerd/containerd/v2 v2.4.2`; version.Revision stays empty (the proxy
# does not give the commit). The difference: upstream's static containerd/ctr are cgo builds
# linked with -extldflags -static, only so that the btrfs snapshotter (the one package with
# `import "C"`, github.com/containerd/btrfs) is in. Here everything is CGO_ENABLED=0 (statically
# linked by the Go linker, no C toolchain or btrfs headers needed) with `no_btrfs`: the lab uses
# the overlayfs snapshotter, and every other plugin (CRI, overlayfs, native, devmapper, zfs,
# tracing) is pure Go and still built in. The shim is CGO_ENABLED=0 upstream too.
# Build on 2 cores (see BUILD-NOTES.md in this folder): cold 1-2 min (67 s with an empty module
# cache, 128 s beside another build), warm Go build cache ~6 s.
set -euo pipefail

CONTAINERD_VERSION=v2.4.2
BINARIES=(containerd containerd-shim-runc-v2 ctr)

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
SCRIPT=build-containerd.sh
# shellcheck source=tests/controlplane/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/../controlplane/go-build.sh"
TOOLS="$SPLITPROXY_TOOLS"
build_begin "$TOOLS/containerd-$CONTAINERD_VERSION" "${BINARIES[@]}"

module=github.com/containerd/containerd/v2
src="$(go_module_src "$module" "$CONTAINERD_VERSION" "$WORK")"
require_go "$(go_version_of "$src/go.mod")" "$module@$CONTAINERD_VERSION"
if grep -qE '^replace|=>' "$src/go.mod"; then
    log "$module@$CONTAINERD_VERSION's go.mod has replace directives: go install pkg@version refuses it"
    exit 1
fi

ldflags="-s -w -X $module/version.Version=$CONTAINERD_VERSION -X $module/version.Package=$module"
revision="$(go_module_info_field "$module" "$CONTAINERD_VERSION" Hash)"
[[ -z $revision ]] || ldflags+=" -X $module/version.Revision=$revision"
tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs"

log "building containerd and ctr (this takes a while on a cold cache)"
(cd "$WORK" && GOBIN="$TMP/bin" go install -trimpath -tags "$tags" -ldflags "$ldflags" \
    "$module/cmd/containerd@$CONTAINERD_VERSION" "$module/cmd/ctr@$CONTAINERD_VERSION")
log "building containerd-shim-runc-v2"
(cd "$WORK" && GOBIN="$TMP/bin" go install -trimpath -tags "$tags no_grpc" -ldflags "$ldflags" \
    "$module/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION")
"$TMP/bin/containerd" --version >&2
"$TMP/bin/ctr" --version >&2
"$TMP/bin/containerd-shim-runc-v2" -v >&2

build_finish
