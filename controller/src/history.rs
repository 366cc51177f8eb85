//! What changed between consecutive cluster states, so that a node's next view is computed from
//! the Services that changed rather than from the whole cluster.
//!
//! Each published state carries its generation and the change sets of the last
//! [`HISTORY_LENGTH`] generations. A stream whose agent holds the view of generation `g` takes
//! the union of the change sets after `g`; further behind than that, it compares whole views.

use imbl::{OrdMap, ordmap::DiffItem};
use splitproxy_proto::Key;
use std::{
    collections::{BTreeSet, VecDeque},
    sync::Arc,
};

/// How many generations of change sets a state keeps. Agents within that many changes of the
/// newest state (all healthy ones: they ACK within a sync period) get views computed from the
/// changes alone; a change set is a few keys, so this costs little.
pub const HISTORY_LENGTH: usize = 256;

/// The keys whose entries differ between two consecutive states.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeSet {
    /// Services added, changed or removed.
    pub services: BTreeSet<Key>,
    /// Endpoint sets added, changed or removed.
    pub endpoints: BTreeSet<Key>,
    /// Nodes added, changed (topology, eligibility) or removed.
    pub nodes: BTreeSet<String>,
    /// Whether the cluster's service CIDRs changed (every node's status carries them).
    pub service_cidrs: bool,
}

impl ChangeSet {
    /// Whether nothing changed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.endpoints.is_empty()
            && self.nodes.is_empty()
            && !self.service_cidrs
    }

    fn extend(&mut self, other: &Self) {
        self.services.extend(other.services.iter().cloned());
        self.endpoints.extend(other.endpoints.iter().cloned());
        self.nodes.extend(other.nodes.iter().cloned());
        self.service_cidrs |= other.service_cidrs;
    }
}

/// A state's generation and the change sets that led to it, newest last.
#[derive(Debug, Clone, Default)]
pub struct History {
    generation: u64,
    recent: VecDeque<Arc<ChangeSet>>,
}

impl History {
    /// The history of the next generation, which `changes` led to.
    #[must_use]
    pub fn next(&self, changes: ChangeSet) -> Self {
        let mut recent = self.recent.clone();
        if recent.len() == HISTORY_LENGTH {
            recent.pop_front();
        }
        recent.push_back(Arc::new(changes));
        Self {
            generation: self.generation + 1,
            recent,
        }
    }

    /// This state's generation: 1 for a source's first state, then one more per state.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// What changed from the state before this one.
    #[must_use]
    pub fn latest(&self) -> Option<&ChangeSet> {
        self.recent.back().map(|changes| &**changes)
    }

    /// Everything that changed after `generation` up to this one; `None` when that is further
    /// back than the history reaches (or not a generation before this one). One generation
    /// back, which is where almost every stream is, is the latest change set itself, shared.
    #[must_use]
    pub fn since(&self, generation: u64) -> Option<Arc<ChangeSet>> {
        let behind = usize::try_from(self.generation.checked_sub(generation)?).ok()?;
        if behind > self.recent.len() {
            return None;
        }
        let mut later = self.recent.range(self.recent.len() - behind..);
        if behind == 1 {
            return later.next().cloned();
        }
        let mut union = ChangeSet::default();
        for changes in later {
            union.extend(changes);
        }
        Some(Arc::new(union))
    }
}

/// The keys present in only one of `a` and `b`, or in both with entries that differ.
#[must_use]
pub fn changed_keys<K: Ord + Clone, V: Clone + PartialEq>(
    a: &OrdMap<K, V>,
    b: &OrdMap<K, V>,
) -> BTreeSet<K> {
    a.diff(b)
        .map(|change| match change {
            DiffItem::Add(key, _)
            | DiffItem::Remove(key, _)
            | DiffItem::Update { new: (key, _), .. } => key.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
