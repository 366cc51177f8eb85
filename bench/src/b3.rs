//! B3 API-server load: the same cluster and the same endpoint churn served to N nodes by upstream
//! kube-proxies (each watching the API server) and by splitproxy (controller replicas watch it,
//! agents follow them), measured with the API server's own metrics: watches it holds, bytes of
//! watch events it sends, and its CPU time.
//!
//! One real control plane (etcd, kube-apiserver, kube-controller-manager) runs for the whole
//! bench; node namespaces and Node objects are added as N grows. A baseline churn with no proxies
//! at all measures what the API server sends anyway (kube-controller-manager watches slices too),
//! so each phase's own share is its bytes over the baseline.

mod apiserver;
mod fleet;
mod workload;

use crate::{
    cluster::{self, Shape},
    svg,
};
use anyhow::{Context as _, Result, bail, ensure};
use apiserver::{Growth, Snapshot};
use fleet::{CONTROLLER_REPLICAS, Fleet, Phase};
use serde::Serialize;
use splitproxy_e2e::{
    addresses::{CONTROL_PLANE, node_ip, pod_cidr},
    control_plane::{Binaries, ControlPlane},
    eventually,
    lab::{Lab, Node},
};
use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

/// The controller's counters of what it sent to agents.
const CONTROLLER_BYTES: &str = "splitproxy_controller_update_bytes_sent_total";
const CONTROLLER_MESSAGES: &str = "splitproxy_controller_update_messages_sent_total";
/// How long killed clients' watches may take to end on the API server.
const WATCHES_END: Duration = Duration::from_secs(120);
/// How long watch events must stop for before the baseline churn counts as delivered.
const SETTLE: Duration = Duration::from_secs(1);

/// B3's flags.
#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    /// How many Services (without selectors; the bench writes their EndpointSlices).
    #[arg(long, env = "B3_SERVICES", default_value_t = 1_000)]
    services: usize,
    /// How many endpoints, spread evenly over the Services (at least one each).
    #[arg(long, env = "B3_ENDPOINTS", default_value_t = 10_000)]
    endpoints: usize,
    /// The cluster sizes to measure, comma-separated, each at most 200.
    #[arg(
        long,
        env = "B3_NODES",
        value_delimiter = ',',
        default_value = "10,20,50"
    )]
    nodes: Vec<usize>,
    /// How many endpoint changes per phase (each to a different Service, so at most --services).
    #[arg(long, env = "B3_CHANGES", default_value_t = 50)]
    changes: usize,
    /// Milliseconds between two changes.
    #[arg(long, env = "B3_INTERVAL_MS", default_value_t = 200)]
    interval_ms: u64,
    /// Seconds to wait for every proxy to program the cluster, and the churn.
    #[arg(long, env = "B3_TIMEOUT_S", default_value_t = 600)]
    timeout_s: u64,
    /// Where b3.json and b3.svg go.
    #[arg(long, env = "B3_OUTPUT", default_value = "bench/results")]
    output: PathBuf,
}

impl Args {
    /// Where b3.json and b3.svg go.
    #[must_use]
    pub fn output(&self) -> &std::path::Path {
        &self.output
    }
}

/// What one B3 run does.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// How many Services.
    pub services: usize,
    /// How many endpoints over all Services.
    pub endpoints: usize,
    /// The cluster sizes, ascending.
    pub nodes: Vec<usize>,
    /// Endpoint changes per phase.
    pub changes: usize,
    /// The time between two changes.
    pub interval_ms: u64,
    /// How long to wait for programming and churn.
    pub timeout_s: u64,
    /// splitproxy controller replicas (each watches the API server).
    pub controller_replicas: u16,
    /// Whom the proxies authenticate as.
    pub proxy_identity: &'static str,
}

impl Args {
    /// The parameters, checked.
    ///
    /// # Errors
    ///
    /// If a size is zero, out of range, or inconsistent with another.
    pub fn params(&self) -> Result<Params> {
        if self.services == 0 || self.changes == 0 || self.nodes.is_empty() {
            bail!("--services, --changes and --nodes must be at least 1");
        }
        cluster::check_churn(self.services, self.endpoints, self.changes)?;
        if let Some(bad) = self.nodes.iter().find(|&&n| n == 0 || n > 200) {
            bail!("--nodes {bad}: each size must be 1 to 200 (the lab's node addresses)");
        }
        let mut nodes = self.nodes.clone();
        nodes.sort_unstable();
        nodes.dedup();
        Ok(Params {
            services: self.services,
            endpoints: self.endpoints,
            nodes,
            changes: self.changes,
            interval_ms: self.interval_ms,
            timeout_s: self.timeout_s,
            controller_replicas: CONTROLLER_REPLICAS,
            proxy_identity: "cluster admin (kube-proxies and controllers alike; the load does not depend on it)",
        })
    }
}

