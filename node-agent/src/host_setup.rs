//! What kube-proxy does to its node before it programs any rule: the conntrack sysctls (table
//! size and timeouts), `route_localnet` for localhost node ports, and its own OOM score.

use crate::kube_proxy_config::ConntrackSettings;
use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};

/// kube-proxy's ceiling for a scaled `nf_conntrack_max`.
const MAX_SCALED_CONNTRACK: u64 = 1_048_576;

/// Where the sysctls and the conntrack module's parameters live; other roots serve tests.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `/proc/sys`.
    pub sysctl: PathBuf,
    /// `/sys/module/nf_conntrack/parameters/hashsize`.
    pub hashsize: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Self {
            sysctl: PathBuf::from("/proc/sys"),
            hashsize: PathBuf::from("/sys/module/nf_conntrack/parameters/hashsize"),
        }
    }
}

/// One sysctl the agent changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// Its name under `/proc/sys` (`net/netfilter/nf_conntrack_max`).
    pub name: String,
    /// The value written.
    pub value: u64,
}

/// Why a sysctl could not be set.
#[derive(Debug, thiserror::Error)]
#[error("setting {name} to {value}")]
pub struct SysctlError {
    /// The sysctl's (or parameter's) path.
    pub name: String,
    /// The value it was to take.
    pub value: u64,
    /// Why it could not.
    #[source]
    pub source: io::Error,
}

/// `nf_conntrack_max` as kube-proxy computes it: `max_per_core` × `cpus`, at least `min` and at
/// most 1048576; `None` when `max_per_core` is 0 (leave the kernel's).
#[must_use]
pub fn conntrack_max(settings: &ConntrackSettings, cpus: usize) -> Option<u64> {
    if settings.max_per_core == 0 {
        return None;
    }
    let cpus = u64::try_from(cpus).unwrap_or(u64::MAX);
    let scaled = u64::from(settings.max_per_core).saturating_mul(cpus);
    Some(if scaled > MAX_SCALED_CONNTRACK {
        MAX_SCALED_CONNTRACK
    } else {
        scaled.max(u64::from(settings.min))
    })
}

/// What the agent did to the node's sysctls.
#[derive(Debug, Default)]
pub struct Applied {
    /// The values written.
    pub changed: Vec<Changed>,
    /// The values the kernel refused: `/proc/sys` read-only in an unprivileged container (a
    /// privileged `--init-only` init container sets them there), or `nf_conntrack_max`, which
    /// only the host's network namespace may write. kube-proxy exits on these; the agent says
    /// so and goes on, its rules work either way.
    pub refused: Vec<SysctlError>,
}

impl Applied {
    /// Records `result`: a refusal is kept, any other failure returned.
    fn record(&mut self, result: Result<(), SysctlError>) -> Result<bool, SysctlError> {
        match result {
            Ok(()) => Ok(true),
            Err(err) if err.is_refusal() => {
                self.refused.push(err);
                Ok(false)
            }
            Err(err) => Err(err),
        }
    }
}

impl SysctlError {
    /// Whether the kernel refused the write (permission, read-only `/proc/sys`), rather than
    /// the sysctl being missing or the value wrong.
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        matches!(
            self.source.kind(),
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
        )
    }

    /// Whether it is about the conntrack table's size, which only the host's network namespace
    /// may change.
    #[must_use]
    pub fn is_table_size(&self) -> bool {
        self.name.ends_with("nf_conntrack_max") || self.name.ends_with("hashsize")
    }
}

/// Sets the conntrack sysctls `settings` ask for, as kube-proxy does on start, in its order;
/// a value already in place is not written.
///
/// # Errors
///
/// The first sysctl that could not be set for another reason than a refusal (see
/// [`Applied::refused`]); those before it stay set.
pub fn set_conntrack_sysctls(
    settings: &ConntrackSettings,
    paths: &Paths,
) -> Result<Applied, SysctlError> {
    let mut applied = Applied::default();
    if let Some(max) = conntrack_max(settings, online_cpus()) {
        let result = set(
            paths,
            "net/netfilter/nf_conntrack_max",
            max,
            &mut applied.changed,
        );
        if applied.record(result)? {
            let result = grow_hash(paths, max, &mut applied.changed);
            applied.record(result)?;
        }
    }
    let seconds = |duration: Duration| duration.as_secs();
    for (name, value) in [
        (
            "nf_conntrack_tcp_timeout_established",
            settings.tcp_established_timeout.map(seconds),
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            settings.tcp_close_wait_timeout.map(seconds),
        ),
        (
            "nf_conntrack_tcp_be_liberal",
            settings.tcp_be_liberal.then_some(1),
        ),
        (
            "nf_conntrack_udp_timeout",
            settings.udp_timeout.map(seconds),
        ),
        (
            "nf_conntrack_udp_timeout_stream",
            settings.udp_stream_timeout.map(seconds),
        ),
    ] {
        if let Some(value) = value {
            let result = set(
                paths,
                &format!("net/netfilter/{name}"),
                value,
                &mut applied.changed,
            );
            applied.record(result)?;
        }
    }
    Ok(applied)
}

