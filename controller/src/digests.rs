//! The digests of one cluster state's Services and endpoint sets in cluster, plain and per-zone
//! form, and their sums per bucket (protocol rules 7 and 11), computed once per state and shared by every
//! resuming node's delta.
//!
//! After a controller restart every agent resumes at once, so the work that does not depend on
//! the node is done once per state: the digests, their sums per bucket, and the keys in each
//! bucket. A state's digests are seeded from the state before's, so under churn only the entries
//! that changed are hashed again. Those of the filtered endpoint sets (plain and per zone), and
//! their sums, are computed only when an agent that takes them resumes: agents that derive
//! locality (protocol rule 15) need the cluster form alone.

use crate::resources::{Endpoints, ServiceBackends, Services};
use splitproxy_proto::{Key, MAX_SUMMARY_BUCKETS, bucket_of, v1alpha1 as pb};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock, PoisonError},
};

/// Whether a summary may have `buckets` buckets (protocol rule 11).
pub fn buckets_allowed(buckets: usize) -> bool {
    splitproxy_proto::BucketSet::empty(buckets).is_some()
}

/// The digests of one cluster state's Services and plain and per-zone endpoint sets, and their
/// sums per bucket, computed on the first resume and then shared by every node's.
#[derive(Debug, Default)]
pub struct SharedDigests {
    /// This state's digests, once computed.
    pub(crate) computed: OnceLock<Digests>,
    /// The digests of the state before, when they were computed: while agents resume under
    /// churn, every published state is resumed from, and most of its entries are the previous
    /// state's, whose digests are taken from there. Dropped once these are computed, so no
    /// chain of states stays alive.
    pub(crate) seed: Mutex<Option<Arc<SharedDigests>>>,
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

    /// The digests of the entries of `services` and `endpoints`: these when those are the maps
    /// of the state they belong to, computed for them alone otherwise.
    #[must_use]
    pub fn for_maps(&self, services: &Arc<Services>, endpoints: &Arc<Endpoints>) -> ForMaps<'_> {
        let digests = self.computed.get_or_init(|| {
            let seed = self
                .seed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            Digests::compute(services, endpoints, seed)
        });
        if Arc::ptr_eq(&digests.services, services) && Arc::ptr_eq(&digests.endpoints, endpoints) {
            ForMaps::Shared(digests)
        } else {
            ForMaps::Own(Box::new(Digests::compute(services, endpoints, None)))
        }
    }
}

/// What [`SharedDigests::for_maps`] gives: the state's own digests, or ones computed for other
/// maps.
pub enum ForMaps<'a> {
    /// The digests of the state the maps belong to.
    Shared(&'a Digests),
    /// Digests computed for maps of no state.
    Own(Box<Digests>),
}

impl std::ops::Deref for ForMaps<'_> {
    type Target = Digests;

    fn deref(&self) -> &Digests {
        match self {
            Self::Shared(digests) => digests,
            Self::Own(digests) => digests,
        }
    }
}

/// How many bucket counts a summary may have: every power of two up to the most.
const BUCKET_COUNTS: usize = MAX_SUMMARY_BUCKETS.trailing_zeros() as usize + 1;

/// Digests by entry address. The maps are held, so every entry stays alive and no address is
/// reused while this exists.
#[derive(Debug)]
pub struct Digests {
    services: Arc<Services>,
    endpoints: Arc<Endpoints>,
    /// The Services' digests and the endpoint sets' in cluster form: what every agent that
    /// derives locality resumes from.
    pub(crate) by_address: HashMap<usize, u64>,
    /// The digests of the plain and per-zone endpoint sets, computed when an agent that takes
    /// filtered sets first resumes from this state.
    pub(crate) filtered: OnceLock<HashMap<usize, u64>>,
    /// The state before, while its filtered digests can seed these: taken when they are
    /// computed, so at most one state is held.
    filtered_seed: Mutex<Option<Arc<SharedDigests>>>,
    /// The sums per bucket, by the bucket count's power of two, each computed when first asked.
    pub(crate) summaries: [OnceLock<PlainSummary>; BUCKET_COUNTS],
    /// The keys per bucket of the state before, by bucket count as `summaries`, where that
    /// state had the same keys and had computed them.
    inherited_keys: [Option<BucketKeys>; BUCKET_COUNTS],
}

