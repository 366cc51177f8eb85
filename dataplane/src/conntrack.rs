//! Stale UDP and SCTP conntrack entries: which ones a sync leaves behind, and deleting them.
//!
//! A UDP (or SCTP) "connection" is a conntrack entry that lives as long as packets keep flowing,
//! and the kernel NATs every packet of it the way its first packet was NATed. New rules therefore
//! do not move a client that keeps its source port: it keeps reaching an endpoint that is gone, or
//! keeps the blackhole entry it got while the Service had no endpoint. kube-proxy's event-driven
//! cleanup (`pkg/proxy/conntrack/cleanup.go` before the netlink reconciler, upstream §1.18)
//! deletes those entries after each sync; so does this module:
//!
//! * **(a) endpoint gone:** for every UDP/SCTP endpoint that was usable before and is not now,
//!   the flows to each of the Service's cluster, external and load-balancer IPs on that port (and
//!   to its node port) that were DNATed to it (`--reply-src <endpoint>`);
//! * **(b) first endpoint:** for every UDP/SCTP Service port that had no usable endpoint and now
//!   has one, every flow to its addresses on that port and to its node port.
//!
//! "Usable" is [`crate::endpoints::categorize`]'s decision (the cluster or the local set, plus the
//! endpoints topology hints only steer this node's new connections away from), per IP family, as
//! the proxier that rendered the rules saw it. [`stale_flows`] is pure; [`Conntrack`] is the thin
//! executor that runs `conntrack -D` for each [`Deletion`].

#[cfg(test)]
mod tests;

use crate::endpoints::categorize;
use crate::tool::{self, RunError};
use crate::{IpFamily, Protocol, ProxyState, Service, ServiceKey, ServicePort};
use std::{collections::BTreeSet, net::IpAddr, process::ExitStatus};

/// What can go wrong while deleting conntrack entries.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `conntrack` could not be started or waited for.
    #[error(transparent)]
    Run(#[from] RunError),
    /// `conntrack -D` failed for another reason than "nothing matched".
    #[error("conntrack {args} failed ({status}): {output}")]
    Delete {
        /// The arguments, space-separated.
        args: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it printed (stderr, then stdout), trimmed.
        output: String,
    },
}

/// The result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where the flows to delete were sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Destination {
    /// A cluster, external or load-balancer IP, and the Service port (`--orig-dst IP --dport P`).
    Address {
        /// The Service address.
        ip: IpAddr,
        /// The Service port.
        port: u16,
    },
    /// A node port on any of the node's addresses (`--dport P`).
    NodePort(u16),
}

/// One `conntrack -D`: the flows of one protocol to one destination, optionally only those DNATed
/// to one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deletion {
    /// The family of the flows (a node port alone does not say).
    pub family: IpFamily,
    /// UDP or SCTP.
    pub protocol: Protocol,
    /// Where the flows were sent.
    pub destination: Destination,
    /// Only flows whose replies come from this endpoint (`--reply-src`); `None` for every flow to
    /// the destination.
    pub reply_source: Option<IpAddr>,
}

impl Deletion {
    /// The `conntrack` arguments, e.g.
    /// `-D -p udp --orig-dst 10.96.0.10 --dport 53 --reply-src 10.244.1.2`.
    #[must_use]
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec!["-D".into(), "-p".into(), self.protocol.as_str().into()];
        if self.family == IpFamily::V6 {
            // conntrack lists IPv4 unless told otherwise, also with IPv6 addresses to match.
            args.extend(["-f".into(), "ipv6".into()]);
        }
        let port = match self.destination {
            Destination::Address { ip, port } => {
                args.extend(["--orig-dst".into(), ip.to_string()]);
                port
            }
            Destination::NodePort(port) => port,
        };
        args.extend(["--dport".into(), port.to_string()]);
        if let Some(endpoint) = self.reply_source {
            args.extend(["--reply-src".into(), endpoint.to_string()]);
        }
        args
    }
}

/// The conntrack deletions kube-proxy would run after `current` replaced `previous`, for the
/// `family` proxier: deduplicated and sorted.
///
/// Rule (a) uses the addresses and ports of the Service as it was (the stale flows were sent to
/// them), so a deleted Service's flows go too; rule (b) uses the Service as it is.
#[must_use]
pub fn stale_flows(previous: &ProxyState, current: &ProxyState, family: IpFamily) -> Vec<Deletion> {
    let mut deletions = BTreeSet::new();
    // Services the two states share have the same endpoints in both, so none of their flows is
    // stale: only the changed ones are looked at.
    let changed: Vec<&ServiceKey> = previous.changed_services(current).collect();
    let of = |state: &'_ ProxyState, key: &ServiceKey| state.services.get(key).cloned();
    for (key, service) in changed
        .iter()
        .filter_map(|key| Some((*key, of(previous, key)?)))
    {
        for port in service.ports.iter().filter(|port| needs_cleanup(port)) {
            let now = usable(
                find_port(current.services.get(key).map(|s| &**s), port),
                family,
            );
            for &(endpoint, _) in usable(Some(port), family).difference(&now) {
                let flows = destinations(&service, port, family);
                deletions.extend(flows.map(|destination| Deletion {
                    family,
                    protocol: port.protocol,
                    destination,
                    reply_source: Some(endpoint),
                }));
            }
        }
    }
    for (key, service) in changed
        .iter()
        .filter_map(|key| Some((*key, of(current, key)?)))
    {
        for port in service.ports.iter().filter(|port| needs_cleanup(port)) {
            let before = usable(
                find_port(previous.services.get(key).map(|s| &**s), port),
                family,
            );
            if before.is_empty() && !usable(Some(port), family).is_empty() {
                let flows = destinations(&service, port, family);
                deletions.extend(flows.map(|destination| Deletion {
                    family,
                    protocol: port.protocol,
                    destination,
                    reply_source: None,
                }));
            }
        }
    }
    deletions.into_iter().collect()
}