/// What the API server does with no proxy running.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    /// WATCH requests it serves (kube-controller-manager's), in all.
    pub watches: f64,
    /// Per resource.
    pub watches_by_resource: BTreeMap<String, f64>,
    /// What the churn cost it.
    pub churn: Growth,
    /// Watch-event bytes of the proxies' resources per change.
    pub watch_bytes_per_change: f64,
}

/// One phase at one cluster size.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRun {
    /// How many nodes (one proxy each).
    pub nodes: usize,
    /// Which proxies.
    pub phase: Phase,
    /// The machine's 1-minute load average when the phase started (it is shared).
    pub load_average_1m: f64,
    /// From starting the proxies until every node programmed every endpoint.
    pub sync_s: f64,
    /// What that initial sync cost the API server.
    pub sync: Growth,
    /// Bytes it sent for it (watch events of the proxies' resources and LIST responses).
    pub sync_bytes: f64,
    /// WATCH requests the API server serves once synced, in all.
    pub watches: f64,
    /// The same over the baseline: the phase's own.
    pub watches_over_baseline: f64,
    /// Per resource.
    pub watches_by_resource: BTreeMap<String, f64>,
    /// From the first change until every node programmed the last.
    pub churn_s: f64,
    /// What the churn cost the API server.
    pub churn: Growth,
    /// Watch-event bytes of the proxies' resources per change.
    pub watch_bytes_per_change: f64,
    /// The same over the baseline: what this phase's watchers received per change.
    pub watch_bytes_per_change_over_baseline: f64,
    /// Bytes the controllers sent to agents during churn (encoded protobuf); zero upstream.
    pub controller_bytes_churn: f64,
    /// Messages the controllers sent to agents during churn; zero upstream.
    pub controller_messages_churn: f64,
    /// Controller bytes per node per change.
    pub controller_bytes_per_node_per_change: f64,
    /// CPU of the phase's processes (kube-proxies, or agents and controllers) during the sync.
    pub proxies_cpu_sync_s: f64,
    /// The same during churn.
    pub proxies_cpu_churn_s: f64,
    /// CPU of the tools they ran (`iptables-restore`, `iptables`, `conntrack`) during the sync.
    pub tools_cpu_sync_s: f64,
    /// The same during churn.
    pub tools_cpu_churn_s: f64,
    /// Their resident memory together after the churn.
    pub proxies_rss_mib: f64,
}

/// Upstream over splitproxy at one cluster size.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// How many nodes.
    pub nodes: usize,
    /// Watches of the phase (over the baseline).
    pub watches: f64,
    /// Watch-event bytes per change (over the baseline).
    pub watch_bytes_per_change: f64,
    /// API-server CPU during churn.
    pub apiserver_cpu_churn: f64,
    /// API-server CPU during the initial sync.
    pub apiserver_cpu_sync: f64,
    /// Bytes the API server sent for the initial sync.
    pub sync_bytes: f64,
}

/// What one B3 run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// The parameters.
    pub params: Params,
    /// How long creating the Services and slices took.
    pub create_s: f64,
    /// The API server with no proxies.
    pub baseline: Baseline,
    /// Every phase at every size, in the order run.
    pub runs: Vec<PhaseRun>,
    /// Upstream over splitproxy per size.
    pub ratios: Vec<Ratio>,
}

/// The bench's world: the lab, the control plane, and the nodes registered so far with their
/// agent tokens.
struct Bench {
    lab: Lab,
    control_plane: ControlPlane,
    binaries: Binaries,
    shape: Shape,
    params: Params,
    nodes: Vec<(Node, PathBuf)>,
    baseline_watches: f64,
}

