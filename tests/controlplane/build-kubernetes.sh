#!/usr/bin/env bash
# Idempotent build of real Kubernetes binaries for the integration tests and the lab cluster:
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet and kubectl, from
# the official Go module k8s.io/kubernetes at one pinned release (KUBERNETES_VERSION in
# go-build.sh, shared with ../cluster/build-e2e.sh), fetched through the Go module proxy.
#
# Output: $SPLITPROXY_TOOLS/kubernetes-<version>/bin/{kube-apiserver,kube-controller-manager,
# kube-scheduler,kube-proxy,kubelet,kubectl}. The last line on stdout is that bin directory;
# progress goes to stderr. When the binaries are already there it does nothing (no network,
# well under a second).
#
# Why not `go install k8s.io/kubernetes/cmd/...@vX`: k8s.io/kubernetes's go.mod requires its
# staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and `replace`s them with
# ./staging/src/..., which `go install pkg@version` refuses. So a throwaway module in a temp dir
# requires k8s.io/kubernetes at the release and replaces each of those staging modules with its
# published twin v0.<minor>.<patch> (the same source, published from the same release commit);
# k8s_module in go-build.sh writes it.
#
# The build mirrors hack/lib/golang.sh of the release: CGO_ENABLED=0 (these are static binaries
# upstream), -trimpath, -tags selinux,notest,grpcnotrace, -ldflags "-s -w" plus the version
# variables, so `kube-apiserver --version` / `kubectl version` print the release. One difference:
# upstream builds kubelet with cgo (it is not in KUBE_STATIC_BINARIES); here it is static like the
# rest, which is what the lab nodes ran (/work/shared/reference/real-cluster-notes.md).
# Build on 2 cores (see NOTES.md): cold, from empty module and build caches, 6.3 min (378 s, 175
# module downloads included; an earlier 4-binary cold build on a busier machine took 14 min);
# with the Go build cache in $SPLITPROXY_TOOLS/go/cache warm, ~30 s; adding kubelet and
# kube-scheduler to a cache warm from the other four, 60 s.
set -euo pipefail

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
SCRIPT=build-kubernetes.sh
# shellcheck source=tests/controlplane/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-build.sh"
TOOLS="$SPLITPROXY_TOOLS"
build_begin "$TOOLS/kubernetes-$KUBERNETES_VERSION" "${BINARIES[@]}"

k8s_module "$WORK" splitproxy.invalid/kubernetes-build
pkgs=()
for b in "${BINARIES[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
k8s_get "$WORK" "${pkgs[@]}"

log "building ${BINARIES[*]} (this takes a while on a cold cache)"
(cd "$WORK" && go build "${K8S_BUILD_FLAGS[@]}" -o "$TMP/bin/" "${pkgs[@]}")
cp "$WORK/go.mod" "$WORK/go.sum" "$TMP/"   # how they were built, for the record
for b in kube-apiserver kube-scheduler kubelet; do "$TMP/bin/$b" --version >&2; done

build_finish
