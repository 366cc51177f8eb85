//! What an operator sees of the running system: the agents' kube-proxy `/metrics`, the
//! controller's `/metrics`, and the real grpcurl against both inspection services, moving as the
//! cluster changes and as an agent dies. Needs root; `scripts/test.sh` builds the binaries first.
//!
//! Addresses: see `splitproxy_e2e::addresses`; the web Service is 10.96.0.10, the Service this
//! test adds is 10.96.0.30. The controller serves gRPC on the control-plane host's address and
//! `/metrics` on its loopback (127.0.0.1:10662, the default).

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use splitproxy_dataplane::IpFamily;
use splitproxy_e2e::{
    demo_cluster::{
        CONTROLLER_INSPECTION, Conditions, DemoCluster, POD_PORT, PortSpec, service_yaml,
        slice_yaml,
    },
    eventually,
    lab::HasNamespace,
};
use std::time::Duration;

/// The longest wait for something to converge; generous because CI machines are slow and shared.
const CONVERGE: Duration = Duration::from_secs(90);
const AGENT_METRICS: &str = "http://127.0.0.1:10249/metrics";
const CONTROLLER_METRICS: &str = "http://127.0.0.1:10662/metrics";
const INSPECTION: &str = "splitproxy.v1alpha1.ControllerInspectionService";

/// One scrape of a `/metrics` page.
struct Scrape(String);

impl Scrape {
    fn of(cluster: &DemoCluster, ns: &(impl HasNamespace + ?Sized), url: &str) -> Result<Self> {
        Ok(Self(cluster.run(ns, "curl", &["-sf", url])?))
    }

    /// The value of the sample `series` (name and labels exactly as exported).
    fn value(&self, series: &str) -> Result<f64> {
        self.0
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .with_context(|| format!("no sample {series} in\n{}", self.0))?
            .trim()
            .parse()
            .with_context(|| format!("{series} is not a number"))
    }

    /// The value of `series`, or 0 before it exists: a labelled histogram appears at its first
    /// observation. (A misspelled name stays 0, which the checks that it grows catch.)
    fn value_or_zero(&self, series: &str) -> f64 {
        self.value(series).unwrap_or(0.0)
    }

    /// Whether any sample mentions `text` (a label, say).
    fn mentions(&self, text: &str) -> bool {
        self.0
            .lines()
            .any(|line| !line.starts_with('#') && line.contains(text))
    }
}

/// What the real grpcurl prints for `method` (or `list`) on `address`, from `ns`.
fn grpcurl(
    cluster: &DemoCluster,
    ns: &(impl HasNamespace + ?Sized),
    address: &str,
    method: &str,
) -> Result<String> {
    cluster.run(ns, "grpcurl", &["-plaintext", address, method])
}

fn json(text: &str) -> Result<Value> {
    serde_json::from_str(text).with_context(|| format!("grpcurl printed no JSON: {text}"))
}

/// `ControllerInspectionService/ListNodes` through grpcurl: the entries, and their node names.
fn list_nodes(cluster: &DemoCluster, address: &str) -> Result<(Vec<Value>, Vec<String>)> {
    let method = format!("{INSPECTION}/ListNodes");
    let listed = json(&grpcurl(cluster, &cluster.control_plane, address, &method)?)?;
    let nodes = listed["nodes"].as_array().cloned().unwrap_or_default();
    let names = nodes
        .iter()
        .filter_map(|n| n["nodeName"].as_str().map(str::to_owned))
        .collect();
    Ok((nodes, names))
}

