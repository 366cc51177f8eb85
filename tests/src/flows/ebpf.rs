//! The eBPF mode against the packet-flow table (written after kube-proxy's iptables mode): the
//! rows it does not serve yet, which the runner skips with the reason, and where it differs
//! from the table by design, each difference with its reason.
//!
//! The mode balances connections from the node (pods and host processes) in the socket layer:
//! the socket is connected to the endpoint itself, so nothing is translated on the way and
//! nothing is masqueraded. Connections from outside go through its packet programs, which
//! translate and mark them for masquerading as kube-proxy does.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use splitproxy_dataplane::{
    Protocol, Service, ServicePort, TrafficPolicy,
    endpoints::categorize,
    testing::flow_table::{Expected, Flow, FlowCase, Origin, Scenario},
};

/// What a flow's destination is to the Services of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Destination {
    /// A Service's cluster IP and port.
    ClusterIp,
    /// A node port on an address that takes node ports.
    NodePort,
    /// A Service's external IP and port.
    ExternalIp,
    /// A Service's load-balancer IP and port; `ranged`: the Service has source ranges.
    LoadBalancer { ranged: bool },
}

/// What `flow`'s destination is in `scenario`, with the Service port it names; `None` for
/// nothing a Service defines.
fn destination<'a>(
    scenario: &'a Scenario,
    flow: &Flow,
) -> Option<(Destination, &'a Service, &'a ServicePort)> {
    let node_port_addresses = scenario
        .node_port_addresses
        .as_ref()
        .unwrap_or(&scenario.node_ips);
    let same_family = |ip: &IpAddr| ip.is_ipv4() == flow.destination.is_ipv4();
    for service in scenario.state.services.values() {
        for port in service
            .ports
            .iter()
            .filter(|port| port.protocol == flow.protocol)
        {
            let on_port = port.port == flow.port;
            let kind = if on_port && service.cluster_ips.contains(&flow.destination) {
                Destination::ClusterIp
            } else if port.node_port == Some(flow.port)
                && node_port_addresses.contains(&flow.destination)
                && service.cluster_ips.iter().any(same_family)
            {
                Destination::NodePort
            } else if on_port && service.external_ips.contains(&flow.destination) {
                Destination::ExternalIp
            } else if on_port && service.load_balancer_ips.contains(&flow.destination) {
                Destination::LoadBalancer {
                    ranged: !service.load_balancer_source_ranges.is_empty(),
                }
            } else {
                continue;
            };
            return Some((kind, service, port));
        }
    }
    None
}

/// Why the eBPF mode does not serve `case` yet, if it does not (`docs/features.md` lists the
/// same gaps): the runner skips the row.
#[must_use]
pub fn unsupported(scenario: &Scenario, case: &FlowCase) -> Option<&'static str> {
    let flow = &case.flow;
    if flow.protocol == Protocol::Sctp {
        return Some("the ebpf mode balances TCP and UDP; SCTP Services are not served yet");
    }
    match (flow.origin, destination(scenario, flow)?.0) {
        (Origin::External, Destination::ClusterIp) => {
            Some("the packet programs do not balance cluster IPs reached from outside the node yet")
        }
        (_, Destination::LoadBalancer { ranged: true }) => Some(
            "load-balancer source ranges are not enforced yet: such a load-balancer IP gets no \
             entries",
        ),
        _ => None,
    }
}

/// What the eBPF mode does with `case`, where it differs from the table's expectation, and
/// why; the table's expectation otherwise.
#[must_use]
pub fn expected(scenario: &Scenario, case: &FlowCase) -> (Expected, Option<&'static str>) {
    let flow = &case.flow;
    if flow.origin == Origin::External {
        return (case.expected.clone(), None);
    }
    let target = destination(scenario, flow);
    match (&case.expected, target) {
        (Expected::Drop, Some((Destination::ClusterIp, _, _))) => (
            Expected::Forbidden,
            Some(
                "a socket program cannot leave connect() waiting: a cluster IP whose endpoints \
                 are all elsewhere under internalTrafficPolicy Local fails at once with EPERM, \
                 where kube-proxy drops its packets",
            ),
        ),
        (Expected::Endpoints { targets }, Some((kind, service, port)))
            if flow.origin == Origin::Pod
                && kind != Destination::ClusterIp
                && service.external_traffic_policy == TrafficPolicy::Local =>
        {
            let every = every_endpoint(port, flow.destination);
            let differs = !targets.keys().eq(every.keys());
            (
                Expected::Endpoints { targets: every },
                differs.then_some(
                    "the socket programs know a pod's connection starts on this node without a \
                     cluster CIDR: it reaches every endpoint of an externalTrafficPolicy Local \
                     Service's external address unmasqueraded, as kube-proxy does once it can \
                     tell pods by their CIDR",
                ),
            )
        }
        (Expected::Endpoints { targets }, _)
            if targets.values().any(|masqueraded| *masqueraded) =>
        {
            (
                Expected::endpoints(targets.keys().map(|target| (*target, false))),
                Some(
                    "the socket programs connect a socket from the node to the endpoint itself: no \
                 packet is translated, so none is masqueraded, and the endpoint sees the \
                 client's own address (a pod reaching itself included, which needs no hairpin)",
                ),
            )
        }
        (expected, _) => (expected.clone(), None),
    }
}

/// The endpoints of `port` in `destination`'s family that the cluster-wide policy spreads over,
/// unmasqueraded.
fn every_endpoint(port: &ServicePort, destination: IpAddr) -> BTreeMap<SocketAddr, bool> {
    let family = port
        .endpoints
        .iter()
        .filter(|endpoint| endpoint.ip.is_ipv4() == destination.is_ipv4());
    categorize(family)
        .cluster
        .iter()
        .map(|endpoint| (SocketAddr::new(endpoint.ip, endpoint.port), false))
        .collect()
}