impl Digests {
    /// The digests of `services` and `endpoints`; those of entries `seed` has (the state
    /// before's, alive while `seed` is, so an equal address is the same entry) are copied.
    pub fn compute(
        services: &Arc<Services>,
        endpoints: &Arc<Endpoints>,
        seed_state: Option<Arc<SharedDigests>>,
    ) -> Self {
        let seed = seed_state.as_deref().and_then(|s| s.computed.get());
        let known = seed.map(|seed| &seed.by_address);
        let services_digests = services.values().map(|s| by_address(s, known));
        let endpoints_digests = endpoints.values().map(|e| by_address(&e.cluster, known));
        let same_keys = seed.is_some_and(|seed| {
            seed.services.keys().eq(services.keys()) && seed.endpoints.keys().eq(endpoints.keys())
        });
        let inherited_keys = std::array::from_fn(|at| {
            let seed = seed.filter(|_| same_keys)?;
            Some(Arc::clone(&seed.summaries.get(at)?.get()?.keys))
        });
        let by_address = services_digests.chain(endpoints_digests).collect();
        let seed_has_filtered = seed.is_some_and(|seed| seed.filtered.get().is_some());
        let filtered_seed = seed_state.filter(|_| seed_has_filtered);
        Self {
            services: Arc::clone(services),
            endpoints: Arc::clone(endpoints),
            by_address,
            filtered: OnceLock::new(),
            filtered_seed: Mutex::new(filtered_seed),
            summaries: std::array::from_fn(|_| OnceLock::new()),
            inherited_keys,
        }
    }

    /// The digests of the plain and per-zone endpoint sets, computed on the first call.
    fn filtered(&self) -> &HashMap<usize, u64> {
        self.filtered.get_or_init(|| {
            let seed = self
                .filtered_seed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            let known = (seed.as_deref())
                .and_then(|seed| seed.computed.get())
                .and_then(|seed| seed.filtered.get());
            self.endpoints
                .values()
                .flat_map(|e| std::iter::once(&e.plain).chain(e.zoned.iter().map(|(_, z)| z)))
                .map(|e| by_address(e, known))
                .collect()
        })
    }

    /// The digest of `resource`: looked up when it is one of these entries, computed for any
    /// other (a node's own endpoints).
    pub fn digest_of<M: prost::Message>(&self, resource: &Arc<M>) -> u64 {
        let at = address(resource);
        (self.by_address.get(&at))
            .or_else(|| self.filtered().get(&at))
            .copied()
            .unwrap_or_else(|| digest(resource))
    }

    /// The sums in `buckets` buckets; `None` for a count the protocol does not allow.
    pub fn summary(&self, buckets: usize) -> Option<&PlainSummary> {
        if !buckets_allowed(buckets) {
            return None;
        }
        let at = buckets.trailing_zeros() as usize;
        let slot = self.summaries.get(at)?;
        let inherited = self.inherited_keys.get(at).cloned().flatten();
        Some(slot.get_or_init(|| PlainSummary::of(self, buckets, inherited)))
    }
}

/// A cluster state's Services and endpoint sets summed per bucket, with the keys in each bucket:
/// what every node's summary, and the resources of a replaced bucket, start from.
#[derive(Debug, Clone)]
pub struct PlainSummary {
    /// The sums with every endpoint set in cluster form (protocol rule 15), which every node
    /// that takes that form starts and ends with.
    cluster: Vec<u64>,
    /// The sums with endpoint sets filtered, for agents that do not derive locality: computed
    /// only when one resumes, as most states are resumed from by agents in cluster form alone.
    filtered: OnceLock<FilteredSums>,
    /// The keys in each bucket: the resources a replaced bucket holds.
    pub keys: BucketKeys,
}

