//! The kernel counters that make a B5 trial invalid when they move: conntrack's drops in the
//! subject's node (a full or clashing table), the server's listen-queue overflows and receive
//! buffer drops, the client's retransmissions (a lost packet costs a second's timer, not rules).

use anyhow::{Context as _, Result};
use splitproxy_e2e::lab::Lab;
use std::collections::BTreeMap;

/// Whose counters a namespace holds.
#[derive(Debug, Clone, Copy)]
pub enum Place {
    /// The subject's node: conntrack's statistics.
    Node,
    /// The server pod: its listen queue and UDP socket.
    Server,
    /// The client's namespace: retransmissions and its UDP socket.
    Client,
}

/// conntrack's per-CPU statistics that count lost or refused entries.
const CONNTRACK: [&str; 4] = ["insert_failed", "drop", "early_drop", "chaintoolong"];
/// The server's `/proc/net/netstat` and `/proc/net/snmp` counters that count dropped packets.
const SERVER: [&str; 4] = [
    "TcpExt.ListenOverflows",
    "TcpExt.ListenDrops",
    "Udp.RcvbufErrors",
    "Udp.InErrors",
];
/// The client's.
const CLIENT: [&str; 2] = ["Tcp.RetransSegs", "Udp.RcvbufErrors"];

/// A snapshot of the watched counters, by `place counter`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters(BTreeMap<String, u64>);

impl Counters {
    /// Reads every counter of each (namespace, place).
    ///
    /// # Errors
    ///
    /// If a namespace's counters cannot be read.
    pub fn read(lab: &Lab, places: &[(&str, Place)]) -> Result<Self> {
        let mut counters = BTreeMap::new();
        for &(ns, place) in places {
            match place {
                Place::Node => {
                    let stats = lab.exec_ok(ns, "conntrack", &["-S"])?;
                    for (name, value) in conntrack_stats(&stats) {
                        counters.insert(format!("node conntrack {name}"), value);
                    }
                }
                Place::Server | Place::Client => {
                    let (label, watched) = match place {
                        Place::Server => ("server", &SERVER[..]),
                        _ => ("client", &CLIENT[..]),
                    };
                    let text = lab
                        .exec_ok(ns, "cat", &["/proc/net/netstat", "/proc/net/snmp"])
                        .with_context(|| format!("reading the {label}'s counters"))?;
                    let all = snmp(&text);
                    for name in watched {
                        // A counter this kernel does not keep cannot move.
                        let value = all.get(*name).copied().unwrap_or(0);
                        counters.insert(format!("{label} {name}"), value);
                    }
                }
            }
        }
        Ok(Self(counters))
    }

    /// How much each counter grew since `before`.
    #[must_use]
    pub fn since(&self, before: &Self) -> BTreeMap<String, u64> {
        self.0
            .iter()
            .map(|(name, &now)| {
                let then = before.0.get(name).copied().unwrap_or(0);
                (name.clone(), now.saturating_sub(then))
            })
            .collect()
    }
}

/// The watched fields of `conntrack -S` (a line per CPU: `cpu=0 found=0 … drop=0 …`), summed
/// over the CPUs.
fn conntrack_stats(text: &str) -> BTreeMap<&'static str, u64> {
    let mut sums: BTreeMap<&'static str, u64> = CONNTRACK.iter().map(|&f| (f, 0)).collect();
    for field in text.split_whitespace() {
        let Some((name, value)) = field.split_once('=') else {
            continue;
        };
        if let (Some(sum), Ok(value)) = (
            CONNTRACK
                .iter()
                .find(|&&f| f == name)
                .and_then(|f| sums.get_mut(f)),
            value.parse::<u64>(),
        ) {
            *sum += value;
        }
    }
    sums
}

/// `/proc/net/netstat` and `/proc/net/snmp`: pairs of lines `Group: names…` / `Group: values…`,
/// as `Group.name` → value.
fn snmp(text: &str) -> BTreeMap<String, u64> {
    let mut counters = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks_exact(2) {
        let (Some((group, names)), Some((same, values))) =
            (pair[0].split_once(':'), pair[1].split_once(':'))
        else {
            continue;
        };
        if group != same {
            continue;
        }
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(value) = value.parse() {
                counters.insert(format!("{group}.{name}"), value);
            }
        }
    }
    counters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_drops_are_summed_over_cpus() {
        let text = "cpu=0 found=3 invalid=9 insert=0 insert_failed=1 drop=2 early_drop=0 error=4 search_restart=0 clash_resolve=5 chaintoolong=0\n\
                    cpu=1 found=0 invalid=0 insert=0 insert_failed=0 drop=1 early_drop=3 error=0 search_restart=0 clash_resolve=0 chaintoolong=0\n";
        let stats = conntrack_stats(text);
        assert_eq!(
            stats,
            BTreeMap::from([
                ("chaintoolong", 0),
                ("drop", 3),
                ("early_drop", 3),
                ("insert_failed", 1)
            ])
        );
    }

    #[test]
    fn snmp_pairs_names_with_values_per_group() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n\
                    TcpExt: 0 7 8\n\
                    Tcp: RtoAlgorithm RetransSegs\n\
                    Tcp: 1 12\n\
                    Udp: InDatagrams InErrors RcvbufErrors\n\
                    Udp: 5 0 2\n";
        let all = snmp(text);
        assert_eq!(all["TcpExt.ListenOverflows"], 7);
        assert_eq!(all["Tcp.RetransSegs"], 12);
        assert_eq!(all["Udp.RcvbufErrors"], 2);
    }

    #[test]
    fn growth_is_counted_per_counter() {
        let before = Counters(BTreeMap::from([("a".to_owned(), 5), ("b".to_owned(), 1)]));
        let after = Counters(BTreeMap::from([("a".to_owned(), 7), ("b".to_owned(), 1)]));
        assert_eq!(
            after.since(&before),
            BTreeMap::from([("a".to_owned(), 2), ("b".to_owned(), 0)])
        );
    }
}
