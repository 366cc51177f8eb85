//! The node view stream server: one task per connected agent that sends the difference between
//! what the agent holds and its node's current view: one revision in flight at a time, or up to
//! eight to an agent that pipelines (protocol rule 12). First revisions, the expensive ones, take
//! turns.

use crate::{
    admission::ConnectionInfo,
    agents::{Connection, Ending},
    auth::{AgentAuth, Refusal},
    cause,
    cluster::ClusterState,
    metrics::Metrics,
    shares,
    view::{Delta, EndpointForm, Held, NodeView},
    wire::{
        self, Encodings,
        server::node_view_service_server::{NodeViewService, NodeViewServiceServer},
    },
};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use prost::Message;
use splitproxy_proto::v1alpha1::{self as pb, sync_request};
use std::{
    collections::{HashMap, VecDeque},
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

/// Largest encoded size of one message's resources; bigger revisions are split (protocol rule 3),
/// and so are bigger endpoint sets, for agents that take them in pieces (rule 14), so no message
/// grows with the cluster or with one Service. What still goes whole is a `Service`, which
/// etcd's request limit bounds (1.5 MiB by default) well below the 4 MiB an agent takes. Small,
/// because each stream's encoder keeps a buffer as large as the largest message it sent: at
/// 256 KiB, the resets of 5,000 agents left about 1 GB behind.
const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// The largest request an agent may send. A subscribe lists a digest of every resource the agent
/// holds, about 55 bytes each: gRPC's default 4 MiB stops at some 35,000 Services, 16 MiB at about
/// 150,000. Acks are a few bytes.
const MAX_SUBSCRIBE_BYTES: usize = 16 << 20;
/// Digests a subscribe may list beyond twice the cluster's resources (what an agent that was
/// away while many were removed may still hold) before they are dropped for a reset: no
/// stream keeps more than the cluster could have given it.
const SPARE_HELD_DIGESTS: usize = 1024;
/// How many nodes' first revisions (a reset, or a delta from what the agent presented) are
/// computed and sent at once: when a controller starts, every agent asks at once. Each holds its
/// messages until its agent has taken them; the cluster's entries in them are shared encodings,
/// the node's own are its alone. 64 did not make a 5,000-node restart any faster in B4.
const CONCURRENT_FIRST_REVISIONS: usize = 8;
/// How long a first revision keeps its slot while its agent reads slowly; after that it goes on
/// without one, so a stalled agent never holds up the others.
const FIRST_REVISION_SLOT: Duration = Duration::from_secs(10);
/// How many revisions may be in flight to an agent that pipelines (protocol rule 12). The agent
/// answers only after its next sync, so every change published while it waits for that sync
/// needs a revision of its own to join it: with eight, changes up to eight per min-sync-period
/// wait at most one period, as under kube-proxy; beyond that rate they are compacted as under
/// rule 6. Each revision in flight holds a view that shares nearly everything with the next.
const PIPELINED_REVISIONS: usize = 8;
/// How long a revision may go unanswered, or unread, before its stream is ended (Calico Typha's
/// `MaxFallBehindSecs` default): a stream whose agent stopped reading or acknowledging would
/// otherwise hold its views, its task and its place among the replica's nodes forever. The agent
/// comes back and resumes from what it holds.
pub const FALL_BEHIND_LIMIT: Duration = Duration::from_secs(300);
/// How long a view an agent rejected waits before it is sent again as it is, the first time;
/// each rejection in a row doubles it, up to [`LONGEST_RESEND_OF_REJECTED`]. A changed view goes
/// at once. Not sooner: the agent keeps its last good rules, and a refusal that stays (a kernel
/// that refuses a rule) would otherwise cost the node a full sync every few seconds; not never: a
/// refusal may pass (a lock held, a module loading), and the agent retries the kernel itself
/// meanwhile.
const FIRST_RESEND_OF_REJECTED: Duration = Duration::from_secs(30);
/// The longest wait before a rejected view is sent again as it is.
const LONGEST_RESEND_OF_REJECTED: Duration = Duration::from_secs(300);
/// How long a shed agent waits before it subscribes to the next replica it knows: not at all,
/// as it is not shed for a fault.
const RETRY_AFTER_SHED: Duration = Duration::ZERO;
/// How long an agent refused by a replica shutting down waits before it tries that replica
/// again: it tries the others first, and this one is gone within seconds.
const RETRY_WHILE_SHUTTING_DOWN: Duration = Duration::from_secs(1);
/// How long an agent refused before the first complete read of the cluster waits to come back.
/// The read takes seconds in a large cluster; meanwhile a refused stream costs the controller
/// nothing, where a parked one would hold the agent's digests and a task.
const RETRY_BEFORE_FIRST_READ: Duration = Duration::from_secs(2);

/// What each node last acknowledged, kept across streams so a reconnecting agent gets a delta.
#[derive(Debug, Default)]
struct Acknowledged {
    by_node: Mutex<HashMap<String, Remembered>>,
}

/// A node's acknowledged revision and view, and since when no stream of it has been open.
#[derive(Debug)]
struct Remembered {
    revision: u64,
    view: Arc<NodeView>,
    /// When the node's last stream here ended; `None` while one is open.
    streamless_since: Option<tokio::time::Instant>,
}

impl Acknowledged {
    fn get(&self, node: &str) -> Option<(u64, Arc<NodeView>)> {
        let by_node = self.by_node.lock().ok()?;
        let remembered = by_node.get(node)?;
        Some((remembered.revision, Arc::clone(&remembered.view)))
    }

    fn set(&self, node: &str, revision: u64, view: Arc<NodeView>) {
        if let Ok(mut by_node) = self.by_node.lock() {
            let remembered = Remembered {
                revision,
                view,
                streamless_since: None,
            };
            by_node.insert(node.to_owned(), remembered);
        }
    }

    /// Notes that `node`'s stream ended.
    fn left(&self, node: &str) {
        if let Ok(mut by_node) = self.by_node.lock()
            && let Some(remembered) = by_node.get_mut(node)
        {
            remembered.streamless_since = Some(tokio::time::Instant::now());
        }
    }

    /// Forgets the nodes `cluster` no longer has, and the views kept for them.
    fn forget_departed(&self, cluster: &ClusterState) {
        if let Ok(mut by_node) = self.by_node.lock() {
            by_node.retain(|node, _| cluster.nodes.contains_key(node));
        }
    }

    /// Forgets the nodes without a stream here for `limit`: their views pin the cluster states
    /// they were computed from, and an agent that comes back after that long resumes from its
    /// summary at little cost.
    fn forget_streamless(&self, limit: Duration) {
        if let Ok(mut by_node) = self.by_node.lock() {
            by_node.retain(|_, remembered| {
                remembered
                    .streamless_since
                    .is_none_or(|since| since.elapsed() < limit)
            });
        }
    }

    #[cfg(test)]
    fn nodes(&self) -> usize {
        self.by_node.lock().map_or(0, |by_node| by_node.len())
    }
}

/// The cluster state as published by the source: `None` until the source has read the whole
/// cluster once, so no agent is ever sent a view of a half-read cluster.
pub type Published = Option<Arc<ClusterState>>;

/// The `NodeViewService` implementation.
#[derive(Debug, Clone)]
pub struct FanOut {
    epoch: String,
    cluster: watch::Receiver<Published>,
    acknowledged: Arc<Acknowledged>,
    metrics: Metrics,
    auth: AgentAuth,
    /// Slots for first revisions, [`CONCURRENT_FIRST_REVISIONS`] of them.
    first_revisions: Arc<Semaphore>,
    /// How long a revision may go unanswered before its stream is ended.
    fall_behind_limit: Duration,
}

impl FanOut {
    /// A server streaming views of the cluster states published on `cluster`.
    #[must_use]
    pub fn new(cluster: watch::Receiver<Published>) -> Self {
        Self {
            epoch: format!("{:016x}", rand::random::<u64>()),
            cluster,
            acknowledged: Arc::default(),
            metrics: Metrics::default(),
            auth: AgentAuth::Open,
            first_revisions: Arc::new(Semaphore::new(CONCURRENT_FIRST_REVISIONS)),
            fall_behind_limit: FALL_BEHIND_LIMIT,
        }
    }

    /// The same server, ending a stream whose agent leaves a revision unanswered for `limit`.
    #[must_use]
    pub fn with_fall_behind_limit(mut self, limit: Duration) -> Self {
        self.fall_behind_limit = limit;
        self
    }

    /// The same server, letting in only agents `auth` identifies, each for its own node.
    #[must_use]
    pub fn with_auth(mut self, auth: AgentAuth) -> Self {
        self.auth = auth;
        self
    }

    /// The same server, recording its streams in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The gRPC service, taking subscribes up to [`MAX_SUBSCRIBE_BYTES`].
    #[must_use]
    pub fn into_service(self) -> NodeViewServiceServer<Self> {
        NodeViewServiceServer::new(self).max_decoding_message_size(MAX_SUBSCRIBE_BYTES)
    }

    /// Forgets what the nodes that leave the cluster acknowledged, as each state is published,
    /// and what those without a stream here for the fall-behind limit did, checked as often: a
    /// node that comes back resumes from its digests or summary. Runs until the source stops.
    pub async fn forget_departed_nodes(&self) {
        let mut cluster = self.cluster.clone();
        let mut nodes_seen = None;
        let mut sweep = tokio::time::interval(self.fall_behind_limit);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = cluster.changed() => if changed.is_err() { return },
                _ = sweep.tick() => {
                    self.acknowledged.forget_streamless(self.fall_behind_limit);
                    continue;
                }
            }
            let published = cluster.borrow_and_update().clone();
            let Some(published) = published else {
                continue;
            };
            // States whose Nodes did not change share their map: nothing to walk.
            if nodes_seen
                .as_ref()
                .is_some_and(|seen| Arc::ptr_eq(seen, &published.nodes))
            {
                continue;
            }
            self.acknowledged.forget_departed(&published);
            nodes_seen = Some(Arc::clone(&published.nodes));
        }
    }

    /// Keeps this replica within its share of the nodes as `replicas` (the count of ready
    /// replicas) and the cluster's nodes change, shedding its oldest streams one every
    /// [`shares::SHED_INTERVAL`] while it holds more (protocol rule 13). Runs until the source
    /// stops.
    pub async fn share_nodes(&self, mut replicas: watch::Receiver<usize>) {
        let mut cluster = self.cluster.clone();
        loop {
            let nodes = cluster
                .borrow_and_update()
                .as_ref()
                .map_or(0, |published| published.nodes.len());
            let count = *replicas.borrow_and_update();
            let limit = shares::limit(nodes, count);
            if self.metrics.agents.set_limit(limit) {
                tracing::info!(
                    replicas = count,
                    nodes,
                    limit,
                    "this replica's share of the nodes"
                );
                let gauge = limit.map_or(0, |limit| i64::try_from(limit).unwrap_or(i64::MAX));
                self.metrics.node_share.set(gauge);
            }
            while self.metrics.agents.shed_oldest() {
                self.metrics.shed_streams.inc();
                tokio::time::sleep(shares::SHED_INTERVAL).await;
                let recount = cluster.has_changed().unwrap_or(false)
                    || replicas.has_changed().unwrap_or(false);
                if recount {
                    break;
                }
            }
            tokio::select! {
                changed = cluster.changed() => if changed.is_err() { return },
                changed = replicas.changed() => if changed.is_err() { return },
            }
        }
    }

    /// This controller process's epoch, as sent in every response.
    #[must_use]
    pub fn epoch(&self) -> &str {
        &self.epoch
    }
}

