//! B5 datapath: what an application feels through a Service. Connect time, whole-exchange
//! latency and connections per second through upstream kube-proxy and splitproxy in each mode,
//! next to two limits (the direct path without proxy rules, without and with conntrack), at
//! several numbers of Services, every implementation in its own node namespace and all fed the
//! same Services by one real API server.
//!
//! ```text
//!  node-1 kube-proxy iptables   node-2 splitproxy iptables   node-3 kube-proxy nftables
//!  node-4 splitproxy nftables   node-5 no rules, no conntrack node-6 no rules, conntrack
//!     each with a client pod (10.244.n.10)          node-7: the server pod (10.244.7.10)
//!  host "outside" (198.18.0.3): the client of node ports
//! ```
//!
//! The measured Services (dozens, spread evenly through the set) all send to the server pod;
//! every other Service has one endpoint of its own, so it sits where a Service with endpoints
//! sits in the rules. The proxies are frozen while measuring (an hour between periodic syncs, no
//! API changes); the client runs on CPU 0 and the server on CPU 1; conntrack is flushed in the
//! subject's node before each trial; a trial whose conntrack drop, listen-queue or retransmit
//! counters moved, or that saw an error, is invalid. Implementations take turns within each
//! round, starting one later each round, and ratios are medians of per-round ratios.

mod counters;
pub mod load;
mod report;
mod results;

use crate::{
    cluster::Shape,
    process::Memory,
    proxied::{OWN_SERVICES, Proxy, ProxyMode, Wanted, populate},
};
use anyhow::{Context as _, Result, ensure};
use counters::Counters;
use load::{Exchange, Measure, Trial};
pub use results::Results;
use results::{Cell, Programming, Round, Size, cell, compare_sizes, compare_subjects, slopes};
use serde::Serialize;
use splitproxy_e2e::{
    addresses::{CLUSTER_POD_CIDR, CONTROL_PLANE, EXTERNAL_CLIENT, pod_ip},
    control_plane::{Binaries, ControlPlane},
    eventually,
    lab::{HasNamespace, Lab, Node, Pod},
};
use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The server pod's ports (the measured Services' target ports).
const SERVER_TCP_PORT: u16 = 8080;
const SERVER_UDP_PORT: u16 = 8053;
/// The measured Services' ports.
const SERVICE_TCP_PORT: u16 = 80;
const SERVICE_UDP_PORT: u16 = 53;
/// The measured Service `k`'s node ports: TCP `30000 + k`, UDP `31000 + k`.
const NODE_PORT_BASE: u16 = 30_000;
const UDP_NODE_PORT_BASE: u16 = 31_000;
/// The client's CPU; the server's is the next one, where there is one.
const CLIENT_CPU: &str = "0";
/// The lab's node of the server pod, after the subjects' nodes.
const SERVER_NODE: usize = SUBJECTS.len();

/// B5's flags.
#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    /// `quick`: 1, 1,000 and 10,000 Services, pod → ClusterIP and pod → pod IP, 3 rounds;
    /// `full`: 1, 1,000, 10,000 and 50,000 Services, every scenario, 5 rounds.
    #[arg(long, value_enum, default_value = "full")]
    profile: Profile,
    /// The numbers of Services instead of the profile's (a list).
    #[arg(long, value_delimiter = ',')]
    services: Vec<usize>,
    /// The scenarios instead of the profile's (a list).
    #[arg(long, value_enum, value_delimiter = ',')]
    scenarios: Vec<Scenario>,
    /// Rounds instead of the profile's (each implementation once per round and scenario).
    #[arg(long)]
    rounds: Option<usize>,
    /// Exchanges timed per latency trial instead of the profile's.
    #[arg(long)]
    latency_count: Option<usize>,
    /// Seconds per rate trial instead of the profile's.
    #[arg(long)]
    rate_seconds: Option<f64>,
    /// Exchanges in flight in a rate trial.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// How many Services are measured (spread evenly through the set; all of them when fewer).
    #[arg(long, default_value_t = 32)]
    measured: usize,
    /// The iptables backend both proxies use in iptables mode. `legacy` by default: the
    /// nf_tables backend's first restore at 10,000 Services runs past 15 minutes here (B2).
    #[arg(long, value_enum, default_value = "legacy")]
    iptables_backend: IptablesBackend,
    /// Seconds to wait for populating or for one proxy's first sync.
    #[arg(long, default_value_t = 3_600)]
    timeout_s: u64,
    /// Where b5.json, b5.md and b5.svg go.
    #[arg(long, default_value = "bench/results")]
    output: PathBuf,
}

