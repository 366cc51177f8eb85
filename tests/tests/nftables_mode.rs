//! The agent in nftables mode (`--proxy-mode nftables`) on the demo cluster: controller → gRPC →
//! agents → one `nft -f -` per sync → real traffic between network namespaces. Needs root and
//! `nft`; `scripts/test.sh` builds the binaries first.
//!
//! Addresses: see `splitproxy_e2e::addresses` (node LAN 198.18.0.0/24, pods 10.244.<node>.0/24,
//! Services 10.96.0.0/16); the web Service is 10.96.0.10:80, node port 30080 (taken on each
//! node's primary IP, the nftables mode's default).

use anyhow::{Context, Result, ensure};
use splitproxy_dataplane::{
    Protocol, ServiceKey,
    nftables::names::{SERVICE_PREFIX, endpoint_map, port_base},
};
use splitproxy_e2e::demo_cluster::DemoCluster;
use splitproxy_e2e::eventually;
use std::time::Duration;

/// Requests per check: with two ready endpoints picked at random, the chance that one of them gets
/// none of 60 requests is 2 × 2⁻⁶⁰.
const REQUESTS: u32 = 60;
/// The longest wait for rules to converge; generous because CI machines are slow and shared.
const CONVERGE: Duration = Duration::from_secs(90);

fn converge(cluster: &DemoCluster, what: &str) -> Result<()> {
    eventually(what, CONVERGE, || cluster.check_traffic(REQUESTS).map(drop))
}

#[test]
fn the_agent_in_nftables_mode_serves_the_cluster_and_keeps_serving_without_the_controller()
-> Result<()> {
    let mut cluster = DemoCluster::start_with(
        "nft",
        &["--proxy-mode", "nftables", "--iptables-sync-period", "2s"],
    )?;
    converge(
        &cluster,
        "traffic reaches exactly the ready endpoints (web-a, web-c)",
    )
    .with_context(|| cluster.logs())?;

    // kube-proxy's table, chain names and hashes, so `nft list` reads as upstream's; the chain
    // picks its two endpoints from the endpoint map named after its hash.
    let node1 = &cluster.nodes[0];
    let table = cluster.run(node1, "nft", &["list", "table", "ip", "kube-proxy"])?;
    let base = port_base(&ServiceKey::new("demo", "web"), Protocol::Tcp, "http");
    let service_chain = format!("{SERVICE_PREFIX}{base}");
    let endpoint_map = endpoint_map(Protocol::Tcp, &base);
    for expected in [
        format!("10.96.0.10 . tcp . 80 : goto {service_chain}"),
        "dnat ip to numgen random mod 2 ".to_owned(),
        format!("map @{endpoint_map}"),
        format!("map {endpoint_map} {{"),
        ": 10.244.1.2 . 8080".to_owned(),
    ] {
        ensure!(
            table.contains(&expected),
            "node-1's table lacks {expected:?}:\n{table}"
        );
    }
    ensure!(
        !table.contains("10.244.2.2"),
        "the not-ready endpoint web-b must not be programmed:\n{table}"
    );
    let mode = cluster.run(node1, "curl", &["-sf", "http://127.0.0.1:10249/proxyMode"])?;
    ensure!(mode == "nftables", "/proxyMode said {mode:?}");

    // An edit converges through an incremental transaction.
    let node1 = node1.clone();
    cluster.set_web(&[("web-b", true), ("web-c", true)])?;
    converge(&cluster, "traffic moves to web-b and web-c after the edit")
        .with_context(|| cluster.logs())?;

    // A table deleted behind the agent's back (a firewall reload) is written again by the next
    // periodic sync, though nothing changed.
    cluster.run(&node1, "nft", &["delete", "table", "ip", "kube-proxy"])?;
    converge(&cluster, "traffic flows again once the table is back")
        .with_context(|| cluster.logs())?;

    // Fail static: with the controller gone, the table stays and traffic keeps flowing.
    cluster.kill_controller()?;
    cluster
        .check_traffic(REQUESTS)
        .context("after the controller was killed")?;
    Ok(())
}
