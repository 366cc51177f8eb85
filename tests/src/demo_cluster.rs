//! The demo cluster: a control-plane host running `splitproxy-controller` on a manifests
//! directory, two nodes running `splitproxy-agent` in iptables mode, web pods answering with their
//! names, a client pod per node and an external client. Used by the end-to-end test and the demo.

use crate::{
    HitReport,
    addresses::{self, CONTROL_PLANE, EXTERNAL_CLIENT},
    bpffs::BpfFs,
    controller_metric, eventually, hit,
    lab::{HasNamespace, Host, Lab, Node, Pod, Process},
    pki::{self, ControllerTls},
    serve,
    testpod::hit_within,
    workspace_binary,
};
use anyhow::{Context, Result, ensure};
use splitproxy_dataplane::IpFamily;
use std::{
    collections::BTreeSet,
    fmt::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

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
/// The IPv6-only Service `demo/web6`'s cluster IP ([`DemoCluster::web6_yaml`]).
pub const WEB6_IP: &str = "fd00:10:96::20";
/// `demo/web6`'s node port.
pub const WEB6_NODE_PORT: u16 = 30620;
/// The port the controller listens on.
pub const CONTROLLER_PORT: u16 = 10660;
/// Where the controller serves its inspection, inside the control-plane host (its default).
pub const CONTROLLER_INSPECTION: &str = "127.0.0.1:10663";
/// The controller's static tokens file, in the credentials directory.
const TOKENS_FILE: &str = "agent-tokens.csv";

/// Gives every node a random token: `<node>.token` files and the controller's `token,node`
/// file, in `dir`.
/// Gives `node` a random token: `<node>.token` in `dir`, and a line in the controller's
/// `token,node` file there (which the controller reads again when it changes).
fn issue_token(dir: &Path, node: &str) -> Result<PathBuf> {
    let token = pki::random_token()?;
    let file = dir.join(format!("{node}.token"));
    std::fs::write(&file, &token).context("writing a node token")?;
    let mut tokens = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(TOKENS_FILE))
        .context("opening the tokens file")?;
    std::io::Write::write_all(&mut tokens, format!("{token},{node}\n").as_bytes())
        .context("writing the tokens file")?;
    Ok(file)
}
/// The longest wait for rules to converge; generous because CI machines are slow and shared.
pub const CONVERGE: Duration = Duration::from_secs(90);
/// How long a request waits for an answer when a drop is expected: long enough for an answer on
/// a loaded machine, short enough to keep tests quick.
pub const DROP_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// Environment added to the controller's and every agent's (e.g. `OTEL_*`).
    env: Vec<(String, String)>,
    /// The controller's TLS material, the static tokens file and each node's token file.
    credentials: tempfile::TempDir,
    tls: ControllerTls,
}

impl DemoCluster {
    /// Builds the topology, starts the web pods, writes the manifests (web-b not ready) and starts
    /// the controller and one agent per node.
    ///
    /// # Errors
    ///
    /// If the lab cannot be built or a binary is missing.
    pub fn start(tag: &str) -> Result<Self> {
        Self::start_with(tag, &[])
    }

    /// [`DemoCluster::start`], with `agent_flags` added to every agent's command line (e.g.
    /// `--cluster-cidr`, `--masquerade-all`).
    ///
    /// # Errors
    ///
    /// If the lab cannot be built or a binary is missing.
    pub fn start_with(tag: &str, agent_flags: &[&str]) -> Result<Self> {
        Self::start_with_env(tag, agent_flags, &[])
    }