impl FanOut {
    /// Logs and counts a refused stream; the returned status tells the agent why.
    fn refuse(&self, peer: &str, refusal: Refusal) -> Status {
        tracing::warn!(%peer, reason = %refusal, "refused an agent stream");
        self.metrics.count_refusal(refusal.reason());
        refusal.into()
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<wire::SyncResponse, Status>> + Send>>;

#[tonic::async_trait]
impl NodeViewService for FanOut {
    type SyncStream = ResponseStream;

    async fn sync(
        &self,
        request: Request<Streaming<pb::SyncRequest>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        let address = (connection.as_ref().map(|c| c.0.peer())).or_else(|| request.remote_addr());
        let peer = address.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        // Before the credential's review: refusals that cost nothing.
        if self.cluster.borrow().is_none() {
            self.metrics.count_refusal("not_ready");
            return Err(not_read_yet());
        }
        if self.metrics.agents.draining() {
            self.metrics.count_refusal("shutting_down");
            return Err(shutting_down(RETRY_WHILE_SHUTTING_DOWN));
        }
        let identity = self
            .auth
            .authenticate(request.metadata(), address.map(|a| a.ip()))
            .await
            .map_err(|refusal| self.refuse(&peer, refusal))?;
        let mut inbound = request.into_inner();
        let subscribe = match inbound.next().await {
            Some(Ok(pb::SyncRequest {
                kind: Some(sync_request::Kind::Subscribe(s)),
            })) => s,
            Some(Err(status)) => return Err(status),
            _ => {
                return Err(Status::invalid_argument(
                    "the first message must be a subscribe",
                ));
            }
        };
        if subscribe.node_name.is_empty() {
            return Err(Status::invalid_argument("subscribe carries no node name"));
        }
        identity
            .admit(&subscribe.node_name)
            .map_err(|refusal| self.refuse(&peer, refusal))?;
        if let Some(connection) = &connection {
            connection.0.authenticated();
        }
        let (tx, rx) = mpsc::channel(4);
        let span = tracing::info_span!("agent_stream", node = %subscribe.node_name, %peer);
        let mut stream = AgentStream::new(self, subscribe, &peer, tx);
        stream.credential_expires = identity.expires;
        tokio::spawn(stream.run(inbound).instrument(span));
        let mut response = Response::new(
            Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)) as Self::SyncStream
        );
        response.metadata_mut().insert(
            splitproxy_proto::READS_SUMMARY,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        Ok(response)
    }
}

/// One agent's stream.
struct AgentStream {
    node: String,
    epoch: String,
    cluster: watch::Receiver<Published>,
    acknowledged: Arc<Acknowledged>,
    tx: mpsc::Sender<Result<wire::SyncResponse, Status>>,
    /// The controller's slots for first revisions.
    first_revisions: Arc<Semaphore>,
    /// The last revision number used on this node.
    revision: u64,
    /// The revision the agent acknowledged last and its view; `None` until it holds a state
    /// from this controller.
    acked: Option<(u64, Arc<NodeView>)>,
    /// What the agent said it holds, when that is not a state of this controller: the first
    /// revision is a delta from it rather than a reset (protocol rules 7 and 11).
    held: Option<Arc<Held>>,
    /// The revisions sent and not yet answered, oldest first.
    in_flight: VecDeque<InFlight>,
    /// How many revisions may be in flight: one, or [`PIPELINED_REVISIONS`] when the agent
    /// pipelines.
    max_in_flight: usize,
    /// How the agent takes endpoint sets too big for one message.
    endpoint_sets: EndpointSets,
    /// The form the agent takes endpoint sets in.
    endpoint_form: EndpointForm,
    /// The last view the agent rejected, while no view was applied since.
    rejected: Option<RejectedView>,
    /// The stream's record for metrics and inspection, which also tells it when it is shed;
    /// removed when the stream ends.
    connection: Connection,
    /// The changes seen since the last revision was sent, for the next one's trace.
    changes: cause::Pending,
    /// How long a revision may go unanswered before the stream is ended.
    fall_behind_limit: Duration,
    /// When the agent's credential expires: the stream ends then, and the agent comes back
    /// with its rotated credential (and resumes).
    credential_expires: Option<std::time::SystemTime>,
}

impl AgentStream {
    fn new(
        server: &FanOut,
        mut subscribe: pb::Subscribe,
        peer: &str,
        tx: mpsc::Sender<Result<wire::SyncResponse, Status>>,
    ) -> Self {
        let capabilities = subscribe.capabilities.clone().unwrap_or_default();
        let endpoint_form = if capabilities.derives_locality {
            EndpointForm::Cluster
        } else {
            EndpointForm::Filtered
        };
        let remembered = server.acknowledged.get(&subscribe.node_name);
        let resumes = match (&subscribe.resume, &remembered) {
            (Some(resume), Some((revision, view))) => {
                resume.controller_epoch == server.epoch
                    && resume.revision == *revision
                    && view.form() == endpoint_form
            }
            _ => false,
        };
        let endpoint_sets = if capabilities.appended_endpoints {
            EndpointSets::InPieces
        } else {
            EndpointSets::Whole
        };
        let resumed_revision = remembered
            .as_ref()
            .filter(|_| resumes)
            .map_or(0, |(r, _)| *r);
        let revision = remembered.as_ref().map_or(0, |(r, _)| *r);
        let acked = remembered.filter(|_| resumes);
        let most_held = (server.cluster.borrow().as_deref()).map_or(0, |cluster| {
            2 * (cluster.services.len() + cluster.endpoints.len())
        }) + SPARE_HELD_DIGESTS;
        if subscribe.held.len() > most_held {
            tracing::warn!(
                digests = subscribe.held.len(),
                most_held,
                "agent presents more resources than the cluster could have left it; sending a reset"
            );
            subscribe.held = Vec::new();
        }
        let held = if resumes {
            None
        } else {
            Held::from_subscribe(&mut subscribe).map(Arc::new)
        };
        server
            .metrics
            .count_subscription(resumed_from(acked.is_some(), held.as_deref()));
        let connection = Connection::open(
            &server.metrics.agents,
            &server.metrics.streams,
            &subscribe.node_name,
            peer,
            capabilities.proxy_mode,
            resumed_revision,
        );
        Self {
            node: subscribe.node_name.clone(),
            epoch: server.epoch.clone(),
            cluster: server.cluster.clone(),
            acknowledged: Arc::clone(&server.acknowledged),
            tx,
            first_revisions: Arc::clone(&server.first_revisions),
            revision,
            acked,
            held,
            in_flight: VecDeque::new(),
            max_in_flight: if capabilities.pipelining {
                PIPELINED_REVISIONS
            } else {
                1
            },
            endpoint_sets,
            endpoint_form,
            rejected: None,
            connection,
            changes: cause::Pending::default(),
            fall_behind_limit: server.fall_behind_limit,
            credential_expires: None,
        }
    }