/// A set of defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// A few minutes per size: 1 / 1k / 10k Services, ClusterIP and pod IP.
    Quick,
    /// Every scenario, 1 / 1k / 10k / 50k Services.
    Full,
}

/// Which iptables the iptables-mode proxies run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IptablesBackend {
    /// `iptables-legacy` (x_tables).
    Legacy,
    /// The host's default `iptables` (nf_tables here).
    Default,
}

/// What a client does, from where, to what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// A pod opens a new TCP connection to a ClusterIP per request.
    ClusterIp,
    /// A host outside the cluster opens a new TCP connection to a node port per request.
    NodePort,
    /// A pod opens a new TCP connection to another pod's IP per request, on a node carrying
    /// every Service: the cost Services put on traffic that is not theirs.
    PodIp,
    /// A pod sends requests over kept-alive connections to a ClusterIP: only the first packet
    /// of a connection meets the rules, so every implementation must come out the same.
    KeptAlive,
    /// A pod sends each UDP request from a new socket (a new source port) to a ClusterIP, as a
    /// DNS client does.
    Udp,
}

impl Scenario {
    fn exchange(self) -> Exchange {
        match self {
            Self::ClusterIp | Self::NodePort | Self::PodIp => Exchange::Connect,
            Self::KeptAlive => Exchange::KeptAlive,
            Self::Udp => Exchange::Udp,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::ClusterIp => "pod → ClusterIP",
            Self::NodePort => "outside → NodePort",
            Self::PodIp => "pod → pod IP",
            Self::KeptAlive => "pod → ClusterIP, kept alive",
            Self::Udp => "pod → ClusterIP, UDP",
        }
    }
}

/// What is measured: a proxy in a mode, or a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Subject {
    /// Upstream kube-proxy.
    KubeProxy(ProxyMode),
    /// splitproxy's agent.
    Splitproxy(ProxyMode),
    /// No proxy rules and no conntrack in the node: the direct path.
    NoProxy,
    /// No proxy rules, conntrack on: the floor of any NAT proxy.
    NoProxyConntrack,
}

/// The measured subjects, in their nodes' order (node-1 first).
const SUBJECTS: [Subject; 7] = [
    Subject::KubeProxy(ProxyMode::Iptables),
    Subject::Splitproxy(ProxyMode::Iptables),
    Subject::KubeProxy(ProxyMode::Nftables),
    Subject::Splitproxy(ProxyMode::Nftables),
    Subject::Splitproxy(ProxyMode::Ebpf),
    Subject::NoProxy,
    Subject::NoProxyConntrack,
];

impl Subject {
    /// Its name in results and tables.
    #[must_use]
    pub fn name(self) -> String {
        match self {
            Self::KubeProxy(mode) => format!("kube-proxy {}", mode.flag()),
            Self::Splitproxy(mode) => format!("splitproxy {}", mode.flag()),
            Self::NoProxy => "limit: no proxy, no conntrack".to_owned(),
            Self::NoProxyConntrack => "limit: no proxy, conntrack".to_owned(),
        }
    }

    fn is_limit(self) -> bool {
        matches!(self, Self::NoProxy | Self::NoProxyConntrack)
    }
}

/// What one B5 run does.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// The profile the defaults came from.
    pub profile: Profile,
    /// Numbers of Services, each on a fresh control plane.
    pub services: Vec<usize>,
    /// The scenarios.
    pub scenarios: Vec<Scenario>,
    /// Rounds per scenario.
    pub rounds: usize,
    /// Exchanges per latency trial.
    pub latency_count: usize,
    /// Seconds per rate trial.
    pub rate_seconds: f64,
    /// Exchanges in flight per rate trial.
    pub concurrency: usize,
    /// Measured Services at most.
    pub measured: usize,
    /// The iptables-mode proxies' backend.
    pub iptables_backend: IptablesBackend,
    /// The longest wait for populating or a first sync, in seconds.
    pub timeout_s: u64,
}

