//! The agent in ebpf mode (`--proxy-mode ebpf`) on the demo cluster: controller → gRPC → agent →
//! map writes → socket programs on node-1's cgroup and packet programs on its device → real
//! connections from a pod, from the node and from outside the cluster. node-1 starts in iptables mode, as a node switching modes does; its agent then removes
//! the iptables rules, so only the programs can send cluster-IP and its node-port traffic anywhere. Needs root and
//! a cgroup v2 hierarchy; `scripts/test.sh` builds the binaries first.
//!
//! Addresses: see `splitproxy_e2e::addresses`; the web Service is 10.96.0.10:80, web-a on node-1
//! and web-c on node-2 ready, web-b on node-2 not.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::demo_cluster::{CONVERGE, DemoCluster, WEB6_IP};
use splitproxy_e2e::{eventually, hit};

/// Requests per check: with two ready endpoints picked at random, the chance that one of them gets
/// none of 60 requests is 2 × 2⁻⁶⁰.
const REQUESTS: u32 = 60;

#[test]
fn the_agent_in_ebpf_mode_serves_cluster_ips_and_node_ports_from_pods_the_node_and_outside_through_changes_and_restarts()
-> Result<()> {
    let mut cluster = DemoCluster::start("ebpf")?;
    let node = cluster.nodes[0].clone();
    let client = cluster.clients[0].clone();
    // The BPF filesystem is unmounted when the test ends, and the pins with it.
    let (_bpffs, flags) = cluster.switch_to_ebpf(0)?;
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    eventually("node-1's iptables rules are removed", CONVERGE, || {
        for save in ["iptables-save", "ip6tables-save"] {
            let nat = cluster.run(&node, save, &["-t", "nat"])?;
            ensure!(
                !nat.contains("KUBE-SERVICES"),
                "{save}: nat still holds:\n{nat}"
            );
        }
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    let url = DemoCluster::cluster_ip_url();
    cluster.expect_answers(&client, &url, &["web-a", "web-c"], REQUESTS)?;
    cluster.expect_answers(&node, &url, &["web-a", "web-c"], REQUESTS)?;
    // The node port on node-1's own address (its primary IP, ebpf mode's default), from a pod
    // and from the node; node-2's, which the programs leave alone, is node-2's iptables rules'.
    for target in [&node, &cluster.nodes[1]] {
        let node_port = DemoCluster::node_port_url(target);
        cluster.expect_answers(&client, &node_port, &["web-a", "web-c"], REQUESTS)?;
    }
    let node_port = DemoCluster::node_port_url(&node);
    cluster.expect_answers(&node, &node_port, &["web-a", "web-c"], REQUESTS)?;
    // From outside the cluster, through the packet programs on node-1's device: web-c, on
    // node-2, is reached masqueraded and answers back through node-1.
    cluster.expect_answers(&cluster.external, &node_port, &["web-a", "web-c"], REQUESTS)?;
    // IPv6: node-1's ip6tables rules went with the switch, so only the IPv6 programs serve it.
    cluster.write_manifest("web6.yaml", &cluster.web6_yaml())?;
    let url6 = format!("http://[{WEB6_IP}]:80/");
    cluster.expect_answers(&client, &url6, &["web-a", "web-c"], REQUESTS)?;
    cluster.expect_answers(&node, &url6, &["web-a", "web-c"], REQUESTS)?;

    cluster.set_web(&[("web-a", true), ("web-b", true), ("web-c", true)])?;
    cluster.expect_answers(&client, &url, &["web-a", "web-b", "web-c"], REQUESTS)?;

    // No agent: the pinned programs and maps keep serving.
    let agent = cluster.agents[0].clone();
    cluster.lab.kill(&agent)?;
    let report = hit(&cluster.lab, &client, &url, REQUESTS)?;
    ensure!(
        report.failures == 0 && report.answers.len() == 3,
        "with the agent stopped: {report:?}"
    );

    // A new agent takes the maps over and applies the next change.
    cluster.agents[0] = cluster.start_agent(0, &flags)?;
    cluster.set_web(&[("web-a", false), ("web-b", true), ("web-c", true)])?;
    cluster.expect_answers(&client, &url, &["web-b", "web-c"], REQUESTS)?;
    let log = cluster.agents[0].log();
    ensure!(
        !log.contains("ERROR"),
        "the new agent logged errors:\n{log}"
    );
    Ok(())
}
