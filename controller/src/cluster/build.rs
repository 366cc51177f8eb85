//! Building cluster states from a source's snapshots, converting only what changed.
//!
//! A source hands over a whole snapshot on every change, but keeps the same `Arc` for every
//! object that did not change; the builder remembers what each object (and each Service's set
//! of slices) converted to, and reuses that. An object that changed in a way the views do not
//! see (an annotation, a status field) converts to an equal value, and keeps its old `Arc` too,
//! so the views downstream see no change at all.

use super::{
    ClusterState, Invalid, Key, NodeInfo, Objects, SERVICE_NAME_LABEL, ServiceBackends,
    ServiceSelector, convert_service, merge_slices,
};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use splitproxy_proto::v1alpha1 as pb;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

/// What a Service converted to: `Ok(None)` when kube-proxy does not program it.
type Converted = Result<Option<Arc<pb::Service>>, Invalid>;

/// What a Service's slices merged to: `None` when no endpoint in them is usable.
type Merged = Option<Arc<ServiceBackends>>;

/// Remembers the conversions of the previous build.
#[derive(Debug, Default)]
pub struct Builder {
    services: HashMap<Key, (Arc<Service>, Converted)>,
    slices: HashMap<Key, (Vec<Arc<EndpointSlice>>, Merged)>,
    /// The Node objects of the previous build and what they converted to: kept whole while
    /// no Node changes, which is most builds.
    nodes: (Vec<Arc<Node>>, Arc<BTreeMap<String, NodeInfo>>),
}

impl Builder {
    /// The state of `objects`, filtered and converted as kube-proxy does: invalid Services are
    /// skipped (and logged when they are first seen), and so are Services `selector` does not
    /// claim. The state's history is empty; see [`ClusterState::followed_by`].
    pub fn build(&mut self, objects: &Objects, selector: &ServiceSelector) -> ClusterState {
        let mut invalid_services = BTreeSet::new();
        let mut services = super::Services::new();
        let mut converted = HashMap::with_capacity(objects.services.len());
        for (key, svc) in &objects.services {
            if !selector.claims(svc.metadata.labels.as_ref()) {
                continue;
            }
            let result = match self.services.remove(key) {
                Some((before, result)) if Arc::ptr_eq(&before, svc) => result,
                before => convert_again(key, svc, before.and_then(|(_, r)| r.ok().flatten())),
            };
            match &result {
                Ok(Some(service)) => {
                    services.insert(key.clone(), Arc::clone(service));
                }
                Ok(None) => {}
                Err(_) => {
                    invalid_services.insert(key.clone());
                }
            }
            converted.insert(key.clone(), (Arc::clone(svc), result));
        }
        self.services = converted;

        let mut endpoints = super::Endpoints::new();
        let mut merged = HashMap::with_capacity(self.slices.len());
        for (key, slices) in slices_by_service(objects) {
            let backends = match self.slices.remove(&key) {
                Some((before, backends)) if same_objects(&before, &slices) => backends,
                before => merge_again(&key, &slices, before.and_then(|(_, b)| b)),
            };
            if let Some(backends) = &backends
                && services.contains_key(&key)
            {
                endpoints.insert(key.clone(), Arc::clone(backends));
            }
            merged.insert(key, (slices, backends));
        }
        self.slices = merged;

        ClusterState {
            services: Arc::new(services),
            endpoints: Arc::new(endpoints),
            nodes: self.nodes_of(objects),
            service_cidrs: Arc::new(service_cidrs(objects)),
            invalid_services,
            ..ClusterState::default()
        }
    }
}

impl Builder {
    /// What the Nodes of `objects` convert to: the previous build's when it had the same Node
    /// objects, so a state whose Nodes did not change shares their map with the state before.
    fn nodes_of(&mut self, objects: &Objects) -> Arc<BTreeMap<String, NodeInfo>> {
        let before = &self.nodes.0;
        let unchanged = before.len() == objects.nodes.len()
            && before
                .iter()
                .zip(objects.nodes.values())
                .all(|(a, b)| Arc::ptr_eq(a, b));
        if !unchanged {
            let converted = objects
                .nodes
                .iter()
                .map(|(name, node)| (name.clone(), NodeInfo::of(node)))
                .collect();
            self.nodes = (
                objects.nodes.values().cloned().collect(),
                Arc::new(converted),
            );
        }
        Arc::clone(&self.nodes.1)
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

/// Converts a Service that is new or changed; an equal result keeps the `Arc` of `before`.
fn convert_again(key: &Key, svc: &Service, before: Option<Arc<pb::Service>>) -> Converted {
    match convert_service(svc) {
        Ok(Some(service)) => Ok(Some(reuse_if_equal(service, before))),
        Ok(None) => Ok(None),
        Err(err) => {
            // Quoted (`?`): a hostile name must not break the log line.
            tracing::warn!(service = ?format!("{}/{}", key.0, key.1), %err, "skipping invalid service");
            Err(err)
        }
    }
}

/// Merges the slices of a Service whose set of slices changed; an equal result keeps the `Arc`
/// of `before`.
fn merge_again(key: &Key, slices: &[Arc<EndpointSlice>], before: Merged) -> Merged {
    let mut merged = merge_slices(slices.iter().map(|slice| &**slice));
    merged
        .remove(key)
        .map(|backends| reuse_if_equal(backends, before))
}

fn reuse_if_equal<T: PartialEq>(value: T, before: Option<Arc<T>>) -> Arc<T> {
    match before {
        Some(before) if *before == value => before,
        _ => Arc::new(value),
    }
}

/// The slices of each Service, by the Service's key, in the slices' key order.
fn slices_by_service(objects: &Objects) -> HashMap<Key, Vec<Arc<EndpointSlice>>> {
    let mut by_service: HashMap<Key, Vec<Arc<EndpointSlice>>> = HashMap::new();
    for ((namespace, _), slice) in &objects.slices {
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL));
        if let Some(service) = service {
            by_service
                .entry((namespace.clone(), service.clone()))
                .or_default()
                .push(Arc::clone(slice));
        }
    }
    by_service
}

fn same_objects<T>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(a, b))
}
