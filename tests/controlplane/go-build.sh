# shellcheck shell=bash
# Sourced by the build-*.sh scripts: the start and end every build shares (build_begin,
# build_finish), the shared Go build environment and module helpers, and the pinned Kubernetes
# release with the throwaway-module build that its binaries share. Sourcing it only sets
# KUBERNETES_VERSION and defines functions (no work, no network). The functions expect SCRIPT
# (the caller's name, for messages) and TOOLS (the tools cache) to be set.

log() { echo "$SCRIPT: $*" >&2; }

# Same cache layout as scripts/setup.sh, so module downloads and compiled packages are reused;
# static binaries; no toolchain downloads (only the module proxy is reachable).
go_build_env() {
    if ! command -v go >/dev/null 2>&1; then
        log "go not found (expected /usr/local/go/bin/go)"
        exit 1
    fi
    export GOPATH="$TOOLS/go" GOMODCACHE="$TOOLS/go/pkg/mod" GOCACHE="$TOOLS/go/cache"
    export GOTOOLCHAIN=local GOFLAGS="-modcacherw -buildvcs=false" CGO_ENABLED=0 GOWORK=off
    unset GOOS GOARCH
}

# build_begin DEST BINARY...: waits for any other build of DEST to end; then, when every BINARY is
# executable in DEST/bin (and the caller's optional hook `build_is_current DIR` agrees), prints
# DEST/bin and exits 0: an already-built run does nothing, with no network. Else sets up the
# build: go_build_env; WORK, an empty temp folder; TMP=DEST.tmp.<pid> with TMP/bin, where the
# build goes, so that DEST appears only by the rename in build_finish (if its binaries are there,
# the build finished); START; an EXIT trap that removes WORK and TMP, so a failed build leaves
# neither behind.
build_begin() {
    DEST=$1
    shift
    BUILD_BINARIES=("$@")
    # One build of DEST at a time: tests running side by side may ask for the same tool, and
    # scripts/test.sh may be building it already; the others wait, then find it built.
    mkdir -p "$(dirname "$DEST")"
    exec {BUILD_LOCK}>"$DEST.lock"
    flock "$BUILD_LOCK"
    if build_complete "$DEST"; then
        echo "$DEST/bin"
        exit 0
    fi
    go_build_env
    START=$SECONDS
    WORK="$(mktemp -d -t "splitproxy-${SCRIPT%.sh}.XXXXXX")"
    TMP="$DEST.tmp.$$"
    trap 'rm -rf "$WORK" "$TMP"' EXIT
    rm -rf "$TMP"   # left by an earlier run with the same pid
    mkdir -p "$TMP/bin"
}

# build_finish [WORD...]: checks that TMP holds the whole build as build_begin checks DEST, renames
# TMP to DEST, logs the time (and the WORDs) and prints DEST/bin, the last line on stdout.
# shellcheck disable=SC2120 # the WORDs are optional
build_finish() {
    build_complete "$TMP" || { log "build left out some of ${BUILD_BINARIES[*]}"; exit 1; }
    rm -rf "$DEST"
    mv "$TMP" "$DEST"
    log "built in $((SECONDS - START))s into $DEST/bin" "$@"
    echo "$DEST/bin"
}

# build_complete DIR: whether DIR/bin holds every BUILD_BINARIES and build_is_current DIR, when
# the caller defines it, agrees.
build_complete() {
    local b
    for b in "${BUILD_BINARIES[@]}"; do [[ -x $1/bin/$b ]] || return 1; done
    ! declare -F build_is_current >/dev/null || build_is_current "$1"
}

# go_module_src MODULE VERSION WORKDIR: downloads the module and prints its folder in the cache.
go_module_src() {
    local module=$1 version=$2 work=$3 src
    log "downloading $module@$version"
    (cd "$work" && go mod download "$module@$version")
    src="$GOMODCACHE/$module@$version"
    [[ -f $src/go.mod ]] || { log "no $src/go.mod after download"; exit 1; }
    echo "$src"
}

# go_version_of GOMOD: prints the go.mod's `go` version.
go_version_of() {
    awk '$1 == "go" { print $2; exit }' "$1"
}

