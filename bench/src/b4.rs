//! B4 scale: the real controller in its own process (pinned to one CPU), serving a manifests
//! directory to thousands of nodes simulated in this process by thin protocol clients
//! ([`thin`]), plus a few real hollow agents as canaries. Measures network programming latency
//! under churn (a file written → each node's ACK, the min-sync timer and a sync time included),
//! the controller's CPU and memory, this generator's own CPU (so a run where the generator is the
//! bottleneck says so), and optionally what a SIGKILLed and restarted controller costs.

mod controller;
pub mod shapes;
pub mod sweep;
mod thin;

use crate::{
    b1,
    cluster::{NAMESPACE, Shape},
    probe::{self, Probe},
    process,
    stats::Summary,
};
use anyhow::{Context as _, bail};
use serde::Serialize;
use splitproxy_agent::sync_timer::SyncPeriods;
use splitproxy_dataplane::ServiceKey;
use splitproxy_e2e::control_plane;
use splitproxy_proto::v1alpha1 as pb;
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    sync::{Arc, PoisonError},
    time::{Duration, Instant},
};
use thin::Recorder;

/// How often the run looks at the records while waiting.
const POLL: Duration = Duration::from_millis(250);
/// How often a wait says how far it got.
const PROGRESS: Duration = Duration::from_secs(15);
/// The agents' periodic resync; the thin clients do not resync, the canaries keep it.
const SYNC_PERIOD: Duration = Duration::from_secs(30);
/// Zones the Nodes are spread over with --hints.
const ZONES: usize = 3;
/// Above this share of its CPUs the generator may be what limits the run.
const BUSY_GENERATOR: f64 = 0.9;

/// What one B4 run does.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// How many nodes (thin clients plus canaries).
    pub nodes: usize,
    /// How many Services.
    pub services: usize,
    /// How many endpoints over all Services.
    pub endpoints: usize,
    /// Endpoint changes during the steady churn (and again during a restart).
    pub changes: usize,
    /// Milliseconds between two changes.
    pub interval_ms: u64,
    /// The agents' minimum time between two syncs.
    pub min_sync_period_ms: u64,
    /// How long a thin client takes to apply a revision (B2's nftables partial sync at 10k).
    pub sync_ms: u64,
    /// Whether every endpoint carries a zone hint (and Nodes a zone).
    pub hints: bool,
    /// The Services beside the churned ones that cost per node (`--daemon-sets`,
    /// `--local-services`, `--hostile-slices`).
    pub shapes: shapes::Shapes,
    /// Whether the thin clients take endpoint sets filtered for their node, as agents before
    /// protocol rule 15, rather than in cluster form.
    pub filtered_endpoints: bool,
    /// Whether to SIGKILL and restart the controller under churn.
    pub restart: bool,
    /// Whether to add a second controller replica under churn, after the steady churn.
    pub add_replica: bool,
    /// How many of the nodes are real hollow agents.
    pub canaries: usize,
    /// The CPU the controller is pinned to.
    pub controller_cpu: Option<usize>,
    /// Seconds to wait for each phase.
    pub timeout_s: u64,
}