    async fn run(mut self, mut inbound: Streaming<pb::SyncRequest>) {
        tracing::info!(
            resumed = self.acked.is_some(),
            from_digests = self.held.is_some(),
            "agent subscribed"
        );
        // Streams are opened only once a state is published (protocol rule 10).
        let known = self
            .cluster
            .borrow()
            .as_ref()
            .is_some_and(|cluster| cluster.nodes.contains_key(&self.node));
        if !known {
            tracing::warn!("agent's node is not a known Node object");
        }
        let credential_expires = self.credential_expires.map(|at| {
            let left = at
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            tokio::time::Instant::now() + left
        });
        let mut dirty = true;
        loop {
            if dirty && self.in_flight.len() < self.in_flight_limit() {
                dirty = false;
                if self.send_next().await.is_err() {
                    break;
                }
            }
            let unanswered_until = self.unanswered_until();
            tokio::select! {
                changed = self.cluster.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    self.connection.observed_change();
                    if let Some(cluster) = self.cluster.borrow().as_deref() {
                        self.changes.note(&cluster.cause);
                    }
                    dirty = true;
                }
                message = inbound.next() => match message {
                    Some(Ok(pb::SyncRequest { kind: Some(sync_request::Kind::Ack(ack)) })) => {
                        // After a NACK, a view that differs from the one rejected goes at once.
                        dirty |= self.on_ack(&ack);
                    }
                    Some(Ok(_)) => tracing::warn!("ignoring a second subscribe on the stream"),
                    Some(Err(status)) => {
                        tracing::info!(%status, "agent stream failed");
                        break;
                    }
                    None => {
                        tracing::info!("agent closed the stream");
                        break;
                    }
                },
                () = sleep_until(self.rejected.as_ref().and_then(RejectedView::held_back_until)) => {
                    if let Some(rejected) = &mut self.rejected {
                        rejected.held_back = false;
                    }
                    dirty = true;
                }
                ending = self.connection.ending() => {
                    let status = match ending {
                        Ending::Shed => {
                            tracing::info!("shedding the stream: this replica holds more than its share of the nodes");
                            shed()
                        }
                        Ending::Superseded => {
                            tracing::info!("ending the stream: a newer stream of this node opened");
                            Status::aborted("a newer stream of this node replaced this one")
                        }
                        Ending::Draining => {
                            tracing::info!("sending the agent to another replica: this one is shutting down");
                            shutting_down(Duration::ZERO)
                        }
                    };
                    let _ = self.tx.send(Err(status)).await;
                    break;
                }
                () = sleep_until(unanswered_until) => {
                    self.fall_behind();
                    break;
                }
                () = sleep_until(credential_expires) => {
                    tracing::info!("agent credential expired; closing the stream");
                    let expired = Status::unauthenticated("credential expired; reconnect with a fresh one");
                    let _ = self.tx.send(Err(expired)).await;
                    break;
                }
            }
        }
        self.acknowledged.left(&self.node);
    }

