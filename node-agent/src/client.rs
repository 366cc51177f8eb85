//! The stream client: keeps one stream to a controller open, gathers revisions, has them applied
//! and answers each with an ACK or NACK. Reconnects with jittered backoff, trying the controllers
//! in turn; while no controller answers, the node keeps its rules (fail static) and the periodic
//! resync keeps repairing them.

use crate::{
    credentials::{CredentialError, Credentials},
    discovery::Discovery,
    fold::{Fold, Folded},
    metrics::Metrics,
    node_state::{NodeState, Revision},
    status::Status,
    sync::{Applier, ApplyError, sleep_until},
};
use futures::{Stream, StreamExt};
use rand::Rng;
use rotation::Rotation;
use splitproxy_dataplane::{Dataplane, IpFamily};
use splitproxy_proto::v1alpha1::{
    self as pb, node_view_service_client::NodeViewServiceClient, sync_request,
};
use splitproxy_telemetry::error_chain;
use splitproxy_telemetry::trace;
use std::time::Duration;
use tokio::{sync::mpsc, time::Instant};
use tracing::Instrument;

/// Where and as whom the client connects.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The controllers, tried in turn.
    pub controllers: Controllers,
    /// The node this agent programs.
    pub node_name: String,
    /// The proxy mode reported to the controller.
    pub proxy_mode: pb::ProxyMode,
    /// The first reconnect delay; doubled per failure up to `max_backoff`.
    pub min_backoff: Duration,
    /// The longest reconnect delay.
    pub max_backoff: Duration,
    /// The trusted CA and the token identifying the node.
    pub credentials: Credentials,
}

/// Where the controller replicas are.
#[derive(Debug, Clone)]
pub enum Controllers {
    /// These URLs.
    Listed(Vec<String>),
    /// The ready endpoints of a Service, listed again for each pass over them.
    Discovered(Discovery),
}

impl Controllers {
    /// Whether there is nothing to connect to, ever.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Listed(urls) if urls.is_empty())
    }

    /// The URLs to try in the next pass; `last` (the previous pass) when discovery fails, so
    /// an unreachable API server does not keep the node from controllers it knew.
    async fn next_pass(&self, last: Vec<String>) -> Vec<String> {
        match self {
            Self::Listed(urls) => urls.clone(),
            Self::Discovered(discovery) => match discovery.controllers().await {
                Ok(urls) => {
                    tracing::debug!(?urls, "found controllers");
                    urls
                }
                Err(err) => {
                    tracing::warn!(
                        error = %error_chain(&err),
                        known = last.len(),
                        "cannot list the controllers; trying the ones known"
                    );
                    last
                }
            },
        }
    }
}

