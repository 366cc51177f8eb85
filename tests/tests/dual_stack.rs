//! IPv6 and dual-stack Services with real traffic between network namespaces, on the demo cluster
//! (manifests source, iptables and ip6tables), and a kernel refusing one family's change. Needs
//! root.
//!
//! Addresses: see `splitproxy_e2e::addresses`; every lab address has an IPv6 twin
//! (`fd00:198:18::11` is node-1, `fd00:10:244:1::2` is web-a). The Services here:
//!
//! | Service            | cluster IPs                      | node port | pods' port |
//! |--------------------|----------------------------------|-----------|------------|
//! | `demo/web6`        | `fd00:10:96::20` (IPv6 only)     | 30620     | 8080       |
//! | `demo/web-dual`    | `10.96.0.30`, `fd00:10:96::30`   | 30630     | 8081       |
//!
//! For `web-dual` every web pod runs two servers on port 8081, one bound to its IPv4 address
//! answering `<pod>@ipv4` and one bound to its IPv6 address answering `<pod>@ipv6`, so an answer
//! says which of the pod's addresses a connection was sent to.

use anyhow::{Context, Result, ensure};
use splitproxy_dataplane::{IpFamily, Protocol, iptables::chain_names::endpoint_chain};
use splitproxy_e2e::{
    agent_metric,
    demo_cluster::{DemoCluster, POD_PORT, WEB6_IP, WEB6_NODE_PORT},
    eventually, hit,
    lab::HasNamespace,
};
use std::{collections::BTreeSet, time::Duration};

const CONVERGE: Duration = Duration::from_secs(90);
/// Requests per check: with two ready endpoints picked at random, the chance that one of them
/// gets none of 40 is 2 × 2⁻⁴⁰.
const REQUESTS: u32 = 40;

const DUAL_IP: &str = "10.96.0.30";
const DUAL_IP6: &str = "fd00:10:96::30";
const DUAL_NODE_PORT: u16 = 30630;
const DUAL_POD_PORT: u16 = 8081;

/// Waits until `count` requests from `from` to `url` are all answered, by exactly `expected`.
fn converges(
    cluster: &DemoCluster,
    from: &(impl HasNamespace + ?Sized),
    url: &str,
    expected: &BTreeSet<String>,
) -> Result<()> {
    eventually(
        &format!("{url} answering {} from {expected:?}", from.ns_name()),
        CONVERGE,
        || {
            let report = hit(&cluster.lab, from, url, REQUESTS)?;
            let answered: BTreeSet<String> = report.answers.keys().cloned().collect();
            ensure!(
                report.failures == 0 && answered == *expected,
                "from {} to {url}: expected answers from exactly {expected:?}, got {report:?}",
                from.ns_name()
            );
            Ok(())
        },
    )
    .with_context(|| cluster.logs())
}

/// Where cluster-IP clients run: each client pod, then each node.
fn pods_and_nodes(cluster: &DemoCluster) -> Vec<&dyn HasNamespace> {
    let pods = cluster.clients.iter().map(|pod| pod as &dyn HasNamespace);
    pods.chain(cluster.nodes.iter().map(|node| node as &dyn HasNamespace))
        .collect()
}

/// The ready web pods' names, each with `suffix`.
fn ready(cluster: &DemoCluster, suffix: &str) -> BTreeSet<String> {
    cluster
        .ready_web()
        .into_iter()
        .map(|name| format!("{name}{suffix}"))
        .collect()
}

/// `demo/web-dual`: dual-stack NodePort (IPv4 primary) with an IPv4 and an IPv6 EndpointSlice,
/// served by the per-family servers on port 8081.
fn dual_yaml(cluster: &DemoCluster) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: web-dual
  namespace: demo
spec:
  type: NodePort
  clusterIP: {DUAL_IP}
  clusterIPs: [{DUAL_IP}, '{DUAL_IP6}']
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: {DUAL_POD_PORT}
    nodePort: {DUAL_NODE_PORT}
---
{}---
{}",
        cluster.endpoint_slice_yaml_for("web-dual", IpFamily::V4, DUAL_POD_PORT),
        cluster.endpoint_slice_yaml_for("web-dual", IpFamily::V6, DUAL_POD_PORT)
    )
}

