//! The IPVS mode as a [`Dataplane`] (kube-proxy's `--proxy-mode ipvs`): each sync plans every
//! IP family's virtual servers, writes the ipsets and iptables rules that masquerade and filter
//! their traffic, binds their addresses to [`INTERFACE`], makes the kernel's IPVS table match the
//! plan, then unbinds the addresses no Service has any more.
//!
//! The netfilter part comes first so that a new Service's address is in the sets
//! `KUBE-IPVS-FILTER` lets through before it is bound and reachable. Last, as upstream, the
//! conntrack entries of UDP and SCTP flows to endpoints that went are deleted, so the flow's next
//! packet is scheduled anew. (Since Linux 5.9 IPVS expires a removed real server's connections
//! itself under `expire_nodest_conn`, which the sysctls set; the deletion covers older kernels.)
//!
//! The IPVS table is one per network namespace for both families, so one backend serves a
//! dual-stack node. Its netlink calls block; a sync runs them on tokio's blocking pool.

use super::apply::{Applied, apply};
use super::interface::{self, DummyInterface};
use super::netfilter::{self, Netfilter};
use super::plan::{Plan, PlanOptions, plan};
use super::rules;
use super::sets::{SetOptions, sets};
use super::{Ipvs, ServiceId, Timeouts, client, sysctl};
use crate::conntrack::{self, Conntrack};
use crate::{Cidr, Dataplane, FailedStep, ProxyState, SyncError, SyncReport, iptables};
use crate::{Families, IpFamily};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// The dummy interface kube-proxy's IPVS mode binds Service addresses to.
pub const INTERFACE: &str = "kube-ipvs0";

/// How the IPVS mode is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The IP families programmed.
    pub families: Families,
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
    /// IPVS's connection timeouts (`--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`,
    /// `--ipvs-udp-timeout`), set once the client connects.
    pub timeouts: Timeouts,
    /// How the masquerade and filter rules are written and what they depend on: the iptables
    /// tools (each family's are used), the cluster CIDR, masquerade-all and the node's IPs.
    pub iptables: iptables::Config,
    /// The `ipset` binary.
    pub ipset: String,
}

