//! `load`: a bounded, rate-limited client. One thread per target sends a request every
//! `1 / rate` seconds, each on a new connection, until the duration is over, and appends one
//! `splitproxy_e2e::load::Outcome` JSON line per request to the output file.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, ensure};
use splitproxy_e2e::load::{Outcome, unix_ms};

/// One Service to load: its name in the outcomes and where to send requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    name: String,
    addr: SocketAddr,
    path: String,
}

/// Parses `NAME=http://IP:PORT/path`.
pub fn parse_target(text: &str) -> Result<Target> {
    let (name, url) = text
        .split_once('=')
        .ok_or_else(|| anyhow!("target {text:?} must be NAME=URL"))?;
    ensure!(!name.is_empty(), "target {text:?} has an empty name");
    let (addr, path) = super::parse_url(url)?;
    Ok(Target {
        name: name.to_owned(),
        addr,
        path,
    })
}

/// How the load runs.
pub struct Plan {
    /// Requests per second, per target.
    pub rate: u32,
    /// How long one request may take.
    pub timeout: Duration,
    /// When to stop sending.
    pub duration: Duration,
}

/// Loads every target in parallel for `plan.duration`, writing outcomes to `out`.
pub fn run(targets: Vec<Target>, plan: &Plan, out: &Path) -> Result<()> {
    ensure!(plan.rate > 0, "--rate must be at least 1");
    ensure!(!targets.is_empty(), "name at least one --target");
    let file = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let file = Arc::new(Mutex::new(file));
    let period = Duration::from_secs(1) / plan.rate;
    let end = Instant::now() + plan.duration;
    let timeout = plan.timeout;
    let threads: Vec<_> = targets
        .into_iter()
        .map(|target| {
            let file = Arc::clone(&file);
            std::thread::spawn(move || load_one(&target, period, timeout, end, &file))
        })
        .collect();
    for thread in threads {
        thread
            .join()
            .map_err(|_| anyhow!("a load thread panicked"))??;
    }
    Ok(())
}

/// Sends to `target` on a fixed schedule until `end`. A request slower than `period` delays the
/// next instead of bunching the missed ones, so the rate never rises above the plan.
fn load_one(
    target: &Target,
    period: Duration,
    timeout: Duration,
    end: Instant,
    file: &Mutex<File>,
) -> Result<()> {
    let mut next = Instant::now();
    while next < end {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let at_ms = unix_ms(SystemTime::now());
        let result = super::request(target.addr, None, &target.path, timeout);
        let outcome = Outcome {
            at_ms,
            target: target.name.clone(),
            ok: result.is_ok(),
            answer: result.unwrap_or_else(|e| format!("{e:#}")),
        };
        let mut line = serde_json::to_string(&outcome).context("encoding an outcome")?;
        line.push('\n');
        // One write per whole line, so a reader (or a kill) never sees half of one.
        file.lock()
            .map_err(|_| anyhow!("the output file's lock is poisoned"))?
            .write_all(line.as_bytes())
            .context("writing an outcome")?;
        next = (next + period).max(Instant::now());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn targets_are_a_name_and_an_ip_url() {
        let target = parse_target("stable=http://10.96.0.20:80/").unwrap();
        assert_eq!(target.name, "stable");
        assert_eq!(target.addr, "10.96.0.20:80".parse().unwrap());
        assert_eq!(target.path, "/");
        assert!(parse_target("http://10.96.0.20/").is_err());
        assert!(parse_target("=http://10.96.0.20/").is_err());
        assert!(parse_target("a=http://example.com/").is_err());
    }
}
