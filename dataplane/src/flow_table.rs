//! The packet-flow table every backend is checked against: sample connections and what must happen to them.
//!
//! Each [`Scenario`] is a [`ProxyState`] plus the addresses local to the node, and a list of
//! [`FlowCase`]s: one new connection ([`Flow`]) and its [`Expected`] fate. The table says nothing
//! about iptables, nftables or IPVS; each backend has its own tracer (or real traffic in network
//! namespaces) that turns a flow into an outcome comparable with [`Expected`]. A backend change that
//! alters what a row expects is a behaviour change, whatever the rule text looks like.
//!
//! Addresses (one block for the whole table):
//!
//! | thing           | addresses                                                               |
//! |-----------------|-------------------------------------------------------------------------|
//! | pods            | `10.244.0.0/16`; client pod [`CLIENT_POD`] on this node, endpoints on other nodes in `10.244.1.x`, `10.244.2.x`, `10.244.3.x` |
//! | cluster IPs     | `10.96.0.0/16`                                                          |
//! | node            | [`NODE_IP`], the only address local to the node                         |
//! | external client | [`EXTERNAL_CLIENT`]                                                     |

use crate::{Endpoint, Protocol, ProxyState, Service, ServiceKey, ServicePort};
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

/// The node's own address: the source of [`Origin::Node`] flows and the destination of node ports.
pub const NODE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 11));
/// A pod on this node that is no Service's endpoint.
pub const CLIENT_POD: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 0, 5));
/// A client outside the cluster.
pub const EXTERNAL_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));

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
    /// The addresses local to the node (`addrtype LOCAL`, node ports).
    pub node_ips: Vec<IpAddr>,
    /// The rows.
    pub cases: Vec<FlowCase>,
}

/// The shared table: every behaviour the dataplane supports today.
#[must_use]
pub fn scenarios() -> Vec<Scenario> {
    vec![node_with_services(), node_without_services()]
}

/// `default/web`: ClusterIP and NodePort, two ready endpoints and one that is starting up.
const WEB_IP: IpAddr = v4(10, 96, 0, 10);
const WEB_NODE_PORT: u16 = 30080;
const WEB_1: SocketAddr = at(v4(10, 244, 1, 10), 8080);
const WEB_2: SocketAddr = at(v4(10, 244, 2, 10), 8080);
const WEB_STARTING: SocketAddr = at(v4(10, 244, 3, 10), 8080);
/// `default/idle`: ClusterIP and NodePort, its only endpoint not ready.
const IDLE_IP: IpAddr = v4(10, 96, 0, 20);
const IDLE_NODE_PORT: u16 = 30081;
const IDLE_STARTING: SocketAddr = at(v4(10, 244, 1, 20), 8080);
/// `kube-system/kube-dns`: UDP only.
const DNS_IP: IpAddr = v4(10, 96, 0, 53);
const DNS_1: SocketAddr = at(v4(10, 244, 1, 53), 53);
const DNS_2: SocketAddr = at(v4(10, 244, 2, 53), 53);
/// `shop/api`: two named ports with target ports that differ from the service ports.
const API_IP: IpAddr = v4(10, 96, 0, 30);
const API_1: IpAddr = v4(10, 244, 1, 30);
const API_2: IpAddr = v4(10, 244, 2, 30);