/// What one B4 run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// The parameters of the run.
    pub params: Params,
    /// Median network programming latency over all (change, thin node) pairs, in ms.
    pub p50_ms: Option<f64>,
    /// Its 99th percentile, in ms.
    pub p99_ms: Option<f64>,
    /// The latency summary of the thin nodes during the steady churn.
    pub programming_latency: Option<Summary>,
    /// The same for the canaries (real agent code), from writing a change to applying it.
    pub canary_latency: Option<Summary>,
    /// (change, node) pairs that had not arrived when the run stopped waiting.
    pub missing: usize,
    /// From starting the controller to every node acknowledging the whole cluster.
    pub initial_sync_s: f64,
    /// The controller's CPU during the initial sync.
    pub controller_initial_sync_cpu_seconds: f64,
    /// The controller's CPU during the steady churn.
    pub controller_cpu_seconds: f64,
    /// That per change and node, in µs.
    pub controller_cpu_us_per_change_per_node: f64,
    /// The controller's resident memory after the steady churn.
    pub controller_rss_bytes: Option<u64>,
    /// Its peak resident memory up to then (the initial sync included).
    pub controller_peak_rss_bytes: Option<u64>,
    /// The generator's (this process's) CPU during the steady churn.
    pub generator_cpu_seconds: f64,
    /// That as a share of the CPUs the generator may run on (0–1).
    pub generator_busy: f64,
    /// Whether the generator was busy enough to be what limited the run.
    pub generator_bottleneck: bool,
    /// With --restart: from the SIGKILL to every thin node acknowledging the new controller.
    pub restart_seconds: Option<f64>,
    /// With --restart: thin nodes that had not resumed on the new controller when the run
    /// stopped waiting for them (then `restart_seconds` is null).
    pub restart_unresolved_nodes: Option<usize>,
    /// With --restart: the generator's `generator_busy` from the SIGKILL until every node holds
    /// the changes made meanwhile; when high, the restart measures the clients as much as the
    /// controller.
    pub restart_generator_busy: Option<f64>,
    /// With --restart: resets the nodes received from the new controller.
    pub restart_resets: Option<u64>,
    /// With --restart: the new controller's peak resident memory.
    pub restart_peak_rss_bytes: Option<u64>,
    /// With --restart: latencies of the changes made while the controller restarted.
    pub restart_latency: Option<Summary>,
    /// With --add-replica: from marking the second replica ready to the first holding no more
    /// than its share of the nodes.
    pub rebalance_seconds: Option<f64>,
    /// With --add-replica: the thin nodes on the second replica at the end.
    pub rebalance_moved_nodes: Option<usize>,
    /// With --add-replica: resets the nodes received meanwhile.
    pub rebalance_resets: Option<u64>,
    /// With --add-replica: the first replica's CPU from marking the second ready to the end of
    /// the churn made meanwhile.
    pub rebalance_first_cpu_seconds: Option<f64>,
    /// With --add-replica: the second replica's CPU over the same time, its start included.
    pub rebalance_second_cpu_seconds: Option<f64>,
    /// With --add-replica: the second replica's peak resident memory.
    pub rebalance_second_peak_rss_bytes: Option<u64>,
    /// With --add-replica: latencies of the changes made while the nodes moved.
    pub rebalance_latency: Option<Summary>,
    /// Every steady-churn latency, for plots.
    #[serde(skip)]
    pub latencies: Vec<Duration>,
}

/// The nodes of a run and what they record.
struct Fleet {
    thin: Vec<Recorder>,
    canaries: Vec<Probe>,
}

