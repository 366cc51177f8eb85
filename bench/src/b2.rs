//! B2 dataplane: full and partial sync times, rule counts and memory of one splitproxy agent next
//! to upstream kube-proxy of the same Kubernetes release, each in its own node namespace, both fed
//! by one real API server (the agent through the splitproxy controller). Every number is read from
//! each proxy's own `/metrics` and `/proc`, and each proxy's rules are counted in its namespace.

pub use crate::proxied::ProxyMode;
use crate::{
    cluster::Shape,
    process::{self, Memory},
    prometheus::{self, Histogram},
    proxied::{OWN_SERVICES, Programmed, Proxy, SYNCS, Wanted, populate},
    svg,
};
use anyhow::{Context as _, Result, ensure};
use serde::Serialize;
use splitproxy_e2e::{
    addresses::CONTROL_PLANE,
    control_plane::{Binaries, ControlPlane},
    eventually,
    lab::Lab,
};
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Endpoint changes received but not yet taken in by a sync.
const PENDING: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_pending";

/// B2's flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Services at each size, paired in order with --endpoints (a list, or repeat the flag).
    #[arg(long, env = "B2_SERVICES", value_delimiter = ',', default_values_t = [1_000, 10_000])]
    services: Vec<usize>,
    /// Endpoints at each size, spread evenly over that size's Services.
    #[arg(long, env = "B2_ENDPOINTS", value_delimiter = ',', default_values_t = [10_000, 100_000])]
    endpoints: Vec<usize>,
    /// The proxy modes to compare (one row per size and mode).
    #[arg(long, env = "B2_PROXY_MODE", value_enum, value_delimiter = ',', default_values_t = [ProxyMode::Iptables])]
    proxy_mode: Vec<ProxyMode>,
    /// Single-endpoint changes measured as partial syncs (each to a different Service).
    #[arg(long, env = "B2_CHANGES", default_value_t = 20)]
    changes: usize,
    /// Pause in milliseconds after both proxies have synced a change, before the next one; above
    /// the proxies' 1 s minimum sync period, so each change gets a sync of its own.
    #[arg(long, env = "B2_INTERVAL_MS", default_value_t = 1_500)]
    interval_ms: u64,
    /// Seconds to wait for populating, a full sync, or one change to be synced.
    #[arg(long, env = "B2_TIMEOUT_S", default_value_t = 900)]
    timeout_s: u64,
    /// Where b2.json and b2.svg go.
    #[arg(long, env = "B2_OUTPUT", default_value = "bench/results")]
    output: PathBuf,
}

/// One cluster size.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Size {
    /// How many Services.
    pub services: usize,
    /// How many endpoints over all Services.
    pub endpoints: usize,
}

/// What one B2 run does.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// The cluster sizes, each run on a fresh control plane.
    pub sizes: Vec<Size>,
    /// The proxy modes.
    pub proxy_modes: Vec<ProxyMode>,
    /// Single-endpoint changes per size and mode.
    pub changes: usize,
    /// The pause after each synced change.
    pub interval_ms: u64,
    /// The longest wait for one step.
    pub timeout_s: u64,
}

impl Args {
    /// The validated parameters.
    ///
    /// # Errors
    ///
    /// If the sizes do not pair up, a size has fewer endpoints than Services, or there are more
    /// changes than the smallest size has Services.
    pub fn params(&self) -> Result<Params> {
        ensure!(
            self.services.len() == self.endpoints.len(),
            "--services ({} sizes) and --endpoints ({} sizes) must pair up",
            self.services.len(),
            self.endpoints.len()
        );
        ensure!(self.changes > 0, "--changes must be at least 1");
        let mut sizes = Vec::new();
        for (&services, &endpoints) in self.services.iter().zip(&self.endpoints) {
            ensure!(
                services >= self.changes,
                "--services {services} must be at least --changes ({}): each change goes to its own Service",
                self.changes
            );
            ensure!(
                endpoints >= services,
                "--endpoints {endpoints} must be at least --services {services}: every Service needs an endpoint to change"
            );
            sizes.push(Size {
                services,
                endpoints,
            });
        }
        let mut proxy_modes = self.proxy_mode.clone();
        proxy_modes.dedup();
        Ok(Params {
            sizes,
            proxy_modes,
            changes: self.changes,
            interval_ms: self.interval_ms,
            timeout_s: self.timeout_s,
        })
    }
}

/// What one B2 run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// The parameters of the run.
    pub params: Params,
    /// The machine's 1, 5 and 15 minute load averages when the run started.
    pub load_average_at_start: Vec<f64>,
    /// One per size and proxy mode.
    pub rows: Vec<Row>,
}

/// One size and proxy mode: both proxies side by side.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// How many Services.
    pub services: usize,
    /// How many endpoints.
    pub endpoints: usize,
    /// splitproxy's backend; kube-proxy ran the same one, or nftables beside ebpf
    /// ([`ProxyMode::kube_proxy`]).
    pub proxy_mode: ProxyMode,
    /// Seconds taken to create the Services and EndpointSlices.
    pub populate_s: f64,
    /// The splitproxy controller's memory at the end.
    pub controller_memory: Option<Memory>,
    /// splitproxy's agent, then kube-proxy.
    pub proxies: Vec<Proxied>,
    /// splitproxy divided by kube-proxy.
    pub ratios: Ratios,
}

