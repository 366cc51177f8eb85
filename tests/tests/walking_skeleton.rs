//! The whole product on the real kernel: controller → gRPC → agents → iptables → real traffic
//! between network namespaces. Needs root; `scripts/test.sh` builds the binaries first.
//!
//! Addresses: see `splitproxy_e2e::addresses` (node LAN 198.18.0.0/24, pods 10.244.<node>.0/24,
//! Services 10.96.0.0/16); the web Service is 10.96.0.10:80, node port 30080.

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, ensure};
use splitproxy_dataplane::{Protocol, iptables::chain_names};
use splitproxy_e2e::{
    agent_metric, await_reconnects,
    demo_cluster::{DemoCluster, SERVICE},
    eventually, hit,
    lab::HasNamespace,
};
use std::time::Duration;

/// Requests per check: with two ready endpoints picked at random, the chance that one of them gets
/// none of 60 requests is 2 × 2⁻⁶⁰.
const REQUESTS: u32 = 60;
/// The longest wait for rules to converge; generous because CI machines are slow and shared.
const CONVERGE: Duration = Duration::from_secs(90);

/// Waits until traffic matches the cluster's ready endpoints, then checks it once more in full.
fn converge(cluster: &DemoCluster, what: &str) -> Result<()> {
    eventually(what, CONVERGE, || cluster.check_traffic(REQUESTS).map(drop))
}

#[test]
fn a_node_port_service_is_reachable_end_to_end_and_survives_the_controller() -> Result<()> {
    let mut cluster = DemoCluster::start("skel")?;
    converge(
        &cluster,
        "traffic reaches exactly the ready endpoints (web-a, web-c)",
    )
    .with_context(|| cluster.logs())?;

    // The rules have kube-proxy's layout and names, so the usual troubleshooting works.
    let port_name = format!("{SERVICE}:http");
    let svc_chain = chain_names::service_chain(&port_name, Protocol::Tcp);
    let node1 = &cluster.nodes[0];
    let nat = cluster.run(node1, "iptables-save", &["-t", "nat"])?;
    for expected in [
        format!(
            "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"{port_name} cluster IP\" -m tcp --dport 80 -j {svc_chain}"
        ),
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
            .to_owned(),
        format!(
            "-j {}",
            chain_names::endpoint_chain(&port_name, Protocol::Tcp, "10.244.1.2:8080")
        ),
        "-j DNAT --to-destination 10.244.1.2:8080".to_owned(),
    ] {
        ensure!(
            nat.contains(&expected),
            "node-1's nat table lacks {expected:?}:\n{nat}"
        );
    }
    ensure!(
        !nat.contains("10.244.2.2:8080"),
        "the not-ready endpoint web-b must not be programmed:\n{nat}"
    );

    // kube-proxy's endpoints.
    let mode = cluster.run(node1, "curl", &["-sf", "http://127.0.0.1:10249/proxyMode"])?;
    ensure!(mode == "iptables", "/proxyMode said {mode:?}");
    let health = cluster.run(node1, "curl", &["-sf", "http://127.0.0.1:10256/healthz"])?;
    ensure!(health.contains("lastUpdated"), "/healthz said {health:?}");

    // The real grpcurl sees the node's state through reflection.
    let services = cluster.run(node1, "grpcurl", &["-plaintext", "127.0.0.1:10661", "list"])?;
    ensure!(
        services.contains("splitproxy.v1alpha1.NodeInspectionService"),
        "grpcurl list: {services}"
    );
    let listed = cluster.run(
        node1,
        "grpcurl",
        &[
            "-plaintext",
            "127.0.0.1:10661",
            "splitproxy.v1alpha1.NodeInspectionService/ListServices",
        ],
    )?;
    ensure!(
        listed.contains("\"name\": \"web\"") && listed.contains("10.244.2.3"),
        "grpcurl ListServices: {listed}"
    );

    // Editing the manifests converges: web-a goes away, web-b becomes ready.
    cluster.set_web(&[("web-b", true), ("web-c", true)])?;
    converge(&cluster, "traffic moves to web-b and web-c after the edit")
        .with_context(|| cluster.logs())?;

    // Fail static: with the controller gone, the rules stay and traffic keeps flowing.
    cluster.kill_controller()?;
    cluster
        .check_traffic(REQUESTS)
        .context("after the controller was killed")?;
    await_reconnects(&cluster.lab, &cluster.nodes, CONVERGE)?;
    cluster
        .check_traffic(REQUESTS)
        .context("while the agents retry the dead controller")?;

    // A new controller process (new epoch) has never served the agents, yet sends each a delta
    // from the digests of what it holds, not a reset: the agents received one reset each, when
    // they first connected.
    cluster.start_controller()?;
    cluster.set_web(&[("web-a", true), ("web-b", false), ("web-c", true)])?;
    converge(
        &cluster,
        "traffic follows the manifests again after the restart",
    )
    .with_context(|| cluster.logs())?;
    for node in &cluster.nodes {
        let resets = agent_metric(
            &cluster.lab,
            node,
            "splitproxy_agent_reset_revisions_received_total",
        )?;
        ensure!(resets == 1.0, "{} received {resets} resets", node.name());
    }

    // With no endpoints left, clients are refused at once (REJECT), from the node, from a pod
    // and through the node port, instead of waiting for a timeout.
    cluster.set_web(&[])?;
    let targets = [
        (cluster.nodes[0].ns_name(), DemoCluster::cluster_ip_url()),
        (cluster.clients[1].ns_name(), DemoCluster::cluster_ip_url()),
        (
            cluster.external.ns_name(),
            DemoCluster::node_port_url(&cluster.nodes[0]),
        ),
    ];
    eventually(
        "clients of the endpoint-less Service are refused",
        CONVERGE,
        || {
            for (from, url) in &targets {
                let report = hit(&cluster.lab, *from, url, 5)?;
                ensure!(
                    report.failures == 5 && report.errors.iter().all(|e| e.contains("refused")),
                    "from {from} to {url}: expected 5 refused connections, got {report:?}"
                );
            }
            Ok(())
        },
    )
    .with_context(|| cluster.logs())?;
    Ok(())
}