impl Args {
    /// The profile's defaults with the flags' overrides.
    ///
    /// # Errors
    ///
    /// If a count is zero.
    pub fn params(&self) -> Result<Params> {
        let (services, scenarios, rounds, latency_count, rate_seconds) = match self.profile {
            Profile::Quick => (
                vec![1, 1_000, 10_000],
                vec![Scenario::ClusterIp, Scenario::PodIp],
                3,
                1_000,
                1.0,
            ),
            Profile::Full => (
                vec![1, 1_000, 10_000, 50_000],
                vec![
                    Scenario::ClusterIp,
                    Scenario::NodePort,
                    Scenario::PodIp,
                    Scenario::KeptAlive,
                    Scenario::Udp,
                ],
                5,
                2_000,
                2.0,
            ),
        };
        let pick = |given: &Vec<usize>, default: Vec<usize>| {
            if given.is_empty() {
                default
            } else {
                given.clone()
            }
        };
        let params = Params {
            profile: self.profile,
            services: pick(&self.services, services),
            scenarios: if self.scenarios.is_empty() {
                scenarios
            } else {
                self.scenarios.clone()
            },
            rounds: self.rounds.unwrap_or(rounds),
            latency_count: self.latency_count.unwrap_or(latency_count),
            rate_seconds: self.rate_seconds.unwrap_or(rate_seconds),
            concurrency: self.concurrency,
            measured: self.measured,
            iptables_backend: self.iptables_backend,
            timeout_s: self.timeout_s,
        };
        ensure!(
            params.services.iter().all(|&n| n > 0),
            "--services: every size needs a Service to measure"
        );
        ensure!(
            params.rounds > 0 && params.latency_count > 0 && params.concurrency > 0,
            "--rounds, --latency-count and --concurrency must be at least 1"
        );
        ensure!(
            params.measured > 0 && params.measured <= 1_000,
            "--measured must be 1 to 1,000 (node ports {NODE_PORT_BASE}.. and {UDP_NODE_PORT_BASE}..)"
        );
        ensure!(params.rate_seconds > 0.0, "--rate-seconds must be above 0");
        Ok(params)
    }
}

/// Runs B5 and writes `b5.json`, `b5.md` and `b5.svg` after each size.
///
/// # Errors
///
/// If the lab or control plane cannot be set up, a proxy does not program the cluster in time,
/// or the results cannot be written.
pub fn run(args: &Args, params: Params) -> Result<()> {
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let binaries = Binaries::ensure()?;
    let mut results = Results {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
        load_average_at_start: crate::process::load_average()?,
        ipvs: ipvs_availability(),
        params,
        sizes: Vec::new(),
        slopes: Vec::new(),
    };
    for &services in &results.params.services.clone() {
        let size = run_size(&binaries, &results.params, services)?;
        results.sizes.push(size);
        compare_sizes(&mut results.sizes);
        results.slopes = slopes(&results.sizes);
        report::write(&results, &args.output)?;
    }
    println!("{}", report::table(&results));
    Ok(())
}

/// Why IPVS mode is not measured.
fn ipvs_availability() -> String {
    if Path::new("/proc/net/ip_vs").exists() {
        "the kernel has IPVS, but B5 does not measure IPVS mode yet".to_owned()
    } else {
        "unavailable: this kernel has no IPVS (/proc/net/ip_vs is missing)".to_owned()
    }
}

/// The lab of one size: nodes, pods and what runs in them.
struct Bench {
    lab: Lab,
    nodes: Vec<Node>,
    clients: Vec<Pod>,
    server: Pod,
    outside: splitproxy_e2e::lab::Host,
    proxies: Vec<(Subject, Proxy)>,
    measured: Vec<usize>,
    /// This binary's path: the client each trial runs.
    exe: String,
}

