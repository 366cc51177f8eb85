//! `sp-flows`: runs the shared packet-flow table with real traffic against a dataplane backend on
//! this machine's kernel (the IPVS VM's, for the IPVS mode), one scenario after the other.
//!
//! ```text
//! sp-flows ipvs|iptables|nftables [--scenario PREFIX] [--prefix NAMESPACE-PREFIX]
//! sp-flows ebpf --cgroup CGROUP --bpf-root BPFFS [--scenario PREFIX] [--prefix NAMESPACE-PREFIX]
//! ```
//!
//! For each scenario it builds the node's addresses, pods and outside clients
//! (`splitproxy_e2e::flows`), programs the scenario's state with the backend, makes every row's
//! connections, and prints one line per row: `ROW {json}` with what was expected and observed.
//! Rows that cannot happen to the backend print as `SKIPPED row: why`. It removes what it built
//! before the next scenario, and exits 0 once every row ran: the caller judges the rows.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, Subcommand};
use splitproxy_dataplane::{
    Dataplane, Families, IpFamily,
    ebpf::{self, EbpfBackend},
    iptables::{self, FamilyExecutor, IptablesBackend},
    ipvs::backend::{self, IpvsBackend},
    nftables::{self, NftablesBackend},
    testing::flow_table::{self, Expected, Origin, Scenario},
};
use splitproxy_e2e::{
    HitReport,
    flows::{self, RowResult, Topology},
    lab,
};

/// How long one connection of a row may take before it counts as dropped.
const CONNECTION_TIMEOUT_MS: u64 = 3000;

/// Runs the packet-flow table with real traffic.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug, Clone)]
enum Mode {
    /// The IPVS mode (needs a kernel with IPVS).
    Ipvs(Selection),
    /// The iptables mode, one ruleset per IP family of the scenario.
    Iptables(Selection),
    /// The nftables mode, one table per IP family of the scenario.
    Nftables(Selection),
    /// The eBPF mode: its socket programs on a cgroup the rows' pods and node processes run in,
    /// its packet programs on the outside clients' veths.
    Ebpf(EbpfSelection),
}

/// Where the eBPF mode's programs attach and pin, besides the scenarios.
#[derive(clap::Args, Debug, Clone)]
struct EbpfSelection {
    #[command(flatten)]
    selection: Selection,
    /// The cgroup v2 folder the socket programs attach to. Connections from pods and from the
    /// node start inside it; outside clients stay in this process's cgroup, which the programs
    /// leave alone, as they leave another machine's processes alone.
    #[arg(long)]
    cgroup: PathBuf,
    /// A mounted BPF filesystem the maps and links are pinned in.
    #[arg(long)]
    bpf_root: PathBuf,
}

/// Which scenarios run, and how their namespaces are named.
#[derive(clap::Args, Debug, Clone)]
struct Selection {
    /// Only the scenarios whose name starts with this.
    #[arg(long)]
    scenario: Option<String>,
    /// The start of every namespace name made: on a shared machine, one its owner cleans up.
    #[arg(long, default_value = "h-")]
    prefix: String,
}

