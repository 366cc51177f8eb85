//! The demo cluster: a control-plane host running `splitproxy-controller` on a manifests
//! directory, two nodes running `splitproxy-agent` in iptables mode, web pods answering with their
//! names, a client pod per node and an external client. Used by the end-to-end test and the demo.

use crate::{
    HitReport,
    addresses::{self, CONTROL_PLANE, EXTERNAL_CLIENT},
    hit,
    lab::{HasNamespace, Host, Lab, Node, Pod, Process},
    serve, workspace_binary,
};
use anyhow::{Context, Result, ensure};
use std::{collections::BTreeSet, fmt::Write as _, net::Ipv4Addr, path::Path};

/// The web Service's namespace and name.
pub const SERVICE: &str = "demo/web";
/// The web Service's cluster IP.
pub const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The web Service's port on the cluster IP.
pub const SERVICE_PORT: u16 = 80;
/// The web Service's node port.
pub const NODE_PORT: u16 = 30080;
/// The port the web pods listen on (the Service's named target port `web`).
pub const POD_PORT: u16 = 8080;
/// The port the controller listens on.
pub const CONTROLLER_PORT: u16 = 10660;

/// Who answered the requests from one place to one URL.
#[derive(Debug, Clone)]
pub struct Observation {
    /// Where the requests came from (a namespace's short description).
    pub from: String,
    /// Where they went.
    pub url: String,
    /// Who answered.
    pub report: HitReport,
}

/// One web pod and whether its endpoint is ready.
#[derive(Debug, Clone)]
pub struct WebPod {
    /// The pod.
    pub pod: Pod,
    /// Whether the EndpointSlice lists it at all.
    pub listed: bool,
    /// Whether the EndpointSlice lists it as ready.
    pub ready: bool,
}

/// The running demo cluster; dropping it stops every process and removes every namespace.
pub struct DemoCluster {
    /// The lab holding it all.
    pub lab: Lab,
    /// The control-plane host.
    pub control_plane: Host,
    /// A host on the node LAN outside the cluster.
    pub external: Host,
    /// The two nodes.
    pub nodes: Vec<Node>,
    /// One client pod per node, in node order.
    pub clients: Vec<Pod>,
    /// The web pods: `web-a` on node-1, `web-b` and `web-c` on node-2.
    pub web: Vec<WebPod>,
    /// The controller process, while running.
    pub controller: Option<Process>,
    /// The agent processes, in node order.
    pub agents: Vec<Process>,
    manifests: tempfile::TempDir,
}

