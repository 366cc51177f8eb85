//! kube-proxy's `healthCheckNodePort` server for `externalTrafficPolicy: Local`, asked over real
//! TCP from outside the cluster, on the demo cluster (manifests source, iptables mode; one test
//! with node-1 in ebpf mode). Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`. `web-a` runs on node-1, `web-b` (not ready) and
//! `web-c` on node-2.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    demo_cluster::{DemoCluster, POD_PORT, WebPod},
    eventually,
};
use std::time::Duration;

const CONVERGE: Duration = Duration::from_secs(90);
const HEALTH_CHECK_NODE_PORT: u16 = 32100;
const MANIFEST: &str = "web-local.yaml";

/// The Service `demo/web-local` (NodePort, `externalTrafficPolicy: Local`, health-check node port
/// 32100) with an EndpointSlice listing `pods` as ready.
fn web_local_yaml(pods: &[&WebPod]) -> String {
    let mut yaml = format!(
        "apiVersion: v1
kind: Service
metadata:
  name: web-local
  namespace: demo
spec:
  type: NodePort
  clusterIP: 10.96.0.32
  externalTrafficPolicy: Local
  healthCheckNodePort: {HEALTH_CHECK_NODE_PORT}
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: {POD_PORT}
    nodePort: 30132
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-local-x7k2p
  namespace: demo
  labels:
    kubernetes.io/service-name: web-local
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: {POD_PORT}
endpoints:
"
    );
    for web in pods {
        yaml.push_str(&format!(
            "- addresses: [{}]\n  conditions: {{ready: true}}\n  nodeName: {}\n  targetRef: {{kind: Pod, name: {}, namespace: demo}}\n",
            web.pod.ip(),
            web.pod.node_name(),
            web.pod.name()
        ));
    }
    yaml
}

fn web<'a>(cluster: &'a DemoCluster, name: &str) -> Result<&'a WebPod> {
    cluster
        .web
        .iter()
        .find(|w| w.pod.name() == name)
        .with_context(|| format!("no web pod {name}"))
}

/// Waits until the health-check port of node `node` (0-based) answers `code` with `local`
/// local endpoints on its IPv4 and IPv6 addresses, asked from the external host.
fn expect_health(cluster: &DemoCluster, node: usize, code: u16, local: u64) -> Result<()> {
    // Both families, as kube-proxy serves each family's health checks.
    let node = &cluster.nodes[node];
    for host in [node.ip().to_string(), format!("[{}]", node.ip6())] {
        expect_health_at(cluster, &host, code, local)?;
    }
    Ok(())
}

fn expect_health_at(cluster: &DemoCluster, host: &str, code: u16, local: u64) -> Result<()> {
    let url = format!("http://{host}:{HEALTH_CHECK_NODE_PORT}/");
    let what = format!("{url} answers {code} with {local} local endpoints");
    eventually(&what, CONVERGE, || {
        let output = cluster.run(
            &cluster.external,
            "curl",
            &[
                "-s",
                "--max-time",
                "5",
                "-o",
                "-",
                "-w",
                "%{http_code}",
                &url,
            ],
        )?;
        let (body, answered) = output
            .len()
            .checked_sub(3)
            .map(|split| output.split_at(split))
            .with_context(|| format!("no status code in {output:?}"))?;
        let body: serde_json::Value =
            serde_json::from_str(body).with_context(|| format!("body of {output:?}"))?;
        ensure!(
            answered == code.to_string()
                && body["localEndpoints"] == local
                && body["serviceProxyHealthy"] == true
                && body["service"] == serde_json::json!({"namespace": "demo", "name": "web-local"}),
            "got {answered} {body}"
        );
        Ok(())
    })
    .with_context(|| cluster.logs())
}

#[test]
fn health_check_node_port_answers_200_only_on_nodes_with_a_local_ready_endpoint() -> Result<()> {
    let cluster = DemoCluster::start("hcnp")?;
    let (web_a, web_c) = (web(&cluster, "web-a")?, web(&cluster, "web-c")?);
    cluster.write_manifest(MANIFEST, &web_local_yaml(&[web_a, web_c]))?;

    expect_health(&cluster, 0, 200, 1)?;
    expect_health(&cluster, 1, 200, 1)?;

    // web-a leaves the slice: node-1 has no local endpoint left, node-2 still has web-c.
    cluster.write_manifest(MANIFEST, &web_local_yaml(&[web_c]))?;

    expect_health(&cluster, 0, 503, 0)?;
    expect_health(&cluster, 1, 200, 1)?;
    Ok(())
}

/// Whether anything accepts a connection to `host`'s health-check node port from outside.
fn listens(cluster: &DemoCluster, host: &str) -> Result<bool> {
    let url = format!("http://{host}:{HEALTH_CHECK_NODE_PORT}/");
    let output = cluster.run(
        &cluster.external,
        "sh",
        &[
            "-c",
            &format!("curl -s --max-time 5 -o /dev/null -w '%{{http_code}}' {url} || true"),
        ],
    )?;
    Ok(output.trim() != "000")
}

#[test]
fn with_node_port_addresses_health_checks_listen_only_there() -> Result<()> {
    // A second address of node-1 (on its loopback device), routed to node-1 by the external host.
    const SECOND_ADDRESS: &str = "198.51.100.1";
    let mut cluster = DemoCluster::start("hcnpaddr")?;
    let web_a = web(&cluster, "web-a")?.clone();
    cluster.write_manifest(MANIFEST, &web_local_yaml(&[&web_a]))?;
    let lan = cluster.nodes[0].ip().to_string();
    cluster.add_node_address(0, SECOND_ADDRESS)?;
    // Every address by default.
    expect_health_at(&cluster, &lan, 200, 1)?;
    expect_health_at(&cluster, SECOND_ADDRESS, 200, 1)?;
    // As upstream, only the selected node-port addresses once nodePortAddresses selects some.
    cluster.restart_agent(0, &["--nodeport-addresses", "198.51.100.0/24"])?;
    expect_health_at(&cluster, SECOND_ADDRESS, 200, 1)?;
    eventually("nothing listens on the LAN address", CONVERGE, || {
        ensure!(!listens(&cluster, &lan)?, "{lan} still answers");
        Ok(())
    })
    .with_context(|| cluster.logs())
}

#[test]
fn the_server_answers_the_same_on_a_node_in_ebpf_mode() -> Result<()> {
    let mut cluster = DemoCluster::start("hcnpebpf")?;
    // The BPF filesystem is unmounted when the test ends, and the pins with it.
    let (_bpffs, _flags) = cluster.switch_to_ebpf(0)?;
    let web_a = web(&cluster, "web-a")?.clone();
    let web_c = web(&cluster, "web-c")?.clone();
    cluster.write_manifest(MANIFEST, &web_local_yaml(&[&web_a, &web_c]))?;
    expect_health(&cluster, 0, 200, 1)?;
    cluster.write_manifest(MANIFEST, &web_local_yaml(&[&web_c]))?;
    expect_health(&cluster, 0, 503, 0)?;
    Ok(())
}
