//! Sharing the nodes between controller replicas (protocol rule 13). Each replica counts the
//! replicas (the ready endpoints of its own Service, read from the cluster like any other
//! Service's) and the nodes, keeps at most its share of the nodes plus a margin, and sheds its
//! oldest streams beyond that, a few at a time, so agents spread onto a replica added after
//! they connected instead of staying where they first landed.
//!
//! The streams and the limit are kept with the other records of the streams, in
//! [`crate::agents::Agents`].
//!
//! Nothing is refused at the door: a count that is stale (a replica gone that still looks
//! ready) must never leave an agent without a controller. An agent shed onto a replica that is
//! itself over its share is taken, and shed again later; as shed agents move on to the next
//! replica they know, the replicas settle within their shares.

use crate::cluster::SERVICE_NAME_LABEL;
use imbl::OrdMap;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use splitproxy_proto::Key;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

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

#[cfg(test)]
mod tests;
