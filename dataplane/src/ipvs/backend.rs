//! The IPVS mode as a [`Dataplane`] (kube-proxy's `--proxy-mode ipvs`): each sync plans every
//! IP family's virtual servers and makes the kernel's IPVS table match them.
//!
//! The IPVS table is one per network namespace for both families, so one backend serves a
//! dual-stack node. Its netlink calls block; a sync runs them on tokio's blocking pool.

use super::apply::{Applied, apply};
use super::plan::{Plan, PlanOptions, plan};
use super::{Ipvs, ServiceId, client, sysctl};
use crate::conntrack::IpFamily;
use crate::{Cidr, Dataplane, FailedStep, ProxyState, SyncError, SyncReport};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// The dummy interface kube-proxy's IPVS mode binds Service addresses to.
pub const INTERFACE: &str = "kube-ipvs0";

/// How the IPVS mode is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The IP families programmed, IPv4 first.
    pub families: Vec<IpFamily>,
    /// The scheduler of every virtual server (`--ipvs-scheduler`).
    pub scheduler: String,
    /// Virtual servers on these addresses are never deleted, though the agent did not plan them
    /// (`--ipvs-exclude-cidrs`): other programs' IPVS services on the node's addresses.
    pub exclude_cidrs: Vec<Cidr>,
    /// The node addresses that take node ports (`--nodeport-addresses`, resolved); `None` for
    /// every address of the node's interfaces, read at each sync, except loopback, IPv6
    /// link-local and [`INTERFACE`]'s.
    pub node_port_addresses: Option<Vec<IpAddr>>,
    /// Answer ARP only for the addresses of the interface asked (`--ipvs-strict-arp`).
    pub strict_arp: bool,
}

impl Default for Config {
    /// IPv4, the `rr` scheduler (kube-proxy's default), no exclusions, every node address, no
    /// strict ARP (kube-proxy's default).
    fn default() -> Self {
        Self {
            families: vec![IpFamily::V4],
            scheduler: "rr".to_owned(),
            exclude_cidrs: Vec::new(),
            node_port_addresses: None,
            strict_arp: false,
        }
    }
}

