//! B4's thin protocol client: speaks the node view protocol as an agent does (subscribe with a
//! resume point and held digests, revisions pipelined and folded with cumulative ACKs,
//! retry-after honoured, the agent's keepalive, and B1's hollow agents' reconnect backoff, 100 ms
//! to 2 s) but holds only an interned key and a digest per resource, so thousands fit in one
//! process. Resources are decoded only as far as their key; their digests are taken over the
//! bytes as received, which is what the protocol defines them over. Revisions are "applied" by
//! waiting for the agent's real min-sync timer and then for a fixed sync time (B2's figure),
//! before the newest is acknowledged; revisions that complete during the wait join that sync.
//! It never rejects a revision, so no delta it receives builds on a state it dropped.

use crate::b1::{MAX_BACKOFF, MIN_BACKOFF};
use prost::bytes::Bytes;
use splitproxy_agent::{
    client::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT},
    sync::sleep_until,
    sync_timer::{SyncPeriods, SyncTimer},
};
use splitproxy_proto::v1alpha1 as pb;
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};
use tokio::{sync::mpsc, time::Instant};
use tokio_stream::StreamExt as _;

/// The gRPC path of the node view stream.
const SYNC_PATH: &str = "/splitproxy.v1alpha1.NodeViewService/Sync";

/// A `SyncResponse` with its resources left encoded; the fields it does not name (status, trace
/// context) are skipped by the decoder.
#[derive(Clone, PartialEq, prost::Message)]
struct Response {
    /// The sending controller's epoch.
    #[prost(string, tag = "1")]
    controller_epoch: String,
    /// The revision this part belongs to.
    #[prost(uint64, tag = "2")]
    revision: u64,
    /// Whether the revision replaces everything held.
    #[prost(bool, tag = "3")]
    reset: bool,
    /// Whether this is the revision's last part.
    #[prost(bool, tag = "4")]
    complete: bool,
    /// Encoded `Service` messages.
    #[prost(bytes = "bytes", repeated, tag = "5")]
    upserted_services: Vec<Bytes>,
    /// Keys of Services gone.
    #[prost(message, repeated, tag = "6")]
    removed_services: Vec<pb::ObjectKey>,
    /// Encoded `ServiceEndpoints` messages.
    #[prost(bytes = "bytes", repeated, tag = "7")]
    upserted_endpoints: Vec<Bytes>,
    /// Keys of endpoint sets gone.
    #[prost(message, repeated, tag = "8")]
    removed_endpoints: Vec<pb::ObjectKey>,
    /// The buckets a first revision answering a summary replaces.
    #[prost(message, optional, tag = "11")]
    replaced_buckets: Option<pb::ReplacedBuckets>,
}

/// The key of a `Service` or `ServiceEndpoints`: field 1 of both; the rest is skipped.
#[derive(Clone, PartialEq, prost::Message)]
struct Keyed {
    /// The resource's namespace and name.
    #[prost(message, optional, tag = "1")]
    key: Option<pb::ObjectKey>,
}

/// Resource keys interned once for every client: (namespace, name) ↔ a small number.
#[derive(Debug, Default)]
pub struct Keys(RwLock<KeyTable>);

#[derive(Debug, Default)]
struct KeyTable {
    /// Numbers by namespace, then name: looked up by `&str` without building a key.
    ids: HashMap<String, HashMap<String, u32>>,
    keys: Vec<pb::ObjectKey>,
    /// Each key's summary bucket (protocol rule 11), by number: hashed once for every client,
    /// so a resume of thousands of clients costs the generator additions, not hashes.
    buckets: Vec<usize>,
}

impl KeyTable {
    fn get(&self, key: &pb::ObjectKey) -> Option<u32> {
        self.ids.get(&key.namespace)?.get(&key.name).copied()
    }
}

impl Keys {
    /// The number of `key`, interning it on first sight.
    pub fn id(&self, key: &pb::ObjectKey) -> u32 {
        if let Some(id) = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            return id;
        }
        let mut table = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = table.get(key) {
            return id;
        }
        let id = u32::try_from(table.keys.len()).unwrap_or(u32::MAX);
        table.keys.push(key.clone());
        let bucket = splitproxy_proto::bucket_of(
            &key.namespace,
            &key.name,
            splitproxy_proto::SUMMARY_BUCKETS,
        );
        table.buckets.push(bucket);
        table
            .ids
            .entry(key.namespace.clone())
            .or_default()
            .insert(key.name.clone(), id);
        id
    }
}

