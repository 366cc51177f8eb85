#!/usr/bin/env bash
# Sets up what the tests need and runs all of them: lints (buf, rustfmt, clippy), a bounded fuzz
# run, unit and in-process tests, and the end-to-end tests in network namespaces on the real
# kernel (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

scripts/setup.sh
# The real control plane for the control-plane tests: built once from the official Kubernetes and
# etcd Go modules (about 20 minutes cold on 2 cores), then cached in $SPLITPROXY_TOOLS.
tests/controlplane/build-kubernetes.sh >/dev/null
tests/controlplane/build-etcd.sh >/dev/null
# The trace receiver for the tracing test: Jaeger v2 from its Go module, cached the same way.
tests/tracing/build-jaeger.sh >/dev/null
# The VM for the IPVS tests: qemu and a pinned Debian kernel with its IPVS modules, cached the same way.
tests/vm/build-vm.sh >/dev/null
# The real cluster (tests/cluster): kubelet, containerd, the CNI plugins, CoreDNS, upstream's
# network e2e tests and the lab's images, cached the same way.
tests/cluster/setup.sh
tests/cluster/build-containerd.sh >/dev/null
tests/cluster/build-cni-plugins.sh >/dev/null
tests/cluster/images.sh >/dev/null
scripts/lint.sh
# Hostile input for the agent's conversion and the renderer: 60 s per cargo-fuzz target.
scripts/fuzz.sh 60
# The end-to-end tests start the workspace's binaries; build them in the tests' profile first.
cargo build --workspace --bins

log="$(mktemp -t splitproxy-test.XXXXXX)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee "$log" || status=$?
# One closing line over every test binary (cargo prints one "test result" line per binary).
awk '/^test result:/ { passed += $4; failed += $6; ignored += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"

# Upstream's own tests on the real cluster: CI's bounded share, the [Conformance] Service specs
# against splitproxy in iptables mode (scripts/conformance.sh with no flags runs the whole
# matrix: three proxies, every Service spec).
trap 'rm -f "$log"; scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
scripts/conformance.sh --proxy iptables --workers 2 \
    --focus '\[sig-network\] Services .*\[Conformance\]' --output target/conformance-ci || status=$?
exit "$status"
