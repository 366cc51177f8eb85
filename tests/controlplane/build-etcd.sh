#!/usr/bin/env bash
# Idempotent build of etcd for the integration tests' kube-apiserver, from the official Go module
# go.etcd.io/etcd/server/v3 at the version kubeadm pins for the Kubernetes release that
# build-kubernetes.sh builds, fetched through the Go module proxy.
#
# Output: $SPLITPROXY_TOOLS/etcd-<version>/bin/etcd. The last line on stdout is that bin
# directory; progress goes to stderr. When the binary is already there it does nothing.
#
# Why not Debian's etcd-server: bookworm ships 3.4.23, older than the oldest etcd that
# Kubernetes v1.36 supports (kubeadm's MinExternalEtcdVersion is 3.5.24; it pins 3.6.8).
# Why not `go install go.etcd.io/etcd/server/v3@vX`: that module's go.mod `replace`s its sibling
# modules (api, client/pkg, client/v3, pkg) with ../ paths, which `go install pkg@version`
# refuses. So a throwaway module requires the server module and replaces each sibling with its
# published twin at the same version. The main package is the module root (main.go calling
# etcdmain.Main). Built like upstream's scripts/build.sh: CGO_ENABLED=0, -trimpath, -s -w.
# Build on 2 cores: ~1 min after build-kubernetes.sh (shared modules), ~6 s with a warm cache.
set -euo pipefail

# kubeadm's constants for Kubernetes v1.36: DefaultEtcdVersion = SupportedEtcdVersion[36] = 3.6.8-0.
ETCD_VERSION=v3.6.8

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
SCRIPT=build-etcd.sh
# shellcheck source=tests/controlplane/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
TOOLS="$SPLITPROXY_TOOLS"
build_begin "$TOOLS/etcd-$ETCD_VERSION" etcd

server=go.etcd.io/etcd/server/v3
src="$(go_module_src "$server" "$ETCD_VERSION" "$WORK")"

go_directive="$(go_version_of "$src/go.mod")"
require_go "$go_directive" "$server@$ETCD_VERSION"

# Sibling modules replaced with ../ paths in the server's go.mod.
mapfile -t siblings < <(awk '$2 == "=>" && $3 ~ /^\.\.\// { print $1 }' "$src/go.mod" | sort -u)
((${#siblings[@]})) || { log "found no sibling modules in $src/go.mod"; exit 1; }

{
    echo "module splitproxy.invalid/etcd-build"
    echo
    echo "go $go_directive"
    echo
    echo "require $server $ETCD_VERSION"
    echo
    echo "replace ("
    for m in "${siblings[@]}"; do echo "	$m => $m $ETCD_VERSION"; done
    echo ")"
} >"$WORK/go.mod"

log "resolving dependencies (${#siblings[@]} sibling modules at $ETCD_VERSION)"
(cd "$WORK" && go get "$server@$ETCD_VERSION" >&2)

log "building etcd"
(cd "$WORK" && go build -trimpath -ldflags "-s -w" -o "$TMP/bin/etcd" "$server")
cp "$WORK/go.mod" "$WORK/go.sum" "$TMP/"   # how it was built, for the record
"$TMP/bin/etcd" --version >&2

build_finish
