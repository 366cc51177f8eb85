//! Which client address a Service's endpoints see, with real traffic on the demo cluster
//! (manifests source, iptables mode): kube-proxy's local-traffic detector (`--cluster-cidr`),
//! `--masquerade-all`, and hairpin traffic (a pod reaching itself through its Service). Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`. web-a runs on node-1 (10.244.1.2), web-c on node-2
//! (10.244.2.3); client-1 is 10.244.1.10, client-2 10.244.2.10; node-1 is 198.18.0.11, node-2
//! 198.18.0.12, the external host 198.18.0.3. The web pods answer `/source` with their name and the
//! client address they saw.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    demo_cluster::{Conditions, DemoCluster},
    eventually, hit,
    lab::HasNamespace,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    time::Duration,
};

const CONVERGE: Duration = Duration::from_secs(90);
const CLUSTER_IP: &str = "10.96.0.70";
const URL: &str = "http://10.96.0.70:80/source";
const REQUESTS: u32 = 30;

/// The Service `demo/web-source` (10.96.0.70:80) backed by the ready pods `pods`.
fn write_service(cluster: &DemoCluster, pods: &[&str]) -> Result<()> {
    let endpoints: Vec<(&str, Conditions)> = pods
        .iter()
        .map(|pod| (*pod, Conditions::ready(true)))
        .collect();
    let spec = format!("  clusterIP: {CLUSTER_IP}");
    cluster.write_web_service("web-source", &spec, "", &endpoints)
}

/// Waits until every one of `REQUESTS` requests from `from` is answered by exactly the pods
/// `by`, each having seen the client address `seen`.
fn expect_seen(
    cluster: &DemoCluster,
    from: &(impl HasNamespace + ?Sized),
    by: &[&str],
    seen: Ipv4Addr,
) -> Result<()> {
    let expected: BTreeMap<String, BTreeSet<Ipv4Addr>> = by
        .iter()
        .map(|pod| ((*pod).to_owned(), BTreeSet::from([seen])))
        .collect();
    let what = format!("{by:?} see {seen} as the client");
    eventually(&what, CONVERGE, || {
        let report = hit(&cluster.lab, from, URL, REQUESTS)?;
        let mut sources: BTreeMap<String, BTreeSet<Ipv4Addr>> = BTreeMap::new();
        for answer in report.answers.keys() {
            let (pod, source) = answer
                .split_once(' ')
                .with_context(|| format!("answer {answer:?} names no client address"))?;
            sources
                .entry(pod.to_owned())
                .or_default()
                .insert(source.parse()?);
        }
        ensure!(
            report.failures == 0 && sources == expected,
            "from {} to {URL}: expected {expected:?}, got {report:?}",
            from.ns_name()
        );
        Ok(())
    })
    .with_context(|| cluster.logs())
}

#[test]
fn with_a_cluster_cidr_pods_keep_their_address_and_clients_outside_it_are_masqueraded() -> Result<()>
{
    let cluster = DemoCluster::start_with("detectlocal", &["--cluster-cidr", "10.244.0.0/16"])?;
    pods_keep_their_address_and_others_are_masqueraded(&cluster)
}

/// What a local-traffic detector promises, whichever it is: pods, on the endpoint's node or
/// another, are seen as themselves; a node and a client outside the cluster are masqueraded.
fn pods_keep_their_address_and_others_are_masqueraded(cluster: &DemoCluster) -> Result<()> {
    write_service(cluster, &["web-a", "web-c"])?;
    let both = ["web-a", "web-c"];
    for client in &cluster.clients {
        expect_seen(cluster, client, &both, client.ip())?;
    }
    // A node is outside the detector (outside the cluster CIDR; its own traffic arrives on no
    // interface): masqueraded to its own address.
    let node2 = &cluster.nodes[1];
    expect_seen(cluster, node2, &both, node2.ip())?;
    // A client outside the cluster that routes the Service range through node-1 is masqueraded
    // to node-1, so web-c on node-2 answers back through node-1 (unmasqueraded, web-c's answer
    // would go straight to the client, untranslated, and the connection would fail).
    let node1 = &cluster.nodes[0];
    cluster.run(
        &cluster.external,
        "ip",
        &[
            "route",
            "add",
            "10.96.0.0/16",
            "via",
            &node1.ip().to_string(),
        ],
    )?;
    expect_seen(cluster, &cluster.external, &both, node1.ip())
}

#[test]
fn with_masquerade_all_pods_are_masqueraded_to_their_node() -> Result<()> {
    let cluster = DemoCluster::start_with("masqall", &["--masquerade-all"])?;
    pods_are_masqueraded_to_their_node(&cluster)
}

#[test]
fn another_masquerade_bit_marks_and_masquerades_all_the_same() -> Result<()> {
    let cluster = DemoCluster::start_with(
        "masqbit",
        &["--masquerade-all", "--iptables-masquerade-bit", "3"],
    )?;
    pods_are_masqueraded_to_their_node(&cluster)?;
    let nat = cluster.run(&cluster.nodes[0], "iptables-save", &["-t", "nat"])?;
    ensure!(
        nat.contains("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x8/0x8") && !nat.contains("0x4000"),
        "{nat}"
    );
    Ok(())
}

fn pods_are_masqueraded_to_their_node(cluster: &DemoCluster) -> Result<()> {
    write_service(cluster, &["web-a", "web-c"])?;
    for (client, node) in cluster.clients.iter().zip(&cluster.nodes) {
        expect_seen(cluster, client, &["web-a", "web-c"], node.ip())?;
    }
    Ok(())
}

#[test]
fn a_pod_reaching_itself_through_its_service_is_answered_masqueraded() -> Result<()> {
    let cluster = DemoCluster::start("hairpin")?;
    write_service(&cluster, &["web-a"])?;
    let web_a = cluster.web_pod("web-a")?;
    // Unmasqueraded, web-a would receive a packet from its own address and drop it; masqueraded
    // to node-1 it answers.
    expect_seen(&cluster, web_a, &["web-a"], cluster.nodes[0].ip())
}

#[test]
fn with_pod_interfaces_as_the_detector_pods_keep_their_address_and_others_are_masqueraded()
-> Result<()> {
    // The lab's pods hang off node-side veths named c<n>-<pod>; the node's LAN link is eth0.
    let cluster = DemoCluster::start_with(
        "detectif",
        &[
            "--detect-local-mode",
            "InterfaceNamePrefix",
            "--pod-interface-name-prefix",
            "c",
        ],
    )?;
    pods_keep_their_address_and_others_are_masqueraded(&cluster)
}
