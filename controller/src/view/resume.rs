//! Deltas for an agent that resumes on a controller that holds none of its states (protocol
//! rules 7 and 11): from what the agent presents, every digest or their sums per bucket, to the
//! node's view.
//!
//! After a controller restart every agent resumes at once, so the work that does not depend on
//! the node is done once per cluster state and shared: the digests of the Services and of the
//! plain and per-zone endpoint sets, their sums per bucket, and the keys in each bucket. Per
//! node there remains only its own endpoint sets and the buckets that differ.

use super::{Delta, EndpointsOf, NodeView, Resources, diff_all};
use crate::cluster::{Endpoints, Key, Services};
use splitproxy_proto::{MAX_SUMMARY_BUCKETS, bucket_of, v1alpha1 as pb};
use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

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

/// Whether a summary may have `buckets` buckets (protocol rule 11).
fn buckets_allowed(buckets: usize) -> bool {
    splitproxy_proto::BucketSet::empty(buckets).is_some()
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
        let digests = shared.for_view(to);
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
        let digests = shared.for_view(to);
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
        let mut sums = plain.sums_in(&self.zone).to_vec();
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

/// The digests of one cluster state's Services and plain and per-zone endpoint sets, and their
/// sums per bucket, computed on the first resume and then shared by every node's.
#[derive(Debug, Default)]
pub struct SharedDigests {
    /// This state's digests, once computed.
    pub(super) computed: OnceLock<Digests>,
    /// The digests of the state before, when they were computed: while agents resume under
    /// churn, every published state is resumed from, and most of its entries are the previous
    /// state's, whose digests are taken from there. Dropped once these are computed, so no
    /// chain of states stays alive.
    pub(super) seed: Mutex<Option<Arc<SharedDigests>>>,
}

impl SharedDigests {
    /// The digests of the state after the one `before` belongs to, computed from those of
    /// `before` where entries are shared when `before`'s were computed, or else from those
    /// `before` was to be computed from: under churn states are published faster than agents
    /// resume from each, and one nobody resumed from must not make the next hash everything.
    #[must_use]
    pub fn after(before: &Arc<Self>) -> Self {
        let seed = if before.computed.get().is_some() {
            Some(Arc::clone(before))
        } else {
            before
                .seed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        };
        Self {
            computed: OnceLock::new(),
            seed: Mutex::new(seed),
        }
    }

    /// The digests for `view`'s entries: these when `view` is of the state they belong to,
    /// computed for `view` alone otherwise.
    fn for_view(&self, view: &NodeView) -> Cow<'_, Digests> {
        let digests = self.computed.get_or_init(|| {
            let seed = self
                .seed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            Digests::compute(
                &view.services,
                &view.backends,
                seed.as_ref().and_then(|s| s.computed.get()),
            )
        });
        if Arc::ptr_eq(&digests.services, &view.services)
            && Arc::ptr_eq(&digests.endpoints, &view.backends)
        {
            Cow::Borrowed(digests)
        } else {
            Cow::Owned(Digests::compute(&view.services, &view.backends, None))
        }
    }
}

/// How many bucket counts a summary may have: every power of two up to the most.
const BUCKET_COUNTS: usize = MAX_SUMMARY_BUCKETS.trailing_zeros() as usize + 1;

/// Digests by entry address. The maps are held, so every entry stays alive and no address is
/// reused while this exists.
#[derive(Debug, Clone)]
pub(super) struct Digests {
    services: Arc<Services>,
    endpoints: Arc<Endpoints>,
    pub(super) by_address: HashMap<usize, u64>,
    /// The sums per bucket, by the bucket count's power of two, each computed when first asked.
    pub(super) summaries: [OnceLock<PlainSummary>; BUCKET_COUNTS],
    /// The keys per bucket of the state before, by bucket count as `summaries`, where that
    /// state had the same keys and had computed them.
    inherited_keys: [Option<BucketKeys>; BUCKET_COUNTS],
}

impl Digests {
    /// The digests of `services` and `endpoints`; those of entries `seed` has (the state
    /// before's, alive while `seed` is, so an equal address is the same entry) are copied.
    pub(super) fn compute(
        services: &Arc<Services>,
        endpoints: &Arc<Endpoints>,
        seed: Option<&Self>,
    ) -> Self {
        let services_digests = services.values().map(|s| by_address(s, seed));
        let endpoints_digests = endpoints
            .values()
            .flat_map(|e| std::iter::once(&e.plain).chain(e.zoned.iter().map(|(_, z)| z)))
            .map(|e| by_address(e, seed));
        let same_keys = seed.is_some_and(|seed| {
            seed.services.keys().eq(services.keys()) && seed.endpoints.keys().eq(endpoints.keys())
        });
        let inherited_keys = std::array::from_fn(|at| {
            let seed = seed.filter(|_| same_keys)?;
            Some(Arc::clone(&seed.summaries.get(at)?.get()?.keys))
        });
        Self {
            services: Arc::clone(services),
            endpoints: Arc::clone(endpoints),
            by_address: services_digests.chain(endpoints_digests).collect(),
            summaries: std::array::from_fn(|_| OnceLock::new()),
            inherited_keys,
        }
    }