/// The wall clock as RFC 3339, for the EndpointSlice trigger-time annotation.
fn now_rfc3339() -> Result<String> {
    let output = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .context("running date")?;
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// Each connected node's acknowledged and latest revision, from the controller's gauges.
fn node_revisions(scrape: &Scrape, node: &str) -> Result<(f64, f64)> {
    Ok((
        scrape.value(&format!(
            "splitproxy_controller_node_acked_revision{{node=\"{node}\"}}"
        ))?,
        scrape.value(&format!(
            "splitproxy_controller_node_latest_revision{{node=\"{node}\"}}"
        ))?,
    ))
}

/// Waits until the controller counts `agents` connected agents and each of `nodes` has
/// acknowledged its latest revision, which is newer than `after`; returns the acknowledged ones.
fn wait_all_acked(
    cluster: &DemoCluster,
    agents: f64,
    nodes: &[&str],
    after: &[f64],
) -> Result<Vec<f64>> {
    eventually(
        "every node acknowledges its latest revision",
        CONVERGE,
        || {
            let scrape = Scrape::of(cluster, &cluster.control_plane, CONTROLLER_METRICS)?;
            let connected = scrape.value("splitproxy_controller_connected_agents")?;
            ensure!(connected == agents, "{connected} agents connected");
            let mut acked = Vec::new();
            for (i, node) in nodes.iter().enumerate() {
                let (ack, latest) = node_revisions(&scrape, node)?;
                ensure!(
                    ack == latest && ack > after.get(i).copied().unwrap_or(0.0),
                    "{node}: acked {ack}, latest {latest}"
                );
                let lag = scrape.value(&format!(
                    "splitproxy_controller_node_lag_seconds{{node=\"{node}\"}}"
                ))?;
                ensure!(lag == 0.0, "{node} lags {lag} s");
                acked.push(ack);
            }
            Ok(acked)
        },
    )
    .with_context(|| cluster.logs())
}

/// A ClusterIP Service `demo/observed` on 10.96.0.30 whose EndpointSlice lists web-a and carries
/// the trigger time `trigger`, as the EndpointSlice controller writes it.
fn observed_service_yaml(cluster: &DemoCluster, trigger: &str) -> Result<String> {
    let spec = "  type: ClusterIP\n  clusterIP: 10.96.0.30\n  clusterIPs: [10.96.0.30]";
    let slice = slice_yaml(
        "observed",
        IpFamily::V4,
        "TCP",
        POD_PORT,
        &[(cluster.web_pod("web-a")?, Conditions::ready(true))],
    );
    let annotated = slice.replacen(
        "  labels:\n",
        &format!(
            "  annotations:\n    endpoints.kubernetes.io/last-change-trigger-time: \"{trigger}\"\n  labels:\n"
        ),
        1,
    );
    if annotated == slice {
        bail!("the slice has no labels to put the annotation before:\n{slice}");
    }
    Ok(service_yaml("observed", spec, PortSpec::WEB, "") + &annotated)
}

#[test]
fn metrics_and_grpcurl_show_changes_reaching_every_node_and_an_agent_leaving() -> Result<()> {
    let mut cluster = DemoCluster::start("observe")?;
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name().to_owned()).collect();
    let nodes: Vec<&str> = names.iter().map(String::as_str).collect();
    let node1 = cluster.nodes[0].clone();
    let controller_address = CONTROLLER_INSPECTION;

    // Both agents connected, and each node has applied what the controller last sent it.
    let acked = wait_all_acked(&cluster, 2.0, &nodes, &[])?;

    let agent = Scrape::of(&cluster, &node1, AGENT_METRICS)?;
    let controller = Scrape::of(&cluster, &cluster.control_plane, CONTROLLER_METRICS)?;
    let service_changes = "kubeproxy_sync_proxy_rules_service_changes_total";
    let endpoint_changes = "kubeproxy_sync_proxy_rules_endpoint_changes_total";
    let programming = r#"kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}"#;
    let received = "splitproxy_agent_update_messages_received_total";
    let sent = "splitproxy_controller_update_messages_sent_total";
    let bytes_sent = "splitproxy_controller_update_bytes_sent_total";
    let views = "splitproxy_controller_view_computations_total";
    let before = [
        agent.value(service_changes)?,
        agent.value(endpoint_changes)?,
        agent.value_or_zero(programming),
        agent.value(received)?,
    ];
    ensure!(before[0] >= 1.0, "the web Service was never counted");
    let controller_before = [
        controller.value(sent)?,
        controller.value(bytes_sent)?,
        controller.value(views)?,
    ];
    ensure!(
        controller_before.iter().all(|v| *v > 0.0),
        "controller counters at zero after the first revisions"
    );

    // A new Service with an endpoint: every node gets a new revision and acknowledges it.
    cluster.write_manifest(
        "observed.yaml",
        &observed_service_yaml(&cluster, &now_rfc3339()?)?,
    )?;
    wait_all_acked(&cluster, 2.0, &nodes, &acked)?;
    eventually("node-1's change metrics move", CONVERGE, || {
        let agent = Scrape::of(&cluster, &node1, AGENT_METRICS)?;
        for (i, name) in [service_changes, endpoint_changes, programming, received]
            .into_iter()
            .enumerate()
        {
            let now = agent.value_or_zero(name);
            ensure!(now > before[i], "{name} stayed at {now}");
        }
        // Applied, so nothing is pending any more.
        for pending in [
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        ] {
            ensure!(agent.value(pending)? == 0.0, "{pending} is not 0");
        }
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    let controller = Scrape::of(&cluster, &cluster.control_plane, CONTROLLER_METRICS)?;
    for (i, name) in [sent, bytes_sent, views].into_iter().enumerate() {
        let now = controller.value(name)?;
        ensure!(now > controller_before[i], "{name} stayed at {now}");
    }

    // The agent's health endpoints are counted under kube-proxy's names.
    cluster.run(&node1, "curl", &["-sf", "http://127.0.0.1:10256/healthz"])?;
    let healthz = Scrape::of(&cluster, &node1, AGENT_METRICS)?
        .value("kubeproxy_proxy_healthz_total{code=\"200\"}")?;
    ensure!(healthz >= 1.0, "healthz total {healthz}");

    // The real grpcurl finds the controller's inspection service through reflection.
    let listed = grpcurl(&cluster, &cluster.control_plane, controller_address, "list")?;
    ensure!(
        listed.contains(INSPECTION) && listed.contains("splitproxy.v1alpha1.NodeViewService"),
        "grpcurl list: {listed}"
    );
    let (connected, listed_names) = list_nodes(&cluster, controller_address)?;
    ensure!(listed_names == nodes, "ListNodes: {connected:?}");
    for node in &connected {
        // protojson prints uint64 as strings and leaves zero values out.
        ensure!(
            node["ackedRevision"] == node["latestRevision"]
                && node["ackedRevision"].as_str().is_some()
                && node.get("revisionsBehind").is_none()
                && node.get("behindSince").is_none()
                && node["lag"] == "0s"
                && node["proxyMode"] == "PROXY_MODE_IPTABLES"
                && node["lastAckAt"].is_string()
                && node["peer"].is_string(),
            "ListNodes entry: {node}"
        );
    }
    let state = json(&grpcurl(
        &cluster,
        &cluster.control_plane,
        controller_address,
        &format!("{INSPECTION}/GetClusterState"),
    )?)?;
    ensure!(
        state["synced"] == true
            && state["serviceCount"] == 2
            && state["nodeCount"] == 2
            && state["connectedAgents"] == 2
            && state.get("invalidServices").is_none(),
        "GetClusterState: {state}"
    );

    // The agent's own inspection agrees with the controller on node-1's applied revision.
    let node_state = json(&grpcurl(
        &cluster,
        &node1,
        "127.0.0.1:10661",
        "splitproxy.v1alpha1.NodeInspectionService/GetNodeState",
    )?)?;
    ensure!(
        node_state["connected"] == true
            && node_state["applied"]["revision"] == connected[0]["ackedRevision"]
            && node_state["serviceCount"] == 2,
        "GetNodeState: {node_state} / ListNodes: {}",
        connected[0]
    );

    // An agent dies: the controller stops counting it, and its per-node series go away.
    let agent2 = cluster.agents[1].clone();
    cluster.lab.kill(&agent2)?;
    eventually(
        "the controller notices node-2's agent is gone",
        CONVERGE,
        || {
            let scrape = Scrape::of(&cluster, &cluster.control_plane, CONTROLLER_METRICS)?;
            let connected = scrape.value("splitproxy_controller_connected_agents")?;
            ensure!(connected == 1.0, "{connected} agents connected");
            ensure!(
                !scrape.mentions(&format!("node=\"{}\"", nodes[1])),
                "node-2 still has series"
            );
            Ok(())
        },
    )
    .with_context(|| cluster.logs())?;
    let (listed, remaining) = list_nodes(&cluster, controller_address)?;
    ensure!(
        remaining == nodes[..1],
        "ListNodes after the kill: {listed:?}"
    );
    Ok(())
}