# require_go VERSION WHAT: fails unless the local Go is at least VERSION.
require_go() {
    local have_go
    have_go="$(go env GOVERSION)"
    have_go="${have_go#go}"
    if [[ "$(printf '%s\n%s\n' "$1" "$have_go" | sort -V | head -n1)" != "$1" ]]; then
        log "$2 needs go $1, have $have_go (GOTOOLCHAIN=local)"
        exit 1
    fi
}

# ---- Kubernetes ---------------------------------------------------------------------------------
# The release that build-kubernetes.sh (control plane, kubelet) and ../cluster/build-e2e.sh (e2e
# test binary and the test images' programs) build, so that they always agree. k8s-openapi 0.29 (the Rust
# client) covers v1_33 ... v1_37; v1.36.x needs Go >= 1.26.0.
KUBERNETES_VERSION=v1.36.3

# k8s_module WORKDIR MODULE: writes WORKDIR/go.mod, a throwaway main module MODULE that requires
# k8s.io/kubernetes at $KUBERNETES_VERSION and replaces each of its staging modules with the
# published twin v0.<minor>.<patch> (why: see build-kubernetes.sh). Sets
#   K8S_SRC          the release's folder in the module cache,
#   K8S_BUILD_FLAGS  go build / go test flags as hack/lib/golang.sh of the release sets them:
#                    -trimpath, -tags selinux,notest,grpcnotrace, -ldflags "-s -w" plus the
#                    version variables (so --version prints the release).
k8s_module() {
    local work=$1 module=$2 go_directive godebug_line minor_patch minor staging_version
    local build_date ldflags m p
    local -a staging required replaced
    K8S_SRC="$(go_module_src k8s.io/kubernetes "$KUBERNETES_VERSION" "$work")"

    go_directive="$(go_version_of "$K8S_SRC/go.mod")"
    godebug_line="$(grep -m1 -E '^godebug ' "$K8S_SRC/go.mod" || true)"
    require_go "$go_directive" "k8s.io/kubernetes@$KUBERNETES_VERSION"

    # Staging modules: the targets of `=> ./staging/...` replaces, kept only when the release
    # actually requires them (e.g. k8s.io/sample-cli-plugin is replaced but never required and
    # not published for every release).
    mapfile -t staging < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$K8S_SRC/go.mod" | sort -u)
    mapfile -t required < <(awk '$2 == "v0.0.0" { print $1 }' "$K8S_SRC/go.mod" | sort -u)
    mapfile -t replaced < <(comm -12 <(printf '%s\n' "${staging[@]}") <(printf '%s\n' "${required[@]}"))
    ((${#replaced[@]})) || { log "found no staging modules in $K8S_SRC/go.mod"; exit 1; }

    minor_patch="${KUBERNETES_VERSION#v1.}"          # 36.3
    minor="${minor_patch%%.*}"                        # 36
    staging_version="v0.$minor_patch"                 # v0.36.3
    log "throwaway module $module: ${#replaced[@]} staging modules at $staging_version"
    {
        echo "module $module"
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

    build_date="$(go_module_info_field k8s.io/kubernetes "$KUBERNETES_VERSION" Time)"
    [[ -n $build_date ]] || build_date="1970-01-01T00:00:00Z"
    ldflags="-s -w"
    for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ldflags+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
    done
    # shellcheck disable=SC2034 # used by the scripts that source this file
    K8S_BUILD_FLAGS=(-trimpath -tags "selinux,notest,grpcnotrace" -ldflags "$ldflags")
}

# k8s_get WORKDIR PACKAGE...: adds packages of k8s.io/kubernetes (at $KUBERNETES_VERSION) and
# everything they import to the throwaway module's go.mod/go.sum.
k8s_get() {
    local work=$1
    shift
    log "resolving dependencies of $*"
    (cd "$work" && go get "${@/%/@$KUBERNETES_VERSION}" >&2)
}

# go_module_info_field MODULE VERSION FIELD: prints a field of the proxy's .info for a downloaded
# module version: Time (publish time) or Hash (the commit, only when the proxy recorded the
# module's Origin); prints nothing when it is not there.
go_module_info_field() {
    local info="$GOMODCACHE/cache/download/$1/@v/$2.info"
    { grep -o "\"$3\":\"[^\"]*\"" "$info" 2>/dev/null || true; } | cut -d'"' -f4
}