/// How often the agent pings its controller over HTTP/2. A controller that hangs or is cut off
/// keeps its connections open without a reset; only an unanswered ping shows it, so this bounds
/// how long a node misses changes another replica could give it.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long a ping may go unanswered before the stream counts as dead. The controller's HTTP/2
/// layer answers pings without waiting for its own work, so a few seconds is still generous.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest message the agent takes from a controller. A controller sends at most 32 KiB of
/// resources per message, one Service's endpoints in pieces (protocol rule 14); only a single
/// `Service` may go past that, and etcd's request limit (1.5 MiB by default) bounds it. gRPC's
/// default, named so that it is a decision.
const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// Why one stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("invalid controller URL")]
    Url(#[source] tonic::transport::Error),
    #[error("connecting")]
    Connect(#[source] tonic::transport::Error),
    #[error("credentials")]
    Credentials(#[from] CredentialError),
    #[error("stream failed: {0}")]
    Status(#[from] tonic::Status),
    #[error("controller closed the stream")]
    Closed,
    #[error("a message of revision {got} arrived while revision {pending} was incomplete")]
    Interleaved { got: u64, pending: u64 },
}

/// Runs the client forever. `config.controllers` must not be empty. The applier's periodic resync
/// runs throughout, connected or not.
pub async fn run<D: Dataplane>(
    config: ClientConfig,
    mut applier: Applier<D>,
    status: Status,
    metrics: Metrics,
) {
    let mut backoff = config.min_backoff;
    // Whether the controller last subscribed to reads summaries (protocol rule 11).
    let mut reads_summary = false;
    let mut rotation = Rotation::default();
    loop {
        if rotation.pass_done() {
            let known = rotation.take_pass();
            let controllers = applier
                .resync_while(config.controllers.next_pass(known))
                .await;
            rotation.start_pass(controllers);
        }
        let mut asked = None;
        if let Some(controller) = rotation.next_controller() {
            status.update(|s| s.controller.clone_from(&controller));
            let mut progressed = false;
            let result = stream_once(
                &config,
                &controller,
                &mut applier,
                &status,
                &metrics,
                &mut reads_summary,
                &mut progressed,
            )
            .await;
            status.update(|s| s.connected = false);
            if let Err(err) = result {
                tracing::warn!(%controller, error = %error_chain(&err), "controller stream ended");
                asked = err.retry_after().map(|hint| hint.min(config.max_backoff));
                rotation.ended(
                    &controller,
                    asked.is_some(),
                    progressed && err.asks_to_come_back(),
                );
            }
            if progressed {
                backoff = config.min_backoff;
            }
        } else {
            tracing::warn!("no ready controller to connect to");
        }
        metrics.reconnects.inc();
        let delay = jitter(rotation.delay(asked, backoff));
        tracing::info!(delay_ms = delay.as_millis() as u64, "reconnecting");
        applier.resync_while(tokio::time::sleep(delay)).await;
        // A controller that said when to come back is not failing: no reason to back off more.
        if asked.is_none() {
            backoff = (backoff * 2).min(config.max_backoff);
        }
    }
}

impl StreamError {
    /// When the controller asked to be tried again: a refusal before its first complete read
    /// of the cluster (protocol rule 10).
    fn retry_after(&self) -> Option<Duration> {
        let Self::Status(status) = self else {
            return None;
        };
        splitproxy_proto::retry_after(status)
    }

    /// Whether the controller ended a working stream expecting the agent back: the agent's
    /// credential expired, and it returns with the rotated one. Not a transport failure, which
    /// may be a controller that hangs.
    fn asks_to_come_back(&self) -> bool {
        matches!(self, Self::Status(status) if status.code() == tonic::Code::Unauthenticated)
    }
}

/// A random delay between half and all of `backoff`, so agents do not reconnect in lockstep.
fn jitter(backoff: Duration) -> Duration {
    let factor = rand::rng().random_range(0.5..=1.0);
    backoff.mul_f64(factor)
}

async fn stream_once<D: Dataplane>(
    config: &ClientConfig,
    controller: &str,
    applier: &mut Applier<D>,
    status: &Status,
    metrics: &Metrics,
    reads_summary: &mut bool,
    progressed: &mut bool,
) -> Result<(), StreamError> {
    let held = status.snapshot().state;
    let families = applier.ip_families();
    let by_summary = *reads_summary;
    let (inbound, acks) = applier
        .resync_while(subscribe(
            config,
            controller,
            &held,
            &families,
            reads_summary,
        ))
        .await?;
    status.update(|s| s.connected = true);
    tracing::info!(%controller, resume = held.epoch.is_some(), by_summary, "subscribed");
    serve(
        &config.node_name,
        held.epoch.is_some(),
        inbound,
        &acks,
        applier,
        metrics,
        progressed,
    )
    .await
}

/// Connects to `controller` and subscribes, resuming from `held`: by its summary when
/// `reads_summary` says the controller reads them, by every digest otherwise (protocol rules 7
/// and 11); then sets `reads_summary` to what this controller says. Returns the inbound stream
/// and the sender of the request stream.
async fn subscribe(
    config: &ClientConfig,
    controller: &str,
    held: &NodeState,
    families: &[IpFamily],
    reads_summary: &mut bool,
) -> Result<
    (
        tonic::Streaming<pb::SyncResponse>,
        mpsc::Sender<pb::SyncRequest>,
    ),
    StreamError,
> {
    let endpoint =
        tonic::transport::Endpoint::from_shared(controller.to_owned()).map_err(StreamError::Url)?;
    let channel = config
        .credentials
        .secure(endpoint)?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(StreamError::Connect)?;
    let subscribe = pb::Subscribe {
        node_name: config.node_name.clone(),
        capabilities: Some(pb::Capabilities {
            proxy_mode: config.proxy_mode as i32,
            ip_families: families
                .iter()
                .map(|family| match family {
                    IpFamily::V4 => pb::IpFamily::Ipv4 as i32,
                    IpFamily::V6 => pb::IpFamily::Ipv6 as i32,
                })
                .collect(),
            pipelining: true,
            appended_endpoints: true,
            derives_locality: true,
        }),
        resume: held.epoch.as_ref().map(|epoch| pb::ResumePoint {
            controller_epoch: epoch.clone(),
            revision: held.revision,
        }),
        held: Vec::new(),
        summary: None,
    };
    let subscribe = match held.epoch {
        None => subscribe,
        Some(_) if *reads_summary => pb::Subscribe {
            summary: Some(held.summary()),
            ..subscribe
        },
        Some(_) => pb::Subscribe {
            held: held.digests(),
            ..subscribe
        },
    };
    // One subscribe plus at most one ack in flight: an ack answers every revision folded.
    let (tx, rx) = mpsc::channel(4);
    send(&tx, sync_request::Kind::Subscribe(subscribe)).await;
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    config.credentials.authorize(&mut request)?;
    let response = NodeViewServiceClient::new(channel)
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
        .sync(request)
        .await?;
    *reads_summary = response
        .metadata()
        .contains_key(splitproxy_proto::READS_SUMMARY);
    Ok((response.into_inner(), tx))
}

/// Sends one request on the request stream.
async fn send(tx: &mpsc::Sender<pb::SyncRequest>, kind: sync_request::Kind) {
    // The receiver lives as long as the request stream; a failed send shows up as the response
    // stream ending.
    let _ = tx.send(pb::SyncRequest { kind: Some(kind) }).await;
}

/// What the stream loop waits for.
enum Event {
    /// A message, a failure, or the end of the stream.
    Message(Box<Option<Result<pb::SyncResponse, tonic::Status>>>),
    /// The revisions folded may be synced now.
    SyncDue,
}

/// The next message, or `sync_at` if it comes first; a message ready at the same time wins, so
/// what already arrived is folded into the sync.
async fn next_event<S>(inbound: &mut S, sync_at: Option<Instant>) -> Event
where
    S: Stream<Item = Result<pb::SyncResponse, tonic::Status>> + Unpin,
{
    tokio::select! {
        biased;
        message = inbound.next() => Event::Message(Box::new(message)),
        () = sleep_until(sync_at) => Event::SyncDue,
    }
}

/// Serves one subscribed stream: gathers each revision's parts, folds complete revisions into
/// one pending state while min-sync-period keeps the kernel waiting, syncs that state when it
/// allows, and answers the newest revision folded on `acks` once its rules are in the kernel, or
/// with a NACK (protocol rule 12). Periodic resyncs run while it waits for the controller.
/// Independent of gRPC, so tests drive it with a plain stream. Each sync is an `apply` span of
/// `node`, continuing the trace of the newest revision folded and linking the others'.
/// `presented_state` says whether the subscribe carried the digests of a held state, on which
/// the stream's first revision then builds.
async fn serve<D, S>(
    node: &str,
    presented_state: bool,
    mut inbound: S,
    acks: &mpsc::Sender<pb::SyncRequest>,
    applier: &mut Applier<D>,
    metrics: &Metrics,
    progressed: &mut bool,
) -> Result<(), StreamError>
where
    D: Dataplane,
    S: Stream<Item = Result<pb::SyncResponse, tonic::Status>> + Unpin,
{
    let mut gathering: Option<Revision> = None;
    let mut pending: Option<Fold> = None;
    let mut sync_at = None;
    // Until a revision is applied, the controller answers a NACK by sending its first revision
    // again, built on the presented state as the first was.
    let mut on_presented_state = presented_state;
    loop {
        let message = match applier
            .resync_while(next_event(&mut inbound, sync_at))
            .await
        {
            Event::SyncDue => {
                sync_at = None;
                if let Some(fold) = pending.take() {
                    let applied = sync(node, fold, acks, applier, metrics).await;
                    *progressed |= applied;
                    on_presented_state &= !applied;
                }
                continue;
            }
            Event::Message(message) => message.transpose()?.ok_or(StreamError::Closed)?,
        };
        metrics.update_messages_received.inc();
        metrics
            .update_bytes_received
            .inc_by(prost::Message::encoded_len(&message) as u64);
        let mut revision = match gathering.take() {
            None => {
                applier.queued();
                Revision {
                    epoch: message.controller_epoch.clone(),
                    number: message.revision,
                    reset: message.reset,
                    on_presented_state,
                    parts: Vec::new(),
                }
            }
            Some(revision) if revision.number == message.revision => revision,
            Some(revision) => {
                return Err(StreamError::Interleaved {
                    got: message.revision,
                    pending: revision.number,
                });
            }
        };
        let complete = message.complete;
        revision.parts.push(message);
        if !complete {
            gathering = Some(revision);
            continue;
        }
        if revision.reset {
            metrics.reset_revisions_received.inc();
        }
        let held = applier.held();
        match Fold::take(&mut pending, &held, &revision) {
            Ok(Folded::Taken) => {}
            Ok(Folded::Stale) => {
                tracing::debug!(
                    revision = revision.number,
                    "dropping a revision built on a state dropped after a rejection"
                );
                if pending.is_none() {
                    applier.unqueued();
                }
            }
            Err(rejected) => {
                pending = None;
                let rejected = ApplyError::Rejected(rejected);
                answer(acks, revision.number, Err(&rejected), metrics).await;
                applier.unqueued();
            }
        }
        sync_at = pending.as_ref().map(|fold| {
            let now = Instant::now();
            if fold.only_status_differs(&held) {
                now
            } else {
                applier
                    .next_sync_allowed()
                    .map_or(now, |allowed| allowed.max(now))
            }
        });
    }
}

/// Syncs the revisions folded in `fold` and answers the newest; returns whether it was applied.
async fn sync<D: Dataplane>(
    node: &str,
    fold: Fold,
    acks: &mpsc::Sender<pb::SyncRequest>,
    applier: &mut Applier<D>,
    metrics: &Metrics,
) -> bool {
    let number = fold.state.revision;
    let span = tracing::info_span!(
        "apply",
        node,
        revision = number,
        reset = fold.reset,
        revisions = fold.revisions,
        services_changed = tracing::field::Empty,
        result = tracing::field::Empty,
    );
    trace::continue_trace(&span, fold.newest_trace());
    trace::link_to(&span, fold.traces.iter().rev().skip(1));
    let applied = applier
        .apply_state(fold.state, fold.reset)
        .instrument(span.clone())
        .await;
    span.record(
        "result",
        if applied.is_ok() {
            "applied"
        } else {
            "rejected"
        },
    );
    if applied.is_ok() {
        tracing::info!(
            revision = number,
            reset = fold.reset,
            revisions = fold.revisions,
            "applied"
        );
    }
    answer(acks, number, applied.as_ref().map(|_| ()), metrics).await;
    if applied.is_err() {
        applier.unqueued();
    }
    applied.is_ok()
}

/// Answers `revision` with an ACK, or a NACK giving why it was not applied.
async fn answer(
    acks: &mpsc::Sender<pb::SyncRequest>,
    revision: u64,
    applied: Result<(), &ApplyError>,
    metrics: &Metrics,
) {
    let ack = match applied {
        Ok(()) => pb::Ack {
            revision,
            status: pb::AckStatus::Applied as i32,
            reason: String::new(),
        },
        Err(err) => {
            let reason = error_chain(err);
            tracing::warn!(revision, %reason, "rejecting revision");
            metrics.rejected_revisions.inc();
            pb::Ack {
                revision,
                status: pb::AckStatus::Rejected as i32,
                reason,
            }
        }
    };
    send(acks, sync_request::Kind::Ack(ack)).await;
}

mod rotation;

#[cfg(test)]
mod tests;
