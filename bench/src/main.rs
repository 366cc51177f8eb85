//! `splitproxy-bench`: runs one benchmark (`b1` fan-out, `b2` dataplane, `b3` API-server load,
//! `b4` scale, `b5` datapath) and writes its results as JSON and an SVG plot.

mod b1;
mod b2;
mod b3;
mod b4;
mod b5;
mod cluster;
mod probe;
mod process;
mod prometheus;
mod proxied;
mod stats;
mod svg;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// splitproxy's benchmarks; each writes its results to `--output`.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    benchmark: Benchmark,
}

#[derive(Debug, Subcommand)]
enum Benchmark {
    /// B1 fan-out: a real controller, many hollow agents, endpoint churn, in one process.
    B1(B1Args),
    /// B2 dataplane: sync times, rules and memory of a splitproxy agent next to upstream
    /// kube-proxy, on a real control plane (needs root).
    B2(b2::Args),
    /// B3 API-server load: upstream kube-proxies versus splitproxy at several cluster sizes,
    /// against a real control plane in network namespaces (needs root).
    B3(b3::Args),
    /// B4 scale: the controller in its own process, thousands of thin protocol clients and a few
    /// hollow agents in this one, endpoint churn, optionally a controller restart.
    B4(B4Args),
    /// The B4 sweep plot: latency, controller memory and restart time against nodes, from the
    /// `b4.json` of several runs.
    B4Plot {
        /// The runs: `b4.json` files, or the directories holding them.
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// The SVG file to write.
        #[arg(long)]
        output: PathBuf,
    },
    /// B5 datapath: connect time, latency and connections per second through a Service, per
    /// mode and number of Services, kube-proxy next to splitproxy and the no-proxy limits, on a
    /// real control plane (needs root).
    B5(b5::Args),
    /// B5's echo server (run by B5 in its server pod).
    #[command(hide = true)]
    B5Serve(b5::load::ServeArgs),
    /// B5's client: one trial, printed as JSON (run by B5 in a client's namespace).
    #[command(hide = true)]
    B5Load(b5::load::LoadArgs),
}

/// B1's flags.
#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
struct B1Args {
    /// How many Services.
    #[arg(long, env = "B1_SERVICES", default_value_t = 1_000)]
    services: usize,
    /// How many endpoints, spread evenly over the Services (at least one each).
    #[arg(long, env = "B1_ENDPOINTS", default_value_t = 10_000)]
    endpoints: usize,
    /// How many hollow agents, one per Node.
    #[arg(long, env = "B1_AGENTS", default_value_t = 100)]
    agents: usize,
    /// How many endpoint changes (each to a different Service, so at most --services).
    #[arg(long, env = "B1_CHANGES", default_value_t = 50)]
    changes: usize,
    /// Milliseconds between two changes.
    #[arg(long, env = "B1_INTERVAL_MS", default_value_t = 200)]
    interval_ms: u64,
    /// The agents' minimum time between syncs (kube-proxy's default is 1 s).
    #[arg(long, env = "B1_MIN_SYNC_PERIOD_MS", default_value_t = 1_000)]
    min_sync_period_ms: u64,
    /// Seconds to wait for the first full sync, and for the last change to arrive.
    #[arg(long, env = "B1_TIMEOUT_S", default_value_t = 600)]
    timeout_s: u64,
    /// Where b1.json and b1.svg go.
    #[arg(long, env = "B1_OUTPUT", default_value = "bench/results")]
    output: PathBuf,
}

impl B1Args {
    fn params(&self) -> anyhow::Result<b1::Params> {
        if self.services == 0 || self.agents == 0 || self.changes == 0 {
            bail!("--services, --agents and --changes must be at least 1");
        }
        cluster::check_churn(self.services, self.endpoints, self.changes)?;
        Ok(b1::Params {
            services: self.services,
            endpoints: self.endpoints,
            agents: self.agents,
            changes: self.changes,
            interval_ms: self.interval_ms,
            min_sync_period_ms: self.min_sync_period_ms,
            timeout_s: self.timeout_s,
        })
    }
}

