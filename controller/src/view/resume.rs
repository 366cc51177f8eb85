//! Deltas for an agent that resumes on a controller that holds none of its states (protocol
//! rules 7 and 11): from what the agent presents, every digest or their sums per bucket, to the
//! node's view.
//!
//! The work that does not depend on the node is done once per cluster state (see
//! [`crate::digests`]); per node there remains only its own endpoint sets and the buckets that
//! differ.

use super::{Delta, EndpointForm, EndpointsOf, NodeView, Resources, diff_all};
use crate::digests::{Digests, PlainSummary, SharedDigests, buckets_allowed};
use splitproxy_proto::{Key, bucket_of, v1alpha1 as pb};
use std::sync::Arc;

/// What an agent said it holds when subscribing, when that is not a state of this controller, so
/// any replica can send it a delta instead of a reset.
#[derive(Debug, Clone, PartialEq)]
pub enum Held {
    /// Every digest (protocol rule 7).
    Digests(HeldDigests),
    /// Their sums per bucket (rule 11).
    Summary(Vec<u64>),
}

impl Held {
    /// What a subscribe says the agent holds; `None` when it holds nothing. A summary wins over
    /// digests; one with a number of buckets the protocol does not allow is ignored.
    #[must_use]
    pub fn from_subscribe(subscribe: &mut pb::Subscribe) -> Option<Self> {
        let summary = subscribe
            .summary
            .take()
            .map(|summary| summary.bucket_sums)
            .filter(|sums| buckets_allowed(sums.len()));
        match summary {
            Some(sums) => Some(Self::Summary(sums)),
            None => {
                HeldDigests::from_subscribe(std::mem::take(&mut subscribe.held)).map(Self::Digests)
            }
        }
    }
}

/// A digest per Service and endpoint set an agent holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeldDigests {
    pub(super) services: SortedDigests,
    pub(super) endpoints: SortedDigests,
}

/// Digests sorted by key, each key once: read in one walk beside a view's sorted maps.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct SortedDigests(pub(super) Vec<(Key, u64)>);

impl SortedDigests {
    pub(super) fn of(mut digests: Vec<(Key, u64)>) -> Self {
        // Agents send them sorted, which this sort finds in one pass.
        digests.sort_by(|(a, _), (b, _)| a.cmp(b));
        digests.dedup_by(|(a, _), (b, _)| a == b);
        Self(digests)
    }
}

impl Resources for SortedDigests {
    type Entry = u64;
    fn get(&self, key: &Key) -> Option<&u64> {
        let at = self.0.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        self.0.get(at).map(|(_, digest)| digest)
    }
    fn entries(&self) -> impl Iterator<Item = (&Key, &u64)> {
        self.0.iter().map(|(key, digest)| (key, digest))
    }
}

impl HeldDigests {
    /// The digests of a subscribe, taken from it; `None` when it lists none (the agent holds
    /// nothing). Entries without a key or kind are ignored: the delta then upserts those
    /// resources. A key listed twice counts once, with its first digest.
    #[must_use]
    pub fn from_subscribe(held: Vec<pb::ResourceDigest>) -> Option<Self> {
        if held.is_empty() {
            return None;
        }
        let (mut services, mut endpoints) = (Vec::new(), Vec::new());
        for entry in held {
            let Some(key) = entry.key else { continue };
            let list = match pb::ResourceKind::try_from(entry.kind) {
                Ok(pb::ResourceKind::Service) => &mut services,
                Ok(pb::ResourceKind::Endpoints) => &mut endpoints,
                _ => continue,
            };
            list.push(((key.namespace, key.name), entry.sha256_prefix));
        }
        Some(Self {
            services: SortedDigests::of(services),
            endpoints: SortedDigests::of(endpoints),
        })
    }
}

impl Delta {
    /// The delta from what an agent holds, known only by digests, to `to`. It always carries the
    /// node's status (rule 9), as the agent's status is not among the digests. `shared` holds
    /// the digests of the entries `to` shares with the cluster state it was computed from.
    #[must_use]
    pub fn from_digests(held: &HeldDigests, to: &NodeView, shared: &SharedDigests) -> Self {
        let digests = shared.for_maps(&to.services, &to.backends);
        let endpoints = EndpointsOf(to);
        Self::assemble(
            diff_all(&held.services, &*to.services, |digest, service| {
                *digest == digests.digest_of(service)
            }),
            diff_all(&held.endpoints, &endpoints, |digest, endpoints| {
                *digest == digests.digest_of(endpoints)
            }),
            to,
            to.status.clone(),
        )
    }

    /// The delta from what an agent holds, known by its sums per bucket, to `to` (protocol rule
    /// 11): every resource of `to` in the buckets whose sums differ, which replace what the
    /// agent holds there, and the node's status. `shared` as for [`Self::from_digests`].
    #[must_use]
    pub fn from_summary(sums: &[u64], to: &NodeView, shared: &SharedDigests) -> Self {
        let mut delta = Self {
            node_status: to.status.clone(),
            ..Self::default()
        };
        let digests = shared.for_maps(&to.services, &to.backends);
        // `Held::from_subscribe` takes no summary with a number of buckets the protocol forbids.
        let Some(plain) = digests.summary(sums.len()) else {
            return delta;
        };
        let current = to.summary(&digests, plain);
        let mut replaced = pb::ReplacedBuckets {
            bucket_count: u32::try_from(sums.len()).unwrap_or(u32::MAX),
            buckets: Vec::new(),
        };
        let buckets = sums.iter().zip(&current).zip(plain.keys.iter());
        for (bucket, ((held, current), keys)) in (0u32..).zip(buckets) {
            if held == current {
                continue;
            }
            replaced.buckets.push(bucket);
            for key in keys {
                if let Some(service) = to.services.get(key) {
                    delta.upserted_services.push(Arc::clone(service));
                }
                if let Some(endpoints) = to.endpoints_of(key) {
                    delta.upserted_endpoints.push(Arc::clone(endpoints));
                }
            }
        }
        if !replaced.buckets.is_empty() {
            delta.replaced_buckets = Some(replaced);
        }
        delta
    }
}

impl NodeView {
    /// This view's digests summed per bucket (protocol rule 11), to compare with an agent's
    /// summary: the sums its zone's nodes share, corrected for the node's own endpoints.
    fn summary(&self, digests: &Digests, plain: &PlainSummary) -> Vec<u64> {
        if self.form == EndpointForm::Cluster {
            return plain.cluster_sums().to_vec();
        }
        let mut sums = plain.sums_in(&self.zone, digests).to_vec();
        let buckets = sums.len();
        for (key, own) in self.own.iter() {
            let replaced = self
                .backends
                .get(key)
                .map_or(0, |b| digests.digest_of(b.seen_in_zone(&self.zone)));
            if let Some(sum) = sums.get_mut(bucket_of(&key.0, &key.1, buckets)) {
                *sum = sum
                    .wrapping_sub(replaced)
                    .wrapping_add(digests.digest_of(own));
            }
        }
        sums
    }
}