    /// Handles an ACK or NACK; returns whether the revision was rejected. An ACK answers every
    /// revision up to the one it names; a NACK drops every revision in flight, which the
    /// agent dropped too (protocol rule 12).
    fn on_ack(&mut self, ack: &pb::Ack) -> bool {
        let Some(position) = self
            .in_flight
            .iter()
            .position(|sent| sent.revision == ack.revision)
        else {
            tracing::warn!(revision = ack.revision, "ack for a revision not in flight");
            return false;
        };
        let revision = ack.revision;
        if ack.status == pb::AckStatus::Applied as i32 {
            tracing::debug!(revision, "revision applied");
            let mut answered = self.in_flight.drain(..=position);
            let newest = answered.next_back();
            answered.for_each(|folded| folded.answer("applied"));
            let Some(newest) = newest else {
                return false;
            };
            newest.answer("applied");
            self.acknowledged
                .set(&self.node, revision, Arc::clone(&newest.view));
            self.acked = Some((revision, newest.view));
            self.held = None;
            self.rejected = None;
            self.connection.acked(revision, self.in_flight.is_empty());
            false
        } else {
            let view = Arc::clone(&self.in_flight[position].view);
            for dropped in self.in_flight.drain(..) {
                dropped.answer("rejected");
            }
            let rejected = RejectedView::after(self.rejected.take(), view);
            tracing::warn!(
                revision,
                reason = %ack.reason,
                resend_in_s = rejected.backoff.as_secs(),
                "agent rejected revision; a changed view goes at once, this one again after a back-off"
            );
            self.rejected = Some(rejected);
            self.connection.rejected(&ack.reason);
            true
        }
    }

