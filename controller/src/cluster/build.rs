//! Building cluster states from a source's snapshots, converting only what changed.
//!
//! A source updates its maps object by object, so consecutive snapshots share every part that
//! did not change. The builder keeps the snapshot it last built from and walks only the
//! differences (`OrdMap::diff` skips the shared parts): it converts the Services and Nodes that
//! changed and merges again the slices of the Services whose slices changed, then patches its
//! output maps, which so share their unchanged parts with the state before. A change the views
//! do not see (an annotation, a status field) converts to an equal value and keeps the old
//! entry, and a map with no change keeps its `Arc`, so the views downstream see no change at
//! all.

use super::{
    ClusterState, Endpoints, NodeInfo, Nodes, Objects, SERVICE_NAME_LABEL, ServiceBackends,
    ServiceSelector, Services, convert_service, merge_slices,
};
use imbl::ordmap::DiffItem;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use splitproxy_proto::Key;
use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

/// The state of the last build, patched by the next.
#[derive(Debug, Default)]
pub struct Builder {
    /// The snapshot the last state was built from.
    objects: Objects,
    /// The selector it was built with; a build with another starts over.
    selector: ServiceSelector,
    services: Arc<Services>,
    invalid_services: BTreeSet<Key>,
    /// Every Service's merged endpoints, programmed or not, by the Service's key.
    merged: HashMap<Key, Arc<ServiceBackends>>,
    /// The merged endpoints of the programmed Services.
    endpoints: Arc<Endpoints>,
    /// The keys of each Service's slices, by the Service's key.
    slices_of: HashMap<Key, BTreeSet<Key>>,
    nodes: Arc<Nodes>,
    service_cidrs: Arc<Vec<String>>,
}

impl Builder {
    /// The state of `objects`, filtered and converted as kube-proxy does: invalid Services are
    /// skipped (and logged each time they change), and so are Services `selector` does not
    /// claim. The state's history is empty; see [`ClusterState::followed_by`].
    pub fn build(&mut self, objects: &Objects, selector: &ServiceSelector) -> ClusterState {
        if self.selector != *selector {
            *self = Self {
                selector: selector.clone(),
                ..Self::default()
            };
        }
        let before = std::mem::replace(&mut self.objects, objects.clone());
        for change in before.services.diff(&objects.services) {
            let (key, service) = after_change(change);
            self.convert(key, service);
        }
        let mut remerge = BTreeSet::new();
        for change in before.slices.diff(&objects.slices) {
            remerge.extend(self.index_slice(change));
        }
        for service in remerge {
            self.merge(&service);
        }
        for change in before.nodes.diff(&objects.nodes) {
            let (name, node) = after_change(change);
            let info = node.map(|node| NodeInfo::of(node));
            if self.nodes.get(name) != info.as_ref() {
                let nodes = Arc::make_mut(&mut self.nodes);
                match info {
                    Some(info) => nodes.insert(name.clone(), info),
                    None => nodes.remove(name),
                };
            }
        }
        if !before.service_cidrs.ptr_eq(&objects.service_cidrs) {
            let cidrs = service_cidrs(objects);
            if *self.service_cidrs != cidrs {
                self.service_cidrs = Arc::new(cidrs);
            }
        }
        ClusterState {
            services: Arc::clone(&self.services),
            endpoints: Arc::clone(&self.endpoints),
            nodes: Arc::clone(&self.nodes),
            service_cidrs: Arc::clone(&self.service_cidrs),
            invalid_services: self.invalid_services.clone(),
            ..ClusterState::default()
        }
    }

