//! Per-node views and the deltas between two views of one node.

use crate::{
    cluster::{ClusterState, Key},
    eligibility,
    topology::Place,
};
use splitproxy_proto::v1alpha1 as pb;
use std::collections::BTreeMap;

/// What one node must program: the Services and, for those that have any, their endpoints; and
/// the node's own status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeView {
    /// Services by key.
    pub services: BTreeMap<Key, pb::Service>,
    /// Endpoints by Service key, with locality set for this node.
    pub endpoints: BTreeMap<Key, pb::ServiceEndpoints>,
    /// The node's status; set in every computed view, `None` only in the empty view a reset is
    /// computed from, so a reset always carries it.
    pub status: Option<pb::NodeStatus>,
}

impl NodeView {
    /// Computes `node`'s view of the cluster: locality, topology hints applied per Service port
    /// with the node's zone (see [`crate::topology`]), and the node's eligibility (see
    /// [`crate::eligibility`]).
    #[must_use]
    pub fn for_node(cluster: &ClusterState, node: &str) -> Self {
        let known = cluster.nodes.get(node);
        let place = Place::new(node, known.map(|n| &n.topology));
        let endpoints = cluster
            .endpoints
            .iter()
            .map(|(key, backends)| {
                let ports = backends
                    .ports
                    .iter()
                    .map(|port| {
                        let mode = place.mode(&port.endpoints);
                        pb::PortEndpoints {
                            port_name: port.port_name.clone(),
                            protocol: port.protocol as i32,
                            endpoints: port
                                .endpoints
                                .iter()
                                .map(|b| pb::Endpoint {
                                    is_local: !b.node_name.is_empty() && b.node_name == node,
                                    topology_excluded: place.excludes(mode, b),
                                    ..b.endpoint.clone()
                                })
                                .collect(),
                        }
                    })
                    .collect();
                let endpoints = pb::ServiceEndpoints {
                    key: Some(object_key(key)),
                    ports,
                    last_change_trigger_time: backends.last_change_trigger_time,
                };
                (key.clone(), endpoints)
            })
            .collect();
        Self {
            services: cluster.services.clone(),
            endpoints,
            status: Some(eligibility::status(known)),
        }
    }
}

/// The changes that turn one view into another.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    /// Services added or changed.
    pub upserted_services: Vec<pb::Service>,
    /// Services removed.
    pub removed_services: Vec<pb::ObjectKey>,
    /// Endpoint sets added or changed.
    pub upserted_endpoints: Vec<pb::ServiceEndpoints>,
    /// Endpoint sets removed while their Service stays.
    pub removed_endpoints: Vec<pb::ObjectKey>,
    /// The node's new status; `None` when it did not change.
    pub node_status: Option<pb::NodeStatus>,
}

impl Delta {
    /// The delta from `from` to `to`. A removed Service implies the removal of its endpoints, so
    /// those are not listed again. The node's status is listed only when it changed.
    #[must_use]
    pub fn between(from: &NodeView, to: &NodeView) -> Self {
        let (upserted_services, removed_services) = diff_maps(&from.services, &to.services);
        let (upserted_endpoints, removed) = diff_maps(&from.endpoints, &to.endpoints);
        let removed_endpoints = removed
            .into_iter()
            .filter(|key| {
                to.services
                    .contains_key(&(key.namespace.clone(), key.name.clone()))
            })
            .collect();
        Self {
            upserted_services,
            removed_services,
            upserted_endpoints,
            removed_endpoints,
            node_status: to.status.clone().filter(|_| from.status != to.status),
        }
    }

    /// Whether the delta changes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.upserted_services.is_empty()
            && self.removed_services.is_empty()
            && self.upserted_endpoints.is_empty()
            && self.removed_endpoints.is_empty()
            && self.node_status.is_none()
    }
}

fn diff_maps<V: Clone + PartialEq>(
    from: &BTreeMap<Key, V>,
    to: &BTreeMap<Key, V>,
) -> (Vec<V>, Vec<pb::ObjectKey>) {
    let upserted = to
        .iter()
        .filter(|(key, value)| from.get(*key) != Some(value))
        .map(|(_, value)| value.clone())
        .collect();
    let removed = from
        .keys()
        .filter(|key| !to.contains_key(*key))
        .map(object_key)
        .collect();
    (upserted, removed)
}

fn object_key((namespace, name): &Key) -> pb::ObjectKey {
    pb::ObjectKey {
        namespace: namespace.clone(),
        name: name.clone(),
    }
}

#[cfg(test)]
mod tests;
