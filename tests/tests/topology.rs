//! Topology-aware routing against a real control plane: the real EndpointSlice controller turns
//! `trafficDistribution` into hints, and splitproxy follows them per node with kube-proxy's
//! all-or-nothing rule. Needs root.
//!
//! Addresses: see `splitproxy_e2e::addresses`. Five nodes: `node-1` and `node-3` in `zone-a`,
//! `node-2` in `zone-b`, `node-4` without a zone label until the test gives it `zone-b`, `node-5`
//! never labelled. Pod `web-aN`/`web-bN`/`web-xN` runs on node `N` at `10.244.N.2`; `node-4` has
//! no pod, so relabelling it changes no slice, only the view of node 4 itself.

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use splitproxy_e2e::{
    addresses::{self, CONTROL_PLANE},
    control_plane::{Binaries, ControlPlane},
    eventually, expect_answers,
    lab::{Lab, Node, Pod, Process},
    serve,
};
use std::{collections::BTreeSet, time::Duration};

const NAMESPACE: &str = "demo";
/// `trafficDistribution: PreferSameZone`.
const ZONAL: &str = "zonal";
const ZONAL_IP: &str = "10.96.0.20";
/// `trafficDistribution: PreferSameNode`.
const NEAR: &str = "near";
const NEAR_IP: &str = "10.96.0.21";
const POD_PORT: u16 = 8080;
const REQUESTS: u32 = 40;
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Generous: the API server, the EndpointSlice controller and five agents share a 2-core machine.
const CONVERGE: Duration = Duration::from_secs(180);

/// One endpoint of a Service's slices as the EndpointSlice controller wrote it: address, ready,
/// `hints.forZones` and `hints.forNodes`.
type SliceEndpoint = (String, bool, Vec<String>, Vec<String>);

struct Cluster {
    lab: Lab,
    control_plane: ControlPlane,
    nodes: Vec<Node>,
    processes: Vec<Process>,
}

impl Cluster {
    fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.control_plane.kubectl(&self.lab, args)
    }

    /// Every endpoint of `service`'s slices, sorted by address.
    fn slice_endpoints(&self, service: &str) -> Result<Vec<SliceEndpoint>> {
        let selector = format!("kubernetes.io/service-name={service}");
        let json = self.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "endpointslices",
            "-l",
            &selector,
            "-o",
            "json",
        ])?;
        let list: Value = serde_json::from_str(&json).context("parsing the slices")?;
        let names = |hints: &Value, field: &str| -> Vec<String> {
            hints[field]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|hint| hint["name"].as_str().map(str::to_owned))
                .collect()
        };
        let mut endpoints: Vec<SliceEndpoint> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|slice| slice["endpoints"].as_array().into_iter().flatten())
            .map(|endpoint| {
                let hints = &endpoint["hints"];
                (
                    endpoint["addresses"][0]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    endpoint["conditions"]["ready"].as_bool().unwrap_or(false),
                    names(hints, "forZones"),
                    names(hints, "forNodes"),
                )
            })
            .collect();
        endpoints.sort();
        Ok(endpoints)
    }

    /// Waits until `service`'s slices hold exactly `expected` (address, ready, zone hints, node
    /// hints), as the EndpointSlice controller writes them.
    fn expect_slices(
        &self,
        service: &str,
        expected: &[(&Pod, bool, &[&str], &[&str])],
    ) -> Result<()> {
        let mut wanted: Vec<SliceEndpoint> = expected
            .iter()
            .map(|(pod, ready, zones, nodes)| {
                let strings = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
                (pod.ip().to_string(), *ready, strings(zones), strings(nodes))
            })
            .collect();
        wanted.sort();
        eventually(
            &format!("{service}'s slices carry the expected hints"),
            CONVERGE,
            || {
                let seen = self.slice_endpoints(service)?;
                ensure!(
                    seen == wanted,
                    "expected {wanted:?}, the slices say {seen:?}"
                );
                Ok(())
            },
        )
        .with_context(|| self.logs())
    }

    /// Waits until traffic from each node to `cluster_ip` is answered, only and all, by the pods
    /// listed for that node (in node order).
    fn converge(&self, what: &str, cluster_ip: &str, per_node: [&[&Pod]; 5]) -> Result<()> {
        let url = format!("http://{cluster_ip}:80/");
        eventually(what, CONVERGE, || {
            for (node, pods) in self.nodes.iter().zip(per_node) {
                let wanted: BTreeSet<&str> = pods.iter().map(|pod| pod.name()).collect();
                expect_answers(&self.lab, node, &url, REQUESTS, &wanted)?;
            }
            Ok(())
        })
        .with_context(|| self.logs())
    }

    fn logs(&self) -> String {
        let mut text = self.control_plane.logs();
        for process in &self.processes {
            text.push_str(&process.log_tail(30));
        }
        text
    }
}

fn service(name: &str, cluster_ip: &str, distribution: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  clusterIP: {cluster_ip}
  trafficDistribution: {distribution}
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: web
"
    )
}