/// Grows the conntrack hash table to a quarter of `max`, as kube-proxy; it never shrinks it.
fn grow_hash(paths: &Paths, max: u64, changed: &mut Vec<Changed>) -> Result<(), SysctlError> {
    let wanted = max / 4;
    let error = |source| SysctlError {
        name: paths.hashsize.display().to_string(),
        value: wanted,
        source,
    };
    if read(&paths.hashsize).map_err(error)? < wanted {
        std::fs::write(&paths.hashsize, wanted.to_string()).map_err(error)?;
        changed.push(Changed {
            name: paths.hashsize.display().to_string(),
            value: wanted,
        });
    }
    Ok(())
}

/// The CPUs online (`/sys/devices/system/cpu/online`, e.g. `0-3,6`), as kube-proxy counts
/// them: every CPU of the machine, not only those this process may run on.
fn online_cpus() -> usize {
    let count = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| {
            text.trim().split(',').try_fold(0, |count, range| {
                let (first, last) = range.split_once('-').unwrap_or((range, range));
                let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
                Some(count + last.checked_sub(first)? + 1)
            })
        });
    count
        .filter(|&count| count > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

fn set(
    paths: &Paths,
    name: &str,
    value: u64,
    changed: &mut Vec<Changed>,
) -> Result<(), SysctlError> {
    let path = paths.sysctl.join(name);
    let error = |source| SysctlError {
        name: name.to_owned(),
        value,
        source,
    };
    if read(&path).ok() == Some(value) {
        return Ok(());
    }
    std::fs::write(&path, value.to_string()).map_err(error)?;
    changed.push(Changed {
        name: name.to_owned(),
        value,
    });
    Ok(())
}

fn read(path: &Path) -> io::Result<u64> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(io::Error::other)
}

/// Sets `net/ipv4/conf/all/route_localnet` to 1, which localhost node ports need (kube-proxy's
/// iptables mode sets it for them).
///
/// # Errors
///
/// When the sysctl cannot be written for another reason than a refusal.
pub fn set_route_localnet(paths: &Paths) -> Result<Applied, SysctlError> {
    let mut applied = Applied::default();
    let result = set(
        paths,
        "net/ipv4/conf/all/route_localnet",
        1,
        &mut applied.changed,
    );
    applied.record(result)?;
    Ok(applied)
}

/// Whether conntrack tracks TCP liberally now (`nf_conntrack_tcp_be_liberal` not 0), as
/// upstream reads it once its sysctls are set.
#[must_use]
pub fn tcp_be_liberal() -> bool {
    read(Path::new(
        "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal",
    ))
    .is_ok_and(|v| v != 0)
}

/// Sets this process's OOM score adjustment, as kube-proxy does for itself.
///
/// # Errors
///
/// When `/proc/self/oom_score_adj` cannot be written (lowering it needs CAP_SYS_RESOURCE).
pub fn set_oom_score_adj(value: i32) -> io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_per_core: u32, min: u32) -> ConntrackSettings {
        ConntrackSettings {
            max_per_core,
            min,
            tcp_established_timeout: Some(Duration::from_secs(86_400)),
            tcp_close_wait_timeout: Some(Duration::from_secs(3600)),
            tcp_be_liberal: false,
            udp_timeout: None,
            udp_stream_timeout: None,
        }
    }

    #[test]
    fn conntrack_max_scales_with_cpus_between_min_and_the_ceiling() {
        // kube-proxy's defaults on 2 CPUs: 65536 is below min.
        assert_eq!(conntrack_max(&settings(32_768, 131_072), 2), Some(131_072));
        assert_eq!(conntrack_max(&settings(32_768, 131_072), 8), Some(262_144));
        assert_eq!(
            conntrack_max(&settings(32_768, 131_072), 64),
            Some(1_048_576)
        );
        assert_eq!(conntrack_max(&settings(0, 131_072), 8), None);
    }

    #[test]
    fn sysctls_are_written_once_and_the_hash_grows_to_a_quarter_of_the_limit() {
        let root = tempfile::tempdir().expect("temporary directory");
        let netfilter = root.path().join("net/netfilter");
        std::fs::create_dir_all(&netfilter).expect("sysctl directory");
        for (name, value) in [
            ("nf_conntrack_max", "65536"),
            ("nf_conntrack_tcp_timeout_established", "432000"),
            ("nf_conntrack_tcp_timeout_close_wait", "3600"),
        ] {
            std::fs::write(netfilter.join(name), value).expect("sysctl file");
        }
        let hashsize = root.path().join("hashsize");
        std::fs::write(&hashsize, "16384\n").expect("hashsize file");
        let paths = Paths {
            sysctl: root.path().to_owned(),
            hashsize: hashsize.clone(),
        };
        let wanted = settings(32_768, 131_072);
        let changed = set_conntrack_sysctls(&wanted, &paths).expect("set").changed;
        let names: Vec<&str> = changed.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "net/netfilter/nf_conntrack_max",
                hashsize.to_str().expect("UTF-8 path"),
                "net/netfilter/nf_conntrack_tcp_timeout_established",
            ],
            "close_wait already held its value"
        );
        let max = conntrack_max(&wanted, online_cpus()).expect("a limit");
        assert_eq!(read(&netfilter.join("nf_conntrack_max")).ok(), Some(max));
        assert_eq!(read(&hashsize).ok(), Some(max / 4));
        assert!(
            set_conntrack_sysctls(&wanted, &paths)
                .expect("again")
                .changed
                .is_empty()
        );
    }
}
