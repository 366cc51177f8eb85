# shellcheck shell=bash
# Sourced by the image builds (scripts/images.sh, tests/cluster/images.sh): turns a root folder into
# a one-layer OCI image archive (the OCI image layout, tarred), with no Docker and no registry.
#
# Reproducible: the layer and the archive are tars with sorted names, numeric root ownership and
# every time set to SOURCE_DATE_EPOCH, compressed with `gzip -n`; the config's `created` is the
# same instant. The same root folder and settings give the same bytes, so the same image ID.
#
# Consumers: `ctr images import` (the name comes from the `io.containerd.image.name`
# annotation), `podman load` and `skopeo copy oci-archive:FILE …` (from
# `org.opencontainers.image.ref.name`, which holds the full reference as containerd writes it on
# export).

# rootfs_skeleton ROOT: the merged-/usr layout of Debian 12 (bin, sbin and lib are links into
# usr), /etc/passwd and /etc/group with root and nonroot (65532, as distroless images), and the
# writable folders programs expect.
rootfs_skeleton() {
    local root=$1 dir
    mkdir -p "$root"/usr/{bin,sbin,lib,lib64} "$root"/{etc,run,tmp,var}
    for dir in bin sbin lib lib64; do ln -sfn "usr/$dir" "$root/$dir"; done
    ln -sfn ../run "$root/var/run"
    chmod 1777 "$root/tmp"
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
        'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$root/etc/group"
}

# rootfs_copy_program ROOT FILE...: copies each program (or shared object) into ROOT at the same
# path, with the shared libraries it loads (rootfs_copy_libraries).
rootfs_copy_program() {
    local root=$1 file
    shift
    for file in "$@"; do
        [[ -e $file ]] || { echo "oci.sh: $file not found" >&2; return 1; }
        mkdir -p "$root$(dirname "$file")"
        cp -L --preserve=mode "$file" "$root$file"
        rootfs_copy_libraries "$root" "$file"
    done
}

