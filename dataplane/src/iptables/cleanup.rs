//! `splitproxy-agent --cleanup`: takes out everything the iptables backend installs, for one IP
//! family. The layout is kube-proxy's, chain names included, so the same cleanup removes what an
//! iptables-mode kube-proxy left behind when a node switches to splitproxy (kube-proxy's own
//! `--cleanup` does the same in reverse).
//!
//! The jumps from the built-in chains go first (`iptables -D`, repeated while one is left, since
//! restarts of other tools may have inserted copies); then one `iptables-restore --noflush` per
//! table flushes and deletes our chains: a chain still jumped to cannot be deleted.

use super::{Iptables, JUMPS, KUBE_PROXY_CANARY, Result, chain_names::is_owned, render};
use std::fmt::Write as _;

/// The chains kube-proxy's layout creates besides the per-Service ones, in any table.
const TOP_LEVEL_CHAINS: [&str; 8] = [
    render::KUBE_SERVICES,
    render::KUBE_NODEPORTS,
    render::KUBE_MARK_MASQ,
    render::KUBE_POSTROUTING,
    render::KUBE_EXTERNAL_SERVICES,
    render::KUBE_FORWARD,
    render::KUBE_PROXY_FIREWALL,
    KUBE_PROXY_CANARY,
];

/// The tables the backend writes to.
const TABLES: [&str; 3] = ["mangle", "nat", "filter"];

/// What a cleanup removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Jumps deleted from built-in chains.
    pub jumps: usize,
    /// Chains flushed and deleted, over all tables.
    pub chains: usize,
}

/// Whether `chain` belongs to kube-proxy's layout.
fn is_ours(chain: &str) -> bool {
    is_owned(chain) || TOP_LEVEL_CHAINS.contains(&chain)
}

/// The restore input that flushes and deletes `chains` of `table`; empty when there are none.
fn removal(table: &str, chains: &[&String]) -> String {
    if chains.is_empty() {
        return String::new();
    }
    let mut payload = format!("*{table}\n");
    for chain in chains {
        let _ = writeln!(payload, ":{chain} - [0:0]");
    }
    for chain in chains {
        let _ = writeln!(payload, "-X {chain}");
    }
    payload.push_str("COMMIT\n");
    payload
}

impl Iptables {
    /// Removes this family's jumps and chains of kube-proxy's layout, leaving every other rule
    /// alone. Running it twice is harmless.
    ///
    /// # Errors
    ///
    /// If a tool cannot run or refuses (for instance, another tool's rule still jumps to one of
    /// the chains).
    pub async fn cleanup(&self) -> Result<Cleaned> {
        let wait = self.config.lock_wait_seconds;
        let mut cleaned = Cleaned::default();
        for jump in &JUMPS {
            // `-D` exits 1 once no copy is left (or the chain is unknown).
            while self
                .run(&self.config.iptables, &jump.delete_args(wait), None)
                .await?
                .status
                .success()
            {
                cleaned.jumps += 1;
            }
        }
        let mut payload = String::new();
        for table in TABLES {
            let existing = self.chains_of(table).await?;
            let ours: Vec<&String> = existing.iter().filter(|chain| is_ours(chain)).collect();
            cleaned.chains += ours.len();
            payload.push_str(&removal(table, &ours));
        }
        if !payload.is_empty() {
            self.restore(&payload, false).await?;
        }
        Ok(cleaned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kube_proxys_chains_are_ours() {
        for chain in [
            "KUBE-SERVICES",
            "KUBE-PROXY-CANARY",
            "KUBE-SVC-XPGD46QRK7WJZT7O",
            "KUBE-SEP-SXIVWICOYRO3J4NJ",
            "KUBE-FW-X27LE4BHSL4DOUIK",
        ] {
            assert!(is_ours(chain), "{chain}");
        }
        for chain in [
            "INPUT",
            "KUBE-KUBELET-CANARY",
            "KUBE-FIREWALL",
            "CNI-HOSTPORT-DNAT",
        ] {
            assert!(!is_ours(chain), "{chain}");
        }
    }

    #[test]
    fn chains_are_flushed_before_they_are_deleted() {
        let (a, b) = ("KUBE-SERVICES".to_owned(), "KUBE-SVC-A".to_owned());
        assert_eq!(
            removal("nat", &[&a, &b]),
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n-X KUBE-SERVICES\n-X KUBE-SVC-A\nCOMMIT\n"
        );
        assert_eq!(removal("mangle", &[]), "");
    }
}
