//! Which endpoints a cluster IP uses, with real traffic on the demo cluster (manifests source,
//! iptables mode): `internalTrafficPolicy: Local` (upstream §1.9) and the fallback to serving
//! terminating endpoints (§1.11). Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`. web-a runs on node-1, web-b and web-c on node-2;
//! client-1 on node-1, client-2 on node-2.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    demo_cluster::{Conditions, DemoCluster, PortSpec, service_yaml, slice_yaml},
    eventually, hit,
    lab::HasNamespace,
    testpod::hit_within,
};
use std::{collections::BTreeSet, time::Duration};

const CONVERGE: Duration = Duration::from_secs(90);
const REQUESTS: u32 = 30;
/// Per request when a drop is expected: long enough for an answer on a loaded machine, short
/// enough to keep the test quick.
const DROP_TIMEOUT: Duration = Duration::from_secs(1);

/// Writes the Service `demo/<name>` (cluster IP `ip`, `spec` lines added) backed by the web pods
/// in `endpoints`.
fn write_service(
    cluster: &DemoCluster,
    name: &str,
    ip: &str,
    spec: &str,
    endpoints: &[(&str, Conditions)],
) -> Result<()> {
    let endpoints = endpoints
        .iter()
        .map(|(pod, conditions)| Ok((cluster.web_pod(pod)?, *conditions)))
        .collect::<Result<Vec<_>>>()?;
    let yaml = service_yaml(
        name,
        &format!("  clusterIP: {ip}\n{spec}"),
        PortSpec::WEB,
        "",
    ) + &slice_yaml(
        name,
        PortSpec::WEB.protocol,
        PortSpec::WEB.target_port,
        &endpoints,
    );
    cluster.write_manifest(&format!("{name}.yaml"), &yaml)
}

/// Waits until all `REQUESTS` requests from `from` to `url` are answered by exactly `pods`.
fn expect_answers(
    cluster: &DemoCluster,
    from: &(impl HasNamespace + ?Sized),
    url: &str,
    pods: &[&str],
) -> Result<()> {
    let expected: BTreeSet<&str> = pods.iter().copied().collect();
    eventually(&format!("{url} answers from {pods:?}"), CONVERGE, || {
        let report = hit(&cluster.lab, from, url, REQUESTS)?;
        let answered: BTreeSet<&str> = report.answers.keys().map(String::as_str).collect();
        ensure!(
            report.failures == 0 && answered == expected,
            "from {} to {url}: expected answers from exactly {expected:?}, got {report:?}",
            from.ns_name()
        );
        Ok(())
    })
    .with_context(|| cluster.logs())
}

/// Waits until requests from `from` to `url` go unanswered until they time out: dropped, not
/// refused.
fn expect_dropped(
    cluster: &DemoCluster,
    from: &(impl HasNamespace + ?Sized),
    url: &str,
) -> Result<()> {
    eventually(&format!("{url} is dropped"), CONVERGE, || {
        let report = hit_within(&cluster.lab, from, url, 3, DROP_TIMEOUT)?;
        ensure!(
            report.answered() == 0 && report.errors.iter().all(|e| e.contains("timed out")),
            "from {} to {url}: expected 3 timeouts, got {report:?}",
            from.ns_name()
        );
        Ok(())
    })
    .with_context(|| cluster.logs())
}

#[test]
fn internal_traffic_policy_local_uses_only_the_clients_node_and_drops_where_none_is_local()
-> Result<()> {
    let cluster = DemoCluster::start("itplocal")?;
    let (name, ip, url) = ("web-internal", "10.96.0.50", "http://10.96.0.50:80/");
    let local = "  internalTrafficPolicy: Local";
    let ready = Conditions::ready(true);
    write_service(
        &cluster,
        name,
        ip,
        local,
        &[
            ("web-a", ready),
            ("web-b", Conditions::ready(false)),
            ("web-c", ready),
        ],
    )?;
    // From each node and from a pod on it, only that node's ready endpoint answers.
    for (i, only) in [(0, "web-a"), (1, "web-c")] {
        expect_answers(&cluster, &cluster.nodes[i], url, &[only])?;
        expect_answers(&cluster, &cluster.clients[i], url, &[only])?;
    }

    // web-c leaves: node-2 has no local endpoint left, so its clients' connections are dropped
    // (kube-proxy's "has no local endpoints"), not sent to web-a and not refused.
    write_service(&cluster, name, ip, local, &[("web-a", ready)])?;
    expect_dropped(&cluster, &cluster.nodes[1], url)?;
    expect_dropped(&cluster, &cluster.clients[1], url)?;
    expect_answers(&cluster, &cluster.clients[0], url, &["web-a"])
}

#[test]
fn terminating_endpoints_serve_until_a_ready_one_exists() -> Result<()> {
    let cluster = DemoCluster::start("terminating")?;
    let (name, ip, url) = ("web-draining", "10.96.0.60", "http://10.96.0.60:80/");
    use Conditions as C;
    // No endpoint is ready: the serving ones (web-a, web-c) still take new connections; web-b,
    // which stopped serving, does not.
    write_service(
        &cluster,
        name,
        ip,
        "",
        &[
            ("web-a", C::TERMINATING_SERVING),
            ("web-b", C::TERMINATING_NOT_SERVING),
            ("web-c", C::TERMINATING_SERVING),
        ],
    )?;
    for client in &cluster.clients {
        expect_answers(&cluster, client, url, &["web-a", "web-c"])?;
    }
    expect_answers(&cluster, &cluster.nodes[0], url, &["web-a", "web-c"])?;

    // A ready endpoint appears: only it is used from now on.
    write_service(
        &cluster,
        name,
        ip,
        "",
        &[
            ("web-a", C::TERMINATING_SERVING),
            ("web-b", C::ready(true)),
            ("web-c", C::TERMINATING_SERVING),
        ],
    )?;
    for client in &cluster.clients {
        expect_answers(&cluster, client, url, &["web-b"])?;
    }
    Ok(())
}
