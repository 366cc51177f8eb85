//! `splitproxy-demo`: the whole product on one machine. Builds the demo cluster in network
//! namespaces (a controller on the manifests source, two nodes with agents in iptables mode, web
//! pods), shows who answers the Service, the rule walk as operators know it, the node's state
//! through grpcurl, an edit converging, and traffic surviving the controller; with `--ebpf`, node-1
//! switching to the ebpf mode. Needs root.

use anyhow::{Context, Result};
use splitproxy_dataplane::{Protocol, iptables::chain_names};
use splitproxy_e2e::{
    demo_cluster::{
        CLUSTER_IP, DemoCluster, NODE_PORT, Observation, POD_PORT, SERVICE, SERVICE_PORT,
    },
    eventually,
};
use std::{
    process::ExitCode,
    time::{Duration, Instant},
};

const REQUESTS: u32 = 40;
const CONVERGE: Duration = Duration::from_secs(90);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ebpf = match args.as_slice() {
        [] => false,
        [flag] if flag == "--ebpf" => true,
        _ => {
            eprintln!("usage: splitproxy-demo [--ebpf]");
            return ExitCode::FAILURE;
        }
    };
    match run(ebpf) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("demo failed: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(ebpf: bool) -> Result<()> {
    heading("splitproxy demo: one controller, two node agents (iptables), real traffic");
    let started = Instant::now();
    let mut cluster = DemoCluster::start("demo")?;
    println!(
        "Service {SERVICE}: NodePort, cluster IP {CLUSTER_IP}:{SERVICE_PORT}, node port {NODE_PORT}, \
         target port \"web\" (named; the pods listen on {POD_PORT})"
    );
    print_endpoints(&cluster);
    println!(
        "Controller on {} (TLS; each agent proves its node with its own token); manifests in {}",
        cluster.controller_url(),
        cluster.manifests_dir().display()
    );

    let observations = converge(&cluster).with_context(|| cluster.logs())?;
    println!(
        "\nAgents programmed both nodes {:.1} s after start.",
        started.elapsed().as_secs_f64()
    );
    heading(&format!(
        "Who answered {REQUESTS} requests (one connection each)"
    ));
    print_observations(&observations);

    heading("The rule walk on node-1, as `iptables -t nat -L` shows it");
    let node1 = cluster.nodes[0].clone();
    let port_name = format!("{SERVICE}:http");
    let svc = chain_names::service_chain(&port_name, Protocol::Tcp);
    let first_ready = cluster
        .web
        .iter()
        .find(|w| w.ready)
        .context("a ready pod")?;
    let sep = chain_names::endpoint_chain(
        &port_name,
        Protocol::Tcp,
        &format!("{}:{POD_PORT}", first_ready.pod.ip()),
    );
    for chain in ["KUBE-SERVICES", "KUBE-NODEPORTS", &svc, &sep] {
        println!("$ iptables -t nat -L {chain} -n");
        print!(
            "{}",
            cluster.run(&node1, "iptables", &["-t", "nat", "-L", chain, "-n"])?
        );
        println!();
    }

    heading("node-1's state through grpcurl (gRPC reflection, bound to the node's localhost)");
    for method in ["GetNodeState", "ListServices"] {
        let full = format!("splitproxy.v1alpha1.NodeInspectionService/{method}");
        println!("$ grpcurl -plaintext 127.0.0.1:10661 {full}");
        println!(
            "{}",
            cluster.run(&node1, "grpcurl", &["-plaintext", "127.0.0.1:10661", &full])?
        );
    }
    println!("$ curl http://127.0.0.1:10249/proxyMode");
    println!(
        "{}",
        cluster.run(&node1, "curl", &["-s", "http://127.0.0.1:10249/proxyMode"])?
    );

    heading("Edit the manifests: web-a leaves, web-b becomes ready");
    cluster.set_web(&[("web-b", true), ("web-c", true)])?;
    let edited = Instant::now();
    let observations = converge(&cluster).with_context(|| cluster.logs())?;
    println!(
        "Converged within {:.1} s (including the {REQUESTS}-request checks).",
        edited.elapsed().as_secs_f64()
    );
    print_endpoints(&cluster);
    print_observations(&observations);

    heading("Kill the controller (SIGKILL): the nodes keep their rules");
    cluster.kill_controller()?;
    let observations = cluster.check_traffic(REQUESTS)?;
    print_observations(&observations);
    if ebpf {
        show_ebpf(&mut cluster)?;
    }
    println!("\nDone; removing the namespaces.");
    Ok(())
}

