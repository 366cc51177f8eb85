#!/usr/bin/env bash
# Idempotent build of real Kubernetes control-plane binaries for the integration tests:
# kube-apiserver, kube-controller-manager, kube-proxy and kubectl, from the official Go module
# k8s.io/kubernetes at one pinned release, fetched through the Go module proxy.
#
# Output: $SPLITPROXY_TOOLS/kubernetes-<version>/bin/{kube-apiserver,kube-controller-manager,
# kube-proxy,kubectl}. The last line on stdout is that bin directory; progress goes to stderr.
# When the binaries are already there it does nothing (no network, well under a second).
#
# Why not `go install k8s.io/kubernetes/cmd/...@vX`: k8s.io/kubernetes's go.mod requires its
# staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and `replace`s them with
# ./staging/src/..., which `go install pkg@version` refuses. So a throwaway module in a temp dir
# requires k8s.io/kubernetes at the release and replaces each of those staging modules with its
# published twin v0.<minor>.<patch> (the same source, published from the same release commit).
#
# The build mirrors hack/lib/golang.sh of the release: CGO_ENABLED=0 (these are static binaries
# upstream), -trimpath, -tags selinux,notest,grpcnotrace, -ldflags "-s -w" plus the version
# variables, so `kube-apiserver --version` / `kubectl version` print the release.
# Cold build on 2 cores: ~14 min (module downloads included); with the Go build cache in
# $SPLITPROXY_TOOLS/go/cache already warm, ~25 s.
set -euo pipefail

# Pinned release. k8s-openapi 0.29 (the Rust client) covers v1_33 ... v1_37; v1.36.x needs Go >= 1.26.0.
KUBERNETES_VERSION=v1.36.3
BINARIES=(kube-apiserver kube-controller-manager kube-proxy kubectl)

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
TOOLS="$SPLITPROXY_TOOLS"
dest="$TOOLS/kubernetes-$KUBERNETES_VERSION"

have_all() {
    local b
    for b in "${BINARIES[@]}"; do [[ -x $1/bin/$b ]] || return 1; done
}
if have_all "$dest"; then
    echo "$dest/bin"
    exit 0
fi

SCRIPT=build-kubernetes.sh
# shellcheck source=tests/controlplane/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
go_build_env

start=$SECONDS
mkdir -p "$TOOLS"
work="$(mktemp -d -t splitproxy-k8sbuild.XXXXXX)"
tmp="$dest.tmp.$$"
trap 'rm -rf "$work" "$tmp"' EXIT

# ---- the release's go.mod: Go version and staging modules ------------------------------------
src="$(go_module_src k8s.io/kubernetes "$KUBERNETES_VERSION" "$work")"
info="$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.info"

go_directive="$(go_version_of "$src/go.mod")"
godebug_line="$(grep -m1 -E '^godebug ' "$src/go.mod" || true)"
require_go "$go_directive" "k8s.io/kubernetes@$KUBERNETES_VERSION"

# Staging modules: the targets of `=> ./staging/...` replaces, kept only when the release
# actually requires them (e.g. k8s.io/sample-cli-plugin is replaced but never required and not
# published for every release).
mapfile -t staging < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$src/go.mod" | sort -u)
mapfile -t required < <(awk '$2 == "v0.0.0" { print $1 }' "$src/go.mod" | sort -u)
mapfile -t replaced < <(comm -12 <(printf '%s\n' "${staging[@]}") <(printf '%s\n' "${required[@]}"))
((${#replaced[@]})) || { log "found no staging modules in $src/go.mod"; exit 1; }

minor_patch="${KUBERNETES_VERSION#v1.}"          # 36.3
minor="${minor_patch%%.*}"                        # 36
staging_version="v0.$minor_patch"                 # v0.36.3

# ---- throwaway module ------------------------------------------------------------------------
{
    echo "module splitproxy.invalid/kubernetes-build"
    echo
    echo "go $go_directive"
    # k8s.io/kubernetes sets its GODEBUG defaults in its go.mod; only the main module's count.
    [[ -n $godebug_line ]] && echo "$godebug_line"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    echo "replace ("
    for m in "${replaced[@]}"; do echo "	$m => $m $staging_version"; done
    echo ")"
} >"$work/go.mod"

pkgs=()
for b in "${BINARIES[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done

log "resolving dependencies (${#replaced[@]} staging modules at $staging_version)"
(cd "$work" && go get "${pkgs[@]/%/@$KUBERNETES_VERSION}" >&2)

# ---- build -----------------------------------------------------------------------------------
build_date="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info" 2>/dev/null || true)"
[[ -n $build_date ]] || build_date="1970-01-01T00:00:00Z"
ldflags="-s -w"
for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
done

rm -rf "$tmp"
mkdir -p "$tmp/bin"
log "building ${BINARIES[*]} (this takes a while on a cold cache)"
(cd "$work" && go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldflags" \
    -o "$tmp/bin/" "${pkgs[@]}")
have_all "$tmp" || { log "build left out some of ${BINARIES[*]}"; exit 1; }
cp "$work/go.mod" "$work/go.sum" "$tmp/"   # how they were built, for the record
"$tmp/bin/kube-apiserver" --version >&2

rm -rf "$dest"
mv "$tmp" "$dest"
log "built in $((SECONDS - start))s into $dest/bin"
echo "$dest/bin"