#[test]
fn traffic_follows_zone_and_node_hints_and_falls_back_when_they_cannot_be_trusted() -> Result<()> {
    let binaries = Binaries::ensure()?;
    let mut lab = Lab::new("topo")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let nodes = lab.add_nodes(5)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
    for (node, zone) in nodes.iter().zip(["zone-a", "zone-b", "zone-a", "", ""]) {
        if zone.is_empty() {
            control_plane.register_node(&lab, node)?;
        } else {
            control_plane.register_labelled_node(&lab, node, &[(ZONE_LABEL, zone)])?;
        }
    }
    control_plane.create_namespace(&lab, NAMESPACE)?;
    let mut pods = Vec::new();
    for (name, n) in [("web-a1", 1), ("web-b2", 2), ("web-a3", 3), ("web-x5", 5)] {
        let pod = lab.add_pod(&nodes[usize::from(n) - 1], name, addresses::pod_ip(n, 2))?;
        serve(&mut lab, &pod, name, POD_PORT)?;
        pods.push(pod);
    }
    let [a1, b2, a3, x5] = [&pods[0], &pods[1], &pods[2], &pods[3]];
    for pod in [a1, b2, a3] {
        control_plane.create_pod(&lab, NAMESPACE, pod, "web", POD_PORT, true)?;
    }
    control_plane.kubectl_apply(&lab, &service(ZONAL, ZONAL_IP, "PreferSameZone"))?;
    control_plane.kubectl_apply(&lab, &service(NEAR, NEAR_IP, "PreferSameNode"))?;

    // The controller reads as the admin here; tests/control_plane.rs proves the deploy/ RBAC.
    let mut processes =
        vec![control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?];
    for node in &nodes {
        processes.push(control_plane.start_agent(&mut lab, node)?);
    }
    let cluster = Cluster {
        lab,
        control_plane,
        nodes,
        processes,
    };

    // The EndpointSlice controller hints each ready endpoint for its own zone, and for
    // PreferSameNode for its own node as well.
    cluster.expect_slices(
        ZONAL,
        &[
            (a1, true, &["zone-a"], &[]),
            (b2, true, &["zone-b"], &[]),
            (a3, true, &["zone-a"], &[]),
        ],
    )?;
    cluster.expect_slices(
        NEAR,
        &[
            (a1, true, &["zone-a"], &["node-1"]),
            (b2, true, &["zone-b"], &["node-2"]),
            (a3, true, &["zone-a"], &["node-3"]),
        ],
    )?;
    // node-4 and node-5 have no zone label, so no hint is for them: they spread over every
    // ready endpoint.
    cluster.converge(
        "PreferSameZone keeps each zone's traffic in the zone",
        ZONAL_IP,
        [&[a1, a3], &[b2], &[a1, a3], &[a1, b2, a3], &[a1, b2, a3]],
    )?;
    cluster.converge(
        "PreferSameNode keeps each node's traffic on the node",
        NEAR_IP,
        [&[a1], &[b2], &[a3], &[a1, b2, a3], &[a1, b2, a3]],
    )?;

    // A zone label given to a node reaches its view: node-4 joins zone-b, and without an
    // endpoint of its own PreferSameNode falls back to the zone.
    cluster.kubectl(&["label", "node", "node-4", &format!("{ZONE_LABEL}=zone-b")])?;
    cluster.converge(
        "node-4 labelled zone-b uses zone-b's endpoint",
        ZONAL_IP,
        [&[a1, a3], &[b2], &[a1, a3], &[b2], &[a1, b2, a3]],
    )?;
    cluster.converge(
        "node-4 without an endpoint of its own uses its zone's for PreferSameNode",
        NEAR_IP,
        [&[a1], &[b2], &[a3], &[b2], &[a1, b2, a3]],
    )?;

    // zone-b's only endpoint stops being ready: the controller drops its hint, no ready endpoint
    // is hinted for zone-b, so zone-b's nodes ignore the hints and go cross-zone.
    cluster
        .control_plane
        .set_pod_ready(&cluster.lab, NAMESPACE, b2, false)?;
    cluster.expect_slices(
        ZONAL,
        &[
            (a1, true, &["zone-a"], &[]),
            (b2, false, &[], &[]),
            (a3, true, &["zone-a"], &[]),
        ],
    )?;
    cluster.converge(
        "zone-b falls back to zone-a when its endpoint is not ready",
        ZONAL_IP,
        [&[a1, a3], &[a1, a3], &[a1, a3], &[a1, a3], &[a1, a3]],
    )?;
    cluster.converge(
        "PreferSameNode falls back across zones for zone-b's nodes",
        NEAR_IP,
        [&[a1], &[a1, a3], &[a3], &[a1, a3], &[a1, a3]],
    )?;

    // All or nothing: a ready endpoint on a node without a zone (node-5) gets no zone hint, so
    // every node ignores the zone hints; the node hints are still complete, so PreferSameNode
    // still holds where a node has an endpoint.
    cluster
        .control_plane
        .create_pod(&cluster.lab, NAMESPACE, x5, "web", POD_PORT, true)?;
    cluster.expect_slices(
        ZONAL,
        &[
            (a1, true, &["zone-a"], &[]),
            (b2, false, &[], &[]),
            (a3, true, &["zone-a"], &[]),
            (x5, true, &[], &[]),
        ],
    )?;
    cluster.expect_slices(
        NEAR,
        &[
            (a1, true, &["zone-a"], &["node-1"]),
            (b2, false, &[], &[]),
            (a3, true, &["zone-a"], &["node-3"]),
            (x5, true, &[], &["node-5"]),
        ],
    )?;
    cluster.converge(
        "one endpoint without a zone hint makes every node ignore the zone hints",
        ZONAL_IP,
        [&[a1, a3, x5]; 5],
    )?;
    cluster.converge(
        "complete node hints still hold where the node has an endpoint",
        NEAR_IP,
        [&[a1], &[a1, a3, x5], &[a3], &[a1, a3, x5], &[x5]],
    )?;
    Ok(())
}