    /// Converts the Service `key`, new or changed (`None`: gone), into the Services.
    fn convert(&mut self, key: &Key, svc: Option<&Arc<Service>>) {
        let claimed = svc.filter(|svc| self.selector.claims(svc.metadata.labels.as_ref()));
        let service = match claimed.map(|svc| convert_service(svc)).transpose() {
            Ok(service) => {
                self.invalid_services.remove(key);
                service.flatten()
            }
            Err(err) => {
                // Quoted (`?`): a hostile name must not break the log line.
                tracing::warn!(service = ?format!("{}/{}", key.0, key.1), %err, "skipping invalid service");
                self.invalid_services.insert(key.clone());
                None
            }
        };
        match service {
            Some(service) if self.services.get(key).is_some_and(|s| **s == service) => {}
            Some(service) => {
                Arc::make_mut(&mut self.services).insert(key.clone(), Arc::new(service));
            }
            None if self.services.contains_key(key) => {
                Arc::make_mut(&mut self.services).remove(key);
            }
            None => {}
        }
        self.place_endpoints(key);
    }

    /// Records a change of one slice in the index of each Service's slices; returns the
    /// Services whose slices changed (the one it belonged to, the one it belongs to).
    fn index_slice(&mut self, change: DiffItem<'_, '_, Key, Arc<EndpointSlice>>) -> Vec<Key> {
        let (key, before, after) = match change {
            DiffItem::Add(key, slice) => (key, None, Some(slice)),
            DiffItem::Update {
                old: (key, before),
                new: (_, after),
            } => (key, Some(before), Some(after)),
            DiffItem::Remove(key, slice) => (key, Some(slice), None),
        };
        let owner = |slice: &EndpointSlice| {
            let labels = slice.metadata.labels.as_ref();
            let service = labels.and_then(|labels| labels.get(SERVICE_NAME_LABEL))?;
            Some((key.0.clone(), service.clone()))
        };
        let (before, after) = (before.and_then(|s| owner(s)), after.and_then(|s| owner(s)));
        if let Some(service) = &before
            && let Some(slices) = self.slices_of.get_mut(service)
        {
            slices.remove(key);
            if slices.is_empty() {
                self.slices_of.remove(service);
            }
        }
        if let Some(service) = &after {
            (self.slices_of.entry(service.clone()).or_default()).insert(key.clone());
        }
        before.into_iter().chain(after).collect()
    }

    /// Merges the slices of the Service `key` again; an equal result keeps the entry before.
    fn merge(&mut self, key: &Key) {
        let slices = self.slices_of.get(key).into_iter().flatten();
        let slices = slices.filter_map(|slice| self.objects.slices.get(slice));
        let merged = merge_slices(slices.map(|slice| &**slice)).remove(key);
        match merged {
            Some(merged) if self.merged.get(key).is_some_and(|m| **m == merged) => {}
            Some(merged) => {
                self.merged.insert(key.clone(), Arc::new(merged));
            }
            None => {
                self.merged.remove(key);
            }
        }
        self.place_endpoints(key);
    }

    /// Lists the Service `key`'s merged endpoints among the endpoints when it is programmed and
    /// has any, and takes them out otherwise.
    fn place_endpoints(&mut self, key: &Key) {
        let merged = (self.merged.get(key)).filter(|_| self.services.contains_key(key));
        match (merged, self.endpoints.get(key)) {
            (Some(merged), Some(listed)) if Arc::ptr_eq(merged, listed) => {}
            (Some(merged), _) => {
                Arc::make_mut(&mut self.endpoints).insert(key.clone(), Arc::clone(merged));
            }
            (None, Some(_)) => {
                Arc::make_mut(&mut self.endpoints).remove(key);
            }
            (None, None) => {}
        }
    }
}

/// The key a change is of, and the value after it (`None`: removed).
fn after_change<'a, K, V>(change: DiffItem<'a, 'a, K, V>) -> (&'a K, Option<&'a V>) {
    match change {
        DiffItem::Add(key, value)
        | DiffItem::Update {
            new: (key, value), ..
        } => (key, Some(value)),
        DiffItem::Remove(key, _) => (key, None),
    }
}

/// Every ServiceCIDR's CIDRs, sorted, without repeats: kube-proxy takes their union.
fn service_cidrs(objects: &Objects) -> Vec<String> {
    let cidrs: BTreeSet<&String> = objects
        .service_cidrs
        .values()
        .filter_map(|object| object.spec.as_ref()?.cidrs.as_ref())
        .flatten()
        .collect();
    cidrs.into_iter().cloned().collect()
}
