//! What of a Node topology-aware routing matches hints against. The rule itself is
//! [`splitproxy_proto::topology`]'s, which agents that derive locality apply too.

use k8s_openapi::api::core::v1::Node;
use splitproxy_proto::topology::Place;

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

/// Where `node` is, whose topology is `topology` when it is a known Node.
#[must_use]
pub fn place<'a>(node: &'a str, topology: Option<&'a NodeTopology>) -> Place<'a> {
    Place {
        node,
        zone: topology.map_or("", |t| t.zone.as_str()),
    }
}