impl Mode {
    fn selection(&self) -> &Selection {
        match self {
            Self::Ipvs(selection) | Self::Iptables(selection) | Self::Nftables(selection) => {
                selection
            }
            Self::Ebpf(ebpf) => &ebpf.selection,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let selection = cli.mode.selection().clone();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
        .and_then(|runtime| {
            for selected in flow_table::scenarios().iter().filter(|s| {
                selection
                    .scenario
                    .as_ref()
                    .is_none_or(|p| s.name.starts_with(p))
            }) {
                runtime.block_on(run(&cli.mode, selected))?;
            }
            Ok(())
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sp-flows: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One scenario against `mode`'s backend, from a bare node back to one.
async fn run(mode: &Mode, scenario: &Scenario) -> Result<()> {
    println!("SCENARIO {}", scenario.name);
    let topology = Topology::of(scenario, &mode.selection().prefix);
    let built = Built::build(&topology)?;
    program(mode, scenario, &topology)
        .await
        .with_context(|| format!("programming {}", scenario.name))?;
    for case in &scenario.cases {
        let (mut expected, difference) = match mode {
            Mode::Ipvs(_) => {
                if let Some(reason) = flows::remote_hairpin(scenario, case) {
                    println!("SKIPPED {}: {reason}", case.flow.name);
                    continue;
                }
                flows::ipvs_expected(scenario, case)
            }
            Mode::Nftables(_) => {
                if let Some(reason) = flows::remote_hairpin(scenario, case) {
                    println!("SKIPPED {}: {reason}", case.flow.name);
                    continue;
                }
                flows::nftables_expected(scenario, case)
            }
            Mode::Ebpf(_) => {
                if let Some(reason) = flows::remote_hairpin(scenario, case)
                    .or_else(|| flows::ebpf::unsupported(scenario, case))
                {
                    println!("SKIPPED {}: {reason}", case.flow.name);
                    continue;
                }
                flows::ebpf::expected(scenario, case)
            }
            // The table is written after kube-proxy's iptables mode.
            Mode::Iptables(_) => (case.expected.clone(), None),
        };
        if expected == Expected::Pass && !topology.owns(case.flow.destination) {
            // Nothing here holds the address: a connection left alone leaves the node and is
            // never answered (the node's LAN leads nowhere), where a rejected one is refused.
            expected = Expected::Drop;
        }
        // IPVS's round robin reaches every endpoint in turn; iptables picks at random.
        let per_target = match mode {
            Mode::Ipvs(_) => 2,
            Mode::Iptables(_) | Mode::Nftables(_) | Mode::Ebpf(_) => 12,
        };
        let count = flows::connections(&expected, per_target);
        let mut words = topology.hit_command(case, count, CONNECTION_TIMEOUT_MS);
        if let Mode::Ebpf(ebpf) = mode
            && case.flow.origin != Origin::External
        {
            words = lab::in_cgroup(&ebpf.cgroup)
                .into_iter()
                .chain(words)
                .collect();
        }
        let report = run_hit(&words)?;
        let observed = flows::observe(case, &report);
        let ok = flows::fulfils(case, &expected, &observed, flows::sticky(scenario, case));
        let row = RowResult {
            scenario: scenario.name.to_owned(),
            row: case.flow.name.to_owned(),
            expected: format!("{expected:?}"),
            difference: difference.map(str::to_owned),
            observed,
            ok,
            pending: case.pending.map(str::to_owned),
        };
        println!("ROW {}", serde_json::to_string(&row)?);
    }
    built.remove(&topology)?;
    clean(mode, scenario).await
}

/// Removes the rules `mode`'s backend left that the next scenario's would not replace: the
/// iptables and nftables modes' node ports would catch the next scenario's servers on the
/// node's addresses before its own sync. (The IPVS mode's go with `kube-ipvs0` and the IPVS
/// table.)
async fn clean(mode: &Mode, scenario: &Scenario) -> Result<()> {
    match mode {
        Mode::Iptables(_) => {
            for family in families(scenario) {
                FamilyExecutor::with_config(iptables::Config::default().with_family(family))
                    .cleanup()
                    .await?;
                // The cleanup leaves kubelet's KUBE-FIREWALL, as kube-proxy's does; this node
                // has no kubelet, and its localnet rule would outlive the scenario.
                let tool = match family {
                    IpFamily::V4 => "iptables",
                    IpFamily::V6 => "ip6tables",
                };
                for args in [
                    &["-D", "INPUT", "-j", "KUBE-FIREWALL"][..],
                    &["-D", "OUTPUT", "-j", "KUBE-FIREWALL"],
                    &["-F", "KUBE-FIREWALL"],
                    &["-X", "KUBE-FIREWALL"],
                ] {
                    // Absent when the scenario never synced: nothing to remove.
                    let _ = Command::new(tool).args(args).output();
                }
            }
        }
        Mode::Nftables(_) => {
            let script: String = IpFamily::ALL
                .into_iter()
                .map(nftables::delete_table)
                .collect();
            let mut nft = Command::new("nft")
                .args(["-f", "-"])
                .stdin(Stdio::piped())
                .spawn()
                .context("running nft")?;
            nft.stdin
                .take()
                .context("nft's stdin")?
                .write_all(script.as_bytes())?;
            ensure!(nft.wait()?.success(), "nft could not delete the tables");
        }
        Mode::Ebpf(ebpf) => {
            ebpf::kernel::remove_pins(&ebpf.bpf_root)?;
        }
        Mode::Ipvs(_) => {}
    }
    Ok(())
}

/// The IP families of the node's addresses.
fn families(scenario: &Scenario) -> Families {
    Families::new(
        IpFamily::ALL
            .into_iter()
            .filter(|family| scenario.node_ips.iter().any(|ip| family.contains(ip))),
    )
}

/// Programs `scenario` with `mode`'s backend, for each IP family of the node's addresses.
async fn program(mode: &Mode, scenario: &Scenario, topology: &Topology) -> Result<()> {
    let families = families(scenario);
    let iptables = iptables::Config::default().with_node_options(scenario.node_options());
    match mode {
        Mode::Ipvs(_) => {
            IpvsBackend::new(backend::Config {
                families,
                node_port_addresses: scenario.node_port_addresses.clone(),
                iptables,
                ..backend::Config::default()
            })
            .sync(&scenario.state)
            .await?;
        }
        Mode::Iptables(_) => {
            IptablesBackend::new(&iptables, &families)
                .sync(&scenario.state)
                .await?;
        }
        Mode::Nftables(_) => {
            NftablesBackend::new(nftables::backend::Config {
                families,
                node_options: scenario.node_options(),
                ..nftables::backend::Config::default()
            })
            .sync(&scenario.state)
            .await?;
        }
        Mode::Ebpf(selection) => {
            let options = scenario.node_options();
            EbpfBackend::new(ebpf::Config {
                bpf_root: selection.bpf_root.clone(),
                cgroup: selection.cgroup.clone(),
                node_port_addresses: Some(
                    scenario
                        .node_port_addresses
                        .clone()
                        .unwrap_or_else(|| scenario.node_ips.clone()),
                ),
                devices: Some(topology.outside_interfaces(scenario)),
                masquerade_mark: 1 << (options.masquerade_bit & 31),
            })
            .sync(&scenario.state)
            .await?;
        }
    }
    Ok(())
}

/// The servers of a scenario's topology, running.
struct Built {
    servers: Vec<Child>,
}

impl Built {
    /// Gives every address its home, starts every server and waits until each answers.
    fn build(topology: &Topology) -> Result<Self> {
        shell(&topology.setup_script()).context("building the scenario's hosts")?;
        let mut built = Self {
            servers: Vec::new(),
        };
        for (address, protocol) in &topology.servers {
            let words = topology.server_command(*address, *protocol);
            let child = Command::new(&words[0])
                .args(&words[1..])
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("starting the server at {address}"))?;
            built.servers.push(child);
        }
        for (address, protocol) in &topology.servers {
            let probe = topology.probe_command(*address, *protocol);
            let mut tries = 0;
            while run_hit(&probe)?.answered() == 0 {
                tries += 1;
                ensure!(tries < 50, "the server at {address} never answered");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(built)
    }

    /// Stops the servers and removes the hosts, the addresses, the IPVS state and the
    /// connections tracked, so the next scenario starts from a bare node (the rules it replaces).
    fn remove(mut self, topology: &Topology) -> Result<()> {
        for server in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
        self.servers.clear();
        shell(&format!(
            "{}ipvsadm -C 2>/dev/null || true\nip link del {} 2>/dev/null || true\n\
             conntrack -F 2>/dev/null || true\n",
            topology.teardown_script(),
            backend::INTERFACE
        ))
    }
}

impl Drop for Built {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

/// Runs `script` with `bash -c` (busybox's `sh` would run its own `ip` before the real one).
fn shell(script: &str) -> Result<()> {
    let status = Command::new("bash")
        .arg("-c")
        .arg(script)
        .status()
        .context("running bash")?;
    if !status.success() {
        bail!("the script exited {status}:\n{script}");
    }
    Ok(())
}

/// Runs an `sp-testpod hit` command line and reads its report.
fn run_hit(words: &[String]) -> Result<HitReport> {
    let output = Command::new(&words[0])
        .args(&words[1..])
        .output()
        .with_context(|| format!("running {words:?}"))?;
    ensure!(
        output.status.success(),
        "{words:?} exited {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("{words:?} printed {stdout:?}"))
}
