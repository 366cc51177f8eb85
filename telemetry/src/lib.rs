//! What the controller and the agent share to be observed: the Prometheus `/metrics` response,
//! the `process_*` metrics ([`process`]), and the logging and tracing setup with the W3C trace
//! context helpers ([`trace`]). Both binaries expose their own metrics; this keeps the
//! exposition format in one place.

pub mod process;
pub mod trace;

/// Formats an error with its sources, for one log line or a NACK reason.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

use axum::{
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use prometheus_client::registry::Registry;

/// `registry` in the OpenMetrics text format, as a `/metrics` response; a 500 naming the error
/// when it cannot be encoded.
pub fn metrics_response(registry: &Registry) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding metrics: {err}"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn metrics_are_encoded_as_openmetrics_text() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        counter.inc();
        registry.register("things", "Things seen", counter);
        let response = metrics_response(&registry);
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()[header::CONTENT_TYPE].to_str().ok();
        assert_eq!(
            content_type,
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
    }
}
