//! A real trace receiver: Jaeger v2 (built by `tests/tracing/build-jaeger.sh`) on a lab host,
//! receiving OTLP and answering its HTTP query API, for the tracing tests and the screenshot.

use crate::{
    addresses::CONTROL_PLANE,
    demo_cluster::{CONVERGE, Conditions, DemoCluster},
    eventually,
    lab::{Host, Lab, Process},
};
use anyhow::{Context, Result, ensure};
use serde::Deserialize;
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::Path,
    time::{Duration, SystemTime},
};

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

/// `time` in microseconds since the Unix epoch, as Jaeger's span start times are.
///
/// # Errors
///
/// If `time` is before the epoch or too far after it.
pub fn micros_since_epoch(time: SystemTime) -> Result<u64> {
    let since = time.duration_since(SystemTime::UNIX_EPOCH)?;
    Ok(u64::try_from(since.as_micros())?)
}

/// A running Jaeger (in-memory storage) on one lab host, listening on all its addresses.
pub struct Jaeger {
    host: Host,
    /// The Jaeger process.
    pub process: Process,
    /// Holds the configuration file, when there is one.
    _config: Option<tempfile::TempDir>,
}

/// The all-in-one setup (OTLP/gRPC in, in-memory storage, query API and UI on every address)
/// with the UI served from `assets`.
fn ui_config(assets: &Path) -> String {
    format!(
        r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    ui:
      assets_path: {assets}
    http:
      endpoint: 0.0.0.0:{QUERY_PORT}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 0.0.0.0:{OTLP_GRPC_PORT}
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"#,
        assets = assets.display()
    )
}

impl Jaeger {
    /// Builds Jaeger if it is not in the tools cache yet, starts it on `host` and waits until
    /// its query API answers. Its web UI is a placeholder page (see [`Jaeger::start_with_ui`]).
    ///
    /// # Errors
    ///
    /// If the build fails, or Jaeger does not start answering in time.
    pub fn start(lab: &mut Lab, host: &Host) -> Result<Self> {
        // Without --config, jaeger runs its built-in all-in-one configuration: OTLP receivers,
        // in-memory storage, query API and UI; this variable opens its ports beyond loopback.
        let env = [("JAEGER_LISTEN_HOST".to_owned(), "0.0.0.0".to_owned())];
        Self::spawn(lab, host, &[], &env, None)
    }

