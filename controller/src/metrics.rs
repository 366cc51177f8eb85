//! The controller's Prometheus metrics (`splitproxy_controller_*`) and the HTTP server that
//! exposes them on `/metrics`.

use axum::{Router, extract::State, response::Response, routing::get};
use prometheus_client::{metrics::gauge::Gauge, registry::Registry};
use std::{net::SocketAddr, sync::Arc};

/// Every metric the controller exports.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// `splitproxy_controller_invalid_services`: Services left out of the last cluster state
    /// because they cannot be programmed (each is logged with its key).
    pub invalid_services: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    #[must_use]
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "splitproxy_controller_invalid_services",
            "Services left out of the cluster state because they cannot be programmed",
            metrics.invalid_services.clone(),
        );
        metrics
    }
}

/// Serves `/metrics` from `registry` on `listen` until the server fails.
///
/// # Errors
///
/// If `listen` cannot be bound or the server fails.
pub async fn serve(listen: SocketAddr, registry: Arc<Registry>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(address = %listen, "serving metrics");
    let router = Router::new()
        .route("/metrics", get(encode))
        .with_state(registry);
    axum::serve(listener, router).await
}

async fn encode(State(registry): State<Arc<Registry>>) -> Response {
    splitproxy_telemetry::metrics_response(&registry)
}
