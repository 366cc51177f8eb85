//! The two kinds of resource a node's view holds, as the cluster state keeps them: converted
//! Services and each Service's merged endpoints, by namespace and name.

use imbl::OrdMap;
use splitproxy_proto::{
    Key,
    topology::{self, Place},
    v1alpha1 as pb,
};
use std::sync::Arc;

/// The converted Services by key; an entry keeps its `Arc` while it does not change, and the
/// map shares its unchanged parts with the state before, so states and views share both.
pub type Services = OrdMap<Key, Arc<pb::Service>>;
/// The merged endpoints by Service key, shared the same way.
pub type Endpoints = OrdMap<Key, Arc<ServiceBackends>>;

/// The merged, deduplicated endpoints of one Service, before per-node locality is known.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceBackends {
    /// The endpoints in cluster form (protocol rule 15): one entry per (port name, protocol),
    /// sorted, each endpoint with its node and hints. What every agent that derives locality
    /// gets, and what the other forms are computed from.
    pub cluster: Arc<pb::ServiceEndpoints>,
    /// The endpoints as every node sees them that runs none of them and whose traffic no hint
    /// narrows, which is most nodes, for agents that take sets filtered for their node: one copy
    /// shared by all their views.
    pub plain: Arc<pb::ServiceEndpoints>,
    /// The endpoints as the nodes of a zone see them where zone hints narrow some port's
    /// traffic there, for the nodes no endpoint runs on and no node hint names: one copy per
    /// zone shared by all their views. Sorted by zone; only zones where some endpoint is left
    /// out, as elsewhere the plain form is the same.
    pub zoned: Vec<(String, Arc<pb::ServiceEndpoints>)>,
}

impl ServiceBackends {
    /// The endpoints of the Service `key`: `ports` in cluster form.
    #[must_use]
    pub fn new(
        key: &Key,
        ports: Vec<pb::PortEndpoints>,
        last_change_trigger_time: Option<prost_types::Timestamp>,
    ) -> Self {
        let cluster = pb::ServiceEndpoints {
            key: Some(pb::ObjectKey {
                namespace: key.0.clone(),
                name: key.1.clone(),
            }),
            ports,
            last_change_trigger_time,
            cluster_form: true,
        };
        let plain = Place::anywhere_in("").filtered(&cluster);
        let zoned = topology::narrowed_zones(&cluster.ports)
            .into_iter()
            .filter_map(|zone| {
                let endpoints = Place::anywhere_in(zone).filtered(&cluster);
                let narrowed = (endpoints.ports.iter().flat_map(|port| &port.endpoints))
                    .any(|endpoint| endpoint.topology_excluded);
                narrowed.then(|| (zone.to_owned(), Arc::new(endpoints)))
            })
            .collect();
        Self {
            cluster: Arc::new(cluster),
            plain: Arc::new(plain),
            zoned,
        }
    }

    /// The endpoints as a node at `place` sees them, for an agent that takes them filtered for
    /// its node: locality set, topology hints applied.
    #[must_use]
    pub fn seen_from(&self, place: &Place) -> pb::ServiceEndpoints {
        place.filtered(&self.cluster)
    }

    /// The endpoints as the nodes of `zone` see them that run none of them and that no node
    /// hint names.
    #[must_use]
    pub fn seen_in_zone(&self, zone: &str) -> &Arc<pb::ServiceEndpoints> {
        self.zoned
            .binary_search_by(|(z, _)| z.as_str().cmp(zone))
            .ok()
            .and_then(|at| self.zoned.get(at))
            .map_or(&self.plain, |(_, endpoints)| endpoints)
    }

    /// The Service's ports in cluster form.
    #[must_use]
    pub fn ports(&self) -> &[pb::PortEndpoints] {
        &self.cluster.ports
    }
}
