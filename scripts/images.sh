#!/usr/bin/env bash
# Builds splitproxy's two container images as OCI archives, from release binaries, with no Docker
# and no registry:
#
#   localhost/splitproxy/agent:TAG       the agent, run as root (it programs netfilter);
#                                        iptables and ip6tables in both variants (nft and
#                                        legacy) behind deploy/images/iptables-wrapper, which
#                                        picks the node's at start; nft, ipset, conntrack and ip
#                                        for the other modes and the cleanup
#   localhost/splitproxy/controller:TAG  the controller, run as nonroot (65532); its binary,
#                                        splitproxy-ca (its CA's Jobs and certificate sidecar)
#                                        and CA roots
#
# `localhost/` is how podman names images that come from no registry; containerd needs a full
# name too, or the kubelet's lookups (which add `docker.io/`) would miss the imported image.
#
#   scripts/images.sh [--tag TAG] [--output DIR]
#
# TAG defaults to the workspace version (Cargo.toml); DIR to target/images. Each archive goes to
# DIR/splitproxy-{agent,controller}.tar, and `ctr -n k8s.io images import`, `podman load -i` or
# `skopeo copy oci-archive:FILE docker://REGISTRY/...` take it. The last stdout line is DIR; a
# line per image before it gives its reference, ID and sizes.
#
# Reproducible: the binaries are built with the work tree's path mapped away, in a cargo target
# folder outside the work tree ($SPLITPROXY_CACHE/cargo-target, so a fresh clone reuses the
# compiled dependencies), and every time in the images is the last commit's (SOURCE_DATE_EPOCH).
# The tools are this Debian 12 machine's packages (scripts/setup.sh installs them), copied with
# the shared libraries they load, as distroless images are made.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
# shellcheck source=scripts/oci.sh
source scripts/oci.sh

tag="$(awk -F'"' '/^\[workspace.package\]/ { p = 1 } p && $1 ~ /^version/ { print $2; exit }' Cargo.toml)"
out=target/images
while (($#)); do
    case $1 in
        --tag) tag=$2; shift 2 ;;
        --output) out=$2; shift 2 ;;
        *) echo "usage: $0 [--tag TAG] [--output DIR]" >&2; exit 64 ;;
    esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# The same build whoever calls it: a caller that is itself cargo (a test) passes its package's
# variables and jobserver on, and the build scripts that watch them would run again.
for variable in $(compgen -e); do
    case $variable in
        CARGO_HOME | RUSTUP_HOME | RUSTUP_TOOLCHAIN) ;;
        CARGO* | RUST* | __CARGO* | MAKEFLAGS | MFLAGS | OUT_DIR | TARGET | HOST | PROFILE | OPT_LEVEL | DEBUG | NUM_JOBS) unset "$variable" ;;
    esac
done
export CARGO_TARGET_DIR="$SPLITPROXY_CACHE/cargo-target"
scripts/lib/prune-other-work-trees.py "$PWD" "$CARGO_TARGET_DIR"
# Paths compiled into the binaries (panic locations, line tables) name no machine's folders: the
# dependencies' sources are under cargo's home, the same for every clone; the work tree's path is
# mapped for the workspace's crates alone (scripts/lib/remap-workspace-paths.sh says why).
export RUSTFLAGS="--remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
export SPLITPROXY_WORK_TREE="$PWD" RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/lib/remap-workspace-paths.sh"
echo "images.sh: building the release binaries in $CARGO_TARGET_DIR" >&2
# Not with SOURCE_DATE_EPOCH: build scripts that watch it (cc's) would rebuild half the tree at
# every commit. The images get it.
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
env -u SOURCE_DATE_EPOCH cargo build --release --locked -p splitproxy-agent -p splitproxy-controller >&2
export SOURCE_DATE_EPOCH=$epoch
bin="$CARGO_TARGET_DIR/release"

work="$(mktemp -d -t splitproxy-images.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# report NAME REFERENCE ID: one line with the archive's and the unpacked layer's sizes.
report() {
    local archive="$out/$1.tar" unpacked
    unpacked="$(du -sb --apparent-size "$work/$1" | cut -f1)"
    printf '%s %s %s archive=%s unpacked=%s\n' "$1" "$2" "$3" \
        "$(stat -c %s "$archive")" "$unpacked"
}

# ---- agent ---------------------------------------------------------------------------------
root="$work/splitproxy-agent"
rootfs_skeleton "$root"
mkdir -p "$root/usr/local/bin"
# Without their line tables (for backtraces' file:line), the binaries are a fifth of the size;
# their symbols stay, so a backtrace still names functions.
strip --strip-debug -o "$root/usr/local/bin/splitproxy-agent" "$bin/splitproxy-agent"
rootfs_copy_libraries "$root" "$bin/splitproxy-agent"
rootfs_netfilter_tools "$root"
agent_ref="localhost/splitproxy/agent:$tag"
agent_id="$(oci_archive "$root" "$agent_ref" "$out/splitproxy-agent.tar" "$(jq -cn '{
    User: "0:0", Entrypoint: ["/usr/local/bin/splitproxy-agent"],
    Env: ["PATH=/usr/local/bin:/usr/sbin:/usr/bin"] }')")"

# ---- controller ----------------------------------------------------------------------------
root="$work/splitproxy-controller"
rootfs_skeleton "$root"
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs"
# With splitproxy-ca: the CA Jobs and each controller Pod's certificate sidecar run it.
for program in splitproxy-controller splitproxy-ca; do
    strip --strip-debug -o "$root/usr/local/bin/$program" "$bin/$program"
    rootfs_copy_libraries "$root" "$bin/$program"
done
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
controller_ref="localhost/splitproxy/controller:$tag"
controller_id="$(oci_archive "$root" "$controller_ref" "$out/splitproxy-controller.tar" "$(jq -cn '{
    User: "65532:65532", Entrypoint: ["/usr/local/bin/splitproxy-controller"],
    Env: ["SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"] }')")"

report splitproxy-agent "$agent_ref" "$agent_id"
report splitproxy-controller "$controller_ref" "$controller_id"
echo "$out"
