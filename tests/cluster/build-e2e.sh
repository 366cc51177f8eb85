#!/usr/bin/env bash
# Idempotent build of what upstream's network end-to-end tests need besides the cluster, all from
# the official Go module k8s.io/kubernetes at the release the control plane is built from
# (KUBERNETES_VERSION in ../controlplane/go-build.sh), fetched through the Go module proxy:
#   e2e-network.test  upstream's network e2e specs (k8s.io/kubernetes/test/e2e/network) compiled
#                     into a test binary of the project's own, e2e/network_test.go next to this
#                     script, which stands in for upstream's e2e.test (same framework flags:
#                     --kubeconfig, --provider, --ginkgo.focus, ...);
#   agnhost           the test image's program (k8s.io/kubernetes/test/images/agnhost), version
#                     from test/images/agnhost/VERSION, for a local
#                     registry.k8s.io/e2e-test-images/agnhost:<version> image;
#   regression-issue-74839  the program of the image of the same name that the Conntrack spec
#                     "should drop INVALID conntrack entries" runs
#                     (k8s.io/kubernetes/test/images/regression-issue-74839, version from its
#                     VERSION), for a local registry.k8s.io/e2e-test-images/regression-issue-74839:<version>;
#   ginkgo            the Ginkgo CLI the release's tests use, to run the specs in parallel;
#   pause             the pod sandbox's program, from build/pause/linux/pause.c, for a local
#                     registry.k8s.io/pause:<version> image.
# The versions are written to VERSIONS next to bin/ (agnhost=2.63.0, regression-issue-74839=1.4,
# pause=3.10.2 for v1.36.3: the tags test/utils/image/manifest.go and kubeadm use).
#
# Output: $SPLITPROXY_TOOLS/kubernetes-e2e-<version>/bin/{e2e-network.test,ginkgo,agnhost,
# regression-issue-74839,pause}. The last line on stdout is that bin directory; progress goes to
# stderr. When the binaries are there and were built from the current e2e/network_test.go (the
# copy next to bin/ is compared), it does nothing (no network, well under a second); an edited
# network_test.go rebuilds.
#
# Why not upstream's e2e.test: `go test -c k8s.io/kubernetes/test/e2e` does not build from the
# published staging modules at v1.36.3 (its apimachinery, apps and DRA suites import packages that
# k8s.io/api, k8s.io/dynamic-resource-allocation and k8s.io/component-helpers v0.36.3 lack);
# the network suite and the framework do. The throwaway module is the one build-kubernetes.sh
# uses (k8s_module in go-build.sh: the release plus its staging modules at v0.36.3), with the
# test file copied in as package ./e2e.
#
# Flags as upstream's: e2e-network.test like hack/lib/golang.sh builds e2e.test (`go test -c`,
# -trimpath, -tags selinux,notest,grpcnotrace, -s -w and the version variables; CGO_ENABLED=0
# here, as for the rest); agnhost like test/images/image-util.sh (CGO_ENABLED=0, -X main.Version=
# <VERSION>, so `agnhost --version` prints it); pause like build/pause/Makefile (gcc -Os -Wall
# -Werror -static -DVERSION=v<TAG>-<REV>, then strip; REV, `git describe` upstream, is the
# release tag here); regression-issue-74839 like agnhost (it has no version variable). gcc and the
# static glibc (libc6-dev) are Debian's.
# Build on 2 cores (see BUILD-NOTES.md in this folder): right after a cold build-kubernetes.sh
# (which compiles most of what it needs), 4-5 min (238 s; 302 s beside another build), most of it
# e2e-network.test; warm Go build cache ~25 s; after an edit of network_test.go ~15 s.
set -euo pipefail

BINARIES=(e2e-network.test ginkgo agnhost regression-issue-74839 pause)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
test_src="$here/e2e/network_test.go"
# shellcheck source=scripts/env.sh
source "$here/../../scripts/env.sh"
SCRIPT=build-e2e.sh
# shellcheck source=tests/controlplane/go-build.sh
source "$here/../controlplane/go-build.sh"
TOOLS="$SPLITPROXY_TOOLS"