    /// The digest of `resource`: looked up when it is one of these entries, computed for any
    /// other (a node's own endpoints).
    fn digest_of<M: prost::Message>(&self, resource: &Arc<M>) -> u64 {
        self.by_address
            .get(&address(resource))
            .copied()
            .unwrap_or_else(|| digest(resource))
    }

    /// The sums in `buckets` buckets; `None` for a count the protocol does not allow.
    fn summary(&self, buckets: usize) -> Option<&PlainSummary> {
        if !buckets_allowed(buckets) {
            return None;
        }
        let at = buckets.trailing_zeros() as usize;
        let slot = self.summaries.get(at)?;
        let inherited = self.inherited_keys.get(at).cloned().flatten();
        Some(slot.get_or_init(|| PlainSummary::of(self, buckets, inherited)))
    }
}

/// A cluster state's Services and plain endpoint sets summed per bucket, with the keys in each
/// bucket: what every node's summary, and the resources of a replaced bucket, start from.
#[derive(Debug, Clone)]
pub(super) struct PlainSummary {
    sums: Vec<u64>,
    /// The sums with each zone's endpoint sets in place of the plain ones, for the zones that
    /// have any.
    zones: HashMap<String, Vec<u64>>,
    pub(super) keys: BucketKeys,
}

/// The keys of the Services and endpoint sets in each bucket, sorted, each once.
type BucketKeys = Arc<Vec<Vec<Key>>>;

impl PlainSummary {
    /// The sums of `digests` in `buckets` buckets, with `inherited` as the keys per bucket
    /// when the state before had the same keys.
    fn of(digests: &Digests, buckets: usize, inherited: Option<BucketKeys>) -> Self {
        let mut sums = vec![0u64; buckets];
        let services = digests
            .services
            .iter()
            .map(|(key, s)| (key, digests.digest_of(s)));
        let endpoints =
            (digests.endpoints.iter()).map(|(key, e)| (key, digests.digest_of(&e.plain)));
        for (key, digest) in services.chain(endpoints) {
            if let Some(sum) = sums.get_mut(bucket_of(&key.0, &key.1, buckets)) {
                *sum = sum.wrapping_add(digest);
            }
        }
        let mut zones = HashMap::new();
        for (key, e) in digests.endpoints.iter() {
            let plain = digests.digest_of(&e.plain);
            for (zone, form) in &e.zoned {
                let sums = zones.entry(zone.clone()).or_insert_with(|| sums.clone());
                if let Some(sum) = sums.get_mut(bucket_of(&key.0, &key.1, buckets)) {
                    *sum = sum
                        .wrapping_sub(plain)
                        .wrapping_add(digests.digest_of(form));
                }
            }
        }
        let keys = inherited.unwrap_or_else(|| Arc::new(bucket_keys(digests, buckets)));
        Self { sums, zones, keys }
    }

    /// The sums every node of `zone` starts from.
    fn sums_in(&self, zone: &str) -> &[u64] {
        self.zones.get(zone).unwrap_or(&self.sums)
    }
}

/// The keys of `digests`' Services and endpoint sets in each of `buckets` buckets, sorted, each
/// once.
fn bucket_keys(digests: &Digests, buckets: usize) -> Vec<Vec<Key>> {
    let mut keys = vec![Vec::new(); buckets];
    for key in digests.services.keys().chain(digests.endpoints.keys()) {
        if let Some(bucket) = keys.get_mut(bucket_of(&key.0, &key.1, buckets)) {
            bucket.push(key.clone());
        }
    }
    for bucket in &mut keys {
        bucket.sort_unstable();
        bucket.dedup();
    }
    keys
}

/// `resource`'s address and digest, the digest copied from `seed` when it has the address.
fn by_address<M: prost::Message>(resource: &Arc<M>, seed: Option<&Digests>) -> (usize, u64) {
    let at = address(resource);
    let known = seed.and_then(|seed| seed.by_address.get(&at)).copied();
    (at, known.unwrap_or_else(|| digest(resource)))
}

fn address<T>(entry: &Arc<T>) -> usize {
    Arc::as_ptr(entry).cast::<()>() as usize
}

fn digest<M: prost::Message>(resource: &Arc<M>) -> u64 {
    splitproxy_proto::digest(&**resource)
}
