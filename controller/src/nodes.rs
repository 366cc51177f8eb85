//! What the controller keeps of each Node, and the status each node's agent is sent from it.

use crate::{eligibility::Ineligible, topology::NodeTopology};
use imbl::OrdMap;
use k8s_openapi::api::core::v1::Node;
use splitproxy_proto::v1alpha1 as pb;
use std::net::IpAddr;

/// What the views need of each known Node, by name.
pub type Nodes = OrdMap<String, NodeInfo>;

/// What the views need of one Node: where it is, and whether it may take new connections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// What topology hints are matched against.
    pub topology: NodeTopology,
    /// Why the node is not eligible for new connections; `None` while it is.
    pub ineligible: Option<Ineligible>,
    /// `spec.podCIDRs` (or the older `spec.podCIDR`), as written.
    pub pod_cidrs: Vec<String>,
    /// The node's IPs as kube-proxy picks them (see [`node_ips`]).
    pub node_ips: Vec<String>,
}

impl NodeInfo {
    /// What the views need of `node`.
    #[must_use]
    pub fn of(node: &Node) -> Self {
        Self {
            topology: NodeTopology::of(node),
            ineligible: Ineligible::of(node),
            pod_cidrs: node
                .spec
                .as_ref()
                .map(|spec| match (&spec.pod_cidrs, &spec.pod_cidr) {
                    (Some(cidrs), _) if !cidrs.is_empty() => cidrs.clone(),
                    (_, Some(cidr)) if !cidr.is_empty() => vec![cidr.clone()],
                    _ => Vec::new(),
                })
                .unwrap_or_default(),
            node_ips: node_ips(node).iter().map(ToString::to_string).collect(),
        }
    }
}

/// The Node's IPs as kube-proxy takes them from `status.addresses`: the first InternalIP, else
/// the first ExternalIP, then the first address of the other family (InternalIPs first again).
fn node_ips(node: &Node) -> Vec<IpAddr> {
    let addresses = node
        .status
        .as_ref()
        .and_then(|status| status.addresses.as_deref())
        .unwrap_or_default();
    let of_type = |kind: &'static str| {
        addresses
            .iter()
            .filter(move |address| address.type_ == kind)
            .filter_map(|address| address.address.parse::<IpAddr>().ok())
    };
    let mut ips = of_type("InternalIP").chain(of_type("ExternalIP"));
    let Some(first) = ips.next() else {
        return Vec::new();
    };
    let other = ips.find(|ip| ip.is_ipv4() != first.is_ipv4());
    std::iter::once(first).chain(other).collect()
}

/// The status sent to the agent of a node the cluster knows as `known` (`None`: not at all): its
/// eligibility and, passed along, its pod CIDRs, IPs and zone and the cluster's `service_cidrs`.
#[must_use]
pub fn status(known: Option<&NodeInfo>, service_cidrs: &[String]) -> pb::NodeStatus {
    let ineligible = match known {
        None => Some(Ineligible::UnknownNode),
        Some(node) => node.ineligible,
    };
    pb::NodeStatus {
        eligible: ineligible.is_none(),
        reason: ineligible.map(|i| i.to_string()).unwrap_or_default(),
        pod_cidrs: known.map(|node| node.pod_cidrs.clone()).unwrap_or_default(),
        service_cidrs: service_cidrs.to_vec(),
        node_ips: known.map(|node| node.node_ips.clone()).unwrap_or_default(),
        zone: known
            .map(|node| node.topology.zone.clone())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
