//! Sharing the nodes between controller replicas (protocol rule 13). Each replica counts the
//! replicas (the ready endpoints of its own Service, read from the cluster like any other
//! Service's) and the nodes, keeps at most its share of the nodes plus a margin, and sheds its
//! oldest streams beyond that, a few at a time, so agents spread onto a replica added after
//! they connected instead of staying where they first landed.
//!
//! Nothing is refused at the door: a count that is stale (a replica gone that still looks
//! ready) must never leave an agent without a controller. An agent shed onto a replica that is
//! itself over its share is taken, and shed again later; as shed agents move on to the next
//! replica they know, the replicas settle within their shares.

use crate::cluster::{Key, SERVICE_NAME_LABEL};
use imbl::OrdMap;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};
use tokio::sync::Notify;

/// How often a replica over its share sheds one stream: 50 a second, so the replica taking them
/// resumes them (each a delta from the agent's summary) without a storm, and 1,000 agents move
/// in 20 seconds.
pub const SHED_INTERVAL: Duration = Duration::from_millis(20);

/// The most streams one of `replicas` keeps while the cluster has `nodes`: its even share plus a
/// fifth, so replicas need not be balanced to the node to stop shedding. `None`, no limit, for
/// a lone replica or before nodes are known.
#[must_use]
pub fn limit(nodes: usize, replicas: usize) -> Option<usize> {
    if replicas <= 1 || nodes == 0 {
        return None;
    }
    let share = nodes.div_ceil(replicas);
    Some(share + share / 5)
}

/// How many replicas serve behind `service`: its ready endpoints, counted per address family
/// (a dual-stack replica has one in each), the larger count. `slices` are keyed by namespace
/// and slice name.
#[must_use]
pub fn ready_replicas(slices: &OrdMap<Key, Arc<EndpointSlice>>, service: &Key) -> usize {
    let (namespace, name) = service;
    let mut by_family: BTreeMap<&str, usize> = BTreeMap::new();
    let from = (namespace.clone(), String::new());
    for ((slice_namespace, _), slice) in slices.range(from..) {
        if slice_namespace != namespace {
            break;
        }
        let labels = slice.metadata.labels.as_ref();
        if labels.and_then(|l| l.get(SERVICE_NAME_LABEL)) != Some(name) {
            continue;
        }
        let ready = (slice.endpoints.as_deref().unwrap_or_default().iter())
            .filter(|endpoint| {
                let conditions = endpoint.conditions.as_ref();
                // Unset means ready, as for every other Service's endpoints.
                conditions.and_then(|c| c.ready) != Some(false)
            })
            .count();
        *by_family.entry(slice.address_type.as_str()).or_default() += ready;
    }
    by_family.into_values().max().unwrap_or(0)
}

/// This replica's open streams and the most it keeps; clones share them.
#[derive(Debug, Clone, Default)]
pub struct Shares {
    table: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    /// The open streams by connection order, each with what tells it to end.
    streams: BTreeMap<u64, Member>,
    /// How many of them were told to end and have not ended yet.
    shedding: usize,
    limit: Option<usize>,
}

#[derive(Debug)]
struct Member {
    shed: Arc<Notify>,
    shedding: bool,
}

impl Shares {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table is consistent after every statement that writes it.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a new stream in until the returned place is dropped.
    #[must_use]
    pub fn join(&self) -> Place {
        let shed = Arc::new(Notify::new());
        let mut table = self.lock();
        let id = table.next_id;
        table.next_id += 1;
        table.streams.insert(
            id,
            Member {
                shed: Arc::clone(&shed),
                shedding: false,
            },
        );
        Place {
            shares: self.clone(),
            id,
            shed,
        }
    }

    /// Sets the most streams kept; returns whether it changed.
    pub fn set_limit(&self, limit: Option<usize>) -> bool {
        let mut table = self.lock();
        let changed = table.limit != limit;
        table.limit = limit;
        changed
    }

    /// Tells the oldest stream to end if more streams are kept than the limit; returns whether
    /// one was told.
    pub fn shed_oldest(&self) -> bool {
        let mut table = self.lock();
        let Some(limit) = table.limit else {
            return false;
        };
        if table.streams.len() - table.shedding <= limit {
            return false;
        }
        let Some(oldest) = table.streams.values_mut().find(|m| !m.shedding) else {
            return false;
        };
        oldest.shedding = true;
        // Kept until the stream looks: it may be busy sending when told.
        oldest.shed.notify_one();
        table.shedding += 1;
        true
    }

    /// How many streams are open and not told to end.
    #[must_use]
    pub fn kept(&self) -> usize {
        let table = self.lock();
        table.streams.len() - table.shedding
    }
}

/// One stream's place among the replica's streams, given up when dropped.
#[derive(Debug)]
pub struct Place {
    shares: Shares,
    id: u64,
    shed: Arc<Notify>,
}

impl Place {
    /// Completes once the stream is to end, the replica being over its share.
    pub async fn shed(&self) {
        self.shed.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut table = self.shares.lock();
        if let Some(member) = table.streams.remove(&self.id)
            && member.shedding
        {
            table.shedding -= 1;
        }
    }
}

#[cfg(test)]
mod tests;
