//! A Service's endpoints as the controller merges them from its EndpointSlices, before any node
//! looks at them: per port, each endpoint with the node it runs on and its topology hints.

use splitproxy_proto::v1alpha1 as pb;
use std::collections::BTreeSet;

/// The endpoints of one Service port.
#[derive(Debug, Clone, PartialEq)]
pub struct PortBackends {
    /// The Service port name.
    pub port_name: String,
    /// The protocol.
    pub protocol: pb::Protocol,
    /// Endpoints sorted by address then port, each with the node it runs on.
    pub endpoints: Vec<Backend>,
}

/// One endpoint, the node it runs on and its topology hints.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    /// The endpoint, with `is_local` and `topology_excluded` unset.
    pub endpoint: pb::Endpoint,
    /// The node the endpoint runs on; empty when the slice does not say.
    pub node_name: String,
    /// The slice's `hints` for the endpoint.
    pub hints: Hints,
}

/// An endpoint's topology hints, as the EndpointSlice controller set them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    /// `hints.forZones[].name`: the zones whose nodes should use the endpoint.
    pub for_zones: BTreeSet<String>,
    /// `hints.forNodes[].name`: the nodes that should use the endpoint.
    pub for_nodes: BTreeSet<String>,
}

impl Hints {
    /// The hints of an EndpointSlice endpoint.
    pub(crate) fn of(hints: Option<&k8s_openapi::api::discovery::v1::EndpointHints>) -> Self {
        let Some(hints) = hints else {
            return Self::default();
        };
        Self {
            for_zones: hints
                .for_zones
                .iter()
                .flatten()
                .map(|zone| zone.name.clone())
                .collect(),
            for_nodes: hints
                .for_nodes
                .iter()
                .flatten()
                .map(|node| node.name.clone())
                .collect(),
        }
    }
}
