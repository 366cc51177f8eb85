//! kube-proxy's Service features with real traffic between network namespaces, on the demo
//! cluster (manifests source, iptables mode). Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`; external IPs come from 192.0.2.0/24 (TEST-NET-1),
//! routed by the external host to node-1 only inside the lab.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    demo_cluster::{self, DemoCluster, PortSpec},
    eventually, hit,
    lab::HasNamespace,
};
use std::{collections::BTreeSet, time::Duration};

const CONVERGE: Duration = Duration::from_secs(90);

/// A Service named `name` in the demo namespace with `spec` (YAML lines indented by two spaces
/// under `spec:`) and port 80 (with `node_port` if given), backed by the web pods.
fn service_yaml(cluster: &DemoCluster, name: &str, spec: &str, node_port: Option<u16>) -> String {
    let port = PortSpec {
        node_port,
        ..PortSpec::WEB
    };
    demo_cluster::service_yaml(name, spec, port, "") + &cluster.endpoint_slice_yaml(name)
}

#[test]
fn external_ips_reach_the_ready_endpoints_with_masquerade() -> Result<()> {
    let cluster = DemoCluster::start("extip")?;
    let external_ip = "192.0.2.10";
    cluster.write_manifest(
        "external.yaml",
        &service_yaml(
            &cluster,
            "web-external",
            &format!("  clusterIP: 10.96.0.21\n  externalIPs: [{external_ip}]"),
            None,
        ),
    )?;
    // The external host sends the external IP to node-1, as a router in front of it would.
    let node1 = cluster.nodes[0].ip().to_string();
    cluster.run(
        &cluster.external,
        "ip",
        &["route", "add", &format!("{external_ip}/32"), "via", &node1],
    )?;
    let expected: BTreeSet<String> = cluster.ready_web().into_iter().collect();
    let url = format!("http://{external_ip}:80/");
    eventually(
        "the external IP answers from the ready pods",
        CONVERGE,
        || {
            let report = hit(&cluster.lab, &cluster.external, &url, 40)?;
            let answered: BTreeSet<String> = report.answers.keys().cloned().collect();
            ensure!(
                report.failures == 0 && answered == expected,
                "from {} to {url}: expected {expected:?}, got {report:?}",
                cluster.external.ns_name()
            );
            Ok(())
        },
    )
    .with_context(|| cluster.logs())
}

#[test]
fn client_ip_affinity_keeps_a_client_on_one_endpoint() -> Result<()> {
    let cluster = DemoCluster::start("affinity")?;
    cluster.write_manifest(
        "sticky.yaml",
        &service_yaml(
            &cluster,
            "web-sticky",
            "  clusterIP: 10.96.0.22\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}",
            None,
        ),
    )?;
    let url = "http://10.96.0.22:80/";
    let ready: BTreeSet<String> = cluster.ready_web().into_iter().collect();
    for client in &cluster.clients {
        eventually(
            "every request of one client reaches one pod",
            CONVERGE,
            || {
                let report = hit(&cluster.lab, client, url, 30)?;
                ensure!(
                    report.failures == 0
                        && report.answers.len() == 1
                        && report.answers.keys().all(|pod| ready.contains(pod)),
                    "from {}: expected 30 answers from one ready pod, got {report:?}",
                    client.ns_name()
                );
                Ok(())
            },
        )
        .with_context(|| cluster.logs())?;
    }
    Ok(())
}

#[test]
fn external_traffic_policy_local_serves_only_the_nodes_own_endpoints() -> Result<()> {
    let cluster = DemoCluster::start("etplocal")?;
    cluster.write_manifest(
        "local.yaml",
        &service_yaml(
            &cluster,
            "web-local",
            "  type: NodePort\n  clusterIP: 10.96.0.23\n  externalTrafficPolicy: Local",
            Some(30090),
        ),
    )?;
    // web-a runs on node-1; on node-2 only web-c is ready (web-b is not).
    for (node, only) in [(&cluster.nodes[0], "web-a"), (&cluster.nodes[1], "web-c")] {
        let url = format!("http://{}:30090/", node.ip());
        eventually(
            "each node port answers from its own node's pod",
            CONVERGE,
            || {
                let report = hit(&cluster.lab, &cluster.external, &url, 30)?;
                ensure!(
                    report.failures == 0 && report.answered_by(only) == 30,
                    "to {url}: expected 30 answers from {only}, got {report:?}"
                );
                Ok(())
            },
        )
        .with_context(|| cluster.logs())?;
    }
    Ok(())
}
