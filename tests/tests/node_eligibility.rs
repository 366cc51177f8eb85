//! Node eligibility against a real control plane: as kube-proxy's, a node's `/healthz` fails while
//! the cluster autoscaler is about to remove the node (taint `ToBeDeletedByClusterAutoscaler`),
//! while the Node is being deleted and once it is gone, so load balancers drain it; `/livez`, the
//! liveness probe, stays OK throughout, and the other node is not affected. Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`. Two nodes; only `node-1` is tainted and deleted.

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use splitproxy_e2e::{
    addresses::CONTROL_PLANE,
    agent_metric, await_reconnects,
    control_plane::{Binaries, ControlPlane},
    eventually,
    lab::{Lab, Node, Process},
};
use std::time::Duration;

/// The taint the cluster autoscaler sets on a node it is about to remove; its value is the time
/// it decided to.
const TAINT: &str = "ToBeDeletedByClusterAutoscaler=1700000000:NoSchedule";
/// A finalizer that holds the Node object while it is being deleted, as a cloud controller's would.
const FINALIZER: &str = "splitproxy.test/hold";
/// Generous: the API server, the controller and two agents share a 2-core machine.
const CONVERGE: Duration = Duration::from_secs(120);

struct Cluster {
    lab: Lab,
    control_plane: ControlPlane,
    nodes: Vec<Node>,
    controller: Option<Process>,
    agents: Vec<Process>,
}

impl Cluster {
    fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.control_plane.kubectl(&self.lab, args)
    }

    /// GETs `path` on the node's health address: the status code and the JSON body.
    fn health(&self, node: &Node, path: &str) -> Result<(u16, Value)> {
        let url = format!("http://127.0.0.1:10256{path}");
        let out = self.lab.exec_ok(
            node,
            "curl",
            &["-s", "-m", "5", "-w", "\n%{http_code}", &url],
        )?;
        let (body, code) = out
            .rsplit_once('\n')
            .context("curl printed no status code")?;
        let body = serde_json::from_str(body).with_context(|| format!("{path} said {body:?}"))?;
        Ok((code.trim().parse()?, body))
    }

    /// `kubeproxy_proxy_healthz_total{code}` on the node's metrics address.
    fn healthz_total(&self, node: &Node, code: u16) -> Result<f64> {
        let series = format!("kubeproxy_proxy_healthz_total{{code=\"{code}\"}}");
        agent_metric(&self.lab, node, &series)
    }

    /// Waits until the node's `/healthz` answers `code` with `nodeEligible` as given, checking
    /// each time that `/livez` answers 200 without `nodeEligible`.
    fn expect_healthz(&self, what: &str, node: &Node, code: u16, eligible: bool) -> Result<()> {
        eventually(what, CONVERGE, || {
            let (got, body) = self.health(node, "/healthz")?;
            ensure!(
                got == code && body["nodeEligible"] == eligible,
                "{}: /healthz answered {got} {body}",
                node.name()
            );
            ensure!(
                body["healthy"] == true,
                "eligibility alone must not make the proxy unhealthy: {body}"
            );
            let (livez, body) = self.health(node, "/livez")?;
            ensure!(
                livez == 200 && body.get("nodeEligible").is_none(),
                "{}: /livez answered {livez} {body}",
                node.name()
            );
            Ok(())
        })
        .with_context(|| self.logs())
    }

    /// node-1's `/healthz` fails as not eligible while node-2's passes.
    fn expect_node_1_drained(&self, what: &str) -> Result<()> {
        self.expect_healthz(what, &self.nodes[0], 503, false)?;
        self.expect_healthz("node-2 is unaffected", &self.nodes[1], 200, true)
    }

    fn logs(&self) -> String {
        let mut text = self.control_plane.logs();
        for process in self.controller.iter().chain(&self.agents) {
            text.push_str(&process.log_tail(30));
        }
        text
    }
}

