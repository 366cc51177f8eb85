//! Logging and distributed tracing for both binaries: the `tracing` subscriber, an OpenTelemetry
//! OTLP exporter switched on only by the standard `OTEL_*` variables, and W3C trace context
//! carried in the protocol's [`pb::TraceContext`].
//!
//! With no `OTEL_*` variable set there is no exporter and no OpenTelemetry layer at all: spans
//! are plain `tracing` spans, and [`context_of`] finds no context to send.

pub use opentelemetry::KeyValue;
use opentelemetry::{
    Context,
    propagation::TextMapPropagator,
    trace::{SpanContext, TraceContextExt, TracerProvider as _},
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use splitproxy_proto::v1alpha1 as pb;
use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::{EnvFilter, layer::SubscriberExt as _, util::SubscriberInitExt as _};

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `OTEL_TRACES_EXPORTER` names an exporter this build does not have.
    #[error("OTEL_TRACES_EXPORTER={0:?} is not supported (use otlp or none)")]
    UnsupportedExporter(String),
    /// The OTLP exporter could not be built from the `OTEL_EXPORTER_OTLP_*` variables.
    #[error("building the OTLP span exporter")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
    /// A global subscriber was already installed.
    #[error("installing the tracing subscriber")]
    Subscriber(#[source] tracing_subscriber::util::TryInitError),
}

/// Whether spans are exported, decided from the standard OpenTelemetry variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Export {
    /// Nothing configured, `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
    Off,
    /// OTLP over gRPC (the only protocol built in: `OTEL_EXPORTER_OTLP_PROTOCOL` is not read);
    /// the exporter reads `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, `..._HEADERS`, `..._TIMEOUT`
    /// itself, and the batch processor `OTEL_BSP_*`.
    Otlp,
}

impl Export {
    /// Decides from `var` (a lookup of environment variables, so tests need not touch the
    /// process environment).
    ///
    /// The specification's default for `OTEL_TRACES_EXPORTER` is `otlp`, which would make every
    /// agent dial `localhost:4317`; here an unset `OTEL_TRACES_EXPORTER` means OTLP only when an
    /// OTLP endpoint is configured, so that nothing configured costs nothing.
    ///
    /// # Errors
    ///
    /// Returns [`Error::UnsupportedExporter`] for an exporter other than `otlp` or `none`.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(Self::Off);
        }
        match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None | Some("") => {
                let endpoint =
                    set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
                Ok(if endpoint { Self::Otlp } else { Self::Off })
            }
            Some("none") => Ok(Self::Off),
            Some("otlp") => Ok(Self::Otlp),
            Some(other) => Err(Error::UnsupportedExporter(other.to_owned())),
        }
    }
}

/// How a binary names itself to the trace backend.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `service.name`, unless `OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`) says otherwise.
    pub service_name: &'static str,
    /// More resource attributes, such as the node name.
    pub attributes: Vec<KeyValue>,
}

/// The installed exporter; [`Telemetry::shutdown`] sends the spans still buffered.
#[derive(Debug)]
#[must_use = "dropping it without shutdown loses the spans still buffered"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    #[must_use]
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes and stops the exporter. Blocks until the buffered spans are sent (or the export
    /// timeout passes); call it from outside async code, while the runtime still runs.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(err) = provider.shutdown()
        {
            tracing::warn!(error = %err, "flushing spans at exit");
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Logs {
    /// klog's `-v`: 0 and 1 write info and above, 2 to 4 add debug, 5 and above trace.
    pub verbosity: u32,
    /// One JSON object per line instead of text.
    pub json: bool,
}

impl Logs {
    /// The level filter `verbosity` stands for.
    fn level(self) -> &'static str {
        match self.verbosity {
            0 | 1 => "info",
            2..=4 => "debug",
            _ => "trace",
        }
    }
}

/// Installs the global subscriber: log lines as `logs` says, filtered by `RUST_LOG` when it is
/// set (by `logs.verbosity` otherwise), plus an OpenTelemetry layer exporting over OTLP when
/// [`Export::from_env`] says so. Must run inside a Tokio runtime when exporting: the gRPC
/// exporter's connection lives on it.
///
/// # Errors
///
/// Returns why the exporter could not be built or the subscriber installed.
pub fn init(identity: Identity, logs: Logs) -> Result<Telemetry, Error> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(logs.level()));
    // Colours only for a person at a terminal: in a Pod's log they are escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let (text, json) = if logs.json {
        (None, Some(tracing_subscriber::fmt::layer().json()))
    } else {
        (Some(tracing_subscriber::fmt::layer().with_ansi(ansi)), None)
    };
    let export = Export::from_env(|name| std::env::var(name).ok())?;
    let provider = match export {
        Export::Off => None,
        Export::Otlp => Some(provider(identity)?),
    };
    let layer = provider
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("splitproxy")));
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(layer)
        .try_init()
        .map_err(Error::Subscriber)?;
    Ok(Telemetry { provider })
}

fn provider(identity: Identity) -> Result<SdkTracerProvider, Error> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_protocol(opentelemetry_otlp::Protocol::Grpc)
        .build()
        .map_err(Error::Exporter)?;
    // The builder's detectors read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the binary's
    // own name is only the fallback.
    let mut resource = Resource::builder().with_attributes(identity.attributes);
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name(identity.service_name);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The W3C trace context of `span`, to send with the work it causes; `None` when the span is
/// not traced (no exporter, or not sampled).
#[must_use]
pub fn context_of(span: &tracing::Span) -> Option<pb::TraceContext> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut headers = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut headers);
    Some(pb::TraceContext {
        traceparent: headers.remove("traceparent")?,
        tracestate: headers.remove("tracestate").unwrap_or_default(),
    })
}

/// The span context a received [`pb::TraceContext`] names; `None` when it is empty or malformed.
#[must_use]
pub fn span_context(trace: &pb::TraceContext) -> Option<SpanContext> {
    let mut headers = HashMap::from([("traceparent".to_owned(), trace.traceparent.clone())]);
    if !trace.tracestate.is_empty() {
        headers.insert("tracestate".to_owned(), trace.tracestate.clone());
    }
    let context = TraceContextPropagator::new().extract(&headers);
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}

/// Makes `span` continue the trace `trace` names or, when it names none, start a trace of its
/// own rather than join the enclosing span's (the enclosing span still prefixes its log lines).
/// Call before the span is first entered.
pub fn continue_trace(span: &tracing::Span, trace: Option<&pb::TraceContext>) {
    let parent = match trace.and_then(span_context) {
        Some(remote) => Context::new().with_remote_span_context(remote),
        None => Context::new(),
    };
    // Fails only when no OpenTelemetry layer is installed, when there is no trace to join.
    let _ = span.set_parent(parent);
}

/// Links `span` to each trace in `traces` (for work that merges several changes).
pub fn link_to<'a>(span: &tracing::Span, traces: impl IntoIterator<Item = &'a pb::TraceContext>) {
    for linked in traces.into_iter().filter_map(span_context) {
        span.add_link(linked);
    }
}

#[cfg(test)]
mod tests;
