//! Stuck agents hold up neither the controller nor the other agents, and cost the controller a
//! bounded amount of memory: agents that never read their stream or never acknowledge stay
//! connected while edits to thousands of Services' endpoints churn through, the real agents'
//! traffic follows every change, the controller's RSS stays within a bound derived from the
//! data, and its inspection shows the stuck nodes behind. Needs root; `scripts/test.sh` builds
//! the binaries.
//!
//! Addresses: see `splitproxy_e2e::addresses`; the web Service is 10.96.0.10, the bulk Services
//! this test adds are 10.96.1.1 to 10.96.8.250 with endpoints in 10.244.100.1 to
//! 10.244.115.250, where no pod lives (only their rules and the size of their revisions
//! matter). The stuck agents run on the control-plane host, as nodes `stuck-1` … that the
//! manifests list as Nodes.

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use splitproxy_e2e::{
    demo_cluster::{CONTROLLER_INSPECTION, CONVERGE, DemoCluster},
    eventually,
    lab::Process,
    workspace_binary,
};
use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

/// Bulk Services and endpoints each: a few thousand endpoints, so every revision is big, and
/// thousands of resources, so a full revision is more messages than the controller's channel to
/// an agent holds.
const BULK_SERVICES: usize = 2000;
const ENDPOINTS_PER_SERVICE: usize = 2;
/// Edits of the bulk Services per phase; each moves every endpoint to a new port, and is
/// published before the next is written, so every one is a state a stuck stream misses.
const EDITS_PER_PHASE: usize = 30;
/// Every this many edits the web pods' readiness flips and traffic must follow.
const FLIP_EVERY: usize = 15;
/// The stuck agents: node name and how each is stuck (`sp-stuck-agent --behaviour`). Several of
/// each, so what a stuck stream costs stands out from the allocator's noise.
const STUCK: [(&str, &str); 8] = [
    ("stuck-1", "never-read"),
    ("stuck-2", "never-read"),
    ("stuck-3", "never-read"),
    ("stuck-4", "never-read"),
    ("stuck-5", "never-read"),
    ("stuck-6", "never-read"),
    ("stuck-7", "never-ack"),
    ("stuck-8", "never-ack"),
];
/// What one stuck stream may hold, in encoded sizes of its full revision: the view it brings the
/// node to and the messages being sent, each several times bigger in memory than on the wire,
/// plus what is parked in the channel and HTTP/2 buffers. Held once, not per change.
const STREAM_COST_IN_REVISIONS: u64 = 16;
/// How much the churn may grow the controller while stuck agents are attached, at least: the
/// allocator keeping freed memory. The same churn without them sets the bound when it grew the
/// controller more (it does, by 25 to 30 MiB: the allocator is still settling), so the bound
/// follows the machine's allocator rather than a guess, and stays far below what queueing
/// revisions for the stuck streams would take.
const CHURN_GROWTH_KIB: u64 = 16 * 1024;
/// The controller's keepalive (a ping every 30 s, 20 s to answer) with room to spare.
const FROZEN_DROPPED: Duration = Duration::from_secs(120);
/// The web pods that are ready after each flip, in turn.
const WEB_TURNS: [&[&str]; 3] = [&["web-a"], &["web-c"], &["web-a", "web-c"]];

