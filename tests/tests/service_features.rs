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
fn client_ip_affinity_keeps_a_client_on_one_endpoint_and_can_be_switched_off_and_on() -> Result<()>
{
    let cluster = DemoCluster::start("affinity")?;
    let sticky = "  clusterIP: 10.96.0.22\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}";
    let loose = "  clusterIP: 10.96.0.22\n  sessionAffinity: None";
    let url = "http://10.96.0.22:80/";
    let ready: BTreeSet<String> = cluster.ready_web().into_iter().collect();
    // Sticky: every client gets one pod. Off: each client's requests spread over every ready
    // pod again (60 requests over two pods all landing on one: 2^-59). On again: sticky again.
    for (spec, answering) in [(sticky, Some(1)), (loose, None), (sticky, Some(1))] {
        cluster.write_manifest(
            "sticky.yaml",
            &service_yaml(&cluster, "web-sticky", spec, None),
        )?;
        let wanted = answering.unwrap_or(ready.len());
        for client in &cluster.clients {
            eventually(
                &format!("each client's requests reach {wanted} pod(s)"),
                CONVERGE,
                || {
                    let report = hit(&cluster.lab, client, url, 60)?;
                    ensure!(
                        report.failures == 0
                            && report.answers.len() == wanted
                            && report.answers.keys().all(|pod| ready.contains(pod)),
                        "from {}: expected 60 answers from {wanted} ready pod(s), got {report:?}",
                        client.ns_name()
                    );
                    Ok(())
                },
            )
            .with_context(|| cluster.logs())?;
        }
    }
    Ok(())
}

#[test]
fn a_multi_port_service_reaches_each_port_on_the_endpoints_its_slices_list_for_it() -> Result<()> {
    let mut cluster = DemoCluster::start("multiport")?;
    // web-c also serves on 9090; its slice lists both ports, web-a's slice only http.
    let web_c = cluster.web_pod("web-c")?.clone();
    splitproxy_e2e::serve(&mut cluster.lab, &web_c, "web-c-alt", 9090)?;
    let (a, c) = (
        cluster.web_pod("web-a")?.clone(),
        cluster.web_pod("web-c")?.clone(),
    );
    let slice = |name: &str, ports: &str, pod: &splitproxy_e2e::lab::Pod| {
        format!(
            "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: demo
  labels: {{kubernetes.io/service-name: web-multi}}
addressType: IPv4
ports: [{ports}]
endpoints:
- addresses: [{}]
  conditions: {{ready: true}}
  nodeName: {}
---
",
            pod.ip(),
            pod.node_name()
        )
    };
    let yaml = "apiVersion: v1
kind: Service
metadata: {name: web-multi, namespace: demo}
spec:
  clusterIP: 10.96.0.24
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: web}
  - {name: alt, protocol: TCP, port: 81, targetPort: alt}
---
"
    .to_owned()
        + &slice("web-multi-a", "{name: http, protocol: TCP, port: 8080}", &a)
        + &slice(
            "web-multi-c",
            "{name: http, protocol: TCP, port: 8080}, {name: alt, protocol: TCP, port: 9090}",
            &c,
        );
    cluster.write_manifest("multi.yaml", &yaml)?;
    for (port, expected) in [
        (80, BTreeSet::from(["web-a", "web-c"])),
        (81, BTreeSet::from(["web-c-alt"])),
    ] {
        let url = format!("http://10.96.0.24:{port}/");
        for client in &cluster.clients {
            eventually(&format!("{url} answered by {expected:?}"), CONVERGE, || {
                splitproxy_e2e::expect_answers(&cluster.lab, client, &url, 40, &expected)
            })
            .with_context(|| cluster.logs())?;
        }
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
