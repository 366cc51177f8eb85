//! Which Services a node may see in a form of its own rather than its zone's: those with an
//! endpoint on the node, and those with a node hint naming it. Indexed once per cluster state, so
//! a node's first view costs in proportion to those Services instead of to every endpoint in the
//! cluster (after a controller restart, every node's view is a first one).

use crate::cluster::{Endpoints, Key};
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
    /// The Services that single out each node (an endpoint on it, or a node hint naming it),
    /// sorted, each once.
    by_node: HashMap<String, Vec<Key>>,
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
        Some(index.by_node.get(node).into_iter().flatten())
    }
}

impl Index {
    fn of(endpoints: &Arc<Endpoints>) -> Self {
        let mut by_node: HashMap<String, Vec<Key>> = HashMap::new();
        for (key, backends) in endpoints.iter() {
            let backends = backends.ports.iter().flat_map(|port| &port.endpoints);
            let nodes = backends
                .flat_map(|b| std::iter::once(&b.node_name).chain(&b.hints.for_nodes))
                .filter(|node| !node.is_empty());
            for node in nodes.unique() {
                by_node.entry(node.clone()).or_default().push(key.clone());
            }
        }
        Self {
            endpoints: Arc::clone(endpoints),
            by_node,
        }
    }
}
