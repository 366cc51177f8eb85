#!/usr/bin/env bash
# Builds the lab cluster's own images as OCI archives (scripts/oci.sh), under the names the
# kubelet, kubeadm's manifests and upstream's e2e tests use, so that no node ever pulls:
#
#   pause     upstream's pause.c, compiled here (the Pod sandbox; runs as 65535 as upstream's)
#   coredns   CoreDNS from its Go module (runs as root; its manifest keeps only NET_BIND_SERVICE)
#   agnhost   upstream's e2e test image: agnhost from the Kubernetes module on a Debian 12
#             minbase (mmdebstrap) with the tools its upstream image carries (bash, curl,
#             netcat-openbsd, iproute2, dig, iperf), its porter certificates, and its users
#   busybox   Debian's static busybox with its applets linked (upstream's is busybox 1.37)
#   nginx     Debian's nginx-light in the foreground (the EndpointSlice tests only run it)
#   regression-issue-74839  upstream's program for that conntrack test, from the module
#   kube-proxy  upstream kube-proxy with the same netfilter tools as splitproxy's agent image
#
# Output: $SPLITPROXY_TOOLS/cluster-images-<key>/*.tar, the key naming the versions and this
# script's inputs; the last stdout line is that folder. When it is complete it does nothing.
set -euo pipefail
shopt -s inherit_errexit
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/env.sh
source "$REPO/scripts/env.sh"
# shellcheck source=scripts/oci.sh
source "$REPO/scripts/oci.sh"
# shellcheck source=tests/cluster/lib/common.sh
source "$REPO/tests/cluster/lib/common.sh"

# The Debian packages of the agnhost and nginx images, beside minbase. Upstream's agnhost is
# Alpine, whose busybox gives it wget; several Service specs exec wget in agnhost pods.
AGNHOST_PACKAGES=bash,curl,wget,netcat-openbsd,iproute2,bind9-dnsutils,iperf,iputils-ping,procps
NGINX_PACKAGES=nginx-light

# The key: this script, what it packs with, and the names and release it builds from common.sh
# (not the whole of it, so that a change to the cluster's scripts rebuilds no image).
key="$({
    cat "${BASH_SOURCE[0]}" "$REPO/scripts/oci.sh" "$REPO/deploy/images/iptables-wrapper"
    declare -p KUBERNETES_VERSION PAUSE_IMAGE COREDNS_IMAGE AGNHOST_IMAGE BUSYBOX_IMAGE \
        NGINX_IMAGE REGRESSION_74839_IMAGE KUBE_PROXY_IMAGE
} | sha256sum | cut -c1-12)"
dest="$SPLITPROXY_TOOLS/cluster-images-$key"
names=(pause coredns agnhost busybox nginx regression-issue-74839 kube-proxy)
complete() {
    local name
    for name in "${names[@]}"; do [[ -f $1/$name.tar ]] || return 1; done
}
if complete "$dest"; then
    echo "$dest"
    exit 0
fi

kube_bin="$("$REPO/tests/controlplane/build-kubernetes.sh" | tail -n1)"
e2e_bin="$("$REPO/tests/cluster/build-e2e.sh" | tail -n1)"
coredns_bin="$("$REPO/tests/cluster/build-coredns.sh" | tail -n1)"
k8s_src="$SPLITPROXY_TOOLS/go/pkg/mod/k8s.io/kubernetes@$KUBERNETES_VERSION"
# The images carry no build time: every time in them is this fixed instant.
export SOURCE_DATE_EPOCH=0

tmp="$dest.tmp.$$"
work="$(mktemp -d -t splitproxy-cluster-images.XXXXXX)"
trap 'rm -rf "$work" "$tmp"' EXIT
mkdir -p "$tmp"

# ---- pause ---------------------------------------------------------------------------------
root="$work/pause"
mkdir -p "$root"
install -m 0755 "$e2e_bin/pause" "$root/pause"
oci_archive "$root" "$PAUSE_IMAGE" "$tmp/pause.tar" \
    '{"User": "65535:65535", "Entrypoint": ["/pause"]}' >/dev/null

# ---- coredns -------------------------------------------------------------------------------
root="$work/coredns"
rootfs_skeleton "$root"
install -m 0755 "$coredns_bin/coredns" "$root/coredns"
oci_archive "$root" "$COREDNS_IMAGE" "$tmp/coredns.tar" \
    '{"User": "0:0", "Entrypoint": ["/coredns"]}' >/dev/null

