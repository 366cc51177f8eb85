//! CPU time and memory from /proc: of this process (in B1 the controller and every hollow agent
//! together, since they share it), or of another one by pid (B2's and B3's proxies).

use anyhow::{Context as _, Result};
use serde::Serialize;
use std::time::Duration;

/// The kernel reports CPU time in USER_HZ ticks, 100 per second on every Linux ABI.
const TICKS_PER_SECOND: u64 = 100;

/// User plus system CPU time of all threads so far; `None` when /proc cannot be read.
#[must_use]
pub fn cpu_time() -> Option<Duration> {
    cpu_time_at("/proc/self/stat")
}

/// [`cpu_time`] of process `pid`; `None` when it is gone.
#[must_use]
pub fn cpu_time_of(pid: u32) -> Option<Duration> {
    cpu_time_at(&format!("/proc/{pid}/stat"))
}

/// User plus system CPU time of the children process `pid` has waited for (the tools a proxy
/// runs: `iptables-restore`, `iptables`, `conntrack`); `None` when it is gone.
#[must_use]
pub fn children_cpu_time_of(pid: u32) -> Option<Duration> {
    stat_ticks(&format!("/proc/{pid}/stat"), 13)
}

/// The resident set size of process `pid` in bytes (VmRSS); `None` when it is gone.
#[must_use]
pub fn rss_bytes_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_bytes(&status, "VmRSS:")
}

fn cpu_time_at(stat_path: &str) -> Option<Duration> {
    stat_ticks(stat_path, 11)
}

/// The sum of two CPU-time fields of a stat file, the user one `skip` fields after the state
/// (field 3): utime and stime are fields 14 and 15, cutime and cstime 16 and 17.
fn stat_ticks(stat_path: &str, skip: usize) -> Option<Duration> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // After the command name, which may hold spaces.
    let after_comm = &stat[stat.rfind(')')? + 2..];
    let mut fields = after_comm.split_whitespace().skip(skip);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis(
        (user + system) * 1000 / TICKS_PER_SECOND,
    ))
}

/// The peak resident set size in bytes (VmHWM); `None` when /proc cannot be read.
#[must_use]
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_bytes(&status, "VmHWM:")
}

/// A process's resident memory now and at its peak.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Memory {
    /// VmRSS, in MiB.
    pub rss_mib: f64,
    /// VmHWM (the peak of VmRSS), in MiB.
    pub peak_rss_mib: f64,
}

impl Memory {
    /// Process `pid`'s memory; `None` when it is gone or /proc cannot be read.
    #[must_use]
    pub fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let mib = |field| status_bytes(&status, field).map(|b| b as f64 / f64::from(1 << 20));
        Some(Self {
            rss_mib: mib("VmRSS:")?,
            peak_rss_mib: mib("VmHWM:")?,
        })
    }
}

/// A `/proc/<pid>/status` field given in kB (`VmHWM:   1234 kB`), in bytes.
fn status_bytes(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The 1, 5 and 15 minute load averages.
///
/// # Errors
///
/// If /proc/loadavg cannot be read or parsed.
pub fn load_average() -> Result<Vec<f64>> {
    let text = std::fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    text.split_whitespace()
        .take(3)
        .map(|v| v.parse().with_context(|| format!("load average {v:?}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_of_children_waited_for_is_counted_apart() {
        let me = std::process::id();
        let stat = || {
            let children = children_cpu_time_of(me).expect("this process's stat");
            (children, cpu_time().expect("this process's stat"))
        };
        let before = stat();
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(status.success());
        let after = stat();
        // This process only waited meanwhile (other tests aside); the child did the work.
        assert!(
            after.0 - before.0 > after.1 - before.1,
            "{before:?} then {after:?}"
        );
    }

    #[test]
    fn this_process_has_used_cpu_and_memory() {
        let busy: u64 = (0..20_000_000u64).fold(0, |a, b| a.wrapping_add(b * b));
        assert!(busy > 0);
        assert!(cpu_time().is_some());
        assert!(peak_rss_bytes().is_some_and(|b| b > 0));
        let memory = Memory::of(std::process::id()).expect("this process's memory");
        assert!(memory.rss_mib > 0.0 && memory.peak_rss_mib >= memory.rss_mib);
        let me = std::process::id();
        assert!(cpu_time_of(me).is_some());
        assert!(rss_bytes_of(me).is_some_and(|b| b > 0));
    }
}
