//! Which Services a node may see in a form of its own rather than the plain one: those with an
//! endpoint on the node, and those whose topology hints may narrow some node's traffic. Indexed
//! once per cluster state, so a node's first view costs in proportion to those Services instead
//! of to every endpoint in the cluster (after a controller restart, every node's view is a first
//! one).

use crate::{
    cluster::{Endpoints, Key},
    topology,
};
use itertools::Itertools;
use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
};

/// The index of one cluster state's endpoints, built on first use.
#[derive(Debug, Default)]
pub struct Placement(OnceLock<Index>);

#[derive(Debug)]
struct Index {
    /// The endpoints indexed; held, so the check that a caller's are the same cannot be fooled
    /// by a reused address.
    endpoints: Arc<Endpoints>,
    /// The Services with an endpoint on each node, sorted.
    by_node: HashMap<String, Vec<Key>>,
    /// The Services whose hints may narrow some node's traffic, sorted.
    hinted: Vec<Key>,
}

impl Placement {
    /// The Services whose endpoints `node` may see in its own form, sorted and each once; `None`
    /// when `endpoints` are not the ones this index is of (the caller then looks at every one).
    pub fn candidates<'a>(
        &'a self,
        endpoints: &Arc<Endpoints>,
        node: &str,
    ) -> Option<impl Iterator<Item = &'a Key>> {
        let index = self.0.get_or_init(|| Index::of(endpoints));
        if !Arc::ptr_eq(&index.endpoints, endpoints) {
            return None;
        }
        let on_node = index.by_node.get(node).map_or(&[][..], Vec::as_slice);
        Some(on_node.iter().merge(&index.hinted).dedup())
    }
}

impl Index {
    fn of(endpoints: &Arc<Endpoints>) -> Self {
        let mut by_node: HashMap<String, Vec<Key>> = HashMap::new();
        let mut hinted = Vec::new();
        for (key, backends) in endpoints.iter() {
            let nodes = backends
                .ports
                .iter()
                .flat_map(|port| &port.endpoints)
                .map(|backend| backend.node_name.as_str())
                .filter(|node| !node.is_empty());
            for node in nodes.unique() {
                by_node
                    .entry(node.to_owned())
                    .or_default()
                    .push(key.clone());
            }
            if backends
                .ports
                .iter()
                .any(|port| topology::may_narrow(&port.endpoints))
            {
                hinted.push(key.clone());
            }
        }
        Self {
            endpoints: Arc::clone(endpoints),
            by_node,
            hinted,
        }
    }
}
