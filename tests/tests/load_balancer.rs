//! LoadBalancer Services with real traffic on the demo cluster (manifests source, iptables mode):
//! ingress IPs by `ipMode` and `loadBalancerSourceRanges` (upstream §1.4). Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`. Load-balancer IPs come from 192.0.2.0/24
//! (TEST-NET-1); the hosts that use one route it to node-1, as the router behind a load balancer
//! would. The external host (198.18.0.3) is the client inside the source ranges; the control-plane
//! host (198.18.0.2) stands in for a client outside them. web-a runs on node-1, web-c on node-2
//! (web-b is not ready).

use anyhow::{Result, ensure};
use splitproxy_e2e::{
    demo_cluster::{Conditions, DROP_TIMEOUT, DemoCluster},
    lab::HasNamespace,
    testpod::hit_within,
};

const REQUESTS: u32 = 30;

/// Writes the LoadBalancer Service `demo/<name>` (cluster IP `ip`, `spec` and `status` lines
/// added) backed by the web pods as they are.
fn write_service(
    cluster: &DemoCluster,
    name: &str,
    ip: &str,
    spec: &str,
    status: &str,
) -> Result<()> {
    let endpoints: Vec<(&str, Conditions)> = cluster
        .web
        .iter()
        .map(|w| (w.pod.name(), Conditions::ready(w.ready)))
        .collect();
    let spec = format!("  type: LoadBalancer\n  clusterIP: {ip}\n{spec}");
    cluster.write_web_service(name, &spec, status, &endpoints)
}

/// Routes `ip` from `ns` to node-1.
fn route_to_node1(
    cluster: &DemoCluster,
    ns: &(impl HasNamespace + ?Sized),
    ip: &str,
) -> Result<()> {
    let node1 = cluster.nodes[0].ip().to_string();
    cluster.run(
        ns,
        "ip",
        &["route", "add", &format!("{ip}/32"), "via", &node1],
    )?;
    Ok(())
}

/// Waits until all `REQUESTS` requests from `from` to `url` are answered by exactly the ready web
/// pods.
fn expect_ready_answer(
    cluster: &DemoCluster,
    from: &(impl HasNamespace + ?Sized),
    url: &str,
) -> Result<()> {
    let ready = cluster.ready_web();
    let ready: Vec<&str> = ready.iter().map(String::as_str).collect();
    cluster.expect_answers(from, url, &ready, REQUESTS)
}

#[test]
fn vip_ingress_ips_reach_the_ready_endpoints_and_proxy_ingress_ips_are_left_to_the_load_balancer()
-> Result<()> {
    let cluster = DemoCluster::start("lbingress")?;
    let (vip, proxied) = ("192.0.2.80", "192.0.2.81");
    write_service(
        &cluster,
        "web-lb",
        "10.96.0.80",
        "",
        &format!(
            "  loadBalancer:\n    ingress:\n    - ip: {vip}\n      ipMode: VIP\n    - ip: {proxied}\n      ipMode: Proxy"
        ),
    )?;
    route_to_node1(&cluster, &cluster.external, vip)?;
    route_to_node1(&cluster, &cluster.external, proxied)?;
    expect_ready_answer(&cluster, &cluster.external, &format!("http://{vip}:80/"))?;

    // The same sync that programmed the VIP left the Proxy-mode IP alone: traffic a load balancer
    // sends to it unproxied finds no Service there, and no pod answers.
    let url = format!("http://{proxied}:80/");
    let report = hit_within(&cluster.lab, &cluster.external, &url, 3, DROP_TIMEOUT)?;
    ensure!(
        report.answered() == 0 && report.failures == 3,
        "to the Proxy-mode ingress {url}: expected no answer, got {report:?}"
    );
    let nat = cluster.run(&cluster.nodes[0], "iptables-save", &["-t", "nat"])?;
    ensure!(
        nat.contains(&format!("-d {vip}/32")) && !nat.contains(proxied),
        "node-1's nat table must match {vip} and not {proxied}:\n{nat}"
    );
    Ok(())
}

#[test]
fn source_ranges_admit_listed_clients_and_a_node_in_range_reaching_its_own_vip() -> Result<()> {
    let cluster = DemoCluster::start("lbranges")?;
    let vip = "192.0.2.85";
    let (external, node1) = (cluster.external.ip(), cluster.nodes[0].ip());
    write_service(
        &cluster,
        "web-guarded",
        "10.96.0.85",
        &format!("  loadBalancerSourceRanges: [{external}/32, {node1}/32]"),
        &format!("  loadBalancer:\n    ingress:\n    - ip: {vip}"),
    )?;
    let url = format!("http://{vip}:80/");

    // A client inside the ranges is served; one outside gets no answer at all.
    route_to_node1(&cluster, &cluster.external, vip)?;
    expect_ready_answer(&cluster, &cluster.external, &url)?;
    route_to_node1(&cluster, &cluster.control_plane, vip)?;
    cluster.expect_dropped(&cluster.control_plane, &url)?;

    // node-1 holds the VIP as a local address, as VIP-style load balancers set it up; its own
    // connections to it then come from the VIP itself. Its node IP is in the ranges, so kube-proxy
    // lets them through.
    let node = &cluster.nodes[0];
    cluster.run(
        node,
        "ip",
        &["addr", "add", &format!("{vip}/32"), "dev", "lo"],
    )?;
    expect_ready_answer(&cluster, node, &url)?;
    // node-2's IP is not in the ranges: its connections to the VIP are dropped.
    route_to_node1(&cluster, &cluster.nodes[1], vip)?;
    cluster.expect_dropped(&cluster.nodes[1], &url)
}