    /// Sends the difference between the last view sent (or acknowledged, with nothing in
    /// flight) and the current one, if any.
    async fn send_next(&mut self) -> Result<(), mpsc::error::SendError<()>> {
        let base = self
            .in_flight
            .back()
            .map(|sent| (sent.revision, Arc::clone(&sent.view)))
            .or_else(|| self.acked.clone());
        // The first revision waits for a slot before it looks at the cluster, so it is computed
        // from the newest state.
        let mut slot = match base {
            // An agent that gave up waiting (its stream reset) leaves the queue rather than
            // have a view computed for nobody when its turn comes.
            None => tokio::select! {
                permit = Arc::clone(&self.first_revisions).acquire_owned() => permit.ok(),
                () = self.tx.closed() => return Err(mpsc::error::SendError(())),
            },
            Some(_) => None,
        };
        let Some(cluster) = self.cluster.borrow_and_update().clone() else {
            return Ok(());
        };
        if self.holds_back(&cluster) {
            // Behind, holding neither this view nor any later one.
            self.connection.view_computed(true);
            return Ok(());
        }
        let reset = base.is_none() && self.held.is_none();
        let (view, mut messages) = match &base {
            Some((base_revision, base_view)) => {
                let (view, delta) = base_view.advance(&cluster, &self.node);
                let unchanged = delta.is_empty();
                self.connection
                    .view_computed(!unchanged || !self.in_flight.is_empty());
                if unchanged {
                    return Ok(());
                }
                let mut messages = split(
                    delta,
                    &self.epoch,
                    self.revision + 1,
                    false,
                    &cluster.encodings,
                    self.endpoint_sets,
                );
                for message in &mut messages {
                    message.base_revision = *base_revision;
                }
                (view, messages)
            }
            None => {
                // A whole view's work: off the async workers, which meanwhile go on reading
                // subscribes and answering every agent's keepalive pings.
                let first = FirstRevision {
                    cluster: Arc::clone(&cluster),
                    node: self.node.clone(),
                    held: self.held.clone(),
                    epoch: self.epoch.clone(),
                    revision: self.revision + 1,
                    endpoint_sets: self.endpoint_sets,
                    endpoint_form: self.endpoint_form,
                };
                let computed = tokio::task::spawn_blocking(move || first.compute())
                    .await
                    .map_err(|_| mpsc::error::SendError(()))?;
                self.connection.view_computed(true);
                computed
            }
        };
        let view = Arc::new(view);
        self.revision += 1;
        tracing::debug!(revision = self.revision, reset, "sending revision");
        let span = self.revision_span(&cluster, reset);
        // Not held across the sends below: an agent that stops reading parks this task there,
        // and would otherwise pin a whole cluster state that the source has long replaced.
        drop(cluster);
        if let Some(first) = messages.first_mut() {
            first.trace_context = splitproxy_telemetry::trace::context_of(&span);
        }
        self.connection.sent(self.revision, &messages);
        let sent_at = tokio::time::Instant::now();
        let slot_until = sent_at + FIRST_REVISION_SLOT;
        for message in messages {
            let room = self.room(&mut slot, slot_until);
            let Ok(room) = tokio::time::timeout_at(sent_at + self.fall_behind_limit, room).await
            else {
                self.fall_behind();
                return Err(mpsc::error::SendError(()));
            };
            room?.send(Ok(message));
        }
        self.in_flight.push_back(InFlight {
            revision: self.revision,
            view,
            span,
            sent_at,
        });
        Ok(())
    }