/// Starts `web-dual`'s servers: on each web pod, `<pod>@ipv4` on its IPv4 address and
/// `<pod>@ipv6` on its IPv6 address.
fn serve_per_family(cluster: &mut DemoCluster) -> Result<()> {
    let pods: Vec<_> = cluster.web.iter().map(|web| web.pod.clone()).collect();
    for pod in pods {
        for (suffix, listen) in [
            ("@ipv4", format!("{}:{DUAL_POD_PORT}", pod.ip())),
            ("@ipv6", format!("[{}]:{DUAL_POD_PORT}", pod.ip6())),
        ] {
            let name = format!("{}{suffix}", pod.name());
            let binary = splitproxy_e2e::workspace_binary("sp-testpod")?;
            cluster.lab.spawn(
                &pod,
                binary,
                &["serve", "--name", &name, "--listen", &listen],
            )?;
        }
    }
    Ok(())
}

#[test]
fn an_ipv6_only_cluster_ip_answers_pods_and_nodes_over_ipv6() -> Result<()> {
    let cluster = DemoCluster::start("sixonly")?;
    cluster.write_manifest("web6.yaml", &cluster.web6_yaml())?;
    let expected: BTreeSet<String> = cluster.ready_web().into_iter().collect();
    let url = format!("http://[{WEB6_IP}]:80/");
    for from in pods_and_nodes(&cluster) {
        converges(&cluster, from, &url, &expected)?;
    }
    // The rules are in ip6tables, under the same chain layout; iptables has none for web6.
    let node1 = &cluster.nodes[0];
    let nat6 = cluster.run(node1, "ip6tables-save", &["-t", "nat"])?;
    ensure!(
        nat6.contains(&format!("-d {WEB6_IP}/128"))
            && nat6.contains("-j DNAT --to-destination [fd00:10:244:1::2]:8080"),
        "node-1's IPv6 nat table:\n{nat6}"
    );
    let nat4 = cluster.run(node1, "iptables-save", &["-t", "nat"])?;
    ensure!(
        !nat4.contains("demo/web6"),
        "node-1's IPv4 nat table has web6:\n{nat4}"
    );
    Ok(())
}

#[test]
fn a_dual_stack_service_sends_each_family_to_the_pods_address_of_that_family() -> Result<()> {
    let mut cluster = DemoCluster::start("dualcip")?;
    serve_per_family(&mut cluster)?;
    cluster.write_manifest("dual.yaml", &dual_yaml(&cluster))?;
    let (v4, v6) = (ready(&cluster, "@ipv4"), ready(&cluster, "@ipv6"));
    let urls = [
        (format!("http://{DUAL_IP}:80/"), &v4),
        (format!("http://[{DUAL_IP6}]:80/"), &v6),
    ];
    for from in pods_and_nodes(&cluster) {
        for (url, expected) in &urls {
            converges(&cluster, from, url, expected)?;
        }
    }
    Ok(())
}

#[test]
fn node_ports_answer_an_outside_client_over_ipv6() -> Result<()> {
    let mut cluster = DemoCluster::start("sixnodeport")?;
    serve_per_family(&mut cluster)?;
    cluster.write_manifest("web6.yaml", &cluster.web6_yaml())?;
    cluster.write_manifest("dual.yaml", &dual_yaml(&cluster))?;
    let plain: BTreeSet<String> = cluster.ready_web().into_iter().collect();
    let (v4, v6) = (ready(&cluster, "@ipv4"), ready(&cluster, "@ipv6"));
    for node in &cluster.nodes {
        let (ip, ip6) = (node.ip(), node.ip6());
        for (url, expected) in [
            (format!("http://[{ip6}]:{WEB6_NODE_PORT}/"), &plain),
            (format!("http://[{ip6}]:{DUAL_NODE_PORT}/"), &v6),
            (format!("http://{ip}:{DUAL_NODE_PORT}/"), &v4),
        ] {
            converges(&cluster, &cluster.external, &url, expected)?;
        }
        // The IPv6-only Service has no IPv4 rules: its node port is closed on IPv4.
        let closed = hit(
            &cluster.lab,
            &cluster.external,
            &format!("http://{ip}:{WEB6_NODE_PORT}/"),
            1,
        )?;
        ensure!(
            closed.failures == 1,
            "the IPv6-only node port answered on {ip}: {closed:?}"
        );
    }
    Ok(())
}

