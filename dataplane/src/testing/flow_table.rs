//! The packet-flow table every backend is checked against: sample connections and what must happen to them.
//!
//! Each [`Scenario`] is a [`ProxyState`] plus the addresses local to the node and the node's
//! masquerade settings (kube-proxy's `--cluster-cidr`, `--masquerade-all`), and a list of
//! [`FlowCase`]s: one new connection ([`Flow`]) and its [`Expected`] fate. The table says nothing
//! about iptables, nftables or IPVS; each backend has its own tracer (or real traffic in network
//! namespaces) that turns a flow into an outcome comparable with [`Expected`]. A backend change that
//! alters what a row expects is a behaviour change, whatever the rule text looks like.
//!
//! Addresses (one block for the whole table):
//!
//! | thing           | addresses                                                               |
//! |-----------------|-------------------------------------------------------------------------|
//! | pods            | `10.244.0.0/16`; client pod [`CLIENT_POD`] and local endpoints on this node in `10.244.0.x`, endpoints on other nodes in `10.244.1.x`, `10.244.2.x`, `10.244.3.x` |
//! | cluster IPs     | `10.96.0.0/16`                                                          |
//! | external and load-balancer IPs | `192.0.2.0/24`, not assigned to the node                 |
//! | node            | [`NODE_IP`], the only address local to the node                         |
//! | external client | [`EXTERNAL_CLIENT`] (`203.0.113.0/24`); [`OTHER_EXTERNAL_CLIENT`] (`198.51.100.0/24`) |
//! | IPv6 pods       | `fd00:10:244::/48`; client pod [`CLIENT_POD6`] in `fd00:10:244::x`, endpoints on other nodes in `fd00:10:244:1::x`, `fd00:10:244:2::x` |
//! | IPv6 cluster IPs | `fd00:10:96::/112`                                                     |
//! | IPv6 node       | [`NODE_IP6`], the node's second address                                 |
//! | IPv6 external client | [`EXTERNAL_CLIENT6`] (`2001:db8:203::/48`)                          |

mod rows;

use crate::{
    Cidr, Endpoint, Protocol, ProxyState, Service, ServiceKey, ServicePort, TrafficPolicy,
};
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

/// The node's own address: the source of [`Origin::Node`] flows and the destination of node ports.
pub const NODE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 11));
/// A pod on this node that is no Service's endpoint.
pub const CLIENT_POD: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 0, 5));
/// A client outside the cluster.
pub const EXTERNAL_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));
/// Another client outside the cluster, in a different network from [`EXTERNAL_CLIENT`].
pub const OTHER_EXTERNAL_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 9));
/// The node's IPv6 address, in the dual-stack scenario.
pub const NODE_IP6: IpAddr = v6(0xfd00, 0x198, 0x18, 0, 0x11);
/// [`CLIENT_POD`]'s IPv6 address.
pub const CLIENT_POD6: IpAddr = v6(0xfd00, 0x10, 0x244, 0, 0x5);
/// An IPv6 client outside the cluster.
pub const EXTERNAL_CLIENT6: IpAddr = v6(0x2001, 0xdb8, 0x203, 0, 0x7);

/// Where a flow's first packet comes from, which decides the hooks it crosses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// A pod (another network namespace): enters the node through PREROUTING.
    Pod,
    /// The node itself (a process in the host network namespace): leaves through OUTPUT, and its
    /// source counts as local (`--src-type LOCAL`).
    Node,
    /// A client outside the cluster: enters the node through PREROUTING.
    External,
}

/// The first packet of a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    /// What the row checks, as a sentence.
    pub name: &'static str,
    /// The source address.
    pub source: IpAddr,
    /// The destination address, before any translation.
    pub destination: IpAddr,
    /// The transport protocol.
    pub protocol: Protocol,
    /// The destination port, before any translation.
    pub port: u16,
    /// Where the packet comes from.
    pub origin: Origin,
}

/// What must happen to a [`Flow`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// Translated to one of `targets`, each chosen with some probability; the value says whether
    /// the source is masqueraded (SNAT to the node) when that target is chosen.
    Endpoints {
        /// Every endpoint the connection may reach, and whether it is masqueraded on the way.
        targets: BTreeMap<SocketAddr, bool>,
    },
    /// Refused with an ICMP error (port unreachable), so the client fails fast.
    Reject,
    /// Silently dropped.
    Drop,
    /// Refused by the socket layer at `connect()` or `sendto()` (`EPERM`), before any packet
    /// leaves: the client fails at once. No kube-proxy mode does this; a mode that does says why.
    Forbidden,
    /// Left alone by the service rules: not translated, not masqueraded, not refused.
    Pass,
}