#[test]
fn stuck_agents_hold_up_neither_the_controller_nor_the_other_agents() -> Result<()> {
    let mut cluster = DemoCluster::start("slow")?;
    cluster.write_manifest("stuck-nodes.yaml", &stuck_nodes_yaml())?;
    cluster.write_manifest("bulk.yaml", &bulk_yaml(0))?;
    let mut flips = 0;
    let settle = flip_web(&mut cluster, &mut flips)?;
    let controller = cluster
        .controller
        .as_ref()
        .context("the controller runs")?
        .pid();

    let before = Memory::of(controller)?;
    let alone = churn(&mut cluster, 0, &mut flips)?;
    let after_alone = Memory::of(controller)?;

    let stuck = start_stuck_agents(&mut cluster)?;
    let attached = Memory::of(controller)?;
    let with_stuck = churn(&mut cluster, EDITS_PER_PHASE, &mut flips)?;
    let after_stuck = Memory::of(controller)?;

    // (3) The inspection shows the stuck nodes behind, the healthy ones caught up.
    let nodes = eventually(
        "the healthy nodes acknowledge the latest revision",
        CONVERGE,
        || {
            let nodes = connected_nodes(&cluster)?;
            for node in &cluster.nodes {
                let entry = find(&nodes, node.name())?;
                ensure!(
                    number(&entry["ackedRevision"]) == number(&entry["latestRevision"]),
                    "{} is behind: {entry}",
                    node.name()
                );
            }
            Ok(nodes)
        },
    )
    .with_context(|| cluster.logs())?;
    let reset_bytes = print_nodes(&cluster, &nodes)?;
    for (name, _) in STUCK {
        let entry = find(&nodes, name)?;
        ensure!(
            number(&entry["ackedRevision"]) == 0
                && number(&entry["latestRevision"]) == 1
                && entry["behindSince"].is_string()
                && entry["lag"].is_string(),
            "{name} should show one revision sent, none acknowledged, and a lag: {entry}"
        );
    }
    for (agent, (name, _)) in stuck.iter().zip(STUCK) {
        let revisions_read = agent.log().matches(" complete").count();
        ensure!(
            revisions_read <= 1,
            "{name} never acknowledges, yet was sent {revisions_read} revisions:\n{}",
            agent.log()
        );
    }

    // (2) Memory: each stuck stream costs a few copies of its one revision, once; the churn
    // through them grows the controller no more than the same churn without them, although it
    // published enough that queueing revisions for them would show.
    let published = with_stuck.published;
    let stuck_count = STUCK.len() as u64;
    let per_stream_kib = attached.rss_kib.saturating_sub(after_alone.rss_kib) / stuck_count;
    let stream_bound_kib = STREAM_COST_IN_REVISIONS * reset_bytes / 1024;
    let churn_growth_kib = after_stuck.hwm_kib.saturating_sub(attached.hwm_kib);
    let alone_growth_kib = after_alone.hwm_kib.saturating_sub(before.hwm_kib);
    let churn_bound_kib = CHURN_GROWTH_KIB.max(alone_growth_kib);
    let queued_kib = stuck_count * published * reset_bytes / 1024;
    println!(
        "controller memory (KiB)        VmRSS   VmHWM\n\
         \x20 before the churn           {:>7} {:>7}\n\
         \x20 after churn, no stuck      {:>7} {:>7}\n\
         \x20 {stuck_count} stuck agents attached    {:>7} {:>7}\n\
         \x20 after churn, stuck         {:>7} {:>7}\n\
         a full revision is {reset_bytes} bytes encoded; each stuck stream holds {per_stream_kib} \
         KiB (bound {stream_bound_kib}); {} states published without stuck agents, {published} \
         with; queueing them for the stuck streams would hold over {queued_kib} KiB",
        before.rss_kib,
        before.hwm_kib,
        after_alone.rss_kib,
        after_alone.hwm_kib,
        attached.rss_kib,
        attached.hwm_kib,
        after_stuck.rss_kib,
        after_stuck.hwm_kib,
        alone.published,
    );
    println!(
        "healthy agents: traffic followed the first change in {settle:?}; flips without stuck \
         agents {:?}, with {:?}",
        alone.converged, with_stuck.converged
    );
    ensure!(
        per_stream_kib <= stream_bound_kib,
        "each stuck stream costs the controller {per_stream_kib} KiB, over {stream_bound_kib} KiB"
    );
    ensure!(
        churn_bound_kib < queued_kib,
        "the churn is too small to tell bounded memory ({churn_bound_kib} KiB) from queued \
         revisions ({queued_kib} KiB)"
    );
    ensure!(
        churn_growth_kib <= churn_bound_kib,
        "the churn grew the controller's VmHWM by {churn_growth_kib} KiB with stuck agents \
         attached, over the bound of {churn_bound_kib} KiB (the same churn without them grew \
         it by {alone_growth_kib} KiB)"
    );

    // A stuck agent stays connected, as a slow one must; a frozen one, whose HTTP/2 layer stops
    // answering the controller's keepalive pings, is dropped.
    let (frozen, frozen_name) = (&stuck[0], STUCK[0].0);
    let status = std::process::Command::new("kill")
        .args(["-STOP", &frozen.pid().to_string()])
        .status()
        .context("running kill")?;
    ensure!(status.success(), "kill -STOP failed: {status}");
    let frozen_at = Instant::now();
    eventually(
        "the controller drops the frozen agent's stream",
        FROZEN_DROPPED,
        || {
            let nodes = connected_nodes(&cluster)?;
            ensure!(
                find(&nodes, frozen_name).is_err(),
                "{frozen_name} is still listed"
            );
            for (name, _) in &STUCK[1..] {
                find(&nodes, name)?;
            }
            Ok(())
        },
    )
    .with_context(|| cluster.logs())?;
    println!(
        "the frozen agent's stream was dropped after {:?}",
        frozen_at.elapsed()
    );
    Ok(())
}