/// A kernel that refuses one family's change, as ip6tables does when another program's rule
/// still jumps to a chain the change deletes: the node keeps the other family's new rules (no
/// flapping back), keeps answering `/livez`, and the refused revision is not sent again and
/// again; once the kernel takes it, the agent's own retry puts it in.
#[test]
fn a_kernel_refusing_one_familys_change_costs_that_family_alone() -> Result<()> {
    let sync_period = Duration::from_secs(3);
    let mut cluster = DemoCluster::start_with("refusesix", &["--iptables-sync-period", "3s"])?;
    cluster.write_manifest("web6.yaml", &cluster.web6_yaml())?;
    let before: BTreeSet<String> = cluster.ready_web().into_iter().collect();
    ensure!(before.contains("web-c"), "web-c is not ready: {before:?}");
    let after: BTreeSet<String> = before.iter().filter(|p| *p != "web-c").cloned().collect();
    let (node1, node2) = (cluster.nodes[0].clone(), cluster.nodes[1].clone());
    let url4 = DemoCluster::cluster_ip_url();
    let url6 = format!("http://[{WEB6_IP}]:80/");
    for node in [&node1, &node2] {
        converges(&cluster, node, &url4, &before)?;
        converges(&cluster, node, &url6, &before)?;
    }

    // Another program's rule on node-1 jumps to the IPv6 chain of web-c's web6 endpoint.
    let web_c6 = format!("[{}]:{POD_PORT}", cluster.web_pod("web-c")?.ip6());
    let chain = endpoint_chain("demo/web6:http", Protocol::Tcp, &web_c6);
    let foreign: [&str; 10] = [
        "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9", "-j", &chain,
    ];
    cluster.run(&node1, "ip6tables", &foreign)?;
    let rejected = |cluster: &DemoCluster| {
        agent_metric(
            &cluster.lab,
            &node1,
            "splitproxy_agent_rejected_revisions_total",
        )
    };
    ensure!(
        rejected(&cluster)? == 0.0,
        "node-1 rejected a revision before the change"
    );

    // web-c leaves both Services: node-1's ip6tables cannot delete its chain.
    cluster.set_web(&[("web-a", true), ("web-b", false)])?;
    cluster.write_manifest("web6.yaml", &cluster.web6_yaml())?;
    eventually("node-1 to reject the change", CONVERGE, || {
        ensure!(rejected(&cluster)? >= 1.0, "no rejection yet");
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    converges(&cluster, &node2, &url6, &after)?;

    // Over four sync-periods (past /livez's 2 x sync-period): IPv4 serves the change, IPv6 the
    // last good rules, and /livez answers.
    let watch_until = std::time::Instant::now() + 4 * sync_period;
    let mut checks = 0;
    while checks < 4 || std::time::Instant::now() < watch_until {
        let v4 = hit(&cluster.lab, &node1, &url4, REQUESTS)?;
        let answered: BTreeSet<String> = v4.answers.keys().cloned().collect();
        ensure!(
            v4.failures == 0 && answered == after,
            "node-1's IPv4 rules went back or failed: {v4:?}\n{}",
            cluster.logs()
        );
        let livez = cluster.run(
            &node1,
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-m",
                "5",
                "-w",
                "%{http_code}",
                "http://127.0.0.1:10256/livez",
            ],
        )?;
        ensure!(
            livez.trim() == "200",
            "node-1's /livez answered {livez}\n{}",
            cluster.logs()
        );
        checks += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    let v6 = hit(&cluster.lab, &node1, &url6, REQUESTS)?;
    let answered: BTreeSet<String> = v6.answers.keys().cloned().collect();
    ensure!(
        answered == before,
        "node-1's IPv6 rules are not the last good ones: {v6:?}"
    );
    // One rejection, or two if the controller's 30 s back-off passed meanwhile; not one every
    // few seconds.
    let count = rejected(&cluster)?;
    println!("node-1 rejected {count} revisions over {checks} checks");
    ensure!(
        count <= 2.0,
        "node-1 rejected {count} revisions: the controller kept resending"
    );

    // The other program's rule goes: the agent's own retry puts the change in.
    let mut undo = foreign;
    undo[2] = "-D";
    cluster.run(&node1, "ip6tables", &undo)?;
    converges(&cluster, &node1, &url6, &after)
}
