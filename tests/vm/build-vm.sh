#!/usr/bin/env bash
# Idempotent setup of the VM that the IPVS tests boot (src/vm.rs): a stock Debian 12 cloud kernel,
# whose package carries the ip_vs modules the development kernel lacks, and the host tools the VM
# harness needs (qemu, a static busybox for the initramfs, cpio, and ipvsadm/ipset/iptables to copy
# into the VM).
#
# Output: $SPLITPROXY_TOOLS/vm-<kernel release>-<package version>/ holding `vmlinuz` and
# `lib/modules/<kernel release>/` (the netfilter, IPVS, ipset, veth and dummy modules with every
# module they depend on, and their modules.dep). The last line on stdout is that folder; progress
# goes to stderr. When the folder is complete it only checks the host packages.
#
# Why the cloud flavour: it is Debian's smallest kernel (made for VMs, few hardware drivers) and
# still builds IPVS, ipset, nf_tables and the xt_* matches as modules.
set -euo pipefail

# The pinned kernel: Debian 12 (bookworm) main's cloud kernel (main rather than bookworm-security,
# whose versions are replaced more often). The modules must come from this exact package: a module
# only loads into the kernel it was built with.
KERNEL_RELEASE=6.1.0-50-cloud-amd64
KERNEL_PACKAGE_VERSION=6.1.176-1

# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
dest="$SPLITPROXY_TOOLS/vm-$KERNEL_RELEASE-$KERNEL_PACKAGE_VERSION"

log() { echo "build-vm.sh: $*" >&2; }

# Tests run in parallel and each calls this script: one at a time, the others then find it done.
mkdir -p "$SPLITPROXY_TOOLS"
exec 9>"$SPLITPROXY_TOOLS/.build-vm.lock"
flock 9

# Host packages, by the file each one provides (dpkg -s alone would accept busybox's dynamic twin).
declare -A needs=(
    [/usr/bin/qemu-system-x86_64]=qemu-system-x86
    [/bin/busybox]=busybox-static
    [/usr/bin/cpio]=cpio
    [/usr/sbin/depmod]=kmod
    [/usr/sbin/ipvsadm]=ipvsadm
    [/usr/sbin/ipset]=ipset
    [/usr/sbin/iptables]=iptables
    [/usr/bin/ldd]=libc-bin
)
missing=()
for file in "${!needs[@]}"; do
    [[ -e $file ]] || missing+=("${needs[$file]}")
done
# The dynamic busybox has the same path but cannot run in the initramfs, which has no libraries
# for it.
if [[ -e /bin/busybox ]] && ! dpkg -s busybox-static >/dev/null 2>&1; then
    missing+=(busybox-static)
fi
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

if [[ -f $dest/vmlinuz && -f $dest/lib/modules/$KERNEL_RELEASE/modules.dep ]]; then
    echo "$dest"
    exit 0
fi

start=$SECONDS
work="$(mktemp -d -t splitproxy-vmbuild.XXXXXX)"
tmp="$dest.tmp.$$"
trap 'rm -rf "$work" "$tmp"' EXIT

package="linux-image-$KERNEL_RELEASE"
log "downloading $package $KERNEL_PACKAGE_VERSION"
# apt-get download writes into the current folder, which its sandbox user cannot write to.
download() {
    (cd "$work" &&
        apt-get download -q -o APT::Sandbox::User=root "$package=$KERNEL_PACKAGE_VERSION" >&2)
}
download || { apt-get update -qq >&2 && download; }
dpkg-deb -x "$work"/"${package}"_*.deb "$work/root"
full="$work/root/lib/modules/$KERNEL_RELEASE"
depmod -b "$work/root" "$KERNEL_RELEASE"

# What the VM loads: every netfilter module (conntrack, NAT, nf_tables, xt_*, ipset, IPVS and
# its schedulers) and the virtual links the tests build namespaces with.
mapfile -t wanted < <(
    cd "$full" &&
        find kernel/net/netfilter kernel/net/ipv4/netfilter kernel/net/ipv6/netfilter \
            -name '*.ko' &&
        echo kernel/drivers/net/veth.ko &&
        echo kernel/drivers/net/dummy.ko
)
# modules.dep lists each module's dependencies transitively, so one pass closes the set.
mapfile -t closure < <(
    awk -v list="${wanted[*]}" '
        BEGIN { n = split(list, w, " "); for (i = 1; i <= n; i++) want[w[i]] = 1 }
        { name = $1; sub(/:$/, "", name)
          if (name in want) { print name; for (i = 2; i <= NF; i++) print $i } }
    ' "$full/modules.dep" | sort -u
)
((${#closure[@]} >= ${#wanted[@]})) || { log "modules.dep lacks some wanted modules"; exit 1; }

rm -rf "$tmp"
modules="$tmp/lib/modules/$KERNEL_RELEASE"
mkdir -p "$modules"
cp "$work/root/boot/vmlinuz-$KERNEL_RELEASE" "$tmp/vmlinuz"
cp "$full/modules.order" "$full/modules.builtin" "$full/modules.builtin.modinfo" "$modules/"
(cd "$full" && cp --parents "${closure[@]}" "$modules/")
depmod -b "$tmp" "$KERNEL_RELEASE"

rm -rf "$dest"
mv "$tmp" "$dest"
log "${#closure[@]} modules of $KERNEL_RELEASE in $((SECONDS - start))s into $dest"
echo "$dest"
