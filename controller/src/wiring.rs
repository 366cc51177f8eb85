//! Wiring: the source feeding the cluster state, the gRPC server agents connect to, and the
//! controller's inspection server (a separate, by default loopback, listener).

use crate::{
    admission::Admission,
    auth::AgentAuth,
    cause::Cause,
    cluster::{Builder, Objects, ServiceSelector},
    fanout::{FanOut, Published},
    history::ChangeSet,
    inspection::Inspection,
    metrics::Metrics,
    serving_tls::{self, Connection, ServingCertificate},
    shares,
    source::Source,
    wire::server::node_view_service_server::NodeViewServiceServer,
};
use splitproxy_proto::Key;
use splitproxy_proto::v1alpha1::controller_inspection_service_server::ControllerInspectionServiceServer;
use std::{io, net::SocketAddr, pin::Pin, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch};
use tokio_stream::{Stream, StreamExt, wrappers::TcpListenerStream};

/// How often the server pings each agent's connection, and how long it waits for the answer
/// before closing it. An agent's HTTP/2 layer answers pings even while the agent is busy or
/// stops reading, so only a peer that is gone (a node powered off, a frozen process) is dropped;
/// without this its stream, parked on a revision that will never be acknowledged, would stay
/// listed and held forever.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Streams one connection may open at once: an agent opens one `Sync`; a tool, a few calls.
const MAX_STREAMS_PER_CONNECTION: u32 = 8;
/// HTTP/2 streams a peer may reset before the server answers them, and streams the server may
/// reset for a peer's errors, before the connection is closed: h2's and hyper's own defaults,
/// which tonic replaces with "unlimited" unless set (the rapid-reset attack, RUSTSEC-2024-0003).
const MAX_PENDING_RESETS: usize = 20;
const MAX_LOCAL_ERROR_RESETS: usize = 1024;
/// The largest request header block: a bearer token and a few fields.
const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The gRPC listener could not be bound.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    /// TLS could not be configured.
    #[error("configuring TLS")]
    Tls(#[source] serving_tls::Error),
    /// The gRPC server failed.
    #[error("serving gRPC")]
    Serve(#[source] tonic::transport::Error),
    /// Reflection could not be built from the descriptor set.
    #[error("building gRPC reflection")]
    Reflection(#[source] tonic_reflection::server::Error),
    /// The source of cluster objects failed.
    #[error("cluster source")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Publishes a new cluster state only when it differs from the last one, so agents' streams wake
/// up only for real changes. The state carries the trace context of the span the source called
/// this in (its change span), and what changed since the last one.
fn publish(
    tx: &watch::Sender<Published>,
    builder: &mut Builder,
    objects: &Objects,
    selector: &ServiceSelector,
    metrics: &Metrics,
) {
    let mut state = builder.build(objects, selector);
    state.cause = Cause::of(&tracing::Span::current());
    metrics
        .invalid_services
        .set(i64::try_from(state.invalid_services.len()).unwrap_or(i64::MAX));
    tx.send_if_modified(|current| {
        let state = state.followed_by(current.as_deref());
        if let Some(current) = current.as_deref()
            && current.invalid_services == state.invalid_services
            && state.history.latest().is_some_and(ChangeSet::is_empty)
        {
            return false;
        }
        tracing::info!(
            services = state.services.len(),
            with_endpoints = state.endpoints.len(),
            nodes = state.nodes.len(),
            generation = state.history.generation(),
            "cluster state changed"
        );
        *current = Some(Arc::new(state));
        true
    });
}

/// How the controller serves agents and people.
#[derive(Debug, Clone)]
pub struct Serving {
    /// The Services this controller programs.
    pub selector: ServiceSelector,
    /// Where streams and states are recorded.
    pub metrics: Metrics,
    /// Who may receive which node's view.
    pub auth: AgentAuth,
    /// The certificate of the node view port, which may change while served; plaintext when
    /// `None`.
    pub tls: Option<Arc<ServingCertificate>>,
    /// The controllers' own Service: its ready endpoints are the replicas this one shares the
    /// nodes with. Without it, this replica keeps every agent that connects.
    pub controller_service: Option<Key>,
    /// How long an agent may leave a revision unanswered before its stream is ended.
    pub fall_behind_limit: Duration,
}

/// Binds `listen` (node views for agents) and `inspection` (the controller's inspection, for
/// people and tools), and runs `source` and both servers until one fails.
///
/// # Errors
///
/// Returns the first error of the listeners, the servers or the source.
pub async fn run(
    listen: SocketAddr,
    inspection: SocketAddr,
    source: impl Source,
    serving: Serving,
) -> Result<(), Error> {
    let bind = |address: SocketAddr| async move {
        TcpListener::bind(address)
            .await
            .map_err(|e| Error::Bind(address, e))
    };
    let listener = bind(listen).await?;
    let inspection_listener = bind(inspection).await?;
    tracing::info!(address = %listen, tls = serving.tls.is_some(), "serving node views");
    tracing::info!(address = %inspection, "serving controller inspection");
    serve(listener, Some(inspection_listener), source, serving).await
}

/// Runs `source` and the gRPC servers on already bound listeners; without `inspection`, the
/// controller's inspection is not served.
///
/// # Errors
///
/// Returns the first error of the servers or the source.
pub async fn serve(
    listener: TcpListener,
    inspection: Option<TcpListener>,
    source: impl Source,
    serving: Serving,
) -> Result<(), Error> {
    let Serving {
        selector,
        metrics,
        auth,
        tls,
        controller_service,
        fall_behind_limit,
    } = serving;
    let (tx, rx) = watch::channel(None);
    let fanout = FanOut::new(rx.clone())
        .with_metrics(metrics.clone())
        .with_auth(auth)
        .with_fall_behind_limit(fall_behind_limit);
    let inspector = Inspection::new(fanout.epoch().to_owned(), metrics.agents.clone(), rx);
    let mut builder = Builder::default();
    let (replicas_tx, replicas) = watch::channel(0);
    let sharing = controller_service.is_some();
    let source = source.run(move |objects| {
        publish(&tx, &mut builder, &objects, &selector, &metrics);
        if let Some(service) = &controller_service {
            let count = shares::ready_replicas(&objects.slices, service);
            replicas_tx.send_if_modified(|held| std::mem::replace(held, count) != count);
        }
    });

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<NodeViewServiceServer<FanOut>>().await;
    health
        .set_serving::<ControllerInspectionServiceServer<Inspection>>()
        .await;

    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES);
    let admitted = Admission::default().incoming(listener);
    let connections: Pin<Box<dyn Stream<Item = io::Result<Connection>> + Send>> = match &tls {
        Some(certificate) => {
            let acceptor = certificate.acceptor().map_err(Error::Tls)?;
            Box::pin(serving_tls::handshakes(admitted, acceptor))
        }
        None => Box::pin(admitted.map(|admitted| admitted.map(Connection::Plain))),
    };
    // Reflection on both ports: it shows schemas only, and lets grpcurl check health here.
    let (reflection_v1, reflection_v1alpha) =
        splitproxy_proto::reflection_services().map_err(Error::Reflection)?;
    // Ends with the source, which holds the sender of the published states.
    tokio::spawn({
        let fanout = fanout.clone();
        async move { fanout.forget_departed_nodes().await }
    });
    if sharing {
        let fanout = fanout.clone();
        tokio::spawn(async move { fanout.share_nodes(replicas).await });
    }
    let views = builder
        .add_service(fanout.into_service())
        .add_service(health_service.clone())
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming(connections);
    let inspection = async {
        let Some(listener) = inspection else {
            return std::future::pending().await;
        };
        let (reflection_v1, reflection_v1alpha) =
            splitproxy_proto::reflection_services().map_err(Error::Reflection)?;
        tonic::transport::Server::builder()
            .add_service(ControllerInspectionServiceServer::new(inspector))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .map_err(Error::Serve)
    };
    tokio::select! {
        result = views => result.map_err(Error::Serve),
        result = inspection => result,
        result = source => result.map_err(|e| Error::Source(Box::new(e))),
    }
}
