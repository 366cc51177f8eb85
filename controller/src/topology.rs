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

use crate::cluster::{Backend, NodeTopology};

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

    /// Whether `backend`'s hints for `mode` name this place.
    fn wants(&self, backend: &Backend, mode: Mode) -> bool {
        match mode {
            Mode::PreferSameNode => backend.hints.for_nodes.contains(self.node),
            Mode::PreferSameZone => backend.hints.for_zones.contains(self.zone),
        }
    }
}

/// Whether the hints of `endpoints` (one Service port's) may narrow some node's traffic: whether
/// [`Place::mode`] can be `Some` for any place.
#[must_use]
pub fn may_narrow(endpoints: &[Backend]) -> bool {
    let ready: Vec<&Backend> = endpoints.iter().filter(|b| is_ready(b)).collect();
    hinted_modes(&ready).next().is_some()
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
