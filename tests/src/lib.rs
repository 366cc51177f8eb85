//! End-to-end harnesses for splitproxy: a lab of network namespaces, the test address block, and
//! a tiny HTTP test pod with a client that counts which endpoint answered.
//!
//! The lab needs root (it creates network namespaces); everything it creates stays inside them.

pub mod addresses;
pub mod bpffs;
pub mod control_plane;
pub mod corpus;
pub mod demo_cluster;
pub mod flows;
pub mod jaeger;
pub mod lab;
pub mod load;
pub mod nft_compare;
pub mod pki;
pub mod real_cluster;
pub mod rule_compare;
pub mod sctp;
pub mod service_generator;
pub mod subscribe;
pub mod testpod;
pub mod vm;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub use testpod::{HitReport, expect_answers, expect_reached, hit, load_report, serve, start_load};

/// The path of a binary built from this workspace (`sp-testpod`, `splitproxy-controller`, …), found
/// next to the running test executable: `target/<profile>/deps/<test>` → `target/<profile>/<name>`.
///
/// # Errors
///
/// If the running executable's path is unknown or the binary has not been built.
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the running test executable")?;
    let mut dir = exe
        .parent()
        .context("the test executable has no directory")?;
    if dir.ends_with("deps") {
        dir = dir.parent().context("the deps directory has no parent")?;
    }
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "binary {name} not found at {}; build it first with `cargo build --workspace --bins` \
             (same profile as the tests)",
            path.display()
        );
    }
    Ok(path)
}

/// Runs the idempotent build script `script` (a path under `tests/`, such as
/// `controlplane/build-etcd.sh`) and returns the folder it prints last: the built tool's `bin`
/// directory in the tools cache. Quick when the tool is already built.
///
/// # Errors
///
/// If the script fails or prints no folder.
pub fn built_tool(script: &str) -> Result<PathBuf> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let output = std::process::Command::new("bash")
        .arg(&path)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {script}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{script} failed with {}",
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .last()
        .context("the build script printed no folder")?;
    Ok(PathBuf::from(dir.trim()))
}

/// Calls `attempt` until it succeeds or `timeout` has passed, pausing a little longer each time;
/// for waiting on things that become true eventually (a server listening, rules applied).
///
/// # Errors
///
/// If `attempt` still fails when `timeout` has passed: its last error, saying what was awaited.
pub fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut attempt: impl FnMut() -> Result<T>,
) -> Result<T> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    let mut tries = 0_u32;
    loop {
        tries += 1;
        match attempt() {
            Ok(value) => return Ok(value),
            Err(e) if start.elapsed() >= timeout => {
                return Err(e.context(format!(
                    "{what}: still failing after {tries} tries in {timeout:?}"
                )));
            }
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// The value of one series (`name` or `name{labels}`, as the exposition writes it) on the
/// metrics address of the agent on `node` (`127.0.0.1:10249` inside the node); zero while the
/// agent does not export it yet, as a counter family before its first label set.
///
/// # Errors
///
/// If the metrics cannot be fetched or the value does not parse.
pub fn agent_metric(lab: &lab::Lab, node: &lab::Node, series: &str) -> Result<f64> {
    Ok(scrape(lab, node, 10249, series)?.unwrap_or(0.0))
}

/// The value of one series (`name` or `name{labels}`) on the `/metrics` of the controller on
/// `host` (`127.0.0.1:10662` there); `None` while it does not export it.
///
/// # Errors
///
/// If the metrics cannot be fetched or the value does not parse.
pub fn controller_metric(lab: &lab::Lab, host: &lab::Host, series: &str) -> Result<Option<f64>> {
    scrape(lab, host, 10662, series)
}

/// The value of one series on `http://127.0.0.1:{port}/metrics` inside `ns`; `None` while it
/// is not exported.
///
/// # Errors
///
/// If the metrics cannot be fetched or the value does not parse.
pub fn scrape(
    lab: &lab::Lab,
    ns: &(impl lab::HasNamespace + ?Sized),
    port: u16,
    series: &str,
) -> Result<Option<f64>> {
    let url = format!("http://127.0.0.1:{port}/metrics");
    let text = lab.exec_ok(ns, "curl", &["-sf", "-m", "5", &url])?;
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|value| {
            value
                .trim()
                .parse()
                .with_context(|| format!("{series} has the value {value:?}"))
        })
        .transpose()
}

/// Waits until the agent on each of `nodes` has counted a reconnect, i.e. has noticed that its
/// controller is gone.
///
/// # Errors
///
/// If an agent has counted none within `timeout`.
pub fn await_reconnects(lab: &lab::Lab, nodes: &[lab::Node], timeout: Duration) -> Result<()> {
    for node in nodes {
        eventually("the agent notices the controller is gone", timeout, || {
            let reconnects = agent_metric(lab, node, "splitproxy_agent_reconnects_total")?;
            anyhow::ensure!(
                reconnects > 0.0,
                "{}: no reconnect counted yet",
                node.name()
            );
            Ok(())
        })?;
    }
    Ok(())
}
