//! `splitproxy-agent --cleanup`: takes out everything the iptables backend installs, for one IP
//! family. The layout is kube-proxy's, chain names included, so the same cleanup removes what an
//! iptables-mode kube-proxy left behind when a node switches to splitproxy (kube-proxy's own
//! `--cleanup` does the same in reverse).
//!
//! Every rule of another chain that jumps into ours goes first, found in `iptables-save` whatever
//! its comment (so also an IPVS-mode kube-proxy's, and copies other tools' restarts inserted);
//! then our chains are flushed and deleted: a chain still jumped to cannot be deleted. Each step
//! is one `iptables-restore --noflush` over all tables.

use super::{FamilyExecutor, KUBE_PROXY_CANARY, Result, chain_names::is_owned, render, save};
use std::fmt::Write as _;

/// The chains kube-proxy's layouts create besides the per-Service ones, in any table: the
/// iptables mode's (which splitproxy shares), then the IPVS mode's own iptables chains.
const TOP_LEVEL_CHAINS: [&str; 13] = [
    render::KUBE_SERVICES,
    render::KUBE_NODEPORTS,
    render::KUBE_MARK_MASQ,
    render::KUBE_POSTROUTING,
    render::KUBE_EXTERNAL_SERVICES,
    render::KUBE_FORWARD,
    render::KUBE_PROXY_FIREWALL,
    KUBE_PROXY_CANARY,
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// The tables the backend writes to.
const TABLES: [&str; 3] = ["mangle", "nat", "filter"];

/// What a cleanup removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Jumps into the layout deleted from other chains.
    pub jumps: usize,
    /// Chains flushed and deleted, over all tables.
    pub chains: usize,
}

/// Whether `chain` belongs to kube-proxy's layout.
fn is_ours(chain: &str) -> bool {
    is_owned(chain) || TOP_LEVEL_CHAINS.contains(&chain)
}

/// The restore input that deletes `rules` (`(chain, rule)` as saved) of `table`; empty when
/// there are none.
fn deletions(table: &str, rules: &[(&str, &str)]) -> String {
    if rules.is_empty() {
        return String::new();
    }
    let mut payload = format!("*{table}\n");
    for (chain, rule) in rules {
        let _ = writeln!(payload, "-D {chain} {rule}");
    }
    payload.push_str("COMMIT\n");
    payload
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

impl FamilyExecutor {
    /// Removes this family's jumps and chains of kube-proxy's layout, leaving every other rule
    /// alone. Running it twice is harmless.
    ///
    /// # Errors
    ///
    /// If a tool cannot run or refuses (for instance, another tool's rule still jumps to one of
    /// the chains).
    pub async fn cleanup(&self) -> Result<Cleaned> {
        let mut cleaned = Cleaned::default();
        let mut unhook = String::new();
        let mut remove = String::new();
        for table in TABLES {
            let saved = self.tools.saved(table).await?;
            let jumps = save::jumps(&saved, table, |chain| !is_ours(chain), is_ours);
            cleaned.jumps += jumps.len();
            unhook.push_str(&deletions(table, &jumps));
            let existing = save::chains(&saved, table);
            let ours: Vec<&String> = existing.iter().filter(|chain| is_ours(chain)).collect();
            cleaned.chains += ours.len();
            remove.push_str(&removal(table, &ours));
        }
        for payload in [unhook, remove] {
            if !payload.is_empty() {
                self.tools.restore(&[&payload], false).await?;
            }
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
        for chain in ["KUBE-NODE-PORT", "KUBE-IPVS-FILTER"] {
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