/// What each encoded resource says, learned once for every client. The controller encodes a
/// resource once per state, so thousands of clients receive the same bytes: one client's
/// decode and digest serve the rest, looked up by the whole encoding (equal bytes, equal digest).
#[derive(Debug, Default)]
pub struct Encodings(Mutex<HashMap<Bytes, Arc<Encoded>, foldhash::fast::RandomState>>);

/// One encoded resource as a client holds it.
#[derive(Debug)]
struct Encoded {
    /// The resource's interned key.
    id: u32,
    /// Its digest (protocol rule 7).
    digest: u64,
    /// For endpoint sets, the addresses it has ready, decoded the first time a client looks for
    /// a churned change in it.
    ready: std::sync::OnceLock<Vec<String>>,
    /// The encoding, for that decode.
    bytes: Bytes,
}

impl Encodings {
    /// What `encoded` says; `None` when it does not decode as a keyed resource.
    fn learn(&self, keys: &Keys, encoded: &Bytes) -> Option<Arc<Encoded>> {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = known.get(encoded) {
            return Some(found.clone());
        }
        let key = <Keyed as prost::Message>::decode(encoded.as_ref())
            .ok()?
            .key?;
        // A copy of its own: a slice would keep the whole received message alive.
        let bytes = Bytes::copy_from_slice(encoded);
        let learned = Arc::new(Encoded {
            id: keys.id(&key),
            digest: splitproxy_proto::digest_of_encoding(&bytes),
            ready: std::sync::OnceLock::new(),
            bytes: bytes.clone(),
        });
        known.insert(bytes, learned.clone());
        Some(learned)
    }
}

impl Encoded {
    /// The endpoint addresses ready in this endpoint set.
    fn ready(&self) -> &[String] {
        self.ready.get_or_init(|| {
            <pb::ServiceEndpoints as prost::Message>::decode(self.bytes.as_ref())
                .map(|decoded| {
                    decoded
                        .ports
                        .into_iter()
                        .flat_map(|p| p.endpoints)
                        .filter(|e| e.conditions.as_ref().is_some_and(|c| c.ready))
                        .map(|e| e.address)
                        .collect()
                })
                .unwrap_or_default()
        })
    }
}

/// One churn step as the thin clients look for it: the endpoint `ip` of the Service numbered
/// `key` stopped being ready at `written`.
#[derive(Debug, Clone)]
pub struct Change {
    /// The Service's interned key.
    pub key: u32,
    /// The endpoint that became not ready.
    pub ip: String,
    /// When the change was written.
    pub written: std::time::Instant,
}

/// The changes made so far (the churner is the only writer), indexed by Service key.
#[derive(Debug, Default)]
pub struct Changes(RwLock<ChangeList>);

#[derive(Debug, Default)]
struct ChangeList {
    list: Vec<Change>,
    by_key: HashMap<u32, Vec<usize>>,
}

impl Changes {
    /// Adds the next change.
    pub fn push(&self, change: Change) {
        let mut changes = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let index = changes.list.len();
        changes.by_key.entry(change.key).or_default().push(index);
        changes.list.push(change);
    }

    /// The changes `endpoints` (an endpoint set as received) holds, by index.
    fn held_in(&self, endpoints: &Encoded) -> Vec<(usize, std::time::Instant)> {
        let changes = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let Some(indices) = changes.by_key.get(&endpoints.id) else {
            return Vec::new();
        };
        let ready = endpoints.ready();
        indices
            .iter()
            .map(|&index| (index, &changes.list[index]))
            .filter(|(_, change)| !ready.contains(&change.ip))
            .map(|(index, change)| (index, change.written))
            .collect()
    }
}

/// What one thin client saw; the run reads it while the client goes on.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// From the start of the run to the end of the first sync holding every Service.
    pub full_sync: Option<Duration>,
    /// Per change, in order: from writing it to the end of the first sync holding it, when the
    /// revision's ACK goes out.
    pub latencies: Vec<Option<Duration>>,
    /// The epoch of the controller whose revision was applied last.
    pub applied_epoch: String,
    /// Revisions with `reset` set received.
    pub resets: u64,
    /// Services and endpoint sets received (added or changed).
    pub upserts: u64,
}