/// B4's flags.
#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
struct B4Args {
    /// How many nodes.
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// How many Services.
    #[arg(long, default_value_t = 10_000)]
    services: usize,
    /// How many endpoints, spread evenly over the Services (at least one each).
    #[arg(long, default_value_t = 100_000)]
    endpoints: usize,
    /// How many endpoint changes in the steady churn (as many again during --restart).
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// Milliseconds between two changes.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// The nodes' minimum time between syncs, in ms (kube-proxy's default is 1 s).
    #[arg(long, default_value_t = 1_000)]
    min_sync_period_ms: u64,
    /// How long a thin client takes to apply a revision, in ms: by default B2's splitproxy
    /// nftables partial sync at 10k Services / 100k endpoints.
    #[arg(long, default_value_t = 59)]
    sync_ms: u64,
    /// Put the Nodes in zones and hint every endpoint for its node's zone.
    #[arg(long)]
    hints: bool,
    /// DaemonSet-backed Services to add, unchurned: an endpoint on every node, two ports.
    #[arg(long, default_value_t = 0)]
    daemon_sets: usize,
    /// NodePort Services with externalTrafficPolicy Local to add, unchurned, ten endpoints each.
    #[arg(long, default_value_t = 0)]
    local_services: usize,
    /// Hand-made Services to add, unchurned: one full slice whose endpoints each name another
    /// node and carry eight node hints.
    #[arg(long, default_value_t = 0)]
    hostile_slices: usize,
    /// Thin clients take endpoint sets filtered for their node, as agents before protocol rule
    /// 15 (the canaries, real agents, still derive locality).
    #[arg(long)]
    filtered_endpoints: bool,
    /// SIGKILL the controller after the steady churn and start it again under more churn.
    #[arg(long)]
    restart: bool,
    /// After the steady churn, start a second controller replica and mark it ready in the
    /// controllers' Service under more churn: the first sheds its nodes beyond its share.
    #[arg(long, conflicts_with = "restart")]
    add_replica: bool,
    /// How many nodes run the real agent code (hollow agents) instead of a thin client.
    #[arg(long, default_value_t = 4)]
    canaries: usize,
    /// The CPU the controller is pinned to (with taskset, when installed).
    #[arg(long, default_value_t = 0)]
    controller_cpu: usize,
    /// Seconds to wait for each phase (the initial sync, the churn, the restart).
    #[arg(long, default_value_t = 1_800)]
    timeout_s: u64,
    /// Where b4.json, b4.svg and the controller's log go.
    #[arg(long, default_value = "bench/results")]
    output: PathBuf,
}

