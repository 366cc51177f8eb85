//! A real Kubernetes control plane inside a lab host: etcd, kube-apiserver and
//! kube-controller-manager (only its EndpointSlice and ServiceAccount controllers), built from the
//! official Go modules by `tests/controlplane/build-*.sh` and started on the host's loopback with
//! generated certificates and a static admin token. Driven with the real kubectl.
//!
//! There is no kubelet: tests create Node objects, create Pods with `nodeName` set, and set their
//! IP and `Ready` condition through the status subresource, so the real EndpointSlice controller
//! produces the slices.

use crate::{
    addresses::CONTROL_PLANE,
    lab::{Host, Lab, Node, Pod, Process},
    pki::{self, ControllerTls},
};
use anyhow::{Context, Result, ensure};
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// A selector-less Service `namespace/name` with port `http` 80 to `pod_port`, and the one
/// EndpointSlice that lists `ip` ready behind it: a Service whose endpoints a test moves by hand.
#[must_use]
pub fn one_endpoint_service_yaml(namespace: &str, name: &str, pod_port: u16, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  ports:\n  - {{name: http, port: 80, targetPort: {pod_port}}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: {namespace}\n  labels:\n    kubernetes.io/service-name: {name}\n    endpointslice.kubernetes.io/managed-by: splitproxy-e2e\n\
         addressType: IPv4\nports:\n- {{name: http, port: {pod_port}, protocol: TCP}}\nendpoints:\n- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n"
    )
}

/// The API server's port on the control-plane host.
pub const API_PORT: u16 = 6443;
/// The Service CIDR the API server allocates cluster IPs from.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The static admin token (group `system:masters`); test-only.
const ADMIN_TOKEN: &str = "splitproxy-e2e-admin";
/// The port splitproxy-controller serves node views on, on the control-plane host.
pub const CONTROLLER_PORT: u16 = 10660;
/// How long the API server may take to become ready on a slow, shared machine.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// The pinned binaries, as `tests/controlplane/build-*.sh` print them.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// Folder holding kube-apiserver, kube-controller-manager, kube-proxy and kubectl.
    pub kubernetes: PathBuf,
    /// Folder holding etcd.
    pub etcd: PathBuf,
}

impl Binaries {
    /// Builds the binaries if they are not cached yet (slow the first time) and returns where
    /// they are.
    ///
    /// # Errors
    ///
    /// If a build script fails.
    pub fn ensure() -> Result<Self> {
        Ok(Self {
            kubernetes: crate::built_tool("controlplane/build-kubernetes.sh")?,
            etcd: crate::built_tool("controlplane/build-etcd.sh")?,
        })
    }

    /// The path of `kubectl`.
    #[must_use]
    pub fn kubectl(&self) -> PathBuf {
        self.kubernetes.join("kubectl")
    }
}

/// A ClusterIP Service `namespace/name` on port 80 selecting the Pods labelled `app: web` on
/// their port named `web` (what [`ControlPlane::create_pod`] makes with app `web`).
#[must_use]
pub fn web_service_yaml(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {namespace}
spec:
  selector:
    app: web
  ports:
  - port: 80
    targetPort: web
"
    )
}

/// The controllers' Service in [`AGENT_NAMESPACE`] (`splitproxy-controller`, as `deploy/`
/// names it) and [`controller_slices_yaml`]'s EndpointSlices. No selector, so the
/// EndpointSlice controller leaves the slices alone.
#[must_use]
pub fn controller_service_yaml(ip: &str, ports: &[u16], ready: &[bool]) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {CONTROLLER_SERVICE}
  namespace: {AGENT_NAMESPACE}
spec:
  ports:
  - name: grpc
    port: 10660
---
{}",
        controller_slices_yaml(ip, ports, ready)
    )
}

