#!/usr/bin/env bash
# Installs the Debian packages the lab cluster needs beyond scripts/setup.sh's, idempotently:
# runc (containerd's runtime), mmdebstrap (the agnhost image's Debian root), util-linux's
# nsenter and findmnt, jq, and the static busybox of the busybox test image. Nothing to do (and no network) when they are in place.
set -euo pipefail
packages=(runc mmdebstrap busybox-static util-linux jq)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "setup.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