/// Why an IPVS sync failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node's addresses could not be listed, for node ports.
    #[error("listing the node's addresses for node ports")]
    NodeAddresses(#[source] std::io::Error),
    /// The IPVS netlink client could not start or read the table; nothing was changed.
    #[error("IPVS")]
    Ipvs(#[source] client::Error),
    /// A kernel setting the IPVS mode needs could not be written.
    #[error("configuring the kernel for IPVS")]
    Sysctl(#[source] sysctl::Error),
    /// The blocking part of the sync did not finish (it panicked).
    #[error("the IPVS sync did not finish: {0}")]
    Task(String),
}

impl SyncError for Error {
    fn failed_step(&self) -> FailedStep {
        FailedStep::Other
    }
}

/// The IPVS backend.
pub struct IpvsBackend {
    config: Config,
    /// The netlink client, opened by the first sync and kept; `None` again after a failure, so
    /// the next sync starts from a fresh socket.
    ipvs: Option<Ipvs>,
}

impl IpvsBackend {
    /// A backend with `config`; it touches the kernel only when it syncs.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self { config, ipvs: None }
    }

    /// The node's addresses as this sync sees them.
    fn node_addresses(&self) -> Result<NodeAddresses, Error> {
        let interfaces = if_addrs::get_if_addrs().map_err(Error::NodeAddresses)?;
        let bound = interfaces
            .iter()
            .filter(|interface| interface.name == INTERFACE)
            .map(if_addrs::Interface::ip)
            .collect();
        let node_ports = match &self.config.node_port_addresses {
            Some(addresses) => addresses.clone(),
            None => interfaces
                .iter()
                .filter(|interface| interface.name != INTERFACE && !interface.is_loopback())
                .map(if_addrs::Interface::ip)
                .filter(|ip| !is_link_local_v6(ip))
                .collect(),
        };
        Ok(NodeAddresses { node_ports, bound })
    }

    /// Each family's plan for `state`.
    fn plans(&self, state: &ProxyState, node_port_addresses: &[IpAddr]) -> Vec<(IpFamily, Plan)> {
        self.config
            .families
            .iter()
            .map(|&family| {
                let plan = plan(
                    state,
                    &PlanOptions {
                        family,
                        scheduler: self.config.scheduler.clone(),
                        node_port_addresses: node_port_addresses.to_vec(),
                    },
                );
                (family, plan)
            })
            .collect()
    }
}

/// Whether `ip` is an IPv6 link-local address (`fe80::/10`): one per interface, never a
/// node-port address.
fn is_link_local_v6(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

impl Dataplane for IpvsBackend {
    type Error = Error;

    fn mode(&self) -> &'static str {
        "ipvs"
    }

    fn ip_families(&self) -> Vec<IpFamily> {
        self.config.families.clone()
    }

    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, Error> {
        let addresses = self.node_addresses()?;
        let plans = self.plans(state, &addresses.node_ports);
        let owned = Ownership {
            node_port_addresses: addresses.node_ports.into_iter().collect(),
            bound: addresses.bound,
            exclude_cidrs: self.config.exclude_cidrs.clone(),
        };
        let full = self.ipvs.is_none();
        let ipvs = self.ipvs.take();
        let strict_arp = self.config.strict_arp;
        let (ipvs, outcome) =
            tokio::task::spawn_blocking(move || sync_ipvs(ipvs, strict_arp, &plans, &owned))
                .await
                .map_err(|e| Error::Task(e.to_string()))?;
        self.ipvs = ipvs;
        let applied = outcome?;
        for refused in &applied.refused {
            // As upstream, one Service the kernel refuses (an unknown scheduler, say) does not
            // fail the sync of the others.
            tracing::warn!(
                change = %refused.change,
                error = %refused.error,
                "IPVS refused a change"
            );
        }
        tracing::debug!(changes = applied.made.len(), "IPVS synced");
        Ok(SyncReport {
            full,
            ..SyncReport::default()
        })
    }
}

/// The node's addresses at a sync.
struct NodeAddresses {
    /// Those that take node ports.
    node_ports: Vec<IpAddr>,
    /// Those bound to [`INTERFACE`]: the Service addresses of the last sync.
    bound: BTreeSet<IpAddr>,
}

/// Which virtual servers outside the plan a sync may delete.
struct Ownership {
    /// The node-port addresses: their virtual servers are node ports.
    node_port_addresses: BTreeSet<IpAddr>,
    /// The addresses bound to [`INTERFACE`] before the sync, the Services' of the last one.
    bound: BTreeSet<IpAddr>,
    /// Addresses never touched.
    exclude_cidrs: Vec<Cidr>,
}

impl Ownership {
    /// Whether the virtual server `id` is the agent's: on an address it binds, bound or takes
    /// node ports on, and not excluded.
    fn owns(&self, id: &ServiceId, planned: &BTreeSet<IpAddr>) -> bool {
        let address = &id.address;
        !self
            .exclude_cidrs
            .iter()
            .any(|cidr| cidr.contains(*address))
            && (planned.contains(address)
                || self.bound.contains(address)
                || self.node_port_addresses.contains(address))
    }
}

/// Connects and writes the kernel settings when `ipvs` is `None`, then applies every plan; hands
/// the client back unless it failed.
fn sync_ipvs(
    ipvs: Option<Ipvs>,
    strict_arp: bool,
    plans: &[(IpFamily, Plan)],
    owned: &Ownership,
) -> (Option<Ipvs>, Result<Applied<client::Error>, Error>) {
    let mut ipvs = match ipvs {
        Some(ipvs) => ipvs,
        None => match connect(strict_arp) {
            Ok(ipvs) => ipvs,
            Err(e) => return (None, Err(e)),
        },
    };
    let planned: BTreeSet<IpAddr> = plans
        .iter()
        .flat_map(|(_, plan)| plan.bound_addresses.iter().copied())
        .collect();
    let mut all = Applied {
        made: Vec::new(),
        refused: Vec::new(),
    };
    for (family, plan) in plans {
        // Each family's plan leaves the other family's virtual servers alone.
        let ours = |id: &ServiceId| family.contains(&id.address) && owned.owns(id, &planned);
        match apply(&mut ipvs, plan, ours) {
            Ok(applied) => {
                all.made.extend(applied.made);
                all.refused.extend(applied.refused);
            }
            Err(e) => return (None, Err(Error::Ipvs(e))),
        }
    }
    (Some(ipvs), Ok(all))
}

/// Opens the IPVS client, which loads `ip_vs`, then writes the settings its sysctls need.
fn connect(strict_arp: bool) -> Result<Ipvs, Error> {
    let ipvs = Ipvs::connect().map_err(Error::Ipvs)?;
    let written =
        sysctl::apply(std::path::Path::new("/proc/sys"), strict_arp).map_err(Error::Sysctl)?;
    for setting in written {
        tracing::info!(key = setting.key, value = setting.value, "set sysctl");
    }
    Ok(ipvs)
}
