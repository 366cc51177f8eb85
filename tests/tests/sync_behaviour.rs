//! How the agent keeps the kernel in line: periodic resyncs that rewrite only what changed, and
//! rules brought back after someone deletes them (a firewall reload), noticed through the
//! `KUBE-PROXY-CANARY` chains; and what it removes of kube-proxy's other proxy modes, on start and
//! with `--cleanup`. Needs root; `scripts/test.sh` builds the binaries first.

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    agent_metric, demo_cluster::DemoCluster, eventually, hit, lab::Node, workspace_binary,
};
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

    let partial = r#"kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}"#;
    eventually("node-1's resyncs to be partial", CONVERGE, || {
        let count = agent_metric(&cluster.lab, &cluster.nodes[0], partial)?;
        ensure!(count >= 2.0, "{partial} is {count}");
        Ok(())
    })
    .with_context(|| cluster.logs())?;

    // What a firewall reload does: every rule and chain of nat and filter deleted.
    let full = r#"kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}"#;
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

    add_other_modes_leftovers(&cluster, &node1)?;

    let binary = workspace_binary("splitproxy-agent")?;
    cluster.run(&node1, &binary.to_string_lossy(), &["--cleanup"])?;

    let tables = cluster.run(&node1, "nft", &["list", "tables"])?;
    ensure!(
        only_other_tables(&tables),
        "nftables on node-1 after --cleanup:\n{tables}"
    );
    let ipsets = cluster.run(&node1, "ipset", &["list", "-n"])?;
    ensure!(
        ipsets == "other-hosts\n",
        "ipsets on node-1 after --cleanup:\n{ipsets}"
    );

    for tool in ["iptables-save", "ip6tables-save"] {
        let saved = cluster.run(&node1, tool, &[])?;
        // kubelet's KUBE-FIREWALL stays, as kube-proxy's cleanup leaves it.
        ensure!(
            !saved
                .lines()
                .any(|line| line.contains("KUBE-") && !line.contains("KUBE-FIREWALL")),
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

/// A node switching to iptables mode keeps the nftables mode's tables until its own first rules
/// are in, then they go.
#[test]
fn an_agent_starting_in_iptables_mode_removes_the_nftables_modes_tables_after_its_first_sync()
-> Result<()> {
    let mut cluster = DemoCluster::start("switch")?;
    let node1 = cluster.nodes[0].clone();
    let agent = cluster.agents[0].clone();
    cluster.lab.kill(&agent)?;
    add_other_modes_leftovers(&cluster, &node1)?;

    // Without a controller the agent programs nothing, so the other mode's rules keep serving.
    cluster.kill_controller()?;
    cluster.agents[0] = cluster.start_agent(0, &[])?;
    std::thread::sleep(Duration::from_secs(5));
    let tables = cluster.run(&node1, "nft", &["list", "tables"])?;
    ensure!(
        tables.contains("ip kube-proxy") && tables.contains("ip6 kube-proxy"),
        "the agent removed the other mode's tables before programming its own:\n{tables}"
    );
    cluster.start_controller()?;
    eventually(
        "node-1's agent removes the nftables tables",
        CONVERGE,
        || {
            let tables = cluster.run(&node1, "nft", &["list", "tables"])?;
            ensure!(only_other_tables(&tables), "{tables}");
            // Written just after the removal.
            let log = cluster.agents[0].log();
            ensure!(
                log.contains("removed another proxy mode's leftovers")
                    && log.contains("ip kube-proxy")
                    && log.contains("ip6 kube-proxy"),
                "the agent did not say what it removed"
            );
            Ok(())
        },
    )
    .with_context(|| cluster.logs())?;
    // The ipsets stay for `--cleanup`: IPVS-mode rules, which iptables mode leaves, may use them.
    let ipsets = cluster.run(&node1, "ipset", &["list", "-n"])?;
    ensure!(ipsets.contains("KUBE-CLUSTER-IP"), "{ipsets}");
    eventually("traffic reaches the ready endpoints", CONVERGE, || {
        cluster.check_traffic(REQUESTS).map(drop)
    })
    .with_context(|| cluster.logs())?;
    Ok(())
}

/// What kube-proxy's nftables mode (its table in both families, with a chain and a rule) and
/// IPVS mode (an ipset) leave on `node`, next to another table and set that must stay.
/// (`kube-ipvs0` is left to `dataplane/tests/iptables_kernel.rs`: the lab's kernel has no dummy
/// interfaces.)
fn add_other_modes_leftovers(cluster: &DemoCluster, node: &Node) -> Result<()> {
    for command in [
        "add table ip kube-proxy",
        "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
        "add rule ip kube-proxy nat-prerouting ip daddr 10.96.0.10 tcp dport 80 counter",
        "add table ip6 kube-proxy",
        "add table ip other-firewall",
    ] {
        cluster.run(node, "nft", &[command])?;
    }
    for set in ["KUBE-CLUSTER-IP", "other-hosts"] {
        cluster.run(node, "ipset", &["create", set, "hash:ip"])?;
    }
    Ok(())
}

/// Whether `nft list tables` shows no kube-proxy table but the other one (and the iptables
/// tables, which iptables-nft keeps in nftables too).
fn only_other_tables(tables: &str) -> bool {
    !tables.contains("kube-proxy") && tables.contains("table ip other-firewall\n")
}