fn run_size(binaries: &Binaries, params: &Params, services: usize) -> Result<Size> {
    let timeout = Duration::from_secs(params.timeout_s);
    let mut lab = Lab::new("bfive")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let outside = lab.add_host("outside", EXTERNAL_CLIENT)?;
    // Seven nodes: far below u8::MAX.
    let node_count = u8::try_from(SERVER_NODE + 1).unwrap_or(u8::MAX);
    let nodes = lab.add_nodes(node_count)?;
    let mut clients = Vec::new();
    for (i, node) in nodes.iter().take(SUBJECTS.len()).enumerate() {
        let n = u8::try_from(i + 1).unwrap_or(u8::MAX); // at most seven
        let pod = lab.add_pod(node, &format!("client-{n}"), pod_ip(n, 10))?;
        // Every port for the client: a rate trial opens thousands of connections a second.
        lab.exec_ok(
            &pod,
            "sysctl",
            &["-qw", "net.ipv4.ip_local_port_range=1024 65535"],
        )?;
        clients.push(pod);
    }
    let server = lab.add_pod(&nodes[SERVER_NODE], "server", pod_ip(node_count, 10))?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries.clone())?;
    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    let measured = measured_indices(services, params.measured);
    eprintln!(
        "b5: {services} Services ({} measured): populating",
        measured.len()
    );
    let started = Instant::now();
    let filler = Shape {
        services,
        endpoints: services,
        nodes: 1,
        zones: 0,
    };
    populate(&lab, &control_plane, services, |index| {
        match measured.binary_search(&index) {
            Ok(k) => measured_yaml(index, k, server.ip(), nodes[SERVER_NODE].name()),
            Err(_) => filler.service_yaml(index, true),
        }
    })?;
    let populate_s = started.elapsed().as_secs_f64();
    eprintln!("b5: populated in {populate_s:.1} s");

    // This binary is also the client and the server (`b5-load`, `b5-serve`).
    let exe = std::env::current_exe().context("finding this benchmark's binary")?;
    let exe = exe.to_string_lossy().into_owned();
    let server_cpu = if std::thread::available_parallelism().map_or(1, usize::from) > 1 {
        "1"
    } else {
        CLIENT_CPU
    };
    lab.spawn(&server, "taskset", &["-c", server_cpu, &exe, "b5-serve"])?;
    for (node, subject) in nodes.iter().zip(SUBJECTS) {
        if subject == Subject::NoProxyConntrack {
            conntrack_floor(&lab, node)?;
        }
    }

    let backend = IptablesPath::new(params.iptables_backend)?;
    let wanted = Wanted {
        service_chains: services + measured.len() + OWN_SERVICES,
        endpoint_jumps: services + measured.len() + OWN_SERVICES,
        // A TCP and a UDP node port per measured Service, on the node's one address.
        node_port_headers: 2 * measured.len(),
        node_port_endpoints: 2 * measured.len(),
    };
    let _controller =
        control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?;
    let mut bench = Bench {
        lab,
        nodes,
        clients,
        server,
        outside,
        proxies: Vec::new(),
        measured,
        exe,
    };
    let mut programming = Vec::new();
    // One at a time, so each first sync has the machine to itself.
    for (i, &subject) in SUBJECTS.iter().enumerate() {
        let (kube_proxy, mode) = match subject {
            Subject::KubeProxy(mode) => (true, mode),
            Subject::Splitproxy(mode) => (false, mode),
            Subject::NoProxy | Subject::NoProxyConntrack => continue,
        };
        let node = bench.nodes[i].clone();
        let env = if mode == ProxyMode::Iptables {
            backend.env()
        } else {
            Vec::new()
        };
        // Frozen while measured: no periodic sync within the run.
        let flags = [
            "--iptables-sync-period=1h",
            &format!("--cluster-cidr={CLUSTER_POD_CIDR}"),
        ];
        let start = if kube_proxy {
            Proxy::start_kube_proxy
        } else {
            Proxy::start_splitproxy
        };
        let proxy = start(&mut bench.lab, &control_plane, &node, mode, &flags, &env)?
            .listed_by(backend.save(mode));
        let full = proxy.await_full_sync(&bench.lab, wanted, timeout)?;
        eprintln!(
            "b5: {} programmed {services} Services in {:.2} s ({} syncs)",
            subject.name(),
            full.sum,
            full.count
        );
        programming.push((subject, full));
        bench.proxies.push((subject, proxy));
    }
    bench.await_reachable(timeout)?;
    let syncs_before: Vec<f64> = bench
        .proxies
        .iter()
        .map(|(_, proxy)| proxy.syncs(&bench.lab).map(|h| h.count))
        .collect::<Result<_>>()?;

    let mut cells = Vec::new();
    for &scenario in &params.scenarios {
        eprintln!("b5: {services} Services: {}", scenario.name());
        cells.extend(bench.measure(scenario, params)?);
    }
    compare_subjects(&mut cells);

    let mut programmed = Vec::new();
    for (((subject, full), (_, proxy)), before) in
        programming.iter().zip(&bench.proxies).zip(syncs_before)
    {
        let listing = proxy.save(&bench.lab)?;
        programmed.push(Programming {
            subject: subject.name(),
            full_sync_s: full.sum,
            syncs: full.count,
            rules: proxy.rules(&listing),
            syncs_while_measured: proxy.syncs(&bench.lab)?.count - before,
            memory: Memory::of(proxy.process.pid()),
        });
    }
    Ok(Size {
        services,
        measured: bench.measured.len(),
        populate_s,
        programming: programmed,
        cells,
    })
}

