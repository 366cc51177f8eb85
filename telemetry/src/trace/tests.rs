use super::*;

fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

#[test]
fn nothing_configured_exports_nothing() {
    assert_eq!(Export::from_env(env(&[])).ok(), Some(Export::Off));
    assert_eq!(
        Export::from_env(env(&[("OTEL_SERVICE_NAME", "x")])).ok(),
        Some(Export::Off)
    );
}

#[test]
fn an_otlp_endpoint_switches_export_on() {
    for var in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        let vars = [(var, "http://127.0.0.1:4317")];
        assert_eq!(Export::from_env(env(&vars)).ok(), Some(Export::Otlp));
    }
    let vars = [("OTEL_TRACES_EXPORTER", "otlp")];
    assert_eq!(Export::from_env(env(&vars)).ok(), Some(Export::Otlp));
}

#[test]
fn none_and_a_disabled_sdk_win_over_an_endpoint() {
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
    for off in [
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_SDK_DISABLED", "true"),
    ] {
        assert_eq!(
            Export::from_env(env(&[endpoint, off])).ok(),
            Some(Export::Off)
        );
    }
}

#[test]
fn an_unknown_exporter_is_refused() {
    let vars = [("OTEL_TRACES_EXPORTER", "zipkin")];
    assert!(matches!(
        Export::from_env(env(&vars)),
        Err(Error::UnsupportedExporter(name)) if name == "zipkin"
    ));
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn a_received_context_is_continued_and_sent_on() {
    let provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::with_default(subscriber, || {
        let received = pb::TraceContext {
            traceparent: TRACEPARENT.to_owned(),
            tracestate: "vendor=1".to_owned(),
        };
        let span = tracing::info_span!("apply");
        continue_trace(&span, Some(&received));
        let sent = context_of(&span).expect("a traced span has a context");
        // Same trace, new span (this one), sampled; the trace state travels along.
        assert!(
            sent.traceparent
                .starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-")
        );
        assert!(sent.traceparent.ends_with("-01"));
        assert_ne!(sent.traceparent, TRACEPARENT);
        assert_eq!(sent.tracestate, "vendor=1");
    });
}

#[test]
fn without_a_received_context_a_new_trace_starts() {
    let provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::with_default(subscriber, || {
        let outer = tracing::info_span!("agent");
        let _outer = outer.enter();
        let outer_trace = context_of(&outer).expect("traced");
        let span = tracing::info_span!("resync");
        continue_trace(&span, None);
        let own = context_of(&span).expect("traced");
        assert_ne!(own.traceparent[3..35], outer_trace.traceparent[3..35]);
    });
}

#[test]
fn without_an_exporter_nothing_is_sent() {
    // No OpenTelemetry layer: what `init` installs when nothing is configured.
    let subscriber = tracing_subscriber::registry();
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("change");
        continue_trace(
            &span,
            Some(&pb::TraceContext {
                traceparent: TRACEPARENT.to_owned(),
                tracestate: String::new(),
            }),
        );
        assert_eq!(context_of(&span), None);
    });
}

#[test]
fn malformed_or_empty_contexts_name_no_span() {
    for traceparent in ["", "00-zz-00f067aa0ba902b7-01", "garbage"] {
        let trace = pb::TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate: String::new(),
        };
        assert!(span_context(&trace).is_none(), "{traceparent:?}");
    }
}
