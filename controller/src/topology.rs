//! Topology-aware routing: which endpoints a node's cluster-wide traffic uses, from the hints the
//! EndpointSlice controller writes.
//!
//! kube-proxy never reads `spec.trafficDistribution`; the EndpointSlice controller turns it into
//! per-endpoint hints (`forZones` for `PreferSameZone`/`PreferClose`/topology-mode `Auto`, and
//! `forNodes` as well for `PreferSameNode`), and each node decides from those hints alone, per
//! Service port (upstream `pkg/proxy/topology.go`):
//!
//! * **same node** when every ready endpoint has node hints and one of them names this node;
//! * else **same zone** when every ready endpoint has zone hints and one of them names this
//!   node's `topology.kubernetes.io/zone`;
//! * else the hints are ignored.
//!
//! The rule is all-or-nothing on purpose: one ready endpoint without a hint, or no endpoint meant
//! for this node or zone, and the node spreads over every ready endpoint rather than risk sending
//! nothing anywhere. Endpoints that are not ready neither vote nor are filtered here; the
//! terminating fallback only ever applies when no endpoint is ready, and then no mode applies.

use crate::backends::{Backend, PortBackends};
use k8s_openapi::api::core::v1::Node;
use splitproxy_proto::v1alpha1 as pb;
use std::collections::BTreeSet;

/// Node label naming the node's zone, which zone hints are matched against.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// What of a Node topology hints are matched against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeTopology {
    /// The node's `topology.kubernetes.io/zone` label; empty when it has none.
    pub zone: String,
}

impl NodeTopology {
    /// The topology of `node`, from its labels.
    #[must_use]
    pub fn of(node: &Node) -> Self {
        let zone = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL));
        Self {
            zone: zone.cloned().unwrap_or_default(),
        }
    }
}

/// How a node narrows a Service port's cluster-wide endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only the endpoints whose node hints name this node.
    PreferSameNode,
    /// Only the endpoints whose zone hints name this node's zone.
    PreferSameZone,
}

/// Where a node is: its name and its topology.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The node's name.
    pub node: &'a str,
    /// The node's zone; empty when the node has no zone label (or is not a known Node).
    pub zone: &'a str,
}

impl<'a> Place<'a> {
    /// The place of `node`, whose topology is `topology` when it is a known Node.
    #[must_use]
    pub fn new(node: &'a str, topology: Option<&'a NodeTopology>) -> Self {
        Self {
            node,
            zone: topology.map_or("", |t| t.zone.as_str()),
        }
    }

    /// The mode the hints of `endpoints` (one Service port's) select for this place; `None` when
    /// the hints are ignored.
    #[must_use]
    pub fn mode(&self, endpoints: &[Backend]) -> Option<Mode> {
        let ready: Vec<&Backend> = endpoints.iter().filter(|b| is_ready(b)).collect();
        hinted_modes(&ready).find(|&mode| ready.iter().any(|b| self.wants(b, mode)))
    }

    /// Whether `mode` leaves `backend` out of this place's cluster-wide traffic: it is ready (so
    /// it would otherwise be used) and its hints name some other node or zone.
    #[must_use]
    pub fn excludes(&self, mode: Option<Mode>, backend: &Backend) -> bool {
        mode.is_some_and(|mode| is_ready(backend) && !self.wants(backend, mode))
    }

    /// The place of the nodes of `zone` that no endpoint runs on and no node hint names: all of
    /// them see a Service's endpoints alike.
    #[must_use]
    pub fn anywhere_in(zone: &'a str) -> Self {
        Self { node: "", zone }
    }

    /// Whether this place's node sees `ports` in a form of its own rather than its zone's: an
    /// endpoint runs on it, or a node hint names it.
    #[must_use]
    pub fn is_singled_out(&self, ports: &[PortBackends]) -> bool {
        !self.node.is_empty()
            && ports
                .iter()
                .flat_map(|port| &port.endpoints)
                .any(|b| b.node_name == self.node || b.hints.for_nodes.contains(self.node))
    }

    /// `ports` as this place sees them: locality set, and each port narrowed by the mode its
    /// hints select here.
    #[must_use]
    pub fn ports(&self, ports: &[PortBackends]) -> Vec<pb::PortEndpoints> {
        ports
            .iter()
            .map(|port| {
                let mode = self.mode(&port.endpoints);
                pb::PortEndpoints {
                    port_name: port.port_name.clone(),
                    protocol: port.protocol as i32,
                    endpoints: port
                        .endpoints
                        .iter()
                        .map(|b| pb::Endpoint {
                            is_local: !self.node.is_empty() && b.node_name == self.node,
                            topology_excluded: self.excludes(mode, b),
                            ..b.endpoint.clone()
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Whether `backend`'s hints for `mode` name this place.
    fn wants(&self, backend: &Backend, mode: Mode) -> bool {
        match mode {
            Mode::PreferSameNode => backend.hints.for_nodes.contains(self.node),
            Mode::PreferSameZone => backend.hints.for_zones.contains(self.zone),
        }
    }
}

/// The zones whose nodes' traffic the zone hints of `ports` narrow for some port: those a zone
/// hint of a ready endpoint names, on ports whose ready endpoints all carry zone hints. Sorted,
/// each once.
#[must_use]
pub fn narrowed_zones(ports: &[PortBackends]) -> BTreeSet<&str> {
    let mut zones = BTreeSet::new();
    for port in ports {
        let ready: Vec<&Backend> = port.endpoints.iter().filter(|b| is_ready(b)).collect();
        if hinted_modes(&ready).any(|mode| mode == Mode::PreferSameZone) {
            let named = ready.iter().flat_map(|b| &b.hints.for_zones);
            zones.extend(named.map(String::as_str));
        }
    }
    zones
}

/// The modes whose hints every one of `ready` carries; none when `ready` is empty.
fn hinted_modes<'a>(ready: &'a [&Backend]) -> impl Iterator<Item = Mode> + 'a {
    [Mode::PreferSameNode, Mode::PreferSameZone]
        .into_iter()
        .filter(move |&mode| !ready.is_empty() && ready.iter().all(|b| has_hints(b, mode)))
}

fn has_hints(backend: &Backend, mode: Mode) -> bool {
    match mode {
        Mode::PreferSameNode => !backend.hints.for_nodes.is_empty(),
        Mode::PreferSameZone => !backend.hints.for_zones.is_empty(),
    }
}

fn is_ready(backend: &Backend) -> bool {
    backend
        .endpoint
        .conditions
        .as_ref()
        .is_some_and(|c| c.ready)
}

#[cfg(test)]
mod tests;