/// The sums with plain endpoint sets, and with each zone's sets in place of the plain ones for
/// the zones that have any.
#[derive(Debug, Clone)]
struct FilteredSums {
    plain: Vec<u64>,
    zones: HashMap<String, Vec<u64>>,
}

/// The keys of the Services and endpoint sets in each bucket, sorted, each once.
pub type BucketKeys = Arc<Vec<Vec<Key>>>;

impl PlainSummary {
    /// The sums of `digests` in `buckets` buckets, with `inherited` as the keys per bucket
    /// when the state before had the same keys.
    fn of(digests: &Digests, buckets: usize, inherited: Option<BucketKeys>) -> Self {
        let keys = inherited.unwrap_or_else(|| Arc::new(bucket_keys(digests, buckets)));
        Self {
            cluster: sum_up(digests, buckets, &|e| &e.cluster),
            filtered: OnceLock::new(),
            keys,
        }
    }

    /// The sums every node of `zone` that takes filtered sets starts from (`digests` are the
    /// ones these were summed from).
    pub fn sums_in(&self, zone: &str, digests: &Digests) -> &[u64] {
        let filtered = self.filtered.get_or_init(|| {
            let buckets = self.cluster.len();
            let plain = sum_up(digests, buckets, &|e| &e.plain);
            let mut zones = HashMap::new();
            for (key, e) in digests.endpoints.iter() {
                let plain_digest = digests.digest_of(&e.plain);
                for (zone, form) in &e.zoned {
                    let sums = zones.entry(zone.clone()).or_insert_with(|| plain.clone());
                    if let Some(sum) = sums.get_mut(bucket_of(&key.0, &key.1, buckets)) {
                        *sum = sum
                            .wrapping_sub(plain_digest)
                            .wrapping_add(digests.digest_of(form));
                    }
                }
            }
            FilteredSums { plain, zones }
        });
        filtered.zones.get(zone).unwrap_or(&filtered.plain)
    }

    /// The sums of every node that takes sets in cluster form.
    pub fn cluster_sums(&self) -> &[u64] {
        &self.cluster
    }
}

/// The digests of `digests`' Services and of one form of each endpoint set (`form`), summed in
/// `buckets` buckets.
fn sum_up(
    digests: &Digests,
    buckets: usize,
    form: &dyn Fn(&ServiceBackends) -> &Arc<pb::ServiceEndpoints>,
) -> Vec<u64> {
    let mut sums = vec![0u64; buckets];
    let services = (digests.services.iter()).map(|(key, s)| (key, digests.digest_of(s)));
    let endpoints = (digests.endpoints.iter()).map(|(key, e)| (key, digests.digest_of(form(e))));
    for (key, digest) in services.chain(endpoints) {
        if let Some(sum) = sums.get_mut(bucket_of(&key.0, &key.1, buckets)) {
            *sum = sum.wrapping_add(digest);
        }
    }
    sums
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

/// `resource`'s address and digest, the digest copied from `known` (the state before's, alive
/// while it is) when it has the address.
fn by_address<M: prost::Message>(
    resource: &Arc<M>,
    known: Option<&HashMap<usize, u64>>,
) -> (usize, u64) {
    let at = address(resource);
    let copied = known.and_then(|known| known.get(&at)).copied();
    (at, copied.unwrap_or_else(|| digest(resource)))
}

fn address<T>(entry: &Arc<T>) -> usize {
    Arc::as_ptr(entry).cast::<()>() as usize
}

fn digest<M: prost::Message>(resource: &Arc<M>) -> u64 {
    splitproxy_proto::digest(&**resource)
}