# rootfs_copy_libraries ROOT FILE...: copies every shared library `ldd` lists for each FILE (and
# the dynamic loader) into ROOT, under the library's real folder and by the name FILE asks for.
# Static programs need nothing.
rootfs_copy_libraries() {
    local root=$1 file lib dir
    shift
    for file in "$@"; do
        # `ldd` prints `name => /path (addr)` for libraries and `/path (addr)` for the loader.
        while read -r lib; do
            dir="$(readlink -f "$(dirname "$lib")")"
            mkdir -p "$root$dir"
            [[ -e $root$dir/$(basename "$lib") ]] ||
                cp -L --preserve=mode "$lib" "$root$dir/$(basename "$lib")"
        done < <(ldd "$file" 2>/dev/null |
            awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
    done
}

# rootfs_netfilter_tools ROOT: what a Service proxy's image needs on any node, from this
# machine's Debian packages: iptables and ip6tables in both variants (nft and legacy), reached
# through deploy/images/iptables-wrapper, which picks the node's variant at the first call (as
# Kubernetes' iptables images do); nft, ipset, conntrack and ip; /bin/sh (dash) for the wrapper.
rootfs_netfilter_tools() {
    local root=$1 libdir family tool variant
    local wrapper
    wrapper="$(dirname "${BASH_SOURCE[0]}")/../deploy/images/iptables-wrapper"
    libdir="$(dirname "$(readlink -f /usr/lib/x86_64-linux-gnu/libc.so.6)")"
    rootfs_copy_program "$root" /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi \
        "$libdir"/xtables/*.so /usr/sbin/nft /usr/sbin/ipset /usr/sbin/conntrack \
        "$(command -v ip)" /usr/bin/dash
    ln -sfn dash "$root/usr/bin/sh"
    install -m 0755 "$wrapper" "$root/usr/sbin/iptables-wrapper"
    for family in iptables ip6tables; do
        for tool in "" -save -restore; do
            ln -sfn iptables-wrapper "$root/usr/sbin/$family$tool"
            for variant in nft legacy; do
                ln -sfn "xtables-$variant-multi" "$root/usr/sbin/$family-$variant$tool"
            done
        done
    done
    cp /etc/protocols /etc/services /etc/ethertypes "$root/etc/"
    cp -r /etc/iproute2 "$root/etc/"
}

# oci_archive ROOT REFERENCE OUT CONFIG_JSON: writes OUT, an OCI archive of one layer holding ROOT,
# named REFERENCE (e.g. `registry.k8s.io/pause:3.10.1`), whose image config's `config` object is
# CONFIG_JSON (Entrypoint, Cmd, User, Env, WorkingDir, Labels...). Prints the image's config
# digest (its ID) on stdout.
oci_archive() {
    local root=$1 reference=$2 out=$3 runtime_config=$4
    local epoch=${SOURCE_DATE_EPOCH:?set SOURCE_DATE_EPOCH for a reproducible image}
    local work created layer_tar diff_id layer_digest layer_size config config_digest
    local manifest manifest_digest
    work="$(mktemp -d -t splitproxy-oci.XXXXXX)"
    created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
    mkdir -p "$work/layout/blobs/sha256"

    layer_tar="$work/layer.tar"
    _oci_tar "$root" "$layer_tar" "$epoch"
    diff_id="sha256:$(sha256sum "$layer_tar" | cut -d' ' -f1)"
    gzip -n -9 "$layer_tar"
    layer_size="$(stat -c %s "$layer_tar.gz")"
    layer_digest="$(_oci_blob "$work/layout" "$layer_tar.gz")"

    config="$(jq -cn --arg created "$created" --arg diff_id "$diff_id" \
        --argjson config "$runtime_config" '{
        created: $created, architecture: "amd64", os: "linux", config: $config,
        rootfs: { type: "layers", diff_ids: [$diff_id] },
        history: [{ created: $created, created_by: "splitproxy scripts/oci.sh" }] }')"
    printf '%s' "$config" >"$work/config.json"
    config_digest="$(_oci_blob "$work/layout" "$work/config.json")"

    manifest="$(jq -cn --arg config "$config_digest" --argjson config_size "${#config}" \
        --arg layer "$layer_digest" --argjson layer_size "$layer_size" '{
        schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
        config: { mediaType: "application/vnd.oci.image.config.v1+json",
                  digest: $config, size: $config_size },
        layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar+gzip",
                   digest: $layer, size: $layer_size }] }')"
    printf '%s' "$manifest" >"$work/manifest.json"
    manifest_digest="$(_oci_blob "$work/layout" "$work/manifest.json")"

    jq -cn --arg digest "$manifest_digest" --argjson size "${#manifest}" \
        --arg reference "$reference" '{
        schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
        manifests: [{ mediaType: "application/vnd.oci.image.manifest.v1+json",
                      digest: $digest, size: $size,
                      platform: { architecture: "amd64", os: "linux" },
                      annotations: { "io.containerd.image.name": $reference,
                                     "org.opencontainers.image.ref.name": $reference } }] }' \
        >"$work/layout/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"

    mkdir -p "$(dirname "$out")"
    _oci_tar "$work/layout" "$out.tmp" "$epoch"
    mv "$out.tmp" "$out"
    rm -rf "$work"
    echo "$config_digest"
}

# _oci_tar DIR OUT EPOCH: a reproducible tar of DIR's contents (names relative to DIR).
_oci_tar() {
    (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
        tar --create --file "$2" --no-recursion --files-from - --format=posix \
            --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
            --mtime="@$3" --owner=0 --group=0 --numeric-owner)
}

# _oci_blob LAYOUT FILE: moves FILE into LAYOUT's blobs by its digest; prints the digest.
_oci_blob() {
    local digest
    digest="$(sha256sum "$2" | cut -d' ' -f1)"
    mv "$2" "$1/blobs/sha256/$digest"
    echo "sha256:$digest"
}
