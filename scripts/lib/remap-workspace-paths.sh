#!/bin/sh
# Cargo's RUSTC_WORKSPACE_WRAPPER for scripts/images.sh: compiles the workspace's own crates with
# the work tree's path mapped to /splitproxy, so the binaries are the same from any clone. Passed
# to the workspace's crates alone (not through RUSTFLAGS, which every dependency's build depends
# on), it leaves the compiled dependencies of one clone good for the next.
exec "$@" "--remap-path-prefix=$SPLITPROXY_WORK_TREE=/splitproxy"
