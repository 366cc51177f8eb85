# shellcheck shell=bash
# Sourced by the project's scripts: where the pinned tools live and a PATH that finds them.
# Safe under `set -euo pipefail` and safe to source more than once.
#
#   SPLITPROXY_TOOLS  tools cache outside the work tree (default /var/cache/splitproxy/tools);
#                     scripts/setup.sh installs into it, $SPLITPROXY_TOOLS/bin holds the symlinks.
#   SPLITPROXY_CACHE  the folder above it (default /var/cache/splitproxy), which also holds the
#                     cargo target folder of scripts/test.sh and scripts/images.sh (cargo-target).

export SPLITPROXY_TOOLS="${SPLITPROXY_TOOLS:-/var/cache/splitproxy/tools}"
export SPLITPROXY_CACHE="${SPLITPROXY_CACHE:-$(dirname "$SPLITPROXY_TOOLS")}"

_splitproxy_path_prepend() {
    case ":${PATH:-}:" in
        *":$1:"*) ;;
        *) PATH="$1${PATH:+:$PATH}" ;;
    esac
}
# Prepended in reverse so the final order is: tools bin, cargo, go.
_splitproxy_path_prepend /usr/local/go/bin
_splitproxy_path_prepend "${HOME:-/root}/.cargo/bin"
_splitproxy_path_prepend "$SPLITPROXY_TOOLS/bin"
unset -f _splitproxy_path_prepend
export PATH