impl Bench {
    fn snapshot(&self) -> Result<Snapshot> {
        Ok(Snapshot::parse(&self.control_plane.metrics(&self.lab)?))
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.params.timeout_s)
    }

    fn flip(&self, ready: bool, interval: Duration) -> Result<()> {
        workload::flip(
            &self.control_plane,
            &self.lab,
            self.params.changes,
            ready,
            interval,
        )
    }

    /// Adds node namespaces and Node objects up to `count`.
    fn grow_to(&mut self, count: usize) -> Result<()> {
        while self.nodes.len() < count {
            let number = u8::try_from(self.nodes.len() + 1).context("at most 200 nodes")?;
            let node = self.lab.add_node(
                &Shape::node_name(self.nodes.len()),
                node_ip(number),
                pod_cidr(number),
            )?;
            let token = workload::register_node(&self.control_plane, &self.lab, &node)?;
            self.nodes.push((node, token));
        }
        Ok(())
    }

    /// The churn with no proxy running.
    fn baseline(&mut self) -> Result<Baseline> {
        let before = self.snapshot()?;
        self.flip(false, self.interval())?;
        let after = self.settled()?;
        self.flip(true, Duration::ZERO)?;
        let churn = after.since(&before);
        self.baseline_watches = after.total_watches();
        Ok(Baseline {
            watches: self.baseline_watches,
            watches_by_resource: after.watches,
            watch_bytes_per_change: per_change(churn.proxy_watch_bytes(), self.params.changes),
            churn,
        })
    }

    /// A snapshot once the API server has stopped sending watch events of the proxies'
    /// resources: with no proxy to wait for, the last change's events may still be on their way.
    fn settled(&self) -> Result<Snapshot> {
        let mut last = self.snapshot()?;
        eventually("watch events stop", self.timeout(), || {
            std::thread::sleep(SETTLE);
            let now = self.snapshot()?;
            let sent = now.since(&last).proxy_watch_events();
            last = now;
            ensure!(sent < 1.0, "{sent} more watch events");
            Ok(())
        })?;
        Ok(last)
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(self.params.interval_ms)
    }

    /// One phase on the first `count` nodes: start, sync, churn, stop, and put things back.
    fn phase(&mut self, phase: Phase, count: usize, baseline: &Baseline) -> Result<PhaseRun> {
        let nodes = self.nodes[..count].to_vec();
        let (endpoints, changes) = (self.shape.endpoints, self.params.changes);
        let load_average_1m = crate::process::load_average()?
            .first()
            .copied()
            .context("/proc/loadavg has no load average")?;
        println!("b3: {count} nodes, {phase:?}: starting (load average {load_average_1m})");

        let before_sync = self.snapshot()?;
        let start = Instant::now();
        let fleet = Fleet::start(
            phase,
            &mut self.lab,
            &self.control_plane,
            &self.binaries,
            &nodes,
        )?;
        let timeout = self.timeout();
        fleet::await_endpoints(
            &mut self.lab,
            Some(&fleet),
            &nodes,
            &self.shape,
            endpoints,
            timeout,
        )?;
        let sync_s = start.elapsed().as_secs_f64();
        let synced = self.snapshot()?;
        let proxies_cpu_sync_s = fleet.cpu_s();
        let tools_cpu_sync_s = fleet.tools_cpu_s();
        println!(
            "b3: {count} nodes, {phase:?}: synced in {sync_s:.1} s, {} watches",
            synced.total_watches()
        );

        let controller_before = self.controller_counters(&fleet)?;
        let before_churn = self.snapshot()?;
        let start = Instant::now();
        self.flip(false, self.interval())?;
        fleet::await_endpoints(
            &mut self.lab,
            Some(&fleet),
            &nodes,
            &self.shape,
            endpoints - changes,
            timeout,
        )?;
        let churn_s = start.elapsed().as_secs_f64();
        let after_churn = self.snapshot()?;
        let controller_after = self.controller_counters(&fleet)?;
        let proxies_cpu_churn_s = fleet.cpu_s() - proxies_cpu_sync_s;
        let tools_cpu_churn_s = fleet.tools_cpu_s() - tools_cpu_sync_s;
        let proxies_rss_mib = fleet.rss_mib();
        println!("b3: {count} nodes, {phase:?}: churn reached every node in {churn_s:.1} s");

        fleet.stop(&mut self.lab)?;
        self.restore(&nodes)?;

        let churn = after_churn.since(&before_churn);
        let sync = synced.since(&before_sync);
        let watches = synced.total_watches();
        let controller_bytes_churn = controller_after.0 - controller_before.0;
        let watch_bytes_per_change = per_change(churn.proxy_watch_bytes(), changes);
        Ok(PhaseRun {
            nodes: count,
            phase,
            load_average_1m,
            sync_s,
            sync_bytes: sync.sync_bytes(),
            sync,
            watches,
            watches_over_baseline: watches - baseline.watches,
            watches_by_resource: synced.watches,
            churn_s,
            watch_bytes_per_change,
            watch_bytes_per_change_over_baseline: watch_bytes_per_change
                - baseline.watch_bytes_per_change,
            churn,
            controller_bytes_churn,
            controller_messages_churn: controller_after.1 - controller_before.1,
            controller_bytes_per_node_per_change: per_change(
                controller_bytes_churn,
                changes * count,
            ),
            proxies_cpu_sync_s,
            proxies_cpu_churn_s,
            tools_cpu_sync_s,
            tools_cpu_churn_s,
            proxies_rss_mib,
        })
    }

    /// The controllers' (bytes, messages) sent so far.
    fn controller_counters(&self, fleet: &Fleet) -> Result<(f64, f64)> {
        let counter = |name| fleet.controller_counter(&self.lab, &self.control_plane, name);
        Ok((counter(CONTROLLER_BYTES)?, counter(CONTROLLER_MESSAGES)?))
    }

    /// After a phase: empty rules on the nodes, every endpoint ready again, and the API server
    /// back at the baseline's watches.
    fn restore(&mut self, nodes: &[(Node, PathBuf)]) -> Result<()> {
        fleet::clean_nodes(&self.lab, nodes)?;
        let timeout = self.timeout();
        fleet::await_endpoints(&mut self.lab, None, nodes, &self.shape, 0, timeout)?;
        self.flip(true, Duration::ZERO)?;
        let baseline = self.baseline_watches;
        eventually("the killed proxies' watches end", WATCHES_END, || {
            let watches = self.snapshot()?.total_watches();
            ensure!(
                watches <= baseline,
                "{watches} watches, the baseline is {baseline}"
            );
            Ok(())
        })
    }
}