/// What every thin client shares with the run.
#[derive(Debug)]
pub struct Shared {
    /// The interned keys.
    pub keys: Keys,
    /// What the resources received say, learned once.
    pub encodings: Encodings,
    /// The churn so far.
    pub changes: Changes,
    /// How many Services the whole cluster has (a full sync holds them all).
    pub services: usize,
    /// When the run started.
    pub started: std::time::Instant,
    /// The controller replicas' URLs, tried in turn.
    pub urls: Vec<String>,
    /// The agents' sync periods, for the min-sync timer.
    pub periods: SyncPeriods,
    /// How long applying one revision takes.
    pub sync_time: Duration,
    /// Whether the clients take endpoint sets in cluster form, as the agent does (protocol rule
    /// 15); without, they take them filtered for their node, as agents before the rule.
    pub derives_locality: bool,
}

/// One thin client's record, shared with the run.
pub type Recorder = Arc<Mutex<Record>>;

/// What a client holds between streams: digests by interned key, the resume point, and whether
/// the controller last subscribed to reads summaries.
#[derive(Debug, Default)]
struct Held {
    services: HashMap<u32, u64>,
    endpoints: HashMap<u32, u64>,
    resume: Option<pb::ResumePoint>,
    reads_summary: bool,
}

impl Held {
    /// What the subscribe lists or summarizes (protocol rules 7 and 11).
    fn presented(&self, keys: &Keys) -> (Vec<pb::ResourceDigest>, Option<pb::HeldSummary>) {
        if self.resume.is_none() {
            return (Vec::new(), None);
        }
        if !self.reads_summary {
            return (digests(keys, self), None);
        }
        let mut summary = pb::HeldSummary::with_buckets(splitproxy_proto::SUMMARY_BUCKETS);
        let table = keys.0.read().unwrap_or_else(PoisonError::into_inner);
        for (&id, &digest) in self.services.iter().chain(&self.endpoints) {
            let sum = &mut summary.bucket_sums[table.buckets[id as usize]];
            *sum = sum.wrapping_add(digest);
        }
        (Vec::new(), Some(summary))
    }
}

/// Who a thin client is: its node's name, and the address it connects from (each node has one
/// of its own, as agents on their nodes' IPs do, so the controller's limits per address meet
/// one node each).
#[derive(Debug, Clone)]
pub struct Node {
    /// The node's name, as it subscribes.
    pub name: String,
    /// The address it connects from.
    pub source: IpAddr,
}

/// Runs the thin client of `node` until the task is dropped, reconnecting as B1's hollow agents
/// do: doubling from [`MIN_BACKOFF`] to [`MAX_BACKOFF`] while failing, or the retry-after asked.
pub async fn run(node: Node, shared: Arc<Shared>, record: Recorder) {
    let mut held = Held::default();
    let mut timer = SyncTimer::new(shared.periods);
    let mut backoff = MIN_BACKOFF;
    // As an agent with a list of controllers: after a stream ends, the next one first.
    for (position, url) in shared.urls.iter().enumerate().cycle() {
        let mut progressed = false;
        let wait = match stream(
            url,
            &node,
            &shared,
            &record,
            &mut held,
            &mut timer,
            &mut progressed,
        )
        .await
        {
            // The wait asked is before that replica again: the next one in the list now.
            Err(StreamError::RetryAfter(_)) if position + 1 < shared.urls.len() => Duration::ZERO,
            Err(StreamError::RetryAfter(wait)) => wait,
            _ if progressed => {
                backoff = MIN_BACKOFF;
                backoff
            }
            _ => {
                backoff = (backoff * 2).min(MAX_BACKOFF);
                backoff
            }
        };
        tokio::time::sleep(wait.mul_f64(rand::random_range(0.5..=1.0))).await;
    }
}

/// Why a stream ended.
enum StreamError {
    /// The controller asked to be left alone this long (protocol rule 10).
    RetryAfter(Duration),
    /// Anything else: connect failures, a reset stream, a decode error.
    Other,
}

impl From<tonic::Status> for StreamError {
    fn from(status: tonic::Status) -> Self {
        splitproxy_proto::retry_after(&status).map_or(Self::Other, Self::RetryAfter)
    }
}