/// One EndpointSlice of the controllers' Service per replica, all at `ip`: the replica on
/// `ports[i]` is ready when `ready[i]` is.
#[must_use]
pub fn controller_slices_yaml(ip: &str, ports: &[u16], ready: &[bool]) -> String {
    let slices: Vec<String> = ports
        .iter()
        .zip(ready)
        .map(|(port, ready)| {
            format!(
                "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {CONTROLLER_SERVICE}-{port}
  namespace: {AGENT_NAMESPACE}
  labels:
    kubernetes.io/service-name: {CONTROLLER_SERVICE}
addressType: IPv4
ports:
- name: grpc
  port: {port}
endpoints:
- addresses: [\"{ip}\"]
  conditions:
    ready: {ready}
"
            )
        })
        .collect();
    slices.join("---\n")
}

/// The controllers' Service, as `deploy/` names it.
pub const CONTROLLER_SERVICE: &str = "splitproxy-controller";

/// The controller URL the agent on `node` follows, as its inspection reports; fails while it
/// is not connected.
///
/// # Errors
///
/// If the inspection cannot be read, or the agent is not connected.
pub fn followed_controller(lab: &Lab, node: &Node) -> Result<String> {
    let state = lab.exec_ok(
        node,
        "grpcurl",
        &[
            "-plaintext",
            "127.0.0.1:10661",
            "splitproxy.v1alpha1.NodeInspectionService/GetNodeState",
        ],
    )?;
    let state: serde_json::Value = serde_json::from_str(&state)
        .with_context(|| format!("grpcurl printed no JSON: {state}"))?;
    anyhow::ensure!(
        state["connected"] == true,
        "{} is not connected: {state}",
        node.name()
    );
    Ok(state["controller"].as_str().unwrap_or_default().to_owned())
}

/// A running control plane on one lab host.
pub struct ControlPlane {
    host: Host,
    binaries: Binaries,
    dir: tempfile::TempDir,
    etcd: Process,
    apiserver: Option<Process>,
    /// Started once the API server is ready.
    controller_manager: Option<Process>,
    /// The controller's serving certificate and the CA agents trust.
    tls: ControllerTls,
}

/// The namespace and ServiceAccount of `deploy/`'s agents, whose Pod-bound tokens the
/// controller accepts by default.
pub const AGENT_NAMESPACE: &str = "splitproxy-system";
/// See [`AGENT_NAMESPACE`].
pub const AGENT_ACCOUNT: &str = "splitproxy-agent";
/// The audience the controller expects agents' tokens for by default.
pub const AGENT_AUDIENCE: &str = "splitproxy";

impl ControlPlane {
    /// Generates certificates and starts etcd, kube-apiserver and kube-controller-manager on
    /// `host`, waiting until the API server is ready.
    ///
    /// # Errors
    ///
    /// If a process cannot start or the API server does not become ready in time.
    pub fn start(lab: &mut Lab, host: &Host, binaries: Binaries) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("splitproxy-controlplane-")
            .tempdir()
            .context("creating the control-plane directory")?;
        write_credentials(dir.path(), host)?;
        let tls = ControllerTls::generate(dir.path(), host.ip())?;
        let etcd_data = dir.path().join("etcd");
        let etcd = lab.spawn(
            host,
            binaries.etcd.join("etcd"),
            &[
                "--data-dir",
                &path(&etcd_data),
                "--listen-client-urls",
                "http://127.0.0.1:2379",
                "--advertise-client-urls",
                "http://127.0.0.1:2379",
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-cluster",
                "default=http://127.0.0.1:2380",
                "--log-level",
                "warn",
            ],
        )?;
        let mut control_plane = Self {
            host: host.clone(),
            binaries,
            dir,
            etcd,
            apiserver: None,
            controller_manager: None,
            tls,
        };
        control_plane.start_apiserver(lab)?;
        // Only now: kube-controller-manager exits when the API server is not healthy within
        // 10 s of its start, which a loaded machine's API server can take.
        control_plane.controller_manager = Some(
            lab.spawn(
                host,
                control_plane
                    .binaries
                    .kubernetes
                    .join("kube-controller-manager"),
                &[
                    "--kubeconfig",
                    &path(&control_plane.dir.path().join("admin.kubeconfig")),
                    // The EndpointSlice controller makes the slices; the ServiceAccount controller
                    // makes each namespace's default account, which Pod admission needs.
                    "--controllers",
                    "endpointslice,serviceaccount",
                    "--leader-elect=false",
                    "--secure-port=0",
                    "--v=1",
                ],
            )?,
        );
        Ok(control_plane)
    }

    /// A lab tagged `tag` with the control plane on a host `cp` ([`CONTROL_PLANE`]), two nodes
    /// registered as Node objects, and `namespace` created: what the tests of the API server
    /// source start from.
    ///
    /// # Errors
    ///
    /// If the lab, the control plane or an object cannot be made.
    pub fn lab_with_two_nodes(tag: &str, namespace: &str) -> Result<(Lab, Host, Vec<Node>, Self)> {
        let binaries = Binaries::ensure()?;
        let mut lab = Lab::new(tag)?;
        let host = lab.add_host("cp", CONTROL_PLANE)?;
        let nodes = lab.add_nodes(2)?;
        let control_plane = Self::start(&mut lab, &host, binaries)?;
        for node in &nodes {
            control_plane.register_node(&lab, node)?;
        }
        control_plane.create_namespace(&lab, namespace)?;
        Ok((lab, host, nodes, control_plane))
    }

    /// Starts kube-apiserver and waits until it is ready.
    ///
    /// # Errors
    ///
    /// If it cannot start or does not become ready in time.
    pub fn start_apiserver(&mut self, lab: &mut Lab) -> Result<()> {
        let file = |name: &str| path(&self.dir.path().join(name));
        let apiserver = lab.spawn(
            &self.host,
            self.binaries.kubernetes.join("kube-apiserver"),
            &[
                "--etcd-servers=http://127.0.0.1:2379",
                &format!("--advertise-address={}", self.host.ip()),
                "--bind-address=0.0.0.0",
                &format!("--secure-port={API_PORT}"),
                &format!("--tls-cert-file={}", file("apiserver.crt")),
                &format!("--tls-private-key-file={}", file("apiserver.key")),
                &format!("--client-ca-file={}", file("ca.crt")),
                &format!("--token-auth-file={}", file("tokens.csv")),
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                &format!("--service-account-key-file={}", file("sa.pub")),
                &format!("--service-account-signing-key-file={}", file("sa.key")),
                &format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--allow-privileged=true",
                "--v=1",
            ],
        )?;
        self.apiserver = Some(apiserver);
        crate::eventually("the API server is ready", READY_TIMEOUT, || {
            let ready = self.kubectl(lab, &["get", "--raw", "/readyz"])?;
            ensure!(ready.trim() == "ok", "readyz said {ready:?}");
            Ok(())
        })
        .with_context(|| self.logs())
    }

    /// Starts splitproxy-controller on the control-plane host, reading the API server with
    /// `kubeconfig` and serving node views with TLS on [`CONTROLLER_PORT`].
    ///
    /// # Errors
    ///
    /// If the binary is missing or cannot start.
    pub fn start_controller(&self, lab: &mut Lab, kubeconfig: &Path) -> Result<Process> {
        self.start_controller_on(lab, kubeconfig, CONTROLLER_PORT)
    }

    /// [`start_controller`](Self::start_controller) serving node views on `port`, and on
    /// loopback `/metrics` on `port + 2` and its inspection on `port + 3` (10662 and 10663 for
    /// the default port, as the controller's defaults), so several replicas can run side by
    /// side on the control-plane host.
    ///
    /// # Errors
    ///
    /// If the binary is missing or cannot start.
    pub fn start_controller_on(
        &self,
        lab: &mut Lab,
        kubeconfig: &Path,
        port: u16,
    ) -> Result<Process> {
        self.start_controller_with_tls(lab, kubeconfig, port, &self.tls.controller_flags())
    }

    /// [`start_controller_on`](Self::start_controller_on) with `tls` for TLS flags instead of
    /// the [`controller_tls`](Self::controller_tls) certificate's.
    ///
    /// # Errors
    ///
    /// If the binary is missing or cannot start.
    pub fn start_controller_with_tls(
        &self,
        lab: &mut Lab,
        kubeconfig: &Path,
        port: u16,
        tls: &[String],
    ) -> Result<Process> {
        let mut args = vec![
            "--kubeconfig".to_owned(),
            path(kubeconfig),
            "--listen".to_owned(),
            format!("{}:{port}", self.host.ip()),
            "--metrics-bind-address".to_owned(),
            format!("127.0.0.1:{}", port + 2),
            "--inspection-bind-address".to_owned(),
            format!("127.0.0.1:{}", port + 3),
        ];
        args.extend_from_slice(tls);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lab.spawn(
            &self.host,
            crate::workspace_binary("splitproxy-controller")?,
            &args,
        )
    }

    /// The URL agents reach a controller on `port` of the control-plane host with.
    #[must_use]
    pub fn controller_url(&self, port: u16) -> String {
        format!("https://{}:{port}", self.host.ip())
    }

    /// The host the control plane runs on.
    #[must_use]
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The key the API server signs ServiceAccount tokens with.
    #[must_use]
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.path().join("sa.key")
    }

    /// The controller's TLS material.
    #[must_use]
    pub fn controller_tls(&self) -> &ControllerTls {
        &self.tls
    }

    /// Starts splitproxy-agent on `node`, following the controller
    /// [`start_controller`](Self::start_controller) started.
    ///
    /// # Errors
    ///
    /// If the token cannot be issued, or the binary is missing or cannot start.
    pub fn start_agent(&self, lab: &mut Lab, node: &Node) -> Result<Process> {
        self.start_agent_with(lab, node, &[])
    }

    /// [`start_agent`](Self::start_agent) with `extra` flags appended (such as `--proxy-mode`).
    ///
    /// # Errors
    ///
    /// If the token cannot be issued, or the binary is missing or cannot start.
    pub fn start_agent_with(&self, lab: &mut Lab, node: &Node, extra: &[&str]) -> Result<Process> {
        self.start_agent_with_env(lab, node, extra, &[])
    }

    /// [`start_agent_with`](Self::start_agent_with) with `env` added to the agent's environment.
    ///
    /// # Errors
    ///
    /// If the token cannot be issued, or the binary is missing or cannot start.
    pub fn start_agent_with_env(
        &self,
        lab: &mut Lab,
        node: &Node,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Result<Process> {
        let token = self.agent_token(lab, node.name())?;
        let controllers = [self.controller_url(CONTROLLER_PORT)];
        self.spawn_agent(lab, node, &controllers, &token, extra, env)
    }

    /// Starts splitproxy-agent on `node`, listing `controllers` (URLs, tried in turn) as
    /// controller replicas, trusting their CA and presenting a token bound to an agent Pod on
    /// `node` (see [`agent_token`](Self::agent_token)).
    ///
    /// # Errors
    ///
    /// If the token cannot be issued, or the binary is missing or cannot start.
    pub fn start_agent_following(
        &self,
        lab: &mut Lab,
        node: &Node,
        controllers: &[String],
    ) -> Result<Process> {
        let token = self.agent_token(lab, node.name())?;
        self.start_agent_with_token(lab, node, controllers, &token)
    }

    /// [`start_agent_following`](Self::start_agent_following) with a token file issued
    /// beforehand by [`agent_token`](Self::agent_token), so starting needs no API calls.
    ///
    /// # Errors
    ///
    /// If the binary is missing or cannot start.
    pub fn start_agent_with_token(
        &self,
        lab: &mut Lab,
        node: &Node,
        controllers: &[String],
        token: &Path,
    ) -> Result<Process> {
        self.spawn_agent(lab, node, controllers, token, &[], &[])
    }

    fn spawn_agent(
        &self,
        lab: &mut Lab,
        node: &Node,
        controllers: &[String],
        token: &Path,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Result<Process> {
        let token = path(token);
        let tls = self.tls.agent_flags();
        let mut args = Vec::new();
        for url in controllers {
            args.extend(["--controller", url.as_str()]);
        }
        args.extend(["--hostname-override", node.name(), "--token-file", &token]);
        args.extend(tls.iter().map(String::as_str));
        args.extend_from_slice(extra);
        lab.spawn_with_env(
            node,
            crate::workspace_binary("splitproxy-agent")?,
            &args,
            env,
        )
    }

    /// Issues the token an agent on node `node_name` presents, as the kubelet does for the
    /// DaemonSet's projected volume: a Pod `splitproxy-agent-<node>` of the agents'
    /// ServiceAccount is created on that node, and a token for the controller's audience is
    /// requested bound to it (TokenRequest), so the API server vouches for the node. Returns the
    /// token file's path.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn agent_token(&self, lab: &Lab, node_name: &str) -> Result<PathBuf> {
        let pod = format!("{AGENT_ACCOUNT}-{node_name}");
        self.kubectl_apply(
            lab,
            &format!(
                "apiVersion: v1
kind: Namespace
metadata:
  name: {AGENT_NAMESPACE}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {AGENT_ACCOUNT}
  namespace: {AGENT_NAMESPACE}
automountServiceAccountToken: false
---
apiVersion: v1
kind: Pod
metadata:
  name: {pod}
  namespace: {AGENT_NAMESPACE}
spec:
  nodeName: {node_name}
  serviceAccountName: {AGENT_ACCOUNT}
  automountServiceAccountToken: false
  containers:
  - name: agent
    image: registry.invalid/splitproxy-agent:e2e
"
            ),
        )?;
        let token = self.kubectl(
            lab,
            &[
                "-n",
                AGENT_NAMESPACE,
                "create",
                "token",
                AGENT_ACCOUNT,
                "--bound-object-kind=Pod",
                &format!("--bound-object-name={pod}"),
                &format!("--audience={AGENT_AUDIENCE}"),
                "--duration=2h",
            ],
        )?;
        let file = self.dir.path().join(format!("agent-{node_name}.token"));
        std::fs::write(&file, token.trim()).context("writing the agent token")?;
        Ok(file)
    }

    /// Kills kube-apiserver (SIGKILL), as a crash would.
    ///
    /// # Errors
    ///
    /// If the process cannot be killed.
    pub fn kill_apiserver(&mut self, lab: &mut Lab) -> Result<()> {
        if let Some(apiserver) = self.apiserver.take() {
            lab.kill(&apiserver)?;
        }
        Ok(())
    }

    /// Runs kubectl as the cluster admin on the control-plane host and returns its output.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn kubectl(&self, lab: &Lab, args: &[&str]) -> Result<String> {
        let kubeconfig = format!("--kubeconfig={}", path(&self.admin_kubeconfig()));
        let mut all = vec![kubeconfig.as_str()];
        all.extend_from_slice(args);
        lab.exec_ok(&self.host, self.binaries.kubectl(), &all)
    }

    /// Creates `namespace` and waits for the ServiceAccount controller's `default` account in it:
    /// until that exists the API server's admission refuses every Pod of the namespace.
    ///
    /// # Errors
    ///
    /// If kubectl fails or the account does not appear in time.
    pub fn create_namespace(&self, lab: &Lab, namespace: &str) -> Result<()> {
        self.kubectl(lab, &["create", "namespace", namespace])?;
        crate::eventually(
            &format!("the default ServiceAccount of {namespace}"),
            READY_TIMEOUT,
            || self.kubectl(lab, &["-n", namespace, "get", "serviceaccount", "default"]),
        )
        .with_context(|| self.logs())?;
        Ok(())
    }

    /// The cluster IP of the Service `namespace/name`, as the API server allocated it.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn cluster_ip(&self, lab: &Lab, namespace: &str, name: &str) -> Result<String> {
        let args = ["-n", namespace, "get", "service", name];
        let mut all = args.to_vec();
        all.push("-o=jsonpath={.spec.clusterIP}");
        Ok(self.kubectl(lab, &all)?.trim().to_owned())
    }

    /// Runs kubectl with `stdin` as input (for `apply -f -`).
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn kubectl_apply(&self, lab: &Lab, yaml: &str) -> Result<String> {
        let input = self.dir.path().join("apply.yaml");
        std::fs::write(&input, yaml).context("writing the objects to apply")?;
        self.kubectl(lab, &["apply", "-f", &path(&input)])
    }

    /// Registers `node` as a Node object (Ready, with its LAN addresses of both families), as a
    /// kubelet of a dual-stack node would.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn register_node(&self, lab: &Lab, node: &Node) -> Result<()> {
        self.register_labelled_node(lab, node, &[])
    }

    /// [`register_node`](Self::register_node) with extra labels, such as
    /// `topology.kubernetes.io/zone`, which a kubelet takes from its cloud provider or flags.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn register_labelled_node(
        &self,
        lab: &Lab,
        node: &Node,
        labels: &[(&str, &str)],
    ) -> Result<()> {
        let extra: String = labels
            .iter()
            .map(|(key, value)| format!("    {key}: {value:?}\n"))
            .collect();
        self.kubectl_apply(
            lab,
            &format!(
                "apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels:
    kubernetes.io/hostname: {name}
{extra}spec:
  podCIDR: {cidr}
  podCIDRs: [{cidr}]
",
                name = node.name(),
                cidr = node.pod_cidr()
            ),
        )?;
        self.kubectl(
            lab,
            &[
                "patch",
                "node",
                node.name(),
                "--subresource=status",
                "--type=merge",
                "-p",
                &format!(
                    r#"{{"status":{{"addresses":[{{"type":"InternalIP","address":"{}"}},{{"type":"InternalIP","address":"{}"}}],"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady","message":"e2e"}}]}}}}"#,
                    node.ip(),
                    node.ip6()
                ),
            ],
        )?;
        Ok(())
    }

    /// Creates the Pod for a lab pod: bound to its node, labelled `app: <app>`, with a container
    /// port named `web` on `port`, and its IP and readiness set through the status subresource.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn create_pod(
        &self,
        lab: &Lab,
        namespace: &str,
        pod: &Pod,
        app: &str,
        port: u16,
        ready: bool,
    ) -> Result<()> {
        self.kubectl_apply(
            lab,
            &format!(
                "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  labels:
    app: {app}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  containers:
  - name: web
    image: registry.invalid/sp-testpod:e2e
    ports:
    - name: web
      containerPort: {port}
",
                name = pod.name(),
                node = pod.node_name()
            ),
        )?;
        self.set_pod_ready(lab, namespace, pod, ready)
    }

    /// Sets a Pod's status: running at its lab IP, `Ready` as given.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn set_pod_ready(&self, lab: &Lab, namespace: &str, pod: &Pod, ready: bool) -> Result<()> {
        let status = if ready { "True" } else { "False" };
        self.kubectl(
            lab,
            &[
                "-n",
                namespace,
                "patch",
                "pod",
                pod.name(),
                "--subresource=status",
                "--type=merge",
                "-p",
                &format!(
                    r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"conditions":[{{"type":"Ready","status":"{status}"}},{{"type":"ContainersReady","status":"{status}"}}]}}}}"#,
                    ip = pod.ip()
                ),
            ],
        )?;
        Ok(())
    }

    /// The admin kubeconfig (server `https://127.0.0.1:6443` on the control-plane host).
    #[must_use]
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// Writes an admin kubeconfig reaching the API server at the control-plane host's LAN
    /// address, for clients on the nodes (upstream kube-proxies in benchmarks), and returns its
    /// path.
    ///
    /// # Errors
    ///
    /// If it cannot be written.
    pub fn lan_admin_kubeconfig(&self) -> Result<PathBuf> {
        let file = self.dir.path().join("admin-lan.kubeconfig");
        let server = format!("https://{}:{API_PORT}", self.host.ip());
        std::fs::write(
            &file,
            kubeconfig(&server, &self.dir.path().join("ca.crt"), ADMIN_TOKEN),
        )
        .context("writing the LAN admin kubeconfig")?;
        Ok(file)
    }

    /// Writes a kubeconfig for `token` next to the admin one and returns its path.
    ///
    /// # Errors
    ///
    /// If it cannot be written.
    pub fn kubeconfig_for_token(&self, name: &str, token: &str) -> Result<PathBuf> {
        let file = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(
            &file,
            kubeconfig(&loopback_server(), &self.dir.path().join("ca.crt"), token),
        )
        .context("writing a kubeconfig")?;
        Ok(file)
    }

    /// Starts upstream kube-proxy of the same release on `node` in `mode` (`iptables`, …), as
    /// the cluster admin, with `/metrics` on `127.0.0.1:10249` inside the node as the agent's.
    /// It leaves the host's conntrack settings alone (they are not per namespace).
    ///
    /// # Errors
    ///
    /// If the kubeconfig cannot be written or kube-proxy cannot start.
    pub fn start_kube_proxy(&self, lab: &mut Lab, node: &Node, mode: &str) -> Result<Process> {
        self.start_kube_proxy_with(lab, node, mode, &[], &[])
    }

    /// [`start_kube_proxy`](Self::start_kube_proxy) with `extra` flags appended and `env` added to
    /// its environment (a `PATH` choosing the iptables backend, say).
    ///
    /// # Errors
    ///
    /// If the kubeconfig cannot be written or kube-proxy cannot start.
    pub fn start_kube_proxy_with(
        &self,
        lab: &mut Lab,
        node: &Node,
        mode: &str,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Result<Process> {
        let kubeconfig = path(&self.lan_admin_kubeconfig()?);
        let mode = format!("--proxy-mode={mode}");
        let mut args = vec![
            "--kubeconfig",
            &kubeconfig,
            "--hostname-override",
            node.name(),
            &mode,
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--v=1",
        ];
        args.extend_from_slice(extra);
        lab.spawn_with_env(
            node,
            self.binaries.kubernetes.join("kube-proxy"),
            &args,
            env,
        )
    }

    /// The API server's own metrics (Prometheus text).
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn metrics(&self, lab: &Lab) -> Result<String> {
        self.kubectl(lab, &["get", "--raw", "/metrics"])
    }

    /// The control-plane processes' logs, for failure messages.
    #[must_use]
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for process in [
            Some(&self.etcd),
            self.apiserver.as_ref(),
            self.controller_manager.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            text.push_str(&process.log_tail(40));
        }
        text
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A CA, the API server's serving certificate, the service-account key pair, the token file and
/// the admin kubeconfig.
fn write_credentials(dir: &Path, host: &Host) -> Result<()> {
    let f = |name: &str| path(&dir.join(name));
    let ca = pki::write_ca(dir, "ca")?;
    pki::write_signed(
        dir,
        "apiserver",
        &ca,
        &format!(
            "IP:127.0.0.1,IP:{},IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc",
            host.ip()
        ),
    )?;
    pki::openssl(&["genrsa", "-out", &f("sa.key"), "2048"])?;
    pki::openssl(&["rsa", "-in", &f("sa.key"), "-pubout", "-out", &f("sa.pub")])?;
    std::fs::write(
        dir.join("tokens.csv"),
        format!("{ADMIN_TOKEN},admin,admin,system:masters\n"),
    )
    .context("writing the token file")?;
    std::fs::write(
        dir.join("admin.kubeconfig"),
        kubeconfig(&loopback_server(), &dir.join("ca.crt"), ADMIN_TOKEN),
    )
    .context("writing the admin kubeconfig")?;
    Ok(())
}

/// The API server as clients on the control-plane host itself reach it.
fn loopback_server() -> String {
    format!("https://127.0.0.1:{API_PORT}")
}

/// A kubeconfig for `server`, trusting `ca`, presenting `token`.
fn kubeconfig(server: &str, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: {server}
    certificate-authority: {}
users:
- name: user
  user:
    token: {token}
contexts:
- name: e2e
  context: {{cluster: e2e, user: user}}
current-context: e2e
",
        ca.display()
    )
}