/// `count` Service indices spread evenly over `0..services` (all of them when fewer).
fn measured_indices(services: usize, count: usize) -> Vec<usize> {
    let count = count.min(services);
    (0..count).map(|k| k * services / count).collect()
}

/// Measured Service `index` (the `k`th measured): a NodePort Service with a TCP and a UDP
/// port, whose one endpoint is the server pod on `server_node`.
fn measured_yaml(index: usize, k: usize, server: Ipv4Addr, server_node: &str) -> String {
    let ip = Shape::cluster_ip(index);
    let tcp_node_port = usize::from(NODE_PORT_BASE) + k;
    let udp_node_port = usize::from(UDP_NODE_PORT_BASE) + k;
    format!(
        "{service}  type: NodePort
  clusterIP: {ip}
  clusterIPs: [{ip}]
  ports:
  - name: tcp
    port: {SERVICE_TCP_PORT}
    protocol: TCP
    targetPort: {SERVER_TCP_PORT}
    nodePort: {tcp_node_port}
  - name: udp
    port: {SERVICE_UDP_PORT}
    protocol: UDP
    targetPort: {SERVER_UDP_PORT}
    nodePort: {udp_node_port}
---
{slice}ports:
- name: tcp
  protocol: TCP
  port: {SERVER_TCP_PORT}
- name: udp
  protocol: UDP
  port: {SERVER_UDP_PORT}
endpoints:
- addresses: [{server}]
  conditions: {{ready: true}}
  nodeName: {server_node}
",
        service = Shape::service_head(index),
        slice = Shape::slice_head(index),
    )
}

/// Turns conntrack on in `node` with one rule that needs it, and nothing else.
fn conntrack_floor(lab: &Lab, node: &Node) -> Result<()> {
    for command in [
        "add table inet b5-floor",
        "add chain inet b5-floor forward { type filter hook forward priority 0 ; policy accept ; }",
        "add rule inet b5-floor forward ct state established,related accept",
    ] {
        let args: Vec<&str> = command.split(' ').collect();
        lab.exec_ok(node, "nft", &args)?;
    }
    Ok(())
}

/// A `PATH` entry whose `iptables*` are the chosen backend's.
struct IptablesPath {
    backend: IptablesBackend,
    dir: Option<tempfile::TempDir>,
}

impl IptablesPath {
    fn new(backend: IptablesBackend) -> Result<Self> {
        let dir = match backend {
            IptablesBackend::Default => None,
            IptablesBackend::Legacy => {
                let dir = tempfile::tempdir().context("creating the iptables-legacy folder")?;
                for family in ["iptables", "ip6tables"] {
                    for suffix in ["", "-save", "-restore"] {
                        let legacy = format!("/usr/sbin/{family}-legacy{suffix}");
                        ensure!(
                            Path::new(&legacy).exists(),
                            "{legacy} is missing (Debian's iptables package has it)"
                        );
                        std::os::unix::fs::symlink(
                            &legacy,
                            dir.path().join(format!("{family}{suffix}")),
                        )
                        .context("linking the legacy iptables")?;
                    }
                }
                Some(dir)
            }
        };
        Ok(Self { backend, dir })
    }

