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
use splitproxy_dataplane::IpFamily;
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
    families: Arc<[IpFamily]>,
}

/// The router of the health address: `/healthz` and `/livez`, reporting on `families` (those the
/// dataplane programs). A revision left unapplied for longer than `timeout` makes both unhealthy;
/// a node the controller says is not eligible fails `/healthz` only.
pub fn health_router(
    status: Status,
    metrics: Metrics,
    timeout: Duration,
    families: &[IpFamily],
) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .with_state(HealthState {
            status,
            metrics,
            timeout,
            families: families.into(),
        })
}

async fn healthz(State(state): State<HealthState>) -> impl IntoResponse {
    health_response(&state, true)
}

async fn livez(State(state): State<HealthState>) -> impl IntoResponse {
    health_response(&state, false)
}

/// kube-proxy's answer: 200 while healthy and, for `/healthz`, the node is eligible (as the
/// controller last said, kept while no controller answers); 503 otherwise. In the body,
/// `lastUpdated` is "now" while healthy (kube-proxy's compatibility rule), the last applied time
/// otherwise; `status` has one entry per IP family with its own `lastUpdated` and `healthy`.
/// Every family takes each revision in the same step, so the entries agree.
fn health_response(state: &HealthState, with_eligibility: bool) -> impl IntoResponse + use<> {
    let snapshot = state.status.snapshot();
    let healthy = snapshot.proxy_healthy(state.timeout);
    let eligible = snapshot.state.eligibility.is_eligible();
    let now = SystemTime::now();
    let applied_at = snapshot.applied_at.unwrap_or(SystemTime::UNIX_EPOCH);
    let last_updated = if healthy { now } else { applied_at };
    let families: serde_json::Map<String, serde_json::Value> = state
        .families
        .iter()
        .map(|family| {
            let status = serde_json::json!({
                "lastUpdated": rfc3339(applied_at),
                "healthy": healthy,
            });
            (family.name().to_owned(), status)
        })
        .collect();
    let mut body = serde_json::json!({
        "lastUpdated": rfc3339(last_updated),
        "currentTime": rfc3339(now),
        "healthy": healthy,
        "status": families,
    });
    if with_eligibility {
        body["nodeEligible"] = serde_json::Value::Bool(eligible);
    }
    let code = if healthy && (eligible || !with_eligibility) {
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