/// Connectionless protocols keep stale entries; TCP's die with their connection.
fn needs_cleanup(port: &ServicePort) -> bool {
    matches!(port.protocol, Protocol::Udp | Protocol::Sctp)
}

/// The port of `service` that is `port` (kube-proxy's `ServicePortName`: name and protocol).
fn find_port<'a>(service: Option<&'a Service>, port: &ServicePort) -> Option<&'a ServicePort> {
    service?
        .ports
        .iter()
        .find(|candidate| candidate.name == port.name && candidate.protocol == port.protocol)
}

/// The endpoints of `port` in `family` that some rule may send traffic to: `(address, port)`
/// pairs, as upstream compares endpoints by `ip:port`.
fn usable(port: Option<&ServicePort>, family: IpFamily) -> BTreeSet<(IpAddr, u16)> {
    let Some(port) = port else {
        return BTreeSet::new();
    };
    let sets = categorize(port.endpoints.iter().filter(|e| family.contains(&e.ip)));
    // An endpoint topology hints steer this node's new connections away from still serves its
    // own zone or node; as in upstream's cleanup, which never looks at hints, its flows stay.
    sets.reachable(true, true)
        .into_iter()
        .chain(sets.topology_excluded)
        .map(|endpoint| (endpoint.ip, endpoint.port))
        .collect()
}

/// Every place a client of `port` sends its packets to, in `family`.
fn destinations<'a>(
    service: &'a Service,
    port: &'a ServicePort,
    family: IpFamily,
) -> impl Iterator<Item = Destination> + 'a {
    let addresses = service
        .cluster_ips
        .iter()
        .chain(&service.external_ips)
        .chain(&service.load_balancer_ips)
        .filter(move |ip| family.contains(ip))
        .map(|&ip| Destination::Address {
            ip,
            port: port.port,
        });
    addresses.chain(port.node_port.map(Destination::NodePort))
}

/// How many flows `conntrack -D` says it deleted, if it says so.
///
/// conntrack-tools prints `conntrack v1.4.7 (conntrack-tools): N flow entries have been
/// deleted.` on stderr, and exits 1 when N is 0: nothing matched, which is not a failure here.
#[must_use]
pub fn deleted_count(output: &str) -> Option<u32> {
    let (before, _) = output.split_once(" flow entries have been deleted")?;
    before
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|digits| digits.parse().ok())
}

/// What one family's deletion of stale flows took and did: kube-proxy's conntrack reconciler
/// metrics (`kubeproxy_conntrack_reconciler_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cleanup {
    /// The family whose flows were looked at.
    pub family: IpFamily,
    /// How long it took.
    pub duration: std::time::Duration,
    /// How many flows `conntrack` deleted.
    pub deleted: u32,
}

/// Deletes the flows of `family` that the change from `previous` to `current` left stale
/// ([`stale_flows`]) with `executor`. Failures are logged, never returned: the rules are in
/// place, and a stale flow is less harm than a failed sync.
pub async fn delete_stale_flows(
    executor: &Conntrack,
    previous: &ProxyState,
    current: &ProxyState,
    family: IpFamily,
) -> Cleanup {
    let started = std::time::Instant::now();
    let deletions = stale_flows(previous, current, family);
    let (mut deleted, mut failed) = (0_u32, 0_u32);
    for deletion in &deletions {
        match executor.delete(deletion).await {
            Ok(count) => deleted = deleted.saturating_add(count),
            Err(error) => {
                failed += 1;
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "could not delete stale conntrack entries"
                );
            }
        }
    }
    if !deletions.is_empty() {
        tracing::debug!(
            ip_family = family.name(),
            deletions = deletions.len(),
            deleted,
            failed,
            "deleted stale conntrack entries"
        );
    }
    Cleanup {
        family,
        duration: started.elapsed(),
        deleted,
    }
}

/// The thin executor: runs `conntrack -D` (under a command prefix such as `ip netns exec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conntrack {
    /// The program to start: the prefix's first word, or the binary.
    program: String,
    /// Its arguments before the `conntrack` ones: the rest of the prefix, then the binary.
    leading: Vec<String>,
}

impl Conntrack {
    /// An executor running `binary`, preceded by the words of `prefix`.
    #[must_use]
    pub fn new(prefix: &[String], binary: &str) -> Self {
        match prefix.split_first() {
            Some((program, rest)) => Self {
                program: program.clone(),
                leading: rest.iter().cloned().chain([binary.to_owned()]).collect(),
            },
            None => Self {
                program: binary.to_owned(),
                leading: Vec::new(),
            },
        }
    }

    /// Runs `deletion`; returns how many flows it deleted (0 when nothing matched).
    ///
    /// # Errors
    ///
    /// If `conntrack` cannot run, or fails for another reason than an empty match.
    pub async fn delete(&self, deletion: &Deletion) -> Result<u32> {
        let args = deletion.args();
        let words: Vec<String> = self.leading.iter().chain(&args).cloned().collect();
        let output = tool::run(&self.program, &words, None).await?.output;
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        match deleted_count(&text) {
            Some(count) if output.status.success() || count == 0 => Ok(count),
            None if output.status.success() => Ok(0),
            _ => Err(Error::Delete {
                args: args.join(" "),
                status: output.status,
                output: text.trim().to_owned(),
            }),
        }
    }
}
