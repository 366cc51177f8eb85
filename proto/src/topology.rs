//! Locality and topology-aware routing: which endpoints run on a node, and which a node's
//! cluster-wide traffic uses, from the hints the EndpointSlice controller writes. The controller
//! applies it for agents that take endpoints filtered for their node, agents that take them in
//! cluster form apply it themselves (protocol rule 15); both through this one module, so the two
//! cannot drift apart.
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

use crate::v1alpha1::{Endpoint, PortEndpoints, ServiceEndpoints};
use std::collections::BTreeSet;

/// How a node narrows a Service port's cluster-wide endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only the endpoints whose node hints name this node.
    PreferSameNode,
    /// Only the endpoints whose zone hints name this node's zone.
    PreferSameZone,
}

/// Where a node is: its name and its zone.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The node's name; empty for a place standing for every node of a zone that no endpoint
    /// runs on and no node hint names.
    pub node: &'a str,
    /// The node's zone; empty when the node has no zone label (or is not a known Node).
    pub zone: &'a str,
}

impl<'a> Place<'a> {
    /// The place of the nodes of `zone` that no endpoint runs on and no node hint names: all of
    /// them see a Service's endpoints alike.
    #[must_use]
    pub fn anywhere_in(zone: &'a str) -> Self {
        Self { node: "", zone }
    }

    /// The mode the hints of `endpoints` (one Service port's, in cluster form) select for this
    /// place; `None` when the hints are ignored.
    #[must_use]
    pub fn mode(&self, endpoints: &[Endpoint]) -> Option<Mode> {
        let ready: Vec<&Endpoint> = endpoints.iter().filter(|e| is_ready(e)).collect();
        hinted_modes(&ready).find(|&mode| ready.iter().any(|e| self.wants(e, mode)))
    }

    /// Whether `endpoint` (in cluster form) runs on this place's node.
    #[must_use]
    pub fn runs(&self, endpoint: &Endpoint) -> bool {
        !self.node.is_empty() && endpoint.node_name == self.node
    }

    /// Whether this place's node sees `ports` (in cluster form) in a form of its own rather than
    /// its zone's: an endpoint runs on it, or a node hint names it.
    #[must_use]
    pub fn is_singled_out(&self, ports: &[PortEndpoints]) -> bool {
        !self.node.is_empty()
            && (ports.iter().flat_map(|port| &port.endpoints))
                .any(|e| self.runs(e) || e.for_nodes.iter().any(|node| node == self.node))
    }

    /// Sets `is_local` and `topology_excluded` of every endpoint of `set` (in cluster form) as
    /// this place sees them, each port narrowed by the mode its hints select here.
    pub fn localize(&self, set: &mut ServiceEndpoints) {
        for port in &mut set.ports {
            let mode = self.mode(&port.endpoints);
            for endpoint in &mut port.endpoints {
                endpoint.is_local = self.runs(endpoint);
                endpoint.topology_excluded =
                    mode.is_some_and(|mode| is_ready(endpoint) && !self.wants(endpoint, mode));
            }
        }
    }

    /// `set` (in cluster form) as an agent that does not derive locality takes it: localized for
    /// this place, without the nodes and hints the cluster form carries.
    #[must_use]
    pub fn filtered(&self, set: &ServiceEndpoints) -> ServiceEndpoints {
        let mut filtered = set.clone();
        self.localize(&mut filtered);
        filtered.cluster_form = false;
        for endpoint in filtered.ports.iter_mut().flat_map(|p| &mut p.endpoints) {
            endpoint.node_name.clear();
            endpoint.for_zones.clear();
            endpoint.for_nodes.clear();
        }
        filtered
    }

    /// Whether `endpoint`'s hints for `mode` name this place.
    fn wants(&self, endpoint: &Endpoint, mode: Mode) -> bool {
        let (hints, name) = match mode {
            Mode::PreferSameNode => (&endpoint.for_nodes, self.node),
            Mode::PreferSameZone => (&endpoint.for_zones, self.zone),
        };
        hints.iter().any(|hint| hint == name)
    }
}

/// The zones whose nodes' traffic the zone hints of `ports` (in cluster form) narrow for some
/// port: those a zone hint of a ready endpoint names, on ports whose ready endpoints all carry
/// zone hints. Sorted, each once.
#[must_use]
pub fn narrowed_zones(ports: &[PortEndpoints]) -> BTreeSet<&str> {
    let mut zones = BTreeSet::new();
    for port in ports {
        let ready: Vec<&Endpoint> = port.endpoints.iter().filter(|e| is_ready(e)).collect();
        if hinted_modes(&ready).any(|mode| mode == Mode::PreferSameZone) {
            let named = ready.iter().flat_map(|e| &e.for_zones);
            zones.extend(named.map(String::as_str));
        }
    }
    zones
}

/// The modes whose hints every one of `ready` carries; none when `ready` is empty.
fn hinted_modes<'a>(ready: &'a [&Endpoint]) -> impl Iterator<Item = Mode> + 'a {
    [Mode::PreferSameNode, Mode::PreferSameZone]
        .into_iter()
        .filter(move |&mode| !ready.is_empty() && ready.iter().all(|e| has_hints(e, mode)))
}

fn has_hints(endpoint: &Endpoint, mode: Mode) -> bool {
    match mode {
        Mode::PreferSameNode => !endpoint.for_nodes.is_empty(),
        Mode::PreferSameZone => !endpoint.for_zones.is_empty(),
    }
}

fn is_ready(endpoint: &Endpoint) -> bool {
    endpoint.conditions.as_ref().is_some_and(|c| c.ready)
}

#[cfg(test)]
mod tests;