/// Runs B3 and returns what it measured, handing the results so far to `save` after each
/// cluster size (a long run that fails late still leaves what it measured).
///
/// # Errors
///
/// If the control plane or a proxy cannot start, or a proxy does not program what it should.
pub fn run(
    params: Params,
    scratch: &std::path::Path,
    mut save: impl FnMut(&Results) -> Result<()>,
) -> Result<Results> {
    let binaries = Binaries::ensure()?;
    let mut lab = Lab::new("bench")?;
    let host = lab.add_host("cp", CONTROL_PLANE)?;
    let control_plane = ControlPlane::start(&mut lab, &host, binaries.clone())?;
    let shape = Shape {
        services: params.services,
        endpoints: params.endpoints,
        nodes: params.nodes.iter().copied().max().unwrap_or(1),
        zones: 0,
    };
    let create_s = workload::create(&control_plane, &lab, &shape, scratch)?.as_secs_f64();
    println!(
        "b3: created {} Services and slices in {create_s:.1} s",
        shape.services
    );
    let mut bench = Bench {
        lab,
        control_plane,
        binaries,
        shape,
        params: params.clone(),
        nodes: Vec::new(),
        baseline_watches: 0.0,
    };
    let mut results = Results {
        baseline: bench.baseline()?,
        params,
        create_s,
        runs: Vec::new(),
        ratios: Vec::new(),
    };
    for count in results.params.nodes.clone() {
        bench.grow_to(count)?;
        let upstream = bench.phase(Phase::Upstream, count, &results.baseline)?;
        let split = bench.phase(Phase::Splitproxy, count, &results.baseline)?;
        results.ratios.push(ratio(&upstream, &split));
        results.runs.extend([upstream, split]);
        save(&results)?;
    }
    Ok(results)
}

/// Upstream over splitproxy.
fn ratio(upstream: &PhaseRun, split: &PhaseRun) -> Ratio {
    Ratio {
        nodes: upstream.nodes,
        watches: upstream.watches_over_baseline / split.watches_over_baseline,
        watch_bytes_per_change: upstream.watch_bytes_per_change_over_baseline
            / split.watch_bytes_per_change_over_baseline,
        apiserver_cpu_churn: upstream.churn.cpu_s / split.churn.cpu_s,
        apiserver_cpu_sync: upstream.sync.cpu_s / split.sync.cpu_s,
        sync_bytes: upstream.sync_bytes / split.sync_bytes,
    }
}

fn per_change(total: f64, changes: usize) -> f64 {
    #[allow(clippy::cast_precision_loss)] // far below 2^52
    let changes = changes as f64;
    total / changes
}

/// Watches (over the baseline) and watch-event bytes per change (over the baseline) against the
/// number of nodes, one line per phase, side by side.
#[must_use]
pub fn plot(results: &Results) -> String {
    let series = |measure: fn(&PhaseRun) -> f64| -> Vec<svg::Series> {
        [Phase::Upstream, Phase::Splitproxy]
            .into_iter()
            .map(|phase| svg::Series {
                name: match phase {
                    Phase::Upstream => "upstream kube-proxies".to_owned(),
                    Phase::Splitproxy => format!(
                        "splitproxy ({} controllers + agents)",
                        results.params.controller_replicas
                    ),
                },
                points: results
                    .runs
                    .iter()
                    .filter(|run| run.phase == phase)
                    .map(|run| {
                        #[allow(clippy::cast_precision_loss)] // at most 200
                        let nodes = run.nodes as f64;
                        (nodes, measure(run))
                    })
                    .collect(),
            })
            .collect()
    };
    let p = &results.params;
    svg::side_by_side(&[
        svg::lines(
            &format!("B3: API-server watches ({} Services)", p.services),
            "nodes",
            "watches held (over baseline)",
            &series(|run| run.watches_over_baseline),
        ),
        svg::lines(
            &format!(
                "B3: API-server watch bytes per endpoint change ({} endpoints)",
                p.endpoints
            ),
            "nodes",
            "bytes per change (over baseline)",
            &series(|run| run.watch_bytes_per_change_over_baseline),
        ),
    ])
}