/// One stream: subscribe, then receive, "apply" and acknowledge revisions until it ends.
async fn stream(
    url: &str,
    node: &Node,
    shared: &Shared,
    record: &Recorder,
    held: &mut Held,
    timer: &mut SyncTimer,
    progressed: &mut bool,
) -> Result<(), StreamError> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(|_| StreamError::Other)?
        .connect_timeout(Duration::from_secs(5))
        .local_address(Some(node.source))
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|_| StreamError::Other)?;
    let (tx, rx) = mpsc::channel(4);
    let (listed, summary) = held.presented(&shared.keys);
    let subscribe = pb::Subscribe {
        node_name: node.name.clone(),
        capabilities: Some(pb::Capabilities {
            proxy_mode: pb::ProxyMode::Nftables as i32,
            ip_families: vec![pb::IpFamily::Ipv4 as i32],
            pipelining: true,
            // Digests are taken of the encodings as received, so sets come whole (rule 14).
            appended_endpoints: false,
            derives_locality: shared.derives_locality,
        }),
        resume: held.resume.clone(),
        held: listed,
        summary,
    };
    let _ = tx
        .send(pb::SyncRequest {
            kind: Some(pb::sync_request::Kind::Subscribe(subscribe)),
        })
        .await;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|_| StreamError::Other)?;
    let codec = tonic_prost::ProstCodec::<pb::SyncRequest, Response>::default();
    let response = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            http::uri::PathAndQuery::from_static(SYNC_PATH),
            codec,
        )
        .await?;
    held.reads_summary = response
        .metadata()
        .contains_key(splitproxy_proto::READS_SUMMARY);
    let mut inbound = response.into_inner();

    let mut revision = Revision::default();
    // Revisions complete and not yet synced: the newest's number and the revisions, applied to
    // what the client holds only by the sync, as the agent's fold is: a stream that ends first
    // leaves the client presenting what it last synced.
    let mut folded: Option<(u64, Vec<Revision>)> = None;
    loop {
        let sync_at = folded.as_ref().map(|_| {
            let now = Instant::now();
            timer.next_sync_allowed().map_or(now, |at| at.max(now))
        });
        let part = tokio::select! {
            biased;
            part = inbound.next() => part,
            () = sleep_until(sync_at) => {
                let Some((number, revisions)) = folded.take() else {
                    continue;
                };
                let started = Instant::now();
                tokio::time::sleep(shared.sync_time).await;
                timer.succeeded(started, Instant::now());
                // Counted as applied even if the ACK is lost with the stream: the node holds
                // the changes, and presents them in its digests when it resumes.
                for done in revisions {
                    let seen = done.apply(&shared.keys, held, record);
                    seen.applied(shared, held, record);
                }
                let ack = pb::Ack {
                    revision: number,
                    status: pb::AckStatus::Applied as i32,
                    reason: String::new(),
                };
                let request = pb::SyncRequest {
                    kind: Some(pb::sync_request::Kind::Ack(ack)),
                };
                if tx.send(request).await.is_err() {
                    return Err(StreamError::Other);
                }
                *progressed = true;
                continue;
            }
        };
        let Some(part) = part.transpose()? else {
            return Ok(());
        };
        if revision.take(shared, part) {
            let done = std::mem::take(&mut revision);
            let number = done.number;
            let (newest, revisions) = folded.get_or_insert_with(|| (number, Vec::new()));
            *newest = number;
            revisions.push(done);
        }
    }
}

/// Sleeps until `at`; forever when it is `None`.
/// The digests `held` presents, sorted by kind then key as rule 7 asks.
fn digests(keys: &Keys, held: &Held) -> Vec<pb::ResourceDigest> {
    let table = keys.0.read().unwrap_or_else(PoisonError::into_inner);
    let mut list: Vec<pb::ResourceDigest> = [
        (pb::ResourceKind::Service, &held.services),
        (pb::ResourceKind::Endpoints, &held.endpoints),
    ]
    .into_iter()
    .flat_map(|(kind, map)| {
        let table = &table;
        map.iter().map(move |(&id, &digest)| pb::ResourceDigest {
            kind: kind as i32,
            key: Some(table.keys[id as usize].clone()),
            sha256_prefix: digest,
        })
    })
    .collect();
    drop(table);
    list.sort_unstable_by(|a, b| (a.kind, sort_key(a)).cmp(&(b.kind, sort_key(b))));
    list
}

