//! kube-proxy's HTTP endpoints: `/metrics` and `/proxyMode` on the metrics address, `/healthz` and
//! `/livez` on the health address, with kube-proxy's semantics.

use crate::{
    metrics::{CodeLabel, Metrics},
    status::Status,
};
use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use prometheus_client::registry::Registry;
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

/// State of the metrics server.
#[derive(Clone)]
struct MetricsState {
    registry: Arc<Registry>,
    mode: &'static str,
}

/// The router of the metrics address: `/metrics` and `/proxyMode`.
pub fn metrics_router(registry: Arc<Registry>, mode: &'static str) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/proxyMode", get(proxy_mode))
        .with_state(MetricsState { registry, mode })
}

async fn metrics(State(state): State<MetricsState>) -> impl IntoResponse {
    splitproxy_telemetry::metrics_response(&state.registry)
}

async fn proxy_mode(State(state): State<MetricsState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        state.mode,
    )
}

/// State of the health server.
#[derive(Clone)]
struct HealthState {
    status: Status,
    metrics: Metrics,
    timeout: Duration,
}

/// The router of the health address: `/healthz` and `/livez`. A revision left unapplied for longer
/// than `timeout` makes both unhealthy.
pub fn health_router(status: Status, metrics: Metrics, timeout: Duration) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .with_state(HealthState {
            status,
            metrics,
            timeout,
        })
}

async fn healthz(State(state): State<HealthState>) -> impl IntoResponse {
    health_response(&state, true)
}

async fn livez(State(state): State<HealthState>) -> impl IntoResponse {
    health_response(&state, false)
}

/// kube-proxy's body: `lastUpdated` is "now" while healthy (its compatibility rule), the last
/// applied time otherwise. Node eligibility comes from the controller in a later version; until
/// then the node counts as eligible.
fn health_response(state: &HealthState, with_eligibility: bool) -> impl IntoResponse + use<> {
    let snapshot = state.status.snapshot();
    let healthy = snapshot.proxy_healthy(state.timeout);
    let now = SystemTime::now();
    let last_updated = if healthy {
        now
    } else {
        snapshot.applied_at.unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let mut body = serde_json::json!({
        "lastUpdated": rfc3339(last_updated),
        "currentTime": rfc3339(now),
        "healthy": healthy,
    });
    if with_eligibility {
        body["nodeEligible"] = serde_json::Value::Bool(true);
    }
    let code = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let counter = if with_eligibility {
        &state.metrics.healthz
    } else {
        &state.metrics.livez
    };
    counter
        .get_or_create(&CodeLabel {
            code: code.as_u16().to_string(),
        })
        .inc();
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body.to_string(),
    )
}

fn rfc3339(time: SystemTime) -> String {
    prost_types::Timestamp::from(time).to_string()
}

#[cfg(test)]
mod tests;