    /// How many revisions may be in flight now: while every first-revision slot is taken (a
    /// restarted controller's agents all resuming at once), one, so the changes meanwhile go to
    /// the agents already served as one delta per sync of theirs instead of one per change, and
    /// the controller's time goes to the agents still waiting; [`Self::max_in_flight`] otherwise.
    fn in_flight_limit(&self) -> usize {
        if self.first_revisions.available_permits() == 0 {
            1
        } else {
            self.max_in_flight
        }
    }

    /// When the oldest revision in flight has gone unanswered too long; `None` with none.
    fn unanswered_until(&self) -> Option<tokio::time::Instant> {
        let oldest = self.in_flight.front()?;
        Some(oldest.sent_at + self.fall_behind_limit)
    }

    /// Ends the stream of an agent that fell behind: tells it so if its stream has room (it may
    /// have stopped reading), and counts it.
    fn fall_behind(&self) {
        tracing::warn!(
            limit_s = self.fall_behind_limit.as_secs(),
            "ending the stream: the agent left a revision unanswered past the fall-behind limit"
        );
        self.connection.fell_behind();
        let status = unavailable(
            "the agent fell behind; subscribe again to resume",
            Duration::ZERO,
        );
        let _ = self.tx.try_send(Err(status));
    }

    /// Whether the next view is the one the agent rejected last, not to be sent again before
    /// its back-off passes: then it is held back until then.
    fn holds_back(&mut self, cluster: &ClusterState) -> bool {
        let Some(rejected) = &mut self.rejected else {
            return false;
        };
        if !self.in_flight.is_empty() || tokio::time::Instant::now() >= rejected.resend_at {
            return false;
        }
        let (_, since_rejected) = rejected.view.advance(cluster, &self.node);
        rejected.held_back = since_rejected.is_empty();
        rejected.held_back
    }

    /// Waits for room for one more message on the stream; gives `slot` up once `slot_until`
    /// passes while the agent is not reading.
    async fn room(
        &self,
        slot: &mut Option<OwnedSemaphorePermit>,
        slot_until: tokio::time::Instant,
    ) -> Result<mpsc::Permit<'_, Result<wire::SyncResponse, Status>>, mpsc::error::SendError<()>>
    {
        if slot.is_some() {
            match tokio::time::timeout_at(slot_until, self.tx.reserve()).await {
                Ok(room) => return room.map_err(|_| mpsc::error::SendError(())),
                Err(_) => {
                    tracing::info!("agent reads its first revision slowly; giving its slot up");
                    *slot = None;
                }
            }
        }
        self.tx
            .reserve()
            .await
            .map_err(|_| mpsc::error::SendError(()))
    }
}

