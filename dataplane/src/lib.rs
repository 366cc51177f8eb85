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

pub use model::{
    Cidr, Endpoint, Protocol, ProxyState, Service, ServiceKey, ServicePort, TrafficPolicy,
};

/// What one successful sync wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Rules written by this sync per table, e.g. `("nat", 12)`.
    pub rules_written: Vec<(String, u32)>,
    /// Rules the backend's tables hold after this sync, per table: those written and those an
    /// incremental sync left in place.
    pub rules_total: Vec<(String, u32)>,
    /// Every rule was written, not only the changed Services' (kube-proxy's full sync).
    pub full: bool,
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
