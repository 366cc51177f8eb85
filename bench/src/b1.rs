//! B1 fan-out: a real controller serving a manifests directory over loopback gRPC to many hollow
//! agents (the real agent client and applier with a [`Probe`] dataplane) in this process, while
//! endpoints churn; measures how long each change takes to reach each agent's applied state.

use crate::{
    cluster::{NAMESPACE, Shape},
    probe::{Change, Changes, Probe, Record},
    process,
    stats::Summary,
};
use anyhow::{Context as _, bail};
use serde::Serialize;
use splitproxy_agent::{
    client::{self, ClientConfig, Controllers},
    status::Status,
    sync::Applier,
    sync_timer::SyncPeriods,
};
use splitproxy_controller::{cluster::ServiceSelector, manifests::ManifestsDir, wiring};
use splitproxy_dataplane::ServiceKey;
use splitproxy_proto::v1alpha1 as pb;
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};
use tokio::{net::TcpListener, task::JoinSet};

/// How often the run looks at the agents' records while waiting.
const POLL: Duration = Duration::from_millis(100);
/// kube-proxy's default --iptables-sync-period; the hollow agents keep it.
const SYNC_PERIOD: Duration = Duration::from_secs(30);
/// The hollow agents' reconnect backoff: shorter than the agent's default (500 ms to 30 s) so
/// a run that restarts its controller measures the controller, not the agents' patience.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What one B1 run does.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// How many Services.
    pub services: usize,
    /// How many endpoints over all Services.
    pub endpoints: usize,
    /// How many hollow agents (and Nodes).
    pub agents: usize,
    /// How many endpoint changes.
    pub changes: usize,
    /// The time between two changes.
    pub interval_ms: u64,
    /// The agents' minimum time between two syncs (kube-proxy's --iptables-min-sync-period).
    pub min_sync_period_ms: u64,
    /// How long to wait for the first full sync, and for the last change to arrive.
    pub timeout_s: u64,
}

/// What one B1 run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// The parameters of the run.
    pub params: Params,
    /// From starting the controller and agents to each agent holding every Service.
    pub first_full_sync: Option<Summary>,
    /// From writing a change to each agent applying a state holding it, over all
    /// (change, agent) pairs.
    pub programming_latency: Option<Summary>,
    /// (change, agent) pairs that had not arrived when the run stopped waiting.
    pub missing: usize,
    /// The changes (by index) some agent had not received when the run stopped waiting.
    pub missing_changes: Vec<usize>,
    /// Controller bytes sent (encoded protobuf) during churn, per agent and change.
    pub bytes_per_node_per_change: f64,
    /// Controller messages sent during churn, per agent and change.
    pub messages_per_node_per_change: f64,
    /// States the agents applied during churn, per agent.
    pub syncs_per_agent: f64,
    /// CPU time (user + system) of the whole process (controller and hollow agents) during
    /// the initial sync.
    pub cpu_initial_sync_s: f64,
    /// CPU time of the whole process during churn.
    pub cpu_churn_s: f64,
    /// Peak resident memory of the whole process.
    pub peak_rss_mib: f64,
    /// Every programming latency, in ms, for plots.
    #[serde(skip)]
    pub latencies: Vec<Duration>,
}

