#!/usr/bin/env bash
# Sets up what the tests need and runs them (needs root): lints (buf, rustfmt, clippy), a bounded
# fuzz run, and every test with cargo-nextest (.config/nextest.toml): unit and in-process tests,
# end-to-end tests in network namespaces on the real kernel, on a real control plane, in a qemu
# VM and on a real kubelet cluster, and upstream's [Conformance] Service specs on that cluster
# (tests/tests/conformance_share.rs). Ends with a table of its phases' wall times, one of the
# test binaries and one of the tests that took longer than 30 s (docs/testing.md keeps the latest).
#
#   scripts/test.sh         the CI tier: what .ci/run runs (about 20 minutes warm, see
#                           docs/testing.md)
#   scripts/test.sh --all   the CI tier, then what is too long for CI: upstream's whole e2e
#                           matrix (scripts/conformance.sh: every selected [sig-network] spec
#                           against kube-proxy and splitproxy's three modes, about 110 minutes), the
#                           differential test over 20 seeds (scripts/differential.sh) and 10
#                           minutes of fuzzing per target
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/lib/phases.sh

all=false
case ${1:-} in
    "") ;;
    --all) all=true ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 64 ;;
esac

# Cargo's builds are cached outside the work tree, like the tools: a fresh clone compiles only the
# workspace's own crates. Incremental state never helps a fresh clone; it only takes disk.
export CARGO_TARGET_DIR="$SPLITPROXY_CACHE/cargo-target" CARGO_INCREMENTAL=0
scripts/lib/prune-other-work-trees.py "$PWD" "$CARGO_TARGET_DIR"
junit=target/nextest/default/junit.xml
rm -f "$junit"

report() {
    phase_join || true
    phase_table
    [[ -f $junit ]] && python3 scripts/lib/test-times.py "$junit" 30
    scripts/cluster.sh down >/dev/null 2>&1 || true
}
trap report EXIT

phase "set-up" scripts/setup.sh
# The real control plane for the control-plane tests, built once from the official Kubernetes and
# etcd Go modules, then cached in $SPLITPROXY_TOOLS like every build below.
phase "build: Kubernetes" tests/controlplane/build-kubernetes.sh >/dev/null
phase "build: etcd" tests/controlplane/build-etcd.sh >/dev/null
# The VM for the IPVS tests: qemu and a pinned Debian kernel with its IPVS modules.
phase "build: VM kernel" tests/vm/build-vm.sh >/dev/null
# Beside everything after the control plane's build, on the CPU the image builds and the tests
# leave idle (they wait on downloads, kubelets, rollouts and timeouts): the trace receiver for
# the tracing test (Jaeger v2 from its Go module), which that test, run last, waits for if it
# has to; and the fuzz targets' instrumented build. On a cold cache each takes about half an
# hour; started only with the tests, they held the tests up to as long.
phase_beside "build: Jaeger" tests/tracing/build-jaeger.sh
phase_beside "build: fuzz targets" scripts/fuzz.sh --build-only
# The real cluster (tests/cluster): kubelet, containerd, the CNI plugins, CoreDNS, upstream's
# network e2e tests and the lab's images.
phase "set-up: cluster packages" tests/cluster/setup.sh
phase "build: containerd" tests/cluster/build-containerd.sh >/dev/null
phase "build: CNI plugins" tests/cluster/build-cni-plugins.sh >/dev/null
phase "build: cluster images" tests/cluster/images.sh >/dev/null
phase "lint" scripts/lint.sh
# Every target in one build, with the features the tests switch on, so that the test run compiles
# nothing more and the end-to-end tests find the binaries they start beside them.
phase "build: workspace" cargo build --workspace --all-targets
# The release images, which the real cluster's tests install: built before their first test
# starts rather than inside it.
phase "build: images" scripts/images.sh >/dev/null

status=0
phase "tests" cargo nextest run --workspace --all-targets || status=$?
phase_join || status=1
# Hostile input for the agent's conversion and the renderer: 60 s per cargo-fuzz target.
phase "fuzz" scripts/fuzz.sh 60 || status=$?

if $all; then
    phase "conformance: the whole matrix" scripts/conformance.sh || status=$?
    phase "differential: 20 seeds" scripts/differential.sh --seeds 20 || status=$?
    phase "fuzz: 10 minutes per target" scripts/fuzz.sh 600 || status=$?
fi
exit "$status"