/// What the kernel says of a process's memory.
#[derive(Debug, Clone, Copy)]
struct Memory {
    /// Resident now.
    rss_kib: u64,
    /// The most ever resident.
    hwm_kib: u64,
}

impl Memory {
    fn of(pid: u32) -> Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading the status of process {pid}"))?;
        let field = |name: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|value| value.trim().strip_suffix(" kB"))
                .with_context(|| format!("no {name} in /proc/{pid}/status"))?
                .trim()
                .parse()
                .with_context(|| format!("{name} of process {pid}"))
        };
        Ok(Self {
            rss_kib: field("VmRSS")?,
            hwm_kib: field("VmHWM")?,
        })
    }
}

/// What one churn phase did.
struct Churned {
    /// Cluster states the controller published meanwhile (its `cluster state changed` lines).
    published: u64,
    /// How long the healthy agents' traffic took to follow each flip of the web pods.
    converged: Vec<Duration>,
}

/// Edits the bulk Services [`EDITS_PER_PHASE`] times from edit number `first`, each published
/// before the next, flipping the web pods' readiness every [`FLIP_EVERY`] edits and waiting for
/// traffic to follow.
fn churn(cluster: &mut DemoCluster, first: usize, flips: &mut usize) -> Result<Churned> {
    let published_before = published(cluster);
    let mut converged = Vec::new();
    for edit in first + 1..=first + EDITS_PER_PHASE {
        let before = published(cluster);
        cluster.write_manifest("bulk.yaml", &bulk_yaml(edit))?;
        eventually("the controller publishes the edit", CONVERGE, || {
            ensure!(published(cluster) > before, "edit {edit} not published yet");
            Ok(())
        })
        .with_context(|| cluster.logs())?;
        if edit % FLIP_EVERY == 0 {
            converged.push(flip_web(cluster, flips)?);
        }
    }
    Ok(Churned {
        published: published(cluster) - published_before,
        converged,
    })
}

/// Makes the next web pods of [`WEB_TURNS`] ready and waits until the cluster IP answers from
/// exactly those, from every node; returns how long that took.
fn flip_web(cluster: &mut DemoCluster, flips: &mut usize) -> Result<Duration> {
    let ready = WEB_TURNS[*flips % WEB_TURNS.len()];
    *flips += 1;
    let web: Vec<(&str, bool)> = ["web-a", "web-b", "web-c"]
        .into_iter()
        .map(|pod| (pod, ready.contains(&pod)))
        .collect();
    let start = Instant::now();
    cluster.set_web(&web)?;
    for node in &cluster.nodes {
        cluster.expect_answers(node, &DemoCluster::cluster_ip_url(), ready, 20)?;
    }
    Ok(start.elapsed())
}

/// How many cluster states the controller has published so far.
fn published(cluster: &DemoCluster) -> u64 {
    cluster.controller.as_ref().map_or(0, |controller| {
        controller.log().matches("cluster state changed").count() as u64
    })
}

