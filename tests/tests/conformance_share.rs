//! CI's share of upstream's own e2e tests: Kubernetes v1.36.3's `[Conformance]` Service specs
//! against splitproxy in iptables mode, installed from `deploy/` on the real cluster, through
//! `scripts/conformance.sh` (which, with no flags, runs the whole matrix: every selected
//! `[sig-network]` spec against kube-proxy and both splitproxy modes). Needs root, and the
//! cluster to itself (the `real-cluster` test group in `.config/nextest.toml`).
//!
//! Ginkgo's report and the results table go to `target/conformance-ci/`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

#[test]
fn upstreams_conformance_service_specs_pass_against_splitproxy_in_iptables_mode() -> Result<()> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = Command::new(repo.join("scripts/conformance.sh"))
        .args([
            "--proxy",
            "iptables",
            "--workers",
            "2",
            "--focus",
            r"\[sig-network\] Services .*\[Conformance\]",
            "--output",
        ])
        .arg(repo.join("target/conformance-ci"))
        .status()
        .context("running scripts/conformance.sh")?;
    let down = Command::new(repo.join("scripts/cluster.sh"))
        .arg("down")
        .status()
        .context("running scripts/cluster.sh down")?;
    ensure!(
        status.success(),
        "upstream's specs failed against splitproxy ({status}); see target/conformance-ci/"
    );
    ensure!(down.success(), "scripts/cluster.sh down failed with {down}");
    Ok(())
}
