//! The dataplane: a plain model of what a node must program, and the backends that program it.
//!
//! Backends consume [`model::ProxyState`], never wire or Kubernetes types. Each backend keeps a
//! pure render step (state → kernel input) apart from a thin executor (processes, sockets).

pub mod conntrack;
pub mod endpoints;
pub mod flow_table;
pub mod iptables;
pub mod model;
pub mod recording;

use std::future::Future;

pub use conntrack::IpFamily;
pub use model::{
    Cidr, Endpoint, Protocol, ProxyState, Service, ServiceKey, ServicePort, TrafficPolicy,
};

/// What one successful sync wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Rules written per table, e.g. `("nat", 12)`, summed over the IP families synced.
    pub rules_written: Vec<(String, u32)>,
    /// Rules written per IP family and table, e.g. `(IpFamily::V6, "nat", 12)`, from backends
    /// that program each family apart (kube-proxy's `ip_family` metric label); empty from the
    /// others.
    pub family_rules: Vec<(IpFamily, String, u32)>,
}

impl SyncReport {
    /// The report of a sync of one IP family that wrote `tables` (`(table, rules)`).
    #[must_use]
    pub fn for_family(family: IpFamily, tables: Vec<(String, u32)>) -> Self {
        Self {
            family_rules: tables
                .iter()
                .map(|(table, rules)| (family, table.clone(), *rules))
                .collect(),
            rules_written: tables,
        }
    }

    /// Adds `other`'s rules (another family's sync) to this report: its families' rules, and its
    /// tables summed into [`rules_written`](Self::rules_written).
    pub fn merge(&mut self, other: Self) {
        for (table, rules) in other.rules_written {
            match self.rules_written.iter_mut().find(|(t, _)| *t == table) {
                Some((_, total)) => *total = total.saturating_add(rules),
                None => self.rules_written.push((table, rules)),
            }
        }
        self.family_rules.extend(other.family_rules);
    }
}

/// A dataplane backend: makes the kernel match a [`ProxyState`].
pub trait Dataplane: Send + 'static {
    /// The error a failed sync returns.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The proxy mode name, as `/proxyMode` reports it (`iptables`, `ipvs`, `nftables`).
    fn mode(&self) -> &'static str;

    /// Makes the kernel's rules match `state`, in one transaction where the kernel allows it.
    ///
    /// # Errors
    ///
    /// Returns an error when the kernel refused the change; the previous rules then stay in place.
    fn sync(
        &mut self,
        state: &ProxyState,
    ) -> impl Future<Output = Result<SyncReport, Self::Error>> + Send;
}