/// Starts the [`STUCK`] agents and waits until each holds its first revision.
fn start_stuck_agents(cluster: &mut DemoCluster) -> Result<Vec<Process>> {
    let url = cluster.controller_url();
    let ca = cluster.controller_tls().ca.to_string_lossy().into_owned();
    let binary = workspace_binary("sp-stuck-agent")?;
    let mut agents = Vec::new();
    for (node, behaviour) in STUCK {
        let token = cluster.issue_token(node)?.to_string_lossy().into_owned();
        let args = [
            "--controller",
            &url,
            "--ca-file",
            &ca,
            "--token-file",
            &token,
            "--node",
            node,
            "--behaviour",
            behaviour,
        ];
        let host = cluster.control_plane.clone();
        agents.push(cluster.lab.spawn(&host, &binary, &args)?);
    }
    eventually("every stuck agent is sent a revision", CONVERGE, || {
        let nodes = connected_nodes(cluster)?;
        for (name, _) in STUCK {
            let entry = find(&nodes, name)?;
            ensure!(number(&entry["latestRevision"]) == 1, "{entry}");
        }
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    Ok(agents)
}

/// `ControllerInspectionService/ListNodes` through grpcurl.
fn connected_nodes(cluster: &DemoCluster) -> Result<Vec<Value>> {
    let method = "splitproxy.v1alpha1.ControllerInspectionService/ListNodes";
    let text = cluster.run(
        &cluster.control_plane,
        "grpcurl",
        &["-plaintext", CONTROLLER_INSPECTION, method],
    )?;
    let listed: Value =
        serde_json::from_str(&text).with_context(|| format!("grpcurl printed no JSON: {text}"))?;
    Ok(listed["nodes"].as_array().cloned().unwrap_or_default())
}

fn find<'a>(nodes: &'a [Value], name: &str) -> Result<&'a Value> {
    nodes
        .iter()
        .find(|n| n["nodeName"] == name)
        .with_context(|| format!("{name} is not listed among {nodes:?}"))
}

/// A 64-bit number as protobuf's JSON writes it (a string, absent when 0).
fn number(value: &Value) -> u64 {
    value.as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Prints what the controller sent each node; returns the bytes of the one revision a stuck
/// agent was sent (its reset, the biggest revision there is).
fn print_nodes(cluster: &DemoCluster, nodes: &[Value]) -> Result<u64> {
    println!("node       revisions acked/sent  messages  bytes");
    for entry in nodes {
        println!(
            "{:<10} {:>9}/{:<9} {:>9} {:>9}",
            entry["nodeName"].as_str().unwrap_or("?"),
            number(&entry["ackedRevision"]),
            number(&entry["latestRevision"]),
            number(&entry["messagesSent"]),
            number(&entry["bytesSent"]),
        );
    }
    let reset = number(&find(nodes, STUCK[0].0)?["bytesSent"]);
    ensure!(
        reset > 0,
        "no bytes sent to {}:\n{}",
        STUCK[0].0,
        cluster.logs()
    );
    Ok(reset)
}

/// The stuck agents' Node objects, so the controller serves them as known nodes.
fn stuck_nodes_yaml() -> String {
    STUCK
        .iter()
        .map(|(name, _)| format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n---\n"))
        .collect()
}

/// The bulk Services and their EndpointSlices at edit number `edit`: every endpoint listens on
/// port `8000 + edit`, so each edit changes every Service's endpoints.
fn bulk_yaml(edit: usize) -> String {
    let mut yaml = String::new();
    for service in 0..BULK_SERVICES {
        let _ = write!(
            yaml,
            "apiVersion: v1
kind: Service
metadata:
  name: bulk-{service}
  namespace: demo
spec:
  clusterIP: 10.96.{}.{}
  ports:
  - name: http
    protocol: TCP
    port: 80
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: bulk-{service}-a1b2c
  namespace: demo
  labels:
    kubernetes.io/service-name: bulk-{service}
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: {port}
endpoints:
",
            1 + service / 250,
            1 + service % 250,
            port = 8000 + edit,
        );
        for endpoint in 0..ENDPOINTS_PER_SERVICE {
            let index = service * ENDPOINTS_PER_SERVICE + endpoint;
            let _ = writeln!(
                yaml,
                "- addresses: [10.244.{}.{}]\n  conditions: {{ready: true}}",
                100 + index / 250,
                1 + index % 250
            );
        }
        yaml.push_str("---\n");
    }
    yaml
}
