//! The capabilities the ebpf mode needs, checked before anything is loaded: without one, the
//! kernel's answer is a bare `EPERM` or a verifier refusal that does not name it (without
//! `CAP_PERFMON` the verifier adds its speculative-execution checks and refuses `sp_connect4` as
//! too complex, `E2BIG`).

use super::error::Error;

/// A capability the mode needs.
struct Needed {
    name: &'static str,
    /// Its number in the kernel's capability sets.
    bit: u32,
    why: &'static str,
    /// Whether `CAP_SYS_ADMIN` does instead, as the kernel lets it for the BPF capabilities.
    sys_admin_will_do: bool,
}

const NEEDED: [Needed; 3] = [
    Needed {
        name: "CAP_BPF",
        bit: 39,
        why: "loading programs and making maps",
        sys_admin_will_do: true,
    },
    Needed {
        name: "CAP_PERFMON",
        bit: 38,
        why: "the verifier's full analysis, without which it refuses the socket programs",
        sys_admin_will_do: true,
    },
    Needed {
        name: "CAP_NET_ADMIN",
        bit: 12,
        why: "attaching to cgroups and devices, and the nftables table",
        sys_admin_will_do: false,
    },
];
const CAP_SYS_ADMIN: u32 = 21;

/// Fails with the capabilities this process lacks, named, if it lacks any (and if its
/// `/proc/self/status` says).
///
/// # Errors
///
/// [`Error::Capabilities`] with what is missing.
pub(super) fn check() -> Result<(), Error> {
    let Some(effective) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .as_deref()
        .and_then(effective)
    else {
        return Ok(());
    };
    let missing = missing(effective);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Capabilities {
            missing: missing.join(", "),
        })
    }
}

/// The effective capability set in `/proc/PID/status`, if it is there.
fn effective(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The needed capabilities `effective` lacks, each with why it is needed.
fn missing(effective: u64) -> Vec<String> {
    let has = |bit: u32| effective & (1 << bit) != 0;
    let held =
        |needed: &Needed| has(needed.bit) || (needed.sys_admin_will_do && has(CAP_SYS_ADMIN));
    NEEDED
        .iter()
        .filter(|needed| !held(needed))
        .map(|needed| format!("{} ({})", needed.name, needed.why))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_effective_set() {
        let status = "Name:\tsplitproxy-agent\nCapInh:\t0000000000000000\nCapPrm:\t000000c000003000\nCapEff:\t000000c000003000\n";
        assert_eq!(effective(status), Some(0xc0_0000_3000));
        assert_eq!(effective("Name:\tx\n"), None);
    }

    #[test]
    fn names_what_the_agent_container_lacks() {
        // deploy/ebpf's set: NET_ADMIN, NET_RAW, BPF, PERFMON.
        let deploy = (1 << 12) | (1 << 13) | (1 << 39) | (1 << 38);
        assert!(missing(deploy).is_empty());
        let without_perfmon = deploy & !(1 << 38);
        let lacks = missing(without_perfmon);
        assert_eq!(lacks.len(), 1);
        assert!(lacks[0].starts_with("CAP_PERFMON ("), "{lacks:?}");
        // The base's set lacks both BPF capabilities.
        let base = (1 << 12) | (1 << 13);
        let lacks = missing(base);
        assert_eq!(lacks.len(), 2);
        assert!(lacks[0].starts_with("CAP_BPF (") && lacks[1].starts_with("CAP_PERFMON ("));
        // CAP_SYS_ADMIN covers BPF and PERFMON, not NET_ADMIN.
        let lacks = missing(1 << CAP_SYS_ADMIN);
        assert_eq!(lacks.len(), 1);
        assert!(lacks[0].starts_with("CAP_NET_ADMIN ("), "{lacks:?}");
        assert!(missing(u64::MAX).is_empty());
    }
}
