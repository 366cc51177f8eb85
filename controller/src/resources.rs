//! The two kinds of resource a node's view holds, as the cluster state keeps them: converted
//! Services and each Service's merged endpoints, by namespace and name.

use crate::{
    backends::PortBackends,
    topology::{self, Place},
};
use imbl::OrdMap;
use splitproxy_proto::{Key, v1alpha1 as pb};
use std::sync::Arc;

/// The converted Services by key; an entry keeps its `Arc` while it does not change, and the
/// map shares its unchanged parts with the state before, so states and views share both.
pub type Services = OrdMap<Key, Arc<pb::Service>>;
/// The merged endpoints by Service key, shared the same way.
pub type Endpoints = OrdMap<Key, Arc<ServiceBackends>>;

/// The merged, deduplicated endpoints of one Service, before per-node locality is known.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceBackends {
    /// One entry per (port name, protocol), sorted.
    pub ports: Vec<PortBackends>,
    /// The newest last-change-trigger-time of the Service's slices.
    pub last_change_trigger_time: Option<prost_types::Timestamp>,
    /// The endpoints as every node sees them that runs none of them and whose traffic no hint
    /// narrows, which is most nodes: one copy shared by all their views.
    pub plain: Arc<pb::ServiceEndpoints>,
    /// The endpoints as the nodes of a zone see them where zone hints narrow some port's
    /// traffic there, for the nodes no endpoint runs on and no node hint names: one copy per
    /// zone shared by all their views. Sorted by zone; only zones where some endpoint is left
    /// out, as elsewhere the plain form is the same.
    pub zoned: Vec<(String, Arc<pb::ServiceEndpoints>)>,
}

impl ServiceBackends {
    /// The endpoints of the Service `key`.
    #[must_use]
    pub fn new(
        key: &Key,
        ports: Vec<PortBackends>,
        last_change_trigger_time: Option<prost_types::Timestamp>,
    ) -> Self {
        let plain = pb::ServiceEndpoints {
            key: Some(pb::ObjectKey {
                namespace: key.0.clone(),
                name: key.1.clone(),
            }),
            ports: ports
                .iter()
                .map(|port| pb::PortEndpoints {
                    port_name: port.port_name.clone(),
                    protocol: port.protocol as i32,
                    endpoints: port.endpoints.iter().map(|b| b.endpoint.clone()).collect(),
                })
                .collect(),
            last_change_trigger_time,
        };
        let mut backends = Self {
            ports,
            last_change_trigger_time,
            plain: Arc::new(plain),
            zoned: Vec::new(),
        };
        backends.zoned = topology::narrowed_zones(&backends.ports)
            .into_iter()
            .filter_map(|zone| {
                let endpoints = backends.seen_from(&Place::anywhere_in(zone));
                let narrowed = (endpoints.ports.iter().flat_map(|port| &port.endpoints))
                    .any(|endpoint| endpoint.topology_excluded);
                narrowed.then(|| (zone.to_owned(), Arc::new(endpoints)))
            })
            .collect();
        backends
    }

    /// The endpoints as a node at `place` sees them: locality set, topology hints applied.
    #[must_use]
    pub fn seen_from(&self, place: &Place) -> pb::ServiceEndpoints {
        pb::ServiceEndpoints {
            key: self.plain.key.clone(),
            ports: place.ports(&self.ports),
            last_change_trigger_time: self.last_change_trigger_time,
        }
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
}
