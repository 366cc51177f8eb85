//! Which Services a node may see in a form of its own rather than its zone's: those with an
//! endpoint on the node, and those with a node hint naming it. Indexed once per cluster state, so
//! a node's first view costs in proportion to those Services instead of to every endpoint in the
//! cluster (after a controller restart, every node's view is a first one).
//!
//! Under churn every published state is resumed from, so each state's index is built from the
//! one before it where that was built: the index is persistent, and only the endpoint sets that
//! changed between the two states are walked.

use crate::resources::{Endpoints, ServiceBackends};
use imbl::{OrdMap, OrdSet, ordmap::DiffItem};
use splitproxy_proto::Key;
use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

/// The index of one cluster state's endpoints, built on first use.
#[derive(Debug, Default)]
pub struct Placement {
    index: OnceLock<Index>,
    /// The index of the state before, when it was built; taken when this one is built, so no
    /// chain of states stays alive.
    seed: Mutex<Option<Arc<Placement>>>,
}

#[derive(Debug, Clone, Default)]
struct Index {
    /// The endpoints indexed; held, so the check that a caller's are the same cannot be fooled
    /// by a reused address, and so the next state's index can be built from their differences.
    endpoints: Arc<Endpoints>,
    /// The Services that single out each node (an endpoint on it, or a node hint naming it).
    by_node: OrdMap<String, OrdSet<Key>>,
}

impl Placement {
    /// The index of the state after the one `before` belongs to, to be built from `before`'s
    /// when that was built.
    #[must_use]
    pub fn after(before: &Arc<Self>) -> Self {
        let seed = before.index.get().is_some().then(|| Arc::clone(before));
        Self {
            index: OnceLock::new(),
            seed: Mutex::new(seed),
        }
    }

    /// The Services whose endpoints `node` may see in its own form, sorted and each once; `None`
    /// when `endpoints` are not the ones this index is of (the caller then looks at every one).
    pub fn candidates<'a>(
        &'a self,
        endpoints: &Arc<Endpoints>,
        node: &str,
    ) -> Option<impl Iterator<Item = &'a Key>> {
        let index = self.index.get_or_init(|| {
            let seed = self
                .seed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            let before = seed.as_ref().and_then(|seed| seed.index.get());
            before.cloned().unwrap_or_default().updated(endpoints)
        });
        if !Arc::ptr_eq(&index.endpoints, endpoints) {
            return None;
        }
        Some(index.by_node.get(node).into_iter().flatten())
    }

    /// Whether the index was built, and dropped the state before's.
    #[cfg(test)]
    pub(crate) fn built_alone(&self) -> bool {
        self.index.get().is_some()
            && self
                .seed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none()
    }
}

impl Index {
    /// This index moved on to `endpoints`, walking only the endpoint sets that differ.
    fn updated(mut self, endpoints: &Arc<Endpoints>) -> Self {
        for item in self.endpoints.diff(endpoints) {
            let (key, before, after) = match item {
                DiffItem::Add(key, after) => (key, None, Some(after)),
                DiffItem::Remove(key, before) => (key, Some(before), None),
                DiffItem::Update {
                    old: (key, before),
                    new: (_, after),
                } => (key, Some(before), Some(after)),
            };
            let (before, after) = (singled_out(before), singled_out(after));
            for &node in before.difference(&after) {
                let emptied = self.by_node.get_mut(node).is_some_and(|keys| {
                    keys.remove(key);
                    keys.is_empty()
                });
                if emptied {
                    self.by_node.remove(node);
                }
            }
            for &node in after.difference(&before) {
                let keys = self.by_node.entry(node.to_owned()).or_default();
                keys.insert(key.clone());
            }
        }
        self.endpoints = Arc::clone(endpoints);
        self
    }
}

/// The nodes `backends` single out: those an endpoint runs on or a node hint names.
fn singled_out(backends: Option<&Arc<ServiceBackends>>) -> BTreeSet<&str> {
    let endpoints = (backends.into_iter())
        .flat_map(|backends| backends.ports())
        .flat_map(|port| &port.endpoints);
    endpoints
        .flat_map(|e| std::iter::once(&e.node_name).chain(&e.for_nodes))
        .filter(|node| !node.is_empty())
        .map(String::as_str)
        .collect()
}
