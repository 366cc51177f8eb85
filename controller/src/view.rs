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
        Self::assemble(
            diff(&from.services, &to.services, PartialEq::eq),
            diff(&from.endpoints, &to.endpoints, PartialEq::eq),
            to,
            to.status.clone().filter(|_| from.status != to.status),
        )
    }

    /// A delta to `to` from upserts and removals per kind. A removed Service implies the removal
    /// of its endpoints, so those are not listed again.
    fn assemble(
        (upserted_services, removed_services): Diff<pb::Service>,
        (upserted_endpoints, removed): Diff<pb::ServiceEndpoints>,
        to: &NodeView,
        node_status: Option<pb::NodeStatus>,
    ) -> Self {
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
            node_status,
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

/// What an agent said it holds when subscribing: a digest per Service and endpoint set
/// (protocol rule 7), so any replica can send it a delta instead of a reset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeldDigests {
    services: BTreeMap<Key, u64>,
    endpoints: BTreeMap<Key, u64>,
}

impl HeldDigests {
    /// The digests of a subscribe; `None` when it lists none (the agent holds nothing). Entries
    /// without a key or kind are ignored: the delta then upserts those resources.
    #[must_use]
    pub fn from_subscribe(held: &[pb::ResourceDigest]) -> Option<Self> {
        let mut digests = Self::default();
        for entry in held {
            let Some(key) = &entry.key else { continue };
            let key = (key.namespace.clone(), key.name.clone());
            let map = match pb::ResourceKind::try_from(entry.kind) {
                Ok(pb::ResourceKind::Service) => &mut digests.services,
                Ok(pb::ResourceKind::Endpoints) => &mut digests.endpoints,
                _ => continue,
            };
            map.insert(key, entry.sha256_prefix);
        }
        (!held.is_empty()).then_some(digests)
    }
}

impl Delta {
    /// The delta from what an agent holds, known only by digests, to `to`. It always carries the
    /// node's status (rule 9), as the agent's status is not among the digests.
    #[must_use]
    pub fn from_digests(held: &HeldDigests, to: &NodeView) -> Self {
        Self::assemble(
            diff(&held.services, &to.services, matches_digest),
            diff(&held.endpoints, &to.endpoints, matches_digest),
            to,
            to.status.clone(),
        )
    }
}

/// Whether `resource` has the digest an agent presented.
fn matches_digest(digest: &u64, resource: &impl prost::Message) -> bool {
    *digest == splitproxy_proto::digest(resource)
}

/// The resources to upsert and the keys to remove, for one kind.
type Diff<V> = (Vec<V>, Vec<pb::ObjectKey>);

/// What turns `from` into `to`, where `same` says whether what `from` holds for a key (the
/// resource itself, or its digest) matches `to`'s resource.
fn diff<H, V: Clone>(
    from: &BTreeMap<Key, H>,
    to: &BTreeMap<Key, V>,
    same: impl Fn(&H, &V) -> bool,
) -> Diff<V> {
    let upserted = to
        .iter()
        .filter(|(key, value)| !from.get(*key).is_some_and(|held| same(held, value)))
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
