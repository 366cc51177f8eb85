#!/usr/bin/env bash
# Idempotent installation of what the project's tests and lints need, on Debian 12, as root.
# Re-running it when everything is in place does no network access and takes well under a second.
#
#   - Debian packages (apt-get update only when one is missing), clang-19 and libbpf-dev among
#     them for the eBPF programs
#   - buf, from the npm package @bufbuild/buf, pinned
#   - grpcurl, built with `go install` from its Go module, pinned
#   - cargo-fuzz, built with `cargo install` from crates.io, pinned (scripts/fuzz.sh runs it on
#     the nightly toolchain)
#   - cargo-nextest, built with `cargo install` from crates.io, pinned (scripts/test.sh runs the
#     tests with it: a process per test, tests of every binary side by side, groups for what
#     tests share)
#
# Tools go to $SPLITPROXY_TOOLS (default /var/cache/splitproxy/tools, outside the work tree):
# one folder per tool and version, plus bin/ with symlinks to the pinned versions.
set -euo pipefail

BUF_VERSION=1.75.0       # npm: @bufbuild/buf
GRPCURL_VERSION=v1.9.4   # go: github.com/fullstorydev/grpcurl
CARGO_FUZZ_VERSION=0.13.1 # crates.io: cargo-fuzz
NEXTEST_VERSION=0.9.151   # crates.io: cargo-nextest
# clang-19 and libbpf-dev compile the eBPF mode's programs (dataplane/build.rs).
APT_PACKAGES=(iptables iproute2 conntrack curl ca-certificates openssl nftables ipset clang-19 libbpf-dev)

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
TOOLS="$SPLITPROXY_TOOLS"
mkdir -p "$TOOLS/bin"

# Noisy installer output goes to a log, shown only when a step fails.
LOG="$(mktemp -t splitproxy-setup.XXXXXX)"
trap 'rm -f "$LOG"' EXIT
quiet() {
    if ! "$@" >>"$LOG" 2>&1; then
        echo "setup.sh: failed: $*" >&2
        cat "$LOG" >&2
        exit 1
    fi
}

# ---- Debian packages -------------------------------------------------------------------------
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
# buf comes from npm: get npm from Debian only when there is none at all (a node install that
# ships its own npm, e.g. nodesource's nodejs, must not be fought with Debian's npm package).
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    quiet apt-get update
    quiet apt-get install -y --no-install-recommends "${missing[@]}"
fi

# ---- buf (npm) -------------------------------------------------------------------------------
case "$(uname -m)" in
    x86_64 | amd64) buf_platform=linux-x64 ;;
    aarch64 | arm64) buf_platform=linux-aarch64 ;;
    armv7l) buf_platform=linux-armv7 ;;
    *) buf_platform="" ;;
esac
buf_dir="$TOOLS/buf-$BUF_VERSION"
# The native binary from the platform package; the main package's bin/buf is a node wrapper
# around it, used only where there is no platform package.
buf_bin="$buf_dir/node_modules/@bufbuild/buf-$buf_platform/bin/buf"
[[ -n $buf_platform ]] || buf_bin="$buf_dir/node_modules/@bufbuild/buf/bin/buf"
if [[ ! -x $buf_bin ]]; then
    tmp="$buf_dir.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    quiet npm install --prefix "$tmp" --no-audit --no-fund --no-save --include=optional \
        --loglevel=error "@bufbuild/buf@$BUF_VERSION"
    rm -rf "$buf_dir"
    mv "$tmp" "$buf_dir"
    if [[ ! -x $buf_bin ]]; then
        echo "setup.sh: @bufbuild/buf@$BUF_VERSION installed no $buf_bin" >&2
        exit 1
    fi
fi
ln -sfn "$buf_bin" "$TOOLS/bin/buf"

# ---- grpcurl (go install) --------------------------------------------------------------------
grpcurl_dir="$TOOLS/grpcurl-$GRPCURL_VERSION"
if [[ ! -x $grpcurl_dir/grpcurl ]]; then
    if ! command -v go >/dev/null 2>&1; then
        echo "setup.sh: go not found (expected /usr/local/go/bin/go)" >&2
        exit 1
    fi
    tmp="$grpcurl_dir.tmp.$$"
    rm -rf "$tmp"
    # Module and build caches live in the tools cache, so a rebuild after a bump reuses them.
    quiet env GOBIN="$tmp" GOPATH="$TOOLS/go" GOMODCACHE="$TOOLS/go/pkg/mod" \
        GOCACHE="$TOOLS/go/cache" GOTOOLCHAIN=local GOFLAGS="-modcacherw -buildvcs=false" \
        go install -ldflags "-X main.version=$GRPCURL_VERSION" \
        "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
    rm -rf "$grpcurl_dir"
    mv "$tmp" "$grpcurl_dir"
fi
ln -sfn "$grpcurl_dir/grpcurl" "$TOOLS/bin/grpcurl"

# ---- cargo-fuzz and cargo-nextest (cargo install), and the nightly toolchain cargo-fuzz needs -----
# cargo_tool CRATE VERSION BINARY [ARGS...]: installs CRATE at VERSION into its own folder (ARGS
# go to cargo install) and links BINARY into bin/.
cargo_tool() {
    local crate=$1 version=$2 binary=$3 dir="$TOOLS/$1-$2" tmp
    shift 3
    if [[ ! -x $dir/bin/$binary ]]; then
        tmp="$dir.tmp.$$"
        rm -rf "$tmp"
        quiet cargo install "$crate" --locked --version "$version" --root "$tmp" "$@"
        rm -rf "$dir"
        mv "$tmp" "$dir"
    fi
    ln -sfn "$dir/bin/$binary" "$TOOLS/bin/$binary"
}
cargo_tool cargo-fuzz "$CARGO_FUZZ_VERSION" cargo-fuzz
# Without the self-update feature: the pinned version is the one that runs.
cargo_tool cargo-nextest "$NEXTEST_VERSION" cargo-nextest --no-default-features --features default-no-update
rustup toolchain list | grep -q '^nightly' || quiet rustup toolchain install nightly --profile minimal

# ---- report ----------------------------------------------------------------------------------
echo "buf $("$TOOLS/bin/buf" --version 2>&1)"
"$TOOLS/bin/grpcurl" -version 2>&1
"$TOOLS/bin/cargo-fuzz" --version
"$TOOLS/bin/cargo-nextest" nextest --version | head -n1
