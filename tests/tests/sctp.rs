//! SCTP Services with real packets between network namespaces, on the demo cluster (manifests
//! source, iptables mode). Needs root.
//!
//! The test kernel has no SCTP sockets but tracks and translates SCTP in netfilter, the dataplane
//! under test; so clients and servers speak the first half of the SCTP handshake over raw IP
//! sockets (`sp-testpod sctp-hit` / `sctp-serve`, see `splitproxy_e2e::sctp`): each request is a
//! real INIT from a fresh port, answered by an INIT-ACK whose state cookie names the pod. The client
//! only counts an INIT-ACK that comes back from the address and port it sent the INIT to, so every
//! answer also proves the reply was translated back.
//!
//! Addresses: see `splitproxy_e2e::addresses`; the SCTP Service is 10.96.0.40:7777, node port
//! 30777, backed by servers on port 9999 in the web pods (web-a on node-1, web-b not ready and
//! web-c on node-2).

use anyhow::{Context, Result, ensure};
use splitproxy_dataplane::{IpFamily, Protocol, iptables::chain_names};
use splitproxy_e2e::{
    demo_cluster::{Conditions, DemoCluster, PortSpec, service_yaml, slice_yaml},
    eventually,
    lab::HasNamespace,
    testpod::{hit_sctp, serve_sctp},
};
use std::{collections::BTreeSet, net::SocketAddrV4, time::Duration};

const CONVERGE: Duration = Duration::from_secs(90);
const CLUSTER_IP: &str = "10.96.0.40";
const SERVICE_PORT: u16 = 7777;
const NODE_PORT: u16 = 30777;
const POD_PORT: u16 = 9999;
/// With two endpoints picked at random, one gets none of 40 with chance 2 × 2⁻⁴⁰.
const REQUESTS: u32 = 40;

#[test]
fn sctp_service_answers_from_its_ready_endpoints_through_cluster_ip_and_node_port() -> Result<()> {
    let mut cluster = DemoCluster::start("sctp")?;
    for web in cluster.web.clone() {
        serve_sctp(&mut cluster.lab, &web.pod, web.pod.name(), POD_PORT)?;
    }
    let endpoints = cluster
        .web
        .iter()
        .map(|w| (&w.pod, Conditions::ready(w.ready)))
        .collect::<Vec<_>>();
    let yaml = service_yaml(
        "signal",
        &format!("  type: NodePort\n  clusterIP: {CLUSTER_IP}"),
        PortSpec {
            protocol: "SCTP",
            port: SERVICE_PORT,
            target_port: POD_PORT,
            node_port: Some(NODE_PORT),
        },
        "",
    ) + &slice_yaml("signal", IpFamily::V4, "SCTP", POD_PORT, &endpoints);
    cluster.write_manifest("signal.yaml", &yaml)?;

    let ready: BTreeSet<String> = cluster.ready_web().into_iter().collect();
    let cluster_ip = SocketAddrV4::new(CLUSTER_IP.parse()?, SERVICE_PORT);
    let node_port = SocketAddrV4::new(cluster.nodes[0].ip(), NODE_PORT);
    let targets = [
        (cluster.clients[0].ns_name(), cluster_ip),
        (cluster.clients[1].ns_name(), cluster_ip),
        (cluster.external.ns_name(), node_port),
    ];
    for (from, to) in targets {
        eventually(
            "INIT-ACKs come back from the Service, sent by exactly the ready pods",
            CONVERGE,
            || {
                let report = hit_sctp(&cluster.lab, from, to, REQUESTS)?;
                let answered: BTreeSet<String> = report.answers.keys().cloned().collect();
                ensure!(
                    report.failures == 0 && answered == ready,
                    "from {from} to {to}: expected answers from exactly {ready:?}, got {report:?}"
                );
                Ok(())
            },
        )
        .with_context(|| cluster.logs())?;
    }

    // The rules use the sctp match, as kube-proxy writes them.
    let port_name = "demo/signal:http";
    let nat = cluster.run(&cluster.nodes[0], "iptables-save", &["-t", "nat"])?;
    let expected = format!(
        "-A KUBE-SERVICES -d {CLUSTER_IP}/32 -p sctp -m comment --comment \"{port_name} cluster IP\" -m sctp --dport {SERVICE_PORT} -j {}",
        chain_names::service_chain(port_name, Protocol::Sctp)
    );
    ensure!(
        nat.contains(&expected),
        "node-1's nat table lacks {expected:?}:\n{nat}"
    );
    Ok(())
}