impl Expected {
    /// [`Expected::Endpoints`] with these targets and masquerade decisions.
    #[must_use]
    pub fn endpoints(targets: impl IntoIterator<Item = (SocketAddr, bool)>) -> Self {
        Self::Endpoints {
            targets: targets.into_iter().collect(),
        }
    }
}

/// One row of the table: a flow and its expected fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowCase {
    /// The connection.
    pub flow: Flow,
    /// What must happen to it.
    pub expected: Expected,
    /// Set while a backend does not implement this row yet: the reason, which runners print
    /// instead of failing. Clear it once the row passes.
    pub pending: Option<&'static str>,
}

/// A node's state and the flows checked against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// What the scenario holds, for reports.
    pub name: &'static str,
    /// What the node must program.
    pub state: ProxyState,
    /// The addresses local to the node (`addrtype LOCAL`, node ports); the first is the node's
    /// own IP (kube-proxy's node IP).
    pub node_ips: Vec<IpAddr>,
    /// The cluster's pod CIDRs (kube-proxy's `--cluster-cidr`): traffic from inside is pod
    /// traffic. Empty: no local-traffic detector.
    pub cluster_cidrs: Vec<Cidr>,
    /// Masquerade all cluster-IP traffic (kube-proxy's `--masquerade-all`).
    pub masquerade_all: bool,
    /// The node addresses that take node ports (kube-proxy's `--nodeport-addresses`, resolved);
    /// `None` for every address in `node_ips`.
    pub node_port_addresses: Option<Vec<IpAddr>>,
    /// The rows.
    pub cases: Vec<FlowCase>,
}

impl Scenario {
    /// The node's configuration the scenario implies, as a backend's render takes it: its
    /// cluster CIDRs, masquerade-all, node-port addresses, and its first address as the node IP.
    #[must_use]
    pub fn node_options(&self) -> crate::NodeOptions {
        crate::NodeOptions::default()
            .with_cluster_cidrs(self.cluster_cidrs.iter().copied())
            .with_masquerade_all(self.masquerade_all)
            .with_node_port_addresses(self.node_port_addresses.clone())
            .with_node_ips(self.node_ips.first().copied())
    }
}

/// The shared table: every behaviour the dataplane supports today.
#[must_use]
pub fn scenarios() -> Vec<Scenario> {
    vec![
        rows::node_with_services(),
        rows::node_without_services(),
        rows::node_with_terminating_endpoints(),
        rows::node_with_external_ips(),
        rows::node_with_session_affinity(),
        rows::node_with_local_traffic_policies(),
        rows::node_with_load_balancer_source_ranges(),
        rows::node_holding_its_load_balancer_ips(),
        rows::node_with_sctp_services(),
        rows::node_with_cluster_cidr(),
        rows::node_with_masquerade_all(),
        rows::node_with_node_port_addresses(),
        rows::node_with_dual_stack_services(),
        rows::node_with_topology_hints(),
    ]
}

/// `default/web`: ClusterIP and NodePort, two ready endpoints and one that is starting up.
const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// `a:b:c:d::e`, the shape of every IPv6 address in the table.
const fn v6(a: u16, b: u16, c: u16, d: u16, e: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(a, b, c, d, 0, 0, 0, e))
}

const fn at(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn row_names_are_unique_within_each_scenario() {
        for scenario in scenarios() {
            let mut seen = BTreeSet::new();
            for case in &scenario.cases {
                assert!(
                    seen.insert(case.flow.name),
                    "{}: duplicate row {:?}",
                    scenario.name,
                    case.flow.name
                );
            }
        }
    }

    #[test]
    fn expected_targets_are_serving_endpoints_of_the_scenario() {
        for scenario in scenarios() {
            let serving: BTreeSet<SocketAddr> = scenario
                .state
                .services
                .values()
                .flat_map(|service| &service.ports)
                .flat_map(|port| &port.endpoints)
                .filter(|endpoint| endpoint.ready || endpoint.serving)
                .map(|endpoint| SocketAddr::new(endpoint.ip, endpoint.port))
                .collect();
            for case in &scenario.cases {
                if let Expected::Endpoints { targets } = &case.expected {
                    for target in targets.keys() {
                        assert!(
                            serving.contains(target),
                            "{}: {target} is no serving endpoint",
                            case.flow.name
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn node_flows_come_from_a_node_address() {
        for scenario in scenarios() {
            for case in &scenario.cases {
                if case.flow.origin == Origin::Node {
                    assert!(
                        scenario.node_ips.contains(&case.flow.source),
                        "{}",
                        case.flow.name
                    );
                }
            }
        }
    }
}