/// The controller back, node-1 switched to the ebpf mode: its iptables rules gone, its pod and
/// the node itself answered through the socket programs, the pins that outlive the agent.
fn show_ebpf(cluster: &mut DemoCluster) -> Result<()> {
    heading("The controller back; node-1 switches to the ebpf mode (--proxy-mode ebpf)");
    cluster.start_controller()?;
    let (bpffs, _) = cluster.switch_to_ebpf(0)?;
    let node1 = cluster.nodes[0].clone();
    eventually("node-1's iptables rules are removed", CONVERGE, || {
        let nat = cluster.run(&node1, "iptables-save", &["-t", "nat"])?;
        anyhow::ensure!(
            !nat.contains("KUBE-SERVICES"),
            "nat still holds KUBE-SERVICES"
        );
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    println!("$ curl http://127.0.0.1:10249/proxyMode");
    println!(
        "{}",
        cluster.run(&node1, "curl", &["-s", "http://127.0.0.1:10249/proxyMode"])?
    );
    println!("$ iptables -t nat -S | grep -c KUBE-   (nothing left of the iptables mode)");
    let nat = cluster.run(&node1, "iptables", &["-t", "nat", "-S"])?;
    println!(
        "{}",
        nat.lines().filter(|line| line.contains("KUBE-")).count()
    );
    let ready: Vec<String> = cluster.ready_web();
    let ready: Vec<&str> = ready.iter().map(String::as_str).collect();
    let url = DemoCluster::cluster_ip_url();
    let client = cluster.clients[0].clone();
    cluster.expect_answers(&client, &url, &ready, REQUESTS)?;
    cluster.expect_answers(&node1, &url, &ready, REQUESTS)?;
    println!(
        "{} on node-1 and node-1 itself: all {REQUESTS} requests to {url} answered by \
         {ready:?}, each socket sent to its endpoint at connect() by the programs on node-1's \
         cgroup",
        client.name()
    );
    let links = bpffs.path().join("splitproxy/v1/links");
    println!(
        "$ ls {}   (pinned: they serve while no agent runs)",
        links.display()
    );
    let mut names: Vec<String> = std::fs::read_dir(&links)?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    println!("{}", names.join("\n"));
    Ok(())
}

fn converge(cluster: &DemoCluster) -> Result<Vec<Observation>> {
    eventually("traffic reaches exactly the ready pods", CONVERGE, || {
        cluster.check_traffic(REQUESTS)
    })
}

fn heading(text: &str) {
    println!("\n=== {text} ===");
}

fn print_endpoints(cluster: &DemoCluster) {
    for web in &cluster.web {
        let state = match (web.listed, web.ready) {
            (false, _) => "not in the EndpointSlice",
            (true, true) => "ready",
            (true, false) => "NOT ready",
        };
        println!(
            "  endpoint {} {} on {}: {state}",
            web.pod.name(),
            web.pod.ip(),
            web.pod.node_name()
        );
    }
}

fn print_observations(observations: &[Observation]) {
    for o in observations {
        let answers: Vec<String> = o
            .report
            .answers
            .iter()
            .map(|(pod, n)| format!("{pod}: {n}"))
            .collect();
        println!(
            "  from {:<28} to {:<26} {} (failed: {})",
            o.from,
            o.url,
            answers.join(", "),
            o.report.failures
        );
    }
}