#[test]
fn a_node_tainted_for_removal_or_being_deleted_fails_healthz_but_stays_live() -> Result<()> {
    let binaries = Binaries::ensure()?;
    let mut lab = Lab::new("elig")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let nodes = lab.add_nodes(2)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    // The controller reads as the admin here; tests/control_plane.rs proves the deploy/ RBAC.
    let controller = control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?;
    let mut agents = Vec::new();
    for node in &nodes {
        agents.push(control_plane.start_agent(&mut lab, node)?);
    }
    let mut cluster = Cluster {
        lab,
        control_plane,
        nodes,
        controller: Some(controller),
        agents,
    };
    let node_1 = cluster.nodes[0].name().to_owned();
    for node in &cluster.nodes {
        cluster.expect_healthz("a known, untainted node is eligible", node, 200, true)?;
    }

    // The cluster autoscaler marks node-1 for removal.
    cluster.kubectl(&["taint", "nodes", &node_1, TAINT])?;
    cluster.expect_node_1_drained("the tainted node fails /healthz")?;
    let before = cluster.healthz_total(&cluster.nodes[0], 503)?;
    let (code, _) = cluster.health(&cluster.nodes[0], "/healthz")?;
    ensure!(code == 503, "node-1's /healthz answered {code}");
    let after = cluster.healthz_total(&cluster.nodes[0], 503)?;
    ensure!(
        after == before + 1.0,
        "kubeproxy_proxy_healthz_total{{code=\"503\"}} went from {before} to {after}"
    );

    // Fail static: without a controller, node-1 stays drained and node-2 stays in.
    if let Some(controller) = cluster.controller.take() {
        cluster.lab.kill(&controller)?;
    }
    await_reconnects(&cluster.lab, &cluster.nodes, CONVERGE)?;
    cluster.expect_node_1_drained("eligibility is kept while the controller is away")?;
    let controller = cluster
        .control_plane
        .start_controller(&mut cluster.lab, &cluster.control_plane.admin_kubeconfig())?;
    cluster.controller = Some(controller);

    // The autoscaler gives up on the removal: node-1 takes traffic again.
    cluster.kubectl(&["taint", "nodes", &node_1, "ToBeDeletedByClusterAutoscaler-"])?;
    cluster.expect_healthz(
        "the untainted node passes /healthz again",
        &cluster.nodes[0],
        200,
        true,
    )?;

    // node-1 is deleted; a finalizer holds its Node object with a deletionTimestamp.
    cluster.kubectl(&[
        "patch",
        "node",
        &node_1,
        "--type=merge",
        "-p",
        &format!(r#"{{"metadata":{{"finalizers":["{FINALIZER}"]}}}}"#),
    ])?;
    cluster.kubectl(&["delete", "node", &node_1, "--wait=false"])?;
    let deletion = cluster.kubectl(&[
        "get",
        "node",
        &node_1,
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    ])?;
    ensure!(
        !deletion.trim().is_empty(),
        "the Node has no deletionTimestamp"
    );
    cluster.expect_node_1_drained("the node being deleted fails /healthz")?;

    // The finalizer goes and so does the Node: a node the controller does not know is not
    // eligible either.
    cluster.kubectl(&[
        "patch",
        "node",
        &node_1,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])?;
    eventually("the Node object is gone", CONVERGE, || {
        let names = cluster.kubectl(&["get", "nodes", "-o", "name"])?;
        ensure!(
            !names.lines().any(|n| n == format!("node/{node_1}")),
            "still listed: {names}"
        );
        Ok(())
    })?;
    eventually(
        "node-1's agent learns that its Node is unknown",
        CONVERGE,
        || {
            let log = cluster.agents[0].log();
            ensure!(
                log.contains("no Node object of this name is known"),
                "not logged yet"
            );
            Ok(())
        },
    )
    .with_context(|| cluster.logs())?;
    cluster.expect_node_1_drained("the deleted node still fails /healthz")
}
