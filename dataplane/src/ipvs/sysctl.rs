//! The kernel settings kube-proxy's IPVS mode needs (`pkg/proxy/ipvs/proxier.go`), decided
//! purely from the configuration and the kernel version, then written under `/proc/sys`.
//!
//! * `net/ipv4/vs/conntrack=1`: IPVS keeps netfilter's conntrack entries, which the masquerade
//!   rules need to see IPVS connections.
//! * `net/ipv4/vs/expire_nodest_conn=1`: a connection to a deleted real server is dropped at its
//!   next packet instead of hanging.
//! * `net/ipv4/vs/expire_quiescent_template=1`: a persistence template (session affinity) pointing
//!   at a real server of weight 0 expires, so a draining endpoint gets no new clients.
//! * `net/ipv4/vs/conn_reuse_mode=0` only on kernels from 4.1 up to 5.9, where the default mode
//!   stalls reused source ports for a second (kubernetes#81775, fixed in 5.9).
//! * `net/ipv4/ip_forward=1`: masqueraded node-port traffic leaves through another interface.
//! * With strict ARP, `net/ipv4/conf/all/arp_ignore=1` and `arp_announce=2`: the node answers
//!   ARP only for addresses of the interface asked, so the Service addresses bound to
//!   `kube-ipvs0` are not announced on its network.
//!
//! The `vs` settings exist only once the `ip_vs` module is loaded: write them after the IPVS
//! client connected.

use std::{io, path::Path};

/// A setting: its path under `/proc/sys` and the value written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The path under `/proc/sys`, `/`-separated (`net/ipv4/vs/conntrack`).
    pub key: &'static str,
    /// The value.
    pub value: &'static str,
}

const fn setting(key: &'static str, value: &'static str) -> Setting {
    Setting { key, value }
}

/// The settings for a kernel of `release` (`uname -r`, as `/proc/sys/kernel/osrelease` says),
/// with or without strict ARP.
#[must_use]
pub fn settings(release: &str, strict_arp: bool) -> Vec<Setting> {
    let mut settings = vec![
        setting("net/ipv4/vs/conntrack", "1"),
        setting("net/ipv4/vs/expire_nodest_conn", "1"),
        setting("net/ipv4/vs/expire_quiescent_template", "1"),
        setting("net/ipv4/ip_forward", "1"),
    ];
    if kernel_version(release).is_some_and(|version| ((4, 1)..(5, 9)).contains(&version)) {
        settings.push(setting("net/ipv4/vs/conn_reuse_mode", "0"));
    }
    if strict_arp {
        settings.push(setting("net/ipv4/conf/all/arp_ignore", "1"));
        settings.push(setting("net/ipv4/conf/all/arp_announce", "2"));
    }
    settings
}

/// The major and minor version of a kernel release (`6.1.0-50-cloud-amd64` is `(6, 1)`);
/// `None` when it does not start with two numbers.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Some((major, minor)),
        _ => None,
    }
}

/// A setting could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("setting {key} to {value}")]
pub struct Error {
    /// The path under `/proc/sys`.
    pub key: &'static str,
    /// The value.
    pub value: &'static str,
    /// Why it failed.
    #[source]
    pub source: io::Error,
}

/// Writes the settings for the running kernel under `root` (`/proc/sys`), skipping those that
/// already hold their value; returns those written.
///
/// # Errors
///
/// When the kernel release cannot be read, or a setting cannot be written: the settings before
/// it stay written.
pub fn apply(root: &Path, strict_arp: bool) -> Result<Vec<Setting>, Error> {
    let release_key = "kernel/osrelease";
    let release = std::fs::read_to_string(root.join(release_key)).map_err(|source| Error {
        key: release_key,
        value: "(read)",
        source,
    })?;
    let mut written = Vec::new();
    for setting in settings(release.trim(), strict_arp) {
        let path = root.join(setting.key);
        if std::fs::read_to_string(&path).is_ok_and(|held| held.trim() == setting.value) {
            continue;
        }
        std::fs::write(&path, setting.value).map_err(|source| Error {
            key: setting.key,
            value: setting.value,
            source,
        })?;
        written.push(setting);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn keys(settings: &[Setting]) -> Vec<&str> {
        settings.iter().map(|s| s.key).collect()
    }

    #[test]
    fn a_current_kernel_keeps_its_conn_reuse_mode() {
        assert_eq!(
            keys(&settings("6.1.0-50-cloud-amd64", false)),
            [
                "net/ipv4/vs/conntrack",
                "net/ipv4/vs/expire_nodest_conn",
                "net/ipv4/vs/expire_quiescent_template",
                "net/ipv4/ip_forward",
            ]
        );
        assert!(!keys(&settings("5.9.0", false)).contains(&"net/ipv4/vs/conn_reuse_mode"));
    }

    #[test]
    fn kernels_from_4_1_before_5_9_get_conn_reuse_mode_0() {
        for release in ["4.1.0", "4.19.0-25-amd64", "5.8.18"] {
            assert!(
                settings(release, false).contains(&setting("net/ipv4/vs/conn_reuse_mode", "0")),
                "{release}"
            );
        }
        assert!(!keys(&settings("4.0.9", false)).contains(&"net/ipv4/vs/conn_reuse_mode"));
        assert!(!keys(&settings("garbage", false)).contains(&"net/ipv4/vs/conn_reuse_mode"));
    }

    #[test]
    fn strict_arp_answers_only_for_the_interface_asked() {
        let strict = settings("6.1.0", true);
        assert!(strict.contains(&setting("net/ipv4/conf/all/arp_ignore", "1")));
        assert!(strict.contains(&setting("net/ipv4/conf/all/arp_announce", "2")));
        assert!(!keys(&settings("6.1.0", false)).contains(&"net/ipv4/conf/all/arp_ignore"));
    }

    #[test]
    fn apply_writes_what_differs_and_names_what_it_could_not_write() {
        let root = tempfile::tempdir().unwrap();
        for (key, value) in [
            ("kernel/osrelease", "6.1.0-50-cloud-amd64\n"),
            ("net/ipv4/vs/conntrack", "0\n"),
            ("net/ipv4/vs/expire_nodest_conn", "1\n"),
            ("net/ipv4/vs/expire_quiescent_template", "0\n"),
            ("net/ipv4/ip_forward", "1\n"),
        ] {
            let path = root.path().join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, value).unwrap();
        }
        let written = apply(root.path(), false).unwrap();
        assert_eq!(
            keys(&written),
            [
                "net/ipv4/vs/conntrack",
                "net/ipv4/vs/expire_quiescent_template"
            ]
        );
        let read = |key: &str| std::fs::read_to_string(root.path().join(key)).unwrap();
        assert_eq!(read("net/ipv4/vs/conntrack"), "1");
        assert!(apply(root.path(), false).unwrap().is_empty());

        // `conf/all` does not exist under this root: the error names the setting.
        let error = apply(root.path(), true).unwrap_err();
        assert_eq!(
            error.to_string(),
            "setting net/ipv4/conf/all/arp_ignore to 1"
        );
    }
}
