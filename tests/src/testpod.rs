//! Driving `sp-testpod` in the lab: start servers that answer with their name, and count who answers.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddrV4;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use crate::lab::{HasNamespace, Lab, Process};
use crate::workspace_binary;

/// What `sp-testpod hit` saw: how many requests each server answered, and what went wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HitReport {
    /// Answers per server name (the body of each successful response).
    pub answers: BTreeMap<String, u32>,
    /// Requests that got no `200` answer.
    pub failures: u32,
    /// The first few distinct errors, for failure messages.
    pub errors: Vec<String>,
}

impl HitReport {
    /// How many requests were answered.
    #[must_use]
    pub fn answered(&self) -> u32 {
        self.answers.values().sum()
    }

    /// How many requests `name` answered.
    #[must_use]
    pub fn answered_by(&self, name: &str) -> u32 {
        self.answers.get(name).copied().unwrap_or(0)
    }
}

/// Starts `sp-testpod serve` in `ns`, answering every request on `[::]:port` (both IP families)
/// with `name`.
///
/// # Errors
///
/// If the `sp-testpod` binary is missing or cannot be started.
pub fn serve(
    lab: &mut Lab,
    ns: &(impl HasNamespace + ?Sized),
    name: &str,
    port: u16,
) -> Result<Process> {
    let binary = workspace_binary("sp-testpod")?;
    let listen = format!("[::]:{port}");
    lab.spawn(ns, binary, &["serve", "--name", name, "--listen", &listen])
}

/// Makes `count` requests to `url` from `ns`, each on a new TCP connection, and reports who answered.
///
/// Failed requests are counted in the report, not returned as errors: the test decides.
///
/// # Errors
///
/// If `sp-testpod` is missing, cannot run, exits unsuccessfully or prints no report.
pub fn hit(
    lab: &Lab,
    ns: &(impl HasNamespace + ?Sized),
    url: &str,
    count: u32,
) -> Result<HitReport> {
    hit_within(lab, ns, url, count, Duration::from_secs(2))
}

/// Makes `count` requests to `url` from `ns` and fails unless every one was answered.
///
/// # Errors
///
/// If a request failed, or as [`hit`].
pub fn expect_reached(
    lab: &Lab,
    ns: &(impl HasNamespace + ?Sized),
    url: &str,
    count: u32,
) -> Result<()> {
    let report = hit(lab, ns, url, count)?;
    anyhow::ensure!(report.failures == 0, "{url}: {report:?}");
    Ok(())
}

/// [`hit`] with each request given at most `timeout` instead of 2 s: for asserting that
/// requests are dropped, which only a timeout shows.
///
/// # Errors
///
/// If `sp-testpod` is missing, cannot run, exits unsuccessfully or prints no report.
pub fn hit_within(
    lab: &Lab,
    ns: &(impl HasNamespace + ?Sized),
    url: &str,
    count: u32,
    timeout: Duration,
) -> Result<HitReport> {
    let count = count.to_string();
    let timeout = timeout.as_millis().to_string();
    run_hit(
        lab,
        ns,
        url,
        &[
            "hit",
            "--url",
            url,
            "--count",
            &count,
            "--timeout-ms",
            &timeout,
        ],
    )
}

/// Starts `sp-testpod sctp-serve` in `ns`, answering every SCTP INIT to `port` with `name`.
///
/// # Errors
///
/// If the `sp-testpod` binary is missing or cannot be started.
pub fn serve_sctp(
    lab: &mut Lab,
    ns: &(impl HasNamespace + ?Sized),
    name: &str,
    port: u16,
) -> Result<Process> {
    let binary = workspace_binary("sp-testpod")?;
    let port = port.to_string();
    lab.spawn(ns, binary, &["sctp-serve", "--name", name, "--port", &port])
}

/// Sends `count` SCTP INITs to `address` from `ns`, each from a fresh port, and reports who
/// answered; an INIT-ACK from anywhere but `address` counts as a failure.
///
/// # Errors
///
/// If `sp-testpod` is missing, cannot run, exits unsuccessfully or prints no report.
pub fn hit_sctp(
    lab: &Lab,
    ns: &(impl HasNamespace + ?Sized),
    address: SocketAddrV4,
    count: u32,
) -> Result<HitReport> {
    let (address, count) = (address.to_string(), count.to_string());
    run_hit(
        lab,
        ns,
        &address,
        &["sctp-hit", "--address", &address, "--count", &count],
    )
}