impl Fleet {
    fn thin_records(&self) -> Vec<thin::Record> {
        self.thin
            .iter()
            .map(|r| r.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .collect()
    }

    /// How many nodes do not yet satisfy `thin_done` / `canary_done`.
    fn pending(
        &self,
        thin_done: impl Fn(&thin::Record) -> bool,
        canary_done: impl Fn(&probe::Record) -> bool,
    ) -> usize {
        // Under each lock in turn: this runs every poll, over thousands of records.
        self.thin
            .iter()
            .filter(|r| !thin_done(&r.lock().unwrap_or_else(PoisonError::into_inner)))
            .count()
            + self
                .canaries
                .iter()
                .filter(|p| !canary_done(&p.record()))
                .count()
    }

    /// Up to a few thin nodes (by position) and the first change of `changes` each lacks, for
    /// when a wait gives up.
    fn lacking(&self, changes: std::ops::Range<usize>) -> Vec<(usize, usize)> {
        self.thin_records()
            .iter()
            .enumerate()
            .filter_map(|(node, r)| {
                changes
                    .clone()
                    .find(|&i| r.latencies.get(i).is_none_or(Option::is_none))
                    .map(|change| (node, change))
            })
            .take(5)
            .collect()
    }

    /// Waits until every node holds the changes numbered `changes`; when it gives up, says which
    /// nodes lack which, and the run goes on with what arrived.
    async fn wait_for(
        &self,
        controller: &mut controller::Controller,
        timeout: Duration,
        what: &str,
        changes: std::ops::Range<usize>,
    ) {
        if let Err(err) = wait(controller, timeout, what, || self.arrived(changes.clone())).await {
            eprintln!(
                "b4: stopped waiting: {err:#}; (thin node, change) lacking: {:?}",
                self.lacking(changes)
            );
        }
    }

    /// How many nodes lack some of the changes numbered `changes`.
    fn arrived(&self, changes: std::ops::Range<usize>) -> usize {
        let has = |latencies: &[Option<Duration>]| {
            changes
                .clone()
                .all(|i| latencies.get(i).is_some_and(Option::is_some))
        };
        self.pending(|r| has(&r.latencies), |r| has(&r.latencies))
    }
}

/// The loopback address thin node `index` connects from: one per node, in 127.10.0.1 and up
/// (the whole 127/8 is the loopback's), none ending in 0 or 255.
fn loopback_of(index: usize) -> IpAddr {
    let octet = |n: usize| u8::try_from(n).unwrap_or(u8::MAX);
    IpAddr::V4(Ipv4Addr::new(
        127,
        octet(10 + index / 250 / 250),
        octet(index / 250 % 250),
        octet(index % 250 + 1),
    ))
}

/// Writes one EndpointSlice of the controllers' Service per replica listening on `listen`
/// (all on loopback), ready as `ready` says. No Service object: only the replicas read the
/// slices.
fn write_replicas(dir: &Path, replicas: &[(SocketAddr, bool)]) -> std::io::Result<()> {
    let ports: Vec<u16> = replicas.iter().map(|(listen, _)| listen.port()).collect();
    let ready: Vec<bool> = replicas.iter().map(|(_, ready)| *ready).collect();
    let yaml =
        control_plane::controller_slices_yaml(&Ipv4Addr::LOCALHOST.to_string(), &ports, &ready);
    std::fs::write(dir.join("controllers.yaml"), yaml)
}

/// Runs B4 with `params`, its manifests in `dir` (empty) and the controller's log in `output`.
///
/// # Errors
///
/// Fails when the manifests cannot be written, the controller does not start or stops, or the
/// nodes do not all hold the whole cluster within the timeout.
pub async fn run(params: Params, dir: &Path, output: &Path) -> anyhow::Result<Results> {
    let shape = Shape {
        services: params.services,
        endpoints: params.endpoints,
        nodes: params.nodes,
        zones: if params.hints { ZONES } else { 0 },
    };
    shape.write(dir).context("writing the manifests")?;
    (params.shapes)
        .write(dir, &shape)
        .context("writing the manifests of the other shapes")?;
    let services = params.services + params.shapes.services();
    let periods = SyncPeriods::new(
        SYNC_PERIOD,
        Duration::from_millis(params.min_sync_period_ms),
    )
    .context("invalid --min-sync-period-ms")?;
    let timeout = Duration::from_secs(params.timeout_s);
    let launch = controller::Launch {
        binary: controller::binary()?,
        manifests: dir.to_owned(),
        listen: free_port()?,
        cpu: params.controller_cpu.filter(|_| controller::can_pin()),
        log: output.join("b4-controller.log"),
        controller_service: None,
    };
    // With --add-replica, a second replica on its own port, not ready until the steady churn
    // is over; both count each other in the controllers' Service.
    let (launch, second) = if params.add_replica {
        let launch = controller::Launch {
            controller_service: Some(format!(
                "{}/{}",
                control_plane::AGENT_NAMESPACE,
                control_plane::CONTROLLER_SERVICE
            )),
            ..launch
        };
        let second = controller::Launch {
            listen: free_port()?,
            cpu: None,
            log: output.join("b4-controller-2.log"),
            ..launch.clone()
        };
        write_replicas(dir, &[(launch.listen, true), (second.listen, false)])?;
        (launch, Some(second))
    } else {
        (launch, None)
    };
    let mut controller = launch.start()?;
    let started = Instant::now();
    let url = format!("http://{}", launch.listen);
    let urls = std::iter::once(url.clone())
        .chain(second.iter().map(|s| format!("http://{}", s.listen)))
        .collect();
    let shared = Arc::new(thin::Shared {
        keys: thin::Keys::default(),
        encodings: thin::Encodings::default(),
        changes: thin::Changes::default(),
        services,
        started,
        urls,
        periods,
        sync_time: Duration::from_millis(params.sync_ms),
        derives_locality: !params.filtered_endpoints,
    });
    let canary_changes = probe::Changes::default();
    let canaries = params.canaries.min(params.nodes);
    let mut tasks = tokio::task::JoinSet::new();
    let fleet = Fleet {
        canaries: (0..canaries)
            .map(|index| {
                let probe = Probe::new(canary_changes.clone(), services, started);
                tasks.spawn(b1::hollow_agent(
                    Shape::node_name(index),
                    url.clone(),
                    probe.clone(),
                    periods,
                ));
                probe
            })
            .collect(),
        thin: (canaries..params.nodes)
            .map(|index| {
                let record = Recorder::default();
                let node = thin::Node {
                    name: Shape::node_name(index),
                    source: loopback_of(index),
                };
                let run = thin::run(node, shared.clone(), record.clone());
                tasks.spawn(async move {
                    run.await;
                    Ok(())
                });
                record
            })
            .collect(),
    };

    wait(&mut controller, timeout, "initial sync", || {
        fleet.pending(|r| r.full_sync.is_some(), |r| r.full_sync.is_some())
    })
    .await?;
    let initial_sync_s = started.elapsed().as_secs_f64();
    let controller_initial_sync_cpu_seconds = controller.cpu_time().as_secs_f64();
    eprintln!("b4: every node holds the cluster after {initial_sync_s:.1} s");

    let total_changes = params.changes
        * if params.restart || params.add_replica {
            2
        } else {
            1
        };
    let churn = Churn {
        shape,
        dir,
        shared: &shared,
        canaries: &canary_changes,
        total: total_changes,
        interval: Duration::from_millis(params.interval_ms),
    };
    let controller_cpu = controller.cpu_time();
    let generator_cpu = process::cpu_time().unwrap_or_default();
    let churn_started = Instant::now();
    churn.changes(0..params.changes).await?;
    let steady = 0..params.changes;
    fleet
        .wait_for(&mut controller, timeout, "steady churn", steady.clone())
        .await;
    let churn_wall = churn_started.elapsed();
    let controller_cpu_seconds = (controller.cpu_time() - controller_cpu).as_secs_f64();
    let generator_cpu_seconds = process::cpu_time()
        .unwrap_or_default()
        .saturating_sub(generator_cpu)
        .as_secs_f64();
    let generator_busy = busy(generator_cpu, churn_wall);
    let steady_memory = controller.memory();
    let records = fleet.thin_records();
    let latencies = latencies_of(records.iter().map(|r| &r.latencies), steady.clone());
    let canary_latencies = latencies_of(
        fleet
            .canaries
            .iter()
            .map(|p| p.record().latencies)
            .collect::<Vec<_>>()
            .iter(),
        steady.clone(),
    );
    let summary = Summary::of(&latencies);

    let mut results = Results {
        p50_ms: summary.as_ref().map(|s| s.p50_ms),
        p99_ms: summary.as_ref().map(|s| s.p99_ms),
        programming_latency: summary,
        canary_latency: Summary::of(&canary_latencies),
        missing: params.nodes * params.changes - latencies.len() - canary_latencies.len(),
        initial_sync_s,
        controller_initial_sync_cpu_seconds,
        controller_cpu_seconds,
        #[allow(clippy::cast_precision_loss)]
        controller_cpu_us_per_change_per_node: controller_cpu_seconds * 1e6
            / (params.changes * params.nodes) as f64,
        controller_rss_bytes: steady_memory.map(|m| mib_to_bytes(m.rss_mib)),
        controller_peak_rss_bytes: steady_memory.map(|m| mib_to_bytes(m.peak_rss_mib)),
        generator_cpu_seconds,
        generator_busy,
        generator_bottleneck: generator_busy > BUSY_GENERATOR,
        restart_seconds: None,
        restart_unresolved_nodes: None,
        restart_generator_busy: None,
        restart_resets: None,
        restart_peak_rss_bytes: None,
        restart_latency: None,
        rebalance_seconds: None,
        rebalance_moved_nodes: None,
        rebalance_resets: None,
        rebalance_first_cpu_seconds: None,
        rebalance_second_cpu_seconds: None,
        rebalance_second_peak_rss_bytes: None,
        rebalance_latency: None,
        latencies,
        params: params.clone(),
    };

    if params.restart {
        let old_epoch = records
            .first()
            .map(|r| r.applied_epoch.clone())
            .unwrap_or_default();
        let resets_before: u64 = records.iter().map(|r| r.resets).sum();
        let killed = Instant::now();
        let generator_cpu = process::cpu_time().unwrap_or_default();
        controller.kill();
        controller = launch.start()?;
        eprintln!("b4: controller SIGKILLed and started again");
        let resumed = async {
            wait(&mut controller, timeout, "restart", || {
                fleet.pending(|r| r.applied_epoch != old_epoch, |_| true)
            })
            .await
            .map(|()| killed.elapsed())
        };
        let (churned, resumed) =
            tokio::join!(churn.changes(params.changes..total_changes), resumed);
        churned?;
        // A restart that does not resolve in time is a result too: recorded as unresolved.
        let restart = resumed
            .inspect_err(|err| eprintln!("b4: the restart did not resolve: {err:#}"))
            .ok();
        let unresolved = fleet
            .thin_records()
            .iter()
            .filter(|r| r.applied_epoch == old_epoch)
            .count();
        let during = params.changes..total_changes;
        fleet
            .wait_for(
                &mut controller,
                timeout,
                "churn after the restart",
                during.clone(),
            )
            .await;
        let records = fleet.thin_records();
        results.restart_generator_busy = Some(busy(generator_cpu, killed.elapsed()));
        results.restart_seconds = restart.map(|took| took.as_secs_f64());
        results.restart_unresolved_nodes = Some(unresolved);
        results.restart_resets =
            Some(records.iter().map(|r| r.resets).sum::<u64>() - resets_before);
        results.restart_peak_rss_bytes = controller.memory().map(|m| mib_to_bytes(m.peak_rss_mib));
        results.restart_latency =
            Summary::of(&latencies_of(records.iter().map(|r| &r.latencies), during));
    }
    if let Some(second_launch) = second {
        let first_epoch = records
            .first()
            .map(|r| r.applied_epoch.clone())
            .unwrap_or_default();
        let resets_before: u64 = records.iter().map(|r| r.resets).sum();
        let second = second_launch.start()?;
        write_replicas(dir, &[(launch.listen, true), (second_launch.listen, true)])?;
        let marked = Instant::now();
        let first_cpu = controller.cpu_time();
        // The canaries list the first replica alone, and come back to it when shed.
        let share = splitproxy_controller::shares::limit(params.nodes, 2)
            .context("two replicas share the nodes")?
            .saturating_sub(canaries);
        let on_first = || {
            fleet
                .thin_records()
                .iter()
                .filter(|r| r.applied_epoch == first_epoch)
                .count()
        };
        let settled = async {
            wait(&mut controller, timeout, "rebalance", || {
                on_first().saturating_sub(share)
            })
            .await
            .map(|()| marked.elapsed())
        };
        let (churned, settled) =
            tokio::join!(churn.changes(params.changes..total_changes), settled);
        churned?;
        let settled = settled
            .inspect_err(|err| eprintln!("b4: the replicas did not settle: {err:#}"))
            .ok();
        let during = params.changes..total_changes;
        fleet
            .wait_for(
                &mut controller,
                timeout,
                "churn while nodes move",
                during.clone(),
            )
            .await;
        let records = fleet.thin_records();
        results.rebalance_seconds = settled.map(|took| took.as_secs_f64());
        results.rebalance_moved_nodes = Some(records.len() - on_first());
        results.rebalance_resets =
            Some(records.iter().map(|r| r.resets).sum::<u64>() - resets_before);
        results.rebalance_first_cpu_seconds =
            Some((controller.cpu_time() - first_cpu).as_secs_f64());
        results.rebalance_second_cpu_seconds = Some(second.cpu_time().as_secs_f64());
        results.rebalance_second_peak_rss_bytes =
            second.memory().map(|m| mib_to_bytes(m.peak_rss_mib));
        results.rebalance_latency =
            Summary::of(&latencies_of(records.iter().map(|r| &r.latencies), during));
    }
    tasks.abort_all();
    Ok(results)
}

/// Writes endpoint changes, each to its own Service, spread over the cluster.
struct Churn<'a> {
    shape: Shape,
    dir: &'a Path,
    shared: &'a thin::Shared,
    canaries: &'a probe::Changes,
    /// How many changes the whole run makes (they are spread over the Services).
    total: usize,
    interval: Duration,
}