impl AgentStream {
    /// The span of the next revision, from sending to the agent's answer: a child of the
    /// newest change's trace, linking the older changes merged into it (see `crate::cause`).
    fn revision_span(&mut self, cluster: &ClusterState, reset: bool) -> tracing::Span {
        let links = self.changes.take_links(&cluster.cause);
        let span = tracing::info_span!(
            "revision",
            node = %self.node,
            revision = self.revision,
            reset,
            merged_changes = links.len() + 1,
            result = tracing::field::Empty,
        );
        splitproxy_telemetry::trace::continue_trace(&span, cluster.cause.0.as_ref());
        splitproxy_telemetry::trace::link_to(&span, &links);
        span
    }
}

/// The view an agent rejected last, and when it may be sent again as it is.
struct RejectedView {
    view: Arc<NodeView>,
    /// The wait before it is sent again: [`FIRST_RESEND_OF_REJECTED`], doubled for each
    /// rejection in a row.
    backoff: Duration,
    resend_at: tokio::time::Instant,
    /// Whether the stream has a view equal to it to send, waiting for `resend_at`.
    held_back: bool,
}

impl RejectedView {
    /// The record of `view`'s rejection, the one after `previous` when the agent applied
    /// nothing in between.
    fn after(previous: Option<Self>, view: Arc<NodeView>) -> Self {
        let backoff = previous.map_or(FIRST_RESEND_OF_REJECTED, |previous| {
            (previous.backoff * 2).min(LONGEST_RESEND_OF_REJECTED)
        });
        Self {
            view,
            backoff,
            resend_at: tokio::time::Instant::now() + backoff,
            held_back: false,
        }
    }

    /// When the view held back may be sent; `None` while none is held back.
    fn held_back_until(&self) -> Option<tokio::time::Instant> {
        self.held_back.then_some(self.resend_at)
    }
}

/// A revision sent and not yet answered.
struct InFlight {
    revision: u64,
    /// The view it brings the agent to.
    view: Arc<NodeView>,
    /// Its span, open from sending until the agent's answer.
    span: tracing::Span,
    /// When its sending started.
    sent_at: tokio::time::Instant,
}

impl InFlight {
    /// Closes the revision's span with the agent's answer.
    fn answer(&self, result: &'static str) {
        self.span.record("result", result);
    }
}

/// What an agent resumed from, as `splitproxy_controller_subscriptions_total` labels it.
fn resumed_from(acknowledged: bool, held: Option<&Held>) -> &'static str {
    match held {
        _ if acknowledged => "acknowledged",
        Some(Held::Summary(_)) => "summary",
        Some(Held::Digests(_)) => "digests",
        None => "none",
    }
}

/// What a node's first revision on a stream is computed from.
struct FirstRevision {
    cluster: Arc<ClusterState>,
    node: String,
    /// What the agent presented; `None` for a reset.
    held: Option<Arc<Held>>,
    epoch: String,
    revision: u64,
    endpoint_sets: EndpointSets,
    endpoint_form: EndpointForm,
}

impl FirstRevision {
    /// The node's view and the messages bringing the agent to it: a reset, or a delta from
    /// what it presented (protocol rules 7 and 11).
    fn compute(self) -> (NodeView, Vec<wire::SyncResponse>) {
        let view = NodeView::for_node(&self.cluster, &self.node, self.endpoint_form);
        let shared = &self.cluster.digests;
        let (delta, reset) = match self.held.as_deref() {
            Some(Held::Digests(held)) => (Delta::from_digests(held, &view, shared), false),
            Some(Held::Summary(sums)) => (Delta::from_summary(sums, &view, shared), false),
            None => (Delta::between(&NodeView::default(), &view), true),
        };
        if let Some(replaced) = &delta.replaced_buckets {
            tracing::debug!(
                buckets = replaced.buckets.len(),
                "replacing differing buckets"
            );
        }
        let messages = split(
            delta,
            &self.epoch,
            self.revision,
            reset,
            &self.cluster.encodings,
            self.endpoint_sets,
        );
        (view, messages)
    }
}

/// How an agent takes an endpoint set bigger than [`MAX_MESSAGE_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointSets {
    /// In one message, as agents older than protocol rule 14 do.
    Whole,
    /// In pieces of at most [`MAX_MESSAGE_BYTES`] (rule 14).
    InPieces,
}

/// One resource change of a revision, for splitting; upserts as their encodings.
enum Item {
    RemovedService(pb::ObjectKey),
    RemovedEndpoints(pb::ObjectKey),
    Service(Bytes),
    Endpoints(Bytes),
    AppendedEndpoints(Bytes),
}

