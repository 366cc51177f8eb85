//! One Service as big as the API server lets it be reaches every node, and the others keep
//! flowing beside it. The API server checks each EndpointSlice (at most 1,000 endpoints and 100
//! ports) but not how many slices a Service has: three full slices behind 100 ports make an
//! endpoint set of about 7.5 MB, past the 4 MiB any gRPC client takes in one message. The
//! controller sends it in pieces (protocol rule 14); before, every agent refused the message and
//! no change to any Service reached any node again. Real etcd, kube-apiserver, controller and
//! agents (one in iptables mode, one in nftables mode), real traffic between network
//! namespaces. Needs root and the cached Kubernetes build.
//!
//! The big Service's endpoints are one ready pod and 2,999 serving-but-terminating addresses:
//! all of them are sent (a terminating endpoint takes over when no ready one is left), while
//! only the ready one gets rules, so the kernels' work stays small and the message does not.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses, agent_metric,
    control_plane::{ControlPlane, one_endpoint_service_yaml},
    eventually, hit,
    lab::{Lab, Node},
    serve,
};
use std::{fmt::Write as _, time::Duration};

const NAMESPACE: &str = "demo";
const POD_PORT: u16 = 8080;
const PORTS: u16 = 100;
const SLICES: usize = 3;
const ENDPOINTS_PER_SLICE: usize = 1000;
/// Generous: the API server, the controller and two agents share a 2-core machine, and the big
/// set is 300,000 endpoint entries on each side.
const CONVERGE: Duration = Duration::from_secs(240);

/// `big`, selector-less, with ports `p0`.. on 1000.. to the pods' port.
fn big_service() -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: big\n  namespace: {NAMESPACE}\nspec:\n  ports:\n"
    );
    for p in 0..PORTS {
        let _ = writeln!(
            yaml,
            "  - {{name: p{p}, port: {}, targetPort: {POD_PORT}, protocol: TCP}}",
            1000 + p
        );
    }
    yaml
}

/// `big`'s slices, as one JSON list: the first endpoint of the first is `ready_ip`, every other
/// one a serving, terminating address that nothing answers on.
fn big_slices(ready_ip: &str) -> String {
    let ports: Vec<String> = (0..PORTS)
        .map(|p| format!(r#"{{"name":"p{p}","port":{POD_PORT},"protocol":"TCP"}}"#))
        .collect();
    let ports = ports.join(",");
    let mut items = Vec::new();
    for slice in 0..SLICES {
        let endpoints: Vec<String> = (0..ENDPOINTS_PER_SLICE)
            .map(|i| {
                let n = slice * ENDPOINTS_PER_SLICE + i;
                if n == 0 {
                    return format!(r#"{{"addresses":["{ready_ip}"],"conditions":{{"ready":true}}}}"#);
                }
                format!(
                    r#"{{"addresses":["10.250.{}.{}"],"conditions":{{"ready":false,"serving":true,"terminating":true}}}}"#,
                    n / 250,
                    n % 250 + 1
                )
            })
            .collect();
        items.push(format!(
            r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"big-{slice}","namespace":"{NAMESPACE}","labels":{{"kubernetes.io/service-name":"big","endpointslice.kubernetes.io/managed-by":"big-service-test"}}}},"addressType":"IPv4","ports":[{ports}],"endpoints":[{}]}}"#,
            endpoints.join(",")
        ));
    }
    format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
        items.join(",")
    )
}

/// `small`, whose one endpoint is `ip`.
fn small(ip: &str) -> String {
    one_endpoint_service_yaml(NAMESPACE, "small", POD_PORT, ip)
}

/// Fails unless every request to `url` from every node is answered by `pod`.
fn all_answered_by(lab: &Lab, nodes: &[Node], url: &str, pod: &str) -> Result<()> {
    for node in nodes {
        let report = hit(lab, node, url, 5)?;
        ensure!(
            report.answers.get(pod) == Some(&5),
            "{url} from {}: {report:?}, expected every answer from {pod}",
            node.name()
        );
    }
    Ok(())
}

#[test]
fn a_service_past_the_agents_message_limit_reaches_every_node_and_the_others_keep_flowing()
-> Result<()> {
    let (mut lab, _, nodes, control_plane) = ControlPlane::lab_with_two_nodes("bigsvc", NAMESPACE)?;
    let web_a = addresses::pod_ip(1, 2).to_string();
    let web_b = addresses::pod_ip(2, 2).to_string();
    for (name, node, ip) in [("web-a", &nodes[0], &web_a), ("web-b", &nodes[1], &web_b)] {
        let pod = lab.add_pod(node, name, ip.parse()?)?;
        serve(&mut lab, &pod, name, POD_PORT)?;
    }

    control_plane.kubectl_apply(&lab, &big_service())?;
    // Created, not applied: kubectl apply would copy each slice into an annotation, which the
    // API server caps at 256 KiB.
    let slices = tempfile::NamedTempFile::new()?;
    std::fs::write(slices.path(), big_slices(&web_a))?;
    control_plane.kubectl(&lab, &["create", "-f", &slices.path().to_string_lossy()])?;
    control_plane.kubectl_apply(&lab, &small(&web_b))?;
    let big_ip = control_plane.cluster_ip(&lab, NAMESPACE, "big")?;
    let small_ip = control_plane.cluster_ip(&lab, NAMESPACE, "small")?;

    let mut processes =
        vec![control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?];
    processes.push(control_plane.start_agent(&mut lab, &nodes[0])?);
    processes.push(control_plane.start_agent_with(
        &mut lab,
        &nodes[1],
        &["--proxy-mode", "nftables"],
    )?);
    let logs = || -> String {
        processes.iter().map(|p| p.log_tail(30)).collect::<String>() + &control_plane.logs()
    };

    eventually("both Services to answer on both nodes", CONVERGE, || {
        all_answered_by(&lab, &nodes, &format!("http://{small_ip}:80/"), "web-b")?;
        for port in [1000, 1000 + PORTS - 1] {
            all_answered_by(&lab, &nodes, &format!("http://{big_ip}:{port}/"), "web-a")?;
        }
        Ok(())
    })
    .with_context(logs)?;

    // The ordinary Service still changes on every node with the big one beside it.
    control_plane.kubectl_apply(&lab, &small(&web_a))?;
    eventually(
        "the small Service's change to reach both nodes",
        CONVERGE,
        || all_answered_by(&lab, &nodes, &format!("http://{small_ip}:80/"), "web-a"),
    )
    .with_context(logs)?;

    for node in &nodes {
        let rejected = agent_metric(&lab, node, "splitproxy_agent_rejected_revisions_total")?;
        ensure!(
            rejected == 0.0,
            "{} rejected {rejected} revisions",
            node.name()
        );
        let messages = agent_metric(
            &lab,
            node,
            "splitproxy_agent_update_messages_received_total",
        )?;
        let bytes = agent_metric(&lab, node, "splitproxy_agent_update_bytes_received_total")?;
        println!(
            "{}: {messages} messages, {:.1} MB, the largest under 4 MiB by construction",
            node.name(),
            bytes / 1e6
        );
        ensure!(
            bytes > 4.0 * 1024.0 * 1024.0,
            "{} received only {bytes} bytes",
            node.name()
        );
    }
    Ok(())
}