/// Runs B1 with `params` in `dir` (an empty directory it fills with manifests).
///
/// # Errors
///
/// Fails when the manifests cannot be written, the controller stops, or the agents do not all
/// hold the whole cluster within the timeout.
pub async fn run(params: Params, dir: &std::path::Path) -> anyhow::Result<Results> {
    let shape = Shape {
        services: params.services,
        endpoints: params.endpoints,
        nodes: params.agents,
        zones: 0,
    };
    shape.write(dir).context("writing the manifests")?;
    let periods = SyncPeriods::new(
        SYNC_PERIOD,
        Duration::from_millis(params.min_sync_period_ms),
    )
    .context("invalid --min-sync-period-ms")?;
    let timeout = Duration::from_secs(params.timeout_s);

    let mut tasks = JoinSet::new();
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .context("binding a loopback port")?;
    let url = format!("http://{}", listener.local_addr()?);
    let metrics = splitproxy_controller::metrics::Metrics::default();
    tasks.spawn(serve_manifests(listener, dir.to_owned(), metrics.clone()));

    let started = Instant::now();
    let cpu_start = process::cpu_time();
    let changes = Changes::default();
    let probes: Vec<Probe> = (0..params.agents)
        .map(|index| {
            let probe = Probe::new(changes.clone(), params.services, started);
            tasks.spawn(hollow_agent(
                Shape::node_name(index),
                url.clone(),
                probe.clone(),
                periods,
            ));
            probe
        })
        .collect();

    wait_until(&mut tasks, &probes, timeout, |r| r.full_sync.is_some())
        .await
        .context("waiting for every agent's first full sync")?;
    let cpu_synced = process::cpu_time();
    let full_syncs: Vec<Duration> = probes.iter().filter_map(|p| p.record().full_sync).collect();
    let syncs_before: u64 = probes.iter().map(|p| p.record().syncs).sum();
    let bytes_before = metrics.streams.bytes_sent.get();
    let messages_before = metrics.streams.messages_sent.get();

    for index in 0..params.changes {
        // Spread the changed Services over the whole cluster.
        let service = index * params.services / params.changes;
        let first = shape.endpoint_range(service).start;
        changes.push(Change {
            service: ServiceKey {
                namespace: NAMESPACE.into(),
                name: Shape::service_name(service),
            },
            ip: IpAddr::V4(Shape::endpoint_ip(first)),
            written: Instant::now(),
        });
        shape
            .rewrite(dir, service, false)
            .context("rewriting a Service's slice")?;
        tokio::time::sleep(Duration::from_millis(params.interval_ms)).await;
    }
    let all_arrived =
        |r: &Record| r.latencies.len() == params.changes && r.latencies.iter().all(Option::is_some);
    if let Err(err) = wait_until(&mut tasks, &probes, timeout, all_arrived).await {
        eprintln!("stopped waiting for the last changes: {err:#}");
    }
    let cpu_end = process::cpu_time();

    let records: Vec<Record> = probes.iter().map(Probe::record).collect();
    let latencies: Vec<Duration> = records
        .iter()
        .flat_map(|r| r.latencies.iter().flatten().copied())
        .collect();
    let pairs = params.agents * params.changes;
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let per_pair = |total: u64| total as f64 / pairs.max(1) as f64;
    let syncs_after: u64 = records.iter().map(|r| r.syncs).sum();
    let seconds = |from: Option<Duration>, to: Option<Duration>| match (from, to) {
        (Some(from), Some(to)) => to.saturating_sub(from).as_secs_f64(),
        _ => f64::NAN,
    };
    #[allow(clippy::cast_precision_loss)]
    let results = Results {
        first_full_sync: Summary::of(&full_syncs),
        programming_latency: Summary::of(&latencies),
        missing: pairs - latencies.len(),
        missing_changes: (0..params.changes)
            .filter(|&i| {
                records
                    .iter()
                    .any(|r| r.latencies.get(i).is_none_or(Option::is_none))
            })
            .collect(),
        bytes_per_node_per_change: per_pair(metrics.streams.bytes_sent.get() - bytes_before),
        messages_per_node_per_change: per_pair(
            metrics.streams.messages_sent.get() - messages_before,
        ),
        syncs_per_agent: (syncs_after - syncs_before) as f64 / params.agents as f64,
        cpu_initial_sync_s: seconds(cpu_start, cpu_synced),
        cpu_churn_s: seconds(cpu_synced, cpu_end),
        peak_rss_mib: process::peak_rss_bytes().unwrap_or(0) as f64 / (1024.0 * 1024.0),
        latencies,
        params,
    };
    tasks.abort_all();
    Ok(results)
}

/// A controller in this process serving the manifests in `dir` on `listener`, to any agent,
/// recording in `metrics`; runs until it fails.
pub async fn serve_manifests(
    listener: TcpListener,
    dir: std::path::PathBuf,
    metrics: splitproxy_controller::metrics::Metrics,
) -> anyhow::Result<()> {
    let serving = wiring::Serving {
        selector: ServiceSelector::default(),
        metrics,
        auth: splitproxy_controller::auth::AgentAuth::Open,
        tls: None,
        controller_service: None,
        fall_behind_limit: splitproxy_controller::fanout::FALL_BEHIND_LIMIT,
    };
    wiring::serve(listener, None, ManifestsDir::new(dir), serving)
        .await
        .context("controller stopped")
}

/// One hollow agent: the real client and applier for `node`, programming `probe`.
pub async fn hollow_agent(
    node: String,
    url: String,
    probe: Probe,
    periods: SyncPeriods,
) -> anyhow::Result<()> {
    let status = Status::default();
    let metrics = splitproxy_agent::metrics::Metrics::new(&mut Default::default());
    let config = ClientConfig {
        controllers: Controllers::Listed(vec![url]),
        node_name: node,
        proxy_mode: pb::ProxyMode::Iptables,
        min_backoff: MIN_BACKOFF,
        max_backoff: MAX_BACKOFF,
        credentials: Default::default(),
    };
    let applier =
        Applier::new("node-1", probe, status.clone(), metrics.clone()).with_sync_periods(periods);
    client::run(config, applier, status, metrics).await;
    Ok(())
}

/// Waits until `done` holds for every probe's record; fails after `timeout` or when a task
/// (the controller) stops.
async fn wait_until(
    tasks: &mut JoinSet<anyhow::Result<()>>,
    probes: &[Probe],
    timeout: Duration,
    done: impl Fn(&Record) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let pending = probes.iter().filter(|p| !done(&p.record())).count();
        if pending == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{pending} of {} agents not there after {timeout:?}",
                probes.len()
            );
        }
        if let Some(stopped) = tokio::time::timeout(POLL, tasks.join_next())
            .await
            .ok()
            .flatten()
        {
            stopped.context("a task panicked")??;
            bail!("a task stopped");
        }
    }
}