impl Churn<'_> {
    /// Makes the changes numbered `range`, one every interval.
    async fn changes(&self, range: std::ops::Range<usize>) -> anyhow::Result<()> {
        for index in range {
            let service = index * self.shape.services / self.total;
            let name = Shape::service_name(service);
            let ip = Shape::endpoint_ip(self.shape.endpoint_range(service).start);
            let written = Instant::now();
            self.shared.changes.push(thin::Change {
                key: self.shared.keys.id(&pb::ObjectKey {
                    namespace: NAMESPACE.into(),
                    name: name.clone(),
                }),
                ip: ip.to_string(),
                written,
            });
            self.canaries.push(probe::Change {
                service: ServiceKey {
                    namespace: NAMESPACE.into(),
                    name,
                },
                ip: IpAddr::V4(ip),
                written,
            });
            self.shape
                .rewrite(self.dir, service, false)
                .context("rewriting a Service's slice")?;
            tokio::time::sleep(self.interval).await;
        }
        Ok(())
    }
}

/// Waits until `pending` says no node is left; fails after `timeout` or when the controller
/// stops. Says how far it got every little while.
async fn wait(
    controller: &mut controller::Controller,
    timeout: Duration,
    what: &str,
    pending: impl Fn() -> usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut said = started;
    loop {
        let left = pending();
        if left == 0 {
            return Ok(());
        }
        if started.elapsed() > timeout {
            bail!("{what}: {left} nodes not there after {timeout:?}");
        }
        if !controller.running() {
            bail!("{what}: the controller stopped (see b4-controller.log)");
        }
        if said.elapsed() > PROGRESS {
            eprintln!(
                "b4: {what}: {left} nodes to go after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The latencies of the changes numbered `changes` over every node's record.
fn latencies_of<'a>(
    records: impl Iterator<Item = &'a Vec<Option<Duration>>>,
    changes: std::ops::Range<usize>,
) -> Vec<Duration> {
    records
        .flat_map(|latencies| {
            changes
                .clone()
                .filter_map(|i| latencies.get(i).copied().flatten())
        })
        .collect()
}

/// The share of the CPUs this process may use that it used over the last `wall`, having used
/// `cpu_before` at its start.
fn busy(cpu_before: Duration, wall: Duration) -> f64 {
    let used = process::cpu_time()
        .unwrap_or_default()
        .saturating_sub(cpu_before);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    #[allow(clippy::cast_precision_loss)] // a few CPUs
    let share = used.as_secs_f64() / wall.as_secs_f64().max(f64::EPSILON) / cpus as f64;
    share
}

/// A loopback port free now, for the controller to listen on across restarts.
fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .context("finding a free loopback port")?;
    Ok(listener.local_addr()?)
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // memory sizes
fn mib_to_bytes(mib: f64) -> u64 {
    (mib * f64::from(1 << 20)) as u64
}
