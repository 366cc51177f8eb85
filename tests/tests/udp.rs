//! UDP Services with real traffic between network namespaces, on the demo cluster (manifests
//! source, iptables mode, and nftables mode for the cleanup): balancing, and the conntrack
//! cleanup that moves a client off an endpoint that is gone (upstream §1.18). Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`; the UDP Service is 10.96.0.30:53, backed by UDP
//! servers on port 5353 in the web pods (web-a on node-1, web-b and web-c on node-2). The client is
//! client-1 on node-1, where its flows are NATed.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    agent_metric,
    demo_cluster::DemoCluster,
    eventually,
    lab::{HasNamespace, Pod},
    testpod::{hit_udp, serve_udp},
};
use std::{collections::BTreeSet, time::Duration};

const CONVERGE: Duration = Duration::from_secs(90);
const CLUSTER_IP: &str = "10.96.0.30";
const URL: &str = "udp://10.96.0.30:53";
const POD_PORT: u16 = 5353;
/// The one source port of the client that must be moved off a removed endpoint.
const STICKY_SOURCE_PORT: u16 = 40053;

/// The UDP Service `demo/dns` and its EndpointSlice listing `pods` as ready.
fn dns_yaml(pods: &[&Pod]) -> String {
    let mut yaml = format!(
        "apiVersion: v1
kind: Service
metadata:
  name: dns
  namespace: demo
spec:
  clusterIP: {CLUSTER_IP}
  clusterIPs: [{CLUSTER_IP}]
  ports:
  - name: dns
    protocol: UDP
    port: 53
    targetPort: {POD_PORT}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-4fq8z
  namespace: demo
  labels:
    kubernetes.io/service-name: dns
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: IPv4
ports:
- name: dns
  protocol: UDP
  port: {POD_PORT}
endpoints:
"
    );
    for pod in pods {
        yaml.push_str(&format!(
            "- addresses: [{}]\n  conditions: {{ready: true}}\n  nodeName: {}\n  targetRef: {{kind: Pod, name: {}, namespace: demo}}\n",
            pod.ip(),
            pod.node_name(),
            pod.name()
        ));
    }
    yaml
}

/// The demo cluster, its agents started with `agent_flags`, with a UDP server in every web pod
/// (listed in the Service or not) and the `demo/dns` Service backed by web-a and web-c.
fn start(tag: &str, agent_flags: &[&str]) -> Result<(DemoCluster, Pod, Pod)> {
    let mut cluster = DemoCluster::start_with(tag, agent_flags)?;
    for web in cluster.web.clone() {
        serve_udp(&mut cluster.lab, &web.pod, web.pod.name(), POD_PORT)?;
    }
    let web_a = cluster.web[0].pod.clone();
    let web_c = cluster.web[2].pod.clone();
    cluster.write_manifest("dns.yaml", &dns_yaml(&[&web_a, &web_c]))?;
    Ok((cluster, web_a, web_c))
}

#[test]
fn udp_service_spreads_datagrams_from_fresh_ports_over_its_ready_endpoints() -> Result<()> {
    let (cluster, web_a, web_c) = start("udp", &[])?;
    let client = &cluster.clients[0];
    let expected: BTreeSet<&str> = [web_a.name(), web_c.name()].into();
    // With two endpoints picked at random, one gets none of 40 with chance 2 × 2⁻⁴⁰.
    eventually("datagrams reach exactly web-a and web-c", CONVERGE, || {
        let report = hit_udp(&cluster.lab, client, URL, 40, None)?;
        let answered: BTreeSet<&str> = report.answers.keys().map(String::as_str).collect();
        ensure!(
            report.failures == 0 && answered == expected,
            "from {} to {URL}: expected answers from exactly {expected:?}, got {report:?}",
            client.ns_name()
        );
        Ok(())
    })
    .with_context(|| cluster.logs())
}

#[test]
fn client_keeping_its_source_port_leaves_a_removed_endpoint() -> Result<()> {
    client_leaves_a_removed_endpoint("udpstale", &[])
}

#[test]
fn client_keeping_its_source_port_leaves_a_removed_endpoint_in_nftables_mode() -> Result<()> {
    client_leaves_a_removed_endpoint("udpstnft", &["--proxy-mode", "nftables"])
}

/// A client sending from one source port reaches one endpoint; once that endpoint leaves the
/// Service (its server still up), the same flow reaches the other.
fn client_leaves_a_removed_endpoint(tag: &str, agent_flags: &[&str]) -> Result<()> {
    let (cluster, web_a, web_c) = start(tag, agent_flags)?;
    let client = &cluster.clients[0];
    let ready = [web_a.name().to_owned(), web_c.name().to_owned()];
    // One flow: every datagram from this port goes where the first one went.
    let first = eventually("the sticky client reaches one endpoint", CONVERGE, || {
        let report = hit_udp(&cluster.lab, client, URL, 5, Some(STICKY_SOURCE_PORT))?;
        let pod = report.answers.keys().next().cloned().unwrap_or_default();
        ensure!(
            report.failures == 0 && report.answered_by(&pod) == 5 && ready.contains(&pod),
            "from {} port {STICKY_SOURCE_PORT}: expected 5 answers from web-a or web-c, got {report:?}",
            client.ns_name()
        );
        Ok(pod)
    })
    .with_context(|| cluster.logs())?;

    // Remove the endpoint the flow goes to. Its server keeps running, so without the cleanup the
    // stale conntrack entry keeps the client on it.
    let (removed, kept) = if first == web_a.name() {
        (&web_a, &web_c)
    } else {
        (&web_c, &web_a)
    };
    cluster.write_manifest("dns.yaml", &dns_yaml(&[kept]))?;

    eventually(
        "the same flow moves to the remaining endpoint",
        CONVERGE,
        || {
            let report = hit_udp(&cluster.lab, client, URL, 5, Some(STICKY_SOURCE_PORT))?;
            ensure!(
                report.failures == 0 && report.answered_by(kept.name()) == 5,
                "from {} port {STICKY_SOURCE_PORT} after removing {}: expected 5 answers from {}, got {report:?}",
                client.ns_name(),
                removed.name(),
                kept.name()
            );
            Ok(())
        },
    )
    .with_context(|| cluster.logs())?;
    // node-1's agent deleted the flow, and counts it as kube-proxy's conntrack reconciler does
    // once its sync is over (the other family's rules may still be written when the flow moves).
    eventually("node-1 counts the deleted flow", CONVERGE, || {
        let deleted = agent_metric(
            &cluster.lab,
            &cluster.nodes[0],
            r#"kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}"#,
        )?;
        ensure!(
            deleted >= 1.0,
            "node-1 counted {deleted} deleted conntrack entries"
        );
        Ok(())
    })
    .with_context(|| cluster.logs())
}
