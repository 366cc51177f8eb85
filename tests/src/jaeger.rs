//! A real trace receiver: Jaeger v2 (built by `tests/tracing/build-jaeger.sh`) on a lab host,
//! receiving OTLP and answering its HTTP query API, for the tracing tests and the screenshot.

use crate::{
    eventually,
    lab::{Host, Lab, Process},
};
use anyhow::{Context, Result};
use serde::Deserialize;
use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

/// Jaeger's OTLP/gRPC port.
pub const OTLP_GRPC_PORT: u16 = 4317;
/// Jaeger's query API and UI port.
pub const QUERY_PORT: u16 = 16686;
/// The longest wait for Jaeger to start answering; generous for slow, shared machines.
const START: Duration = Duration::from_secs(60);

/// The `OTEL_*` variables that make a splitproxy binary export its spans to a Jaeger on `host_ip`,
/// sending batches every 200 ms so a test does not wait on the 5 s default.
#[must_use]
pub fn otlp_env(host_ip: Ipv4Addr) -> Vec<(String, String)> {
    [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{host_ip}:{OTLP_GRPC_PORT}"),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "200".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A running Jaeger (in-memory storage) on one lab host, listening on all its addresses.
pub struct Jaeger {
    host: Host,
    /// The Jaeger process.
    pub process: Process,
}

impl Jaeger {
    /// Builds Jaeger if it is not in the tools cache yet, starts it on `host` and waits until
    /// its query API answers.
    ///
    /// # Errors
    ///
    /// If the build fails, or Jaeger does not start answering in time.
    pub fn start(lab: &mut Lab, host: &Host) -> Result<Self> {
        let bin = crate::built_tool("tracing/build-jaeger.sh")?;
        // Without --config, jaeger runs its built-in all-in-one configuration: OTLP receivers,
        // in-memory storage, query API and UI; this variable opens its ports beyond loopback.
        let env = [("JAEGER_LISTEN_HOST".to_owned(), "0.0.0.0".to_owned())];
        let process = lab.spawn_with_env(host, bin.join("jaeger"), &[], &env)?;
        let jaeger = Self {
            host: host.clone(),
            process,
        };
        eventually("jaeger answers its query API", START, || {
            jaeger.query(lab, "/api/services").map(drop)
        })
        .with_context(|| jaeger.process.log_tail(40))?;
        Ok(jaeger)
    }

    /// The UI and query API's base URL, as reached from inside the lab.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}:{QUERY_PORT}", self.host.ip())
    }

    /// The traces of `service` Jaeger holds (the newest 50 of the last hour).
    ///
    /// # Errors
    ///
    /// If the query fails or its answer does not parse.
    pub fn traces(&self, lab: &Lab, service: &str) -> Result<Vec<Trace>> {
        let body = self.query(
            lab,
            &format!("/api/traces?service={service}&limit=50&lookback=1h"),
        )?;
        let answer: Answer = serde_json::from_str(&body).context("parsing Jaeger's traces")?;
        Ok(answer.data)
    }

    /// GETs `path` from the query API with `curl` inside the lab host's namespace.
    fn query(&self, lab: &Lab, path: &str) -> Result<String> {
        let url = format!("{}{path}", self.url());
        lab.exec_ok(&self.host, "curl", &["-sSf", "--max-time", "10", &url])
    }
}

#[derive(Debug, Deserialize)]
struct Answer {
    data: Vec<Trace>,
}

/// One trace as Jaeger's query API returns it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    /// The trace id.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// Its spans.
    pub spans: Vec<Span>,
    /// The processes (services) that sent spans, by the ids spans refer to.
    pub processes: BTreeMap<String, TraceProcess>,
}

impl Trace {
    /// The service name of `span`'s process.
    #[must_use]
    pub fn service_of(&self, span: &Span) -> Option<&str> {
        self.processes
            .get(&span.process_id)
            .map(|p| p.service_name.as_str())
    }

    /// The spans called `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Span> + 'a {
        self.spans.iter().filter(move |s| s.operation_name == name)
    }

    /// The span's parent in this trace, if it has one.
    #[must_use]
    pub fn parent_of(&self, span: &Span) -> Option<&Span> {
        let parent = span
            .references
            .iter()
            .find(|r| r.ref_type == "CHILD_OF" && r.trace_id == self.trace_id)?;
        self.spans.iter().find(|s| s.span_id == parent.span_id)
    }
}

/// One span.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Span {
    /// The span id.
    #[serde(rename = "spanID")]
    pub span_id: String,
    /// The span's name.
    pub operation_name: String,
    /// Its parent and links.
    #[serde(default)]
    pub references: Vec<Reference>,
    /// When it started, in microseconds since the Unix epoch.
    pub start_time: u64,
    /// Its attributes.
    #[serde(default)]
    pub tags: Vec<Tag>,
    /// The key of its process in [`Trace::processes`].
    #[serde(rename = "processID")]
    pub process_id: String,
}

impl Span {
    /// The attribute `key`, as text.
    #[must_use]
    pub fn tag(&self, key: &str) -> Option<String> {
        let tag = self.tags.iter().find(|t| t.key == key)?;
        Some(match &tag.value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

/// A span's reference to another span.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reference {
    /// `CHILD_OF` (the parent) or `FOLLOWS_FROM` (a link).
    pub ref_type: String,
    /// The referenced span's trace.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// The referenced span.
    #[serde(rename = "spanID")]
    pub span_id: String,
}

/// A span attribute.
#[derive(Debug, Clone, Deserialize)]
pub struct Tag {
    /// Its name.
    pub key: String,
    /// Its value.
    pub value: serde_json::Value,
}

/// A process that sent spans.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceProcess {
    /// Its `service.name`.
    pub service_name: String,
}
