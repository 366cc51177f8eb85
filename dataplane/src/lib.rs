//! The dataplane: a plain model of what a node must program, and the backends that program it.
//!
//! Backends consume [`model::ProxyState`], never wire or Kubernetes types. Each backend keeps a
//! pure render step (state → kernel input) apart from a thin executor (processes, sockets).

pub mod changes;
pub mod conntrack;
pub mod ebpf;
pub mod endpoints;
mod family;
pub mod full_sync;
pub mod iptables;
pub mod ipvs;
pub mod leftovers;
pub mod local_traffic;
pub mod model;
pub mod nftables;
pub mod node_options;
mod node_port_addresses;
pub(crate) mod port_plan;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tool;

use std::future::Future;

pub use changes::changed_keys;
pub use family::{Families, IpFamily};
pub use model::{
    Cidr, Endpoint, Protocol, ProxyState, Service, ServiceKey, ServicePort, TrafficPolicy,
};
pub use node_options::NodeOptions;

/// What one successful sync wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Rules written per IP family and table, e.g. `(IpFamily::V6, "nat", 12)` (kube-proxy's
    /// `ip_family` metric label).
    pub family_rules: Vec<(IpFamily, String, u32)>,
    /// Rules held per IP family and table after this sync: those written and those an
    /// incremental sync left in place.
    pub family_totals: Vec<(IpFamily, String, u32)>,
    /// Every rule was written, not only the changed Services' (kube-proxy's full sync); with
    /// several families, in at least one of them, whose sync then takes a full sync's time.
    pub full: bool,
    /// The deletion of stale conntrack flows after the sync, per family; none on the first
    /// sync, which has no earlier state to compare with.
    pub conntrack: Vec<conntrack::Cleanup>,
}

impl SyncReport {
    /// The report of a sync of one IP family that wrote `written` and left `total` rules per
    /// table (`(table, rules)`), fully or not.
    #[must_use]
    pub fn for_family(
        family: IpFamily,
        written: Vec<(String, u32)>,
        total: Vec<(String, u32)>,
        full: bool,
    ) -> Self {
        let per_family = |counts: Vec<(String, u32)>| {
            counts
                .into_iter()
                .map(|(table, rules)| (family, table, rules))
                .collect()
        };
        Self {
            family_rules: per_family(written),
            family_totals: per_family(total),
            full,
            conntrack: Vec::new(),
        }
    }

    /// Adds `other`'s rules (another family's sync) to this report. The sync is full when
    /// either was: as upstream's per-family proxiers, a family rewritten whole (its canary gone,
    /// say) counts as a full sync even while the other family's sync was partial.
    pub fn merge(&mut self, other: Self) {
        self.family_rules.extend(other.family_rules);
        self.family_totals.extend(other.family_totals);
        self.full = self.full || other.full;
        self.conntrack.extend(other.conntrack);
    }

    /// Rules written per table, e.g. `("nat", 12)`, summed over the IP families.
    #[must_use]
    pub fn rules_written(&self) -> Vec<(String, u32)> {
        per_table(&self.family_rules)
    }

    /// Rules held per table after this sync, summed over the IP families.
    #[must_use]
    pub fn rules_total(&self) -> Vec<(String, u32)> {
        per_table(&self.family_totals)
    }
}

/// `counts` summed per table, tables in the order they first appear.
fn per_table(counts: &[(IpFamily, String, u32)]) -> Vec<(String, u32)> {
    let mut sums: Vec<(String, u32)> = Vec::new();
    for (_, table, rules) in counts {
        match sums.iter_mut().find(|(t, _)| t == table) {
            Some((_, sum)) => *sum = sum.saturating_add(*rules),
            None => sums.push((table.clone(), *rules)),
        }
    }
    sums
}

/// Which step of a sync failed, as kube-proxy's failure counters tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedStep {
    /// The kernel refused the rules written in one transaction (`iptables-restore`); `partial`
    /// when the sync wrote only the changed Services' chains.
    Restore {
        /// The sync was partial (kube-proxy's `..._partial_restore_failures_total`).
        partial: bool,
    },
    /// Something before or after the transaction: reading the tables, running a tool, a jump.
    Other,
}

/// An error of a failed sync, saying which step failed.
pub trait SyncError: std::error::Error + Send + Sync + 'static {
    /// The step that failed.
    fn failed_step(&self) -> FailedStep;

    /// The IP family whose rules failed, when the sync writes each family's on its own; `None`
    /// when one step holds every family's (nftables) or the backend programs one family.
    fn failed_family(&self) -> Option<IpFamily> {
        None
    }
}

impl SyncError for std::convert::Infallible {
    fn failed_step(&self) -> FailedStep {
        match *self {}
    }
}

/// A dataplane backend: makes the kernel match a [`ProxyState`].
pub trait Dataplane: Send + 'static {
    /// The error a failed sync returns.
    type Error: SyncError;

    /// The proxy mode name, as `/proxyMode` reports it (`iptables`, `ipvs`, `nftables`).
    fn mode(&self) -> &'static str;

    /// The IP families the backend programs, IPv4 first, as `/healthz` lists them; IPv4 unless
    /// the backend says otherwise.
    fn ip_families(&self) -> Families {
        Families::default()
    }

    /// Makes the kernel's rules match `state`, in one transaction where the kernel allows it.
    ///
    /// # Errors
    ///
    /// Returns an error when the kernel refused the change; the previous rules then stay in place.
    fn sync(
        &mut self,
        state: &ProxyState,
    ) -> impl Future<Output = Result<SyncReport, Self::Error>> + Send;

    /// Replaces the CIDRs pod traffic is told by (the cluster CIDRs of the local-traffic
    /// detector), as kube-proxy's `NodeCIDR` detector follows its Node's `podCIDRs`. Every
    /// Service's rules use them, so the next sync writes all rules again. A backend without the
    /// detector ignores them.
    fn set_local_cidrs(&mut self, cidrs: Vec<Cidr>) {
        let _ = cidrs;
    }

    /// Replaces the cluster's service CIDRs (kube-proxy's `ServiceCIDR`s): nftables mode drops
    /// traffic to their addresses that no Service holds, so the next sync writes every rule
    /// again. The other modes do not use them, as upstream.
    fn set_service_cidrs(&mut self, cidrs: Vec<Cidr>) {
        let _ = cidrs;
    }

    /// Replaces the node's own IPs (kube-proxy's node IPs, one per family), which the
    /// load-balancer source-range rules match; the next sync writes every rule again.
    fn set_node_ips(&mut self, ips: Vec<std::net::IpAddr>) {
        let _ = ips;
    }

    /// Replaces the addresses that take node ports (`None`: every local address), as
    /// kube-proxy matches `nodePortAddresses` against the node's addresses again at each sync;
    /// the next sync writes every rule again. A backend that reads them at each sync anyway
    /// only stores them.
    fn set_node_port_addresses(&mut self, addresses: Option<Vec<std::net::IpAddr>>) {
        let _ = addresses;
    }
}