# build_begin's hook: a build is current only if made from this network_test.go (its copy is kept
# next to bin/), so an edit rebuilds.
build_is_current() { cmp -s "$1/network_test.go" "$test_src"; }
build_begin "$TOOLS/kubernetes-e2e-$KUBERNETES_VERSION" "${BINARIES[@]}"

command -v gcc >/dev/null 2>&1 || { log "gcc not found (apt-get install gcc libc6-dev)"; exit 1; }

k8s_module "$WORK" splitproxy.invalid/kubernetes-e2e
mkdir -p "$WORK/e2e"
cp "$test_src" "$WORK/e2e/"
k8s_get "$WORK" k8s.io/kubernetes/test/images/agnhost \
    k8s.io/kubernetes/test/images/regression-issue-74839 k8s.io/kubernetes/test/e2e/network
# The test's other imports (framework packages, ginkgo, gomega, klog, ...) are packages of modules
# already in the release's graph, so `go get -t` resolves them at the release's versions, never at
# @latest (checked: every version in the resulting go.mod is the release's).
(cd "$WORK" && go get -t ./e2e >&2)

# ---- test image programs: agnhost, regression-issue-74839 ----------------------------------------
image_version() { tr -d '[:space:]' <"$K8S_SRC/test/images/$1/VERSION"; }
agnhost_version="$(image_version agnhost)"
regression_version="$(image_version regression-issue-74839)"
log "building agnhost $agnhost_version, regression-issue-74839 $regression_version"
(cd "$WORK" && go build -trimpath -ldflags "-s -w -X main.Version=$agnhost_version" \
    -o "$TMP/bin/agnhost" k8s.io/kubernetes/test/images/agnhost)
(cd "$WORK" && go build -trimpath -ldflags "-s -w" \
    -o "$TMP/bin/regression-issue-74839" k8s.io/kubernetes/test/images/regression-issue-74839)
"$TMP/bin/agnhost" --version >&2

# ---- pause -------------------------------------------------------------------------------------
pause_c="$K8S_SRC/build/pause/linux/pause.c"
[[ -f $pause_c ]] || { log "no build/pause/linux/pause.c in the module"; exit 1; }
pause_version="$(awk '$1 == "TAG" && $2 == "?=" { print $3; exit }' "$K8S_SRC/build/pause/Makefile")"
[[ -n $pause_version ]] || { log "no TAG in build/pause/Makefile"; exit 1; }
log "building pause $pause_version"
gcc -Os -Wall -Werror -static "-DVERSION=v$pause_version-$KUBERNETES_VERSION" \
    -o "$TMP/bin/pause" "$pause_c"
strip "$TMP/bin/pause"
"$TMP/bin/pause" -v >&2

# ---- e2e-network.test --------------------------------------------------------------------------
log "building e2e-network.test (this takes a while on a cold cache)"
(cd "$WORK" && go test -c "${K8S_BUILD_FLAGS[@]}" -o "$TMP/bin/e2e-network.test" ./e2e)
help="$("$TMP/bin/e2e-network.test" --help 2>&1 || true)"
[[ $help == *-kubeconfig* && $help == *-provider* && $help == *-ginkgo.focus* ]] ||
    { log "e2e-network.test --help lacks --kubeconfig, --provider or --ginkgo.focus"; exit 1; }

# ---- ginkgo -------------------------------------------------------------------------------------
# The Ginkgo CLI at the version the release's tests use: it runs e2e-network.test's specs in
# several processes (a test binary alone cannot) and merges their reports.
log "building the ginkgo CLI"
(cd "$WORK" && go build -trimpath -ldflags "-s -w" -o "$TMP/bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
"$TMP/bin/ginkgo" version >&2

cp "$WORK/go.mod" "$WORK/go.sum" "$test_src" "$TMP/"   # how they were built, for the record
printf '%s\n' "agnhost=$agnhost_version" "regression-issue-74839=$regression_version" \
    "pause=$pause_version" >"$TMP/VERSIONS"

build_finish "(agnhost $agnhost_version, regression-issue-74839 $regression_version," \
    "pause $pause_version)"