# debian_root NAME PACKAGES: unpacks a Debian 12 minbase root with PACKAGES into $work/NAME.
# The root is cached by its package list (mmdebstrap takes a minute or two), without manuals.
debian_root() {
    local cached
    cached="$SPLITPROXY_TOOLS/debian-bookworm-$(echo "$2" | sha256sum | cut -c1-12).tar"
    if [[ ! -f $cached ]]; then
        echo "images.sh: making a Debian 12 root with $2" >&2
        mmdebstrap --quiet --format=tar --variant=minbase --include="$2" --skip=output/dev \
            --dpkgopt="path-exclude=/usr/share/man/*" --dpkgopt="path-exclude=/usr/share/doc/*" \
            --dpkgopt="path-exclude=/usr/share/locale/*" bookworm "$cached.tmp" >&2
        mv "$cached.tmp" "$cached"
    fi
    mkdir -p "$work/$1"
    tar -xf "$cached" -C "$work/$1" --numeric-owner
}

# ---- agnhost -------------------------------------------------------------------------------
debian_root agnhost "$AGNHOST_PACKAGES"
root="$work/agnhost"
install -m 0755 "$e2e_bin/agnhost" "$root/agnhost"
ln -s agnhost "$root/agnhost-2"
ln -s /usr/bin/iperf "$root/usr/local/bin/iperf"
install -m 0755 "$coredns_bin/coredns" "$root/coredns"
mkdir -p "$root/uploads"
cp "$k8s_src/test/images/agnhost/porter/localhost.crt" "$k8s_src/test/images/agnhost/porter/localhost.key" "$root/"
chmod 0644 "$root/localhost.crt" "$root/localhost.key"
# The user and group upstream's image defines, which some tests name.
echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >>"$root/etc/passwd"
printf '%s\n' 'user-defined-in-image:x:1000:' 'group-defined-in-image:x:50000:user-defined-in-image' \
    >>"$root/etc/group"
oci_archive "$root" "$AGNHOST_IMAGE" "$tmp/agnhost.tar" \
    '{"Entrypoint": ["/agnhost"], "Cmd": ["pause"], "ExposedPorts": {"80/tcp": {}, "8080/tcp": {}, "8081/tcp": {}, "9376/tcp": {}, "5000/tcp": {}}}' >/dev/null

# ---- busybox -------------------------------------------------------------------------------
root="$work/busybox"
mkdir -p "$root/bin" "$root/etc" "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
    [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"
done
printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/:/bin/false' >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
chmod 1777 "$root/tmp"
oci_archive "$root" "$BUSYBOX_IMAGE" "$tmp/busybox.tar" '{"Cmd": ["sh"]}' >/dev/null

# ---- nginx ---------------------------------------------------------------------------------
debian_root nginx "$NGINX_PACKAGES"
oci_archive "$work/nginx" "$NGINX_IMAGE" "$tmp/nginx.tar" \
    '{"Cmd": ["nginx", "-g", "daemon off;"], "ExposedPorts": {"80/tcp": {}}}' >/dev/null

# ---- regression-issue-74839 -----------------------------------------------------------------
root="$work/regression-issue-74839"
rootfs_skeleton "$root"
install -m 0755 "$e2e_bin/regression-issue-74839" "$root/regression-issue-74839"
oci_archive "$root" "$REGRESSION_74839_IMAGE" "$tmp/regression-issue-74839.tar" \
    '{"Entrypoint": ["/regression-issue-74839"]}' >/dev/null

# ---- kube-proxy ----------------------------------------------------------------------------
root="$work/kube-proxy"
rootfs_skeleton "$root"
mkdir -p "$root/usr/local/bin"
install -m 0755 "$kube_bin/kube-proxy" "$root/usr/local/bin/kube-proxy"
rootfs_netfilter_tools "$root"
oci_archive "$root" "$KUBE_PROXY_IMAGE" "$tmp/kube-proxy.tar" \
    '{"User": "0:0", "Entrypoint": ["/usr/local/bin/kube-proxy"], "Env": ["PATH=/usr/local/bin:/usr/sbin:/usr/bin"]}' >/dev/null

rm -rf "$dest"
mv "$tmp" "$dest"
for name in "${names[@]}"; do
    echo "images.sh: $name $(stat -c %s "$dest/$name.tar") bytes" >&2
done
echo "$dest"
