//! How the agent keeps the kernel in line: periodic resyncs that rewrite only what changed, and
//! rules brought back after someone deletes them (a firewall reload), noticed through the
//! `KUBE-PROXY-CANARY` chains. Needs root; `scripts/test.sh` builds the binaries first.

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{agent_metric, demo_cluster::DemoCluster, eventually, hit, workspace_binary};
use std::time::Duration;

/// The longest wait for rules to converge; generous because CI machines are slow and shared.
const CONVERGE: Duration = Duration::from_secs(90);
const REQUESTS: u32 = 40;

#[test]
fn rules_deleted_behind_the_agents_back_come_back_and_resyncs_are_partial() -> Result<()> {
    let mut cluster = DemoCluster::start("resync")?;
    eventually("traffic reaches the ready endpoints", CONVERGE, || {
        cluster.check_traffic(REQUESTS).map(drop)
    })
    .with_context(|| cluster.logs())?;
    // Resync every second on node-1; its rules stay in place while the agent restarts.
    cluster.restart_agent(0, &["--iptables-sync-period", "1s"])?;

    let partial = "kubeproxy_sync_partial_proxy_rules_duration_seconds_count";
    eventually("node-1's resyncs to be partial", CONVERGE, || {
        let count = agent_metric(&cluster.lab, &cluster.nodes[0], partial)?;
        ensure!(count >= 2.0, "{partial} is {count}");
        Ok(())
    })
    .with_context(|| cluster.logs())?;

    // What a firewall reload does: every rule and chain of nat and filter deleted.
    let full = "kubeproxy_sync_full_proxy_rules_duration_seconds_count";
    let full_before = agent_metric(&cluster.lab, &cluster.nodes[0], full)?;
    let node1 = cluster.nodes[0].clone();
    for table in ["nat", "filter"] {
        cluster.run(&node1, "iptables", &["-t", table, "-F"])?;
        cluster.run(&node1, "iptables", &["-t", table, "-X"])?;
    }
    eventually("node-1's rules to come back", CONVERGE, || {
        let nat = cluster.run(&node1, "iptables-save", &["-t", "nat"])?;
        ensure!(nat.contains("-j KUBE-SERVICES"), "no jump to KUBE-SERVICES");
        ensure!(nat.contains("KUBE-PROXY-CANARY"), "no canary");
        cluster.check_traffic(REQUESTS).map(drop)
    })
    .with_context(|| cluster.logs())?;
    let full_after = agent_metric(&cluster.lab, &cluster.nodes[0], full)?;
    ensure!(
        full_after > full_before,
        "{full} stayed at {full_before} although the canary was deleted"
    );
    let log = cluster.agents[0].log();
    ensure!(log.contains("canary chain is gone"), "{log}");
    Ok(())
}

#[test]
fn cleanup_takes_every_rule_out_of_a_node_and_leaves_the_others() -> Result<()> {
    let mut cluster = DemoCluster::start("cleanup")?;
    eventually("traffic reaches the ready endpoints", CONVERGE, || {
        cluster.check_traffic(REQUESTS).map(drop)
    })
    .with_context(|| cluster.logs())?;
    let node1 = cluster.nodes[0].clone();
    let agent = cluster.agents[0].clone();
    cluster.lab.kill(&agent)?;

    let binary = workspace_binary("splitproxy-agent")?;
    cluster.run(&node1, &binary.to_string_lossy(), &["--cleanup"])?;

    for tool in ["iptables-save", "ip6tables-save"] {
        let saved = cluster.run(&node1, tool, &[])?;
        ensure!(
            !saved.contains("KUBE-"),
            "{tool} on node-1 still shows\n{saved}"
        );
    }
    let url = DemoCluster::cluster_ip_url();
    let from_node1 = hit(&cluster.lab, &node1, &url, 1)?;
    ensure!(
        from_node1.answered() == 0,
        "node-1 still reaches the Service: {from_node1:?}"
    );
    let from_node2 = hit(&cluster.lab, &cluster.nodes[1], &url, REQUESTS)?;
    ensure!(
        from_node2.failures == 0,
        "node-2 lost the Service: {from_node2:?}"
    );
    Ok(())
}