impl B4Args {
    fn params(&self) -> anyhow::Result<b4::Params> {
        if self.services == 0 || self.nodes == 0 || self.changes == 0 {
            bail!("--services, --nodes and --changes must be at least 1");
        }
        let changes = self.changes
            * if self.restart || self.add_replica {
                2
            } else {
                1
            };
        cluster::check_churn(self.services, self.endpoints, changes)?;
        if self.local_services > b4::shapes::MOST_LOCAL_SERVICES {
            bail!(
                "--local-services must be at most {}: each takes a node port of its own",
                b4::shapes::MOST_LOCAL_SERVICES
            );
        }
        Ok(b4::Params {
            nodes: self.nodes,
            services: self.services,
            endpoints: self.endpoints,
            changes: self.changes,
            interval_ms: self.interval_ms,
            min_sync_period_ms: self.min_sync_period_ms,
            sync_ms: self.sync_ms,
            hints: self.hints,
            shapes: b4::shapes::Shapes {
                daemon_sets: self.daemon_sets,
                local_services: self.local_services,
                hostile_slices: self.hostile_slices,
            },
            filtered_endpoints: self.filtered_endpoints,
            restart: self.restart,
            add_replica: self.add_replica,
            canaries: self.canaries,
            controller_cpu: Some(self.controller_cpu),
            timeout_s: self.timeout_s,
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().benchmark {
        Benchmark::B1(args) => run_b1(args).await,
        Benchmark::B2(args) => {
            let params = args.params().unwrap_or_else(|err| bad_flags(&err));
            // The lab drives processes and waits on them: blocking work, off the runtime.
            tokio::task::spawn_blocking(move || b2::run(&args, params)).await?
        }
        Benchmark::B3(args) => run_b3(&args),
        Benchmark::B4(args) => run_b4(args).await,
        Benchmark::B4Plot { runs, output } => plot_b4(&runs, &output),
        Benchmark::B5(args) => {
            let params = args.params().unwrap_or_else(|err| bad_flags(&err));
            tokio::task::spawn_blocking(move || b5::run(&args, params)).await?
        }
        Benchmark::B5Serve(args) => b5::load::serve(&args),
        Benchmark::B5Load(args) => b5::load::load(&args),
    }
}

/// Exits with the usage error code and `err`.
fn bad_flags(err: &anyhow::Error) -> ! {
    eprintln!("splitproxy-bench: {err:#}");
    std::process::exit(64);
}

/// Runs B3 and writes `b3.json` and `b3.svg`.
fn run_b3(args: &b3::Args) -> anyhow::Result<()> {
    let params = args.params().unwrap_or_else(|err| bad_flags(&err));
    let output = args.output();
    std::fs::create_dir_all(output).with_context(|| format!("creating {}", output.display()))?;
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    // The lab and kubectl block; nothing else runs meanwhile.
    let results = b3::run(params, scratch.path(), |results| {
        let json = serde_json::to_string_pretty(results)?;
        std::fs::write(output.join("b3.json"), format!("{json}\n"))?;
        std::fs::write(output.join("b3.svg"), b3::plot(results))?;
        Ok(())
    })?;
    println!("{}", serde_json::to_string_pretty(&results)?);
    Ok(())
}

/// Runs B4 and writes `b4.json` and `b4.svg`.
async fn run_b4(args: B4Args) -> anyhow::Result<()> {
    let params = args.params().unwrap_or_else(|err| bad_flags(&err));
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let manifests = tempfile::tempdir().context("creating the manifests directory")?;
    let results = b4::run(params, manifests.path(), &args.output).await?;

    let json = serde_json::to_string_pretty(&results)?;
    std::fs::write(args.output.join("b4.json"), format!("{json}\n"))?;
    let p = &results.params;
    let title = format!(
        "B4: {} nodes, {} Services, {} endpoints{}: programming latency CDF",
        p.nodes,
        p.services,
        p.endpoints,
        if p.hints { ", zone hints" } else { "" }
    );
    std::fs::write(
        args.output.join("b4.svg"),
        svg::cdf(&title, &results.latencies),
    )?;
    println!("{json}");
    Ok(())
}

/// Writes the B4 sweep plot of `runs` to `output`.
fn plot_b4(runs: &[PathBuf], output: &std::path::Path) -> anyhow::Result<()> {
    let runs = runs
        .iter()
        .map(|path| {
            let file = if path.is_dir() {
                path.join("b4.json")
            } else {
                path.clone()
            };
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))
        })
        .collect::<anyhow::Result<Vec<serde_json::Value>>>()?;
    std::fs::write(output, b4::sweep::plot(&runs))
        .with_context(|| format!("writing {}", output.display()))
}

/// Runs B1 and writes `b1.json` and `b1.svg`.
async fn run_b1(args: B1Args) -> anyhow::Result<()> {
    let params = args.params().unwrap_or_else(|err| bad_flags(&err));
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let manifests = tempfile::tempdir().context("creating the manifests directory")?;
    let results = b1::run(params, manifests.path()).await?;

    let json = serde_json::to_string_pretty(&results)?;
    std::fs::write(args.output.join("b1.json"), format!("{json}\n"))?;
    let p = &results.params;
    let title = format!(
        "B1: {} Services, {} endpoints, {} agents: programming latency CDF",
        p.services, p.endpoints, p.agents
    );
    std::fs::write(
        args.output.join("b1.svg"),
        svg::cdf(&title, &results.latencies),
    )?;
    println!("{json}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_changes_than_services_is_refused() {
        let cli = Cli::try_parse_from([
            "splitproxy-bench",
            "b1",
            "--services",
            "5",
            "--changes",
            "6",
        ])
        .expect("flags parse");
        let Benchmark::B1(args) = cli.benchmark else {
            panic!("b1 parses as B1");
        };
        let err = args.params().expect_err("too many changes");
        assert!(err.to_string().contains("at most --services"), "{err}");
    }

    #[test]
    fn b4_needs_a_service_for_every_change_of_both_churns() {
        let parse = |flags: &[&str]| {
            let cli = Cli::try_parse_from(["splitproxy-bench", "b4"].iter().chain(flags))
                .expect("flags parse");
            let Benchmark::B4(args) = cli.benchmark else {
                panic!("b4 parses as B4");
            };
            args.params()
        };
        let base = [
            "--services",
            "150",
            "--endpoints",
            "300",
            "--changes",
            "100",
        ];
        assert_eq!(parse(&base).expect("fits").changes, 100);
        let restart = [&base[..], &["--restart"]].concat();
        let err = parse(&restart).expect_err("200 changes, 150 Services");
        assert!(err.to_string().contains("at most --services"), "{err}");
    }

    fn b2(flags: &[&str]) -> anyhow::Result<b2::Params> {
        let cli = Cli::try_parse_from(["splitproxy-bench", "b2"].iter().chain(flags))?;
        let Benchmark::B2(args) = cli.benchmark else {
            panic!("b2 parses as B2");
        };
        args.params()
    }

    #[test]
    fn b2_sizes_come_as_lists_or_repeated_flags() {
        let params = b2(&[
            "--services",
            "20,30",
            "--endpoints",
            "30",
            "--endpoints",
            "40",
        ])
        .expect("two sizes");
        let sizes: Vec<_> = params
            .sizes
            .iter()
            .map(|s| (s.services, s.endpoints))
            .collect();
        assert_eq!(sizes, vec![(20, 30), (30, 40)]);
        let defaults = b2(&[]).expect("the defaults");
        assert_eq!(defaults.sizes.len(), 2);
    }

    #[test]
    fn b2_sizes_that_do_not_pair_up_are_refused() {
        let err = b2(&["--services", "20,30", "--endpoints", "30"]).expect_err("unpaired");
        assert!(err.to_string().contains("must pair up"), "{err}");
        let err = b2(&["--services", "20", "--endpoints", "5"]).expect_err("too few endpoints");
        assert!(err.to_string().contains("at least --services"), "{err}");
    }

    #[test]
    fn b3_sizes_are_sorted_and_bounded() {
        let parse = |nodes: &str| {
            let cli = Cli::try_parse_from(["splitproxy-bench", "b3", "--nodes", nodes])
                .expect("flags parse");
            let Benchmark::B3(args) = cli.benchmark else {
                panic!("parsed as another benchmark");
            };
            args.params()
        };
        assert_eq!(parse("50,10,20,10").expect("valid").nodes, vec![10, 20, 50]);
        let err = parse("10,201").expect_err("too many nodes");
        assert!(err.to_string().contains("--nodes 201"), "{err}");
    }
}