impl DemoCluster {
    /// Builds the topology, starts the web pods, writes the manifests (web-b not ready) and starts
    /// the controller and one agent per node.
    ///
    /// # Errors
    ///
    /// If the lab cannot be built or a binary is missing.
    pub fn start(tag: &str) -> Result<Self> {
        let mut lab = Lab::new(tag)?;
        let control_plane = lab.add_host("cp", CONTROL_PLANE)?;
        let external = lab.add_host("ext", EXTERNAL_CLIENT)?;
        let nodes = lab.add_nodes(2)?;
        let mut web = Vec::new();
        for (name, node, host, ready) in [
            ("web-a", 0, 2, true),
            ("web-b", 1, 2, false),
            ("web-c", 1, 3, true),
        ] {
            let n = u8::try_from(node + 1).context("node number")?;
            let pod = lab.add_pod(&nodes[node], name, addresses::pod_ip(n, host))?;
            serve(&mut lab, &pod, name, POD_PORT)?;
            web.push(WebPod {
                pod,
                listed: true,
                ready,
            });
        }
        let mut clients = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let n = u8::try_from(i + 1).context("node number")?;
            clients.push(lab.add_pod(node, &format!("client-{n}"), addresses::pod_ip(n, 10))?);
        }
        let manifests = tempfile::Builder::new()
            .prefix("splitproxy-manifests-")
            .tempdir()
            .context("creating the manifests directory")?;
        let mut cluster = Self {
            lab,
            control_plane,
            external,
            nodes,
            clients,
            web,
            controller: None,
            agents: Vec::new(),
            manifests,
        };
        cluster.write_manifests()?;
        cluster.start_controller()?;
        for i in 0..cluster.nodes.len() {
            let node = cluster.nodes[i].clone();
            let agent = cluster.lab.spawn(
                &node,
                workspace_binary("splitproxy-agent")?,
                &[
                    "--controller",
                    &cluster.controller_url(),
                    "--hostname-override",
                    node.name(),
                    "--proxy-mode",
                    "iptables",
                ],
            )?;
            cluster.agents.push(agent);
        }
        Ok(cluster)
    }

    /// The controller's and agents' logs, for failure messages.
    #[must_use]
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for process in self.controller.iter().chain(&self.agents) {
            text.push_str(&format!(
                "--- {}\n{}\n",
                process.log_path().display(),
                process.log()
            ));
        }
        text
    }

    /// The URL agents reach the controller at.
    #[must_use]
    pub fn controller_url(&self) -> String {
        format!("http://{}:{CONTROLLER_PORT}", self.control_plane.ip())
    }

    /// The manifests directory the controller serves.
    #[must_use]
    pub fn manifests_dir(&self) -> &Path {
        self.manifests.path()
    }

    /// Starts the controller on the control-plane host.
    ///
    /// # Errors
    ///
    /// If the binary is missing or cannot start.
    pub fn start_controller(&mut self) -> Result<()> {
        let listen = format!("{}:{CONTROLLER_PORT}", self.control_plane.ip());
        let manifests = self.manifests.path().to_string_lossy().into_owned();
        let controller = self.lab.spawn(
            &self.control_plane,
            workspace_binary("splitproxy-controller")?,
            &["--manifests", &manifests, "--listen", &listen],
        )?;
        self.controller = Some(controller);
        Ok(())
    }

    /// Kills the controller (SIGKILL), as a crash would.
    ///
    /// # Errors
    ///
    /// If the process cannot be killed.
    pub fn kill_controller(&mut self) -> Result<()> {
        if let Some(controller) = self.controller.take() {
            self.lab.kill(&controller)?;
        }
        Ok(())
    }

    /// Sets which web pods the EndpointSlice lists and which of those are ready, and rewrites the manifests (by rename, as editors
    /// and `kubectl get -o yaml > file` pipelines that write a temporary file do).
    ///
    /// # Errors
    ///
    /// If the manifests cannot be written.
    pub fn set_web(&mut self, pods: &[(&str, bool)]) -> Result<()> {
        for web in &mut self.web {
            let entry = pods.iter().find(|(name, _)| *name == web.pod.name());
            web.listed = entry.is_some();
            web.ready = entry.is_some_and(|(_, ready)| *ready);
        }
        self.write_manifests()
    }

    /// The names of the web pods whose endpoints are ready.
    #[must_use]
    pub fn ready_web(&self) -> Vec<String> {
        self.web
            .iter()
            .filter(|w| w.listed && w.ready)
            .map(|w| w.pod.name().to_owned())
            .collect()
    }

    /// The URL of the Service's cluster IP.
    #[must_use]
    pub fn cluster_ip_url() -> String {
        format!("http://{CLUSTER_IP}:{SERVICE_PORT}/")
    }

    /// The URL of the Service's node port on `node`.
    #[must_use]
    pub fn node_port_url(node: &Node) -> String {
        format!("http://{}:{NODE_PORT}/", node.ip())
    }

    /// Sends `requests` requests to the cluster IP from every node and every client pod, and to
    /// every node's node port from the external host.
    ///
    /// # Errors
    ///
    /// If a client cannot run (failed requests are counted in the reports, not errors).
    pub fn observe(&self, requests: u32) -> Result<Vec<Observation>> {
        let cluster_ip = Self::cluster_ip_url();
        let mut observations = Vec::new();
        let mut record = |from: String, ns: &dyn HasNamespace, url: &str| -> Result<()> {
            let report = hit(&self.lab, ns, url, requests)?;
            observations.push(Observation {
                from,
                url: url.to_owned(),
                report,
            });
            Ok(())
        };
        for node in &self.nodes {
            record(format!("{} (the node)", node.name()), node, &cluster_ip)?;
        }
        for client in &self.clients {
            let from = format!("{} (a pod on {})", client.name(), client.node_name());
            record(from, client, &cluster_ip)?;
        }
        for node in &self.nodes {
            let from = format!("{} (outside the cluster)", self.external.name());
            record(from, &self.external, &Self::node_port_url(node))?;
        }
        Ok(observations)
    }

    /// [`DemoCluster::observe`], failing unless every request was answered, only by the ready
    /// web pods, and each of those answered at least once from every place.
    ///
    /// # Errors
    ///
    /// On any failed request, an answer from a pod that is not ready, or a ready pod not reached.
    pub fn check_traffic(&self, requests: u32) -> Result<Vec<Observation>> {
        let ready = self.ready_web();
        let wanted: BTreeSet<&str> = ready.iter().map(String::as_str).collect();
        let observations = self.observe(requests)?;
        for o in &observations {
            let answered: BTreeSet<&str> = o.report.answers.keys().map(String::as_str).collect();
            ensure!(
                o.report.failures == 0 && answered == wanted,
                "from {} to {}: expected answers from exactly {wanted:?} with no failures, got {:?}",
                o.from,
                o.url,
                o.report
            );
        }
        Ok(observations)
    }

    /// Runs a command in `ns` and returns its standard output, failing on a non-zero exit.
    ///
    /// # Errors
    ///
    /// If the command fails.
    pub fn run(
        &self,
        ns: &(impl HasNamespace + ?Sized),
        program: &str,
        args: &[&str],
    ) -> Result<String> {
        self.lab.exec_ok(ns, program, args)
    }

    fn write_manifests(&self) -> Result<()> {
        self.write_manifest("web.yaml", &self.manifests_yaml()?)
    }

    /// Writes (or replaces, by rename) one manifests file, for Services beyond `demo/web`.
    ///
    /// # Errors
    ///
    /// If the file cannot be written.
    pub fn write_manifest(&self, file: &str, yaml: &str) -> Result<()> {
        let path = self.manifests.path().join(file);
        let temporary = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&temporary, yaml).context("writing the manifests")?;
        std::fs::rename(&temporary, &path).context("replacing the manifests")?;
        Ok(())
    }

    /// An EndpointSlice for the Service `demo/<service>` whose port `http` is served by the web
    /// pods, as they are listed and ready now.
    #[must_use]
    pub fn endpoint_slice_yaml(&self, service: &str) -> String {
        let (namespace, _) = SERVICE.split_once('/').unwrap_or_default();
        let mut yaml = format!(
            "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-x7k2p
  namespace: {namespace}
  labels:
    kubernetes.io/service-name: {service}
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: {POD_PORT}
endpoints:
"
        );
        for web in self.web.iter().filter(|w| w.listed) {
            yaml.push_str(&format!(
                "- addresses: [{}]\n  conditions: {{ready: {}}}\n  nodeName: {}\n  targetRef: {{kind: Pod, name: {}, namespace: {namespace}}}\n",
                web.pod.ip(),
                web.ready,
                web.pod.node_name(),
                web.pod.name()
            ));
        }
        yaml
    }

    /// The cluster as `kubectl get -o yaml` would print it: the Nodes, the Service with a named
    /// target port, and its EndpointSlice.
    fn manifests_yaml(&self) -> Result<String> {
        let mut yaml = String::new();
        for node in &self.nodes {
            writeln!(
                yaml,
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {}\nstatus:\n  addresses:\n  - type: InternalIP\n    address: {}\n---",
                node.name(),
                node.ip()
            )?;
        }
        let (namespace, name) = SERVICE.split_once('/').context("service key")?;
        write!(
            yaml,
            "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {namespace}
spec:
  type: NodePort
  clusterIP: {CLUSTER_IP}
  clusterIPs: [{CLUSTER_IP}]
  selector:
    app: web
  ports:
  - name: http
    protocol: TCP
    port: {SERVICE_PORT}
    targetPort: web
    nodePort: {NODE_PORT}
---
"
        )?;
        yaml.push_str(&self.endpoint_slice_yaml(name));
        Ok(yaml)
    }
}