impl Default for Config {
    /// IPv4, the `rr` scheduler (kube-proxy's default), no exclusions, every node address, no
    /// strict ARP and the kernel's timeouts (kube-proxy's defaults), the iptables tools'
    /// defaults, `ipset` from PATH.
    fn default() -> Self {
        Self {
            families: Families::default(),
            scheduler: "rr".to_owned(),
            exclude_cidrs: Vec::new(),
            node_port_addresses: None,
            strict_arp: false,
            timeouts: Timeouts::default(),
            iptables: iptables::Config::default(),
            ipset: "ipset".to_owned(),
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
    /// The dummy interface could not be found, created or read, or an address could not be
    /// bound or unbound.
    #[error("the {INTERFACE} interface")]
    Interface(#[source] interface::Error),
    /// The ipsets or the masquerade and filter rules could not be written.
    #[error("the IPVS mode's ipsets and iptables rules")]
    Netfilter(#[source] netfilter::Error),
    /// A kernel setting the IPVS mode needs could not be written.
    #[error("configuring the kernel for IPVS")]
    Sysctl(#[source] sysctl::Error),
    /// The blocking part of the sync did not finish (it panicked).
    #[error("the IPVS sync did not finish: {0}")]
    Task(String),
}

impl SyncError for Error {
    fn failed_step(&self) -> FailedStep {
        match self {
            Self::Netfilter(netfilter::Error::Iptables { source, .. }) => source.failed_step(),
            _ => FailedStep::Other,
        }
    }
}

/// The IPVS backend.
pub struct IpvsBackend {
    config: Config,
    /// The ipsets and iptables rules as last written.
    netfilter: Netfilter,
    /// The state of the last successful sync; `None` before the first, which deletes no flows.
    applied: Option<ProxyState>,
    /// The netlink sockets, opened by the first sync and kept; `None` again after a failure, so
    /// the next sync starts from fresh ones.
    kernel: Option<Kernel>,
}

/// What a sync programs the kernel through.
struct Kernel {
    ipvs: Ipvs,
    interface: DummyInterface,
}

impl IpvsBackend {
    /// A backend with `config`; it touches the kernel only when it syncs.
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            netfilter: Netfilter::new(&config.ipset, &config.iptables, &config.families),
            config,
            kernel: None,
            applied: None,
        }
    }

    /// The node's addresses at this sync, but [`INTERFACE`]'s.
    fn node_addresses(&self) -> Result<NodeAddresses, Error> {
        let interfaces = if_addrs::get_if_addrs().map_err(Error::NodeAddresses)?;
        let local = interfaces
            .iter()
            .filter(|interface| interface.name != INTERFACE)
            .map(if_addrs::Interface::ip)
            .collect();
        let node_ports = crate::node_port_addresses::select(
            self.config.node_port_addresses.as_deref(),
            &interfaces,
            INTERFACE,
        );
        Ok(NodeAddresses { local, node_ports })
    }

    /// Each family's plan for `state`.
    fn plans(&self, state: &ProxyState, addresses: &NodeAddresses) -> Vec<(IpFamily, Plan)> {
        self.config
            .families
            .iter()
            .map(|&family| {
                let plan = plan(
                    state,
                    &PlanOptions {
                        family,
                        scheduler: self.config.scheduler.clone(),
                        node_port_addresses: addresses.node_ports.clone(),
                        local_addresses: addresses.local.clone(),
                    },
                );
                (family, plan)
            })
            .collect()
    }
}

/// The node's addresses at a sync.
struct NodeAddresses {
    /// Every address but [`INTERFACE`]'s.
    local: BTreeSet<IpAddr>,
    /// Those that take node ports.
    node_ports: Vec<IpAddr>,
}

impl IpvsBackend {
    /// Each family's ipsets and iptables rules for `state` and its `plans`, written where they
    /// changed.
    async fn write_netfilter(
        &mut self,
        state: &ProxyState,
        plans: &[(IpFamily, Plan)],
        node_port_addresses: &[IpAddr],
    ) -> Result<Vec<netfilter::Written>, Error> {
        let node = &self.config.iptables.node_options;
        let family_sets: Vec<_> = plans
            .iter()
            .map(|(family, plan)| {
                let options = SetOptions {
                    family: *family,
                    node_port_addresses: node_port_addresses.to_vec(),
                    node_ips: node.node_ips.clone(),
                };
                sets(state, plan, &options)
            })
            .collect();
        let rules: Vec<_> = family_sets
            .iter()
            .map(|sets| rules::render(sets, node))
            .collect();
        self.netfilter
            .sync(family_sets, &rules)
            .await
            .map_err(Error::Netfilter)
    }
}

impl Dataplane for IpvsBackend {
    type Error = Error;

    fn mode(&self) -> &'static str {
        "ipvs"
    }

    /// The iptables rules are rendered from the configuration at every sync, and written where
    /// they differ from what the kernel holds.
    fn set_local_cidrs(&mut self, cidrs: Vec<crate::Cidr>) {
        self.config.iptables.node_options.cluster_cidrs = cidrs;
    }

    fn set_node_port_addresses(&mut self, addresses: Option<Vec<std::net::IpAddr>>) {
        self.config
            .iptables
            .node_options
            .node_port_addresses
            .clone_from(&addresses);
        self.config.node_port_addresses = addresses;
    }

    fn set_node_ips(&mut self, ips: Vec<std::net::IpAddr>) {
        self.config.iptables.node_options.node_ips = ips;
    }

    fn ip_families(&self) -> Families {
        self.config.families.clone()
    }

    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, Error> {
        let addresses = self.node_addresses()?;
        let plans = self.plans(state, &addresses);
        let written = self
            .write_netfilter(state, &plans, &addresses.node_ports)
            .await?;
        let owned = Ownership {
            node_port_addresses: addresses.node_ports.into_iter().collect(),
            exclude_cidrs: self.config.exclude_cidrs.clone(),
        };
        let full = self.kernel.is_none();
        let kernel = self.kernel.take();
        let settings = (self.config.strict_arp, self.config.timeouts);
        let (kernel, outcome) =
            tokio::task::spawn_blocking(move || sync_kernel(kernel, settings, &plans, &owned))
                .await
                .map_err(|e| Error::Task(e.to_string()))?;
        self.kernel = kernel;
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
        let mut report = SyncReport {
            full,
            ..SyncReport::default()
        };
        if let Some(previous) = self.applied.replace(state.clone()) {
            let iptables = &self.config.iptables;
            let conntrack = Conntrack::new(&iptables.command_prefix, &iptables.conntrack);
            for &family in &self.config.families {
                report.conntrack.push(
                    conntrack::delete_stale_flows(&conntrack, &previous, state, family).await,
                );
            }
        }
        for family in written {
            let rules = if family.written {
                family.totals.clone()
            } else {
                Vec::new()
            };
            report.merge(SyncReport::for_family(
                family.family,
                rules,
                family.totals,
                family.full,
            ));
        }
        Ok(report)
    }
}

/// Which virtual servers outside the plan a sync may delete.
struct Ownership {
    /// The node-port addresses: their virtual servers are node ports.
    node_port_addresses: BTreeSet<IpAddr>,
    /// Addresses never touched.
    exclude_cidrs: Vec<Cidr>,
}

impl Ownership {
    /// Whether the virtual server `id` is the agent's: on an address it serves (`served`), had
    /// bound before the sync (`bound`, the Services' of the last one) or takes node ports on, and
    /// not excluded.
    fn owns(&self, id: &ServiceId, served: &BTreeSet<IpAddr>, bound: &BTreeSet<IpAddr>) -> bool {
        let address = &id.address;
        !self.excluded(*address)
            && (served.contains(address)
                || bound.contains(address)
                || self.node_port_addresses.contains(address))
    }

    /// Whether `address` is inside `--ipvs-exclude-cidrs`: never unbound, and its virtual
    /// servers never deleted.
    fn excluded(&self, address: IpAddr) -> bool {
        self.exclude_cidrs.iter().any(|cidr| cidr.contains(address))
    }
}

/// Connects and writes the kernel settings when `kernel` is `None`; binds the planned addresses,
/// applies every plan, and unbinds the addresses no plan has. Hands the sockets back unless a
/// step failed.
fn sync_kernel(
    kernel: Option<Kernel>,
    (strict_arp, timeouts): (bool, Timeouts),
    plans: &[(IpFamily, Plan)],
    owned: &Ownership,
) -> (Option<Kernel>, Result<Applied<client::Error>, Error>) {
    let mut kernel = match kernel {
        Some(kernel) => kernel,
        None => match connect(strict_arp, &timeouts) {
            Ok(kernel) => kernel,
            Err(e) => return (None, Err(e)),
        },
    };
    match program(&mut kernel, plans, owned) {
        Ok(applied) => (Some(kernel), Ok(applied)),
        Err(e) => (None, Err(e)),
    }
}

/// One sync's kernel changes, in the order that keeps traffic flowing: addresses first (a
/// virtual server takes packets only to a local address), stale addresses last (after their
/// virtual servers are gone).
fn program(
    kernel: &mut Kernel,
    plans: &[(IpFamily, Plan)],
    owned: &Ownership,
) -> Result<Applied<client::Error>, Error> {
    let planned: BTreeSet<IpAddr> = plans
        .iter()
        .flat_map(|(_, plan)| plan.bound_addresses.iter().copied())
        .collect();
    let bound = kernel.interface.addresses().map_err(Error::Interface)?;
    for &address in planned.difference(&bound) {
        kernel.interface.bind(address).map_err(Error::Interface)?;
    }
    let mut all = Applied {
        made: Vec::new(),
        refused: Vec::new(),
    };
    let served: BTreeSet<IpAddr> = plans
        .iter()
        .flat_map(|(_, plan)| plan.servers.keys().map(|id| id.address))
        .collect();
    for (family, plan) in plans {
        // Each family's plan leaves the other family's virtual servers alone.
        let ours = |id: &ServiceId| family.contains(&id.address) && owned.owns(id, &served, &bound);
        let applied = apply(&mut kernel.ipvs, plan, ours).map_err(Error::Ipvs)?;
        all.made.extend(applied.made);
        all.refused.extend(applied.refused);
    }
    for &address in bound.difference(&planned) {
        if !owned.excluded(address) {
            kernel.interface.unbind(address).map_err(Error::Interface)?;
        }
    }
    Ok(all)
}

/// Opens the IPVS client, which loads `ip_vs`, writes the settings its sysctls need and the
/// timeouts, and finds or creates [`INTERFACE`].
fn connect(strict_arp: bool, timeouts: &Timeouts) -> Result<Kernel, Error> {
    let mut ipvs = Ipvs::connect().map_err(Error::Ipvs)?;
    if !timeouts.is_unset() {
        ipvs.set_timeouts(timeouts).map_err(Error::Ipvs)?;
        tracing::info!(?timeouts, "set IPVS connection timeouts");
    }
    let written =
        sysctl::apply(std::path::Path::new("/proc/sys"), strict_arp).map_err(Error::Sysctl)?;
    for setting in written {
        tracing::info!(key = setting.key, value = setting.value, "set sysctl");
    }
    let interface = DummyInterface::ensure(INTERFACE).map_err(Error::Interface)?;
    Ok(Kernel { ipvs, interface })
}