/// What one proxy did at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Proxied {
    /// `splitproxy` (the agent) or `kube-proxy`.
    pub proxy: &'static str,
    /// The time spent syncing from starting on the populated cluster until its rules held it,
    /// in seconds: the first (full) sync's, unless `syncs_to_program` says more.
    pub full_sync_s: Option<f64>,
    /// How many syncs that took.
    pub syncs_to_program: f64,
    /// The mean over the changes of each change's sync time, in seconds.
    pub partial_sync_mean_s: Option<f64>,
    /// The slowest change's sync time, in seconds.
    pub partial_sync_max_s: Option<f64>,
    /// Syncs seen during the changes (one per change, plus any periodic ones).
    pub partial_syncs: f64,
    /// Rules in the proxy's namespace at the end (`-A` lines of `iptables-save`; rules in the
    /// `kube-proxy` table's chains in nftables mode; entries of the services map in ebpf mode).
    pub rules: usize,
    /// The state programmed at the end, checked against the cluster.
    pub programmed: Programmed,
    /// The proxy process's memory at the end.
    pub memory: Option<Memory>,
}

/// Ratios of splitproxy's numbers to kube-proxy's at one size (below 1: splitproxy is smaller).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    /// Full sync time.
    pub full_sync: Option<f64>,
    /// Mean partial sync time.
    pub partial_sync_mean: Option<f64>,
    /// Peak resident memory of the proxy process.
    pub peak_rss: Option<f64>,
}

/// Runs B2 with `args` and writes `b2.json` and `b2.svg` to its output directory.
///
/// # Errors
///
/// If the output cannot be written or the lab or control plane cannot be set up.
pub fn run(args: &Args, params: Params) -> Result<()> {
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let binaries = Binaries::ensure()?;
    let mut results = Results {
        load_average_at_start: process::load_average()?,
        params,
        rows: Vec::new(),
    };
    for &size in &results.params.sizes {
        for &mode in &results.params.proxy_modes {
            let row = run_size(&binaries, &results.params, size, mode)?;
            println!("{}", serde_json::to_string(&row)?);
            results.rows.push(row);
            // Written after every row, so a later size that fails leaves the earlier ones.
            write(&results, &args.output)?;
        }
    }
    println!("{}", serde_json::to_string_pretty(&results)?);
    Ok(())
}

/// Starts a lab with a fresh control plane, populates it, starts the controller, the agent and
/// kube-proxy, measures both proxies and tears it all down.
fn run_size(binaries: &Binaries, params: &Params, size: Size, mode: ProxyMode) -> Result<Row> {
    let timeout = Duration::from_secs(params.timeout_s);
    let shape = Shape {
        services: size.services,
        endpoints: size.endpoints,
        nodes: 2,
        zones: 0,
    };
    let mut lab = Lab::new("btwo")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let nodes = lab.add_nodes(2)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries.clone())?;
    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    eprintln!(
        "b2: {} Services / {} endpoints, {}: populating",
        size.services,
        size.endpoints,
        mode.flag()
    );
    let started = Instant::now();
    populate(&lab, &control_plane, shape.services, |index| {
        shape.service_yaml(index, true)
    })?;
    let populate_s = started.elapsed().as_secs_f64();
    eprintln!("b2: populated in {populate_s:.1} s");

    let mut wanted = Wanted {
        service_chains: size.services + OWN_SERVICES,
        endpoint_jumps: size.endpoints + OWN_SERVICES,
        node_port_headers: 0,
        node_port_endpoints: 0,
    };
    // The controller and agent first, then kube-proxy, so each full sync has the machine to
    // itself (the controller is idle by the time kube-proxy starts).
    let controller = control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?;
    let splitproxy = Proxy::start_splitproxy(&mut lab, &control_plane, &nodes[0], mode, &[], &[])?;
    let splitproxy_full = splitproxy.await_full_sync(&lab, wanted, timeout)?;
    let kube_proxy = Proxy::start_kube_proxy(&mut lab, &control_plane, &nodes[1], mode, &[], &[])?;
    let kube_proxy_full = kube_proxy.await_full_sync(&lab, wanted, timeout)?;
    eprintln!(
        "b2: both proxies programmed the cluster; {} changes",
        params.changes
    );

    let proxies = [&splitproxy, &kube_proxy];
    let partial = measure_changes(
        &lab,
        &control_plane,
        &proxies,
        size.services,
        params,
        timeout,
    )?;
    wanted.endpoint_jumps -= params.changes;
    let mut proxied = Vec::new();
    for ((proxy, full), changes) in proxies
        .iter()
        .zip([splitproxy_full, kube_proxy_full])
        .zip(partial)
    {
        let what = format!("{} removes the changed endpoints", proxy.name);
        let last = eventually(&what, timeout, || {
            let save = proxy.save(&lab)?;
            let found = Programmed::count(&save, wanted, proxy.mode);
            ensure!(found.matches(), "found {found:?}");
            Ok(save)
        });
        // A proxy that missed a change is a result too: report what it holds.
        let save = match last {
            Ok(save) => save,
            Err(err) => {
                eprintln!("b2: {err:#}");
                proxy.save(&lab)?
            }
        };
        proxied.push(Proxied {
            proxy: proxy.name,
            full_sync_s: (full.count > 0.0).then_some(full.sum),
            syncs_to_program: full.count,
            partial_sync_mean_s: changes.mean(),
            partial_sync_max_s: changes.max(),
            partial_syncs: changes.syncs,
            rules: proxy.rules(&save),
            programmed: Programmed::count(&save, wanted, proxy.mode),
            memory: Memory::of(proxy.process.pid()),
        });
    }
    let ratios = ratios(&proxied[0], &proxied[1]);
    Ok(Row {
        services: size.services,
        endpoints: size.endpoints,
        proxy_mode: mode,
        populate_s,
        controller_memory: Memory::of(controller.pid()),
        proxies: proxied,
        ratios,
    })
}

