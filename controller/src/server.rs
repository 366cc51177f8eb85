//! Wiring: the source feeding the cluster state, and the gRPC server agents connect to, which
//! also serves the controller's inspection service.

use crate::{
    cause::Cause,
    cluster::{ClusterState, Objects, ServiceSelector},
    fanout::{FanOut, Published},
    inspection::Inspection,
    metrics::Metrics,
    source::Source,
};
use splitproxy_proto::v1alpha1::{
    controller_inspection_service_server::ControllerInspectionServiceServer,
    node_view_service_server::NodeViewServiceServer,
};
use std::{net::SocketAddr, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch};
use tokio_stream::wrappers::TcpListenerStream;

/// How often the server pings each agent's connection, and how long it waits for the answer
/// before closing it. An agent's HTTP/2 layer answers pings even while the agent is busy or
/// stops reading, so only a peer that is gone (a node powered off, a frozen process) is dropped;
/// without this its stream, parked on a revision that will never be acknowledged, would stay
/// listed and held forever.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The gRPC listener could not be bound.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
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
/// this in (its change span).
fn publish(
    tx: &watch::Sender<Published>,
    objects: &Objects,
    selector: &ServiceSelector,
    metrics: &Metrics,
) {
    let mut state = ClusterState::build(objects, selector);
    state.cause = Cause::of(&tracing::Span::current());
    metrics
        .invalid_services
        .set(i64::try_from(state.invalid_services.len()).unwrap_or(i64::MAX));
    tx.send_if_modified(|current| {
        if current.as_deref() == Some(&state) {
            return false;
        }
        tracing::info!(
            services = state.services.len(),
            with_endpoints = state.endpoints.len(),
            nodes = state.nodes.len(),
            "cluster state changed"
        );
        *current = Some(Arc::new(state));
        true
    });
}

/// Binds `listen` and runs `source` and the server until either fails.
///
/// # Errors
///
/// Returns the first error of the listener, the server or the source.
pub async fn run(
    listen: SocketAddr,
    source: impl Source,
    selector: ServiceSelector,
    metrics: Metrics,
) -> Result<(), Error> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Bind(listen, e))?;
    tracing::info!(address = %listen, "serving node views");
    serve(listener, source, selector, metrics).await
}

/// Runs `source` and the gRPC server on an already bound listener, serving the Services
/// `selector` claims and recording into `metrics`.
///
/// # Errors
///
/// Returns the first error of the server or the source.
pub async fn serve(
    listener: TcpListener,
    source: impl Source,
    selector: ServiceSelector,
    metrics: Metrics,
) -> Result<(), Error> {
    let (tx, rx) = watch::channel(None);
    let fanout = FanOut::new(rx.clone()).with_metrics(metrics.clone());
    let inspection = Inspection::new(fanout.epoch().to_owned(), metrics.agents.clone(), rx);
    let source = source.run(move |objects| publish(&tx, &objects, &selector, &metrics));

    let (reflection_v1, reflection_v1alpha) =
        splitproxy_proto::reflection_services().map_err(Error::Reflection)?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<NodeViewServiceServer<FanOut>>().await;
    health
        .set_serving::<ControllerInspectionServiceServer<Inspection>>()
        .await;

    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(NodeViewServiceServer::new(fanout))
        .add_service(ControllerInspectionServiceServer::new(inspection))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming(TcpListenerStream::new(listener));
    tokio::select! {
        result = server => result.map_err(Error::Serve),
        result = source => result.map_err(|e| Error::Source(Box::new(e))),
    }
}