    /// The environment a proxy in iptables mode runs with.
    fn env(&self) -> Vec<(String, String)> {
        self.dir.as_ref().map_or_else(Vec::new, |dir| {
            let path = std::env::var("PATH").unwrap_or_default();
            vec![(
                "PATH".to_owned(),
                format!("{}:{path}", dir.path().display()),
            )]
        })
    }

    /// The `iptables-save` that lists a proxy's rules in `mode`.
    fn save(&self, mode: ProxyMode) -> &'static str {
        match (mode, self.backend) {
            (ProxyMode::Iptables, IptablesBackend::Legacy) => "iptables-legacy-save",
            _ => "iptables-save",
        }
    }
}

impl Bench {
    /// Where `subject`'s client runs and what it sends to in `scenario`; `None` where the
    /// scenario has no such path (a limit has no node port).
    fn route(&self, subject_index: usize, scenario: Scenario) -> Option<(String, Vec<SocketAddr>)> {
        let subject = SUBJECTS[subject_index];
        let client = self.clients[subject_index].ns_name().to_owned();
        let server_tcp = SocketAddr::from((self.server.ip(), SERVER_TCP_PORT));
        let server_udp = SocketAddr::from((self.server.ip(), SERVER_UDP_PORT));
        let vips = |port: u16| -> Vec<SocketAddr> {
            self.measured
                .iter()
                .map(|&index| SocketAddr::from((Shape::cluster_ip(index), port)))
                .collect()
        };
        Some(match (scenario, subject.is_limit()) {
            (Scenario::ClusterIp | Scenario::KeptAlive, false) => (client, vips(SERVICE_TCP_PORT)),
            (Scenario::Udp, false) => (client, vips(SERVICE_UDP_PORT)),
            (Scenario::NodePort, false) => {
                let node_ip = self.nodes[subject_index].ip();
                let ports = (0..self.measured.len())
                    .map(|k| {
                        // k < --measured ≤ 1,000 (Args::params): the port fits.
                        let port = NODE_PORT_BASE + u16::try_from(k).unwrap_or(0);
                        SocketAddr::from((node_ip, port))
                    })
                    .collect();
                (self.outside.ns_name().to_owned(), ports)
            }
            (Scenario::NodePort, _) => return None,
            (Scenario::Udp, true) => (client, vec![server_udp]),
            (Scenario::PodIp, _) | (Scenario::ClusterIp | Scenario::KeptAlive, true) => {
                (client, vec![server_tcp])
            }
        })
    }