/// Makes `count` requests to `url` from `ns`, as [`hit`], and checks that every one was answered
/// and that the servers that answered are exactly `expected`.
///
/// # Errors
///
/// As [`hit`]; and when a request failed or the set of servers that answered is not `expected`.
pub fn expect_answers(
    lab: &Lab,
    ns: &(impl HasNamespace + ?Sized),
    url: &str,
    count: u32,
    expected: &BTreeSet<&str>,
) -> Result<()> {
    let report = hit(lab, ns, url, count)?;
    let answered: BTreeSet<&str> = report.answers.keys().map(String::as_str).collect();
    ensure!(
        report.failures == 0 && answered == *expected,
        "from {} to {url}: expected exactly {expected:?}, got {report:?}",
        ns.ns_name()
    );
    Ok(())
}

/// Starts `sp-testpod serve --udp` in `ns`, answering every datagram on `[::]:port` (both IP
/// families) with `name`.
///
/// # Errors
///
/// If the `sp-testpod` binary is missing or cannot be started.
pub fn serve_udp(
    lab: &mut Lab,
    ns: &(impl HasNamespace + ?Sized),
    name: &str,
    port: u16,
) -> Result<Process> {
    let binary = workspace_binary("sp-testpod")?;
    let listen = format!("[::]:{port}");
    lab.spawn(
        ns,
        binary,
        &["serve", "--udp", "--name", name, "--listen", &listen],
    )
}

/// Sends `count` datagrams to `url` (`udp://IP:PORT` or `udp://[IPv6]:PORT`) from `ns` and reports who answered: all
/// from `source_port` on one socket (one conntrack flow), or each from a fresh ephemeral port.
///
/// Unanswered datagrams are counted in the report, not returned as errors: the test decides.
///
/// # Errors
///
/// If `sp-testpod` is missing, cannot run, exits unsuccessfully or prints no report.
pub fn hit_udp(
    lab: &Lab,
    ns: &(impl HasNamespace + ?Sized),
    url: &str,
    count: u32,
    source_port: Option<u16>,
) -> Result<HitReport> {
    let count = count.to_string();
    let source_port = source_port.map(|port| port.to_string());
    let mut args = vec!["hit", "--udp", "--url", url, "--count", &count];
    if let Some(port) = &source_port {
        args.extend(["--source-port", port]);
    }
    run_hit(lab, ns, url, &args)
}

/// Runs `sp-testpod args...` (a `hit` to `url`) in `ns` to completion and reads its report.
fn run_hit(
    lab: &Lab,
    ns: &(impl HasNamespace + ?Sized),
    url: &str,
    args: &[&str],
) -> Result<HitReport> {
    let binary = workspace_binary("sp-testpod")?;
    let output = lab.exec(ns, binary, args)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "sp-testpod hit {url} in {} exited with {}: {}",
        ns.ns_name(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    parse_report(&stdout)?.with_context(|| format!("sp-testpod hit printed no report: {stdout:?}"))
}

/// Starts steady load in the background: `count` requests to `url` from `ns`, `interval_ms`
/// apart. Read the result with [`load_report`] once the process has finished.
///
/// # Errors
///
/// If `sp-testpod` is missing or cannot be started.
pub fn start_load(
    lab: &mut Lab,
    ns: &(impl HasNamespace + ?Sized),
    url: &str,
    count: u32,
    interval_ms: u32,
) -> Result<Process> {
    let binary = workspace_binary("sp-testpod")?;
    let (count, interval) = (count.to_string(), interval_ms.to_string());
    lab.spawn(
        ns,
        binary,
        &[
            "hit",
            "--url",
            url,
            "--count",
            &count,
            "--interval-ms",
            &interval,
        ],
    )
}

/// The report of a load started with [`start_load`]; `None` while it is still running.
///
/// # Errors
///
/// If the process printed something that is not a report.
pub fn load_report(load: &Process) -> Result<Option<HitReport>> {
    parse_report(&load.log())
}

/// The report on the last non-empty line of `output`, if there is one yet.
fn parse_report(output: &str) -> Result<Option<HitReport>> {
    let Some(line) = output.lines().rev().find(|l| !l.trim().is_empty()) else {
        return Ok(None);
    };
    serde_json::from_str(line)
        .map(Some)
        .with_context(|| format!("sp-testpod hit printed no report: {output:?}"))
}
