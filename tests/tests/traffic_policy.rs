//! Which endpoints a cluster IP uses, with real traffic on the demo cluster (manifests source,
//! iptables mode): `internalTrafficPolicy: Local` (upstream §1.9) and the fallback to serving
//! terminating endpoints (§1.11). Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`. web-a runs on node-1, web-b and web-c on node-2;
//! client-1 on node-1, client-2 on node-2.

use anyhow::Result;
use splitproxy_e2e::demo_cluster::{Conditions, DemoCluster};

const REQUESTS: u32 = 30;

#[test]
fn internal_traffic_policy_local_uses_only_the_clients_node_and_drops_where_none_is_local()
-> Result<()> {
    let cluster = DemoCluster::start("itplocal")?;
    let (name, url) = ("web-internal", "http://10.96.0.50:80/");
    let spec = "  clusterIP: 10.96.0.50\n  internalTrafficPolicy: Local";
    let ready = Conditions::ready(true);
    cluster.write_web_service(
        name,
        spec,
        "",
        &[
            ("web-a", ready),
            ("web-b", Conditions::ready(false)),
            ("web-c", ready),
        ],
    )?;
    // From each node and from a pod on it, only that node's ready endpoint answers.
    for (i, only) in [(0, "web-a"), (1, "web-c")] {
        cluster.expect_answers(&cluster.nodes[i], url, &[only], REQUESTS)?;
        cluster.expect_answers(&cluster.clients[i], url, &[only], REQUESTS)?;
    }

    // web-c leaves: node-2 has no local endpoint left, so its clients' connections are dropped
    // (kube-proxy's "has no local endpoints"), not sent to web-a and not refused.
    cluster.write_web_service(name, spec, "", &[("web-a", ready)])?;
    cluster.expect_dropped(&cluster.nodes[1], url)?;
    cluster.expect_dropped(&cluster.clients[1], url)?;
    cluster.expect_answers(&cluster.clients[0], url, &["web-a"], REQUESTS)
}

#[test]
fn terminating_endpoints_serve_until_a_ready_one_exists() -> Result<()> {
    let cluster = DemoCluster::start("terminating")?;
    let (name, url) = ("web-draining", "http://10.96.0.60:80/");
    // web-a and web-c are terminating but still serving; web-b is what the test changes.
    let write = |web_b| {
        let serving = Conditions::TERMINATING_SERVING;
        let endpoints = [("web-a", serving), ("web-b", web_b), ("web-c", serving)];
        cluster.write_web_service(name, "  clusterIP: 10.96.0.60", "", &endpoints)
    };
    // No endpoint is ready: the serving ones (web-a, web-c) still take new connections; web-b,
    // which stopped serving, does not.
    write(Conditions::TERMINATING_NOT_SERVING)?;
    for client in &cluster.clients {
        cluster.expect_answers(client, url, &["web-a", "web-c"], REQUESTS)?;
    }
    cluster.expect_answers(&cluster.nodes[0], url, &["web-a", "web-c"], REQUESTS)?;

    // A ready endpoint appears: only it is used from now on.
    write(Conditions::ready(true))?;
    for client in &cluster.clients {
        cluster.expect_answers(client, url, &["web-b"], REQUESTS)?;
    }
    Ok(())
}

#[test]
fn local_policy_falls_back_to_the_nodes_own_terminating_endpoints() -> Result<()> {
    let cluster = DemoCluster::start("localterm")?;
    let url = "http://10.96.0.61:80/";
    // node-1's only endpoint (web-a) is terminating but serving; node-2 has a ready one (web-b)
    // next to a terminating one (web-c).
    let serving = Conditions::TERMINATING_SERVING;
    cluster.write_web_service(
        "web-local-draining",
        "  clusterIP: 10.96.0.61\n  internalTrafficPolicy: Local",
        "",
        &[
            ("web-a", serving),
            ("web-b", Conditions::ready(true)),
            ("web-c", serving),
        ],
    )?;
    cluster.expect_answers(&cluster.clients[0], url, &["web-a"], REQUESTS)?;
    cluster.expect_answers(&cluster.clients[1], url, &["web-b"], REQUESTS)
}
