# shellcheck shell=bash
# Sourced by the build-*.sh scripts: the shared Go build environment and module helpers.
# Expects SCRIPT (the caller's name, for messages) and TOOLS (the tools cache) to be set.

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