/// The key a digest sorts by, borrowed.
fn sort_key(digest: &pb::ResourceDigest) -> Option<(&str, &str)> {
    digest
        .key
        .as_ref()
        .map(|k| (k.namespace.as_str(), k.name.as_str()))
}

/// The parts of one revision gathered so far, reduced to keys and digests.
#[derive(Debug, Default)]
struct Revision {
    epoch: String,
    number: u64,
    reset: bool,
    services: Vec<(u32, u64)>,
    removed_services: Vec<u32>,
    endpoints: Vec<(u32, u64)>,
    removed_endpoints: Vec<u32>,
    /// The buckets whose resources it replaces (protocol rule 11).
    replaced: Option<pb::ReplacedBuckets>,
    /// The churned changes (by index) its endpoints hold, and when each was written.
    changes: Vec<(usize, std::time::Instant)>,
}

impl Revision {
    /// Adds one part; true when it completed the revision.
    fn take(&mut self, shared: &Shared, part: Response) -> bool {
        let keys = &shared.keys;
        self.epoch = part.controller_epoch;
        self.number = part.revision;
        self.reset |= part.reset;
        if part.replaced_buckets.is_some() {
            self.replaced = part.replaced_buckets;
        }
        let learn = |encoded| shared.encodings.learn(keys, encoded);
        for service in part.upserted_services.iter().filter_map(learn) {
            self.services.push((service.id, service.digest));
        }
        for endpoints in part.upserted_endpoints.iter().filter_map(learn) {
            self.endpoints.push((endpoints.id, endpoints.digest));
            self.changes.extend(shared.changes.held_in(&endpoints));
        }
        self.removed_services
            .extend(part.removed_services.iter().map(|k| keys.id(k)));
        self.removed_endpoints
            .extend(part.removed_endpoints.iter().map(|k| keys.id(k)));
        part.complete
    }

    /// Applies the revision to `held` and returns the changes it brings.
    fn apply(self, keys: &Keys, held: &mut Held, record: &Recorder) -> Seen {
        if self.reset {
            held.services.clear();
            held.endpoints.clear();
            record.lock().unwrap_or_else(PoisonError::into_inner).resets += 1;
        }
        if let Some(replaced) = self.replaced.as_ref().and_then(pb::ReplacedBuckets::to_set) {
            let table = keys.0.read().unwrap_or_else(PoisonError::into_inner);
            // Each key's bucket is known when the count is the one the clients summarize in:
            // hashing every key held, in every client, would be most of a resume's cost.
            let known = replaced.bucket_count() == splitproxy_proto::SUMMARY_BUCKETS;
            let outside = |id: &u32| {
                let id = *id as usize;
                if known {
                    return !replaced.holds(table.buckets[id]);
                }
                let key = &table.keys[id];
                !replaced.contains(&key.namespace, &key.name)
            };
            held.services.retain(|id, _| outside(id));
            held.endpoints.retain(|id, _| outside(id));
        }
        for id in self.removed_services {
            held.services.remove(&id);
        }
        for id in self.removed_endpoints {
            held.endpoints.remove(&id);
        }
        let upserts = self.services.len() + self.endpoints.len();
        held.services.extend(self.services);
        held.endpoints.extend(self.endpoints);
        held.resume = Some(pb::ResumePoint {
            controller_epoch: self.epoch.clone(),
            revision: self.number,
        });
        Seen {
            epoch: self.epoch,
            upserts: upserts as u64,
            changes: self.changes,
        }
    }
}

/// What a revision brought, recorded once its sync is done.
struct Seen {
    epoch: String,
    upserts: u64,
    changes: Vec<(usize, std::time::Instant)>,
}

impl Seen {
    fn applied(self, shared: &Shared, held: &Held, record: &Recorder) {
        let now = std::time::Instant::now();
        let mut record = record.lock().unwrap_or_else(PoisonError::into_inner);
        record.upserts += self.upserts;
        record.applied_epoch = self.epoch;
        if record.full_sync.is_none() && held.services.len() >= shared.services {
            record.full_sync = Some(now - shared.started);
        }
        for (index, written) in self.changes {
            if record.latencies.len() <= index {
                record.latencies.resize(index + 1, None);
            }
            record.latencies[index].get_or_insert(now.saturating_duration_since(written));
        }
    }
}

#[cfg(test)]
mod tests;
