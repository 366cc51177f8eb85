//! The real cluster of `tests/cluster/` (`scripts/cluster.sh`): a control plane and four kubelet
//! nodes with containerd in network namespaces, every image built here. Tests drive it with
//! kubectl as the cluster admin, and reach into a node's namespaces for what only a node sees
//! (its rules).

use anyhow::{Context, Result, bail, ensure};
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

/// The nodes, as `tests/cluster/lib/common.sh` names them.
pub const NODES: [&str; 4] = ["cp-1", "cp-2", "worker-1", "worker-2"];
/// The nodes that take ordinary workloads (the control-plane nodes are tainted).
pub const WORKERS: [&str; 2] = ["worker-1", "worker-2"];
/// The cluster DNS Service's IP (`kube-dns`).
pub const DNS_SERVICE_IP: &str = "10.96.0.10";
/// The `kubernetes` Service's IP.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The namespace `deploy/` installs splitproxy in.
pub const SPLITPROXY_NAMESPACE: &str = "splitproxy-system";

/// A Service proxy `scripts/cluster.sh install` puts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxy {
    /// splitproxy from `deploy/`, agents in iptables mode.
    SplitproxyIptables,
    /// splitproxy from `deploy/`, agents in nftables mode.
    SplitproxyNftables,
    /// splitproxy from `deploy/ebpf/`, agents in ebpf mode; over another splitproxy mode, the
    /// agents switch to it as a rolling update.
    SplitproxyEbpf,
    /// Upstream kube-proxy as kubeadm installs it (iptables mode).
    KubeProxy,
    /// kube-proxy (installed first if it is not) turned into splitproxy in place by
    /// `deploy/migrate-from-kube-proxy`.
    SplitproxyMigrated,
}

impl Proxy {
    /// The name `cluster.sh install` takes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::SplitproxyIptables => "splitproxy-iptables",
            Self::SplitproxyNftables => "splitproxy-nftables",
            Self::SplitproxyEbpf => "splitproxy-ebpf",
            Self::KubeProxy => "kube-proxy",
            Self::SplitproxyMigrated => "splitproxy-migrated",
        }
    }
}

/// The running lab cluster.
pub struct RealCluster {
    kubeconfig: PathBuf,
    kubectl: PathBuf,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `scripts/cluster.sh args`, its progress on stderr; returns its last stdout line.
fn cluster_sh(args: &[&str]) -> Result<String> {
    let output = Command::new(repo().join("scripts/cluster.sh"))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running scripts/cluster.sh {}", args.join(" ")))?;
    ensure!(
        output.status.success(),
        "scripts/cluster.sh {} failed with {}",
        args.join(" "),
        output.status
    );
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_owned())
}

impl RealCluster {
    /// A new cluster: whatever ran before is removed first, so no state of an earlier run (or
    /// proxy) is left. Slow: four kubelets register and the images are imported.
    ///
    /// # Errors
    ///
    /// If the cluster cannot be brought down or up.
    pub fn fresh() -> Result<Self> {
        cluster_sh(&["down"])?;
        Self::up()
    }

    /// The cluster, brought up unless it runs.
    ///
    /// # Errors
    ///
    /// If it cannot be brought up.
    pub fn up() -> Result<Self> {
        let kubeconfig = PathBuf::from(cluster_sh(&["up"])?);
        let kubectl = crate::built_tool("controlplane/build-kubernetes.sh")?.join("kubectl");
        Ok(Self {
            kubeconfig,
            kubectl,
        })
    }

    /// Removes the cluster.
    ///
    /// # Errors
    ///
    /// If `cluster.sh down` fails.
    pub fn down(self) -> Result<()> {
        cluster_sh(&["down"]).map(drop)
    }

    /// Installs `proxy` and waits until it runs on every node and the cluster DNS answers
    /// through its Service.
    ///
    /// # Errors
    ///
    /// If the installation fails or does not become ready in time.
    pub fn install(&self, proxy: Proxy) -> Result<()> {
        cluster_sh(&["install", proxy.name()]).map(drop)
    }

    /// Runs kubectl as the cluster admin; returns its stdout.
    ///
    /// # Errors
    ///
    /// If kubectl fails (the error holds its stderr).
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_with_input(args, None)
    }

    /// Runs `kubectl apply -f -` with `yaml`.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn apply(&self, yaml: &str) -> Result<String> {
        self.kubectl_with_input(&["apply", "-f", "-"], Some(yaml))
    }

    fn kubectl_with_input(&self, args: &[&str], input: Option<&str>) -> Result<String> {
        use std::io::Write;
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl")?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(input.as_bytes())
                .context("writing kubectl's input")?;
        }
        let output = child.wait_with_output().context("running kubectl")?;
        if !output.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Runs `command` in container `pod` of `namespace` (`kubectl exec`); returns its stdout.
    ///
    /// # Errors
    ///
    /// If the exec or the command fails.
    pub fn exec(&self, namespace: &str, pod: &str, command: &[&str]) -> Result<String> {
        let mut args = vec!["-n", namespace, "exec", pod, "--"];
        args.extend_from_slice(command);
        self.kubectl(&args)
    }

    /// Waits until `pod` in `namespace` is Ready.
    ///
    /// # Errors
    ///
    /// If it is not Ready within `timeout`.
    pub fn wait_ready(&self, namespace: &str, pod: &str, timeout: Duration) -> Result<()> {
        let timeout = format!("--timeout={}s", timeout.as_secs());
        self.kubectl(&[
            "-n",
            namespace,
            "wait",
            "--for=condition=Ready",
            &format!("pod/{pod}"),
            &timeout,
        ])
        .map(drop)
    }

    /// The log of `pod` in `namespace`.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn logs(&self, namespace: &str, pod: &str) -> Result<String> {
        self.kubectl(&["-n", namespace, "logs", pod])
    }

    /// Runs `command` in node `node`'s network and UTS namespaces, as a process of that node
    /// would; returns its stdout.
    ///
    /// # Errors
    ///
    /// If the command fails.
    pub fn on_node(node: &str, command: &[&str]) -> Result<String> {
        let output = Command::new("nsenter")
            .arg(format!("--net=/run/netns/spc-{node}"))
            .arg(format!("--uts=/run/splitproxy-cluster/{node}/uts"))
            .arg("--")
            .args(command)
            .output()
            .with_context(|| format!("running {} on {node}", command.join(" ")))?;
        ensure!(
            output.status.success(),
            "{} on {node} failed: {}",
            command.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}