impl Item {
    /// Its size in a message, field tag and length prefix included.
    fn encoded_len(&self) -> usize {
        let body = match self {
            Self::RemovedService(key) | Self::RemovedEndpoints(key) => key.encoded_len(),
            Self::Service(encoded)
            | Self::Endpoints(encoded)
            | Self::AppendedEndpoints(encoded) => encoded.len(),
        };
        1 + prost::length_delimiter_len(body) + body
    }

    /// The items upserting `set`: its encoding, or its pieces when `sets` allows them and it is
    /// too big for one message.
    fn endpoints(
        set: &Arc<pb::ServiceEndpoints>,
        encodings: &Encodings,
        sets: EndpointSets,
    ) -> Vec<Self> {
        let whole = encodings.of(set);
        if sets == EndpointSets::Whole || whole.len() <= MAX_MESSAGE_BYTES {
            return vec![Self::Endpoints(whole)];
        }
        // A piece's entry overhead must fit the budget too.
        let budget = MAX_MESSAGE_BYTES - 6;
        let pieces = encodings.pieces_of(set, budget);
        let (first, rest) = pieces
            .split_first()
            .map_or((None, &[][..]), |(f, r)| (Some(f), r));
        let first = first.cloned().map(Self::Endpoints);
        first
            .into_iter()
            .chain(rest.iter().cloned().map(Self::AppendedEndpoints))
            .collect()
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The refusal of a stream before the first complete read (protocol rule 10).
fn not_read_yet() -> Status {
    unavailable(
        "the controller has not read the whole cluster yet",
        RETRY_BEFORE_FIRST_READ,
    )
}

/// The end of a stream, or the refusal of one, by a replica shutting down (protocol rule 13):
/// the agent subscribes to another replica, and comes back here after `retry_after`.
fn shutting_down(retry_after: Duration) -> Status {
    unavailable(
        "this controller replica is shutting down; subscribe to another",
        retry_after,
    )
}

/// The end of a shed stream (protocol rule 13).
fn shed() -> Status {
    unavailable(
        "this controller replica holds more than its share of the nodes; subscribe to another",
        RETRY_AFTER_SHED,
    )
}

/// An UNAVAILABLE status asking the agent to wait `retry_after` (protocol rule 10).
fn unavailable(message: &str, retry_after: Duration) -> Status {
    let mut status = Status::unavailable(message);
    let millis = retry_after.as_millis().to_string();
    if let Ok(value) = millis.parse() {
        status
            .metadata_mut()
            .insert(splitproxy_proto::RETRY_AFTER_MS, value);
    }
    status
}

/// Splits one revision into messages whose resources take at most [`MAX_MESSAGE_BYTES`] encoded;
/// the last carries `complete`, the first the node's status when it changed and the buckets a
/// delta from a summary replaces. Removals go first so an agent never holds a removed and an
/// added copy. Upserts are encoded through `encodings`, the cache of the state they belong to;
/// an endpoint set too big for one message goes in pieces where `sets` allows, whole otherwise.
#[must_use]
pub fn split(
    delta: Delta,
    epoch: &str,
    revision: u64,
    reset: bool,
    encodings: &Encodings,
    sets: EndpointSets,
) -> Vec<wire::SyncResponse> {
    let header = || wire::SyncResponse {
        controller_epoch: epoch.to_owned(),
        revision,
        reset,
        ..Default::default()
    };
    let services = (delta.upserted_services.iter()).map(|s| Item::Service(encodings.of(s)));
    let endpoints =
        (delta.upserted_endpoints.iter()).flat_map(|e| Item::endpoints(e, encodings, sets));
    let items = delta
        .removed_services
        .into_iter()
        .map(Item::RemovedService)
        .chain(
            delta
                .removed_endpoints
                .into_iter()
                .map(Item::RemovedEndpoints),
        )
        .chain(services)
        .chain(endpoints);
    let mut messages = vec![wire::SyncResponse {
        node_status: delta.node_status,
        replaced_buckets: delta.replaced_buckets,
        ..header()
    }];
    let mut bytes = 0;
    for item in items {
        let size = item.encoded_len();
        // Each later piece of an endpoint set starts a message (rule 14), so a message never
        // names a key twice in one list (rule 8).
        let piece = matches!(item, Item::AppendedEndpoints(_));
        if bytes > 0 && (piece || bytes + size > MAX_MESSAGE_BYTES) {
            messages.push(header());
            bytes = 0;
        }
        bytes += size;
        let last = messages.len() - 1;
        let message = &mut messages[last];
        match item {
            Item::RemovedService(key) => message.removed_services.push(key),
            Item::RemovedEndpoints(key) => message.removed_endpoints.push(key),
            Item::Service(encoded) => message.upserted_services.push(encoded),
            Item::Endpoints(encoded) => message.upserted_endpoints.push(encoded),
            Item::AppendedEndpoints(encoded) => message.appended_endpoints.push(encoded),
        }
    }
    if let Some(last) = messages.last_mut() {
        last.complete = true;
    }
    messages
}

#[cfg(test)]
mod tests;