    /// [`DemoCluster::start_with`], with `env` (name, value) in the controller's and every
    /// agent's environment, also when they are restarted later (e.g. the `OTEL_*` variables that
    /// switch trace export on).
    ///
    /// # Errors
    ///
    /// If the lab cannot be built or a binary is missing.
    pub fn start_with_env(tag: &str, agent_flags: &[&str], env: &[(&str, &str)]) -> Result<Self> {
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
        let credentials = tempfile::Builder::new()
            .prefix("splitproxy-credentials-")
            .tempdir()
            .context("creating the credentials directory")?;
        let tls = ControllerTls::generate(credentials.path(), control_plane.ip())?;
        for node in &nodes {
            issue_token(credentials.path(), node.name())?;
        }
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
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            credentials,
            tls,
        };
        cluster.write_manifests()?;
        cluster.start_controller()?;
        for i in 0..cluster.nodes.len() {
            let agent = cluster.start_agent(i, agent_flags)?;
            cluster.agents.push(agent);
        }
        Ok(cluster)
    }

    /// Starts an agent on the node at `index`, with `extra` flags after the usual ones (which
    /// may name another `--proxy-mode`).
    ///
    /// # Errors
    ///
    /// If the binary is missing or cannot be started.
    pub fn start_agent(&mut self, index: usize, extra: &[&str]) -> Result<Process> {
        let node = self.nodes.get(index).context("no such node")?.clone();
        let url = self.controller_url();
        let token = self.token_file(node.name()).to_string_lossy().into_owned();
        let tls = self.tls.agent_flags();
        let mut args = vec![
            "--controller",
            &url,
            "--hostname-override",
            node.name(),
            "--token-file",
            &token,
        ];
        // iptables mode unless `extra` names one.
        if !extra.contains(&"--proxy-mode") {
            args.extend(["--proxy-mode", "iptables"]);
        }
        args.extend(tls.iter().map(String::as_str));
        args.extend_from_slice(extra);
        self.lab.spawn_with_env(
            &node,
            workspace_binary("splitproxy-agent")?,
            &args,
            &self.env,
        )
    }

    /// Replaces the agent on the node at `index` with one started with `extra` flags; the rules
    /// stay in place meanwhile.
    ///
    /// # Errors
    ///
    /// If the old agent cannot be killed or the new one started.
    pub fn restart_agent(&mut self, index: usize, extra: &[&str]) -> Result<()> {
        let old = self.agents.get(index).context("no such agent")?.clone();
        self.lab.kill(&old)?;
        self.agents[index] = self.start_agent(index, extra)?;
        Ok(())
    }

    /// Restarts the agent on the node at `index` in ebpf mode: the node gets a lab cgroup (its
    /// processes and its pods' start there, [`Lab::node_cgroup`]) for the programs and a BPF
    /// filesystem for the pins, which the returned guard unmounts. Returns the guard and the
    /// agent flags, for later restarts.
    ///
    /// # Errors
    ///
    /// If the cgroup or the filesystem cannot be made, or the agent cannot be restarted.
    pub fn switch_to_ebpf(&mut self, index: usize) -> Result<(BpfFs, Vec<String>)> {
        let node = self.nodes.get(index).context("no such node")?.clone();
        let cgroup = self.lab.node_cgroup(&node)?;
        let bpffs = BpfFs::mount()?;
        let flags: Vec<String> = [
            "--proxy-mode",
            "ebpf",
            "--bpf-root",
            &bpffs.path().to_string_lossy(),
            "--cgroup-root",
            &cgroup.to_string_lossy(),
        ]
        .iter()
        .map(|flag| (*flag).to_owned())
        .collect();
        let words: Vec<&str> = flags.iter().map(String::as_str).collect();
        self.restart_agent(index, &words)?;
        Ok((bpffs, flags))
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
        format!("https://{}:{CONTROLLER_PORT}", self.control_plane.ip())
    }

    /// The controller's TLS material (the CA agents trust, the serving certificate).
    #[must_use]
    pub fn controller_tls(&self) -> &ControllerTls {
        &self.tls
    }

    /// Gives a node that is not part of the lab (a test client posing as an agent) a token the
    /// running controller accepts for it; returns the token file.
    ///
    /// # Errors
    ///
    /// If the files cannot be written.
    pub fn issue_token(&self, node: &str) -> Result<PathBuf> {
        issue_token(self.credentials.path(), node)
    }

    /// The file holding `node`'s token, which the controller's tokens file maps to `node`.
    #[must_use]
    pub fn token_file(&self, node: &str) -> PathBuf {
        self.credentials.path().join(format!("{node}.token"))
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
        let tokens = self
            .credentials
            .path()
            .join(TOKENS_FILE)
            .to_string_lossy()
            .into_owned();
        let tls = self.tls.controller_flags();
        let mut args = vec![
            "--manifests",
            &manifests,
            "--listen",
            &listen,
            "--agent-tokens-file",
            &tokens,
        ];
        args.extend(tls.iter().map(String::as_str));
        let controller = self.lab.spawn_with_env(
            &self.control_plane,
            workspace_binary("splitproxy-controller")?,
            &args,
            &self.env,
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

    /// Waits (up to [`CONVERGE`]) until all of `requests` requests from `from` to `url` are
    /// answered, by exactly the web pods `pods`.
    ///
    /// # Errors
    ///
    /// If that does not happen in time; the error holds the last report and the cluster's logs.
    pub fn expect_answers(
        &self,
        from: &(impl HasNamespace + ?Sized),
        url: &str,
        pods: &[&str],
        requests: u32,
    ) -> Result<()> {
        let expected: BTreeSet<&str> = pods.iter().copied().collect();
        eventually(&format!("{url} answers from {pods:?}"), CONVERGE, || {
            let report = hit(&self.lab, from, url, requests)?;
            let answered: BTreeSet<&str> = report.answers.keys().map(String::as_str).collect();
            ensure!(
                report.failures == 0 && answered == expected,
                "from {} to {url}: expected answers from exactly {expected:?}, got {report:?}",
                from.ns_name()
            );
            Ok(())
        })
        .with_context(|| self.logs())
    }

    /// Waits (up to [`CONVERGE`]) until requests from `from` to `url` go unanswered until they
    /// time out: dropped, neither answered nor refused. Each request waits [`DROP_TIMEOUT`].
    ///
    /// # Errors
    ///
    /// If that does not happen in time; the error holds the last report and the cluster's logs.
    pub fn expect_dropped(&self, from: &(impl HasNamespace + ?Sized), url: &str) -> Result<()> {
        eventually(&format!("{url} is dropped"), CONVERGE, || {
            let report = hit_within(&self.lab, from, url, 3, DROP_TIMEOUT)?;
            ensure!(
                report.answered() == 0 && report.errors.iter().all(|e| e.contains("timed out")),
                "from {} to {url}: expected 3 timeouts, got {report:?}",
                from.ns_name()
            );
            Ok(())
        })
        .with_context(|| self.logs())
    }

    /// Gives node `index` one more address, `ip`, on its loopback device, and routes it to that
    /// node from the external host.
    ///
    /// # Errors
    ///
    /// If `ip` fails.
    pub fn add_node_address(&self, index: usize, ip: &str) -> Result<()> {
        let node = &self.nodes[index];
        self.run(
            node,
            "ip",
            &["addr", "add", &format!("{ip}/32"), "dev", "lo"],
        )?;
        let via = node.ip().to_string();
        self.run(
            &self.external,
            "ip",
            &["route", "add", &format!("{ip}/32"), "via", &via],
        )?;
        Ok(())
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

    /// How many of `count` requests from node-1 to `http://ip:80/` were answered.
    ///
    /// # Errors
    ///
    /// If the client cannot run.
    pub fn answered(&self, ip: Ipv4Addr, count: u32) -> Result<u32> {
        let report = hit(
            &self.lab,
            &self.nodes[0],
            &format!("http://{ip}:80/"),
            count,
        )?;
        Ok(count - report.failures)
    }

    /// The value of one series (`name` or `name{labels}`) on the controller's `/metrics`;
    /// `None` while it does not export it.
    ///
    /// # Errors
    ///
    /// If the metrics cannot be fetched or the value does not parse.
    pub fn controller_metric(&self, series: &str) -> Result<Option<f64>> {
        controller_metric(&self.lab, &self.control_plane, series)
    }

    /// Writes (or replaces, by rename) one manifests file, for Services beyond `demo/web`.
    ///
    /// # Errors
    ///
    /// If the file cannot be written.
    pub fn write_manifest(&self, file: &str, yaml: &str) -> Result<()> {
        self.write_manifest_bytes(file, yaml.as_bytes())
    }

    /// [`DemoCluster::write_manifest`] with any bytes, e.g. a file that is not UTF-8.
    ///
    /// # Errors
    ///
    /// If the file cannot be written.
    pub fn write_manifest_bytes(&self, file: &str, bytes: &[u8]) -> Result<()> {
        let path = self.manifests.path().join(file);
        let temporary = self.manifests.path().join(format!(".{file}.tmp"));
        std::fs::write(&temporary, bytes).context("writing the manifests")?;
        std::fs::rename(&temporary, &path).context("replacing the manifests")?;
        Ok(())
    }

    /// An EndpointSlice for the Service `demo/<service>` whose port `http` is served by the web
    /// pods, as they are listed and ready now.
    #[must_use]
    pub fn endpoint_slice_yaml(&self, service: &str) -> String {
        self.endpoint_slice_yaml_for(service, IpFamily::V4, POD_PORT)
    }

    /// An EndpointSlice of `family` (`addressType: IPv4` or `IPv6`, the pods' addresses of that
    /// family) for the Service `demo/<service>` whose port `http` is served by the web pods on
    /// `port`, as they are listed and ready now. A dual-stack Service has one of each, as the
    /// EndpointSlice controller writes them.
    #[must_use]
    pub fn endpoint_slice_yaml_for(&self, service: &str, family: IpFamily, port: u16) -> String {
        let endpoints: Vec<(&Pod, Conditions)> = self
            .web
            .iter()
            .filter(|w| w.listed)
            .map(|w| (&w.pod, Conditions::ready(w.ready)))
            .collect();
        slice_yaml(service, family, "TCP", port, &endpoints)
    }

    /// `demo/web6`: an IPv6-only NodePort Service on [`WEB6_IP`] and [`WEB6_NODE_PORT`], port 80
    /// to the web pods' [`POD_PORT`], with one IPv6 EndpointSlice.
    #[must_use]
    pub fn web6_yaml(&self) -> String {
        format!(
            "apiVersion: v1
kind: Service
metadata:
  name: web6
  namespace: demo
spec:
  type: NodePort
  clusterIP: '{WEB6_IP}'
  clusterIPs: ['{WEB6_IP}']
  ipFamilies: [IPv6]
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: {POD_PORT}
    nodePort: {WEB6_NODE_PORT}
---
{}",
            self.endpoint_slice_yaml_for("web6", IpFamily::V6, POD_PORT)
        )
    }

    /// Writes `<name>.yaml`: the Service `demo/<name>` with port [`PortSpec::WEB`], `spec` and
    /// `status` (as in [`service_yaml`]), and its EndpointSlice listing the web pods named in
    /// `endpoints` with their conditions.
    ///
    /// # Errors
    ///
    /// If a name is not a web pod's or the manifest cannot be written.
    pub fn write_web_service(
        &self,
        name: &str,
        spec: &str,
        status: &str,
        endpoints: &[(&str, Conditions)],
    ) -> Result<()> {
        let endpoints = endpoints
            .iter()
            .map(|(pod, conditions)| Ok((self.web_pod(pod)?, *conditions)))
            .collect::<Result<Vec<_>>>()?;
        let yaml = service_yaml(name, spec, PortSpec::WEB, status)
            + &slice_yaml(name, IpFamily::V4, "TCP", POD_PORT, &endpoints);
        self.write_manifest(&format!("{name}.yaml"), &yaml)
    }

    /// The web pod called `name`.
    ///
    /// # Errors
    ///
    /// If there is none.
    pub fn web_pod(&self, name: &str) -> Result<&Pod> {
        self.web
            .iter()
            .map(|w| &w.pod)
            .find(|pod| pod.name() == name)
            .with_context(|| format!("no web pod {name}"))
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

/// An endpoint's conditions in an EndpointSlice (`ready`, `serving`, `terminating`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    /// Takes new connections.
    pub ready: bool,
    /// Still serving (true while a ready pod terminates).
    pub serving: bool,
    /// The pod is being deleted.
    pub terminating: bool,
}

impl Conditions {
    /// A running pod, ready or not (`serving` follows `ready`, as the API defaults it).
    #[must_use]
    pub const fn ready(ready: bool) -> Self {
        Self {
            ready,
            serving: ready,
            terminating: false,
        }
    }

    /// A terminating pod that still serves (`ready: false, serving: true, terminating: true`).
    pub const TERMINATING_SERVING: Self = Self {
        ready: false,
        serving: true,
        terminating: true,
    };

    /// A terminating pod that no longer serves.
    pub const TERMINATING_NOT_SERVING: Self = Self {
        ready: false,
        serving: false,
        terminating: true,
    };
}

/// An EndpointSlice for the Service `demo/<service>` with one port named `http` (`protocol`,
/// `port` on the pods), listing `endpoints` with their conditions.
#[must_use]
pub fn slice_yaml(
    service: &str,
    family: IpFamily,
    protocol: &str,
    port: u16,
    endpoints: &[(&Pod, Conditions)],
) -> String {
    let (namespace, _) = SERVICE.split_once('/').unwrap_or_default();
    let (suffix, address_type) = match family {
        IpFamily::V4 => ("x7k2p", "IPv4"),
        IpFamily::V6 => ("v6x7k", "IPv6"),
    };
    let mut yaml = format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-{suffix}
  namespace: {namespace}
  labels:
    kubernetes.io/service-name: {service}
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
addressType: {address_type}
ports:
- name: http
  protocol: {protocol}
  port: {port}
endpoints:
"
    );
    for (pod, c) in endpoints {
        let address = match family {
            IpFamily::V4 => pod.ip().to_string(),
            IpFamily::V6 => format!("'{}'", pod.ip6()),
        };
        yaml.push_str(&format!(
            "- addresses: [{address}]\n  conditions: {{ready: {}, serving: {}, terminating: {}}}\n  nodeName: {}\n  targetRef: {{kind: Pod, name: {}, namespace: {namespace}}}\n",
            c.ready,
            c.serving,
            c.terminating,
            pod.node_name(),
            pod.name()
        ));
    }
    yaml
}

/// The one port (named `http`) of a Service written by [`service_yaml`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: &'static str,
    /// The port on the cluster IP.
    pub port: u16,
    /// The port on the pods.
    pub target_port: u16,
    /// The node port, if any.
    pub node_port: Option<u16>,
}

impl PortSpec {
    /// TCP port 80 to the web pods' [`POD_PORT`], no node port.
    pub const WEB: Self = Self {
        protocol: "TCP",
        port: 80,
        target_port: POD_PORT,
        node_port: None,
    };
}

/// A Service `demo/<name>` with one port `port`; `spec` and `status` are YAML lines indented by
/// two spaces, put under `spec:` and `status:` (no `status:` when it is empty).
#[must_use]
pub fn service_yaml(name: &str, spec: &str, port: PortSpec, status: &str) -> String {
    let (namespace, _) = SERVICE.split_once('/').unwrap_or_default();
    let status = if status.is_empty() {
        String::new()
    } else {
        format!("status:\n{status}\n")
    };
    let PortSpec {
        protocol,
        port,
        target_port,
        node_port,
    } = port;
    let node_port = node_port.map_or_else(String::new, |p| format!("    nodePort: {p}\n"));
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {namespace}
spec:
{spec}
  ports:
  - name: http
    protocol: {protocol}
    port: {port}
    targetPort: {target_port}
{node_port}{status}---
"
    )
}