fn node_with_services() -> Scenario {
    let web = service(
        "default",
        "web",
        WEB_IP,
        vec![port(
            "",
            Protocol::Tcp,
            80,
            Some(WEB_NODE_PORT),
            vec![ready(WEB_1), ready(WEB_2), starting(WEB_STARTING)],
        )],
    );
    let idle = service(
        "default",
        "idle",
        IDLE_IP,
        vec![port(
            "",
            Protocol::Tcp,
            80,
            Some(IDLE_NODE_PORT),
            vec![starting(IDLE_STARTING)],
        )],
    );
    let dns = service(
        "kube-system",
        "kube-dns",
        DNS_IP,
        vec![port(
            "dns",
            Protocol::Udp,
            53,
            None,
            vec![ready(DNS_1), ready(DNS_2)],
        )],
    );
    let api = service(
        "shop",
        "api",
        API_IP,
        vec![
            port(
                "http",
                Protocol::Tcp,
                80,
                None,
                vec![ready(at(API_1, 8080)), ready(at(API_2, 8080))],
            ),
            port(
                "metrics",
                Protocol::Tcp,
                9090,
                None,
                vec![ready(at(API_1, 9100)), ready(at(API_2, 9100))],
            ),
        ],
    );

    let web_direct = || Expected::endpoints([(WEB_1, false), (WEB_2, false)]);
    let web_masqueraded = || Expected::endpoints([(WEB_1, true), (WEB_2, true)]);
    use Origin::{External, Node, Pod};
    use Protocol::{Tcp, Udp};
    let cases = vec![
        case(
            "pod to cluster IP reaches the ready endpoints unmasqueraded",
            (Pod, CLIENT_POD),
            (Tcp, WEB_IP, 80),
            web_direct(),
        ),
        case(
            "node to cluster IP reaches the ready endpoints unmasqueraded",
            (Node, NODE_IP),
            (Tcp, WEB_IP, 80),
            web_direct(),
        ),
        case(
            "external client to node port reaches the ready endpoints masqueraded",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, WEB_NODE_PORT),
            web_masqueraded(),
        ),
        case(
            "pod to node port reaches the ready endpoints masqueraded",
            (Pod, CLIENT_POD),
            (Tcp, NODE_IP, WEB_NODE_PORT),
            web_masqueraded(),
        ),
        case(
            "node to its own node port reaches the ready endpoints masqueraded",
            (Node, NODE_IP),
            (Tcp, NODE_IP, WEB_NODE_PORT),
            web_masqueraded(),
        ),
        case(
            "endpoint to its own service is masqueraded only when it reaches itself",
            (Pod, WEB_1.ip()),
            (Tcp, WEB_IP, 80),
            Expected::endpoints([(WEB_1, true), (WEB_2, false)]),
        ),
        case(
            "pod to cluster IP on a port the service lacks passes",
            (Pod, CLIENT_POD),
            (Tcp, WEB_IP, 443),
            Expected::Pass,
        ),
        case(
            "pod to another pod's IP passes",
            (Pod, CLIENT_POD),
            (Tcp, WEB_1.ip(), WEB_1.port()),
            Expected::Pass,
        ),
        case(
            "pod to an address outside the cluster passes",
            (Pod, CLIENT_POD),
            (Tcp, EXTERNAL_CLIENT, 443),
            Expected::Pass,
        ),
        case(
            "external client to a node port no service has passes",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, 22),
            Expected::Pass,
        ),
        case(
            "pod to cluster IP without ready endpoints is rejected",
            (Pod, CLIENT_POD),
            (Tcp, IDLE_IP, 80),
            Expected::Reject,
        ),
        case(
            "node to cluster IP without ready endpoints is rejected",
            (Node, NODE_IP),
            (Tcp, IDLE_IP, 80),
            Expected::Reject,
        ),
        case(
            "external client to node port without ready endpoints is rejected",
            (External, EXTERNAL_CLIENT),
            (Tcp, NODE_IP, IDLE_NODE_PORT),
            Expected::Reject,
        ),
        case(
            "pod to UDP cluster IP reaches the DNS endpoints",
            (Pod, CLIENT_POD),
            (Udp, DNS_IP, 53),
            Expected::endpoints([(DNS_1, false), (DNS_2, false)]),
        ),
        case(
            "pod to UDP-only cluster IP over TCP passes",
            (Pod, CLIENT_POD),
            (Tcp, DNS_IP, 53),
            Expected::Pass,
        ),
        case(
            "pod to a multi-port service's http port reaches the http target port",
            (Pod, CLIENT_POD),
            (Tcp, API_IP, 80),
            Expected::endpoints([(at(API_1, 8080), false), (at(API_2, 8080), false)]),
        ),
        case(
            "pod to a multi-port service's metrics port reaches the metrics target port",
            (Pod, CLIENT_POD),
            (Tcp, API_IP, 9090),
            Expected::endpoints([(at(API_1, 9100), false), (at(API_2, 9100), false)]),
        ),
    ];

    Scenario {
        name: "node with web (NodePort), idle (no ready endpoints), kube-dns (UDP) and api (two named ports)",
        state: state([web, idle, dns, api]),
        node_ips: vec![NODE_IP],
        cases,
    }
}

fn node_without_services() -> Scenario {
    use Origin::{External, Pod};
    Scenario {
        name: "node without services",
        state: ProxyState::default(),
        node_ips: vec![NODE_IP],
        cases: vec![
            case(
                "pod to an unused cluster IP passes",
                (Pod, CLIENT_POD),
                (Protocol::Tcp, WEB_IP, 80),
                Expected::Pass,
            ),
            case(
                "external client to an unused node port passes",
                (External, EXTERNAL_CLIENT),
                (Protocol::Tcp, NODE_IP, WEB_NODE_PORT),
                Expected::Pass,
            ),
        ],
    }
}

fn case(
    name: &'static str,
    (origin, source): (Origin, IpAddr),
    (protocol, destination, port): (Protocol, IpAddr, u16),
    expected: Expected,
) -> FlowCase {
    FlowCase {
        flow: Flow {
            name,
            source,
            destination,
            protocol,
            port,
            origin,
        },
        expected,
        pending: None,
    }
}

fn state(services: impl IntoIterator<Item = Service>) -> ProxyState {
    ProxyState {
        services: services
            .into_iter()
            .map(|service| (service.key.clone(), service))
            .collect(),
    }
}

fn service(namespace: &str, name: &str, cluster_ip: IpAddr, ports: Vec<ServicePort>) -> Service {
    Service {
        key: ServiceKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        cluster_ips: vec![cluster_ip],
        ports,
        ..Default::default()
    }
}

fn port(
    name: &str,
    protocol: Protocol,
    port: u16,
    node_port: Option<u16>,
    endpoints: Vec<Endpoint>,
) -> ServicePort {
    ServicePort {
        name: name.to_owned(),
        protocol,
        port,
        node_port,
        endpoints,
    }
}

/// A ready endpoint on another node.
fn ready(address: SocketAddr) -> Endpoint {
    Endpoint {
        ip: address.ip(),
        port: address.port(),
        ready: true,
        serving: true,
        terminating: false,
        is_local: false,
    }
}

/// An endpoint on another node that is starting up: neither ready nor serving.
fn starting(address: SocketAddr) -> Endpoint {
    Endpoint {
        ready: false,
        serving: false,
        ..ready(address)
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
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
    fn expected_targets_are_ready_endpoints_of_the_scenario() {
        for scenario in scenarios() {
            let ready: BTreeSet<SocketAddr> = scenario
                .state
                .services
                .values()
                .flat_map(|service| &service.ports)
                .flat_map(|port| &port.endpoints)
                .filter(|endpoint| endpoint.ready)
                .map(|endpoint| SocketAddr::new(endpoint.ip, endpoint.port))
                .collect();
            for case in &scenario.cases {
                if let Expected::Endpoints { targets } = &case.expected {
                    for target in targets.keys() {
                        assert!(
                            ready.contains(target),
                            "{}: {target} is no ready endpoint",
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