    /// Waits until every subject's client gets an answer through its path in every scenario.
    fn await_reachable(&self, timeout: Duration) -> Result<()> {
        for scenario in [Scenario::ClusterIp, Scenario::NodePort, Scenario::Udp] {
            for (i, subject) in SUBJECTS.iter().enumerate() {
                let Some((client, targets)) = self.route(i, scenario) else {
                    continue;
                };
                let what = format!("{} answers {}", subject.name(), scenario.name());
                eventually(&what, timeout, || {
                    let args = ["--count", &targets.len().to_string()];
                    let trial =
                        self.client(&client, scenario, &targets, Measure::Latency, &args)?;
                    ensure!(trial.errors.is_empty(), "errors {:?}", trial.errors);
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    /// Runs the client in `ns` and reads its trial.
    fn client(
        &self,
        ns: &str,
        scenario: Scenario,
        targets: &[SocketAddr],
        measure: Measure,
        extra: &[&str],
    ) -> Result<Trial> {
        let targets: Vec<String> = targets.iter().map(ToString::to_string).collect();
        let targets = targets.join(",");
        let exchange = serde_plain(&scenario.exchange())?;
        let measure = serde_plain(&measure)?;
        let mut args = vec![
            "-c",
            CLIENT_CPU,
            &self.exe,
            "b5-load",
            "--targets",
            &targets,
            "--exchange",
            &exchange,
            "--measure",
            &measure,
        ];
        args.extend_from_slice(extra);
        let out = self.lab.exec_ok(ns, "taskset", &args)?;
        serde_json::from_str(out.trim()).with_context(|| format!("reading the client's {out:?}"))
    }

    /// Every round of `scenario` through every subject, subjects taking turns.
    fn measure(&self, scenario: Scenario, params: &Params) -> Result<Vec<Cell>> {
        let mut rounds: Vec<Vec<Round>> = SUBJECTS.iter().map(|_| Vec::new()).collect();
        for round in 0..params.rounds {
            for turn in 0..SUBJECTS.len() {
                let i = (turn + round) % SUBJECTS.len();
                if let Some((client, targets)) = self.route(i, scenario) {
                    rounds[i].push(self.round(i, scenario, &client, &targets, params)?);
                }
            }
        }
        Ok(SUBJECTS
            .iter()
            .zip(rounds)
            .filter(|(_, rounds)| !rounds.is_empty())
            .map(|(subject, rounds)| cell(scenario, *subject, &rounds))
            .collect())
    }

    fn round(
        &self,
        subject_index: usize,
        scenario: Scenario,
        client: &str,
        targets: &[SocketAddr],
        params: &Params,
    ) -> Result<Round> {
        let node = &self.nodes[subject_index];
        let watched = [
            (node.ns_name(), counters::Place::Node),
            (self.server.ns_name(), counters::Place::Server),
            (client, counters::Place::Client),
        ];
        let before = Counters::read(&self.lab, &watched)?;
        flush_conntrack(&self.lab, node)?;
        let count = params.latency_count.to_string();
        let latency = self.client(
            client,
            scenario,
            targets,
            Measure::Latency,
            &["--count", &count],
        )?;
        flush_conntrack(&self.lab, node)?;
        let seconds = params.rate_seconds.to_string();
        let concurrency = params.concurrency.to_string();
        let rate = self.client(
            client,
            scenario,
            targets,
            Measure::Rate,
            &["--seconds", &seconds, "--concurrency", &concurrency],
        )?;
        let after = Counters::read(&self.lab, &watched)?;
        let counters = after.since(&before);
        let mut invalid_because: Vec<String> = counters
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(name, n)| format!("{name} +{n}"))
            .collect();
        for (what, trial) in [("latency", &latency), ("rate", &rate)] {
            for (cause, n) in &trial.errors {
                invalid_because.push(format!("{what} trial: {n} × {cause}"));
            }
        }
        Ok(Round {
            latency,
            rate,
            counters,
            invalid_because,
        })
    }
}

/// A value's name as serde writes it (the client's flag values).
fn serde_plain<T: Serialize>(value: &T) -> Result<String> {
    Ok(serde_json::to_string(value)?.trim_matches('"').to_owned())
}

/// Empties `node`'s conntrack table, so each trial starts from the same state.
fn flush_conntrack(lab: &Lab, node: &Node) -> Result<()> {
    let out = lab.exec(node, "conntrack", &["-F"])?;
    // conntrack -F in a namespace that tracks nothing has nothing to flush and says so.
    ensure!(
        out.status.success() || String::from_utf8_lossy(&out.stderr).contains("0 flow entries"),
        "conntrack -F in {}: {}",
        node.name(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_services_are_spread_through_the_set() {
        assert_eq!(measured_indices(1, 32), [0]);
        assert_eq!(measured_indices(4, 32), [0, 1, 2, 3]);
        let spread = measured_indices(10_000, 4);
        assert_eq!(spread, [0, 2_500, 5_000, 7_500]);
    }

    #[test]
    fn a_measured_service_parses_as_the_controller_reads_it() {
        let yaml = measured_yaml(7, 2, Ipv4Addr::new(10, 244, 7, 10), "node-7");
        let objects = splitproxy_controller::manifests::parse_documents(&yaml)
            .expect("the generated manifest parses");
        assert_eq!(objects.len(), 2);
        assert!(yaml.contains("nodePort: 30002") && yaml.contains("nodePort: 31002"));
        assert!(yaml.contains("clusterIP: 10.96.1.7"));
    }
}