/// The sync times of one proxy over the changes.
#[derive(Debug, Default)]
struct ChangeSyncs {
    /// Each change's mean sync time (over the syncs seen while it was applied), in seconds.
    each: Vec<f64>,
    /// Syncs seen over all changes.
    syncs: f64,
}

impl ChangeSyncs {
    fn mean(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)] // a few dozen changes
        (!self.each.is_empty()).then(|| self.each.iter().sum::<f64>() / self.each.len() as f64)
    }

    fn max(&self) -> Option<f64> {
        self.each.iter().copied().reduce(f64::max)
    }
}

/// Makes `params.changes` single-endpoint changes, each the first endpoint of a different
/// one of the `services` Services turning not ready, and waits for every proxy to sync each before the next.
fn measure_changes(
    lab: &Lab,
    control_plane: &ControlPlane,
    proxies: &[&Proxy],
    services: usize,
    params: &Params,
    timeout: Duration,
) -> Result<Vec<ChangeSyncs>> {
    let mut results: Vec<ChangeSyncs> = proxies.iter().map(|_| ChangeSyncs::default()).collect();
    for change in 0..params.changes {
        let index = change * services / params.changes;
        let before: Vec<Histogram> = proxies
            .iter()
            .map(|proxy| proxy.syncs(lab))
            .collect::<Result<_>>()?;
        Shape::set_first_endpoint_ready(control_plane, lab, index, false)?;
        for ((proxy, before), result) in proxies.iter().zip(&before).zip(&mut results) {
            let what = format!("{} syncs change {change}", proxy.name);
            let after = eventually(&what, timeout, || {
                let text = proxy.metrics(lab)?;
                let after = Histogram::parse(&text, SYNCS);
                ensure!(after.count_since(before) > 0.0, "no sync yet");
                let pending = prometheus::sum(&text, PENDING, &[]);
                ensure!(pending == 0.0, "{pending} endpoint changes pending");
                Ok(after)
            })?;
            result.syncs += after.count_since(before);
            if let Some(mean) = after.mean_since(before) {
                result.each.push(mean);
            }
        }
        std::thread::sleep(Duration::from_millis(params.interval_ms));
    }
    Ok(results)
}

fn ratios(splitproxy: &Proxied, kube_proxy: &Proxied) -> Ratios {
    let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?).filter(|r| r.is_finite());
    Ratios {
        full_sync: ratio(splitproxy.full_sync_s, kube_proxy.full_sync_s),
        partial_sync_mean: ratio(
            splitproxy.partial_sync_mean_s,
            kube_proxy.partial_sync_mean_s,
        ),
        peak_rss: ratio(
            splitproxy.memory.map(|m| m.peak_rss_mib),
            kube_proxy.memory.map(|m| m.peak_rss_mib),
        ),
    }
}

/// Writes `b2.json` and `b2.svg` (full and partial sync times, splitproxy next to kube-proxy).
fn write(results: &Results, output: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(results)?;
    std::fs::write(output.join("b2.json"), format!("{json}\n"))?;
    let several_modes = results.params.proxy_modes.len() > 1;
    let mut groups = Vec::new();
    for row in &results.rows {
        let mut size = format!("{}/{}", thousands(row.services), thousands(row.endpoints));
        if several_modes {
            size = format!("{size} {}", row.proxy_mode.flag());
        }
        let ms = |s: Option<f64>| s.map(|s| s * 1000.0);
        groups.push(svg::Group {
            label: format!("{size} full"),
            values: row.proxies.iter().map(|p| ms(p.full_sync_s)).collect(),
        });
        groups.push(svg::Group {
            label: format!("{size} partial"),
            values: row
                .proxies
                .iter()
                .map(|p| ms(p.partial_sync_mean_s))
                .collect(),
        });
    }
    let svg = svg::grouped_bars(
        "B2: sync time per size (Services/endpoints)",
        "sync time (ms, log scale)",
        &["splitproxy", "kube-proxy"],
        &groups,
    );
    std::fs::write(output.join("b2.svg"), svg)?;
    Ok(())
}

/// `10000` as `10k`.
fn thousands(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}
