#!/usr/bin/env bash
# Idempotent build of the CNI plugins the lab cluster's pod network uses: bridge, host-local,
# loopback and portmap, from the official Go module github.com/containernetworking/plugins at
# one pinned release, fetched through the Go module proxy.
#
# Output: $SPLITPROXY_TOOLS/cni-plugins-<version>/bin/{bridge,host-local,loopback,portmap}: the
# folder to give containerd as its CNI bin_dir. The last line on stdout is that bin directory;
# progress goes to stderr. When the binaries are already there it does nothing (no network, well
# under a second).
#
# Why v1.10.0: the newest release on the proxy; its go.mod says `go 1.26.8`, exactly the local Go
# (GOTOOLCHAIN=local), and has no `replace` directives, so plain `go install pkg@version` builds
# it with the release's own go.sum. Debian bookworm's containernetworking-plugins is 1.1.1.
# Flags mirror upstream's scripts/release.sh (CGO_ENABLED=0, -X .../buildversion.BuildVersion=<tag>),
# plus -trimpath and -s -w; run without CNI_COMMAND a plugin prints `CNI bridge plugin v1.10.0`.
# Build on 2 cores (see BUILD-NOTES.md in this folder): cold, from empty module and build caches,
# 25 s; warm Go build cache ~1 s.
set -euo pipefail

CNI_PLUGINS_VERSION=v1.10.0
# plugin name => its package folder in the module
declare -A PLUGINS=(
    [bridge]=plugins/main/bridge
    [loopback]=plugins/main/loopback
    [host-local]=plugins/ipam/host-local
    [portmap]=plugins/meta/portmap
)

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
SCRIPT=build-cni-plugins.sh
# shellcheck source=tests/controlplane/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/../controlplane/go-build.sh"
TOOLS="$SPLITPROXY_TOOLS"
build_begin "$TOOLS/cni-plugins-$CNI_PLUGINS_VERSION" "${!PLUGINS[@]}"

module=github.com/containernetworking/plugins
src="$(go_module_src "$module" "$CNI_PLUGINS_VERSION" "$WORK")"
require_go "$(go_version_of "$src/go.mod")" "$module@$CNI_PLUGINS_VERSION"

pkgs=()
for b in "${!PLUGINS[@]}"; do pkgs+=("$module/${PLUGINS[$b]}@$CNI_PLUGINS_VERSION"); done

log "building ${!PLUGINS[*]}"
(cd "$WORK" && GOBIN="$TMP/bin" go install -trimpath \
    -ldflags "-s -w -X $module/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" "${pkgs[@]}")
for b in "${!PLUGINS[@]}"; do
    # Without CNI_COMMAND a plugin prints its name and version on stderr and exits 0.
    about="$(env -u CNI_COMMAND "$TMP/bin/$b" 2>&1)"
    [[ $about == *"$CNI_PLUGINS_VERSION"* ]] || { log "$b does not say $CNI_PLUGINS_VERSION: $about"; exit 1; }
done
log "$(env -u CNI_COMMAND "$TMP/bin/bridge" 2>&1 | head -n1)"

build_finish