    /// [`Jaeger::start`], serving the web UI from `ui_assets` (a built Jaeger UI: `index.html`
    /// and its `static/` folder), which the Go module does not carry.
    ///
    /// # Errors
    ///
    /// As [`Jaeger::start`], and if the configuration cannot be written.
    pub fn start_with_ui(lab: &mut Lab, host: &Host, ui_assets: &Path) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("splitproxy-jaeger-")
            .tempdir()
            .context("creating Jaeger's configuration folder")?;
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, ui_config(ui_assets)).context("writing Jaeger's configuration")?;
        let config = config.to_string_lossy().into_owned();
        Self::spawn(lab, host, &["--config", &config], &[], Some(dir))
    }

    fn spawn(
        lab: &mut Lab,
        host: &Host,
        args: &[&str],
        env: &[(String, String)],
        config: Option<tempfile::TempDir>,
    ) -> Result<Self> {
        let bin = crate::built_tool("tracing/build-jaeger.sh")?;
        let process = lab.spawn_with_env(host, bin.join("jaeger"), args, env)?;
        let jaeger = Self {
            host: host.clone(),
            process,
            _config: config,
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

    /// Waits up to `timeout` for the complete trace of the manifests change made at
    /// `changed_at` (see [`Trace::check_change`]) among the controller's traces.
    ///
    /// # Errors
    ///
    /// If no such trace is complete in time: what each candidate lacks.
    pub fn change_trace(
        &self,
        lab: &Lab,
        changed_at: u64,
        nodes: &[&str],
        timeout: Duration,
    ) -> Result<Trace> {
        eventually("one trace holds the change on every node", timeout, || {
            let traces = self.traces(lab, "splitproxy-controller")?;
            let mut lacks = Vec::new();
            for trace in traces {
                match trace.check_change(changed_at, nodes) {
                    Ok(()) => return Ok(trace),
                    Err(err) => lacks.push(format!("{}: {err:#}", trace.trace_id)),
                }
            }
            anyhow::bail!("no complete trace yet: {}", lacks.join("; "))
        })
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

    /// Whether this is the complete trace of a manifests change made at `changed_at` (µs since the
    /// epoch) that changed one Service: the controller's change span, an applied `apply` span of
    /// one Service from the agent of each of `nodes` under a controller span, and successful
    /// `iptables sync` spans with their attributes under each `apply`.
    ///
    /// # Errors
    ///
    /// Says what is missing.
    pub fn check_change(&self, changed_at: u64, nodes: &[&str]) -> Result<()> {
        let trace = self;
        let change = trace
            .named("manifests change")
            .find(|s| s.tag("initial").as_deref() == Some("false") && s.start_time >= changed_at)
            .context("no manifests change span after the write")?;
        ensure!(
            trace.service_of(change) == Some("splitproxy-controller"),
            "the change span comes from {:?}",
            trace.service_of(change)
        );
        let mut seen = BTreeSet::new();
        for apply in trace.named("apply") {
            ensure!(
                trace.service_of(apply) == Some("splitproxy-agent"),
                "an apply span comes from {:?}",
                trace.service_of(apply)
            );
            let parent = trace
                .parent_of(apply)
                .context("an apply span has no parent")?;
            ensure!(
                trace.service_of(parent) == Some("splitproxy-controller"),
                "an apply span's parent is {:?}",
                parent.operation_name
            );
            ensure!(
                apply.tag("result").as_deref() == Some("applied"),
                "an apply span's result is {:?}",
                apply.tag("result")
            );
            ensure!(
                apply.tag("services_changed").as_deref() == Some("1"),
                "an apply span changed {:?} services",
                apply.tag("services_changed")
            );
            let kernel: Vec<_> = trace
                .named("iptables sync")
                .filter(|s| {
                    trace
                        .parent_of(s)
                        .is_some_and(|p| p.span_id == apply.span_id)
                })
                .collect();
            ensure!(
                !kernel.is_empty(),
                "an apply span has no iptables sync child"
            );
            for sync in kernel {
                ensure!(
                    sync.tag("result").as_deref() == Some("ok")
                        && sync.tag("ip_family").is_some()
                        && sync.tag("sync").is_some()
                        && sync.tag("rules_written").is_some(),
                    "an iptables sync span lacks its attributes: {:?}",
                    sync.tags
                );
            }
            seen.insert(apply.tag("node").context("an apply span has no node")?);
        }
        let expected: BTreeSet<String> = nodes.iter().map(|n| (*n).to_owned()).collect();
        ensure!(seen == expected, "apply spans from {seen:?}");
        Ok(())
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

/// The demo cluster exporting its controller's and agents' spans to a Jaeger on its
/// control-plane host: what the tracing test and the screenshot tool both run.
pub struct TracedDemo {
    /// The demo cluster.
    pub cluster: DemoCluster,
    /// The Jaeger receiving its spans.
    pub jaeger: Jaeger,
}

impl TracedDemo {
    /// The demo nodes, each of which applies every change.
    pub const NODES: &[&str] = &["node-1", "node-2"];
    /// The longest wait for a change's trace to be complete in Jaeger; generous because CI
    /// machines are slow and shared, and spans arrive in batches from three processes.
    pub const TRACE_ARRIVES: Duration = Duration::from_secs(120);

    /// Starts the demo cluster with OTLP export and Jaeger (serving the web UI from `ui_assets`
    /// if given), and waits until traffic reaches the ready web pods, so both nodes hold the
    /// demo state and a later change reaches them as a delta (an agent that connects late gets
    /// a reset holding every Service instead).
    ///
    /// # Errors
    ///
    /// If the cluster or Jaeger cannot start, or the cluster does not converge.
    pub fn start(tag: &str, ui_assets: Option<&Path>) -> Result<Self> {
        let env = otlp_env(CONTROL_PLANE);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut cluster = DemoCluster::start_with_env(tag, &[], &env)?;
        let host = cluster.control_plane.clone();
        let jaeger = match ui_assets {
            Some(assets) => Jaeger::start_with_ui(&mut cluster.lab, &host, assets)?,
            None => Jaeger::start(&mut cluster.lab, &host)?,
        };
        eventually("traffic reaches the ready web pods", CONVERGE, || {
            cluster.check_traffic(20).map(drop)
        })
        .with_context(|| cluster.logs())?;
        Ok(Self { cluster, jaeger })
    }

    /// Adds the Service `demo/traced` (10.96.0.20:80, backed by web-a) and returns the complete
    /// trace of that change (see [`Trace::check_change`]).
    ///
    /// # Errors
    ///
    /// If the manifest cannot be written or the trace is not complete in time (with the
    /// processes' logs).
    pub fn add_a_service(&self) -> Result<Trace> {
        let changed_at = micros_since_epoch(SystemTime::now())?;
        self.cluster.write_web_service(
            "traced",
            "  clusterIP: 10.96.0.20",
            "",
            &[("web-a", Conditions::ready(true))],
        )?;
        self.jaeger
            .change_trace(
                &self.cluster.lab,
                changed_at,
                Self::NODES,
                Self::TRACE_ARRIVES,
            )
            .with_context(|| {
                format!(
                    "{}\n--- jaeger\n{}",
                    self.cluster.logs(),
                    self.jaeger.process.log_tail(30)
                )
            })
    }
}
